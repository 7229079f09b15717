//! Counters and latency histograms per pool, and the live registries of clients and
//! server connections with their states: what the admin console, the metrics endpoint
//! and the live view read. Updated with relaxed atomics, once per transaction or state
//! change, never per message.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU32, AtomicU64, Ordering::Relaxed, Ordering::SeqCst};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;

/// Upper bounds of the latency buckets, in microseconds (the last bucket is +Inf).
pub const BUCKETS_US: [u64; 20] = [
    50, 100, 200, 300, 500, 750, 1_000, 2_000, 3_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 500_000,
    1_000_000, 2_000_000, 5_000_000, 10_000_000,
];

/// A fixed-bucket latency histogram (Prometheus-style, cumulative on export).
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    pub fn observe(&self, d: Duration) {
        let us = d.as_micros().min(u64::MAX as u128) as u64;
        let i = BUCKETS_US.iter().position(|&b| us <= b).unwrap_or(BUCKETS_US.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_us.fetch_add(us, Relaxed);
    }

    /// Per-bucket counts (not cumulative), the sum in µs and the count. The count is
    /// the buckets' total as read (an observation under way may be in one and not yet
    /// in the other): Prometheus wants `_count` equal to the `+Inf` bucket, and a
    /// quantile's rank must fall within the buckets.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let buckets: Vec<u64> = self.buckets.iter().map(|b| b.load(Relaxed)).collect();
        HistogramSnapshot { count: buckets.iter().sum(), buckets, sum_us: self.sum_us.load(Relaxed) }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    pub buckets: Vec<u64>,
    pub sum_us: u64,
    pub count: u64,
}

impl HistogramSnapshot {
    /// Observations since `earlier` (for windows such as "the last minute").
    pub fn since(&self, earlier: &HistogramSnapshot) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: self
                .buckets
                .iter()
                .zip(earlier.buckets.iter().chain(std::iter::repeat(&0)))
                .map(|(a, b)| a - b.min(a))
                .collect(),
            sum_us: self.sum_us.saturating_sub(earlier.sum_us),
            count: self.count.saturating_sub(earlier.count),
        }
    }

    /// The q-quantile in µs, interpolated linearly inside its bucket; 0 when empty.
    pub fn quantile(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = (q.clamp(0.0, 1.0) * self.count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            if n > 0 && seen + n >= rank {
                let lo = if i == 0 { 0 } else { BUCKETS_US[i - 1] };
                // the last bucket is open-ended: report its lower bound
                let hi = BUCKETS_US.get(i).copied().unwrap_or(lo);
                let frac = (rank - seen) as f64 / n as f64;
                return lo + ((hi - lo) as f64 * frac) as u64;
            }
            seen += n;
        }
        *BUCKETS_US.last().unwrap()
    }
}

/// Totals of one pool since start (PgBouncer's SHOW STATS columns, and more).
#[derive(Debug, Default)]
pub struct PoolStats {
    pub server_assignment_count: AtomicU64,
    pub xact_count: AtomicU64,
    pub query_count: AtomicU64,
    /// Bytes received from clients (and forwarded to servers).
    pub received: AtomicU64,
    /// Bytes sent to clients.
    pub sent: AtomicU64,
    pub xact_time_us: AtomicU64,
    pub query_time_us: AtomicU64,
    pub wait_time_us: AtomicU64,
    pub client_parse_count: AtomicU64,
    pub server_parse_count: AtomicU64,
    pub bind_count: AtomicU64,
    pub prepared_hits: AtomicU64,
    pub prepared_misses: AtomicU64,
    pub server_connects: AtomicU64,
    pub server_connect_failures: AtomicU64,
    pub xact_hist: Histogram,
    pub query_hist: Histogram,
    pub wait_hist: Histogram,
    pub connect_hist: Histogram,
    /// ErrorResponses from servers by SQLSTATE class (first two characters).
    pub errors: Mutex<HashMap<String, u64>>,
}

impl PoolStats {
    /// Adds `from`'s SHOW STATS counters to these (a dropped pool's, kept for its
    /// database: `Pools::retired`).
    pub fn fold(&self, from: &PoolStats) {
        let pairs = [
            (&self.server_assignment_count, &from.server_assignment_count),
            (&self.xact_count, &from.xact_count),
            (&self.query_count, &from.query_count),
            (&self.received, &from.received),
            (&self.sent, &from.sent),
            (&self.xact_time_us, &from.xact_time_us),
            (&self.query_time_us, &from.query_time_us),
            (&self.wait_time_us, &from.wait_time_us),
            (&self.client_parse_count, &from.client_parse_count),
            (&self.server_parse_count, &from.server_parse_count),
            (&self.bind_count, &from.bind_count),
        ];
        for (to, from) in pairs {
            to.fetch_add(from.load(Relaxed), Relaxed);
        }
    }
}

/// What one linked exchange adds to the pool's totals, flushed when it ends.
#[derive(Debug, Default, Clone, Copy)]
pub struct ExchangeStats {
    pub queries: u64,
    pub query_time_us: u64,
    pub received: u64,
    pub sent: u64,
    pub client_parses: u64,
    pub server_parses: u64,
    pub binds: u64,
    pub prepared_hits: u64,
}

impl PoolStats {
    pub fn add(&self, e: &ExchangeStats) {
        self.query_count.fetch_add(e.queries, Relaxed);
        self.query_time_us.fetch_add(e.query_time_us, Relaxed);
        self.received.fetch_add(e.received, Relaxed);
        self.sent.fetch_add(e.sent, Relaxed);
        self.client_parse_count.fetch_add(e.client_parses, Relaxed);
        self.server_parse_count.fetch_add(e.server_parses, Relaxed);
        self.bind_count.fetch_add(e.binds, Relaxed);
        self.prepared_hits.fetch_add(e.prepared_hits, Relaxed);
        self.prepared_misses.fetch_add(e.server_parses, Relaxed);
    }

    pub fn transaction(&self, d: Duration) {
        self.xact_count.fetch_add(1, Relaxed);
        self.xact_time_us.fetch_add(d.as_micros() as u64, Relaxed);
        self.xact_hist.observe(d);
    }

    pub fn waited(&self, d: Duration) {
        self.server_assignment_count.fetch_add(1, Relaxed);
        self.wait_time_us.fetch_add(d.as_micros() as u64, Relaxed);
        self.wait_hist.observe(d);
    }

    /// Counts a server's ErrorResponse by its SQLSTATE class; a class PostgreSQL does
    /// not define (a client can raise any code: `RAISE ... USING ERRCODE`) counts as
    /// `other`, so clients cannot add label values at will.
    pub fn error(&self, sqlstate: &str) {
        let class = sqlstate.get(..2).filter(|c| SQLSTATE_CLASSES.contains(c)).unwrap_or("other");
        *self.errors.lock().entry(class.to_string()).or_default() += 1;
    }
}

/// PostgreSQL's SQLSTATE classes (its errcodes.txt).
const SQLSTATE_CLASSES: [&str; 44] = [
    "00", "01", "02", "03", "08", "09", "0A", "0B", "0F", "0L", "0P", "0Z", "10", "20", "21", "22", "23", "24", "25",
    "26", "27", "28", "2B", "2D", "2F", "34", "38", "39", "3B", "3D", "3F", "40", "42", "44", "53", "54", "55", "57",
    "58", "72", "F0", "HV", "P0", "XX",
];

/// Microseconds since the Unix epoch.
pub fn now_us() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as u64).unwrap_or(0)
}

/// A client's state as the admin console shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ClientState {
    Login = 0,
    Idle = 1,
    Waiting = 2,
    Active = 3,
}

/// A connected client, as listed by SHOW CLIENTS.
#[derive(Debug)]
pub struct ClientInfo {
    pub id: u64,
    pub user: String,
    pub database: String,
    /// A client of the admin console (decided by the config its login read: a later
    /// rename of `admin_database` does not turn it into a pooled client, nor the reverse).
    pub console: bool,
    /// Where the client connected from; formatted only when shown.
    pub peer: crate::net::listener::Peer,
    pub connect_time_us: u64,
    pub application_name: Mutex<String>,
    pub tls: bool,
    state: AtomicU8,
    /// When the current request or wait began (µs since epoch).
    pub request_time_us: AtomicU64,
    /// The id of the linked server connection, 0 when none. A CancelRequest for this
    /// client goes to that server (`cancel`): stored with SeqCst when a server is
    /// linked (paired with a cancel request for a waiting client) and when it is given
    /// back (paired with the cancel's in-flight mark).
    pub server_id: AtomicU64,
    pub prepared_statements: AtomicU64,
    /// Wakes the session: the console killed it (`killed`), or the pooler's phase
    /// changed. `interrupts` counts the wake-ups (see `client::interrupt`).
    pub interrupt: tokio::sync::Notify,
    pub interrupts: AtomicU64,
    /// Set by the console (KILL_CLIENT, KILL db): the session ends at once.
    pub killed: std::sync::atomic::AtomicBool,
    /// A CancelRequest came while the client waited for a server: its session answers
    /// the request instead of sending it (`cancel::CancelRegistry::target`).
    cancel_pending: std::sync::atomic::AtomicBool,
}

impl ClientInfo {
    pub fn new(id: u64, user: &str, database: &str, peer: &crate::net::listener::Peer, tls: bool) -> Self {
        let now = now_us();
        ClientInfo {
            id,
            user: user.to_string(),
            database: database.to_string(),
            console: false,
            peer: peer.clone(),
            connect_time_us: now,
            application_name: Mutex::new(String::new()),
            tls,
            state: AtomicU8::new(ClientState::Login as u8),
            request_time_us: AtomicU64::new(now),
            server_id: AtomicU64::new(0),
            prepared_statements: AtomicU64::new(0),
            interrupt: tokio::sync::Notify::new(),
            interrupts: AtomicU64::new(0),
            killed: Default::default(),
            cancel_pending: Default::default(),
        }
    }

    /// Marked as a client of the admin console (see `console`).
    pub fn on_console(self, console: bool) -> Self {
        ClientInfo { console, ..self }
    }

    /// Past its login (state other than `Login`): what SHOW DATABASES, USERS and
    /// LISTS count as a client.
    pub fn logged_in(&self) -> bool {
        self.state() != ClientState::Login
    }

    pub fn state(&self) -> ClientState {
        match self.state.load(Relaxed) {
            1 => ClientState::Idle,
            2 => ClientState::Waiting,
            3 => ClientState::Active,
            _ => ClientState::Login,
        }
    }

    pub fn set_state(&self, s: ClientState) {
        self.set_state_at(s, crate::clock::coarse_wall_us());
    }

    /// `set_state` with the time (µs since the epoch) already read.
    pub fn set_state_at(&self, s: ClientState, now_us: u64) {
        self.state.store(s as u8, Relaxed);
        self.request_time_us.store(now_us, Relaxed);
    }

    /// Asks the session to end (admin KILL).
    pub fn kill(&self) {
        self.killed.store(true, Relaxed);
        self.wake();
    }

    /// Wakes the session to look at its `killed` flag and the pooler's phase.
    pub fn wake(&self) {
        self.interrupts.fetch_add(1, std::sync::atomic::Ordering::Release);
        self.interrupt.notify_one();
    }

    pub fn is_killed(&self) -> bool {
        self.killed.load(Relaxed)
    }

    /// Asks the session to cancel the request it waits with (a CancelRequest while it
    /// waits for a server). SeqCst, like `take_cancel` and the session's store of
    /// `server_id`: see `cancel::CancelRegistry::target`.
    pub fn request_cancel(&self) {
        self.cancel_pending.store(true, SeqCst);
        self.wake();
    }

    /// Whether a cancel request waits to be taken (`take_cancel`).
    pub fn cancel_requested(&self) -> bool {
        self.cancel_pending.load(SeqCst)
    }

    /// Takes a cancel request: true for the one caller that acts on it.
    pub fn take_cancel(&self) -> bool {
        // A plain load first: nearly always false, and then no locked instruction.
        self.cancel_requested() && self.cancel_pending.swap(false, SeqCst)
    }
}

/// A server connection's state as the admin console shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ServerState {
    Login = 0,
    Idle = 1,
    Active = 2,
}

/// A server connection, as listed by SHOW SERVERS.
#[derive(Debug)]
pub struct ServerInfo {
    pub id: u64,
    pub addr: crate::server::ServerAddr,
    /// The address a host name gave this connection (unset for an IP address or a Unix
    /// socket): SHOW SERVERS shows it, and a cancel goes there.
    peer: std::sync::OnceLock<std::net::SocketAddr>,
    /// The server's backend key (BackendKeyData), 0 until it has logged in.
    pid: AtomicU32,
    secret: AtomicU32,
    pub connect_time_us: u64,
    /// The pool's RECONNECT generation when this connection was begun (`Pool::reconnect`).
    pub generation: AtomicU64,
    state: AtomicU8,
    pub request_time_us: AtomicU64,
    /// The linked client's id, 0 when none.
    pub client_id: AtomicU64,
    pub prepared_statements: AtomicU64,
    /// Cancel requests being forwarded to this server (`cancel::InFlight`), and
    /// `CANCEL_UNSURE` once one was given up.
    cancels: AtomicU32,
    cancels_done: tokio::sync::Notify,
}

/// `ServerInfo::cancels`' mark of a cancel given up.
const CANCEL_UNSURE: u32 = 1 << 31;

impl ServerInfo {
    pub fn new(id: u64, addr: crate::server::ServerAddr) -> Self {
        ServerInfo {
            id,
            addr,
            peer: std::sync::OnceLock::new(),
            pid: AtomicU32::new(0),
            secret: AtomicU32::new(0),
            connect_time_us: now_us(),
            generation: AtomicU64::new(0),
            state: AtomicU8::new(ServerState::Login as u8),
            request_time_us: AtomicU64::new(now_us()),
            client_id: AtomicU64::new(0),
            prepared_statements: AtomicU64::new(0),
            cancels: AtomicU32::new(0),
            cancels_done: tokio::sync::Notify::new(),
        }
    }

    /// Records the address a host name gave the connection (before its login).
    pub fn set_peer(&self, at: std::net::SocketAddr) {
        let _ = self.peer.set(at);
    }

    /// The address a host name gave the connection; None for an IP address or a Unix
    /// socket (`addr` says where it goes).
    pub fn peer(&self) -> Option<std::net::SocketAddr> {
        self.peer.get().copied()
    }

    /// Records the backend key (the server's BackendKeyData at login). Published to a
    /// cancel by the linking session's Release store of its `server_id` (see `cancel`).
    pub fn set_cancel_key(&self, pid: u32, secret: u32) {
        self.pid.store(pid, Relaxed);
        self.secret.store(secret, Relaxed);
    }

    /// The backend key: (pid, secret).
    pub fn cancel_key(&self) -> (u32, u32) {
        (self.pid.load(Relaxed), self.secret.load(Relaxed))
    }

    /// A cancel request for this server is being forwarded. SeqCst, with the client's
    /// `server_id` read after it (`cancel::CancelRegistry::target`): a session that
    /// stores 0 there and then finds no cancel in flight can lend the server on.
    pub fn cancel_started(&self) {
        self.cancels.fetch_add(1, SeqCst);
    }

    /// A forwarded cancel request was processed by the server (or given up).
    pub fn cancel_ended(&self) {
        if self.cancels.fetch_sub(1, SeqCst) & !CANCEL_UNSURE == 1 {
            self.cancels_done.notify_waiters();
        }
    }

    /// The forwarding of a cancel request gave up (timed out, or failed after its
    /// connection may have carried it): it may still reach what the server runs
    /// next. Marked before the request's `cancel_ended`.
    pub fn cancel_given_up(&self) {
        self.cancels.fetch_or(CANCEL_UNSURE, SeqCst);
    }

    /// Whether cancel requests for this server are being forwarded, or one was given
    /// up (read after the session stored 0 in its client's `server_id`): one load, as
    /// every transaction's end reads it.
    pub fn cancels_in_flight(&self) -> bool {
        self.cancels.load(SeqCst) > 0
    }

    /// Whether a cancel request for this server was given up (`cancel_given_up`).
    pub fn cancel_unsure(&self) -> bool {
        self.cancels.load(SeqCst) & CANCEL_UNSURE != 0
    }

    /// Waits until no cancel request for this server is being forwarded.
    pub async fn cancels_settled(&self) {
        loop {
            let done = self.cancels_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.cancels.load(SeqCst) & !CANCEL_UNSURE == 0 {
                return;
            }
            done.await;
        }
    }

    pub fn state(&self) -> ServerState {
        match self.state.load(Relaxed) {
            1 => ServerState::Idle,
            2 => ServerState::Active,
            _ => ServerState::Login,
        }
    }

    pub fn set_state(&self, s: ServerState, client_id: u64) {
        self.set_state_at(s, client_id, crate::clock::coarse_wall_us());
    }

    /// `set_state` with the time (µs since the epoch) already read.
    pub fn set_state_at(&self, s: ServerState, client_id: u64, now_us: u64) {
        self.state.store(s as u8, Relaxed);
        self.client_id.store(client_id, Relaxed);
        self.request_time_us.store(now_us, Relaxed);
    }
}

/// Live entries by id; an entry is removed when its guard drops.
#[derive(Debug)]
pub struct Registry<T> {
    map: Mutex<foldhash::HashMap<u64, Arc<T>>>,
}

impl<T> Default for Registry<T> {
    fn default() -> Self {
        Registry { map: Mutex::new(Default::default()) }
    }
}

impl<T> Registry<T> {
    pub fn insert(&self, id: u64, v: Arc<T>) {
        self.map.lock().insert(id, v);
    }

    pub fn remove(&self, id: u64) {
        self.map.lock().remove(&id);
    }

    pub fn get(&self, id: u64) -> Option<Arc<T>> {
        self.map.lock().get(&id).cloned()
    }

    /// A snapshot, sorted by id.
    pub fn list(&self) -> Vec<Arc<T>> {
        let mut v: Vec<(u64, Arc<T>)> = self.map.lock().iter().map(|(k, v)| (*k, v.clone())).collect();
        v.sort_by_key(|(k, _)| *k);
        v.into_iter().map(|(_, v)| v).collect()
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

    /// Error classes are PostgreSQL's; any other a client raises counts as `other`.
    #[test]
    fn errors_count_by_known_class() {
        let stats = PoolStats::default();
        for code in ["42P01", "42703", "Q1000", "AB123", "57014", "", "10608"] {
            stats.error(code);
        }
        let counts = stats.errors.lock().clone();
        let want = [("42", 2), ("57", 1), ("10", 1), ("other", 3)].map(|(c, n)| (c.to_string(), n));
        assert_eq!(counts, std::collections::HashMap::from(want));
    }

    /// A session giving a server back waits for the cancels in flight, and is woken
    /// when the last one ends; one given up marks the server for good.
    #[tokio::test]
    async fn cancels_settled_waits_for_the_last_cancel() {
        let info = Arc::new(ServerInfo::new(1, crate::server::ServerAddr { host: "h".into(), port: 1 }));
        info.cancels_settled().await;
        assert!(!info.cancels_in_flight() && !info.cancel_unsure());
        info.cancel_started();
        info.cancel_started();
        info.cancel_started();
        info.cancel_given_up();
        info.cancel_ended();
        let waiting = tokio::spawn({
            let info = info.clone();
            async move { info.cancels_settled().await }
        });
        tokio::task::yield_now().await;
        info.cancel_ended();
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "done with a cancel still in flight");
        info.cancel_ended();
        tokio::time::timeout(Duration::from_secs(5), waiting).await.expect("woken").unwrap();
        info.cancels_settled().await;
        assert!(info.cancels_in_flight() && info.cancel_unsure(), "the given-up cancel forgotten");
    }

    #[test]
    fn histogram_quantiles() {
        let h = Histogram::default();
        for _ in 0..90 {
            h.observe(Duration::from_micros(80));
        }
        for _ in 0..10 {
            h.observe(Duration::from_millis(40));
        }
        let s = h.snapshot();
        assert_eq!(s.count, 100);
        let p50 = s.quantile(0.5);
        assert!((50..=100).contains(&p50), "{p50}");
        let p99 = s.quantile(0.99);
        assert!((20_000..=50_000).contains(&p99), "{p99}");
        assert_eq!(HistogramSnapshot::default().quantile(0.5), 0);
        let later = {
            h.observe(Duration::from_secs(30));
            h.snapshot()
        };
        let d = later.since(&s);
        assert_eq!(d.count, 1);
        assert_eq!(d.quantile(0.5), 10_000_000);
    }

    #[test]
    fn registry_lists_sorted() {
        let r: Registry<u32> = Registry::default();
        r.insert(2, Arc::new(20));
        r.insert(1, Arc::new(10));
        assert_eq!(r.list().iter().map(|v| **v).collect::<Vec<_>>(), vec![10, 20]);
        r.remove(1);
        assert_eq!(r.len(), 1);
    }
}
