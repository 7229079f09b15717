//! The untagged packets a client sends first: StartupMessage, SSLRequest,
//! GSSENCRequest and CancelRequest.

use std::ops::Range;

use super::{ProtocolError, read_cstr};

/// The longest startup packet accepted (PostgreSQL uses the same limit).
pub const MAX_STARTUP_LEN: usize = 10_000;

pub const SSL_REQUEST_CODE: u32 = 80_877_103;
pub const GSSENC_REQUEST_CODE: u32 = 80_877_104;
pub const CANCEL_REQUEST_CODE: u32 = 80_877_102;
pub const PROTOCOL_3_0: u32 = 3 << 16;

/// A parsed first packet from a client.
#[derive(Debug, PartialEq, Eq)]
pub enum StartupPacket {
    Ssl,
    GssEnc,
    Cancel { pid: u32, secret: u32 },
    Startup(StartupMessage),
}

/// A StartupMessage: the requested protocol minor version and the parameters, kept as
/// the packet's text with the offsets of each name and value (one allocation for all
/// of them, not two per parameter: a new connection's first work).
#[derive(PartialEq, Eq, Clone)]
pub struct StartupMessage {
    pub minor: u16,
    /// The parameter area: each name and value ended by a NUL.
    text: Box<str>,
    /// Where each name and its value are in `text`.
    spans: Spans,
}

impl StartupMessage {
    /// The parameters in the order the client sent them.
    pub fn params(&self) -> impl Iterator<Item = (&str, &str)> {
        self.spans.iter().map(|(k, v)| (&self.text[k.clone()], &self.text[v.clone()]))
    }

    /// A parameter's value; the last one when it is given twice, as in PostgreSQL.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.params().filter(|(k, _)| *k == name).last().map(|(_, v)| v)
    }

    /// Protocol options (`_pq_.*`) the client asked for; Sluice supports none.
    pub fn protocol_options(&self) -> impl Iterator<Item = &str> {
        self.params().filter(|(k, _)| k.starts_with("_pq_.")).map(|(k, _)| k)
    }
}

impl std::fmt::Debug for StartupMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StartupMessage")
            .field("minor", &self.minor)
            .field("params", &self.params().collect::<Vec<_>>())
            .finish()
    }
}

/// Validates the length word of a startup packet (which includes itself).
pub fn check_length(len: u32) -> Result<usize, ProtocolError> {
    let len = len as usize;
    if !(8..=MAX_STARTUP_LEN).contains(&len) {
        return Err(ProtocolError::BadStartupLength(len));
    }
    Ok(len)
}

/// Parses a startup packet body (everything after the length word).
pub fn parse(body: &[u8]) -> Result<StartupPacket, ProtocolError> {
    let code = u32::from_be_bytes(body.get(..4).ok_or(ProtocolError::Malformed("startup"))?.try_into().unwrap());
    let rest = &body[4..];
    match code {
        SSL_REQUEST_CODE => Ok(StartupPacket::Ssl),
        GSSENC_REQUEST_CODE => Ok(StartupPacket::GssEnc),
        CANCEL_REQUEST_CODE => {
            if rest.len() != 8 {
                return Err(ProtocolError::Malformed("CancelRequest"));
            }
            let pid = u32::from_be_bytes(rest[..4].try_into().unwrap());
            let secret = u32::from_be_bytes(rest[4..8].try_into().unwrap());
            Ok(StartupPacket::Cancel { pid, secret })
        }
        _ => {
            let (major, minor) = ((code >> 16) as u16, (code & 0xffff) as u16);
            if major != 3 {
                return Err(ProtocolError::UnsupportedVersion { major, minor });
            }
            let (text, spans) = parse_params(rest)?;
            let lossy = matches!(text, std::borrow::Cow::Owned(_));
            let m = StartupMessage { minor, text: text.into(), spans };
            // Only `application_name` is taken so: other values become settings the
            // server would read differently (a `search_path`), or names.
            let mangled =
                |(k, v): (&str, &str)| k.contains('\u{fffd}') || (k != "application_name" && v.contains('\u{fffd}'));
            if lossy && m.params().any(mangled) {
                let what = "StartupMessage (a parameter other than application_name not in UTF-8)";
                return Err(ProtocolError::Malformed(what));
            }
            Ok(StartupPacket::Startup(m))
        }
    }
}

/// Where each parameter's name and value are in the parameter area.
type Spans = Vec<(Range<usize>, Range<usize>)>;

/// Splits the parameter area: name, NUL, value, NUL, ..., and an empty name ending it.
/// Bytes that are not UTF-8 (an `application_name` in Latin-1, which PostgreSQL takes
/// as it comes) read as U+FFFD: the NULs stay where they are, as no multi-byte
/// character holds one. (The caller refuses them in any other parameter.)
fn parse_params(buf: &[u8]) -> Result<(std::borrow::Cow<'_, str>, Spans), ProtocolError> {
    let bad = || ProtocolError::Malformed("StartupMessage");
    let text = String::from_utf8_lossy(buf);
    let mut spans = Vec::new();
    let mut pos = 0;
    loop {
        let name = next_cstr(&text, &mut pos).ok_or_else(bad)?;
        if name.is_empty() {
            return if pos == text.len() { Ok((text, spans)) } else { Err(bad()) };
        }
        let value = next_cstr(&text, &mut pos).ok_or_else(bad)?;
        spans.push((name, value));
    }
}

/// The NUL-terminated string at `pos` in `text`, as its range; moves `pos` past its NUL.
fn next_cstr(text: &str, pos: &mut usize) -> Option<Range<usize>> {
    let (s, _) = read_cstr(&text.as_bytes()[*pos..])?;
    let range = *pos..*pos + s.len();
    *pos = range.end + 1;
    Some(range)
}

/// A boolean startup value read as PostgreSQL reads one (`parse_bool`): `true`,
/// `false`, `yes`, `no`, `on`, `off` or a prefix of them (`on`/`off` at least two
/// letters), any case, or `1`/`0`.
pub fn parse_bool(value: &str) -> Option<bool> {
    let lower = value.to_ascii_lowercase();
    let prefix_of = |word: &str| !lower.is_empty() && word.starts_with(lower.as_str());
    match lower.as_str() {
        "1" => Some(true),
        "0" => Some(false),
        "o" => None,
        _ if prefix_of("true") || prefix_of("yes") || prefix_of("on") => Some(true),
        _ if prefix_of("false") || prefix_of("no") || prefix_of("off") => Some(false),
        _ => None,
    }
}

/// Splits a libpq `options` value into `-c name=value` settings. Backslash escapes a
/// space, as in PostgreSQL's own parser. Other switches are rejected.
pub fn parse_options(options: &str) -> Result<Vec<(String, String)>, String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut chars = options.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => cur.extend(chars.next()),
            c if c.is_whitespace() => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    let mut out = Vec::new();
    let mut it = words.into_iter();
    while let Some(w) = it.next() {
        let setting = if w == "-c" {
            it.next().ok_or_else(|| "missing setting after -c".to_string())?
        } else if let Some(s) = w.strip_prefix("-c").or_else(|| w.strip_prefix("--")) {
            s.to_string()
        } else {
            return Err(format!("unsupported startup option \"{w}\""));
        };
        let (k, v) = setting.split_once('=').ok_or_else(|| format!("option \"{setting}\" needs a value"))?;
        out.push((k.replace('-', "_"), v.to_string()));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(code: u32, rest: &[u8]) -> Vec<u8> {
        let mut v = code.to_be_bytes().to_vec();
        v.extend_from_slice(rest);
        v
    }

    #[test]
    fn parses_startup_message() {
        let p = parse(&packet(PROTOCOL_3_0, b"user\0bob\0database\0db\0\0")).unwrap();
        let StartupPacket::Startup(m) = p else { panic!() };
        assert_eq!(m.minor, 0);
        assert_eq!(m.get("user"), Some("bob"));
        assert_eq!(m.get("database"), Some("db"));
        assert_eq!(m.get("nope"), None);
        assert_eq!(m.params().collect::<Vec<_>>(), vec![("user", "bob"), ("database", "db")]);
        let StartupPacket::Startup(m) = parse(&packet(PROTOCOL_3_0, b"\0")).unwrap() else { panic!() };
        assert_eq!(m.params().count(), 0);
        // An empty value is a value; the last of a repeated name is the one `get` sees,
        // as PostgreSQL takes the last.
        let StartupPacket::Startup(m) = parse(&packet(PROTOCOL_3_0, b"a\0x\0a\0\0\0")).unwrap() else { panic!() };
        assert_eq!(m.params().collect::<Vec<_>>(), vec![("a", "x"), ("a", "")]);
        assert_eq!(m.get("a"), Some(""));
        assert_eq!(format!("{m:?}"), r#"StartupMessage { minor: 0, params: [("a", "x"), ("a", "")] }"#);
    }

    #[test]
    fn booleans_read_as_postgresql_reads_them() {
        for yes in ["true", "t", "TRUE", "Tr", "yes", "y", "YE", "on", "ON", "1"] {
            assert_eq!(parse_bool(yes), Some(true), "{yes}");
        }
        for no in ["false", "f", "FALSE", "fal", "no", "N", "off", "of", "OFF", "0"] {
            assert_eq!(parse_bool(no), Some(false), "{no}");
        }
        for neither in ["", "o", "database", "truee", "2", "01", " true", "onn", "offf"] {
            assert_eq!(parse_bool(neither), None, "{neither}");
        }
    }

    #[test]
    fn parses_special_requests() {
        assert_eq!(parse(&packet(SSL_REQUEST_CODE, b"")).unwrap(), StartupPacket::Ssl);
        assert_eq!(parse(&packet(GSSENC_REQUEST_CODE, b"")).unwrap(), StartupPacket::GssEnc);
        let c = parse(&packet(CANCEL_REQUEST_CODE, &[0, 0, 0, 7, 0, 0, 1, 0])).unwrap();
        assert_eq!(c, StartupPacket::Cancel { pid: 7, secret: 256 });
        assert!(parse(&packet(CANCEL_REQUEST_CODE, &[0, 0])).is_err());
    }

    #[test]
    fn rejects_bad_packets() {
        assert!(parse(&packet(2 << 16, b"\0")).is_err());
        assert!(parse(&packet(PROTOCOL_3_0, b"user\0bob")).is_err());
        assert!(parse(&packet(PROTOCOL_3_0, b"user\0bob\0\0extra")).is_err());
        assert!(parse(&packet(PROTOCOL_3_0, b"")).is_err());
        // Only application_name may be other than UTF-8.
        assert!(parse(&packet(PROTOCOL_3_0, b"user\0b\xffb\0\0")).is_err());
        assert!(parse(&packet(PROTOCOL_3_0, b"user\0u\0database\0d\xc3\0\0")).is_err());
        assert!(parse(&packet(PROTOCOL_3_0, b"user\0u\0search_path\0caf\xe9\0\0")).is_err());
        assert!(parse(&packet(PROTOCOL_3_0, b"user\0u\0caf\xe9\0x\0\0")).is_err());
        let latin1 = parse(&packet(PROTOCOL_3_0, b"user\0u\0application_name\0caf\xe9\0\0"));
        let Ok(StartupPacket::Startup(m)) = latin1 else { panic!("{latin1:?}") };
        assert_eq!((m.get("user"), m.get("application_name")), (Some("u"), Some("caf\u{fffd}")));
        assert!(parse(b"\0\0").is_err());
        assert!(check_length(7).is_err());
        assert!(check_length(10_001).is_err());
        assert_eq!(check_length(8).unwrap(), 8);
    }

    #[test]
    fn newer_minor_is_reported() {
        let StartupPacket::Startup(m) = parse(&packet(PROTOCOL_3_0 | 2, b"user\0u\0_pq_.x\0y\0\0")).unwrap() else {
            panic!()
        };
        assert_eq!(m.minor, 2);
        assert_eq!(m.protocol_options().collect::<Vec<_>>(), vec!["_pq_.x"]);
    }

    #[test]
    fn options_parsing() {
        let o = parse_options("-c search_path=a,b --statement-timeout=5 -cwork_mem=1MB").unwrap();
        assert_eq!(
            o,
            vec![
                ("search_path".into(), "a,b".into()),
                ("statement_timeout".into(), "5".into()),
                ("work_mem".into(), "1MB".into())
            ]
        );
        let o = parse_options(r"-c application_name=a\ b").unwrap();
        assert_eq!(o, vec![("application_name".into(), "a b".into())]);
        assert!(parse_options("-d 5").is_err());
        assert!(parse_options("-c").is_err());
    }
}
