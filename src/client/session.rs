//! The session state machine: Idle (no server) → Linked (a server lent for a
//! transaction, or for the whole session) → back to Idle when the transaction
//! ends, until the client leaves. Cleans up the server on every way out.

use std::sync::Arc;
use std::sync::atomic::Ordering::{Relaxed, Release, SeqCst};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncReadExt;

use super::cancelled::{self, Skipping, cancellable};
use super::interrupt::Interrupt;
use super::needs::client_need;
use super::relay::send_to_client;
use super::track::Track;
use super::{ClientConn, Exit, WAITING_INPUT_LIMIT};
use crate::app::{App, Phase};
use crate::cancel::CancelKey;
use crate::config::{PoolMode, secs};
use crate::params::ClientSettings;
use crate::pool::{Borrowed, Pool, PoolError};
use crate::prepared::ClientStatements;
use crate::protocol::{Header, TxStatus, build, fe, sqlstate};
use crate::server::ServerConn;
use crate::stats::{ClientInfo, ClientState, ServerState};

/// The client settings in force (timeouts, `server_fast_close`, `max_packet_size`,
/// `disable_pqexec`): read at login, and again whenever a reload or an admin SET has
/// been applied since (`Session::follow_reloads`), as PgBouncer applies the values in
/// force to clients already connected.
#[derive(Debug, Clone, Copy)]
pub struct ClientRules {
    pub query: Option<Duration>,
    pub idle_transaction: Option<Duration>,
    pub client_idle: Option<Duration>,
    /// `server_fast_close`.
    pub fast_close: bool,
    /// The largest length field `max_packet_size` lets through.
    pub packet_limit: usize,
    /// `disable_pqexec`: a simple Query ends the client.
    pub refuse_query: bool,
    /// The pools' reload count when they were read (`Pools::reloads`).
    seen: u64,
}

impl ClientRules {
    fn read(app: &App) -> ClientRules {
        // The count first: the config is put in place before the count goes up, so
        // this config is at least as new as the count says.
        let seen = app.pools.reloads();
        let g = &app.config.load().general;
        ClientRules {
            query: secs(g.query_timeout),
            idle_transaction: secs(g.idle_transaction_timeout),
            client_idle: secs(g.client_idle_timeout),
            fast_close: g.server_fast_close,
            packet_limit: crate::protocol::length_limit(g.max_packet_size),
            refuse_query: g.disable_pqexec,
            seen,
        }
    }
}

pub struct Session {
    pub(super) app: Arc<App>,
    /// What the admin console shows of this client.
    pub(super) info: Arc<ClientInfo>,
    pub(super) pool: Arc<Pool>,
    pub(super) mode: PoolMode,
    pub(super) settings: ClientSettings,
    /// Kept for its `Drop`, which unregisters the client's cancel key; a cancel finds
    /// the linked server through `info.server_id`.
    _cancel_key: CancelKey,
    pub(super) server: Option<Box<ServerConn>>,
    pub(super) track: Track,
    pub(super) rules: ClientRules,
    pub(super) limits: Limits,
    /// The client's named prepared statements (pooled modes).
    pub(super) stmts: ClientStatements,
    /// Client bytes the server's socket has not taken yet (the relay reads the server
    /// meanwhile).
    pub(super) to_server: crate::net::backlog::Backlog,
    /// The rest of a request cancelled while it waited for a server, being dropped.
    skipping: Skipping,
    /// Where the pool hands this client a connection when it waits for one (made at its
    /// first wait, reused by the others).
    handoff: crate::pool::WaitSlot,
}

/// The end of a session, however it ends: the client leaves the list, and a server
/// still held (only when the session did not end through `cleanup`, which returns it:
/// a panic in the client's task, or the runtime stopping) is closed and its pool slot
/// freed, so the pool does not shrink for good.
impl Drop for Session {
    fn drop(&mut self) {
        if let Some(server) = self.server.take() {
            self.pool.discard(server);
        }
        self.app.client_infos.remove(self.info.id);
    }
}

/// Prepared-statement limits copied from the config at login.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub server_statements: usize,
    pub client_statements: usize,
}

/// What the idle client asked for.
enum Wanted {
    Server,
    Leave(Exit),
}

/// How a wait for a server ended, when the client stays.
enum Linked {
    /// A server carries the client's settings and takes its request.
    Server,
    /// A CancelRequest came first: the request was answered with 57014, no server.
    Cancelled,
}

impl Session {
    pub fn new(
        app: &Arc<App>,
        info: Arc<ClientInfo>,
        pool: Arc<Pool>,
        mode: PoolMode,
        settings: ClientSettings,
        key: CancelKey,
        server: Option<Box<ServerConn>>,
    ) -> Session {
        let rules = ClientRules::read(app);
        let g = &app.config.load().general;
        let limits = Limits {
            server_statements: g.max_prepared_statements,
            client_statements: g.max_client_prepared_statements,
        };
        let s = Session {
            app: app.clone(),
            info,
            limits,
            stmts: ClientStatements::default(),
            to_server: Default::default(),
            skipping: Skipping::No,
            handoff: Default::default(),
            pool,
            mode,
            settings,
            _cancel_key: key,
            server,
            track: Track::with_rules(rules.packet_limit, rules.refuse_query),
            rules,
        };
        if let Some(server) = &s.server {
            s.info.server_id.store(server.id, Release);
            server.info.set_state(ServerState::Active, s.info.id);
        }
        s.info.set_state(if s.server.is_some() { ClientState::Active } else { ClientState::Idle });
        s
    }

    /// Serves the client until it leaves; always gives the server back.
    pub async fn run(mut self: Box<Self>, conn: &mut ClientConn) -> Exit {
        let info = self.info.clone();
        let notified = info.interrupt.notified();
        tokio::pin!(notified);
        let mut interrupt = Interrupt::new(&info, notified);
        let exit = loop {
            if self.server.is_none() {
                match self.wait_for_work(conn, &mut interrupt).await {
                    Wanted::Server => {}
                    Wanted::Leave(exit) => break exit,
                }
                match self.link(conn, &mut interrupt).await {
                    Ok(Linked::Server) => {}
                    Ok(Linked::Cancelled) => continue,
                    Err(exit) => break exit,
                }
            }
            if let Err(exit) = self.relay(conn, &mut interrupt).await {
                break exit;
            }
        };
        // The client is told first: the cleanup may wait on a server that does not answer.
        let exit = exit.told_at_once(&mut conn.stream);
        self.cleanup().await;
        exit
    }

    /// Waits, with no server, for the client's next message: as much of it as the
    /// relay must see before passing it on (a Bind's statement name, a whole Parse), so
    /// that the server it gets can be given the message at once.
    async fn wait_for_work(&mut self, conn: &mut ClientConn, interrupt: &mut Interrupt<'_, '_>) -> Wanted {
        // Since when the client sent nothing, in µs since the epoch (`client_idle_timeout`,
        // read only when one is set): from when it went idle (its state's time), then
        // from its last bytes. A wake-up (a reload setting the timeout) does not start
        // it again.
        let mut idle_from_us: Option<u64> = None;
        loop {
            // (Before the next message is looked at: `max_packet_size` applies to it.)
            self.follow_reloads();
            if self.skipping.is_active() {
                match self.skipping.advance(&mut conn.buf, self.rules.packet_limit) {
                    Err(e) => return Wanted::Leave(Exit::protocol(e)),
                    Ok(true) => {
                        let mut out = BytesMut::new();
                        build::ready_for_query(&mut out, TxStatus::Idle);
                        // (Under the interrupt: a client that does not read is still ended
                        // by a KILL or the shutdown.)
                        let sent = send_to_client(&mut conn.stream, &out, interrupt, &self.app, None).await;
                        if let Err(exit) = sent {
                            return Wanted::Leave(exit);
                        }
                    }
                    Ok(false) => {}
                }
            }
            match Header::peek_within(&conn.buf, self.rules.packet_limit) {
                // The rest of a cancelled request is still to come: read on.
                _ if self.skipping.is_active() => {}
                Err(e) => return Wanted::Leave(Exit::protocol(e)),
                Ok(Some(h)) if h.tag == fe::TERMINATE => return Wanted::Leave(Exit::Terminated),
                // Refused before a server is taken for it (the relay would refuse it).
                Ok(Some(h)) if !fe::is_session_message(h.tag) => {
                    return Wanted::Leave(Exit::protocol(crate::protocol::ProtocolError::UnknownMessage(h.tag)));
                }
                Ok(Some(h)) if h.tag == fe::FLUSH && h.frame_len != 5 => {
                    let e = crate::protocol::ProtocolError::BadLength { tag: h.tag, len: h.frame_len - 1 };
                    return Wanted::Leave(Exit::protocol(e));
                }
                Ok(Some(h)) => {
                    let need = client_need(self.mode != PoolMode::Session, self.rules.refuse_query)(h.tag);
                    // Refused (too long, or turned off) before any server is taken for it.
                    let Some(needed) = need.wanted(h.frame_len) else {
                        return Wanted::Leave(Exit::protocol(need.refusal(h)));
                    };
                    if conn.buf.len() >= needed {
                        return Wanted::Server;
                    }
                    reserve_toward(&mut conn.buf, needed);
                }
                Ok(None) => {}
            }
            if let Some(exit) = self.interruption() {
                return Wanted::Leave(exit);
            }
            // An idle client's next message is usually small: keep its buffer small
            // (the relay grows it when a transaction streams more).
            if conn.buf.capacity() - conn.buf.len() < 128 {
                conn.buf.reserve(1024);
            }
            let idle = self.rules.client_idle.map(|d| {
                let from = *idle_from_us.get_or_insert_with(|| self.info.request_time_us.load(Relaxed));
                d.saturating_sub(Duration::from_micros(crate::clock::coarse_wall_us().saturating_sub(from)))
            });
            tokio::select! {
                biased;
                r = conn.stream.read_buf(&mut conn.buf) => match r {
                    Ok(0) | Err(_) => return Wanted::Leave(Exit::Closed),
                    Ok(_) if idle.is_some() => idle_from_us = Some(crate::clock::coarse_wall_us()),
                    Ok(_) => {}
                },
                // Killed or shutting down (the checks above say which), or the timeouts
                // changed (read again above).
                _ = interrupt.fired() => {}
                _ = crate::clock::sleep_opt(idle), if idle.is_some() => {
                    return Wanted::Leave(Exit::fatal(sqlstate::PROTOCOL_VIOLATION, "client_idle_timeout: closing idle connection"));
                }
            }
        }
    }

    /// Why the client must leave before its next transaction (`interrupt::interruption`).
    fn interruption(&self) -> Option<Exit> {
        super::interrupt::interruption(&self.app, &self.info)
    }

    /// Gets a server for the client's transaction and makes it carry the client's
    /// settings. The client's EOF, a KILL or shutdown while waiting ends the wait; a
    /// client that sends more meanwhile has it kept, up to `WAITING_INPUT_LIMIT` bytes.
    /// A CancelRequest while it waits ends the wait: the request is answered with
    /// 57014 (`Linked::Cancelled`).
    async fn link(&mut self, conn: &mut ClientConn, interrupt: &mut Interrupt<'_, '_>) -> Result<Linked, Exit> {
        // A cancel request set after the client's last wait had ended (late for that
        // request) is dropped; one set from here on may still reach this request, as a
        // delayed cancel may reach the next query on PostgreSQL (`cancel::target`).
        self.info.take_cancel();
        let asked_us = crate::clock::coarse_wall_us();
        self.info.set_state_at(ClientState::Waiting, asked_us);
        tracing::debug!(client = self.info.id, counts = ?self.pool.counts(), "waiting for a server");
        let mut since = None;
        // Whether anything took time between the request and the link (a server check
        // or a SET), so the link's time must be read again.
        let mut round_trips = false;
        // A server found gone by the SET of the client's settings is replaced once.
        let mut set_failed = false;
        let server = loop {
            let Some(server) = self.checkout(conn, interrupt, &mut since).await? else {
                return self.cancelled(conn, interrupt).await;
            };
            // Killed or shut down while it waited: the request is not sent.
            if since.is_some()
                && let Some(exit) = self.interruption()
            {
                self.pool.checkin(server);
                return Err(exit);
            }
            let mut server = server;
            if self.pool.needs_check(&server) {
                round_trips = true;
                match Box::pin(self.pool.checked(server)).await {
                    Some(checked) => server = checked,
                    None => continue, // closed
                }
            }
            // The client's settings, and the values it was told at login where the server
            // started with others (`ClientSettings`). Boxed: rarely needed (settings
            // differ), and large enough to double the size of every client task if kept
            // inline. Borrowed across the round trips: a session ending during them
            // closes the server and frees its slot.
            if !server.carries_for(&self.settings) {
                let want = self.settings.wanted_on(&server.startup);
                if !server.carries(&want) {
                    round_trips = true;
                    let mut held = Borrowed::new(&self.pool, server);
                    if let Err(e) = Box::pin(held.apply_params(&want, self.pool.internal_limits())).await {
                        // Gone (its end not seen at check-out, nor checked): the
                        // request has not been sent, so another server takes it, as
                        // after a failed check. A refused SET (an ERROR) ends the client.
                        let gone = held.broken;
                        held.checkin();
                        if gone && !set_failed {
                            set_failed = true;
                            continue;
                        }
                        return Err(Exit::fatal(e.sqlstate(), format!("cannot apply session settings: {e}")));
                    }
                    server = held.take();
                }
            }
            break server;
        };
        // Killed or shut down during the check or the SET: the request is not sent either.
        if round_trips && let Some(exit) = self.interruption() {
            self.pool.checkin(server);
            return Err(exit);
        }
        self.pool.stats.waited(since.map_or(Duration::ZERO, |s| s.elapsed()));
        // A connection taken at once (`since` unset) and used as it was starts in the
        // tick the request did.
        let now_us = if since.is_some() || round_trips { crate::clock::coarse_wall_us() } else { asked_us };
        server.info.set_state_at(ServerState::Active, self.info.id, now_us);
        // SeqCst (covers the Release that makes the server's key visible to a cancel
        // that reads this id): paired with the cancel request taken below.
        self.info.server_id.store(server.id, SeqCst);
        self.info.set_state_at(ClientState::Active, now_us);
        tracing::debug!(client = self.info.id, server = server.id, "linked");
        self.track.reset();
        self.server = Some(server);
        // A cancel that found the client still waiting as the wait ended: answered as
        // if it had come during the wait (the request has not been sent).
        if self.cancel_taken(&conn.buf) {
            // Unused: back to the pool once any other cancel on its way has reached it.
            self.unlink_for_cancels().await;
            self.give_back(true);
            return self.cancelled(conn, interrupt).await;
        }
        Ok(Linked::Server)
    }

    /// Waits for a server from the pool, reading what the client sends meanwhile. None:
    /// a CancelRequest for the waiting request came first.
    async fn checkout(
        &self,
        conn: &mut ClientConn,
        interrupt: &mut Interrupt<'_, '_>,
        since: &mut Option<std::time::Instant>,
    ) -> Result<Option<Box<ServerConn>>, Exit> {
        let checkout = self.pool.checkout_since(since, &self.handoff);
        tokio::pin!(checkout);
        loop {
            tokio::select! {
                // The common case, a server at once, polls nothing else.
                biased;
                r = &mut checkout => return r.map(Some).map_err(pool_failure),
                r = conn.stream.read_buf(&mut conn.buf), if conn.buf.len() < WAITING_INPUT_LIMIT => {
                    if matches!(r, Ok(0) | Err(_)) {
                        return Err(Exit::Closed);
                    }
                }
                _ = interrupt.fired() => {
                    if let Some(exit) = self.interruption() {
                        return Err(exit);
                    }
                    if self.cancel_taken(&conn.buf) {
                        return Ok(None);
                    }
                }
            }
        }
    }

    /// Takes a cancel request for the waiting request at the front of `buf`, if it can
    /// be cancelled (`cancelled::cancellable`); one that cannot (a Sync, say) is left,
    /// and dropped when the next wait starts.
    fn cancel_taken(&self, buf: &[u8]) -> bool {
        self.info.cancel_requested() && cancellable(buf) && self.info.take_cancel()
    }

    /// Answers the request a CancelRequest reached while it waited for a server, as
    /// PostgreSQL answers a cancelled statement (`cancelled::answer`); the rest of the
    /// request is skipped as it arrives (`wait_for_work`).
    async fn cancelled(&mut self, conn: &mut ClientConn, interrupt: &mut Interrupt<'_, '_>) -> Result<Linked, Exit> {
        tracing::debug!(client = self.info.id, "request cancelled while waiting for a server");
        let mut out = BytesMut::new();
        self.skipping = cancelled::answer(&conn.buf, &mut out);
        self.info.set_state(ClientState::Idle);
        self.track.errors.push(sqlstate::QUERY_CANCELED.into());
        self.flush_stats();
        send_to_client(&mut conn.stream, &out, interrupt, &self.app, None).await?;
        Ok(Linked::Cancelled)
    }

    /// Returns the linked server to the pool (transaction ended). Here and in
    /// `cleanup` the server stays in `self.server` across the awaits: a session that
    /// ends during them (a panic, its task dropped) closes it through `Drop` and so
    /// frees its place in the pool, where a local would be dropped unaccounted.
    pub(super) async fn release(&mut self) {
        self.flush_stats();
        self.distrust_unsure_server();
        let Some(server) = self.server.as_deref() else { return };
        tracing::debug!(client = self.info.id, server = server.id, "released");
        self.unlink_for_cancels().await;
        self.info.set_state(ClientState::Idle);
        if let Some(settings) = self.pool.reset_always().filter(|_| !self.linked().broken) {
            let server = self.linked();
            if Box::pin(server.exec(&settings.reset_query, settings.internal)).await.is_err() {
                // Perhaps half done (an ERROR part way through): its state is unknown,
                // so it is closed, as in `cleanup`.
                return self.give_back(false);
            }
            server.was_reset(settings.reset_effect);
        }
        self.give_back(true);
    }

    /// After the client left: roll back, reset, and return or close the server. While
    /// Sluice shuts down, a running query's cancel is waited for (the process must not
    /// exit before it is sent), and at the last phase the server is closed at once
    /// (PostgreSQL rolls back what a Terminate leaves open) rather than rolled back and
    /// reset first.
    async fn cleanup(&mut self) {
        self.flush_stats();
        self.distrust_unsure_server();
        let Some(server) = self.server.as_deref() else { return };
        let phase = self.app.current_phase();
        if server.broken || !self.track.protocol_idle() || phase == Phase::Stopping {
            self.info.server_id.store(0, SeqCst);
            // A query is still running or the protocol state is unknown.
            if !self.track.protocol_idle() {
                let limit = self.pool.settings().cancel_timeout;
                match phase {
                    // Counted: a shutdown coming meanwhile waits for it.
                    Phase::Running => {
                        let (cancel, guard) = (server.cancel_now(limit), self.app.track_background());
                        tokio::spawn(async move {
                            cancel.await;
                            drop(guard);
                        });
                    }
                    // Bounded even with no limit set: the shutdown waits for it.
                    _ => Box::pin(server.cancel_now(Some(limit.unwrap_or(SHUTDOWN_CANCEL_LIMIT)))).await,
                }
            }
            return self.give_back(false);
        }
        self.unlink_for_cancels().await;
        if self.linked().broken {
            return self.give_back(false);
        }
        let settings = self.pool.settings();
        let limit = settings.internal;
        let reset = self.mode == PoolMode::Session || settings.reset_query_always;
        let server = self.linked();
        if server.tx != TxStatus::Idle && server.exec("ROLLBACK", limit).await.is_err() {
            return self.give_back(false);
        }
        if reset && !settings.reset_query.is_empty() {
            match server.exec(&settings.reset_query, limit).await {
                Ok(()) => server.was_reset(settings.reset_effect),
                Err(_) => return self.give_back(false),
            }
        }
        self.give_back(true);
    }

    /// Marks the linked server broken (closed when given back) if it may still answer
    /// Syncs the client sent inside a COPY that failed (`Track::server_unsure`).
    fn distrust_unsure_server(&mut self) {
        if self.track.server_unsure()
            && let Some(server) = self.server.as_deref_mut()
        {
            tracing::debug!(client = self.info.id, server = server.id, "closed: Syncs sent inside a failed COPY");
            server.broken = true;
        }
    }

    /// Reads the client settings again if a reload or admin SET was applied since they
    /// were read: a wait begun from here on (the relay's, or the idle client's) counts
    /// with the values in force.
    #[inline]
    pub(super) fn follow_reloads(&mut self) {
        if self.app.pools.reloads() != self.rules.seen {
            self.rules = ClientRules::read(&self.app);
            self.track.set_rules(self.rules.packet_limit, self.rules.refuse_query);
        }
    }

    /// The linked server (while `release` or `cleanup` works on it).
    fn linked(&mut self) -> &mut ServerConn {
        self.server.as_deref_mut().expect("a linked server")
    }

    /// The linked server goes back to the pool (`reuse`) or is closed.
    fn give_back(&mut self, reuse: bool) {
        if let Some(server) = self.server.take() {
            if reuse { self.pool.checkin(server) } else { self.pool.discard(server) }
        }
    }
}

/// How long a cancel waited for while shutting down may take when
/// `cancel_wait_timeout` sets no limit.
const SHUTDOWN_CANCEL_LIMIT: Duration = Duration::from_secs(10);

impl Session {
    /// The client's cancels stop reaching `server` (its `server_id` goes to 0), and
    /// those already on their way are let through before the server runs anything
    /// else or goes to another client (`cancel::CancelRegistry::target`).
    /// A cancel not through within its forwarding's bound (which starts a little later),
    /// or whose forwarding gave up, could still reach what the server runs next: the
    /// server is then closed, not lent again.
    async fn unlink_for_cancels(&mut self) {
        self.info.server_id.store(0, SeqCst);
        let Some(server) = self.server.as_deref_mut() else { return };
        if server.info.cancels_in_flight() {
            // Rare, and boxed: it would otherwise enlarge every session's future.
            // With no limit (`cancel_wait_timeout = 0`) the forwarding may never end:
            // the server is closed at once instead of being waited for.
            let Some(limit) = self.pool.settings().cancel_timeout else {
                server.broken = true;
                return;
            };
            let settled = tokio::time::timeout(limit, server.info.cancels_settled());
            if Box::pin(settled).await.is_err() || server.info.cancel_unsure() {
                server.broken = true;
            }
        }
    }

    /// Adds this exchange's counts to the pool's statistics.
    pub(super) fn flush_stats(&mut self) {
        self.track.flush_to(&self.pool.stats, self.mode != PoolMode::Session);
        self.info.prepared_statements.store(self.stmts.len() as u64, Relaxed);
        if let Some(s) = &self.server {
            s.info.prepared_statements.store(s.prepared.len() as u64, Relaxed);
        }
    }
}

pub(super) fn pool_failure(e: PoolError) -> Exit {
    match e {
        PoolError::Connect(e) => Exit::fatal(e.sqlstate(), format!("server connection failed: {e}")),
        PoolError::WaitTimeout => Exit::fatal(sqlstate::QUERY_CANCELED, e.to_string()),
        PoolError::Closed(_) => Exit::fatal(sqlstate::CANNOT_CONNECT_NOW, e.to_string()),
        PoolError::LoginRetry(ref f) => Exit::fatal(&f.code, e.to_string()),
    }
}

/// Room for the rest of a message the relay must see whole (up to `needed` bytes in
/// `buf`), grown as its bytes arrive: by at most what has arrived (8 KiB at first), so
/// a header declaring a 64 MiB Parse reserves nothing its sender has not begun to send.
fn reserve_toward(buf: &mut BytesMut, needed: usize) {
    let missing = needed.saturating_sub(buf.len());
    if buf.capacity() - buf.len() < missing {
        buf.reserve(missing.min(buf.len().max(8 * 1024)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_message_gets_room_as_it_arrives() {
        let needed = crate::prepared::MAX_PARSE_LEN;
        let mut buf = BytesMut::from(&b"P\x04\x00\x00\x00"[..]);
        reserve_toward(&mut buf, needed);
        assert!(buf.capacity() < 64 * 1024, "reserved {} for a 5-byte header", buf.capacity());
        // Filled as the client sends it: the room doubles at most each step, and the
        // whole message fits in the end.
        let mut steps = 0;
        while buf.len() < needed {
            reserve_toward(&mut buf, needed);
            let room = buf.capacity() - buf.len();
            assert!(room > 0 && buf.capacity() <= 4 * buf.len().max(8 * 1024), "{} for {}", buf.capacity(), buf.len());
            buf.resize((buf.len() + room).min(needed), 0);
            steps += 1;
        }
        assert!(steps < 20, "{steps} steps");
    }
}
