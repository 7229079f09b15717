//! Typed views of the few backend messages Sluice reads whole.

use super::{ProtocolError, read_cstr};

/// The fields of an ErrorResponse or NoticeResponse that Sluice uses.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ErrorFields {
    pub severity: String,
    pub code: String,
    pub message: String,
    /// The server function that raised it (`R`): never translated, unlike the message.
    pub routine: String,
}

impl ErrorFields {
    /// Parses the body of an ErrorResponse / NoticeResponse.
    pub fn parse(body: &[u8]) -> Result<Self, ProtocolError> {
        Self::parse_inner(body, false)
    }

    /// Parses the first part of a long ErrorResponse's body (the relay reads at most
    /// `ERROR_PREFIX` of it): fields cut off at the end are kept as far as they go.
    /// PostgreSQL sends severity and code first, the message next.
    pub fn parse_prefix(body: &[u8]) -> Result<Self, ProtocolError> {
        Self::parse_inner(body, true)
    }

    fn parse_inner(mut body: &[u8], cut: bool) -> Result<Self, ProtocolError> {
        let mut f = ErrorFields::default();
        loop {
            let Some((&kind, rest)) = body.split_first() else {
                return if cut { Ok(f) } else { Err(ProtocolError::Malformed("ErrorResponse")) };
            };
            if kind == 0 {
                return Ok(f);
            }
            let (value, rest) = match read_cstr(rest) {
                Some(v) => v,
                None if cut => (rest, &[][..]),
                None => return Err(ProtocolError::Malformed("ErrorResponse")),
            };
            let value = String::from_utf8_lossy(value).into_owned();
            match kind {
                b'V' => f.severity = value,
                b'S' if f.severity.is_empty() => f.severity = value,
                b'C' => f.code = value,
                b'M' => f.message = value,
                b'R' => f.routine = value,
                _ => {}
            }
            body = rest;
        }
    }

    pub fn is_fatal(&self) -> bool {
        matches!(self.severity.as_str(), "FATAL" | "PANIC")
    }
}

/// Parses a ParameterStatus body into name and value.
pub fn parameter_status(body: &[u8]) -> Result<(&[u8], &[u8]), ProtocolError> {
    let bad = ProtocolError::Malformed("ParameterStatus");
    let (name, rest) = read_cstr(body).ok_or(bad.clone())?;
    let (value, _) = read_cstr(rest).ok_or(bad)?;
    Ok((name, value))
}

/// Parses a DataRow body into its column values (None for NULL).
pub fn data_row(body: &[u8]) -> Result<Vec<Option<&[u8]>>, ProtocolError> {
    let bad = ProtocolError::Malformed("DataRow");
    let (count, mut rest) = super::read_i16(body).ok_or(bad.clone())?;
    let mut values = Vec::with_capacity(count.max(0) as usize);
    for _ in 0..count {
        let (len, after) = super::read_i32(rest).ok_or(bad.clone())?;
        if len < 0 {
            values.push(None);
            rest = after;
            continue;
        }
        let value = after.get(..len as usize).ok_or(bad.clone())?;
        values.push(Some(value));
        rest = &after[len as usize..];
    }
    if count < 0 || !rest.is_empty() {
        return Err(bad);
    }
    Ok(values)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_error_fields() {
        let body = b"SERROR\0VERROR\0C42P01\0Mrelation \"x\" does not exist\0P15\0Rparser_open_table\0\0";
        let f = ErrorFields::parse(body).unwrap();
        assert_eq!((f.code.as_str(), f.routine.as_str()), ("42P01", "parser_open_table"));
        assert!(!f.is_fatal());
        assert!(ErrorFields::parse(b"SERROR\0").is_err());
        assert!(ErrorFields::parse(b"SERR").is_err());
        let cut = ErrorFields::parse_prefix(b"SERROR\0VERROR\0C22P02\0Minvalid input: \"xxxx").unwrap();
        assert_eq!((cut.code.as_str(), cut.message.as_str()), ("22P02", "invalid input: \"xxxx"));
    }

    #[test]
    fn parses_data_rows() {
        let mut b = bytes::BytesMut::new();
        crate::protocol::build::data_row(&mut b, &[Some(b"u"), None, Some(b"")]);
        let row = data_row(crate::protocol::body(&b)).unwrap();
        assert_eq!(row, vec![Some(&b"u"[..]), None, Some(&b""[..])]);
        // Cut short, a length past the end, bytes left over, a negative count.
        assert!(data_row(&crate::protocol::body(&b)[..7]).is_err());
        assert!(data_row(b"\0\x01\0\0\0\x09abc").is_err());
        assert!(data_row(b"\0\x01\0\0\0\x01abc").is_err());
        assert!(data_row(b"\xff\xff").is_err());
    }

    #[test]
    fn parses_parameter_status() {
        assert_eq!(parameter_status(b"a\0b\0").unwrap(), (&b"a"[..], &b"b"[..]));
        assert!(parameter_status(b"a\0b").is_err());
    }
}
