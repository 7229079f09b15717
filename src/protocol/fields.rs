//! Typed views of the few backend messages Sluice reads whole.

use super::{ProtocolError, read_cstr};

/// The fields of an ErrorResponse or NoticeResponse that Sluice uses.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct ErrorFields {
    pub severity: String,
    pub code: String,
    pub message: String,
}

impl ErrorFields {
    /// Parses the body of an ErrorResponse / NoticeResponse.
    pub fn parse(mut body: &[u8]) -> Result<Self, ProtocolError> {
        let mut f = ErrorFields::default();
        loop {
            let (&kind, rest) = body.split_first().ok_or(ProtocolError::Malformed("ErrorResponse"))?;
            if kind == 0 {
                return Ok(f);
            }
            let (value, rest) = read_cstr(rest).ok_or(ProtocolError::Malformed("ErrorResponse"))?;
            let value = String::from_utf8_lossy(value).into_owned();
            match kind {
                b'V' => f.severity = value,
                b'S' if f.severity.is_empty() => f.severity = value,
                b'C' => f.code = value,
                b'M' => f.message = value,
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_error_fields() {
        let body = b"SERROR\0VERROR\0C42P01\0Mrelation \"x\" does not exist\0P15\0\0";
        let f = ErrorFields::parse(body).unwrap();
        assert_eq!(f.code, "42P01");
        assert!(!f.is_fatal());
        assert!(ErrorFields::parse(b"SERROR\0").is_err());
        assert!(ErrorFields::parse(b"SERR").is_err());
    }

    #[test]
    fn parses_parameter_status() {
        assert_eq!(parameter_status(b"a\0b\0").unwrap(), (&b"a"[..], &b"b"[..]));
        assert!(parameter_status(b"a\0b").is_err());
    }
}
