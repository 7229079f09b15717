//! Sluice to PostgreSQL over TLS (`server_tls_*`), against clusters started with
//! ssl = on, and pgbench reconnecting over TLS through Sluice.

use tokio_postgres::error::SqlState;

use crate::common::{CertFiles, PgCluster, PgOptions, PgSsl, Role, Sluice, TestCerts, connect, try_connect};
use crate::{client_tls, path_str, server_tls};

fn ssl_cluster(cert: &CertFiles) -> PgCluster {
    let ssl = PgSsl { cert: cert.cert.clone(), key: cert.key.clone(), ca: None };
    PgCluster::start_with(PgOptions { ssl: Some(ssl), ..PgOptions::default() })
}

/// A column of `pg_stat_ssl` for the server connection Sluice lent for this query
/// (`ssl`: whether it is encrypted; `version`: its TLS version).
async fn server_side(port: u16, column: &str) -> Result<String, tokio_postgres::Error> {
    let (c, _task) = try_connect(port, Role::SCRAM.name, Role::SCRAM.password, "app").await?;
    let sql = format!("select {column}::text from pg_stat_ssl where pid = pg_backend_pid()");
    let rows = c.simple_query(&sql).await?;
    Ok(rows
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .unwrap_or_default())
}

/// Whether the server connection Sluice lent for this query is encrypted.
async fn server_side_ssl(port: u16) -> Result<String, tokio_postgres::Error> {
    server_side(port, "ssl").await
}

#[tokio::test]
async fn require_verify_ca_and_verify_full_against_ssl_postgres() {
    let certs = TestCerts::generate();
    let pg = ssl_cluster(&certs.server);
    for (mode, host) in [("require", "127.0.0.1"), ("verify-ca", "127.0.0.1"), ("verify-full", "localhost")] {
        let s =
            server_tls(Sluice::builder(&pg), mode, &certs).database("app", &[("host", &format!("\"{host}\""))]).start();
        assert_eq!(server_side_ssl(s.port).await.unwrap(), "true", "{mode} to {host}");
    }
    let s = server_tls(Sluice::builder(&pg), "verify-full", &certs).start();
    assert_eq!(server_side_ssl(s.port).await.unwrap(), "true", "verify-full to the IP address 127.0.0.1");
    let s = Sluice::builder(&pg).start();
    assert_eq!(server_side_ssl(s.port).await.unwrap(), "false", "server TLS is off by default");
}

#[tokio::test]
async fn bad_server_certificates_are_refused_in_libpq_words() {
    let certs = TestCerts::generate();
    let cases = [
        (&certs.expired, "verify-full", "certificate verify failed: certificate has expired"),
        (&certs.expired, "verify-ca", "certificate verify failed: certificate has expired"),
        (
            &certs.wrong_host,
            "verify-full",
            "server certificate for \"wrong.example\" does not match host name \"localhost\"",
        ),
    ];
    for (cert, mode, expected) in cases {
        let pg = ssl_cluster(cert);
        let s = server_tls(Sluice::builder(&pg), mode, &certs).database("app", &[("host", "\"localhost\"")]).start();
        let e = server_side_ssl(s.port).await.expect_err("must fail");
        let db = e.as_db_error().unwrap_or_else(|| panic!("a server error, got {e:?}"));
        assert_eq!(db.code(), &SqlState::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION, "{db:?}");
        assert!(db.message().contains(expected), "{mode}: {}", db.message());
        assert!(db.message().starts_with("server connection failed: SSL error: "), "{}", db.message());
    }
    // verify-ca ignores the name; require ignores the certificate.
    let pg = ssl_cluster(&certs.wrong_host);
    let s = server_tls(Sluice::builder(&pg), "verify-ca", &certs).database("app", &[("host", "\"localhost\"")]).start();
    assert_eq!(server_side_ssl(s.port).await.unwrap(), "true");
    let pg = ssl_cluster(&certs.expired);
    let s = server_tls(Sluice::builder(&pg), "require", &certs).start();
    assert_eq!(server_side_ssl(s.port).await.unwrap(), "true");
}

#[tokio::test]
async fn prefer_allow_and_require_against_postgres_without_ssl() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    for mode in ["prefer", "allow"] {
        let s = server_tls(Sluice::builder(&pg), mode, &certs).start();
        assert_eq!(server_side_ssl(s.port).await.unwrap(), "false", "{mode} falls back to plaintext");
    }
    let s = server_tls(Sluice::builder(&pg), "require", &certs).start();
    let e = server_side_ssl(s.port).await.expect_err("require must fail");
    let db = e.as_db_error().expect("a server error");
    assert!(db.message().contains("server does not support SSL, but SSL was required"), "{}", db.message());
    // and prefer uses TLS where it exists
    let pg = ssl_cluster(&certs.server);
    let s = server_tls(Sluice::builder(&pg), "prefer", &certs).start();
    assert_eq!(server_side_ssl(s.port).await.unwrap(), "true");
    // `allow` (PgBouncer's): the same as prefer.
    let s = server_tls(Sluice::builder(&pg), "allow", &certs).start();
    assert_eq!(server_side_ssl(s.port).await.unwrap(), "true");
}

#[tokio::test]
async fn client_certificate_towards_postgres() {
    let certs = TestCerts::generate();
    let ssl = PgSsl { cert: certs.server.cert.clone(), key: certs.server.key.clone(), ca: Some(certs.ca.clone()) };
    let hba_first = ["127.0.0.1/32", "::1/128"]
        .iter()
        .map(|net| format!("hostssl all u_trust {net} trust clientcert=verify-full"))
        .collect();
    let pg = PgCluster::start_with(PgOptions { ssl: Some(ssl), hba_first, ..PgOptions::default() });
    let trust = |b: crate::common::SluiceBuilder| b.general("auth_type", "\"trust\"");
    let with = server_tls(trust(Sluice::builder(&pg)), "verify-full", &certs)
        .general("server_tls_cert_file", &path_str(&certs.client_trust.cert))
        .general("server_tls_key_file", &path_str(&certs.client_trust.key))
        .start();
    let c = connect(with.port, "u_trust", "", "app").await;
    let row = c.query_one("select ssl, client_dn from pg_stat_ssl where pid = pg_backend_pid()", &[]).await.unwrap();
    assert!(row.get::<_, bool>(0));
    assert_eq!(row.get::<_, String>(1), "/CN=u_trust");

    let without = server_tls(trust(Sluice::builder(&pg)), "verify-full", &certs).start();
    let e = try_connect(without.port, "u_trust", "", "app").await.expect_err("PostgreSQL wants a certificate");
    let db = e.as_db_error().expect("a server error");
    assert!(db.message().contains("certificate"), "{}", db.message());
}

#[test]
fn pgbench_reconnecting_over_tls_at_40_clients() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let s = client_tls(Sluice::builder(&pg), "require", &certs.server, &certs)
        .general("max_client_conn", "100")
        .database("app", &[("pool_size", "10")])
        .start();
    let script = certs.dir().join("select.sql");
    std::fs::write(&script, "select 1;\n").unwrap();
    // verify-full against the test CA, to localhost: the chain and the host name are checked.
    let out = std::process::Command::new("pgbench")
        .args(["-h", "localhost", "-p", &s.port.to_string(), "-U", Role::SCRAM.name])
        .args(["-n", "-C", "-c", "40", "-j", "2", "-T", "5", "-f"])
        .arg(&script)
        .arg("app")
        .env("PGPASSWORD", Role::SCRAM.password)
        .env("PGSSLMODE", "verify-full")
        .env("PGSSLROOTCERT", &certs.ca)
        .output()
        .expect("pgbench runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "pgbench failed:\n{text}");
    assert!(text.contains("number of failed transactions: 0 "), "{text}");
    let line = text.lines().find(|l| l.contains("actually processed")).expect("summary");
    let processed: u64 = line.rsplit(':').next().unwrap().trim().split('/').next().unwrap().parse().unwrap();
    assert!(processed >= 40, "too few TLS reconnects:\n{text}");
    assert!(!s.log().contains("TLS handshake failed"), "{}", s.log());
}

/// A large pipeline both ways over TLS to the server: a TLS write can also stop inside
/// rustls (taken, not yet flushed), and Sluice keeps reading meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_pipeline_over_server_tls_does_not_deadlock() {
    let certs = TestCerts::generate();
    let pg = ssl_cluster(&certs.server);
    let s = server_tls(Sluice::builder(&pg), "require", &certs)
        .general("pool_mode", "\"transaction\"")
        .database("app", &[("pool_size", "1")])
        .start();
    assert_eq!(server_side_ssl(s.port).await.unwrap(), "true");
    crate::common::huge_pipeline(s.port).await;
}

/// `server_tls_protocols`: the highest version both sides have by default (TLS 1.3
/// with PostgreSQL 15), TLS 1.2 when only that is listed; `server_tls_ciphers` then
/// picks the suite.
#[tokio::test]
async fn server_tls_protocols_choose_the_version() {
    let certs = TestCerts::generate();
    let pg = ssl_cluster(&certs.server);
    let s = server_tls(Sluice::builder(&pg), "require", &certs).start();
    assert_eq!(server_side(s.port, "version").await.unwrap(), "TLSv1.3");
    let s =
        server_tls(Sluice::builder(&pg), "require", &certs).general("server_tls_protocols", r#"["tlsv1.2"]"#).start();
    assert_eq!(server_side(s.port, "version").await.unwrap(), "TLSv1.2");
    // `server_tls_ciphers` chooses among TLS 1.2's suites (PostgreSQL's own preference
    // is another one).
    let chacha = "ECDHE-ECDSA-CHACHA20-POLY1305";
    assert_ne!(server_side(s.port, "cipher").await.unwrap(), chacha);
    let s = server_tls(Sluice::builder(&pg), "require", &certs)
        .general("server_tls_protocols", r#"["tlsv1.2"]"#)
        .general("server_tls_ciphers", &format!("\"{chacha}\""))
        .start();
    assert_eq!(server_side(s.port, "cipher").await.unwrap(), chacha);
}
