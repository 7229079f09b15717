//! The check before a loan (`server_check_delay`): a connection idle that long must
//! answer an empty query before it is lent.

use std::sync::Arc;

use super::{Borrowed, Pool, PoolError, WaitSlot};
use crate::server::ServerConn;

impl Pool {
    /// Whether `s` must pass a check before it is lent: idle for `server_check_delay`.
    pub fn needs_check(&self, s: &ServerConn) -> bool {
        s.last_used.elapsed() >= self.settings.load().check_delay
    }

    /// The check before a loan: `server` back once an empty query shows it alive; None
    /// when it fails, and the server is closed (also when the caller is dropped during
    /// the round trip: its slot is freed).
    pub async fn checked(&self, server: Box<ServerConn>) -> Option<Box<ServerConn>> {
        let mut held = Borrowed::new(self, server);
        held.exec("", self.internal_timeout()).await.ok()?;
        Some(held.take())
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
