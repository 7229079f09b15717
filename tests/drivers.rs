//! Real client drivers through Sluice: psycopg 3 (prepare_threshold=0), asyncpg, node-postgres
//! (named queries), pgjdbc (prepareThreshold=1) and pgx v5 (statement cache) each run the
//! workload of tests/drivers/README.md, 8 clients over a pool of 3, once per pool mode.
//!
//! The drivers live outside the source tree, installed by `tests/drivers/install.sh` (which
//! `scripts/test.sh` runs first); a test whose driver is not installed fails and says so.

mod common;

use std::io::{Read, Seek};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use common::{DB, PgCluster, Role, Sluice, toml_str};
use sha2::{Digest, Sha256};

/// Concurrent driver connections of the main phase (the programs' DRIVER_CLIENTS).
const CLIENTS: u32 = 8;
/// Server connections Sluice may open: fewer than the clients, so they queue and share.
const POOL_SIZE: u32 = 3;
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
    let status = loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            break Some(status);
        }
        if started.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut output = String::new();
    for file in [&mut stdout, &mut stderr] {
        file.rewind().expect("rewind");
        file.read_to_string(&mut output).expect("read output");
    }
    Finished { status, output, elapsed: started.elapsed() }
}

/// Starts PostgreSQL and Sluice (pool of 3 in `mode`), runs the driver's workload through it
/// and asserts that every check passed and that Sluice kept to its pool size.
fn run(driver: Driver, mode: DriverPoolMode) {
    let mut cmd = driver.command().unwrap_or_else(|e| panic!("{}: {e}", driver.name()));
    let pg = PgCluster::start();
    let sluice = Sluice::builder(&pg)
        .general("pool_mode", &toml_str(mode.as_str()))
        .database("app", &[("pool_size", &POOL_SIZE.to_string())])
        .start();
    // Connection parameters as libpq reads them; nothing inherited (PGSERVICE, PGOPTIONS...).
    // A TLS variant sets PGSSLMODE (require, verify-full) and PGSSLROOTCERT instead.
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PG") {
            cmd.env_remove(name);
        }
    }
    cmd.env("PGHOST", "127.0.0.1")
        .env("PGPORT", sluice.port.to_string())
        .env("PGUSER", Role::SCRAM.name)
        .env("PGPASSWORD", Role::SCRAM.password)
        .env("PGDATABASE", DB)
        .env("PGSSLMODE", "disable")
        .env("PGCONNECT_TIMEOUT", "10")
        .env("SLUICE_MODE", mode.as_str())
        .env("DRIVER_CLIENTS", CLIENTS.to_string());
    let run = run_bounded(cmd, RUN_LIMIT);
    let what = format!("{} in {} mode", driver.name(), mode.as_str());
    match run.status {
        None => panic!("{what}: killed after {RUN_LIMIT:?}; output:\n{}", run.output),
        Some(status) => assert!(status.success(), "{what} failed ({status}); output:\n{}", run.output),
    }
    eprintln!("{} [{:.1} s with start-up]", run.output.trim(), run.elapsed.as_secs_f64());
    let servers: u32 = pg
        .psql(&format!("select count(*) from pg_stat_activity where usename = '{}'", Role::SCRAM.name))
        .parse()
        .expect("a count");
    assert!(servers <= POOL_SIZE, "{what}: a pool of {POOL_SIZE} opened {servers} server connections");
}

#[test]
fn psycopg_session() {
    run(Driver::Psycopg, DriverPoolMode::Session);
}

#[test]
fn psycopg_transaction() {
    run(Driver::Psycopg, DriverPoolMode::Transaction);
}

#[test]
fn asyncpg_session() {
    run(Driver::Asyncpg, DriverPoolMode::Session);
}

#[test]
fn asyncpg_transaction() {
    run(Driver::Asyncpg, DriverPoolMode::Transaction);
}

#[test]
fn node_pg_session() {
    run(Driver::NodePg, DriverPoolMode::Session);
}

#[test]
fn node_pg_transaction() {
    run(Driver::NodePg, DriverPoolMode::Transaction);
}

#[test]
fn jdbc_session() {
    run(Driver::Jdbc, DriverPoolMode::Session);
}

#[test]
fn jdbc_transaction() {
    run(Driver::Jdbc, DriverPoolMode::Transaction);
}

#[test]
fn pgx_session() {
    run(Driver::Pgx, DriverPoolMode::Session);
}

#[test]
fn pgx_transaction() {
    run(Driver::Pgx, DriverPoolMode::Transaction);
}
