//! A client's interrupt: the admin console's KILL, or the pooler's shutdown phase
//! changing. Registered once for the whole session rather than on every wait: a
//! tokio `Notified` takes its lock when registered, when dropped, and on every poll,
//! and a pooled client waits twice per transaction.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Acquire;
use std::task::{Context, Poll};

use tokio::sync::futures::Notified;

use super::Exit;
use crate::app::{App, Phase};
use crate::stats::ClientInfo;

/// Why the client must leave before its next request: killed by the admin console, or
/// the pooler shutting down.
pub(super) fn interruption(app: &App, info: &ClientInfo) -> Option<Exit> {
    if info.is_killed() {
        return Some(Exit::killed());
    }
    matches!(app.current_phase(), Phase::Draining | Phase::Stopping).then(Exit::shutting_down)
}

/// `interruption` that cannot wait for the transaction's end: killed by the admin
/// console, or the shutdown's last phase (not its draining one).
pub(super) fn interruption_now(app: &App, info: &ClientInfo) -> Option<Exit> {
    interruption(app, info).filter(|_| info.is_killed() || app.current_phase() == Phase::Stopping)
}

pub(super) struct Interrupt<'a, 'i> {
    info: &'i ClientInfo,
    notified: Pin<&'a mut Notified<'i>>,
    /// The notified future has been polled once: its waiter (this task) is registered.
    registered: bool,
    /// `ClientInfo::interrupts` when this interrupt last fired.
    seen: u64,
}

impl<'a, 'i> Interrupt<'a, 'i> {
    /// `notified` must come from `info.interrupt.notified()`.
    pub fn new(info: &'i ClientInfo, notified: Pin<&'a mut Notified<'i>>) -> Self {
        Interrupt { info, notified, registered: false, seen: info.interrupts.load(Acquire) }
    }

    /// Why the session must end at once, if it must (`interruption_now`).
    pub fn ends_now(&self, app: &App) -> Option<Exit> {
        interruption_now(app, self.info)
    }

    /// Resolves when the client is interrupted (again); the caller then reads why from
    /// `ClientInfo::killed` and the application's phase.
    pub fn fired(&mut self) -> impl Future<Output = ()> + '_ {
        std::future::poll_fn(move |cx| self.poll_fired(cx))
    }

    fn poll_fired(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let count = self.info.interrupts.load(Acquire);
        // Registered and nothing new: the registered waker (this task's, which does
        // not change) will be woken, so skip the lock a poll would take.
        if self.registered && count == self.seen {
            return Poll::Pending;
        }
        match self.notified.as_mut().poll(cx) {
            Poll::Ready(()) => {
                self.seen = count;
                self.notified.set(self.info.interrupt.notified());
                self.registered = false;
                Poll::Ready(())
            }
            Poll::Pending => {
                self.registered = true;
                Poll::Pending
            }
        }
    }
}
