//! How Sluice checks PostgreSQL's certificate, one variant per `server_tls_sslmode`.
//! Every variant checks the handshake signatures, so the peer must hold the key of the
//! certificate it shows; what differs is what the certificate itself must prove.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{WebPkiServerVerifier, verify_server_cert_signed_by_trust_anchor};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature};
use rustls::server::ParsedCertificate;
use rustls::{DigitallySignedStruct, Error, RootCertStore, SignatureScheme};
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
            ServerVerifier::Full(v) => v.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now),
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
