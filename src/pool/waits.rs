//! Clients waiting for a server connection: the pool's FIFO queue kept in deadline
//! order, the one task per pool that fails waits past `query_wait_timeout`, waits held
//! by PAUSE, and what a reload changing the timeout does to waits already begun.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Handoff, Inner, Pool, PoolError, PoolSettings, Queued};

impl Inner {
    /// Queues a wait behind those that run out no later than it, to keep the deadlines
    /// in order for the expiry task: at the back, but for a wait queued again (PAUSE,
    /// a reload, a closed queue) that began before some already queued, which takes
    /// its place by when it began, ahead of them.
    pub(super) fn enqueue(&mut self, w: Queued) {
        let later = |q: &Queued| matches!((q.deadline, w.deadline), (Some(a), Some(b)) if a > b);
        match self.waiters.iter().rposition(|q| !later(q)) {
            Some(i) if i + 1 == self.waiters.len() => self.waiters.push_back(w),
            found => self.waiters.insert(found.map_or(0, |i| i + 1), w),
        }
    }

    /// Whether to start the expiry task for a queue that `needs` one: true once, until
    /// the task ends (`Pool::expire_waiters`).
    pub(super) fn arm_expiry(&mut self, needs: bool) -> bool {
        let arm = needs && !self.expiry_armed;
        self.expiry_armed |= arm;
        arm
    }
}

impl Pool {
    /// When a wait that began at `since` (now, if unset) runs out of `query_wait_timeout`.
    pub(super) fn deadline(settings: &PoolSettings, since: &mut Option<Instant>) -> Option<Instant> {
        let start = *since.get_or_insert_with(Instant::now);
        settings.wait_timeout.map(|t| start + t)
    }

    /// `query_wait_timeout` changed to `timeout`: a wait queued before it runs out no
    /// later than one queued now. The deadlines stay in queue order (`Inner::enqueue`), so the
    /// expiry task, which looks at the oldest wait, reaches every one in time (a wait queued with no
    /// timeout, or a longer one, would otherwise hold up those behind it); a task
    /// already sleeping toward an older, later deadline is woken to look again.
    pub(super) fn bound_queued_waits(self: &Arc<Self>, timeout: Option<Duration>) {
        let Some(t) = timeout else { return };
        let latest = Instant::now() + t;
        let (arm, running) = {
            let mut inner = self.inner.lock();
            for w in inner.waiters.iter_mut() {
                w.deadline = no_later_than(w.deadline, latest);
            }
            let waiting = !inner.waiters.is_empty();
            let arm = inner.arm_expiry(waiting);
            (arm, inner.expiry_armed && !arm)
        };
        if arm {
            tokio::spawn(self.clone().expire_waiters());
        } else if running {
            // Stored as a permit if the task is not sleeping yet: it looks again anyway.
            self.deadlines_moved.notify_one();
        }
    }

    /// Fails the waits that ran past their deadline, oldest first, sleeping until the
    /// next one (or until a reload moves the deadlines, `bound_queued_waits`); ends when
    /// nobody waits with a deadline.
    pub(super) async fn expire_waiters(self: Arc<Self>) {
        loop {
            let wake_at = {
                let mut inner = self.inner.lock();
                let now = Instant::now();
                loop {
                    let Some(front) = inner.waiters.front() else {
                        inner.expiry_armed = false;
                        return;
                    };
                    match front.deadline {
                        _ if front.tx.is_closed() => {}
                        Some(d) if d <= now => {}
                        Some(d) => break d,
                        // Queued with no timeout set, and so are all behind it (a
                        // timeout set since bounds every wait, `bound_queued_waits`,
                        // and starts a task): nothing to expire.
                        None => {
                            inner.expiry_armed = false;
                            return;
                        }
                    }
                    let w = inner.waiters.pop_front().expect("front exists");
                    let _ = w.tx.send(Handoff::TimedOut);
                }
            };
            let sleep = tokio::time::sleep_until(tokio::time::Instant::from_std(wake_at));
            tokio::select! {
                () = sleep => {}
                () = self.deadlines_moved.notified() => {}
            }
        }
    }

    /// Waits until the pool is resumed (or closed: `close` clears the pause), or the
    /// wait that began at `since` times out. A reload that sets or shortens
    /// `query_wait_timeout` meanwhile bounds it as it bounds queued waits
    /// (`bound_queued_waits`).
    pub(super) async fn wait_resumed(&self, since: &mut Option<Instant>) -> Result<(), PoolError> {
        let mut timeout = self.settings.load().wait_timeout;
        let mut deadline = Self::deadline(&self.settings.load(), since);
        loop {
            let woken = self.wait_until(|p| !p.is_paused() || p.settings.load().wait_timeout != timeout);
            match deadline {
                Some(d) => tokio::time::timeout_at(d.into(), woken).await.map_err(|_| PoolError::WaitTimeout)?,
                None => woken.await,
            }
            if !self.is_paused() {
                return Ok(());
            }
            timeout = self.settings.load().wait_timeout;
            if let Some(t) = timeout {
                let latest = Instant::now() + t;
                deadline = no_later_than(deadline, latest);
            }
        }
    }
}

/// A deadline moved to `latest` if it was later, or had none.
fn no_later_than(deadline: Option<Instant>, latest: Instant) -> Option<Instant> {
    Some(deadline.map_or(latest, |d| d.min(latest)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A wait queued again (after PAUSE, a reload) that began before some already
    /// queued goes ahead of them: the deadlines stay in order for the expiry task, which
    /// looks at the oldest only. Equal deadlines keep their arrival order.
    #[test]
    fn queued_waits_stay_in_deadline_order() {
        let now = Instant::now();
        let mut inner = Inner::default();
        let mut receivers = Vec::new();
        for secs in [5, 9, 2, 9, 7] {
            let (tx, rx) = tokio::sync::oneshot::channel();
            inner.enqueue(Queued { tx, deadline: Some(now + Duration::from_secs(secs)) });
            receivers.push(rx);
        }
        // Which arrival each place in the queue holds, front first.
        let mut order = Vec::new();
        for w in std::mem::take(&mut inner.waiters) {
            w.tx.send(Handoff::Connect).expect("a receiver");
            order.extend(receivers.iter_mut().position(|rx| rx.try_recv().is_ok()));
        }
        assert_eq!(order, [2, 0, 4, 1, 3]);
    }
}
