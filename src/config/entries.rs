//! Checks of the `[databases]` and `[users]` entries, and of the passwords and secrets
//! they hold, against `[general]`; of the durations and the TLS keys.

use std::collections::BTreeMap;

use super::{AuthType, ClientTlsMode, ConfigError, Database, General, Invalid, ServerTlsMode, TLS_PROTOCOLS, User};

pub(super) fn validate_database(name: &str, db: &Database, g: &General, invalid: Invalid) -> Result<(), ConfigError> {
    if name.is_empty() || name.len() > 63 {
        return Err(invalid("dbname", "database names must have 1 to 63 bytes".into()));
    }
    if db.port == 0 {
        return Err(invalid("port", "must be between 1 and 65535".into()));
    }
    if db.host.is_empty() {
        return Err(invalid("host", "must be a host name, an IP address or a socket directory".into()));
    }
    if db.pool_size == Some(0) {
        return Err(invalid("pool_size", "must be at least 1".into()));
    }
    let size = db.pool_size.unwrap_or(g.default_pool_size);
    if db.min_pool_size.unwrap_or(0) > size {
        return Err(invalid("min_pool_size", format!("is larger than the pool size ({size})")));
    }
    if g.auth_type == AuthType::Any && db.user.is_none() {
        return Err(invalid("user", super::ANY_NEEDS_USER.into()));
    }
    if db.password.is_some() && db.user.is_none() {
        return Err(invalid("password", "is only used together with user".into()));
    }
    if let Some(e) = db.password.as_deref().and_then(secret_error) {
        return Err(invalid("password", e));
    }
    if db.password.as_deref().is_some_and(|p| p.starts_with("SCRAM-SHA-256$")) {
        // Pass-through needs a client proving that secret, and a database's own user
        // is never a client's: give what Sluice can log in with by itself.
        return Err(invalid(
            "password",
            "a SCRAM secret cannot log in as a database's own user; give a plain password or an md5 hash".into(),
        ));
    }
    let strings = [
        ("dbname", &db.dbname),
        ("user", &db.user),
        ("client_encoding", &db.client_encoding),
        ("datestyle", &db.datestyle),
        ("timezone", &db.timezone),
        ("connect_query", &db.connect_query),
    ];
    for (key, value) in strings {
        if value.as_deref() == Some("") {
            return Err(invalid(key, "must not be empty (leave it out for the default)".into()));
        }
        if value.as_deref().is_some_and(|v| v.contains('\0')) {
            return Err(invalid(key, "must not contain a NUL character".into()));
        }
    }
    Ok(())
}

/// Why a password, md5 hash or SCRAM secret in the config cannot be used, if it cannot.
/// An empty one is refused: it would let any client in with an empty password (leave
/// the key out for a user without one; PgBouncer refuses empty passwords at login).
fn secret_error(value: &str) -> Option<String> {
    if value.is_empty() {
        return Some("must not be empty (leave the key out for no password)".to_string());
    }
    crate::auth::Secret::parse(value).err().map(|_| "is not a valid SCRAM-SHA-256 secret".to_string())
}

/// Checks a user's entry. An md5 hash under `scram-sha-256` is an error in `[users]`
/// (the operator's own config), not when it comes from the `auth_file`
/// (`from_auth_file`): PgBouncer loads such a file, and that user's logins are refused
/// (see `md5_under_scram`).
pub(super) fn validate_user(
    user: &User,
    g: &General,
    from_auth_file: bool,
    invalid: Invalid,
) -> Result<(), ConfigError> {
    if let Some(p) = &user.password {
        if let Some(e) = secret_error(p) {
            return Err(invalid("password", e));
        }
        if !from_auth_file && md5_under_scram(user, g) {
            return Err(invalid(
                "password",
                "an md5 hash cannot check SCRAM logins; give a plain password or a SCRAM secret".into(),
            ));
        }
    }
    if let Some(e) = user.server_password.as_deref().and_then(secret_error) {
        return Err(invalid("server_password", e));
    }
    if user.pool_size == Some(0) {
        return Err(invalid("pool_size", "must be at least 1".into()));
    }
    Ok(())
}

/// Whether `user`'s password is an md5 hash while clients log in with SCRAM: it cannot
/// check their proofs, so every login of that user fails (as PostgreSQL refuses a role
/// with an md5 password under a `scram-sha-256` pg_hba line).
pub(super) fn md5_under_scram(user: &User, g: &General) -> bool {
    g.auth_type == AuthType::ScramSha256 && user.has_md5_hash()
}

impl User {
    /// Whether the user's password is an md5 hash (which cannot check SCRAM logins).
    pub(super) fn has_md5_hash(&self) -> bool {
        self.password.as_deref().is_some_and(crate::auth::md5::is_md5_hash)
    }
}

/// Where the config's users come from, for errors naming a user that is not there.
fn where_users_are(g: &General) -> &'static str {
    if g.auth_file.is_empty() { "[users]" } else { "[users] or the auth_file" }
}

/// The admin console keys: users must be users of the config, `[users]` or the
/// `auth_file` (`users` holds both; for their passwords; under `auth_type = "any"` none
/// is asked, and any name will do), the virtual database must not shadow a real one.
pub(super) fn validate_admin(
    g: &General,
    databases: &BTreeMap<String, Database>,
    users: &BTreeMap<String, User>,
    invalid: Invalid,
) -> Result<(), ConfigError> {
    if g.admin_database.is_empty() || g.admin_database.len() > 63 {
        return Err(invalid("admin_database", "must have 1 to 63 bytes".into()));
    }
    if databases.contains_key(&g.admin_database) {
        return Err(invalid("admin_database", format!("\"{}\" is also a [databases] entry", g.admin_database)));
    }
    for (key, list) in [("admin_users", &g.admin_users), ("stats_users", &g.stats_users)] {
        let unknown = |u: &&String| g.auth_type != super::AuthType::Any && !users.contains_key(*u);
        if let Some(u) = list.iter().find(unknown) {
            return Err(invalid(key, format!("user \"{u}\" is not in {}", where_users_are(g))));
        }
    }
    if !g.stats_period.is_finite() || !(1.0..=86_400.0).contains(&g.stats_period) {
        return Err(invalid("stats_period", "must be between 1 and 86400 seconds".into()));
    }
    if !g.metrics_listen.is_empty() && g.metrics_listen.parse::<std::net::SocketAddr>().is_err() {
        return Err(invalid(
            "metrics_listen",
            format!("\"{}\" is not an address like \"127.0.0.1:9930\"", g.metrics_listen),
        ));
    }
    Ok(())
}

/// An error at `key` of a section (`["general"]`, `["databases", NAME]`).
pub(super) type InvalidIn<'a> = &'a dyn Fn(&[&str], &str, String) -> ConfigError;

/// Checks the password lookups (`auth_user`, `auth_query`, `auth_dbname`), in
/// `[general]` and per database: the user must be one Sluice can log in as, the query
/// must take the user name as `$1`, and the database must be a `[databases]` entry.
pub(super) fn validate_auth_lookups(
    g: &General,
    databases: &BTreeMap<String, Database>,
    users: &BTreeMap<String, User>,
    invalid: InvalidIn,
) -> Result<(), ConfigError> {
    let general = ["general"];
    validate_pam(g, databases, invalid)?;
    check_lookup(g.auth_user.as_str(), g.auth_query.as_str(), g.auth_dbname.as_str(), g, databases, users, &|k, m| {
        invalid(&general, k, m)
    })?;
    for (name, db) in databases {
        let section = ["databases", name.as_str()];
        let at = |k: &str, m| invalid(&section, k, m);
        for (key, value) in
            [("auth_user", &db.auth_user), ("auth_query", &db.auth_query), ("auth_dbname", &db.auth_dbname)]
        {
            if value.as_deref() == Some("") {
                return Err(at(key, "must not be empty (leave it out for the general setting)".into()));
            }
        }
        let user = db.auth_user.as_deref().unwrap_or(&g.auth_user);
        let query = db.auth_query.as_deref().unwrap_or(&g.auth_query);
        let dbname = db.auth_dbname.as_deref().unwrap_or(&g.auth_dbname);
        // Only what the entry sets itself is reported at its line; the rest was
        // checked with `[general]`.
        let own = |k: &str, m: String| match (k, &db.auth_user, &db.auth_query, &db.auth_dbname) {
            ("auth_user", Some(_), ..) | ("auth_query", _, Some(_), _) | ("auth_dbname", .., Some(_)) => at(k, m),
            _ => invalid(&general, k, m),
        };
        check_lookup(user, query, dbname, g, databases, users, &own)?;
    }
    Ok(())
}

/// `pam_service` names a service file and `pam_config_dir` is absolute; under
/// `auth_type = "pam"` libpam can be loaded (with `pam_start_confdir` when
/// `pam_config_dir` is set) and no `auth_user` lookups are configured (PAM checks the
/// passwords, as in PgBouncer, where the two do not go together).
fn validate_pam(g: &General, databases: &BTreeMap<String, Database>, invalid: InvalidIn) -> Result<(), ConfigError> {
    let general = |k: &str, m: String| invalid(&["general"], k, m);
    let service = &g.pam_service;
    if service.is_empty() || service.contains(['/', '\0']) {
        return Err(general("pam_service", "must be a service name (a file name in the PAM directory)".into()));
    }
    if !g.pam_config_dir.is_empty() && (!g.pam_config_dir.starts_with('/') || g.pam_config_dir.contains('\0')) {
        return Err(general("pam_config_dir", "must be an absolute path".into()));
    }
    if g.auth_type != super::AuthType::Pam {
        return Ok(());
    }
    let pam = crate::auth::pam::Pam::load().map_err(|e| general("auth_type", format!("\"pam\": {e}")))?;
    if !g.pam_config_dir.is_empty() && !pam.has_config_dir() {
        return Err(general("pam_config_dir", "this libpam has no pam_start_confdir (Linux-PAM 1.4 or later)".into()));
    }
    const NO_LOOKUPS: &str = "auth_type = \"pam\" takes no auth_user: PAM checks the passwords";
    if !g.auth_user.is_empty() {
        return Err(general("auth_user", NO_LOOKUPS.into()));
    }
    match databases.iter().find(|(_, db)| db.auth_user.is_some()) {
        Some((name, _)) => Err(invalid(&["databases", name], "auth_user", NO_LOOKUPS.into())),
        None => Ok(()),
    }
}

fn check_lookup(
    user: &str,
    query: &str,
    dbname: &str,
    g: &General,
    databases: &BTreeMap<String, Database>,
    users: &BTreeMap<String, User>,
    invalid: Invalid,
) -> Result<(), ConfigError> {
    if user.is_empty() {
        return Ok(());
    }
    if !users.contains_key(user) {
        let known = where_users_are(g);
        return Err(invalid(
            "auth_user",
            format!("user \"{user}\" is not in {known} (Sluice logs in to the server as it to look up passwords)"),
        ));
    }
    // `$1` itself, not `$10`.
    let takes_1 = query.match_indices("$1").any(|(at, _)| !query[at + 2..].starts_with(|c: char| c.is_ascii_digit()));
    if !takes_1 {
        return Err(invalid("auth_query", "must take the user name as $1".into()));
    }
    if query.contains('\0') {
        return Err(invalid("auth_query", "must not contain a NUL character".into()));
    }
    // One the fallback entry serves will do, as in PgBouncer.
    let served = databases.contains_key(dbname) || databases.contains_key(super::FALLBACK_DATABASE);
    if !dbname.is_empty() && (!served || dbname == super::FALLBACK_DATABASE) {
        return Err(invalid("auth_dbname", format!("\"{dbname}\" is not a [databases] entry")));
    }
    Ok(())
}

/// Every key holding seconds: finite, 0 or more.
pub(super) fn validate_durations(g: &General, invalid: Invalid) -> Result<(), ConfigError> {
    let durations = [
        ("server_check_delay", g.server_check_delay),
        ("server_lifetime", g.server_lifetime),
        ("server_idle_timeout", g.server_idle_timeout),
        ("autodb_idle_timeout", g.autodb_idle_timeout),
        ("server_connect_timeout", g.server_connect_timeout),
        ("server_login_retry", g.server_login_retry),
        ("dns_max_ttl", g.dns_max_ttl),
        ("dns_nxdomain_ttl", g.dns_nxdomain_ttl),
        ("reserve_pool_timeout", g.reserve_pool_timeout),
        ("internal_query_timeout", g.internal_query_timeout),
        ("cancel_wait_timeout", g.cancel_wait_timeout),
        ("client_login_timeout", g.client_login_timeout),
        ("query_wait_timeout", g.query_wait_timeout),
        ("query_timeout", g.query_timeout),
        ("idle_transaction_timeout", g.idle_transaction_timeout),
        ("client_idle_timeout", g.client_idle_timeout),
        ("shutdown_timeout", g.shutdown_timeout),
        ("auth_failure_delay", g.auth_failure_delay),
    ];
    for (key, v) in durations {
        if !v.is_finite() || !(0.0..=1e9).contains(&v) {
            return Err(invalid(key, "must be a number of seconds from 0 to 1000000000".into()));
        }
    }
    Ok(())
}

/// The TCP options within what Linux accepts (`TCP_KEEPIDLE` and `TCP_KEEPINTVL` at
/// most 32767 s, `TCP_KEEPCNT` 127 probes, `TCP_USER_TIMEOUT` an `int` of ms), and a
/// backlog of at least 1.
pub(super) fn validate_tcp(g: &General, invalid: Invalid) -> Result<(), ConfigError> {
    let limits = [
        ("tcp_keepidle", g.tcp_keepidle, 32767, "seconds"),
        ("tcp_keepintvl", g.tcp_keepintvl, 32767, "seconds"),
        ("tcp_keepcnt", g.tcp_keepcnt, 127, "probes"),
        ("tcp_user_timeout", g.tcp_user_timeout, i32::MAX as u32, "milliseconds"),
        ("tcp_socket_buffer", g.tcp_socket_buffer, i32::MAX as u32 / 2, "bytes"),
    ];
    for (key, v, most, unit) in limits {
        if v > most {
            return Err(invalid(key, format!("must be at most {most} {unit} (0: the kernel's)")));
        }
    }
    if !cfg!(any(target_os = "linux", target_os = "android")) && g.tcp_user_timeout > 0 {
        return Err(invalid("tcp_user_timeout", "is not available on this system (0: the kernel's)".into()));
    }
    if g.listen_backlog == 0 {
        return Err(invalid("listen_backlog", "must be at least 1".into()));
    }
    Ok(())
}

/// Checks that each TLS mode has the files it needs; the files themselves are read by
/// `tls::load`, at start-up and on each reload.
pub(super) fn validate_tls(g: &General, invalid: Invalid) -> Result<(), ConfigError> {
    let mode = g.client_tls_sslmode;
    let client_files = [
        ("client_tls_cert_file", &g.client_tls_cert_file, mode != ClientTlsMode::Disable),
        ("client_tls_key_file", &g.client_tls_key_file, mode != ClientTlsMode::Disable),
        ("client_tls_ca_file", &g.client_tls_ca_file, mode.verifies_client()),
    ];
    if let Some((file, _, _)) = client_files.iter().find(|(_, value, needed)| *needed && value.is_empty()) {
        return Err(invalid("client_tls_sslmode", format!("\"{}\" needs {file}", mode.as_str())));
    }
    if g.auth_type == AuthType::Cert && !mode.verifies_client() {
        return Err(invalid(
            "auth_type",
            "\"cert\" needs client_tls_sslmode = \"verify-ca\" or \"verify-full\" (clients must present a certificate)"
                .into(),
        ));
    }
    for (key, list) in
        [("client_tls_protocols", &g.client_tls_protocols), ("server_tls_protocols", &g.server_tls_protocols)]
    {
        if list.is_empty() {
            return Err(invalid(key, "must list at least one of \"tlsv1.2\", \"tlsv1.3\"".into()));
        }
        if let Some(p) = list.iter().find(|p| !TLS_PROTOCOLS.contains(&p.as_str())) {
            return Err(invalid(key, format!("\"{p}\" is not supported; use \"tlsv1.2\" and/or \"tlsv1.3\"")));
        }
    }
    use crate::tls::suites::{kx_groups, tls12_suites};
    for (key, value) in [("client_tls_ciphers", &g.client_tls_ciphers), ("server_tls_ciphers", &g.server_tls_ciphers)] {
        tls12_suites(value).map_err(|e| invalid(key, e))?;
    }
    kx_groups(&g.client_tls_ecdhcurve).map_err(|e| invalid("client_tls_ecdhcurve", e))?;
    let server = g.server_tls_sslmode;
    if server >= ServerTlsMode::VerifyCa && g.server_tls_ca_file.is_empty() {
        return Err(invalid("server_tls_sslmode", format!("\"{}\" needs server_tls_ca_file", server.as_str())));
    }
    match (g.server_tls_cert_file.is_empty(), g.server_tls_key_file.is_empty()) {
        (false, true) => Err(invalid("server_tls_cert_file", "needs server_tls_key_file too".into())),
        (true, false) => Err(invalid("server_tls_key_file", "needs server_tls_cert_file too".into())),
        _ => Ok(()),
    }
}
