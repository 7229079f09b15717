//! Where a waiting client is handed what the pool gives it (`Handoff`): a slot of the
//! client's own, made at its first wait and reused by each wait after it, so a wait
//! allocates nothing (a channel per wait was an allocation per transaction whenever
//! clients queue for connections).
//!
//! A slot serves one wait at a time. Each wait has a number; the pool's queue entry
//! (`Sender`) gives only to the wait it was made for, so an entry left in the queue by
//! a wait its client abandoned (it left, or a cancel ended the wait) finds that wait
//! ended, and never gives to a later one.

use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

use super::{Handoff, Pool};

/// A client's hand-off slot, made at its first wait (`WaitSlot`).
#[derive(Debug, Default)]
pub struct HandoffSlot(Mutex<SlotState>);

/// What a client keeps for its waits: empty until it first waits.
pub type WaitSlot = OnceLock<Arc<HandoffSlot>>;

#[derive(Debug, Default)]
struct SlotState {
    /// The current wait's number: bumped by each new wait.
    wait: u64,
    /// The current wait is queued and has been given nothing yet.
    open: bool,
    given: Option<Handoff>,
    waker: Option<Waker>,
}

/// A waiting client's entry in the pool's queue.
#[derive(Debug)]
pub(super) struct Sender {
    slot: Arc<HandoffSlot>,
    wait: u64,
}

impl HandoffSlot {
    /// Begins a new wait on this slot: the queue entry that gives to it, and its number.
    pub(super) fn open(self: &Arc<Self>) -> (Sender, u64) {
        let mut st = self.0.lock();
        // Every wait ends closed with its hand-off taken: a second wait at once on one
        // slot would lose what the first was given.
        debug_assert!(!st.open && st.given.is_none(), "one wait at a time per slot");
        st.wait = st.wait.wrapping_add(1);
        st.open = true;
        st.given = None;
        (Sender { slot: self.clone(), wait: st.wait }, st.wait)
    }
}

#[cfg(test)]
impl HandoffSlot {
    /// What was given to the current wait, taken.
    pub(super) fn take_given(&self) -> Option<Handoff> {
        self.0.lock().given.take()
    }
}

impl Sender {
    /// Gives `h` to the wait, if it is still open; else hands it back.
    pub(super) fn give(self, h: Handoff) -> Result<(), Handoff> {
        let waker = {
            let mut st = self.slot.0.lock();
            if st.wait != self.wait || !st.open {
                return Err(h);
            }
            st.open = false;
            st.given = Some(h);
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
        Ok(())
    }

    /// Whether the wait ended without it (its client left the wait).
    pub(super) fn is_closed(&self) -> bool {
        let st = self.slot.0.lock();
        st.wait != self.wait || !st.open
    }
}

/// Dropped without giving (the queue cleared: PAUSE, the pool closed or failing its
/// waits): the wait ends with nothing, and its client looks at the pool again.
impl Drop for Sender {
    fn drop(&mut self) {
        let waker = {
            let mut st = self.slot.0.lock();
            if st.wait != self.wait || !st.open {
                return;
            }
            st.open = false;
            st.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

/// A client waiting on its slot. If it goes away, what was handed to it in the
/// meantime goes back to the pool (a connection, or the room to open one).
pub(super) struct Waiter<'a> {
    pub(super) pool: &'a Pool,
    pub(super) slot: &'a HandoffSlot,
    pub(super) wait: u64,
    /// The wait ended here (what it was given, if anything, is the caller's).
    pub(super) done: bool,
}

impl Waiter<'_> {
    /// What the wait was given; None: it ended with nothing (its queue was dropped).
    pub(super) async fn received(&mut self) -> Option<Handoff> {
        std::future::poll_fn(|cx| self.poll_received(cx)).await
    }

    pub(super) fn poll_received(&mut self, cx: &mut Context<'_>) -> Poll<Option<Handoff>> {
        let mut st = self.slot.0.lock();
        if st.wait == self.wait && st.open {
            if !st.waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                st.waker = Some(cx.waker().clone());
            }
            return Poll::Pending;
        }
        self.done = true;
        st.waker = None;
        Poll::Ready(if st.wait == self.wait { st.given.take() } else { None })
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        let given = {
            let mut st = self.slot.0.lock();
            if st.wait != self.wait {
                return;
            }
            st.open = false;
            st.waker = None;
            st.given.take()
        };
        match given {
            Some(Handoff::Server(s)) => self.pool.checkin(s),
            Some(Handoff::Connect) => self.pool.give_back_slot(),
            Some(Handoff::TimedOut | Handoff::Failed(_)) | None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(slot: &HandoffSlot, wait: u64) -> bool {
        let st = slot.0.lock();
        st.wait == wait && st.open && st.given.is_none()
    }

    /// An entry left in the queue by an earlier wait of the same client never gives
    /// to a later one; a dropped entry ends its wait with nothing.
    #[test]
    fn an_entry_gives_only_to_its_own_wait() {
        let slot = Arc::new(HandoffSlot::default());
        let (first, _) = slot.open();
        // Abandoned by its client (what `Waiter`'s drop does), its entry left queued.
        slot.0.lock().open = false;
        let (second, wait) = slot.open();
        assert!(first.is_closed() && !second.is_closed());
        assert!(matches!(first.give(Handoff::Connect), Err(Handoff::Connect)));
        assert!(pending(&slot, wait), "the later wait got nothing from the earlier entry");
        assert!(second.give(Handoff::TimedOut).is_ok());
        assert!(matches!(slot.take_given(), Some(Handoff::TimedOut)));
        let (third, wait) = slot.open();
        drop(third);
        let st = slot.0.lock();
        assert!(st.wait == wait && !st.open && st.given.is_none());
    }
}
