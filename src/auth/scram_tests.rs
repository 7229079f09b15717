use super::ScramError::*;
use super::*;
use std::sync::OnceLock;

// RFC 7677 section 3.
const CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
const SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";
const SALT: &str = "W22ZaJ0SNY7soEsUEjb6gQ==";
const CLIENT_FIRST: &str = "n,,n=user,r=rOprNGfwEbeRWgbNEkqO";
const SERVER_FIRST: &str = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
const CLIENT_FINAL: &str = "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                            p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=";
const SERVER_FINAL: &str = "v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=";

fn salt() -> Vec<u8> {
    B64.decode(SALT).unwrap()
}

/// The RFC's verifier, derived once: PBKDF2 is slow in unoptimized test builds.
fn rfc_secret() -> ScramSecret {
    static SECRET: OnceLock<ScramSecret> = OnceLock::new();
    let derive = || ScramSecret::derive("pencil", &salt(), 4096);
    SECRET.get_or_init(derive).clone()
}

/// The RFC client's keys, derived once.
fn rfc_keys(_: &[u8], _: u32) -> Result<ClientKeys, ScramError> {
    static KEYS: OnceLock<ClientKeys> = OnceLock::new();
    let derive = || ClientKeys::derive("pencil", &salt(), 4096);
    Ok(KEYS.get_or_init(derive).clone())
}

fn password(password: &'static str) -> impl FnOnce(&[u8], u32) -> Result<ClientKeys, ScramError> {
    move |salt, iterations| Ok(ClientKeys::derive(password, salt, iterations))
}

fn rfc_server() -> ScramServer {
    ScramServer::new(rfc_secret(), SERVER_NONCE.to_owned())
}

fn rfc_client() -> ScramClient {
    ScramClient::with_user("user", CLIENT_NONCE.to_owned())
}

/// A server that has accepted the RFC's client-first.
fn server_after_first() -> ScramServer {
    let mut server = rfc_server();
    server.handle_client_first(CLIENT_FIRST.as_bytes()).unwrap();
    server
}

/// A client that has handled the RFC's server-first.
fn client_after_first() -> ScramClient {
    let mut client = rfc_client();
    client.handle_server_first(SERVER_FIRST.as_bytes(), rfc_keys).unwrap();
    client
}

fn client_first_err(msg: &str) -> ScramError {
    rfc_server().handle_client_first(msg.as_bytes()).unwrap_err()
}

fn client_final_err(msg: &str) -> ScramError {
    server_after_first().handle_client_final(msg.as_bytes()).unwrap_err()
}

/// The error for a bad server-first, checking that no keys were asked for.
fn server_first_err(msg: &str) -> ScramError {
    let mut called = false;
    let keys = |_: &[u8], _: u32| {
        called = true;
        rfc_keys(&[], 0)
    };
    let err = rfc_client().handle_server_first(msg.as_bytes(), keys).unwrap_err();
    assert!(!called, "{msg}");
    err
}

fn server_final(msg: &[u8]) -> Result<(), ScramError> {
    client_after_first().handle_server_final(msg)
}

/// Runs a whole exchange with random nonces; returns the ClientKey the server recovered.
fn round_trip(secret: ScramSecret, pw: &'static str) -> Result<[u8; 32], ScramError> {
    let mut client = ScramClient::new(nonce());
    let mut server = ScramServer::new(secret, nonce());
    let server_first = server.handle_client_first(&client.client_first())?;
    let client_final = client.handle_server_first(&server_first, password(pw))?;
    let (server_final, client_key) = server.handle_client_final(&client_final)?;
    client.handle_server_final(&server_final)?;
    Ok(client_key)
}

#[test]
fn rfc7677_client() {
    let mut client = rfc_client();
    assert_eq!(client.client_first(), CLIENT_FIRST.as_bytes());
    let client_final = client.handle_server_first(SERVER_FIRST.as_bytes(), password("pencil"));
    assert_eq!(client_final.unwrap(), CLIENT_FINAL.as_bytes());
    assert_eq!(client.handle_server_final(SERVER_FINAL.as_bytes()), Ok(()));
    assert_eq!(client.handle_server_final(SERVER_FINAL.as_bytes()), Err(State));
}

#[test]
fn rfc7677_server() {
    let mut server = rfc_server();
    let server_first = server.handle_client_first(CLIENT_FIRST.as_bytes()).unwrap();
    assert_eq!(server_first, SERVER_FIRST.as_bytes());
    let (server_final, key) = server.handle_client_final(CLIENT_FINAL.as_bytes()).unwrap();
    assert_eq!(server_final, SERVER_FINAL.as_bytes());
    assert_eq!(key, ClientKeys::derive("pencil", &salt(), 4096).client_key);
    assert_eq!(server.handle_client_final(CLIENT_FINAL.as_bytes()), Err(State));
}

#[test]
fn public_client_first_has_empty_user() {
    assert_eq!(ScramClient::new("abc".into()).client_first(), b"n,,n=,r=abc");
    let client = ScramClient::with_user("a=b,c", "x".into());
    assert_eq!(client.client_first(), b"n,,n=a=3Db=2Cc,r=x");
}

#[test]
fn round_trip_with_random_nonces() {
    let salt = b"some salt bytes!";
    let secret = ScramSecret::derive("correct horse", salt, 4096);
    let client_key = round_trip(secret.clone(), "correct horse").unwrap();
    assert_eq!(client_key, ClientKeys::derive("correct horse", salt, 4096).client_key);
    assert_eq!(round_trip(secret, "battery staple"), Err(InvalidProof));
}

#[test]
fn nonces_are_random_and_printable() {
    let (a, b) = (nonce(), nonce());
    assert_ne!(a, b);
    assert_eq!(a.len(), 24);
    assert!(valid_nonce(&a) && valid_nonce(&b));
}

#[test]
fn secret_display_parse_round_trip() {
    let secret = rfc_secret();
    let text = secret.to_string();
    assert_eq!(
        text,
        "SCRAM-SHA-256$4096:W22ZaJ0SNY7soEsUEjb6gQ==$\
         WG5d8oPm3OtcPnkdi4Uo7BkeZkBFzpcXkuLmtbsT4qY=:\
         wfPLwcE6nTWhTAmQ7tl2KeoiWGPlZqQxSrmfPwDl2dU="
    );
    assert_eq!(ScramSecret::parse(&text), Ok(secret));
}

#[test]
fn secret_parse_rejects_malformed() {
    let good = rfc_secret().to_string();
    let (head, keys) = good.rsplit_once('$').unwrap();
    let (stored, server) = keys.split_once(':').unwrap();
    let bad = [
        String::new(),
        "SCRAM-SHA-256".into(),
        "SCRAM-SHA-256$".into(),
        head.to_string(),
        format!("{head}${stored}"),
        format!("{head}${stored}:"),
        format!("{head}${stored}:{server}:"),
        format!("{head}${stored}:!!!!"),
        format!("{head}${stored}:{}", B64.encode([0u8; 31])),
        format!("{head}${stored}:{}", B64.encode([0u8; 33])),
        good.replace("$4096:", "$0:"),
        good.replace("$4096:", "$:"),
        good.replace("$4096:", "$+4096:"),
        good.replace("$4096:", "$10000001:"),
        good.replace("$4096:", "$99999999999999999999:"),
        good.replace("$4096:", "$4096"),
        good.replace(SALT, ""),
        good.replace(SALT, "W22ZaJ0SNY7soEsUEjb6g"),
        good.replace("SCRAM-SHA-256", "SCRAM-SHA-1"),
        format!("md5{good}"),
    ];
    for s in bad {
        assert_eq!(ScramSecret::parse(&s), Err(BadSecret), "{s:?}");
    }
}

#[test]
fn mock_secret() {
    let mock = ScramSecret::mock("alice", b"key", 4096);
    assert_eq!(mock, ScramSecret::mock("alice", b"key", 4096));
    assert_ne!(mock.salt, ScramSecret::mock("bob", b"key", 4096).salt);
    assert_ne!(mock.salt, ScramSecret::mock("alice", b"other key", 4096).salt);
    assert_eq!((mock.iterations, mock.salt.len()), (4096, 16));
    assert_eq!(ScramSecret::parse(&mock.to_string()), Ok(mock.clone()));
    for pw in ["", "alice", "key", "pencil"] {
        assert_eq!(round_trip(mock.clone(), pw), Err(InvalidProof));
    }
}

#[test]
fn server_accepts_y_header_and_checks_binding_attribute() {
    let first = CLIENT_FIRST.replacen('n', "y", 1);
    let mut server = rfc_server();
    server.handle_client_first(first.as_bytes()).unwrap();
    // The RFC proof was computed over "c=biws", so it no longer matches.
    let with_y = CLIENT_FINAL.replace("c=biws", "c=eSws");
    assert_eq!(server.handle_client_final(with_y.as_bytes()), Err(InvalidProof));

    let mut server = rfc_server();
    server.handle_client_first(first.as_bytes()).unwrap();
    let err = server.handle_client_final(CLIENT_FINAL.as_bytes());
    assert_eq!(err, Err(Malformed("channel binding does not match gs2 header")));
    assert_eq!(client_final_err(&with_y), Malformed("channel binding does not match gs2 header"));
}

#[test]
#[rustfmt::skip]
fn server_rejects_bad_client_first() {
    assert_eq!(client_first_err("p=tls-server-end-point,,n=,r=abc"), ChannelBinding);
    assert_eq!(client_first_err("x,,n=,r=abc"), Malformed("gs2 header"));
    assert_eq!(client_first_err("n,"), Malformed("gs2 header"));
    assert_eq!(client_first_err("n,a=bob,n=,r=abc"), Malformed("authorization identity is not supported"));
    assert_eq!(client_first_err("n,,m=ext,n=,r=abc"), Malformed("mandatory extension is not supported"));
    assert_eq!(client_first_err("n,,"), Malformed("username"));
    assert_eq!(client_first_err("n,,r=abc"), Malformed("username"));
    assert_eq!(client_first_err("n,,n="), Malformed("client nonce"));
    assert_eq!(client_first_err("n,,n=,r="), Malformed("client nonce"));
    assert_eq!(client_first_err("n,,n=,r=a b"), Malformed("client nonce"));
    assert_eq!(rfc_server().handle_client_first(b"n,,n=,r=\xff"), Err(Malformed("not UTF-8")));
}

#[test]
#[rustfmt::skip]
fn server_rejects_bad_client_final() {
    assert_eq!(client_final_err(&CLIENT_FINAL.replace("k0,", "k1,")), Nonce);
    assert_eq!(client_final_err(&CLIENT_FINAL.replace("p=dHzb", "p=")), Malformed("proof"));
    assert_eq!(client_final_err(&CLIENT_FINAL.replace("p=dHzb", "p=dHzc")), InvalidProof);
    assert_eq!(client_final_err("c=biws,r=rOprNGfwEbeRWgbNEkqO"), Malformed("missing proof"));
    assert_eq!(client_final_err("c=biws,p=AAAA"), Malformed("nonce"));
    assert_eq!(client_final_err("r=x,p=AAAA"), Malformed("channel binding"));
}

#[test]
#[rustfmt::skip]
fn client_rejects_bad_server_first() {
    const GOOD: &str = "rOprNGfwEbeRWgbNEkqOx,s=W22ZaJ0SNY7soEsUEjb6gQ==";
    assert_eq!(server_first_err(&format!("r=someoneelse,s={SALT},i=4096")), Nonce);
    assert_eq!(server_first_err(&format!("r={CLIENT_NONCE},s={SALT},i=4096")), Nonce);
    assert_eq!(server_first_err(&format!("r={GOOD},i=0")), Malformed("iteration count"));
    assert_eq!(server_first_err(&format!("r={GOOD},i=10000001")), Malformed("iteration count"));
    assert_eq!(server_first_err(&format!("r={GOOD},i=-1")), Malformed("iteration count"));
    assert_eq!(server_first_err(&format!("r={GOOD}")), Malformed("iteration count"));
    assert_eq!(server_first_err(&format!("r={CLIENT_NONCE}x,s=,i=1")), Malformed("salt"));
    assert_eq!(server_first_err(&format!("r={CLIENT_NONCE}x,s=***,i=1")), Malformed("salt"));
    assert_eq!(server_first_err(&format!("r={CLIENT_NONCE}x,i=1")), Malformed("salt"));
    assert_eq!(server_first_err(&format!("m=ext,r={GOOD},i=1")), Malformed("mandatory extension is not supported"));
    assert_eq!(server_first_err("e=other-error"), Malformed("server nonce"));
    let failing_keys = |_: &[u8], _: u32| Err(BadSecret);
    assert_eq!(rfc_client().handle_server_first(SERVER_FIRST.as_bytes(), failing_keys), Err(BadSecret));
}

#[test]
#[rustfmt::skip]
fn client_rejects_bad_server_final() {
    let wrong = format!("v={}", B64.encode([7u8; 32]));
    assert_eq!(server_final(b"e=invalid-proof"), Err(Server("invalid-proof".into())));
    assert_eq!(server_final(wrong.as_bytes()), Err(ServerSignature));
    assert_eq!(server_final(b"v=AAAA"), Err(Malformed("server signature")));
    assert_eq!(server_final(b""), Err(Malformed("server signature")));
    assert_eq!(server_final(b"x=1"), Err(Malformed("server signature")));
    assert_eq!(server_final(b"\xff"), Err(Malformed("not UTF-8")));
}

#[test]
fn out_of_order_calls() {
    assert_eq!(rfc_server().handle_client_final(CLIENT_FINAL.as_bytes()), Err(State));
    let again = server_after_first().handle_client_first(CLIENT_FIRST.as_bytes());
    assert_eq!(again, Err(State));
    // A failed step ends the exchange.
    let mut server = rfc_server();
    assert!(server.handle_client_first(b"garbage").is_err());
    assert_eq!(server.handle_client_first(CLIENT_FIRST.as_bytes()), Err(State));

    assert_eq!(rfc_client().handle_server_final(SERVER_FINAL.as_bytes()), Err(State));
    let again = client_after_first().handle_server_first(SERVER_FIRST.as_bytes(), rfc_keys);
    assert_eq!(again, Err(State));
}

/// Every truncation and many single-byte corruptions of a valid message.
fn damaged(msg: &str) -> Vec<Vec<u8>> {
    let bytes = msg.as_bytes();
    let mut out: Vec<Vec<u8>> = (0..bytes.len()).map(|n| bytes[..n].to_vec()).collect();
    for i in 0..bytes.len() {
        for b in [0u8, b',', b'=', b'p', b'r', b'v', 0xff, 0x80] {
            let mut v = bytes.to_vec();
            v[i] = b;
            out.push(v);
        }
    }
    out
}

/// Nothing may panic, and a damaged final message must never authenticate.
#[test]
fn damaged_messages_never_panic() {
    for msg in damaged(CLIENT_FIRST) {
        let _ = rfc_server().handle_client_first(&msg);
    }
    for msg in damaged(SERVER_FIRST) {
        let _ = rfc_client().handle_server_first(&msg, rfc_keys);
    }
    for msg in damaged(CLIENT_FINAL) {
        let result = server_after_first().handle_client_final(&msg);
        assert_eq!(result.is_ok(), msg == CLIENT_FINAL.as_bytes());
    }
    for msg in damaged(SERVER_FINAL) {
        assert_eq!(server_final(&msg).is_ok(), msg == SERVER_FINAL.as_bytes());
    }
}

/// SASLprep as PostgreSQL runs it: NFKC and the mappings; ASCII as it is; a password
/// it refuses (a control character) or maps to nothing used as it is.
#[test]
fn saslprep_as_postgresql_runs_it() {
    assert_eq!(&*sasl_prep("clave\u{ba}\u{b2}\u{a0}x"), b"claveo2 x");
    assert_eq!(&*sasl_prep("plain ascii\x07"), b"plain ascii\x07");
    assert_eq!(&*sasl_prep("a\u{7}\u{e9}"), "a\u{7}\u{e9}".as_bytes(), "refused: raw");
    assert_eq!(&*sasl_prep("\u{ad}"), "\u{ad}".as_bytes(), "mapped to nothing: raw");
}
