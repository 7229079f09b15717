//! Black-box protocol tests: the release of servers at the right moment for every
//! flow a client can send (simple, extended, Flush without Sync, pipelines, COPY,
//! function calls, Terminate), and malformed input. Raw sockets, trust auth. COPY has
//! its own file (`copy.rs`).

#[path = "../common/mod.rs"]
mod common;
mod copy;

use std::time::Duration;

use common::raw::*;
use common::{PgCluster, Sluice, one_client_queued};

fn setup(pool_size: usize, mode: &str) -> (PgCluster, Sluice) {
    let pg = PgCluster::start();
    let sluice = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("pool_mode", &format!("\"{mode}\""))
        .general("admin_users", r#"["u_trust"]"#)
        .database("app", &[("pool_size", &pool_size.to_string())])
        .start();
    (pg, sluice)
}

fn trust(s: &Sluice) -> Raw {
    Raw::login(s.port, "u_trust", "app")
}

/// The first value of `sql` as a new client gets it: with a pool of one, served only
/// once the server went back to the pool.
fn from_another_client(s: &Sluice, sql: &str) -> String {
    let mut other = trust(s);
    other.send(&query(sql));
    first_value(&other.until_ready())
}

#[test]
fn simple_query_with_error_halfway_then_more() {
    let (_pg, s) = setup(1, "transaction");
    let mut c = trust(&s);
    c.send(&query("select 1; select 1/0; select 2"));
    let m = c.until_ready();
    assert_eq!(tags(&m), "TDCEZ");
    assert_eq!(sqlstate(&m[3].1), "22012");
    assert_eq!(m[4].1, b"I");
    c.send(&query(""));
    assert_eq!(tags(&c.until_ready()), "IZ");
    c.send(&query("select 42"));
    assert_eq!(first_value(&c.until_ready()), "42");
}

#[test]
fn extended_unnamed_and_pipelined_syncs() {
    let (_pg, s) = setup(1, "transaction");
    let mut c = trust(&s);
    let mut batch = Vec::new();
    for i in 0..3 {
        batch.extend(parse("", "select $1::int + 1"));
        batch.extend(bind("", "", &[&i.to_string()]));
        batch.extend(describe_portal(""));
        batch.extend(execute("", 0));
        batch.extend(sync());
    }
    c.send(&batch);
    for i in 0..3 {
        let m = c.until_ready();
        assert_eq!(tags(&m), "12TDCZ");
        assert_eq!(first_value(&m), (i + 1).to_string());
    }
    // a second client is served on the single server afterwards
    assert_eq!(from_another_client(&s, "select 7"), "7");
}

#[test]
fn flush_without_sync_keeps_the_server_linked() {
    let (_pg, s) = setup(1, "transaction");
    let mut a = trust(&s);
    let mut batch = parse("", "select pg_backend_pid()");
    batch.extend(bind("", "", &[]));
    batch.extend(execute("", 0));
    batch.extend(flush());
    a.send(&batch);
    let m = a.take(4);
    assert_eq!(tags(&m), "12DC");
    // A holds the only server until it syncs: B's query must wait.
    let port = s.port;
    let b = std::thread::spawn(move || {
        let mut b = Raw::login(port, "u_trust", "app");
        b.send(&query("select pg_backend_pid()"));
        first_value(&b.until_ready())
    });
    // B's query is in the pool's queue (not served) while A holds the server.
    let queued = one_client_queued(port, "u_trust", "", "app");
    assert!(queued, "second client never queued for the only server");
    assert!(!b.is_finished(), "second client got a server while the first had not synced");
    a.send(&sync());
    assert_eq!(tags(&a.until_ready()), "Z");
    let pid_b = b.join().unwrap();
    assert_eq!(pid_b, first_value(&m));
}

#[test]
fn function_call_message() {
    let (_pg, s) = setup(1, "transaction");
    let mut c = trust(&s);
    c.send(&query("select 'int4pl'::regproc::oid"));
    let oid: i32 = first_value(&c.until_ready()).parse().unwrap();
    let mut b = oid.to_be_bytes().to_vec();
    b.extend_from_slice(&0u16.to_be_bytes()); // argument formats: default text
    b.extend_from_slice(&2u16.to_be_bytes());
    for v in ["40", "2"] {
        b.extend_from_slice(&(v.len() as i32).to_be_bytes());
        b.extend_from_slice(v.as_bytes());
    }
    b.extend_from_slice(&0u16.to_be_bytes()); // result format text
    c.send(&msg(b'F', &b));
    let m = c.until_ready();
    assert_eq!(tags(&m), "VZ");
    assert_eq!(&m[0].1[4..], b"42");
}

#[test]
fn large_messages_stream_both_ways() {
    let (_pg, s) = setup(1, "transaction");
    let mut c = trust(&s);
    let big = "x".repeat(8 << 20);
    c.send(&query(&format!("select length('{big}')")));
    assert_eq!(first_value(&c.until_ready()), (8 << 20).to_string());
    c.send(&query("select repeat('y', 30000000)"));
    let m = c.until_ready();
    assert_eq!(tags(&m), "TDCZ");
    assert_eq!(m[1].1.len(), 2 + 4 + 30_000_000);
    // A Parse the relay reads whole, from a client with no server yet: its room grows
    // as it arrives, and it runs as sent.
    let mut b = parse("", &format!("select length('{big}')"));
    b.extend(bind("", "", &[]));
    b.extend(execute("", 0));
    b.extend(sync());
    c.send(&b);
    let m = c.until_ready();
    assert_eq!(tags(&m), "12DCZ");
    assert_eq!(first_value(&m), (8 << 20).to_string());
}

#[test]
fn terminate_returns_the_server() {
    let (_pg, s) = setup(1, "transaction");
    let mut a = trust(&s);
    a.send(&query("select 1"));
    a.until_ready();
    a.send(&msg(b'X', b""));
    assert!(a.closed());
    let mut b = trust(&s);
    b.send(&query("select 2"));
    assert_eq!(first_value(&b.until_ready()), "2");
}

#[test]
fn encryption_requests_are_refused_then_startup_works() {
    let (_pg, s) = setup(1, "transaction");
    for code in [80877103u32, 80877104] {
        let mut r = Raw::open(s.port);
        let mut p = 8u32.to_be_bytes().to_vec();
        p.extend(code.to_be_bytes());
        r.send(&p);
        let mut one = [0u8; 1];
        std::io::Read::read_exact(&mut r.s, &mut one).unwrap();
        assert_eq!(&one, b"N");
        r.send(&startup(&[("user", "u_trust"), ("database", "app")], 3 << 16));
        assert_eq!(r.until_ready()[0].0, b'R');
    }
}

#[test]
fn newer_protocol_minor_is_negotiated_down() {
    let (_pg, s) = setup(1, "transaction");
    let mut r = Raw::open(s.port);
    r.send(&startup(&[("user", "u_trust"), ("database", "app"), ("_pq_.something", "1")], (3 << 16) | 2));
    let m = r.until_ready();
    assert_eq!(m[0].0, b'v', "{m:?}");
    assert_eq!(&m[0].1[..4], &(3u32 << 16).to_be_bytes());
    assert!(String::from_utf8_lossy(&m[0].1).contains("_pq_.something"));
    assert_eq!(m[1].0, b'R');
    r.send(&query("select 5"));
    assert_eq!(first_value(&r.until_ready()), "5");
}

#[test]
fn malformed_startup_packets_are_rejected() {
    let (_pg, s) = setup(1, "transaction");
    // Each gets the FATAL error PostgreSQL sends for it (docs/behaviour.md: malformed
    // startup packets 08P01, protocol 2.0 0A000), then the connection is closed.
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("length below minimum", 3u32.to_be_bytes().to_vec(), "08P01"),
        ("absurd length", 0x7fff_ffffu32.to_be_bytes().to_vec(), "08P01"),
        ("protocol 2", startup(&[("user", "u_trust")], 2 << 16), "0A000"),
        ("unterminated", [12u32.to_be_bytes(), (3u32 << 16).to_be_bytes(), *b"abcd"].concat(), "08P01"),
        ("no user", startup(&[("database", "app")], 3 << 16), "28000"),
    ];
    for (case, bytes, want) in cases {
        let mut r = Raw::open(s.port);
        r.send(&bytes);
        let m = r.recv();
        let Some((b'E', body)) = &m else { panic!("{case}: expected FATAL {want}, got {m:?}") };
        assert_eq!(sqlstate(body), want, "{case}: {:?}", String::from_utf8_lossy(body));
        assert_eq!(field(body, b'S'), "FATAL", "{case}: {:?}", String::from_utf8_lossy(body));
        assert!(r.closed(), "{case}: the connection stayed open");
    }
    let mut ok = trust(&s);
    ok.send(&query("select 1"));
    assert_eq!(first_value(&ok.until_ready()), "1");
}

/// An md5 password message without its terminating NUL is malformed (`08P01`), not a
/// wrong password.
#[test]
fn an_unterminated_md5_password_is_a_protocol_violation() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("auth_type", "\"md5\"").start();
    let mut c = Raw::open(s.port);
    c.send(&startup(&[("user", "u_md5"), ("database", "app")], 3 << 16));
    let asked = c.recv().expect("an authentication request");
    assert_eq!(asked.0, b'R', "{asked:?}");
    c.send(&msg(b'p', b"md5abcdef"));
    c.expect_error("08P01", "malformed password message");
}

#[test]
fn absurd_message_length_closes_only_that_client() {
    let (pg, s) = setup(1, "transaction");
    let mut bad = trust(&s);
    bad.send(&[b'Q', 0x7f, 0xff, 0xff, 0xff]);
    bad.expect_error("08P01", "");
    assert!(bad.closed());
    // Mid-transaction too: the server must not stay stuck in the transaction.
    let mut c = trust(&s);
    c.send(&query("begin; select 1"));
    c.until_ready();
    c.send(&[b'Q', 0, 0, 0, 1]);
    assert!(c.closed());
    let mut ok = trust(&s);
    ok.send(&query("select 3"));
    assert_eq!(first_value(&ok.until_ready()), "3");
    assert_eq!(pg.backends("state like 'idle in transaction%'"), 0);
}

/// A message type no client may send is refused by Sluice with PostgreSQL's FATAL,
/// before it reaches the server: the server stays in the pool (rolled back when the
/// client was in a transaction) instead of being ended by PostgreSQL over it. So is a
/// Flush with a body: the server would fail it and skip to the next Sync unannounced.
#[test]
fn unknown_message_types_are_refused_and_the_server_kept() {
    let (pg, s) = setup(1, "transaction");
    let pid = from_another_client(&s, "select pg_backend_pid()");
    let unknown = |tag: u8| format!("invalid frontend message type {tag}");
    let cases = [
        (None, b'?', unknown(b'?')),
        (Some("begin; select 1"), b'p', unknown(b'p')),
        (None, 0xa3, unknown(0xa3)),
        (None, b'H', "invalid message length 9 for message type 'H'".to_string()),
    ];
    for (setup_sql, tag, error) in cases {
        let mut c = trust(&s);
        if let Some(sql) = setup_sql {
            c.send(&query(sql));
            c.until_ready();
        }
        c.send(&msg(tag, b"noise"));
        c.expect_error("08P01", &error);
        assert!(c.closed());
        assert_eq!(from_another_client(&s, "select pg_backend_pid()"), pid, "type {tag}");
    }
    assert_eq!(pg.backends("state like 'idle in transaction%'"), 0);
    // Refused without a server: at once while the only one is in another client's
    // transaction (not after query_wait_timeout).
    let mut holder = trust(&s);
    holder.send(&query("begin"));
    holder.until_ready();
    for (tag, body) in [(b'?', &b"noise"[..]), (b'H', b"noise")] {
        let mut c = trust(&s);
        c.send(&msg(tag, body));
        c.expect_error("08P01", "");
        assert!(c.closed());
    }
    holder.send(&query("commit"));
    holder.until_ready();
}

#[test]
fn statement_mode_refuses_transaction_blocks() {
    let (_pg, s) = setup(2, "statement");
    let mut c = trust(&s);
    c.send(&query("begin"));
    let m = c.until_ready();
    assert_eq!(tags(&m), "CEZ", "{m:?}");
    assert_eq!(sqlstate(&m[1].1), "25001");
    assert_eq!(m[2].1, b"I");
    c.send(&query("select 9"));
    assert_eq!(first_value(&c.until_ready()), "9");
}

/// Statements pipelined ahead of a Terminate run to their end, as on PostgreSQL (which
/// reads the Terminate after them), though the client closed its socket: the autocommit
/// INSERT is kept, the open transaction's rolled back, and the server goes back to the
/// pool (the next client gets the same one) instead of being cancelled and closed.
#[test]
fn statements_pipelined_ahead_of_a_terminate_run_to_their_end() {
    for mode in ["transaction", "session"] {
        let (pg, s) = setup(1, mode);
        pg.psql("create table ended (a int); grant all on ended to u_trust");
        let mut c = trust(&s);
        c.send(&query("select pg_backend_pid()"));
        let pid = first_value(&c.until_ready());
        let mut last = query("insert into ended select 1 from pg_sleep(1)");
        last.extend(query("begin; insert into ended values (2)"));
        last.extend(msg(b'X', b""));
        c.send(&last);
        drop(c);
        let kept = || pg.psql("select string_agg(a::text, ',') from ended") == "1";
        assert!(common::wait_until(Duration::from_secs(20), kept), "{mode}: {}", pg.psql("select count(*) from ended"));
        assert_eq!(from_another_client(&s, "select pg_backend_pid()"), pid, "{mode}: the server was not given back");
        assert_eq!(from_another_client(&s, "select count(*) from ended"), "1", "{mode}: the open transaction was kept");
    }
}

/// Nothing a client sends after its Terminate runs, as on PostgreSQL (which reads no
/// further): an autocommit INSERT in the same write after it is dropped.
#[test]
fn nothing_after_a_terminate_runs() {
    for mode in ["transaction", "session"] {
        let (pg, s) = setup(1, mode);
        pg.psql("create table after_x (a int); grant all on after_x to u_trust");
        let mut c = trust(&s);
        let mut last = query("select 1");
        last.extend(msg(b'X', b""));
        last.extend(query("insert into after_x values (1)"));
        c.send(&last);
        drop(c);
        // A pool of one: the next client is served once the server is given back.
        assert_eq!(from_another_client(&s, "select count(*) from after_x"), "0", "{mode}: ran after the Terminate");
    }
}

/// What a Terminate does not wait for: extended messages with no Sync (PostgreSQL
/// would roll their implicit transaction back; the server is closed at once), and a
/// result larger than a socket holds (PostgreSQL would stop at a write to the client
/// gone; the rest is cancelled): the next client is served at once either way.
#[test]
fn a_terminate_waits_neither_for_unsynced_messages_nor_for_a_large_result() {
    let (pg, s) = setup(1, "transaction");
    pg.psql("create table unsynced (a int); grant all on unsynced to u_trust");
    let huge = "select repeat('x', 1000) from generate_series(1, 20000000)";
    let mut unsynced = parse("", "insert into unsynced values (1)");
    unsynced.extend(bind("", "", &[]));
    unsynced.extend(execute("", 0));
    for (what, mut last) in [("unsynced messages", unsynced), ("a large result", query(huge))] {
        let mut c = trust(&s);
        c.send(&query("select 1"));
        c.until_ready();
        last.extend(msg(b'X', b""));
        c.send(&last);
        drop(c);
        let started = std::time::Instant::now();
        assert_eq!(from_another_client(&s, "select 42"), "42", "after {what}");
        assert!(started.elapsed() < Duration::from_secs(5), "served after {:?}: {what}", started.elapsed());
    }
    assert_eq!(from_another_client(&s, "select count(*) from unsynced"), "0");
}

/// A SET inside a block statement mode refuses is rolled back with it: the client is
/// told the setting's value again (ParameterStatus) and keeps it on later statements,
/// whichever server runs them.
#[test]
fn statement_mode_rolls_back_a_set_inside_a_refused_block() {
    let (_pg, s) = setup(2, "statement");
    let mut c = trust(&s);
    c.send(&query("show TimeZone"));
    let before = first_value(&c.until_ready());
    assert_ne!(before, "Asia/Tokyo");
    c.send(&query("begin; set TimeZone = 'Asia/Tokyo'"));
    let m = c.until_ready();
    let statuses: Vec<String> =
        m.iter().filter(|(t, _)| *t == b'S').map(|(_, b)| String::from_utf8_lossy(b).into_owned()).collect();
    assert_eq!(statuses.last().map(String::as_str), Some(format!("TimeZone\0{before}\0").as_str()), "{m:?}");
    assert_eq!(sqlstate(&m.iter().find(|(t, _)| *t == b'E').expect("the refusal").1), "25001");
    for _ in 0..3 {
        c.send(&query("show TimeZone"));
        assert_eq!(first_value(&c.until_ready()), before);
    }
}

/// Pipelined queries in statement mode are judged when the last is answered: a
/// transaction block begun and ended inside the pipeline runs (the server is never
/// held across the client's round trips); one still open then is rolled back and
/// refused, after the pipeline's answers.
#[test]
fn statement_mode_judges_a_pipeline_by_its_end() {
    let (pg, s) = setup(1, "statement");
    pg.psql("create table st_p (a int); grant all on st_p to u_trust");
    let mut c = trust(&s);
    let mut p = query("begin");
    p.extend(query("insert into st_p values (1)"));
    p.extend(query("commit"));
    c.send(&p);
    for status in [b"T", b"T", b"I"] {
        let m = c.until_ready();
        assert_eq!(tags(&m), "CZ", "{m:?}");
        assert_eq!(m[1].1, status);
    }
    let mut p = query("begin");
    p.extend(query("insert into st_p values (2)"));
    c.send(&p);
    let m = c.until_ready();
    assert_eq!((tags(&m).as_str(), &m[1].1[..]), ("CZ", &b"T"[..]));
    let m = c.until_ready();
    assert_eq!(tags(&m), "CEZ", "{m:?}");
    assert_eq!(sqlstate(&m[1].1), "25001");
    assert_eq!(m[2].1, b"I");
    c.send(&query("select count(*) from st_p"));
    assert_eq!(first_value(&c.until_ready()), "1", "the block left open was not rolled back");
}

/// An error in an extended-protocol exchange reported before the rest of it has
/// come (Flush, then more messages and the Sync in a later write): the server skips
/// those messages, and Sluice must not wait for their replies.
#[test]
fn error_before_the_rest_of_a_pipeline_arrives() {
    let (_pg, s) = setup(1, "transaction");
    let mut c = trust(&s);
    // Fails when executed (not when planned, as a constant 1/0 would).
    let mut b = parse("", "select 1/(random()*0)::int");
    b.extend(bind("", "", &[]));
    b.extend(execute("", 0));
    b.extend(flush());
    c.send(&b);
    let m = c.take(3);
    assert_eq!(tags(&m), "12E");
    assert_eq!(sqlstate(&m[2].1), "22012");
    // Skipped by the server, which answers only the Sync.
    let mut rest = parse("s", "select 2");
    rest.extend(bind("", "s", &[]));
    rest.extend(execute("", 0));
    rest.extend(sync());
    c.send(&rest);
    assert_eq!(tags(&c.until_ready()), "Z");
    // The statement was never defined; the single server is free for another client.
    let mut b = bind("", "s", &[]);
    b.extend(execute("", 0));
    b.extend(sync());
    c.send(&b);
    let m = c.until_ready();
    assert_eq!(tags(&m), "EZ");
    assert_eq!(sqlstate(&m[0].1), "26000");
    assert_eq!(from_another_client(&s, "select 5"), "5");
}

/// PostgreSQL skips everything up to the Sync after an error in an extended-protocol
/// message, a simple query or function call pipelined there too: no ReadyForQuery comes
/// for them, and the server must still go back to the pool at the end.
#[test]
fn requests_skipped_after_an_extended_error_release_the_server() {
    for mode in ["transaction", "statement", "session"] {
        let (_pg, s) = setup(1, mode);
        let mut c = trust(&s);
        let call = msg(b'F', &[0, 0, 0, 1, 0, 0, 0, 0, 0, 0]);
        c.send(&[parse("", "selec 1"), query("select 1"), call, flush(), sync(), query("select 2")].concat());
        let m = c.until_ready();
        assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "42601".to_string()), "{mode}");
        let m = c.until_ready();
        assert_eq!((tags(&m), first_value(&m)), ("TDCZ".to_string(), "2".to_string()), "{mode}");
        server_free_after(&s, mode, c);
    }
}

/// The client's server is free for another client: at once in the pooled modes (a pool
/// of one), and in session mode once the client leaves, as the same backend (kept for
/// reuse, not closed as if a request were still under way).
fn server_free_after(s: &Sluice, mode: &str, mut c: Raw) {
    if mode != "session" {
        assert_eq!(from_another_client(s, "select 3"), "3", "{mode}");
        return;
    }
    c.send(&query("select pg_backend_pid()"));
    let pid = first_value(&c.until_ready());
    c.send(&msg(b'X', b""));
    assert!(c.closed());
    assert_eq!(from_another_client(s, "select pg_backend_pid()"), pid, "the session's server was not kept");
}

/// A COPY sent at once with its data whose query the server skips (an extended
/// message before it failed), pipelined with an extended COPY that sends an early
/// Sync: the first COPY's data must not be taken for the second's, whose early Sync
/// the server ignores, and the server is free afterwards.
#[test]
fn a_skipped_copy_sent_at_once_leaves_no_trace() {
    for mode in ["transaction", "session"] {
        let (pg, s) = setup(1, mode);
        pg.psql("CREATE TABLE copy_w (a int); GRANT ALL ON copy_w TO u_trust");
        let mut c = trust(&s);
        let mut b = [parse("", "selec 1"), query("copy copy_w from stdin"), copy_rows(b"1\n"), sync()].concat();
        b.extend(extended_query("copy copy_w from stdin"));
        c.send(&b);
        let m = c.until_ready();
        assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "42601".to_string()), "{mode}");
        assert_eq!(tags(&c.take(3)), "12G", "{mode}");
        c.send(&[copy_rows(b"2\n"), sync()].concat());
        assert_eq!(tags(&c.until_ready()), "CZ", "{mode}");
        c.send(&query("select string_agg(a::text, ',') from copy_w"));
        assert_eq!(first_value(&c.until_ready()), "2", "{mode}");
        server_free_after(&s, mode, c);
    }
}

/// An ErrorResponse longer than what Sluice reads whole (it quotes a 2 MB value)
/// reaches the client intact, and the connection goes on.
#[test]
fn a_long_error_message_passes_through() {
    let (_pg, s) = setup(1, "transaction");
    let mut c = trust(&s);
    c.send(&query("select repeat('x', 2000000)::int"));
    let m = c.until_ready();
    assert_eq!(tags(&m), "EZ");
    assert_eq!(sqlstate(&m[0].1), "22P02");
    assert!(field(&m[0].1, b'M').len() > 2_000_000);
    c.send(&query("select 3"));
    assert_eq!(first_value(&c.until_ready()), "3");
}

#[test]
fn notices_pass_through_and_login_timeout_applies() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("auth_type", "\"trust\"").general("client_login_timeout", "2").start();
    let mut c = trust(&s);
    c.send(&query("do $$ begin raise notice 'hello there'; end $$"));
    let m = c.until_ready();
    assert_eq!(tags(&m), "NCZ");
    assert_eq!(field(&m[0].1, b'M'), "hello there");
    // A client that never finishes its login (here, its startup packet) is closed with
    // an error.
    let mut idle = Raw::open(s.port);
    idle.send(&[0, 0, 0]);
    idle.expect_error("08P01", "client_login_timeout");
    assert!(idle.closed());
}

/// A client whose input turns out malformed after Sluice has relayed the start of a
/// message (a CopyData streamed in pieces) is disconnected, and its server, which holds
/// half a message, is closed: the next client is not read out of step.
#[test]
fn a_protocol_error_after_half_a_message_closes_the_server() {
    let (_pg, s) = setup(1, "transaction");
    let mut c = trust(&s);
    // A CopyData declaring 1000 bytes, 500 of them sent behind a query.
    let mut first = query("select 1");
    first.extend([b'd', 0, 0, 0x03, 0xe8]);
    first.extend([b'x'; 500]);
    c.send(&first);
    assert_eq!(tags(&c.until_ready()), "TDCZ", "the query before it ran");
    // The rest of it, then a message with an impossible length.
    let mut rest = vec![b'x'; 496];
    rest.extend([0, 0, 0, 0, 0]);
    c.send(&rest);
    let m = c.recv().expect("an error before the connection closes");
    assert_eq!((m.0, sqlstate(&m.1)), (b'E', "08P01".to_string()), "{m:?}");
    assert_eq!(from_another_client(&s, "select 42"), "42");
}

/// A server message over `max_packet_size` right behind one relayed in pieces (a long
/// row, then a longer one): the client gets the first row whole, then the FATAL, at a
/// message boundary; never the FATAL's bytes inside the row. The first row's length
/// varies so that its tail and the next header share one of Sluice's reads.
#[test]
fn a_fatal_for_an_overlong_server_message_starts_at_a_boundary() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("max_packet_size", "65536")
        .database("app", &[("pool_size", "1")])
        .start();
    for n in (16_000..41_000).step_by(500) {
        let mut c = trust(&s);
        c.send(&query(&format!("select repeat('x', {n}) union all select repeat('y', 100000)")));
        let m = c.take(3);
        assert_eq!(tags(&m), "TDE", "n = {n}: {:?}", m.iter().map(|(t, b)| (*t as char, b.len())).collect::<Vec<_>>());
        assert_eq!(first_column(&m[1].1), "x".repeat(n), "n = {n}: the row was cut");
        assert_eq!(sqlstate(&m[2].1), "08P01", "n = {n}");
        assert!(field(&m[2].1, b'M').contains("over max_packet_size (65536)"), "n = {n}");
        assert!(c.closed(), "n = {n}");
    }
}

/// A simple Query after extended messages answered through a Flush (asyncpg prepares
/// with Parse/Describe/Flush): PostgreSQL ends their implicit transaction with the
/// Query's, answering ReadyForQuery Idle, so the server goes back to the pool then
/// (a pool of one serves the next client at once).
#[test]
fn a_query_after_unsynced_extended_messages_ends_their_transaction() {
    let (_pg, s) = setup(1, "transaction");
    let mut c = trust(&s);
    c.send(&[parse("", "select 1"), flush()].concat());
    assert_eq!(tags(&c.take(1)), "1");
    c.send(&query("select 2"));
    let m = c.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("TDCZ".to_string(), "2".to_string()));
    assert_eq!(from_another_client(&s, "select 3"), "3", "the server was kept");
    c.send(&query("select 4"));
    assert_eq!(first_value(&c.until_ready()), "4");
}
