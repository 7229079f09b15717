//! A request cancelled while it waited for a server (a CancelRequest reached its client
//! in the pool's queue): Sluice answers it as PostgreSQL answers a cancelled statement,
//! without a server, and skips the rest of it as PostgreSQL skips a failed request.

use bytes::{Buf, BytesMut};

use crate::protocol::build::{self, Severity};
use crate::protocol::{Header, ProtocolError, TxStatus, fe, sqlstate};

/// What is left of a cancelled request in the client's input.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Skipping {
    #[default]
    No,
    /// Bytes of a cancelled Query or FunctionCall not read yet (its ReadyForQuery has
    /// been sent).
    Bytes(usize),
    /// Extended protocol: every message up to and including the next Sync, whose
    /// ReadyForQuery ends the request (a Terminate ends the skipping, unanswered);
    /// `rest` bytes of the current message are still to drop.
    ToSync { rest: usize },
}

/// Whether the request at the front of `buf` can be cancelled: it starts a statement.
/// Anything else a client may send between transactions (a Sync or Flush asking for
/// what is pending, the leftovers of a failed COPY) is left alone, as an idle
/// PostgreSQL backend ignores a cancel.
pub(super) fn cancellable(buf: &[u8]) -> bool {
    matches!(
        Header::peek(buf),
        Ok(Some(h)) if matches!(
            h.tag,
            fe::QUERY | fe::FUNCTION_CALL | fe::PARSE | fe::BIND | fe::DESCRIBE | fe::EXECUTE | fe::CLOSE
        )
    )
}

/// The answer to the cancelled request at the front of `buf`, and how the rest of it is
/// skipped: PostgreSQL's 57014 (and at once ReadyForQuery for a Query or FunctionCall,
/// which end where they are; the extended protocol gets it at its Sync). The client is
/// between transactions: it waited for a server.
pub(super) fn answer(buf: &[u8], out: &mut BytesMut) -> Skipping {
    let Ok(Some(h)) = Header::peek(buf) else { return Skipping::No };
    build::error_response(out, Severity::Error, sqlstate::QUERY_CANCELED, "canceling statement due to user request");
    if matches!(h.tag, fe::QUERY | fe::FUNCTION_CALL) {
        build::ready_for_query(out, TxStatus::Idle);
        Skipping::Bytes(h.frame_len)
    } else {
        Skipping::ToSync { rest: 0 }
    }
}

impl Skipping {
    /// Drops what `buf` holds of the cancelled request. True when its Sync was dropped:
    /// the client is then owed its ReadyForQuery. A message whose length field says
    /// more than `limit` is refused (`max_packet_size`), as in the relay.
    pub(super) fn advance(&mut self, buf: &mut BytesMut, limit: usize) -> Result<bool, ProtocolError> {
        loop {
            match self {
                Skipping::No => return Ok(false),
                Skipping::Bytes(n) => {
                    let k = (*n).min(buf.len());
                    buf.advance(k);
                    *n -= k;
                    if *n == 0 {
                        *self = Skipping::No;
                    }
                    return Ok(false);
                }
                Skipping::ToSync { rest } if *rest > 0 => {
                    let k = (*rest).min(buf.len());
                    buf.advance(k);
                    *rest -= k;
                    if *rest > 0 {
                        return Ok(false);
                    }
                }
                Skipping::ToSync { rest } => {
                    let Some(h) = Header::peek_within(buf, limit)? else { return Ok(false) };
                    // PostgreSQL stops skipping at a Terminate too: it is the caller's.
                    if h.tag == fe::TERMINATE {
                        *self = Skipping::No;
                        return Ok(false);
                    }
                    if h.tag != fe::SYNC {
                        *rest = h.frame_len;
                        continue;
                    }
                    if buf.len() < h.frame_len {
                        return Ok(false);
                    }
                    buf.advance(h.frame_len);
                    *self = Skipping::No;
                    return Ok(true);
                }
            }
        }
    }

    pub(super) fn is_active(&self) -> bool {
        *self != Skipping::No
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::build::message as msg;

    fn tags(out: &BytesMut) -> Vec<u8> {
        let mut tags = Vec::new();
        let mut rest = &out[..];
        while let Ok(Some(h)) = Header::peek(rest) {
            tags.push(h.tag);
            rest = &rest[h.frame_len..];
        }
        tags
    }

    #[test]
    fn a_query_is_answered_at_once_and_skipped_as_it_arrives() {
        let q = msg(fe::QUERY, b"select pg_sleep(10)\0");
        let mut out = BytesMut::new();
        let mut s = answer(&q[..7], &mut out);
        assert_eq!(tags(&out), b"EZ");
        assert!(String::from_utf8_lossy(&out).contains("57014"));
        // Only part of the Query has arrived; then the rest, and the next request.
        let mut buf = BytesMut::from(&q[..7]);
        assert!(!s.advance(&mut buf, crate::protocol::MAX_MESSAGE_LEN).unwrap());
        assert!(buf.is_empty() && s.is_active());
        buf.extend_from_slice(&q[7..]);
        let next = msg(fe::QUERY, b"select 1\0");
        buf.extend_from_slice(&next);
        assert!(!s.advance(&mut buf, crate::protocol::MAX_MESSAGE_LEN).unwrap());
        assert!(!s.is_active());
        assert_eq!(&buf[..], &next[..], "the next request is left alone");
    }

    #[test]
    fn the_extended_protocol_is_skipped_through_its_sync() {
        let mut req = msg(fe::PARSE, b"\0select $1\0\0\0");
        req.extend(msg(fe::BIND, &[0u8; 40]));
        req.extend(msg(fe::EXECUTE, b"\0\0\0\0\0"));
        let sync = msg(fe::SYNC, b"");
        let next = msg(fe::QUERY, b"select 2\0");
        let mut out = BytesMut::new();
        let mut s = answer(&req, &mut out);
        assert_eq!(tags(&out), b"E", "ReadyForQuery waits for the Sync");
        // Fed a few bytes at a time: no ReadyForQuery before the Sync is whole.
        let all: Vec<u8> = [req.clone(), sync.clone(), next.clone()].concat();
        let sync_end = req.len() + sync.len();
        let mut buf = BytesMut::new();
        let mut fed = 0;
        let mut done_at = None;
        while fed < all.len() && done_at.is_none() {
            let k = 3.min(all.len() - fed);
            buf.extend_from_slice(&all[fed..fed + k]);
            fed += k;
            if s.advance(&mut buf, crate::protocol::MAX_MESSAGE_LEN).unwrap() {
                done_at = Some(fed);
            }
        }
        let done_at = done_at.expect("the Sync ends the skip");
        assert!(done_at >= sync_end && done_at < sync_end + 3, "ended at {done_at}, Sync ends at {sync_end}");
        assert!(!s.is_active());
        buf.extend_from_slice(&all[fed..]);
        assert_eq!(&buf[..], &next[..], "the next request is left alone");
    }

    #[test]
    fn only_requests_that_start_a_statement_are_cancelled() {
        for tag in [fe::QUERY, fe::FUNCTION_CALL, fe::PARSE, fe::BIND, fe::DESCRIBE, fe::EXECUTE, fe::CLOSE] {
            assert!(cancellable(&msg(tag, b"x\0")), "{}", tag as char);
        }
        for tag in [fe::SYNC, fe::FLUSH, fe::COPY_DATA, fe::COPY_DONE, fe::COPY_FAIL] {
            assert!(!cancellable(&msg(tag, b"")), "{}", tag as char);
        }
        assert!(!cancellable(b""));
    }

    #[test]
    fn a_terminate_ends_the_skipping_and_is_left_for_the_session() {
        let mut out = BytesMut::new();
        let mut s = answer(&msg(fe::BIND, &[0u8; 8]), &mut out);
        let terminate = msg(fe::TERMINATE, b"");
        let mut buf = BytesMut::from(
            &[msg(fe::BIND, &[0u8; 8]), msg(fe::EXECUTE, b"\0\0\0\0\0"), terminate.clone()].concat()[..],
        );
        assert!(!s.advance(&mut buf, crate::protocol::MAX_MESSAGE_LEN).unwrap(), "no ReadyForQuery without a Sync");
        assert!(!s.is_active());
        assert_eq!(&buf[..], &terminate[..]);
    }
}
