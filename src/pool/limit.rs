//! A shared counter of server connections against a maximum (0 = unlimited), for
//! `max_db_connections` and `max_user_connections`, and the pools that count against
//! it, so that room one pool frees reaches the others' queues at once.
//!
//! A pool takes its database's and its user's limit together (`acquire_pair`, the
//! database's lock first, always), so no other pool sees one of them held for a moment
//! and given back. A pool that finds a limit full marks it `contended` under the same
//! lock; whoever frees room afterwards sees the mark (`take_contended`) and wakes the
//! pools sharing the limit. Either the freeing comes first, and the pool that looks
//! sees the room, or the mark does, and the freeing sees it: no wake-up is lost. A
//! mark no queue needs any more is cleared by the janitor's pass (`settle`), as it
//! has every check-in wake the janitor.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::Pool;

#[derive(Debug, Default)]
struct Count {
    current: usize,
    /// A pool found the limit full since the last wake-up.
    contended: bool,
}

#[derive(Debug, Default)]
pub struct ConnLimit {
    max: AtomicUsize,
    count: Mutex<Count>,
    /// The pools counting against this limit.
    pools: Mutex<Vec<Weak<Pool>>>,
}

impl ConnLimit {
    pub fn new(max: usize) -> Self {
        ConnLimit { max: AtomicUsize::new(max), ..Default::default() }
    }

    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    pub fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    pub fn current(&self) -> usize {
        self.count.lock().current
    }

    /// Whether the limit is set and a pool found it full since the last wake-up (one
    /// atomic load when no limit is set).
    pub fn is_contended(&self) -> bool {
        self.max() > 0 && self.count.lock().contended
    }

    /// Whether the limit is set and reached.
    pub fn is_full(&self) -> bool {
        !has_room(self.max(), self.current())
    }

    /// Counts `pool` among those to wake when room is freed.
    pub fn join(&self, pool: &Arc<Pool>) {
        let mut pools = self.pools.lock();
        pools.retain(|p| p.strong_count() > 0);
        pools.push(Arc::downgrade(pool));
    }

    /// Takes one connection under both limits, or none (marking the full one contended:
    /// call with the pool's lock held, and queue the client under that same hold).
    pub fn acquire_pair(db: &ConnLimit, user: &ConnLimit) -> bool {
        Self::acquire(db, user, true)
    }

    /// `acquire_pair` for a connection nobody waits for (`min_pool_size`): a full limit
    /// is not marked, as no queue needs room made.
    pub fn acquire_pair_unmarked(db: &ConnLimit, user: &ConnLimit) -> bool {
        Self::acquire(db, user, false)
    }

    fn acquire(db: &ConnLimit, user: &ConnLimit, mark: bool) -> bool {
        let mut d = db.count.lock();
        let mut u = user.count.lock();
        let d_room = has_room(db.max(), d.current);
        let u_room = has_room(user.max(), u.current);
        if d_room && u_room {
            d.current += 1;
            u.current += 1;
        }
        d.contended |= mark && !d_room;
        u.contended |= mark && !u_room;
        d_room && u_room
    }

    /// Gives back one connection taken with `acquire_pair`.
    pub fn release_pair(db: &ConnLimit, user: &ConnLimit) {
        let mut d = db.count.lock();
        let mut u = user.count.lock();
        d.current = d.current.saturating_sub(1);
        u.current = u.current.saturating_sub(1);
    }

    /// The pools to wake, if one found the limit full since the last call (and clears
    /// the mark); call with no pool's lock held.
    pub fn take_contended(&self) -> Vec<Arc<Pool>> {
        if !std::mem::take(&mut self.count.lock().contended) {
            return Vec::new();
        }
        self.pools.lock().iter().filter_map(Weak::upgrade).collect()
    }

    /// Clears the mark unless a pool counting against this limit has clients queued;
    /// call with no pool's lock held. Taken first and set again: a pool marks and queues
    /// under one hold of its lock, which `has_waiters` takes, so a mark set before the
    /// clear is seen with its queue, and one set after stays. Room freed while the mark
    /// was down woke nobody, so the queues are woken (each marks the limit again if it
    /// is still full).
    pub fn settle(&self) {
        if !self.is_contended() {
            return;
        }
        let waiting: Vec<_> = self.take_contended().into_iter().filter(|p| p.has_waiters()).collect();
        if !waiting.is_empty() {
            self.count.lock().contended = true;
            waiting.iter().for_each(|p| p.wake_waiters());
        }
    }
}

fn has_room(max: usize, current: usize) -> bool {
    max == 0 || current < max
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_unlimited() {
        let (l, u) = (ConnLimit::new(2), ConnLimit::new(0));
        assert!(ConnLimit::acquire_pair(&l, &u) && ConnLimit::acquire_pair(&l, &u));
        assert!(!ConnLimit::acquire_pair(&l, &u));
        assert_eq!((l.current(), u.current()), (2, 2), "a refused pair takes neither");
        ConnLimit::release_pair(&l, &u);
        assert!(ConnLimit::acquire_pair(&l, &u));
        for _ in 0..100 {
            assert!(ConnLimit::acquire_pair(&u, &ConnLimit::new(0)));
        }
        assert_eq!(u.current(), 102);
    }

    #[test]
    fn a_full_limit_is_marked_until_taken() {
        let (l, u) = (ConnLimit::new(1), ConnLimit::new(0));
        assert!(ConnLimit::acquire_pair(&l, &u));
        assert!(l.take_contended().is_empty() && !l.count.lock().contended);
        assert!(!ConnLimit::acquire_pair(&l, &u));
        assert!(l.count.lock().contended && !u.count.lock().contended);
        // No pools joined: nothing to wake, but the mark is cleared.
        assert!(l.take_contended().is_empty());
        assert!(!l.count.lock().contended);
    }
}
