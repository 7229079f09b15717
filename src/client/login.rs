//! From the first byte to ReadyForQuery: TLS (SSLRequest or a direct TLS handshake),
//! GSSENCRequest refusal, cancel requests, protocol-version negotiation, limits,
//! authentication, and the login reply (ParameterStatus, BackendKeyData) for each
//! pool mode.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::AsyncReadExt;
use tracing::{info, warn};

use super::handshake::{handshake, refused_shutting_down};
use super::interrupt::{Interrupt, interruption};
use super::session::{Session, pool_failure};
use super::{ClientConn, Exit, WAITING_INPUT_LIMIT};
use crate::admin::{self, AdminSession};
use crate::app::{App, Phase};
use crate::auth::client::{AuthFailure, Method, Shown, authenticate};
use crate::config::{AuthType, Config, PoolMode, secs};
use crate::params::{ClientParams, ClientSettings, NOT_SETTINGS, is_reported};
use crate::pool::{Borrowed, LoginReply, ParamList, Pool};
use crate::protocol::startup::{self, StartupMessage};
use crate::protocol::{TxStatus, build, sqlstate};
use crate::stats::{ClientInfo, ClientState};
use crate::tls;

/// A logged-in client: a pooled session, or the admin console. Boxed, so the client
/// task does not keep a second copy of the session inline while it runs.
pub enum LoggedIn {
    Pool(Box<Session>),
    Admin(Box<AdminSession>),
}

/// The client's pool, from the config as it is now (a reload may have been applied
/// while the client authenticated): a pool created from the config read at the start of
/// the login would keep that config's settings until the next reload.
/// A client proven by nothing (`anonymous`: the config read at its login's start said
/// `auth_type = "any"`) is served only by a database's own user, while the config
/// still says `any`.
fn current_pool(app: &App, database: &str, user: &str, anonymous: bool) -> Option<Arc<crate::pool::Pool>> {
    loop {
        let seen = app.pools.reloads();
        let (cfg, users) = (app.config.load(), app.users.load());
        if anonymous && !cfg.serves_anonymous(database) {
            return None;
        }
        if let Ok(pool) = app.pools.get_current(seen, &cfg, &users, database, user) {
            return pool;
        }
    }
}

pub use super::interrupt::LoginDeadline;

/// Runs the login; Ok gives a session ready to serve queries. `deadline` bounds the
/// handshake and authentication, and the wait for a server only in a pool that has
/// not had one yet (PgBouncer's "client_login_timeout (server down)"): once a pool
/// knows its server's defaults, a login waiting for a server (session mode, or
/// settings to check) waits as any request does, under `query_wait_timeout`.
pub async fn login(app: &Arc<App>, conn: &mut ClientConn, deadline: LoginDeadline) -> Result<LoggedIn, Exit> {
    let msg = {
        let shaking = handshake(app, conn);
        tokio::pin!(shaking);
        deadline.bound(shaking).await?
    };
    if app.current_phase() != Phase::Running {
        return refused_shutting_down();
    }
    let cfg = app.config.load_full();
    let user = msg.get("user").filter(|u| !u.is_empty()).ok_or_else(|| {
        Exit::fatal(sqlstate::INVALID_AUTHORIZATION, "no PostgreSQL user name specified in startup packet")
    })?;
    let database = clip_name(msg.get("database").filter(|d| !d.is_empty()).unwrap_or(user));
    let user = clip_name(user);
    // The console is never refused for it (counted all the same), as in PgBouncer: an
    // operator must be able to look and act when clients fill the limit.
    if app.client_count() > cfg.general.max_client_conn && !admin::is_admin_database(&cfg, database) {
        return Err(Exit::fatal(sqlstate::TOO_MANY_CONNECTIONS, "no more connections allowed (max_client_conn)"));
    }
    no_replication(&msg)?;
    if admin::is_admin_database(&cfg, database) {
        let admin = admin_login(app, conn, &cfg, user, database, &msg, deadline).await;
        return admin.map(|a| LoggedIn::Admin(Box::new(a)));
    }
    if cfg.database(database).is_none() {
        return Err(Exit::fatal(sqlstate::INVALID_CATALOG_NAME, format!("database \"{database}\" does not exist")));
    }
    if app.pools.is_disabled(database) {
        return Err(Exit::fatal(
            sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
            format!("database \"{database}\" is not currently accepting connections (disabled from the admin console)"),
        ));
    }
    // Read before authentication: a malformed `options` is refused at once, and SHOW
    // CLIENTS has the application_name while the client authenticates.
    let mut params = client_params(&msg)?;
    if cfg.general.application_name_add_host {
        params.add_host(&conn.peer);
    }
    let app_name = params.get("application_name").unwrap_or_default();
    let (info, listed, greeting) = listed_and_proven(app, conn, &cfg, user, database, app_name, deadline).await?;
    let pool = current_pool(app, database, user, cfg.general.auth_type == AuthType::Any).ok_or_else(|| {
        if app.config.load().database(database).is_none() {
            // Removed by a reload while the client authenticated.
            return Exit::fatal(sqlstate::INVALID_CATALOG_NAME, format!("database \"{database}\" does not exist"));
        }
        Exit::fatal(sqlstate::INVALID_AUTHORIZATION, format!("no server login configured for user \"{user}\""))
    })?;
    // A pool that knows its server's defaults has had a server: waiting for one now is
    // `query_wait_timeout`'s business, with the rest of the login (the SETs are bounded
    // by `internal_query_timeout`).
    let deadline = if pool.learned.defaults().is_some() { LoginDeadline::NONE } else { deadline };
    let session = {
        let starting = async {
            match pool.settings().mode {
                PoolMode::Session => start_session_mode(app, conn, greeting, pool, params, info.clone()).await,
                mode => start_pooled(app, conn, greeting, pool, params, mode, info.clone()).await,
            }
        };
        tokio::pin!(starting);
        deadline.bound(starting).await?
    };
    listed.keep();
    if cfg.general.log_connections {
        info!(peer = %conn.peer, user, database, tls = tls::describe(&conn.stream), "login");
    }
    Ok(LoggedIn::Pool(Box::new(session)))
}

/// Refuses a replication connection (`replication` true or `database`; Sluice takes
/// none), and a `replication` value that is not a boolean, as PostgreSQL does.
fn no_replication(msg: &StartupMessage) -> Result<(), Exit> {
    match msg.get("replication").map(|v| (v, startup::parse_bool(v))) {
        None | Some((_, Some(false))) => Ok(()),
        Some(("database", _) | (_, Some(true))) => {
            Err(Exit::fatal(sqlstate::FEATURE_NOT_SUPPORTED, "replication connections are not supported"))
        }
        Some((value, None)) => Err(Exit::fatal(
            sqlstate::INVALID_PARAMETER_VALUE,
            format!("invalid value for parameter \"replication\": \"{value}\""),
        )),
    }
}

/// A user or database name cut to PostgreSQL's longest name (NAMEDATALEN − 1 = 63
/// bytes; at a character boundary), as PostgreSQL cuts them before anything looks at
/// them, so that pools, `auth_hba_file` lines and lookups see the name the server will.
fn clip_name(name: &str) -> &str {
    const LONGEST: usize = 63;
    let mut end = name.len().min(LONGEST);
    while !name.is_char_boundary(end) {
        end -= 1;
    }
    &name[..end]
}

/// Lists the client in `App::client_infos` (SHOW CLIENTS shows it logging in; KILL and
/// the pooler's shutdown reach it from here on) and authenticates it under its
/// interrupt, within `deadline`. A refused client gets its error after
/// `auth_failure_delay`, which the deadline does not cut short. Gives its info, the
/// listing (which the caller keeps once the login succeeds) and what the login reply
/// starts with (`prove`).
async fn listed_and_proven<'a>(
    app: &'a Arc<App>,
    conn: &mut ClientConn,
    cfg: &Config,
    user: &str,
    database: &str,
    application_name: &str,
    deadline: LoginDeadline,
) -> Result<(Arc<ClientInfo>, Listed<'a>, BytesMut), Exit> {
    let info = ClientInfo::new(app.client_id(), user, database, &conn.peer, conn.stream.is_tls());
    let info = Arc::new(info.on_console(admin::is_admin_database(cfg, database)));
    *info.application_name.lock() = application_name.to_string();
    let listed = Listed::new(app, &info);
    let proving = async {
        let proof = {
            let proving = prove(app, conn, cfg, user, database);
            tokio::pin!(proving);
            deadline.bound(proving).await?
        };
        match proof {
            Proof::Proven(greeting) => Ok(greeting),
            Proof::Refused(exit) => {
                // Under the interrupt: a KILL or the shutdown ends it early.
                if let Some(d) = secs(cfg.general.auth_failure_delay) {
                    tokio::time::sleep(d).await;
                }
                Err(exit)
            }
        }
    };
    tokio::pin!(proving);
    let greeting = interruptible(app, &info, proving).await?;
    Ok((info, listed, greeting))
}

/// How an authentication exchange ended, the client still there.
enum Proof {
    /// What the login reply starts with (see `Proven::greeting`).
    Proven(BytesMut),
    /// Refused (logged already): the client gets this after `auth_failure_delay`.
    Refused(Exit),
}

/// A client listed in `App::client_infos` while it logs in: unlisted again when the
/// login fails or is abandoned (`client_login_timeout`); once it succeeds, the session
/// unlists it when it ends.
struct Listed<'a> {
    app: &'a App,
    id: u64,
}

impl<'a> Listed<'a> {
    fn new(app: &'a App, info: &Arc<ClientInfo>) -> Self {
        app.client_infos.insert(info.id, info.clone());
        Listed { app, id: info.id }
    }

    fn keep(self) {
        std::mem::forget(self);
    }
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        self.app.client_infos.remove(self.id);
    }
}

/// A server for a login's round trips (session mode's own server, or learning how the
/// server spells settings), checked as for any loan. The client waits as `waiting`
/// (SHOW POOLS `cl_waiting`); a KILL or the pooler shutting down ends the wait, and so
/// does the client leaving (it does not keep its place in the queue). What it sends
/// meanwhile is kept for its session, up to `WAITING_INPUT_LIMIT` bytes.
async fn login_checkout<'p>(
    app: &App,
    pool: &'p Arc<Pool>,
    info: &ClientInfo,
    conn: &mut ClientConn,
) -> Result<Borrowed<'p>, Exit> {
    info.set_state(ClientState::Waiting);
    // Checked before the loan as a transaction's server is (`server_check_delay`).
    let waiting = async { pool.checkout_checked().await.map_err(pool_failure) };
    let checkout = async {
        tokio::pin!(waiting);
        loop {
            tokio::select! {
                biased;
                r = &mut waiting => return r,
                r = conn.stream.read_buf(&mut conn.buf), if conn.buf.len() < WAITING_INPUT_LIMIT => {
                    if matches!(r, Ok(0) | Err(_)) {
                        return Err(Exit::Closed);
                    }
                }
            }
        }
    };
    tokio::pin!(checkout);
    let got = interruptible(app, info, checkout).await;
    info.set_state(ClientState::Login);
    Ok(Borrowed::new(pool, got?))
}

/// Runs a step of a listed client's login until it ends, or until a KILL or the
/// pooler's shutdown interrupts it (`interruption`).
async fn interruptible<T, F>(app: &App, info: &ClientInfo, mut step: Pin<&mut F>) -> Result<T, Exit>
where
    F: Future<Output = Result<T, Exit>> + ?Sized,
{
    let notified = info.interrupt.notified();
    tokio::pin!(notified);
    let mut interrupt = Interrupt::new(info, notified);
    loop {
        if let Some(exit) = interruption(app, info) {
            return Err(exit);
        }
        tokio::select! {
            biased;
            r = step.as_mut() => return r,
            _ = interrupt.fired() => {}
        }
    }
}

/// Authenticates the client as `user` per `auth_type` (or the `auth_hba_file`).
async fn prove(app: &Arc<App>, conn: &mut ClientConn, cfg: &Config, user: &str, database: &str) -> Result<Proof, Exit> {
    if super::method::own_socket_admin(cfg, conn, user, database) {
        return Ok(Proof::Proven(BytesMut::new()));
    }
    let (method, map) = match super::method::login_method(cfg, conn, user, database) {
        Ok(chosen) => chosen,
        Err(refused) => return Ok(Proof::Refused(refused)),
    };
    if method == Method::Any {
        // Nothing to check, and no user to look up: the database's own user logs in.
        return Ok(Proof::Proven(BytesMut::new()));
    }
    let users = app.users.load_full();
    let listed = users.get(user);
    let (auth_user, candidate) = match listed {
        // The console's users are the config's (`admin_users`, `stats_users`): no lookup
        // (the fallback entry would otherwise serve the console's name).
        _ if admin::is_admin_database(cfg, database) => (listed.cloned(), None),
        Some(u) if !crate::auth::looked_up_though_listed(cfg, database, u) => (Some(u.clone()), None),
        // Boxed: only logins of users the config does not list (or lists without a
        // password) pay for its future.
        _ => match Box::pin(super::lookup::looked_up(app, &users, database, user)).await? {
            Some(c) => (Some(c.user.clone()), Some(c)),
            None => (listed.cloned(), None),
        },
    };
    let cert_name = tls::peer_common_name(&conn.stream);
    let os_user = if method == Method::Peer { super::method::os_user(&conn.stream).await } else { None };
    let pam = (method == Method::Pam).then(|| super::lookup::pam_place(cfg, &conn.peer));
    let shown = Shown { cert_name: cert_name.as_deref(), os_user: os_user.as_deref(), map, pam };
    let exchange =
        authenticate(&mut conn.stream, &mut conn.buf, method, user, auth_user.as_deref(), &app.checks, shown);
    let proven = match exchange.await {
        Ok(p) => p,
        Err(AuthFailure::Closed) => return Err(Exit::Closed),
        Err(e) => {
            // Logged before the delay (`listed_and_proven`).
            let (cn, os_user, detail) = (cert_name.as_deref(), os_user.as_deref(), e.detail());
            let map = map.map(|m| m.name);
            warn!(peer = %conn.peer, user, database, client_cn = cn, os_user, map, detail, "login failed: {e}");
            return Ok(Proof::Refused(Exit::fatal(e.sqlstate(), e.to_string())));
        }
    };
    let auth_user = match (candidate, proven.pam_password) {
        (Some(found), _) => Some(super::lookup::adopt(app, &users, database, found)),
        (None, Some(p)) if crate::auth::pam_logs_in(cfg, user) && !admin::is_admin_database(cfg, database) => {
            Some(super::lookup::adopt_pam(app, &users, database, user, p)?)
        }
        (None, _) => auth_user,
    };
    if let (Some(key), Some(u)) = (proven.client_key, &auth_user) {
        u.server.learn_client_key(key);
    }
    Ok(Proof::Proven(proven.greeting))
}

/// Login to the admin console: the usual authentication, then `admin_users` or
/// `stats_users` must list the user (`method::console_role`).
async fn admin_login(
    app: &Arc<App>,
    conn: &mut ClientConn,
    cfg: &Config,
    user: &str,
    database: &str,
    msg: &StartupMessage,
    deadline: LoginDeadline,
) -> Result<AdminSession, Exit> {
    let app_name = msg.get("application_name").unwrap_or_default();
    // As pooled clients are (KILL never reaches the console's clients; KILL_CLIENT and
    // the shutdown do).
    let (info, listed, mut out) = listed_and_proven(app, conn, cfg, user, database, app_name, deadline).await?;
    let Some(role) = super::method::console_role(cfg, conn, user, database) else {
        warn!(peer = %conn.peer, user, "admin console login refused: not in admin_users or stats_users");
        return Err(Exit::fatal(
            sqlstate::INSUFFICIENT_PRIVILEGE,
            format!("user \"{user}\" is not allowed on the admin console (admin_users, stats_users)"),
        ));
    };
    build::auth_ok(&mut out);
    let version = format!("{}/sluice", env!("CARGO_PKG_VERSION"));
    for (k, v) in [
        ("server_version", version.as_str()),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("TimeZone", "UTC"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
        ("application_name", app_name),
    ] {
        build::parameter_status(&mut out, k.as_bytes(), v.as_bytes());
    }
    let (pid, secret) = app.cancel.unlisted_key();
    build::backend_key_data(&mut out, pid, secret);
    build::ready_for_query(&mut out, TxStatus::Idle);
    conn.stream.send(&out).await.map_err(|_| Exit::Closed)?;
    if cfg.general.log_connections {
        info!(peer = %conn.peer, user, database, "admin console login");
    }
    let session = AdminSession::new(app, info, role);
    listed.keep();
    Ok(session)
}

/// The session settings a client asked for in its startup packet.
fn client_params(msg: &StartupMessage) -> Result<ClientParams, Exit> {
    let mut list = Vec::new();
    for (k, v) in msg.params() {
        if k == "options" {
            let opts = startup::parse_options(v).map_err(|e| Exit::fatal(sqlstate::PROTOCOL_VIOLATION, e))?;
            list.extend(opts);
        } else if !NOT_SETTINGS.contains(&k) && !k.starts_with("_pq_.") {
            list.push((k.to_string(), v.to_string()));
        }
    }
    Ok(ClientParams::new(list))
}

/// A server for a login's round trips (`login_checkout`) carrying the client's
/// settings; a value the server rejects ends the login with the server's own error, as
/// a direct connection would. A server found gone by the SET (its end not seen at
/// check-out, nor checked) is replaced once, as after a failed check. Also gives how
/// long the client waited for the server.
async fn server_with<'p>(
    app: &App,
    pool: &'p Arc<Pool>,
    info: &ClientInfo,
    conn: &mut ClientConn,
    params: &ClientParams,
) -> Result<(Borrowed<'p>, Duration), Exit> {
    let limit = pool.internal_limits();
    let mut retried = false;
    let mut waited = Duration::ZERO;
    loop {
        let asked = Instant::now();
        let mut server = login_checkout(app, pool, info, conn).await?;
        waited += asked.elapsed();
        let Err(e) = server.apply_params(params, limit).await else { return Ok((server, waited)) };
        let gone = server.broken;
        server.checkin();
        if !gone || retried {
            return Err(Exit::fatal(e.sqlstate(), e.to_string()));
        }
        retried = true;
    }
}

/// Session mode: the client gets a server for its whole life, and sees that server's
/// own parameters and cancel key. `out` holds what the reply starts with (`prove`).
async fn start_session_mode(
    app: &Arc<App>,
    conn: &mut ClientConn,
    mut out: BytesMut,
    pool: Arc<Pool>,
    params: ClientParams,
    info: Arc<ClientInfo>,
) -> Result<Session, Exit> {
    let (server, waited) = server_with(app, &pool, &info, conn, &params).await?;
    // A server assigned, for the session (SHOW STATS, the wait histogram), as a
    // transaction's is in the pooled modes.
    pool.stats.waited(waited);
    // The server's process id (notifications carry it; a random one with `peer_id`), a
    // secret of Sluice's.
    let key = app.cancel.register_with_pid(Some(server.cancel_key().0), &info, &pool);
    build::auth_ok(&mut out);
    for (k, v) in &server.reported {
        build::parameter_status(&mut out, k.as_bytes(), v.as_bytes());
    }
    build::backend_key_data(&mut out, key.pid, key.secret);
    build::ready_for_query(&mut out, TxStatus::Idle);
    // A client gone before its reply: the borrowed server is closed on the way out.
    conn.stream.send(&out).await.map_err(|_| Exit::Closed)?;
    let server = server.take();
    let settings = ClientSettings::new(params, server.startup.clone());
    Ok(Session::new(app, info, pool, PoolMode::Session, settings, key, Some(server)))
}

/// Transaction and statement mode: the client is told the server defaults overlaid
/// with its own settings in the server's spelling. Worked out once per distinct set
/// of settings and kept by the pool (`Learned::reply`). `out` holds what the reply
/// starts with (`prove`).
async fn start_pooled(
    app: &Arc<App>,
    conn: &mut ClientConn,
    mut out: BytesMut,
    pool: Arc<Pool>,
    params: ClientParams,
    mode: PoolMode,
    info: Arc<ClientInfo>,
) -> Result<Session, Exit> {
    let reply = match pool.learned.reply(&params) {
        Some(r) => r,
        None => work_out_reply(app, conn, &pool, &info, params).await?,
    };
    out.reserve(reply.status.len() + 64);
    build::auth_ok(&mut out);
    out.extend_from_slice(&reply.status);
    let key = app.cancel.register(&info, &pool);
    build::backend_key_data(&mut out, key.pid, key.secret);
    build::ready_for_query(&mut out, TxStatus::Idle);
    conn.stream.send(&out).await.map_err(|_| Exit::Closed)?;
    Ok(Session::new(app, info, pool, mode, ClientSettings::new(reply.kept, reply.told), key, None))
}

/// The login reply for a client asking for `asked`: the server spellings of its
/// values are learned from a server the first time (which also checks them), and
/// settings equal to a server default are dropped (no SET on each checkout).
async fn work_out_reply(
    app: &App,
    conn: &mut ClientConn,
    pool: &Arc<Pool>,
    info: &ClientInfo,
    asked: ClientParams,
) -> Result<LoginReply, Exit> {
    let learned = &pool.learned;
    // Names of their own per client (`application_name_add_host`): neither their
    // spellings nor the settings lists and replies holding them are kept, as no other
    // client will ask for them (the pool's caps stay for settings that recur).
    let per_client = app.config.load().general.application_name_add_host;
    let mut defaults = learned.defaults();
    let unknown = asked.iter().any(|(k, v)| learned.spelling(k, v).is_none());
    if defaults.is_none() || unknown {
        let (server, _) = server_with(app, pool, info, conn, &asked).await?;
        for (k, v) in asked.iter().filter(|(k, _)| !(per_client && *k == "application_name")) {
            let canon = if is_reported(k) { server.reported(k).unwrap_or(v) } else { v };
            learned.learn_canonical(k, v, canon);
        }
        server.checkin();
        defaults = learned.defaults();
    }
    let defaults = defaults.unwrap_or_default();
    // Each value's server spelling, looked up once for the reply and for keeping it.
    let spelled: Vec<Spelled<'_>> = asked.iter().map(|(k, v)| (k, v, learned.spelling(k, v))).collect();
    let mut kept = asked.clone();
    for (k, _, canon) in &spelled {
        if defaults.iter().any(|(dk, dv)| dk.eq_ignore_ascii_case(k) && canon.as_deref() == Some(dv.as_str())) {
            kept.remove(k);
        }
    }
    if !per_client {
        learned.intern(&mut kept);
    }
    let reply = LoginReply { kept, status: reply_status(&defaults, &spelled), told: defaults };
    // Kept only when every spelling was known.
    if !per_client && spelled.iter().all(|(.., canon)| canon.is_some()) {
        learned.remember_reply(asked, &reply);
    }
    Ok(reply)
}

/// A client's setting as asked for: name, value as sent, and the server's spelling of
/// the value when known.
type Spelled<'a> = (&'a str, &'a str, Option<Arc<str>>);

/// The ParameterStatus block of a login reply: each server default, or the client's own
/// value for it in the server's spelling when known. A value without a known spelling
/// (past the pool's cap on spellings, or a reload moved the pool meanwhile) is
/// announced as the client sent it.
fn reply_status(defaults: &ParamList, spelled: &[Spelled<'_>]) -> Bytes {
    let mut status = BytesMut::with_capacity(512);
    for (k, v) in defaults.iter() {
        let mine = spelled.iter().find(|(lk, ..)| lk.eq_ignore_ascii_case(k));
        let value = mine.map_or(v.as_str(), |(_, cv, canon)| canon.as_deref().unwrap_or(cv));
        build::parameter_status(&mut status, k.as_bytes(), value.as_bytes());
    }
    status.freeze()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    use crate::net::Stream;
    use crate::net::listener::Peer;
    use crate::protocol::fields::parameter_status;
    use crate::protocol::{Header, body};

    const LOGIN_FUTURE_LIMIT: usize = 6000;

    fn statuses(mut b: &[u8]) -> Vec<(String, String)> {
        let mut out = Vec::new();
        while let Some(h) = Header::peek(b).unwrap() {
            let (k, v) = parameter_status(body(&b[..h.frame_len])).unwrap();
            out.push((String::from_utf8_lossy(k).into_owned(), String::from_utf8_lossy(v).into_owned()));
            b = &b[h.frame_len..];
        }
        out
    }

    /// The login's future is moved whole into its box once per connection (`serve`), so
    /// its size is paid by every login: callgrind counted ~9,500 instructions more per
    /// connection when two wrappers each stored their step twice (9,024 bytes, against
    /// 4,800 since; 4,944 once it held the `client_login_timeout` deadline). The bound
    /// catches such a growth.
    #[tokio::test]
    async fn the_login_future_stays_small() {
        let text = "[databases.app]\n[users.u]\npassword = \"p\"\n";
        let app = App::new(Config::parse(text, std::path::Path::new("sluice.toml")).unwrap()).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let _client = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let (socket, addr) = listener.accept().await.unwrap();
        let (buf, peer) = (BytesMut::new(), Peer::Tcp(addr));
        let mut conn = ClientConn { stream: Stream::Tcp(socket), buf, peer, splice: Default::default(), guard: None };
        let size = std::mem::size_of_val(&login(&app, &mut conn, LoginDeadline::after(Some(Duration::from_secs(60)))));
        assert!(size <= LOGIN_FUTURE_LIMIT, "the login future grew to {size} bytes");
    }

    #[test]
    fn login_status_spells_known_values_and_announces_others_as_sent() {
        let defaults: ParamList = vec![
            ("TimeZone".into(), "UTC".into()),
            ("application_name".into(), "".into()),
            ("DateStyle".into(), "ISO, MDY".into()),
        ];
        let spelled: Vec<Spelled<'_>> = vec![
            ("timezone", "asia/tokyo", Some("Asia/Tokyo".into())),
            // Past the cap on spellings: none known, the value goes out as sent.
            ("application_name", "app 10001", None),
        ];
        let got = statuses(&reply_status(&defaults, &spelled));
        let want = [("TimeZone", "Asia/Tokyo"), ("application_name", "app 10001"), ("DateStyle", "ISO, MDY")];
        assert_eq!(got, want.map(|(k, v)| (k.to_string(), v.to_string())));
    }
}
