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
            // Not where a certificate of the chain carries name constraints: webpki
            // checks them against subject alternative names only, where OpenSSL (for
            // libpq) checks a common name it falls back to as well.
            Err(Error::InvalidCertificate(CertificateError::NotValidForNameContext { presented, .. }))
                if presented.is_empty() && !constrained(intermediates, roots) =>
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

/// Whether an intermediate certificate (one that cannot be read counts) or a trusted
/// root carries name constraints.
fn constrained(intermediates: &[CertificateDer<'_>], roots: &RootCertStore) -> bool {
    intermediates.iter().any(|c| super::cn::has_name_constraints(c).unwrap_or(true))
        || roots.roots.iter().any(|r| r.name_constraints.is_some())
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

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, DnType, GeneralSubtree, IsCa, Issuer, KeyPair, NameConstraints};

    /// A root, an intermediate it signs (with DNS name constraints or not) and a leaf the
    /// intermediate signs with no subject alternative names and the common name `cn`:
    /// the roots, the leaf and the intermediate.
    fn chain(constraints: Option<NameConstraints>, cn: &str) -> (RootCertStore, Vec<CertificateDer<'static>>) {
        let ca = |name: &str| {
            let mut p = CertificateParams::new(Vec::new()).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.distinguished_name.push(DnType::CommonName, name);
            p
        };
        let root_key = KeyPair::generate().unwrap();
        let root_params = ca("root");
        let root = root_params.self_signed(&root_key).unwrap();
        let root_issuer = Issuer::new(root_params, root_key);
        let mut inter_params = ca("intermediate");
        inter_params.name_constraints = constraints;
        let inter_key = KeyPair::generate().unwrap();
        let inter = inter_params.signed_by(&inter_key, &root_issuer).unwrap();
        let inter_issuer = Issuer::new(inter_params, inter_key);
        let mut leaf_params = CertificateParams::new(Vec::new()).unwrap();
        leaf_params.distinguished_name.push(DnType::CommonName, cn);
        let leaf = leaf_params.signed_by(&KeyPair::generate().unwrap(), &inter_issuer).unwrap();
        let mut roots = RootCertStore::empty();
        roots.add(root.der().clone()).unwrap();
        (roots, vec![leaf.der().clone(), inter.der().clone()])
    }

    fn verify(roots: RootCertStore, certs: &[CertificateDer<'static>], host: &str) -> Result<(), Error> {
        let algs = rustls::crypto::aws_lc_rs::default_provider().signature_verification_algorithms;
        let verifier = ServerVerifier::new(algs, Proof::ChainAndHost(Arc::new(roots)));
        let name = ServerName::try_from(host.to_string()).unwrap();
        verifier.verify_server_cert(&certs[0], &certs[1..], &name, &[], UnixTime::now()).map(|_| ())
    }

    /// verify-full's common-name fallback is not used under a name-constrained CA:
    /// webpki checks constraints against subject alternative names only, so a leaf
    /// without any, named outside the constraints, would pass on its common name.
    #[test]
    fn the_common_name_fallback_is_refused_under_name_constraints() {
        let host = "db.prod.example.com";
        let (roots, certs) = chain(None, host);
        assert!(verify(roots, &certs, host).is_ok(), "the fallback without constraints");
        let dev = NameConstraints {
            permitted_subtrees: vec![GeneralSubtree::DnsName(".dev.example.com".into())],
            excluded_subtrees: vec![],
        };
        let (roots, certs) = chain(Some(dev), host);
        assert!(verify(roots, &certs, host).is_err(), "a common name outside the constraints accepted");
    }
}
