//! Accepting TLS from a client, either after an SSLRequest answered 'S', or directly
//! when the connection starts with a TLS record (PostgreSQL 17's
//! `sslnegotiation=direct`), which must offer the ALPN protocol "postgresql".

use std::io;
use std::sync::Arc;

use bytes::{Buf, BytesMut};
use rustls::ServerConfig;
use rustls::server::{Accepted, Acceptor, ClientHello};
use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;
use tokio_rustls::StartHandshake;

use super::{ALPN_POSTGRESQL, common_name};
use crate::net::Stream;

/// The first byte of a TLS handshake record: a client starting with it is sending a
/// ClientHello, not a startup packet (whose first byte, of a length, is 0 here).
pub const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// How a client asked for TLS.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Negotiation {
    /// SSLRequest, answered 'S'. ALPN is optional, and must include "postgresql" when
    /// offered (rustls refuses the handshake otherwise).
    SslRequest,
    /// A ClientHello as the first bytes; ALPN "postgresql" is required.
    Direct,
}

#[derive(Debug, thiserror::Error)]
pub enum AcceptError {
    #[error("TLS handshake failed: {0}")]
    Handshake(std::io::Error),
    #[error("direct TLS connection without the ALPN protocol \"postgresql\"")]
    NoAlpn,
    #[error("TLS is only offered on TCP connections")]
    NotTcp,
}

/// Runs the server side of the handshake on `stream` (plain TCP) and replaces it with
/// the TLS stream. `buf` holds what was already read from the client (a direct TLS
/// client's first bytes: the connection's first read tells a ClientHello from a
/// startup packet, so no byte is peeked at first); it is consumed. On failure the
/// stream is left `Closed`: nothing more can be said to a client whose handshake failed.
pub async fn accept(
    stream: &mut Stream,
    config: Arc<ServerConfig>,
    how: Negotiation,
    buf: &mut BytesMut,
) -> Result<(), AcceptError> {
    let mut tcp = stream.take_tcp().ok_or(AcceptError::NotTcp)?;
    let accepted = read_client_hello(&mut tcp, buf).await?;
    if how == Negotiation::Direct && !offers_postgresql(&accepted.client_hello()) {
        return Err(AcceptError::NoAlpn);
    }
    let tls = StartHandshake::from_parts(accepted, tcp).into_stream(config).await.map_err(AcceptError::Handshake)?;
    *stream = Stream::TlsAccepted(Box::new(tls));
    Ok(())
}

/// Feeds rustls what `buf` holds, then reads the socket straight into it, until the
/// whole ClientHello is in. A ClientHello rustls refuses is answered with its alert.
async fn read_client_hello(tcp: &mut TcpStream, buf: &mut BytesMut) -> Result<Accepted, AcceptError> {
    let err = |kind: io::ErrorKind, what: &str| AcceptError::Handshake(io::Error::new(kind, what.to_string()));
    let mut acceptor = Acceptor::default();
    while !buf.is_empty() {
        let n = acceptor.read_tls(&mut &buf[..]).map_err(AcceptError::Handshake)?;
        if n == 0 {
            return Err(err(io::ErrorKind::InvalidData, "rustls took no bytes"));
        }
        buf.advance(n);
    }
    loop {
        match acceptor.accept() {
            Ok(Some(accepted)) => return Ok(accepted),
            Ok(None) => {}
            Err((e, mut alert)) => {
                let mut out = Vec::new();
                let _ = alert.write_all(&mut out);
                let _ = tcp.write_all(&out).await;
                return Err(AcceptError::Handshake(io::Error::new(io::ErrorKind::InvalidData, e)));
            }
        }
        tcp.readable().await.map_err(AcceptError::Handshake)?;
        match acceptor.read_tls(&mut TryRead(tcp)) {
            Ok(0) => {
                return Err(err(
                    io::ErrorKind::UnexpectedEof,
                    "the client closed the connection during the TLS handshake",
                ));
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(AcceptError::Handshake(e)),
        }
    }
}

/// A non-blocking read of the socket for rustls' `read_tls` (after `readable()`).
struct TryRead<'a>(&'a TcpStream);

impl io::Read for TryRead<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.try_read(buf)
    }
}

fn offers_postgresql(hello: &ClientHello<'_>) -> bool {
    hello.alpn().is_some_and(|mut protocols| protocols.any(|p| p == ALPN_POSTGRESQL))
}

/// The common name of the client's certificate (verified by rustls in the verify
/// modes), if the client is on TLS and sent one.
pub fn peer_common_name(stream: &Stream) -> Option<String> {
    match stream {
        Stream::TlsAccepted(s) => s.get_ref().1.peer_certificates()?.first().and_then(|c| common_name(c)),
        _ => None,
    }
}

/// "TLSv1.3 TLS13_AES_256_GCM_SHA384" for a client on TLS, None otherwise (for logs).
pub fn describe(stream: &Stream) -> Option<String> {
    let Stream::TlsAccepted(s) = stream else { return None };
    let conn = s.get_ref().1;
    let version = match conn.protocol_version() {
        Some(rustls::ProtocolVersion::TLSv1_3) => "TLSv1.3",
        Some(rustls::ProtocolVersion::TLSv1_2) => "TLSv1.2",
        _ => "TLS",
    };
    let suite = conn.negotiated_cipher_suite().and_then(|c| c.suite().as_str()).unwrap_or("");
    Some(format!("{version} {suite}").trim_end().to_string())
}
