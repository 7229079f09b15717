//! The check before a loan (`server_check_delay`): a connection idle that long must
//! answer `server_check_query` (by default an empty query) before it is lent.

use std::sync::Arc;

use super::{Borrowed, Pool, PoolError, WaitSlot};
use crate::protocol::TxStatus;
use crate::server::ServerConn;

/// How long a connection that has just logged in counts as checked (`needs_check`).
const FRESH: std::time::Duration = std::time::Duration::from_secs(1);

impl Pool {
    /// Whether `s` must pass a check before it is lent: idle for `server_check_delay`,
    /// unless it finished its login within the last second and was never given back
    /// since (its login just showed it alive; with `server_check_delay = 0` and a check
    /// that keeps failing, each replacement would otherwise fail its check in turn, for
    /// ever). `last_used` is the end of the login until the connection is given back.
    pub fn needs_check(&self, s: &ServerConn) -> bool {
        let idle = s.last_used.elapsed();
        idle >= self.settings.load().check_delay && (s.returned || idle >= FRESH)
    }

    /// The check before a loan: `server` back once `server_check_query` shows it alive
    /// (answered without an error, and no transaction left open); None when it fails,
    /// and the server is closed (also when the caller is dropped during the round trip:
    /// its slot is freed), or when a RECONNECT, KILL or a move of the pool's host came
    /// during the check (not lent even once, as a connection opened across one).
    pub async fn checked(&self, server: Box<ServerConn>) -> Option<Box<ServerConn>> {
        let mut held = Borrowed::new(self, server);
        let settings = self.settings();
        let failed = match held.exec(&settings.check_query, settings.internal).await {
            Err(e) => e.to_string(),
            Ok(()) if held.tx != TxStatus::Idle => "server_check_query left a transaction open".into(),
            Ok(()) if self.marked(&held) || self.left_behind(&held.info) => {
                tracing::debug!(server = held.id, "marked for closing during its check: closed");
                return None;
            }
            Ok(()) => return Some(held.take()),
        };
        tracing::warn!(server = held.id, "server check failed, closing the connection: {failed}");
        None
    }

    /// A checkout whose connection is checked as for any loan, one failing its check
    /// being replaced; one clock for the whole wait (`query_wait_timeout`), which a
    /// failed check does not start again. For a login's round trips and the lookups.
    pub async fn checkout_checked(self: &Arc<Self>) -> Result<Box<ServerConn>, PoolError> {
        let (mut since, slot) = (None, WaitSlot::new());
        loop {
            let server = self.checkout_since(&mut since, &slot).await?;
            if !self.needs_check(&server) {
                return Ok(server);
            }
            if let Some(server) = Box::pin(self.checked(server)).await {
                return Ok(server);
            }
        }
    }
}
