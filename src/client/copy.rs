//! The COPY FROM STDIN bookkeeping of a linked exchange (`Track`): whether the server is
//! in COPY mode, COPYs the client ended before the server began them, and Syncs sent
//! inside a COPY, which the server may or may not answer, with the probe that settles it.

use crate::protocol::{ProtocolError, be, sqlstate};

/// Syncs a client sent after the request that begins a COPY FROM STDIN and before the
/// COPY's end. PostgreSQL ignores those it reads in COPY mode; when the COPY fails it
/// answers those it had not read yet, and whether it had depends on timing (a COPY into
/// a view fails before reading anything, one with a bad row after reading up to it).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum EarlySyncs {
    #[default]
    None,
    /// The COPY under way has such Syncs, taken as ignored: right if it ends well.
    Counted,
    /// It failed: a ReadyForQuery may still come for them after the server looks done.
    /// In the pooled modes the server is then probed (`Track::probe`) before it goes
    /// back to the pool; in session mode it is closed at the end.
    Unsure,
    /// The probe went out, naming this token: what the server sends before the probe's
    /// answer (an error naming the token) answers requests Sluice already counted as
    /// answered, and is passed on as it is.
    Probed(u64),
    /// The probe's error came; its ReadyForQuery is next, and then the server is known
    /// to be done.
    ProbeAnswered,
}

impl EarlySyncs {
    /// Whether a probe is under way (`Probed`, `ProbeAnswered`).
    #[inline]
    pub fn probing(self) -> bool {
        matches!(self, EarlySyncs::Probed(_) | EarlySyncs::ProbeAnswered)
    }

    /// Whether Sluice's own count of the server's answers can be trusted: no failed
    /// COPY with a Sync inside leaves it in doubt, and no probe is under way.
    #[inline]
    pub fn settled(self) -> bool {
        matches!(self, EarlySyncs::None | EarlySyncs::Counted)
    }

    /// A Sync of the COPY under way was taken as ignored (an earlier doubt stands).
    pub fn counted(&mut self) {
        if *self == EarlySyncs::None {
            *self = EarlySyncs::Counted;
        }
    }

    /// The COPY under way ended (CommandComplete: its Syncs were read in COPY mode, and
    /// ignored) or failed (ErrorResponse: they may be answered yet).
    #[inline]
    pub fn copy_ended(&mut self, failed: bool) {
        if *self == EarlySyncs::Counted {
            *self = if failed { EarlySyncs::Unsure } else { EarlySyncs::None };
        }
    }
}

/// The name of the portal the probe describes (which never exists).
pub(super) fn probe_portal(token: u64) -> String {
    format!("sluice_probe_{token:016x}")
}

/// Whether `m` is the reply to the probe the state waits for, and the state after it:
/// the error saying the probe's portal does not exist (PostgreSQL answers so in every
/// transaction state, an aborted one included), then its ReadyForQuery.
pub(super) fn probe_reply(
    state: EarlySyncs,
    m: &crate::protocol::scan::Msg,
) -> Result<Option<EarlySyncs>, ProtocolError> {
    match state {
        EarlySyncs::Probed(token) if m.tag == be::ERROR_RESPONSE => {
            let f = super::track::error_fields(m)?;
            let ours = f.code == sqlstate::INVALID_CURSOR_NAME && f.message.contains(&probe_portal(token));
            Ok(ours.then_some(EarlySyncs::ProbeAnswered))
        }
        EarlySyncs::ProbeAnswered if m.tag == be::READY_FOR_QUERY => Ok(Some(EarlySyncs::None)),
        _ => Ok(None),
    }
}

/// The server's unit of work (`Track::units_sent`) it has surely reached: the units
/// answered or skipped, less the Syncs taken as ignored that it may not have read yet.
pub(super) fn unit_reached(units_sent: u32, pending: u32, ignored_since_ready: u32) -> u32 {
    units_sent.wrapping_sub(pending).wrapping_sub(ignored_since_ready)
}

/// Whether unit `a` comes before unit `b` (the counts wrap).
pub(super) fn before(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a) as i32) > 0
}

/// The most COPY ends (`EndedAhead`) a client may send ahead of the COPYs they end: a
/// query may begin several COPYs, but CopyDone after CopyDone outside a COPY (which
/// PostgreSQL reads and ignores, so the server's socket holds nothing back) would
/// otherwise grow the list without end. Past it the client is refused (53400).
pub(super) const ENDED_AHEAD_LIMIT: usize = 16_384;

/// A COPY FROM STDIN the client ended before the server began it.
#[derive(Debug, Clone, Copy)]
pub(super) struct EndedAhead {
    /// The unit of the request that begins it (`Track::units_sent`).
    pub unit: u32,
    /// Syncs the client sent between the request that begins it and its end: the
    /// server, in copy-in mode by then, ignores them.
    pub ignored: u32,
    /// A Sync came after its end (the one an extended-protocol COPY waits for).
    pub synced: bool,
}

/// Whether the server is in COPY IN mode, and how the COPY began.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum CopyIn {
    #[default]
    Off,
    /// By a simple Query: the server's ErrorResponse and ReadyForQuery end it, and the
    /// client's CopyData/CopyDone still under way are ignored by the server.
    Simple,
    /// By an Execute: after an ErrorResponse the server skips to a Sync.
    Extended,
}

#[cfg(test)]
mod tests {
    use bytes::{BufMut, BytesMut};

    use super::*;
    use crate::client::track::Track;
    use crate::config::PoolMode;
    use crate::prepared::ServerStatements;
    use crate::protocol::TxStatus;
    use crate::protocol::build::{self, Severity};
    use crate::protocol::scan::{Msg, Splice};

    /// A server message as the scanner gives it to the relay.
    fn scanned(frame: &[u8]) -> Msg<'_> {
        Msg { tag: frame[0], start: 0, frame_len: frame.len(), frame: Some(frame) }
    }

    fn bytes(f: impl FnOnce(&mut BytesMut)) -> Vec<u8> {
        let mut b = BytesMut::new();
        f(&mut b);
        b.to_vec()
    }

    fn error(code: &str, message: &str) -> Vec<u8> {
        bytes(|b| build::error_response(b, Severity::Error, code, message))
    }

    fn ready() -> Vec<u8> {
        bytes(|b| build::ready_for_query(b, TxStatus::Idle))
    }

    #[test]
    fn only_the_probes_own_answer_ends_it() {
        let mut t = Track::default();
        let mut out = BytesMut::new();
        t.probe(&mut out);
        let EarlySyncs::Probed(token) = t.early_syncs else { panic!("no probe sent") };
        let name = probe_portal(token);
        let expected = bytes(|b| {
            build::describe(b, b'P', name.as_bytes());
            build::sync(b);
        });
        assert_eq!(&out[..], &expected[..]);
        let not_there = |name: &str| error("34000", &format!("portal \"{name}\" does not exist"));
        let probed = t.early_syncs;
        // Replies before the answer pass, the answer and its ReadyForQuery not.
        assert_eq!(probe_reply(probed, &scanned(&ready())).unwrap(), None);
        assert_eq!(probe_reply(probed, &scanned(&not_there(&probe_portal(token ^ 1)))).unwrap(), None);
        assert_eq!(probe_reply(probed, &scanned(&error("22012", &name))).unwrap(), None);
        assert_eq!(probe_reply(probed, &scanned(&not_there(&name))).unwrap(), Some(EarlySyncs::ProbeAnswered));
        let notification = [b'A', 0, 0, 0, 4];
        assert_eq!(probe_reply(EarlySyncs::ProbeAnswered, &scanned(&notification)).unwrap(), None);
        assert_eq!(probe_reply(EarlySyncs::ProbeAnswered, &scanned(&ready())).unwrap(), Some(EarlySyncs::None));
        assert_eq!(probe_reply(EarlySyncs::None, &scanned(&ready())).unwrap(), None);
    }

    /// A COPY begun behind the probe: its CopyInResponse passes (its end may be in the
    /// server's input before the probe); the error PostgreSQL gives for the probe read
    /// as that COPY's data ends the link; a DISCARD ALL answered meanwhile is recorded.
    #[test]
    fn a_copy_behind_the_probe_is_let_run_until_it_eats_the_probe() {
        let mut t = Track::default();
        t.probe(&mut BytesMut::new());
        let copy_in = copy_in_response();
        assert_eq!(from_server(&mut t, &copy_in), copy_in);
        let mut server = ServerStatements::default();
        server.add(7, 10);
        let discarded = bytes(|b| build::command_complete(b, "DISCARD ALL"));
        let mut sp = Splice::new();
        t.scan_server(&discarded, &mut sp, PoolMode::Transaction, &mut server).unwrap();
        assert!(server.is_empty() && t.ext.emptied.is_some() && t.discard_mark == Some(0));
        let eaten = error("08P01", "unexpected message type 0x44 during COPY from stdin");
        let mut sp = Splice::new();
        let r = t.scan_server(&eaten, &mut sp, PoolMode::Transaction, &mut ServerStatements::default());
        assert!(matches!(r, Err(ProtocolError::Limit(_))), "{r:?}");
    }

    /// A DISCARD ALL answered when Sluice expects nothing more (its ReadyForQuery was
    /// counted early) still empties the books.
    #[test]
    fn an_emptying_reply_counts_with_nothing_expected() {
        let mut t = Track::default();
        let mut server = ServerStatements::default();
        server.add(7, 10);
        let frame = bytes(|b| build::command_complete(b, "DISCARD ALL"));
        t.ext.on_server(&scanned(&frame), &mut Splice::new(), &mut server).unwrap();
        assert!(server.is_empty() && t.ext.emptied.is_some() && t.ext.discarded);
    }

    /// Settings reported before a DISCARD ALL and after it, read at once: the mark
    /// says which came after (those still hold for the client).
    #[test]
    fn a_discard_marks_the_settings_reported_before_it() {
        let mut t = Track::default();
        let answers = bytes(|b| {
            for (tag, zone) in [("SET", "Europe/Paris"), ("DISCARD ALL", "UTC"), ("SET", "Asia/Tokyo")] {
                build::command_complete(b, tag);
                build::parameter_status(b, b"TimeZone", zone.as_bytes());
                build::ready_for_query(b, TxStatus::Idle);
            }
        });
        assert_eq!(from_server(&mut t, &answers), answers);
        assert_eq!((t.param_updates.len(), t.discard_mark), (3, Some(1)));
    }

    /// What the relay forwards of `server` bytes, and the server side's state after.
    fn from_server(t: &mut Track, server: &[u8]) -> Vec<u8> {
        from_server_in(PoolMode::Transaction, t, server)
    }

    fn from_server_in(mode: PoolMode, t: &mut Track, server: &[u8]) -> Vec<u8> {
        let mut sp = Splice::new();
        let n = t.scan_server(server, &mut sp, mode, &mut ServerStatements::default()).unwrap();
        assert_eq!(n, server.len());
        sp.finish(server, n).to_vec()
    }

    fn copy_in_response() -> Vec<u8> {
        bytes(|b| {
            build::frame(b, b'G', |b| {
                b.put_u8(0);
                b.put_i16(0);
            })
        })
    }

    fn from_client(t: &mut Track, client: &[u8]) {
        let mut sp = Splice::new();
        assert_eq!(t.scan_client(client, &mut sp, None).unwrap(), client.len());
    }

    /// A failed COPY whose Sync inside is answered late, after the probe went out and
    /// the client sent its next query: that late ReadyForQuery answers a request from
    /// before the probe, and must not count for the query sent after it.
    #[test]
    fn a_late_ready_for_query_does_not_count_for_a_request_sent_after_the_probe() {
        let mut t = Track::default();
        from_client(&mut t, &bytes(|b| build::query(b, "copy t from stdin")));
        let copy_in = copy_in_response();
        from_server(&mut t, &copy_in);
        let data = bytes(|b| {
            build::frame(b, b'd', |b| b.put_slice(b"not a number\n"));
            build::sync(b);
            build::frame(b, b'c', |_| {});
        });
        from_client(&mut t, &data);
        from_server(&mut t, &[error("22P02", "invalid input syntax for type integer"), ready()].concat());
        assert_eq!((t.pending, t.server_unsure()), (0, true));
        let mut probe = BytesMut::new();
        t.probe(&mut probe);
        let EarlySyncs::Probed(token) = t.early_syncs else { panic!("no probe sent") };
        from_client(&mut t, &bytes(|b| build::query(b, "select 1")));
        assert_eq!(t.pending, 1);
        // The Sync's late answer is forwarded, and counts for nothing.
        assert_eq!(from_server(&mut t, &ready()), ready());
        assert_eq!(t.pending, 1);
        let answer = [error("34000", &format!("portal \"{}\" does not exist", probe_portal(token))), ready()].concat();
        assert_eq!(from_server(&mut t, &answer), Vec::<u8>::new(), "the probe's answer reached the client");
        assert_eq!((t.pending, t.server_unsure()), (1, false));
        let reply = [bytes(|b| build::command_complete(b, "SELECT 1")), ready()].concat();
        assert_eq!(from_server(&mut t, &reply), reply);
        assert_eq!(t.pending, 0);
    }

    /// A simple-query COPY failed, and the client's Sync is read after the error but
    /// before its ReadyForQuery (PostgreSQL flushes the error on its own): the server
    /// is out of COPY mode, and answers that Sync.
    #[test]
    fn a_sync_sent_after_a_simple_copy_failed_is_answered() {
        let mut t = Track::default();
        from_client(&mut t, &bytes(|b| build::query(b, "copy t from stdin")));
        from_server(&mut t, &copy_in_response());
        from_client(&mut t, &bytes(|b| build::frame(b, b'd', |b| b.put_slice(b"not a number\n"))));
        from_server(&mut t, &error("22P02", "invalid input syntax for type integer"));
        from_client(&mut t, &bytes(build::sync));
        from_server(&mut t, &ready());
        assert_eq!((t.pending, t.protocol_idle()), (1, false), "the Sync's answer is still to come");
        from_client(&mut t, &bytes(|b| build::frame(b, b'c', |_| {})));
        from_server(&mut t, &ready());
        assert_eq!((t.pending, t.protocol_idle(), t.server_unsure()), (0, true, false));
    }

    /// Statement mode does not take a late ReadyForQuery (a Sync inside a failed COPY)
    /// and a BEGIN's for the end of everything the client sent: the open block is not
    /// refused while the count is in doubt, and no reply is dropped for it.
    #[test]
    fn statement_mode_refuses_no_block_while_a_failed_copy_leaves_the_count_in_doubt() {
        let mut t = Track::default();
        from_client(&mut t, &bytes(|b| build::query(b, "copy t from stdin")));
        from_server(&mut t, &copy_in_response());
        from_client(
            &mut t,
            &bytes(|b| {
                build::frame(b, b'd', |b| b.put_slice(b"not a number\n"));
                build::sync(b);
                build::frame(b, b'c', |_| {});
                build::query(b, "begin");
                build::query(b, "select 1");
            }),
        );
        let in_block = bytes(|b| build::ready_for_query(b, TxStatus::InTransaction));
        let begun = [bytes(|b| build::command_complete(b, "BEGIN")), in_block].concat();
        let replies = [error("22P02", "invalid input syntax for type integer"), ready(), ready(), begun].concat();
        assert_eq!(from_server_in(PoolMode::Statement, &mut t, &replies), replies);
        assert!(!t.violation);
        assert!(t.server_unsure());
    }
}
