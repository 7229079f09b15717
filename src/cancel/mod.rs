//! Cancel keys: every client gets a BackendKeyData from Sluice (in session mode with
//! the real server's process id, which notifications carry, but a secret of Sluice's,
//! so a client that has left cannot cancel the queries of the next client of that
//! server), registered here with the client and its pool. A CancelRequest is
//! forwarded only to the server that client is linked to when the request arrives,
//! found through the client's `server_id` and the pool's server list: linking and
//! unlinking a server (every transaction) touches nothing here.
//!
//! In a peered group (`peer_id`, `[peers]`) every key is random (in session mode too)
//! and its secret carries the id of the process that issued it, so that a cancel
//! request reaching another process of the group is forwarded to the right one
//! (`route`, `peers`).

mod peers;

pub use peers::{PeerPools, answer};

use std::collections::hash_map::Entry;
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;

use foldhash::HashMap;
use parking_lot::Mutex;

use crate::pool::Pool;
use crate::server::ServerAddr;
use crate::stats::{ClientInfo, ClientState, ServerInfo};

/// The server a client's cancel would go to right now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CancelTarget {
    pub addr: ServerAddr,
    /// The address the server's host name gave the connection (`ServerInfo::peer`).
    pub at: Option<std::net::SocketAddr>,
    pub pid: u32,
    pub secret: u32,
    /// How long forwarding it may take (`cancel_wait_timeout`; None: no limit).
    pub limit: Option<std::time::Duration>,
}

/// A cancel request being forwarded to a server: while it lives, that server is not
/// lent to another client.
#[derive(Debug)]
pub struct InFlight(Arc<ServerInfo>);

impl InFlight {
    /// The forwarding gave up: the server is closed rather than lent again
    /// (`ServerInfo::cancel_given_up`).
    pub fn given_up(&self) {
        self.0.cancel_given_up();
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.cancel_ended();
    }
}

/// Whose key it is: the client (its `server_id` names the linked server) and the pool
/// its servers come from.
#[derive(Clone, Debug)]
struct Owner {
    client: Arc<ClientInfo>,
    pool: Arc<Pool>,
}

#[derive(Debug, Default)]
pub struct CancelRegistry {
    map: Mutex<HashMap<(u32, u32), Owner>>,
    /// This process's `peer_id` (0: no peering), marked in each key it issues.
    peer_id: u16,
}

/// What a key's secret says in a peered group: the top 2 bits are the hops a forward
/// may still make (3 when issued: a group whose `[peers]` send a request round in
/// circles drops it after three), the next 14 the `peer_id` of the process whose key
/// it is; the low 16 bits are random. Read only when peering is on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Mark {
    pub peer: u16,
    pub hops: u8,
}

impl Mark {
    const PEER_BITS: u32 = 0x3fff << 16;
    const HOPS_SHIFT: u32 = 30;
    /// The hops a key is issued with (the most its two bits hold).
    const ISSUED_HOPS: u8 = 3;

    pub fn of(secret: u32) -> Mark {
        Mark { peer: ((secret & Self::PEER_BITS) >> 16) as u16, hops: (secret >> Self::HOPS_SHIFT) as u8 }
    }

    /// `secret` with this mark in place of its own.
    pub fn put(self, secret: u32) -> u32 {
        let peer = (u32::from(self.peer) << 16) & Self::PEER_BITS;
        (secret & 0xffff) | peer | (u32::from(self.hops & 3) << Self::HOPS_SHIFT)
    }
}

/// Where a cancel request goes (`CancelRegistry::route`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// The key is this process's (or peering is off).
    Here,
    /// Peer `id`'s key: forwarded to it with `secret`, one hop fewer marked.
    Peer { id: u16, secret: u32 },
    /// Another peer's key that has been forwarded three times already: dropped.
    Spent { id: u16 },
}

/// A registered key; unregisters itself when dropped.
#[derive(Debug)]
pub struct CancelKey {
    registry: Arc<CancelRegistry>,
    pub pid: u32,
    pub secret: u32,
    client_id: u64,
}

impl Drop for CancelKey {
    fn drop(&mut self) {
        if let Entry::Occupied(e) = self.registry.map.lock().entry((self.pid, self.secret))
            && e.get().client.id == self.client_id
        {
            e.remove();
        }
    }
}

impl CancelRegistry {
    /// A registry for a process with this `peer_id` (0: no peering).
    pub fn new(peer_id: u16) -> CancelRegistry {
        CancelRegistry { map: Mutex::default(), peer_id }
    }

    /// Whether this process is one of a peered group (`peer_id` set).
    pub fn peered(&self) -> bool {
        self.peer_id != 0
    }

    /// Where a cancel request with this secret goes.
    pub fn route(&self, secret: u32) -> Route {
        let mark = Mark::of(secret);
        match mark {
            _ if self.peer_id == 0 || mark.peer == self.peer_id => Route::Here,
            Mark { peer: id, hops: 0 } => Route::Spent { id },
            Mark { peer: id, hops } => Route::Peer { id, secret: Mark { peer: id, hops: hops - 1 }.put(secret) },
        }
    }

    /// A key registered nowhere (the admin console's): a cancel request with it reaches
    /// nothing, and in a peered group is not forwarded either.
    pub fn unlisted_key(&self) -> (u32, u32) {
        (rand::random::<u32>() & 0x7fff_ffff, self.fresh_secret())
    }

    /// A random secret, with this process's mark in a peered group.
    fn fresh_secret(&self) -> u32 {
        match self.peer_id {
            0 => rand::random(),
            peer => Mark { peer, hops: Mark::ISSUED_HOPS }.put(rand::random()),
        }
    }

    /// The secret as issued: a forwarded request's has fewer hops marked.
    fn as_issued(&self, secret: u32) -> u32 {
        match self.peer_id {
            0 => secret,
            _ => Mark { hops: Mark::ISSUED_HOPS, ..Mark::of(secret) }.put(secret),
        }
    }

    /// Registers a fresh random key for `client` (transaction and statement mode).
    pub fn register(self: &Arc<Self>, client: &Arc<ClientInfo>, pool: &Arc<Pool>) -> CancelKey {
        self.register_with_pid(None, client, pool)
    }

    /// A new key with a random secret, and the process id `pid` (session mode: the
    /// server's own) or, when that is None or 0 (a server that sent no key), a random one.
    /// In a peered group the pid is always random (as PgBouncer's keys are), so that the
    /// key holds 47 random bits beside the issuer's mark.
    pub fn register_with_pid(
        self: &Arc<Self>,
        pid: Option<u32>,
        client: &Arc<ClientInfo>,
        pool: &Arc<Pool>,
    ) -> CancelKey {
        let pid = pid.filter(|_| self.peer_id == 0);
        loop {
            let pid = pid.filter(|&p| p != 0).unwrap_or_else(|| rand::random::<u32>() & 0x7fff_ffff);
            let secret = self.fresh_secret();
            if pid == 0 {
                continue;
            }
            let owner = Owner { client: client.clone(), pool: pool.clone() };
            if let Entry::Vacant(v) = self.map.lock().entry((pid, secret)) {
                v.insert(owner);
                return CancelKey { registry: self.clone(), pid, secret, client_id: client.id };
            }
        }
    }

    /// Where a CancelRequest for this key should go: the server its client is linked
    /// to now, if any, and a guard that keeps that server from being lent to another
    /// client until the request has been forwarded (drop it then). A client waiting
    /// for a server is asked to cancel its request itself (None here).
    pub fn target(&self, pid: u32, secret: u32) -> Option<(CancelTarget, InFlight)> {
        let owner = self.map.lock().get(&(pid, self.as_issued(secret))).cloned()?;
        // SeqCst (covers the Acquire that makes the server's key, written at its login,
        // visible): see the re-checks below.
        let mut id = owner.client.server_id.load(SeqCst);
        if id == 0 {
            if owner.client.state() != ClientState::Waiting {
                return None; // idle: nothing to cancel
            }
            // The session stores `server_id` and then takes the request, both SeqCst:
            // either it sees the request, or this sees the server and takes the request
            // back. Exactly one acts on it.
            owner.client.request_cancel();
            id = owner.client.server_id.load(SeqCst);
            if id == 0 || !owner.client.take_cancel() {
                return None;
            }
        }
        let server = owner.pool.servers.get(id)?;
        server.cancel_started();
        let in_flight = InFlight(server);
        // Still linked after the mark? A session that gives the server back stores 0
        // first and then waits for marked cancels (`ServerInfo::cancels_settled`), so
        // either it sees this one or this sees its 0: the request never reaches the
        // server's next client.
        if owner.client.server_id.load(SeqCst) != id {
            return None;
        }
        let server = &in_flight.0;
        let (pid, secret) = server.cancel_key();
        let limit = owner.pool.settings().cancel_timeout;
        Some((CancelTarget { addr: server.addr.clone(), at: server.peer(), pid, secret, limit }, in_flight))
    }

    pub fn len(&self) -> usize {
        self.map.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::listener::Peer;
    use crate::stats::ServerInfo;
    use std::sync::atomic::Ordering::Release;

    fn pool() -> Arc<Pool> {
        let text = "[databases.db]\nhost = \"127.0.0.1\"\nport = 5\n[users.u]\npassword = \"p\"\n";
        let cfg = crate::config::Config::parse(text, std::path::Path::new("t.toml")).unwrap();
        let users = crate::auth::UserStore::from_config(&cfg).unwrap();
        crate::pool::Pools::default().get(&cfg, &users, "db", "u").unwrap()
    }

    /// The target of a key, the in-flight guard dropped at once.
    fn tgt(r: &CancelRegistry, pid: u32, secret: u32) -> Option<CancelTarget> {
        r.target(pid, secret).map(|(t, _)| t)
    }

    #[test]
    fn a_cancel_being_forwarded_holds_its_server() {
        let r = Arc::new(CancelRegistry::default());
        let (p, c) = (pool(), client(1));
        server(&p, 7, 9, 8);
        let k = r.register(&c, &p);
        c.server_id.store(7, Release);
        let info = p.servers.get(7).unwrap();
        let (_, in_flight) = r.target(k.pid, k.secret).unwrap();
        assert!(info.cancels_in_flight());
        drop(in_flight);
        assert!(!info.cancels_in_flight());
        // Unlinked: nothing is marked.
        c.server_id.store(0, Release);
        assert!(r.target(k.pid, k.secret).is_none());
        assert!(!info.cancels_in_flight());
    }

    fn client(id: u64) -> Arc<ClientInfo> {
        Arc::new(ClientInfo::new(id, "u", "db", &Peer::Unix, false))
    }

    /// A server connection of `pool` with backend key (`pid`, `secret`), as a pool
    /// lists it once logged in.
    fn server(pool: &Pool, id: u64, pid: u32, secret: u32) {
        let info = ServerInfo::new(id, ServerAddr { host: "h".into(), port: 1 });
        info.set_cancel_key(pid, secret);
        pool.servers.insert(id, Arc::new(info));
    }

    #[test]
    fn cancel_goes_to_the_linked_server_only() {
        let r = Arc::new(CancelRegistry::default());
        let (p, c) = (pool(), client(1));
        server(&p, 7, 9, 8);
        server(&p, 8, 19, 18);
        let k = r.register(&c, &p);
        assert_eq!(tgt(&r, k.pid, k.secret), None, "idle client");
        c.server_id.store(7, Release);
        let t = CancelTarget {
            addr: ServerAddr { host: "h".into(), port: 1 },
            at: None,
            pid: 9,
            secret: 8,
            limit: Some(std::time::Duration::from_secs(10)),
        };
        assert_eq!(tgt(&r, k.pid, k.secret), Some(t));
        assert_eq!(tgt(&r, k.pid, k.secret ^ 1), None, "wrong secret");
        c.server_id.store(8, Release);
        assert_eq!(tgt(&r, k.pid, k.secret).map(|t| t.pid), Some(19));
        p.servers.remove(8);
        assert_eq!(tgt(&r, k.pid, k.secret), None, "server closed meanwhile");
        c.server_id.store(0, Release);
        assert_eq!(tgt(&r, k.pid, k.secret), None, "unlinked");
        let (pid, secret) = (k.pid, k.secret);
        drop(k);
        c.server_id.store(7, Release);
        assert_eq!(tgt(&r, pid, secret), None, "key dropped");
        assert!(r.is_empty());
    }

    #[test]
    fn a_waiting_client_is_asked_to_cancel_its_request() {
        let r = Arc::new(CancelRegistry::default());
        let (p, c) = (pool(), client(1));
        server(&p, 7, 9, 8);
        let k = r.register(&c, &p);
        // Idle (between requests): nothing to cancel, nothing asked.
        c.set_state(ClientState::Idle);
        assert_eq!(tgt(&r, k.pid, k.secret), None);
        assert!(!c.take_cancel());
        // Waiting for a server: nothing forwarded, the session asked once.
        c.set_state(ClientState::Waiting);
        let woken = c.interrupts.load(SeqCst);
        assert_eq!(tgt(&r, k.pid, k.secret), None);
        assert!(c.interrupts.load(SeqCst) > woken, "the session was not woken");
        assert!(c.take_cancel());
        assert!(!c.take_cancel());
        // Linked (the state not updated yet): forwarded, the session not asked.
        c.server_id.store(7, SeqCst);
        assert_eq!(tgt(&r, k.pid, k.secret).map(|t| t.pid), Some(9));
        assert!(!c.take_cancel());
    }

    #[test]
    fn session_keys_share_the_pid_not_the_secret() {
        let r = Arc::new(CancelRegistry::default());
        let p = pool();
        let (c1, c2) = (client(1), client(2));
        server(&p, 3, 5, 6);
        let a = r.register_with_pid(Some(5), &c1, &p);
        let (old_pid, old_secret) = (a.pid, a.secret);
        drop(a);
        // The server's next client gets the same pid and another secret; the old key
        // reaches nothing.
        let b = r.register_with_pid(Some(5), &c2, &p);
        c2.server_id.store(3, Release);
        assert_eq!((b.pid, old_pid), (5, 5));
        assert_ne!(b.secret, old_secret);
        assert_eq!(tgt(&r, old_pid, old_secret), None);
        // A server that sent no key (pid 0): a random pid, not a loop for ever.
        assert_ne!(r.register_with_pid(Some(0), &c1, &p).pid, 0);
        assert_eq!(
            tgt(&r, b.pid, b.secret),
            Some(CancelTarget {
                addr: ServerAddr { host: "h".into(), port: 1 },
                at: None,
                pid: 5,
                secret: 6,
                limit: Some(std::time::Duration::from_secs(10))
            })
        );
        drop(b);
        assert!(r.is_empty());
    }

    #[test]
    fn peered_keys_carry_their_issuer_and_are_found_after_hops() {
        let r = Arc::new(CancelRegistry::new(5));
        let (p, c) = (pool(), client(1));
        server(&p, 7, 9, 8);
        c.server_id.store(7, Release);
        // Session mode's server pid is not used: the key is all random.
        let k = r.register_with_pid(Some(9), &c, &p);
        assert_ne!(k.pid, 9);
        assert_eq!(Mark::of(k.secret), Mark { peer: 5, hops: 3 });
        assert_eq!(r.route(k.secret), Route::Here);
        // Forwarded here by a peer (fewer hops left): still this process's key.
        let forwarded = Mark { peer: 5, hops: 1 }.put(k.secret);
        assert_eq!(r.route(forwarded), Route::Here);
        assert_eq!(tgt(&r, k.pid, forwarded).map(|t| t.pid), Some(9));
        assert_eq!(tgt(&r, k.pid, Mark { peer: 6, hops: 3 }.put(k.secret)), None, "another peer's bits");
        // Another peer's key: forwarded with one hop fewer, until none is left.
        let theirs = Mark { peer: 6, hops: 3 }.put(0xabcd);
        let Route::Peer { id: 6, secret } = r.route(theirs) else { panic!("{:?}", r.route(theirs)) };
        assert_eq!((Mark::of(secret), secret & 0xffff), (Mark { peer: 6, hops: 2 }, 0xabcd));
        assert_eq!(r.route(Mark { peer: 6, hops: 0 }.put(1)), Route::Spent { id: 6 });
        // Without peering the secret is only a secret.
        let plain = Arc::new(CancelRegistry::default());
        assert_eq!(plain.route(theirs), Route::Here);
        assert_eq!(plain.register_with_pid(Some(9), &c, &p).pid, 9);
    }

    #[test]
    fn marks_round_trip() {
        for (peer, hops) in [(1, 3), (16383, 0), (8191, 2)] {
            let m = Mark { peer, hops };
            assert_eq!(Mark::of(m.put(u32::MAX)), m);
            assert_eq!(m.put(u32::MAX) & 0xffff, 0xffff);
        }
    }
}
