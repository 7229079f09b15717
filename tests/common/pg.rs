//! Throwaway PostgreSQL clusters for tests, copied from a template built once, with a role per auth method.

use std::hash::{Hash, Hasher};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tempfile::TempDir;

use super::{exit_or_kill, free_port, has_ipv6_loopback, psql_cmd, wait_until};

/// The database every test role may use.
pub const DB: &str = "app";

/// A login role that exists in every cluster, with the password it logs in with ("" for none).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Role {
    pub name: &'static str,
    pub password: &'static str,
}

impl Role {
    /// SCRAM secret stored, pg_hba `scram-sha-256`; member of pg_signal_backend.
    pub const SCRAM: Role = Role { name: "u_scram", password: "pw_scram" };
    /// md5 hash stored, pg_hba `md5`.
    pub const MD5: Role = Role { name: "u_md5", password: "pw_md5" };
    /// SCRAM secret stored, pg_hba `password` (cleartext on the wire).
    pub const PLAIN: Role = Role { name: "u_plain", password: "pw_plain" };
    /// No password, pg_hba `trust`.
    pub const TRUST: Role = Role { name: "u_trust", password: "" };
    /// Superuser, SCRAM secret stored, pg_hba `scram-sha-256`.
    pub const ADMIN: Role = Role { name: "u_admin", password: "pw_admin" };
}

/// Bump when the template recipe changes in a way the hash below cannot see.
const TEMPLATE_VERSION: u32 = 2;

/// Run once in the template, as `postgres`, by psql over the Unix socket.
const SETUP_SQL: &str = "
CREATE DATABASE app;
SET password_encryption = 'scram-sha-256';
CREATE ROLE u_scram LOGIN PASSWORD 'pw_scram';
CREATE ROLE u_plain LOGIN PASSWORD 'pw_plain';
CREATE ROLE u_trust LOGIN;
CREATE ROLE u_admin LOGIN SUPERUSER PASSWORD 'pw_admin';
SET password_encryption = 'md5';
CREATE ROLE u_md5 LOGIN PASSWORD 'pw_md5';
GRANT pg_signal_backend TO u_scram;
GRANT ALL ON DATABASE app TO u_scram, u_md5, u_plain, u_trust;
\\connect app
GRANT ALL ON SCHEMA public TO u_scram, u_md5, u_plain, u_trust;
";

/// The settings file every cluster writes into its data directory; postgresql.conf includes it.
const SETTINGS_FILE: &str = "sluice_test.conf";

/// TLS for a cluster: `ssl = on` with this certificate and key, and optionally a CA
/// for client certificates (`ssl_ca_file`). The files are copied into the data
/// directory, owned by the server's user with mode 0600, as PostgreSQL demands.
#[derive(Clone, Debug)]
pub struct PgSsl {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: Option<PathBuf>,
}

/// Options for `PgCluster::start_with`; `Default` is what `PgCluster::start` uses.
#[derive(Clone, Debug, Default)]
pub struct PgOptions {
    pub ssl: Option<PgSsl>,
    /// pg_hba.conf lines placed before the usual ones (e.g. `hostssl ... clientcert=verify-full`).
    pub hba_first: Vec<String>,
    /// `listen_addresses` in place of the loopback ones (127.0.0.1, and ::1 where it exists).
    pub listen: Option<String>,
    /// The port in place of a free one (for two clusters on one port, each listening on its
    /// own address).
    pub port: Option<u16>,
}

/// A running (or stopped) PostgreSQL cluster in its own temporary directory. The postmaster is
/// this process's child, so stopping it reaps it (no zombies where PID 1 does not reap).
pub struct PgCluster {
    pub port: u16,
    pub socket_dir: PathBuf,
    pub data_dir: PathBuf,
    log_path: PathBuf,
    postmaster: Option<Child>,
    options: PgOptions,
    dir: TempDir,
}

impl PgCluster {
    /// Copies the template, picks a free port and starts PostgreSQL; panics with the log on failure.
    pub fn start() -> PgCluster {
        Self::start_with(PgOptions::default())
    }

    /// Like `start`, with TLS and extra pg_hba.conf lines.
    pub fn start_with(options: PgOptions) -> PgCluster {
        let template = template();
        let dir = owned_temp_dir("sluice-pg-");
        let socket_dir = dir.path().join("sock");
        let data_dir = dir.path().join("data");
        std::fs::create_dir(&socket_dir).expect("create socket dir");
        give_to_postgres(dir.path());
        run_checked(Command::new("cp").arg("-a").arg(template).arg(&data_dir), "copy template");
        let log_path = dir.path().join("postgres.log");
        let mut pg = PgCluster { port: 0, socket_dir, data_dir, log_path, postmaster: None, options, dir };
        pg.install_tls_and_hba();
        for attempt in 1..=5 {
            pg.port = pg.options.port.unwrap_or_else(free_port);
            pg.write_settings();
            match pg.try_start_server() {
                Ok(()) => return pg,
                Err(e) if attempt < 5 && port_taken(&pg.log()) => {
                    eprintln!("retrying PostgreSQL start: {e}")
                }
                Err(e) => panic!("{e}\n--- PostgreSQL log ---\n{}", pg.log()),
            }
        }
        unreachable!()
    }

    /// Stops PostgreSQL with a fast shutdown (SIGINT, as `pg_ctl stop -m fast`) and waits until it is gone.
    pub fn stop(&mut self) {
        let postmaster = self.postmaster.take().expect("PgCluster::stop: cluster is not running");
        if let Err(e) = shut_down(postmaster, libc::SIGINT, Duration::from_secs(30)) {
            panic!("{e}\n--- PostgreSQL log ---\n{}", self.log());
        }
    }

    /// Starts the same data directory on the same port again after `stop`.
    pub fn start_again(&mut self) {
        assert!(self.postmaster.is_none(), "PgCluster::start_again: cluster is already running");
        if let Err(e) = self.try_start_server() {
            panic!("{e}\n--- PostgreSQL log ---\n{}", self.log());
        }
    }

    /// `stop` then `start_again`.
    pub fn restart(&mut self) {
        self.stop();
        self.start_again();
    }

    /// Runs SQL as `postgres` in database `app` and returns trimmed stdout (unaligned, tuples only).
    pub fn psql(&self, sql: &str) -> String {
        self.psql_db(DB, sql)
    }

    /// Like `psql`, in another database.
    pub fn psql_db(&self, db: &str, sql: &str) -> String {
        psql_socket(&self.socket_dir, self.port, db, sql)
    }

    /// Client connections to PostgreSQL (Sluice's server connections, and any client connected
    /// straight to it) matching `filter`, an SQL condition on `pg_stat_activity` such as
    /// `"state = 'active' and query like '%pg_sleep%'"` (`"true"` for all); the psql session
    /// asking is not counted. Poll it with `wait_until` when the number is expected to change.
    pub fn backends(&self, filter: &str) -> usize {
        let sql = format!(
            "select count(*) from pg_stat_activity \
             where backend_type = 'client backend' and pid <> pg_backend_pid() and ({filter})"
        );
        let count = self.psql(&sql);
        count.parse().unwrap_or_else(|e| panic!("{sql}: {count:?}: {e}"))
    }

    /// Waits (up to 10 s; from a multi-threaded tokio test) until a query containing
    /// `text` is running on the server.
    pub fn running(&self, text: &str) -> bool {
        let filter = format!("state = 'active' and query like '%{text}%'");
        tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || self.backends(&filter) > 0))
    }

    /// The server log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }

    /// The `rolpassword` PostgreSQL stores for `role` (a "SCRAM-SHA-256$..." secret or "md5..." hash).
    pub fn scram_secret(&self, role: &str) -> String {
        let role = role.replace('\'', "''");
        self.psql(&format!("SELECT rolpassword FROM pg_authid WHERE rolname = '{role}'"))
    }

    /// Copies the `PgOptions::ssl` files into the data directory and writes `hba_first`.
    fn install_tls_and_hba(&self) {
        use std::os::unix::fs::PermissionsExt;
        if let Some(ssl) = &self.options.ssl {
            let files =
                [("server.crt", Some(&ssl.cert)), ("server.key", Some(&ssl.key)), ("root.crt", ssl.ca.as_ref())];
            for (name, src) in files {
                let Some(src) = src else { continue };
                let dest = self.data_dir.join(name);
                std::fs::copy(src, &dest)
                    .unwrap_or_else(|e| panic!("copy {} to the data directory: {e}", src.display()));
                std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(0o600)).expect("chmod TLS file");
                give_to_postgres(&dest);
            }
        }
        if !self.options.hba_first.is_empty() {
            let hba = self.data_dir.join("pg_hba.conf");
            std::fs::write(&hba, format!("{}\n{}", self.options.hba_first.join("\n"), hba_text())).expect("write hba");
            give_to_postgres(&hba);
        }
    }

    fn write_settings(&self) {
        let loopback = if has_ipv6_loopback() { "127.0.0.1,::1" } else { "127.0.0.1" };
        let listen = self.options.listen.as_deref().unwrap_or(loopback);
        let mut text = format!(
            "port = {port}\nlisten_addresses = '{listen}'\nunix_socket_directories = '{sock}'\n\
             fsync = off\nsynchronous_commit = off\nfull_page_writes = off\n\
             max_connections = 200\nshared_buffers = 32MB\npassword_encryption = 'scram-sha-256'\n\
             logging_collector = off\nlog_connections = on\nlog_line_prefix = '%m [%p] %q%u@%d '\n",
            port = self.port,
            sock = self.socket_dir.display(),
        );
        if let Some(ssl) = &self.options.ssl {
            text.push_str("ssl = on\nssl_cert_file = 'server.crt'\nssl_key_file = 'server.key'\n");
            if ssl.ca.is_some() {
                text.push_str("ssl_ca_file = 'root.crt'\n");
            }
        }
        let path = self.data_dir.join(SETTINGS_FILE);
        std::fs::write(&path, text).expect("write PostgreSQL settings");
        give_to_postgres(&path);
    }

    fn try_start_server(&mut self) -> Result<(), String> {
        let postmaster = spawn_postgres(&self.data_dir, self.dir.path(), &self.log_path)
            .map_err(|e| format!("PostgreSQL did not start on port {}: {e}", self.port))?;
        self.postmaster = Some(postmaster);
        Ok(())
    }
}

impl Drop for PgCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let tail: Vec<&str> = log.lines().rev().take(60).collect();
            let tail: Vec<&str> = tail.into_iter().rev().collect();
            eprintln!("--- PostgreSQL log tail (port {}) ---\n{}\n---", self.port, tail.join("\n"));
        }
        if let Some(postmaster) = self.postmaster.take() {
            // Immediate shutdown (SIGQUIT, as `pg_ctl stop -m immediate`); SIGKILL after 10 s.
            let _ = shut_down(postmaster, libc::SIGQUIT, Duration::from_secs(10));
        }
        // `dir` (a TempDir) is removed when this struct's fields drop.
    }
}

/// "md5" followed by md5hex(password + role): PostgreSQL's stored md5 hash, computed with `md5sum`.
pub fn md5_secret(role: &str, password: &str) -> String {
    let mut child = Command::new("md5sum").stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().expect("run md5sum");
    let mut stdin = child.stdin.take().expect("md5sum stdin");
    stdin.write_all(format!("{password}{role}").as_bytes()).expect("write to md5sum");
    drop(stdin);
    let out = child.wait_with_output().expect("md5sum output");
    assert!(out.status.success(), "md5sum failed");
    let hex = String::from_utf8_lossy(&out.stdout);
    format!("md5{}", hex.split_whitespace().next().expect("md5sum printed a hash"))
}

/// The directory holding initdb, postgres, pg_ctl and psql: $SLUICE_PG_BINDIR, else the newest
/// /usr/lib/postgresql/N/bin, else empty (found on PATH).
pub fn pg_bindir() -> &'static Path {
    static BINDIR: OnceLock<PathBuf> = OnceLock::new();
    BINDIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("SLUICE_PG_BINDIR") {
            return PathBuf::from(dir);
        }
        let mut versions: Vec<u32> = std::fs::read_dir("/usr/lib/postgresql")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .filter(|v| Path::new(&format!("/usr/lib/postgresql/{v}/bin/postgres")).exists())
            .collect();
        versions.sort_unstable();
        versions.last().map(|v| PathBuf::from(format!("/usr/lib/postgresql/{v}/bin"))).unwrap_or_default()
    })
}

fn is_root() -> bool {
    // SAFETY: geteuid(2) cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// A command for a PostgreSQL server tool, run as the `postgres` OS user when we are root
/// (setpriv execs in place, so a spawned postmaster's pid is the child's pid).
fn pg_tool(tool: &str) -> Command {
    let path = pg_bindir().join(tool);
    if is_root() {
        let mut cmd = Command::new("setpriv");
        cmd.args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"]).arg(path);
        cmd
    } else {
        Command::new(path)
    }
}

/// Starts a postmaster on `data` (settings from its config files) with output appended to `log`,
/// and waits until postmaster.pid says "ready" (30 s deadline) or the process exits.
fn spawn_postgres(data: &Path, cwd: &Path, log: &Path) -> Result<Child, String> {
    let log = std::fs::OpenOptions::new().create(true).append(true).open(log).expect("open PostgreSQL log");
    let mut child = pg_tool("postgres")
        .arg("-D")
        .arg(data)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("clone log file"))
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot run postgres: {e}"))?;
    let pid = child.id().to_string();
    let mut exited = None;
    let ready = wait_until(Duration::from_secs(30), || {
        exited = child.try_wait().expect("try_wait on postgres");
        let pid_file = std::fs::read_to_string(data.join("postmaster.pid")).unwrap_or_default();
        let lines: Vec<&str> = pid_file.lines().map(str::trim).collect();
        exited.is_some() || (lines.first() == Some(&pid.as_str()) && lines.get(7) == Some(&"ready"))
    });
    if let Some(status) = exited {
        return Err(format!("postgres exited ({status})"));
    }
    if !ready {
        let _ = shut_down(child, libc::SIGQUIT, Duration::from_secs(5));
        return Err("not ready within 30 s".into());
    }
    Ok(child)
}

/// Sends `signal` to the postmaster and reaps it; SIGKILL if it is not gone within `timeout`.
fn shut_down(mut postmaster: Child, signal: libc::c_int, timeout: Duration) -> Result<(), String> {
    // SAFETY: kill(2) has no memory-safety preconditions; the pid is our own unreaped child.
    unsafe { libc::kill(postmaster.id() as libc::pid_t, signal) };
    match exit_or_kill(&mut postmaster, timeout) {
        Some(_) => Ok(()),
        None => Err(format!("postgres (pid {}) did not stop within {timeout:?}; killed", postmaster.id())),
    }
}

/// A temporary directory that the user running PostgreSQL owns (mode 0755 so any client can reach sockets in it).
fn owned_temp_dir(prefix: &str) -> TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::Builder::new().prefix(prefix).tempdir_in(clusters_parent()).expect("create temp dir");
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod temp dir");
    super::claim(dir.path());
    give_to_postgres(dir.path());
    dir
}

/// Where cluster directories go: $SLUICE_TEST_TMPDIR, else /dev/shm when it has 2 GiB free
/// (copying the template to tmpfs takes ~0.1 s against ~1.2 s on a slow disk), else the temp dir.
fn clusters_parent() -> &'static Path {
    static PARENT: OnceLock<PathBuf> = OnceLock::new();
    PARENT.get_or_init(|| {
        if let Some(dir) = std::env::var_os("SLUICE_TEST_TMPDIR") {
            return PathBuf::from(dir);
        }
        let shm = Path::new("/dev/shm");
        if free_bytes(shm) >= 2 << 30 && tempfile::tempdir_in(shm).is_ok() {
            return shm.to_path_buf();
        }
        std::env::temp_dir()
    })
}

fn free_bytes(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c_path) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return 0;
    };
    // SAFETY: statvfs only writes into the zeroed struct we pass; c_path is NUL-terminated.
    unsafe {
        let mut st: libc::statvfs = std::mem::zeroed();
        if libc::statvfs(c_path.as_ptr(), &mut st) != 0 {
            return 0;
        }
        st.f_bavail as u64 * st.f_frsize as u64
    }
}

fn give_to_postgres(path: &Path) {
    if is_root() {
        run_checked(Command::new("chown").args(["-R", "postgres:postgres"]).arg(path), "chown to postgres");
    }
}

fn run_checked(cmd: &mut Command, what: &str) -> Output {
    let out = cmd.stdin(Stdio::null()).output().unwrap_or_else(|e| panic!("{what}: cannot run {cmd:?}: {e}"));
    assert!(out.status.success(), "{what} failed: {cmd:?}\n{}", describe(&out));
    out
}

fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

fn port_taken(log: &str) -> bool {
    log.contains("Address already in use") || log.contains("could not create any TCP/IP sockets")
}

/// psql as `postgres` over a Unix socket, SQL on stdin; panics with stderr on failure.
fn psql_socket(socket_dir: &Path, port: u16, db: &str, sql: &str) -> String {
    let socket_dir = socket_dir.to_str().expect("socket directory path is UTF-8");
    let mut child = psql_cmd(port, socket_dir, "postgres", "", db)
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run psql");
    let mut stdin = child.stdin.take().expect("psql stdin");
    // Write from another thread so a large result cannot dead-lock against a full stdin pipe.
    let out = std::thread::scope(|s| {
        s.spawn(move || stdin.write_all(sql.as_bytes()));
        child.wait_with_output().expect("psql output")
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "psql failed ({}) on port {port}:\n{sql}\n{stderr}", out.status);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// The template data directory: built by the first caller in this process, or reused from an
/// earlier test binary (cached under CARGO_TARGET_TMPDIR, keyed by PostgreSQL version and recipe).
fn template() -> &'static Path {
    static TEMPLATE: OnceLock<PathBuf> = OnceLock::new();
    TEMPLATE.get_or_init(|| {
        let cache = option_env!("CARGO_TARGET_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
        std::fs::create_dir_all(&cache).expect("create template cache dir");
        super::sweep_orphans(clusters_parent(), "sluice-pg-", postmaster_pid);
        let path = cache.join(format!("sluice-pg-template-{:016x}", template_key()));
        if !path.exists() {
            build_template(&path);
        }
        path
    })
}

/// The postmaster pid recorded in a cluster directory (`data/postmaster.pid`).
fn postmaster_pid(dir: &Path) -> Option<i32> {
    let pid_file = std::fs::read_to_string(dir.join("data/postmaster.pid")).ok()?;
    pid_file.lines().next()?.trim().parse().ok()
}

fn template_key() -> u64 {
    let version = run_checked(Command::new(pg_bindir().join("postgres")).arg("--version"), "postgres --version");
    let mut h = std::hash::DefaultHasher::new();
    (TEMPLATE_VERSION, &version.stdout, SETUP_SQL, hba_text(), is_root()).hash(&mut h);
    h.finish()
}

fn hba_text() -> String {
    let mut hba = String::from("local all all trust\n");
    for net in ["127.0.0.1/32", "::1/128"] {
        for (user, method) in
            [("u_trust", "trust"), ("u_md5", "md5"), ("u_plain", "password"), ("all", "scram-sha-256")]
        {
            hba.push_str(&format!("host all {user} {net} {method}\n"));
        }
    }
    hba
}

/// initdb, create the roles with PostgreSQL listening only on a private Unix socket, stop, then
/// publish the data directory at `dest` with an atomic rename (safe against concurrent test binaries).
fn build_template(dest: &Path) {
    let work = owned_temp_dir("sluice-pg-initdb-");
    let data = work.path().join("data");
    let initdb = ["-U", "postgres", "-A", "trust", "-E", "UTF8", "--locale=C", "--wal-segsize=1", "-N"];
    run_checked(pg_tool("initdb").arg("-D").arg(&data).args(initdb).current_dir(work.path()), "initdb");
    std::fs::write(data.join("pg_hba.conf"), hba_text()).expect("write pg_hba.conf");
    let mut conf = std::fs::OpenOptions::new().append(true).open(data.join("postgresql.conf")).expect("conf");
    writeln!(conf, "include_if_exists = '{SETTINGS_FILE}'").expect("append to postgresql.conf");
    let settings = format!(
        "port = 5432\nlisten_addresses = ''\nunix_socket_directories = '{}'\nfsync = off\n",
        work.path().display()
    );
    std::fs::write(data.join(SETTINGS_FILE), settings).expect("write settings");
    give_to_postgres(work.path());
    let log = work.path().join("template-server.log");
    let server_log = || std::fs::read_to_string(&log).unwrap_or_default();
    let postmaster = match spawn_postgres(&data, work.path(), &log) {
        Ok(postmaster) => postmaster,
        Err(e) => panic!("template server: {e}\n{}", server_log()),
    };
    psql_socket(work.path(), 5432, "postgres", SETUP_SQL);
    if let Err(e) = shut_down(postmaster, libc::SIGINT, Duration::from_secs(30)) {
        panic!("template server: {e}\n{}", server_log());
    }
    std::fs::remove_file(data.join(SETTINGS_FILE)).expect("remove template settings");
    static STAGING: AtomicU32 = AtomicU32::new(0);
    let n = STAGING.fetch_add(1, Ordering::Relaxed);
    let staging = dest.with_extension(format!("staging-{}-{n}", std::process::id()));
    run_checked(Command::new("cp").arg("-a").arg(&data).arg(&staging), "copy template to cache");
    if std::fs::rename(&staging, dest).is_err() {
        // Another process published the same template first; ours is redundant.
        let _ = std::fs::remove_dir_all(&staging);
        assert!(dest.exists(), "could not publish PostgreSQL template at {}", dest.display());
    }
}

/// A backend of a test's cluster frozen with SIGSTOP (a server that stops answering),
/// resumed however the test ends, so the cluster can shut down.
pub struct Stopped(i32);

impl Stopped {
    pub fn new(pid: &str) -> Self {
        let pid: i32 = pid.parse().expect("a backend pid");
        // SAFETY: kill(2) on a PostgreSQL backend of this test's own cluster.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0, "cannot stop backend {pid}");
        Stopped(pid)
    }
}

impl Drop for Stopped {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}
