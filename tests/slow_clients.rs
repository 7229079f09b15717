//! Clients that stop reading a large result, or the replies Sluice writes itself: an
//! admin KILL_CLIENT or `query_timeout` still ends them and frees their server
//! connection for the next client, and the connection ends without an ErrorResponse
//! written into the middle of a row (also when the server dies in the middle of one).

mod common;

use std::io::{Read, Write};
use std::time::Duration;

use common::console::kill_client_of;
use common::raw::{Raw, first_value, msg, query, tags};
use common::{PgCluster, Sluice, wait_until};

/// One server connection, trust logins, `u_trust` an admin, `query_wait_timeout` 20 s
/// (a client left waiting fails instead of hanging the test).
fn sluice(pg: &PgCluster, extra: &[(&str, &str)]) -> Sluice {
    let mut b = Sluice::builder(pg)
        .general("auth_type", "\"trust\"")
        .general("pool_mode", "\"transaction\"")
        .general("admin_users", r#"["u_trust"]"#)
        .general("query_wait_timeout", "20")
        .database("app", &[("pool_size", "1")]);
    for (k, v) in extra {
        b = b.general(k, v);
    }
    b.start()
}

/// A client that asked for ~200 MB and reads none of it, returned once PostgreSQL is
/// blocked writing to Sluice: Sluice stopped reading the server because its own write
/// to the client does not go through.
fn stalled(pg: &PgCluster, s: &Sluice) -> Raw {
    let mut c = Raw::login(s.port, "u_trust", "app");
    c.send(&query("select repeat('x', 1000000) from generate_series(1, 200)"));
    let blocked = || pg.backends("wait_event = 'ClientWrite'") == 1;
    assert!(wait_until(Duration::from_secs(30), blocked), "PostgreSQL never blocked writing to Sluice");
    c
}

/// The next client gets the (only) server connection and its answer.
fn next_client_is_served(s: &Sluice) {
    let mut c = Raw::login(s.port, "u_trust", "app");
    c.send(&query("select 42"));
    let m = c.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("TDCZ".to_string(), "42".to_string()), "{m:?}");
}

/// Reads what the stalled client was sent, to the end: the connection must close, and
/// if it closes in the middle of a message, no ErrorResponse is inside that message
/// (the FATAL may only come at a message boundary).
fn reads_to_a_clean_end(mut c: Raw) {
    let mut bytes = Vec::new();
    c.stream().read_to_end(&mut bytes).expect("the connection closes");
    let mut at = 0;
    while at + 5 <= bytes.len() {
        let len = u32::from_be_bytes(bytes[at + 1..at + 5].try_into().unwrap()) as usize;
        if at + 1 + len > bytes.len() {
            break;
        }
        at += 1 + len;
    }
    let cut = &bytes[at..];
    assert!(
        !cut.windows(5).any(|w| [b"57P01", b"57014", b"08006"].contains(&w.try_into().unwrap())),
        "an ErrorResponse inside a message cut short ({} bytes read, the last {} a partial message)",
        bytes.len(),
        cut.len()
    );
}

#[test]
fn a_client_that_stops_reading_is_killed_and_its_server_freed() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[]);
    let c = stalled(&pg, &s);
    kill_client_of(s.port, "u_trust", "app");
    next_client_is_served(&s);
    reads_to_a_clean_end(c);
}

#[test]
fn query_timeout_ends_a_client_that_stops_reading() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[("query_timeout", "6")]);
    let c = stalled(&pg, &s);
    next_client_is_served(&s);
    reads_to_a_clean_end(c);
    assert!(s.log().contains("query_timeout"), "{}", s.log());
}

/// The server dies while the client has part of a row: the client reads what was sent
/// and the connection closes, with no 08006 written into the row.
#[test]
fn a_server_dying_mid_row_closes_the_client_without_a_torn_message() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[]);
    let c = stalled(&pg, &s);
    pg.psql("select pg_terminate_backend(pid) from pg_stat_activity where wait_event = 'ClientWrite'");
    reads_to_a_clean_end(c);
    next_client_is_served(&s);
}

/// Inside a transaction (its server held), a client sends named Closes, which Sluice
/// answers itself, and reads none of the answers: once both directions are full,
/// Sluice is stuck writing its own replies. A KILL_CLIENT still ends the session and
/// frees the server.
#[test]
fn a_client_that_stops_reading_sluices_own_replies_is_killed_and_its_server_freed() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[]);
    let mut c = Raw::login(s.port, "u_trust", "app");
    c.send(&query("begin"));
    c.until_ready();
    let mut writer = c.stream().try_clone().expect("a second handle");
    // Blocked for 5 s: not a stall of a loaded machine, Sluice stopped reading.
    writer.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let batch: Vec<u8> = (0..8192).flat_map(|_| msg(b'C', b"Sx\0")).collect();
    // Bounded: 400 MB of Closes would be 250 MB of answers, far more than the sockets hold.
    let blocked = (0..(400 << 20) / batch.len()).any(|_| writer.write_all(&batch).is_err());
    assert!(blocked, "the client's writes never blocked: Sluice kept reading");
    kill_client_of(s.port, "u_trust", "app");
    next_client_is_served(&s);
    assert!(c.closed(), "the stalled client's connection stays open");
}

/// Writes `bytes` to `w` (whose writes time out) until all went out, the peer closed the
/// connection (EPIPE, reset), or `patience` passed; returns how many went out. A write
/// timeout is not taken for the end: on a loaded machine Sluice may stall for a while
/// and then read on. (Each write goes on where the last stopped, so no message is
/// sent torn.)
fn write_until_closed(w: &mut std::net::TcpStream, bytes: &[u8], patience: Duration) -> usize {
    use std::io::ErrorKind::{Interrupted, TimedOut, WouldBlock};
    let deadline = std::time::Instant::now() + patience;
    let mut at = 0;
    while at < bytes.len() && std::time::Instant::now() < deadline {
        match w.write(&bytes[at..]) {
            Ok(0) => break,
            Ok(n) => at += n,
            Err(e) if matches!(e.kind(), WouldBlock | TimedOut | Interrupted) => continue,
            Err(_) => break,
        }
    }
    at
}

/// A client whose `pg_sleep(secs)` runs on the server, sent through the extended
/// protocol with a Flush and no Sync (its answers owed).
fn sleeping(pg: &PgCluster, s: &Sluice, secs: u32) -> Raw {
    use common::raw::{bind, execute, flush, parse};
    let mut c = Raw::login(s.port, "u_trust", "app");
    let sql = format!("select pg_sleep({secs})");
    c.send(&[parse("", &sql), bind("", "", &[]), execute("", 0), flush()].concat());
    assert!(pg.running(&sql), "the query never started");
    c
}

/// Behind a query the server is still running, a client sends named Closes, which
/// Sluice answers itself: their replies wait behind the query's, and nothing reaches
/// the server to hold the client back. Past a bound the client is refused (53400)
/// instead of Sluice's memory growing without end, and its server is freed.
#[test]
fn replies_sluice_owes_behind_a_running_query_are_bounded() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[]);
    let mut c = sleeping(&pg, &s, 60);
    let mut writer = c.stream().try_clone().expect("a second handle");
    writer.set_write_timeout(Some(Duration::from_millis(500))).unwrap();
    // 40 batches of 4096: ten times the bound. Sluice may close the connection while
    // the client still writes.
    let closes: Vec<u8> = (0..40 * 4096).flat_map(|_| msg(b'C', b"Sx\0")).collect();
    let sent = write_until_closed(&mut writer, &closes, Duration::from_secs(30));
    assert!(sent > 16_384 * 8, "only {sent} bytes of Closes went out: the bound was never reached");
    c.expect_error("53400", "too many replies waiting behind the server's answers");
    assert!(c.closed(), "the refused client's connection stays open");
    next_client_is_served(&s);
}

/// The bound on Sluice's own replies counts those in a row behind the last message
/// that went to the server: a client pipelining many Closes, each followed by a Sync
/// the server answers, behind a query still running, is served in full.
#[test]
fn sluices_own_replies_between_requests_to_the_server_are_not_bounded() {
    use common::raw::sync;
    let pg = PgCluster::start();
    let s = sluice(&pg, &[]);
    let mut c = sleeping(&pg, &s, 1);
    let groups = 20_000;
    let batch: Vec<u8> = (0..groups).flat_map(|_| [msg(b'C', b"Sx\0"), sync()].concat()).collect();
    c.send(&batch);
    assert_eq!(tags(&c.take(3)), "12D");
    let m = c.take(2 * groups + 1);
    assert_eq!(tags(&m[..3]), "C3Z", "{:?}", &m[..3]);
    assert!(
        m[1..].chunks(2).all(|p| p[0].0 == b'3' && p[1].0 == b'Z'),
        "not one CloseComplete and ReadyForQuery per Sync"
    );
}
