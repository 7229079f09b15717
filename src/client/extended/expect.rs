//! The queue items of `client::extended`: what each message sent to the server will be
//! answered with, what Sluice does with that reply, and what its outcome changes.

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;

use crate::prepared::Statement;
use crate::protocol::{be, fe};

/// What a message sent to the server will be answered with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::client) enum Kind {
    Parse,
    Bind,
    Describe,
    Execute,
    Close,
    Sync,
    Query,
    Call,
    /// A reply Sluice makes up with no server message behind it.
    Local,
}

impl Kind {
    /// The reply a client message with `tag` gets, as sent (Flush and the COPY
    /// messages get none of their own).
    pub fn of_request(tag: u8) -> Option<Kind> {
        Some(match tag {
            fe::PARSE => Kind::Parse,
            fe::BIND => Kind::Bind,
            fe::DESCRIBE => Kind::Describe,
            fe::EXECUTE => Kind::Execute,
            fe::CLOSE => Kind::Close,
            fe::SYNC => Kind::Sync,
            fe::QUERY => Kind::Query,
            fe::FUNCTION_CALL => Kind::Call,
            _ => return None,
        })
    }

    /// Whether a server message with `tag` is the last of this kind's reply.
    #[inline]
    pub fn done_by(self, tag: u8) -> bool {
        match self {
            Kind::Parse => tag == be::PARSE_COMPLETE,
            Kind::Bind => tag == be::BIND_COMPLETE,
            Kind::Close => tag == be::CLOSE_COMPLETE,
            Kind::Describe => matches!(tag, be::ROW_DESCRIPTION | be::NO_DATA),
            Kind::Execute => {
                matches!(tag, be::COMMAND_COMPLETE | be::EMPTY_QUERY_RESPONSE | be::PORTAL_SUSPENDED)
            }
            Kind::Sync | Kind::Query | Kind::Call => tag == be::READY_FOR_QUERY,
            Kind::Local => false,
        }
    }

    /// Extended-protocol messages: an error in one makes the server skip everything
    /// up to the next Sync.
    #[inline]
    pub fn starts_skip(self) -> bool {
        matches!(self, Kind::Parse | Kind::Bind | Kind::Describe | Kind::Execute | Kind::Close | Kind::Local)
    }

    /// What the server skips after such an error: everything but the Sync, a simple
    /// query or function call included (no ReadyForQuery comes for those).
    #[inline]
    pub fn skipped(self) -> bool {
        self != Kind::Sync
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reply {
    Forward,
    /// The reply to a message Sluice injected: the client must not see it (an error
    /// still reaches it, as the error of the client message that follows).
    Swallow,
    /// A message whose failure the client has already been told of (the failing Bind
    /// of `refuse_held`): nothing of its reply reaches the client, errors included.
    Refused,
    /// Sluice's own reply to a message it did not forward.
    Synthetic(Bytes),
}

/// What the outcome of a message changes in Sluice's books.
#[derive(Debug, Default)]
pub(super) enum Effect {
    #[default]
    None,
    /// A Parse defined this client name: undone if the server rejects or skips it.
    Define(Bytes, Arc<Statement>),
    /// The client's Parse of the unnamed statement, with this id: if the server rejects
    /// or skips it, the server's unnamed statement is not this one (it may still be
    /// another client's), and the client has none.
    Unnamed(u64),
    /// Sluice's own Parse of the client's unnamed statement (this id) ahead of a Bind or
    /// Describe: if the server rejects or skips it, the server does not hold it, but the
    /// client still does (on PostgreSQL this Parse would not exist).
    UnnamedAgain(u64),
    /// The client's Close of its unnamed statement, answered by the server, and the
    /// count of the client's unnamed Parses and Closes it was: if the server skips it
    /// after an error, the client keeps the statement, unless a later Parse or Close
    /// came since.
    /// (Boxed: a rare case, kept from making every queue item bigger.)
    CloseUnnamed(Box<(crate::prepared::Unnamed, u64)>),
    /// A Parse of a name the client already holds: it fails as a duplicate, unless the
    /// Parse that defined it, still in the pipeline, was skipped, and then the name
    /// stands. (Boxed: rare.)
    Redefine(Box<Redefinition>),
    /// The client's Describe of its statement (at this generation): remember the
    /// shape it saw.
    Capture(Arc<Statement>, u64),
    /// A Close of this client name, answered by Sluice: undone if the server skips
    /// that point of the pipeline after an error (PostgreSQL would not have closed it).
    Close(Bytes, Arc<Statement>),
    /// The mark of a client message held until everything queued before it is answered
    /// (`Extended::hold_for_answers`); its reply is empty.
    Hold,
    /// Sluice's Close of this server-side statement (evicted or stale): if the server
    /// skips it after an error, the statement is still there, and is closed again
    /// before the next request (`ServerStatements::to_close`).
    Closes(u64),
    /// Sluice's Describe of a copy (of this generation) the client has not seen: if
    /// the shape differs from what the client saw, it gets 0A000 as from PostgreSQL.
    Verify(Arc<Statement>, u64),
}

/// A client's Parse of a name it holds, sent as the server-side Parse of `st`
/// (`Effect::Redefine`): on success the server holds `st` as prepared at `generation`,
/// within the pool's `cap`.
#[derive(Debug)]
pub(super) struct Redefinition {
    pub name: Bytes,
    pub st: Arc<Statement>,
    pub generation: u64,
    pub cap: usize,
    /// The client's earlier Parse of the name failed or was skipped while this one was
    /// queued: the name stands only if this one succeeds.
    pub defines: bool,
}

#[derive(Debug)]
pub(super) struct Expect {
    pub kind: Kind,
    pub reply: Reply,
    /// The server-side statement concerned (Parse, Bind, Describe, Execute).
    pub stmt: Option<u64>,
    pub effect: Effect,
    pub failed: bool,
}

impl Expect {
    #[inline]
    pub fn new(kind: Kind, reply: Reply, stmt: Option<u64>) -> Self {
        Expect { kind, reply, stmt, effect: Effect::None, failed: false }
    }

    #[inline]
    pub fn with(mut self, effect: Effect) -> Self {
        self.effect = effect;
        self
    }

    /// Whether this is a Parse or a Close (Sluice's) of server statement `id`.
    pub fn parses_or_closes(&self, id: u64) -> bool {
        (self.kind == Kind::Parse && self.stmt == Some(id))
            || match &self.effect {
                Effect::Closes(c) => *c == id,
                Effect::Redefine(r) => r.st.id == id,
                _ => false,
            }
    }
}

/// The replies the server owes, oldest first, and how many of them are Syncs', so
/// that asking for a Sync behind an item (`Extended::unanswered_before_sync`) costs
/// nothing while none is queued: a long pipeline under one Sync stays linear.
#[derive(Debug, Default)]
pub(super) struct Queue {
    items: VecDeque<Expect>,
    syncs: usize,
    /// Items Sluice answers itself (`Kind::Local`) at the back of the queue, behind the
    /// last message that went to the server.
    local_run: usize,
}

impl Queue {
    /// The queued client Parse of `name` again, as statement `id` (`Effect::Redefine`).
    pub fn redefinition_mut(&mut self, name: &[u8], id: u64) -> Option<&mut Redefinition> {
        self.items.iter_mut().find_map(|e| match &mut e.effect {
            Effect::Redefine(r) if r.name.as_ref() == name && r.st.id == id => Some(&mut **r),
            _ => None,
        })
    }

    /// Forgets what queued Closes answered by Sluice took of `name` as `st` (a Parse
    /// that defined it failed or was skipped: there is nothing to give back).
    pub fn forget_closes_of(&mut self, name: &[u8], st: &Arc<Statement>) {
        for e in &mut self.items {
            if matches!(&e.effect, Effect::Close(n, s) if n.as_ref() == name && Arc::ptr_eq(s, st)) {
                e.effect = Effect::None;
            }
        }
    }

    #[inline]
    pub fn push_back(&mut self, e: Expect) {
        self.syncs += usize::from(e.kind == Kind::Sync);
        self.local_run = if e.kind == Kind::Local { self.local_run + 1 } else { 0 };
        self.items.push_back(e);
    }

    #[inline]
    pub fn pop_front(&mut self) -> Option<Expect> {
        let e = self.items.pop_front()?;
        self.syncs -= usize::from(e.kind == Kind::Sync);
        self.local_run = self.local_run.min(self.items.len());
        Some(e)
    }

    pub fn remove(&mut self, i: usize) -> Option<Expect> {
        let in_run = i >= self.items.len() - self.local_run;
        let e = self.items.remove(i)?;
        self.syncs -= usize::from(e.kind == Kind::Sync);
        self.local_run -= usize::from(in_run);
        Some(e)
    }

    pub fn clear(&mut self) {
        self.items.clear();
        self.syncs = 0;
        self.local_run = 0;
    }

    /// The oldest item, to mark it failed (its kind is not to change).
    #[inline]
    pub fn front_mut(&mut self) -> Option<&mut Expect> {
        self.items.front_mut()
    }

    /// How many Syncs are unanswered.
    #[inline]
    pub fn syncs(&self) -> usize {
        self.syncs
    }

    /// How many items Sluice answers itself are queued at the back, behind the last
    /// message that went to the server (those at the front leave at once).
    #[inline]
    pub fn local_run(&self) -> usize {
        self.local_run
    }

    /// Forgets what queued Closes answered by Sluice took, but of the statements `keep`
    /// names (a DISCARD ALL or DEALLOCATE ALL ahead of them took those names anyway:
    /// should the server skip a Close, there is nothing to give back).
    pub fn forget_closes_unless(&mut self, keep: impl Fn(&Arc<Statement>) -> bool) {
        for e in &mut self.items {
            if matches!(&e.effect, Effect::Close(_, s) if !keep(s)) {
                e.effect = Effect::None;
            }
        }
    }
}

impl std::ops::Deref for Queue {
    type Target = VecDeque<Expect>;

    #[inline]
    fn deref(&self) -> &VecDeque<Expect> {
        &self.items
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Sync count and the run of local items at the back follow every way items
    /// enter and leave.
    #[test]
    fn the_queue_counts_its_syncs() {
        let item = |kind| Expect::new(kind, Reply::Forward, None);
        let mut q = Queue::default();
        let counted = |q: &Queue| (q.syncs(), q.iter().filter(|e| e.kind == Kind::Sync).count(), q.local_run());
        for kind in [Kind::Parse, Kind::Local, Kind::Sync, Kind::Bind, Kind::Sync, Kind::Local, Kind::Local] {
            q.push_back(item(kind));
        }
        assert_eq!(counted(&q), (2, 2, 2));
        assert_eq!(q.remove(5).map(|e| e.kind), Some(Kind::Local));
        assert_eq!(q.remove(3).map(|e| e.kind), Some(Kind::Bind));
        assert!(q.remove(9).is_none());
        assert_eq!(counted(&q), (2, 2, 1));
        q.push_back(item(Kind::Local));
        assert_eq!(counted(&q), (2, 2, 2));
        for _ in 0..3 {
            q.pop_front();
        }
        assert_eq!(counted(&q), (1, 1, 2));
        q.pop_front();
        q.pop_front();
        assert_eq!(counted(&q), (0, 0, 1));
        q.clear();
        assert_eq!(counted(&q), (0, 0, 0));
        assert!(q.pop_front().is_none());
    }
}
