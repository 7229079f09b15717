//! Protocol tracking of a linked exchange: which Query/Sync messages still await a
//! ReadyForQuery, whether extended-protocol messages wait for a Sync, COPY state, the
//! transaction status, and the per-exchange statistics. Scans both directions with the
//! frame scanner; the relay (`relay.rs`) does the I/O.

use std::time::{Duration, Instant};

pub(super) use super::copy::{CopyIn, EarlySyncs};
use super::copy::{ENDED_AHEAD_LIMIT, EndedAhead, before, probe_portal, probe_reply, unit_reached};
use super::extended::{ClientCtx, Extended};
use super::needs::{client_need, server_need};
pub(super) use super::seen::Seen;
use crate::config::PoolMode;
use crate::params::is_reported;
use crate::prepared::TextEffects;
use crate::protocol::fields::{ErrorFields, parameter_status};
use crate::protocol::scan::{Scanner, Splice};
use crate::protocol::{ProtocolError, TxStatus, be, body, fe, sqlstate};
use crate::stats::{ExchangeStats, PoolStats};

/// Protocol state of the linked exchange.
#[derive(Debug, Default)]
pub struct Track {
    /// Statistics of this exchange, flushed to the pool at each transaction end.
    pub stats: ExchangeStats,
    /// When the current transaction began; its duration once it ended.
    xact_start: Option<Instant>,
    pub xact_done: Option<Duration>,
    /// SQLSTATEs of errors the server sent, flushed with the stats.
    pub errors: Vec<String>,
    /// Commands completed that change what statements parse to, or the settings the
    /// server carries.
    pub seen: Seen,
    /// Durations of the round trips (request to the last ReadyForQuery) since the
    /// last flush, for the query-time histogram.
    pub query_times: Vec<Duration>,
    /// Query, Sync and FunctionCall messages not yet answered by ReadyForQuery.
    pub pending: u32,
    /// Extended-protocol messages sent since the last Sync.
    pub unsynced: bool,
    /// The last message the server reads is a simple Query or FunctionCall: its
    /// ReadyForQuery ends the implicit transaction of unsynced extended messages before
    /// it, as a Sync would (PostgreSQL finishes the transaction command).
    pub(super) last_simple: bool,
    pub(super) client_scan: Scanner,
    pub(super) server_scan: Scanner,
    /// Simple Query messages end the client (`disable_pqexec`); kept across links.
    pub(super) refuse_query: bool,
    pub(super) terminated: bool,
    /// Bytes of answers read and dropped since the client's Terminate.
    pub(super) dropped_after_terminate: usize,
    /// Statement mode saw a transaction block open.
    pub(super) violation: bool,
    pub(super) server_fatal: Option<String>,
    pub(super) tx: Option<TxStatus>,
    pub(super) busy_since: Option<Instant>,
    /// Where `query_timeout` counts from: the start of the busy period, then each
    /// ReadyForQuery that leaves more requests due (a pipeline of quick statements is
    /// not one long query).
    pub(super) timed_from: Option<Instant>,
    /// When the connection last went quiet: the client's last message, or the server's
    /// answer to the last request due (`idle_transaction_timeout` counts from it, as
    /// PostgreSQL's idle timeout counts from the backend going idle).
    pub(super) idle_since: Option<Instant>,
    pub(super) param_updates: Vec<(String, String)>,
    /// How many of `param_updates` came before the last DISCARD ALL the server finished:
    /// those no longer hold for the client's settings (`Session::relay` applies the
    /// DISCARD first).
    pub(super) discard_mark: Option<usize>,
    /// The replies the server has yet to send, one per request; in the pooled modes
    /// also the prepared-statement rewriting (session mode forwards as sent).
    pub ext: Extended,
    /// The server is in copy-in mode: it ignores Sync and Flush until CopyDone/Fail.
    pub(super) copy_in: CopyIn,
    /// Syncs sent since the last Execute (or Query): if that Execute starts a COPY FROM
    /// STDIN, the server ignores them (none is answered before its CopyInResponse).
    pub(super) syncs_after_execute: u32,
    /// Query/Sync/FunctionCall messages sent before that Execute and not yet answered:
    /// the next ReadyForQuery answers one of them, not one of those Syncs.
    pub(super) before_execute: u32,
    /// COPYs the client ended (CopyDone/CopyFail) before the server's CopyInResponse
    /// began them, oldest first (a pipeline sent at once).
    pub(super) ended_ahead: std::collections::VecDeque<EndedAhead>,
    /// Query, Sync and FunctionCall messages counted in `pending` so far: the server's
    /// unit of work (a simple query, or the extended messages up to a Sync) that a
    /// message belongs to is this count when it is sent (`Track::unit_reached`).
    pub(super) units_sent: u32,
    /// The unit of the last Query or Execute sent on this link: a COPY ended ahead
    /// belongs to it.
    pub(super) last_begin: Option<u32>,
    /// Syncs taken as ignored (sent inside a COPY) since the last ReadyForQuery: the
    /// server may not have read them yet.
    pub(super) ignored_since_ready: u32,
    /// Whether Syncs taken as ignored may have been answered after all.
    pub(super) early_syncs: EarlySyncs,
}

/// The fields of a server ErrorResponse the relay saw (or the first `ERROR_PREFIX`
/// bytes of it).
pub(super) fn error_fields(m: &crate::protocol::scan::Msg) -> Result<ErrorFields, ProtocolError> {
    let frame = m.frame.unwrap_or_default();
    if frame.len() < m.frame_len { ErrorFields::parse_prefix(body(frame)) } else { ErrorFields::parse(body(frame)) }
}

impl Track {
    /// Takes this exchange's statistics for the pool (transaction end or exit).
    pub fn take_stats(&mut self, pooled: bool) -> ExchangeStats {
        let mut s = std::mem::take(&mut self.stats);
        if pooled {
            s.server_parses = std::mem::take(&mut self.ext.server_parses);
            s.prepared_hits = std::mem::take(&mut self.ext.cache_hits);
        } else {
            s.server_parses = s.client_parses;
        }
        s
    }

    /// Adds this exchange's counts, transaction time, errors and query times to the
    /// pool's statistics (transaction end or exit).
    pub(super) fn flush_to(&mut self, stats: &PoolStats, pooled: bool) {
        stats.add(&self.take_stats(pooled));
        if let Some(d) = self.xact_done.take() {
            stats.transaction(d);
        }
        for code in self.errors.drain(..) {
            stats.error(&code);
        }
        for d in self.query_times.drain(..) {
            stats.query_hist.observe(d);
        }
    }

    /// A Track refusing messages whose length field says more than `limit`, either way
    /// (`max_packet_size`: `protocol::length_limit`), and simple Query messages when
    /// `refuse_query` (`disable_pqexec`).
    pub fn with_rules(limit: usize, refuse_query: bool) -> Track {
        let mut t = Track::default();
        t.set_rules(limit, refuse_query);
        t
    }

    /// `with_rules`' rules from the next message on.
    pub fn set_rules(&mut self, limit: usize, refuse_query: bool) {
        self.client_scan.set_limit(limit);
        self.server_scan.set_limit(limit);
        self.refuse_query = refuse_query;
    }

    /// Starts tracking a new link, keeping allocated buffers.
    pub fn reset(&mut self) {
        // Field by field, in place: building a fresh Track and dropping the old one
        // costs more than the rest of the per-transaction bookkeeping (callgrind).
        let Track {
            stats,
            xact_start,
            xact_done,
            errors,
            seen,
            query_times,
            pending,
            unsynced,
            last_simple,
            client_scan,
            server_scan,
            refuse_query: _,
            terminated,
            dropped_after_terminate,
            violation,
            server_fatal,
            tx,
            busy_since,
            timed_from,
            idle_since,
            param_updates,
            discard_mark,
            ext,
            copy_in,
            syncs_after_execute,
            before_execute,
            ended_ahead,
            units_sent,
            last_begin,
            ignored_since_ready,
            early_syncs,
        } = self;
        *stats = ExchangeStats::default();
        *xact_start = None;
        *xact_done = None;
        errors.clear();
        *seen = Seen::default();
        query_times.clear();
        *pending = 0;
        *unsynced = false;
        *last_simple = false;
        client_scan.restart();
        server_scan.restart();
        *terminated = false;
        *dropped_after_terminate = 0;
        *violation = false;
        *server_fatal = None;
        *tx = None;
        *busy_since = None;
        *timed_from = None;
        *idle_since = None;
        param_updates.clear();
        *discard_mark = None;
        ext.clear();
        *copy_in = CopyIn::Off;
        *syncs_after_execute = 0;
        *before_execute = 0;
        ended_ahead.clear();
        *units_sent = 0;
        *last_begin = None;
        *ignored_since_ready = 0;
        *early_syncs = EarlySyncs::None;
    }

    /// A request is under way (`query_timeout` runs): one the server has not answered
    /// (a Query or Sync, or an extended message with no Sync yet, such as an Execute
    /// followed by a Flush), or a client message held for a shape check.
    pub fn awaiting_server(&self) -> bool {
        self.pending > 0 || !self.ext.is_idle()
    }

    /// The server may still answer Syncs sent inside a COPY that failed, and no probe
    /// has settled it (`EarlySyncs`): it must be closed, not lent again.
    pub fn server_unsure(&self) -> bool {
        !self.early_syncs.settled()
    }

    /// Writes the probe (`EarlySyncs::Unsure`): a Describe of a portal named with a
    /// random token, and a Sync. The server answers it after everything sent before,
    /// in any transaction state, with an error naming the token: what comes before that
    /// error answers requests already counted, and once the ReadyForQuery after it is
    /// read the server has nothing more to send.
    pub(super) fn probe(&mut self, out: &mut bytes::BytesMut) {
        let token = rand::random::<u64>();
        crate::protocol::build::describe(out, b'P', probe_portal(token).as_bytes());
        crate::protocol::build::sync(out);
        self.early_syncs = EarlySyncs::Probed(token);
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
    pub(super) fn scan_client(
        &mut self,
        buf: &[u8],
        splice: &mut Splice,
        mut ctx: Option<ClientCtx>,
    ) -> Result<usize, ProtocolError> {
        if self.ext.holding() {
            return Ok(0);
        }
        let was_busy = self.awaiting_server();
        let Track {
            client_scan,
            refuse_query,
            pending,
            unsynced,
            last_simple,
            terminated,
            ext,
            copy_in,
            syncs_after_execute,
            before_execute,
            ended_ahead,
            units_sent,
            last_begin,
            ignored_since_ready,
            early_syncs,
            stats,
            ..
        } = self;
        let n = client_scan.scan(
            buf,
            client_need(ctx.is_some(), *refuse_query),
            |m, sp| {
                if *terminated {
                    // Nothing after a Terminate reaches the server (PostgreSQL reads no
                    // further): dropped with it.
                    sp.drop_range(m.start, m.start + m.frame_len);
                    return Ok(());
                }
                let ignored = *copy_in != CopyIn::Off && matches!(m.tag, fe::SYNC | fe::FLUSH);
                let mut no_reply = false;
                if !ignored {
                    if let Some(cx) = ctx.as_mut() {
                        cx.in_copy = *copy_in != CopyIn::Off;
                        no_reply = ext.on_client(&m, sp, cx)?;
                        if ext.holding() {
                            // Held back (`stop_before`): counted when scanned again.
                            return Ok(());
                        }
                    } else {
                        no_reply = ext.on_client_forwarded(m.tag);
                    }
                }
                match m.tag {
                    _ if ignored => {}
                    fe::QUERY | fe::FUNCTION_CALL if !no_reply => *last_simple = true,
                    fe::QUERY | fe::FUNCTION_CALL | fe::COPY_DATA | fe::COPY_DONE | fe::COPY_FAIL | fe::TERMINATE => {}
                    _ => *last_simple = false,
                }
                match m.tag {
                    // Taken as ignored; answered after all if the COPY fails before the
                    // server reads it (`EarlySyncs`).
                    fe::SYNC if ignored => early_syncs.counted(),
                    _ if ignored => {}
                    fe::TERMINATE => {
                        *terminated = true;
                        sp.drop_range(m.start, m.start + m.frame_len);
                    }
                    // Answered by Sluice, or skipped by the server: no ReadyForQuery.
                    fe::QUERY | fe::FUNCTION_CALL if no_reply => {}
                    fe::QUERY | fe::FUNCTION_CALL => {
                        *last_begin = Some(*units_sent);
                        *units_sent = units_sent.wrapping_add(1);
                        *pending += 1;
                        *syncs_after_execute = 0;
                        *before_execute = *pending;
                    }
                    fe::SYNC => {
                        *units_sent = units_sent.wrapping_add(1);
                        *pending += 1;
                        *syncs_after_execute += 1;
                        // It ends every extended COPY ended ahead since the last one.
                        for e in ended_ahead.iter_mut().rev().take_while(|e| !e.synced) {
                            e.synced = true;
                        }
                        *unsynced = false;
                    }
                    fe::EXECUTE => {
                        *last_begin = Some(*units_sent);
                        *syncs_after_execute = 0;
                        *before_execute = *pending;
                        *unsynced = true;
                    }
                    // Ending a COPY the server has not begun yet: the Syncs since the
                    // Execute (or Query) before it will be ignored, the later ones not.
                    // (Unless that request is answered already, or there is none on this
                    // link: the late end of a failed COPY, ignored by the server.)
                    fe::COPY_DONE | fe::COPY_FAIL if *copy_in == CopyIn::Off => {
                        let reached = unit_reached(*units_sent, *pending, *ignored_since_ready);
                        if let Some(unit) = last_begin.filter(|&u| !before(u, reached)) {
                            if ended_ahead.len() >= ENDED_AHEAD_LIMIT {
                                return Err(ProtocolError::Limit(
                                    "too many COPY ends sent ahead of the COPYs they end",
                                ));
                            }
                            ended_ahead.push_back(EndedAhead { unit, ignored: *syncs_after_execute, synced: false });
                        }
                        *syncs_after_execute = 0;
                    }
                    fe::COPY_DONE | fe::COPY_FAIL => *copy_in = CopyIn::Off,
                    fe::COPY_DATA => {}
                    fe::PARSE => {
                        stats.client_parses += 1;
                        *unsynced = true;
                    }
                    fe::BIND => {
                        stats.binds += 1;
                        *unsynced = true;
                    }
                    // A Flush with a body would fail on the server and start a skip to
                    // the next Sync that nothing else announces (the server answers a
                    // Flush with nothing): refused here instead.
                    fe::FLUSH if m.frame_len != 5 => {
                        return Err(ProtocolError::BadLength { tag: m.tag, len: m.frame_len - 1 });
                    }
                    fe::DESCRIBE | fe::CLOSE | fe::FLUSH => *unsynced = true,
                    // Refused before it reaches the server, which would end the
                    // connection over it (FATAL 08P01) and cost the pool a server.
                    tag => return Err(ProtocolError::UnknownMessage(tag)),
                }
                Ok(())
            },
            splice,
        )?;
        let now = Instant::now();
        if !was_busy && self.awaiting_server() {
            self.busy_since = Some(now);
            self.timed_from = Some(now);
            if self.tx.is_none_or(|t| t == TxStatus::Idle) && self.xact_start.is_none() {
                self.xact_start = Some(now);
            }
        }
        self.idle_since = Some(now);
        self.stats.received += n as u64;
        Ok(n)
    }

    /// Scans server bytes; returns how many can be forwarded.
    pub(super) fn scan_server(
        &mut self,
        buf: &[u8],
        splice: &mut Splice,
        mode: PoolMode,
        prepared: &mut crate::prepared::ServerStatements,
    ) -> Result<usize, ProtocolError> {
        let was_awaiting = self.awaiting_server();
        let Track {
            server_scan,
            pending,
            unsynced,
            last_simple,
            violation,
            server_fatal,
            tx,
            param_updates,
            discard_mark,
            ext,
            copy_in,
            syncs_after_execute,
            before_execute,
            ended_ahead,
            units_sent,
            ignored_since_ready,
            early_syncs,
            stats,
            busy_since,
            timed_from,
            xact_start,
            xact_done,
            errors,
            seen,
            query_times,
            ..
        } = self;
        let n = server_scan.scan(
            buf,
            server_need,
            |m, sp| {
                if early_syncs.probing() {
                    let books =
                        ProbeBooks { tx, param_updates, discard_mark, seen, ext, prepared, server_fatal, errors };
                    return while_probing(early_syncs, &m, sp, books);
                }
                let refused = ext.on_server(&m, sp, prepared)?;
                let frame = m.frame.unwrap_or_default();
                match m.tag {
                    be::COPY_IN_RESPONSE => {
                        // Begun by an Execute, the COPY ends with a Sync the server waits
                        // for even when the COPY fails: keep the server till then.
                        let extended = ext.head_is_execute();
                        // COPYs ended ahead whose request the server finished without
                        // beginning them (it failed, or was skipped after an error): their
                        // data was ignored.
                        let reached = unit_reached(*units_sent, *pending, *ignored_since_ready);
                        while ended_ahead.front().is_some_and(|e| before(e.unit, reached)) {
                            ended_ahead.pop_front();
                        }
                        // Syncs sent after the request that began this COPY and before the
                        // client ended it are ignored by the server.
                        let ignored = match ended_ahead.pop_front() {
                            // The client already ended it (sent all of it at once).
                            Some(e) => {
                                *copy_in = CopyIn::Off;
                                *unsynced |= extended && !e.synced;
                                e.ignored
                            }
                            // A message held for a shape check follows in the client's
                            // input with no end of this COPY before it: PostgreSQL would
                            // read Sluice's Describe as COPY data, and the check would never
                            // be answered.
                            None if ext.holding() => {
                                return Err(ProtocolError::Limit(
                                    "a request sent inside a COPY, before its data (Sluice had to wait for an answer first)",
                                ));
                            }
                            None => {
                                *copy_in = if extended { CopyIn::Extended } else { CopyIn::Simple };
                                *unsynced |= extended;
                                std::mem::take(syncs_after_execute)
                            }
                        };
                        *pending = pending.saturating_sub(ignored);
                        *ignored_since_ready += ignored;
                        if ignored > 0 {
                            early_syncs.counted();
                        }
                        ext.drop_ignored_syncs(ignored as usize);
                    }
                    be::READY_FOR_QUERY => {
                        // It answers a request sent before the last Execute, or else
                        // one of the Syncs after it. Those are left counted: a COPY that
                        // Execute begins is begun (CopyInResponse) before any of them is
                        // answered, so a ReadyForQuery taken for one of them first is a
                        // late one (`EarlySyncs`), and the Sync is still to be ignored.
                        *before_execute = before_execute.saturating_sub(1);
                        let status = ready_status(frame).ok_or(ProtocolError::Malformed("ReadyForQuery"))?;
                        // The server is out of COPY mode (a COPY begun by a simple query
                        // and failed ends here, whether or not the client ended it), and
                        // past every Sync it ignored.
                        *copy_in = CopyIn::Off;
                        *ignored_since_ready = 0;
                        *pending = pending.saturating_sub(1);
                        *tx = Some(status);
                        stats.queries += 1;
                        // The answer to a Query or FunctionCall sent after unsynced
                        // extended messages: their implicit transaction ended with it.
                        if *pending == 0 && *last_simple {
                            *unsynced = false;
                        }
                        if *pending > 0 {
                            *timed_from = Some(Instant::now());
                        } else {
                            let now = Instant::now();
                            let busy = busy_since.map_or(Duration::ZERO, |b| now - b);
                            stats.query_time_us += busy.as_micros() as u64;
                            query_times.push(busy);
                            if status == TxStatus::Idle {
                                *xact_done = xact_start.take().map(|s| now - s);
                            }
                            // Everything answered: a COPY ended ahead whose request failed
                            // before it began (the server ignored its data) is gone.
                            if !*unsynced {
                                ended_ahead.clear();
                            }
                        }
                        // A transaction block still open when everything the client
                        // sent is answered (one begun and ended inside a pipeline is
                        // fine: the server is not held across the client's round trips).
                        // (Not while a failed COPY leaves the count in doubt: this may
                        // be a late answer, with the real ones still to come.)
                        if mode == PoolMode::Statement
                            && status != TxStatus::Idle
                            && *pending == 0
                            && !*unsynced
                            && ext.is_idle()
                            && early_syncs.settled()
                        {
                            *violation = true;
                            sp.drop_range(m.start, m.start + m.frame_len);
                        }
                    }
                    be::COMMAND_COMPLETE => {
                        early_syncs.copy_ended(false);
                        // Session mode does not read statement texts: any SET counts.
                        let sets = if mode == PoolMode::Session { TextEffects::ALL } else { ext.sets };
                        seen.note(body(frame), sets);
                        discard_at(ext, discard_mark, param_updates);
                    }
                    be::PARAMETER_STATUS => reported(frame, param_updates)?,
                    be::ERROR_RESPONSE => {
                        early_syncs.copy_ended(true);
                        // A COPY IN the server ended by itself: the Syncs the client
                        // sends from now on are read out of COPY mode and answered (begun
                        // by an Execute, the server skips to the next of them; by a simple
                        // query, its ReadyForQuery comes first).
                        *copy_in = CopyIn::Off;
                        // Requests pipelined behind a failed extended message, skipped.
                        let skipped = std::mem::take(&mut ext.skipped_requests);
                        *pending = pending.saturating_sub(skipped);
                        *before_execute = before_execute.saturating_sub(skipped);
                        let f = error_fields(&m)?;
                        // A refused message's error stands for the 0A000 the client got
                        // (a FATAL is the server's own).
                        errors.push(if refused && !f.is_fatal() {
                            sqlstate::FEATURE_NOT_SUPPORTED.into()
                        } else {
                            f.code.clone()
                        });
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
        )?;
        stats.sent += n as u64;
        if was_awaiting && !self.awaiting_server() {
            // Everything due is answered: idle from now, however long it ran.
            self.idle_since = Some(Instant::now());
        }
        Ok(n)
    }
}

/// What a server message read while a probe is under way may still change.
struct ProbeBooks<'a> {
    tx: &'a mut Option<TxStatus>,
    param_updates: &'a mut Vec<(String, String)>,
    discard_mark: &'a mut Option<usize>,
    seen: &'a mut Seen,
    ext: &'a mut Extended,
    prepared: &'a mut crate::prepared::ServerStatements,
    server_fatal: &'a mut Option<String>,
    errors: &'a mut Vec<String>,
}

/// A server message while a probe is under way (`EarlySyncs::probing`): the probe's
/// own replies are swallowed, the ReadyForQuery after them giving the transaction state
/// after all the client sent before the probe. The rest answers requests sent before
/// the probe and already counted as answered: passed on as it is, with what it changes
/// on the server still recorded (settings, DDL, statements emptied).
fn while_probing(
    state: &mut EarlySyncs,
    m: &crate::protocol::scan::Msg,
    sp: &mut Splice,
    b: ProbeBooks,
) -> Result<(), ProtocolError> {
    let frame = m.frame.unwrap_or_default();
    if let Some(next) = probe_reply(*state, m)? {
        if m.tag == be::READY_FOR_QUERY {
            *b.tx = ready_status(frame);
        }
        sp.drop_range(m.start, m.start + m.frame_len);
        *state = next;
        return Ok(());
    }
    match m.tag {
        be::PARAMETER_STATUS => reported(frame, b.param_updates)?,
        be::COMMAND_COMPLETE => {
            b.seen.note(body(frame), TextEffects::ALL);
            b.ext.note_emptying(m, b.prepared);
            discard_at(b.ext, b.discard_mark, b.param_updates);
        }
        // A COPY FROM STDIN one of those requests began, whose end the client had not
        // sent before the probe: the server read the probe as COPY data and failed the
        // COPY over it ("unexpected message type 0x44"), and will not answer the probe.
        // No way on.
        be::ERROR_RESPONSE if probe_eaten(m)? => {
            return Err(ProtocolError::Limit(
                "a COPY began behind the probe Sluice sent after a failed COPY with a Sync inside it",
            ));
        }
        // Counted as any error; a FATAL (the server ending: pg_terminate_backend) is
        // replaced by Sluice's own 08006 when the server goes away, as outside a probe.
        be::ERROR_RESPONSE => {
            let f = error_fields(m)?;
            b.errors.push(f.code.clone());
            if f.is_fatal() {
                *b.server_fatal = Some(format!("{} ({})", f.message, f.code));
                sp.drop_range(m.start, m.start + m.frame_len);
            }
        }
        _ => {}
    }
    Ok(())
}

/// The transaction status a ReadyForQuery frame reports.
fn ready_status(frame: &[u8]) -> Option<TxStatus> {
    frame.get(5).copied().and_then(TxStatus::from_byte)
}

/// Whether an error is PostgreSQL's for the probe's Describe read inside a COPY.
fn probe_eaten(m: &crate::protocol::scan::Msg) -> Result<bool, ProtocolError> {
    let f = error_fields(m)?;
    Ok(f.code == sqlstate::PROTOCOL_VIOLATION && f.message.contains("0x44"))
}

/// After a CommandComplete: a DISCARD ALL it finished marks the settings reported so far.
#[inline]
fn discard_at(ext: &mut Extended, mark: &mut Option<usize>, param_updates: &[(String, String)]) {
    if std::mem::take(&mut ext.discarded) {
        *mark = Some(param_updates.len());
    }
}

/// Records a ParameterStatus the client is told of (a setting the server reports).
fn reported(frame: &[u8], param_updates: &mut Vec<(String, String)>) -> Result<(), ProtocolError> {
    let (k, v) = parameter_status(body(frame))?;
    let k = String::from_utf8_lossy(k);
    if is_reported(&k) {
        param_updates.push((k.into_owned(), String::from_utf8_lossy(v).into_owned()));
    }
    Ok(())
}

#[cfg(test)]
mod tests;
