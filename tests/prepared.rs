//! Named and unnamed prepared statements through transaction pooling, byte-exact:
//! sharing server-side statements, local Close, DEALLOCATE, re-parsing on another
//! server, eviction. Schema changes and shape checks: tests/prepared_schema.rs; pipelines
//! of several Sync segments and the server's books after errors in them:
//! tests/pipelines.rs.

mod common;

use common::raw::*;
use common::stmts::*;
use common::{PgCluster, Sluice};
/// The first value a simple query returns to `c`.
fn simple(c: &mut Raw, sql: &str) -> String {
    c.send(&query(sql));
    first_value(&c.until_ready())
}

#[test]
fn statements_are_shared_and_survive_server_changes() {
    let (_pg, s) = setup(2, &[]);
    let mut clients: Vec<Raw> = (0..6).map(|_| login(&s)).collect();
    // One after another, the clients all prepare on the one server open (x).
    let x = simple(&mut clients[0], "select pg_backend_pid()");
    for (i, c) in clients.iter_mut().enumerate() {
        // different names for the same text, and one name for different texts
        assert_eq!(prepare(c, &format!("s{i}"), "select $1::int * 2"), "1Z");
        assert_eq!(prepare(c, "same", &format!("select {i} + $1::int")), "1Z");
        assert_eq!(simple(c, "select pg_backend_pid()"), x, "client {i} prepared on another server");
    }
    // `holder` keeps x in a transaction: the first round runs on the pool's other server
    // (y), which has none of the statements and is given each one as it is first used.
    let mut holder = login(&s);
    holder.send(&query("begin"));
    holder.until_ready();
    assert_eq!(simple(&mut holder, "select pg_backend_pid()"), x);
    // One server-side statement per distinct text on each server: 1 + 6.
    let count = "select count(*) from pg_prepared_statements";
    assert_eq!(simple(&mut holder, count), "7", "on x");
    for round in 0..3 {
        for (i, c) in clients.iter_mut().enumerate() {
            let m = run(c, &format!("s{i}"), &[&round.to_string()]);
            assert_eq!(tags(&m), "2DCZ");
            assert_eq!(first_value(&m), (round * 2).to_string());
            assert_eq!(first_value(&run(c, "same", &["10"])), (i + 10).to_string());
        }
        if round == 0 {
            let mut c = login(&s);
            let y = simple(&mut c, "select pg_backend_pid()");
            assert_ne!(y, x, "the round ran on x, which holder holds");
            assert_eq!(simple(&mut c, count), "7", "on y after the first round");
            holder.send(&query("commit"));
            holder.until_ready();
        }
    }
    // Later rounds went to either server: neither parsed any text twice.
    holder.send(&query("begin"));
    holder.until_ready();
    let held = simple(&mut holder, "select pg_backend_pid()");
    let mut other = login(&s);
    assert_ne!(simple(&mut other, "select pg_backend_pid()"), held);
    assert_eq!(simple(&mut holder, count), "7", "on {held}");
    assert_eq!(simple(&mut other, count), "7", "on the server besides {held}");
    holder.send(&query("commit"));
    holder.until_ready();
}

/// Clients whose settings may change what a text parses to (here `TimeZone`, which
/// fixes a timestamptz literal when the statement is parsed) do not share a server's
/// copy: each gets what PostgreSQL would give it. Clients that differ only in a
/// setting that changes no parsing (`application_name`) still share one.
#[test]
fn statements_are_shared_only_between_clients_parsing_alike() {
    let (_pg, s) = setup(1, &[]);
    let login_in = |zone: &str, app: &str| {
        let mut c = Raw::open(s.port);
        let options = format!("-c TimeZone={zone}");
        c.send(&startup(
            &[("user", "u_trust"), ("database", "app"), ("options", &options), ("application_name", app)],
            3 << 16,
        ));
        c.until_ready();
        c
    };
    let sql = "select extract(epoch from '2024-01-01 00:00'::timestamptz)::bigint";
    let (mut paris, mut utc) = (login_in("Europe/Paris", "a"), login_in("UTC", "b"));
    for (c, want) in [(&mut paris, "1704063600"), (&mut utc, "1704067200")] {
        assert_eq!(prepare(c, "q", sql), "1Z");
        assert_eq!(first_value(&run(c, "q", &[])), want);
    }
    // A third client in UTC under another application_name shares the UTC copy: two
    // statements on the one server.
    let mut other = login_in("UTC", "c");
    assert_eq!(prepare(&mut other, "q", sql), "1Z");
    assert_eq!(first_value(&run(&mut other, "q", &[])), "1704067200");
    other.send(&query("select count(*) from pg_prepared_statements"));
    assert_eq!(first_value(&other.until_ready()), "2");
}

/// In a failed transaction PostgreSQL refuses a Parse (25P02), also of a text the
/// server holds: Sluice sends it rather than answering from the server's cache, so the
/// client gets that error, the name stays undefined, and after ROLLBACK it prepares.
#[test]
fn a_parse_in_a_failed_transaction_is_refused_as_postgresql_refuses_it() {
    let (_pg, s) = setup(1, &[]);
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "s1", "select 1"), "1Z");
    for sql in ["begin", "select 1/0"] {
        c.send(&query(sql));
        c.until_ready();
    }
    c.send(&[parse("s2", "select 1"), sync()].concat());
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1), m[1].1.clone()), ("EZ".to_string(), "25P02".to_string(), b"E".to_vec()));
    c.send(&query("rollback"));
    c.until_ready();
    assert_eq!(prepare(&mut c, "s2", "select 1"), "1Z");
    assert_eq!(first_value(&run(&mut c, "s2", &[])), "1");
}

/// Statement names are PostgreSQL's: only their first 63 bytes count, so a second
/// name alike that far is the same name (42P05), and the 63 bytes alone name it.
#[test]
fn statement_names_count_to_63_bytes() {
    let (_pg, s) = setup(1, &[]);
    let mut c = login(&s);
    let stem = "n".repeat(63);
    assert_eq!(prepare(&mut c, &format!("{stem}x"), "select 7"), "1Z");
    c.send(&[parse(&format!("{stem}y"), "select 7"), sync()].concat());
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "42P05".to_string()), "{m:?}");
    assert_eq!(first_value(&run(&mut c, &stem, &[])), "7");
    // Behind a DISCARD ALL, a long name parsed and closed again is gone, as on PostgreSQL.
    let long = format!("{}zzz", "m".repeat(63));
    c.send(&[query("discard all"), parse(&long, "select 8"), close_stmt(&long), sync()].concat());
    c.until_ready();
    c.until_ready();
    let m = run(&mut c, &long, &[]);
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "26000".to_string()), "{m:?}");
}

#[test]
fn close_is_local_and_closed_names_are_gone() {
    let (_pg, s) = setup(1, &[]);
    let mut a = login(&s);
    let mut b = login(&s);
    assert_eq!(prepare(&mut a, "q", "select 1"), "1Z");
    assert_eq!(prepare(&mut b, "q", "select 1"), "1Z");
    let mut batch = close_stmt("q");
    batch.extend(sync());
    a.send(&batch);
    assert_eq!(tags(&a.until_ready()), "3Z");
    let m = run(&mut a, "q", &[]);
    assert_eq!(tags(&m), "EZ");
    assert_eq!(sqlstate(&m[0].1), "26000");
    // b's statement (the same server-side one) still works
    assert_eq!(first_value(&run(&mut b, "q", &[])), "1");
    // and a can prepare the name again
    assert_eq!(prepare(&mut a, "q", "select 2"), "1Z");
    assert_eq!(first_value(&run(&mut a, "q", &[])), "2");
}

#[test]
fn unnamed_statement_is_reparsed_on_another_server() {
    let (_pg, s) = setup(2, &[]);
    let mut a = login(&s);
    let mut holder = login(&s);
    // Parse/Describe/Sync of the unnamed statement, as some drivers do...
    let mut b = parse("", "select pg_backend_pid()");
    b.extend({
        let mut d = vec![b'S', 0];
        d.truncate(2);
        msg(b'D', &d)
    });
    b.extend(sync());
    a.send(&b);
    assert_eq!(tags(&a.until_ready()), "1tTZ");
    // ...another client takes that server...
    holder.send(&query("begin; select pg_backend_pid()"));
    let held = first_value(&holder.until_ready());
    // ...then Bind/Execute/Sync lands on the other server and must still work.
    let m = run(&mut a, "", &[]);
    assert_eq!(tags(&m), "2DCZ", "{m:?}");
    assert_ne!(first_value(&m), held);
    holder.send(&query("commit"));
    holder.until_ready();
}

/// A client with no unnamed statement that binds or describes one gets 26000, as from
/// PostgreSQL, never the unnamed statement another client left on the server.
#[test]
fn another_clients_unnamed_statement_is_out_of_reach() {
    let (_pg, s) = setup(1, &[]);
    let mut a = login(&s);
    assert_eq!(prepare(&mut a, "", "select 'secret of a'"), "1Z");
    let mut b = login(&s);
    let m = run(&mut b, "", &[]);
    assert_eq!(tags(&m), "EZ", "{m:?}");
    assert_eq!(sqlstate(&m[0].1), "26000");
    assert_eq!(describe_stmt(&mut b, ""), "EZ");
    // The same after closing its own.
    b.send(&[parse("", "select 'b'"), close_stmt(""), sync()].concat());
    assert_eq!(tags(&b.until_ready()), "13Z");
    let m = run(&mut b, "", &[]);
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "26000".to_string()));
    // The client that parsed it still has it.
    let m = run(&mut a, "", &[]);
    assert_eq!(tags(&m), "2DCZ", "{m:?}");
    assert_eq!(first_value(&m), "secret of a");
}

/// A client whose unnamed Parse the server skipped (after an earlier error) or failed
/// while reading it (invalid encoding: before PostgreSQL drops its previous unnamed
/// statement) has no unnamed statement, and the server may still hold another
/// client's: its Bind gets 26000, never that statement.
#[test]
fn a_skipped_or_unreadable_unnamed_parse_leaves_nothing_to_bind() {
    let (_pg, s) = setup(1, &[]);
    let mut b = login(&s);
    let mut a = login(&s);
    let skipped = [parse("s1", "selec"), parse("", "select 'mine'"), sync()].concat();
    let unreadable = [msg(b'P', b"\0select '\xff'\0\0\0"), sync()].concat();
    for (what, batch) in [("skipped", skipped), ("unreadable", unreadable)] {
        b.send(&extended_query("select 'secret of b'"));
        assert_eq!(first_value(&b.until_ready()), "secret of b");
        a.send(&batch);
        assert_eq!(tags(&a.until_ready()), "EZ", "{what}");
        let m = run(&mut a, "", &[]);
        assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "26000".to_string()), "{what}: {m:?}");
    }
    // The same in one pipeline, the Bind sent before the error is known: Sluice parses
    // the client's statement again for it (PostgreSQL alone would answer 26000).
    b.send(&extended_query("select 'secret of b'"));
    assert_eq!(first_value(&b.until_ready()), "secret of b");
    a.send(
        &[parse("s1", "selec"), parse("", "select 'mine'"), sync(), bind("", "", &[]), execute("", 0), sync()].concat(),
    );
    assert_eq!(tags(&a.until_ready()), "EZ");
    let m = a.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("2DCZ".to_string(), "mine".to_string()), "{m:?}");
}

/// The client's own unnamed statement stays usable wherever PostgreSQL keeps it: after
/// Sluice's re-parse of it is skipped, after another client's Close of the server's
/// unnamed statement, after its own Close is skipped, after DEALLOCATE ALL through the
/// extended protocol.
#[test]
fn the_clients_own_unnamed_statement_lasts_as_on_postgresql() {
    let (_pg, s) = setup(1, &[]);
    let mut b = login(&s);
    let mut other = login(&s);
    let runs_mine = |b: &mut Raw, what: &str| {
        let m = run(b, "", &[]);
        assert_eq!((tags(&m), first_value(&m)), ("2DCZ".to_string(), "mine".to_string()), "{what}: {m:?}");
    };
    b.send(&[parse("", "select 'mine'"), sync()].concat());
    assert_eq!(tags(&b.until_ready()), "1Z");
    // Another client's unnamed statement on the server: the next Bind re-parses, and
    // here that re-parse is skipped after an error.
    assert_eq!(prepare(&mut other, "", "select 'other'"), "1Z");
    b.send(&[bind("", "nope", &[]), bind("", "", &[]), execute("", 0), sync()].concat());
    assert_eq!(tags(&b.until_ready()), "EZ");
    runs_mine(&mut b, "after a skipped re-parse");
    other.send(&[close_stmt(""), sync()].concat());
    assert_eq!(tags(&other.until_ready()), "3Z");
    runs_mine(&mut b, "after another client's Close");
    b.send(&[bind("", "nope", &[]), close_stmt(""), sync()].concat());
    assert_eq!(tags(&b.until_ready()), "EZ");
    runs_mine(&mut b, "after its own Close was skipped");
    b.send(&[parse("d", "deallocate all"), bind("", "d", &[]), execute("", 0), sync()].concat());
    assert_eq!(tags(&b.until_ready()), "12CZ");
    runs_mine(&mut b, "after DEALLOCATE ALL");
    // A skipped Close does not bring back a statement a later Close dropped, nor one
    // whose Parse was skipped with it (PostgreSQL would still hold the statement from
    // before that Parse; Sluice replaced it when the Parse went by, and answers 26000).
    let closes = [bind("", "nope", &[]), close_stmt(""), sync(), close_stmt(""), sync()].concat();
    let parse_and_close = [bind("", "nope", &[]), parse("", "select 'new'"), close_stmt(""), sync()].concat();
    for (what, batch, replies) in [("a later Close", closes, 2), ("a skipped Parse", parse_and_close, 1)] {
        b.send(&[parse("", "select 'mine'"), sync()].concat());
        assert_eq!(tags(&b.until_ready()), "1Z");
        b.send(&batch);
        for _ in 0..replies {
            b.until_ready();
        }
        let m = run(&mut b, "", &[]);
        assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "26000".to_string()), "{what}: {m:?}");
    }
}

#[test]
fn deallocate_and_discard_behave_as_on_a_server() {
    let (_pg, s) = setup(1, &[("query_wait_timeout", "5")]);
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "d1", "select 1"), "1Z");
    assert_eq!(prepare(&mut c, "d2", "select 2"), "1Z");
    c.send(&query("DEALLOCATE d1"));
    let m = c.until_ready();
    assert_eq!(tags(&m), "CZ");
    assert!(String::from_utf8_lossy(&m[0].1).starts_with("DEALLOCATE"));
    assert_eq!(sqlstate(&run(&mut c, "d1", &[])[0].1), "26000");
    assert_eq!(first_value(&run(&mut c, "d2", &[])), "2");
    c.send(&query("deallocate nosuch"));
    let m = c.until_ready();
    assert_eq!(sqlstate(&m[0].1), "26000");
    c.send(&query("DEALLOCATE ALL"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(sqlstate(&run(&mut c, "d2", &[])[0].1), "26000");
    assert_eq!(prepare(&mut c, "d3", "select 3"), "1Z");
    c.send(&query("DISCARD ALL"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(sqlstate(&run(&mut c, "d3", &[])[0].1), "26000");
    // the server really lost its statements, and Sluice knows it
    assert_eq!(prepare(&mut c, "d4", "select 3"), "1Z");
    assert_eq!(first_value(&run(&mut c, "d4", &[])), "3");
    // A DEALLOCATE answered by Sluice leaves nothing owed: the only server is free.
    c.send(&query("DEALLOCATE d4"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    let mut other = login(&s);
    other.send(&query("select 5"));
    assert_eq!(first_value(&other.until_ready()), "5", "the server stayed with the client that sent DEALLOCATE");
}

/// DEALLOCATE answered by Sluice reports the transaction status PostgreSQL would: that
/// of a BEGIN pipelined ahead of it, and in a failed transaction it is refused (25P02)
/// and the statement kept.
#[test]
fn deallocate_reports_the_transaction_as_postgresql_does() {
    let (_pg, s) = setup(1, &[]);
    let mut c = login(&s);
    for name in ["d1", "d2"] {
        assert_eq!(prepare(&mut c, name, "select 2"), "1Z");
    }
    c.send(&[query("begin"), query("deallocate d1")].concat());
    let m = [c.until_ready(), c.until_ready()].concat();
    assert_eq!(tags(&m), "CZCZ");
    assert_eq!((m[1].1.as_slice(), m[3].1.as_slice()), (&b"T"[..], &b"T"[..]), "{m:?}");
    c.send(&query("select 1/0"));
    assert_eq!(tags(&c.until_ready()), "EZ");
    c.send(&query("deallocate d2"));
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1), m[1].1.as_slice()), ("EZ".to_string(), "25P02".to_string(), &b"E"[..]));
    c.send(&query("rollback"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(first_value(&run(&mut c, "d2", &[])), "2", "the refused DEALLOCATE kept d2");
}

/// A DEALLOCATE of the client's statements pipelined behind requests still at the
/// server waits for their answers, then runs as PostgreSQL runs it in turn: in the
/// transaction they leave, refused (25P02) if it failed, skipped if the server skips
/// after an extended-protocol error.
#[test]
fn a_pipelined_deallocate_runs_in_turn() {
    let (_pg, s) = setup(1, &[]);
    let mut c = login(&s);
    for (name, sql) in [("d1", "select 1"), ("d2", "select 2"), ("d3", "select 3")] {
        assert_eq!(prepare(&mut c, name, sql), "1Z");
    }
    let rollback = |c: &mut Raw| {
        c.send(&query("rollback"));
        assert_eq!(tags(&c.until_ready()), "CZ");
    };
    let refused = |m: &[(u8, Vec<u8>)], at: usize| {
        assert_eq!((sqlstate(&m[at].1), m[at + 1].1.as_slice()), ("25P02".to_string(), &b"E"[..]), "{m:?}");
    };
    // Behind a BEGIN: it runs, inside the transaction.
    c.send(&[query("begin"), query("deallocate d1")].concat());
    let m = [c.until_ready(), c.until_ready()].concat();
    assert_eq!(tags(&m), "CZCZ");
    assert_eq!((m[1].1.as_slice(), m[3].1.as_slice()), (&b"T"[..], &b"T"[..]), "{m:?}");
    let m = run(&mut c, "d1", &[]);
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "26000".to_string()), "d1 is gone: {m:?}");
    rollback(&mut c);
    // Behind a request that fails the transaction: refused, as are a DEALLOCATE ALL and
    // a Parse of the name behind it; the statements stay.
    let failing = [query("begin"), query("select 1/0")].concat();
    let tail = [query("deallocate d2"), query("deallocate all"), parse("d2", "select 22"), sync()].concat();
    c.send(&[failing.clone(), tail].concat());
    let m: Vec<_> = (0..5).flat_map(|_| c.until_ready()).collect();
    assert_eq!(tags(&m), "CZEZEZEZEZ", "{m:?}");
    for at in [4, 6, 8] {
        refused(&m, at);
    }
    rollback(&mut c);
    for (name, v) in [("d2", "2"), ("d3", "3")] {
        assert_eq!(first_value(&run(&mut c, name, &[])), v, "the refused DEALLOCATEs kept {name}");
    }
    // In a failed transaction, behind a Close the server answers with no Sync: refused.
    c.send(&failing);
    assert_eq!(tags(&[c.until_ready(), c.until_ready()].concat()), "CZEZ");
    c.send(&[msg(b'C', b"P\0"), query("deallocate d2")].concat());
    let m = c.until_ready();
    assert_eq!(tags(&m), "3EZ", "{m:?}");
    refused(&m, 1);
    rollback(&mut c);
    assert_eq!(first_value(&run(&mut c, "d2", &[])), "2");
    // Skipped with the rest of an extended request that failed before its Sync, as
    // PostgreSQL skips it: no answer, the statement kept.
    let mut b = parse("", "select 1/0");
    b.extend(bind("", "", &[]));
    b.extend(execute("", 0));
    b.extend(query("deallocate d3"));
    b.extend(sync());
    c.send(&b);
    let m = c.until_ready();
    assert_eq!(tags(&m), "1EZ", "{m:?}");
    assert_eq!(first_value(&run(&mut c, "d3", &[])), "3", "the skipped DEALLOCATE kept d3");
    // Behind a Close of the name that the server skips after an error: the name is
    // still the client's when the DEALLOCATE runs, which succeeds.
    c.send(&[parse("", "select nosuchcol"), close_stmt("d3"), sync(), query("deallocate d3")].concat());
    let m = [c.until_ready(), c.until_ready()].concat();
    assert_eq!(tags(&m), "EZCZ", "{m:?}");
    assert_eq!(m[2].1, b"DEALLOCATE\0", "{m:?}");
    let m = run(&mut c, "d3", &[]);
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "26000".to_string()), "d3 is gone: {m:?}");
    // A Close (answered by Sluice) of a name whose Parse failed, skipped with it: the
    // name was never defined.
    c.send(&[parse("d5", "select nosuchcol"), close_stmt("d5"), sync()].concat());
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "42703".to_string()), "{m:?}");
    let m = run(&mut c, "d5", &[]);
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "26000".to_string()), "{m:?}");
}

#[test]
fn eviction_and_server_loss_reprepare_transparently() {
    let (pg, s) = setup(1, &[("max_prepared_statements", "2")]);
    let mut c = login(&s);
    for i in 0..5 {
        assert_eq!(prepare(&mut c, &format!("e{i}"), &format!("select {i}")), "1Z");
    }
    for _ in 0..2 {
        for i in 0..5 {
            assert_eq!(first_value(&run(&mut c, &format!("e{i}"), &[])), i.to_string());
        }
    }
    c.send(&query("select count(*) from pg_prepared_statements"));
    assert!(first_value(&c.until_ready()).parse::<u32>().unwrap() <= 2);
    c.send(&query("select pg_backend_pid()"));
    let pid = first_value(&c.until_ready());
    pg.psql(&format!("select pg_terminate_backend({pid})"));
    assert!(common::wait_until(std::time::Duration::from_secs(20), || pg.backends(&format!("pid = {pid}")) == 0));
    for i in 0..5 {
        assert_eq!(first_value(&run(&mut c, &format!("e{i}"), &[])), i.to_string());
    }
}

/// An evicted statement's open portal goes on: pgJDBC with a fetch size runs a named
/// portal over several Executes; Sluice evicting its statement (here for another
/// statement, with room for one per server) in between does not end the portal, since
/// PostgreSQL's portal keeps its own plan.
#[test]
fn eviction_leaves_an_open_portal_running() {
    let (_pg, s) = setup(1, &[("max_prepared_statements", "1")]);
    let mut c = login(&s);
    c.send(&query("begin"));
    c.until_ready();
    let mut b = parse("rows", "select g from generate_series(1, 3) g");
    b.extend(bind("cur", "rows", &[]));
    b.extend(execute("cur", 1));
    b.extend(sync());
    c.send(&b);
    let m = c.until_ready();
    assert_eq!(tags(&m), "12DsZ", "{m:?}");
    assert_eq!(first_value(&m), "1");
    // Another statement: the server's one room goes to it, `rows` is closed there.
    assert_eq!(prepare(&mut c, "other", "select 42"), "1Z");
    assert_eq!(first_value(&run(&mut c, "other", &[])), "42");
    c.send(&query("select count(*) from pg_prepared_statements"));
    assert_eq!(first_value(&c.until_ready()), "1", "rows was not evicted");
    c.send(&[execute("cur", 1), sync()].concat());
    let m = c.until_ready();
    assert_eq!(tags(&m), "DsZ", "{m:?}");
    assert_eq!(first_value(&m), "2");
    c.send(&query("commit"));
    c.until_ready();
}

#[test]
fn session_mode_passes_statements_through() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .database("app", &[("pool_size", "1"), ("pool_mode", "\"session\"")])
        .start();
    let mut c = Raw::login(s.port, "u_trust", "app");
    assert_eq!(prepare(&mut c, "mine", "select 5"), "1Z");
    c.send(&query("select name from pg_prepared_statements"));
    assert_eq!(first_value(&c.until_ready()), "mine");
}

/// Statement mode: a DEALLOCATE (answered by Sluice) pipelined behind a BEGIN, in one
/// write. The BEGIN's block is refused as statement mode refuses any (its
/// ReadyForQuery replaced by the error and an idle one) and the DEALLOCATE answered
/// after it: one ReadyForQuery per query, as the client counts them.
#[test]
fn statement_mode_answers_a_deallocate_behind_a_refused_begin_once() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("pool_mode", "\"statement\"")
        .database("app", &[("pool_size", "1")])
        .start();
    let mut c = login(&s);
    c.send(&[query("begin"), query("deallocate all")].concat());
    let first = c.until_ready();
    assert_eq!(tags(&first), "CEZ", "{first:?}");
    assert_eq!((sqlstate(&first[1].1), first[2].1.clone()), ("25001".to_string(), b"I".to_vec()));
    let second = c.until_ready();
    assert_eq!(tags(&second), "CZ", "{second:?}");
    c.send(&query("select 1"));
    let m = c.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("TDCZ".to_string(), "1".to_string()), "{m:?}");
}

/// Statement mode: a COPY inside a transaction block fails while the client has sent
/// part of its next CopyData. The block is left open, but the ROLLBACK that statement
/// mode sends would land inside that half message: the client is refused (25001) and
/// the server closed at once, with no wait (here `internal_query_timeout = 0`, which
/// would make that wait endless).
#[test]
fn statement_mode_refuses_a_block_left_mid_message() {
    let pg = PgCluster::start();
    pg.psql("create table copied_ints (a int); grant all on copied_ints to public");
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("pool_mode", "\"statement\"")
        .general("internal_query_timeout", "0")
        .database("app", &[("pool_size", "1")])
        .start();
    let mut c = login(&s);
    c.send(&query("begin; copy copied_ints from stdin"));
    assert_eq!(tags(&c.take(2)), "CG");
    let mut half = msg(b'd', &[b'1'; 1000]);
    half.truncate(100);
    c.send(&[msg(b'd', b"not a number\n"), half].concat());
    c.expect_error("22P02", "invalid input syntax");
    c.expect_error("25001", "transaction blocks are not allowed in statement pooling mode");
    assert!(c.closed(), "the refused client's connection stays open");
    let mut next = login(&s);
    next.send(&query("select count(*) from copied_ints"));
    assert_eq!(first_value(&next.until_ready()), "0");
}

#[test]
fn refused_discard_all_keeps_statements() {
    let (_pg, s) = setup(1, &[]);
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "kept", "select 11"), "1Z");
    // DISCARD ALL cannot run inside a transaction block: nothing is discarded.
    c.send(&query("begin"));
    c.until_ready();
    c.send(&query("DISCARD ALL"));
    let m = c.until_ready();
    assert_eq!(sqlstate(&m[0].1), "25001");
    c.send(&query("rollback"));
    c.until_ready();
    assert_eq!(first_value(&run(&mut c, "kept", &[])), "11");
}

/// A Bind too large for one read, of a statement the server it lands on lacks: the
/// Parse Sluice injects goes in front of it, and the Bind reaches the server intact.
#[test]
fn a_large_bind_of_a_statement_new_to_its_server() {
    let (_pg, s) = setup(2, &[]);
    let mut a = login(&s);
    assert_eq!(prepare(&mut a, "big", "select length($1)"), "1Z");
    // b holds the server a prepared on, and c leaves a second one idle: a's next
    // transaction takes that one at once, with only the start of its Bind read.
    let mut b = login(&s);
    b.send(&query("begin"));
    b.until_ready();
    let mut c = login(&s);
    c.send(&query("select 1"));
    c.until_ready();
    let text = "x".repeat(200_000);
    let m = run(&mut a, "big", &[&text]);
    assert_eq!(tags(&m), "2DCZ", "{m:?}");
    assert_eq!(first_value(&m), "200000");
    b.send(&query("commit"));
    b.until_ready();
}

/// Sluice's own query on a server (here the check after `server_check_delay`) drops
/// the server's unnamed statement, as any simple query does: a client binding its
/// unnamed statement afterwards has it parsed again first.
#[test]
fn unnamed_statement_survives_sluices_own_queries() {
    // The check bumps a sequence, so the test sees that it ran between Parse and Bind.
    let check = ("server_check_query", "\"select nextval('checks')\"");
    let (pg, s) = setup(1, &[("server_check_delay", "0.05"), check]);
    pg.psql("create sequence checks; grant usage on sequence checks to public");
    let checks = || pg.psql("select case when is_called then last_value else 0 end from checks");
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "", "select 11"), "1Z");
    let before = checks();
    // Ages the idle server past server_check_delay: the next loan checks it first. (Time
    // passing is the condition itself: nothing to poll.)
    std::thread::sleep(std::time::Duration::from_millis(200));
    let m = run(&mut c, "", &[]);
    assert_eq!(tags(&m), "2DCZ", "{}", field(&m[0].1, b'M'));
    assert_eq!(first_value(&m), "11");
    let after: i64 = checks().parse().unwrap();
    assert_eq!(after, before.parse::<i64>().unwrap() + 1, "the Bind's loan was not checked once");
}
