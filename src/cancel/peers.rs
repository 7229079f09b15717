//! Answering a CancelRequest: forwarded to the server of the client whose key it is,
//! or, in a peered group, to the Sluice that issued the key (PgBouncer's peering: a
//! TCP load balancer or `so_reuseport` may hand the request's connection to any
//! process of the group).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use super::Route;
use crate::app::App;
use crate::config::secs;
use crate::server::ServerAddr;

/// Forwards the cancel request for key (`pid`, `secret`) and returns once it has been
/// processed (the connection it came on then closes: libpq waits for that close
/// before it takes the cancel as delivered), or dropped.
pub async fn answer(app: &Arc<App>, pid: u32, secret: u32) {
    match app.cancel.route(secret) {
        Route::Here => here(app, pid, secret).await,
        Route::Peer { id, secret } => app.peer_pools.forward(app, id, pid, secret).await,
        // Debug, as any connection can send any key: not a log line per request.
        Route::Spent { id } => debug!(
            "cancel request for peer {id} dropped: it was forwarded three times already \
             (does each [peers] entry reach the process with its id?)"
        ),
    }
}

/// A key of this process: to the server its client is linked to, if any. Accepted in
/// plaintext whatever the TLS mode (libpq before 17 never encrypts cancel requests),
/// in any phase once read. (While Sluice drains its listeners are closed, as
/// PgBouncer's are, but for a peered process's Unix socket, which then takes cancel
/// requests only: `app::accept_loop`.) The server stays with its client until the
/// request is processed: the forwarding is a task of its own holding that guard, so a
/// `client_login_timeout` shorter than the forwarding's own bound
/// (`cancel_wait_timeout`) ends the request's connection, not the guard.
async fn here(app: &Arc<App>, pid: u32, secret: u32) {
    let Some((t, in_flight)) = app.cancel.target(pid, secret) else { return };
    let forward = tokio::spawn(async move {
        if let Err(e) = t.addr.cancel(t.at, t.pid, t.secret, t.limit).await {
            in_flight.given_up();
            warn!("forwarding cancel request to {} failed: {e}", t.addr);
        }
        drop(in_flight);
    });
    let _ = forward.await;
}

/// The cancel requests being forwarded to each peer (SHOW PEER_POOLS), at most its
/// `pool_size` at once.
#[derive(Debug, Default)]
pub struct PeerPools {
    pools: Mutex<BTreeMap<u16, Arc<PeerPool>>>,
}

#[derive(Debug)]
struct PeerPool {
    /// The slots it has now (`pool_size`; a reload resizes it in place).
    size: AtomicUsize,
    slots: Arc<Semaphore>,
    /// Requests waiting for a slot.
    waiting: AtomicUsize,
    /// Requests being forwarded (each on a connection of its own).
    active: AtomicUsize,
}

/// Counts one in `n` while it lives.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(n: &'a AtomicUsize) -> Self {
        n.fetch_add(1, Relaxed);
        Counted(n)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Relaxed);
    }
}

impl PeerPools {
    /// Peer `id`'s pool, with `size` slots (a changed `pool_size` resizes it: slots
    /// added at once, slots taken away as they come free).
    fn pool(&self, id: u16, size: usize) -> Arc<PeerPool> {
        // (u32: what acquire_many takes; far below the semaphore's maximum, so slots added
        // before a shrink's debt is paid cannot overflow it.)
        let size = size.min(u32::MAX as usize);
        let mut pools = self.pools.lock();
        let pool = pools.entry(id).or_insert_with(|| {
            let (size, slots) = (AtomicUsize::new(size), Arc::new(Semaphore::new(size)));
            Arc::new(PeerPool { size, slots, waiting: AtomicUsize::new(0), active: AtomicUsize::new(0) })
        });
        let had = pool.size.swap(size, Relaxed);
        if size > had {
            pool.slots.add_permits(size - had);
        } else if size < had {
            let owed = (had - size) - pool.slots.forget_permits(had - size);
            if let Ok(owed) = u32::try_from(owed)
                && owed > 0
            {
                let slots = pool.slots.clone();
                tokio::spawn(async move { slots.acquire_many_owned(owed).await.map(|p| p.forget()) });
            }
        }
        pool.clone()
    }

    /// (waiting, being forwarded) requests for peer `id`.
    pub fn counts(&self, id: u16) -> (usize, usize) {
        self.pools.lock().get(&id).map_or((0, 0), |p| (p.waiting.load(Relaxed), p.active.load(Relaxed)))
    }

    /// Sends the request to peer `id` as a CancelRequest of its own, waiting for a
    /// slot and then for the peer to close the connection (it does once it has
    /// processed the request), all within `cancel_wait_timeout`.
    async fn forward(&self, app: &App, id: u16, pid: u32, secret: u32) {
        let cfg = app.config.load();
        let Some(peer) = cfg.peers.get(&id) else {
            debug!("cancel request for peer {id} dropped: [peers] has no entry {id}");
            return;
        };
        let addr = ServerAddr { host: peer.host.as_str().into(), port: peer.port };
        let (pool, limit) = (self.pool(id, peer.slots(&cfg.general)), secs(cfg.general.cancel_wait_timeout));
        drop(cfg);
        let send = async {
            let _slot = {
                let _waiting = Counted::new(&pool.waiting);
                pool.slots.acquire().await.map_err(std::io::Error::other)?
            };
            let _active = Counted::new(&pool.active);
            addr.cancel(None, pid, secret, None).await
        };
        let sent = match limit {
            Some(limit) => tokio::time::timeout(limit, send).await.unwrap_or_else(|_| {
                Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "not through within cancel_wait_timeout"))
            }),
            None => send.await,
        };
        match sent {
            Ok(()) => debug!("cancel request forwarded to peer {id} ({addr})"),
            // Debug too: any connection can send a key of a peer that is down.
            Err(e) => debug!("forwarding cancel request to peer {id} ({addr}) failed: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_resized_peer_pool_keeps_its_slots_count_right() {
        let pools = PeerPools::default();
        let p = pools.pool(1, 2);
        let (a, b) = (p.slots.acquire().await.unwrap(), p.slots.acquire().await.unwrap());
        // Down to one while both are taken: in place, a slot taken away once one frees.
        assert!(Arc::ptr_eq(&p, &pools.pool(1, 1)));
        for _ in 0..3 {
            tokio::task::yield_now().await;
        }
        drop(a);
        assert_eq!(p.slots.available_permits(), 0, "the freed slot was not taken away");
        drop(b);
        assert_eq!(p.slots.available_permits(), 1);
        pools.pool(1, 3);
        assert_eq!(p.slots.available_permits(), 3, "slots added at once");
        assert_eq!(pools.pool(2, usize::MAX).slots.available_permits(), u32::MAX as usize);
        assert_eq!(pools.counts(1), (0, 0));
    }
}
