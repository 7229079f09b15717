//! The TLS layer seen by a rustls client: direct TLS with ALPN (PostgreSQL 17),
//! SSLRequest with and without ALPN, GSSENCRequest, TLS versions, and how
//! connections end (close_notify both ways, a socket dropped without one).

use std::io::{Read, Write};
use std::net::TcpStream;

use crate::client::{self, GSSENC_REQUEST, NO_ALPN, Opts, PG_ALPN, SSL_REQUEST};
use crate::common::{PgCluster, Sluice, TestCerts, psql_cmd};
use crate::raw::{self, Raw, sqlstate};
use crate::{client_tls, run_sql};

fn trust_sluice(pg: &PgCluster, certs: &TestCerts, mode: &str) -> Sluice {
    let b = Sluice::builder(pg).general("auth_type", "\"trust\"").database("app", &[("pool_size", "1")]);
    client_tls(b, mode, &certs.server, certs).start()
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

    for alpn in [&NO_ALPN, &Opts { alpn: &[b"http/1.1"], tls12_only: false }] {
        let config = client::config(&certs.ca, alpn);
        let refused = client::direct(s.port, &config).and_then(|mut sock| {
            client::login(&mut sock, "u_trust").map_err(std::io::Error::other)?;
            Ok(())
        });
        assert!(refused.is_err(), "direct TLS with ALPN {:?} must be refused", alpn.alpn);
    }
    // With client TLS disabled, a ClientHello is no startup packet.
    let plain = Sluice::builder(&pg).general("auth_type", "\"trust\"").start();
    let refused = client::direct(plain.port, &client::config(&certs.ca, &PG_ALPN));
    assert!(refused.is_err());
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
    // Offering ALPN without "postgresql" is refused, as PostgreSQL 17 does.
    let http = Opts { alpn: &[b"http/1.1"], tls12_only: false };
    let refused = client::negotiated(s.port, &client::config(&certs.ca, &http));
    assert!(refused.is_err());
    // TLS 1.2 works by default...
    let tls12 = Opts { alpn: &[], tls12_only: true };
    let mut sock = client::negotiated(s.port, &client::config(&certs.ca, &tls12)).expect("TLS 1.2");
    assert_eq!(sock.conn.protocol_version(), Some(rustls::ProtocolVersion::TLSv1_2));
    client::login(&mut sock, "u_trust").expect("login over TLS 1.2");
    // ...and not when client_tls_protocols leaves it out.
    let b = Sluice::builder(&pg).general("auth_type", "\"trust\"").general("client_tls_protocols", "[\"tlsv1.3\"]");
    let only13 = client_tls(b, "require", &certs.server, &certs).start();
    assert!(client::negotiated(only13.port, &client::config(&certs.ca, &tls12)).is_err());
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
