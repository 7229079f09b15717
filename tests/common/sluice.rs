//! Runs the built `sluice` binary as a child process with a generated TOML config; signals, logs, config rewrites.

use std::fs::File;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use tempfile::TempDir;

use super::{PgCluster, free_port, wait_until};

const START_DEADLINE: Duration = Duration::from_secs(20);

/// A running Sluice process; killed (SIGKILL) on drop, and its log printed if the test is panicking.
pub struct Sluice {
    pub port: u16,
    /// Where Sluice puts `.s.PGSQL.<port>`; empty when the config disables the Unix socket.
    pub socket_dir: PathBuf,
    pub config_path: PathBuf,
    log_path: PathBuf,
    /// Whether the config has TCP listeners (`listen_addr` is not `[]`).
    tcp: bool,
    child: Child,
    _dir: TempDir,
}

impl Sluice {
    /// A config builder pointing database `app` at `pg`, with the test users; see `SluiceBuilder`.
    pub fn builder(pg: &PgCluster) -> SluiceBuilder {
        SluiceBuilder::new(pg)
    }

    /// Starts Sluice with a full config text (which must set `listen_port`) and waits until it
    /// accepts connections; panics with the log if it exits first or takes over 20 s.
    pub fn start(config: &str) -> Sluice {
        Self::try_start(config).unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like `start`, returning the reason and the log instead of panicking (for "refuses to start" tests).
    pub fn try_start(config: &str) -> Result<Sluice, String> {
        let port = toml_value(config, "listen_port").and_then(|v| v.parse().ok()).expect("config must set listen_port");
        let socket_dir = match toml_value(config, "unix_socket_dir") {
            Some(v) => PathBuf::from(v.trim_matches('"')),
            None => PathBuf::from("/tmp"),
        };
        launch(sluice_dir(), port, socket_dir, config, &[])
    }

    /// Sends SIGHUP (reload the config).
    pub fn reload(&self) {
        self.signal(libc::SIGHUP);
    }

    /// Sends SIGTERM.
    pub fn terminate(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Sends SIGINT.
    pub fn interrupt(&self) {
        self.signal(libc::SIGINT);
    }

    /// Polls until the process exits (its status) or `timeout` passes (None).
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        super::wait_exit(&mut self.child, timeout)
    }

    /// Everything Sluice wrote to stdout and stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// Polls the log until it contains `needle` (true) or `timeout` passes (false).
    pub fn wait_log(&self, needle: &str, timeout: Duration) -> bool {
        self.wait_log_times(needle, 1, timeout)
    }

    /// Polls the log until `needle` appears at least `n` times (true) or `timeout` passes.
    pub fn wait_log_times(&self, needle: &str, n: usize, timeout: Duration) -> bool {
        wait_until(timeout, || self.log().matches(needle).count() >= n)
    }

    /// Replaces the config file atomically (write a sibling, then rename); follow with `reload`.
    pub fn write_config(&self, config: &str) {
        let tmp = self.config_path.with_extension("toml.new");
        std::fs::write(&tmp, config).expect("write new sluice config");
        std::fs::rename(&tmp, &self.config_path).expect("replace sluice config");
    }

    /// Rewrites the config file with `from` replaced by `to` (which must change it),
    /// reloads, and waits until the reload is logged.
    pub fn reload_replacing(&self, from: &str, to: &str) {
        let cfg = self.config();
        assert!(cfg.contains(from), "config layout changed, no {from:?}:\n{cfg}");
        let before = self.log().matches("configuration reloaded").count();
        self.write_config(&cfg.replace(from, to));
        self.reload();
        let logged = self.wait_log_times("configuration reloaded", before + 1, Duration::from_secs(10));
        assert!(logged, "no reload logged");
    }

    /// The config file as it is now.
    pub fn config(&self) -> String {
        std::fs::read_to_string(&self.config_path).expect("read sluice config")
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: libc::c_int) {
        // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own unreaped child.
        let rc = unsafe { libc::kill(self.pid() as libc::pid_t, signal) };
        assert_eq!(rc, 0, "kill({}, {signal}): {}", self.pid(), std::io::Error::last_os_error());
    }

    /// Ready when every listener the config asks for listens: TCP (unless `listen_addr = []`) and
    /// the Unix socket (unless `unix_socket_dir = ""`). Checked in /proc, so no probe connection
    /// reaches Sluice (it would show up as a client in logs and stats).
    fn is_listening(&self) -> bool {
        let socket = self.socket_dir.join(format!(".s.PGSQL.{}", self.port));
        (!self.tcp || tcp_listening(self.port)) && (self.socket_dir.as_os_str().is_empty() || unix_listening(&socket))
    }
}

/// Whether some socket listens on TCP `port` (/proc/net/tcp and tcp6; a connect where /proc is missing).
fn tcp_listening(port: u16) -> bool {
    let suffix = format!(":{port:04X}");
    let mut readable = false;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        readable = true;
        let listening = text.lines().skip(1).any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && fields[1].ends_with(&suffix) && fields[3] == "0A"
        });
        if listening {
            return true;
        }
    }
    let v4 = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let v6 = SocketAddr::from((Ipv6Addr::LOCALHOST, port));
    let timeout = Duration::from_millis(200);
    !readable && (TcpStream::connect_timeout(&v4, timeout).is_ok() || TcpStream::connect_timeout(&v6, timeout).is_ok())
}

/// Whether a Unix socket listens at `path` (/proc/net/unix flag __SO_ACCEPTCON; a connect where /proc is missing).
fn unix_listening(path: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/net/unix") else {
        return UnixStream::connect(path).is_ok();
    };
    let path = path.to_string_lossy();
    text.lines().any(|line| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        fields.len() > 7 && fields[3] == "00010000" && fields[7] == path
    })
}

impl Drop for Sluice {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if std::thread::panicking() {
            let path = self.log_path.display();
            eprintln!("----- sluice log ({path}) -----\n{}\n----- end of sluice log -----", self.log());
        }
    }
}

/// A temporary directory for one Sluice: config and log inside, and `sock/` (mode 0777) for its socket.
fn sluice_dir() -> TempDir {
    use std::os::unix::fs::PermissionsExt;
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| super::sweep_orphans(&std::env::temp_dir(), "sluice-proc-", recorded_pid));
    let dir = tempfile::Builder::new().prefix("sluice-proc-").tempdir().expect("create temp dir");
    super::claim(dir.path());
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
    let sock = dir.path().join("sock");
    std::fs::create_dir(&sock).expect("create socket dir");
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o777)).expect("chmod socket dir");
    dir
}

fn launch(
    dir: TempDir,
    port: u16,
    socket_dir: PathBuf,
    config: &str,
    env: &[(String, String)],
) -> Result<Sluice, String> {
    let config_path = dir.path().join("sluice.toml");
    std::fs::write(&config_path, config).expect("write sluice config");
    let log_path = dir.path().join("sluice.log");
    let log = File::create(&log_path).expect("create sluice log");
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .arg("--config")
        .arg(&config_path)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone log file"))
        .stderr(log)
        .env("RUST_BACKTRACE", "1")
        .env("NO_COLOR", "1") // plain log text for `wait_log` and assertions
        .envs(env.iter().map(|(k, v)| (k, v)))
        .spawn()
        .expect("spawn the sluice binary");
    std::fs::write(dir.path().join("sluice.pid"), child.id().to_string()).expect("write sluice.pid");
    let tcp = toml_value(config, "listen_addr").is_none_or(|v| v.replace(' ', "") != "[]");
    let mut sluice = Sluice { port, socket_dir, config_path, log_path, tcp, child, _dir: dir };
    let mut exited = None;
    let listening = wait_until(START_DEADLINE, || {
        let sluice = &mut sluice;
        exited = sluice.child.try_wait().expect("try_wait on sluice");
        exited.is_some() || sluice.is_listening()
    });
    if let Some(status) = exited {
        return Err(format!("sluice exited ({status}) before accepting connections; log:\n{}", sluice.log()));
    }
    if !listening {
        return Err(format!("sluice did not accept connections on port {port} within 20 s; log:\n{}", sluice.log()));
    }
    Ok(sluice)
}

fn recorded_pid(dir: &Path) -> Option<i32> {
    std::fs::read_to_string(dir.join("sluice.pid")).ok()?.trim().parse().ok()
}

/// The raw value of the first `key = value` line in a TOML text (comments and quotes kept).
fn toml_value<'a>(config: &'a str, key: &str) -> Option<&'a str> {
    config.lines().find_map(|line| {
        let (k, v) = line.split_once('=')?;
        (k.trim() == key).then(|| v.trim())
    })
}

type Entries = Vec<(String, String)>;

/// Builds a Sluice config: a free port, a socket dir, `[databases.app]` pointing at the cluster,
/// and users u_scram, u_md5, u_plain with their passwords (u_trust too, without a password, when
/// `auth_type` is "trust", since Sluice requires passwords otherwise). Values are TOML literals.
pub struct SluiceBuilder {
    port: u16,
    socket_dir: PathBuf,
    pg_port: u16,
    general: Entries,
    databases: Vec<(String, Entries)>,
    users: Vec<(String, Entries)>,
    peers: Vec<(String, Entries)>,
    trust_user: bool,
    /// Environment variables for the process.
    env: Entries,
    dir: TempDir,
}

impl SluiceBuilder {
    fn new(pg: &PgCluster) -> SluiceBuilder {
        let dir = sluice_dir();
        let socket_dir = dir.path().join("sock");
        let port = free_port();
        let general = vec![
            ("listen_addr".to_string(), r#"["127.0.0.1"]"#.to_string()),
            ("listen_port".to_string(), port.to_string()),
            ("unix_socket_dir".to_string(), toml_str(&socket_dir.display().to_string())),
            ("log_level".to_string(), toml_str("info")),
            // Most tests are about transaction pooling (the default is session, as in
            // PgBouncer); tests of other modes set theirs.
            ("pool_mode".to_string(), toml_str("transaction")),
            // The default is `prefer`; TLS tests that start PostgreSQL with TLS set theirs.
            ("server_tls_sslmode".to_string(), toml_str("disable")),
            // One worker runs the current-thread runtime; tests that exercise the
            // multi-threaded one (pgbench, admin kill) set `workers = 2`.
            ("workers".to_string(), "1".to_string()),
        ];
        let mut b = SluiceBuilder {
            port,
            socket_dir,
            pg_port: pg.port,
            general,
            databases: Vec::new(),
            users: Vec::new(),
            peers: Vec::new(),
            trust_user: true,
            env: Vec::new(),
            dir,
        };
        b = b.database("app", &[]);
        for (name, password) in [("u_scram", "pw_scram"), ("u_md5", "pw_md5"), ("u_plain", "pw_plain")] {
            b = b.user(name, &[("password", &toml_str(password))]);
        }
        b
    }

    /// Sets an environment variable of the process.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        set(&mut self.env, key, value);
        self
    }

    /// Sets `[general] key = value` (value is a TOML literal, e.g. `"\"transaction\""` or `"5"`).
    pub fn general(mut self, key: &str, value: &str) -> Self {
        set(&mut self.general, key, value);
        self
    }

    /// Adds or amends `[databases.NAME]`; new entries start with host 127.0.0.1, the cluster's port, dbname "app".
    pub fn database(mut self, name: &str, entries: &[(&str, &str)]) -> Self {
        let pg_port = self.pg_port;
        let db = section(&mut self.databases, name, || {
            vec![
                ("host".to_string(), toml_str("127.0.0.1")),
                ("port".to_string(), pg_port.to_string()),
                ("dbname".to_string(), toml_str(super::DB)),
            ]
        });
        entries.iter().for_each(|(k, v)| set(db, k, v));
        self
    }

    /// Adds or amends `[users.NAME]`.
    pub fn user(mut self, name: &str, entries: &[(&str, &str)]) -> Self {
        let user = section(&mut self.users, name, Vec::new);
        entries.iter().for_each(|(k, v)| set(user, k, v));
        self
    }

    /// Drops a `[users.NAME]` section (default or added).
    pub fn without_user(mut self, name: &str) -> Self {
        self.users.retain(|(n, _)| n != name);
        self.trust_user &= name != "u_trust";
        self
    }

    /// Adds a `[peers.ID]` entry.
    pub fn peer(mut self, id: u16, entries: &[(&str, &str)]) -> Self {
        let e = entries.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        self.peers.push((id.to_string(), e));
        self
    }

    /// Drops a `[databases.NAME]` section (default or added).
    pub fn without_database(mut self, name: &str) -> Self {
        self.databases.retain(|(n, _)| n != name);
        self
    }

    /// The port Sluice will listen on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The directory Sluice's Unix socket will be in.
    pub fn socket_dir(&self) -> &Path {
        &self.socket_dir
    }

    /// The TOML text `start` would use.
    pub fn config_text(&self) -> String {
        let mut text = String::from("[general]\n");
        write_entries(&mut text, &self.general);
        for (name, entries) in &self.databases {
            text.push_str(&format!("\n[databases.{}]\n", toml_key(name)));
            write_entries(&mut text, entries);
        }
        for (name, entries) in &self.users {
            text.push_str(&format!("\n[users.{}]\n", toml_key(name)));
            write_entries(&mut text, entries);
        }
        for (id, entries) in &self.peers {
            text.push_str(&format!("\n[peers.{id}]\n"));
            write_entries(&mut text, entries);
        }
        let trust_auth = self.general.iter().any(|(k, v)| k == "auth_type" && v == "\"trust\"");
        if self.trust_user && trust_auth && !self.users.iter().any(|(n, _)| n == "u_trust") {
            text.push_str("\n[users.u_trust]\n");
        }
        text
    }

    /// Starts Sluice with this config; panics with the log on failure.
    pub fn start(self) -> Sluice {
        self.try_start().unwrap_or_else(|e| panic!("{e}"))
    }

    /// Like `start`, returning the reason and the log instead of panicking.
    pub fn try_start(self) -> Result<Sluice, String> {
        let config = self.config_text();
        launch(self.dir, self.port, self.socket_dir, &config, &self.env)
    }
}

fn section<'a>(
    sections: &'a mut Vec<(String, Entries)>,
    name: &str,
    init: impl FnOnce() -> Entries,
) -> &'a mut Entries {
    let i = match sections.iter().position(|(n, _)| n == name) {
        Some(i) => i,
        None => {
            sections.push((name.to_string(), init()));
            sections.len() - 1
        }
    };
    &mut sections[i].1
}

fn set(entries: &mut Entries, key: &str, value: &str) {
    match entries.iter_mut().find(|(k, _)| k == key) {
        Some(entry) => entry.1 = value.to_string(),
        None => entries.push((key.to_string(), value.to_string())),
    }
}

fn write_entries(text: &mut String, entries: &Entries) {
    for (k, v) in entries {
        text.push_str(&format!("{k} = {v}\n"));
    }
}

/// A TOML basic string literal.
pub fn toml_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}

fn toml_key(name: &str) -> String {
    let bare = !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    if bare { name.to_string() } else { toml_str(name) }
}
