//! Builders for the messages Sluice writes itself. Each appends one complete frame to
//! a `BytesMut`, so a batch of replies goes out in a single write.

use bytes::{BufMut, BytesMut};

use super::{TxStatus, auth_code, be, fe};

/// Severity of an ErrorResponse Sluice raises.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Error,
    Fatal,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Error => "ERROR",
            Self::Fatal => "FATAL",
        }
    }
}

/// Writes a frame: tag, length placeholder, body written by `f`, then the length.
pub fn frame(buf: &mut BytesMut, tag: u8, f: impl FnOnce(&mut BytesMut)) {
    buf.put_u8(tag);
    let at = buf.len();
    buf.put_u32(0);
    f(buf);
    let len = (buf.len() - at) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

fn cstr(buf: &mut BytesMut, s: &[u8]) {
    buf.put_slice(s);
    buf.put_u8(0);
}

/// The single place an ErrorResponse is composed.
pub fn error_response(buf: &mut BytesMut, severity: Severity, code: &str, message: &str) {
    report(buf, be::ERROR_RESPONSE, severity.as_str(), code, message, None);
}

/// An ErrorResponse that names the PostgreSQL routine it stands for (field `R`), for
/// errors Sluice raises in PostgreSQL's place that drivers recognise by that field.
pub fn error_response_from(buf: &mut BytesMut, severity: Severity, code: &str, message: &str, routine: Option<&str>) {
    report(buf, be::ERROR_RESPONSE, severity.as_str(), code, message, routine);
}

/// A NoticeResponse (severity NOTICE, SQLSTATE 00000), as the admin console's SHOW HELP.
pub fn notice_response(buf: &mut BytesMut, message: &str) {
    report(buf, be::NOTICE_RESPONSE, "NOTICE", "00000", message, None);
}

fn report(buf: &mut BytesMut, tag: u8, severity: &str, code: &str, message: &str, routine: Option<&str>) {
    frame(buf, tag, |b| {
        b.put_u8(b'S');
        cstr(b, severity.as_bytes());
        b.put_u8(b'V');
        cstr(b, severity.as_bytes());
        b.put_u8(b'C');
        cstr(b, code.as_bytes());
        b.put_u8(b'M');
        // A NUL inside the text would end the field early; PostgreSQL never sends one.
        let msg: Vec<u8> = message.bytes().filter(|&c| c != 0).collect();
        cstr(b, &msg);
        if let Some(r) = routine {
            b.put_u8(b'R');
            cstr(b, r.as_bytes());
        }
        b.put_u8(0);
    });
}

pub fn ready_for_query(buf: &mut BytesMut, status: TxStatus) {
    frame(buf, be::READY_FOR_QUERY, |b| b.put_u8(status.as_byte()));
}

pub fn parameter_status(buf: &mut BytesMut, name: &[u8], value: &[u8]) {
    frame(buf, be::PARAMETER_STATUS, |b| {
        cstr(b, name);
        cstr(b, value);
    });
}

pub fn backend_key_data(buf: &mut BytesMut, pid: u32, secret: u32) {
    frame(buf, be::BACKEND_KEY_DATA, |b| {
        b.put_u32(pid);
        b.put_u32(secret);
    });
}

pub fn auth_ok(buf: &mut BytesMut) {
    frame(buf, be::AUTHENTICATION, |b| b.put_i32(auth_code::OK));
}

pub fn auth_md5(buf: &mut BytesMut, salt: [u8; 4]) {
    frame(buf, be::AUTHENTICATION, |b| {
        b.put_i32(auth_code::MD5);
        b.put_slice(&salt);
    });
}

pub fn auth_cleartext(buf: &mut BytesMut) {
    frame(buf, be::AUTHENTICATION, |b| b.put_i32(auth_code::CLEARTEXT));
}

/// AuthenticationSASL offering the given mechanisms.
pub fn auth_sasl(buf: &mut BytesMut, mechanisms: &[&str]) {
    frame(buf, be::AUTHENTICATION, |b| {
        b.put_i32(auth_code::SASL);
        for m in mechanisms {
            cstr(b, m.as_bytes());
        }
        b.put_u8(0);
    });
}

pub fn auth_sasl_continue(buf: &mut BytesMut, data: &[u8]) {
    frame(buf, be::AUTHENTICATION, |b| {
        b.put_i32(auth_code::SASL_CONTINUE);
        b.put_slice(data);
    });
}

pub fn auth_sasl_final(buf: &mut BytesMut, data: &[u8]) {
    frame(buf, be::AUTHENTICATION, |b| {
        b.put_i32(auth_code::SASL_FINAL);
        b.put_slice(data);
    });
}

/// NegotiateProtocolVersion: the newest minor version supported and the options not
/// recognised.
pub fn negotiate_protocol_version(buf: &mut BytesMut, minor: u32, unsupported: &[&str]) {
    frame(buf, be::NEGOTIATE_PROTOCOL_VERSION, |b| {
        b.put_u32(minor);
        b.put_u32(unsupported.len() as u32);
        for o in unsupported {
            cstr(b, o.as_bytes());
        }
    });
}

pub fn command_complete(buf: &mut BytesMut, tag: &str) {
    frame(buf, be::COMMAND_COMPLETE, |b| cstr(b, tag.as_bytes()));
}

pub fn close_complete(buf: &mut BytesMut) {
    frame(buf, be::CLOSE_COMPLETE, |_| {});
}

pub fn parse_complete(buf: &mut BytesMut) {
    frame(buf, be::PARSE_COMPLETE, |_| {});
}

pub fn bind_complete(buf: &mut BytesMut) {
    frame(buf, be::BIND_COMPLETE, |_| {});
}

pub fn no_data(buf: &mut BytesMut) {
    frame(buf, be::NO_DATA, |_| {});
}

pub fn empty_query_response(buf: &mut BytesMut) {
    frame(buf, be::EMPTY_QUERY_RESPONSE, |_| {});
}

/// ParameterDescription with the given parameter type OIDs.
pub fn parameter_description(buf: &mut BytesMut, types: &[u32]) {
    frame(buf, be::PARAMETER_DESCRIPTION, |b| {
        b.put_u16(types.len() as u16);
        for t in types {
            b.put_u32(*t);
        }
    });
}

/// RowDescription of computed columns: (name, type OID, type size, format code).
pub fn row_description(buf: &mut BytesMut, columns: &[(&str, u32, i16, i16)]) {
    frame(buf, be::ROW_DESCRIPTION, |b| {
        b.put_u16(columns.len() as u16);
        for (name, oid, size, format) in columns {
            cstr(b, name.as_bytes());
            b.put_u32(0); // no table
            b.put_u16(0); // no column number
            b.put_u32(*oid);
            b.put_i16(*size);
            b.put_i32(-1); // no type modifier
            b.put_i16(*format);
        }
    });
}

/// DataRow; None is NULL.
pub fn data_row(buf: &mut BytesMut, values: &[Option<&[u8]>]) {
    frame(buf, be::DATA_ROW, |b| values_with_lengths(b, values));
}

/// A count of values, then each as its length and bytes (-1 and none for NULL): a
/// DataRow's columns, a Bind's parameters.
fn values_with_lengths(b: &mut BytesMut, values: &[Option<&[u8]>]) {
    b.put_u16(values.len() as u16);
    for v in values {
        match v {
            Some(v) => {
                b.put_i32(v.len() as i32);
                b.put_slice(v);
            }
            None => b.put_i32(-1),
        }
    }
}

// ---- frontend messages Sluice sends to servers ----

/// StartupMessage for protocol 3.0 with the given parameters.
pub fn startup_message(buf: &mut BytesMut, params: &[(&str, &str)]) {
    let at = buf.len();
    buf.put_u32(0);
    buf.put_u32(super::startup::PROTOCOL_3_0);
    for (k, v) in params {
        cstr(buf, k.as_bytes());
        cstr(buf, v.as_bytes());
    }
    buf.put_u8(0);
    let len = (buf.len() - at) as u32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// One whole message as bytes, for unit tests.
#[cfg(test)]
pub(crate) fn message(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut b = BytesMut::new();
    frame(&mut b, tag, |b| b.extend_from_slice(body));
    b.to_vec()
}

pub fn cancel_request(buf: &mut BytesMut, pid: u32, secret: u32) {
    buf.put_u32(16);
    buf.put_u32(super::startup::CANCEL_REQUEST_CODE);
    buf.put_u32(pid);
    buf.put_u32(secret);
}

pub fn ssl_request(buf: &mut BytesMut) {
    buf.put_u32(8);
    buf.put_u32(super::startup::SSL_REQUEST_CODE);
}

pub fn query(buf: &mut BytesMut, sql: &str) {
    frame(buf, fe::QUERY, |b| cstr(b, sql.as_bytes()));
}

pub fn password(buf: &mut BytesMut, password: &[u8]) {
    frame(buf, fe::PASSWORD, |b| cstr(b, password));
}

pub fn sasl_initial_response(buf: &mut BytesMut, mechanism: &str, data: &[u8]) {
    frame(buf, fe::PASSWORD, |b| {
        cstr(b, mechanism.as_bytes());
        b.put_i32(data.len() as i32);
        b.put_slice(data);
    });
}

pub fn sasl_response(buf: &mut BytesMut, data: &[u8]) {
    frame(buf, fe::PASSWORD, |b| b.put_slice(data));
}

pub fn terminate(buf: &mut BytesMut) {
    frame(buf, fe::TERMINATE, |_| {});
}

pub fn flush(buf: &mut BytesMut) {
    frame(buf, fe::FLUSH, |_| {});
}

pub fn sync(buf: &mut BytesMut) {
    frame(buf, fe::SYNC, |_| {});
}

/// Parse of a named statement with no parameter types given.
pub fn parse(buf: &mut BytesMut, name: &[u8], query: &[u8], param_types: &[u32]) {
    frame(buf, fe::PARSE, |b| {
        cstr(b, name);
        cstr(b, query);
        b.put_u16(param_types.len() as u16);
        for t in param_types {
            b.put_u32(*t);
        }
    });
}

/// Bind of a statement to a portal with these parameter format codes, no parameters
/// and default result formats.
pub fn bind_with_formats(buf: &mut BytesMut, portal: &[u8], statement: &[u8], formats: &[u16]) {
    frame(buf, fe::BIND, |b| {
        cstr(b, portal);
        cstr(b, statement);
        b.put_u16(formats.len() as u16);
        for f in formats {
            b.put_u16(*f);
        }
        b.put_u16(0); // parameters
        b.put_u16(0); // result format codes
    });
}

/// Bind of a statement to a portal with text parameters (None: NULL) and text results.
pub fn bind_text(buf: &mut BytesMut, portal: &[u8], statement: &[u8], params: &[Option<&[u8]>]) {
    frame(buf, fe::BIND, |b| {
        cstr(b, portal);
        cstr(b, statement);
        b.put_u16(0); // parameter formats: all text
        values_with_lengths(b, params);
        b.put_u16(0); // result formats: all text
    });
}

/// Execute of a portal, all rows.
pub fn execute(buf: &mut BytesMut, portal: &[u8]) {
    frame(buf, fe::EXECUTE, |b| {
        cstr(b, portal);
        b.put_i32(0);
    });
}

/// Describe of a statement (`S`) or portal (`P`).
pub fn describe(buf: &mut BytesMut, kind: u8, name: &[u8]) {
    frame(buf, fe::DESCRIBE, |b| {
        b.put_u8(kind);
        cstr(b, name);
    });
}

/// Close of a statement (`S`) or portal (`P`).
pub fn close(buf: &mut BytesMut, kind: u8, name: &[u8]) {
    frame(buf, fe::CLOSE, |b| {
        b.put_u8(kind);
        cstr(b, name);
    });
}

/// Quotes a value as a SQL string literal that reads the same whatever
/// standard_conforming_strings says, with every character beyond ASCII written as a
/// Unicode escape (`\u00e9`) when `ascii`: the text then reads the same whatever the
/// connection's `client_encoding`, which PostgreSQL converts a whole query message
/// from. (Not for a SQL_ASCII database, where such escapes of characters beyond ASCII
/// are refused.)
pub fn quote_literal(value: &str, ascii: bool) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(value.len() + 3);
    s.push_str("E'");
    for c in value.chars() {
        match c {
            '\'' => s.push_str("''"),
            '\\' => s.push_str("\\\\"),
            c if ascii && !c.is_ascii() && u32::from(c) <= 0xffff => {
                let _ = write!(s, "\\u{:04x}", u32::from(c));
            }
            c if ascii && !c.is_ascii() => {
                let _ = write!(s, "\\U{:08x}", u32::from(c));
            }
            c => s.push(c),
        }
    }
    s.push('\'');
    s
}

/// Quotes an identifier (a parameter name) for SET.
pub fn quote_ident(name: &str) -> String {
    format!("\"{}\"", name.replace('"', "\"\""))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Header, fields::ErrorFields};

    #[test]
    fn error_response_round_trips() {
        let mut b = BytesMut::new();
        error_response(&mut b, Severity::Fatal, "28P01", "password authentication failed");
        let h = Header::peek(&b).unwrap().unwrap();
        assert_eq!(h.tag, b'E');
        assert_eq!(h.frame_len, b.len());
        let f = ErrorFields::parse(&b[5..]).unwrap();
        assert_eq!(f.severity, "FATAL");
        assert_eq!(f.code, "28P01");
        assert_eq!(f.message, "password authentication failed");
    }

    #[test]
    fn fixed_frames() {
        let mut b = BytesMut::new();
        ready_for_query(&mut b, TxStatus::InTransaction);
        assert_eq!(&b[..], b"Z\0\0\0\x05T");
        b.clear();
        backend_key_data(&mut b, 1, 2);
        assert_eq!(&b[..], b"K\0\0\0\x0c\0\0\0\x01\0\0\0\x02");
        b.clear();
        startup_message(&mut b, &[("user", "u")]);
        assert_eq!(&b[..], b"\0\0\0\x10\0\x03\0\0user\0u\0\0");
        b.clear();
        cancel_request(&mut b, 5, 6);
        assert_eq!(b.len(), 16);
    }

    #[test]
    fn literals_are_quoted() {
        assert_eq!(quote_literal("a'b\\c", false), "E'a''b\\\\c'");
        assert_eq!(quote_literal("café", false), "E'café'");
        assert_eq!(quote_literal("café 🐘", true), "E'caf\\u00e9 \\U0001f418'");
        assert_eq!(quote_ident("Time\"Zone"), "\"Time\"\"Zone\"");
    }
}
