//! Asking PostgreSQL for TLS: SSLRequest, its one-byte answer, then the handshake,
//! with the host name as SNI (DNS names only) and, for verify-full, as the name the
//! certificate must carry. Unix sockets stay plain, as with libpq.

use bytes::BytesMut;
use rustls::CertificateError;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_rustls::TlsConnector;

use super::ServerTls;
use crate::config::ServerTlsMode;
use crate::net::Stream;
use crate::protocol::build;

/// Why TLS to a server could not be set up; the texts follow libpq's.
#[derive(Debug, thiserror::Error)]
pub enum TlsConnectError {
    #[error("server does not support SSL, but SSL was required")]
    Refused,
    #[error("received invalid response to SSL negotiation: {0:?}")]
    BadResponse(char),
    #[error("\"{0}\" cannot be used as a TLS server name")]
    BadName(String),
    #[error("SSL error: {0}")]
    Handshake(String),
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Negotiates TLS on a freshly opened server connection per `tls.mode`; returns the
/// stream to log in on (TLS, or plain where the mode and the server allow it).
pub async fn negotiate(stream: Stream, tls: &ServerTls, host: &str) -> Result<Stream, TlsConnectError> {
    let Some(config) = tls.config() else {
        return Ok(stream);
    };
    let mut tcp = match stream {
        Stream::Tcp(tcp) => tcp,
        other => return Ok(other),
    };
    let mut out = BytesMut::new();
    build::ssl_request(&mut out);
    tcp.write_all(&out).await?;
    // One byte, read straight from the socket: anything the server sent after it stays
    // there and would be fed to the TLS handshake, never taken as protocol data.
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer).await?;
    match answer[0] {
        b'S' => {}
        b'N' if matches!(tls.mode, ServerTlsMode::Allow | ServerTlsMode::Prefer) => return Ok(Stream::Tcp(tcp)),
        b'N' => return Err(TlsConnectError::Refused),
        other => return Err(TlsConnectError::BadResponse(char::from(other))),
    }
    let name = ServerName::try_from(host.to_string()).map_err(|_| TlsConnectError::BadName(host.to_string()))?;
    let connected = TlsConnector::from(config.clone()).connect(name, tcp).await;
    let connected = connected.map_err(|e| TlsConnectError::Handshake(describe(&e, host)))?;
    Ok(Stream::TlsConnected(Box::new(connected)))
}

/// A handshake failure in the words libpq uses for the same failures.
fn describe(e: &std::io::Error, host: &str) -> String {
    match e.get_ref().and_then(|inner| inner.downcast_ref::<rustls::Error>()) {
        Some(rustls::Error::InvalidCertificate(c)) => certificate_failure(c, host),
        Some(other) => other.to_string(),
        None => e.to_string(),
    }
}

/// webpki spells presented names as `DnsName("a.example")` or `IpAddress(10.0.0.1)`.
fn bare(name: &str) -> &str {
    match name.split_once('(').and_then(|(_, inner)| inner.strip_suffix(')')) {
        Some(inner) => inner.trim_matches('"'),
        None => name,
    }
}

fn certificate_failure(e: &CertificateError, host: &str) -> String {
    use CertificateError as C;
    match e {
        C::NotValidForNameContext { presented, .. } => match presented.split_first().map(|(f, r)| (bare(f), r)) {
            Some((first, [])) => format!("server certificate for \"{first}\" does not match host name \"{host}\""),
            Some((first, rest)) => format!(
                "server certificate for \"{first}\" (and {} other name{}) does not match host name \"{host}\"",
                rest.len(),
                if rest.len() == 1 { "" } else { "s" }
            ),
            None => format!("server certificate does not match host name \"{host}\""),
        },
        C::NotValidForName => format!("server certificate does not match host name \"{host}\""),
        C::Expired | C::ExpiredContext { .. } => "certificate verify failed: certificate has expired".into(),
        C::NotValidYet | C::NotValidYetContext { .. } => {
            "certificate verify failed: certificate is not yet valid".into()
        }
        C::UnknownIssuer => {
            "certificate verify failed: the certificate is not signed by a CA in server_tls_ca_file".into()
        }
        C::BadSignature => "certificate verify failed: certificate signature failure".into(),
        other => format!("certificate verify failed: {other:?}"),
    }
}
