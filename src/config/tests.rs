use super::*;

fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new("sluice.toml"))
}

fn err(text: &str) -> String {
    parse(text).unwrap_err().to_string()
}

#[test]
fn defaults_are_sane() {
    let c = parse("").unwrap();
    assert_eq!(c.general.listen_port, 6432);
    assert_eq!(c.general.auth_type, AuthType::ScramSha256);
    assert_eq!(c.general.pool_mode, PoolMode::Session);
    assert_eq!(c.general.server_tls_sslmode, crate::config::ServerTlsMode::Prefer);
    assert_eq!(c.listen, vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);
    assert!(c.workers() >= 1);
}

#[test]
fn full_example_parses() {
    let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/examples/sluice.toml")).unwrap();
    let c = parse(&text).unwrap();
    assert!(!c.databases.is_empty());
    assert!(!c.users.is_empty());
}

#[test]
fn unknown_key_names_line() {
    let e = err("[general]\nlisten_port = 6432\nlisten_prot = 1\n");
    assert!(e.starts_with("sluice.toml:3:"), "{e}");
    assert!(e.contains("listen_prot"), "{e}");
}

#[test]
fn wrong_type_and_bad_enum_name_line() {
    let e = err("[general]\n\nlisten_port = \"x\"\n");
    assert!(e.starts_with("sluice.toml:3:"), "{e}");
    let e = err("[databases.app]\npool_mode = \"sometimes\"\n");
    assert!(e.starts_with("sluice.toml:2:"), "{e}");
    assert!(e.contains("sometimes"), "{e}");
}

#[test]
fn semantic_errors_name_file_line_and_key() {
    let e = err("[general]\nauth_type = \"trust\"\n[databases.app]\nhost = \"h\"\nport = 0\n");
    assert_eq!(e, "sluice.toml:5: databases.app.port: must be between 1 and 65535");
    let e = err("[general]\nauth_type = \"trust\"\n[databases.app]\ntimezone = \"\"\n");
    assert_eq!(e, "sluice.toml:4: databases.app.timezone: must not be empty (leave it out for the default)");
    let e = err("[general]\nauth_type = \"trust\"\n[databases.app]\nconnect_query = \"select 1\\u0000\"\n");
    assert_eq!(e, "sluice.toml:4: databases.app.connect_query: must not contain a NUL character");
    let e = err("[general]\nlisten_addr = [\"not a host\"]\n");
    assert!(e.starts_with("sluice.toml:2: general.listen_addr:"), "{e}");
    let e = err("[general]\nquery_timeout = -1\n");
    assert!(e.starts_with("sluice.toml:2: general.query_timeout:"), "{e}");
    let e = err("[general]\nlog_level = \"[[[\"\n");
    assert!(e.contains("general.log_level"), "{e}");
    // TCP options beyond what the kernel takes, a backlog of 0, an unknown group, an
    // unknown TLS version.
    let cases = [
        ("tcp_keepcnt = 128", "tcp_keepcnt: must be at most 127 probes (0: the kernel's)"),
        ("tcp_keepidle = 32768", "tcp_keepidle: must be at most 32767 seconds (0: the kernel's)"),
        ("unix_socket_group = \"no-such-group-here\"", "unix_socket_group: no group named \"no-such-group-here\""),
        (
            "server_tls_protocols = [\"sslv3\"]",
            "server_tls_protocols: \"sslv3\" is not supported; use \"tlsv1.2\" and/or \"tlsv1.3\"",
        ),
        ("listen_backlog = 0", "listen_backlog: must be at least 1"),
        ("cancel_wait_timeout = -1", "cancel_wait_timeout: must be a number of seconds from 0 to 1000000000"),
        ("dns_nxdomain_ttl = -1", "dns_nxdomain_ttl: must be a number of seconds from 0 to 1000000000"),
        ("query_timeout = 1e300", "query_timeout: must be a number of seconds from 0 to 1000000000"),
        ("unix_socket_mode = \"0777777\"", "unix_socket_mode: must be an octal file mode from \"0\" to \"0777\""),
        ("unix_socket_mode = \"+777\"", "unix_socket_mode: must be an octal file mode from \"0\" to \"0777\""),
        ("unix_socket_mode = \"\"", "unix_socket_mode: must be an octal file mode from \"0\" to \"0777\""),
        ("unix_socket_mode = \"77777777777\"", "unix_socket_mode: must be an octal file mode from \"0\" to \"0777\""),
        ("server_check_query = \"select\\u0000\"", "server_check_query: must not contain a NUL character"),
        ("max_packet_size = 1023", "max_packet_size: must be at least 1024"),
    ];
    for (line, want) in cases {
        assert_eq!(err(&format!("[general]\n{line}\n")), format!("sluice.toml:2: general.{want}"));
    }
    assert!(parse("[general]\nunix_socket_group = \"root\"\n").is_ok());
    assert!(parse("[general]\nunix_socket_mode = \"0700\"\n").is_ok());
    // A port, a comma-separated list or a mistyped IPv4 address is no host name.
    for entry in ["127.0.0.1:6432", "localhost:6432", "10.0.0.1,10.0.0.2", "300.1.1.1"] {
        let e = err(&format!("[general]\nlisten_addr = [\"{entry}\"]\n"));
        assert!(e.starts_with("sluice.toml:2: general.listen_addr:"), "{entry}: {e}");
    }
    assert!(parse("[general]\nlisten_addr = [\"db-1.example.com\", \"localhost\"]\n").is_ok());
    assert!(parse("[general]\nmax_packet_size = 1024\n").is_ok());
    assert!(err("[general]\nmax_packet_size = 4294967296\n").starts_with("sluice.toml:2: general.max_packet_size"));
    let e = err("[general]\nclient_tls_ciphers = \"RC4:DHE-RSA-AES128-SHA\"\n");
    assert!(e.starts_with("sluice.toml:2: general.client_tls_ciphers: \"RC4:DHE-RSA-AES128-SHA\" allows none"), "{e}");
    let e = err("[general]\nserver_tls_ciphers = \"!ALL\"\n");
    assert!(e.starts_with("sluice.toml:2: general.server_tls_ciphers:"), "{e}");
    let e = err("[general]\nclient_tls_ecdhcurve = \"none\"\n");
    assert!(e.starts_with("sluice.toml:2: general.client_tls_ecdhcurve: \"none\" is not supported"), "{e}");
    assert!(
        parse("[general]\nclient_tls_ciphers = \"HIGH:!aNULL:!MD5\"\nclient_tls_ecdhcurve = \"prime256v1\"\n").is_ok()
    );
    let e = err("[general]\ntcp_user_timeout = -5\n");
    assert!(e.starts_with("sluice.toml:2: general.tcp_user_timeout:"), "{e}");
    assert!(parse("[general]\ntcp_keepidle = 32767\ntcp_keepcnt = 127\ntcp_user_timeout = 30000\n").is_ok());
    let e = err("[general]\n\ntcp_socket_buffer = 1073741824\n");
    assert!(e.starts_with("sluice.toml:3: general.tcp_socket_buffer: must be at most 1073741823 bytes"), "{e}");
    assert_eq!(parse("[general]\ntcp_socket_buffer = 65536\n").unwrap().general.tcp_socket_buffer, 65536);
}

#[test]
fn inline_tables_and_dotted_keys_name_their_line() {
    let e =
        err("[general]\nauth_type = \"trust\"\n[databases]\nok = { host = \"h\" }\napp = { host = \"h\", port = 0 }\n");
    assert_eq!(e, "sluice.toml:5: databases.app.port: must be between 1 and 65535");
    let e = err("[general]\nauth_type = \"trust\"\n[databases]\napp.host = \"h\"\napp.port = 0\n");
    assert_eq!(e, "sluice.toml:5: databases.app.port: must be between 1 and 65535");
    let e = err("general = { auth_type = \"trust\", listen_port = \"x\" }\n");
    assert!(e.starts_with("sluice.toml:1: general.listen_port:"), "{e}");
}

#[test]
fn scram_is_a_short_spelling_of_scram_sha_256() {
    let c = parse("[general]\nauth_type = \"scram\"\n").unwrap();
    assert_eq!(c.general.auth_type, AuthType::ScramSha256);
    let e = err("[general]\nauth_type = \"scram-sha-1\"\n");
    assert!(e.starts_with("sluice.toml:2: general.auth_type: unknown variant"), "{e}");
}

#[test]
fn user_secrets_are_checked_against_auth_type() {
    let e = err("[users.bob]\npassword = \"SCRAM-SHA-256$4096:bad\"\n");
    assert!(e.starts_with("sluice.toml:2: users.bob.password"), "{e}");
    // An empty password would let anyone in with an empty password.
    for (text, key) in
        [("password = \"\"", "password"), ("password = \"p\"\nserver_password = \"\"", "server_password")]
    {
        let e = err(&format!("[users.bob]\n{text}\n"));
        assert!(e.contains(&format!("users.bob.{key}: must not be empty")), "{e}");
    }
    assert!(parse("[general]\nauth_type = \"trust\"\n[users.bob]\n").is_ok());
    // What Sluice logs in to servers with: checked too, naming the key.
    let e = err("[users.bob]\npassword = \"p\"\nserver_password = \"SCRAM-SHA-256$x\"\n");
    assert!(e.starts_with("sluice.toml:3: users.bob.server_password: is not a valid"), "{e}");
    let e = err("[databases.app]\nuser = \"o\"\npassword = \"SCRAM-SHA-256$x\"\n");
    assert!(e.starts_with("sluice.toml:3: databases.app.password: is not a valid"), "{e}");
    let scram = crate::auth::scram::ScramSecret::derive("p", b"0123456789abcdef", 4096).to_string();
    // Under md5 a SCRAM secret is accepted: that user logs in with SCRAM.
    assert!(parse(&format!("[general]\nauth_type = \"md5\"\n[users.bob]\npassword = \"{scram}\"\n")).is_ok());
    let e = err(&format!("[databases.app]\nuser = \"o\"\npassword = \"{scram}\"\n"));
    assert!(e.contains("databases.app.password: a SCRAM secret cannot log in as a database's own user"), "{e}");
    // A reload that keeps the running auth_type checks the new users against it.
    let mut c = parse(&format!("[users.x]\npassword = \"{scram}\"\n")).unwrap();
    assert!(c.check_users().is_ok());
    c.general.auth_type = AuthType::ScramSha256;
    c.users.get_mut("x").unwrap().password = Some(crate::auth::md5::password_hash("x", "p"));
    assert!(c.check_users().unwrap_err().starts_with("users.x.password: an md5 hash cannot check SCRAM logins"));
    for key in ["dbname", "user"] {
        let e = err(&format!("[databases.app]\n{key} = \"\"\n"));
        assert!(e.starts_with(&format!("sluice.toml:2: databases.app.{key}: must not be empty")), "{e}");
    }
}

/// An md5 hash from the `auth_file` under `scram-sha-256` loads (PgBouncer loads such a
/// file and refuses that user's logins), with a warning naming the file's line; written
/// in `[users]` it stays an error.
#[test]
fn auth_file_md5_hashes_load_under_scram_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let md5 = crate::auth::md5::password_hash("old", "p");
    std::fs::write(dir.path().join("userlist.txt"), format!("\"new\" \"p\"\n\n\"old\" \"{md5}\"\n")).unwrap();
    let path = dir.path().join("sluice.toml");
    let load = |text: &str| Config::parse(&format!("[general]\nauth_file = \"userlist.txt\"\n{text}"), &path);
    let c = load("").unwrap();
    let file = dir.path().join("userlist.txt");
    let want = format!("{}:3: old: an md5 hash cannot check SCRAM logins", file.display());
    assert!(matches!(c.warnings().as_slice(), [w] if w.starts_with(&want)), "{:?}", c.warnings());
    assert!(c.check_users().is_ok(), "a reload keeping scram-sha-256 takes the file as the load did");
    // md5 logins are checked with it; a [users] password of its own wins over the file.
    assert!(load("auth_type = \"md5\"\n").unwrap().warnings().is_empty());
    assert!(load("[users.old]\npassword = \"p\"\n").unwrap().warnings().is_empty());
    // The operator's own [users] entry: refused at load, as is one a reload would keep.
    let e = load(&format!("[users.old]\npassword = \"{md5}\"\n")).unwrap_err().to_string();
    assert!(e.contains(":4: users.old.password: an md5 hash cannot check SCRAM logins"), "{e}");
    let mut c = load("auth_type = \"md5\"\n[users.own]\n").unwrap();
    c.general.auth_type = AuthType::ScramSha256;
    assert!(c.check_users().is_ok());
    c.users.get_mut("own").unwrap().password = Some(md5);
    assert!(c.check_users().unwrap_err().starts_with("users.own.password: an md5 hash"));
}

#[test]
fn min_pool_size_bounded_by_pool_size() {
    let e = err("[general]\nauth_type = \"trust\"\n[databases.a]\npool_size = 2\nmin_pool_size = 3\n");
    assert!(e.starts_with("sluice.toml:5: databases.a.min_pool_size"), "{e}");
}

#[test]
fn pool_mode_precedence() {
    let c = parse(
        "[general]\npool_mode = \"statement\"\nauth_type = \"trust\"\n[databases.a]\npool_mode = \"session\"\n[databases.b]\n[users.u]\npool_mode = \"transaction\"\n",
    )
    .unwrap();
    let (a, b) = (&c.databases["a"], &c.databases["b"]);
    assert_eq!(c.pool_mode(a, None), PoolMode::Session);
    assert_eq!(c.pool_mode(b, None), PoolMode::Statement);
    assert_eq!(c.pool_mode(a, c.users.get("u")), PoolMode::Transaction);
}

/// As in PgBouncer: the user's `pool_size`, then the database's, then the default;
/// not the user's for a database with a forced server user.
#[test]
fn pool_size_precedence() {
    let c = parse(
        "[general]\ndefault_pool_size = 7\nauth_type = \"trust\"\n[databases.a]\npool_size = 3\n[databases.b]\n[databases.f]\npool_size = 4\nuser = \"s\"\n[users.u]\npool_size = 5\n[users.v]\n",
    )
    .unwrap();
    let (a, b, f) = (&c.databases["a"], &c.databases["b"], &c.databases["f"]);
    let (u, v) = (c.users.get("u"), c.users.get("v"));
    assert_eq!([c.pool_size(a, u), c.pool_size(b, u), c.pool_size(f, u)], [5, 5, 4]);
    assert_eq!([c.pool_size(a, v), c.pool_size(b, v), c.pool_size(a, None)], [3, 7, 3]);
}

#[test]
fn ipv6_and_wildcard_listen() {
    let c = parse("[general]\nlisten_addr = [\"[::1]\", \"127.0.0.1\"]\n").unwrap();
    assert_eq!(c.listen.len(), 2);
    assert_eq!(parse("[general]\nlisten_addr = [\"*\"]\n").unwrap().listen.len(), 2);
    // A host name: kept as a name (resolved when the listeners are bound, at start-up),
    // to every address it resolves to (here from /etc/hosts), each once.
    let c = parse("[general]\nlisten_addr = [\"localhost\", \"127.0.0.2\"]\n").unwrap();
    assert_eq!(c.listen_names().collect::<Vec<_>>(), ["localhost"]);
    assert_eq!(c.listen, vec![std::net::IpAddr::from([127, 0, 0, 2])]);
    let named = c.listen_ips().unwrap();
    assert!(named.contains(&std::net::IpAddr::from([127, 0, 0, 1])), "{named:?}");
    assert!(named.iter().all(|ip| ip.is_loopback()), "{named:?}");
    // An address a listed wildcard of its family takes already is not bound again.
    let wild = parse("[general]\nlisten_addr = [\"0.0.0.0\", \"localhost\"]\n").unwrap().listen_ips().unwrap();
    assert!(!wild.contains(&std::net::IpAddr::from([127, 0, 0, 1])), "{wild:?}");
    assert!(err("[general]\nlisten_addr = [\"no such\"]\n").contains("not an IP address or a host name"));
    // Addresses that cannot all be bound: named before start-up fails on them.
    for list in [r#""::1", "[::1]""#, r#""*", "0.0.0.0""#, r#""127.0.0.1", "0.0.0.0""#] {
        let e = err(&format!("[general]\nlisten_addr = [{list}]\n"));
        assert!(e.starts_with("sluice.toml:2: general.listen_addr:"), "{list}: {e}");
    }
}

#[test]
fn every_key_is_documented() {
    let docs = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/config.md")).unwrap();
    let mut missing = Vec::new();
    for (section, key) in reference::keys() {
        if !docs.contains(&format!("### `{key}`")) && !docs.contains(&format!("| `{key}` |")) {
            missing.push(format!("{section}.{key}"));
        }
    }
    assert!(missing.is_empty(), "undocumented config keys in docs/config.md: {missing:?}");
}

#[test]
fn tls_modes_need_their_files() {
    let e = err("[general]\nclient_tls_sslmode = \"require\"\n");
    assert_eq!(e, "sluice.toml:2: general.client_tls_sslmode: \"require\" needs client_tls_cert_file");
    let base = "[general]\nclient_tls_cert_file = \"c.pem\"\nclient_tls_key_file = \"k.pem\"\n";
    assert!(parse(&format!("{base}client_tls_sslmode = \"allow\"\n")).is_ok());
    let e = err(&format!("{base}client_tls_sslmode = \"verify-ca\"\n"));
    assert!(e.contains("general.client_tls_sslmode: \"verify-ca\" needs client_tls_ca_file"), "{e}");
    let e = err(&format!("{base}client_tls_sslmode = \"sometimes\"\n"));
    assert!(e.starts_with("sluice.toml:4:"), "{e}");
    let e = err("[general]\nserver_tls_sslmode = \"verify-full\"\n");
    assert!(e.contains("general.server_tls_sslmode: \"verify-full\" needs server_tls_ca_file"), "{e}");
    let e = err("[general]\nserver_tls_cert_file = \"c.pem\"\n");
    assert!(e.contains("general.server_tls_cert_file: needs server_tls_key_file"), "{e}");
    // PgBouncer's `allow`, the same as prefer there.
    let c = parse("[general]\nserver_tls_sslmode = \"allow\"\n").expect("allow refused");
    assert_eq!(c.general.server_tls_sslmode, crate::config::ServerTlsMode::Allow);
}

#[test]
fn cert_auth_needs_verified_client_certificates() {
    let e = err("[general]\nauth_type = \"cert\"\n");
    assert!(e.starts_with("sluice.toml:2: general.auth_type:"), "{e}");
    let ok = "[general]\nauth_type = \"cert\"\nclient_tls_sslmode = \"verify-full\"\n\
              client_tls_cert_file = \"c\"\nclient_tls_key_file = \"k\"\nclient_tls_ca_file = \"ca\"\n";
    assert_eq!(parse(ok).unwrap().general.auth_type, AuthType::Cert);
}

#[test]
fn any_auth_needs_every_database_to_have_its_own_user() {
    let e = err("[general]\nauth_type = \"any\"\n[databases.own]\nuser = \"app\"\n[databases.theirs]\nport = 5433\n");
    assert!(e.starts_with("sluice.toml:5: databases.theirs.user:"), "{e}");
    assert!(e.contains("auth_type = \"any\" needs every database to have its own user"), "{e}");
    let ok = parse("[general]\nauth_type = \"any\"\n[databases.own]\nuser = \"app\"\n").unwrap();
    assert_eq!(ok.general.auth_type, AuthType::Any);
    assert_eq!(ok.check_users(), Ok(()));
    // A reload keeping a running `any` (its new `cert` could not be set up) is checked
    // again, against the new file's databases.
    let mut kept = parse("[general]\nauth_type = \"md5\"\n[databases.theirs]\n").unwrap();
    kept.general.auth_type = AuthType::Any;
    let e = kept.check_users().unwrap_err();
    assert_eq!(e, "databases.theirs.user: auth_type = \"any\" needs every database to have its own user");
}

#[test]
fn tls_protocols_are_checked_and_paths_resolved() {
    let e = err("[general]\nclient_tls_protocols = [\"tlsv1.1\"]\n");
    assert!(e.contains("general.client_tls_protocols: \"tlsv1.1\" is not supported"), "{e}");
    assert!(err("[general]\nclient_tls_protocols = []\n").contains("at least one"));
    let c = Config::parse("", Path::new("/etc/sluice/sluice.toml")).unwrap();
    assert_eq!(c.resolve("certs/a.pem"), Path::new("/etc/sluice/certs/a.pem"));
    assert_eq!(c.resolve("/abs/a.pem"), Path::new("/abs/a.pem"));
}

#[test]
fn password_lookups_are_checked_where_they_are_set() {
    let users = "[users.auth]\npassword = \"p\"\n";
    assert!(parse(&format!("[general]\nauth_user = \"auth\"\n[databases.app]\n{users}")).is_ok());
    let e = err(&format!("[general]\nauth_user = \"nobody\"\n[databases.app]\n{users}"));
    assert!(e.starts_with("sluice.toml:2: general.auth_user: user \"nobody\" is not in [users]"), "{e}");
    let e = err(&format!("[general]\nauth_user = \"auth\"\nauth_query = \"SELECT 1, 2\"\n{users}"));
    assert_eq!(e, "sluice.toml:3: general.auth_query: must take the user name as $1");
    let e = err(&format!("[general]\nauth_user = \"auth\"\nauth_query = \"SELECT $10, $2\"\n{users}"));
    assert_eq!(e, "sluice.toml:3: general.auth_query: must take the user name as $1");
    let e = err(&format!("[general]\nauth_user = \"auth\"\nauth_query = \"SELECT $1\\u0000\"\n{users}"));
    assert_eq!(e, "sluice.toml:3: general.auth_query: must not contain a NUL character");
    let e = err(&format!("[general]\nauth_user = \"auth\"\nauth_dbname = \"elsewhere\"\n[databases.app]\n{users}"));
    assert_eq!(e, "sluice.toml:3: general.auth_dbname: \"elsewhere\" is not a [databases] entry");
    // A database's own settings are reported at its own lines; general ones it uses at
    // theirs (the query is only checked where some lookup uses it).
    let e = err(&format!("[databases.app]\nauth_user = \"nobody\"\n{users}"));
    assert!(e.starts_with("sluice.toml:2: databases.app.auth_user: user \"nobody\""), "{e}");
    let text = format!("[general]\nauth_query = \"SELECT 1, 2\"\n[databases.app]\nauth_user = \"auth\"\n{users}");
    assert_eq!(err(&text), "sluice.toml:2: general.auth_query: must take the user name as $1");
    assert!(parse(&format!("[general]\nauth_query = \"SELECT 1, 2\"\n[databases.app]\n{users}")).is_ok());
    let e = err(&format!("[databases.app]\nauth_user = \"auth\"\nauth_dbname = \"\"\n{users}"));
    assert!(e.starts_with("sluice.toml:3: databases.app.auth_dbname: must not be empty"), "{e}");
    // The admin console's SET is checked too.
    let c = parse(&format!("[databases.app]\n{users}")).unwrap();
    let g = General { auth_user: "nobody".into(), ..c.general.clone() };
    let e = c.with_general(g).unwrap_err();
    assert!(e.starts_with("general.auth_user: user \"nobody\""), "{e}");
}

#[test]
fn hba_reads_its_file_beside_the_config_and_checks_cert_lines() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    let load = |text: &str| Config::parse(text, &config);
    let e = load("[general]\nauth_type = \"hba\"\n").unwrap_err().to_string();
    assert!(e.contains(":1: general.auth_hba_file: auth_type = \"hba\" needs an auth_hba_file"), "{e}");
    std::fs::write(dir.path().join("hba.conf"), "local all all peer\nhostssl all all all cert\n").unwrap();
    let text = "[general]\nauth_type = \"hba\"\nauth_hba_file = \"hba.conf\"\n";
    let e = load(text).unwrap_err().to_string();
    assert!(
        e.ends_with("hba.conf:2: connection type: hostssl cannot fit a login: client_tls_sslmode is \"disable\""),
        "{e}"
    );
    std::fs::write(dir.path().join("hba.conf"), "local all all peer\nhost all all 127.0.0.1/32 md5\n").unwrap();
    let cfg = load(text).unwrap();
    assert_eq!(cfg.hba.as_ref().map(|h| h.file.clone()), Some(dir.path().join("hba.conf")));
    // Other auth types do not read it (PgBouncer's rule), even when it is missing.
    let cfg = load("[general]\nauth_type = \"md5\"\nauth_hba_file = \"missing.conf\"\n").unwrap();
    assert!(cfg.hba.is_none());
    let e = load("[general]\nauth_type = \"hba\"\nauth_hba_file = \"missing.conf\"\n").unwrap_err().to_string();
    assert!(e.contains("missing.conf: cannot read"), "{e}");
    // With client TLS and a CA, cert lines load; SET cannot take the CA away from them.
    std::fs::write(dir.path().join("hba.conf"), "hostssl all all all cert\n").unwrap();
    let tls = "client_tls_sslmode = \"allow\"\nclient_tls_cert_file = \"s.crt\"\nclient_tls_key_file = \"s.key\"\n";
    let cfg = load(&format!("{text}{tls}client_tls_ca_file = \"ca.crt\"\n")).unwrap();
    let general = General { client_tls_ca_file: String::new(), ..cfg.general.clone() };
    let e = cfg.with_general(general).unwrap_err();
    assert!(e.contains("hba.conf:1: method: cert needs client_tls_ca_file"), "{e}");
    let general = General { client_tls_sslmode: ClientTlsMode::Disable, ..cfg.general.clone() };
    assert!(cfg.with_general(general).unwrap_err().contains("hba.conf:1: connection type: hostssl cannot fit"));
    std::fs::write(dir.path().join("hba.conf"), "# nothing\n\n").unwrap();
    let e = load(text).unwrap_err().to_string();
    assert!(e.ends_with("hba.conf:1: -: the file has no rules: every login would be refused"), "{e}");
    let plain = load("[general]\nauth_type = \"plain\"\n").unwrap();
    assert_eq!(plain.general.auth_type.method(), Some(crate::auth::client::Method::Password));
}

#[test]
fn hba_lines_that_fit_no_login_are_warned_about() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    let rules = "local all all peer\nhostnossl all all all md5\nhost all all all scram-sha-256\n";
    std::fs::write(dir.path().join("hba.conf"), rules).unwrap();
    let tls = "client_tls_sslmode = \"require\"\nclient_tls_cert_file = \"s.crt\"\nclient_tls_key_file = \"s.key\"\n";
    let text = format!(
        "[general]\nauth_type = \"hba\"\nauth_hba_file = \"hba.conf\"\nunix_socket_dir = \"\"\n{tls}\n\
         [users.old]\npassword = \"{}\"\n[users.new]\npassword = \"pw\"\n",
        crate::auth::md5::password_hash("old", "pw")
    );
    let warnings = Config::parse(&text, &config).unwrap().warnings();
    let file = dir.path().join("hba.conf").display().to_string();
    let want = [
        format!("{file}:1: this line fits no login: unix_socket_dir is empty (no Unix socket)"),
        format!("{file}:2: this line fits no login: client_tls_sslmode refuses plaintext TCP logins"),
        format!(
            "{file}:3: an md5 hash cannot check SCRAM logins: the logins of old on scram-sha-256 lines are refused"
        ),
    ];
    assert_eq!(warnings, want);
}

#[test]
fn peers_are_validated_with_their_line() {
    let c = parse(
        "[general]\npeer_id = 2\n[peers.1]\nhost = \"/tmp/s1\"\n[peers.2]\nhost = \"10.0.0.2\"\nport = 7000\npool_size = 3\n",
    )
    .unwrap();
    assert_eq!(c.general.peer_id, 2);
    assert_eq!(c.peers[&1], Peer { host: "/tmp/s1".into(), port: 6432, pool_size: None });
    assert_eq!((c.peers[&2].port, c.peers[&2].slots(&c.general)), (7000, 3));
    assert_eq!(c.peers[&1].slots(&c.general), 20, "default_pool_size");
    // Inline tables under [peers] are the same.
    assert_eq!(parse("[peers]\n7 = { host = \"h\" }\n").unwrap().peers[&7].host, "h");
    let e = err("[general]\npeer_id = 16384\n");
    assert_eq!(e, "sluice.toml:2: general.peer_id: must be between 0 (no peering) and 16383");
    for (text, want) in [
        ("[peers.0]\nhost = \"h\"\n", "sluice.toml:1: peers.0: a peer is named by its peer_id, 1 to 16383"),
        ("\n[peers.x]\nhost = \"h\"\n", "sluice.toml:2: peers.x: a peer is named by its peer_id, 1 to 16383"),
        ("[peers.01]\nhost = \"h\"\n", "sluice.toml:1: peers.01: a peer is named by its peer_id, 1 to 16383"),
        (
            "[peers.3]\nhost = \"@s\"\n",
            "sluice.toml:2: peers.3.host: Unix sockets in the abstract namespace are not supported",
        ),
        ("[peers.3]\nhost = \"h\"\nport = 0\n", "sluice.toml:3: peers.3.port: must be between 1 and 65535"),
        ("[peers.3]\nhost = \"h\"\npool_size = 0\n", "sluice.toml:3: peers.3.pool_size: must be at least 1"),
    ] {
        assert_eq!(err(text), want, "{text}");
    }
    assert!(err("[peers.3]\nport = 5\n").contains("host"), "host is required");
    assert!(err("[peers.3]\nhost = \"h\"\nuser = \"u\"\n").contains("unknown field"));
    // Listed without a peer_id: loads, with a warning.
    let w = parse("[peers.3]\nhost = \"h\"\n").unwrap().warnings();
    assert!(w.iter().any(|w| w.contains("peer_id is 0")), "{w:?}");
    let w = parse("[general]\npeer_id = 3\n[peers.3]\nhost = \"h\"\n").unwrap().warnings();
    assert!(w.iter().any(|w| w.contains("lists no other process")), "{w:?}");
    assert!(parse("[general]\npeer_id = 3\n[peers.4]\nhost = \"h\"\n").unwrap().warnings().is_empty());
}

#[test]
fn pam_settings_are_validated() {
    let c = parse("[general]\nauth_type = \"pam\"\n").unwrap();
    assert_eq!((c.general.auth_type, c.general.pam_service.as_str()), (AuthType::Pam, "sluice"));
    assert_eq!(c.general.auth_type.method(), Some(crate::auth::client::Method::Pam));
    for (text, want) in [
        ("[general]\npam_service = \"a/b\"\n", "sluice.toml:2: general.pam_service: must be a service name"),
        ("[general]\npam_config_dir = \"pam.d\"\n", "sluice.toml:2: general.pam_config_dir: must be an absolute path"),
        (
            "[general]\nauth_type = \"pam\"\nauth_user = \"a\"\n[users.a]\npassword = \"p\"\n",
            "sluice.toml:3: general.auth_user: auth_type = \"pam\" takes no auth_user",
        ),
        (
            "[general]\nauth_type = \"pam\"\n[databases.d]\nauth_user = \"a\"\n[users.a]\npassword = \"p\"\n",
            "sluice.toml:4: databases.d.auth_user: auth_type = \"pam\" takes no auth_user",
        ),
    ] {
        let e = err(text);
        assert!(e.starts_with(want), "{text}: {e}");
    }
    // Not a method of auth_hba_file lines (nor in PgBouncer's).
    let hba = hba::Hba::parse("host all all 127.0.0.1/32 pam\n", Path::new("hba.conf")).unwrap_err().to_string();
    assert!(hba.contains("authentication method \"pam\" is not supported"), "{hba}");
}
