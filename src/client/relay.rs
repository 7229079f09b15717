//! The relay: while a server is linked, bytes flow both ways as they arrive. Only
//! message headers are read, plus the few messages that matter whole (Terminate from
//! the client; ReadyForQuery, ParameterStatus and ErrorResponse from the server).
//! Each read is forwarded with one write. The transaction ends, and the server goes
//! back to the pool, when every Query/Sync has been answered by a ReadyForQuery 'I'.

use std::time::Instant;

use bytes::{Buf, BytesMut};
use tokio::io::AsyncReadExt;

use super::session::{Session, sleep_opt};
use super::{ClientConn, Exit};
use crate::app::Phase;
use crate::config::PoolMode;
use crate::params::is_reported;
use crate::protocol::build::{self, Severity};
use crate::protocol::fields::{ErrorFields, parameter_status};
use crate::protocol::scan::{Scanner, Splice};
use crate::protocol::{ProtocolError, TxStatus, be, body, fe, sqlstate};

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
}

impl Track {
    /// No request outstanding and no message half-forwarded in either direction.
    pub fn protocol_idle(&self) -> bool {
        self.pending == 0 && !self.unsynced && !self.client_scan.mid_message() && !self.server_scan.mid_message()
    }

    /// Scans client bytes; returns how many can be forwarded.
    fn scan_client(&mut self, buf: &[u8], splice: &mut Splice) -> Result<usize, ProtocolError> {
        let was_busy = self.pending > 0;
        let Track { client_scan, pending, unsynced, terminated, .. } = self;
        let n = client_scan.scan(
            buf,
            |t| t == fe::TERMINATE,
            |m, sp| {
                match m.tag {
                    fe::TERMINATE => {
                        *terminated = true;
                        sp.drop_range(m.start, m.start + m.frame_len);
                    }
                    fe::QUERY | fe::FUNCTION_CALL => *pending += 1,
                    fe::SYNC => {
                        *pending += 1;
                        *unsynced = false;
                    }
                    fe::COPY_DATA | fe::COPY_DONE | fe::COPY_FAIL => {}
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
    fn scan_server(&mut self, buf: &[u8], splice: &mut Splice, mode: PoolMode) -> Result<usize, ProtocolError> {
        let Track { server_scan, pending, violation, server_fatal, tx, param_updates, .. } = self;
        server_scan.scan(
            buf,
            |t| matches!(t, be::READY_FOR_QUERY | be::PARAMETER_STATUS | be::ERROR_RESPONSE),
            |m, sp| {
                let frame = m.frame.unwrap_or_default();
                match m.tag {
                    be::READY_FOR_QUERY => {
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
        let mut splice = Splice::new();
        self.forward_client(conn, &mut splice).await?;
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
                    Ok(_) => self.forward_client(conn, &mut splice).await?,
                },
                r = server.stream.read_buf(&mut server.buf) => match r {
                    Ok(0) | Err(_) => {
                        server.broken = true;
                        return Err(server_lost(self.track.server_fatal.take()));
                    }
                    Ok(_) => self.forward_server(conn, &mut splice).await?,
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
        let n = self.track.scan_client(&conn.buf, splice).map_err(Exit::protocol)?;
        let server = self.server.as_mut().expect("relay without a server");
        let out = splice.finish(&conn.buf, n);
        let written = if out.is_empty() { Ok(()) } else { server.stream.send(out).await };
        splice.reset();
        conn.buf.advance(n);
        if written.is_err() {
            server.broken = true;
            return Err(server_lost(None));
        }
        if self.track.terminated {
            return Err(Exit::Terminated);
        }
        Ok(())
    }

    async fn forward_server(&mut self, conn: &mut ClientConn, splice: &mut Splice) -> Result<(), Exit> {
        let server = self.server.as_mut().expect("relay without a server");
        let n = self.track.scan_server(&server.buf, splice, self.mode).map_err(|e| {
            server.broken = true;
            Exit::fatal(sqlstate::PROTOCOL_VIOLATION, format!("server sent invalid data: {e}"))
        })?;
        let out = splice.finish(&server.buf, n);
        let written = if out.is_empty() { Ok(()) } else { conn.stream.send(out).await };
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
        conn.stream.send(&out).await.map_err(|_| Exit::Closed)
    }
}
