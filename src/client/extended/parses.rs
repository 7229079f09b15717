//! The Parse side of `client::extended`: a client's Parse of a named statement (answered
//! from the server's cache, sent, or made to fail as a duplicate), and making sure a
//! server holds a statement before a Bind or Describe of it (`ensure`), with the shape
//! check that may hold that message back.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::expect::{Effect, Expect, Kind, Redefinition, Reply};
use super::{ClientCtx, Extended, LOCAL_REPLIES_LIMIT, flush_injected};
use crate::prepared::{self, Presence, Statement, TextEffects};
use crate::protocol::build;
use crate::protocol::scan::{Msg, Splice};
use crate::protocol::{ProtocolError, TxStatus};

impl Extended {
    /// A Parse of a name the client already holds (`existing`). A real server refuses
    /// it as a duplicate: make it say so. If the Parse that defined the name, still in
    /// the pipeline, is skipped after an error, this one succeeds and the name stands
    /// again. The client's own earlier Parse of the name still in doubt does not count
    /// (if the server skips it, this one is what defines the name, as on PostgreSQL); any
    /// other Parse or Close of the statement does (Sluice's own, or the client's Parse
    /// of another name with the same text; `unless_in_doubt`). (Out of line: rare.)
    #[cold]
    #[inline(never)]
    pub(super) fn on_parse_again(
        &mut self,
        name: &[u8],
        existing: Arc<Statement>,
        m: &Msg,
        sp: &mut Splice,
        cx: &mut ClientCtx,
    ) -> Result<(), ProtocolError> {
        let id = existing.id;
        let counts = |e: &Expect| {
            e.parses_or_closes(id)
                && !match &e.effect {
                    Effect::Define(n, _) => n.as_ref() == name,
                    Effect::Redefine(r) => r.name.as_ref() == name,
                    _ => false,
                }
        };
        if self.ensure(&existing, m.start, sp, cx, &counts) {
            return Ok(());
        }
        sp.drop_range(m.start, m.start + m.frame_len);
        sp.insert(m.start, &existing.parse);
        let generation = cx.generation(id);
        let name = Bytes::copy_from_slice(name);
        let effect =
            Effect::Redefine(Box::new(Redefinition { name, st: existing, generation, cap: cx.cap, defines: false }));
        self.queue.push_back(Expect::new(Kind::Parse, Reply::Forward, None).with(effect));
        Ok(())
    }

    /// A client that keeps sending Parses and Closes Sluice answers itself behind an
    /// answer the server owes (a long query, say) would queue their replies without
    /// end: nothing reaches the server, so nothing holds the client back. Past
    /// `LOCAL_REPLIES_LIMIT` of them in a row, with no message to the server between
    /// (which the server's socket would hold back), the client is refused.
    pub(super) fn local_replies_bounded(&self) -> Result<bool, ProtocolError> {
        match self.queue.local_run() > LOCAL_REPLIES_LIMIT {
            true => Err(ProtocolError::Limit(
                "too many replies waiting behind the server's answers (the client sends without reading)",
            )),
            false => Ok(false),
        }
    }

    pub(super) fn on_parse(&mut self, m: &Msg, sp: &mut Splice, cx: &mut ClientCtx) -> Result<(), ProtocolError> {
        let frame = m.frame.ok_or(ProtocolError::Malformed("Parse"))?;
        let p = prepared::parse_view(frame)?;
        if p.name.is_empty() {
            let id = rand::random::<u64>() | 1;
            cx.stmts.set_unnamed(frame, id, TextEffects::of(p.query));
            self.unnamed_changes += 1;
            cx.server.unnamed = id;
            self.server_parses += 1;
            self.queue.push_back(Expect::new(Kind::Parse, Reply::Forward, None).with(Effect::Unnamed(id)));
            return Ok(());
        }
        if let Some(existing) = cx.stmts.get(p.name).cloned() {
            return self.on_parse_again(prepared::key(p.name), existing, m, sp, cx);
        }
        sp.drop_range(m.start, m.start + m.frame_len);
        if cx.stmts.len() >= cx.client_limit {
            return Err(ProtocolError::Limit(
                "too many prepared statements for one client (max_client_prepared_statements)",
            ));
        }
        let st = Arc::new(prepared::statement(&p, cx.epoch, cx.settings));
        cx.stmts.insert(p.name, st.clone());
        let mut presence = self.unless_in_doubt(st.id, cx.server.lookup_since(st.id, cx.generation(st.id), cx.epoch));
        if presence == Presence::Fresh && self.cache_unsure(cx.tx) {
            presence = Presence::Stale;
        }
        let item = if presence == Presence::Fresh {
            self.cache_hits += 1;
            let mut b = BytesMut::new();
            build::parse_complete(&mut b);
            Expect::new(Kind::Local, Reply::Synthetic(b.freeze()), None)
        } else {
            let stale = presence == Presence::Stale;
            if stale {
                self.inject_close(st.id, m.start, sp);
            }
            if self.add_to_server(st.id, m.start, sp, cx) || stale {
                flush_injected(m.start, sp);
            }
            sp.insert(m.start, &st.parse);
            self.server_parses += 1;
            Expect::new(Kind::Parse, Reply::Forward, Some(st.id))
        };
        self.queue.push_back(item.with(Effect::Define(Bytes::copy_from_slice(prepared::key(p.name)), st)));
        Ok(())
    }

    /// Whether a Parse of a statement the server holds may not be answered from the
    /// server's cache, but must be sent (after a Close, harmless if the copy is gone):
    /// in a failed transaction (PostgreSQL refuses a Parse there with 25P02); in a
    /// transaction block behind an unanswered Sync, query or function call, whose
    /// failure would leave the block failed when the Parse runs (a failure in its own
    /// Sync segment makes the server skip it, as it does Sluice's answer); behind an
    /// unanswered query or Execute, which may empty the server's statements (DISCARD
    /// ALL, DEALLOCATE ALL, told only by its tag once it completes). (Out of line: rare.)
    #[inline(never)]
    pub(super) fn cache_unsure(&self, tx: TxStatus) -> bool {
        let ahead = |kinds: &[Kind]| self.queue.iter().any(|e| kinds.contains(&e.kind));
        tx == TxStatus::Failed
            || (tx == TxStatus::InTransaction && (self.queue.syncs() != 0 || ahead(&[Kind::Call])))
            || ahead(&[Kind::Query, Kind::Execute])
    }

    /// Records a statement on the server, closing the least recently used one if full
    /// (true: a Close was injected).
    pub(super) fn add_to_server(&mut self, id: u64, at: usize, sp: &mut Splice, cx: &mut ClientCtx) -> bool {
        let evicted = cx.server.add_gen(id, cx.generation(id), cx.epoch, cx.cap);
        if let Some(evicted) = evicted {
            self.inject_close(evicted, at, sp);
        }
        evicted.is_some()
    }

    /// Closes a server-side statement before input offset `at` (reply swallowed); the
    /// caller adds the Flush (`flush_injected`) once it has injected all it needs there.
    pub(super) fn inject_close(&mut self, id: u64, at: usize, sp: &mut Splice) {
        let (buf, from) = sp.insert_buf();
        prepared::close_frame(buf, id);
        sp.commit_insert(at, from);
        self.queue.push_back(Expect::new(Kind::Close, Reply::Swallow, None).with(Effect::Closes(id)));
    }

    /// Makes sure the server holds `st`, injecting its Parse before the client message
    /// at offset `at`, also when a Parse or Close of it still unanswered, one of the
    /// queue items that `counts`, may yet be skipped by the server (as in
    /// `unless_in_doubt`); it is then closed first (a later segment's Parse settles the
    /// statement, `settled_later`). True when that message is held back for a shape
    /// check.
    #[inline]
    pub(super) fn ensure(
        &mut self,
        st: &Arc<Statement>,
        at: usize,
        sp: &mut Splice,
        cx: &mut ClientCtx,
        counts: &dyn Fn(&Expect) -> bool,
    ) -> bool {
        let generation = cx.generation(st.id);
        let (presence, checked) = cx.server.lookup_checked(st.id, generation, st.epoch);
        // The usual case: held and current, nothing in doubt (no Sync queued), and no
        // shape to check, or one this copy's Describe showed.
        if presence == Presence::Fresh && self.queue.syncs() == 0 {
            let shape = st.shape.lock();
            if shape.as_ref().is_none_or(|(_, g, h)| *g >= generation && *h == checked) {
                return false;
            }
        }
        self.ensure_rest(st, at, sp, cx, counts, (generation, presence, checked))
    }

    /// `ensure` past its usual case: `looked` is the statement's generation, what the
    /// books say the server holds of it, and the shape its copy showed. (Out of line.)
    #[inline(never)]
    pub(super) fn ensure_rest(
        &mut self,
        st: &Arc<Statement>,
        at: usize,
        sp: &mut Splice,
        cx: &mut ClientCtx,
        counts: &dyn Fn(&Expect) -> bool,
        looked: (u64, Presence, u64),
    ) -> bool {
        let (generation, mut presence, checked) = looked;
        if presence != Presence::Stale && self.unanswered_before_sync(counts) {
            presence = Presence::Stale;
        }
        if presence != Presence::Fresh {
            if presence == Presence::Stale {
                self.inject_close(st.id, at, sp);
            }
            self.add_to_server(st.id, at, sp, cx);
            sp.insert(at, &st.parse);
            self.server_parses += 1;
            self.push(Kind::Parse, Reply::Swallow, Some(st.id));
        }
        // A copy the client's view of the statement may not match: check its shape
        // (also a copy another client prepared after a schema change, which no Describe
        // on this server has shown the client's shape of).
        let seen = st.shape.lock().as_ref().map(|(_, g, h)| (*g, *h));
        tracing::debug!(stmt = st.id, ?presence, generation, ?seen, "statement needed");
        if seen.is_some_and(|(g, h)| presence != Presence::Fresh || g < generation || checked != h) {
            let (buf, from) = sp.insert_buf();
            prepared::describe_frame(buf, &st.name);
            sp.commit_insert(at, from);
            let verify = Effect::Verify(st.clone(), generation);
            self.queue.push_back(Expect::new(Kind::Describe, Reply::Swallow, Some(st.id)).with(verify));
            flush_injected(at, sp);
            // The message waits for the answer (`holding`): if the shape changed, it
            // must not run.
            sp.stop_before(at);
            return true;
        }
        if presence != Presence::Fresh {
            flush_injected(at, sp);
        }
        false
    }
}
