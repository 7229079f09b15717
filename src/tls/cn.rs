//! The subject common name (CN) of an X.509 certificate, for `auth_type = "cert"` and
//! verify-full's fallback, whether a certificate carries name constraints, and whether
//! it is self-issued and when it is valid (a server certificate trusted as itself).
//! A minimal DER walk (RFC 5280 §4.1, X.690 §8.1): Certificate → TBSCertificate →
//! subject Name → the first attribute of type 2.5.4.3 (or → extensions). The
//! certificate has already been verified by rustls; this only reads it, and returns
//! None for anything odd.

const SEQUENCE: u8 = 0x30;
const SET: u8 = 0x31;
const OID: u8 = 0x06;
/// `[0] EXPLICIT Version` at the start of a TBSCertificate (absent for v1).
const VERSION_TAG: u8 = 0xa0;
/// id-at-commonName, 2.5.4.3.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// `[3] EXPLICIT Extensions` at the end of a TBSCertificate.
const EXTENSIONS_TAG: u8 = 0xa3;
/// id-ce-nameConstraints, 2.5.29.30.
const OID_NAME_CONSTRAINTS: &[u8] = &[0x55, 0x1d, 0x1e];

/// One DER element: (tag, contents, what follows). None when truncated, when the
/// length is indefinite or longer than 4 bytes, or for multi-byte tags.
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    if tag & 0x1f == 0x1f {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 {
            return None;
        }
        let bytes = rest.get(..n)?;
        (bytes.iter().fold(0usize, |acc, &b| (acc << 8) | usize::from(b)), rest.get(n..)?)
    };
    Some((tag, rest.get(..len)?, rest.get(len..)?))
}

/// The contents of an element that must have tag `tag`, and what follows it.
fn expect(input: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (t, contents, rest) = element(input)?;
    (t == tag).then_some((contents, rest))
}

/// The subject's first common name, if the certificate has one that is text.
pub fn common_name(cert_der: &[u8]) -> Option<String> {
    let (subject, _) = expect(after_validity(cert_der)?, SEQUENCE)?;
    first_common_name(subject)
}

/// Whether a certificate has a name constraints extension (None when it cannot be
/// read: the caller takes that as having one).
pub fn has_name_constraints(cert_der: &[u8]) -> Option<bool> {
    // subject, subjectPublicKeyInfo
    let mut rest = element(element(after_validity(cert_der)?)?.2)?.2;
    while !rest.is_empty() {
        let (tag, contents, after) = element(rest)?;
        rest = after;
        if tag != EXTENSIONS_TAG {
            continue; // issuerUniqueID, subjectUniqueID
        }
        let (mut extensions, _) = expect(contents, SEQUENCE)?;
        while !extensions.is_empty() {
            let (extension, after) = expect(extensions, SEQUENCE)?;
            extensions = after;
            if expect(extension, OID)?.0 == OID_NAME_CONSTRAINTS {
                return Some(true);
            }
        }
    }
    Some(false)
}

/// Whether the certificate's issuer is its subject (self-issued), and its validity
/// period in seconds since 1970: (notBefore, notAfter).
pub fn self_issued_validity(cert_der: &[u8]) -> Option<(bool, (i64, i64))> {
    let (cert, _) = expect(cert_der, SEQUENCE)?;
    let (tbs, _) = expect(cert, SEQUENCE)?;
    let mut rest = tbs;
    if let Some((VERSION_TAG, _, after)) = element(rest) {
        rest = after;
    }
    let rest = element(element(rest)?.2)?.2; // serialNumber, signature
    let (issuer, rest) = expect(rest, SEQUENCE)?;
    let (validity, rest) = expect(rest, SEQUENCE)?;
    let (subject, _) = expect(rest, SEQUENCE)?;
    let (t1, from, after) = element(validity)?;
    let (t2, until, _) = element(after)?;
    Some((issuer == subject, (time(t1, from)?, time(t2, until)?)))
}

/// A UTCTime (`YYMMDDHHMMSSZ`, years 1950–2049) or GeneralizedTime
/// (`YYYYMMDDHHMMSSZ`) as seconds since 1970 (RFC 5280 §4.1.2.5).
fn time(tag: u8, text: &[u8]) -> Option<i64> {
    let digits = |s: &[u8]| -> Option<i64> {
        s.iter().try_fold(0i64, |n, &b| b.is_ascii_digit().then(|| n * 10 + i64::from(b - b'0')))
    };
    let (year, rest) = match (tag, text.len()) {
        (0x17, 13) => {
            let yy = digits(&text[..2])?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, &text[2..])
        }
        (0x18, 15) => (digits(&text[..4])?, &text[4..]),
        _ => return None,
    };
    if rest[10] != b'Z' {
        return None;
    }
    let field = |i: usize| digits(&rest[i..i + 2]);
    let (month, day) = (field(0)?, field(2)?);
    let (hour, minute, second) = (field(4)?, field(6)?, field(8)?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 || second > 60 {
        return None;
    }
    // Days since 1970-01-01 of a proleptic Gregorian date (years counted from March).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days * 86_400 + hour * 3600 + minute * 60 + second)
}

/// A TBSCertificate from its subject on (past version, serialNumber, signature,
/// issuer and validity).
fn after_validity(cert_der: &[u8]) -> Option<&[u8]> {
    let (cert, _) = expect(cert_der, SEQUENCE)?;
    let (tbs, _) = expect(cert, SEQUENCE)?;
    let mut rest = tbs;
    if let Some((VERSION_TAG, _, after)) = element(rest) {
        rest = after;
    }
    for _ in 0..4 {
        rest = element(rest)?.2;
    }
    Some(rest)
}

/// Name ::= SEQUENCE OF SET OF SEQUENCE { type OID, value ANY }
fn first_common_name(mut name: &[u8]) -> Option<String> {
    while !name.is_empty() {
        let (rdn, rest) = expect(name, SET)?;
        name = rest;
        let mut attributes = rdn;
        while !attributes.is_empty() {
            let (attribute, rest) = expect(attributes, SEQUENCE)?;
            attributes = rest;
            let (oid, value) = expect(attribute, OID)?;
            if oid == OID_COMMON_NAME {
                let (tag, text, _) = element(value)?;
                return directory_string(tag, text);
            }
        }
    }
    None
}

/// DirectoryString forms; names with NUL bytes are refused (as PostgreSQL does).
fn directory_string(tag: u8, bytes: &[u8]) -> Option<String> {
    let text = match tag {
        // UTF8String, PrintableString, TeletexString (read as UTF-8), IA5String
        0x0c | 0x13 | 0x14 | 0x16 => std::str::from_utf8(bytes).ok()?.to_string(),
        // BMPString: UTF-16BE
        0x1e if bytes.len() % 2 == 0 => {
            let units: Vec<u16> = bytes.chunks_exact(2).map(|c| u16::from_be_bytes([c[0], c[1]])).collect();
            String::from_utf16(&units).ok()?
        }
        _ => return None,
    };
    (!text.contains('\0')).then_some(text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cert_with(dn: &[(rcgen::DnType, &str)]) -> Vec<u8> {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.distinguished_name = rcgen::DistinguishedName::new();
        for (t, v) in dn {
            params.distinguished_name.push(t.clone(), *v);
        }
        let key = rcgen::KeyPair::generate().unwrap();
        params.self_signed(&key).unwrap().der().to_vec()
    }

    #[test]
    fn reads_the_common_name() {
        let der = cert_with(&[(rcgen::DnType::OrganizationName, "Acme"), (rcgen::DnType::CommonName, "u_scram")]);
        assert_eq!(common_name(&der).as_deref(), Some("u_scram"));
        let der = cert_with(&[(rcgen::DnType::CommonName, "ünï")]);
        assert_eq!(common_name(&der).as_deref(), Some("ünï"));
    }

    #[test]
    fn no_common_name_is_none() {
        assert_eq!(common_name(&cert_with(&[(rcgen::DnType::OrganizationName, "Acme")])), None);
        assert_eq!(common_name(&[]), None);
        assert_eq!(common_name(&[0x30, 0x80, 0, 0]), None);
    }

    #[test]
    fn every_truncation_is_handled() {
        let der = cert_with(&[(rcgen::DnType::CommonName, "u_scram")]);
        for n in 0..der.len() {
            let _ = common_name(&der[..n]);
            let _ = has_name_constraints(&der[..n]);
            let _ = self_issued_validity(&der[..n]);
        }
    }

    #[test]
    fn name_constraints_are_seen() {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        assert_eq!(has_name_constraints(params.self_signed(&key).unwrap().der()), Some(false));
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params.name_constraints = Some(rcgen::NameConstraints {
            permitted_subtrees: vec![rcgen::GeneralSubtree::DnsName(".dev.example.com".into())],
            excluded_subtrees: vec![],
        });
        assert_eq!(has_name_constraints(params.self_signed(&key).unwrap().der()), Some(true));
        assert_eq!(has_name_constraints(&[0x30, 0x03, 0x30, 0x01]), None);
    }

    #[test]
    fn reads_whether_self_issued_and_the_validity() {
        let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
        params.not_before = rcgen::date_time_ymd(2024, 2, 29);
        params.not_after = rcgen::date_time_ymd(2051, 1, 1);
        let key = rcgen::KeyPair::generate().unwrap();
        let der = params.self_signed(&key).unwrap().der().to_vec();
        // 2024-02-29 and 2051-01-01 (a GeneralizedTime past 2049), at midnight UTC.
        assert_eq!(self_issued_validity(&der), Some((true, (1_709_164_800, 2_556_143_999 + 1))));
        assert_eq!(time(0x17, b"700101000000Z"), Some(0));
        assert_eq!(time(0x17, b"491231235959Z"), Some(2_524_607_999));
        assert_eq!(time(0x17, b"700101000000+"), None);
        assert_eq!(time(0x18, b"19691231235959Z"), Some(-1));
        let issuer = rcgen::Issuer::new(params, key);
        let mut leaf = rcgen::CertificateParams::new(vec!["db".to_string()]).unwrap();
        leaf.distinguished_name = rcgen::DistinguishedName::new();
        leaf.distinguished_name.push(rcgen::DnType::CommonName, "db");
        let leaf = leaf.signed_by(&rcgen::KeyPair::generate().unwrap(), &issuer).unwrap();
        assert!(matches!(self_issued_validity(leaf.der()), Some((false, _))));
    }

    proptest! {
        #[test]
        fn never_panics_on_noise(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = common_name(&bytes);
            let _ = has_name_constraints(&bytes);
            let _ = self_issued_validity(&bytes);
        }

        #[test]
        fn never_panics_on_corrupted_certificates(pos in 0usize..400, byte in any::<u8>()) {
            let mut der = cert_with(&[(rcgen::DnType::CommonName, "u_scram")]);
            let i = pos % der.len();
            der[i] = byte;
            let _ = common_name(&der);
        }
    }
}
