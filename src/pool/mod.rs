//! Pools of server connections keyed by (database, server user): an idle stack, a
//! FIFO queue of waiting clients with direct hand-off of a returning connection to
//! the oldest waiter, per-database and per-user connection limits, and the janitor
//! step that retires old connections and keeps `min_pool_size` open.

mod borrowed;
mod check;
mod control;
mod handoff;
mod learned;
mod limit;
mod maintain;
mod registry;
mod retry;
mod settings;
mod waits;
use waits::Expiry;

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::server::{ServerConn, ServerError, connect};
use crate::stats::{PoolStats, Registry, ServerInfo, ServerState};

pub use borrowed::Borrowed;
use borrowed::Opening;
pub use handoff::{HandoffSlot, WaitSlot};
use handoff::{Sender, Waiter};
pub use learned::{Learned, LoginReply};
pub use limit::ConnLimit;
pub use retry::ConnectFailure;
pub use settings::PoolSettings;

pub use crate::params::ParamList;
pub use registry::{PoolKey, Pools};

#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("query_wait_timeout: no server connection became free in time")]
    WaitTimeout,
    #[error("server connection failed: {0}")]
    Connect(ServerError),
    /// The pool was closed (`Pool::close`), for the reason given.
    #[error("{0}")]
    Closed(&'static str),
    /// Held back by a recent failed connect (`server_login_retry`).
    #[error("{0}")]
    LoginRetry(Arc<ConnectFailure>),
}

#[derive(Default, Debug)]
struct Inner {
    // Boxed: a connection moves through the pool, the hand-off and the session on every
    // transaction, and a pointer moves cheaper than the struct.
    #[allow(clippy::vec_box)]
    idle: Vec<Box<ServerConn>>,
    waiters: VecDeque<Queued>,
    /// The task that expires waiters past `query_wait_timeout` (one per pool, while
    /// any wait is queued and a timeout is set).
    expiry: Expiry,
    /// `query_wait_timeout`, for the waits queued (from when each began): set with the
    /// queue's lock by the reload that changes it (`retime_waits`).
    wait_timeout: Option<Duration>,
    /// Open plus connecting server connections.
    total: usize,
    connecting: usize,
    /// Closed (`Pool::close`), and why.
    closed: Option<&'static str>,
    /// The last failed connect, until one succeeds (`server_login_retry`).
    failed: Option<Arc<ConnectFailure>>,
}

impl Inner {
    /// The failed connect that holds new ones back now, if any.
    fn held_back(&self, retry: Option<Duration>) -> Option<&Arc<ConnectFailure>> {
        self.failed.as_ref().filter(|f| f.holds(retry))
    }

    /// Whether no connection is open (or lent): only connects under way, if any.
    fn none_open(&self) -> bool {
        self.total == self.connecting
    }

    /// The idle connection to lend next: the one given back last (a few connections
    /// carry the load, and stay warm), or with `round_robin` the one idle longest (the
    /// load spread over all, for servers behind one address that balance it).
    fn take_idle(&mut self, round_robin: bool) -> Option<Box<ServerConn>> {
        match round_robin {
            false => self.idle.pop(),
            true if self.idle.is_empty() => None,
            true => Some(self.idle.remove(0)),
        }
    }
}

/// A client in the queue, and when its wait times out.
#[derive(Debug)]
struct Queued {
    tx: Sender,
    /// When the client began waiting: `query_wait_timeout` counts from here.
    since: Instant,
}

/// What a waiting client is handed, oldest waiter first.
#[derive(Debug)]
enum Handoff {
    /// A connection coming back from another client.
    Server(Box<ServerConn>),
    /// Room to open a connection: the slot is already counted in `total`.
    Connect,
    /// `query_wait_timeout` ran out.
    TimedOut,
    /// A connect failed with no connection open (`server_login_retry`).
    Failed(Arc<ConnectFailure>),
}

#[allow(clippy::large_enum_variant)] // built and matched at once, never stored
enum Next {
    Take(Box<ServerConn>),
    Connect,
    /// PAUSEd since the caller looked: wait for RESUME.
    Paused,
    /// Queued as the wait of this number on the caller's slot; `true`: start the task
    /// that expires waits.
    Wait(u64, bool),
}

/// A slot counted in `total` and `connecting` while a connection is being opened;
/// given back if the open fails or is abandoned (its future dropped).
struct ConnectingSlot<'a> {
    pool: &'a Pool,
    armed: bool,
}

impl ConnectingSlot<'_> {
    /// Opens the connection; a failure gives the slot back (`Drop`).
    async fn open(mut self) -> Result<Box<ServerConn>, ServerError> {
        let r = self.pool.connect_counted().await;
        if r.is_ok() {
            self.armed = false;
            let mut inner = self.pool.inner.lock();
            inner.connecting -= 1;
            // The server is back: connects are no longer held back, and clients queued
            // meanwhile may open them.
            let held = inner.failed.take().is_some();
            drop(inner);
            if held {
                self.pool.wake_waiters();
            }
        }
        r
    }
}

impl Drop for ConnectingSlot<'_> {
    fn drop(&mut self) {
        if self.armed {
            self.pool.give_back_slot();
        }
    }
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
    /// Server defaults and client settings learned for logins (see `Learned`).
    pub learned: Learned,
    pub stats: PoolStats,
    /// Generations of prepared statements (see `prepared::Generations`).
    pub stmt_gens: ArcSwap<crate::prepared::Generations>,
    /// Bumped when a DDL completes through this pool: new Parses do not reuse
    /// server-side statements prepared before it.
    pub schema_epoch: std::sync::atomic::AtomicU64,
    /// Open server connections, for the admin console and for forwarding cancels
    /// (`cancel`): a connection must leave it when it is closed (`discard`).
    pub servers: Registry<ServerInfo>,
    /// Source of connection ids, shared by all pools.
    ids: Arc<std::sync::atomic::AtomicU64>,
    /// Admin PAUSE: checkouts wait (`wait_until`, woken by `changed`), returned
    /// connections are closed.
    paused: std::sync::atomic::AtomicBool,
    /// Admin RECONNECT/KILL (and a reload moving the pool) begin a new generation:
    /// connections begun in an earlier one are closed when they come back. A counter,
    /// not a time: a clock stepping back cannot mark new connections.
    generation: std::sync::atomic::AtomicU64,
    /// Notified whenever a connection comes back or is closed (PAUSE, WAIT_CLOSE).
    changed: Notify,
    /// `wait_until` callers now waiting on `changed`.
    watchers: AtomicUsize,
    /// Shared by every pool (`Pools::room_wanted`): a shared limit keeps this pool's
    /// queue from connecting.
    room_wanted: Arc<Notify>,
    /// Wakes the expiry task to look again: a reload changed the timeout, or a wait
    /// that began earlier went to the front of the queue.
    expiry_recheck: Notify,
}

impl Pool {
    pub fn new(
        key: PoolKey,
        settings: PoolSettings,
        db_limit: Arc<ConnLimit>,
        user_limit: Arc<ConnLimit>,
        ids: Arc<std::sync::atomic::AtomicU64>,
        room_wanted: Arc<Notify>,
    ) -> Self {
        Pool {
            key,
            inner: Mutex::new(Inner { wait_timeout: settings.wait_timeout, ..Inner::default() }),
            settings: ArcSwap::from_pointee(settings),
            db_limit,
            user_limit,
            learned: Learned::default(),
            stats: PoolStats::default(),
            stmt_gens: ArcSwap::from_pointee(Default::default()),
            schema_epoch: Default::default(),
            servers: Registry::default(),
            ids,
            paused: Default::default(),
            generation: Default::default(),
            changed: Notify::new(),
            expiry_recheck: Notify::new(),
            watchers: AtomicUsize::new(0),
            room_wanted,
        }
    }

    pub fn settings(&self) -> Arc<PoolSettings> {
        self.settings.load_full()
    }

    /// Applies reloaded settings. When the server address, database name, startup
    /// settings, `connect_query` or `server_tls_sslmode` changed, every connection opened
    /// before is closed: idle ones at once, lent ones as they come back (new certificates
    /// alone keep existing connections).
    pub fn update(self: &Arc<Self>, mut settings: PoolSettings) {
        let old = self.settings.load_full();
        if old.login.same_credentials(&settings.login) {
            // Rebuilt by the reload (a database's own user and password; a user's is
            // carried over by `UserStore::inherit` already): the keys it derived stay.
            settings.login = old.login.clone();
        }
        let new = Arc::new(settings);
        self.settings.store(new.clone());
        // (Or its connections begin otherwise: new startup settings, a new connect_query.)
        let moved = !old.target.same_sessions(&new.target);
        if moved {
            self.learned.forget();
        }
        if old.wait_timeout != new.wait_timeout {
            self.retime_waits(new.wait_timeout);
            // Waits held by PAUSE look at the new timeout (`wait_resumed`).
            self.notify_changed();
        }
        if moved || old.target.tls.mode != new.target.tls.mode {
            // Every connection opened so far is closed: idle ones now, lent ones when
            // they come back (as after RECONNECT).
            self.reconnect();
        }
        // A reload ends a `server_login_retry` wait: the operator may have mended what
        // failed (a password, the address).
        self.inner.lock().failed = None;
        self.wake_waiters();
    }

    pub fn counts(&self) -> PoolCounts {
        let i = self.inner.lock();
        PoolCounts { idle: i.idle.len(), total: i.total, waiting: i.waiters.len(), connecting: i.connecting }
    }

    /// Lends a server connection: an idle one, a new one if the pool has room, or the
    /// next one returned, in FIFO order, within `query_wait_timeout`.
    ///
    /// Cancellation-safe: if the future is dropped (the client left) while connecting
    /// or just after a connection was handed to it, the slot or connection goes back.
    pub async fn checkout(self: &Arc<Self>) -> Result<Box<ServerConn>, PoolError> {
        self.checkout_since(&mut None, &WaitSlot::new()).await
    }

    /// `checkout`, setting `since` to when it started waiting (connecting, queueing or
    /// paused) unless already set; an idle connection taken at once leaves it None,
    /// which saves reading the clock on the common path. A wait in the queue is handed
    /// its connection through `slot`, the caller's, made at its first wait and reused
    /// (one checkout at a time per slot).
    ///
    /// The queue's timeout is enforced by one task per pool (`expire_waiters`) rather
    /// than a timer per wait: at hundreds of clients over a pool of tens, nearly every
    /// transaction waits. A client opening a connection is bounded by the same timeout
    /// (`connect_within`, boxed: rare, and its timers would enlarge every client task).
    pub async fn checkout_since(
        self: &Arc<Self>,
        since: &mut Option<Instant>,
        slot: &WaitSlot,
    ) -> Result<Box<ServerConn>, PoolError> {
        loop {
            match self.next(since, slot)? {
                Next::Take(s) => return Ok(s),
                Next::Paused => self.wait_resumed(since).await?,
                Next::Connect => {
                    let since = *since.get_or_insert_with(Instant::now);
                    return Box::pin(self.connect_within(since)).await;
                }
                Next::Wait(wait, arm) => {
                    if arm {
                        tokio::spawn(self.clone().expire_waiters());
                    }
                    let slot = slot.get().expect("a wait is queued on a slot it made");
                    let mut waiter = Waiter { pool: self, slot, wait, done: false };
                    match waiter.received().await {
                        Some(Handoff::Server(s)) => return Ok(s),
                        Some(Handoff::TimedOut) => return Err(PoolError::WaitTimeout),
                        Some(Handoff::Failed(f)) => return Err(PoolError::LoginRetry(f)),
                        Some(Handoff::Connect) => {
                            let since = *since.get_or_insert_with(Instant::now);
                            return Box::pin(self.connect_within(since)).await;
                        }
                        // The pool dropped the queue (closed, paused, reloaded): look again.
                        None => {}
                    }
                }
            }
        }
    }

    fn next(&self, since: &mut Option<Instant>, slot: &WaitSlot) -> Result<Next, PoolError> {
        let settings = self.settings.load();
        let mut inner = self.inner.lock();
        if let Some(why) = inner.closed {
            return Err(PoolError::Closed(why));
        }
        // Read under the lock `pause` clears the queue under: no wait queued after it.
        if self.is_paused() {
            return Ok(Next::Paused);
        }
        while let Some(mut s) = inner.take_idle(settings.round_robin) {
            // (One beyond a size lowered by a reload or SET is closed, not lent: the
            // janitor would close it within a second.)
            if inner.total <= settings.most() && self.usable(&mut s, &settings) {
                return Ok(Next::Take(s));
            }
            // Closed like any other (Terminate, close_notify), outside the lock.
            drop(inner);
            self.discard(s);
            inner = self.inner.lock();
            if let Some(why) = inner.closed {
                return Err(PoolError::Closed(why));
            }
            if self.is_paused() {
                return Ok(Next::Paused);
            }
        }
        match inner.held_back(settings.login_retry) {
            // Nothing open to wait for: the failure, at once (PgBouncer's fast fail).
            Some(f) if inner.none_open() => return Err(PoolError::LoginRetry(f.clone())),
            // Queued for a connection coming back.
            Some(_) => {}
            None if inner.waiters.is_empty() && inner.total < settings.size => {
                if self.acquire_limits() {
                    inner.total += 1;
                    inner.connecting += 1;
                    return Ok(Next::Connect);
                }
                // A shared limit is full: another pool's idle connection may make room.
                self.room_wanted.notify_one();
            }
            None => {}
        }
        let (tx, wait) = slot.get_or_init(Default::default).open();
        let since = *since.get_or_insert_with(Instant::now);
        let timed = inner.wait_timeout.is_some();
        let arm = inner.arm_expiry(timed);
        inner.enqueue(Queued { tx, since });
        if !arm && inner.due_before_expiry_looks(since) {
            // Queued again, having begun before the wait the expiry task sleeps toward.
            self.expiry_recheck.notify_one();
        }
        Ok(Next::Wait(wait, arm))
    }

    /// Whether an idle connection may be lent (an address its host name lost since it
    /// was given back is seen here, before the janitor's next pass).
    fn usable(&self, s: &mut ServerConn, settings: &PoolSettings) -> bool {
        let expired = s.created.elapsed() >= settings.lifetime;
        !expired && !s.broken && !self.marked(s) && !settings.target.left_behind(s) && !s.stream.is_dead_or_noisy()
    }

    /// Opens a connection for a slot already counted in `total` and `connecting`.
    async fn open(&self) -> Result<Box<ServerConn>, ServerError> {
        let slot = ConnectingSlot { pool: self, armed: true };
        slot.open().await
    }

    /// `open`, holding its own handle on the pool: the connect can go on in a task.
    async fn open_owned(self: Arc<Self>) -> Result<Box<ServerConn>, ServerError> {
        self.open().await
    }

    /// Opens a connection for a slot already counted, for a client whose wait began at
    /// `since`. The wait stays bounded by `query_wait_timeout` (the one in force, counted
    /// from `since`), as in the queue: when it runs out first the client gets
    /// `WaitTimeout`, and the connect goes on in a task of its own; the connection it
    /// opens joins the pool (the oldest waiter, or the idle stack), and a failure gives
    /// its slot back.
    ///
    /// Cancellation-safe: dropped while connecting (the client left), the connect is
    /// abandoned and its slot given back (`ConnectingSlot`).
    async fn connect_within(self: &Arc<Self>, since: Instant) -> Result<Box<ServerConn>, PoolError> {
        // Boxed: a task takes it over as it is if the wait runs out.
        let mut open = Box::pin(self.clone().open_owned());
        loop {
            let timeout = self.settings.load().wait_timeout;
            // A reload (or SET) that changes the timeout applies to this wait too.
            let retimed = self.wait_until(move |p| p.settings.load().wait_timeout != timeout);
            tokio::select! {
                biased;
                r = &mut open => return r.map_err(PoolError::Connect),
                () = retimed => {}
                () = crate::clock::sleep_opt(timeout.map(|t| (since + t).saturating_duration_since(Instant::now()))) => {
                    let pool = self.clone();
                    tokio::spawn(async move {
                        if let Ok(s) = open.await {
                            pool.checkin(s);
                        }
                    });
                    return Err(PoolError::WaitTimeout);
                }
            }
        }
    }

    async fn connect_counted(&self) -> Result<Box<ServerConn>, ServerError> {
        loop {
            // A connect begun before a RECONNECT belongs to the generation it replaces.
            // Read before the settings: a reload swaps the settings, then starts a
            // generation, so a connect that read the old settings has the old one too.
            let generation = self.generation.load(std::sync::atomic::Ordering::Acquire);
            let settings = self.settings.load_full();
            let id = self.ids.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let started = Instant::now();
            // Listed (SHOW SERVERS, state `new`) while it logs in; unlisted again if it
            // fails, or the connect is dropped.
            let info = Arc::new(ServerInfo::new(id, settings.target.addr.clone()));
            info.generation.store(generation, std::sync::atomic::Ordering::Relaxed);
            let listed = Opening::list(self, info.clone());
            // Boxed: opening a connection (TLS, SCRAM) is rare, and its state would
            // otherwise enlarge every client task that may wait for a server.
            let mut s = match Box::pin(connect(
                &settings.target,
                &settings.login,
                settings.connect_timeout,
                settings.internal,
                info,
            ))
            .await
            {
                Ok(s) => s,
                Err(e) => {
                    self.stats.server_connect_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    self.connect_failed(&e, &settings);
                    return Err(e);
                }
            };
            self.stats.server_connects.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.stats.connect_hist.observe(started.elapsed());
            // Its host name's answer changed while it logged in, leaving its address
            // out: opened again, to an address the name has now.
            if settings.target.left_behind(&mut s) {
                s.close();
                continue;
            }
            if generation != self.generation.load(std::sync::atomic::Ordering::Acquire) {
                // A RECONNECT, KILL or reload moving the pool came while it connected:
                // not lent even once (its listing goes, which tells WAIT_CLOSE). Opened
                // again, to the pool's server (after a KILL, which pauses the pool, that
                // one is closed when given back: one connect more, in a rare race).
                s.close();
                continue;
            }
            s.info.set_state(ServerState::Active, 0);
            listed.keep();
            // The pool learns its defaults from its connections, not from one opened
            // before a reload moved the pool (its server is no longer the pool's); one
            // opened across a reload that did not move it shares them all the same.
            s.startup = self.learned.share(&s.startup, Arc::ptr_eq(&settings, &self.settings.load()));
            return Ok(s);
        }
    }

    /// Takes a connection back. Clean connections go to the oldest waiter or the idle
    /// stack; anything else is closed.
    pub fn checkin(&self, mut s: Box<ServerConn>) {
        let settings = self.settings.load();
        let now = crate::clock::CoarseInstant::now();
        let expired = now.since(s.created) >= settings.lifetime;
        if !s.is_clean() || expired || *s.addr() != settings.target.addr || settings.target.left_behind(&mut s) {
            return self.discard(s);
        }
        s.last_used = now;
        s.returned = true;
        s.info.set_state(ServerState::Idle, 0);
        let mut inner = self.inner.lock();
        // Checked under the lock: PAUSE and RECONNECT set their flag, then empty the idle
        // stack under it, so a connection is either seen by them there or refused here.
        // Also closed: one beyond the pool's size and reserve (lowered by a reload or
        // SET); reserve connections go on serving the queue, and idle, go by
        // `server_idle_timeout` (`maintain`).
        if inner.closed.is_some() || self.is_paused() || self.marked(&s) || inner.total > settings.most() {
            drop(inner);
            return self.discard(s);
        }
        while let Some(w) = inner.waiters.pop_front() {
            match w.tx.give(Handoff::Server(s)) {
                Ok(()) => return,
                Err(Handoff::Server(back)) => s = back,
                Err(_) => unreachable!("sent a server"),
            }
        }
        inner.idle.push(s);
        drop(inner);
        // A pool sharing a full limit may wait for room this idle connection can make.
        if self.db_limit.is_contended() || self.user_limit.is_contended() {
            self.room_wanted.notify_one();
        }
        self.notify_changed();
    }

    /// Closes a connection and lets a waiter open a replacement.
    pub fn discard(&self, s: Box<ServerConn>) {
        self.servers.remove(s.id);
        s.close();
        {
            let mut inner = self.inner.lock();
            inner.total -= 1;
            self.release_limits();
        }
        self.room_freed();
    }

    /// Room for a connection was freed (one closed, or a connect failed or was
    /// abandoned): this pool's oldest waiters first, then the pools sharing a limit that
    /// one of them found full, then whoever waits for the pool to empty (PAUSE).
    fn room_freed(&self) {
        self.wake_waiters();
        self.wake_sharing();
        self.notify_changed();
    }

    /// Gives the oldest waiters the room there now is to open connections: each gets
    /// a slot already counted, so FIFO order holds.
    fn wake_waiters(&self) {
        // PAUSEd: no new connections; RESUME wakes the queue again.
        if self.is_paused() {
            return;
        }
        let settings = self.settings.load();
        let mut gave_back = false;
        let mut inner = self.inner.lock();
        // After a failed connect: no new one before `server_login_retry` is over (and
        // if the last connection just closed, the queue has nothing to wait for).
        if let Some(f) = inner.held_back(settings.login_retry).cloned() {
            inner.fail_waiters_if_none_open(&f);
            return;
        }
        while let Some(front) = inner.waiters.front() {
            if inner.total >= settings.room_for(front.since) {
                break;
            }
            if !self.acquire_limits() {
                break;
            }
            let w = inner.waiters.pop_front().expect("not empty");
            if w.tx.give(Handoff::Connect).is_ok() {
                inner.total += 1;
                inner.connecting += 1;
            } else {
                self.release_limits();
                gave_back = true;
            }
        }
        drop(inner);
        // Room a departed waiter did not use may be another pool's (each such step
        // drops a waiter, so the wake-ups it starts end).
        if gave_back {
            self.wake_sharing();
        }
    }

    /// Wakes the queues of the pools that found a shared limit full (`ConnLimit`); never
    /// called with a pool's lock held.
    fn wake_sharing(&self) {
        for limit in [&self.db_limit, &self.user_limit] {
            for pool in limit.take_contended() {
                pool.wake_waiters();
            }
        }
    }

    /// A connect slot given back unused: its connect failed or was abandoned, or the
    /// waiter it was handed to left.
    fn give_back_slot(&self) {
        {
            let mut inner = self.inner.lock();
            inner.total -= 1;
            inner.connecting -= 1;
        }
        self.release_limits();
        self.room_freed();
    }

    fn acquire_limits(&self) -> bool {
        ConnLimit::acquire_pair(&self.db_limit, &self.user_limit)
    }

    fn release_limits(&self) {
        ConnLimit::release_pair(&self.db_limit, &self.user_limit);
    }

    /// Counts this pool among those its limits wake (`ConnLimit::join`).
    pub(super) fn join_limits(self: &Arc<Self>) {
        self.db_limit.join(self);
        self.user_limit.join(self);
    }

    /// A server reported statement `id` (held at generation `seen`) stale: copies of
    /// that generation elsewhere must be re-prepared.
    pub fn mark_stale(&self, id: u64, seen: u64) {
        self.stmt_gens.rcu(|gens| {
            let mut gens = (**gens).clone();
            let cur = gens.entry(id).or_insert(0);
            if *cur == seen {
                *cur += 1;
            }
            gens
        });
    }

    pub fn is_unused(&self) -> bool {
        let i = self.inner.lock();
        i.total == 0 && i.waiters.is_empty()
    }

    /// The settings, when `server_reset_query_always` applies (a reset query is set and
    /// runs after every transaction, not only when a session ends); one cheap load
    /// otherwise, as on nearly every release.
    pub fn reset_always(&self) -> Option<Arc<PoolSettings>> {
        let s = self.settings.load();
        (s.reset_query_always && !s.reset_query.is_empty()).then(|| arc_swap::Guard::into_inner(s))
    }

    /// The limit for Sluice's own queries on this pool's servers.
    pub fn internal_limits(&self) -> crate::server::QueryBounds {
        self.settings.load().internal
    }
}
