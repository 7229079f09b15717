//! Authentication: SCRAM-SHA-256 and MD5 in both directions, and the per-user
//! credential store built from the config (with cached key derivations, so no login
//! runs PBKDF2 once the keys are known).

pub mod client;
pub mod found;
pub mod md5;
pub mod pam;
pub mod query;
pub mod scram;

use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use found::FoundUsers;
use scram::{ClientKeys, ScramError, ScramSecret};

/// Compares secrets in constant time (for equal lengths).
pub(crate) fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    a.len() == b.len() && std::hint::black_box(diff) == 0
}

/// Iterations used when Sluice derives a SCRAM secret from a plain password.
pub const SCRAM_ITERATIONS: u32 = 4096;

/// What a user's `password` key holds.
#[derive(Clone, Debug, PartialEq)]
pub enum Secret {
    Plain(String),
    Md5(String),
    Scram(ScramSecret),
}

impl Secret {
    pub fn parse(s: &str) -> Result<Secret, ScramError> {
        if s.starts_with("SCRAM-SHA-256$") {
            return ScramSecret::parse(s).map(Secret::Scram);
        }
        if md5::is_md5_hash(s) {
            return Ok(Secret::Md5(s.to_string()));
        }
        Ok(Secret::Plain(s.to_string()))
    }
}

/// A user as clients authenticate against it.
#[derive(Debug)]
pub struct UserAuth {
    pub name: String,
    pub secret: Option<Secret>,
    /// The SCRAM verifier clients are checked against: parsed from the config, or
    /// derived once from a plain password with a random salt.
    scram: OnceLock<ScramSecret>,
    /// How Sluice logs in to PostgreSQL as this user.
    pub server: Arc<ServerLogin>,
}

impl UserAuth {
    pub fn new(name: &str, password: Option<&str>, server_password: Option<&str>) -> Result<Self, ScramError> {
        let secret = password.map(Secret::parse).transpose()?;
        let server = match (server_password, &secret) {
            (Some(p), _) => ServerLogin::from_secret(Secret::parse(p)?),
            (None, Some(s)) => ServerLogin::from_secret(s.clone()),
            (None, None) => ServerLogin::none(),
        };
        Ok(UserAuth { name: name.to_string(), secret, scram: OnceLock::new(), server: Arc::new(server) })
    }

    /// A user an `auth_query` lookup found, with the password it gave: clients are
    /// checked against it, and Sluice logs in to the server with it (an md5 hash as one,
    /// a SCRAM secret by pass-through of the key a client proves).
    pub fn found(name: &str, secret: Option<Secret>) -> Self {
        let server = secret.clone().map_or_else(ServerLogin::none, ServerLogin::from_secret);
        UserAuth { name: name.to_string(), secret, scram: OnceLock::new(), server: Arc::new(server) }
    }

    /// The verifier for SCRAM client authentication, if this user can do SCRAM.
    pub fn scram_secret(&self) -> Option<&ScramSecret> {
        match &self.secret {
            Some(Secret::Scram(s)) => Some(self.scram.get_or_init(|| s.clone())),
            Some(Secret::Plain(p)) => Some(self.scram.get_or_init(|| {
                let salt: [u8; 16] = rand::random();
                ScramSecret::derive(p, &salt, SCRAM_ITERATIONS)
            })),
            _ => None,
        }
    }

    /// The md5 hash clients' md5 responses are checked against.
    pub fn md5_hash(&self) -> Option<String> {
        match &self.secret {
            Some(Secret::Plain(p)) => Some(md5::password_hash(&self.name, p)),
            Some(Secret::Md5(h)) => Some(h.clone()),
            _ => None,
        }
    }
}

/// Credentials for logging in to a server, with the derived SCRAM keys cached per
/// (salt, iterations) so each new server connection skips PBKDF2.
#[derive(Debug, Default)]
pub struct ServerLogin {
    pub password: Option<String>,
    pub md5: Option<String>,
    /// A SCRAM secret only: Sluice can log in by reusing the ClientKey a client proved
    /// (SCRAM pass-through), provided the server holds the same secret.
    pub scram: Option<ScramSecret>,
    passthrough_key: Mutex<Option<[u8; 32]>>,
    /// Keys for the (salt, iterations) servers announced, newest last: a role's secret
    /// on a server has one of each, so a few entries serve a user whose databases live
    /// on different servers. Shared with the blocking thread that derives them, which
    /// stores its result even if the connect that asked for it gave up meanwhile.
    cache: Arc<Mutex<Vec<DerivedKeys>>>,
    /// PBKDF2 derivations run (tests check that concurrent connects share one).
    derivations: Arc<std::sync::atomic::AtomicU32>,
}

/// SCRAM keys for a (salt, iterations), derived or being derived.
type DerivedKeys = (Vec<u8>, u32, Derivation);

#[derive(Debug, Clone)]
enum Derivation {
    Ready(ClientKeys),
    /// On a blocking thread: connects that need the same keys meanwhile wait for it
    /// rather than each running PBKDF2 (a pool opening many connections at once).
    Running(tokio::sync::watch::Receiver<Option<ClientKeys>>),
}

/// Entries `ServerLogin` keeps (distinct servers one user logs in to with SCRAM).
const SERVER_KEYS_KEPT: usize = 4;

/// SCRAM iteration counts derived in place (PostgreSQL's default is 4096).
const INLINE_ITERATIONS: u32 = 16_384;

impl ServerLogin {
    pub fn none() -> Self {
        Self::default()
    }

    pub fn from_secret(s: Secret) -> Self {
        match s {
            Secret::Plain(p) => ServerLogin { password: Some(p), ..Self::default() },
            Secret::Md5(h) => ServerLogin { md5: Some(h), ..Self::default() },
            Secret::Scram(s) => ServerLogin { scram: Some(s), ..Self::default() },
        }
    }

    pub fn plain(password: &str) -> Self {
        ServerLogin { password: Some(password.to_string()), ..Self::default() }
    }

    /// Whether `other` logs in with the same credentials (a reload that rebuilt it can
    /// keep this one, with its cached keys).
    pub fn same_credentials(&self, other: &ServerLogin) -> bool {
        (&self.password, &self.md5, &self.scram) == (&other.password, &other.md5, &other.scram)
    }

    /// Remembers the ClientKey recovered from a client's SCRAM proof, if it is this
    /// login's secret's (a client may have proved another password: the user's
    /// `password` and `server_password` can differ).
    pub fn learn_client_key(&self, key: [u8; 32]) {
        if self.scram.as_ref().is_some_and(|s| s.owns_client_key(&key)) {
            *self.passthrough_key.lock() = Some(key);
        }
    }

    /// SCRAM keys for the salt and iteration count a server announced. PBKDF2, when
    /// the keys are not cached, runs in place for PostgreSQL's usual counts (a few
    /// milliseconds, once per salt), and on a blocking thread for larger ones: the server
    /// chooses the count (up to millions), and the runtime's threads serve every client.
    /// (Not always on a thread: once a process has a second thread, glibc wraps every
    /// `recv` and `send` in cancellation bookkeeping, +2% of the relay's instructions.)
    pub async fn scram_keys(&self, salt: &[u8], iterations: u32) -> Result<ClientKeys, LoginError> {
        if let Some(p) = &self.password {
            // A derivation to wait for (running on a thread), or none: derived here.
            let running = {
                let mut cache = self.cache.lock();
                match cache.iter().find(|(s, i, _)| s == salt && *i == iterations).map(|c| c.2.clone()) {
                    Some(Derivation::Ready(keys)) => return Ok(keys),
                    Some(Derivation::Running(rx)) => Some(rx),
                    None if iterations <= INLINE_ITERATIONS => None,
                    None => Some(self.start_derivation(&mut cache, p, salt, iterations)),
                }
            };
            let Some(mut rx) = running else {
                let keys = derive(&self.derivations, p, salt, iterations);
                remember(&mut self.cache.lock(), salt, iterations, Derivation::Ready(keys.clone()));
                return Ok(keys);
            };
            return match rx.wait_for(Option::is_some).await {
                Ok(keys) => Ok(keys.clone().expect("waited for Some")),
                // The thread died (PBKDF2 does not panic; a runtime shutting down): the
                // next connect derives again.
                Err(_) => {
                    self.cache.lock().retain(|(s, i, _)| (s.as_slice(), *i) != (salt, iterations));
                    Err(LoginError::Derivation)
                }
            };
        }
        let secret = self.scram.as_ref().ok_or(LoginError::NoPassword("SCRAM"))?;
        if secret.salt != salt || secret.iterations != iterations {
            return Err(LoginError::SecretMismatch);
        }
        let client_key = (*self.passthrough_key.lock()).ok_or(LoginError::NoClientKey)?;
        Ok(ClientKeys { client_key, server_key: secret.server_key })
    }

    /// Starts deriving keys on a blocking thread, entered in `cache` (locked by the
    /// caller) as running; the thread enters its result, and tells those waiting.
    fn start_derivation(
        &self,
        cache: &mut Vec<DerivedKeys>,
        password: &str,
        salt: &[u8],
        iterations: u32,
    ) -> tokio::sync::watch::Receiver<Option<ClientKeys>> {
        let (tx, rx) = tokio::sync::watch::channel(None);
        remember(cache, salt, iterations, Derivation::Running(rx.clone()));
        let (p, salt, cache, count) =
            (password.to_string(), salt.to_vec(), self.cache.clone(), self.derivations.clone());
        tokio::task::spawn_blocking(move || {
            let keys = derive(&count, &p, &salt, iterations);
            remember(&mut cache.lock(), &salt, iterations, Derivation::Ready(keys.clone()));
            let _ = tx.send(Some(keys));
        });
        rx
    }

    /// The response to an md5 challenge.
    pub fn md5_response(&self, user: &str, salt: [u8; 4]) -> Result<String, LoginError> {
        let hash = match (&self.password, &self.md5) {
            (Some(p), _) => md5::password_hash(user, p),
            (None, Some(h)) => h.clone(),
            _ => return Err(LoginError::NoPassword("md5")),
        };
        Ok(md5::salted_response(&hash, salt))
    }
}

/// PBKDF2 for the SCRAM keys, counted.
fn derive(count: &std::sync::atomic::AtomicU32, password: &str, salt: &[u8], iterations: u32) -> ClientKeys {
    count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    ClientKeys::derive(password, salt, iterations)
}

/// Enters keys for (salt, iterations) in place of any earlier entry, the oldest entry
/// going when `SERVER_KEYS_KEPT` are kept.
fn remember(cache: &mut Vec<DerivedKeys>, salt: &[u8], iterations: u32, d: Derivation) {
    cache.retain(|(s, i, _)| (s.as_slice(), *i) != (salt, iterations));
    if cache.len() == SERVER_KEYS_KEPT {
        cache.remove(0);
    }
    cache.push((salt.to_vec(), iterations, d));
}

/// Why Sluice cannot answer a server's authentication request.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LoginError {
    #[error("no password configured for {0} authentication to the server")]
    NoPassword(&'static str),
    #[error("the configured SCRAM secret does not match the server's (different salt or iterations)")]
    SecretMismatch,
    #[error("SCRAM pass-through needs a client to log in with SCRAM first")]
    NoClientKey,
    #[error("deriving the SCRAM keys failed")]
    Derivation,
}

/// All users by name, rebuilt on reload, and the users `auth_query` lookups found,
/// kept across reloads.
#[derive(Debug, Default)]
pub struct UserStore {
    pub users: foldhash::HashMap<String, Arc<UserAuth>>,
    found: Arc<FoundUsers>,
}

impl UserStore {
    pub fn from_config(cfg: &crate::config::Config) -> Result<Self, ScramError> {
        let mut users = foldhash::HashMap::default();
        for (name, u) in &cfg.users {
            let auth = UserAuth::new(name, u.password.as_deref(), u.server_password.as_deref())?;
            users.insert(name.clone(), Arc::new(auth));
        }
        Ok(UserStore { users, found: Default::default() })
    }

    /// Carries cached derivations over from the previous store for unchanged users, so
    /// a reload does not force PBKDF2 again: the whole user when nothing changed, its
    /// server login when only the client's secret did (the pools keep using that login
    /// object, `Pool::update`, and the ClientKeys clients prove reach it).
    pub fn inherit(&mut self, old: &UserStore) {
        self.found = old.found.clone();
        for (name, user) in self.users.iter_mut() {
            let Some(prev) = old.users.get(name) else { continue };
            if !prev.server.same_credentials(&user.server) {
                continue;
            }
            if format!("{:?}", prev.secret) == format!("{:?}", user.secret) {
                *user = prev.clone();
            } else {
                Arc::get_mut(user).expect("a store being built is its users' only owner").server = prev.server.clone();
            }
        }
    }

    pub fn get(&self, name: &str) -> Option<&Arc<UserAuth>> {
        self.users.get(name)
    }

    /// The user `name` as clients of `database` log in: the config's, else the one a
    /// lookup found or PAM let in (`finds_users`). Under `auth_type = "pam"` the one PAM
    /// let in comes first, unless the config's sets `server_password` (`pam_logs_in`).
    pub fn find(&self, cfg: &crate::config::Config, database: &str, name: &str) -> Option<Arc<UserAuth>> {
        let found = || finds_users(cfg, database).then(|| self.found.get(database, name)).flatten();
        match self.users.get(name) {
            Some(u) if pam_logs_in(cfg, name) || looked_up_though_listed(cfg, database, u) => {
                found().or_else(|| Some(u.clone()))
            }
            Some(u) => Some(u.clone()),
            None => found(),
        }
    }

    /// The users lookups found (`found::FoundUsers`).
    pub fn found(&self) -> &FoundUsers {
        &self.found
    }

    /// The names of the users lookups found (or PAM let in) in databases that still
    /// find users.
    pub fn found_names(&self, cfg: &crate::config::Config) -> Vec<String> {
        self.found.names(|db| finds_users(cfg, db))
    }
}

/// Whether a client PAM lets in as `user` logs in to the server with the password it
/// gave PAM: under `auth_type = "pam"`, unless the user's entry sets `server_password`.
pub fn pam_logs_in(cfg: &crate::config::Config, user: &str) -> bool {
    cfg.general.auth_type == crate::config::AuthType::Pam
        && cfg.users.get(user).is_none_or(|u| u.server_password.is_none())
}

/// Whether the clients of `database` may log in as users the config does not list:
/// the database has lookups (`auth_user`), or PAM checks every login.
/// Whether a user the config lists has its password looked up (`auth_query`) in
/// `database`, as PgBouncer looks up a `[users]` entry that `auth_file` gives no
/// password: it has none of its own, nor a `server_password`, and the database has
/// lookups. (Found, it logs in to the server as the lookup found it; its `[users]`
/// settings hold.)
pub fn looked_up_though_listed(cfg: &crate::config::Config, database: &str, u: &UserAuth) -> bool {
    u.secret.is_none()
        && cfg.users.get(&u.name).is_none_or(|c| c.server_password.is_none())
        && query::lookup_for(cfg, database).is_some()
}

pub fn finds_users(cfg: &crate::config::Config, database: &str) -> bool {
    cfg.general.auth_type == crate::config::AuthType::Pam || query::lookup_for(cfg, database).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_classified() {
        assert!(matches!(Secret::parse("hunter2").unwrap(), Secret::Plain(_)));
        let h = md5::password_hash("u", "p");
        assert!(matches!(Secret::parse(&h).unwrap(), Secret::Md5(_)));
        let s = ScramSecret::derive("p", b"0123456789abcdef", 4096).to_string();
        assert!(matches!(Secret::parse(&s).unwrap(), Secret::Scram(_)));
        assert!(Secret::parse("SCRAM-SHA-256$broken").is_err());
    }

    #[test]
    fn plain_password_derives_scram_once() {
        let u = UserAuth::new("u", Some("pw"), None).unwrap();
        let a = u.scram_secret().unwrap().clone();
        let b = u.scram_secret().unwrap().clone();
        assert_eq!(a, b);
        assert_eq!(a, ScramSecret::derive("pw", &a.salt, a.iterations));
        assert_eq!(u.md5_hash().unwrap(), md5::password_hash("u", "pw"));
    }

    #[tokio::test]
    async fn server_login_caches_and_passes_through() {
        let l = ServerLogin::plain("pw");
        let k1 = l.scram_keys(b"salt", 4096).await.unwrap();
        assert_eq!(k1, l.scram_keys(b"salt", 4096).await.unwrap());
        assert_eq!(k1, ClientKeys::derive("pw", b"salt", 4096));
        // Other servers' salts are kept beside it, up to a bound, the oldest going first.
        for n in 0..SERVER_KEYS_KEPT {
            let salt = format!("pepper{n}");
            assert_eq!(l.scram_keys(salt.as_bytes(), 2).await.unwrap(), ClientKeys::derive("pw", salt.as_bytes(), 2));
        }
        let many = INLINE_ITERATIONS + 1;
        assert_eq!(l.scram_keys(b"pepper0", many).await.unwrap(), ClientKeys::derive("pw", b"pepper0", many));
        let kept: Vec<Vec<u8>> = l.cache.lock().iter().map(|(s, _, _)| s.clone()).collect();
        assert_eq!(l.derivations.load(std::sync::atomic::Ordering::Relaxed), 2 + SERVER_KEYS_KEPT as u32);
        assert_eq!(kept.len(), SERVER_KEYS_KEPT);
        assert!(!kept.contains(&b"salt".to_vec()) && kept.contains(&b"pepper0".to_vec()));

        let secret = ScramSecret::derive("pw", b"salt", 4096);
        let p = ServerLogin::from_secret(Secret::Scram(secret.clone()));
        assert_eq!(p.scram_keys(b"salt", 4096).await, Err(LoginError::NoClientKey));
        // A ClientKey of another password is not taken.
        p.learn_client_key(ClientKeys::derive("other", b"salt", 4096).client_key);
        assert_eq!(p.scram_keys(b"salt", 4096).await, Err(LoginError::NoClientKey));
        p.learn_client_key(k1.client_key);
        assert_eq!(p.scram_keys(b"salt", 4096).await.unwrap(), k1);
        assert_eq!(p.scram_keys(b"other", 4096).await, Err(LoginError::SecretMismatch));
        assert_eq!(p.md5_response("u", [0; 4]), Err(LoginError::NoPassword("md5")));
    }

    /// A reload keeps a user's server login (with the keys it derived and the ClientKey
    /// clients proved) while its credentials stay, also when the client's password
    /// changed; a new server password builds a new one.
    #[test]
    fn a_reload_keeps_the_server_login_while_its_credentials_stay() {
        let store = |users: &[(&str, &str, &str)]| UserStore {
            users: users
                .iter()
                .map(|(n, p, sp)| (n.to_string(), Arc::new(UserAuth::new(n, Some(p), Some(sp)).unwrap())))
                .collect(),
            found: Default::default(),
        };
        let old = store(&[("same", "a", "x"), ("client", "a", "x"), ("server", "a", "x")]);
        let mut new = store(&[("same", "a", "x"), ("client", "b", "x"), ("server", "a", "y")]);
        new.inherit(&old);
        let kept = |n: &str| Arc::ptr_eq(&new.get(n).unwrap().server, &old.get(n).unwrap().server);
        assert!(Arc::ptr_eq(new.get("same").unwrap(), old.get("same").unwrap()));
        assert!(kept("client") && !kept("server"));
        assert_eq!(format!("{:?}", new.get("client").unwrap().secret), format!("{:?}", Secret::parse("b").ok()));
    }

    /// Connects that need keys derived on a blocking thread share one derivation, also
    /// when the connect that started it gave up (its result is still kept).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_connects_share_one_derivation() {
        use std::sync::atomic::Ordering::Relaxed;
        let l = Arc::new(ServerLogin::plain("pw"));
        let many = INLINE_ITERATIONS + 1;
        let expected = ClientKeys::derive("pw", b"salt", many);
        let _ = tokio::time::timeout(std::time::Duration::from_micros(1), l.scram_keys(b"salt", many)).await;
        let tasks: Vec<_> = (0..8)
            .map(|_| {
                let l = l.clone();
                tokio::spawn(async move { l.scram_keys(b"salt", many).await })
            })
            .collect();
        for t in tasks {
            assert_eq!(t.await.unwrap().unwrap(), expected);
        }
        assert_eq!(l.derivations.load(Relaxed), 1);
    }
}
