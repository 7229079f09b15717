//! Reading PEM files: certificate chains, private keys and CA bundles. Errors are
//! sentences naming the file, for the config error that carries the key.

use std::path::Path;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

fn read(path: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))
}

/// Every certificate in a PEM file, leaf first; at least one.
pub fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{}: not a PEM certificate file: {e}", path.display()))?;
    if certs.is_empty() {
        return Err(format!("{}: no certificate (no \"BEGIN CERTIFICATE\" block)", path.display()));
    }
    Ok(certs)
}

/// The first private key in a PEM file (PKCS#8, PKCS#1 RSA or SEC1 EC).
pub fn key(path: &Path) -> Result<PrivateKeyDer<'static>, String> {
    let pem = read(path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| format!("{}: no usable private key: {e}", path.display()))
}

/// Trust anchors from a PEM bundle; at least one must be usable.
pub fn roots(path: &Path) -> Result<RootCertStore, String> {
    let mut store = RootCertStore::empty();
    for cert in certs(path)? {
        store.add(cert).map_err(|e| format!("{}: unusable CA certificate: {e}", path.display()))?;
    }
    Ok(store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_and_garbage_files_are_reported_with_their_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope.pem");
        assert!(certs(&missing).unwrap_err().contains("nope.pem"));
        let junk = dir.path().join("junk.pem");
        std::fs::write(&junk, b"hello\n").unwrap();
        assert!(certs(&junk).unwrap_err().contains("no certificate"));
        assert!(key(&junk).unwrap_err().contains("no usable private key"));
        assert!(roots(&junk).is_err());
    }

    #[test]
    fn generated_pem_loads() {
        let dir = tempfile::tempdir().unwrap();
        let ck = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        let (c, k) = (dir.path().join("c.pem"), dir.path().join("k.pem"));
        std::fs::write(&c, ck.cert.pem()).unwrap();
        std::fs::write(&k, ck.signing_key.serialize_pem()).unwrap();
        assert_eq!(certs(&c).unwrap().len(), 1);
        assert!(key(&k).is_ok());
        assert_eq!(roots(&c).unwrap().len(), 1);
    }
}
