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
                    let _ = w.tx.give(Handoff::TimedOut);
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
    use crate::pool::handoff::{HandoffSlot, WaitSlot, Waiter};
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

    /// Queues a wait that began at `since` on `slot`: its number.
    fn queue(pool: &Arc<Pool>, since: Instant, slot: &WaitSlot) -> u64 {
        match pool.next(&mut Some(since), slot) {
            Ok(Next::Wait(wait, arm)) => {
                if arm {
                    tokio::spawn(pool.clone().expire_waiters());
                }
                wait
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
        let (later_slot, earlier_slot) = (WaitSlot::new(), WaitSlot::new());
        let wait = queue(&pool, now, &later_slot);
        let mut later = Waiter { pool: &pool, slot: later_slot.get().unwrap(), wait, done: false };
        // The task sleeps toward the later wait's deadline (now + 4 s).
        while !matches!(pool.inner.lock().expiry, Expiry::Asleep(_)) {
            tokio::task::yield_now().await;
        }
        let wait = queue(&pool, now - Duration::from_secs(3), &earlier_slot);
        let mut earlier = Waiter { pool: &pool, slot: earlier_slot.get().unwrap(), wait, done: false };
        assert!(matches!(earlier.received().await, Some(Handoff::TimedOut)));
        // At now + 1 s: the later wait has three more seconds to go.
        let pending = std::future::poll_fn(|cx| std::task::Poll::Ready(later.poll_received(cx).is_pending())).await;
        assert!(pending, "the later wait timed out with the earlier one");
        assert!(matches!(later.received().await, Some(Handoff::TimedOut)));
        assert!(now.elapsed() >= Duration::from_secs(4));
    }

    /// A wait its client abandoned (a cancel, the client leaving) leaves its entry in
    /// the queue. The client's next wait, on the same slot, is queued behind the waits
    /// that began before it, and is not served through the old entry: room goes to the
    /// oldest open wait.
    #[tokio::test]
    async fn an_abandoned_wait_does_not_serve_the_clients_next_one() {
        let pools = Pools::default();
        let pool = full_pool(&pools);
        let (a, b) = (WaitSlot::new(), WaitSlot::new());
        let now = Instant::now();
        let first = queue(&pool, now, &a);
        drop(Waiter { pool: &pool, slot: a.get().unwrap(), wait: first, done: false });
        let wait_b = queue(&pool, now + Duration::from_millis(1), &b);
        let wait_a = queue(&pool, now + Duration::from_millis(2), &a);
        assert_eq!(pool.counts().waiting, 3, "the abandoned entry is still queued");
        // Room for one connection: it goes to b, the oldest open wait.
        pool.inner.lock().total = 0;
        pool.wake_waiters();
        let mut b = Waiter { pool: &pool, slot: b.get().unwrap(), wait: wait_b, done: false };
        assert!(matches!(b.received().await, Some(Handoff::Connect)));
        let mut a = Waiter { pool: &pool, slot: a.get().unwrap(), wait: wait_a, done: false };
        let pending = std::future::poll_fn(|cx| std::task::Poll::Ready(a.poll_received(cx).is_pending())).await;
        assert!(pending, "the client's new wait was served through its abandoned entry");
        assert_eq!(pool.counts().waiting, 1);
    }

    /// A wait queued again (after PAUSE, a dropped queue) that began before some
    /// already queued goes ahead of them; waits that began at the same time keep their
    /// arrival order.
    #[test]
    fn waits_are_queued_in_the_order_they_began() {
        let now = Instant::now();
        let mut inner = Inner::default();
        let mut slots = Vec::new();
        for secs in [5, 9, 2, 9, 7, 1] {
            let slot = Arc::new(HandoffSlot::default());
            let (tx, _) = slot.open();
            inner.enqueue(Queued { tx, since: now + Duration::from_secs(secs) });
            slots.push(slot);
        }
        // Which arrival each place in the queue holds, front first.
        let mut order = Vec::new();
        for w in std::mem::take(&mut inner.waiters) {
            w.tx.give(Handoff::Connect).expect("an open wait");
            order.extend(slots.iter().position(|s| s.take_given().is_some()));
        }
        assert_eq!(order, [5, 2, 0, 4, 1, 3]);
    }

    /// Counts: (total, connecting, waiting, db limit taken).
    fn tally(pool: &Pool) -> (usize, usize, usize, usize) {
        let c = pool.counts();
        (c.total, c.connecting, c.waiting, pool.db_limit.current())
    }

    /// A connect slot handed to a wait whose client leaves before polling it goes back.
    #[tokio::test]
    async fn connect_given_then_wait_dropped_before_poll_goes_back() {
        let pools = Pools::default();
        let pool = full_pool(&pools);
        let slot = WaitSlot::new();
        let wait = queue(&pool, Instant::now(), &slot);
        let waiter = Waiter { pool: &pool, slot: slot.get().unwrap(), wait, done: false };
        pool.inner.lock().total = 0;
        pool.wake_waiters();
        assert_eq!(tally(&pool), (1, 1, 0, 1));
        drop(waiter);
        assert_eq!(tally(&pool), (0, 0, 0, 0));
    }

    /// PAUSE, close and a failed connect end a registered wait (woken), reusing one slot.
    #[tokio::test]
    async fn dropped_queue_wakes_registered_wait() {
        let pools = Pools::default();
        let pool = full_pool(&pools);
        let slot = WaitSlot::new();
        let poll_once = |w: &mut Waiter<'_>| {
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            w.poll_received(&mut cx).is_pending()
        };
        // PAUSE
        let wait = queue(&pool, Instant::now(), &slot);
        let mut w = Waiter { pool: &pool, slot: slot.get().unwrap(), wait, done: false };
        let pending = std::future::poll_fn(|cx| std::task::Poll::Ready(w.poll_received(cx).is_pending())).await;
        assert!(pending);
        let p2 = pool.clone();
        std::thread::spawn(move || p2.pause()).join().unwrap();
        let r = tokio::time::timeout(Duration::from_secs(2), w.received()).await;
        assert!(matches!(r, Ok(None)), "pause ends the wait with nothing");
        drop(w);
        pool.resume();
        // Failed (retry.rs)
        let wait = queue(&pool, Instant::now(), &slot);
        let mut w = Waiter { pool: &pool, slot: slot.get().unwrap(), wait, done: false };
        assert!(poll_once(&mut w));
        let f = crate::pool::ConnectFailure::new(&crate::server::ServerError::ConnectTimeout);
        {
            let mut inner = pool.inner.lock();
            inner.total = 0;
            inner.fail_waiters_if_none_open(&f);
            inner.total = 1;
        }
        let r = tokio::time::timeout(Duration::from_secs(2), w.received()).await;
        assert!(matches!(r, Ok(Some(Handoff::Failed(_)))));
        drop(w);
        // close
        let wait = queue(&pool, Instant::now(), &slot);
        let mut w = Waiter { pool: &pool, slot: slot.get().unwrap(), wait, done: false };
        assert!(poll_once(&mut w));
        pool.close("closed by the test");
        let r = tokio::time::timeout(Duration::from_secs(2), w.received()).await;
        assert!(matches!(r, Ok(None)), "close ends the wait with nothing");
        drop(w);
        assert!(matches!(pool.next(&mut None, &slot), Err(PoolError::Closed("closed by the test"))));
    }

    /// What the stress test's clients saw: waits abandoned, connect slots received,
    /// waits ended by a dropped queue (PAUSE).
    #[derive(Default)]
    struct Seen {
        abandoned: u64,
        connects: u64,
        dropped: u64,
    }

    /// xorshift64: the stress test's clients choose when to give up a wait.
    fn rng(seed: u64) -> impl FnMut() -> u64 {
        let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        }
    }

    /// One check-out of a stress client on its slot; the connect slot it got, if any,
    /// is given back after a while. Waits are abandoned at random points (before or
    /// after the give, between the give and the poll).
    async fn stress_checkout(pool: &Arc<Pool>, slot: &WaitSlot, next: &mut impl FnMut() -> u64, seen: &mut Seen) {
        let mut since = None;
        let held = loop {
            let (wait, arm) = match pool.next(&mut since, slot) {
                Ok(Next::Take(_)) => unreachable!("no idle connection"),
                Ok(Next::Connect) => break true,
                Ok(Next::Paused) if pool.wait_resumed(&mut since).await.is_ok() => continue,
                Ok(Next::Paused) => break false,
                Ok(Next::Wait(wait, arm)) => (wait, arm),
                Err(e) => panic!("{e:?}"),
            };
            if arm {
                tokio::spawn(pool.clone().expire_waiters());
            }
            let mut waiter = Waiter { pool, slot: slot.get().unwrap(), wait, done: false };
            let r = next();
            let got = if r % 2 == 0 {
                tokio::select! {
                    h = waiter.received() => Some(h),
                    () = tokio::time::sleep(Duration::from_micros(r % 60)) => None,
                }
            } else {
                Some(waiter.received().await)
            };
            match got {
                None => seen.abandoned += 1,
                Some(Some(Handoff::Connect)) => seen.connects += 1,
                Some(Some(Handoff::TimedOut)) => {}
                Some(Some(other)) => panic!("unexpected {other:?}"),
                Some(None) => {
                    seen.dropped += 1;
                    continue;
                }
            }
            break matches!(got, Some(Some(Handoff::Connect)));
        };
        if held {
            match next() % 3 {
                0 => tokio::task::yield_now().await,
                1 => tokio::time::sleep(Duration::from_micros(30)).await,
                _ => {}
            }
            pool.give_back_slot();
        }
    }

    /// PAUSE/RESUME now and then, and the janitor's pass, until `stop`.
    fn stress_chaos(pool: Arc<Pool>, stop: Arc<std::sync::atomic::AtomicBool>) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_micros(300)).await;
                n += 1;
                if n % 7 == 0 {
                    pool.pause();
                    tokio::time::sleep(Duration::from_micros(100)).await;
                    pool.resume();
                }
                pool.maintain();
            }
            pool.resume();
        })
    }

    /// Many clients on a multi-threaded runtime, each with one reused slot, wait,
    /// abandon waits at random points, take connect slots and give them back;
    /// PAUSE/RESUME, the janitor's pass and a short `query_wait_timeout` run meanwhile.
    /// Nothing hangs, and every slot is accounted for at the end.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn stress_handoff_conserves_connect_slots() {
        for timeout in ["query_wait_timeout = 0\n", "query_wait_timeout = 1\n"] {
            let text = format!(
                "[general]\n{timeout}[databases.a]\nhost = \"127.0.0.1\"\npool_size = 3\n[users.u]\npassword = \"p\"\n"
            );
            let cfg = Config::parse(&text, std::path::Path::new("sluice.toml")).expect("a valid config");
            let users = UserStore::from_config(&cfg).expect("valid users");
            let pools = Pools::default();
            let pool = pools.get(&cfg, &users, "a", "u").expect("a configured database");
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let chaos = stress_chaos(pool.clone(), stop.clone());
            let clients: Vec<_> = (0..24u64)
                .map(|c| {
                    let pool = pool.clone();
                    tokio::spawn(async move {
                        let (slot, mut next, mut seen) = (WaitSlot::new(), rng(c), Seen::default());
                        for _ in 0..1500 {
                            stress_checkout(&pool, &slot, &mut next, &mut seen).await;
                        }
                        seen
                    })
                })
                .collect();
            let mut total = Seen::default();
            let all = async {
                for c in clients {
                    let seen = c.await.expect("client task");
                    (total.abandoned, total.connects) =
                        (total.abandoned + seen.abandoned, total.connects + seen.connects);
                    total.dropped += seen.dropped;
                }
            };
            tokio::time::timeout(Duration::from_secs(120), all).await.expect("a wait was never woken (hang)");
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            chaos.await.unwrap();
            pool.maintain();
            let covered = total.abandoned > 0 && total.connects > 0 && total.dropped > 0;
            assert!(covered, "the run covered abandoned, served and dropped waits");
            assert_eq!(tally(&pool), (0, 0, 0, 0), "every connect slot is accounted for");
        }
    }
}
