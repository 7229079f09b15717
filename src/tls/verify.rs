//! How Sluice checks PostgreSQL's certificate, one verifier for every `server_tls_sslmode`.
//! The handshake signatures are always checked, so the peer must hold the key of the
//! certificate it shows; what differs is what the certificate itself must prove: nothing
//! (`prefer`, `require`: encryption without authentication, as libpq does it), a chain
//! to a trusted root (`verify-ca`), or the chain and the host name (`verify-full`, a DNS
//! name or IP address). verify-full follows libpq where webpki is stricter: a
//! certificate without subject alternative names is matched on its common
//! name (a leading `*.` matching one label), as certificates made per PostgreSQL's
//! documentation often are.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::{verify_server_cert_signed_by_trust_anchor, verify_server_name};
use rustls::crypto::{WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature};
use rustls::server::ParsedCertificate;
use rustls::{CertificateError, DigitallySignedStruct, Error, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

/// What a server certificate must prove beyond the handshake signatures.
#[derive(Debug)]
pub enum Proof {
    /// `prefer`, `require`: nothing.
    Nothing,
    /// `verify-ca`: a chain to one of these roots; the host name is not checked.
    Chain(Arc<RootCertStore>),
    /// `verify-full`: a chain to one of these roots, and the host name.
    ChainAndHost(Arc<RootCertStore>),
}

#[derive(Debug)]
pub struct ServerVerifier {
    algs: WebPkiSupportedAlgorithms,
    proof: Proof,
}

impl ServerVerifier {
    pub fn new(algs: WebPkiSupportedAlgorithms, proof: Proof) -> ServerVerifier {
        ServerVerifier { algs, proof }
    }
}

impl ServerCertVerifier for ServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let (roots, host) = match &self.proof {
            Proof::Nothing => return Ok(ServerCertVerified::assertion()),
            Proof::Chain(roots) => (roots, false),
            Proof::ChainAndHost(roots) => (roots, true),
        };
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(&cert, roots, intermediates, now, self.algs.all)?;
        if !host {
            return Ok(ServerCertVerified::assertion());
        }
        match verify_server_name(&cert, server_name) {
            Ok(()) => Ok(ServerCertVerified::assertion()),
            // No subject alternative names at all (webpki lists every kind it saw):
            // libpq looks at the common name. (libpq also does when the names are all of
            // other kinds than the host's; Sluice refuses those, tls.md.)
            Err(Error::InvalidCertificate(CertificateError::NotValidForNameContext { presented, .. }))
                if presented.is_empty() =>
            {
                common_name_matches(end_entity, server_name)
            }
            Err(e) => Err(e),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls12_signature(message, cert, dss, &self.algs)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        verify_tls13_signature(message, cert, dss, &self.algs)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algs.supported_schemes()
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
