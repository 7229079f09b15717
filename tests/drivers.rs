//! Real client drivers through Sluice: psycopg 3 (prepare_threshold=0), asyncpg, node-postgres
//! (named queries), pgjdbc (prepareThreshold=1) and pgx v5 (statement cache) each run the
//! workload of tests/drivers/README.md, 8 clients over a pool of 3, once per pool mode, and
//! once more in transaction mode over TLS that the driver verifies in full (`*_transaction_tls`:
//! Sluice requires TLS, the driver checks its certificate against a CA made for the run and
//! its host name, and Sluice's log must show every connection logged in over TLS).
//!
//! The drivers live outside the source tree, installed by `tests/drivers/install.sh` (which
//! `scripts/test.sh` runs first); a test whose driver is not installed fails and says so.

mod common;

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{
    DB, PgCluster, Role, Sluice, TestCerts, exit_or_kill, has_ipv6_loopback, libpq_env, toml_str, wait_until,
};
use sha2::{Digest, Sha256};

/// Concurrent driver connections of the main phase (the programs' DRIVER_CLIENTS).
const CLIENTS: u32 = 8;
/// Server connections Sluice may open: fewer than the clients, so they queue and share.
const POOL_SIZE: usize = 3;
/// A run takes a few seconds; past this it is killed (the programs' own watchdog is 60 s).
const RUN_LIMIT: Duration = Duration::from_secs(120);

/// The DRIVER_POOL_MODE knob: the pool mode Sluice runs with, which the program is told as
/// SLUICE_MODE. Every driver has one test per mode.
#[derive(Clone, Copy, Debug)]
enum DriverPoolMode {
    /// A client keeps its server: the driver must behave exactly as on a direct connection.
    Session,
    /// A server is lent per transaction: named statements must follow the client (issue 3).
    Transaction,
}

impl DriverPoolMode {
    fn as_str(self) -> &'static str {
        match self {
            DriverPoolMode::Session => "session",
            DriverPoolMode::Transaction => "transaction",
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Driver {
    Psycopg,
    Asyncpg,
    NodePg,
    Jdbc,
    Pgx,
}

impl Driver {
    fn name(self) -> &'static str {
        match self {
            Driver::Psycopg => "psycopg",
            Driver::Asyncpg => "asyncpg",
            Driver::NodePg => "node-postgres",
            Driver::Jdbc => "pgjdbc",
            Driver::Pgx => "pgx",
        }
    }

    /// The part of tests/drivers/install.sh that installs this driver.
    fn part(self) -> &'static str {
        match self {
            Driver::Psycopg | Driver::Asyncpg => "python",
            Driver::NodePg => "node",
            Driver::Jdbc => "java",
            Driver::Pgx => "go",
        }
    }

    /// The command that runs this driver's workload program, or why it cannot run.
    fn command(self) -> Result<Command, String> {
        installed(self.part())?;
        let out = drivers_out();
        let src = drivers_src();
        let cmd = match self {
            Driver::Psycopg | Driver::Asyncpg => {
                let script =
                    if matches!(self, Driver::Psycopg) { "psycopg_workload.py" } else { "asyncpg_workload.py" };
                let mut cmd = Command::new(out.join("venv/bin/python"));
                cmd.arg(src.join("python").join(script));
                cmd
            }
            Driver::NodePg => {
                let mut cmd = Command::new("node");
                cmd.arg(src.join("node/pg_workload.js")).env("NODE_PATH", out.join("node/node_modules"));
                cmd
            }
            Driver::Jdbc => {
                let classpath = std::fs::read_to_string(out.join("java/classpath.txt"))
                    .map_err(|e| format!("cannot read {}: {e}", out.join("java/classpath.txt").display()))?;
                // The source launcher compiles the one file in memory: nothing to go stale.
                let mut cmd = Command::new("java");
                cmd.arg("-cp")
                    .arg(classpath.trim())
                    .arg(src.join("java/src/main/java/sluice/drivers/JdbcWorkload.java"));
                cmd
            }
            Driver::Pgx => Command::new(pgx_binary()?),
        };
        Ok(cmd)
    }
}

/// tests/drivers in the source tree.
fn drivers_src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/drivers")
}

/// Where tests/drivers/install.sh puts the drivers: `drivers` in the cargo target directory.
fn drivers_out() -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).parent().expect("target dir").join("drivers")
}

/// Checks the stamp tests/drivers/install.sh leaves for `part`: the sha256 of the pinned
/// files it installed from, then their paths. Missing or stale means the drivers on disk are
/// not the pinned ones.
fn installed(part: &str) -> Result<(), String> {
    let stamp_path = drivers_out().join(format!("{part}.stamp"));
    let advice = format!("run `bash scripts/test.sh` (or just `bash tests/drivers/install.sh {part}`) first");
    let Ok(stamp) = std::fs::read_to_string(&stamp_path) else {
        return Err(format!("the {part} drivers are not installed ({} is missing): {advice}", stamp_path.display()));
    };
    let mut lines = stamp.lines();
    let recorded = lines.next().unwrap_or_default();
    let mut hash = Sha256::new();
    for file in lines {
        let path = drivers_src().join(file);
        let bytes = std::fs::read(&path).map_err(|e| format!("{}: {e}: {advice}", path.display()))?;
        hash.update(bytes);
    }
    if format!("{:x}", hash.finalize()) != recorded {
        return Err(format!(
            "the {part} drivers were installed from other pinned files than the current ones: {advice}"
        ));
    }
    Ok(())
}

/// Builds the pgx program (once per test process) from the module cache the install filled,
/// offline; the build cache makes this about a second.
fn pgx_binary() -> Result<PathBuf, String> {
    static BUILT: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let binary = drivers_out().join("go/pgx-workload");
            let out = Command::new("go")
                .args(["build", "-mod=readonly", "-buildvcs=false", "-o"])
                .arg(&binary)
                .arg(".")
                .current_dir(drivers_src().join("go"))
                .env("GOPROXY", "off")
                .env("GOTOOLCHAIN", "local")
                .stdin(Stdio::null())
                .output()
                .map_err(|e| format!("cannot run go: {e}"))?;
            if !out.status.success() {
                return Err(format!(
                    "go build of tests/drivers/go failed ({}); if modules are missing, run `bash scripts/test.sh` \
                     (or `bash tests/drivers/install.sh go`):\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                ));
            }
            Ok(binary)
        })
        .clone()
}

struct Finished {
    status: Option<ExitStatus>,
    output: String,
    elapsed: Duration,
}

/// Runs `cmd` with stdout and stderr captured, killing it after `limit`.
fn run_bounded(mut cmd: Command, limit: Duration) -> Finished {
    let mut stdout = tempfile::tempfile().expect("temp file");
    let mut stderr = tempfile::tempfile().expect("temp file");
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(stdout.try_clone().expect("clone temp file"))
        .stderr(stderr.try_clone().expect("clone temp file"))
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let status = exit_or_kill(&mut child, limit);
    let mut output = String::new();
    for file in [&mut stdout, &mut stderr] {
        file.rewind().expect("rewind");
        file.read_to_string(&mut output).expect("read output");
    }
    Finished { status, output, elapsed: started.elapsed() }
}

/// How the driver reaches Sluice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Transport {
    /// Plain TCP to 127.0.0.1 (PGSSLMODE=disable).
    Plain,
    /// TLS, verified in full: Sluice requires it (`client_tls_sslmode = "require"`) and presents a
    /// certificate for localhost, 127.0.0.1 and ::1 signed by a CA generated for the run; the
    /// driver connects to `localhost` with PGSSLMODE=verify-full and PGSSLROOTCERT=that CA, so it
    /// checks the chain and the host name.
    VerifyFull,
}

/// PostgreSQL and a Sluice with a pool of 3 in `mode` in front of it, over `transport`.
struct Stack {
    // Dropped in this order: Sluice, then PostgreSQL, then the certificate files.
    sluice: Sluice,
    pg: PgCluster,
    certs: Option<TestCerts>,
}

impl Stack {
    fn start(mode: DriverPoolMode, transport: Transport) -> Stack {
        let pg = PgCluster::start();
        let mut builder = Sluice::builder(&pg)
            .general("pool_mode", &toml_str(mode.as_str()))
            .database("app", &[("pool_size", &POOL_SIZE.to_string())]);
        let certs = match transport {
            Transport::Plain => None,
            Transport::VerifyFull => {
                let certs = TestCerts::generate();
                let path = |p: &Path| toml_str(&p.display().to_string());
                builder = builder
                    .general("client_tls_sslmode", &toml_str("require"))
                    .general("client_tls_cert_file", &path(&certs.server.cert))
                    .general("client_tls_key_file", &path(&certs.server.key));
                // `localhost` may resolve to ::1 first (/etc/hosts decides): listen there too.
                if has_ipv6_loopback() {
                    builder = builder.general("listen_addr", r#"["127.0.0.1", "::1"]"#);
                }
                Some(certs)
            }
        };
        Stack { sluice: builder.start(), pg, certs }
    }

    /// Points `cmd` at Sluice through the PG* variables libpq reads, as `role`: plaintext to
    /// 127.0.0.1, or with `root` (a CA certificate file) verify-full to localhost. No PG*
    /// variable is inherited (PGSERVICE, PGOPTIONS...): `libpq_env`.
    fn env(&self, cmd: &mut Command, mode: DriverPoolMode, role: Role, root: Option<&Path>) {
        let host = if root.is_some() { "localhost" } else { "127.0.0.1" };
        libpq_env(cmd, self.sluice.port, host, role.name, role.password, DB)
            .env("SLUICE_MODE", mode.as_str())
            .env("DRIVER_CLIENTS", CLIENTS.to_string());
        if let Some(ca) = root {
            cmd.env("PGSSLMODE", "verify-full").env("PGSSLROOTCERT", ca);
        }
    }
}

/// Starts PostgreSQL and Sluice (pool of 3 in `mode`, reached over `transport`), runs the
/// driver's workload through it and asserts that every check passed and that Sluice kept to its
/// pool size; over TLS, also that every connection of the run logged in over TLS.
fn run(driver: Driver, mode: DriverPoolMode, transport: Transport) {
    let mut cmd = driver.command().unwrap_or_else(|e| panic!("{}: {e}", driver.name()));
    let stack = Stack::start(mode, transport);
    stack.env(&mut cmd, mode, Role::SCRAM, stack.certs.as_ref().map(|c| c.ca.as_path()));
    let run = run_bounded(cmd, RUN_LIMIT);
    let tls = if transport == Transport::VerifyFull { " over TLS (verify-full)" } else { "" };
    let what = format!("{} in {} mode{tls}", driver.name(), mode.as_str());
    match run.status {
        None => panic!("{what}: killed after {RUN_LIMIT:?}; output:\n{}", run.output),
        Some(status) => assert!(status.success(), "{what} failed ({status}); output:\n{}", run.output),
    }
    let servers = stack.pg.backends(&format!("usename = '{}'", Role::SCRAM.name));
    assert!(servers <= POOL_SIZE, "{what}: a pool of {POOL_SIZE} opened {servers} server connections");
    let logins = match transport {
        Transport::Plain => String::new(),
        Transport::VerifyFull => format!(", {} TLS logins", assert_every_login_tls(&what, &stack.sluice)),
    };
    eprintln!("{} [{:.1} s with start-up{logins}]", run.output.trim(), run.elapsed.as_secs_f64());
}

/// Sluice's log line for a client login: `... login peer=... user=... database=... tls="TLSv1.3 ..."`
/// (the `tls` field is left out for a plaintext client).
fn is_login(line: &str) -> bool {
    line.contains(" login peer=")
}

/// The reason in Sluice's log line for the end of a client connection, any connection, logged in
/// or not: `... client disconnected: REASON peer=...`.
fn disconnect_reason(line: &str) -> Option<&str> {
    let (_, rest) = line.split_once("client disconnected: ")?;
    Some(rest.rsplit_once(" peer=").map_or(rest, |(reason, _)| reason))
}

/// Asserts, from Sluice's log once every connection of the finished run has closed, that each
/// logged in over TLS: every login line names a TLS version, there are as many logins as
/// connections (none was refused or failed its handshake), at least one per client, and each
/// ended as a client ends it. Returns the number of logins.
fn assert_every_login_tls(what: &str, sluice: &Sluice) -> usize {
    let count =
        |log: &str| (log.lines().filter(|l| is_login(l)).count(), log.lines().filter_map(disconnect_reason).count());
    // The program has exited, but Sluice may not have logged the last disconnects yet.
    wait_until(Duration::from_secs(10), || {
        let (logins, ends) = count(&sluice.log());
        logins == ends
    });
    let log = sluice.log();
    let (logins, ends) = count(&log);
    assert_eq!(logins, ends, "{what}: {ends} client connections but {logins} logins; Sluice's log:\n{log}");
    assert!(
        logins > CLIENTS as usize,
        "{what}: only {logins} logins for {CLIENTS} clients (is log_connections off?); Sluice's log:\n{log}"
    );
    let plain: Vec<&str> = log.lines().filter(|l| is_login(l) && !l.contains(" tls=\"TLSv1.")).collect();
    assert!(plain.is_empty(), "{what}: logins without TLS:\n{}", plain.join("\n"));
    let unclean: Vec<&str> = log
        .lines()
        .filter(|l| {
            disconnect_reason(l)
                .is_some_and(|reason| reason != "client terminated" && reason != "client closed the connection")
        })
        .collect();
    assert!(unclean.is_empty(), "{what}: connections ended by Sluice:\n{}", unclean.join("\n"));
    logins
}

#[test]
fn psycopg_session() {
    run(Driver::Psycopg, DriverPoolMode::Session, Transport::Plain);
}

#[test]
fn psycopg_transaction() {
    run(Driver::Psycopg, DriverPoolMode::Transaction, Transport::Plain);
}

#[test]
fn asyncpg_session() {
    run(Driver::Asyncpg, DriverPoolMode::Session, Transport::Plain);
}

#[test]
fn asyncpg_transaction() {
    run(Driver::Asyncpg, DriverPoolMode::Transaction, Transport::Plain);
}

#[test]
fn node_pg_session() {
    run(Driver::NodePg, DriverPoolMode::Session, Transport::Plain);
}

#[test]
fn node_pg_transaction() {
    run(Driver::NodePg, DriverPoolMode::Transaction, Transport::Plain);
}

#[test]
fn jdbc_session() {
    run(Driver::Jdbc, DriverPoolMode::Session, Transport::Plain);
}

#[test]
fn jdbc_transaction() {
    run(Driver::Jdbc, DriverPoolMode::Transaction, Transport::Plain);
}

#[test]
fn pgx_session() {
    run(Driver::Pgx, DriverPoolMode::Session, Transport::Plain);
}

#[test]
fn pgx_transaction() {
    run(Driver::Pgx, DriverPoolMode::Transaction, Transport::Plain);
}

// The same workloads over TLS, each driver verifying Sluice's certificate and host name
// (PGSSLMODE=verify-full, PGSSLROOTCERT, PGHOST=localhost), in transaction mode.

#[test]
fn psycopg_transaction_tls() {
    run(Driver::Psycopg, DriverPoolMode::Transaction, Transport::VerifyFull);
}

#[test]
fn asyncpg_transaction_tls() {
    run(Driver::Asyncpg, DriverPoolMode::Transaction, Transport::VerifyFull);
}

#[test]
fn node_pg_transaction_tls() {
    run(Driver::NodePg, DriverPoolMode::Transaction, Transport::VerifyFull);
}

#[test]
fn jdbc_transaction_tls() {
    run(Driver::Jdbc, DriverPoolMode::Transaction, Transport::VerifyFull);
}

#[test]
fn pgx_transaction_tls() {
    run(Driver::Pgx, DriverPoolMode::Transaction, Transport::VerifyFull);
}

/// verify-full really verifies: with PGSSLROOTCERT naming a CA that did not sign Sluice's
/// certificate, every program fails to connect, in the TLS handshake (Sluice logs a failed
/// handshake for it and no login). One Sluice for all five; each program gives up at its first
/// connection.
#[test]
fn tls_wrong_ca_is_refused_by_every_driver() {
    let mode = DriverPoolMode::Transaction;
    let stack = Stack::start(mode, Transport::VerifyFull);
    let wrong_ca = stack.certs.as_ref().map(|c| c.untrusted_ca.clone()).expect("certificates");
    let failed_handshakes = || {
        let log = stack.sluice.log();
        let reasons: Vec<String> = log.lines().filter_map(disconnect_reason).map(str::to_string).collect();
        assert!(reasons.iter().all(|r| r.starts_with("TLS handshake failed")), "{log}");
        reasons.len()
    };
    for driver in [Driver::Psycopg, Driver::Asyncpg, Driver::NodePg, Driver::Jdbc, Driver::Pgx] {
        let mut cmd = driver.command().unwrap_or_else(|e| panic!("{}: {e}", driver.name()));
        stack.env(&mut cmd, mode, Role::SCRAM, Some(&wrong_ca));
        let before = failed_handshakes();
        let run = run_bounded(cmd, RUN_LIMIT);
        let what = format!("{} with verify-full and a CA that did not sign Sluice's certificate", driver.name());
        match run.status {
            None => panic!("{what}: killed after {RUN_LIMIT:?}; output:\n{}", run.output),
            Some(status) => assert!(!status.success(), "{what} succeeded; output:\n{}", run.output),
        }
        // Each driver words it its own way, but names the certificate (or its certification path).
        assert!(run.output.to_lowercase().contains("certific"), "{what}: failed for another reason:\n{}", run.output);
        assert!(
            wait_until(Duration::from_secs(10), || failed_handshakes() > before),
            "{what}: Sluice logged no failed TLS handshake; its log:\n{}",
            stack.sluice.log()
        );
        let first = run.output.lines().find(|l| l.to_lowercase().contains("certific")).unwrap_or_default();
        eprintln!("{what}: refused [{:.1} s]: {}", run.elapsed.as_secs_f64(), first.trim());
    }
    let log = stack.sluice.log();
    assert!(!log.lines().any(is_login), "a login got through:\n{log}");
}
