//! The settings of one pool, worked out from the config (`settings_with`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::registry::{PoolKey, ServerSide};
use crate::auth::ServerLogin;
use crate::config::PoolMode;
use crate::config::{Config, secs};
use crate::server::{QueryBounds, ServerAddr, ServerTarget};

/// Settings of one pool, replaced as a whole on reload.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub target: ServerTarget,
    pub login: Arc<ServerLogin>,
    pub mode: PoolMode,
    pub size: usize,
    /// The connections kept open however idle: `min_pool_size`, at most `size` (a
    /// larger one fills the pool, no more).
    pub kept_open: usize,
    /// Connections this old are closed when they come back or while idle (zero: after
    /// one use).
    pub lifetime: Duration,
    pub idle_timeout: Option<Duration>,
    pub connect_timeout: Option<Duration>,
    pub wait_timeout: Option<Duration>,
    /// How long a connection idles before it is checked; `Duration::MAX` when
    /// `server_check_query` is "" (no check).
    pub check_delay: Duration,
    /// The query of the check: "" an empty query (`server_check_query = "<empty>"`).
    pub check_query: String,
    pub reset_query: String,
    /// What `reset_query` leaves on a connection, worked out once.
    pub reset_effect: crate::server::ResetEffect,
    pub reset_query_always: bool,
    /// Bounds of Sluice's own queries on a server (`internal_query_timeout`,
    /// `cancel_wait_timeout`).
    pub internal: QueryBounds,
    /// How long forwarding a client's cancel request may take (`cancel_wait_timeout`).
    pub cancel_timeout: Option<Duration>,
    /// How long a failed connect holds new ones back (`server_login_retry`).
    pub login_retry: Option<Duration>,
    /// Connections beyond `size` for a client that has waited `reserve_timeout`.
    pub reserve: usize,
    pub reserve_timeout: Option<Duration>,
    /// Idle connections lent oldest first (`server_round_robin`), not newest first.
    pub round_robin: bool,
}

impl PoolSettings {
    /// The connections the pool may hold open for a client waiting since `since`:
    /// its size, and the reserve once that client has waited `reserve_pool_timeout`.
    pub(super) fn room_for(&self, since: Instant) -> usize {
        let due = self.reserve > 0 && self.reserve_timeout.is_some_and(|t| since.elapsed() >= t);
        if due { self.most() } else { self.size }
    }

    /// The most connections the pool holds: its size and its reserve. Beyond it (after
    /// a reload or SET lowered them) connections are closed as they come back.
    pub(super) fn most(&self) -> usize {
        self.size + self.reserve
    }
}

/// The settings of the pool `key` of `cfg`, whose server login is `login`; None when
/// `cfg` has no such database.
pub(super) fn settings_with(
    cfg: &Config,
    side: &ServerSide<'_>,
    key: &PoolKey,
    login: Arc<ServerLogin>,
) -> Option<PoolSettings> {
    let db_name = key.database.as_str();
    let db = cfg.database(db_name)?;
    let g = &cfg.general;
    let server_user = key.user.clone();
    let user_cfg = cfg.users.get(&server_user).filter(|_| db.user.is_none());
    let size = cfg.pool_size(db, user_cfg);
    let settings = PoolSettings {
        target: ServerTarget {
            addr: ServerAddr { host: db.host.as_str().into(), port: db.port },
            database: db.dbname.clone().unwrap_or_else(|| db_name.to_string()),
            user: server_user.clone(),
            tcp: crate::net::listener::TcpOptions::of(g),
            tls: side.tls.clone(),
            dns: side.hosts.record(&db.host),
            dns_ttl: crate::server::dns::DnsTtl {
                answer: Duration::from_secs_f64(g.dns_max_ttl),
                failure: Duration::from_secs_f64(g.dns_nxdomain_ttl),
            },
            params: db.server_params(),
            connect_query: db.connect_query.clone(),
        },
        login,
        mode: cfg.pool_mode(db, user_cfg),
        size,
        // None with `server_lifetime = 0`: each connection is used once, so one opened
        // to be kept would be closed unused, and opened again, every second.
        // Not for the databases the fallback entry serves: their pools go when unused
        // (`autodb_idle_timeout`), and kept connections would hold them.
        kept_open: if g.server_lifetime == 0.0 || cfg.is_fallback_served(db_name) {
            0
        } else {
            db.min_pool_size.unwrap_or(g.min_pool_size).min(size)
        },
        // 0: each connection used once, then closed (PgBouncer's meaning).
        lifetime: Duration::from_secs_f64(g.server_lifetime),
        idle_timeout: secs(g.server_idle_timeout),
        connect_timeout: secs(g.server_connect_timeout),
        wait_timeout: secs(g.query_wait_timeout),
        // 0: checked every time, as in PgBouncer (validated finite, not negative).
        check_delay: match g.server_check_query.as_str() {
            "" => Duration::MAX,
            _ => Duration::from_secs_f64(g.server_check_delay),
        },
        check_query: match g.server_check_query.as_str() {
            crate::config::EMPTY_QUERY => String::new(),
            q => q.to_string(),
        },
        reset_query: g.server_reset_query.clone(),
        reset_effect: crate::server::ResetEffect::of(&g.server_reset_query),
        reset_query_always: g.server_reset_query_always,
        internal: crate::server::QueryBounds {
            query: secs(g.internal_query_timeout),
            cancel: secs(g.cancel_wait_timeout),
        },
        cancel_timeout: secs(g.cancel_wait_timeout),
        login_retry: secs(g.server_login_retry),
        reserve: db.reserve_pool_size.unwrap_or(g.reserve_pool_size),
        reserve_timeout: secs(g.reserve_pool_timeout),
        round_robin: g.server_round_robin,
    };
    Some(settings)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::auth::UserStore;
    use crate::config::Config;
    use crate::pool::Pools;

    /// The check and cancel settings of a pool, as PgBouncer means them:
    /// `server_check_delay = 0` checks before every loan, `server_check_query = ""`
    /// never, `"<empty>"` (the default) sends an empty query; `cancel_wait_timeout = 0`
    /// sets no limit.
    #[test]
    fn check_and_cancel_settings() {
        use std::time::Duration as D;
        let cases = [
            ("server_check_delay = 0", D::ZERO, "", Some(D::from_secs(10))),
            ("server_check_query = \"select 1\"", D::from_secs(30), "select 1", Some(D::from_secs(10))),
            ("server_check_delay = 0\nserver_check_query = \"\"", D::MAX, "", Some(D::from_secs(10))),
            ("cancel_wait_timeout = 0", D::from_secs(30), "", None),
            ("cancel_wait_timeout = 0.5", D::from_secs(30), "", Some(D::from_millis(500))),
        ];
        for (lines, delay, query, cancel) in cases {
            let text =
                format!("[general]\n{lines}\n[databases.a]\nhost = \"127.0.0.1\"\n[users.u]\npassword = \"p\"\n");
            let cfg = Config::parse(&text, Path::new("sluice.toml")).expect("a valid config");
            let users = UserStore::from_config(&cfg).expect("valid users");
            let settings = Pools::default().get(&cfg, &users, "a", "u").expect("a pool").settings();
            assert_eq!((settings.check_delay, settings.check_query.as_str()), (delay, query), "{lines}");
            assert_eq!((settings.cancel_timeout, settings.internal.cancel), (cancel, cancel), "{lines}");
        }
    }
}
