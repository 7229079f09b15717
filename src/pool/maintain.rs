//! The janitor's side of a pool (once a second): retiring idle and old connections,
//! refilling to `min_pool_size`, and making room under a shared connection limit for a
//! pool whose clients starve; and closing a pool.

use std::sync::Arc;

use super::Pool;
use super::limit::ConnLimit;
use crate::server::ServerError;

impl Pool {
    /// One janitor pass: closes connections idle past `server_idle_timeout` or older
    /// than `server_lifetime` (keeping `min_pool_size`), idle ones beyond the pool's
    /// size and idle ones to an address their host name no longer has (and looks the
    /// name up again when its answer is `dns_max_ttl` old), drops abandoned waiters, and
    /// returns how many connections to open to reach `min_pool_size`.
    pub fn maintain(&self) -> usize {
        let settings = self.settings.load();
        let mut retire = Vec::new();
        let (missing, total) = {
            let mut inner = self.inner.lock();
            inner.waiters.retain(|w| !w.tx.is_closed());
            let mut keep = Vec::with_capacity(inner.idle.len());
            let mut total = inner.total;
            for mut s in inner.idle.drain(..) {
                let idle_too_long =
                    settings.idle_timeout.is_some_and(|t| s.last_used.elapsed() >= t) && total > settings.kept_open;
                let too_old = s.created.elapsed() >= settings.lifetime;
                // More connections than the pool's size (lowered by a reload or SET)
                // and its reserve; reserve connections idle go by `server_idle_timeout`,
                // as in PgBouncer (closing them at once made queued clients earn the
                // reserve again, `reserve_pool_timeout`, every few statements).
                let too_many = total > settings.most();
                let left_behind = settings.target.left_behind(&mut s);
                if idle_too_long || too_old || too_many || left_behind || s.stream.is_dead_or_noisy() {
                    total -= 1;
                    retire.push(s);
                } else {
                    keep.push(s);
                }
            }
            inner.idle = keep;
            let missing =
                if inner.closed.is_some() || self.is_paused() { 0 } else { settings.kept_open.saturating_sub(total) };
            (missing, total)
        };
        // A host name is looked up again once its answer is `dns_max_ttl` old while the
        // pool has connections to it (the next connect would do it otherwise).
        if let Some(dns) = settings.target.dns.as_ref().filter(|_| total > 0) {
            dns.refresh(settings.target.addr.port, settings.target.dns_ttl.answer);
        }
        for s in retire {
            self.discard(s);
        }
        missing
    }

    /// Opens one connection for `min_pool_size` and parks it idle. False when none is
    /// opened: the pool is closed or paused, holds `min_pool_size` connections already
    /// (refills begun in earlier rounds count), is full, or a connection limit is reached.
    pub async fn prefill(&self) -> Result<bool, ServerError> {
        {
            let settings = self.settings.load();
            let mut inner = self.inner.lock();
            let enough = inner.total >= settings.kept_open;
            let held_back = inner.held_back(settings.login_retry).is_some();
            let acquired = || ConnLimit::acquire_pair_unmarked(&self.db_limit, &self.user_limit);
            if inner.closed.is_some() || self.is_paused() || enough || held_back || !acquired() {
                return Ok(false);
            }
            inner.total += 1;
            inner.connecting += 1;
        }
        let s = self.open().await?;
        self.checkin(s);
        Ok(true)
    }

    /// Closes every idle connection now; in-use ones are closed when they come back.
    /// Its clients' next check-out fails with `why` (57P03).
    pub fn close(&self, why: &'static str) {
        let idle = {
            let mut inner = self.inner.lock();
            inner.closed = Some(why);
            inner.waiters.clear();
            std::mem::take(&mut inner.idle)
        };
        // Clients waiting for a RESUME learn that the pool is gone.
        self.set_paused(false);
        for s in idle {
            self.discard(s);
        }
    }

    /// Closes idle connections (used after PostgreSQL restarts or on RECONNECT).
    pub fn drop_idle(&self) {
        let idle = std::mem::take(&mut self.inner.lock().idle);
        for s in idle {
            self.discard(s);
        }
    }

    /// Clients wait although the pool has room: a shared limit (max_db_connections,
    /// max_user_connections) stops it from opening a connection.
    pub fn is_starved(&self) -> bool {
        let settings = self.settings.load();
        let i = self.inner.lock();
        // (Not while `server_login_retry` holds its connects back: room made for it
        // would not be used.)
        !i.waiters.is_empty()
            && i.total < settings.size
            && i.connecting == 0
            && i.held_back(settings.login_retry).is_none()
    }

    /// Whether clients wait in this pool's queue.
    pub fn has_waiters(&self) -> bool {
        !self.inner.lock().waiters.is_empty()
    }

    /// Whether closing one of this pool's connections gives `starved` room: `starved`
    /// finds a shared limit full, and this pool counts against every one it finds full.
    pub fn can_make_room_for(&self, starved: &Pool) -> bool {
        let (db_full, user_full) = (starved.db_limit.is_full(), starved.user_limit.is_full());
        (db_full || user_full)
            && (!db_full || Arc::ptr_eq(&self.db_limit, &starved.db_limit))
            && (!user_full || Arc::ptr_eq(&self.user_limit, &starved.user_limit))
    }

    /// Closes one idle connection, if any (to make room under a shared limit): the one
    /// idle longest, which would be lent last.
    pub fn evict_one_idle(&self) -> bool {
        let s = self.inner.lock().take_idle(true);
        match s {
            Some(s) => {
                self.discard(s);
                true
            }
            None => false,
        }
    }
}
