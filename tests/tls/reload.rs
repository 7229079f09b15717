//! SIGHUP and TLS: certificates are read again without dropping connections; a file
//! that cannot be used keeps the running certificate and TLS settings while the rest of
//! the reload goes ahead; a new server_tls_sslmode reaches pooled server connections.

use std::path::Path;
use std::time::Duration;

use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

use crate::client::{self, PG_ALPN};
use crate::common::{CertFiles, PgCluster, PgOptions, PgSsl, Role, Sluice, TestCerts, connect, wait_until};
use crate::{client_tls, path_str};

fn der(pem: &Path) -> Vec<u8> {
    CertificateDer::from_pem_file(pem).expect("PEM certificate").to_vec()
}

fn install(from: &CertFiles, to: &CertFiles) {
    std::fs::copy(&from.cert, &to.cert).unwrap();
    std::fs::copy(&from.key, &to.key).unwrap();
}

fn reloads(s: &Sluice) -> usize {
    s.log().matches("configuration reloaded").count()
}

#[test]
fn sighup_rereads_certificates_and_keeps_the_old_one_on_a_bad_file() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let live = CertFiles { cert: certs.dir().join("live.crt"), key: certs.dir().join("live.key") };
    install(&certs.server, &live);
    let s = client_tls(Sluice::builder(&pg).general("auth_type", "\"trust\""), "require", &live, &certs).start();
    let config = client::config(&certs.ca, &PG_ALPN);
    let served = || {
        let sock = client::negotiated(s.port, &config).expect("handshake");
        sock.conn.peer_certificates().expect("a certificate")[0].to_vec()
    };
    assert_eq!(served(), der(&certs.server.cert));
    let mut old = client::negotiated(s.port, &config).unwrap();
    client::login(&mut old, "u_trust").unwrap();

    install(&certs.server2, &live);
    s.reload();
    let new = der(&certs.server2.cert);
    assert!(wait_until(Duration::from_secs(10), || served() == new), "new connections get the new certificate");
    assert_eq!(client::query_value(&mut old, "select 'still here'"), "still here");

    // A bad certificate file, together with a new database, and a client TLS mode and
    // certificate logins that need the new client setup, in the same reload: the TLS
    // settings and auth_type stay the running ones.
    std::fs::write(&live.cert, "not a certificate\n").unwrap();
    let other = format!("\n[databases.other]\nhost = \"127.0.0.1\"\nport = {}\ndbname = \"app\"\n", pg.port);
    let changed = s
        .config()
        .replace(r#"client_tls_sslmode = "require""#, r#"client_tls_sslmode = "verify-ca""#)
        .replace(r#"auth_type = "trust""#, r#"auth_type = "cert""#);
    assert!(changed.contains("verify-ca") && changed.contains(r#""cert""#), "{changed}");
    s.write_config(&(changed + &other));
    let before = reloads(&s);
    s.reload();
    assert!(wait_until(Duration::from_secs(10), || reloads(&s) > before), "{}", s.log());
    let log = s.log();
    assert!(
        log.contains("general.client_tls_cert_file") && log.contains("keeping the running client TLS setup"),
        "{log}"
    );
    assert_eq!(served(), new, "the running certificate stays");
    let mut sock = client::negotiated(s.port, &config).unwrap();
    client::login_db(&mut sock, "u_trust", "other").expect("the new database from the same reload");
    assert_eq!(client::query_value(&mut sock, "select current_database()"), "app");
    assert_eq!(client::query_value(&mut old, "select 'and still'"), "and still");

    // A good file again is picked up by the next reload (with the running settings).
    install(&certs.server, &live);
    s.write_config(&(s.config().replace("verify-ca", "require").replace(r#""cert""#, r#""trust""#)));
    s.reload();
    let first = der(&certs.server.cert);
    assert!(wait_until(Duration::from_secs(10), || served() == first));
}

#[tokio::test]
async fn server_tls_mode_change_reaches_pooled_connections() {
    let certs = TestCerts::generate();
    let ssl = PgSsl { cert: certs.server.cert.clone(), key: certs.server.key.clone(), ca: None };
    let pg = PgCluster::start_with(PgOptions { ssl: Some(ssl), ..PgOptions::default() });
    let s = Sluice::builder(&pg).database("app", &[("pool_size", "2")]).start();
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let ssl_now = || async {
        let row = c.query_one("select ssl from pg_stat_ssl where pid = pg_backend_pid()", &[]).await.unwrap();
        row.get::<_, bool>(0)
    };
    assert!(!ssl_now().await);
    let tls = format!("server_tls_sslmode = \"verify-full\"\nserver_tls_ca_file = {}", path_str(&certs.ca));
    s.reload_replacing("server_tls_sslmode = \"disable\"", &tls);
    assert!(ssl_now().await, "the idle plaintext server was retired; the next one uses TLS");
}

/// Admin SET of the server side's TLS settings: new server connections follow (the
/// idle plaintext one retired); a setting whose files cannot be used is refused,
/// naming the key, and changes nothing.
#[tokio::test]
async fn admin_set_of_server_tls_takes_effect_or_is_refused() {
    let certs = TestCerts::generate();
    let ssl = PgSsl { cert: certs.server.cert.clone(), key: certs.server.key.clone(), ca: None };
    let pg = PgCluster::start_with(PgOptions { ssl: Some(ssl), ..PgOptions::default() });
    let s = Sluice::builder(&pg).database("app", &[("pool_size", "2")]).general("admin_users", "[\"u_scram\"]").start();
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let admin = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "pgbouncer").await;
    let ssl_now = || async {
        let row = c.query_one("select ssl from pg_stat_ssl where pid = pg_backend_pid()", &[]).await.unwrap();
        row.get::<_, bool>(0)
    };
    assert!(!ssl_now().await);
    admin.simple_query(&format!("SET server_tls_ca_file = '{}'", certs.ca.display())).await.unwrap();
    admin.simple_query("SET server_tls_sslmode = 'verify-full'").await.unwrap();
    assert!(ssl_now().await, "the idle plaintext server was retired; the next one uses TLS");
    let e = admin.simple_query("SET server_tls_ca_file = '/nonexistent/ca.crt'").await.unwrap_err();
    assert_eq!(crate::common::code(&e), "22023");
    let text = e.as_db_error().map(|d| d.message().to_string()).unwrap_or_default();
    assert!(text.contains("server_tls_ca_file"), "{text}");
    let shown = admin.simple_query("SHOW CONFIG").await.unwrap();
    let ca = shown.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) if r.get("key") == Some("server_tls_ca_file") => {
            r.get("value").map(String::from)
        }
        _ => None,
    });
    assert_eq!(ca, Some(certs.ca.display().to_string()), "the refused SET was stored");
    // Still verify-full with the test CA: a new server connection verifies and uses TLS.
    admin.simple_query("RECONNECT app").await.unwrap();
    assert!(ssl_now().await, "a refused SET changed the server TLS setup");
}

#[test]
fn unusable_tls_files_stop_start_up_and_check_naming_file_line_and_key() {
    let certs = TestCerts::generate();
    let path = certs.dir().join("bad.toml");
    let port = crate::common::free_port();
    let config = |cert: &str| {
        format!(
            "[general]\nlisten_port = {port}\nunix_socket_dir = \"\"\nclient_tls_sslmode = \"require\"\nclient_tls_cert_file = \"{cert}\"\n\
             client_tls_key_file = {}\n",
            path_str(&certs.server.key)
        )
    };
    let sluice = |args: &[&str]| {
        let out =
            std::process::Command::new(env!("CARGO_BIN_EXE_sluice")).arg("--config").arg(&path).args(args).output();
        let out = out.expect("run sluice");
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    std::fs::write(&path, config("missing.crt")).unwrap();
    for args in [&["--check"][..], &[]] {
        let (code, err) = sluice(args);
        assert_eq!(code, Some(2), "{err}");
        assert!(err.contains(&format!("{}:5: general.client_tls_cert_file: cannot read", path.display())), "{err}");
    }
    // A certificate that does not fit the key.
    std::fs::write(&path, config(&certs.server2.cert.display().to_string())).unwrap();
    let (code, err) = sluice(&["--check"]);
    assert_eq!(code, Some(2));
    assert!(err.contains("general.client_tls_key_file: does not fit client_tls_cert_file"), "{err}");
    std::fs::write(&path, config(&certs.server.cert.display().to_string())).unwrap();
    assert_eq!(sluice(&["--check"]).0, Some(0));
}

/// A reload to `auth_type = "cert"` whose client TLS files cannot be used keeps the
/// running `hba` with its rules (the new config read no auth_hba_file): logins go on.
#[test]
fn a_kept_hba_auth_type_keeps_its_rules() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let live = CertFiles { cert: certs.dir().join("live.crt"), key: certs.dir().join("live.key") };
    install(&certs.server, &live);
    let hba = certs.dir().join("hba.conf");
    std::fs::write(&hba, "hostssl all u_trust all trust\nhost all all all reject\n").unwrap();
    let b = Sluice::builder(&pg)
        .general("auth_type", "\"hba\"")
        .general("auth_hba_file", &path_str(&hba))
        .user("u_trust", &[]);
    let s = client_tls(b, "require", &live, &certs).start();
    let config = client::config(&certs.ca, &PG_ALPN);
    let login = || {
        let mut sock = client::negotiated(s.port, &config).expect("handshake");
        client::login(&mut sock, "u_trust").map(|_| client::query_value(&mut sock, "select current_user"))
    };
    assert_eq!(login().as_deref(), Ok("u_trust"));

    std::fs::write(&live.cert, "not a certificate\n").unwrap();
    let changed = s
        .config()
        .replace(r#"client_tls_sslmode = "require""#, r#"client_tls_sslmode = "verify-ca""#)
        .replace(r#"auth_type = "hba""#, r#"auth_type = "cert""#);
    assert!(changed.contains(r#"auth_type = "cert""#), "{changed}");
    s.write_config(&changed);
    let before = reloads(&s);
    s.reload();
    assert!(wait_until(Duration::from_secs(10), || reloads(&s) > before), "{}", s.log());
    assert!(s.log().contains("keeping the running client TLS setup"), "{}", s.log());
    assert_eq!(login().as_deref(), Ok("u_trust"), "the running hba rules still decide");
}

/// A reload to `auth_type = "cert"` whose client TLS files cannot be used keeps the
/// running `scram-sha-256`; a `[users]` md5 hash the new file gives (fine under `cert`)
/// cannot check that: the reload fails, its error naming the file, the line and the key.
#[test]
fn a_kept_auth_type_the_new_users_do_not_fit_names_file_line_and_key() {
    let certs = TestCerts::generate();
    let pg = PgCluster::start();
    let live = CertFiles { cert: certs.dir().join("live.crt"), key: certs.dir().join("live.key") };
    install(&certs.server, &live);
    let s = client_tls(Sluice::builder(&pg), "require", &live, &certs).start();
    std::fs::write(&live.cert, "not a certificate\n").unwrap();
    let hash = crate::common::md5_secret(Role::MD5.name, Role::MD5.password);
    let changed = s
        .config()
        .replace(r#"client_tls_sslmode = "require""#, r#"client_tls_sslmode = "verify-ca""#)
        .replace("[general]\n", "[general]\nauth_type = \"cert\"\n")
        + &format!("\n[users.late]\npassword = \"{hash}\"\n");
    assert!(changed.contains(r#"auth_type = "cert""#), "{changed}");
    s.write_config(&changed);
    s.reload();
    assert!(s.wait_log("reload failed", Duration::from_secs(10)), "{}", s.log());
    let line = changed.lines().position(|l| l.starts_with("password = \"md5")).unwrap() + 1;
    let want = format!("{}:{line}: users.late.password: ", s.config_path.display());
    assert!(s.log().contains(&want), "no {want} in {}", s.log());
}
