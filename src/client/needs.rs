//! How much of each message the relay reads before passing it on: the few messages
//! whose contents matter whole or in part, the rest streamed as they come.

use crate::prepared::{MAX_PARSE_LEN, NAME_PREFIX};
use crate::protocol::scan::Need;
use crate::protocol::{MAX_INSPECTED_LEN, be, fe};

/// Why a simple Query ends the client under `disable_pqexec` (PgBouncer's words first).
const PQEXEC_DISALLOWED: &str = "PQexec disallowed: the simple query protocol is turned off (disable_pqexec)";

/// How much of each client message the relay reads (in the pooled modes, or in session
/// mode); a simple Query ends the client when `refuse_query` (`disable_pqexec`).
pub(super) fn client_need(pooled: bool, refuse_query: bool) -> impl Fn(u8) -> Need {
    move |tag| match tag {
        fe::TERMINATE => Need::Whole(MAX_INSPECTED_LEN),
        fe::QUERY if refuse_query => Need::Refused(PQEXEC_DISALLOWED),
        _ if !pooled => Need::Stream,
        fe::PARSE => Need::Whole(MAX_PARSE_LEN),
        fe::BIND | fe::DESCRIBE => Need::Prefix(NAME_PREFIX),
        fe::CLOSE => Need::Whole(MAX_INSPECTED_LEN),
        fe::QUERY => Need::Prefix(256),
        _ => Need::Stream,
    }
}

/// How much of each server message the relay reads.
pub(super) fn server_need(tag: u8) -> Need {
    match tag {
        be::READY_FOR_QUERY | be::PARAMETER_STATUS | be::ROW_DESCRIPTION | be::COMMAND_COMPLETE => {
            Need::Whole(MAX_INSPECTED_LEN)
        }
        // Can be long (it may quote a long value): its fields come first.
        be::ERROR_RESPONSE => Need::Prefix(ERROR_PREFIX),
        _ => Need::Stream,
    }
}

/// How much of an ErrorResponse the relay reads before passing the rest on.
const ERROR_PREFIX: usize = 64 * 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::ProtocolError;
    use crate::protocol::scan::{Scanner, Splice};

    /// `disable_pqexec` refuses a Query in every mode, and nothing else; a scan reports
    /// the refusal, not a length error.
    #[test]
    fn a_simple_query_is_refused_in_every_mode_only_when_turned_off() {
        let refused = Need::Refused(PQEXEC_DISALLOWED);
        for pooled in [false, true] {
            assert_eq!(client_need(pooled, true)(fe::QUERY), refused);
            assert_ne!(client_need(pooled, false)(fe::QUERY), refused);
            for tag in [fe::PARSE, fe::BIND, fe::EXECUTE, fe::SYNC, fe::TERMINATE, fe::FUNCTION_CALL] {
                assert_eq!(client_need(pooled, true)(tag), client_need(pooled, false)(tag));
            }
        }
        let mut query = bytes::BytesMut::new();
        crate::protocol::build::query(&mut query, "select 1; drop table t");
        let mut sp = Splice::new();
        let scanned = Scanner::default().scan(&query, client_need(true, true), |_, _| Ok(()), &mut sp);
        assert!(matches!(scanned, Err(ProtocolError::Disallowed(why)) if why == PQEXEC_DISALLOWED), "{scanned:?}");
        assert_eq!(Scanner::default().scan(&query, client_need(true, false), |_, _| Ok(()), &mut sp), Ok(query.len()));
    }
}
