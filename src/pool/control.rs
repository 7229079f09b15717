//! The operator's controls of a pool (admin console PAUSE, RESUME, RECONNECT, KILL,
//! WAIT_CLOSE) and the notification they wait on.

use std::sync::atomic::AtomicUsize;
use std::sync::atomic::Ordering::{Acquire, Relaxed, SeqCst};

use super::{Pool, ServerConn};
use crate::stats::ServerInfo;

impl Pool {
    /// SeqCst, like `watchers`: a waiter counts itself in and then reads the flag, the
    /// setter writes the flag and then looks for waiters, so one of them sees the other.
    pub fn is_paused(&self) -> bool {
        self.paused.load(SeqCst)
    }

    /// Why the pool was closed (`close`), if it was.
    pub fn closed_why(&self) -> Option<&'static str> {
        self.inner.lock().closed
    }

    /// Sets the flag first (a check-out reads it under the pool's lock, which `pause`
    /// takes after this), then wakes whoever waits on it (`wait_until`).
    pub(super) fn set_paused(&self, on: bool) {
        self.paused.store(on, SeqCst);
        self.notify_changed();
    }

    /// PAUSE: checkouts wait, those already queued too (their queue is dropped, so
    /// they wait for RESUME); idle connections are closed now and the others as they
    /// come back.
    pub fn pause(&self) {
        self.set_paused(true);
        let queued = std::mem::take(&mut self.inner.lock().waiters);
        drop(queued);
        self.drop_idle();
    }

    /// RESUME: waiting checkouts go on; a PAUSE still waiting for the pool to empty
    /// ends (`wait_until` callers are woken).
    pub fn resume(&self) {
        self.set_paused(false);
        self.wake_waiters();
    }

    /// RECONNECT: every connection open now (or being opened) is closed when it is next
    /// idle.
    pub fn reconnect(&self) {
        self.generation.fetch_add(1, SeqCst);
        let marked: Vec<Box<ServerConn>> = {
            let mut inner = self.inner.lock();
            let (marked, keep) = std::mem::take(&mut inner.idle).into_iter().partition(|s| self.marked(s));
            inner.idle = keep;
            marked
        };
        for s in marked {
            self.discard(s);
        }
    }

    /// Server connections still open that RECONNECT or KILL marked for closing.
    pub fn marked_count(&self) -> usize {
        self.servers.list().iter().filter(|s| self.close_needed(s)).count()
    }

    /// Whether a server connection was marked for closing (SHOW SERVERS close_needed).
    pub fn close_needed(&self, info: &ServerInfo) -> bool {
        info.generation.load(Relaxed) < self.generation.load(Acquire)
    }

    /// Goes to an address its host name no longer has (closed when it comes back;
    /// SHOW SERVERS close_needed).
    pub fn left_behind(&self, info: &ServerInfo) -> bool {
        self.settings.load().target.lost(info)
    }

    /// Marked for closing by RECONNECT or KILL.
    pub(super) fn marked(&self, s: &ServerConn) -> bool {
        self.close_needed(&s.info)
    }

    /// Waits until `done` holds, re-checking whenever a connection comes back or closes.
    pub async fn wait_until(&self, done: impl Fn(&Pool) -> bool) {
        struct Watching<'a>(&'a AtomicUsize);
        impl Drop for Watching<'_> {
            fn drop(&mut self) {
                self.0.fetch_sub(1, SeqCst);
            }
        }
        self.watchers.fetch_add(1, SeqCst);
        let _watching = Watching(&self.watchers);
        loop {
            let changed = self.changed.notified();
            if done(self) {
                return;
            }
            changed.await;
        }
    }

    /// Wakes `wait_until` callers; skips the notifier's lock (taken on every check-in)
    /// when nobody waits.
    pub(super) fn notify_changed(&self) {
        if self.watchers.load(SeqCst) > 0 {
            self.changed.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;

    use crate::server::ServerAddr;
    use crate::stats::ServerInfo;

    /// RECONNECT marks by generation: the connections begun before it, whatever the
    /// clock says, and none begun after it.
    #[test]
    fn reconnect_marks_earlier_generations_only() {
        let text = "[databases.db]\nhost = \"127.0.0.1\"\nport = 5\n[users.u]\npassword = \"p\"\n";
        let cfg = crate::config::Config::parse(text, std::path::Path::new("t.toml")).unwrap();
        let users = crate::auth::UserStore::from_config(&cfg).unwrap();
        let pool = crate::pool::Pools::default().get(&cfg, &users, "db", "u").unwrap();
        let addr = || ServerAddr { host: "h".into(), port: 1 };
        let before = ServerInfo::new(1, addr());
        assert!(!pool.close_needed(&before));
        pool.reconnect();
        assert!(pool.close_needed(&before));
        // Begun after the RECONNECT (stamped as `connect_counted` does), even if the
        // clock stepped back since: not marked.
        let after = ServerInfo::new(2, addr());
        after.generation.store(pool.generation.load(Relaxed), Relaxed);
        assert!(!pool.close_needed(&after));
        pool.reconnect();
        assert!(pool.close_needed(&after));
    }
}
