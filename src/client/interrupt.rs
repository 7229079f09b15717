//! A client's interrupt: the admin console's KILL, or the pooler's shutdown phase
//! changing, registered once for the whole session rather than on every wait (a tokio
//! `Notified` takes its lock when registered, when dropped, and on every poll, and a
//! pooled client waits twice per transaction); and the deadline `client_login_timeout`
//! sets the steps of its login.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::Ordering::Acquire;
use std::task::{Context, Poll};
use std::time::Duration;

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

/// When a login must be through the steps `client_login_timeout` bounds (counted from
/// the accept): the handshake, TLS and authentication, and a wait for a pool's first
/// server. None: no limit.
#[derive(Clone, Copy, Debug)]
pub struct LoginDeadline(Option<tokio::time::Instant>);

impl LoginDeadline {
    /// For a step the deadline does not bound.
    pub(super) const NONE: LoginDeadline = LoginDeadline(None);

    /// The deadline `limit` from now (None: no limit).
    pub fn after(limit: Option<Duration>) -> Self {
        LoginDeadline(limit.and_then(|t| tokio::time::Instant::now().checked_add(t)))
    }

    /// Runs a step of the login until it ends or the deadline passes. The step comes
    /// pinned by the caller (see `until_shutdown`).
    pub(super) async fn bound<T, F>(self, step: Pin<&mut F>) -> Result<T, Exit>
    where
        F: Future<Output = Result<T, Exit>> + ?Sized,
    {
        match self.0 {
            Some(at) => tokio::time::timeout_at(at, step)
                .await
                .unwrap_or_else(|_| Err(Exit::protocol("client_login_timeout: login took too long"))),
            None => step.await,
        }
    }
}
