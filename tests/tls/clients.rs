//! Clients to Sluice over TLS with psql (libpq): what libpq users see.

use std::time::Duration;

use tokio_postgres::error::SqlState;

use crate::common::{PgCluster, Role, Sluice, TestCerts, psql_cmd, try_connect};
use crate::{client_tls, psql_tls, run_sql, with_cert};

const NO_PASSWORD: Role = Role { name: "u_scram", password: "" };

#[test]
fn psql_with_sslmode_require_and_verify_full() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let s = client_tls(Sluice::builder(&pg), "require", &certs.server, &certs).start();
    let r = run_sql(psql_tls(s.port, "127.0.0.1", Role::SCRAM, "require", &certs), "\\conninfo");
    assert!(r.ok, "{}", r.stderr);
    assert!(r.stdout.contains("SSL connection (protocol: TLSv1.3"), "{}", r.stdout);
    for host in ["localhost", "127.0.0.1"] {
        for role in [Role::SCRAM, Role::MD5] {
            let r = run_sql(psql_tls(s.port, host, role, "verify-full", &certs), "select current_user");
            assert!(r.ok, "verify-full to {host} as {}: {}", role.name, r.stderr);
            assert_eq!(r.stdout, role.name);
        }
    }
    // libpq's default (prefer) takes TLS too; the statements run on PostgreSQL as usual.
    let r = run_sql(psql_tls(s.port, "127.0.0.1", Role::SCRAM, "prefer", &certs), "select 6 * 7");
    assert_eq!(r.stdout, "42", "{}", r.stderr);
    assert!(s.log().contains("tls=\"TLSv1.3 TLS13_"), "the login line names the TLS version:\n{}", s.log());
}

#[tokio::test]
async fn plaintext_is_refused_when_tls_is_required() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let s = client_tls(Sluice::builder(&pg), "require", &certs.server, &certs).start();
    let r = run_sql(psql_tls(s.port, "127.0.0.1", Role::SCRAM, "disable", &certs), "select 1");
    assert!(!r.ok);
    assert!(r.stderr.contains("FATAL:  SSL required"), "{}", r.stderr);
    let e = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await.expect_err("refused");
    assert_eq!(e.code(), Some(&SqlState::INVALID_AUTHORIZATION_SPECIFICATION), "{e}");
    // The Unix socket is local: no TLS there, and none required.
    let socket = s.socket_dir.display().to_string();
    let r = run_sql(psql_cmd(s.port, &socket, Role::SCRAM.name, Role::SCRAM.password, "app"), "select 1");
    assert_eq!(r.stdout, "1", "{}", r.stderr);
    // With client_tls_sslmode = allow, plaintext and TLS both work.
    let a = client_tls(Sluice::builder(&pg), "allow", &certs.server, &certs).start();
    assert_eq!(run_sql(psql_tls(a.port, "127.0.0.1", Role::SCRAM, "disable", &certs), "select 1").stdout, "1");
    assert_eq!(run_sql(psql_tls(a.port, "localhost", Role::SCRAM, "verify-full", &certs), "select 2").stdout, "2");
}

#[test]
fn verify_full_rejects_expired_and_wrong_host_certificates() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let expired = client_tls(Sluice::builder(&pg), "require", &certs.expired, &certs).start();
    let r = run_sql(psql_tls(expired.port, "localhost", Role::SCRAM, "verify-full", &certs), "select 1");
    assert!(!r.ok);
    assert!(r.stderr.contains("certificate verify failed"), "{}", r.stderr);
    let r = run_sql(psql_tls(expired.port, "localhost", Role::SCRAM, "verify-ca", &certs), "select 1");
    assert!(r.stderr.contains("certificate verify failed"), "{}", r.stderr);
    // libpq's require verifies like verify-ca when it has a root certificate; without one
    // it does not verify at all.
    let mut require = psql_tls(expired.port, "localhost", Role::SCRAM, "require", &certs);
    require.env("PGSSLROOTCERT", certs.dir().join("no-such-root.crt"));
    let r = run_sql(require, "select 1");
    assert_eq!(r.stdout, "1", "require without a root certificate does not verify: {}", r.stderr);

    let wrong = client_tls(Sluice::builder(&pg), "require", &certs.wrong_host, &certs).start();
    let r = run_sql(psql_tls(wrong.port, "localhost", Role::SCRAM, "verify-full", &certs), "select 1");
    assert!(!r.ok);
    let expected = "server certificate for \"wrong.example\" does not match host name \"localhost\"";
    assert!(r.stderr.contains(expected), "{}", r.stderr);
    let r = run_sql(psql_tls(wrong.port, "localhost", Role::SCRAM, "verify-ca", &certs), "select 1");
    assert_eq!(r.stdout, "1", "verify-ca does not check the name: {}", r.stderr);
}

#[test]
fn client_certificate_authentication() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let b = Sluice::builder(&pg).general("auth_type", "\"cert\"");
    let s = client_tls(b, "verify-full", &certs.server, &certs).start();
    let psql = || psql_tls(s.port, "localhost", NO_PASSWORD, "verify-full", &certs);
    let r = run_sql(with_cert(psql(), &certs.client), "select current_user");
    assert_eq!(r.stdout, "u_scram", "CN=u_scram logs in as u_scram: {}", r.stderr);

    let r = run_sql(with_cert(psql(), &certs.client_md5), "select 1");
    assert!(r.stderr.contains("FATAL:  certificate authentication failed for user \"u_scram\""), "{}", r.stderr);
    assert!(s.log().contains("client_cn=\"u_md5\""), "the log names the certificate's CN:\n{}", s.log());
    let r = run_sql(
        with_cert(psql_tls(s.port, "localhost", Role::MD5, "verify-full", &certs), &certs.client_md5),
        "select current_user",
    );
    assert_eq!(r.stdout, "u_md5", "{}", r.stderr);

    // No client certificate: TLS 1.3's certificate_required alert, and the log says why.
    let r = run_sql(psql(), "select 1");
    assert!(!r.ok, "no client certificate: the handshake must fail");
    assert!(r.stderr.contains("SSL error: tlsv13 alert certificate required"), "{}", r.stderr);
    let line = "client disconnected: TLS handshake failed: peer sent no certificates";
    assert!(s.wait_log(line, Duration::from_secs(10)), "no {line:?} in the log:\n{}", s.log());
    // A certificate from an unknown CA: the unknown_ca alert.
    let r = run_sql(with_cert(psql(), &certs.untrusted_client), "select 1");
    assert!(!r.ok, "a certificate from an unknown CA must fail");
    assert!(r.stderr.contains("SSL error: tlsv1 alert unknown ca"), "{}", r.stderr);
    let line = "client disconnected: TLS handshake failed: invalid peer certificate: UnknownIssuer";
    assert!(s.wait_log(line, Duration::from_secs(10)), "no {line:?} in the log:\n{}", s.log());

    let socket = s.socket_dir.display().to_string();
    let r = run_sql(psql_cmd(s.port, &socket, "u_scram", "", "app"), "select 1");
    assert!(r.stderr.contains("connection requires a valid client certificate"), "{}", r.stderr);
}

#[test]
fn verify_ca_demands_a_certificate_and_still_checks_passwords() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let s = client_tls(Sluice::builder(&pg), "verify-ca", &certs.server, &certs).start();
    let psql = |role| psql_tls(s.port, "127.0.0.1", role, "require", &certs);
    let r = run_sql(with_cert(psql(Role::SCRAM), &certs.client_md5), "select current_user");
    assert_eq!(r.stdout, "u_scram", "any trusted certificate, then SCRAM: {}", r.stderr);
    let wrong = Role { name: "u_scram", password: "wrong" };
    let r = run_sql(with_cert(psql(wrong), &certs.client), "select 1");
    assert!(r.stderr.contains("password authentication failed"), "{}", r.stderr);
    let r = run_sql(psql(Role::SCRAM), "select 1");
    assert!(!r.ok, "no certificate: refused");
    assert!(r.stderr.contains("SSL error: tlsv13 alert certificate required"), "{}", r.stderr);
    let line = "client disconnected: TLS handshake failed: peer sent no certificates";
    assert!(s.wait_log(line, Duration::from_secs(10)), "no {line:?} in the log:\n{}", s.log());
}

/// Under `auth_type = "hba"`, `hostssl` and `hostnossl` lines tell TLS logins from
/// plaintext ones, and a `cert` line takes a client certificate that the mode (`allow`)
/// does not demand: the certificate logs u_scram in without a password (and, under
/// `map=`, CN=u_md5 as u_scram), while others log in over TLS with no certificate, or
/// with one, and their passwords.
#[test]
fn hba_lines_tell_tls_from_plaintext_and_cert_lines_take_certificates() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let hba = dir.path().join("hba.conf");
    let rules = "hostssl app u_scram 127.0.0.1/32 cert\n\
                 hostssl other all 127.0.0.1/32 cert map=cmap\n\
                 hostssl app all 127.0.0.1/32 scram-sha-256\n\
                 hostnossl app all 127.0.0.1/32 reject\n";
    std::fs::write(&hba, rules).unwrap();
    let ident = dir.path().join("ident.conf");
    std::fs::write(&ident, "cmap u_md5 u_scram\n").unwrap();
    let b = Sluice::builder(&pg)
        .general("auth_type", "\"hba\"")
        .general("auth_hba_file", &crate::path_str(&hba))
        .general("auth_ident_file", &crate::path_str(&ident))
        .database("other", &[]);
    let s = client_tls(b, "allow", &certs.server, &certs).start();
    let tls = |role| psql_tls(s.port, "localhost", role, "verify-full", &certs);

    let r = run_sql(with_cert(tls(NO_PASSWORD), &certs.client), "select current_user");
    assert_eq!(r.stdout, "u_scram", "CN=u_scram logs in as u_scram: {}", r.stderr);
    let r = run_sql(tls(NO_PASSWORD), "select 1");
    assert!(r.stderr.contains("FATAL:  connection requires a valid client certificate"), "{}", r.stderr);
    let r = run_sql(with_cert(tls(NO_PASSWORD), &certs.client_md5), "select 1");
    assert!(r.stderr.contains("certificate authentication failed for user \"u_scram\""), "{}", r.stderr);
    // map=: CN=u_md5 logs in as u_scram to `other`, as the map says; CN=u_scram may not.
    let other = |cert| {
        let mut cmd = with_cert(tls(NO_PASSWORD), cert);
        cmd.env("PGDATABASE", "other");
        run_sql(cmd, "select current_user")
    };
    let r = other(&certs.client_md5);
    assert_eq!(r.stdout, "u_scram", "CN=u_md5 mapped to u_scram: {}", r.stderr);
    let r = other(&certs.client);
    assert!(r.stderr.contains("certificate authentication failed for user \"u_scram\""), "{}", r.stderr);

    let r = run_sql(tls(Role::MD5), "select current_user");
    assert_eq!(r.stdout, "u_md5", "no certificate is asked of a scram-sha-256 line: {}", r.stderr);
    let r = run_sql(with_cert(tls(Role::MD5), &certs.client_md5), "select current_user");
    assert_eq!(r.stdout, "u_md5", "{}", r.stderr);
    let wrong = Role { name: "u_md5", password: "wrong" };
    let r = run_sql(tls(wrong), "select 1");
    assert!(r.stderr.contains("password authentication failed for user \"u_md5\""), "{}", r.stderr);
    // A certificate from a CA nobody trusts fails the handshake, as with PostgreSQL.
    let r = run_sql(with_cert(tls(Role::MD5), &certs.untrusted_client), "select 1");
    assert!(!r.ok && r.stderr.contains("unknown ca"), "{}", r.stderr);

    for role in [Role::MD5, Role::SCRAM] {
        let r = run_sql(psql_cmd(s.port, "127.0.0.1", role.name, role.password, "app"), "select 1");
        let want = format!(
            "FATAL:  pg_hba.conf rejects connection for host \"127.0.0.1\", user \"{}\", database \"app\", no encryption",
            role.name
        );
        assert!(r.stderr.contains(&want), "{}", r.stderr);
    }
}

/// What `openssl s_client` prints for a TLS 1.2 handshake with Sluice (PostgreSQL's
/// STARTTLS) offering only `ciphers` and `curves`.
fn tls12_hello(port: u16, ciphers: &str, curves: &str) -> String {
    let out = std::process::Command::new("openssl")
        .args(["s_client", "-starttls", "postgres", "-connect", &format!("127.0.0.1:{port}"), "-tls1_2"])
        .args(["-cipher", ciphers, "-curves", curves])
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run openssl s_client");
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// `client_tls_ciphers` and `client_tls_ecdhcurve`: by default a TLS 1.2 client gets
/// any of Sluice's suites and curves; after a reload that lists some, only those.
#[test]
fn client_tls_ciphers_and_ecdhcurve_limit_what_clients_get() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let (aes128, aes256) = ("ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-ECDSA-AES256-GCM-SHA384");
    let s = client_tls(Sluice::builder(&pg), "require", &certs.server, &certs).start();
    // (The client's curves must take in the certificate's, P-256: TLS 1.2's list is
    // for both.)
    let refused = [(aes256, "P-256:P-384"), (aes128, "P-256")];
    for (cipher, curve) in refused {
        let hello = tls12_hello(s.port, cipher, curve);
        assert!(hello.contains(&format!("Cipher is {cipher}")), "{cipher} with {curve} refused by default: {hello}");
    }
    let mode = "client_tls_sslmode = \"require\"";
    let limits = format!(
        "{mode}\nclient_tls_ciphers = \"HIGH:!aRSA:!{aes256}:!CHACHA20\"\nclient_tls_ecdhcurve = \"secp384r1\""
    );
    s.reload_replacing(mode, &limits);
    let hello = tls12_hello(s.port, &format!("{aes256}:{aes128}"), "P-256:P-384");
    assert!(hello.contains(&format!("Cipher is {aes128}")), "{hello}");
    assert!(hello.contains("P-384") || hello.contains("secp384r1"), "the curve: {hello}");
    for (cipher, curve) in refused {
        let hello = tls12_hello(s.port, cipher, curve);
        assert!(!hello.contains("Cipher is ECDHE"), "{cipher} with {curve} taken: {hello}");
    }
    // Admin SET loads the client TLS setup anew (here on the console's own user's
    // socket login: TCP logins need TLS).
    let console = || psql_cmd(s.port, &s.socket_dir.display().to_string(), "pgbouncer", "", "pgbouncer");
    for (key, value) in [("client_tls_ciphers", "default"), ("client_tls_ecdhcurve", "auto")] {
        let set = run_sql(console(), &format!("SET {key} = '{value}'"));
        assert!(set.ok, "{}", set.stderr);
    }
    let (cipher, curve) = refused[1];
    assert!(tls12_hello(s.port, cipher, curve).contains(&format!("Cipher is {cipher}")), "SET did not take");
}
