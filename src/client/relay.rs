//! The relay: while a server is linked, bytes flow both ways as they arrive. Only
//! message headers are read, plus the few messages that matter whole (Terminate from
//! the client; ReadyForQuery, ParameterStatus and ErrorResponse from the server).
//! Each read is forwarded with one write. The transaction ends, and the server goes
//! back to the pool, when every Query/Sync has been answered by a ReadyForQuery 'I'.

use std::time::Instant;

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::extended::{ClientCtx, Extended};
use super::session::{Session, sleep_opt};
use super::{ClientConn, Exit};
use crate::app::Phase;
use crate::config::PoolMode;
use crate::params::is_reported;
use crate::prepared::{MAX_PARSE_LEN, NAME_PREFIX};
use crate::protocol::build::{self, Severity};
use crate::protocol::fields::{ErrorFields, parameter_status};
use crate::protocol::scan::{Need, Scanner, Splice};
use crate::protocol::{MAX_INSPECTED_LEN, ProtocolError, TxStatus, be, body, fe, sqlstate};

/// Protocol state of the linked exchange.
#[derive(Debug, Default)]
pub struct Track {
    /// Query, Sync and FunctionCall messages not yet answered by ReadyForQuery.
    pub pending: u32,
    /// Extended-protocol messages sent since the last Sync.
    pub unsynced: bool,
    client_scan: Scanner,
    server_scan: Scanner,
    terminated: bool,
    /// Statement mode saw a transaction block open.
    violation: bool,
    server_fatal: Option<String>,
    tx: Option<TxStatus>,
    busy_since: Option<Instant>,
    last_client_activity: Option<Instant>,
    param_updates: Vec<(String, String)>,
    /// Prepared-statement rewriting (transaction and statement mode).
    pub ext: Extended,
    /// The server is in copy-in mode: it ignores Sync and Flush until CopyDone/Fail.
    copy_in: bool,
    /// Syncs sent since the last Execute and not yet answered: if that Execute starts
    /// a COPY FROM STDIN, the server ignores them.
    syncs_after_execute: u32,
}

/// How much of each client message the relay reads.
fn client_need(pooled: bool) -> impl Fn(u8) -> Need {
    move |tag| match tag {
        fe::TERMINATE => Need::Whole(MAX_INSPECTED_LEN),
        _ if !pooled => Need::Stream,
        fe::PARSE => Need::Whole(MAX_PARSE_LEN),
        fe::BIND | fe::DESCRIBE => Need::Prefix(NAME_PREFIX),
        fe::CLOSE => Need::Whole(MAX_INSPECTED_LEN),
        fe::QUERY => Need::Prefix(256),
        _ => Need::Stream,
    }
}

fn server_need(tag: u8) -> Need {
    match tag {
        be::READY_FOR_QUERY | be::PARAMETER_STATUS | be::ERROR_RESPONSE => Need::Whole(MAX_INSPECTED_LEN),
        _ => Need::Stream,
    }
}

impl Track {
    /// Starts tracking a new link, keeping allocated buffers.
    pub fn reset(&mut self) {
        let mut ext = std::mem::take(&mut self.ext);
        ext.clear();
        let mut updates = std::mem::take(&mut self.param_updates);
        updates.clear();
        *self = Track { ext, param_updates: updates, ..Track::default() };
    }

    /// No request outstanding and no message half-forwarded in either direction.
    pub fn protocol_idle(&self) -> bool {
        self.pending == 0
            && !self.unsynced
            && !self.client_scan.mid_message()
            && !self.server_scan.mid_message()
            && self.ext.is_idle()
    }

    /// Scans client bytes; returns how many can be forwarded. `ctx` is given in the
    /// pooled modes, where prepared statements are rewritten.
    fn scan_client(
        &mut self,
        buf: &[u8],
        splice: &mut Splice,
        mut ctx: Option<ClientCtx>,
    ) -> Result<usize, ProtocolError> {
        let was_busy = self.pending > 0;
        let Track { client_scan, pending, unsynced, terminated, ext, copy_in, syncs_after_execute, .. } = self;
        if let Some(cx) = ctx.as_mut().filter(|_| !client_scan.mid_message()) {
            ext.inject_closes(splice, cx.server);
        }
        let n = client_scan.scan(
            buf,
            client_need(ctx.is_some()),
            |m, sp| {
                let ignored = *copy_in && matches!(m.tag, fe::SYNC | fe::FLUSH);
                if let Some(cx) = ctx.as_mut().filter(|_| !ignored) {
                    ext.on_client(&m, sp, cx)?;
                }
                match m.tag {
                    _ if ignored => {}
                    fe::TERMINATE => {
                        *terminated = true;
                        sp.drop_range(m.start, m.start + m.frame_len);
                    }
                    fe::QUERY | fe::FUNCTION_CALL => {
                        *pending += 1;
                        *syncs_after_execute = 0;
                    }
                    fe::SYNC => {
                        *pending += 1;
                        *syncs_after_execute += 1;
                        *unsynced = false;
                    }
                    fe::EXECUTE => {
                        *syncs_after_execute = 0;
                        *unsynced = true;
                    }
                    fe::COPY_DONE | fe::COPY_FAIL => *copy_in = false,
                    fe::COPY_DATA => {}
                    _ => *unsynced = true,
                }
                Ok(())
            },
            splice,
        )?;
        let now = Instant::now();
        if !was_busy && self.pending > 0 {
            self.busy_since = Some(now);
        }
        self.last_client_activity = Some(now);
        Ok(n)
    }

    /// Scans server bytes; returns how many can be forwarded.
    fn scan_server(
        &mut self,
        buf: &[u8],
        splice: &mut Splice,
        mode: PoolMode,
        prepared: &mut crate::prepared::ServerStatements,
    ) -> Result<usize, ProtocolError> {
        let Track {
            server_scan,
            pending,
            violation,
            server_fatal,
            tx,
            param_updates,
            ext,
            copy_in,
            syncs_after_execute,
            ..
        } = self;
        server_scan.scan(
            buf,
            server_need,
            |m, sp| {
                if mode != PoolMode::Session {
                    ext.on_server(&m, sp, prepared)?;
                }
                let frame = m.frame.unwrap_or_default();
                match m.tag {
                    be::COPY_IN_RESPONSE => {
                        // Syncs sent after the Execute that started this COPY are ignored.
                        *copy_in = true;
                        *pending = pending.saturating_sub(*syncs_after_execute);
                        if mode != PoolMode::Session {
                            ext.drop_ignored_syncs(*syncs_after_execute as usize);
                        }
                        *syncs_after_execute = 0;
                    }
                    be::READY_FOR_QUERY => {
                        *syncs_after_execute = 0;
                        let status = frame.get(5).copied().and_then(TxStatus::from_byte);
                        let status = status.ok_or(ProtocolError::Malformed("ReadyForQuery"))?;
                        *pending = pending.saturating_sub(1);
                        *tx = Some(status);
                        if mode == PoolMode::Statement && status != TxStatus::Idle {
                            *violation = true;
                            sp.drop_range(m.start, m.start + m.frame_len);
                        }
                    }
                    be::PARAMETER_STATUS => {
                        let (k, v) = parameter_status(body(frame))?;
                        let k = String::from_utf8_lossy(k);
                        if is_reported(&k) {
                            param_updates.push((k.into_owned(), String::from_utf8_lossy(v).into_owned()));
                        }
                    }
                    be::ERROR_RESPONSE => {
                        let f = ErrorFields::parse(body(frame))?;
                        if f.is_fatal() {
                            // Replaced by Sluice's own 08006 when the server goes away.
                            *server_fatal = Some(format!("{} ({})", f.message, f.code));
                            sp.drop_range(m.start, m.start + m.frame_len);
                        }
                    }
                    _ => {}
                }
                Ok(())
            },
            splice,
        )
    }
}

fn server_lost(detail: Option<String>) -> Exit {
    let message = match detail {
        Some(d) => format!("server connection lost: {d}"),
        None => "server closed the connection unexpectedly".to_string(),
    };
    Exit::fatal(sqlstate::CONNECTION_FAILURE, message)
}

fn reserve(buf: &mut BytesMut, chunk: usize) {
    if buf.capacity() - buf.len() < chunk / 4 {
        buf.reserve(chunk);
    }
}

impl Session {
    /// Relays until the transaction ends (Ok: the server went back to the pool) or
    /// the connection ends (Err).
    pub(super) async fn relay(&mut self, conn: &mut ClientConn) -> Result<(), Exit> {
        let mut splice = std::mem::take(&mut self.splice);
        let r = self.relay_loop(conn, &mut splice).await;
        splice.reset();
        self.splice = splice;
        r
    }

    async fn relay_loop(&mut self, conn: &mut ClientConn, splice: &mut Splice) -> Result<(), Exit> {
        self.forward_client(conn, splice).await?;
        loop {
            if self.mode != PoolMode::Session && self.releasable() {
                self.release().await;
                return Ok(());
            }
            self.check_phase()?;
            let server = self.server.as_mut().expect("relay without a server");
            reserve(&mut conn.buf, 4096);
            reserve(&mut server.buf, 16 * 1024);
            let t = &self.track;
            let query_deadline = self.timeouts.query.zip(t.busy_since).map(|(d, s)| s + d).filter(|_| t.pending > 0);
            let idle_in_tx = t.pending == 0 && t.tx.is_some_and(|s| s != TxStatus::Idle);
            let idle_deadline =
                self.timeouts.idle_transaction.zip(t.last_client_activity).map(|(d, s)| s + d).filter(|_| idle_in_tx);
            tokio::select! {
                r = conn.stream.read_buf(&mut conn.buf) => match r {
                    Ok(0) | Err(_) => return Err(Exit::Closed),
                    Ok(_) => self.forward_client(conn, splice).await?,
                },
                r = server.stream.read_buf(&mut server.buf) => match r {
                    Ok(0) | Err(_) => {
                        server.broken = true;
                        return Err(server_lost(self.track.server_fatal.take()));
                    }
                    Ok(_) => self.forward_server(conn, splice).await?,
                },
                _ = sleep_opt(query_deadline.map(|d| d.saturating_duration_since(Instant::now()))) => {
                    server.broken = true;
                    return Err(Exit::fatal(sqlstate::QUERY_CANCELED, "query_timeout: query took too long"));
                }
                _ = sleep_opt(idle_deadline.map(|d| d.saturating_duration_since(Instant::now()))) => {
                    return Err(Exit::fatal(sqlstate::IDLE_IN_TRANSACTION_TIMEOUT, "idle_transaction_timeout: transaction left idle too long"));
                }
                _ = self.phase.changed() => {}
            }
        }
    }

    fn releasable(&self) -> bool {
        self.track.protocol_idle() && self.server.as_ref().is_some_and(|s| s.tx == TxStatus::Idle)
    }

    /// Ends the session on shutdown: at once when stopping, at the end of the
    /// transaction when draining (session mode; pooled modes drain when idle).
    fn check_phase(&self) -> Result<(), Exit> {
        let phase = *self.phase.borrow();
        let idle = self.track.protocol_idle() && self.server.as_ref().is_some_and(|s| s.tx == TxStatus::Idle);
        if phase == Phase::Stopping || (phase == Phase::Draining && idle) {
            return Err(Exit::fatal(sqlstate::ADMIN_SHUTDOWN, "terminating connection: the pooler is shutting down"));
        }
        Ok(())
    }

    async fn forward_client(&mut self, conn: &mut ClientConn, splice: &mut Splice) -> Result<(), Exit> {
        let server = self.server.as_mut().expect("relay without a server");
        let ctx = (self.mode != PoolMode::Session).then_some(ClientCtx {
            stmts: &mut self.stmts,
            server: &mut server.prepared,
            cap: self.limits.server_statements,
            client_limit: self.limits.client_statements,
            tx: server.tx,
        });
        let n = self.track.scan_client(&conn.buf, splice, ctx).map_err(|e| match e {
            ProtocolError::Limit(what) => Exit::fatal(sqlstate::CONFIGURATION_LIMIT_EXCEEDED, what),
            e => Exit::protocol(e),
        })?;
        let out = splice.finish(&conn.buf, n);
        let written = if out.is_empty() { Ok(()) } else { server.stream.write_all(out).await };
        splice.reset();
        conn.buf.advance(n);
        if written.is_err() {
            server.broken = true;
            return Err(server_lost(None));
        }
        if self.track.terminated {
            return Err(Exit::Terminated);
        }
        let mut local = BytesMut::new();
        self.track.ext.take_leading_synthetic(&mut local);
        if !local.is_empty() {
            conn.stream.write_all(&local).await.map_err(|_| Exit::Closed)?;
        }
        Ok(())
    }

    async fn forward_server(&mut self, conn: &mut ClientConn, splice: &mut Splice) -> Result<(), Exit> {
        let server = self.server.as_mut().expect("relay without a server");
        let n = self.track.scan_server(&server.buf, splice, self.mode, &mut server.prepared).map_err(|e| {
            server.broken = true;
            Exit::fatal(sqlstate::PROTOCOL_VIOLATION, format!("server sent invalid data: {e}"))
        })?;
        let out = splice.finish(&server.buf, n);
        let written = if out.is_empty() { Ok(()) } else { conn.stream.write_all(out).await };
        splice.reset();
        server.buf.advance(n);
        if let Some(tx) = self.track.tx {
            server.tx = tx;
        }
        for (k, v) in self.track.param_updates.drain(..) {
            server.set_reported(&k, &v);
            self.params.set(&k, &v);
            if let Some(applied) = server.applied.as_mut() {
                applied.set(&k, &v);
            }
        }
        for (name, st) in self.track.ext.undefined.drain(..) {
            self.stmts.undefine(&name, &st);
        }
        for (name, st) in self.track.ext.redefined.drain(..) {
            self.stmts.insert(&name, st);
        }
        if std::mem::take(&mut self.track.ext.discarded) {
            // The client ran DISCARD ALL: its settings are the server defaults now.
            self.params = crate::params::ClientParams::default();
            server.applied = Some(crate::params::ClientParams::default());
        }
        if written.is_err() {
            return Err(Exit::Closed);
        }
        if self.track.server_fatal.is_some() {
            server.broken = true;
            return Err(server_lost(self.track.server_fatal.take()));
        }
        if self.track.violation {
            self.statement_violation(conn).await?;
        }
        Ok(())
    }

    /// Statement mode refuses transaction blocks: roll the server back and tell the
    /// client, which keeps its connection.
    async fn statement_violation(&mut self, conn: &mut ClientConn) -> Result<(), Exit> {
        self.track.violation = false;
        let server = self.server.as_mut().expect("relay without a server");
        if server.exec("ROLLBACK").await.is_err() {
            server.broken = true;
            return Err(server_lost(None));
        }
        self.track.tx = Some(TxStatus::Idle);
        let mut out = BytesMut::new();
        build::error_response(
            &mut out,
            Severity::Error,
            sqlstate::ACTIVE_SQL_TRANSACTION,
            "transaction blocks are not allowed in statement pooling mode",
        );
        build::ready_for_query(&mut out, TxStatus::Idle);
        conn.stream.write_all(&out).await.map_err(|_| Exit::Closed)
    }
}
