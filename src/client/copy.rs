//! The COPY FROM STDIN bookkeeping of a linked exchange (`Track`): whether the server is
//! in COPY mode, COPYs the client ended before the server began them, and Syncs sent
//! inside a COPY, which the server may or may not answer, with the probe that settles it.

use crate::protocol::{be, body};

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
    /// In the pooled modes the server is then asked for a value (`Track::probe`)
    /// before it goes back to the pool; in session mode it is closed at the end.
    Unsure,
    /// The probe went out: what the server sends before its answer (a value no reply
    /// of the client's holds) is the client's.
    Probed(u64),
    /// The probe's value came; its ReadyForQuery is next, and then the server is known
    /// to be done.
    ProbeAnswered,
}

/// `int8abs(bigint)`: the probe's function, built in (its OID is fixed), callable by
/// every role, without side effects; for a positive argument it returns it.
pub(super) const PROBE_FUNCTION: u32 = 1230;

/// Whether `m` is the reply to the probe the state waits for, and the state after it.
#[inline]
pub(super) fn probe_reply(state: EarlySyncs, m: &crate::protocol::scan::Msg) -> Option<EarlySyncs> {
    match state {
        EarlySyncs::Probed(v) if m.tag == be::FUNCTION_CALL_RESPONSE => {
            let value = m.frame.map(body).and_then(|b| b.strip_prefix(&8i32.to_be_bytes()[..]));
            (value == Some(&v.to_be_bytes()[..])).then_some(EarlySyncs::ProbeAnswered)
        }
        EarlySyncs::ProbeAnswered if m.tag == be::READY_FOR_QUERY => Some(EarlySyncs::None),
        _ => None,
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
    use super::*;
    use crate::client::track::Track;

    /// A server message as the scanner gives it to the relay.
    fn scanned(frame: &[u8]) -> crate::protocol::scan::Msg<'_> {
        crate::protocol::scan::Msg { tag: frame[0], start: 0, frame_len: frame.len(), frame: Some(frame) }
    }

    #[test]
    fn only_the_probes_own_answer_ends_it() {
        let mut t = Track::default();
        let mut out = bytes::BytesMut::new();
        t.probe(&mut out);
        let EarlySyncs::Probed(v) = t.early_syncs else { panic!("no probe sent") };
        // FunctionCall: oid, one binary argument (the value), binary result.
        let mut body = PROBE_FUNCTION.to_be_bytes().to_vec();
        body.extend([0, 1, 0, 1, 0, 1, 0, 0, 0, 8]);
        body.extend(v.to_be_bytes());
        body.extend([0, 1]);
        assert_eq!(&out[..], &[&[b'F'][..], &(body.len() as u32 + 4).to_be_bytes(), &body].concat()[..]);
        let answer = |value: u64| [&[b'V', 0, 0, 0, 16, 0, 0, 0, 8][..], &value.to_be_bytes()].concat();
        let ready = [b'Z', 0, 0, 0, 5, b'I'];
        // A client's reply before the answer passes, the answer and its ReadyForQuery not.
        assert_eq!(probe_reply(t.early_syncs, &scanned(&ready)), None);
        assert_eq!(probe_reply(t.early_syncs, &scanned(&answer(v ^ 1))), None);
        let next = probe_reply(t.early_syncs, &scanned(&answer(v)));
        assert_eq!(next, Some(EarlySyncs::ProbeAnswered));
        assert_eq!(probe_reply(EarlySyncs::ProbeAnswered, &scanned(&[b'A', 0, 0, 0, 4])), None);
        assert_eq!(probe_reply(EarlySyncs::ProbeAnswered, &scanned(&ready)), Some(EarlySyncs::None));
        assert_eq!(probe_reply(EarlySyncs::None, &scanned(&ready)), None);
    }
}
