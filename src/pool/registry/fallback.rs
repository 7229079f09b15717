//! The janitor's pass over the databases the fallback entry `*` serves: their pools go
//! once unused for `autodb_idle_timeout` (PgBouncer's), as clients may name any
//! database there and their pools would otherwise pile up.

use std::sync::Arc;
use std::time::Instant;

use super::{Pool, Pools};
use crate::auth::found::FoundUsers;
use crate::config::{Config, FALLBACK_DATABASE, secs};

impl Pools {
    /// Drops the pools of a database the fallback serves once it has been unused for
    /// `autodb_idle_timeout`: no client connected to it (`busy` says which databases
    /// have one), no server connection open or being opened and no queue, that long,
    /// and no other reference held to the pool now (a passing look, the statistics or a
    /// SHOW, holds the drop off without restarting the count). The lookups' pools of
    /// such a database go the same way; once it has no pool left, so do the users
    /// lookups found there and the limits no pool uses. A paused database keeps its
    /// pools (as in PgBouncer). Run by the janitor with the config it read after
    /// `reloads()` gave `seen` (nothing is dropped if a reload came since), and `busy`
    /// worked out from the clients listed at `listed_at` or later.
    pub fn retire_unused_fallback_pools(
        &self,
        seen: u64,
        cfg: &Config,
        found: &FoundUsers,
        busy: &dyn Fn(&str) -> bool,
        listed_at: Instant,
    ) {
        let fallback = cfg.databases.contains_key(FALLBACK_DATABASE);
        let Some(limit) = secs(cfg.general.autodb_idle_timeout).filter(|_| fallback) else {
            // Off: no count goes on (a later config turning it on starts afresh).
            self.unused_since.lock().clear();
            return;
        };
        let now = Instant::now();
        let mut map = self.map.lock();
        if seen != self.reloads() {
            return;
        }
        let mut lookups = self.lookups.lock();
        let mut unused = self.unused_since.lock();
        // A login or a lookup takes its reference on a pool under these locks, so none
        // can come between the look and the removal.
        let mut retire = |lookup: bool, pool: &Arc<Pool>| {
            let c = pool.counts();
            let at = (lookup, pool.key.clone());
            if c.total > 0 || c.waiting > 0 || busy(&pool.key.database) {
                unused.remove(&at);
                return false;
            }
            let since = *unused.entry(at.clone()).or_insert(now);
            if Arc::strong_count(pool) > 1 || now.duration_since(since) < limit {
                return false;
            }
            let (db, user) = (&pool.key.database, &pool.key.user);
            tracing::info!(db = %db, user = %user, lookups = lookup, "unused pool of a fallback database dropped");
            unused.remove(&at);
            pool.close("its pool went unused and was dropped");
            if !lookup {
                self.retire_stats(pool);
            }
            true
        };
        let served = |db: &str| cfg.is_fallback_served(db) && !self.is_paused(db);
        for (_, pools) in map.iter_mut().filter(|(db, _)| served(db)) {
            pools.retain(|_, pool| !retire(false, pool));
        }
        lookups.retain(|key, pool| !served(&key.database) || !retire(true, pool));
        // The users found in a database left with no pool, unless a login entered one
        // after the clients were listed (it is making the database's pool again; one
        // that entered one before and is still there made the database busy).
        map.retain(|db, pools| {
            if pools.is_empty() {
                found.drop_database(db, listed_at);
            }
            // (A database the fallback serves is no `[databases]` entry.)
            self.keep_database(db, pools, false)
        });
        unused.retain(|(lookup, k), _| match lookup {
            true => lookups.contains_key(k),
            false => map.get(&k.database).is_some_and(|p| p.contains_key(&k.user)),
        });
        // Limits no pool uses any more (those of the databases dropped).
        self.db_limits.lock().retain(|_, l| Arc::strong_count(l) > 1);
        self.user_limits.lock().retain(|_, l| Arc::strong_count(l) > 1);
    }
}
