//! SCRAM-SHA-256 (RFC 5802, 7677) as PostgreSQL speaks it: verifying clients, logging in to servers.

use super::ct_eq;
use base64::Engine;
use base64::engine::general_purpose::STANDARD as B64;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

/// The SASL mechanism name PostgreSQL advertises in AuthenticationSASL.
pub const SCRAM_SHA_256: &str = "SCRAM-SHA-256";

/// The most PBKDF2 iterations accepted from a server or a stored secret: beyond this a
/// count is a denial of service rather than protection.
const MAX_ITERATIONS: u32 = 10_000_000;
/// Iteration count and salt length of the secrets Sluice invents (PostgreSQL's defaults).
pub const DEFAULT_ITERATIONS: u32 = 4096;
const SALT_LEN: usize = 16;
/// The channel-binding attribute values for the gs2 headers "n,," and "y,,".
const CBIND_N: &str = "biws";
const CBIND_Y: &str = "eSws";

type HmacSha256 = Hmac<Sha256>;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ScramError {
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("invalid SCRAM secret")]
    BadSecret,
    #[error("channel binding is not supported")]
    ChannelBinding,
    #[error("nonce mismatch")]
    Nonce,
    #[error("password authentication failed")]
    InvalidProof,
    #[error("server signature mismatch")]
    ServerSignature,
    #[error("the server accepted the login without its SCRAM signature (it has not proved it knows the password)")]
    Unfinished,
    #[error("server error: {0}")]
    Server(String),
    #[error("SCRAM exchange out of order")]
    State,
}

/// A SCRAM-SHA-256 verifier as PostgreSQL stores it in pg_authid.rolpassword:
/// `SCRAM-SHA-256$<iterations>:<base64 salt>$<base64 StoredKey>:<base64 ServerKey>`
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScramSecret {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl ScramSecret {
    /// Parses the rolpassword format; any deviation is `BadSecret`.
    pub fn parse(s: &str) -> Result<Self, ScramError> {
        let rest = s.strip_prefix(SCRAM_SHA_256).and_then(|r| r.strip_prefix('$')).ok_or(ScramError::BadSecret)?;
        let (params, keys) = rest.split_once('$').ok_or(ScramError::BadSecret)?;
        let (iterations, salt) = params.split_once(':').ok_or(ScramError::BadSecret)?;
        let (stored_key, server_key) = keys.split_once(':').ok_or(ScramError::BadSecret)?;
        let salt = B64.decode(salt).map_err(|_| ScramError::BadSecret)?;
        if salt.is_empty() {
            return Err(ScramError::BadSecret);
        }
        Ok(Self {
            iterations: parse_iterations(iterations).ok_or(ScramError::BadSecret)?,
            salt,
            stored_key: decode_key(stored_key).ok_or(ScramError::BadSecret)?,
            server_key: decode_key(server_key).ok_or(ScramError::BadSecret)?,
        })
    }

    /// The verifier PostgreSQL would store for `password` (SASLprep'd as PostgreSQL
    /// does: `sasl_prep`).
    pub fn derive(password: &str, salt: &[u8], iterations: u32) -> Self {
        let keys = ClientKeys::derive(password, salt, iterations);
        Self { iterations, salt: salt.to_vec(), stored_key: sha256(&keys.client_key), server_key: keys.server_key }
    }

    /// A secret for a user that does not exist: a salt derived deterministically from
    /// (user, mock_key) with HMAC so repeated attempts see the same salt (as PostgreSQL
    /// does), `iterations` (those of the real secrets: `Checks::mock`), and keys such
    /// that no proof can verify.
    ///
    /// The StoredKey is an HMAC output rather than the hash of any ClientKey, so a proof
    /// would need a SHA-256 preimage of it; the exchange runs the same computations as for
    /// a real user, so neither the messages nor the timing reveal that the user is missing.
    pub fn mock(user: &str, mock_key: &[u8], iterations: u32) -> Self {
        let derive = |label: &[u8]| hmac(mock_key, &[label, user.as_bytes()]);
        Self {
            iterations,
            salt: derive(b"sluice mock salt\0")[..SALT_LEN].to_vec(),
            stored_key: derive(b"sluice mock stored key\0"),
            server_key: derive(b"sluice mock server key\0"),
        }
    }
}

impl std::fmt::Display for ScramSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{SCRAM_SHA_256}${}:{}${}:{}",
            self.iterations,
            B64.encode(&self.salt),
            B64.encode(self.stored_key),
            B64.encode(self.server_key)
        )
    }
}

/// Keys Sluice needs to authenticate to a server as a client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientKeys {
    pub client_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl ClientKeys {
    /// SaltedPassword = PBKDF2-HMAC-SHA256(password, salt, iterations); ClientKey and
    /// ServerKey are HMACs of it (RFC 5802 section 3).
    pub fn derive(password: &str, salt: &[u8], iterations: u32) -> Self {
        let salted = pbkdf2::pbkdf2_hmac_array::<Sha256, 32>(&sasl_prep(password), salt, iterations);
        Self { client_key: hmac(&salted, &[b"Client Key"]), server_key: hmac(&salted, &[b"Server Key"]) }
    }
}

/// A random nonce: 18 random bytes, base64 encoded (printable, no ',').
pub fn nonce() -> String {
    let mut bytes = [0u8; 18];
    rand::RngCore::fill_bytes(&mut rand::thread_rng(), &mut bytes);
    B64.encode(bytes)
}

/// Sluice verifying a connecting client (the server role of SCRAM).
pub struct ScramServer {
    state: ServerState,
}

enum ServerState {
    Initial {
        secret: ScramSecret,
        server_nonce: String,
    },
    AwaitingFinal {
        secret: ScramSecret,
        /// The c= value the client must echo, fixed by its gs2 header.
        cbind: &'static str,
        nonce: String,
        /// client-first-message-bare "," server-first-message ","
        auth_prefix: String,
    },
    Done,
}

impl ScramServer {
    /// `server_nonce` must be printable ASCII without ',' (as [`nonce`] returns).
    pub fn new(secret: ScramSecret, server_nonce: String) -> Self {
        Self { state: ServerState::Initial { secret, server_nonce } }
    }

    /// Input: the client-first-message (the data of SASLInitialResponse). Output:
    /// server-first-message. Accepts gs2 headers "n,," and "y,,", rejects "p=..." with
    /// `ChannelBinding`; the username attribute is ignored (PostgreSQL takes the user from
    /// the startup packet and libpq sends "n=,").
    pub fn handle_client_first(&mut self, data: &[u8]) -> Result<Vec<u8>, ScramError> {
        let ServerState::Initial { secret, server_nonce } = std::mem::replace(&mut self.state, ServerState::Done)
        else {
            return Err(ScramError::State);
        };
        let (cbind, bare) = parse_gs2_header(utf8(data)?)?;
        let client_nonce = parse_client_first_bare(bare)?;
        let nonce = format!("{client_nonce}{server_nonce}");
        let server_first = format!("r={nonce},s={},i={}", B64.encode(&secret.salt), secret.iterations);
        let auth_prefix = format!("{bare},{server_first},");
        self.state = ServerState::AwaitingFinal { secret, cbind, nonce, auth_prefix };
        Ok(server_first.into_bytes())
    }

    /// Input: client-final-message. Checks that the channel-binding attribute matches the
    /// gs2 header, the nonce, and the proof (constant-time compare of H(ClientKey) with
    /// StoredKey). Output: server-final-message and the ClientKey recovered from the proof.
    pub fn handle_client_final(&mut self, data: &[u8]) -> Result<(Vec<u8>, [u8; 32]), ScramError> {
        let ServerState::AwaitingFinal { secret, cbind, nonce, auth_prefix } =
            std::mem::replace(&mut self.state, ServerState::Done)
        else {
            return Err(ScramError::State);
        };
        let msg = utf8(data)?;
        let (without_proof, proof) = msg.rsplit_once(",p=").ok_or(ScramError::Malformed("missing proof"))?;
        let mut parts = without_proof.split(',');
        if attr(parts.next(), 'c', "channel binding")? != cbind {
            return Err(ScramError::Malformed("channel binding does not match gs2 header"));
        }
        if attr(parts.next(), 'r', "nonce")? != nonce {
            return Err(ScramError::Nonce);
        }
        let proof = decode_key(proof).ok_or(ScramError::Malformed("proof"))?;
        let auth: [&[u8]; 2] = [auth_prefix.as_bytes(), without_proof.as_bytes()];
        let client_key = xor(proof, hmac(&secret.stored_key, &auth));
        if !ct_eq(&sha256(&client_key), &secret.stored_key) {
            return Err(ScramError::InvalidProof);
        }
        let server_final = format!("v={}", B64.encode(hmac(&secret.server_key, &auth)));
        Ok((server_final.into_bytes(), client_key))
    }
}

/// Sluice logging in to PostgreSQL (the client role of SCRAM).
pub struct ScramClient {
    nonce: String,
    /// Sent in client-first-message; always empty outside tests (PostgreSQL ignores it).
    user: String,
    state: ClientState,
}

enum ClientState {
    Initial,
    AwaitingFinal { server_signature: [u8; 32] },
    Done,
}

impl ScramClient {
    /// `client_nonce` must be printable ASCII without ',' (as [`nonce`] returns).
    pub fn new(client_nonce: String) -> Self {
        Self { nonce: client_nonce, user: String::new(), state: ClientState::Initial }
    }

    /// A client that names `user` in its first message, as the RFC examples do.
    #[cfg(test)]
    fn with_user(user: &str, client_nonce: String) -> Self {
        Self { user: user.to_owned(), ..Self::new(client_nonce) }
    }

    fn first_bare(&self) -> String {
        let user = self.user.replace('=', "=3D").replace(',', "=2C");
        format!("n={user},r={}", self.nonce)
    }

    /// client-first-message: `n,,n=,r=<nonce>`
    pub fn client_first(&self) -> Vec<u8> {
        format!("n,,{}", self.first_bare()).into_bytes()
    }

    /// The salt and iteration count of a server-first-message, read without taking it
    /// (the keys are derived from them before `handle_server_first`).
    pub fn server_first_params(&self, data: &[u8]) -> Result<(Vec<u8>, u32), ScramError> {
        let (_, salt, iterations) = parse_server_first(utf8(data)?, &self.nonce)?;
        Ok((salt, iterations))
    }

    /// Given server-first-message, returns client-final-message. `keys` is called with
    /// (salt, iterations) from the server so the caller can cache PBKDF2 results or supply
    /// keys recovered elsewhere. Rejects a server nonce that does not extend the client
    /// nonce, and iteration counts of 0 or above the bound.
    pub fn handle_server_first(
        &mut self,
        data: &[u8],
        keys: impl FnOnce(&[u8], u32) -> Result<ClientKeys, ScramError>,
    ) -> Result<Vec<u8>, ScramError> {
        if !matches!(std::mem::replace(&mut self.state, ClientState::Done), ClientState::Initial) {
            return Err(ScramError::State);
        }
        let server_first = utf8(data)?;
        let (nonce, salt, iterations) = parse_server_first(server_first, &self.nonce)?;
        let keys = keys(&salt, iterations)?;
        let without_proof = format!("c={CBIND_N},r={nonce}");
        let bare = self.first_bare();
        let auth: [&[u8]; 5] = [bare.as_bytes(), b",", server_first.as_bytes(), b",", without_proof.as_bytes()];
        let stored_key = sha256(&keys.client_key);
        let proof = xor(keys.client_key, hmac(&stored_key, &auth));
        let server_signature = hmac(&keys.server_key, &auth);
        self.state = ClientState::AwaitingFinal { server_signature };
        Ok(format!("{without_proof},p={}", B64.encode(proof)).into_bytes())
    }

    /// Whether the exchange is over: the server's signature checked (or the server's
    /// error read).
    pub fn is_done(&self) -> bool {
        matches!(self.state, ClientState::Done)
    }

    /// Verifies "v=..." (constant time); "e=..." gives `ScramError::Server(text)`.
    pub fn handle_server_final(&mut self, data: &[u8]) -> Result<(), ScramError> {
        let ClientState::AwaitingFinal { server_signature } = std::mem::replace(&mut self.state, ClientState::Done)
        else {
            return Err(ScramError::State);
        };
        let first = utf8(data)?.split(',').next();
        if let Some(text) = first.and_then(|f| f.strip_prefix("e=")) {
            return Err(ScramError::Server(text.to_owned()));
        }
        let signature =
            decode_key(attr(first, 'v', "server signature")?).ok_or(ScramError::Malformed("server signature"))?;
        if !ct_eq(&signature, &server_signature) {
            return Err(ScramError::ServerSignature);
        }
        Ok(())
    }
}

/// Splits `gs2-cbind-flag,[authzid],bare` into the c= value the client must later send
/// and the client-first-message-bare.
fn parse_gs2_header(msg: &str) -> Result<(&'static str, &str), ScramError> {
    let mut parts = msg.splitn(3, ',');
    let cbind = match parts.next() {
        Some("n") => CBIND_N,
        Some("y") => CBIND_Y,
        Some(flag) if flag.starts_with("p=") => return Err(ScramError::ChannelBinding),
        _ => return Err(ScramError::Malformed("gs2 header")),
    };
    match parts.next() {
        Some("") => {}
        Some(a) if a.starts_with("a=") => {
            return Err(ScramError::Malformed("authorization identity is not supported"));
        }
        _ => return Err(ScramError::Malformed("gs2 header")),
    }
    let bare = parts.next().ok_or(ScramError::Malformed("gs2 header"))?;
    Ok((cbind, bare))
}

/// The client nonce from `n=<user>,r=<nonce>[,extensions]`; the user is ignored.
fn parse_client_first_bare(bare: &str) -> Result<&str, ScramError> {
    let mut parts = bare.split(',');
    let user = parts.next();
    if user.is_some_and(|u| u.starts_with("m=")) {
        return Err(ScramError::Malformed("mandatory extension is not supported"));
    }
    attr(user, 'n', "username")?;
    let nonce = attr(parts.next(), 'r', "client nonce")?;
    if !valid_nonce(nonce) {
        return Err(ScramError::Malformed("client nonce"));
    }
    Ok(nonce)
}

/// (nonce, salt, iterations) from `r=<nonce>,s=<salt>,i=<iterations>[,extensions]`.
fn parse_server_first<'a>(msg: &'a str, client_nonce: &str) -> Result<(&'a str, Vec<u8>, u32), ScramError> {
    let mut parts = msg.split(',');
    let first = parts.next();
    if first.is_some_and(|p| p.starts_with("m=")) {
        return Err(ScramError::Malformed("mandatory extension is not supported"));
    }
    let nonce = attr(first, 'r', "server nonce")?;
    if !valid_nonce(nonce) || nonce.len() <= client_nonce.len() || !nonce.starts_with(client_nonce) {
        return Err(ScramError::Nonce);
    }
    let salt = B64.decode(attr(parts.next(), 's', "salt")?).map_err(|_| ScramError::Malformed("salt"))?;
    if salt.is_empty() {
        return Err(ScramError::Malformed("salt"));
    }
    let iterations = parse_iterations(attr(parts.next(), 'i', "iteration count")?)
        .ok_or(ScramError::Malformed("iteration count"))?;
    Ok((nonce, salt, iterations))
}

/// The value of attribute `name` in `part` ("name=value"), or `Malformed(what)`.
fn attr<'a>(part: Option<&'a str>, name: char, what: &'static str) -> Result<&'a str, ScramError> {
    part.and_then(|p| p.strip_prefix(name)).and_then(|p| p.strip_prefix('=')).ok_or(ScramError::Malformed(what))
}

/// RFC 5802 nonces: printable ASCII except ','.
fn valid_nonce(nonce: &str) -> bool {
    !nonce.is_empty() && nonce.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',')
}

/// Plain decimal digits in 1..=MAX_ITERATIONS.
fn parse_iterations(s: &str) -> Option<u32> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok().filter(|i| (1..=MAX_ITERATIONS).contains(i))
}

fn decode_key(s: &str) -> Option<[u8; 32]> {
    B64.decode(s).ok()?.try_into().ok()
}

fn utf8(data: &[u8]) -> Result<&str, ScramError> {
    std::str::from_utf8(data).map_err(|_| ScramError::Malformed("not UTF-8"))
}

/// SASLprep (RFC 4013) of a password, as PostgreSQL (`pg_saslprep`) and libpq run it
/// before hashing: non-ASCII spaces mapped to a space, soft hyphens and the like dropped,
/// NFKC normalization (`º²` becomes `o2`); a password SASLprep refuses (prohibited or
/// unassigned characters, bidirectional text mixed wrongly) is used as it is, as
/// PostgreSQL falls back to the raw bytes.
fn sasl_prep(password: &str) -> std::borrow::Cow<'_, [u8]> {
    use std::borrow::Cow;
    // (ASCII is its own SASLprep, or refused for a control character: as it is.)
    if password.is_ascii() {
        return Cow::Borrowed(password.as_bytes());
    }
    match stringprep::saslprep(password) {
        // (Mapped to nothing at all: PostgreSQL refuses an empty result, so raw.)
        Ok(p) if p.is_empty() => Cow::Borrowed(password.as_bytes()),
        Ok(Cow::Borrowed(p)) => Cow::Borrowed(p.as_bytes()),
        Ok(Cow::Owned(p)) => Cow::Owned(p.into_bytes()),
        Err(_) => Cow::Borrowed(password.as_bytes()),
    }
}

fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut mac = HmacSha256::new_from_slice(key).expect("HMAC accepts keys of any length");
    for part in parts {
        mac.update(part);
    }
    mac.finalize().into_bytes().into()
}

impl ScramSecret {
    /// Whether `client_key` is this secret's ClientKey (its hash is the StoredKey).
    pub fn owns_client_key(&self, client_key: &[u8; 32]) -> bool {
        ct_eq(&sha256(client_key), &self.stored_key)
    }
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

fn xor(mut a: [u8; 32], b: [u8; 32]) -> [u8; 32] {
    a.iter_mut().zip(b).for_each(|(x, y)| *x ^= y);
    a
}

#[cfg(test)]
#[path = "scram_tests.rs"]
mod tests;
