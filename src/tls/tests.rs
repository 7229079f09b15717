//! Loading TLS settings, and Sluice's server side of TLS (`negotiate`) against an
//! in-process TLS server on loopback: verify modes, SNI, and the error texts.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::BytesMut;
use rcgen::{CertificateParams, DnType, Issuer, KeyPair};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::*;
use crate::net::Stream;

/// A CA and leaf certificates signed by it, as PEM files in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: Issuer<'static, KeyPair>,
}

impl Pki {
    fn new() -> Pki {
        let mut params = CertificateParams::new(Vec::new()).unwrap();
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let dir = tempfile::tempdir().unwrap();
        let name = format!("test CA {}", dir.path().display());
        params.distinguished_name.push(DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.path().join("ca.crt"), cert.pem()).unwrap();
        Pki { dir, ca: Issuer::new(params, key) }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Writes NAME.crt and NAME.key for a leaf with these SANs and common name.
    fn leaf(&self, name: &str, sans: &[&str], cn: &str, expired: bool) {
        let mut params = CertificateParams::new(sans.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
        params.distinguished_name.push(DnType::CommonName, cn);
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.ca).unwrap();
        std::fs::write(self.path(&format!("{name}.crt")), cert.pem()).unwrap();
        std::fs::write(self.path(&format!("{name}.key")), key.serialize_pem()).unwrap();
    }
}

fn config(dir: &Path, general: &str) -> Config {
    let path = dir.join("sluice.toml");
    let text = format!("[general]\n{general}\n");
    std::fs::write(&path, &text).unwrap();
    Config::parse(&text, &path).unwrap()
}

/// No TLS for clients by default; to servers `prefer`, as in PgBouncer and libpq.
#[test]
fn client_tls_off_and_server_tls_preferred_by_default() {
    let pki = Pki::new();
    let (c, s) = load(&config(pki.dir.path(), "")).unwrap();
    assert!(c.config().is_none() && s.config().is_some());
    let (_, s) = load(&config(pki.dir.path(), "server_tls_sslmode = \"disable\"")).unwrap();
    assert!(s.config().is_none());
}

#[test]
fn files_resolve_relative_to_the_config_and_errors_name_the_key() {
    let pki = Pki::new();
    pki.leaf("server", &["localhost"], "localhost", false);
    let ok = "client_tls_sslmode = \"verify-ca\"\nclient_tls_cert_file = \"server.crt\"\n\
              client_tls_key_file = \"server.key\"\nclient_tls_ca_file = \"ca.crt\"";
    assert!(ClientTls::load(&config(pki.dir.path(), ok)).unwrap().config().is_some());

    let missing = ok.replace("ca.crt", "nope.crt");
    let e = load(&config(pki.dir.path(), &missing)).unwrap_err().to_string();
    assert!(e.contains("sluice.toml:5: general.client_tls_ca_file: cannot read"), "{e}");
    assert!(e.contains("nope.crt"), "{e}");

    pki.leaf("other", &["localhost"], "other", false);
    let mismatch = ok.replace("server.key", "other.key");
    let e = ClientTls::load(&config(pki.dir.path(), &mismatch)).unwrap_err();
    assert_eq!(e.key, "client_tls_key_file");

    std::fs::write(pki.path("junk.crt"), "junk").unwrap();
    let junk = "server_tls_sslmode = \"verify-full\"\nserver_tls_ca_file = \"junk.crt\"";
    assert_eq!(ServerTls::load(&config(pki.dir.path(), junk)).unwrap_err().key, "server_tls_ca_file");
}

/// A fake PostgreSQL that answers SSLRequest with `answer`, then (for 'S') runs a TLS
/// handshake with NAME.crt and reports the SNI it saw; the handshake outcome is the
/// client's to judge.
async fn fake_server(pki: &Pki, cert: &str, answer: u8) -> (u16, tokio::task::JoinHandle<Option<String>>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let certs = files::certs(&pki.path(&format!("{cert}.crt"))).unwrap();
    let key = files::key(&pki.path(&format!("{cert}.key"))).unwrap();
    let server = ServerConfig::builder_with_provider(Arc::new(rustls::crypto::aws_lc_rs::default_provider()))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
    let task = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut request = [0u8; 8];
        tcp.read_exact(&mut request).await.unwrap();
        assert_eq!(request, [0, 0, 0, 8, 4, 210, 22, 47]);
        tcp.write_all(&[answer]).await.unwrap();
        if answer != b'S' {
            return None;
        }
        let start = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp).await.ok()?;
        let sni = start.client_hello().server_name().map(str::to_string);
        let _ = start.into_stream(Arc::new(server)).await;
        sni
    });
    (port, task)
}

async fn connect_with(
    pki: &Pki,
    mode: &str,
    cert: &str,
    host: &str,
    answer: u8,
) -> (Result<Stream, String>, Option<String>) {
    let cfg = config(pki.dir.path(), &format!("server_tls_sslmode = \"{mode}\"\nserver_tls_ca_file = \"ca.crt\""));
    let tls = ServerTls::load(&cfg).unwrap();
    let (port, server) = fake_server(pki, cert, answer).await;
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let r = negotiate(Stream::Tcp(tcp), &tls, host).await.map_err(|e| e.to_string());
    (r, server.await.unwrap())
}

#[tokio::test]
async fn verify_modes_against_good_expired_and_wrong_host_certificates() {
    let pki = Pki::new();
    pki.leaf("good", &["localhost", "127.0.0.1"], "localhost", false);
    pki.leaf("expired", &["localhost", "127.0.0.1"], "localhost", true);
    pki.leaf("wrong", &["wrong.example"], "wrong.example", false);

    let (r, sni) = connect_with(&pki, "verify-full", "good", "localhost", b'S').await;
    assert!(r.unwrap().is_tls());
    assert_eq!(sni.as_deref(), Some("localhost"), "SNI carries a DNS host name");
    let (r, sni) = connect_with(&pki, "verify-full", "good", "127.0.0.1", b'S').await;
    assert!(r.unwrap().is_tls(), "IP address SAN");
    assert_eq!(sni, None, "no SNI for an IP address");

    let (r, _) = connect_with(&pki, "verify-full", "wrong", "localhost", b'S').await;
    let e = r.unwrap_err();
    assert_eq!(e, "SSL error: server certificate for \"wrong.example\" does not match host name \"localhost\"");
    let (r, _) = connect_with(&pki, "verify-ca", "wrong", "localhost", b'S').await;
    assert!(r.unwrap().is_tls(), "verify-ca does not check the host name");
    let (r, _) = connect_with(&pki, "verify-ca", "expired", "localhost", b'S').await;
    assert_eq!(r.unwrap_err(), "SSL error: certificate verify failed: certificate has expired");
    let (r, _) = connect_with(&pki, "require", "expired", "localhost", b'S').await;
    assert!(r.unwrap().is_tls(), "require checks nothing about the certificate");

    let other = Pki::new();
    other.leaf("good", &["localhost"], "localhost", false);
    std::fs::copy(pki.path("ca.crt"), other.path("ca.crt")).unwrap();
    let (r, _) = connect_with(&other, "verify-ca", "good", "localhost", b'S').await;
    let e = r.unwrap_err();
    assert!(e.contains("not signed by a CA in server_tls_ca_file"), "{e}");
}

#[tokio::test]
async fn verify_full_falls_back_to_the_common_name_without_sans() {
    let pki = Pki::new();
    pki.leaf("cn_only", &[], "localhost", false);
    pki.leaf("wildcard", &[], "*.db.example", false);
    let (r, _) = connect_with(&pki, "verify-full", "cn_only", "localhost", b'S').await;
    assert!(r.unwrap().is_tls());
    let (r, _) = connect_with(&pki, "verify-full", "cn_only", "127.0.0.1", b'S').await;
    assert_eq!(
        r.unwrap_err(),
        "SSL error: server certificate for \"localhost\" does not match host name \"127.0.0.1\""
    );
    let (r, _) = connect_with(&pki, "verify-full", "wildcard", "eu1.db.example", b'S').await;
    assert!(r.unwrap().is_tls());
    for host in ["a.eu1.db.example", "db.example"] {
        let (r, _) = connect_with(&pki, "verify-full", "wildcard", host, b'S').await;
        assert!(r.unwrap_err().contains("does not match host name"), "{host}");
    }
    // With SANs, the common name is not looked at (as libpq).
    pki.leaf("san", &["other.example"], "localhost", false);
    let (r, _) = connect_with(&pki, "verify-full", "san", "localhost", b'S').await;
    assert!(r.unwrap_err().contains("server certificate for \"other.example\""));
}

#[tokio::test]
async fn a_server_without_tls() {
    let pki = Pki::new();
    pki.leaf("good", &["localhost"], "localhost", false);
    let (r, _) = connect_with(&pki, "prefer", "good", "localhost", b'N').await;
    assert!(matches!(r.unwrap(), Stream::Tcp(_)), "prefer falls back to plaintext");
    let (r, _) = connect_with(&pki, "require", "good", "localhost", b'N').await;
    assert_eq!(r.unwrap_err(), "server does not support SSL, but SSL was required");
    let (r, _) = connect_with(&pki, "require", "good", "localhost", b'E').await;
    assert_eq!(r.unwrap_err(), "received invalid response to SSL negotiation: 'E'");
}

/// Client TLS required with a "localhost" certificate from `pki`, plus `more` settings:
/// the loaded client and server sides.
fn localhost_tls(pki: &Pki, more: &str) -> (ClientTls, ServerTls) {
    pki.leaf("good", &["localhost"], "localhost", false);
    let cfg = config(
        pki.dir.path(),
        &format!(
            "client_tls_sslmode = \"require\"\nclient_tls_cert_file = \"good.crt\"\nclient_tls_key_file = \"good.key\"\n{more}"
        ),
    );
    load(&cfg).unwrap()
}

/// A writer faster than its reader: when `Stream::send` returns, nothing may be left
/// inside rustls. tokio-rustls keeps the tail of a write there when the socket is full
/// (write_all alone would return with it), and nothing would send it until the next
/// write: a client waiting for the end of a result would wait for ever.
#[tokio::test]
async fn send_leaves_nothing_inside_rustls() {
    let pki = Pki::new();
    let (client_side, server_side) = localhost_tls(&pki, "server_tls_sslmode = \"require\"");
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let big: Vec<u8> = (0..4u32 << 20).map(|i| (i % 251) as u8).collect();
    let expected = big.clone();
    let (done_tx, done_rx) = tokio::sync::oneshot::channel::<()>();
    let writer = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        // A small send buffer keeps the socket full at the last write.
        socket2::SockRef::from(&tcp).set_send_buffer_size(8 << 10).unwrap();
        let mut request = [0u8; 8];
        tcp.read_exact(&mut request).await.unwrap();
        tcp.write_all(b"S").await.unwrap();
        let mut stream = Stream::Tcp(tcp);
        let config = client_side.config().unwrap().clone();
        accept(&mut stream, config, Negotiation::SslRequest, &mut BytesMut::new()).await.unwrap();
        stream.send(&big).await.unwrap();
        let Stream::TlsAccepted(tls) = &stream else { panic!("not TLS") };
        let pending = tls.get_ref().1.wants_write();
        let _ = done_rx.await; // stay connected, silent, until the reader is done
        pending
    });
    // ...and a small receive window on the reader's side.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(8 << 10).unwrap();
    let tcp = socket.connect(([127, 0, 0, 1], port).into()).await.unwrap();
    let mut stream = negotiate(Stream::Tcp(tcp), &server_side, "localhost").await.unwrap();
    let mut got = Vec::with_capacity(expected.len());
    let mut chunk = vec![0u8; 16 << 10];
    while got.len() < expected.len() {
        let read = tokio::time::timeout(std::time::Duration::from_secs(10), stream.read(&mut chunk)).await;
        let n = read.expect("the rest of the data never arrived").unwrap();
        assert!(n > 0, "early EOF");
        got.extend_from_slice(&chunk[..n]);
        tokio::time::sleep(std::time::Duration::from_micros(200)).await; // a slow reader
    }
    assert!(got == expected);
    done_tx.send(()).unwrap();
    assert!(!writer.await.unwrap(), "send returned with TLS data still inside rustls");
}

/// A listener whose first connection goes through the direct-TLS accept once its
/// first `pre_read` bytes (a TLS record's first byte) were read the usual way. The
/// task gives the stream after the accept (TLS, or closed), the accept's outcome and
/// how many of the bytes read before it were left unconsumed.
async fn direct_tls_server(
    client_side: &ClientTls,
    pre_read: usize,
) -> (u16, tokio::task::JoinHandle<(Stream, Result<(), String>, usize)>) {
    let config = client_side.config().unwrap().clone();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = tokio::spawn(async move {
        let (mut tcp, _) = listener.accept().await.unwrap();
        let mut first = vec![0u8; pre_read];
        tcp.read_exact(&mut first).await.unwrap();
        assert_eq!(first[0], TLS_HANDSHAKE_RECORD);
        let mut buf = BytesMut::from(&first[..]);
        let mut stream = Stream::Tcp(tcp);
        let r = accept(&mut stream, config, Negotiation::Direct, &mut buf).await.map_err(|e| e.to_string());
        (stream, r, buf.len())
    });
    (port, server)
}

/// Direct TLS: the connection's first read may hold part of the ClientHello (here just
/// its record header); the handshake takes it from there and reads the rest.
#[tokio::test]
async fn direct_tls_continues_from_bytes_already_read() {
    let pki = Pki::new();
    // Sluice's own client side (ALPN "postgresql", verify-full) plays the client.
    let (client_side, server_side) =
        localhost_tls(&pki, "server_tls_sslmode = \"verify-full\"\nserver_tls_ca_file = \"ca.crt\"");
    let (port, server) = direct_tls_server(&client_side, 5).await;
    let tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let connector = tokio_rustls::TlsConnector::from(server_side.config().unwrap().clone());
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let (mut stream, r, left) = server.await.unwrap();
    r.unwrap();
    assert_eq!(left, 0, "the bytes read before the handshake were consumed");
    tls.write_all(b"ping").await.unwrap();
    let mut got = [0u8; 4];
    stream.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"ping");
    stream.send(b"pong").await.unwrap();
    tls.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"pong");
}

/// Runs the direct-TLS accept on a connection whose client sends `client_sends` and
/// then shuts down its sending side; gives the accept's outcome and what the client got.
async fn direct_accept_of(client_sends: &'static [u8]) -> (Result<(), String>, Vec<u8>) {
    let pki = Pki::new();
    let (client_side, _) = localhost_tls(&pki, "");
    let (port, server) = direct_tls_server(&client_side, 1).await;
    let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    tcp.write_all(client_sends).await.unwrap();
    tcp.shutdown().await.unwrap();
    let mut got = Vec::new();
    let _ = tcp.read_to_end(&mut got).await;
    let (stream, r, _) = server.await.unwrap();
    assert!(matches!(stream, Stream::Closed), "a failed handshake leaves the stream closed");
    (r, got)
}

/// A ClientHello record holding something else (a ServerHello) is refused with a TLS
/// alert to the client; a client that closes in the middle of its ClientHello ends
/// the handshake with an error, not a hang.
#[tokio::test]
async fn refused_and_unfinished_client_hellos() {
    let (r, got) = direct_accept_of(&[0x16, 0x03, 0x01, 0x00, 0x05, 0x02, 0x00, 0x00, 0x01, 0x00]).await;
    assert!(r.is_err(), "{r:?}");
    assert_eq!(got.first(), Some(&0x15), "an alert record: {got:?}");
    let (r, got) = direct_accept_of(&[0x16, 0x03, 0x01, 0x00, 0x40, 0x01]).await;
    assert!(r.unwrap_err().contains("closed the connection during the TLS handshake"));
    assert!(got.is_empty(), "{got:?}");
}
