//! Prepared statements through transaction pooling after schema changes: the result
//! shape each client saw checked before a copy it has not seen is used (0A000 as
//! PostgreSQL when it changed), stale copies closed and parsed again, SETs that change
//! parsing or not, refused runs that must not reach the server, statements dropped
//! behind Sluice's back. The rest of prepared statements: tests/prepared.rs.

mod common;

use std::time::Duration;

use common::http::{http_get, sample};
use common::raw::*;
use common::stmts::*;
use common::{free_port, wait_until};

/// A table dropped and made again with the same columns (outside Sluice) changes
/// nothing of a statement's result but the table's OID: a statement prepared again on
/// a server passes the shape check, as PostgreSQL re-plans it without complaint.
#[test]
fn a_table_made_again_alike_keeps_its_statements() {
    let (pg, s) = setup(1, &[("max_prepared_statements", "1")]);
    pg.psql("create table remade (a int); grant all on remade to public");
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "p", "select a from remade"), "1Z");
    assert_eq!(describe_stmt(&mut c, "p"), "tTZ");
    pg.psql(
        "drop table remade; create table remade (a int); insert into remade values (7); grant all on remade to public",
    );
    // Another statement takes the server's only slot: p is prepared again, and checked.
    assert_eq!(prepare(&mut c, "other", "select 2"), "1Z");
    let m = run(&mut c, "p", &[]);
    assert_eq!((tags(&m), first_value(&m)), ("2DCZ".to_string(), "7".to_string()), "{m:?}");
}

/// A client's described statement whose shared copy another client's Parse made again
/// after a schema change (the ALTER ran through Sluice): the first client's next Bind
/// is checked against that copy and refused with 0A000, as PostgreSQL refuses a
/// statement whose result type changed, rather than given rows of the new type.
#[test]
fn a_copy_another_client_made_after_ddl_is_checked_before_use() {
    let (pg, s) = setup(1, &[]);
    pg.psql("create table reshaped (a int); insert into reshaped values (5); alter table reshaped owner to u_trust");
    let (mut c, mut d) = (login(&s), login(&s));
    assert_eq!(prepare(&mut c, "p", "select a from reshaped"), "1Z");
    assert_eq!(describe_stmt(&mut c, "p"), "tTZ");
    d.send(&query("alter table reshaped alter column a type bigint"));
    assert_eq!(tags(&d.until_ready()), "CZ");
    assert_eq!(prepare(&mut d, "q", "select a from reshaped"), "1Z");
    let m = run(&mut c, "p", &[]);
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "0A000".to_string()), "{m:?}");
    // Prepared again, it runs with the new type.
    c.send(&[close_stmt("p"), sync()].concat());
    c.until_ready();
    assert_eq!(prepare(&mut c, "p", "select a from reshaped"), "1Z");
    assert_eq!(first_value(&run(&mut c, "p", &[])), "5");
}

#[test]
fn changed_result_type_fails_once_then_works() {
    let (pg, s) = setup(1, &[]);
    pg.psql("create table plan_t (a int); insert into plan_t values (1); grant all on plan_t to u_trust");
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "p", "select * from plan_t"), "1Z");
    assert_eq!(first_value(&run(&mut c, "p", &[])), "1");
    pg.psql("alter table plan_t add column b text default 'x'");
    let m = run(&mut c, "p", &[]);
    assert_eq!(tags(&m), "EZ");
    assert_eq!(sqlstate(&m[0].1), "0A000");
    let m = run(&mut c, "p", &[]);
    assert_eq!(tags(&m), "2DCZ", "the pool stays poisoned: {m:?}");
}

/// The Close Sluice owes the server for a statement found stale goes only where the
/// server reads it as a request: not ahead of the Sync that ends the skip after the
/// error (the server would skip it, and its missing answer would swallow the client's
/// ReadyForQuery), nor inside a COPY (the server would fail the COPY over it).
#[test]
fn a_stale_statement_is_closed_where_the_server_reads_it() {
    let (pg, s) = setup(1, &[]);
    pg.psql(
        "create table plan_s (a int); insert into plan_s values (1); create table plan_c (a int); \
         grant all on plan_s, plan_c to u_trust",
    );
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "p", "select * from plan_s"), "1Z");
    assert_eq!(first_value(&run(&mut c, "p", &[])), "1");
    // After the error, the Sync comes in a write of its own.
    pg.psql("alter table plan_s add column b text default 'x'");
    c.send(&[bind("", "p", &[]), execute("", 0), flush()].concat());
    let m = c.take(1);
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("E".to_string(), "0A000".to_string()));
    c.send(&sync());
    assert_eq!(tags(&c.until_ready()), "Z");
    assert_eq!(tags(&run(&mut c, "p", &[])), "2DCZ");
    // A COPY's data right after the error.
    pg.psql("alter table plan_s add column c text default 'y'");
    c.send(&[bind("", "p", &[]), execute("", 0), sync(), query("copy plan_c from stdin")].concat());
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "0A000".to_string()));
    assert_eq!(tags(&c.take(1)), "G");
    c.send(&copy_rows(b"7\n"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(tags(&run(&mut c, "p", &[])), "2DCZ");
    c.send(&query("select a from plan_c"));
    assert_eq!(first_value(&c.until_ready()), "7");
}

/// A client that sends a request inside a COPY, before its data, where Sluice must
/// check the statement's shape first (its copy was evicted): PostgreSQL would read the
/// check as COPY data. The client is told and the server closed; nothing hangs.
#[test]
fn a_shape_check_behind_a_copy_begun_ends_the_link_not_hangs() {
    let (pg, s) = setup(1, &[("max_prepared_statements", "1")]);
    pg.psql("create table plan_h (a int); grant all on plan_h to u_trust");
    let mut c = login(&s);
    c.send(&query("select pg_backend_pid()"));
    let pid = first_value(&c.until_ready());
    assert_eq!(prepare(&mut c, "p", "select 1 as a"), "1Z");
    assert_eq!(describe_stmt(&mut c, "p"), "tTZ");
    assert_eq!(prepare(&mut c, "q", "select 2"), "1Z"); // evicts p from the server
    c.send(&[query("copy plan_h from stdin"), bind("", "p", &[]), execute("", 0), sync()].concat());
    c.expect_error("08P01", "inside a COPY");
    assert!(c.closed());
    let mut other = login(&s);
    other.send(&query("select pg_backend_pid()"));
    let m = other.until_ready();
    assert_eq!(tags(&m), "TDCZ");
    assert_ne!(first_value(&m), pid, "the server was kept");
}

/// How a test client runs a SET: as a simple Query, as a named statement prepared in one
/// exchange and executed in a later one (as statement-caching drivers do), or as the
/// unnamed statement in one extended-protocol exchange.
#[derive(Clone, Copy, Debug)]
enum Via {
    Query,
    Named,
    Unnamed,
}

fn run_via(c: &mut Raw, via: Via, name: &str, sql: &str) {
    let done = match via {
        Via::Query => {
            c.send(&query(sql));
            tags(&c.until_ready())
        }
        Via::Named => {
            assert_eq!(prepare(c, name, sql), "1Z", "{sql}");
            tags(&run(c, name, &[]))
        }
        Via::Unnamed => {
            let b = extended_query(sql);
            c.send(&b);
            tags(&c.until_ready())
        }
    };
    assert!(done.contains('C') && done.ends_with('Z'), "{via:?} {sql}: {done}");
}

#[test]
fn sets_that_leave_parsing_alone_keep_statements_shared() {
    let (_pg, s) = setup(1, &[("admin_users", "[\"u_trust\"]")]);
    // SHOW PREPARED_STATEMENTS: cache_hits, the client Parses given a statement the
    // server already held.
    let hits = || -> u64 {
        let cell = common::console_cell(s.port, "u_trust", "", "show prepared_statements", "app", 4);
        cell.as_deref().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("cache_hits: {cell:?}"))
    };
    let sql = "select 1 + $1::int";
    let mut first = login(&s);
    assert_eq!(prepare(&mut first, "a", sql), "1Z");
    let mut other = login(&s);
    let cases = [
        (Via::Query, "set statement_timeout = 5000", true),
        (Via::Query, "set local lock_timeout = '1s'", true),
        (Via::Named, "set statement_timeout = 4000", true),
        (Via::Unnamed, "set application_name = 'x'", true),
        (Via::Query, "set search_path = public", false),
        (Via::Named, "set datestyle = 'ISO, MDY'", false),
        (Via::Unnamed, "set search_path = public", false),
        (Via::Query, "reset all", false),
        (Via::Query, "alter table if exists no_such_table add column x int", false),
    ];
    for (i, (via, set, shared)) in cases.into_iter().enumerate() {
        run_via(&mut other, via, &format!("set{i}"), set);
        let before = hits();
        let mut c = login(&s);
        assert_eq!(prepare(&mut c, "c", sql), "1Z", "{set}");
        assert_eq!(first_value(&run(&mut c, "c", &["1"])), "2", "{set}");
        let after = hits();
        assert_eq!(after == before + 1, shared, "after {via:?} {set:?}: shared? (cache_hits {before} -> {after})");
    }
}

/// The refused run of a statement whose result type changed, on a server that
/// prepared it after the change and so runs it, with a long answer (its rows cross
/// reads): every byte of that answer is dropped, and the client gets only the 0A000
/// and its ReadyForQuery.
#[test]
fn a_refused_run_with_a_long_result_is_dropped_whole() {
    let (pg, s) = setup(2, &[]);
    pg.psql(
        "create table long_t (a int); insert into long_t select 1 from generate_series(1, 3000); \
         grant all on long_t to u_trust",
    );
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "p", "select * from long_t"), "1Z");
    // Described, as drivers do: Sluice keeps the result type the client saw.
    assert_eq!(describe_stmt(&mut c, "p"), "tTZ");
    assert_eq!(run(&mut c, "p", &[]).len(), 3003);
    // b holds c's server; d leaves the other one idle, without the statement.
    let mut b = login(&s);
    b.send(&query("begin"));
    b.until_ready();
    let mut d = login(&s);
    d.send(&query("select 1"));
    d.until_ready();
    pg.psql("alter table long_t add column b text default repeat('x', 100)");
    let m = run(&mut c, "p", &[]);
    assert_eq!(tags(&m), "EZ");
    assert_eq!(sqlstate(&m[0].1), "0A000");
    // Nothing of the dropped answer is left in the stream.
    c.send(&query("select 7"));
    let m = c.until_ready();
    assert_eq!(tags(&m), "TDCZ");
    assert_eq!(first_value(&m), "7");
    b.send(&query("commit"));
    b.until_ready();
}

/// A statement whose result type changed since the client described it is refused
/// before it runs: the client's Bind waits for the answer to the shape check of the
/// copy on another server. A refused INSERT ... RETURNING leaves no row; a refusal in
/// a pipeline rolls back the pipeline's implicit transaction, and one in a transaction
/// block aborts the transaction, as PostgreSQL's own refusal does.
#[test]
fn a_refused_statement_does_not_run() {
    let http = free_port();
    let (pg, s) = setup(2, &[("metrics_listen", &format!("\"127.0.0.1:{http}\""))]);
    pg.psql("create table ref_t (a int); grant all on ref_t to u_trust");
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "ins", "insert into ref_t values (1) returning *"), "1Z");
    assert_eq!(prepare(&mut c, "side", "insert into ref_t values (2)"), "1Z");
    assert_eq!(describe_stmt(&mut c, "ins"), "tTZ");
    assert_eq!(tags(&run(&mut c, "ins", &[])), "2DCZ");
    // b holds c's server; d leaves the other one idle, without the statements, but
    // with one prepared in SQL under the name of the Bind Sluice makes fail.
    let mut b = login(&s);
    b.send(&query("begin"));
    b.until_ready();
    let mut d = login(&s);
    d.send(&query("prepare sluice_refused as select 1"));
    assert_eq!(tags(&d.until_ready()), "CZ");
    pg.psql("alter table ref_t add column b int");
    let rows = |c: &mut Raw| {
        c.send(&query("select count(*) from ref_t"));
        first_value(&c.until_ready())
    };
    let m = run(&mut c, "ins", &[]);
    assert_eq!(tags(&m), "EZ");
    assert_eq!(sqlstate(&m[0].1), "0A000");
    assert_eq!(rows(&mut c), "1", "the refused INSERT ran");
    // In a pipeline: the INSERT before it is rolled back with it.
    let mut p = bind("", "side", &[]);
    p.extend(execute("", 0));
    p.extend(bind("", "ins", &[]));
    p.extend(execute("", 0));
    p.extend(sync());
    c.send(&p);
    let m = c.until_ready();
    assert_eq!(tags(&m), "2CEZ");
    assert_eq!(sqlstate(&m[2].1), "0A000");
    assert_eq!(m[3].1, b"I");
    assert_eq!(rows(&mut c), "1", "the pipeline's implicit transaction was not rolled back");
    // In a transaction block: the transaction is aborted.
    c.send(&query("begin"));
    c.until_ready();
    let m = run(&mut c, "ins", &[]);
    assert_eq!(tags(&m), "EZ");
    assert_eq!(m[1].1, b"E", "the transaction must be aborted");
    c.send(&query("rollback"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(rows(&mut c), "1");
    // A shape check that fails lets the held message go on, for the server to skip.
    pg.psql("drop table ref_t");
    let m = run(&mut c, "ins", &[]);
    assert_eq!(tags(&m), "EZ");
    assert_eq!(sqlstate(&m[0].1), "42P01");
    c.send(&query("select 8"));
    assert_eq!(first_value(&c.until_ready()), "8");
    b.send(&query("commit"));
    b.until_ready();
    // The error statistics count what the clients were told: three 0A000 and one
    // 42P01, none of the errors of the Binds Sluice made fail.
    let errors = |class: &str| {
        let text = http_get(http, "/metrics").map(|r| r.1).unwrap_or_default();
        sample(&text, &format!("sluice_errors_total{{database=\"app\",user=\"u_trust\",class=\"{class}\"}}"))
    };
    let counted = wait_until(Duration::from_secs(10), || errors("0A") == Some(3.0) && errors("42") == Some(1.0));
    assert!(counted, "errors by class: 0A {:?}, 42 {:?}", errors("0A"), errors("42"));
    assert_eq!((errors("26"), errors("08")), (None, None), "the failing Binds' own errors were counted");
}

/// `query_timeout` runs while a client's message is held for a shape check: the Bind
/// of a described statement waits while the statement's copy on the other server is
/// parsed and described, and that Parse waits for a lock another client's transaction
/// holds. The client is ended with 57014 when the timeout runs out, and the blocked
/// server is cancelled and closed, not pooled.
#[test]
fn query_timeout_runs_while_a_message_is_held() {
    let (pg, s) = setup(2, &[("query_timeout", "5")]);
    pg.psql("create table held_t (a int); grant all on held_t to u_trust");
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "ins", "insert into held_t values (1) returning *"), "1Z");
    assert_eq!(describe_stmt(&mut c, "ins"), "tTZ");
    // b takes c's server and locks the table: c's next run goes to the other server,
    // which lacks the statement, and the Parse Sluice sends there waits for b.
    let mut b = login(&s);
    b.send(&query("begin; lock table held_t"));
    assert_eq!(tags(&b.until_ready()), "CCZ");
    let mut run = bind("", "ins", &[]);
    run.extend(execute("", 0));
    run.extend(sync());
    let started = std::time::Instant::now();
    c.send(&run);
    // The waiting backend's pid, taken in the same look that sees it wait.
    let mut pid = String::new();
    let waits = wait_until(Duration::from_secs(10), || {
        pid = pg.psql("select pid from pg_stat_activity where wait_event_type = 'Lock'");
        !pid.is_empty()
    });
    assert!(waits, "the Parse in front of the held Bind never waited for the lock");
    c.expect_error("57014", "query_timeout");
    assert!(started.elapsed() >= Duration::from_millis(4900), "ended after {:?}", started.elapsed());
    assert!(c.closed());
    // Cancelled and closed, not pooled: its backend ends while b still holds the lock.
    let gone = wait_until(Duration::from_secs(10), || pg.backends(&format!("pid = {pid}")) == 0);
    assert!(gone, "the timed-out server was not closed");
    b.send(&query("commit"));
    assert_eq!(tags(&b.until_ready()), "CZ");
    b.send(&query("select count(*) from held_t"));
    assert_eq!(first_value(&b.until_ready()), "0", "the held INSERT ran");
    // A new client gets a server: the closed one's slot was freed.
    let mut d = login(&s);
    d.send(&query("insert into held_t values (2)"));
    assert_eq!(tags(&d.until_ready()), "CZ");
}

/// Another client deallocates the server-side statements behind Sluice's back: all of
/// them with a DEALLOCATE ALL Sluice does not recognise (a comment before it), then one
/// by its server-side name. The statements are parsed again: at once after the first,
/// after one 26000 after the second.
#[test]
fn statements_deallocated_behind_sluices_back_are_parsed_again() {
    let (_pg, s) = setup(1, &[]);
    let mut q = login(&s);
    assert_eq!(prepare(&mut q, "q1", "select 21"), "1Z");
    assert_eq!(first_value(&run(&mut q, "q1", &[])), "21");
    let mut c = login(&s);
    c.send(&query("/* x */ DEALLOCATE ALL"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(first_value(&run(&mut q, "q1", &[])), "21");
    c.send(&query("select name from pg_prepared_statements"));
    let name = first_value(&c.until_ready());
    c.send(&query(&format!("DEALLOCATE \"{name}\"")));
    assert_eq!(tags(&c.until_ready()), "CZ");
    let m = run(&mut q, "q1", &[]);
    assert_eq!(sqlstate(&m[0].1), "26000");
    assert_eq!(first_value(&run(&mut q, "q1", &[])), "21");
}
