//! Which authentication method a login gets: `auth_type`'s, or under `auth_type =
//! "hba"` the first `auth_hba_file` line that fits the connection, database and user
//! (a `reject` line, or no fitting line, refuses it before any exchange, as PostgreSQL
//! does); and the Unix socket peer's OS user for `peer` lines.

use tracing::warn;

use super::{ClientConn, Exit};
use crate::admin;
use crate::auth::client::Method;
use crate::config::Config;
use crate::config::hba::{Action, Login};
use crate::config::ident::UserMap;
use crate::net::Stream;
use crate::net::listener::Peer;
use crate::protocol::sqlstate;

/// The method `user`'s login to `database` authenticates with (and the user name map
/// of its `auth_hba_file` line, for `peer` and `cert`), or the refusal (logged) when a
/// line rejects it or none fits. The refusals are PostgreSQL's words, which operators
/// and tools know.
pub(super) fn login_method<'a>(
    cfg: &'a Config,
    conn: &ClientConn,
    user: &str,
    database: &str,
) -> Result<(Method, Option<UserMap<'a>>), Exit> {
    if let Some(method) = cfg.general.auth_type.method() {
        return Ok((method, None));
    }
    let addr = match &conn.peer {
        Peer::Tcp(a) => Some(a.ip()),
        Peer::Unix => None,
    };
    let tls = conn.stream.is_tls();
    // The console by either of its names is matched as `admin_database`: lines written
    // for it cannot be passed by its alias.
    let matched = if admin::is_admin_database(cfg, database) { cfg.general.admin_database.as_str() } else { database };
    // `Config` reads the file whenever auth_type is hba; without rules, none fits.
    let hba = cfg.hba.as_deref();
    let decided = hba.and_then(|hba| Some((hba, hba.rule_for(&Login { addr, tls, database: matched, user })?)));
    let (what, line) = match decided {
        Some((hba, rule)) => match (rule.action, rule.user_map(hba)) {
            (Action::Authenticate(method), Ok(map)) => return Ok((method, map)),
            // A `reject` line, or a `map=` without its ident file (loading refuses that).
            _ => ("pg_hba.conf rejects connection", Some(rule.line)),
        },
        None => ("no pg_hba.conf entry", None),
    };
    let host = addr.map_or_else(|| "[local]".to_string(), |a| a.to_canonical().to_string());
    let encryption = if tls { "SSL encryption" } else { "no encryption" };
    let message = format!("{what} for host \"{host}\", user \"{user}\", database \"{database}\", {encryption}");
    let file = hba.map(|h| h.file.display().to_string()).unwrap_or_default();
    warn!(peer = %conn.peer, user, database, hba_file = file, hba_line = line, "login refused: {message}");
    Err(Exit::fatal(sqlstate::INVALID_AUTHORIZATION, message))
}

/// The console's own user (PgBouncer's): `pgbouncer` logs in to the console without a
/// password, as an admin, over the Unix socket from a process of the OS user Sluice
/// runs as, as PgBouncer lets it.
pub const SOCKET_ADMIN: &str = "pgbouncer";

/// Whether this login is the console's own user's (`SOCKET_ADMIN`).
pub(super) fn own_socket_admin(cfg: &Config, conn: &ClientConn, user: &str, database: &str) -> bool {
    if user != SOCKET_ADMIN || !admin::is_admin_database(cfg, database) {
        return false;
    }
    let Stream::Unix(socket) = &conn.stream else { return false };
    // SAFETY: geteuid cannot fail and touches no memory.
    socket.peer_cred().is_ok_and(|c| c.uid() == unsafe { libc::geteuid() })
}

/// A console login's role: an admin's for the console's own user (`own_socket_admin`),
/// else as `admin_users`/`stats_users` list the name; under `auth_type = "any"` (no
/// password asked) any other name gets in as a stats user, SHOW only, as in PgBouncer
/// (whose console checks the names of those lists there too).
pub(super) fn console_role(cfg: &Config, conn: &ClientConn, user: &str, database: &str) -> Option<admin::Role> {
    if own_socket_admin(cfg, conn, user, database) {
        return Some(admin::Role::Admin);
    }
    let any = cfg.general.auth_type == crate::config::AuthType::Any;
    admin::role_of(cfg, user).or(any.then_some(admin::Role::Stats))
}

/// The name of the OS user of the process at the other end of a Unix socket (for
/// `peer`), read from the socket's credentials and the system's user database (on a
/// blocking thread: the database may be remote, LDAP or sssd).
pub(super) async fn os_user(stream: &Stream) -> Option<String> {
    let Stream::Unix(socket) = stream else { return None };
    let uid = socket.peer_cred().ok()?.uid();
    tokio::task::spawn_blocking(move || crate::os::user_name(uid)).await.ok().flatten()
}
