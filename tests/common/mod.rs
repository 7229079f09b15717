//! Test harness shared by integration tests: real PostgreSQL clusters, a running Sluice, client helpers.
#![allow(dead_code)]

mod certs;
pub mod console;
pub mod http;
mod pg;
pub mod raw;
mod sluice;
pub mod stmts;

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

// Each test binary uses a subset of these re-exports.
#[allow(unused_imports)]
pub use certs::{CertFiles, Leaf, TestCerts};
#[allow(unused_imports)]
pub use pg::{DB, PgCluster, PgOptions, PgSsl, Role, Stopped, md5_secret, pg_bindir};
#[allow(unused_imports)]
pub use sluice::{Sluice, SluiceBuilder, toml_str};

/// Connects with tokio-postgres (NoTls) to 127.0.0.1:`port` and spawns the connection task;
/// panics with the error on failure. An empty `password` sends none.
pub async fn connect(port: u16, user: &str, password: &str, db: &str) -> tokio_postgres::Client {
    match try_connect(port, user, password, db).await {
        Ok((client, _task)) => client,
        Err(e) => panic!("connect to 127.0.0.1:{port} as {user}/{db} failed: {e} ({e:?})"),
    }
}

/// Like `connect`, returning the error, and the handle of the task that drives the connection
/// (it finishes when the connection closes).
pub async fn try_connect(
    port: u16,
    user: &str,
    password: &str,
    db: &str,
) -> Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), tokio_postgres::Error> {
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user(user)
        .dbname(db)
        .ssl_mode(tokio_postgres::config::SslMode::Disable)
        .connect_timeout(Duration::from_secs(10));
    if !password.is_empty() {
        config.password(password);
    }
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    let task = tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok((client, task))
}

/// Points `cmd`, a libpq client (psql, pgbench, an exporter, a driver workload), at `host`
/// (a name, an address or a Unix socket directory) and `port` as `user`, database `db`, through
/// libpq's environment alone: PGHOST, PGPORT, PGUSER, PGPASSWORD (none when `password` is
/// empty), PGDATABASE, PGSSLMODE=disable and PGCONNECT_TIMEOUT=10. No other PG* variable is
/// inherited (PGSERVICE, PGOPTIONS...); set TLS variables after this to override PGSSLMODE.
pub fn libpq_env<'a>(
    cmd: &'a mut Command,
    port: u16,
    host: &str,
    user: &str,
    password: &str,
    db: &str,
) -> &'a mut Command {
    for (name, _) in std::env::vars_os() {
        if name.to_string_lossy().starts_with("PG") {
            cmd.env_remove(name);
        }
    }
    cmd.env("PGHOST", host)
        .env("PGPORT", port.to_string())
        .env("PGUSER", user)
        .env("PGDATABASE", db)
        .env("PGSSLMODE", "disable")
        .env("PGCONNECT_TIMEOUT", "10");
    if !password.is_empty() {
        cmd.env("PGPASSWORD", password);
    }
    cmd
}

/// `psql -X -qtA -v ON_ERROR_STOP=1 -w` pointed at `host`:`port` as `user`, database `db`, by
/// `libpq_env` (PGSSLMODE=disable); add `-c SQL` (or stdin) and run it.
pub fn psql_cmd(port: u16, host: &str, user: &str, password: &str, db: &str) -> Command {
    let mut cmd = Command::new(pg_bindir().join("psql"));
    cmd.args(["-X", "-qtA", "-v", "ON_ERROR_STOP=1", "-w"]);
    libpq_env(&mut cmd, port, host, user, password, db);
    cmd
}

/// The SQLSTATE of a failed tokio-postgres call, or "no sqlstate: ERROR" when the error did not
/// come from the server (so an assertion on the code shows what happened instead).
pub fn code(e: &tokio_postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_else(|| format!("no sqlstate: {e}"))
}

/// A loopback TCP port that is free now (on 127.0.0.1, and ::1 where it exists).
/// Ports come from below the kernel's ephemeral range so outgoing client connections never take
/// them, and are never handed out twice by one process.
pub fn free_port() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (lo, hi) = (20_000u32, ephemeral_low().min(60_000));
    if hi <= lo + 1000 {
        return any_free_port();
    }
    let span = hi - lo;
    let seed = std::process::id().wrapping_mul(7919) % span;
    for _ in 0..span {
        let port = (lo + (seed + NEXT.fetch_add(1, Ordering::Relaxed)) % span) as u16;
        if port_is_free(port) {
            return port;
        }
    }
    panic!("no free loopback port in {lo}..{hi}");
}

fn ephemeral_low() -> u32 {
    let range = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    range.split_whitespace().next().and_then(|s| s.parse().ok()).unwrap_or(32768)
}

fn any_free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

fn port_is_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok() && (!has_ipv6_loopback() || TcpListener::bind(("::1", port)).is_ok())
}

/// Whether the loopback interface has ::1 (PostgreSQL then also listens there).
pub fn has_ipv6_loopback() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        let table = std::fs::read_to_string("/proc/net/if_inet6").unwrap_or_default();
        table.lines().any(|l| l.starts_with("00000000000000000000000000000001"))
    })
}

/// Column `column` (0-based) of the row for database `db` in the admin console's reply to
/// `show` (SHOW POOLS, SHOW PREPARED_STATEMENTS...), read with psql as `user`, who must be in
/// `admin_users` or `stats_users`; None without such a row.
pub fn console_cell(port: u16, user: &str, password: &str, show: &str, db: &str, column: usize) -> Option<String> {
    console_cell_where(port, user, password, show, &[db], column)
}

/// `console_cell` for the row whose first columns are `key` (SHOW POOLS: database, user).
pub fn console_cell_where(
    port: u16,
    user: &str,
    password: &str,
    show: &str,
    key: &[&str],
    column: usize,
) -> Option<String> {
    let out = psql_cmd(port, "127.0.0.1", user, password, "pgbouncer")
        .args(["-F", "|", "-c", show])
        .output()
        .expect("psql runs");
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .map(|l| l.split('|').collect::<Vec<_>>())
        .find(|f| f.starts_with(key))
        .and_then(|f| Some(f.get(column)?.to_string()))
}

/// Clients of database `db` waiting for a server connection, as the admin console's
/// `SHOW POOLS` counts them (`cl_waiting`); `user` must be in `admin_users`. None when the
/// console could not be asked (psql failed), has no row for `db`, or the cell is not a
/// number, so a failing console never reads as "nobody waits".
pub fn clients_waiting(port: u16, user: &str, password: &str, db: &str) -> Option<usize> {
    console_cell(port, user, password, "SHOW POOLS", db, 3).and_then(|v| v.parse().ok())
}

/// Polls `clients_waiting` until one client of `db` waits for a server; false after 10 s.
/// Blocks the thread (from an async test: `spawn_blocking` or `block_in_place`).
pub fn one_client_queued(port: u16, user: &str, password: &str, db: &str) -> bool {
    wait_until(Duration::from_secs(10), || clients_waiting(port, user, password, db) == Some(1))
}

/// The one polling loop of the tests: calls `condition` until it holds (true) or `timeout`
/// passes (false), every 10 ms, and once more at the deadline.
/// Blocks the thread: from an async test use `eventually`; in a current-thread tokio test,
/// only poll things outside its runtime.
pub fn wait_until(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if condition() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// `wait_until` for an async condition: awaits `condition()` every 10 ms until it yields
/// true or `timeout` passes (false), without blocking the runtime.
pub async fn eventually<F, Fut>(timeout: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Polls (`wait_until`) until `child` exits: its status; None if `timeout` passes first, when the
/// child is left running.
pub fn wait_exit(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let mut status = None;
    wait_until(timeout, || {
        status = child.try_wait().expect("try_wait on a child process");
        status.is_some()
    });
    status
}

/// `wait_exit`, then, if the child still runs, SIGKILL and reap it (None).
pub fn exit_or_kill(child: &mut Child, timeout: Duration) -> Option<ExitStatus> {
    let status = wait_exit(child, timeout);
    if status.is_none() {
        let _ = child.kill();
        let _ = child.wait();
    }
    status
}

/// Records in `dir` that this test process owns it, for `sweep_orphans` in later runs.
fn claim(dir: &Path) {
    std::fs::write(dir.join("owner.pid"), std::process::id().to_string()).expect("write owner.pid");
}

/// Removes `prefix*` directories under `parent` left by test processes that died without
/// cleaning up (killed by a timeout, say): SIGKILLs the server `server_pid(dir)` names when its
/// command line mentions the directory, then deletes the directory. Only claimed directories whose
/// owner is gone are touched.
fn sweep_orphans(parent: &Path, prefix: &str, server_pid: fn(&Path) -> Option<i32>) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    for entry in entries.flatten() {
        let dir = entry.path();
        let name = entry.file_name();
        if !name.to_string_lossy().starts_with(prefix) {
            continue;
        }
        let owner = std::fs::read_to_string(dir.join("owner.pid")).ok();
        let Some(owner) = owner.and_then(|s| s.trim().parse::<i32>().ok()) else {
            continue;
        };
        if process_alive(owner) {
            continue;
        }
        if let Some(pid) = server_pid(&dir) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&*dir.to_string_lossy()) {
                // SAFETY: kill(2) has no memory-safety preconditions.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn process_alive(pid: i32) -> bool {
    // SAFETY: signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Connects with tokio-postgres over the Unix socket `socket_dir/.s.PGSQL.port`; panics on failure.
pub async fn connect_unix(
    socket_dir: &Path,
    port: u16,
    user: &str,
    password: &str,
    db: &str,
) -> tokio_postgres::Client {
    let mut config = tokio_postgres::Config::new();
    config.host_path(socket_dir).port(port).user(user).dbname(db);
    if !password.is_empty() {
        config.password(password);
    }
    let (client, connection) = match config.connect(tokio_postgres::NoTls).await {
        Ok(pair) => pair,
        Err(e) => panic!("connect to {}/.s.PGSQL.{port} as {user} failed: {e}", socket_dir.display()),
    };
    tokio::spawn(async move {
        let _ = connection.await;
    });
    client
}

/// The first column of the first row a simple query returns, as text.
pub async fn value(c: &tokio_postgres::Client, sql: &str) -> String {
    for m in c.simple_query(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}")) {
        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
            return r.get(0).unwrap_or("").to_string();
        }
    }
    panic!("no row from {sql}")
}

/// Pipelines 200 queries of 256 KiB each way through one connection to `port` while
/// reading their answers (tokio-postgres writes and reads at once), and checks every
/// answer and that the connection serves a query afterwards. A relay that stops reading
/// the server while a write to it waits deadlocks here: PostgreSQL reads no more input
/// while its own output is blocked.
pub async fn huge_pipeline(port: u16) {
    let c = connect(port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let echo = c.prepare("select $1::text").await.unwrap();
    let big = "x".repeat(256 * 1024);
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&big];
    let all = futures_util::future::try_join_all((0..200).map(|_| c.query_one(&echo, &params)));
    let rows = tokio::time::timeout(Duration::from_secs(60), all).await.expect("the relay deadlocked").unwrap();
    assert_eq!(rows.len(), 200);
    assert!(rows.iter().all(|r| r.get::<_, &str>(0) == big), "an answer came back changed");
    assert_eq!(value(&c, "select 'after'").await, "after");
}

/// Sends `token`'s cancel request to Sluice on `port` and returns once Sluice has
/// processed it: Sluice closes the connection after forwarding the request (or finding
/// nothing to cancel), as libpq expects. (`CancelToken::cancel_query` returns once the
/// request is written, so a statement sent right after could race the cancel.)
pub async fn cancel_processed(port: u16, token: &tokio_postgres::CancelToken) {
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect for cancel");
    token.cancel_query_raw(UntilClosed(tcp), tokio_postgres::NoTls).await.expect("cancel request");
}

/// A stream whose shutdown, after shutting down its own writing, reads until the peer
/// closes.
struct UntilClosed(tokio::net::TcpStream);

impl tokio::io::AsyncRead for UntilClosed {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for UntilClosed {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        use std::task::Poll;
        use tokio::io::AsyncRead;
        std::task::ready!(std::pin::Pin::new(&mut self.0).poll_shutdown(cx))?;
        let mut scratch = [0u8; 64];
        loop {
            let mut buf = tokio::io::ReadBuf::new(&mut scratch);
            std::task::ready!(std::pin::Pin::new(&mut self.0).poll_read(cx, &mut buf))?;
            if buf.filled().is_empty() {
                return Poll::Ready(Ok(()));
            }
        }
    }
}
