//! The TLS layer seen by a rustls client: direct TLS with ALPN (PostgreSQL 17),
//! SSLRequest with and without ALPN, GSSENCRequest, TLS versions (each refusal by the
//! alert or error the client gets and the line Sluice logs), how connections end
//! (close_notify both ways, a socket dropped without one), and large results and admin
//! console replies over TLS.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use rustls::{AlertDescription, InvalidMessage};

use crate::client::{self, GSSENC_REQUEST, NO_ALPN, Opts, PG_ALPN, SSL_REQUEST};
use crate::common::console::kill_client_of;
use crate::common::{PgCluster, Sluice, TestCerts, psql_cmd};
use crate::raw::{self, Raw, first_column, sqlstate};
use crate::{client_tls, run_sql};

fn trust_sluice(pg: &PgCluster, certs: &TestCerts, mode: &str) -> Sluice {
    let b = Sluice::builder(pg).general("auth_type", "\"trust\"").database("app", &[("pool_size", "1")]);
    client_tls(b, mode, &certs.server, certs).start()
}

/// The rustls error behind a failed handshake or read; None for plain I/O errors (EOF).
fn rustls_error(e: &std::io::Error) -> Option<&rustls::Error> {
    e.get_ref()?.downcast_ref()
}

#[test]
fn direct_tls_needs_alpn_postgresql() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let s = trust_sluice(&pg, &certs, "require");
    let mut sock = client::direct(s.port, &client::config(&certs.ca, &PG_ALPN)).expect("direct handshake");
    assert_eq!(sock.conn.alpn_protocol(), Some(&b"postgresql"[..]));
    let msgs = client::login(&mut sock, "u_trust").expect("login over direct TLS");
    assert_eq!(msgs[0].0, b'R');
    assert_eq!(client::query_value(&mut sock, "select 'direct'"), "direct");

    // Without "postgresql" among the ALPN protocols, Sluice closes the socket on reading
    // the ClientHello, before any answer: the client's handshake meets the end of stream.
    let no_alpn = "client disconnected: direct TLS connection without the ALPN protocol \"postgresql\"";
    for (i, alpn) in [&NO_ALPN, &Opts { alpn: &[b"http/1.1"], tls12_only: false }].into_iter().enumerate() {
        let e = client::direct(s.port, &client::config(&certs.ca, alpn)).err();
        let e = e.unwrap_or_else(|| panic!("direct TLS with ALPN {:?} must be refused", alpn.alpn));
        assert_eq!(e.kind(), ErrorKind::UnexpectedEof, "ALPN {:?}: {e}", alpn.alpn);
        assert!(rustls_error(&e).is_none(), "no alert, just a close: {e}");
        assert!(
            s.wait_log_times(no_alpn, i + 1, Duration::from_secs(10)),
            "ALPN {:?}: no {no_alpn:?} in the log:\n{}",
            alpn.alpn,
            s.log()
        );
    }
    // With client TLS disabled, a ClientHello is no startup packet: its first bytes read
    // as a length out of range, answered by a plaintext FATAL that rustls cannot parse.
    let plain = Sluice::builder(&pg).general("auth_type", "\"trust\"").start();
    let e = client::direct(plain.port, &client::config(&certs.ca, &PG_ALPN)).expect_err("refused");
    assert!(
        matches!(rustls_error(&e), Some(rustls::Error::InvalidMessage(InvalidMessage::InvalidContentType))),
        "{e:?}"
    );
    let fatal = "client disconnected: invalid startup packet length";
    assert!(plain.wait_log(fatal, Duration::from_secs(10)), "no {fatal:?} in the log:\n{}", plain.log());
    let log = plain.log();
    let line = log.lines().find(|l| l.contains(fatal)).unwrap_or_default();
    assert!(line.contains(" (08P01)"), "a protocol violation: {line}");
}

#[test]
fn ssl_request_with_and_without_alpn() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let s = trust_sluice(&pg, &certs, "prefer");
    for opts in [&NO_ALPN, &PG_ALPN] {
        let mut sock = client::negotiated(s.port, &client::config(&certs.ca, opts)).expect("handshake");
        client::login(&mut sock, "u_trust").expect("login");
        assert_eq!(client::query_value(&mut sock, "select 1"), "1");
    }
    // Offering ALPN without "postgresql" is refused with the no_application_protocol
    // alert, as PostgreSQL 17 does.
    let http = Opts { alpn: &[b"http/1.1"], tls12_only: false };
    let e = client::negotiated(s.port, &client::config(&certs.ca, &http)).expect_err("refused");
    let alert = rustls::Error::AlertReceived(AlertDescription::NoApplicationProtocol);
    assert_eq!(rustls_error(&e), Some(&alert), "{e:?}");
    let line = "client disconnected: TLS handshake failed: peer doesn't support any known protocol";
    assert!(s.wait_log(line, Duration::from_secs(10)), "no {line:?} in the log:\n{}", s.log());
    // TLS 1.2 works by default...
    let tls12 = Opts { alpn: &[], tls12_only: true };
    let mut sock = client::negotiated(s.port, &client::config(&certs.ca, &tls12)).expect("TLS 1.2");
    assert_eq!(sock.conn.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_2));
    client::login(&mut sock, "u_trust").expect("login over TLS 1.2");
    // ...and not when client_tls_protocols leaves it out: a protocol_version alert.
    let b = Sluice::builder(&pg).general("auth_type", "\"trust\"").general("client_tls_protocols", "[\"tlsv1.3\"]");
    let only13 = client_tls(b, "require", &certs.server, &certs).start();
    let e = client::negotiated(only13.port, &client::config(&certs.ca, &tls12)).expect_err("TLS 1.2 refused");
    let alert = rustls::Error::AlertReceived(AlertDescription::ProtocolVersion);
    assert_eq!(rustls_error(&e), Some(&alert), "{e:?}");
    let line = "client disconnected: TLS handshake failed: peer is incompatible: Tls12NotOfferedOrEnabled";
    assert!(only13.wait_log(line, Duration::from_secs(10)), "no {line:?} in the log:\n{}", only13.log());
}

#[test]
fn gssenc_is_refused_then_ssl_is_accepted() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let s = trust_sluice(&pg, &certs, "require");
    let mut tcp = TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    assert_eq!(client::request(&mut tcp, GSSENC_REQUEST), b'N');
    assert_eq!(client::request(&mut tcp, SSL_REQUEST), b'S');
    let mut sock = client::handshake(tcp, &client::config(&certs.ca, &PG_ALPN)).expect("handshake");
    client::login(&mut sock, "u_trust").expect("login");
    // An encryption request inside TLS is a protocol violation.
    let mut sock = client::negotiated(s.port, &client::config(&certs.ca, &PG_ALPN)).unwrap();
    sock.write_all(&[0, 0, 0, 8, 4, 210, 22, 47]).unwrap();
    sock.flush().unwrap();
    let (tag, body) = client::recv(&mut sock).expect("an error");
    assert_eq!((tag, sqlstate(&body).as_str()), (b'E', "08P01"));
}

#[test]
fn plaintext_sent_with_the_ssl_request_is_refused() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let s = trust_sluice(&pg, &certs, "require");
    let mut r = Raw::open(s.port);
    let mut bytes = vec![0, 0, 0, 8, 4, 210, 22, 47];
    bytes.extend(raw::startup(&[("user", "u_trust"), ("database", "app")], 3 << 16));
    r.send(&bytes);
    let (tag, body) = r.recv().expect("an error, not 'S'");
    assert_eq!((tag, sqlstate(&body).as_str()), (b'E', "08P01"));
    assert!(r.closed());
}

#[test]
fn close_notify_both_ways_and_abrupt_closes() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let s = trust_sluice(&pg, &certs, "require");
    let config = client::config(&certs.ca, &PG_ALPN);

    // Terminate, then close_notify: Sluice answers with its own close_notify, so the
    // client reads a clean end of stream (rustls reports a missing one as an error).
    let mut sock = client::negotiated(s.port, &config).unwrap();
    client::login(&mut sock, "u_trust").unwrap();
    sock.write_all(&raw::msg(b'X', b"")).unwrap();
    sock.conn.send_close_notify();
    sock.flush().unwrap();
    let mut rest = Vec::new();
    assert_eq!(sock.read_to_end(&mut rest).expect("clean close_notify from sluice"), 0);

    // close_notify alone, in the middle of a transaction (npgsql-style half-close).
    let mut sock = client::negotiated(s.port, &config).unwrap();
    client::login(&mut sock, "u_trust").unwrap();
    assert_eq!(client::query_value(&mut sock, "begin; select 1"), "1");
    sock.conn.send_close_notify();
    sock.flush().unwrap();
    assert_eq!(sock.read_to_end(&mut rest).expect("clean close from sluice"), 0);

    // A TCP close without close_notify, mid-transaction: the only server is rolled back
    // and lent to the next client.
    let mut sock = client::negotiated(s.port, &config).unwrap();
    client::login(&mut sock, "u_trust").unwrap();
    assert_eq!(client::query_value(&mut sock, "begin; select 2"), "2");
    drop(sock);
    let mut next = client::negotiated(s.port, &config).unwrap();
    client::login(&mut next, "u_trust").unwrap();
    assert_eq!(
        client::query_value(&mut next, "select count(*) from pg_stat_activity where state like 'idle in%'"),
        "0"
    );
    let mut plain = Raw::open(s.port);
    plain.send(&raw::startup(&[("user", "u_trust"), ("database", "app")], 3 << 16));
    let (tag, body) = plain.recv().expect("an error");
    assert_eq!((tag, sqlstate(&body).as_str()), (b'E', "28000"), "plaintext login refused under require");
    let socket = s.socket_dir.display().to_string();
    let r = run_sql(psql_cmd(s.port, &socket, "u_trust", "", "app"), "select 4");
    assert_eq!(r.stdout, "4", "the Unix socket still works: {}", r.stderr);
}

#[test]
fn large_messages_stream_both_ways_over_tls() {
    // A result far larger than the socket buffers: the relay's writes must not leave the
    // tail inside rustls (the reason every write is flushed).
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let s = trust_sluice(&pg, &certs, "require");
    let mut sock = client::negotiated(s.port, &client::config(&certs.ca, &PG_ALPN)).unwrap();
    client::login(&mut sock, "u_trust").unwrap();
    let big = "x".repeat(8 << 20);
    assert_eq!(client::query_value(&mut sock, &format!("select length('{big}')")), (8 << 20).to_string());
    sock.write_all(&raw::query("select repeat('y', 30000000)")).unwrap();
    sock.flush().unwrap();
    let mut tags = String::new();
    let mut row_len = 0;
    loop {
        let (tag, body) = client::recv(&mut sock).expect("message");
        tags.push(char::from(tag));
        if tag == b'D' {
            row_len = body.len();
        }
        if tag == b'Z' {
            break;
        }
    }
    assert_eq!(tags, "TDCZ");
    assert_eq!(row_len, 2 + 4 + 30_000_000);
    assert_eq!(client::query_value(&mut sock, "select 'after'"), "after");
}

#[test]
fn large_admin_replies_arrive_whole_over_tls() {
    // A reply of over a megabyte, many times the 64 KiB of records rustls holds back
    // when the socket is full, must arrive whole and leave the session in step. (The
    // console once wrote without flushing, and the tail of such a reply could stay inside
    // rustls. That needs the socket full at the console's last write, which a client
    // cannot arrange: Sluice's send buffer grows to megabytes on loopback. The flush
    // itself is pinned by `tls::tests::send_leaves_nothing_inside_rustls`.)
    const DATABASES: usize = 6000;
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let mut b = Sluice::builder(&pg).general("auth_type", "\"trust\"").general("admin_users", "[\"u_trust\"]");
    let names: Vec<String> = (0..DATABASES).map(|i| format!("{i:05}_{}", "d".repeat(57))).collect();
    for name in &names {
        b = b.database(name, &[]);
    }
    let s = client_tls(b, "require", &certs.server, &certs).start();
    let mut sock = client::negotiated(s.port, &client::config(&certs.ca, &PG_ALPN)).expect("handshake");
    client::login_db(&mut sock, "u_trust", "pgbouncer").expect("admin console login over TLS");

    sock.write_all(&raw::query("SHOW DATABASES")).unwrap();
    sock.flush().unwrap();
    let (mut tags, mut rows, mut bytes) = (String::new(), Vec::new(), 0);
    loop {
        let got = client::recv(&mut sock);
        let (tag, body) = got.unwrap_or_else(|e| panic!("{e} after {} rows, {bytes} bytes", rows.len()));
        bytes += 5 + body.len();
        match tag {
            b'D' => rows.push(first_column(&body)),
            b'Z' => break,
            _ => tags.push(char::from(tag)),
        }
    }
    assert_eq!(tags, "TC");
    // The console's own row, then the databases in name order ("app" last).
    let mut expected = vec!["pgbouncer".to_string()];
    expected.extend(names);
    expected.push("app".to_string());
    assert!(rows == expected, "{} rows of {}: {:?} .. {:?}", rows.len(), expected.len(), rows.first(), rows.last());
    assert!(bytes > 1 << 20, "only {bytes} bytes");
    // The session goes on in step.
    assert_eq!(client::query_value(&mut sock, "SHOW VERSION"), format!("Sluice {}", env!("CARGO_PKG_VERSION")));
}

/// A TLS client killed while it reads nothing (Sluice's own replies to its Closes fill
/// both directions): its close_notify cannot go into the full socket, so Sluice gives
/// its last words up after 5 s and closes the connection, though the client never
/// reads, instead of holding its task and its connection for ever.
#[test]
fn last_words_to_a_tls_client_that_does_not_read_are_given_up() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let b = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("admin_users", r#"["u_trust"]"#)
        .database("app", &[("pool_size", "1")]);
    let s = client_tls(b, "allow", &certs.server, &certs).start();
    let mut sock = client::negotiated(s.port, &client::config(&certs.ca, &PG_ALPN)).unwrap();
    client::login(&mut sock, "u_trust").unwrap();
    assert_eq!(client::query_value(&mut sock, "begin; select 1"), "1");
    // Closes (answered by Sluice itself) written through rustls, nothing read back.
    let (mut conn, mut tcp) = (sock.conn, sock.sock);
    // Blocked for 5 s: Sluice stopped reading because its replies fill the socket, not
    // because a loaded machine held it off the CPU for a moment (with 2 s, a run beside
    // a valgrind job killed a client whose replies still fitted, which then closed at
    // once, correctly).
    tcp.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let batch: Vec<u8> = (0..4096).flat_map(|_| raw::msg(b'C', b"Sx\0")).collect();
    // Only the send timeout means blocked. An interrupted send is tried again (with a
    // send timeout set, a signal interrupts it even under SA_RESTART: signal(7)), and
    // any other error fails the test with its own message (a CI run once took an error
    // after 1 s for a blocked socket, and failed later, in the wrong place).
    let blocked = (0..(400 << 20) / batch.len()).any(|_| {
        conn.writer().write_all(&batch).unwrap();
        while conn.wants_write() {
            match conn.write_tls(&mut tcp) {
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return true;
                }
                Err(e) => panic!("writing to Sluice failed: {e}"),
            }
        }
        false
    });
    assert!(blocked, "the client's writes never blocked: Sluice kept reading");
    kill_client_of(s.port, "u_trust", "app");
    let killed = std::time::Instant::now();
    // Logged once the last words are over (the session, and its server, ended at once).
    let ended = s.wait_log("closed in the middle of a message to the client", Duration::from_secs(30));
    assert!(ended, "the killed client's connection was never closed:\n{}", s.log());
    assert!(
        killed.elapsed() >= Duration::from_secs(4),
        "closed after {:?}: its close_notify went out",
        killed.elapsed()
    );
    drop(tcp);
}
