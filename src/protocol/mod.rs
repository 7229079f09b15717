//! The PostgreSQL v3 wire protocol, without I/O: message tags, header peeking with
//! length limits, startup packets, typed views of the few messages Sluice reads and
//! builders for the ones it writes. Nothing here touches a socket, so it is fuzzable.

pub mod build;
pub mod fields;
pub mod scan;
pub mod sqlstate;
pub mod startup;

use thiserror::Error;

/// Frontend (client → server) message tags.
pub mod fe {
    pub const BIND: u8 = b'B';
    pub const CLOSE: u8 = b'C';
    pub const COPY_DATA: u8 = b'd';
    pub const COPY_DONE: u8 = b'c';
    pub const COPY_FAIL: u8 = b'f';
    pub const DESCRIBE: u8 = b'D';
    pub const EXECUTE: u8 = b'E';
    pub const FLUSH: u8 = b'H';
    pub const FUNCTION_CALL: u8 = b'F';
    pub const PARSE: u8 = b'P';
    /// PasswordMessage, SASLInitialResponse and SASLResponse share this tag.
    pub const PASSWORD: u8 = b'p';
    pub const QUERY: u8 = b'Q';
    pub const SYNC: u8 = b'S';
    pub const TERMINATE: u8 = b'X';

    /// Whether a logged-in client may send a message of this type (PostgreSQL's list);
    /// the relay refuses any other (`ProtocolError::UnknownMessage`).
    pub fn is_session_message(tag: u8) -> bool {
        matches!(
            tag,
            BIND | CLOSE
                | COPY_DATA
                | COPY_DONE
                | COPY_FAIL
                | DESCRIBE
                | EXECUTE
                | FLUSH
                | FUNCTION_CALL
                | PARSE
                | QUERY
                | SYNC
                | TERMINATE
        )
    }
}

/// Backend (server → client) message tags.
pub mod be {
    pub const AUTHENTICATION: u8 = b'R';
    pub const BACKEND_KEY_DATA: u8 = b'K';
    pub const BIND_COMPLETE: u8 = b'2';
    pub const CLOSE_COMPLETE: u8 = b'3';
    pub const COMMAND_COMPLETE: u8 = b'C';
    pub const COPY_BOTH_RESPONSE: u8 = b'W';
    pub const COPY_IN_RESPONSE: u8 = b'G';
    pub const COPY_OUT_RESPONSE: u8 = b'H';
    pub const DATA_ROW: u8 = b'D';
    pub const EMPTY_QUERY_RESPONSE: u8 = b'I';
    pub const ERROR_RESPONSE: u8 = b'E';
    pub const NEGOTIATE_PROTOCOL_VERSION: u8 = b'v';
    pub const NO_DATA: u8 = b'n';
    pub const NOTICE_RESPONSE: u8 = b'N';
    pub const NOTIFICATION_RESPONSE: u8 = b'A';
    pub const PARAMETER_DESCRIPTION: u8 = b't';
    pub const PARAMETER_STATUS: u8 = b'S';
    pub const PARSE_COMPLETE: u8 = b'1';
    pub const PORTAL_SUSPENDED: u8 = b's';
    pub const READY_FOR_QUERY: u8 = b'Z';
    pub const ROW_DESCRIPTION: u8 = b'T';
}

/// Authentication request codes carried in an `R` message.
pub mod auth_code {
    pub const OK: i32 = 0;
    pub const CLEARTEXT: i32 = 3;
    pub const MD5: i32 = 5;
    pub const SASL: i32 = 10;
    pub const SASL_CONTINUE: i32 = 11;
    pub const SASL_FINAL: i32 = 12;
}

/// Size of a regular message header: one tag byte and a four-byte length.
pub const HEADER_LEN: usize = 5;

/// The largest message PostgreSQL itself accepts (1 GiB); anything claiming more is
/// treated as a protocol violation before a byte of it is buffered.
pub const MAX_MESSAGE_LEN: usize = 0x4000_0000;

/// Upper bound for the few messages Sluice must hold whole to read them
/// (ReadyForQuery, ParameterStatus, ErrorResponse, authentication...).
pub const MAX_INSPECTED_LEN: usize = 1 << 20;

/// Transaction status carried by ReadyForQuery.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxStatus {
    Idle,
    InTransaction,
    Failed,
}

impl TxStatus {
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            b'I' => Some(Self::Idle),
            b'T' => Some(Self::InTransaction),
            b'E' => Some(Self::Failed),
            _ => None,
        }
    }

    pub fn as_byte(self) -> u8 {
        match self {
            Self::Idle => b'I',
            Self::InTransaction => b'T',
            Self::Failed => b'E',
        }
    }
}

#[derive(Debug, Clone, Error, PartialEq, Eq)]
pub enum ProtocolError {
    #[error("invalid message length {len} for message type '{tag}'", tag = char::from(*.tag))]
    BadLength { tag: u8, len: usize },
    #[error("message of type '{tag}' is too large to process ({len} bytes)", tag = char::from(*.tag))]
    TooLarge { tag: u8, len: usize },
    #[error("malformed {0} message")]
    Malformed(&'static str),
    /// A message type a client may not send once logged in (PostgreSQL's wording).
    #[error("invalid frontend message type {0}")]
    UnknownMessage(u8),
    /// Longer than `max_packet_size` (lengths of the whole message, type byte too).
    #[error("message of type '{tag}' is {len} bytes long, over max_packet_size ({limit})", tag = char::from(*.tag))]
    OverLimit { tag: u8, len: usize, limit: usize },
    #[error("invalid startup packet length {0}")]
    BadStartupLength(usize),
    #[error("{0}")]
    Limit(&'static str),
    /// A message of a type the config turns off (`disable_pqexec`), saying so.
    #[error("{0}")]
    Disallowed(&'static str),
    #[error("unsupported frontend protocol {major}.{minor}")]
    UnsupportedVersion { major: u16, minor: u16 },
}

/// A message header seen at the front of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub tag: u8,
    /// Total frame length: tag byte + length field + body.
    pub frame_len: usize,
}

impl Header {
    /// Peeks at the header at the start of `buf`. `Ok(None)` when fewer than five bytes
    /// are there. The declared length is validated, never used to allocate.
    pub fn peek(buf: &[u8]) -> Result<Option<Header>, ProtocolError> {
        Self::peek_within(buf, MAX_MESSAGE_LEN)
    }

    /// [`Header::peek`] refusing a message whose length field says more than `limit`
    /// (at most `MAX_MESSAGE_LEN`) with [`ProtocolError::OverLimit`]: the same one
    /// comparison.
    #[inline(always)]
    pub fn peek_within(buf: &[u8], limit: usize) -> Result<Option<Header>, ProtocolError> {
        debug_assert!(limit <= MAX_MESSAGE_LEN);
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        if !(4..=limit).contains(&len) {
            return Err(length_error(buf[0], len, limit));
        }
        Ok(Some(Header { tag: buf[0], frame_len: len + 1 }))
    }
}

/// A length out of the protocol's bounds, or over a lower `limit`, told as
/// `max_packet_size` counts: the whole message, its type byte too. (Out of line: rare.)
#[cold]
#[inline(never)]
fn length_error(tag: u8, len: usize, limit: usize) -> ProtocolError {
    match len {
        4..=MAX_MESSAGE_LEN => ProtocolError::OverLimit { tag, len: len + 1, limit: limit + 1 },
        _ => ProtocolError::BadLength { tag, len },
    }
}

/// The largest length field `max_packet_size` lets through (it counts the type byte
/// as well, as PgBouncer does), within PostgreSQL's own bound.
pub fn length_limit(max_packet_size: u32) -> usize {
    (max_packet_size as usize).saturating_sub(1).min(MAX_MESSAGE_LEN)
}

/// Returns the body of a complete frame (everything after the header); empty for a
/// slice shorter than a header.
pub fn body(frame: &[u8]) -> &[u8] {
    frame.get(HEADER_LEN..).unwrap_or_default()
}

/// Reads a NUL-terminated string at the front of `buf`, returning it and the rest.
pub fn read_cstr(buf: &[u8]) -> Option<(&[u8], &[u8])> {
    let nul = memchr::memchr(0, buf)?;
    Some((&buf[..nul], &buf[nul + 1..]))
}

/// Reads a big-endian i32 at the front of `buf`.
pub fn read_i32(buf: &[u8]) -> Option<(i32, &[u8])> {
    let bytes: [u8; 4] = buf.get(..4)?.try_into().ok()?;
    Some((i32::from_be_bytes(bytes), &buf[4..]))
}

/// Reads a big-endian i16 at the front of `buf`.
pub fn read_i16(buf: &[u8]) -> Option<(i16, &[u8])> {
    let bytes: [u8; 2] = buf.get(..2)?.try_into().ok()?;
    Some((i16::from_be_bytes(bytes), &buf[2..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peek_needs_five_bytes() {
        assert_eq!(Header::peek(b"Q\0\0\0").unwrap(), None);
        let h = Header::peek(b"Q\0\0\0\x05x").unwrap().unwrap();
        assert_eq!(h, Header { tag: b'Q', frame_len: 6 });
    }

    #[test]
    fn peek_rejects_short_and_absurd_lengths() {
        assert!(matches!(Header::peek(b"Q\0\0\0\x03"), Err(ProtocolError::BadLength { .. })));
        assert!(matches!(Header::peek(b"Q\x7f\xff\xff\xff"), Err(ProtocolError::BadLength { .. })));
        assert!(Header::peek(b"Q\x40\0\0\0").unwrap().is_some());
        assert!(Header::peek(b"Q\x40\0\0\x01").is_err());
    }

    #[test]
    fn a_lower_limit_is_told_from_a_bad_length() {
        let over = Header::peek_within(b"Q\0\0\x01\x01", 256);
        assert_eq!(over, Err(ProtocolError::OverLimit { tag: b'Q', len: 258, limit: 257 }));
        assert_eq!((length_limit(2048), length_limit(u32::MAX)), (2047, MAX_MESSAGE_LEN));
        assert!(Header::peek_within(b"Q\0\0\x01\0", 256).unwrap().is_some());
        let absurd = Header::peek_within(b"Q\x7f\xff\xff\xff", 256);
        assert!(matches!(absurd, Err(ProtocolError::BadLength { .. })));
        assert!(matches!(Header::peek_within(b"Q\0\0\0\x03", 256), Err(ProtocolError::BadLength { .. })));
    }

    #[test]
    fn cstr_and_ints() {
        let (s, rest) = read_cstr(b"abc\0def").unwrap();
        assert_eq!((s, rest), (&b"abc"[..], &b"def"[..]));
        assert!(read_cstr(b"abc").is_none());
        assert_eq!(read_i32(&[0, 0, 1, 0, 9]).unwrap(), (256, &[9u8][..]));
        assert!(read_i16(&[1]).is_none());
    }

    #[test]
    fn tx_status_round_trip() {
        for b in [b'I', b'T', b'E'] {
            assert_eq!(TxStatus::from_byte(b).unwrap().as_byte(), b);
        }
        assert!(TxStatus::from_byte(b'x').is_none());
    }
}
