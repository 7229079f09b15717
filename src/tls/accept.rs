//! Accepting TLS from a client, either after an SSLRequest answered 'S', or directly
//! when the connection starts with a TLS record (PostgreSQL 17's
//! `sslnegotiation=direct`), which must offer the ALPN protocol "postgresql".

use std::sync::Arc;

use rustls::ServerConfig;
use rustls::server::{Acceptor, ClientHello};
use tokio_rustls::LazyConfigAcceptor;

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
/// the TLS stream. On failure the stream is left `Closed`: nothing more can be said
/// to a client whose handshake failed.
pub async fn accept(stream: &mut Stream, config: Arc<ServerConfig>, how: Negotiation) -> Result<(), AcceptError> {
    let tcp = stream.take_tcp().ok_or(AcceptError::NotTcp)?;
    let start = LazyConfigAcceptor::new(Acceptor::default(), tcp).await.map_err(AcceptError::Handshake)?;
    if how == Negotiation::Direct && !offers_postgresql(&start.client_hello()) {
        return Err(AcceptError::NoAlpn);
    }
    let tls = start.into_stream(config).await.map_err(AcceptError::Handshake)?;
    *stream = Stream::TlsAccepted(Box::new(tls));
    Ok(())
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
