//! Wiring: the shared state handle every task gets, the listeners, the janitor,
//! signals (SIGHUP reload, SIGTERM graceful shutdown, SIGINT immediate exit) and the
//! shutdown sequence. No globals: each `App` is self-contained, so tests build their own.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use tokio::sync::{Notify, watch};
use tracing::{error, info, warn};

use crate::auth::UserStore;
use crate::cancel::CancelRegistry;
use crate::config::{Config, General, secs};
use crate::net::listener::{Listener, TcpOptions, set_listener_options};
use crate::pool::Pools;
use crate::tls::{self, ClientTls, ServerTls};

/// Where the process is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    Running,
    /// Admin SHUTDOWN WAIT_FOR_CLIENTS: no new clients; exit once the clients have left.
    Quiescing,
    /// SIGTERM: no new clients; each client is closed once its transaction ends.
    Draining,
    /// SIGINT or the shutdown timeout: everything is closed now.
    Stopping,
}

#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error("{0}")]
    Config(#[from] crate::config::ConfigError),
    #[error("cannot listen on {what}: {source}")]
    Listen { what: String, source: std::io::Error },
    #[error("invalid secret in the users section: {0}")]
    Secret(#[from] crate::auth::scram::ScramError),
}

/// A changed TLS key whose files cannot be used (`App::change_config`): the key and why.
#[derive(Debug)]
pub struct UnusableTls(pub String);

/// The handle shared by every task.
#[derive(Debug)]
pub struct App {
    pub config: ArcSwap<Config>,
    pub users: ArcSwap<UserStore>,
    /// TLS towards clients; rebuilt on reload (TLS towards servers lives in `pools`).
    pub client_tls: ArcSwap<ClientTls>,
    pub pools: Pools,
    pub cancel: Arc<CancelRegistry>,
    /// Cancel requests being forwarded to peers (`[peers]`).
    pub peer_pools: crate::cancel::PeerPools,
    clients: AtomicUsize,
    no_clients: Notify,
    /// Background work the exit waits for (`BackgroundGuard`).
    background: AtomicUsize,
    /// Notified when a reload or SET puts a new config in place (`set_config`).
    config_changed: Notify,
    phase: watch::Sender<Phase>,
    /// The TCP listening sockets: a reload or admin SET that changes the TCP options
    /// (`tcp_keepalive`...) changes them at once (accepted connections inherit them).
    listeners: parking_lot::Mutex<TcpListeners>,
    /// Held by each change of the config (reload, admin SET) from reading the running
    /// config to storing the new one: two changes at once must not lose one's update.
    config_writes: parking_lot::Mutex<()>,
    /// The phase as a plain value, read by sessions on every loop turn (they are woken
    /// through `ClientInfo::wake` when it changes).
    phase_now: std::sync::atomic::AtomicU8,
    /// Notified (`notify_waiters`) when the phase changes: connections not yet listed in
    /// `client_infos` (still before their startup packet) wait on it.
    pub phase_changed: Notify,
    /// What logins are checked with: the key of unknown users' mock secrets, the bound on
    /// clear-text logins' PBKDF2 runs.
    pub checks: crate::auth::client::Checks,
    /// Clients from their startup packet on (logging in, logged in), for the admin
    /// console, KILL and the shutdown.
    pub client_infos: crate::stats::Registry<crate::stats::ClientInfo>,
    next_client_id: std::sync::atomic::AtomicU64,
    /// Per-second samples and stats_period averages (admin console, metrics, live view).
    pub monitor: crate::metrics::Monitor,
}

/// The TCP listening sockets and the TCP options now set on them.
#[derive(Debug)]
struct TcpListeners {
    options: TcpOptions,
    sockets: Vec<Weak<tokio::net::TcpListener>>,
}

/// Work the exit waits for beside the clients (a cancel a session left to a task of its
/// own), for as long as it lives (`App::track_background`).
pub struct BackgroundGuard(Arc<App>);

impl Drop for BackgroundGuard {
    fn drop(&mut self) {
        if self.0.background.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.no_clients.notify_waiters();
        }
    }
}

/// Counts a connected client for as long as it lives.
pub struct ClientGuard(Arc<App>);

impl Drop for ClientGuard {
    fn drop(&mut self) {
        if self.0.clients.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.no_clients.notify_waiters();
        }
    }
}

impl App {
    pub fn new(cfg: Config) -> Result<Arc<App>, AppError> {
        let users = UserStore::from_config(&cfg)?;
        cfg.warnings().iter().for_each(|w| warn!("{w}"));
        let (client_tls, server_tls) = tls::load(&cfg)?;
        let pools = Pools::default();
        pools.set_server_tls(Arc::new(server_tls));
        let options = TcpOptions::of(&cfg.general);
        let cancel = Arc::new(CancelRegistry::new(cfg.general.peer_id));
        Ok(Arc::new(App {
            config: ArcSwap::from_pointee(cfg),
            users: ArcSwap::from_pointee(users),
            client_tls: ArcSwap::from_pointee(client_tls),
            pools,
            cancel,
            peer_pools: Default::default(),
            clients: AtomicUsize::new(0),
            no_clients: Notify::new(),
            background: AtomicUsize::new(0),
            config_changed: Notify::new(),
            phase: watch::channel(Phase::Running).0,
            listeners: parking_lot::Mutex::new(TcpListeners { options, sockets: Vec::new() }),
            config_writes: parking_lot::Mutex::new(()),
            phase_now: std::sync::atomic::AtomicU8::new(Phase::Running as u8),
            phase_changed: Notify::new(),
            checks: crate::auth::client::Checks::new(rand::random()),
            client_infos: Default::default(),
            next_client_id: std::sync::atomic::AtomicU64::new(1),
            monitor: Default::default(),
        }))
    }

    /// A new id for a client connection.
    pub fn client_id(&self) -> u64 {
        self.next_client_id.fetch_add(1, Ordering::Relaxed)
    }

    pub fn client_count(&self) -> usize {
        self.clients.load(Ordering::Acquire)
    }

    /// Counts background work the exit waits for, until the guard is dropped.
    pub fn track_background(self: &Arc<Self>) -> BackgroundGuard {
        self.background.fetch_add(1, Ordering::AcqRel);
        BackgroundGuard(self.clone())
    }

    pub fn track_client(self: &Arc<Self>) -> ClientGuard {
        self.clients.fetch_add(1, Ordering::AcqRel);
        ClientGuard(self.clone())
    }

    pub fn phase(&self) -> watch::Receiver<Phase> {
        self.phase.subscribe()
    }

    /// The current phase, without the channel's lock.
    pub fn current_phase(&self) -> Phase {
        match self.phase_now.load(Ordering::Acquire) {
            0 => Phase::Running,
            1 => Phase::Quiescing,
            2 => Phase::Draining,
            _ => Phase::Stopping,
        }
    }

    pub fn set_phase(&self, p: Phase) {
        let changed = self.phase.send_if_modified(|cur| {
            let advance = (p as u8) > (*cur as u8);
            if advance {
                *cur = p;
                self.phase_now.store(p as u8, Ordering::Release);
            }
            advance
        });
        // Sessions wait on their own interrupt, not on the phase channel.
        if changed {
            self.phase_changed.notify_waiters();
            for c in self.client_infos.list() {
                c.wake();
            }
        }
    }

    /// Re-reads the config file; on error the running config stays (and the error is
    /// logged and returned).
    pub fn reload(&self) -> Result<(), String> {
        let _writing = self.config_writes.lock();
        let path = self.config.load().path.clone();
        let failed = |e: &dyn std::fmt::Display| {
            error!("reload failed, keeping the running configuration: {e}");
            format!("reload failed, keeping the running configuration: {e}")
        };
        let mut cfg = Config::load(&path).map_err(|e| failed(&e))?;
        let mut users = UserStore::from_config(&cfg).map_err(|e| failed(&e))?;
        users.inherit(&self.users.load());
        let old = self.config.load();
        let kept = cfg.keep_start_up(&old);
        let (client_tls, server_tls) = self.reload_tls(&mut cfg, &old);
        // A running auth_type kept (the new `cert` needed the client TLS files) must still
        // fit the new users' secrets.
        cfg.check_users().map_err(|e| failed(&placed(&path, &e)))?;
        // The new auth_hba_file's lines against the TLS settings in force (the running
        // ones, when the new client TLS files could not be used).
        cfg.check_hba().map_err(|e| failed(&e))?;
        cfg.warnings().iter().for_each(|w| warn!("{w}"));
        for key in kept {
            warn!(
                "general.{key}: changed in the file; read only at start-up, so the running value stays until a restart"
            );
        }
        self.client_tls.store(client_tls);
        self.pools.set_server_tls(server_tls);
        // Users found in databases that no longer have lookups go (their pools close).
        users.found().retain_databases(|db| crate::auth::finds_users(&cfg, db));
        // The config first, the pools after: a login that sees the pools' reload count go
        // up reads this config (`Pools::get_current`).
        let (cfg, users) = (Arc::new(cfg), Arc::new(users));
        self.users.store(users.clone());
        self.set_config(cfg.clone());
        self.pools.reload(&cfg, &users);
        self.wake_for_timeouts(&old.general, &cfg.general);
        info!("configuration reloaded");
        Ok(())
    }

    /// Changes the running configuration in memory (admin SET), one change at a time:
    /// `change` gets the running one, and what it returns is applied. Pool settings
    /// and limits follow at once; the users stay. A changed TLS setting loads that
    /// side's TLS setup anew for connections from now on; if it cannot be used, nothing
    /// changes.
    pub fn change_config<E: From<UnusableTls>>(
        &self,
        change: impl FnOnce(&Config) -> Result<Config, E>,
    ) -> Result<(), E> {
        let _writing = self.config_writes.lock();
        let old = self.config.load();
        let cfg = change(&old)?;
        let (g, was) = (&cfg.general, &old.general);
        let client_changed = g.client_tls_keys() != was.client_tls_keys();
        let server_changed = g.server_tls_keys() != was.server_tls_keys();
        let unusable = |e: tls::TlsError| UnusableTls(format!("general.{}: {}", e.key, e.message));
        let client = if client_changed { Some(ClientTls::load(&cfg).map_err(unusable)?) } else { None };
        let server = if server_changed { Some(ServerTls::load(&cfg).map_err(unusable)?) } else { None };
        if let Some(client) = client {
            self.client_tls.store(Arc::new(client));
        }
        if let Some(server) = server {
            self.pools.set_server_tls(Arc::new(server));
        }
        let cfg = Arc::new(cfg);
        self.set_config(cfg.clone());
        self.pools.reload(&cfg, &self.users.load());
        self.wake_for_timeouts(&old.general, &cfg.general);
        Ok(())
    }

    /// Wakes every session when a reload or SET changed a client timeout: it reads them
    /// again (its reload count moved), so waits under way (an idle client, a
    /// transaction left idle) count with the new values, as PgBouncer applies them to
    /// clients already connected. Also after every reload under `server_fast_close`
    /// (or one turning it on): a session-mode client idle with a server the reload
    /// marked for closing then ends at once (`Session::fast_close`).
    fn wake_for_timeouts(&self, old: &General, new: &General) {
        let timeouts = |g: &General| (g.query_timeout, g.idle_transaction_timeout, g.client_idle_timeout);
        if timeouts(old) != timeouts(new) || new.server_fast_close {
            for c in self.client_infos.list() {
                c.wake();
            }
        }
    }

    /// Puts `cfg` in place (the caller holds `config_writes`) and applies its TCP
    /// options to the listening sockets when they changed.
    fn set_config(&self, cfg: Arc<Config>) {
        let options = TcpOptions::of(&cfg.general);
        self.config.store(cfg);
        self.config_changed.notify_waiters();
        let mut listeners = self.listeners.lock();
        if std::mem::replace(&mut listeners.options, options) != options {
            for l in listeners.sockets.iter().filter_map(Weak::upgrade) {
                set_listener_options(&l, &options);
                let addr = l.local_addr().map(|a| a.to_string()).unwrap_or_default();
                info!("{addr}: {} for connections from now on", options.describe());
            }
        }
    }
}

impl App {
    /// Re-reads the TLS files of both sides. A side whose files cannot be used keeps its
    /// running setup (logged), and `cfg` keeps that side's running TLS keys, so that what
    /// SHOW CONFIG says and what logins check is the setup in force (and keeps the
    /// running client authentication, `hba` rules included, instead of a new `cert`,
    /// which needs the new client setup: `Config::keep_client_tls`);
    /// connections keep the setup they were opened with.
    fn reload_tls(&self, cfg: &mut Config, running: &Config) -> (Arc<ClientTls>, Arc<ServerTls>) {
        let keep = |cfg: &Config, e: tls::TlsError, side: &str| {
            error!("{}; keeping the running {side} TLS setup and settings", cfg.general_error(e.key, e.message));
        };
        let client = match ClientTls::load(cfg) {
            Ok(t) => Arc::new(t),
            Err(e) => {
                keep(cfg, e, "client");
                cfg.keep_client_tls(running);
                self.client_tls.load_full()
            }
        };
        let server = match ServerTls::load(cfg) {
            Ok(t) => Arc::new(t),
            Err(e) => {
                keep(cfg, e, "server");
                cfg.general.keep_server_tls(&running.general);
                self.pools.server_tls()
            }
        };
        (client, server)
    }
}

/// Binds every configured listener; failing to bind one is an error, but for an
/// address from `*` or a host name that the system lacks (its family turned off, an
/// IPv6 `localhost` without `::1`), which is skipped with a warning, as in PgBouncer,
/// as long as one of `listen_addr`'s addresses is bound.
pub fn bind(cfg: &Config) -> Result<Vec<Listener>, AppError> {
    let g = &cfg.general;
    let mut out = Vec::new();
    let ips = cfg
        .listen_ips()
        .map_err(|e| AppError::Listen { what: "listen_addr".into(), source: std::io::Error::other(e) })?;
    let mut skipped = None;
    for ip in &ips {
        let what = || format!("{ip} port {}", g.listen_port);
        match Listener::tcp(*ip, g.listen_port, TcpOptions::of(g), g.listen_backlog, g.so_reuseport) {
            Ok(l) => out.push(l),
            Err(source)
                if !cfg.listed_as_address(ip)
                    && matches!(source.raw_os_error(), Some(libc::EAFNOSUPPORT | libc::EADDRNOTAVAIL)) =>
            {
                warn!("cannot listen on {}: {source}; skipped (an address of `*` or a host name)", what());
                skipped = Some(AppError::Listen { what: what(), source });
            }
            Err(source) => return Err(AppError::Listen { what: what(), source }),
        }
    }
    if let Some(e) = skipped.filter(|_| out.is_empty()) {
        return Err(e);
    }
    if !g.unix_socket_dir.is_empty() {
        // Checked at load (`config::validate`): octal, at most 0777.
        let mode = u32::from_str_radix(&g.unix_socket_mode, 8).unwrap_or(0o700);
        let group = Some(g.unix_socket_group.as_str()).filter(|s| !s.is_empty());
        let l = Listener::unix(&g.unix_socket_dir, g.listen_port, mode, group, g.listen_backlog)
            .map_err(|source| AppError::Listen { what: g.unix_socket_dir.clone(), source })?;
        out.push(l);
    }
    Ok(out)
}

/// Runs Sluice until shutdown.
pub async fn run(app: Arc<App>, listeners: Vec<Listener>, signals: Signals) {
    let mut accepting = Vec::new();
    for l in listeners {
        info!("listening on {}", l.describe());
        app.listeners.lock().sockets.extend(l.tcp_socket());
        accepting.push(tokio::spawn(accept_loop(app.clone(), l)));
    }
    tokio::spawn(janitor(app.clone()));
    tokio::spawn(crate::metrics::stats_task(app.clone()));
    start_metrics(&app).await;
    tokio::spawn(on_signals(app.clone(), signals));
    crate::net::notify::service_manager("READY=1");
    let mut phase = app.phase();
    let _ = phase.wait_for(|p| *p != Phase::Running).await;
    crate::net::notify::service_manager("STOPPING=1");
    let mut drain_start = None;
    loop {
        let now = *phase.borrow_and_update();
        if now == Phase::Stopping {
            break;
        }
        // SHUTDOWN WAIT_FOR_CLIENTS waits for ever; SIGTERM for shutdown_timeout from the
        // drain's start, as a reload or SET sets it now (read again when they come).
        let changed = app.config_changed.notified();
        let started = (now == Phase::Draining).then(|| *drain_start.get_or_insert_with(Instant::now));
        let timeout = secs(app.config.load().general.shutdown_timeout);
        let limit = started.zip(timeout).map(|(s, t)| (s + t).saturating_duration_since(Instant::now()));
        tokio::select! {
            _ = wait_for_no_clients(&app) => break,
            _ = phase.changed() => {}
            _ = changed => {}
            _ = crate::clock::sleep_opt(limit) => {
                warn!("shutdown_timeout reached with {} clients left", app.client_count());
                break;
            }
        }
    }
    app.set_phase(Phase::Stopping);
    for p in app.pools.upkeep() {
        p.close("Sluice is shutting down");
    }
    // The sessions end now (each told 57P01): their servers are closed, a running
    // query's cancel sent first, before the process goes (a query left running would
    // hold its locks on PostgreSQL with no pooler), for at most `STOPPING_LIMIT`.
    if tokio::time::timeout(STOPPING_LIMIT, wait_for_no_clients(&app)).await.is_err() {
        warn!("{} clients still ending after {}s: exiting", app.client_count(), STOPPING_LIMIT.as_secs());
    }
    // The accept loops end at Stopping, dropping their listeners (which removes the Unix
    // socket file) before the runtime is left behind (`main`).
    for a in accepting {
        let _ = a.await;
    }
    info!("shut down");
}

/// How long the exit waits for the sessions to end at the last phase of a shutdown.
const STOPPING_LIMIT: Duration = Duration::from_secs(5);

/// Waits until no client is left, nor background work (`BackgroundGuard`: a cancel of a
/// query whose client left, which must be sent before the process goes).
async fn wait_for_no_clients(app: &App) {
    loop {
        let notified = app.no_clients.notified();
        if app.client_count() == 0 && app.background.load(Ordering::Acquire) == 0 {
            return;
        }
        notified.await;
    }
}

/// Starts the HTTP endpoint when `metrics_listen` is set; a failure to bind is logged
/// and Sluice runs without it.
async fn start_metrics(app: &Arc<App>) {
    let addr = app.config.load().general.metrics_listen.clone();
    if addr.is_empty() {
        return;
    }
    match tokio::net::TcpListener::bind(&addr).await {
        Ok(l) => {
            info!("metrics and live view on http://{addr}/");
            tokio::spawn(crate::metrics::http::serve(app.clone(), l));
        }
        Err(e) => error!("cannot listen on metrics_listen {addr}: {e}; running without the metrics endpoint"),
    }
}

/// The signals Sluice handles, installed as start-up begins (`Signals::install`), so
/// that one sent before Sluice is ready waits for it rather than ending the process.
pub struct Signals {
    hup: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    quit: tokio::signal::unix::Signal,
    usr1: tokio::signal::unix::Signal,
    usr2: tokio::signal::unix::Signal,
}

impl Signals {
    /// Installs the handlers (inside the runtime).
    pub fn install() -> std::io::Result<Signals> {
        use tokio::signal::unix::{SignalKind, signal};
        Ok(Signals {
            hup: signal(SignalKind::hangup())?,
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
            quit: signal(SignalKind::quit())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
        })
    }
}

/// SIGHUP reloads, SIGTERM drains (a second one, while draining, stops), SIGINT and
/// SIGQUIT stop, SIGUSR1/SIGUSR2 pause/resume every pool (admin PAUSE/RESUME).
async fn on_signals(app: Arc<App>, signals: Signals) {
    let Signals { mut hup, mut term, mut int, mut quit, mut usr1, mut usr2 } = signals;
    loop {
        tokio::select! {
            _ = hup.recv() => {
                let _ = app.reload();
            }
            _ = term.recv() => {
                if app.current_phase() == Phase::Draining {
                    info!("SIGTERM again: shutting down now");
                    app.set_phase(Phase::Stopping);
                } else {
                    info!("SIGTERM: no new connections; closing clients as their transactions end");
                    app.set_phase(Phase::Draining);
                }
            }
            _ = int.recv() => {
                info!("SIGINT: shutting down now");
                app.set_phase(Phase::Stopping);
            }
            _ = quit.recv() => {
                info!("SIGQUIT: shutting down now");
                app.set_phase(Phase::Stopping);
            }
            _ = usr1.recv() => {
                info!("SIGUSR1: pausing every pool");
                app.pools.pause(None);
            }
            _ = usr2.recv() => {
                info!("SIGUSR2: resuming every pool");
                let _ = app.pools.resume(None); // (never refused without a name)
            }
        }
    }
}

/// Takes connections until the shutdown; the Unix socket of a peered process (`peer_id`)
/// stays open until the process stops, for the cancel requests its peers forward to it
/// for its clients (a rolling restart: the process taking over the shared TCP port
/// forwards them here): a login there is refused then (`client::login`), and such a
/// connection is not counted as a client.
async fn accept_loop(app: Arc<App>, listener: Listener) {
    let mut phase = app.phase();
    let mut failures = crate::net::listener::AcceptFailures::default();
    let peers_socket = matches!(listener, Listener::Unix(..)) && app.cancel.peered();
    let open_until = if peers_socket { Phase::Stopping } else { Phase::Quiescing };
    loop {
        let accepted = tokio::select! {
            r = listener.accept(|| TcpOptions::of(&app.config.load().general)) => r,
            _ = phase.wait_for(|p| *p as u8 >= open_until as u8) => return,
        };
        match accepted {
            Ok((stream, peer)) => {
                let guard = (app.current_phase() == Phase::Running).then(|| app.track_client());
                tokio::spawn(crate::client::serve(app.clone(), stream, peer, guard));
            }
            Err(e) => failures.failed("client listener", &e).await,
        }
    }
}

/// Retires idle/old server connections and keeps min_pool_size, once a second.
async fn janitor(app: Arc<App>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut phase = app.phase();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            // A shared limit keeps a queue from connecting: make room now, not at the
            // next tick.
            _ = app.pools.room_wanted.notified() => {
                app.pools.rebalance();
                continue;
            }
            _ = phase.wait_for(|p| *p == Phase::Stopping) => return,
        }
        app.pools.rebalance();
        for pool in app.pools.upkeep() {
            let counts = pool.counts();
            if counts.waiting > 0 {
                tracing::debug!(db = %pool.key.database, user = %pool.key.user, ?counts, "clients waiting");
                pool.retry_for_waiters();
            }
            let missing = pool.maintain();
            if missing > 0 {
                let pool = pool.clone();
                tokio::spawn(async move {
                    for _ in 0..missing {
                        match pool.prefill().await {
                            Ok(true) => {}
                            // Full, or at a connection limit: the next round tries again.
                            Ok(false) => break,
                            Err(e) => {
                                warn!(db = %pool.key.database, user = %pool.key.user, "min_pool_size connect failed: {e}");
                                break;
                            }
                        }
                    }
                });
            }
        }
        retire_unused_fallback_pools(&app);
    }
}

/// The janitor's pass over the pools of databases the fallback entry serves, told which
/// databases have clients (only when the config has a fallback entry).
fn retire_unused_fallback_pools(app: &App) {
    let seen = app.pools.reloads();
    let cfg = app.config.load();
    // Before the clients are listed: a login listed later that entered a found user
    // keeps it (`FoundUsers::drop_database`).
    let listed_at = std::time::Instant::now();
    let clients = match cfg.databases.contains_key(crate::config::FALLBACK_DATABASE) {
        true => app.client_infos.list(),
        false => Vec::new(),
    };
    let busy: std::collections::HashSet<&str> = clients.iter().map(|c| c.database.as_str()).collect();
    let users = app.users.load();
    app.pools.retire_unused_fallback_pools(seen, &cfg, users.found(), &|db| busy.contains(db), listed_at);
}

/// Raises the open-files limit to its hard maximum (10,000 clients need 10,000 fds).
pub fn raise_fd_limit() {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit with a valid pointer to a local struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// A check's error (`key: message`) with the file and the line of its key, as the
/// load's errors have them.
fn placed(path: &std::path::Path, e: &str) -> String {
    let key = e.split(": ").next().unwrap_or_default();
    let text = std::fs::read_to_string(path).unwrap_or_default();
    match crate::config::locate_key(&text, &key.split('.').collect::<Vec<_>>()) {
        0 => format!("{}: {e}", path.display()), // (a user of the auth_file, say)
        line => format!("{}:{line}: {e}", path.display()),
    }
}
