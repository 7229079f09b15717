//! Black-box protocol tests: the release of servers at the right moment for every
//! flow a client can send (simple, extended, Flush without Sync, pipelines, COPY,
//! function calls, Terminate), and malformed input. Raw sockets, trust auth.

mod common;

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
fn copy_in_and_out_inside_a_transaction() {
    let (pg, s) = setup(2, "transaction");
    pg.psql("CREATE TABLE copy_t (a int, b text); GRANT ALL ON copy_t TO u_trust");
    let mut c = trust(&s);
    c.send(&query("begin"));
    c.until_ready();
    c.send(&query("copy copy_t from stdin"));
    assert_eq!(c.recv().unwrap().0, b'G');
    let mut data = Vec::new();
    for i in 0..1000 {
        data.extend(msg(b'd', format!("{i}\tvalue {i}\n").as_bytes()));
    }
    data.extend(msg(b'c', b""));
    c.send(&data);
    let m = c.until_ready();
    assert_eq!(tags(&m), "CZ");
    assert_eq!(m[1].1, b"T");
    c.send(&query("copy (select * from copy_t order by a) to stdout"));
    let m = c.until_ready();
    assert_eq!(m[0].0, b'H');
    assert_eq!(m.iter().filter(|(t, _)| *t == b'd').count(), 1000);
    assert_eq!(tags(&m[m.len() - 3..]), "cCZ");
    c.send(&query("commit"));
    c.until_ready();
    assert_eq!(pg.psql("select count(*) from copy_t"), "1000");
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
    let cases: Vec<Vec<u8>> = vec![
        3u32.to_be_bytes().to_vec(),                                          // length below minimum
        0x7fff_ffffu32.to_be_bytes().to_vec(),                                // absurd length
        startup(&[("user", "u_trust")], 2 << 16),                             // protocol 2
        [12u32.to_be_bytes(), (3u32 << 16).to_be_bytes(), *b"abcd"].concat(), // unterminated
        startup(&[("database", "app")], 3 << 16),                             // no user
    ];
    for bytes in cases {
        let mut r = Raw::open(s.port);
        r.send(&bytes);
        let m = r.recv();
        if let Some((tag, body)) = &m {
            assert_eq!(*tag, b'E', "{m:?}");
            assert!(["08P01", "28000"].contains(&sqlstate(body).as_str()), "{}", sqlstate(body));
        }
        assert!(r.closed());
    }
    let mut ok = trust(&s);
    ok.send(&query("select 1"));
    assert_eq!(first_value(&ok.until_ready()), "1");
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

#[test]
fn extended_copy_in_with_early_sync_releases_the_server() {
    let (pg, s) = setup(1, "transaction");
    pg.psql("CREATE TABLE copy_x (a int); GRANT ALL ON copy_x TO u_trust");
    let mut c = trust(&s);
    // As tokio-postgres does: Bind/Execute/Sync, then the data, CopyDone and Sync.
    let b = extended_query("copy copy_x from stdin");
    c.send(&b);
    let m = c.take(3);
    assert_eq!(tags(&m), "12G");
    let mut data = copy_rows(b"1\n2\n");
    data.extend(sync());
    c.send(&data);
    assert_eq!(tags(&c.until_ready()), "CZ");
    // the single server went back to the pool
    assert_eq!(from_another_client(&s, "select count(*) from copy_x"), "2");
}

/// An extended-protocol COPY FROM STDIN pipelined behind a simple query: the query's
/// ReadyForQuery must not make Sluice forget the Sync sent after the COPY's Execute,
/// which the server ignores; the server then goes back to the pool (of one).
#[test]
fn extended_copy_in_pipelined_behind_a_query_releases_the_server() {
    let (pg, s) = setup(1, "transaction");
    pg.psql("CREATE TABLE copy_y (a int); GRANT ALL ON copy_y TO u_trust");
    let mut c = trust(&s);
    let mut b = query("select 1");
    b.extend(extended_query("copy copy_y from stdin"));
    c.send(&b);
    assert_eq!(tags(&c.until_ready()), "TDCZ");
    assert_eq!(tags(&c.take(3)), "12G");
    let mut data = copy_rows(b"1\n");
    data.extend(sync());
    c.send(&data);
    assert_eq!(tags(&c.until_ready()), "CZ");
    // the single server went back to the pool
    assert_eq!(from_another_client(&s, "select count(*) from copy_y"), "1");
}

/// A whole COPY FROM STDIN sent at once (Execute, Sync, data, CopyDone, Sync) before the
/// server's CopyInResponse: only the first Sync is ignored by the server, the last one
/// is answered, and the server goes back to the pool. Also with requests behind it, two
/// COPYs in one query, and a COPY sent at once whose query fails before it begins.
#[test]
fn extended_copy_in_sent_at_once_releases_the_server() {
    let (pg, s) = setup(1, "transaction");
    pg.psql("CREATE TABLE copy_z (a int); GRANT ALL ON copy_z TO u_trust");
    let mut c = trust(&s);
    let mut b = extended_query("copy copy_z from stdin");
    b.extend(copy_rows(b"1\n2\n3\n"));
    b.extend(sync());
    c.send(&b);
    let m = c.until_ready();
    assert_eq!(tags(&m), "12GCZ", "{m:?}");
    assert_eq!(from_another_client(&s, "select count(*) from copy_z"), "3");
    // The same for a simple-query COPY; an extended query after it is answered.
    let mut b = query("copy copy_z from stdin");
    b.extend(copy_rows(b"4\n"));
    c.send(&b);
    assert_eq!(tags(&c.until_ready()), "GCZ");
    let b = extended_query("select count(*) from copy_z");
    c.send(&b);
    let m = c.until_ready();
    assert_eq!(tags(&m), "12DCZ", "{m:?}");
    assert_eq!(first_value(&m), "4");
    // The count as another client sees it: served only if the server went back to the
    // pool (of one).
    let served_elsewhere = |s: &Sluice| from_another_client(s, "select count(*) from copy_z");
    let extended_count = |c: &mut Raw| {
        c.send(&extended_query("select count(*) from copy_z"));
        let m = c.until_ready();
        assert_eq!(tags(&m), "12DCZ", "{m:?}");
        first_value(&m)
    };
    // A COPY sent at once with another request behind it, in either protocol.
    let mut b = extended_query("copy copy_z from stdin");
    b.extend(copy_rows(b"5\n"));
    b.extend(sync());
    b.extend(extended_query("select 6"));
    c.send(&b);
    assert_eq!(tags(&c.until_ready()), "12GCZ");
    assert_eq!(first_value(&c.until_ready()), "6");
    assert_eq!(served_elsewhere(&s), "5", "the server stayed with the client");
    let mut b = query("copy copy_z from stdin");
    b.extend(copy_rows(b"7\n"));
    b.extend(query("select 8"));
    c.send(&b);
    assert_eq!(tags(&c.until_ready()), "GCZ");
    assert_eq!(first_value(&c.until_ready()), "8");
    assert_eq!(served_elsewhere(&s), "6", "the server stayed with the client");
    assert_eq!(extended_count(&mut c), "6");
    // Two COPYs in one query, each fed after the server began it.
    c.send(&query("copy copy_z from stdin; copy copy_z from stdin"));
    assert_eq!(tags(&c.take(1)), "G");
    c.send(&copy_rows(b"9\n"));
    assert_eq!(tags(&c.take(2)), "CG");
    c.send(&copy_rows(b"10\n"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(served_elsewhere(&s), "8", "the server stayed with the client");
    assert_eq!(extended_count(&mut c), "8");
    // A COPY sent at once whose query fails before it begins: its data is ignored.
    let mut b = query("copy no_such_table from stdin");
    b.extend(copy_rows(b"1\n"));
    c.send(&b);
    assert_eq!(tags(&c.until_ready()), "EZ");
    assert_eq!(served_elsewhere(&s), "8", "the server stayed with the client");
    c.send(&query("copy copy_z from stdin"));
    assert_eq!(tags(&c.take(1)), "G");
    c.send(&copy_rows(b"11\n"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(extended_count(&mut c), "9");
    assert_eq!(served_elsewhere(&s), "9");
}

/// An extended-protocol COPY FROM STDIN that fails on a bad row: the server then
/// skips everything up to the client's next Sync, so it stays with this client until
/// that Sync is answered; the next client on the single server is served correctly.
#[test]
fn failed_extended_copy_in_keeps_the_server_until_sync() {
    let (pg, s) = setup(1, "transaction");
    pg.psql("CREATE TABLE copy_bad (a int); GRANT ALL ON copy_bad TO u_trust");
    let mut c = trust(&s);
    let b = extended_query("copy copy_bad from stdin");
    c.send(&b);
    assert_eq!(tags(&c.take(3)), "12G");
    let data = copy_rows(b"1\nnot a number\n");
    c.send(&data);
    c.expect_error("22P02", "");
    // Another client asks for the only server meanwhile: it must not get it before
    // the first client's Sync.
    let mut d = trust(&s);
    d.send(&query("select 5"));
    assert!(one_client_queued(s.port, "u_trust", "", "app"), "the second client never queued");
    c.send(&sync());
    assert_eq!(tags(&c.until_ready()), "Z");
    assert_eq!(first_value(&d.until_ready()), "5");
    c.send(&query("select count(*) from copy_bad"));
    assert_eq!(first_value(&c.until_ready()), "0");
}

/// A simple-query COPY FROM STDIN that fails on a bad row, from a client that stops
/// there without ending the COPY: PostgreSQL leaves COPY mode with its ReadyForQuery,
/// so the client's next request (a Sync among it) is answered as usual, and the server
/// goes back to the pool afterwards; data the client still sends for the failed COPY
/// is ignored.
#[test]
fn a_failed_simple_copy_in_ends_with_its_ready_for_query() {
    let (pg, s) = setup(1, "transaction");
    pg.psql("CREATE TABLE copy_v (a int); GRANT ALL ON copy_v TO u_trust");
    let mut c = trust(&s);
    c.send(&query("copy copy_v from stdin"));
    assert_eq!(tags(&c.take(1)), "G");
    c.send(&msg(b'd', b"1\nnot a number\n"));
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "22P02".to_string()));
    c.send(&extended_query("select 7"));
    let m = c.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("12DCZ".to_string(), "7".to_string()));
    assert_eq!(from_another_client(&s, "select 3"), "3", "the server stayed with the client");
    // Late data and the end of the failed COPY: ignored by PostgreSQL, and not taken
    // for a later COPY's.
    c.send(&copy_rows(b"2\n"));
    c.send(&extended_query("copy copy_v from stdin"));
    assert_eq!(tags(&c.take(3)), "12G");
    c.send(&[copy_rows(b"4\n"), sync()].concat());
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(from_another_client(&s, "select string_agg(a::text, ',') from copy_v"), "4");
}

/// Two COPYs in one query sent at once with their data and a Sync inside the first:
/// PostgreSQL ignores the Sync (it reads it in COPY mode); the second COPY's end must
/// still be known as sent (a Sync after it counts again), and the server is free when
/// the transaction ends.
#[test]
fn a_sync_inside_the_first_of_two_copies_sent_at_once() {
    let (pg, s) = setup(1, "transaction");
    pg.psql("CREATE TABLE copy_u (a int); GRANT ALL ON copy_u TO u_trust");
    let mut c = trust(&s);
    // In a transaction block: what follows runs on the same link.
    c.send(&query("begin"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    let mut b = query("copy copy_u from stdin; copy copy_u from stdin");
    b.extend([msg(b'd', b"1\n"), sync(), msg(b'c', b""), copy_rows(b"2\n")].concat());
    c.send(&b);
    assert_eq!(tags(&c.until_ready()), "GCGCZ");
    c.send(&extended_query("select count(*) from copy_u"));
    let m = c.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("12DCZ".to_string(), "2".to_string()));
    c.send(&query("commit"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(from_another_client(&s, "select 3"), "3", "the server stayed with the client");
}

/// Two extended-protocol COPYs sent whole under one Sync: that Sync ends both, and
/// the server goes back to the pool once it is answered.
#[test]
fn two_extended_copies_under_one_sync_release_the_server() {
    for mode in ["transaction", "session"] {
        let (pg, s) = setup(1, mode);
        pg.psql("CREATE TABLE copy_two (a int); GRANT ALL ON copy_two TO u_trust");
        let mut c = trust(&s);
        let copy = [bind("", "", &[]), execute("", 0), copy_rows(b"1\n")].concat();
        c.send(&[parse("", "copy copy_two from stdin"), copy.clone(), copy, sync()].concat());
        assert_eq!(tags(&c.until_ready()), "12GC2GCZ", "{mode}");
        server_free_after(&s, mode, c);
    }
}

/// A pool of one in transaction mode, a table and a view on it for the failed-COPY
/// tests, and a client whose server is the backend `pid`.
fn copy_setup() -> (PgCluster, Sluice, Raw, String) {
    let (pg, s) = setup(1, "transaction");
    pg.psql(
        "CREATE TABLE copy_t (a int); CREATE VIEW copy_tv AS SELECT * FROM copy_t; \
         GRANT ALL ON copy_t, copy_tv TO u_trust",
    );
    let mut c = trust(&s);
    c.send(&query("select pg_backend_pid()"));
    let pid = first_value(&c.until_ready());
    (pg, s, c, pid)
}

/// A COPY begun, then a bad row, a Sync, its end and `behind` sent at once: PostgreSQL
/// fails on the row, then answers the Sync, which Sluice cannot tell from a Sync read
/// in COPY mode and ignored. Before the server goes back to the pool Sluice probes it,
/// and all that comes before the probe's answer is the client's.
fn failed_copy_with_a_sync_inside(c: &mut Raw, behind: &[u8]) {
    c.send(&query("copy copy_t from stdin"));
    assert_eq!(tags(&c.take(1)), "G");
    c.send(&[msg(b'd', b"not a number\n"), sync(), msg(b'c', b""), behind.to_vec()].concat());
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "22P02".to_string()));
    assert_eq!(tags(&c.until_ready()), "Z", "the Sync's answer");
}

/// A COPY into a view sent at once with a Sync before its data and one after, and a
/// query behind: it fails right after CopyInResponse, before reading the first Sync, so
/// PostgreSQL answers both Syncs, where a COPY that reads its input ignores the first.
#[test]
fn a_copy_failing_before_its_early_sync_is_read_does_not_reach_the_next_client() {
    let (_pg, s, mut c, pid) = copy_setup();
    let mut b = [parse("", "copy copy_tv from stdin"), bind("", "", &[]), execute("", 0), sync()].concat();
    b.extend([copy_rows(b"1\n"), sync(), query("select 42")].concat());
    c.send(&b);
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[3].1)), ("12GEZ".to_string(), "42809".to_string()));
    assert_eq!(tags(&c.until_ready()), "Z", "the second Sync's answer");
    let m = c.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("TDCZ".to_string(), "42".to_string()));
    others_served_by_the_same_server(&s, &pid);
}

/// A Sync sent inside a COPY the server began, behind a row that fails.
#[test]
fn a_sync_inside_a_copy_failing_on_its_data_does_not_reach_the_next_client() {
    let (_pg, s, mut c, pid) = copy_setup();
    failed_copy_with_a_sync_inside(&mut c, b"");
    others_served_by_the_same_server(&s, &pid);
}

/// A COPY with an early Sync that fails on its data (the Sync read in COPY mode and
/// ignored, as with tokio-postgres): nothing more comes, and the server is kept.
#[test]
fn an_early_sync_read_inside_a_failing_copy_is_not_answered() {
    let (_pg, s, mut c, pid) = copy_setup();
    c.send(&[parse("", "copy copy_t from stdin"), bind("", "", &[]), execute("", 0), sync()].concat());
    assert_eq!(tags(&c.take(3)), "12G");
    c.send(&[copy_rows(b"not a number\n"), sync()].concat());
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "22P02".to_string()));
    others_served_by_the_same_server(&s, &pid);
}

/// With a transaction begun and failed behind the late answer: the probe finds the
/// server in that failed transaction and answers all the same; the server stays with
/// the client until its ROLLBACK.
#[test]
fn the_probe_answers_in_a_failed_transaction() {
    let (_pg, s, mut c, pid) = copy_setup();
    failed_copy_with_a_sync_inside(&mut c, &query("begin; select 1/0"));
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[1].1), &m[2].1[..]), ("CEZ".to_string(), "22012".to_string(), &b"E"[..]));
    c.send(&query("select 1"));
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "25P02".to_string()), "in the failed transaction");
    c.send(&query("rollback"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    others_served_by_the_same_server(&s, &pid);
}

/// With DISCARD ALL behind it, answered before or after the probe went out: still
/// recorded (the server's statements are gone, and a client preparing the same text
/// gets it parsed again, not taken as there).
#[test]
fn a_discard_all_answered_around_the_probe_is_recorded() {
    let (_pg, s, mut c, pid) = copy_setup();
    c.send(&[parse("s1", "select 1"), sync()].concat());
    assert_eq!(tags(&c.until_ready()), "1Z");
    failed_copy_with_a_sync_inside(&mut c, &query("discard all"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    let mut other = trust(&s);
    other.send(&[parse("s2", "select 1"), bind("", "s2", &[]), execute("", 0), sync()].concat());
    let m = other.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("12DCZ".to_string(), "1".to_string()), "{m:?}");
    drop(other);
    others_served_by_the_same_server(&s, &pid);
}

/// With a whole COPY behind it (its data and end sent before the probe): it runs.
#[test]
fn a_whole_copy_behind_the_probe_runs() {
    let (_pg, s, mut c, pid) = copy_setup();
    failed_copy_with_a_sync_inside(&mut c, &[query("copy copy_t from stdin"), copy_rows(b"5\n")].concat());
    assert_eq!(tags(&c.until_ready()), "GCZ");
    c.send(&query("select count(*) from copy_t"));
    assert_eq!(first_value(&c.until_ready()), "1");
    others_served_by_the_same_server(&s, &pid);
}

/// With an extended-protocol COPY behind it, a Sync inside that one too, failing on
/// its data: the late answer is not taken for that Sync, which the server ignores.
#[test]
fn an_extended_copy_behind_the_probe_keeps_its_own_sync_ignored() {
    let (_pg, s, mut c, pid) = copy_setup();
    let behind = [extended_query("copy copy_t from stdin"), msg(b'd', b"not a number\n")].concat();
    failed_copy_with_a_sync_inside(&mut c, &behind);
    let m = c.take(4);
    assert_eq!((tags(&m), sqlstate(&m[3].1)), ("12GE".to_string(), "22P02".to_string()));
    c.send(&[msg(b'c', b""), sync()].concat());
    assert_eq!(tags(&c.until_ready()), "Z");
    others_served_by_the_same_server(&s, &pid);
}

/// With a COPY behind it whose data comes later. If the server began it before Sluice
/// probed, the probe waits for its end; if after, the server read the probe as that
/// COPY's data and failed it: the client is told, and the server closed. (Which one
/// depends on timing; `client::copy`'s unit tests pin both down.) The server's
/// CopyInResponse and its error for the probe may come in one read: the client then
/// gets only the error.
#[test]
fn a_copy_behind_the_probe_with_its_data_later_runs_or_ends_the_link() {
    let (_pg, s, mut c, pid) = copy_setup();
    failed_copy_with_a_sync_inside(&mut c, &query("copy copy_t from stdin"));
    let (mut tag, mut body) = c.recv().expect("a reply");
    if tag == b'G' {
        c.send(&copy_rows(b"6\n"));
        (tag, body) = c.recv().expect("a reply");
    }
    if tag == b'C' {
        assert_eq!(tags(&c.take(1)), "Z");
        c.send(&query("select count(*) from copy_t"));
        assert_eq!(first_value(&c.until_ready()), "1");
        return others_served_by_the_same_server(&s, &pid);
    }
    assert_eq!((tag, sqlstate(&body)), (b'E', "08P01".to_string()), "{}", field(&body, b'M'));
    assert!(field(&body, b'M').contains("probe"), "{}", field(&body, b'M'));
    assert!(c.closed());
    assert_ne!(another_clients_backend(&s), pid, "the server was kept");
}

/// Session mode: the same COPY into a view passes through as PostgreSQL answers it, and
/// when the client leaves, its server, which may still answer, is closed, not reset for
/// the next client.
#[test]
fn session_mode_closes_a_server_left_unsure_by_a_failed_copy() {
    let (pg, s) = setup(1, "session");
    pg.psql(
        "CREATE TABLE copy_s (a int); CREATE VIEW copy_sv AS SELECT * FROM copy_s; GRANT ALL ON copy_sv TO u_trust",
    );
    let mut c = trust(&s);
    c.send(&query("select pg_backend_pid()"));
    let pid = first_value(&c.until_ready());
    let mut b = [parse("", "copy copy_sv from stdin"), bind("", "", &[]), execute("", 0), sync()].concat();
    b.extend([copy_rows(b"1\n"), sync(), query("select 42")].concat());
    c.send(&b);
    assert_eq!(tags(&c.until_ready()), "12GEZ");
    assert_eq!(tags(&c.until_ready()), "Z", "the second Sync's answer");
    assert_eq!(first_value(&c.until_ready()), "42");
    c.send(&msg(b'X', b""));
    assert!(c.closed());
    assert_ne!(another_clients_backend(&s), pid, "the server was kept");
}

/// Three clients in turn get their own answer, from the backend `pid` (the only server,
/// kept and lent again).
fn others_served_by_the_same_server(s: &Sluice, pid: &str) {
    for _ in 0..3 {
        assert_eq!(another_clients_backend(s), pid, "the server was not kept");
    }
}

/// The backend a new client's query runs on; its answer must be exactly its own.
fn another_clients_backend(s: &Sluice) -> String {
    let mut other = trust(s);
    other.send(&query("select pg_backend_pid()"));
    let m = other.until_ready();
    assert_eq!(tags(&m), "TDCZ", "another client got a reply that was not its own");
    first_value(&m)
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

/// An ErrorResponse longer than what Sluice reads whole (it quotes a 2 MB value)
/// reaches the client intact, and the connection goes on.
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
    let s = Sluice::builder(&pg).general("auth_type", "\"trust\"").general("client_login_timeout", "0.5").start();
    let mut c = trust(&s);
    c.send(&query("do $$ begin raise notice 'hello there'; end $$"));
    let m = c.until_ready();
    assert_eq!(tags(&m), "NCZ");
    assert_eq!(field(&m[0].1, b'M'), "hello there");
    // A client that never finishes its login is closed with an error.
    let mut idle = Raw::open(s.port);
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
