//! Clients waiting for a server connection: the pool's FIFO queue, kept in the order
//! the waits began; the one task per pool that fails waits past `query_wait_timeout`;
//! waits held by PAUSE. The timeout is PgBouncer's: the one in force now, counted from
//! when each wait began, so a reload that changes it applies to the waits already
//! begun too.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Handoff, Inner, Pool, PoolError, Queued};

/// Where a pool's expiry task stands.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Expiry {
    /// No task runs.
    #[default]
    Off,
    /// Started, and not yet asleep (once asleep, it stays `Asleep` until it looks
    /// again under the queue's lock).
    Looking,
    /// Asleep until the front wait runs out, at the latest (it may be woken sooner).
    Asleep(Instant),
}

impl Inner {
    /// Queues a wait behind those that began no later than it: at the back, but for a
    /// wait queued again (after PAUSE, a failed server check, a queue dropped) that
    /// began before some already queued, which goes ahead of them.
    pub(super) fn enqueue(&mut self, w: Queued) {
        let at = self.waiters.iter().rposition(|q| q.since <= w.since).map_or(0, |i| i + 1);
        self.waiters.insert(at, w);
    }

    /// Whether a wait that began at `since` runs out before the expiry task, asleep,
    /// next looks (it must be woken to look again).
    pub(super) fn due_before_expiry_looks(&self, since: Instant) -> bool {
        matches!((self.wait_timeout, self.expiry), (Some(t), Expiry::Asleep(at)) if since + t < at)
    }

    /// Whether to start the expiry task for a queue that `needs` one: true once, until
    /// the task ends (`Pool::expire_waiters`).
    pub(super) fn arm_expiry(&mut self, needs: bool) -> bool {
        let arm = needs && self.expiry == Expiry::Off;
        if arm {
            self.expiry = Expiry::Looking;
        }
        arm
    }
}

impl Pool {
    /// `query_wait_timeout` changed to `timeout`, for the waits queued too (from when
    /// each began): the expiry task is started, or woken to look again.
    pub(super) fn retime_waits(self: &Arc<Self>, timeout: Option<Duration>) {
        let arm = {
            let mut inner = self.inner.lock();
            inner.wait_timeout = timeout;
            let needs = timeout.is_some() && !inner.waiters.is_empty();
            let arm = inner.arm_expiry(needs);
            if !arm && inner.expiry != Expiry::Off {
                // Stored as a permit if the task is not sleeping yet: it looks again anyway.
                self.expiry_recheck.notify_one();
            }
            arm
        };
        if arm {
            tokio::spawn(self.clone().expire_waiters());
        }
    }

    /// Fails the waits that ran past `query_wait_timeout`, oldest first, sleeping until
    /// the next one runs out (or until woken: a reload changed the timeout, or a wait
    /// that began earlier went to the front); ends when nobody waits or no timeout is
    /// set.
    pub(super) async fn expire_waiters(self: Arc<Self>) {
        loop {
            let wake_at = {
                let mut inner = self.inner.lock();
                let now = Instant::now();
                loop {
                    let (Some(front), Some(t)) = (inner.waiters.front(), inner.wait_timeout) else {
                        inner.expiry = Expiry::Off;
                        return;
                    };
                    let due = front.since + t;
                    if due > now && !front.tx.is_closed() {
                        inner.expiry = Expiry::Asleep(due);
                        break due;
                    }
                    let w = inner.waiters.pop_front().expect("front exists");
                    let _ = w.tx.send(Handoff::TimedOut);
                }
            };
            let sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(wake_at));
            tokio::select! {
                () = sleep => {}
                () = self.expiry_recheck.notified() => {}
            }
        }
    }

    /// Waits until the pool is resumed (or closed: `close` clears the pause), or the
    /// wait that began at `since` runs past `query_wait_timeout` (the one in force:
    /// a reload that changes it wakes this wait to look again).
    pub(super) async fn wait_resumed(&self, since: &mut Option<Instant>) -> Result<(), PoolError> {
        let start = *since.get_or_insert_with(Instant::now);
        loop {
            let timeout = self.settings.load().wait_timeout;
            let woken = self.wait_until(|p| !p.is_paused() || p.settings.load().wait_timeout != timeout);
            match timeout {
                Some(t) => {
                    let due = tokio::time::Instant::from_std(start + t);
                    tokio::time::timeout_at(due, woken).await.map_err(|_| PoolError::WaitTimeout)?;
                }
                None => woken.await,
            }
            if !self.is_paused() {
                return Ok(());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::UserStore;
    use crate::config::Config;
    use crate::pool::{Next, Pools};

    /// A full pool of one with `query_wait_timeout = 4` (no server: its one slot is
    /// counted as taken).
    fn full_pool(pools: &Pools) -> Arc<Pool> {
        let text = "[general]\nquery_wait_timeout = 4\n[databases.a]\nhost = \"127.0.0.1\"\npool_size = 1\n\
                    [users.u]\npassword = \"p\"\n";
        let cfg = Config::parse(text, std::path::Path::new("sluice.toml")).expect("a valid config");
        let users = UserStore::from_config(&cfg).expect("valid users");
        let pool = pools.get(&cfg, &users, "a", "u").expect("a configured database");
        pool.inner.lock().total = 1;
        pool
    }

    fn queue(pool: &Arc<Pool>, since: Instant) -> tokio::sync::oneshot::Receiver<Handoff> {
        match pool.next(&mut Some(since)) {
            Ok(Next::Wait(rx, arm)) => {
                if arm {
                    tokio::spawn(pool.clone().expire_waiters());
                }
                rx
            }
            _ => panic!("the pool is full: the wait is queued"),
        }
    }

    /// A wait queued again ahead of the one the expiry task sleeps toward (it began
    /// earlier: PAUSE, a failed server check) wakes the task, and fails at its own
    /// deadline, not at the later one's.
    #[tokio::test]
    async fn a_wait_queued_again_ahead_times_out_at_its_own_deadline() {
        let pools = Pools::default();
        let pool = full_pool(&pools);
        let now = Instant::now();
        let mut later = queue(&pool, now);
        // The task sleeps toward the later wait's deadline (now + 4 s).
        while !matches!(pool.inner.lock().expiry, Expiry::Asleep(_)) {
            tokio::task::yield_now().await;
        }
        let earlier = queue(&pool, now - Duration::from_secs(3));
        assert!(matches!(earlier.await, Ok(Handoff::TimedOut)));
        // At now + 1 s: the later wait has three more seconds to go.
        let pending = matches!(later.try_recv(), Err(tokio::sync::oneshot::error::TryRecvError::Empty));
        assert!(pending, "the later wait timed out with the earlier one");
        assert!(matches!(later.await, Ok(Handoff::TimedOut)));
        assert!(now.elapsed() >= Duration::from_secs(4));
    }

    /// A wait queued again (after PAUSE, a dropped queue) that began before some
    /// already queued goes ahead of them; waits that began at the same time keep their
    /// arrival order.
    #[test]
    fn waits_are_queued_in_the_order_they_began() {
        let now = Instant::now();
        let mut inner = Inner::default();
        let mut receivers = Vec::new();
        for secs in [5, 9, 2, 9, 7, 1] {
            let (tx, rx) = tokio::sync::oneshot::channel();
            inner.enqueue(Queued { tx, since: now + Duration::from_secs(secs) });
            receivers.push(rx);
        }
        // Which arrival each place in the queue holds, front first.
        let mut order = Vec::new();
        for w in std::mem::take(&mut inner.waiters) {
            w.tx.send(Handoff::Connect).expect("a receiver");
            order.extend(receivers.iter_mut().position(|rx| rx.try_recv().is_ok()));
        }
        assert_eq!(order, [5, 2, 0, 4, 1, 3]);
    }
}
