//! PgBouncer's `client_tls_ciphers` / `server_tls_ciphers` (the TLS 1.2 cipher suites a
//! side offers, in OpenSSL's syntax) and `client_tls_ecdhcurve` (the key exchange
//! groups), read into the rustls provider that side is built with. Every TLS 1.2 suite
//! rustls has is an ECDHE suite with an AEAD cipher, so the lists select among those
//! six; TLS 1.3's suites are not chosen by these settings (as in PgBouncer).

use rustls::crypto::{CryptoProvider, SupportedKxGroup, aws_lc_rs};
use rustls::{CipherSuite, SupportedCipherSuite};

/// The TLS 1.2 suites rustls offers, by their OpenSSL names.
const TLS12: [(CipherSuite, &str); 6] = [
    (CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384, "ECDHE-ECDSA-AES256-GCM-SHA384"),
    (CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, "ECDHE-ECDSA-AES128-GCM-SHA256"),
    (CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256, "ECDHE-ECDSA-CHACHA20-POLY1305"),
    (CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384, "ECDHE-RSA-AES256-GCM-SHA384"),
    (CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256, "ECDHE-RSA-AES128-GCM-SHA256"),
    (CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256, "ECDHE-RSA-CHACHA20-POLY1305"),
];

/// PgBouncer's (libtls') shortcuts: each allows every suite here, all of which are
/// among the "secure" ones.
const SHORTCUTS: [&str; 8] = ["default", "secure", "fast", "normal", "compat", "legacy", "insecure", "all"];

/// OpenSSL words that take in every suite here (all are ECDHE, AEAD, TLS 1.2, "HIGH").
const EVERY: [&str; 9] = ["ALL", "DEFAULT", "HIGH", "ECDHE", "EECDH", "kECDHE", "kEECDH", "AEAD", "TLSv1.2"];

/// Whether one part of an OpenSSL cipher string (a name or a word; `A+B` is split on
/// `+`) takes in the suite named `openssl` / `iana`. Words not known here take in
/// nothing, as OpenSSL skips unknown names (they may name suites rustls does not have,
/// such as `DHE-RSA-...`).
fn part_takes(part: &str, openssl: &str, iana: &str) -> bool {
    let within = |s: &str| openssl.contains(s);
    part.eq_ignore_ascii_case(openssl)
        || part.eq_ignore_ascii_case(iana)
        || EVERY.contains(&part)
        || match part {
            "AESGCM" => within("GCM"),
            "AES" | "AES128" | "AES256" | "CHACHA20" | "ECDSA" => within(part),
            "aECDSA" => within("ECDSA"),
            "RSA" | "aRSA" => within("-RSA-"),
            "SHA256" | "SHA384" => iana.ends_with(part),
            _ => false,
        }
}

/// Whether `token` (one element of the list, no prefix) takes in the suite.
fn takes(token: &str, openssl: &str, iana: &str) -> bool {
    token.split('+').all(|part| part_takes(part, openssl, iana))
}

/// The TLS 1.2 suites a `*_tls_ciphers` value allows, in rustls' order of preference:
/// one of PgBouncer's shortcuts (`default`, `secure`, `fast`, `normal`, `compat`,
/// `legacy`, `insecure`, `all`) or an OpenSSL cipher list (elements separated by `:`,
/// `,` or spaces: names, OpenSSL or IANA spelling; words such as `HIGH`, `ECDHE`,
/// `AESGCM`, `CHACHA20`, `aECDSA`, `aRSA`; `A+B` for both; `!X` or `-X` to leave out;
/// `+X` and `@...` are about order and strength levels and are skipped). Names of
/// suites rustls does not have are skipped, as OpenSSL skips unknown ones; a list that
/// leaves none of the six is an error.
pub fn tls12_suites(value: &str) -> Result<Vec<CipherSuite>, String> {
    let value = value.trim();
    if SHORTCUTS.iter().any(|s| s.eq_ignore_ascii_case(value)) {
        return Ok(TLS12.iter().map(|(s, _)| *s).collect());
    }
    let tokens: Vec<&str> = value.split([':', ',', ' ']).filter(|t| !t.is_empty()).collect();
    let chosen: Vec<CipherSuite> = TLS12
        .iter()
        .filter(|(suite, openssl)| {
            let iana = format!("{suite:?}");
            let wanted = tokens.iter().any(|t| !t.starts_with(['!', '-', '+', '@']) && takes(t, openssl, &iana));
            let dropped = tokens.iter().filter_map(|t| t.strip_prefix(['!', '-'])).any(|t| takes(t, openssl, &iana));
            wanted && !dropped
        })
        .map(|(s, _)| *s)
        .collect();
    if chosen.is_empty() {
        let names: Vec<&str> = TLS12.iter().map(|(_, n)| *n).collect();
        return Err(format!(
            "\"{value}\" allows none of the TLS 1.2 cipher suites Sluice has ({}), or a shortcut: {}",
            names.join(", "),
            SHORTCUTS.join(", ")
        ));
    }
    Ok(chosen)
}

/// The key exchange groups a `client_tls_ecdhcurve` value allows: `auto` (rustls'
/// defaults: X25519, P-256, P-384 and the X25519/ML-KEM hybrid), or curve names
/// separated by `:` or `,` (`prime256v1`/`secp256r1`/`P-256`, `secp384r1`/`P-384`,
/// `X25519`). `none` (PgBouncer: no ECDH) is refused: every suite here needs it.
pub fn kx_groups(value: &str) -> Result<Vec<&'static dyn SupportedKxGroup>, String> {
    use aws_lc_rs::kx_group::{SECP256R1, SECP384R1, X25519};
    let value = value.trim();
    if value.eq_ignore_ascii_case("auto") {
        return Ok(aws_lc_rs::DEFAULT_KX_GROUPS.to_vec());
    }
    if value.eq_ignore_ascii_case("none") {
        return Err("\"none\" is not supported: every TLS suite Sluice has uses ECDH key exchange".into());
    }
    let mut groups: Vec<&'static dyn SupportedKxGroup> = Vec::new();
    for name in value.split([':', ',']).map(str::trim).filter(|n| !n.is_empty()) {
        let group: &'static dyn SupportedKxGroup = match name.to_ascii_lowercase().as_str() {
            "prime256v1" | "secp256r1" | "p-256" => SECP256R1,
            "secp384r1" | "p-384" => SECP384R1,
            "x25519" => X25519,
            _ => return Err(format!("unknown curve \"{name}\"; use auto, prime256v1, secp384r1 or X25519")),
        };
        if !groups.iter().any(|g| g.name() == group.name()) {
            groups.push(group);
        }
    }
    if groups.is_empty() {
        return Err("names no curve; use auto, prime256v1, secp384r1 or X25519".into());
    }
    Ok(groups)
}

/// The aws-lc-rs provider with only `tls12` among its TLS 1.2 suites (TLS 1.3's all
/// kept) and `groups` as its key exchange groups.
pub fn provider(tls12: &[CipherSuite], groups: Vec<&'static dyn SupportedKxGroup>) -> CryptoProvider {
    let mut provider = aws_lc_rs::default_provider();
    let kept = |s: &SupportedCipherSuite| s.tls13().is_some() || tls12.contains(&s.suite());
    provider.cipher_suites.retain(kept);
    provider.kx_groups = groups;
    provider
}

#[cfg(test)]
mod tests {
    use super::*;
    use CipherSuite as S;

    fn names(value: &str) -> Vec<&'static str> {
        let chosen = tls12_suites(value).unwrap_or_else(|e| panic!("{value}: {e}"));
        TLS12.iter().filter(|(s, _)| chosen.contains(s)).map(|(_, n)| *n).collect()
    }

    #[test]
    fn shortcuts_and_broad_words_allow_every_suite() {
        for value in ["default", "Secure", "fast", "all", "HIGH:!aNULL:!MD5", "ALL", "ECDHE"] {
            assert_eq!(names(value).len(), 6, "{value}");
        }
    }

    #[test]
    fn lists_select_by_name_word_and_combination() {
        assert_eq!(names("ECDHE-ECDSA-AES128-GCM-SHA256"), ["ECDHE-ECDSA-AES128-GCM-SHA256"]);
        assert_eq!(names("TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256"), ["ECDHE-RSA-CHACHA20-POLY1305"]);
        // Mozilla's "intermediate" list names DHE suites rustls does not have: skipped.
        let mozilla = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:DHE-RSA-AES128-GCM-SHA256";
        assert_eq!(names(mozilla), ["ECDHE-ECDSA-AES128-GCM-SHA256", "ECDHE-RSA-AES128-GCM-SHA256"]);
        assert_eq!(names("ECDHE+AESGCM").len(), 4);
        assert_eq!(
            names("aECDSA+CHACHA20:aRSA+AES256"),
            ["ECDHE-ECDSA-CHACHA20-POLY1305", "ECDHE-RSA-AES256-GCM-SHA384"]
        );
        assert_eq!(names("HIGH:!CHACHA20:!aRSA"), ["ECDHE-ECDSA-AES256-GCM-SHA384", "ECDHE-ECDSA-AES128-GCM-SHA256"]);
        assert_eq!(names("HIGH:-SHA384:@STRENGTH").len(), 4);
    }

    #[test]
    fn a_list_allowing_nothing_here_is_an_error() {
        for value in ["DHE-RSA-AES256-GCM-SHA384", "RC4:3DES", "HIGH:!ECDHE", "", "no such thing"] {
            let e = tls12_suites(value).expect_err(value);
            assert!(e.contains("allows none of the TLS 1.2 cipher suites"), "{e}");
        }
    }

    #[test]
    fn curves() {
        let named = |v: &str| kx_groups(v).unwrap().iter().map(|g| g.name()).collect::<Vec<_>>();
        assert_eq!(kx_groups("auto").unwrap().len(), aws_lc_rs::DEFAULT_KX_GROUPS.len());
        assert_eq!(named("prime256v1"), [aws_lc_rs::kx_group::SECP256R1.name()]);
        assert_eq!(named("X25519:P-384:secp384r1").len(), 2);
        assert!(kx_groups("none").unwrap_err().contains("not supported"));
        assert!(kx_groups("brainpoolP256r1").unwrap_err().contains("unknown curve"));
    }

    #[test]
    fn the_provider_keeps_tls13_and_the_chosen_tls12_suites() {
        let p = provider(&[S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256], kx_groups("P-256").unwrap());
        let tls12: Vec<_> = p.cipher_suites.iter().filter(|s| s.tls13().is_none()).map(|s| s.suite()).collect();
        assert_eq!(tls12, [S::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256]);
        assert_eq!(p.cipher_suites.iter().filter(|s| s.tls13().is_some()).count(), 3);
        assert_eq!(p.kx_groups.len(), 1);
    }
}
