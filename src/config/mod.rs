//! Configuration: the TOML file, its validation (every error names file, line and key),
//! and the derived settings the rest of Sluice reads.

pub mod convert;
mod entries;
pub mod hba;
pub mod ident;
mod keep;
mod kinds;
mod listen;
mod locate;
mod peers;
pub mod reference;
mod userlist;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use entries::{
    validate_admin, validate_auth_lookups, validate_database, validate_durations, validate_tcp, validate_tls,
    validate_user,
};
pub use kinds::*;
use listen::{listed_ip, same_socket};
pub use locate::locate_key;
pub use peers::{MAX_PEER_ID, Peer};

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("{file}: cannot read: {source}")]
    Io { file: String, source: std::io::Error },
    #[error("{file}:{line}: {key}: {message}")]
    Invalid { file: String, line: usize, key: String, message: String },
}

impl ConfigError {
    /// An error at `line` of `file` (the config's other files: `auth_file`,
    /// `auth_hba_file`, `auth_ident_file`).
    pub fn at(file: &Path, line: usize, key: &str, message: String) -> ConfigError {
        ConfigError::Invalid { file: file.display().to_string(), line, key: key.to_string(), message }
    }
}

/// `server_check_query`'s value for an empty query (PgBouncer's spelling).
pub const EMPTY_QUERY: &str = "<empty>";

/// The name of the `[databases]` entry that serves databases not listed (`Config::database`).
pub const FALLBACK_DATABASE: &str = "*";

/// The `[general]` section. Durations are seconds (fractions allowed); 0 disables.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct General {
    pub listen_addr: Vec<String>,
    pub listen_port: u16,
    pub unix_socket_dir: String,
    pub unix_socket_mode: String,
    /// OS group of the Unix socket file ("" = the process's).
    pub unix_socket_group: String,
    pub workers: usize,
    pub auth_type: AuthType,
    /// PgBouncer's userlist.txt, read for users' passwords ("" = none).
    pub auth_file: String,
    /// The pg_hba.conf-style file `auth_type = "hba"` reads ("" = none).
    pub auth_hba_file: String,
    /// The pg_ident.conf-style user name maps of its `map=` options ("" = none).
    pub auth_ident_file: String,
    /// The user whose server connection looks up the passwords of users Sluice does not
    /// know (`auth_query`); "" = no lookups.
    pub auth_user: String,
    /// The query run (with the user name as `$1`) to find a user's password.
    pub auth_query: String,
    /// The `[databases]` entry the lookups run in ("" = the client's database).
    pub auth_dbname: String,
    /// The PAM service `auth_type = "pam"` checks passwords with.
    pub pam_service: String,
    /// A directory of PAM service files instead of the system's; empty: the system's.
    pub pam_config_dir: String,
    pub pool_mode: PoolMode,
    pub default_pool_size: usize,
    pub min_pool_size: usize,
    /// Connections a pool may open beyond its size for a client that has waited
    /// `reserve_pool_timeout` (0: none).
    pub reserve_pool_size: usize,
    /// Seconds a client waits before the reserve may be used for it (0: never).
    pub reserve_pool_timeout: f64,
    pub max_client_conn: usize,
    pub max_db_connections: usize,
    pub max_user_connections: usize,
    /// Lend idle server connections oldest first (spreading load over them), not newest
    /// first.
    pub server_round_robin: bool,
    pub server_reset_query: String,
    pub server_reset_query_always: bool,
    /// Session mode: a server marked for closing (RECONNECT, a reload moving its
    /// database, a DNS change) is closed at its transaction's end, with its client.
    pub server_fast_close: bool,
    pub server_check_delay: f64,
    /// The query that checks an idle server before a loan: `<empty>` an empty query,
    /// "" no check.
    pub server_check_query: String,
    pub server_lifetime: f64,
    pub server_idle_timeout: f64,
    /// Pools of databases the fallback entry `*` serves are dropped once unused this
    /// long (0: never).
    pub autodb_idle_timeout: f64,
    pub server_connect_timeout: f64,
    pub server_login_retry: f64,
    /// How long a lookup of a server's host name is used before it is made again.
    pub dns_max_ttl: f64,
    /// How long a failed lookup (with no earlier answer) is used before the next.
    pub dns_nxdomain_ttl: f64,
    /// Limit for each query Sluice itself runs on a server (check, SET, reset, ROLLBACK).
    pub internal_query_timeout: f64,
    /// How long forwarding a cancel request to a server may take (0: no limit).
    pub cancel_wait_timeout: f64,
    pub client_login_timeout: f64,
    pub query_wait_timeout: f64,
    pub query_timeout: f64,
    pub idle_transaction_timeout: f64,
    pub client_idle_timeout: f64,
    pub shutdown_timeout: f64,
    pub auth_failure_delay: f64,
    pub log_level: String,
    pub log_format: LogFormat,
    pub log_connections: bool,
    pub log_disconnections: bool,
    /// Log the errors Sluice itself sends to clients.
    pub log_pooler_errors: bool,
    pub tcp_keepalive: bool,
    /// Seconds of silence before the first keepalive probe (0: the kernel's).
    pub tcp_keepidle: u32,
    /// Seconds between keepalive probes (0: the kernel's).
    pub tcp_keepintvl: u32,
    /// Unanswered keepalive probes before a connection is dropped (0: the kernel's).
    pub tcp_keepcnt: u32,
    /// Milliseconds sent data may stay unacknowledged (0: the kernel's).
    pub tcp_user_timeout: u32,
    /// Bytes of each TCP connection's send and receive buffers (0: the kernel's, which
    /// sizes them as needed).
    pub tcp_socket_buffer: u32,
    /// Clients may not use the simple query protocol (PgBouncer's `disable_pqexec`).
    pub disable_pqexec: bool,
    /// `TCP_DEFER_ACCEPT` on the TCP listeners (Linux): a connection is accepted once
    /// its first data (the startup packet) has come.
    pub tcp_defer_accept: bool,
    /// Queue of connections not yet accepted, per listening socket.
    pub listen_backlog: u32,
    /// SO_REUSEPORT on the TCP listeners: several processes may listen on one port.
    pub so_reuseport: bool,
    /// This process's id in a peered group (`[peers]`); 0: no peering.
    pub peer_id: u16,
    pub max_prepared_statements: usize,
    pub max_client_prepared_statements: usize,
    /// Adds " - address:port" to each client's `application_name` at login.
    pub application_name_add_host: bool,
    /// The longest protocol message let through either way after login, as its length
    /// field counts.
    pub max_packet_size: u32,
    pub client_tls_sslmode: ClientTlsMode,
    pub client_tls_cert_file: String,
    pub client_tls_key_file: String,
    pub client_tls_ca_file: String,
    pub client_tls_protocols: Vec<String>,
    /// The TLS 1.2 cipher suites offered to clients (OpenSSL syntax or a shortcut).
    pub client_tls_ciphers: String,
    /// The key exchange groups offered to clients (`auto` or curve names).
    pub client_tls_ecdhcurve: String,
    pub server_tls_sslmode: ServerTlsMode,
    pub server_tls_ca_file: String,
    pub server_tls_cert_file: String,
    pub server_tls_key_file: String,
    /// TLS versions offered to servers.
    pub server_tls_protocols: Vec<String>,
    /// The TLS 1.2 cipher suites offered to PostgreSQL.
    pub server_tls_ciphers: String,
    /// Name of the admin console's virtual database (`sluice` is an alias).
    pub admin_database: String,
    /// Users allowed every admin console command.
    pub admin_users: Vec<String>,
    /// Users allowed the admin console's read-only SHOW commands.
    pub stats_users: Vec<String>,
    /// Append the columns pre-1.8 PgBouncer tools read (SHOW STATS `total_requests`,
    /// SHOW DATABASES `reserve_pool`).
    pub admin_legacy_columns: bool,
    /// Seconds between statistics snapshots (SHOW STATS averages, `log_stats`).
    pub stats_period: f64,
    /// Log a line of statistics per database every `stats_period`.
    pub log_stats: bool,
    /// `host:port` of the HTTP endpoint for metrics and the live view ("" = off).
    pub metrics_listen: String,
}

impl Default for General {
    fn default() -> Self {
        Self {
            listen_addr: vec!["127.0.0.1".into()],
            listen_port: 6432,
            unix_socket_dir: "/tmp".into(),
            unix_socket_mode: "0777".into(),
            unix_socket_group: String::new(),
            workers: 0,
            auth_type: AuthType::ScramSha256,
            auth_file: String::new(),
            auth_hba_file: String::new(),
            auth_ident_file: String::new(),
            auth_user: String::new(),
            auth_query: crate::auth::query::DEFAULT_QUERY.into(),
            auth_dbname: String::new(),
            pam_service: "sluice".into(),
            pam_config_dir: String::new(),
            // PgBouncer's default: the mode no application can notice.
            pool_mode: PoolMode::Session,
            default_pool_size: 20,
            min_pool_size: 0,
            reserve_pool_size: 0,
            reserve_pool_timeout: 5.0,
            max_client_conn: 100,
            max_db_connections: 0,
            max_user_connections: 0,
            server_round_robin: false,
            server_reset_query: "DISCARD ALL".into(),
            server_reset_query_always: false,
            server_fast_close: false,
            server_check_delay: 30.0,
            server_check_query: EMPTY_QUERY.into(),
            server_lifetime: 3600.0,
            server_idle_timeout: 600.0,
            autodb_idle_timeout: 3600.0,
            server_connect_timeout: 15.0,
            server_login_retry: 15.0,
            dns_max_ttl: 15.0,
            dns_nxdomain_ttl: 15.0,
            internal_query_timeout: 5.0,
            cancel_wait_timeout: 10.0,
            client_login_timeout: 60.0,
            query_wait_timeout: 120.0,
            query_timeout: 0.0,
            idle_transaction_timeout: 0.0,
            client_idle_timeout: 0.0,
            shutdown_timeout: 30.0,
            auth_failure_delay: 0.0,
            log_level: "info".into(),
            log_format: LogFormat::Text,
            log_connections: true,
            log_disconnections: true,
            log_pooler_errors: true,
            tcp_keepalive: true,
            tcp_keepidle: 60,
            tcp_keepintvl: 0,
            tcp_keepcnt: 0,
            tcp_user_timeout: 0,
            tcp_socket_buffer: 0,
            tcp_defer_accept: cfg!(target_os = "linux"),
            disable_pqexec: false,
            listen_backlog: 4096,
            so_reuseport: false,
            peer_id: 0,
            max_prepared_statements: 200,
            max_client_prepared_statements: 2000,
            max_packet_size: i32::MAX as u32,
            application_name_add_host: false,
            client_tls_sslmode: ClientTlsMode::Disable,
            client_tls_cert_file: String::new(),
            client_tls_key_file: String::new(),
            client_tls_ca_file: String::new(),
            client_tls_protocols: TLS_PROTOCOLS.iter().map(|p| p.to_string()).collect(),
            client_tls_ciphers: "default".into(),
            client_tls_ecdhcurve: "auto".into(),
            // PgBouncer's default (since 1.20) and libpq's.
            server_tls_sslmode: ServerTlsMode::Prefer,
            server_tls_ca_file: String::new(),
            server_tls_cert_file: String::new(),
            server_tls_key_file: String::new(),
            server_tls_protocols: TLS_PROTOCOLS.iter().map(|p| p.to_string()).collect(),
            server_tls_ciphers: "default".into(),
            admin_database: "pgbouncer".into(),
            admin_users: Vec::new(),
            stats_users: Vec::new(),
            admin_legacy_columns: false,
            stats_period: 60.0,
            log_stats: true,
            metrics_listen: String::new(),
        }
    }
}

impl General {
    /// The settings the client side's TLS setup is loaded from (`tls::ClientTls::load`).
    pub fn client_tls_keys(&self) -> (ClientTlsMode, [&str; 5], &[String]) {
        let g = self;
        let files = [&g.client_tls_cert_file, &g.client_tls_key_file, &g.client_tls_ca_file];
        let [cert, key, ca] = files.map(String::as_str);
        (g.client_tls_sslmode, [cert, key, ca, &g.client_tls_ciphers, &g.client_tls_ecdhcurve], &g.client_tls_protocols)
    }

    /// The settings the server side's TLS setup is loaded from (`tls::ServerTls::load`).
    pub fn server_tls_keys(&self) -> (ServerTlsMode, [&str; 4], &[String]) {
        let g = self;
        let files = [&g.server_tls_ca_file, &g.server_tls_cert_file, &g.server_tls_key_file, &g.server_tls_ciphers];
        (g.server_tls_sslmode, files.map(String::as_str), &g.server_tls_protocols)
    }
}

/// A `[databases.NAME]` entry: where a logical database lives and how it is pooled.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Database {
    #[serde(default = "default_host")]
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    /// Database name on the server; defaults to the entry's name.
    pub dbname: Option<String>,
    /// Forced server user: every client of this database shares its pool.
    pub user: Option<String>,
    pub password: Option<String>,
    pub pool_size: Option<usize>,
    pub min_pool_size: Option<usize>,
    pub reserve_pool_size: Option<usize>,
    pub pool_mode: Option<PoolMode>,
    pub max_db_connections: Option<usize>,
    /// This database's `auth_user`, `auth_query` and `auth_dbname` (default: general's).
    pub auth_user: Option<String>,
    pub auth_query: Option<String>,
    pub auth_dbname: Option<String>,
    /// Sent in the startup packet of each server connection (PgBouncer's database
    /// settings): the server's defaults for this database's pools.
    pub client_encoding: Option<String>,
    pub datestyle: Option<String>,
    pub timezone: Option<String>,
    /// Run on each new server connection before it is lent.
    pub connect_query: Option<String>,
}

impl Database {
    /// The settings each server connection's startup packet carries for this database
    /// (besides user and database), by their PostgreSQL names.
    pub fn server_params(&self) -> Vec<(&'static str, String)> {
        let named =
            [("client_encoding", &self.client_encoding), ("DateStyle", &self.datestyle), ("TimeZone", &self.timezone)];
        named.into_iter().filter_map(|(k, v)| Some((k, v.clone()?))).collect()
    }
}

/// A `[users.NAME]` entry.
#[derive(Clone, Debug, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct User {
    /// Plain password, "md5..." hash or "SCRAM-SHA-256$..." secret, checked against clients.
    pub password: Option<String>,
    /// Password Sluice uses to log in to PostgreSQL as this user (defaults to `password`
    /// when that is plain or an md5 hash).
    pub server_password: Option<String>,
    pub pool_mode: Option<PoolMode>,
    pub pool_size: Option<usize>,
    pub max_user_connections: Option<usize>,
}

fn default_host() -> String {
    "127.0.0.1".into()
}

fn default_port() -> u16 {
    5432
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct FileConfig {
    #[serde(default)]
    general: General,
    #[serde(default)]
    databases: BTreeMap<String, Database>,
    #[serde(default)]
    users: BTreeMap<String, User>,
    #[serde(default)]
    peers: BTreeMap<String, Peer>,
}

/// A loaded, validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    pub path: PathBuf,
    pub general: General,
    pub databases: BTreeMap<String, Database>,
    pub users: BTreeMap<String, User>,
    /// The `[peers]` entries by peer id.
    pub peers: BTreeMap<u16, Peer>,
    /// The users whose password is the `auth_file`'s, with its line there.
    from_auth_file: BTreeMap<String, usize>,
    /// The `auth_hba_file`'s rules, under `auth_type = "hba"`.
    pub hba: Option<std::sync::Arc<hba::Hba>>,
    /// Listen addresses parsed from `general.listen_addr`.
    pub listen: Vec<IpAddr>,
}

/// Seconds as a Duration, or None when 0 (disabled).
pub fn secs(v: f64) -> Option<Duration> {
    (v > 0.0).then(|| Duration::from_secs_f64(v))
}

/// The text of a file the config is read from (the config itself, `auth_file`,
/// `auth_hba_file`, `auth_ident_file`).
fn read(file: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(file).map_err(|source| ConfigError::Io { file: file.display().to_string(), source })
}

/// `file` as named in the config at `config`: relative to the config's directory.
fn resolve_from(config: &Path, file: &str) -> PathBuf {
    match config.parent() {
        Some(dir) if Path::new(file).is_relative() => dir.join(file),
        _ => PathBuf::from(file),
    }
}

impl Config {
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::parse(&read(path)?, path)
    }

    pub fn parse(text: &str, path: &Path) -> Result<Self, ConfigError> {
        let file = path.display().to_string();
        let raw: FileConfig = toml::from_str(text).map_err(|e| {
            let line = e.span().map(|s| line_of(text, s.start)).unwrap_or(0);
            let key = e.span().map_or_else(|| "-".to_string(), |s| locate::key_at(text, s.start));
            ConfigError::Invalid { file: file.clone(), line, key, message: e.message().to_string() }
        })?;
        let invalid = |section: &[&str], key: &str, message: String| ConfigError::Invalid {
            file: file.clone(),
            line: locate_key(text, &[section, &[key]].concat()),
            key: [section, &[key]].concat().join("."),
            message,
        };
        let listen = validate_general(&raw.general, &|k, m| invalid(&["general"], k, m))?;
        for (name, db) in &raw.databases {
            validate_database(name, db, &raw.general, &|k, m| invalid(&["databases", name], k, m))?;
        }
        for (name, user) in &raw.users {
            validate_user(user, &raw.general, false, &|k, m| invalid(&["users", name], k, m))?;
        }
        let mut users = raw.users;
        let mut from_auth_file = BTreeMap::new();
        if !raw.general.auth_file.is_empty() {
            let g = &raw.general;
            let check = |u: &User| validate_user(u, g, true, &unplaced).map_err(|e| keyed("", e));
            from_auth_file = userlist::merge(&resolve_from(path, &g.auth_file), &mut users, &check)?;
        }
        validate_admin(&raw.general, &raw.databases, &users, &|k, m| invalid(&["general"], k, m))?;
        validate_auth_lookups(&raw.general, &raw.databases, &users, &|section, k, m| invalid(section, k, m))?;
        let hba = hba::for_config(&raw.general, path, &|k, m| invalid(&["general"], k, m))?;
        let peers = peers::validate(raw.peers, &|id, k, m| match k {
            "" => invalid(&["peers"], id, m),
            k => invalid(&["peers", id], k, m),
        })?;
        let (general, databases) = (raw.general, raw.databases);
        Ok(Config { path: path.to_path_buf(), general, databases, users, peers, from_auth_file, hba, listen })
    }

    /// This configuration with another `[general]` section, validated as at load (for
    /// the admin console's SET). The error is the message without file and line.
    pub fn with_general(&self, general: General) -> Result<Config, String> {
        let listen = validate_general(&general, &unplaced).map_err(|e| keyed("", e))?;
        validate_admin(&general, &self.databases, &self.users, &unplaced).map_err(|e| keyed("", e))?;
        let placed = |section: &[&str], k: &str, m| unplaced(&[section, &[k]].concat().join("."), m);
        validate_auth_lookups(&general, &self.databases, &self.users, &placed).map_err(|e| keyed("", e))?;
        for (name, db) in &self.databases {
            // Named as in the file: which database the new value does not fit.
            validate_database(name, db, &general, &unplaced).map_err(|e| keyed(&format!("databases.{name}."), e))?;
        }
        let config = Config { general, listen, ..self.clone() };
        config.check_hba()?;
        Ok(config)
    }

    /// Whether the client TLS settings let the `auth_hba_file`'s lines fit (as at load;
    /// for SET, and for a reload that kept the running TLS keys).
    pub fn check_hba(&self) -> Result<(), String> {
        self.hba.as_ref().map_or(Ok(()), |h| hba::check_tls(&self.general, h).map_err(|e| e.to_string()))
    }

    /// Whether every user's secrets can check logins under this configuration's
    /// `auth_type` (as at load; for a reload that kept the running `auth_type`), and,
    /// under `any`, whether every database has its own user.
    pub fn check_users(&self) -> Result<(), String> {
        for (name, user) in &self.users {
            let from_file = self.from_auth_file.contains_key(name);
            validate_user(user, &self.general, from_file, &unplaced)
                .map_err(|e| keyed(&format!("users.{name}."), e))?;
        }
        let unforced = self.databases.iter().find(|(_, db)| db.user.is_none()).map(|(n, _)| n);
        if let Some(name) = unforced.filter(|_| self.general.auth_type == AuthType::Any) {
            return Err(format!("databases.{name}.user: {ANY_NEEDS_USER}"));
        }
        Ok(())
    }

    /// Whether this config serves a login proven by nothing (`auth_type = "any"`) to
    /// `database`: only while it says `any`, and through the database's own user.
    pub fn serves_anonymous(&self, database: &str) -> bool {
        self.general.auth_type == AuthType::Any && self.database(database).is_some_and(|d| d.user.is_some())
    }

    /// The pool mode for a (database, user) pair: user, then database, then general.
    pub fn pool_mode(&self, db: &Database, user: Option<&User>) -> PoolMode {
        user.and_then(|u| u.pool_mode).filter(|_| db.user.is_none()).or(db.pool_mode).unwrap_or(self.general.pool_mode)
    }

    /// The pool size for a (database, user) pair: user, then database, then general
    /// (PgBouncer's order).
    pub fn pool_size(&self, db: &Database, user: Option<&User>) -> usize {
        user.and_then(|u| u.pool_size)
            .filter(|_| db.user.is_none())
            .or(db.pool_size)
            .unwrap_or(self.general.default_pool_size)
    }

    /// A file named in the config: relative paths are relative to the config file's directory.
    pub fn resolve(&self, file: &str) -> PathBuf {
        resolve_from(&self.path, file)
    }

    /// An error about `[general] key` found after parsing (a file it names cannot be
    /// used, say), pointing at the key's line when the file can still be read.
    pub fn general_error(&self, key: &str, message: String) -> ConfigError {
        let text = std::fs::read_to_string(&self.path).unwrap_or_default();
        ConfigError::Invalid {
            file: self.path.display().to_string(),
            line: locate_key(&text, &["general", key]),
            key: format!("general.{key}"),
            message,
        }
    }

    /// The `[databases]` entry serving clients of database `name`: its own, else the
    /// fallback entry `*` (PgBouncer's), whose pools reach the server database of the
    /// name the client asked for unless the entry sets `dbname`.
    /// `*` itself names no database a client can ask for.
    pub fn database(&self, name: &str) -> Option<&Database> {
        if name == FALLBACK_DATABASE {
            return None;
        }
        self.databases.get(name).or_else(|| self.databases.get(FALLBACK_DATABASE))
    }

    /// Whether clients of `name` are served by the fallback entry (`database`).
    pub fn is_fallback_served(&self, name: &str) -> bool {
        !self.databases.contains_key(name) && self.databases.contains_key(FALLBACK_DATABASE)
    }

    pub fn workers(&self) -> usize {
        match self.general.workers {
            0 => std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            n => n,
        }
    }
}

type Invalid<'a> = &'a dyn Fn(&str, String) -> ConfigError;

fn validate_general(g: &General, invalid: Invalid) -> Result<Vec<IpAddr>, ConfigError> {
    let mut listen = Vec::new();
    for a in &g.listen_addr {
        let ip = match a.as_str() {
            "*" => {
                listen.push(IpAddr::from([0u8; 4]));
                IpAddr::from([0u16; 8])
            }
            a => match listed_ip(a) {
                Some(ip) => ip,
                // A host name: resolved when the listeners are bound, at start-up only
                // (`Config::listen_ips`), so a reload or SET waits for no resolver. Not
                // one with a port or a comma in it, nor digits and dots alone.
                None if is_host_name(a) => continue,
                None => return Err(invalid("listen_addr", format!("\"{a}\" is not an IP address or a host name"))),
            },
        };
        listen.push(ip);
    }
    // One socket per address and port: a second for the same address, or one beside
    // a wildcard of its family, cannot be bound.
    for (i, ip) in listen.iter().enumerate() {
        if listen[..i].iter().any(|o| same_socket(o, ip)) {
            return Err(invalid(
                "listen_addr",
                format!("{ip} is listed twice, or beside a wildcard address of its family (which covers it)"),
            ));
        }
    }
    if g.listen_port == 0 {
        return Err(invalid("listen_port", "must be between 1 and 65535".into()));
    }
    if !g.unix_socket_group.is_empty()
        && let Err(e) = crate::os::group_id(&g.unix_socket_group)
    {
        return Err(invalid("unix_socket_group", e.to_string()));
    }
    let mode = &g.unix_socket_mode;
    let octal = mode.bytes().all(|b| (b'0'..=b'7').contains(&b));
    if !octal || !matches!(u32::from_str_radix(mode, 8), Ok(m) if m <= 0o777) {
        return Err(invalid("unix_socket_mode", "must be an octal file mode from \"0\" to \"0777\"".into()));
    }
    if g.default_pool_size == 0 {
        return Err(invalid("default_pool_size", "must be at least 1".into()));
    }
    if g.max_client_conn == 0 {
        return Err(invalid("max_client_conn", "must be at least 1".into()));
    }
    if g.max_packet_size < MIN_PACKET_SIZE {
        return Err(invalid("max_packet_size", format!("must be at least {MIN_PACKET_SIZE}")));
    }
    if g.workers > 1024 {
        return Err(invalid("workers", "must be at most 1024".into()));
    }
    for (key, text) in [("server_check_query", &g.server_check_query), ("server_reset_query", &g.server_reset_query)] {
        if text.contains('\0') {
            return Err(invalid(key, "must not contain a NUL character".into()));
        }
    }
    validate_durations(g, invalid)?;
    validate_tcp(g, invalid)?;
    peers::validate_peer_id(g, invalid)?;
    if tracing_subscriber::EnvFilter::try_new(&g.log_level).is_err() {
        return Err(invalid("log_level", format!("\"{}\" is not a log level or filter", g.log_level)));
    }
    validate_tls(g, invalid)?;
    Ok(listen)
}

/// Why a database without its own `user` is refused under `auth_type = "any"`: the
/// client's name is ignored, so it cannot name the server login either.
const ANY_NEEDS_USER: &str = "auth_type = \"any\" needs every database to have its own user";

/// The least `max_packet_size`: below it common statements, and the server's own
/// messages (a RowDescription, an ErrorResponse), would not pass.
const MIN_PACKET_SIZE: u32 = 1024;

/// A validation error outside the file (admin SET, a reload's second look): no line.
fn unplaced(key: &str, message: String) -> ConfigError {
    ConfigError::Invalid { file: String::new(), line: 0, key: key.to_string(), message }
}

/// An `unplaced` error as `prefix` + key: message.
fn keyed(prefix: &str, e: ConfigError) -> String {
    match e {
        ConfigError::Invalid { key, message, .. } => format!("{prefix}{key}: {message}"),
        e => e.to_string(),
    }
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|&b| b == b'\n').count() + 1
}

/// Whether a `listen_addr` entry that is not an IP address reads as a host name:
/// letters, digits, dots, hyphens and underscores, not digits and dots alone (a
/// mistyped IPv4 address), so `host:6432` or a comma-separated list are refused.
fn is_host_name(a: &str) -> bool {
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_');
    !a.is_empty() && a.chars().all(allowed) && !a.chars().all(|c| c.is_ascii_digit() || c == '.')
}

#[cfg(test)]
mod tests;
