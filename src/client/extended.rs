//! Prepared statements through transaction pooling, applied to the relayed stream.
//! Client → server: named Parse/Bind/Describe are renamed to the shared server-side
//! statement, a Parse is injected before a Bind/Describe on a server that lacks the
//! statement (or the client's unnamed statement), Close of a named statement and
//! DEALLOCATE are answered locally. Server → client: a queue of expected replies, one
//! per message sent, lets replies to injected messages be swallowed and Sluice's own
//! replies be placed exactly where the client expects them, also after errors (the
//! server skips to the next Sync, and so does the queue). Session mode keeps the same
//! queue, fed from message types only (`on_client_forwarded`): it rewrites nothing, but
//! needs to know which requests the server skips and whether a COPY was begun by an
//! Execute.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::prepared::{
    self, ClientStatements, Generations, Presence, ServerStatements, SqlCommand, Statement, TextEffects,
};
use crate::protocol::build;
use crate::protocol::scan::{Msg, Splice};
use crate::protocol::{ProtocolError, TxStatus, body, fe, sqlstate};

mod answers;
pub(super) mod expect;
mod parses;
use expect::{Effect, Expect, Kind, Queue, Reply};

/// What the client side of a scan needs besides the message.
pub struct ClientCtx<'a> {
    pub stmts: &'a mut ClientStatements,
    pub server: &'a mut ServerStatements,
    /// max_prepared_statements per server connection.
    pub cap: usize,
    /// Statements one client may hold.
    pub client_limit: usize,
    pub tx: TxStatus,
    /// The pool's statement generations (see [`Generations`]).
    pub gens: &'a Generations,
    /// The pool's schema epoch: bumped by each DDL seen through Sluice.
    pub epoch: u64,
    /// The client's settings that may change parsing (`ClientParams::parse_hash`).
    pub settings: u64,
    /// The message being read is inside a COPY FROM STDIN the server has begun.
    pub in_copy: bool,
}

impl ClientCtx<'_> {
    fn generation(&self, id: u64) -> u64 {
        self.gens.get(&id).copied().unwrap_or(0)
    }
}

/// The replies Sluice gives itself (cached Parses, Closes) that may wait in a row behind
/// an answer the server owes, per client (`Extended::local_replies_bounded`).
const LOCAL_REPLIES_LIMIT: usize = 16_384;

/// Per-link state of the replies the server owes (every mode) and, in the pooled modes,
/// of the extended-protocol rewriting.
#[derive(Debug, Default)]
pub struct Extended {
    queue: Queue,
    last_bind: Option<u64>,
    /// The server reported an error in an extended-protocol exchange whose Sync has not
    /// come yet: it skips every message up to that Sync, and so does the tracking.
    skipping: bool,
    /// The shape check refused: the held message (`holding`) is replaced by one the
    /// server fails.
    refuse: bool,
    /// Simple queries and function calls the server skipped after an error (they were
    /// pipelined behind the failed message): the caller expects no ReadyForQuery for
    /// them, and takes the count.
    pub skipped_requests: u32,
    /// Set when a DEALLOCATE ALL / DISCARD ALL ran: the client's statements are gone
    /// but for those its Parses queued behind it define, given here; what the answers
    /// before it settled (`redefined`, `reopened`) was dropped. The caller empties the
    /// client's names before it settles the rest (`settle_names`).
    pub emptied: Option<Vec<(Bytes, Arc<Statement>)>>,
    /// Set when the server finished a DISCARD ALL (its statements are gone).
    pub discarded: bool,
    /// Client statements whose Parse failed or was skipped: the caller forgets them.
    pub undefined: Vec<(Bytes, Arc<Statement>)>,
    /// The id of the client's unnamed statement whose Parse failed or was skipped: the
    /// caller forgets it, unless the client has parsed another since.
    pub unnamed_lost: Option<u64>,
    /// The client's unnamed statement whose Close the server skipped: the caller gives
    /// it back, unless the client has parsed another since.
    pub unnamed_reopened: Option<prepared::Unnamed>,
    /// The client's unnamed Parses and Closes so far (`Effect::CloseUnnamed`).
    unnamed_changes: u64,
    /// Client statements a Parse re-established (after an earlier Parse of the same
    /// name in the pipeline was skipped): the caller records them again.
    pub redefined: Vec<(Bytes, Arc<Statement>)>,
    /// Client statements whose Close (answered by Sluice) fell where the server skipped
    /// after an error: the caller gives the names back (`ClientStatements::restore`).
    pub reopened: Vec<(Bytes, Arc<Statement>)>,
    /// Parses sent to servers (forwarded or injected), and client Parses answered
    /// from a server's cache, since the last flush.
    pub server_parses: u64,
    pub cache_hits: u64,
    /// Statements a server reported stale (id, generation it held): the caller bumps
    /// the pool's generation so other servers re-prepare them.
    pub stale: Vec<(u64, u64)>,
    /// What the statements this exchange ran, or bound for running, may SET (worked
    /// out once per text): what later statements parse to, a session setting
    /// PostgreSQL does not report, the role. A SET or RESET completing is read with
    /// these (`Seen::note`).
    pub sets: TextEffects,
}

impl Extended {
    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
    }

    /// Whether a client message is held back, unscanned, until a shape check's answer
    /// (a run the check refuses must not run), or until everything before it is
    /// answered (`hold_for_answers`); the relay scans the client's input again once it
    /// is not. The check (`Effect::Verify`) or the mark (`Effect::Hold`) is then the
    /// last item queued: nothing is scanned after it until it leaves the queue,
    /// answered or skipped.
    pub fn holding(&self) -> bool {
        self.queue.back().is_some_and(|e| matches!(e.effect, Effect::Verify(..) | Effect::Hold))
    }

    /// Whether the oldest unanswered message is an Execute (a COPY it starts is an
    /// extended-protocol one, ended by a Sync).
    pub fn head_is_execute(&self) -> bool {
        self.queue.front().is_some_and(|e| e.kind == Kind::Execute)
    }

    /// Forgets everything but the allocations (a new link starts).
    #[inline]
    pub fn clear(&mut self) {
        self.queue.clear();
        self.last_bind = None;
        self.skipping = false;
        self.refuse = false;
        self.skipped_requests = 0;
        self.unnamed_lost = None;
        self.unnamed_reopened = None;
        self.emptied = None;
        self.discarded = false;
        // Checked first: clearing runs drop glue even when empty (nearly always).
        for v in [&mut self.undefined, &mut self.redefined, &mut self.reopened] {
            if !v.is_empty() {
                v.clear();
            }
        }
        self.stale.clear();
        self.sets = TextEffects::default();
    }

    fn push(&mut self, kind: Kind, reply: Reply, stmt: Option<u64>) {
        self.queue.push_back(Expect::new(kind, reply, stmt));
    }

    /// Applies what the server's answers decided about the client's names: its unnamed
    /// statement (`unnamed_lost`, then `unnamed_reopened`), then `undefined`,
    /// `redefined`, `reopened`, in that order.
    #[inline]
    pub fn settle_names(&mut self, stmts: &mut ClientStatements) {
        if let Some(id) = self.unnamed_lost.take() {
            if stmts.unnamed.as_ref().is_some_and(|u| u.id == id) {
                stmts.forget_unnamed();
            }
        }
        if let Some(u) = self.unnamed_reopened.take() {
            stmts.unnamed.get_or_insert(u);
        }
        if self.undefined.is_empty() && self.redefined.is_empty() && self.reopened.is_empty() {
            return; // the usual case, without three empty drains
        }
        for (name, st) in self.undefined.drain(..) {
            stmts.undefine(&name, &st);
        }
        for (name, st) in self.redefined.drain(..) {
            stmts.insert(&name, st);
        }
        for (name, st) in self.reopened.drain(..) {
            stmts.restore(name, st);
        }
    }

    /// Closes on the server the statements queued for closing (`to_close`), before the
    /// client message at offset `at`: one the server reads as a request, neither while it
    /// skips to a Sync after an error nor inside a COPY (it would fail the COPY).
    #[inline(never)]
    fn inject_closes(&mut self, at: usize, sp: &mut Splice, server: &mut ServerStatements) {
        for id in std::mem::take(&mut server.to_close) {
            self.inject_close(id, at, sp);
        }
        flush_injected(at, sp);
    }

    /// Handles one client message (pooled modes). Sync/Query bookkeeping for the
    /// release decision stays with the caller; the result tells it whether a Query or
    /// FunctionCall gets no ReadyForQuery from the server: Sluice answered it
    /// (DEALLOCATE), or the server skips it (`skipping`).
    #[inline]
    pub fn on_client(&mut self, m: &Msg, sp: &mut Splice, cx: &mut ClientCtx) -> Result<bool, ProtocolError> {
        if std::mem::take(&mut self.refuse) {
            self.refuse_held(m, sp);
            return Ok(false);
        }
        if let Some(no_reply) = self.skipped_by_server(m.tag) {
            return Ok(no_reply);
        }
        if !cx.server.to_close.is_empty() && starts_request(m.tag) {
            self.inject_closes(m.start, sp, cx.server);
        }
        match m.tag {
            fe::PARSE => self.on_parse(m, sp, cx).and_then(|()| self.local_replies_bounded()),
            fe::BIND | fe::DESCRIBE => self.on_bind_or_describe(m, sp, cx).map(|()| false),
            fe::CLOSE => self.on_close(m, sp, cx).and_then(|()| self.local_replies_bounded()),
            fe::EXECUTE => {
                self.queue.push_back(Expect::new(Kind::Execute, Reply::Forward, self.last_bind));
                Ok(false)
            }
            fe::SYNC => {
                self.push(Kind::Sync, Reply::Forward, None);
                Ok(false)
            }
            fe::QUERY => self.on_query(m, sp, cx),
            fe::FUNCTION_CALL => {
                self.push(Kind::Call, Reply::Forward, None);
                Ok(false)
            }
            _ => Ok(false),
        }
    }

    /// Handles one client message in session mode, where everything is forwarded as
    /// sent: only the reply it gets is queued. The result is `on_client`'s. (Out of
    /// line: the pooled modes' scan loops, which never call it, stay as small as before.)
    #[inline(never)]
    pub fn on_client_forwarded(&mut self, tag: u8) -> bool {
        if let Some(no_reply) = self.skipped_by_server(tag) {
            return no_reply;
        }
        if let Some(kind) = Kind::of_request(tag) {
            self.push(kind, Reply::Forward, None);
        }
        false
    }

    /// While the server skips to the next Sync after an error (`skipping`), a client
    /// message other than that Sync is passed on as sent and answered with nothing (a
    /// Parse defines nothing, a Close closes nothing): `Some`, true for a simple query
    /// or function call (no ReadyForQuery comes for it). `None` for a message the
    /// server reads, the Sync that ends the skipping included.
    #[inline]
    fn skipped_by_server(&mut self, tag: u8) -> Option<bool> {
        if !self.skipping {
            return None;
        }
        if tag != fe::SYNC {
            return Some(matches!(tag, fe::QUERY | fe::FUNCTION_CALL));
        }
        self.skipping = false;
        None
    }

    fn on_bind_or_describe(&mut self, m: &Msg, sp: &mut Splice, cx: &mut ClientCtx) -> Result<(), ProtocolError> {
        let prefix = m.frame.ok_or(ProtocolError::Malformed("Bind/Describe"))?;
        let kind = if m.tag == fe::BIND { Kind::Bind } else { Kind::Describe };
        if kind == Kind::Describe && body(prefix).first() == Some(&b'P') {
            self.push(kind, Reply::Forward, None);
            return Ok(());
        }
        let (_, name) = prepared::name_field(prefix, m.tag)?;
        let mut stmt = None;
        let mut effect = Effect::None;
        let mut effects = TextEffects::default();
        if name.is_empty() {
            effects = self.unnamed_here(m.start, sp, cx);
        } else if let Some(st) = cx.stmts.get(name).cloned() {
            effects = st.effects;
            if kind == Kind::Describe {
                effect = Effect::Capture(st.clone(), cx.generation(st.id));
            }
            let id = st.id;
            if self.ensure(&st, m.start, sp, cx, &|e| e.parses_or_closes(id)) {
                return Ok(());
            }
            let (buf, from) = sp.insert_buf();
            let replaced = prepared::renamed_prefix(buf, prefix, m.frame_len, m.tag, &st.name)?;
            sp.drop_range(m.start, m.start + replaced);
            sp.commit_insert(m.start, from);
            stmt = Some(st.id);
        }
        if kind == Kind::Bind {
            self.last_bind = stmt;
            // Its execution in this exchange may SET what later statements parse to.
            self.sets |= effects;
        }
        self.queue.push_back(Expect::new(kind, Reply::Forward, stmt).with(effect));
        Ok(())
    }

    /// The effects of the client's unnamed statement, made sure to be the server's:
    /// parsed here if it was parsed on another server, or if its Parse is still
    /// unanswered behind a Sync (the server may yet skip it). A client with none gets
    /// the server's closed, as it may be another client's: the server then refuses the
    /// Bind or Describe (26000) as PostgreSQL would.
    fn unnamed_here(&mut self, at: usize, sp: &mut Splice, cx: &mut ClientCtx) -> TextEffects {
        let Some(u) = cx.stmts.unnamed.as_ref() else {
            let (buf, from) = sp.insert_buf();
            build::close(buf, b'S', b"");
            sp.commit_insert(at, from);
            flush_injected(at, sp);
            self.push(Kind::Close, Reply::Swallow, None);
            cx.server.unnamed = 0;
            return TextEffects::default();
        };
        if cx.server.unnamed != u.id
            || self.unanswered_before_sync(
                |e| matches!(e.effect, Effect::Unnamed(i) | Effect::UnnamedAgain(i) if i == u.id),
            )
        {
            sp.insert(at, &u.parse);
            flush_injected(at, sp);
            self.server_parses += 1;
            self.queue.push_back(Expect::new(Kind::Parse, Reply::Swallow, None).with(Effect::UnnamedAgain(u.id)));
            cx.server.unnamed = u.id;
        }
        u.effects
    }

    /// What the server holds of statement `id`, given what the books say (`presence`):
    /// while a Parse or Close of it is unanswered with a Sync queued behind, an error
    /// before it may yet make the server skip it, so the books may be wrong either way;
    /// it is then taken as stale (closed and parsed again, a Close of a statement the
    /// server lacks being harmless).
    #[inline]
    fn unless_in_doubt(&self, id: u64, presence: Presence) -> Presence {
        // The usual case first: nothing before this exchange unanswered (or stale anyway).
        if self.queue.is_empty() || presence == Presence::Stale {
            return presence;
        }
        if self.unanswered_before_sync(|e| e.parses_or_closes(id)) { Presence::Stale } else { presence }
    }

    /// Whether an item `matches` is unanswered with a Sync queued behind it (the queue
    /// holds exactly what the server has not answered yet): an error before it may yet
    /// make the server skip it. (The look through the queue, needed only while a Sync
    /// is queued, is out of line: inlined into `on_client`, it has grown it past what
    /// the compiler inlines into the scan loop.)
    #[inline]
    fn unanswered_before_sync(&self, matches: impl Fn(&Expect) -> bool) -> bool {
        self.queue.syncs() != 0 && self.any_before_sync(&matches)
    }

    #[inline(never)]
    fn any_before_sync(&self, matches: &dyn Fn(&Expect) -> bool) -> bool {
        let mut rest = self.queue.iter();
        rest.any(matches) && rest.any(|e| e.kind == Kind::Sync)
    }

    fn on_close(&mut self, m: &Msg, sp: &mut Splice, cx: &mut ClientCtx) -> Result<(), ProtocolError> {
        let frame = m.frame.ok_or(ProtocolError::Malformed("Close"))?;
        let (_, name) = prepared::name_field(frame, m.tag)?;
        if body(frame).first() == Some(&b'S') {
            if name.is_empty() {
                // The server drops whatever unnamed statement it holds; should it skip
                // this Close after an error, the client's statement stands again.
                cx.server.unnamed = 0;
                self.unnamed_changes += 1;
                let item = Expect::new(Kind::Close, Reply::Forward, None);
                self.queue.push_back(match cx.stmts.unnamed.take() {
                    Some(u) => item.with(Effect::CloseUnnamed(Box::new((u, self.unnamed_changes)))),
                    None => item,
                });
                return Ok(());
            } else {
                // Other clients may share the server-side statement: answer here.
                let closed = cx.stmts.remove(name);
                sp.drop_range(m.start, m.start + m.frame_len);
                let mut b = BytesMut::new();
                build::close_complete(&mut b);
                let mut item = Expect::new(Kind::Local, Reply::Synthetic(b.freeze()), None);
                if let Some((name, st)) = closed {
                    item.effect = Effect::Close(name, st);
                }
                self.queue.push_back(item);
                return Ok(());
            }
        }
        self.push(Kind::Close, Reply::Forward, None);
        Ok(())
    }

    #[inline]
    fn on_query(&mut self, m: &Msg, sp: &mut Splice, cx: &mut ClientCtx) -> Result<bool, ProtocolError> {
        // A simple query replaces the server's unnamed statement.
        cx.server.unnamed = 0;
        let sql = m.frame.filter(|f| f.len() == m.frame_len).and_then(|f| crate::protocol::read_cstr(body(f)));
        let sql = sql.map(|(sql, _)| sql);
        if self.sets != TextEffects::ALL {
            // A text not read whole (long) may hold any statement.
            let set = sql.map_or(prepared::SetTarget::Unknown, prepared::SetTarget::of);
            self.sets |= TextEffects::of_target(set, sql);
        }
        match sql.and_then(prepared::sql_command) {
            Some(c @ (SqlCommand::Deallocate(_) | SqlCommand::DeallocateAll)) => Ok(self.on_deallocate(c, m, sp, cx)),
            _ => {
                self.push(Kind::Query, Reply::Forward, None);
                Ok(false)
            }
        }
    }

    /// A simple query that is exactly a DEALLOCATE: of a statement the client holds, or
    /// ALL, answered here (true: no ReadyForQuery comes from the server); of another
    /// name, forwarded (the server refuses it). (Out of line: rare, and `on_query`
    /// stays small enough for the scan loop to inline.)
    #[cold]
    #[inline(never)]
    fn on_deallocate(&mut self, command: SqlCommand, m: &Msg, sp: &mut Splice, cx: &mut ClientCtx) -> bool {
        if cx.in_copy {
            // Inside a COPY FROM STDIN (the client's mistake): to the server, as any query.
            self.push(Kind::Query, Reply::Forward, None);
            return false;
        }
        if self.queue.iter().any(|e| !matches!(e.reply, Reply::Synthetic(_))) {
            // The server's answers still due decide, even whether the name is the
            // client's (a Close ahead may yet be skipped): read again once they are in.
            self.hold_for_answers(m, sp);
            return false;
        }
        let ours = match &command {
            SqlCommand::Deallocate(name) => cx.stmts.get(name.as_bytes()).is_some(),
            SqlCommand::DeallocateAll => true,
            SqlCommand::DiscardAll => false,
        };
        // Nothing due from the server: the transaction status is known (that of its
        // last ReadyForQuery: extended messages since, with no Sync, may have changed it).
        let mut b = BytesMut::new();
        if cx.tx == TxStatus::Failed {
            // As PostgreSQL: refused in a failed transaction, the statements kept.
            let text = "current transaction is aborted, commands ignored until end of transaction block";
            build::error_response(&mut b, build::Severity::Error, sqlstate::IN_FAILED_SQL_TRANSACTION, text);
        } else if !ours {
            // Not one of the client's names: the server answers.
            self.push(Kind::Query, Reply::Forward, None);
            return false;
        } else if let SqlCommand::Deallocate(name) = command {
            cx.stmts.remove(name.as_bytes());
            build::command_complete(&mut b, "DEALLOCATE");
        } else {
            cx.stmts.clear();
            build::command_complete(&mut b, "DEALLOCATE ALL");
        }
        sp.drop_range(m.start, m.start + m.frame_len);
        build::ready_for_query(&mut b, cx.tx);
        self.push(Kind::Local, Reply::Synthetic(b.freeze()), None);
        true
    }

    /// Holds the client message `m` (and what follows it) back, unscanned, until the
    /// server has answered everything queued before it (`holding`): a DEALLOCATE that
    /// Sluice answers must see the transaction status they leave (a failed transaction
    /// refuses it) and whether the server skips it after an error, as PostgreSQL runs
    /// it in turn. A Flush makes the server send those answers without more input.
    fn hold_for_answers(&mut self, m: &Msg, sp: &mut Splice) {
        flush_injected(m.start, sp);
        sp.stop_before(m.start);
        self.queue.push_back(Expect::new(Kind::Local, Reply::Synthetic(Bytes::new()), None).with(Effect::Hold));
    }

    /// The message held for a failed shape check: the server gets, instead of it, a
    /// Bind it fails, so the exchange fails there as it would have on PostgreSQL
    /// itself (the transaction aborts; the server skips to the Sync). That error is
    /// not the client's: it already has its 0A000.
    fn refuse_held(&mut self, m: &Msg, sp: &mut Splice) {
        let (buf, from) = sp.insert_buf();
        prepared::failing_bind_frame(buf);
        sp.commit_insert(m.start, from);
        sp.drop_range(m.start, m.start + m.frame_len);
        self.push(Kind::Bind, Reply::Refused, None);
    }
}

/// Whether a client message with `tag` is one the server reads as (part of) a request,
/// the place for Sluice's own messages ahead of it: not a Sync (it may end a skip after
/// an error), not Flush, nor a COPY message.
fn starts_request(tag: u8) -> bool {
    Kind::of_request(tag).is_some_and(|k| k != Kind::Sync)
}

/// A Flush right after messages Sluice injected before input offset `at` (ahead of
/// the client's message there, never inside it, which may be only partly read): the
/// server sends their replies even when the client's own messages are answered
/// locally and no Sync follows.
fn flush_injected(at: usize, sp: &mut Splice) {
    let (buf, from) = sp.insert_buf();
    build::flush(buf);
    sp.commit_insert(at, from);
}
