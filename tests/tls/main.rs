//! Black-box TLS tests against real PostgreSQL and the built `sluice` binary, with
//! certificates generated at run time (tests/common/certs.rs):
//! - `clients`: psql through Sluice with sslmode require/verify-full, plaintext refused,
//!   expired and wrong-host certificates, client-certificate authentication, the TLS 1.2
//!   suites and curves offered (`openssl s_client`);
//! - `direct`: a rustls client for PostgreSQL 17's direct TLS (ALPN), SSLRequest with
//!   and without ALPN, GSSENCRequest, TLS versions, close_notify and abrupt closes;
//! - `servers`: Sluice to a PostgreSQL running with ssl = on, per server_tls_sslmode,
//!   with a client certificate, and pgbench -C over TLS (verify-full);
//! - `reload`: certificates re-read on SIGHUP, a bad file keeping the old one.

#[path = "../common/mod.rs"]
mod common;
use common::raw;

mod client;
mod clients;
mod direct;
mod reload;
mod servers;

use std::path::Path;
use std::process::Command;

use common::{CertFiles, Role, SluiceBuilder, TestCerts, psql_cmd, toml_str};

fn path_str(p: &Path) -> String {
    toml_str(&p.display().to_string())
}

/// Client TLS in `mode`, presenting `cert`; client certificates are checked against the test CA.
pub fn client_tls(b: SluiceBuilder, mode: &str, cert: &CertFiles, certs: &TestCerts) -> SluiceBuilder {
    b.general("client_tls_sslmode", &toml_str(mode))
        .general("client_tls_cert_file", &path_str(&cert.cert))
        .general("client_tls_key_file", &path_str(&cert.key))
        .general("client_tls_ca_file", &path_str(&certs.ca))
}

/// Server TLS in `mode`, trusting the test CA.
pub fn server_tls(b: SluiceBuilder, mode: &str, certs: &TestCerts) -> SluiceBuilder {
    b.general("server_tls_sslmode", &toml_str(mode)).general("server_tls_ca_file", &path_str(&certs.ca))
}

/// psql to `host`:`port` as `role` with libpq's `sslmode` and the test CA as sslrootcert.
pub fn psql_tls(port: u16, host: &str, role: Role, sslmode: &str, certs: &TestCerts) -> Command {
    let mut cmd = psql_cmd(port, host, role.name, role.password, "app");
    cmd.env("PGSSLMODE", sslmode).env("PGSSLROOTCERT", &certs.ca);
    cmd
}

/// Adds `sslcert`/`sslkey` to a psql command.
pub fn with_cert(mut cmd: Command, cert: &CertFiles) -> Command {
    cmd.env("PGSSLCERT", &cert.cert).env("PGSSLKEY", &cert.key);
    cmd
}

pub struct Run {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

/// Runs a command with `-c sql` appended.
pub fn run_sql(mut cmd: Command, sql: &str) -> Run {
    let out = cmd.args(["-c", sql]).output().expect("run psql");
    Run {
        ok: out.status.success(),
        stdout: String::from_utf8_lossy(&out.stdout).trim().to_string(),
        stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
    }
}
