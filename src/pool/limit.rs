//! A shared counter of server connections against a maximum (0 = unlimited), for
//! `max_db_connections` and `max_user_connections`.

use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug, Default)]
pub struct ConnLimit {
    max: AtomicUsize,
    current: AtomicUsize,
}

impl ConnLimit {
    pub fn new(max: usize) -> Self {
        ConnLimit { max: AtomicUsize::new(max), current: AtomicUsize::new(0) }
    }

    pub fn set_max(&self, max: usize) {
        self.max.store(max, Ordering::Relaxed);
    }

    pub fn max(&self) -> usize {
        self.max.load(Ordering::Relaxed)
    }

    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    pub fn try_acquire(&self) -> bool {
        let max = self.max.load(Ordering::Relaxed);
        self.current
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |c| (max == 0 || c < max).then_some(c + 1))
            .is_ok()
    }

    pub fn release(&self) {
        let _ = self.current.fetch_update(Ordering::AcqRel, Ordering::Relaxed, |c| c.checked_sub(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_and_unlimited() {
        let l = ConnLimit::new(2);
        assert!(l.try_acquire() && l.try_acquire());
        assert!(!l.try_acquire());
        l.release();
        assert!(l.try_acquire());
        let u = ConnLimit::new(0);
        for _ in 0..100 {
            assert!(u.try_acquire());
        }
        assert_eq!(u.current(), 100);
    }
}
