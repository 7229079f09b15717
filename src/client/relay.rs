//! The relay: while a server is linked, bytes flow both ways as they arrive. Only
//! message headers are read, plus the few messages that matter whole (Terminate from
//! the client; ReadyForQuery, ParameterStatus and ErrorResponse from the server).
//! Each read is forwarded with one write. The transaction ends, and the server goes
//! back to the pool, when every Query/Sync has been answered by a ReadyForQuery 'I'.

use std::task::Poll;
use std::time::Instant;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::extended::ClientCtx;
use super::interrupt::Interrupt;
use super::session::Session;
use super::track::{CopyIn, EarlySyncs, Seen};
use super::{ClientConn, Exit};
use crate::app::{App, Phase};
use crate::clock::sleep_opt;
use crate::config::PoolMode;
use crate::net::Stream;
use crate::net::backlog::Event;
use crate::protocol::build::{self, Severity};
use crate::protocol::{ProtocolError, TxStatus, sqlstate};

fn server_lost(detail: Option<String>) -> Exit {
    let message = match detail {
        Some(d) => format!("server connection lost: {d}"),
        None => "server closed the connection unexpectedly".to_string(),
    };
    Exit::fatal(sqlstate::CONNECTION_FAILURE, message)
}

const STATEMENT_MODE_REFUSAL: &str = "transaction blocks are not allowed in statement pooling mode";

/// What woke the relay.
enum Woke {
    /// Client bytes arrived (this many).
    Client(usize),
    /// Server bytes arrived.
    Server,
    /// Something the loop's checks handle (a kill, shutdown), or a backlog written out.
    Other,
}

/// The client's input cannot be relayed: the session ends, and nothing of this read
/// reaches the server. If the start of a message was relayed before (`partial`: a
/// CopyData streamed in pieces), the server waits for a rest that will never come, so it
/// is closed, never lent to another client; otherwise it goes back to the pool.
/// (Out of line: rare.)
#[cold]
#[inline(never)]
fn client_input_refused(server: &mut crate::server::ServerConn, e: ProtocolError, partial: bool) -> Exit {
    server.broken |= partial;
    match e {
        ProtocolError::Limit(what) => Exit::fatal(sqlstate::CONFIGURATION_LIMIT_EXCEEDED, what),
        e => Exit::protocol(e),
    }
}

fn query_timed_out(server: &mut crate::server::ServerConn) -> Exit {
    server.broken = true;
    query_timeout()
}

fn query_timeout() -> Exit {
    Exit::fatal(sqlstate::QUERY_CANCELED, "query_timeout: query took too long")
}

/// Writes `out` to the client. The usual write takes it all at once (tried first, with
/// no wait set up); a client that has stopped reading does not hold the relay, and its
/// server, for ever: a KILL, the shutdown's last phase (`Interrupt::ends_now`) or the
/// query's deadline ends the wait.
#[inline]
pub(super) async fn send_to_client(
    stream: &mut Stream,
    out: &[u8],
    interrupt: &mut Interrupt<'_, '_>,
    app: &App,
    deadline: Option<Instant>,
) -> Result<(), Exit> {
    let now = std::future::poll_fn(|cx| {
        let mut s = std::pin::Pin::new(&mut *stream);
        Poll::Ready(match s.as_mut().poll_write(cx, out) {
            Poll::Ready(Ok(n)) if n == out.len() => match s.poll_flush(cx) {
                Poll::Ready(Ok(())) => Ok(None),
                _ => Ok(Some(n)),
            },
            Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => Err(Exit::Closed),
            Poll::Ready(Ok(n)) => Ok(Some(n)),
            Poll::Pending => Ok(Some(0)),
        })
    })
    .await?;
    match now {
        None => Ok(()),
        Some(n) => send_to_client_slowly(stream, &out[n..], interrupt, app, deadline).await,
    }
}

/// `send_to_client` once the client's socket did not take everything at once.
#[inline(never)]
async fn send_to_client_slowly(
    stream: &mut Stream,
    mut out: &[u8],
    interrupt: &mut Interrupt<'_, '_>,
    app: &App,
    deadline: Option<Instant>,
) -> Result<(), Exit> {
    loop {
        // Written, then flushed (a TLS stream may hold back the tail of a write).
        let step = async {
            if out.is_empty() { stream.flush().await.map(|()| None) } else { stream.write(out).await.map(Some) }
        };
        tokio::select! {
            biased;
            r = step => match r {
                Ok(None) => return Ok(()),
                Ok(Some(0)) | Err(_) => return Err(Exit::Closed),
                Ok(Some(n)) => out = &out[n..],
            },
            // Part of the client's output is still unsent: it ends mid-message.
            _ = sleep_opt(deadline.map(|d| d.saturating_duration_since(Instant::now()))), if deadline.is_some() => {
                return Err(query_timeout().mid_message());
            }
            _ = interrupt.fired() => {
                if let Some(exit) = interrupt.ends_now(app) {
                    return Err(exit.mid_message());
                }
            }
        }
    }
}

/// How much of the answers to requests sent before a client's Terminate Sluice reads
/// and drops (`drains_after_terminate`) before it cancels the rest and closes the server.
const DRAIN_LIMIT: usize = 1 << 20;

fn reserve(buf: &mut BytesMut, chunk: usize) {
    if buf.capacity() - buf.len() < chunk / 4 {
        buf.reserve(chunk);
    }
}

impl Session {
    /// Relays until the transaction ends (Ok: the server went back to the pool) or
    /// the connection ends (Err).
    pub(super) async fn relay(&mut self, conn: &mut ClientConn, interrupt: &mut Interrupt<'_, '_>) -> Result<(), Exit> {
        // Ended with the client's output in the middle of a server message: no FATAL
        // can follow it.
        let r = self
            .relay_loop(conn, interrupt)
            .await
            .map_err(|exit| if self.track.server_scan.mid_message() { exit.mid_message() } else { exit });
        conn.splice.reset();
        if !self.to_server.is_empty() {
            // Ended with part of the client's input still unsent: the server may hold
            // half a message.
            self.to_server.clear();
            if let Some(server) = self.server.as_mut() {
                server.broken = true;
            }
        }
        r
    }

    async fn relay_loop(&mut self, conn: &mut ClientConn, interrupt: &mut Interrupt<'_, '_>) -> Result<(), Exit> {
        // (A reload while the client waited for its server.)
        self.follow_reloads();
        self.forward_client(conn, interrupt, None).await?;
        // Room kept for the client's next read: small (most requests are), bigger once
        // a read fills it (COPY FROM STDIN, large Bind): no reallocation for the usual
        // short exchange, few reads for a long stream.
        let mut client_chunk = 1024;
        loop {
            if self.track.terminated && !self.drains_after_terminate() {
                return Err(Exit::Terminated);
            }
            if self.mode != PoolMode::Session && self.releasable() {
                match self.track.early_syncs {
                    // Not yet: a ReadyForQuery may still come (`EarlySyncs`). (Not into a
                    // COPY either: the server would read the probe as its data.)
                    EarlySyncs::Unsure if self.track.copy_in == CopyIn::Off => self.probe_server().await?,
                    EarlySyncs::Unsure | EarlySyncs::Probed(_) | EarlySyncs::ProbeAnswered => {}
                    EarlySyncs::None | EarlySyncs::Counted => {
                        self.release().await;
                        return Ok(());
                    }
                }
            }
            if self.info.is_killed() {
                return Err(Exit::killed());
            }
            self.check_phase()?;
            self.follow_reloads();
            if self.rules.fast_close && self.mode == PoolMode::Session {
                self.fast_close()?;
            }
            let server = self.server.as_mut().expect("relay without a server");
            reserve(&mut conn.buf, client_chunk);
            reserve(&mut server.buf, 16 * 1024);
            let client_room = conn.buf.capacity() - conn.buf.len();
            let t = &self.track;
            let query_deadline = self.rules.query.zip(t.timed_from).map(|(d, s)| s + d).filter(|_| t.awaiting_server());
            // Nothing due from the server (no Execute answered only at a later Sync), in a
            // transaction block, or in the implicit transaction of extended messages the
            // client has not synced yet (an Execute answered through a Flush: its locks
            // are held until the Sync), as PgBouncer counts a linked client it is not
            // answering.
            let idle_in_tx = !t.awaiting_server() && (t.tx.is_some_and(|s| s != TxStatus::Idle) || t.unsynced);
            let idle_deadline =
                self.rules.idle_transaction.zip(t.idle_since).map(|(d, s)| s + d).filter(|_| idle_in_tx);
            // (Nor is the client read while a probe is out: late answers to what it sent
            // before may still come, and replies Sluice gives itself must not pass them.)
            let wait = self.track.ext.holding() || self.track.terminated || self.track.early_syncs.probing();
            let woke = if !self.to_server.is_empty() || wait {
                self.wait_on_server(interrupt, query_deadline).await?
            } else {
                tokio::select! {
                    biased;
                    r = conn.stream.read_buf(&mut conn.buf) => match r {
                        Ok(0) | Err(_) => return Err(Exit::Closed),
                        Ok(n) => Woke::Client(n),
                    },
                    r = server.stream.read_buf(&mut server.buf) => match r {
                        Ok(0) | Err(_) => return Err(self.server_gone()),
                        Ok(_) => Woke::Server,
                    },
                    // Disabled branches are not polled: no timer work without a deadline.
                    _ = sleep_opt(query_deadline.map(|d| d.saturating_duration_since(Instant::now()))), if query_deadline.is_some() => {
                        return Err(query_timed_out(server));
                    }
                    _ = sleep_opt(idle_deadline.map(|d| d.saturating_duration_since(Instant::now()))), if idle_deadline.is_some() => {
                        return Err(Exit::fatal(sqlstate::IDLE_IN_TRANSACTION_TIMEOUT, "idle_transaction_timeout: transaction left idle too long"));
                    }
                    // Killed or shutting down: the checks at the top of the loop say which.
                    _ = interrupt.fired() => Woke::Other,
                }
            };
            // What was read is scanned under the settings now in force (a reload while
            // the relay waited: `max_packet_size`).
            self.follow_reloads();
            match woke {
                Woke::Client(n) => {
                    // A full read of at least 1 KB: a stream, not a short request.
                    if n >= client_room && n >= 1024 {
                        client_chunk = 8 * 1024;
                    }
                    self.forward_client(conn, interrupt, query_deadline).await?
                }
                Woke::Server => {
                    let held = self.track.ext.holding();
                    self.forward_server(conn, interrupt, query_deadline).await?;
                    if held && !self.track.ext.holding() && !conn.buf.is_empty() {
                        // The answer a message was held for came: on with the client's input.
                        self.forward_client(conn, interrupt, query_deadline).await?;
                    }
                }
                Woke::Other => {}
            }
        }
    }

    /// The relay's wait while the client is not read: the server's socket holds back
    /// client input (written as it drains), or a message waits for a shape check's
    /// answer (`Extended::holding`). The server is read all the while: PostgreSQL reads
    /// no more input until its output is read.
    async fn wait_on_server(
        &mut self,
        interrupt: &mut Interrupt<'_, '_>,
        query_deadline: Option<Instant>,
    ) -> Result<Woke, Exit> {
        let server = self.server.as_mut().expect("relay without a server");
        tokio::select! {
            biased;
            ev = self.to_server.read_or_drain(&mut server.stream, &mut server.buf) => match ev {
                Event::Read(Ok(0) | Err(_)) => Err(self.server_gone()),
                Event::Read(Ok(_)) => Ok(Woke::Server),
                Event::Drained(Ok(())) => Ok(Woke::Other),
                Event::Drained(Err(_)) => {
                    server.broken = true;
                    Err(server_lost(None))
                }
            },
            _ = sleep_opt(query_deadline.map(|d| d.saturating_duration_since(Instant::now()))), if query_deadline.is_some() => {
                Err(query_timed_out(server))
            }
            // Killed or shutting down: the relay loop's checks say which.
            _ = interrupt.fired() => Ok(Woke::Other),
        }
    }

    /// Sends the probe that tells when a server that may still answer Syncs sent inside
    /// a failed COPY is done (`Track::probe`); it is released after the answer.
    async fn probe_server(&mut self) -> Result<(), Exit> {
        let mut out = BytesMut::new();
        self.track.probe(&mut out);
        let server = self.server.as_mut().expect("relay without a server");
        tracing::debug!(client = self.info.id, server = server.id, "probing: Syncs sent inside a failed COPY");
        // Nothing is waiting to go to the server (`releasable`), so a plain send keeps
        // the order (and the backlog's write stays inlined in the relay's hot path).
        if server.stream.send(&out).await.is_err() {
            server.broken = true;
            return Err(server_lost(None));
        }
        Ok(())
    }

    /// The server closed its connection (or reading it failed).
    fn server_gone(&mut self) -> Exit {
        if let Some(server) = self.server.as_mut() {
            server.broken = true;
        }
        server_lost(self.track.server_fatal.take())
    }

    /// After the client's Terminate, whether the requests it sent before are still
    /// being answered: they run to their end, as on PostgreSQL, which reads the
    /// Terminate only after them (their answers are read and dropped, under
    /// `query_timeout`), and the server is then given back. Only while a
    /// ReadyForQuery is due (extended messages with no Sync would wait for ever: such a
    /// server is closed, its implicit transaction rolled back as PostgreSQL would), not
    /// inside a COPY FROM STDIN (its data will not come), and only while the answers fit
    /// in what a socket holds (`DRAIN_LIMIT`): PostgreSQL writing more to a client gone
    /// would fail, and stop.
    fn drains_after_terminate(&self) -> bool {
        (self.track.pending > 0 || !self.to_server.is_empty())
            && self.track.copy_in == CopyIn::Off
            && self.track.dropped_after_terminate < DRAIN_LIMIT
    }

    /// `server_fast_close`: in session mode, between transactions, a server marked for
    /// closing (RECONNECT, a reload moving its database, its host name's address gone)
    /// is closed, and its client with it, so that the client sees its session end.
    #[cold]
    #[inline(never)]
    fn fast_close(&mut self) -> Result<(), Exit> {
        if !self.releasable() {
            return Ok(());
        }
        let server = self.server.as_mut().expect("relay without a server");
        if !self.pool.close_needed(&server.info) && !self.pool.left_behind(&server.info) {
            return Ok(());
        }
        server.broken = true;
        Err(Exit::fatal(
            sqlstate::ADMIN_SHUTDOWN,
            "server_fast_close: the server connection was closed (RECONNECT, a reload, or a new address for its host)",
        ))
    }

    fn releasable(&self) -> bool {
        self.track.protocol_idle()
            && self.to_server.is_empty()
            && self.server.as_ref().is_some_and(|s| s.tx == TxStatus::Idle)
    }

    /// Ends the session on shutdown: at once when stopping, at the end of the
    /// transaction when draining (session mode; pooled modes drain when idle).
    fn check_phase(&self) -> Result<(), Exit> {
        let phase = self.app.current_phase();
        if phase == Phase::Stopping || (phase == Phase::Draining && self.releasable()) {
            return Err(Exit::shutting_down());
        }
        Ok(())
    }

    async fn forward_client(
        &mut self,
        conn: &mut ClientConn,
        interrupt: &mut Interrupt<'_, '_>,
        query_deadline: Option<Instant>,
    ) -> Result<(), Exit> {
        let splice = &mut conn.splice;
        let server = self.server.as_mut().expect("relay without a server");
        let gens = self.pool.stmt_gens.load();
        let ctx = (self.mode != PoolMode::Session).then_some(ClientCtx {
            gens: &gens,
            epoch: self.pool.schema_epoch.load(std::sync::atomic::Ordering::Acquire),
            settings: self.settings.kept.parse_hash(),
            stmts: &mut self.stmts,
            server: &mut server.prepared,
            cap: self.limits.server_statements,
            client_limit: self.limits.client_statements,
            tx: server.tx,
            in_copy: false,
        });
        // Part of a message is at the server already (relayed in pieces), its rest to come.
        let partial = self.track.client_scan.mid_message();
        // Session mode never links again: a request's start is its `request_time`.
        let session_idle = ctx.is_none() && !self.track.awaiting_server();
        let n = match self.track.scan_client(&conn.buf, splice, ctx) {
            Ok(n) => n,
            Err(e) => return Err(client_input_refused(server, e, partial)),
        };
        if session_idle && self.track.awaiting_server() {
            let now = crate::clock::coarse_wall_us();
            self.info.request_time_us.store(now, std::sync::atomic::Ordering::Relaxed);
            server.info.request_time_us.store(now, std::sync::atomic::Ordering::Relaxed);
        }
        let out = splice.finish(&conn.buf, n);
        // What the socket does not take now waits in the backlog (see `relay_loop`).
        let written = if out.is_empty() { Ok(()) } else { self.to_server.write(&mut server.stream, out).await };
        splice.reset();
        conn.buf.advance(n);
        if written.is_err() {
            server.broken = true;
            return Err(server_lost(None));
        }
        let mut local = BytesMut::new();
        self.track.ext.take_leading_synthetic(&mut local);
        if self.track.terminated {
            // Sluice's own replies are not sent after the client's Terminate; the relay
            // loop ends the session, once what is due is answered
            // (`drains_after_terminate`).
            return Ok(());
        }
        if !local.is_empty() {
            if let Err(exit) = send_to_client(&mut conn.stream, &local, interrupt, &self.app, query_deadline).await {
                // The server holds the client's requests sent with these replies.
                if let Some(server) = self.server.as_mut() {
                    server.broken = true;
                }
                return Err(exit);
            }
        }
        Ok(())
    }

    async fn forward_server(
        &mut self,
        conn: &mut ClientConn,
        interrupt: &mut Interrupt<'_, '_>,
        query_deadline: Option<Instant>,
    ) -> Result<(), Exit> {
        let splice = &mut conn.splice;
        let server = self.server.as_mut().expect("relay without a server");
        let tail = self.track.server_scan.passing();
        let n = match self.track.scan_server(&server.buf, splice, self.mode, &mut server.prepared) {
            Ok(n) => n,
            Err(e) => {
                server.broken = true;
                let exit = match e {
                    // A state Sluice cannot follow (not bad data).
                    ProtocolError::Limit(what) => Exit::fatal(sqlstate::PROTOCOL_VIOLATION, what),
                    e => Exit::fatal(sqlstate::PROTOCOL_VIOLATION, format!("server sent invalid data: {e}")),
                };
                // The rest of a message the client has part of goes first (nothing of
                // this read went out): the FATAL then starts where a message does.
                if tail > 0 && !self.track.terminated {
                    let rest = &server.buf[..tail];
                    send_to_client(&mut conn.stream, rest, interrupt, &self.app, query_deadline).await?;
                }
                return Err(exit);
            }
        };
        let out = splice.finish(&server.buf, n);
        // (After the client's Terminate its answers are read, not sent.)
        let written = if out.is_empty() || self.track.terminated {
            self.track.dropped_after_terminate += out.len();
            Ok(())
        } else {
            send_to_client(&mut conn.stream, out, interrupt, &self.app, query_deadline).await
        };
        splice.reset();
        server.buf.advance(n);
        if let Some(tx) = self.track.tx {
            server.tx = tx;
        }
        // The client ran DISCARD ALL: its settings are the server's defaults now, with
        // what the server reported after it.
        let discard = self.track.discard_mark.take();
        if discard.is_some() {
            self.settings.discarded(&server.startup);
            server.applied = Some(crate::params::ClientParams::default());
        }
        for (i, (k, v)) in self.track.param_updates.drain(..).enumerate() {
            server.set_reported(&k, &v);
            if discard.is_none_or(|at| i >= at) {
                self.settings.kept.set(&k, &v);
                if let Some(applied) = server.applied.as_mut() {
                    applied.set(&k, &v);
                }
            }
        }
        if let Some(kept) = self.track.ext.emptied.take() {
            self.stmts.clear();
            kept.into_iter().for_each(|(name, st)| self.stmts.insert(&name, st));
        }
        self.track.ext.settle_names(&mut self.stmts);
        for (id, seen) in self.track.ext.stale.drain(..) {
            self.pool.mark_stale(id, seen);
        }
        if self.track.seen != Seen::default() {
            let seen = std::mem::take(&mut self.track.seen);
            if seen.schema {
                self.pool.schema_epoch.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            }
            if seen.settings {
                server.settings_changed();
            }
            if seen.role {
                server.settings_unknown();
            }
        }
        if self.track.xact_done.is_some() || self.track.query_times.len() >= 1024 {
            self.flush_stats();
        }
        let server = self.server.as_mut().expect("relay without a server");
        if let Err(exit) = written {
            // Part of the server's reply is unread (or was not taken by the client).
            server.broken = true;
            return Err(exit);
        }
        if let Some(fatal) = self.track.server_fatal.take() {
            server.broken = true;
            // Read with the answer that ended the client's transaction (PostgreSQL
            // ending the server just then): in the pooled modes nothing of the client's
            // is lost, so the server is closed as it is released and the client stays.
            // (Not while a probe is due or out, or client input waits to go out: the
            // client is then owed what will not come, and is told, quoting the FATAL.)
            let ended = server.tx == TxStatus::Idle
                && self.track.protocol_idle()
                && self.to_server.is_empty()
                && self.track.early_syncs.settled();
            if self.mode != PoolMode::Session && ended {
                tracing::info!(client = self.info.id, server = server.id, "server ended between transactions: {fatal}");
                return Ok(());
            }
            return Err(server_lost(Some(fatal)));
        }
        if self.track.violation {
            self.statement_violation(conn, interrupt, query_deadline).await?;
        }
        Ok(())
    }

    /// Statement mode refuses transaction blocks: roll the server back and tell the
    /// client, which keeps its connection.
    async fn statement_violation(
        &mut self,
        conn: &mut ClientConn,
        interrupt: &mut Interrupt<'_, '_>,
        query_deadline: Option<Instant>,
    ) -> Result<(), Exit> {
        self.track.violation = false;
        let server = self.server.as_mut().expect("relay without a server");
        let (client_mid, server_mid) = (self.track.client_scan.mid_message(), self.track.server_scan.mid_message());
        if !self.to_server.is_empty() || client_mid || server_mid {
            // Client input is still going out (nothing the server answers, or the block
            // would not be left open), or part of a message either way (a CopyData after
            // a failed COPY; an asynchronous message): no room for the ROLLBACK, whose
            // bytes or answer would land inside it; give the server up.
            server.broken = true;
            return Err(Exit::fatal(sqlstate::ACTIVE_SQL_TRANSACTION, STATEMENT_MODE_REFUSAL));
        }
        // The ROLLBACK undoes a SET inside the block: the client is told, and keeps the
        // setting it had before (as it would have been given back on PostgreSQL).
        let before = server.reported.clone();
        if let Err(e) = Box::pin(server.exec("ROLLBACK", self.pool.internal_limits())).await {
            server.broken = true;
            return Err(server_lost(Some(e.to_string())));
        }
        self.track.tx = Some(TxStatus::Idle);
        let mut out = BytesMut::new();
        for (k, v) in &server.reported {
            let changed = !before.iter().any(|(bk, bv)| bk == k && bv == v);
            if changed && crate::params::is_reported(k) {
                self.settings.kept.set(k, v);
                build::parameter_status(&mut out, k.as_bytes(), v.as_bytes());
            }
        }
        build::error_response(&mut out, Severity::Error, sqlstate::ACTIVE_SQL_TRANSACTION, STATEMENT_MODE_REFUSAL);
        build::ready_for_query(&mut out, TxStatus::Idle);
        send_to_client(&mut conn.stream, &out, interrupt, &self.app, query_deadline).await
    }
}
