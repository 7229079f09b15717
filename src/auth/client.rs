//! Sluice checking a connecting client: trust, md5, SCRAM-SHA-256, a clear-text
//! password, the TLS client certificate or the Unix socket peer's OS user. Unknown users
//! go through the same exchange with a mock secret, so they fail the same way, at the
//! same step, after the same delay as a wrong password.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite};

use super::scram::{self, ScramError, ScramSecret, ScramServer};
use super::{Secret, UserAuth, ct_eq, md5};
use crate::net::{ReadError, read_message};
use crate::protocol::{body, build, fe, read_cstr, read_i32, sqlstate};

/// How a client proves who it is: the `auth_type`, or under `auth_type = "hba"` the
/// `auth_hba_file` line that fits its login.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Trust,
    Md5,
    /// The password in clear text (`auth_type = "plain"`, `password` lines).
    Password,
    ScramSha256,
    Cert,
    /// The Unix socket peer's OS user name must be the user's (`local` lines).
    Peer,
    /// No check at all, whoever the client says it is (`auth_type = "any"`, where each
    /// database logs in as its own user).
    Any,
    /// The password in clear text, checked by PAM (`auth_type = "pam"`).
    Pam,
}

/// Why a client login failed; each maps to the FATAL the client receives.
#[derive(Debug, thiserror::Error)]
pub enum AuthFailure {
    #[error("password authentication failed for user \"{0}\"")]
    BadPassword(String),
    /// A clear-text password of no bytes, refused before any check (PostgreSQL's rule,
    /// which keeps an empty password away from PAM, whose stack may let it in).
    #[error("empty password returned by client")]
    EmptyPassword,
    /// A user with no SCRAM verifier (an md5 hash, or no password) logging in with
    /// SCRAM: told what a wrong password is told; `why` is for the log.
    #[error("password authentication failed for user \"{user}\"")]
    NoScramSecret { user: String, why: &'static str },
    #[error("no such user: \"{0}\"")]
    NoUser(String),
    #[error("certificate authentication failed for user \"{0}\"")]
    CertMismatch(String),
    #[error("connection requires a valid client certificate")]
    NoCertificate,
    #[error("Peer authentication failed for user \"{0}\"")]
    PeerMismatch(String),
    /// PAM refused the password or the account (`why`, PAM's message, is for the log).
    #[error("password authentication failed for user \"{user}\"")]
    PamDenied { user: String, why: String },
    /// Sluice could not run the check (its reason is for the log only).
    #[error("internal error during authentication")]
    Internal(String),
    #[error("{0}")]
    Protocol(String),
    #[error("client closed the connection during authentication")]
    Closed,
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

impl AuthFailure {
    pub fn sqlstate(&self) -> &'static str {
        match self {
            AuthFailure::BadPassword(_)
            | AuthFailure::EmptyPassword
            | AuthFailure::NoScramSecret { .. }
            | AuthFailure::PamDenied { .. } => sqlstate::INVALID_PASSWORD,
            AuthFailure::NoUser(_)
            | AuthFailure::CertMismatch(_)
            | AuthFailure::NoCertificate
            | AuthFailure::PeerMismatch(_) => sqlstate::INVALID_AUTHORIZATION,
            AuthFailure::Internal(_) => sqlstate::INTERNAL_ERROR,
            _ => sqlstate::PROTOCOL_VIOLATION,
        }
    }

    /// What the log says beyond the client's error, if anything.
    pub fn detail(&self) -> Option<&str> {
        match self {
            AuthFailure::NoScramSecret { why, .. } => Some(why),
            AuthFailure::PamDenied { why, .. } | AuthFailure::Internal(why) => Some(why),
            _ => None,
        }
    }
}

impl From<ReadError> for AuthFailure {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Closed => AuthFailure::Closed,
            ReadError::Io(e) => AuthFailure::Io(e),
            ReadError::Protocol(p) => AuthFailure::Protocol(p.to_string()),
        }
    }
}

/// What a successful login proved.
#[derive(Debug, Default)]
pub struct Proven {
    /// The ClientKey recovered from a SCRAM proof (for SCRAM pass-through).
    pub client_key: Option<[u8; 32]>,
    /// The password PAM accepted (`auth_type = "pam"`): the server login is made with
    /// it (`lookup::adopt_pam`).
    pub pam_password: Option<Hidden>,
    /// Messages the login reply must start with (SCRAM's SASLFinal): not sent here, so
    /// the whole reply leaves in one write.
    pub greeting: BytesMut,
}

/// A password, kept out of Debug output.
pub struct Hidden(pub Vec<u8>);

impl std::fmt::Debug for Hidden {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Hidden")
    }
}

/// Where `auth_type = "pam"` checks a password: the service, the directory of service
/// files (None: the system's), and the client's address (PAM_RHOST) over TCP.
#[derive(Debug, Clone, Copy)]
pub struct PamPlace<'a> {
    pub service: &'a str,
    pub config_dir: Option<&'a str>,
    pub host: Option<std::net::IpAddr>,
}

/// What the connection itself shows of the client.
#[derive(Debug, Default, Clone, Copy)]
pub struct Shown<'a> {
    /// The common name of the client's verified TLS certificate, if it presented one.
    pub cert_name: Option<&'a str>,
    /// On the Unix socket, the name of the peer process's OS user.
    pub os_user: Option<&'a str>,
    /// Which of those names may log in as which users (`map=`); without one, a name
    /// logs in as itself only.
    pub map: Option<crate::config::ident::UserMap<'a>>,
    /// Where PAM checks the password (`Method::Pam`).
    pub pam: Option<PamPlace<'a>>,
}

/// What every login is checked with: the key unknown users' mock secrets derive from,
/// and the bound on clear-text logins deriving SCRAM keys at once.
#[derive(Debug)]
pub struct Checks {
    pub mock_key: [u8; 32],
    /// Permits for PBKDF2 runs of clear-text logins (each on a blocking thread, so the
    /// runtime's threads keep serving clients; bounded, as anyone who can connect can
    /// make one run). A run holds its permit to its end, even when its login is gone.
    derivations: std::sync::Arc<tokio::sync::Semaphore>,
    /// libpam, loaded at the first PAM login.
    pam: std::sync::OnceLock<Result<std::sync::Arc<super::pam::Pam>, String>>,
    /// Permits for PAM checks (on blocking threads too, bounded the same way).
    pam_checks: std::sync::Arc<tokio::sync::Semaphore>,
    /// The highest iteration count of the real SCRAM secrets logins used, which unknown
    /// users' mock secrets show (a fixed 4096 would tell them apart from real users
    /// whose secrets were made with another count, as PostgreSQL's `scram_iterations`;
    /// the highest, not the last, so an unknown user's count does not move with other
    /// users' logins).
    mock_iterations: std::sync::atomic::AtomicU32,
}

/// PBKDF2 runs of clear-text logins at once (`Checks`).
const DERIVATIONS_AT_ONCE: usize = 2;

/// PAM checks at once (`Checks`): one, as PgBouncer runs them (not every PAM module is
/// safe to run on two threads at once).
const PAM_CHECKS_AT_ONCE: usize = 1;

impl Checks {
    pub fn new(mock_key: [u8; 32]) -> Self {
        let derivations = std::sync::Arc::new(tokio::sync::Semaphore::new(DERIVATIONS_AT_ONCE));
        let pam_checks = std::sync::Arc::new(tokio::sync::Semaphore::new(PAM_CHECKS_AT_ONCE));
        let mock_iterations = scram::DEFAULT_ITERATIONS.into();
        Checks { mock_key, derivations, pam: std::sync::OnceLock::new(), pam_checks, mock_iterations }
    }

    /// The mock secret of a user with none (`ScramSecret::mock`).
    fn mock(&self, user: &str) -> ScramSecret {
        ScramSecret::mock(user, &self.mock_key, self.mock_iterations.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// A login used a real SCRAM secret: mock secrets show at least its iteration count
    /// from now on.
    fn seen(&self, secret: &ScramSecret) {
        self.mock_iterations.fetch_max(secret.iterations, std::sync::atomic::Ordering::Relaxed);
    }

    /// Checks `user`'s `password` with PAM at `place`, on a blocking thread once a
    /// permit is free.
    async fn pam(&self, place: PamPlace<'_>, user: &str, password: &[u8]) -> Result<(), AuthFailure> {
        let pam = self.pam.get_or_init(|| super::pam::Pam::load().map(std::sync::Arc::new));
        let pam = pam.clone().map_err(AuthFailure::Internal)?;
        let (service, dir) = (place.service.to_string(), place.config_dir.map(str::to_string));
        let (user, password, host) = (user.to_string(), password.to_vec(), place.host.map(|h| h.to_string()));
        let check = move || {
            let config_dir = dir.as_deref();
            let ask = super::pam::Ask { service: &service, config_dir, user: &user, password: &password, host };
            pam.check(&ask).map_err(|r| (r, user))
        };
        match blocking(&self.pam_checks, check).await? {
            Ok(()) => Ok(()),
            Err((super::pam::Refusal::Denied(why), user)) => Err(AuthFailure::PamDenied { user, why }),
            Err((super::pam::Refusal::Failed(why), _)) => Err(AuthFailure::Internal(why)),
        }
    }

    /// The SCRAM keys `password` derives with `secret`'s salt and iterations, on a
    /// blocking thread, once a permit is free.
    async fn derive(&self, password: &[u8], secret: &ScramSecret) -> Result<super::scram::ClientKeys, AuthFailure> {
        let password = String::from_utf8_lossy(password).into_owned();
        let (salt, iterations) = (secret.salt.clone(), secret.iterations);
        blocking(&self.derivations, move || super::scram::ClientKeys::derive(&password, &salt, iterations)).await
    }
}

/// Runs `work` on a blocking thread once one of `permits` is free; the permit is held
/// to the work's end, even when the login waiting for it is gone.
async fn blocking<T: Send + 'static>(
    permits: &std::sync::Arc<tokio::sync::Semaphore>,
    work: impl FnOnce() -> T + Send + 'static,
) -> Result<T, AuthFailure> {
    let internal = |e: &dyn std::fmt::Display| AuthFailure::Internal(e.to_string());
    let permit = permits.clone().acquire_owned().await.map_err(|e| internal(&e))?;
    let work = move || {
        let _permit = permit;
        work()
    };
    tokio::task::spawn_blocking(work).await.map_err(|e| internal(&e))
}

/// Runs the authentication exchange. Sends neither SCRAM's last message nor
/// AuthenticationOk: the caller batches them (`Proven::greeting`) with the rest of the
/// login reply.
pub async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    method: Method,
    name: &str,
    user: Option<&UserAuth>,
    checks: &Checks,
    shown: Shown<'_>,
) -> Result<Proven, AuthFailure> {
    // Who the connection shows the client to be, where the method asks (cert, peer).
    let map = shown.map;
    let shown_as = |seen: Option<&str>, mismatch: fn(String) -> AuthFailure, missing| match (seen, user) {
        (None, _) => Err(missing),
        (Some(n), _) if !map.map_or(n == name, |m| m.allows(n, name)) => Err(mismatch(name.to_string())),
        (Some(_), None) => Err(AuthFailure::NoUser(name.to_string())),
        (Some(_), Some(_)) => Ok(Proven::default()),
    };
    match method {
        Method::Cert => shown_as(shown.cert_name, AuthFailure::CertMismatch, AuthFailure::NoCertificate),
        Method::Peer => shown_as(shown.os_user, AuthFailure::PeerMismatch, AuthFailure::PeerMismatch(name.to_string())),
        Method::Any => Ok(Proven::default()),
        Method::Trust => match user {
            Some(_) => Ok(Proven::default()),
            None => Err(AuthFailure::NoUser(name.to_string())),
        },
        // A SCRAM secret cannot check an md5 response: that user does SCRAM instead, as
        // in PgBouncer and PostgreSQL.
        Method::Md5 if user.is_some_and(|u| matches!(u.secret, Some(Secret::Scram(_)))) => {
            scram_login(stream, buf, name, user, checks).await
        }
        Method::Md5 => md5_exchange(stream, buf, name, user).await,
        Method::ScramSha256 => scram_login(stream, buf, name, user, checks).await,
        Method::Password => password_exchange(stream, buf, name, user, checks).await,
        Method::Pam => pam_exchange(stream, buf, name, checks, shown.pam).await,
    }
}

/// The password in clear text, checked by PAM: the user need not be listed (PAM knows
/// who may log in), and the password PAM accepted is given back for the server login.
/// PAM's own failure delays are skipped (`pam::Pam::check`); `auth_failure_delay` is
/// Sluice's.
async fn pam_exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    name: &str,
    checks: &Checks,
    place: Option<PamPlace<'_>>,
) -> Result<Proven, AuthFailure> {
    let place = place.ok_or_else(|| AuthFailure::Internal("no PAM service given".into()))?;
    let password = clear_password(stream, buf).await?;
    checks.pam(place, name, &password).await?;
    Ok(Proven { pam_password: Some(Hidden(password)), ..Proven::default() })
}

/// Asks for the password in clear text and reads it; an empty one is refused, as
/// PostgreSQL refuses it.
async fn clear_password<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
) -> Result<Vec<u8>, AuthFailure> {
    let mut out = BytesMut::new();
    build::auth_cleartext(&mut out);
    crate::net::send(stream, &out).await?;
    let frame = read_password(stream, buf).await?;
    match read_cstr(body(&frame)) {
        Some(([], [])) => Err(AuthFailure::EmptyPassword),
        Some((p, [])) => Ok(p.to_vec()),
        _ => Err(AuthFailure::Protocol("malformed password message".into())),
    }
}

/// The password in clear text, checked against whatever the user's password is: equal
/// to a plain one, hashing to an md5 one, or deriving a SCRAM secret's StoredKey (PBKDF2
/// per login, as PostgreSQL runs it for `password` lines; its ClientKey then serves the
/// server login by pass-through). Every refusal (a wrong password of any kind, an
/// unknown user, one without a password, a password that is not UTF-8) comes after
/// PBKDF2 (against a mock secret where the user has no SCRAM one), so it takes as long
/// whether the user exists or not.
async fn password_exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    name: &str,
    user: Option<&UserAuth>,
    checks: &Checks,
) -> Result<Proven, AuthFailure> {
    let password = &clear_password(stream, buf).await?[..];
    let secret = match (user.and_then(|u| u.secret.as_ref()), std::str::from_utf8(password)) {
        (Some(Secret::Plain(p)), Ok(given)) if ct_eq(p.as_bytes(), given.as_bytes()) => return Ok(Proven::default()),
        (Some(Secret::Md5(h)), Ok(given)) if ct_eq(h.as_bytes(), md5::password_hash(name, given).as_bytes()) => {
            return Ok(Proven::default());
        }
        (Some(Secret::Scram(secret)), Ok(_)) => Some(secret),
        _ => None,
    };
    if let Some(secret) = secret {
        checks.seen(secret);
    }
    let mock = checks.mock(name);
    let keys = checks.derive(password, secret.unwrap_or(&mock)).await?;
    match secret {
        Some(secret) if secret.owns_client_key(&keys.client_key) => {
            Ok(Proven { client_key: Some(keys.client_key), ..Proven::default() })
        }
        _ => Err(AuthFailure::BadPassword(name.to_string())),
    }
}

/// A SCRAM login; an unknown user (or one with no SCRAM verifier: an md5 hash from the
/// `auth_file`, no password) is run through the exchange against a mock secret and
/// refused at its end, like a wrong password.
async fn scram_login<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    name: &str,
    user: Option<&UserAuth>,
    checks: &Checks,
) -> Result<Proven, AuthFailure> {
    let Some(secret) = user.and_then(|u| u.scram_secret()).cloned() else {
        // A mock secret: refused at the end of the exchange, whatever the proof.
        return match scram_exchange(stream, buf, name, checks.mock(name)).await {
            Ok(_) | Err(AuthFailure::BadPassword(_)) => Err(unverifiable(name, user)),
            Err(e) => Err(e),
        };
    };
    checks.seen(&secret);
    let (key, greeting) = scram_exchange(stream, buf, name, secret).await?;
    Ok(Proven { client_key: Some(key), greeting, ..Proven::default() })
}

/// Why a user without a SCRAM verifier (`scram_login`) is refused.
fn unverifiable(name: &str, user: Option<&UserAuth>) -> AuthFailure {
    let user_name = name.to_string();
    match user.map(|u| &u.secret) {
        None => AuthFailure::BadPassword(user_name),
        Some(Some(Secret::Md5(_))) => {
            AuthFailure::NoScramSecret { user: user_name, why: "its password is an md5 hash, which cannot check SCRAM" }
        }
        Some(_) => AuthFailure::NoScramSecret { user: user_name, why: "it has no password" },
    }
}

async fn md5_exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    name: &str,
    user: Option<&UserAuth>,
) -> Result<Proven, AuthFailure> {
    let salt: [u8; 4] = rand::random();
    let mut out = BytesMut::new();
    build::auth_md5(&mut out, salt);
    crate::net::send(stream, &out).await?;
    let frame = read_password(stream, buf).await?;
    let response = read_cstr(body(&frame))
        .map(|(r, _)| r)
        .ok_or_else(|| AuthFailure::Protocol("malformed password message".into()))?;
    // Unknown users are checked against a hash no response can match.
    let hash = user.and_then(|u| u.md5_hash()).unwrap_or_else(|| md5::password_hash(name, &scram::nonce()));
    if user.is_some() && md5::verify(&hash, salt, response) {
        Ok(Proven::default())
    } else {
        Err(AuthFailure::BadPassword(name.to_string()))
    }
}

/// The SCRAM exchange up to the client's proof; gives the ClientKey and the server's
/// final message (unsent).
async fn scram_exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    name: &str,
    secret: ScramSecret,
) -> Result<([u8; 32], BytesMut), AuthFailure> {
    let mut out = BytesMut::new();
    build::auth_sasl(&mut out, &[scram::SCRAM_SHA_256]);
    crate::net::send(stream, &out).await?;

    let frame = read_password(stream, buf).await?;
    let bad = || AuthFailure::Protocol("malformed SASLInitialResponse".into());
    let (mechanism, rest) = read_cstr(body(&frame)).ok_or_else(bad)?;
    if mechanism != scram::SCRAM_SHA_256.as_bytes() {
        return Err(AuthFailure::Protocol("client selected an invalid SASL authentication mechanism".into()));
    }
    let (len, data) = read_i32(rest).ok_or_else(bad)?;
    if len < 0 || len as usize != data.len() {
        return Err(bad());
    }
    let mut server = ScramServer::new(secret, scram::nonce());
    let first = server.handle_client_first(data).map_err(|e| scram_failure(e, name))?;
    out.clear();
    build::auth_sasl_continue(&mut out, &first);
    crate::net::send(stream, &out).await?;

    let frame = read_password(stream, buf).await?;
    let (last, client_key) = server.handle_client_final(body(&frame)).map_err(|e| scram_failure(e, name))?;
    out.clear();
    build::auth_sasl_final(&mut out, &last);
    Ok((client_key, out))
}

fn scram_failure(e: ScramError, name: &str) -> AuthFailure {
    match e {
        ScramError::InvalidProof => AuthFailure::BadPassword(name.to_string()),
        other => AuthFailure::Protocol(other.to_string()),
    }
}

async fn read_password<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut BytesMut) -> Result<BytesMut, AuthFailure> {
    let frame = read_message(stream, buf).await?;
    // A client leaving (it had no password to give, say) is not a failed login: no
    // warning, no `auth_failure_delay`, as for one that just closes its socket.
    if frame[0] == fe::TERMINATE {
        return Err(AuthFailure::Closed);
    }
    if frame[0] != fe::PASSWORD {
        return Err(AuthFailure::Protocol(format!(
            "expected password response, got message type '{}'",
            char::from(frame[0])
        )));
    }
    Ok(frame)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::scram::{ClientKeys, ScramClient};
    use tokio::io::DuplexStream;

    /// The next message the server sent: its type and body.
    async fn read(s: &mut DuplexStream, buf: &mut BytesMut) -> (u8, Vec<u8>) {
        let frame = read_message(s, buf).await.unwrap();
        (frame[0], body(&frame).to_vec())
    }

    /// The client's side of a SCRAM login with a wrong password: what it was told (the
    /// AuthenticationSASL message, the salt and the iteration count).
    async fn wrong_password(mut client: DuplexStream) -> (Vec<u8>, Vec<u8>, u32) {
        let (mut buf, mut out) = (BytesMut::new(), BytesMut::new());
        let (tag, sasl) = read(&mut client, &mut buf).await;
        assert_eq!(tag, b'R');
        let mut scram = ScramClient::new(scram::nonce());
        build::sasl_initial_response(&mut out, scram::SCRAM_SHA_256, &scram.client_first());
        crate::net::send(&mut client, &out).await.unwrap();
        let (tag, cont) = read(&mut client, &mut buf).await;
        assert_eq!(tag, b'R');
        let (salt, iterations) = scram.server_first_params(&cont[4..]).unwrap();
        let last = scram.handle_server_first(&cont[4..], |s, i| Ok(ClientKeys::derive("guess", s, i))).unwrap();
        out.clear();
        build::sasl_response(&mut out, &last);
        crate::net::send(&mut client, &out).await.unwrap();
        (sasl, salt, iterations)
    }

    /// What a client sees of a SCRAM login of `name` with the wrong password, and the
    /// error it is refused with.
    async fn seen(name: &str, user: Option<&UserAuth>) -> ((Vec<u8>, Vec<u8>, u32), String, &'static str) {
        let (client, mut server) = tokio::io::duplex(1 << 16);
        let client = tokio::spawn(wrong_password(client));
        let mut buf = BytesMut::new();
        let checks = Checks::new(*b"a fixed mock key for these tests");
        let refused = authenticate(&mut server, &mut buf, Method::ScramSha256, name, user, &checks, Shown::default());
        let e = refused.await.expect_err("a wrong password");
        let told = tokio::time::timeout(std::time::Duration::from_secs(10), client)
            .await
            .expect("the exchange ran to its end")
            .unwrap();
        (told, e.to_string(), e.sqlstate())
    }

    /// A user whose password cannot check SCRAM (an md5 hash from the auth_file, or no
    /// password) goes through the same exchange as an unknown user of that name, with
    /// the same salt and iterations, and is refused with the same error.
    #[tokio::test]
    async fn a_user_without_a_scram_verifier_looks_like_an_unknown_one() {
        let unknown = seen("old", None).await;
        assert_eq!(unknown.2, sqlstate::INVALID_PASSWORD);
        let md5 = UserAuth::new("old", Some(&md5::password_hash("old", "p")), None).unwrap();
        assert_eq!(seen("old", Some(&md5)).await, unknown);
        let none = UserAuth::new("old", None, None).unwrap();
        assert_eq!(seen("old", Some(&none)).await, unknown);
    }

    /// An unknown user's mock secret shows the iteration count of the real secrets in
    /// use (PostgreSQL's `scram_iterations` may be other than 4096), so the count does
    /// not tell real users from unknown ones.
    #[tokio::test]
    async fn an_unknown_users_iterations_are_those_of_real_secrets() {
        let checks = Checks::new(*b"a fixed mock key for these tests");
        let told = |name: &'static str, user: Option<UserAuth>| {
            let checks = &checks;
            async move {
                let (client, mut server) = tokio::io::duplex(1 << 16);
                let client = tokio::spawn(wrong_password(client));
                let mut buf = BytesMut::new();
                let refused = authenticate(
                    &mut server,
                    &mut buf,
                    Method::ScramSha256,
                    name,
                    user.as_ref(),
                    checks,
                    Shown::default(),
                );
                assert!(refused.await.is_err());
                client.await.unwrap().2
            }
        };
        assert_eq!(told("nobody", None).await, 4096);
        let secret = ScramSecret::derive("p", b"0123456789abcdef", 8192).to_string();
        let real = UserAuth::new("real", Some(&secret), None).unwrap();
        assert_eq!(told("real", Some(real)).await, 8192);
        assert_eq!(told("nobody", None).await, 8192);
    }

    /// A clear-text password of no bytes is refused before any check, as PostgreSQL
    /// refuses it: here a PAM stack that lets everyone in (pam_permit) would take it.
    #[tokio::test]
    async fn an_empty_clear_text_password_is_refused_before_pam_sees_it() {
        let dir = tempfile::tempdir().unwrap();
        let everyone = "auth required pam_permit.so\naccount required pam_permit.so\n";
        std::fs::write(dir.path().join("sluice-permit"), everyone).unwrap();
        let checks = Checks::new(*b"a fixed mock key for these tests");
        let config_dir = dir.path().to_str();
        let place = PamPlace { service: "sluice-permit", config_dir, host: None };
        for (password, method) in [(&b"any"[..], Method::Pam), (b"", Method::Pam), (b"", Method::Password)] {
            let (mut client, mut server) = tokio::io::duplex(1 << 16);
            let mut out = BytesMut::new();
            build::password(&mut out, password);
            crate::net::send(&mut client, &out).await.unwrap();
            let shown = Shown { pam: Some(place), ..Shown::default() };
            let user = UserAuth::new("alice", Some("p"), None).unwrap();
            let got =
                authenticate(&mut server, &mut BytesMut::new(), method, "alice", Some(&user), &checks, shown).await;
            match password {
                b"" => {
                    let e = got.expect_err("an empty password let in");
                    assert_eq!((e.to_string().as_str(), e.sqlstate()), ("empty password returned by client", "28P01"));
                }
                _ => assert!(got.is_ok(), "{got:?}"),
            }
        }
    }
}
