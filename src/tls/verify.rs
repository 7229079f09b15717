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
    Chain(Arc<Trusted>),
    /// `verify-full`: a chain to one of these roots, and the host name.
    ChainAndHost(Arc<Trusted>),
}

/// What `server_tls_ca_file` holds: its certificates as trust anchors, and the
/// self-issued ones whole. A server showing one of those very certificates is trusted
/// as itself, within its validity, as OpenSSL (libpq, PgBouncer) trusts it: also when
/// it is marked as a CA, as `openssl req -x509` makes them (PostgreSQL's documented
/// recipe for a self-signed server certificate), which webpki refuses as a server's.
#[derive(Debug)]
pub struct Trusted {
    pub roots: RootCertStore,
    pub own: Vec<CertificateDer<'static>>,
}

impl Trusted {
    pub fn new(certs: Vec<CertificateDer<'static>>) -> Result<Trusted, rustls::Error> {
        let mut roots = RootCertStore::empty();
        let mut own = Vec::new();
        for cert in certs {
            roots.add(cert.clone())?;
            if super::cn::self_issued_validity(&cert).is_some_and(|(selfish, _)| selfish) {
                own.push(cert);
            }
        }
        Ok(Trusted { roots, own })
    }

    /// Whether `cert` is one of the file's self-issued certificates, valid `now` (an
    /// error when it is one that is not).
    fn holds_itself(&self, cert: &CertificateDer<'_>, now: UnixTime) -> Result<bool, Error> {
        if !self.own.iter().any(|c| c.as_ref() == cert.as_ref()) {
            return Ok(false);
        }
        let Some((_, (from, until))) = super::cn::self_issued_validity(cert) else { return Ok(false) };
        let now = i64::try_from(now.as_secs()).unwrap_or(i64::MAX);
        match now {
            n if n < from => Err(CertificateError::NotValidYet.into()),
            n if n > until => Err(CertificateError::Expired.into()),
            _ => Ok(true),
        }
    }
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
        let (trusted, host) = match &self.proof {
            Proof::Nothing => return Ok(ServerCertVerified::assertion()),
            Proof::Chain(trusted) => (trusted, false),
            Proof::ChainAndHost(trusted) => (trusted, true),
        };
        let roots = &trusted.roots;
        let cert = ParsedCertificate::try_from(end_entity)?;
        if !trusted.holds_itself(end_entity, now)? {
            verify_server_cert_signed_by_trust_anchor(&cert, roots, intermediates, now, self.algs.all)?;
        }
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
        let verifier = ServerVerifier::new(algs, Proof::ChainAndHost(Arc::new(Trusted { roots, own: Vec::new() })));
        let name = ServerName::try_from(host.to_string()).unwrap();
        verifier.verify_server_cert(&certs[0], &certs[1..], &name, &[], UnixTime::now()).map(|_| ())
    }

    /// A self-signed server certificate marked as a CA (as `openssl req -x509` makes
    /// them), given as its own CA file: trusted as itself within its validity, as
    /// OpenSSL trusts it (webpki alone refuses a CA certificate as a server's), and the
    /// host name still checked.
    #[test]
    fn a_self_signed_ca_certificate_is_trusted_as_itself() {
        let cert = |not_after| {
            let mut p = CertificateParams::new(vec!["db.example.com".to_string()]).unwrap();
            p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
            p.not_after = not_after;
            p.self_signed(&KeyPair::generate().unwrap()).unwrap().der().clone()
        };
        let check = |der: &CertificateDer<'static>, own: bool, host: &str| {
            let trusted = Trusted::new(vec![der.clone()]).unwrap();
            let trusted = if own { trusted } else { Trusted { own: Vec::new(), ..trusted } };
            let algs = rustls::crypto::aws_lc_rs::default_provider().signature_verification_algorithms;
            let verifier = ServerVerifier::new(algs, Proof::ChainAndHost(Arc::new(trusted)));
            let name = ServerName::try_from(host.to_string()).unwrap();
            verifier.verify_server_cert(der, &[], &name, &[], UnixTime::now()).map(|_| ())
        };
        let good = cert(rcgen::date_time_ymd(2099, 1, 1));
        assert!(check(&good, false, "db.example.com").is_err(), "webpki took it alone");
        assert!(check(&good, true, "db.example.com").is_ok());
        assert!(check(&good, true, "other.example.com").is_err(), "the host name was not checked");
        let expired = cert(rcgen::date_time_ymd(2001, 1, 1));
        let e = check(&expired, true, "db.example.com").unwrap_err();
        assert_eq!(e, Error::InvalidCertificate(CertificateError::Expired));
        // One certificate of a chain (not self-issued) is not trusted as itself.
        let (roots, certs) = chain(None, "db.example.com");
        let trusted = Trusted::new(vec![certs[1].clone()]).unwrap();
        assert!(trusted.own.is_empty() && !roots.is_empty());
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
