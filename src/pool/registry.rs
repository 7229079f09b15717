//! All pools by (database, server user), created on first login and updated or
//! closed on reload, plus the shared per-database and per-user connection limits.

mod fallback;

use std::sync::Arc;

use arc_swap::ArcSwap;
use foldhash::HashMap;
use parking_lot::Mutex;
use tokio::sync::Notify;

use super::settings::settings_with;
use super::{ConnLimit, Pool, PoolSettings};
use crate::auth::{ServerLogin, UserStore};
use crate::config::Config;
use crate::server::dns::Hosts;
use crate::tls::ServerTls;

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    pub database: String,
    /// The user Sluice logs in to the server as.
    pub user: String,
}

/// A reload was applied after the config a login holds was read (`Pools::get_current`).
#[derive(Debug)]
pub struct Reloaded;

#[derive(Debug)]
pub struct Pools {
    /// database → server user → pool (two levels: a login looks a pool up by the
    /// names it has, without building a key).
    map: Mutex<HashMap<String, HashMap<String, Arc<Pool>>>>,
    db_limits: Mutex<HashMap<String, Arc<ConnLimit>>>,
    user_limits: Mutex<HashMap<String, Arc<ConnLimit>>>,
    server_ids: Arc<std::sync::atomic::AtomicU64>,
    /// Reloads applied so far (`reload`), counted under the map lock: a login that read
    /// the config before a reload must not create a pool from it after (`get_current`).
    reloads: std::sync::atomic::AtomicU64,
    /// TLS towards servers, given to new pools and, on reload, to every pool.
    server_tls: ArcSwap<ServerTls>,
    /// Admin console PAUSE/DISABLE state, kept per database name so pools created
    /// later (first login, reload) start in it.
    flags: Mutex<DbFlags>,
    /// What the servers' host names resolved to (`ServerTarget::dns`).
    hosts: Hosts,
    /// The lookups' pools (`lookup_pool`).
    lookups: Mutex<HashMap<PoolKey, Arc<Pool>>>,
    /// Since when each pool of a fallback-served database has been unused
    /// (`retire_unused_fallback_pools`).
    unused_since: Mutex<HashMap<(bool, PoolKey), std::time::Instant>>,
    /// The SHOW STATS counters of pools dropped while their database kept others (a
    /// reload taking a user away, an unused fallback pool), per database, so the
    /// database's totals never go back; gone with the database's last pool.
    retired: Mutex<HashMap<String, crate::stats::PoolStats>>,
    /// Told when a shared limit (`max_db_connections`, `max_user_connections`) keeps a
    /// queued client from connecting: the janitor makes room at once (`rebalance`), as
    /// PgBouncer evicts an idle connection of another pool when it finds the limit full.
    pub room_wanted: Arc<Notify>,
}

/// The registry's part of new pool settings (`settings_with`).
pub(super) struct ServerSide<'a> {
    pub(super) tls: Arc<ServerTls>,
    pub(super) hosts: &'a Hosts,
}

#[derive(Debug, Default)]
struct DbFlags {
    paused_all: bool,
    paused: std::collections::HashSet<String>,
    disabled: std::collections::HashSet<String>,
}

impl Default for Pools {
    fn default() -> Self {
        Pools {
            map: Default::default(),
            db_limits: Default::default(),
            user_limits: Default::default(),
            server_ids: Arc::new(std::sync::atomic::AtomicU64::new(1)),
            reloads: Default::default(),
            server_tls: Default::default(),
            flags: Default::default(),
            unused_since: Default::default(),
            lookups: Default::default(),
            hosts: Default::default(),
            retired: Default::default(),
            room_wanted: Default::default(),
        }
    }
}

impl Pools {
    /// The pool a client of `db` logging in as `user` uses, created on first use, from
    /// a config read now (tests).
    #[cfg(test)]
    pub fn get(&self, cfg: &Config, users: &UserStore, db: &str, user: &str) -> Option<Arc<Pool>> {
        self.get_current(self.reloads(), cfg, users, db, user).ok().flatten()
    }

    /// Reloads applied so far (see `get_current`).
    pub fn reloads(&self) -> u64 {
        self.reloads.load(std::sync::atomic::Ordering::Acquire)
    }

    /// The pool a client of `db` logging in as `user` uses, created on first use; None
    /// when the database is not configured. The login holds the config it read after
    /// `reloads()` gave `seen`: `Err` if a reload was applied since and a pool would be
    /// created from that config.
    pub fn get_current(
        &self,
        seen: u64,
        cfg: &Config,
        users: &UserStore,
        db: &str,
        user: &str,
    ) -> Result<Option<Arc<Pool>>, Reloaded> {
        let Some(server_user) = server_user(cfg, users, db, user) else { return Ok(None) };
        self.get_or_create(seen, cfg, users, db, server_user)
    }

    /// The pool whose connections run the `auth_query` lookups for clients of a
    /// database: `auth_user`'s in the lookups' database, a pool of its own that is never
    /// lent to a client, so no client's `SET`, `SET ROLE` or `search_path` reaches a
    /// lookup. Not in `all` (SHOW POOLS, statistics); in `of` (PAUSE, RECONNECT...) and
    /// `upkeep`.
    pub fn lookup_pool(
        &self,
        seen: u64,
        cfg: &Config,
        users: &UserStore,
        lookup: &crate::auth::query::Lookup<'_>,
    ) -> Result<Option<Arc<Pool>>, Reloaded> {
        let key = PoolKey { database: lookup.database.to_string(), user: lookup.user.to_string() };
        if let Some(p) = self.lookups.lock().get(&key) {
            return Ok(Some(p.clone()));
        }
        let Some(settings) = lookup_settings(cfg, users, &self.side(), &key) else {
            return Ok(None);
        };
        // Reloads are counted under the map's lock (see `get_current`).
        let _map = self.map.lock();
        if seen != self.reloads() {
            return Err(Reloaded);
        }
        let mut lookups = self.lookups.lock();
        if let Some(p) = lookups.get(&key) {
            return Ok(Some(p.clone()));
        }
        let pool = self.new_pool(cfg, key.clone(), settings);
        lookups.insert(key, pool.clone());
        Ok(Some(pool))
    }

    fn get_or_create(
        &self,
        seen: u64,
        cfg: &Config,
        users: &UserStore,
        db: &str,
        server_user: &str,
    ) -> Result<Option<Arc<Pool>>, Reloaded> {
        // Every login comes here: find an existing pool before building its settings.
        if let Some(p) = self.map.lock().get(db).and_then(|m| m.get(server_user)) {
            return Ok(Some(p.clone()));
        }
        let key = PoolKey { database: db.to_string(), user: server_user.to_string() };
        let Some(settings) = settings_of(cfg, users, &self.side(), &key) else {
            return Ok(None);
        };
        let mut map = self.map.lock();
        if seen != self.reloads() {
            return Err(Reloaded);
        }
        let users_of_db = map.entry(key.database.clone()).or_default();
        if let Some(p) = users_of_db.get(&key.user) {
            return Ok(Some(p.clone()));
        }
        let user = key.user.clone();
        let pool = self.new_pool(cfg, key, settings);
        users_of_db.insert(user, pool.clone());
        Ok(Some(pool))
    }

    /// A new pool under its database's and user's shared limits, paused if its database is.
    fn new_pool(&self, cfg: &Config, key: PoolKey, settings: PoolSettings) -> Arc<Pool> {
        let db_limit = self.limit(&self.db_limits, &key.database, db_max(cfg, &key.database));
        let user_limit = self.limit(&self.user_limits, &key.user, user_max(cfg, &key.user));
        let paused = self.is_paused(&key.database);
        let pool =
            Arc::new(Pool::new(key, settings, db_limit, user_limit, self.server_ids.clone(), self.room_wanted.clone()));
        pool.join_limits();
        if paused {
            pool.pause();
        }
        pool
    }

    /// The shared limit of a database or user, created with `max` on first use; an
    /// existing one keeps the maximum the last reload gave it (a login still holding
    /// the previous config must not undo a reload).
    fn limit(&self, map: &Mutex<HashMap<String, Arc<ConnLimit>>>, name: &str, max: usize) -> Arc<ConnLimit> {
        map.lock().entry(name.to_string()).or_insert_with(|| Arc::new(ConnLimit::new(max))).clone()
    }

    /// Pools starved by a shared connection limit get room (run by the janitor, once a
    /// second) by closing an idle connection of another pool under the same limit; the
    /// close wakes the starved queue (`ConnLimit`), as any connection closed under the
    /// limit does at once.
    pub fn rebalance(&self) {
        let pools = self.upkeep();
        // Marks of limits found full whose queues are gone (a client served by its own
        // pool's connection after all) would have every check-in wake this pass. First,
        // so that a connection checked in idle while a mark was down is still evicted
        // for a starved queue below.
        let mut seen = std::collections::HashSet::new();
        for limit in pools.iter().flat_map(|p| [&p.db_limit, &p.user_limit]) {
            if seen.insert(Arc::as_ptr(limit)) {
                limit.settle();
            }
        }
        for starved in pools.iter().filter(|p| p.is_starved()) {
            // One connection a pass per starved pool: its queue takes it before the
            // next pass looks again.
            let _ =
                pools.iter().any(|p| !Arc::ptr_eq(p, starved) && p.can_make_room_for(starved) && p.evict_one_idle());
        }
    }

    /// The pools of one database, or all of them, the lookups' included (for PAUSE,
    /// RESUME, RECONNECT, KILL, WAIT_CLOSE).
    pub fn of(&self, db: Option<&str>) -> Vec<Arc<Pool>> {
        let mut v = self.upkeep();
        v.retain(|p| db.is_none_or(|d| p.key.database == d));
        v
    }

    /// Every pool, the lookups' included (`lookup_pool`): for the janitor, SHOW SERVERS
    /// and the shutdown.
    pub fn upkeep(&self) -> Vec<Arc<Pool>> {
        let mut v = self.all();
        v.extend(self.lookups.lock().values().cloned());
        v
    }

    /// PAUSE one database or all: see [`Pool::pause`].
    pub fn pause(&self, db: Option<&str>) {
        {
            let mut f = self.flags.lock();
            match db {
                Some(d) => f.paused.insert(d.to_string()),
                None => std::mem::replace(&mut f.paused_all, true),
            };
        }
        self.of(db).iter().for_each(|p| p.pause());
    }

    /// Keeps a dropped pool's SHOW STATS counters for its database (`retired`).
    pub(super) fn retire_stats(&self, pool: &Pool) {
        self.retired.lock().entry(pool.key.database.clone()).or_default().fold(&pool.stats);
    }

    /// Whether a database keeps its place in the map (it has pools); one with none
    /// left loses its retired counters too, its statistics starting again from zero,
    /// unless it is a `[databases]` entry (`configured`: SHOW STATS keeps its row, whose
    /// totals must not go back, as when a reload changed its own `user`).
    pub(super) fn keep_database(&self, db: &str, pools: &HashMap<String, Arc<Pool>>, configured: bool) -> bool {
        if pools.is_empty() && !configured {
            self.retired.lock().remove(db);
        }
        !pools.is_empty()
    }

    /// Calls `f` with each database's retired counters (`retired`).
    pub fn retired_stats(&self, mut f: impl FnMut(&str, &crate::stats::PoolStats)) {
        self.retired.lock().iter().for_each(|(db, s)| f(db, s));
    }

    /// RESUME one database or all. A database paused on its own stays paused while
    /// everything is resumed only when named, as in PgBouncer. Naming a database not
    /// paused on its own is refused (`NotPaused`), as in PgBouncer: under a PAUSE of
    /// everything (`PAUSE`, `KILL` or SIGUSR1 without a name) it would resume nothing.
    pub fn resume(&self, db: Option<&str>) -> Result<(), NotPaused> {
        {
            let mut f = self.flags.lock();
            match db {
                Some(d) if !f.paused.remove(d) => return Err(NotPaused { all: f.paused_all }),
                Some(_) => {}
                None => {
                    f.paused_all = false;
                    f.paused.clear();
                }
            }
        }
        for p in self.of(db) {
            if !self.is_paused(&p.key.database) {
                p.resume();
            }
        }
        Ok(())
    }

    pub fn is_paused(&self, db: &str) -> bool {
        let f = self.flags.lock();
        f.paused_all || f.paused.contains(db)
    }

    pub fn all_paused(&self) -> bool {
        self.flags.lock().paused_all
    }

    /// The databases paused or disabled one by one (SHOW DATABASES lists those the
    /// fallback entry serves even when they have no pool).
    pub fn flagged(&self) -> Vec<String> {
        let f = self.flags.lock();
        f.paused.iter().chain(&f.disabled).cloned().collect()
    }

    /// DISABLE / ENABLE: whether new logins to a database are refused.
    pub fn set_disabled(&self, db: &str, disabled: bool) {
        let mut f = self.flags.lock();
        if disabled {
            f.disabled.insert(db.to_string());
        } else {
            f.disabled.remove(db);
        }
    }

    pub fn is_disabled(&self, db: &str) -> bool {
        self.flags.lock().disabled.contains(db)
    }

    /// Open server connections counted against `max_db_connections` for `db`.
    pub fn db_connections(&self, db: &str) -> usize {
        self.db_limits.lock().get(db).map_or(0, |l| l.current())
    }

    /// Open server connections counted against `max_user_connections` for `user`.
    pub fn user_connections(&self, user: &str) -> usize {
        self.user_limits.lock().get(user).map_or(0, |l| l.current())
    }

    pub fn all(&self) -> Vec<Arc<Pool>> {
        let mut v: Vec<_> = self.map.lock().values().flat_map(|m| m.values().cloned()).collect();
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }

    /// Sets the TLS setup for server connections opened from now on (takes effect in
    /// existing pools at the next `reload`).
    pub fn set_server_tls(&self, tls: Arc<ServerTls>) {
        self.server_tls.store(tls);
    }

    pub fn server_tls(&self) -> Arc<ServerTls> {
        self.server_tls.load_full()
    }

    /// Host names the pools' servers have (SHOW LISTS `dns_names`).
    pub fn host_names(&self) -> usize {
        self.hosts.names()
    }

    /// The servers' host names and their last answers (`Hosts::list`).
    pub fn host_answers(&self) -> Vec<(Arc<str>, crate::server::dns::LastAnswer)> {
        self.hosts.list()
    }

    /// What new pool settings take from the registry.
    fn side(&self) -> ServerSide<'_> {
        ServerSide { tls: self.server_tls.load_full(), hosts: &self.hosts }
    }

    /// Applies a reloaded configuration: new settings for surviving pools, closing of
    /// pools whose database or user is gone, new limits.
    pub fn reload(&self, cfg: &Config, users: &UserStore) {
        let side = self.side();
        let mut map = self.map.lock();
        self.reloads.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        // Limits first: each pool's `update` wakes its queue, which then sees a raised
        // limit.
        for (name, l) in self.db_limits.lock().iter() {
            l.set_max(db_max(cfg, name));
        }
        for (name, l) in self.user_limits.lock().iter() {
            l.set_max(user_max(cfg, name));
        }
        for pools in map.values_mut() {
            pools.retain(|_, pool| {
                let why = match cfg.database(&pool.key.database) {
                    None => "its database was removed by a reload",
                    Some(_) => "a reload removed its user, or changed the database's own user",
                };
                let kept = keep_updated(pool, settings_of(cfg, users, &side, &pool.key), why);
                if !kept {
                    self.retire_stats(pool);
                }
                kept
            });
        }
        map.retain(|db, pools| self.keep_database(db, pools, cfg.databases.contains_key(db)));
        // A configured database kept its counters with no pool left: not once removed.
        self.retired.lock().retain(|db, _| cfg.databases.contains_key(db) || map.contains_key(db));
        let why = "lookups no longer run as this user";
        self.lookups.lock().retain(|key, pool| keep_updated(pool, lookup_settings(cfg, users, &side, key), why));
    }

    /// A lookup found a new password for a user of `db`: its pool, if it has one, logs
    /// in with it from now on (connections already open stay, as in PostgreSQL). Under
    /// the registry's lock, as a reload's updates, and refused (`Reloaded`: the caller
    /// reads the configuration again) when a reload came since the caller read it
    /// (`seen`), so an older configuration never replaces the one a reload applied.
    pub fn refresh_login(
        &self,
        seen: u64,
        cfg: &Config,
        users: &UserStore,
        db: &str,
        user: &str,
    ) -> Result<(), Reloaded> {
        let map = self.map.lock();
        if seen != self.reloads() {
            return Err(Reloaded);
        }
        if let Some(pool) = map.get(db).and_then(|m| m.get(user))
            && let Some(s) = settings_of(cfg, users, &self.side(), &pool.key)
        {
            pool.update(s);
        }
        Ok(())
    }
}

/// A RESUME of a database that is not paused on its own (`Pools::resume`); `all`: while
/// everything is paused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NotPaused {
    pub all: bool,
}

fn db_max(cfg: &Config, db: &str) -> usize {
    cfg.database(db).and_then(|d| d.max_db_connections).unwrap_or(cfg.general.max_db_connections)
}

fn user_max(cfg: &Config, user: &str) -> usize {
    cfg.users.get(user).and_then(|u| u.max_user_connections).unwrap_or(cfg.general.max_user_connections)
}

/// The user a client of `db_name` logged in as `client_user` reaches the server as:
/// the database's forced server user, else the client's own (configured, or found by
/// a lookup).
fn server_user<'a>(cfg: &'a Config, users: &UserStore, db_name: &str, client_user: &'a str) -> Option<&'a str> {
    match &cfg.database(db_name)?.user {
        Some(forced) => Some(forced),
        None if users.get(client_user).is_some() => Some(client_user),
        None => users.find(cfg, db_name, client_user).map(|_| client_user),
    }
}

/// The server login of the pool `key`; None when the config has no such pool: its
/// database is gone, or its user is neither the database's own, nor (where the
/// database has none) a user of the config or one a lookup found.
fn login_of(cfg: &Config, users: &UserStore, key: &PoolKey) -> Option<Arc<ServerLogin>> {
    let db = cfg.database(&key.database)?;
    match (&db.user, &db.password) {
        // Validated with the config: a plain password or an md5 hash.
        (Some(forced), Some(p)) if *forced == key.user => Some(Arc::new(
            crate::auth::Secret::parse(p).map_or_else(|_| ServerLogin::plain(p), ServerLogin::from_secret),
        )),
        (Some(forced), None) if *forced == key.user => {
            Some(users.get(forced).map(|u| u.server.clone()).unwrap_or_default())
        }
        (Some(_), _) => None,
        (None, _) => users.find(cfg, &key.database, &key.user).map(|u| u.server.clone()),
    }
}

/// Whether `user` is the one lookups run as in `db`, for the clients of `db` itself or
/// of another database.
fn runs_lookups_of(cfg: &Config, user: &str, db: &str) -> bool {
    use crate::auth::query::{lookup_for, lookup_with};
    // Each entry's own (the fallback's too, whose `auth_dbname` may name another
    // database), and `db`'s, which the fallback may serve.
    let entries = cfg.databases.iter().filter_map(|(name, entry)| lookup_with(cfg, entry, name));
    entries.chain(lookup_for(cfg, db)).any(|l| l.user == user && l.database == db)
}

/// The settings of the pool `key` (see `login_of`).
fn settings_of(cfg: &Config, users: &UserStore, side: &ServerSide<'_>, key: &PoolKey) -> Option<PoolSettings> {
    settings_with(cfg, side, key, login_of(cfg, users, key)?)
}

/// The settings of the lookups' pool `key` (`Pools::lookup_pool`): `auth_user` logs in
/// as the config has it; None once no database's lookups run there as that user.
fn lookup_settings(cfg: &Config, users: &UserStore, side: &ServerSide<'_>, key: &PoolKey) -> Option<PoolSettings> {
    if !runs_lookups_of(cfg, &key.user, &key.database) {
        return None;
    }
    // No connections kept open for lookups: they are opened when a login needs one.
    let s = settings_with(cfg, side, key, users.get(&key.user)?.server.clone())?;
    Some(PoolSettings { kept_open: 0, ..s })
}

/// A pool kept by a reload takes its new settings; one the new config has no place for
/// is closed (false), its clients told `why`.
fn keep_updated(pool: &Arc<Pool>, settings: Option<PoolSettings>, why: &'static str) -> bool {
    match settings {
        Some(s) => {
            pool.update(s);
            true
        }
        None => {
            pool.close(why);
            false
        }
    }
}

#[cfg(test)]
mod tests;
