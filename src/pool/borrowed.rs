//! A server connection lent outside the relay, for a login's round trips, and one
//! being opened, listed while it logs in.

use super::Pool;
use crate::server::ServerConn;

/// A server connection lent for a login's round trips (checking settings, a
/// session-mode login): closed and its slot freed if the holder is dropped before it
/// hands the connection on (`take`) or back (`checkin`), e.g. by `client_login_timeout`
/// or a client that left before its login reply.
pub struct Borrowed<'a> {
    pool: &'a Pool,
    server: Option<Box<ServerConn>>,
}

impl<'a> Borrowed<'a> {
    pub fn new(pool: &'a Pool, server: Box<ServerConn>) -> Self {
        Borrowed { pool, server: Some(server) }
    }

    /// Hands the connection on; the holder now answers for it.
    pub fn take(mut self) -> Box<ServerConn> {
        self.server.take().expect("a borrowed server")
    }

    pub fn checkin(self) {
        self.pool.checkin(self.take());
    }

    /// The pool the connection belongs to.
    pub fn pool(&self) -> &'a Pool {
        self.pool
    }
}

impl std::ops::Deref for Borrowed<'_> {
    type Target = ServerConn;
    fn deref(&self) -> &ServerConn {
        self.server.as_ref().expect("a borrowed server")
    }
}

impl std::ops::DerefMut for Borrowed<'_> {
    fn deref_mut(&mut self) -> &mut ServerConn {
        self.server.as_mut().expect("a borrowed server")
    }
}

impl Drop for Borrowed<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.server.take() {
            self.pool.discard(s);
        }
    }
}

/// A server connection being opened, listed in its pool's `servers` (SHOW SERVERS, state
/// `new`): unlisted again when the connect fails or is dropped, unless `keep` says it
/// logged in.
pub(super) struct Opening<'a> {
    pool: &'a Pool,
    id: u64,
}

impl<'a> Opening<'a> {
    pub(super) fn list(pool: &'a Pool, info: std::sync::Arc<crate::stats::ServerInfo>) -> Self {
        let id = info.id;
        pool.servers.insert(id, info);
        Opening { pool, id }
    }

    pub(super) fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Opening<'_> {
    fn drop(&mut self) {
        self.pool.servers.remove(self.id);
        // WAIT_CLOSE counts a connection being opened when RECONNECT marked it.
        self.pool.notify_changed();
    }
}
