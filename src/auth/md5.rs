//! PostgreSQL's legacy MD5 password scheme: stored hashes, salted responses, verification.

use super::ct_eq;
use ::md5::{Digest, Md5};

/// "md5" + hex(md5(password || user)), the format PostgreSQL stores.
pub fn password_hash(user: &str, password: &str) -> String {
    md5_hex(&[password.as_bytes(), user.as_bytes()])
}

/// Whether a configured secret is an md5 hash ("md5" + 32 lowercase hex).
pub fn is_md5_hash(s: &str) -> bool {
    s.strip_prefix("md5")
        .is_some_and(|hex| hex.len() == 32 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

/// The response to an AuthenticationMD5Password challenge: "md5" +
/// hex(md5(hex_part_of_hash || salt)), where hash is the "md5..." stored hash. A `hash`
/// without the "md5" prefix is used whole.
pub fn salted_response(hash: &str, salt: [u8; 4]) -> String {
    let hex = hash.strip_prefix("md5").unwrap_or(hash);
    md5_hex(&[hex.as_bytes(), &salt])
}

/// Constant-time check of a client's response against the stored hash. `response` is the
/// PasswordMessage's string without its terminating NUL; a `hash` that is not an md5 hash
/// verifies nothing.
pub fn verify(hash: &str, salt: [u8; 4], response: &[u8]) -> bool {
    is_md5_hash(hash) && ct_eq(salted_response(hash, salt).as_bytes(), response)
}

/// "md5" followed by the lowercase hex MD5 of the concatenated parts.
fn md5_hex(parts: &[&[u8]]) -> String {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let mut md5 = Md5::new();
    for part in parts {
        md5.update(part);
    }
    let mut out = String::with_capacity(35);
    out.push_str("md5");
    for byte in md5.finalize() {
        out.push(char::from(HEX[usize::from(byte >> 4)]));
        out.push(char::from(HEX[usize::from(byte & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `printf 'secretpostgres' | md5sum`
    const SECRET_POSTGRES: &str = "md553f48b7c4b76a86ce72276c5755f217d";

    #[test]
    fn password_hash_matches_md5sum() {
        assert_eq!(password_hash("postgres", "secret"), SECRET_POSTGRES);
        // `printf 'md5user' | md5sum`: password "md5", user "user".
        assert_eq!(password_hash("user", "md5"), "md5f4b96c24785053ec563b3db27eb2ed13");
    }

    #[test]
    fn recognizes_md5_hashes() {
        assert!(is_md5_hash(SECRET_POSTGRES));
        assert!(is_md5_hash(&password_hash("", "")));
        assert!(!is_md5_hash(&SECRET_POSTGRES.to_uppercase()));
        assert!(!is_md5_hash(&SECRET_POSTGRES.replace('d', "D")));
        assert!(!is_md5_hash(&SECRET_POSTGRES[..34]));
        assert!(!is_md5_hash(&format!("{SECRET_POSTGRES}0")));
        assert!(!is_md5_hash(&SECRET_POSTGRES.replace('5', "g")));
        assert!(!is_md5_hash(&SECRET_POSTGRES[3..]));
        assert!(!is_md5_hash("md5"));
        assert!(!is_md5_hash(""));
        assert!(!is_md5_hash("SCRAM-SHA-256$4096:c2FsdA==$AAAA:AAAA"));
        assert!(!is_md5_hash("md5é0123456789abcdef0123456789abc"));
    }

    #[test]
    fn salted_response_round_trip() {
        let salt = [0x01, 0x02, 0x03, 0x04];
        let response = salted_response(SECRET_POSTGRES, salt);
        assert!(is_md5_hash(&response));
        // `printf '53f48b7c4b76a86ce72276c5755f217d\x01\x02\x03\x04' | md5sum`
        assert_eq!(response, "md5bb41a296aab6baccb36ff243a562abff");
        assert!(verify(SECRET_POSTGRES, salt, response.as_bytes()));
        assert_ne!(salted_response(SECRET_POSTGRES, [0; 4]), response);
    }

    #[test]
    fn verify_rejects_wrong_responses() {
        let salt = [9, 8, 7, 6];
        let good = salted_response(SECRET_POSTGRES, salt);
        let other_user = password_hash("alice", "secret");
        assert!(!verify(SECRET_POSTGRES, [9, 8, 7, 5], good.as_bytes()));
        assert!(!verify(&other_user, salt, good.as_bytes()));
        assert!(!verify(SECRET_POSTGRES, salt, salted_response(&other_user, salt).as_bytes()));
        assert!(!verify(SECRET_POSTGRES, salt, good.to_uppercase().as_bytes()));
        assert!(!verify(SECRET_POSTGRES, salt, b""));
        assert!(!verify(SECRET_POSTGRES, salt, &good.as_bytes()[..34]));
        assert!(!verify(SECRET_POSTGRES, salt, format!("{good}\0").as_bytes()));
        assert!(!verify(SECRET_POSTGRES, salt, SECRET_POSTGRES.as_bytes()));
        for i in 0..good.len() {
            let mut bad = good.clone().into_bytes();
            bad[i] ^= 1;
            assert!(!verify(SECRET_POSTGRES, salt, &bad));
        }
    }

    #[test]
    fn verify_needs_an_md5_hash() {
        let salt = [1, 1, 1, 1];
        let plaintext = "secret";
        assert!(!verify(plaintext, salt, salted_response(plaintext, salt).as_bytes()));
        assert!(!verify("", salt, salted_response("", salt).as_bytes()));
    }
}
