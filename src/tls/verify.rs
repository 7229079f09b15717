//! How Sluice checks PostgreSQL's certificate, one variant per `server_tls_sslmode`.
//! Every variant checks the handshake signatures, so the peer must hold the key of the
//! certificate it shows; what differs is what the certificate itself must prove.
//! verify-full follows libpq where webpki is stricter: a certificate without DNS or IP
//! subject alternative names is matched on its common name (a leading `*.` matching
//! one label), as certificates made per PostgreSQL's documentation often are.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

#[derive(Debug)]
pub enum ServerVerifier {
    /// `prefer`, `require`: encryption without authentication, as libpq does it.
    AnyCertificate { algs: WebPkiSupportedAlgorithms },
    /// `verify-ca`: the chain must lead to a trusted root; the host name is not checked.
    Chain { roots: Arc<RootCertStore>, algs: WebPkiSupportedAlgorithms },
    /// `verify-full`: chain and host name (DNS name or IP address).
    Full(Arc<WebPkiServerVerifier>),
}

impl ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        match self {
            ServerVerifier::AnyCertificate { .. } => Ok(ServerCertVerified::assertion()),
            ServerVerifier::Chain { roots, algs } => {
                let cert = ParsedCertificate::try_from(end_entity)?;
                verify_server_cert_signed_by_trust_anchor(&cert, roots, intermediates, now, algs.all)?;
                Ok(ServerCertVerified::assertion())
            }
            ServerVerifier::Full(v) => {
                match v.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now) {
                    // The chain is valid (webpki checks it first); no SAN names at all.
                    Err(Error::InvalidCertificate(CertificateError::NotValidForNameContext { presented, .. }))
                        if presented.is_empty() =>
                    {
                        common_name_matches(end_entity, server_name)
                    }
                    other => other,
                }
            }
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        match self {
            ServerVerifier::Full(v) => v.verify_tls12_signature(message, cert, dss),
            ServerVerifier::AnyCertificate { algs } | ServerVerifier::Chain { algs, .. } => {
                verify_tls12_signature(message, cert, dss, algs)
            }
        }
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        match self {
            ServerVerifier::Full(v) => v.verify_tls13_signature(message, cert, dss),
            ServerVerifier::AnyCertificate { algs } | ServerVerifier::Chain { algs, .. } => {
                verify_tls13_signature(message, cert, dss, algs)
            }
        }
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        match self {
            ServerVerifier::Full(v) => v.supported_verify_schemes(),
            ServerVerifier::AnyCertificate { algs } | ServerVerifier::Chain { algs, .. } => algs.supported_schemes(),
        }
    }
}

/// libpq's fallback for certificates without subject alternative names.
fn common_name_matches(cert: &CertificateDer<'_>, name: &ServerName<'_>) -> Result<ServerCertVerified, Error> {
    let (host, dns) = match name {
        ServerName::DnsName(d) => (d.as_ref().to_string(), true),
        ServerName::IpAddress(ip) => (std::net::IpAddr::from(*ip).to_string(), false),
        _ => return Err(CertificateError::NotValidForName.into()),
    };
    let Some(cn) = super::common_name(cert) else {
        return Err(CertificateError::NotValidForName.into());
    };
    let wildcard = || {
        let Some(suffix) = cn.strip_prefix("*.") else { return false };
        host.split_once('.').is_some_and(|(label, rest)| !label.is_empty() && rest.eq_ignore_ascii_case(suffix))
    };
    if cn.eq_ignore_ascii_case(&host) || (dns && wildcard()) {
        return Ok(ServerCertVerified::assertion());
    }
    Err(CertificateError::NotValidForNameContext { expected: name.to_owned(), presented: vec![cn] }.into())
}
