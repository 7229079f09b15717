//! Certificates for TLS tests, generated at run time with rcgen (ECDSA P-256): a CA and
//! leaf certificates signed by it, written as PEM files (keys mode 0600, as libpq wants).

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair};
use tempfile::TempDir;

/// A certificate and its private key on disk.
#[derive(Clone, Debug)]
pub struct CertFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// What a leaf certificate says about itself.
pub struct Leaf<'a> {
    /// Subject alternative names: DNS names or IP addresses.
    pub sans: &'a [&'a str],
    pub cn: &'a str,
    /// Valid in 2020 only.
    pub expired: bool,
}

/// A CA in a temporary directory, and the standard set of certificates tests use.
pub struct TestCerts {
    /// The CA certificate (PEM): `sslrootcert` for clients, `*_tls_ca_file` for Sluice.
    pub ca: PathBuf,
    /// For localhost, 127.0.0.1 and ::1.
    pub server: CertFiles,
    /// The same names with another key: what a reload switches to.
    pub server2: CertFiles,
    /// For localhost and 127.0.0.1, expired.
    pub expired: CertFiles,
    /// For wrong.example only.
    pub wrong_host: CertFiles,
    /// Client certificate, CN=u_scram.
    pub client: CertFiles,
    /// Client certificate, CN=u_md5.
    pub client_md5: CertFiles,
    /// Client certificate, CN=u_trust.
    pub client_trust: CertFiles,
    /// CN=u_scram, signed by a CA nobody trusts.
    pub untrusted_client: CertFiles,
    /// That CA's certificate (PEM): a wrong `sslrootcert`, which no certificate here chains to
    /// but `untrusted_client`.
    pub untrusted_ca: PathBuf,
    issuer: Issuer<'static, KeyPair>,
    dir: TempDir,
}

impl TestCerts {
    pub fn generate() -> TestCerts {
        static SWEPT: std::sync::Once = std::sync::Once::new();
        SWEPT.call_once(|| super::sweep_orphans(&std::env::temp_dir(), "sluice-certs-", |_| None));
        let dir = tempfile::Builder::new().prefix("sluice-certs-").tempdir().expect("create cert dir");
        super::claim(dir.path());
        let (issuer, ca_pem) = new_ca("Sluice test CA");
        let ca = dir.path().join("ca.crt");
        std::fs::write(&ca, ca_pem).expect("write CA");
        let (stranger, stranger_pem) = new_ca("Sluice test CA nobody trusts");
        let untrusted_ca = dir.path().join("untrusted_ca.crt");
        std::fs::write(&untrusted_ca, stranger_pem).expect("write untrusted CA");
        const LOCAL: &[&str] = &["localhost", "127.0.0.1", "::1"];
        let leaf = |name: &str, sans: &[&str], cn: &str, expired: bool| {
            write_leaf(dir.path(), name, &Leaf { sans, cn, expired }, &issuer)
        };
        let server = leaf("server", LOCAL, "localhost", false);
        let server2 = leaf("server2", LOCAL, "localhost", false);
        let expired = leaf("expired", &["localhost", "127.0.0.1"], "localhost", true);
        let wrong_host = leaf("wrong_host", &["wrong.example"], "wrong.example", false);
        let client = leaf("client", &[], "u_scram", false);
        let client_md5 = leaf("client_md5", &[], "u_md5", false);
        let client_trust = leaf("client_trust", &[], "u_trust", false);
        let untrusted_client =
            write_leaf(dir.path(), "untrusted", &Leaf { sans: &[], cn: "u_scram", expired: false }, &stranger);
        TestCerts {
            ca,
            server,
            server2,
            expired,
            wrong_host,
            client,
            client_md5,
            client_trust,
            untrusted_client,
            untrusted_ca,
            issuer,
            dir,
        }
    }

    /// The directory holding every file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Another leaf signed by the CA, as NAME.crt and NAME.key.
    pub fn leaf(&self, name: &str, leaf: &Leaf) -> CertFiles {
        write_leaf(self.dir.path(), name, leaf, &self.issuer)
    }
}

fn new_ca(name: &str) -> (Issuer<'static, KeyPair>, String) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    let key = KeyPair::generate().expect("CA key");
    let pem = params.self_signed(&key).expect("self-sign CA").pem();
    (Issuer::new(params, key), pem)
}

fn write_leaf(dir: &Path, name: &str, leaf: &Leaf, issuer: &Issuer<'static, KeyPair>) -> CertFiles {
    use std::os::unix::fs::PermissionsExt;
    let sans: Vec<String> = leaf.sans.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(sans).expect("leaf params");
    params.distinguished_name.push(DnType::CommonName, leaf.cn);
    if leaf.expired {
        params.not_before = rcgen::date_time_ymd(2020, 1, 1);
        params.not_after = rcgen::date_time_ymd(2020, 12, 31);
    }
    let key = KeyPair::generate().expect("leaf key");
    let cert = params.signed_by(&key, issuer).expect("sign leaf");
    let files = CertFiles { cert: dir.join(format!("{name}.crt")), key: dir.join(format!("{name}.key")) };
    std::fs::write(&files.cert, cert.pem()).expect("write certificate");
    std::fs::write(&files.key, key.serialize_pem()).expect("write key");
    std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600)).expect("chmod key");
    files
}
