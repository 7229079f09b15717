//! `server_login_retry`, as in PgBouncer: after a connect to its server fails (the
//! connection refused or cut, a timeout, a refused login), a pool opens no new
//! connection for that long. A client that needs one meanwhile, in a pool with no
//! connection open, gets the failure at once (so do the clients queued when it
//! happened); one in a pool with connections waits in the queue for one coming back.
//! Once the time is over, the janitor lets the oldest waiter connect again, and so
//! does the next request. A reload (or admin SET) ends the wait at once: it is how an
//! operator says the server was mended.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Handoff, Inner, Pool, PoolSettings};
use crate::server::ServerError;

/// A pool's last failed connect: what the clients held back by it are told.
#[derive(Debug)]
pub struct ConnectFailure {
    at: Instant,
    /// The SQLSTATE the failed connect gave its own client.
    pub code: String,
    pub message: String,
}

impl ConnectFailure {
    pub(super) fn new(e: &ServerError) -> Arc<Self> {
        Arc::new(ConnectFailure { at: Instant::now(), code: e.sqlstate().to_string(), message: e.to_string() })
    }

    /// Whether it still holds new connects back (`retry`: `server_login_retry`).
    pub(super) fn holds(&self, retry: Option<Duration>) -> bool {
        retry.is_some_and(|r| self.at.elapsed() < r)
    }
}

impl std::fmt::Display for ConnectFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "server login has been failing, try again later (server_login_retry): {}", self.message)
    }
}

impl Inner {
    /// With connects held back and no connection open, the queued clients have nothing
    /// to wait for: they get the failure now, as new requests do.
    pub(super) fn fail_waiters_if_none_open(&mut self, f: &Arc<ConnectFailure>) {
        if self.none_open() {
            for w in self.waiters.drain(..) {
                let _ = w.tx.give(Handoff::Failed(f.clone()));
            }
        }
    }
}

impl Pool {
    /// A connect begun with `settings` failed: new ones are held back for
    /// `server_login_retry`, and if no connection is open the clients queued get the
    /// failure now. Not when a reload replaced the settings meanwhile: the operator may
    /// have mended what failed (and the reload ended the wait already).
    pub(super) fn connect_failed(&self, e: &ServerError, settings: &Arc<PoolSettings>) {
        let f = ConnectFailure::new(e);
        let mut inner = self.inner.lock();
        // Looked at under the lock: a reload stores its settings before it takes the
        // lock to end the wait, so this sees them or comes before that end.
        let current = self.settings.load();
        if !Arc::ptr_eq(&current, settings) || current.login_retry.is_none() {
            return;
        }
        inner.failed = Some(f.clone());
        inner.fail_waiters_if_none_open(&f);
    }

    /// The janitor's look at the queue: once `server_login_retry` is over, the oldest
    /// waiters may open connections again (nothing else would offer them one).
    pub fn retry_for_waiters(&self) {
        self.wake_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_holds_connects_back_for_server_login_retry_only() {
        let f = ConnectFailure::new(&ServerError::ConnectTimeout);
        assert!(f.holds(Some(Duration::from_secs(60))));
        assert!(!f.holds(None), "0 turns it off");
        assert!(!f.holds(Some(Duration::ZERO)));
        assert_eq!(f.code, crate::protocol::sqlstate::SQLCLIENT_UNABLE_TO_ESTABLISH);
        assert!(f.to_string().ends_with("(server_login_retry): timed out connecting to the server"), "{f}");
    }
}
