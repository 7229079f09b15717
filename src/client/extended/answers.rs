//! The server side of `client::extended`: each server message answers the head of the
//! queue of expected replies; Sluice's own replies are placed after the message that
//! precedes them, injected messages' replies are swallowed, and an error makes the
//! queue skip to the next Sync as the server does.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::Extended;
use super::expect::{Effect, Expect, Kind, Redefinition, Reply};
use crate::prepared::{ServerStatements, Statement};
use crate::protocol::build;
use crate::protocol::fields::ErrorFields;
use crate::protocol::scan::{Msg, Splice};
use crate::protocol::{ProtocolError, be, body};

/// The shape a Describe reply gives: of a RowDescription, each column's name, type
/// and type modifier, what PostgreSQL compares before it refuses a changed result type
/// (not the column's table and attribute number: a table made again alike is the same
/// result); NoData as `n`.
fn shape_of(m: &Msg) -> Bytes {
    match m.frame {
        Some(f) if m.tag == be::ROW_DESCRIPTION => {
            row_shape(body(f)).map_or_else(|| Bytes::copy_from_slice(f), Bytes::from)
        }
        _ => Bytes::from_static(b"n"),
    }
}

/// The hash a shape is known by (`ServerStatements::lookup_checked`); never 0, which means none.
fn shape_hash(shape: &[u8]) -> u64 {
    use std::hash::BuildHasher;
    foldhash::fast::FixedState::default().hash_one(shape) | 1
}

/// A RowDescription body's columns as name, type OID and type modifier (None if it is
/// malformed: the frame is then compared whole).
fn row_shape(body: &[u8]) -> Option<Vec<u8>> {
    let (count, mut rest) = crate::protocol::read_i16(body)?;
    let mut out = Vec::with_capacity(body.len());
    out.extend_from_slice(&count.to_be_bytes());
    for _ in 0..count {
        let (name, after) = crate::protocol::read_cstr(rest)?;
        // Table OID (4), attribute number (2), type OID (4), length (2), modifier (4),
        // format (2).
        let fixed = after.get(..18)?;
        out.extend_from_slice(name);
        out.push(0);
        out.extend_from_slice(&fixed[6..10]);
        out.extend_from_slice(&fixed[12..16]);
        rest = &after[18..];
    }
    rest.is_empty().then_some(out)
}

/// How the server answered a client's Parse of a name it holds (`Effect::Redefine`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Parsed,
    /// Refused as a duplicate (42P05): the server holds the statement.
    Duplicate,
    /// Skipped after an earlier error, or refused for another reason.
    NotRun,
}

impl Extended {
    /// Records a CommandComplete of DISCARD ALL or DEALLOCATE ALL (`emptied_by`).
    #[inline]
    pub(in crate::client) fn note_emptying(&mut self, m: &Msg, server: &mut ServerStatements) {
        let body = body(m.frame.unwrap_or_default());
        // Most tags (SELECT, INSERT...) are told by their first letter.
        if body.first() != Some(&b'D') {
            return;
        }
        let tag = crate::protocol::read_cstr(body).map_or(&[][..], |(t, _)| t);
        let discard = tag == b"DISCARD ALL";
        if discard || tag == b"DEALLOCATE ALL" {
            self.emptied_by(discard, server);
        }
    }

    /// The server's statements are gone, but for those parsed behind the command in the
    /// same pipeline (their Parse still queued); so are the client's, but for the names
    /// those Parses define (`emptied`), and after DISCARD ALL its settings (`discarded`).
    fn emptied_by(&mut self, discard: bool, server: &mut ServerStatements) {
        let parsed_behind = |e: &Expect| match &e.effect {
            Effect::Redefine(r) => Some(r.st.id),
            _ => e.stmt.filter(|_| e.kind == Kind::Parse),
        };
        server.clear_except(self.queue.iter().filter_map(parsed_behind));
        let defined_behind = |e: &Expect| match &e.effect {
            Effect::Define(name, st) => Some((name.clone(), st.clone())),
            _ => None,
        };
        let behind: Vec<(Bytes, Arc<Statement>)> = self.queue.iter().filter_map(defined_behind).collect();
        // Closes behind it of names defined before it give nothing back if skipped.
        self.queue.forget_closes_unless(|st| behind.iter().any(|(_, s)| Arc::ptr_eq(s, st)));
        // A name closed behind its Parse went when the Close was read (given back by
        // `reopened` should the server skip the Close).
        let closed = |name: &Bytes, st: &Arc<Statement>| {
            self.queue.iter().any(|e| matches!(&e.effect, Effect::Close(n, s) if n == name && Arc::ptr_eq(s, st)))
        };
        self.emptied = Some(behind.iter().filter(|(n, st)| !closed(n, st)).cloned().collect());
        // Names the answers before it gave back or defined again are gone with the rest
        // (a Parse of a name again queued behind it settles after it, as ever).
        self.redefined.clear();
        self.reopened.clear();
        self.discarded |= discard;
    }

    /// Sluice's own replies now at the head of the queue (everything before them has
    /// been answered): append them to `out` for the client.
    pub fn take_leading_synthetic(&mut self, out: &mut BytesMut) {
        while let Some(Expect { reply: Reply::Synthetic(b), .. }) = self.queue.front() {
            out.extend_from_slice(b);
            self.queue.pop_front();
        }
    }

    /// Removes the first `n` Sync expectations after the head (the Execute or Query
    /// that began a COPY FROM STDIN): the server ignores those Syncs.
    pub fn drop_ignored_syncs(&mut self, n: usize) {
        let (mut n, mut i) = (n, 1);
        while n > 0 && i < self.queue.len() {
            if self.queue[i].kind == Kind::Sync {
                self.queue.remove(i);
                n -= 1;
            } else {
                i += 1;
            }
        }
    }

    /// Handles one server message (every mode). Whether it answers a message Sluice
    /// refused (`refuse_held`): the client never sees it, having had its 0A000 instead.
    /// (Inline: one caller, the scan of the server's replies, where a call of its own
    /// cost ~3% more instructions per extended-protocol transaction.)
    #[inline]
    pub fn on_server(
        &mut self,
        m: &Msg,
        sp: &mut Splice,
        server: &mut ServerStatements,
    ) -> Result<bool, ProtocolError> {
        if matches!(m.tag, be::NOTICE_RESPONSE | be::PARAMETER_STATUS | be::NOTIFICATION_RESPONSE) {
            return Ok(false);
        }
        let Some(head) = self.queue.front_mut() else {
            // Nothing expected (a ReadyForQuery counted early, see `track::EarlySyncs`):
            // what the reply changes still counts.
            if m.tag == be::COMMAND_COMPLETE {
                self.note_emptying(m, server);
            }
            return Ok(false);
        };
        let refused = head.reply == Reply::Refused;
        if refused {
            sp.drop_range(m.start, m.start + m.frame_len);
        }
        if m.tag == be::ERROR_RESPONSE {
            if !head.kind.starts_skip() {
                head.failed = true;
                return Ok(refused);
            }
            let item = self.queue.pop_front().expect("head exists");
            self.after_error(item, m, server)?;
            return Ok(refused);
        }
        let (kind, swallowed) = (head.kind, head.reply == Reply::Swallow);
        // A client's command that emptied the server's statements, told by its tag:
        // DISCARD ALL, DEALLOCATE ALL, as a simple query (also in forms Sluice does not
        // answer itself: `/* c */ DEALLOCATE ALL`, one of several statements) or the
        // Execute of a prepared one (whichever portal it runs).
        if m.tag == be::COMMAND_COMPLETE && matches!(kind, Kind::Query | Kind::Execute) {
            self.note_emptying(m, server);
        }
        // Every message of a reply to an injected message is removed.
        if swallowed {
            sp.drop_range(m.start, m.start + m.frame_len);
        }
        if !kind.done_by(m.tag) {
            return Ok(refused);
        }
        let item = self.queue.pop_front().expect("head exists");
        let end = m.start + m.frame_len;
        match item.effect {
            Effect::Redefine(r) => self.settle_redefinition(*r, Answer::Parsed, server),
            Effect::Capture(st, generation) => {
                tracing::debug!(stmt = st.id, generation, "shape captured");
                let shape = shape_of(m);
                let hash = shape_hash(&shape);
                server.set_checked(st.id, hash);
                *st.shape.lock() = Some((shape, generation, hash));
            }
            Effect::Verify(st, generation) => {
                let now = shape_of(m);
                let changed = {
                    let mut shape = st.shape.lock();
                    match shape.as_mut() {
                        // Same shape: the client's view holds for this generation too,
                        // and this copy is checked.
                        Some((seen, g, hash)) if *seen == now => {
                            *g = generation;
                            server.set_checked(st.id, *hash);
                            false
                        }
                        // Changed: the statement stays refused until re-described.
                        Some(_) => true,
                        None => false,
                    }
                };
                tracing::debug!(stmt = st.id, generation, changed, "shape verified");
                if changed {
                    // The schema changed: copies prepared before it elsewhere are stale.
                    self.stale.push((st.id, server.generation(st.id).unwrap_or(0)));
                    self.refuse_changed_shape(sp, end);
                }
            }
            _ => {}
        }
        if matches!(self.queue.front(), Some(Expect { reply: Reply::Synthetic(_), .. })) {
            self.emit_synthetic(sp, end);
        }
        Ok(refused)
    }

    /// Sluice's own replies now at the head of the queue, behind the server's message
    /// ending at `end`: into the client's output. (Out of line: rare.)
    #[cold]
    #[inline(never)]
    fn emit_synthetic(&mut self, sp: &mut Splice, end: usize) {
        while let Some(Expect { reply: Reply::Synthetic(b), .. }) = self.queue.front() {
            sp.insert(end, b);
            self.queue.pop_front();
        }
    }

    /// The statement's result type changed since the client described it: the client
    /// gets the error PostgreSQL gives for that (at `at` in the server's output), and
    /// the message held for the check is refused (`refuse_held`).
    fn refuse_changed_shape(&mut self, sp: &mut Splice, at: usize) {
        let mut b = BytesMut::new();
        // As PostgreSQL words it; drivers (asyncpg) recognise it by the routine name.
        build::error_response_from(
            &mut b,
            build::Severity::Error,
            crate::protocol::sqlstate::FEATURE_NOT_SUPPORTED,
            "cached plan must not change result type",
            Some("RevalidateCachedQuery"),
        );
        sp.insert(at, &b);
        self.refuse = true;
    }

    /// Undoes what a message the server failed or skipped was expected to do.
    fn undo(&mut self, effect: Effect, server: &mut ServerStatements) {
        match effect {
            // A Parse of the name again, still queued, decides whether it stands.
            Effect::Define(name, st) => {
                // A Close behind it took a name PostgreSQL never defined: nothing to give back.
                self.queue.forget_closes_of(&name, &st);
                match self.queue.redefinition_mut(&name, st.id) {
                    Some(r) => r.defines = true,
                    None => self.undefined.push((name, st)),
                }
            }
            Effect::Close(name, st) => self.reopened.push((name, st)),
            // The statement is still on the server: close it before the next request.
            Effect::Closes(id) if !self.settled_later(id) => server.to_close.push(id),
            Effect::Redefine(r) => self.settle_redefinition(*r, Answer::NotRun, server),
            // Given back only if it was the client's last word on its unnamed statement,
            // and not from a Parse that failed or was skipped too.
            Effect::CloseUnnamed(closed) => {
                let (u, at) = *closed;
                if at == self.unnamed_changes && self.unnamed_lost != Some(u.id) {
                    self.unnamed_reopened = Some(u);
                }
            }
            // The server does not hold that unnamed statement (a later Parse replaces
            // whatever it holds anyway); after the client's own Parse, nor does the client.
            Effect::Unnamed(id) | Effect::UnnamedAgain(id) => {
                if server.unnamed == id {
                    server.unnamed = 0;
                }
                if matches!(effect, Effect::Unnamed(_)) {
                    self.unnamed_lost = Some(id);
                }
            }
            _ => {}
        }
    }

    /// The client's names and the books after a client's Parse of a name it holds
    /// (`Effect::Redefine`), sent as the Parse of `r.st` and not recorded when sent.
    /// The name stands again if the Parse ran; if not, and the earlier Parse of the
    /// name was undone meanwhile (`defines`), it goes. The server holds the statement
    /// when it answered (parsed, or refused as a duplicate), unless a Close of it is
    /// owed already (`to_close`: the books say it is gone); otherwise (skipped, or failed
    /// for another reason) it may or may not, and it is closed before the next request.
    /// A Parse or Close of it queued behind (another client Parse of a name it holds
    /// included) settles the books instead: they already say what that leaves.
    fn settle_redefinition(&mut self, r: Redefinition, answer: Answer, server: &mut ServerStatements) {
        let (id, epoch) = (r.st.id, r.st.epoch);
        let held = answer != Answer::NotRun;
        if answer == Answer::Parsed {
            self.redefined.push((r.name, r.st));
        } else if r.defines {
            self.undefined.push((r.name, r.st));
        }
        if self.queue.iter().any(|e| e.parses_or_closes(id)) || (held && server.to_close.contains(&id)) {
            return;
        }
        if !held {
            server.forget(id);
            server.to_close.push(id);
        } else if let Some(evicted) = server.add_gen(id, r.generation, epoch, r.cap) {
            server.to_close.push(evicted);
        }
    }

    /// Whether a later Sync segment (behind the next Sync queued) parses or closes
    /// server statement `id` again: that one settles what the server holds (a Parse
    /// there is sent after a Close, `unless_in_doubt`, and the books already say what it
    /// leaves; a client's Parse of a name it holds is settled when answered,
    /// `settle_redefinition`), so a Parse or Close of it that fails or is skipped here
    /// changes nothing in them. Otherwise the books go back to what the server holds: no
    /// statement after a failed or skipped Parse, the statement (to be closed) after a
    /// skipped Close.
    fn settled_later(&self, id: u64) -> bool {
        self.queue.syncs() > 0 && self.queue.iter().skip_while(|e| e.kind != Kind::Sync).any(|e| e.parses_or_closes(id))
    }

    /// An error ended an extended-protocol message: the server now skips everything up
    /// to the next Sync, so drop what was expected of those messages. (Out of line, to
    /// keep `on_server` small enough to inline where replies are scanned.)
    #[cold]
    #[inline(never)]
    fn after_error(&mut self, item: Expect, m: &Msg, server: &mut ServerStatements) -> Result<(), ProtocolError> {
        match item.effect {
            // Refused as a duplicate (the usual outcome): the server holds the statement.
            Effect::Redefine(r) => {
                let duplicate = crate::client::track::error_fields(m)?.code == "42P05";
                self.settle_redefinition(*r, if duplicate { Answer::Duplicate } else { Answer::NotRun }, server);
            }
            effect => self.undo(effect, server),
        }
        if let Some(id) = item.stmt {
            let f = crate::client::track::error_fields(m)?;
            // 26000: the server lost it behind Sluice's back (a DEALLOCATE Sluice did
            // not recognise): parse it again on next use.
            let lost = f.code == "26000" && matches!(item.kind, Kind::Bind | Kind::Describe);
            if item.kind == Kind::Parse && f.code == "42P05" {
                // The server holds a copy the books did not know of (whatever a later
                // segment does with it): closed before the next request, parsed again
                // on next use.
                tracing::warn!(stmt = id, "a server held a prepared statement Sluice's books missed; closing it");
                server.forget(id);
                server.to_close.push(id);
            } else if (item.kind == Kind::Parse || lost) && !self.settled_later(id) {
                server.forget(id);
            } else if is_stale_plan(&f) {
                // The server's statement is stale: close and re-parse it on next use,
                // and so on every other server of the pool.
                self.stale.push((id, server.generation(id).unwrap_or(0)));
                server.forget(id);
                server.to_close.push(id);
            }
        }
        while let Some(next) = self.queue.front() {
            if !next.kind.skipped() {
                break;
            }
            let dropped = self.queue.pop_front().expect("front exists");
            self.skipped_requests += u32::from(matches!(dropped.kind, Kind::Query | Kind::Call));
            if let (Kind::Parse, Some(id)) = (dropped.kind, dropped.stmt)
                && !self.settled_later(id)
            {
                server.forget(id);
            }
            self.undo(dropped.effect, server);
        }
        // The Sync that ends the skipping is still to come from the client. (A shape
        // check skipped here leaves the queue: the message held for it goes on, and is
        // skipped too.)
        self.skipping = self.queue.is_empty();
        Ok(())
    }
}

/// PostgreSQL's error for a prepared statement whose result type a schema change
/// altered (`RevalidateCachedQuery`): told by the routine, which is never translated,
/// or, from a server that leaves the routine out, by the English message.
fn is_stale_plan(f: &ErrorFields) -> bool {
    f.code == "0A000"
        && (f.routine == "RevalidateCachedQuery" || f.message.contains("cached plan must not change result type"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::fe;

    /// A RowDescription body of one column `a` from table `table` (attribute 1).
    fn one_column(table: u32, type_oid: u32, modifier: i32) -> Vec<u8> {
        let mut b = 1u16.to_be_bytes().to_vec();
        b.extend_from_slice(b"a\0");
        b.extend_from_slice(&table.to_be_bytes());
        b.extend_from_slice(&1u16.to_be_bytes());
        b.extend_from_slice(&type_oid.to_be_bytes());
        b.extend_from_slice(&4i16.to_be_bytes());
        b.extend_from_slice(&modifier.to_be_bytes());
        b.extend_from_slice(&0u16.to_be_bytes());
        b
    }

    /// The shape is the columns' names, types and modifiers: another table OID is the
    /// same shape, another type or modifier is not; a malformed body has none.
    #[test]
    fn a_row_shape_leaves_out_where_columns_come_from() {
        let shape = |table, type_oid, modifier| row_shape(&one_column(table, type_oid, modifier));
        assert!(shape(16384, 23, -1).is_some());
        assert_eq!(shape(16384, 23, -1), shape(99999, 23, -1));
        assert_ne!(shape(16384, 23, -1), shape(16384, 20, -1));
        assert_ne!(shape(16384, 1043, 14), shape(16384, 1043, 24));
        let body = one_column(16384, 23, -1);
        assert_eq!(row_shape(&body[..body.len() - 1]), None);
        assert_eq!(row_shape(&[body.as_slice(), b"x"].concat()), None);
    }

    /// A stale statement is told from the routine, whatever the server's language
    /// (`lc_messages`); the English message is the fallback.
    #[test]
    fn a_stale_plan_is_told_in_any_language() {
        let f = |message: &str, routine: &str| ErrorFields {
            severity: "ERROR".into(),
            code: "0A000".into(),
            message: message.into(),
            routine: routine.into(),
        };
        assert!(is_stale_plan(&f("gecachter Plan darf den Ergebnistyp nicht ändern", "RevalidateCachedQuery")));
        assert!(is_stale_plan(&f("cached plan must not change result type", "")));
        assert!(!is_stale_plan(&f("gecachter Plan darf den Ergebnistyp nicht ändern", "")));
        assert!(!is_stale_plan(&f("something else not supported", "transformStmt")));
    }

    fn sent(e: &mut Extended, tags: &[u8]) -> u32 {
        tags.iter().map(|&t| u32::from(e.on_client_forwarded(t))).sum()
    }

    /// A server message with `tag` and an empty body.
    fn answered(e: &mut Extended, tag: u8) {
        let frame = [tag, 0, 0, 0, 4];
        let m = Msg { tag, start: 0, frame_len: frame.len(), frame: Some(&frame) };
        let refused = e.on_server(&m, &mut Splice::new(), &mut ServerStatements::default()).unwrap();
        assert!(!refused);
    }

    #[test]
    fn requests_behind_a_failed_extended_message_are_skipped_up_to_the_sync() {
        let mut e = Extended::default();
        let call = fe::FUNCTION_CALL;
        assert_eq!(sent(&mut e, &[fe::PARSE, fe::QUERY, call, fe::FLUSH, fe::SYNC, fe::QUERY]), 0);
        answered(&mut e, be::ERROR_RESPONSE);
        assert_eq!(e.skipped_requests, 2);
        answered(&mut e, be::READY_FOR_QUERY); // the Sync's
        assert!(!e.is_idle());
        answered(&mut e, be::ROW_DESCRIPTION);
        answered(&mut e, be::READY_FOR_QUERY);
        assert!(e.is_idle());
    }

    #[test]
    fn an_error_before_the_rest_is_sent_skips_it_as_it_comes() {
        let mut e = Extended::default();
        sent(&mut e, &[fe::PARSE, fe::BIND, fe::EXECUTE, fe::FLUSH]);
        answered(&mut e, be::PARSE_COMPLETE);
        answered(&mut e, be::BIND_COMPLETE);
        answered(&mut e, be::ERROR_RESPONSE);
        assert_eq!(e.skipped_requests, 0);
        // Skipped by the server: the query gets no ReadyForQuery, the Sync does.
        assert_eq!(sent(&mut e, &[fe::PARSE, fe::QUERY, fe::SYNC]), 1);
        assert_eq!(sent(&mut e, &[fe::QUERY]), 0);
        answered(&mut e, be::READY_FOR_QUERY);
        answered(&mut e, be::READY_FOR_QUERY);
        assert!(e.is_idle());
    }

    #[test]
    fn an_error_in_a_simple_query_skips_nothing() {
        let mut e = Extended::default();
        sent(&mut e, &[fe::QUERY, fe::QUERY]);
        answered(&mut e, be::ERROR_RESPONSE);
        answered(&mut e, be::READY_FOR_QUERY);
        assert_eq!((e.skipped_requests, e.queue.len()), (0, 1));
    }

    #[test]
    fn a_copy_begun_by_an_execute_is_told_and_its_early_syncs_dropped() {
        let mut e = Extended::default();
        sent(&mut e, &[fe::BIND, fe::EXECUTE, fe::SYNC, fe::COPY_DONE, fe::SYNC]);
        answered(&mut e, be::BIND_COMPLETE);
        assert!(e.head_is_execute());
        e.drop_ignored_syncs(1);
        answered(&mut e, be::COMMAND_COMPLETE);
        answered(&mut e, be::READY_FOR_QUERY);
        assert!(e.is_idle());
    }
}
