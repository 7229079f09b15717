//! Pools of server connections keyed by (database, server user): an idle stack, a
//! FIFO queue of waiting clients with direct hand-off of a returning connection to
//! the oldest waiter, per-database and per-user connection limits, and the janitor
//! step that retires old connections and keeps `min_pool_size` open.

mod limit;
mod registry;

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tokio::sync::oneshot;

use crate::auth::ServerLogin;
use crate::config::PoolMode;
use crate::server::{ServerConn, ServerError, ServerTarget, connect};

pub use limit::ConnLimit;

/// (name, value) pairs as a server reports them.
pub type ParamList = Vec<(String, String)>;
pub use registry::{PoolKey, Pools};

/// Settings of one pool, replaced as a whole on reload.
#[derive(Debug, Clone)]
pub struct PoolSettings {
    pub target: ServerTarget,
    pub login: Arc<ServerLogin>,
    pub mode: PoolMode,
    pub size: usize,
    pub min_size: usize,
    pub lifetime: Option<Duration>,
    pub idle_timeout: Option<Duration>,
    pub connect_timeout: Option<Duration>,
    pub wait_timeout: Option<Duration>,
    pub check_delay: Option<Duration>,
    pub reset_query: String,
    pub reset_query_always: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("query_wait_timeout: no server connection became free in time")]
    WaitTimeout,
    #[error("server connection failed: {0}")]
    Connect(ServerError),
    #[error("database is shutting down or was removed")]
    Closed,
}

#[derive(Default, Debug)]
struct Inner {
    idle: Vec<ServerConn>,
    waiters: VecDeque<oneshot::Sender<ServerConn>>,
    /// Open plus connecting server connections.
    total: usize,
    connecting: usize,
    closed: bool,
}

#[allow(clippy::large_enum_variant)] // built and matched at once, never stored
enum Next {
    Take(ServerConn),
    Connect,
    Wait(oneshot::Receiver<ServerConn>),
}

/// Counts of the pool's connections for logs and the admin console.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolCounts {
    pub idle: usize,
    pub total: usize,
    pub waiting: usize,
    pub connecting: usize,
}

#[derive(Debug)]
pub struct Pool {
    pub key: PoolKey,
    settings: ArcSwap<PoolSettings>,
    inner: Mutex<Inner>,
    db_limit: Arc<ConnLimit>,
    user_limit: Arc<ConnLimit>,
    /// ParameterStatus values of a fresh server connection: what clients are told at
    /// login before any server is lent to them.
    defaults: Mutex<Option<Arc<ParamList>>>,
    /// Server spellings of client-supplied setting values already proven valid.
    canonical: Mutex<std::collections::HashMap<(String, String), String>>,
}

impl Pool {
    pub fn new(key: PoolKey, settings: PoolSettings, db_limit: Arc<ConnLimit>, user_limit: Arc<ConnLimit>) -> Self {
        Pool {
            key,
            settings: ArcSwap::from_pointee(settings),
            inner: Mutex::new(Inner::default()),
            db_limit,
            user_limit,
            defaults: Mutex::new(None),
            canonical: Mutex::new(Default::default()),
        }
    }

    pub fn settings(&self) -> Arc<PoolSettings> {
        self.settings.load_full()
    }

    /// Applies reloaded settings. Connections to a changed server address or user are
    /// retired as they come back; idle ones are also closed when `server_tls_sslmode`
    /// changed (new certificates alone keep existing connections).
    pub fn update(&self, settings: PoolSettings) {
        let old = self.settings.swap(Arc::new(settings));
        let new = self.settings.load();
        let moved = old.target.addr != new.target.addr || old.target.database != new.target.database;
        if moved {
            *self.defaults.lock() = None;
            self.canonical.lock().clear();
        }
        if moved || old.target.tls.mode != new.target.tls.mode {
            let idle = std::mem::take(&mut self.inner.lock().idle);
            for s in idle {
                self.discard(s);
            }
        }
        self.wake_waiters();
    }

    pub fn counts(&self) -> PoolCounts {
        let i = self.inner.lock();
        PoolCounts { idle: i.idle.len(), total: i.total, waiting: i.waiters.len(), connecting: i.connecting }
    }

    pub fn defaults(&self) -> Option<Arc<ParamList>> {
        self.defaults.lock().clone()
    }

    pub fn canonical(&self, name: &str, value: &str) -> Option<String> {
        self.canonical.lock().get(&(name.to_string(), value.to_string())).cloned()
    }

    pub fn learn_canonical(&self, name: &str, value: &str, canonical: &str) {
        let mut c = self.canonical.lock();
        if c.len() < 10_000 {
            c.insert((name.to_string(), value.to_string()), canonical.to_string());
        }
    }

    /// Lends a server connection: an idle one, a new one if the pool has room, or the
    /// next one returned, in FIFO order, within `query_wait_timeout`.
    pub async fn checkout(&self) -> Result<ServerConn, PoolError> {
        let deadline = self.settings.load().wait_timeout.map(|t| tokio::time::Instant::now() + t);
        loop {
            match self.next()? {
                Next::Take(s) => return Ok(s),
                Next::Connect => return self.open().await.map_err(PoolError::Connect),
                Next::Wait(rx) => {
                    let got = match deadline {
                        Some(d) => tokio::time::timeout_at(d, rx).await.map_err(|_| PoolError::WaitTimeout)?,
                        None => rx.await,
                    };
                    if let Ok(s) = got {
                        return Ok(s);
                    }
                    // The sender was dropped: capacity freed up, try again.
                }
            }
        }
    }

    fn next(&self) -> Result<Next, PoolError> {
        let settings = self.settings.load();
        let mut inner = self.inner.lock();
        if inner.closed {
            return Err(PoolError::Closed);
        }
        while let Some(s) = inner.idle.pop() {
            if self.usable(&s, &settings) {
                return Ok(Next::Take(s));
            }
            inner.total -= 1;
            self.release_limits();
            drop(s);
        }
        if inner.waiters.is_empty() && inner.total < settings.size && self.acquire_limits() {
            inner.total += 1;
            inner.connecting += 1;
            return Ok(Next::Connect);
        }
        let (tx, rx) = oneshot::channel();
        inner.waiters.push_back(tx);
        Ok(Next::Wait(rx))
    }

    fn usable(&self, s: &ServerConn, settings: &PoolSettings) -> bool {
        let expired = settings.lifetime.is_some_and(|l| s.created.elapsed() >= l);
        !expired && !s.broken && !s.stream.is_dead_or_noisy()
    }

    async fn open(&self) -> Result<ServerConn, ServerError> {
        let settings = self.settings.load_full();
        let r = connect(&settings.target, &settings.login, settings.connect_timeout).await;
        {
            let mut inner = self.inner.lock();
            inner.connecting -= 1;
            if r.is_err() {
                inner.total -= 1;
                self.release_limits();
            }
        }
        if let Ok(s) = &r {
            self.defaults.lock().get_or_insert_with(|| Arc::new(s.reported.clone()));
        } else {
            self.wake_waiters();
        }
        r
    }

    /// Takes a connection back. Clean connections go to the oldest waiter or the idle
    /// stack; anything else is closed.
    pub fn checkin(&self, mut s: ServerConn) {
        let settings = self.settings.load();
        let expired = settings.lifetime.is_some_and(|l| s.created.elapsed() >= l);
        if !s.is_clean() || expired || s.addr != settings.target.addr {
            return self.discard(s);
        }
        s.last_used = Instant::now();
        let mut inner = self.inner.lock();
        if inner.closed {
            drop(inner);
            return self.discard(s);
        }
        while let Some(w) = inner.waiters.pop_front() {
            match w.send(s) {
                Ok(()) => return,
                Err(back) => s = back,
            }
        }
        inner.idle.push(s);
    }

    /// Closes a connection and lets a waiter open a replacement.
    pub fn discard(&self, s: ServerConn) {
        s.close();
        {
            let mut inner = self.inner.lock();
            inner.total -= 1;
            self.release_limits();
        }
        self.wake_waiters();
    }

    /// Wakes waiters for which there is now room to open a connection (they retry).
    fn wake_waiters(&self) {
        let settings = self.settings.load();
        let mut inner = self.inner.lock();
        let room = settings.size.saturating_sub(inner.total);
        for _ in 0..room {
            match inner.waiters.pop_front() {
                Some(w) => drop(w),
                None => break,
            }
        }
    }

    fn acquire_limits(&self) -> bool {
        if !self.db_limit.try_acquire() {
            return false;
        }
        if !self.user_limit.try_acquire() {
            self.db_limit.release();
            return false;
        }
        true
    }

    fn release_limits(&self) {
        self.db_limit.release();
        self.user_limit.release();
    }

    /// One janitor pass: closes connections idle past `server_idle_timeout` or older
    /// than `server_lifetime` (keeping `min_pool_size`), drops abandoned waiters, and
    /// returns how many connections to open to reach `min_pool_size`.
    pub fn maintain(&self) -> usize {
        let settings = self.settings.load();
        let mut retire = Vec::new();
        let missing = {
            let mut inner = self.inner.lock();
            inner.waiters.retain(|w| !w.is_closed());
            let mut keep = Vec::with_capacity(inner.idle.len());
            let mut total = inner.total;
            for s in inner.idle.drain(..) {
                let idle_too_long =
                    settings.idle_timeout.is_some_and(|t| s.last_used.elapsed() >= t) && total > settings.min_size;
                let too_old = settings.lifetime.is_some_and(|l| s.created.elapsed() >= l);
                if idle_too_long || too_old || s.stream.is_dead_or_noisy() {
                    total -= 1;
                    retire.push(s);
                } else {
                    keep.push(s);
                }
            }
            inner.idle = keep;
            if inner.closed { 0 } else { settings.min_size.saturating_sub(total) }
        };
        for s in retire {
            self.discard(s);
        }
        missing
    }

    /// Opens one connection for `min_pool_size` and parks it idle.
    pub async fn prefill(&self) -> Result<(), ServerError> {
        {
            let settings = self.settings.load();
            let mut inner = self.inner.lock();
            if inner.closed || inner.total >= settings.size || !self.acquire_limits() {
                return Ok(());
            }
            inner.total += 1;
            inner.connecting += 1;
        }
        let s = self.open().await?;
        self.checkin(s);
        Ok(())
    }

    /// Closes every idle connection now; in-use ones are closed when they come back.
    pub fn close(&self) {
        let idle = {
            let mut inner = self.inner.lock();
            inner.closed = true;
            inner.waiters.clear();
            std::mem::take(&mut inner.idle)
        };
        for s in idle {
            self.discard(s);
        }
    }

    /// Closes idle connections (used after PostgreSQL restarts or on RECONNECT).
    pub fn drop_idle(&self) {
        let idle = std::mem::take(&mut self.inner.lock().idle);
        for s in idle {
            self.discard(s);
        }
    }

    pub fn is_unused(&self) -> bool {
        let i = self.inner.lock();
        i.total == 0 && i.waiters.is_empty()
    }

    pub fn needs_check(&self, s: &ServerConn) -> bool {
        self.settings.load().check_delay.is_some_and(|d| s.last_used.elapsed() >= d)
    }
}
