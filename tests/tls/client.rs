//! A blocking rustls client for tests that need control over the TLS side: direct TLS
//! or SSLRequest first, the ALPN list, TLS versions, close_notify; plus message I/O on
//! the encrypted stream.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};

pub type TlsSock = StreamOwned<ClientConnection, TcpStream>;

/// How the test client speaks TLS.
pub struct Opts<'a> {
    pub alpn: &'a [&'a [u8]],
    pub tls12_only: bool,
}

pub const PG_ALPN: Opts = Opts { alpn: &[b"postgresql"], tls12_only: false };
pub const NO_ALPN: Opts = Opts { alpn: &[], tls12_only: false };

/// A client config trusting the PEM CA at `ca`.
pub fn config(ca: &Path, opts: &Opts) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(ca).expect("read CA") {
        roots.add(cert.expect("CA certificate")).expect("add CA");
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let builder = ClientConfig::builder_with_provider(provider);
    let builder = if opts.tls12_only {
        builder.with_protocol_versions(&[&rustls::version::TLS12])
    } else {
        builder.with_safe_default_protocol_versions()
    };
    let mut config = builder.expect("TLS versions").with_root_certificates(roots).with_no_client_auth();
    config.alpn_protocols = opts.alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

fn open(port: u16) -> TcpStream {
    let tcp = TcpStream::connect(("127.0.0.1", port)).expect("connect to sluice");
    tcp.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    tcp
}

/// Completes the handshake on `tcp` for server name "localhost".
pub fn handshake(tcp: TcpStream, config: &Arc<ClientConfig>) -> std::io::Result<TlsSock> {
    let name = ServerName::try_from("localhost").unwrap();
    let conn = ClientConnection::new(config.clone(), name).map_err(std::io::Error::other)?;
    let mut sock = StreamOwned::new(conn, tcp);
    while sock.conn.is_handshaking() {
        sock.conn.complete_io(&mut sock.sock)?;
    }
    // TLS 1.3: the server's verdict on our Finished (an alert, a close) comes after.
    Ok(sock)
}

/// A TLS handshake as the very first bytes (PostgreSQL 17's `sslnegotiation=direct`).
pub fn direct(port: u16, config: &Arc<ClientConfig>) -> std::io::Result<TlsSock> {
    handshake(open(port), config)
}

/// Sends `packet` (SSLRequest or GSSENCRequest) and returns Sluice's one-byte answer.
pub fn request(tcp: &mut TcpStream, code: u32) -> u8 {
    let mut p = 8u32.to_be_bytes().to_vec();
    p.extend(code.to_be_bytes());
    tcp.write_all(&p).unwrap();
    let mut one = [0u8; 1];
    tcp.read_exact(&mut one).expect("answer to the encryption request");
    one[0]
}

pub const SSL_REQUEST: u32 = 80877103;
pub const GSSENC_REQUEST: u32 = 80877104;

/// SSLRequest, 'S', then the handshake.
pub fn negotiated(port: u16, config: &Arc<ClientConfig>) -> std::io::Result<TlsSock> {
    let mut tcp = open(port);
    assert_eq!(request(&mut tcp, SSL_REQUEST), b'S');
    handshake(tcp, config)
}

/// Sends a startup packet for `user` (trust auth) and reads up to ReadyForQuery; Err
/// when the connection fails on the way (TLS alert, close).
pub fn login(sock: &mut TlsSock, user: &str) -> Result<Vec<(u8, Vec<u8>)>, String> {
    login_db(sock, user, "app")
}

pub fn login_db(sock: &mut TlsSock, user: &str, db: &str) -> Result<Vec<(u8, Vec<u8>)>, String> {
    let packet = crate::raw::startup(&[("user", user), ("database", db)], 3 << 16);
    sock.write_all(&packet).map_err(|e| e.to_string())?;
    sock.flush().map_err(|e| e.to_string())?;
    let mut out = Vec::new();
    loop {
        let m = recv(sock).map_err(|e| format!("{e} after {out:?}"))?;
        let done = m.0 == b'Z';
        out.push(m);
        if done {
            return Ok(out);
        }
    }
}

/// One message, or the I/O error (EOF included).
pub fn recv(s: &mut impl Read) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    s.read_exact(&mut head)?;
    let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len.saturating_sub(4)];
    s.read_exact(&mut body)?;
    Ok((head[0], body))
}

/// Runs a simple query and returns the first value of the first row.
pub fn query_value(sock: &mut TlsSock, sql: &str) -> String {
    sock.write_all(&crate::raw::query(sql)).unwrap();
    sock.flush().unwrap();
    let mut msgs = Vec::new();
    loop {
        let m = recv(sock).unwrap_or_else(|e| panic!("{sql}: {e} after {msgs:?}"));
        let done = m.0 == b'Z';
        msgs.push(m);
        if done {
            return crate::raw::first_value(&msgs);
        }
    }
}
