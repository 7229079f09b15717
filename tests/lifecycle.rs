//! The process from outside: config errors at start-up, SIGHUP reload, SIGTERM
//! drain, SIGINT, and the connect/disconnect log lines.

mod common;

use std::time::Duration;

use common::raw::{Raw, msg, startup};
use common::{PgCluster, Role, Sluice, connect, try_connect, value, wait_until};

#[test]
fn broken_config_names_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.toml");
    std::fs::write(&path, "[general]\nlisten_port = 6432\n\n[databases.app]\nport = 0\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice")).arg("--config").arg(&path).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("{}:5: databases.app.port:", path.display())), "{err}");
    std::fs::write(&path, "[general]\nlisten_port = 6432\nbogus = 1\n").unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice")).arg("--config").arg(&path).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.toml:3:") && err.contains("bogus"), "{err}");
    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["--config", "/nonexistent.toml"])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent.toml"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reloads_without_dropping_clients() {
    let pg = PgCluster::start();
    pg.psql("create database other; grant all on database other to u_scram");
    let s = Sluice::builder(&pg).database("app", &[("pool_size", "1")]).start();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&a, "select 1").await, "1");
    assert!(try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "other").await.is_err());
    // new database, bigger pool, a new client password (the server password stays)
    let cfg = s.config().replace("pool_size = 1", "pool_size = 3")
        + &format!("\n[databases.other]\nhost = \"127.0.0.1\"\nport = {}\ndbname = \"other\"\n", pg.port);
    let cfg = cfg.replace(
        "[users.u_scram]\npassword = \"pw_scram\"",
        "[users.u_scram]\npassword = \"new-secret\"\nserver_password = \"pw_scram\"",
    );
    assert!(cfg.contains("new-secret"), "config layout changed:\n{cfg}");
    s.write_config(&cfg);
    s.reload();
    assert!(s.wait_log("configuration reloaded", Duration::from_secs(10)));
    let o = connect(s.port, Role::SCRAM.name, "new-secret", "other").await;
    assert_eq!(value(&o, "select current_database()").await, "other");
    assert!(try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await.is_err());
    // the old client is still connected and working
    assert_eq!(value(&a, "select 2").await, "2");
    // pool_size 3: three transactions at once
    a.simple_query("begin").await.unwrap();
    let b = connect(s.port, Role::SCRAM.name, "new-secret", "app").await;
    b.simple_query("begin").await.unwrap();
    let c = connect(s.port, Role::SCRAM.name, "new-secret", "app").await;
    let r = tokio::time::timeout(Duration::from_secs(20), value(&c, "select 3")).await;
    assert_eq!(r.expect("pool size was not raised by the reload"), "3");
    // a broken config is refused and the running one kept
    s.write_config("[general]\nlisten_port = \"nope\"\n");
    s.reload();
    assert!(s.wait_log("reload failed", Duration::from_secs(10)));
    assert_eq!(value(&c, "select 4").await, "4");
    let d = connect(s.port, Role::SCRAM.name, "new-secret", "other").await;
    assert_eq!(value(&d, "select 5").await, "5");
}

/// A reload that lowers a pool's size closes the connections beyond it: idle ones at
/// the janitor's next round, lent ones when their transaction ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_lowering_pool_size_closes_the_connections_beyond_it() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).database("app", &[("pool_size", "3")]).start();
    let mut clients = Vec::new();
    for _ in 0..3 {
        let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
        c.simple_query("begin").await.unwrap();
        clients.push(c);
    }
    let servers = |n: usize| {
        let count = || pg.backends("usename = 'u_scram'") == n;
        tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), count))
    };
    assert!(servers(3));
    for (lent, from, to) in [(false, 3, 1), (true, 1, 3), (true, 3, 1)] {
        if !lent {
            for c in &clients {
                c.simple_query("commit").await.unwrap();
            }
        }
        s.reload_replacing(&format!("pool_size = {from}"), &format!("pool_size = {to}"));
        if lent {
            for c in &clients {
                c.simple_query("commit").await.unwrap();
            }
        }
        if to == 3 {
            for c in &clients {
                c.simple_query("begin").await.unwrap();
            }
            continue;
        }
        assert!(
            servers(1),
            "{} server connections after pool_size {from} -> 1 ({})",
            pg.backends("usename = 'u_scram'"),
            if lent { "lent" } else { "idle" }
        );
    }
}

/// A reload that points a database at another server database replaces its server
/// connections: one lent out during the reload is closed when its client gives it back,
/// not kept for the next transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_moving_a_database_replaces_lent_server_connections() {
    let pg = PgCluster::start();
    pg.psql("create database other; grant all on database other to u_scram");
    let s = Sluice::builder(&pg).database("app", &[("pool_size", "1")]).start();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    a.simple_query("begin").await.unwrap();
    assert_eq!(value(&a, "select current_database()").await, "app");
    s.reload_replacing("dbname = \"app\"", "dbname = \"other\"");
    assert_eq!(value(&a, "select current_database()").await, "app", "the open transaction keeps its server");
    a.simple_query("commit").await.unwrap();
    assert_eq!(value(&a, "select current_database()").await, "other");
}

/// A client whose authentication spans a reload gets its pool from the config as it is
/// after the reload: a pool created from the config the login read at its start kept
/// that config's settings (here, its pool mode) until the next reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_spanning_a_reload_gets_a_pool_from_the_new_config() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"md5\"")
        .general("admin_users", &format!("[\"{}\"]", Role::SCRAM.name))
        .start();
    let mut c = Raw::open(s.port);
    c.send(&startup(&[("user", Role::MD5.name), ("database", "app")], 3 << 16));
    let (tag, body) = c.recv().expect("an authentication request");
    assert_eq!((tag, &body[..4]), (b'R', &[0, 0, 0, 5][..]), "md5 expected");
    s.reload_replacing("[databases.app]", "[databases.app]\npool_mode = \"session\"");
    let hash = sluice::auth::md5::password_hash(Role::MD5.name, Role::MD5.password);
    let salt = body[4..8].try_into().unwrap();
    let mut password = sluice::auth::md5::salted_response(&hash, salt).into_bytes();
    password.push(0);
    c.send(&msg(b'p', &password));
    assert_eq!(c.until_ready()[0].0, b'R');
    let admin = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "pgbouncer").await;
    let pools = admin.simple_query("SHOW POOLS").await.unwrap();
    let mode = pools.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) if r.get("user") == Some(Role::MD5.name) => {
            r.get("pool_mode").map(String::from)
        }
        _ => None,
    });
    assert_eq!(mode.as_deref(), Some("session"));
}

/// The seconds left on the keepalive timer of an established socket's line of
/// /proc/net/tcp (`tr` 2, `tm->when` in hundredths of a second); None when it runs none.
#[cfg(target_os = "linux")]
fn keepalive_left(fields: &[&str]) -> Option<u64> {
    let when = fields[5].strip_prefix("02:")?;
    Some(u64::from_str_radix(when, 16).expect("a hex timer") / 100)
}

/// The seconds left on the keepalive timer of Sluice's side of the client connection
/// from local port `client_port`; None when it runs none.
#[cfg(target_os = "linux")]
fn keepalive_timer(sluice_port: u16, client_port: u16) -> Option<u64> {
    let (local, remote) = (format!(":{sluice_port:04X}"), format!(":{client_port:04X}"));
    let timer = || {
        let text = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
        text.lines()
            .map(|l| l.split_whitespace().collect::<Vec<_>>())
            .find(|f| f.len() > 5 && f[1].ends_with(&local) && f[2].ends_with(&remote) && f[3] == "01")
            .map(|f| keepalive_left(&f))
    };
    // Polled: on a loaded machine Sluice's side may be listed a moment after connect().
    let mut found = None;
    wait_until(Duration::from_secs(10), || {
        found = timer();
        found.is_some()
    });
    found.expect("Sluice's side of the connection")
}

/// The keepalive timer of each of Sluice's established TCP connections to the server on
/// `pg_port` (/proc/net/tcp: the seconds left, None when it runs none).
#[cfg(target_os = "linux")]
fn server_keepalive_timers(pg_port: u16) -> Vec<Option<u64>> {
    let remote = format!(":{pg_port:04X}");
    let text = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    text.lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|f| f.len() > 5 && f[2].ends_with(&remote) && f[3] == "01")
        .map(|f| keepalive_left(&f))
        .collect()
}

/// Server connections follow tcp_keepalive and tcp_keepidle too, so a server lost
/// without a reset is noticed.
#[cfg(target_os = "linux")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_connections_follow_tcp_keepalive() {
    let pg = PgCluster::start();
    for on in [true, false] {
        let s = Sluice::builder(&pg).general("tcp_keepalive", &on.to_string()).general("tcp_keepidle", "300").start();
        let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
        assert_eq!(value(&c, "select 1").await, "1");
        let timers = server_keepalive_timers(pg.port);
        assert!(!timers.is_empty(), "no server connection over TCP");
        // The first probe 300 s after the last traffic (not 60 s, the default).
        let right = |t: &Option<u64>| if on { t.is_some_and(|t| (200..=300).contains(&t)) } else { t.is_none() };
        assert!(timers.iter().all(right), "tcp_keepalive = {on}: {timers:?}");
        drop(c);
        drop(s);
    }
}

/// tcp_keepalive is on for client connections by default (the first probe after 60 s);
/// a reload changing tcp_keepidle, then one turning keepalive off, apply from the next
/// connection on (the listening socket is changed at once), and connections made before
/// keep theirs; with `tcp_defer_accept` off a connection is taken up before its data.
#[cfg(target_os = "linux")]
#[test]
fn tcp_keepalive_follows_a_reload() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).start();
    // Each sends the first bytes of a startup packet: under `tcp_defer_accept` (the
    // default) a connection is taken up once data has come.
    let connect = || {
        let mut c = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        std::io::Write::write_all(&mut c, &[0, 0, 0]).unwrap();
        c
    };
    let timer = |c: &std::net::TcpStream| keepalive_timer(s.port, c.local_addr().unwrap().port());
    let before = connect();
    assert!(timer(&before).is_some_and(|t| t <= 60), "{:?}", timer(&before));
    let reload = |key: &str, value: &str, log: &str| {
        let cfg = s.config().replacen("[general]\n", &format!("[general]\n{key} = {value}\n"), 1);
        s.write_config(&cfg);
        s.reload();
        assert!(s.wait_log(log, Duration::from_secs(10)), "{}", s.log());
    };
    reload(
        "tcp_keepidle",
        "500",
        "tcp_keepalive on (tcp_keepidle 500 s, tcp_keepintvl the kernel's, tcp_keepcnt the kernel's), tcp_defer_accept on for connections from now on",
    );
    let idle_500 = connect();
    assert!(timer(&idle_500).is_some_and(|t| (400..=500).contains(&t)), "{:?}", timer(&idle_500));
    reload("tcp_keepalive", "false", "tcp_keepalive off, tcp_defer_accept on for connections from now on");
    let after = connect();
    assert_eq!(timer(&after), None);
    // With tcp_defer_accept off a connection that has sent nothing is taken up too.
    reload("tcp_defer_accept", "false", "tcp_keepalive off, tcp_defer_accept off for connections from now on");
    let silent = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    assert_eq!(timer(&silent), None, "Sluice's side is listed, with no keepalive");
    assert!(timer(&before).is_some_and(|t| t <= 60));
    assert!(timer(&idle_500).is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_waits_for_transactions_then_exits() {
    let pg = PgCluster::start();
    let mut s = Sluice::builder(&pg).general("shutdown_timeout", "30").start();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let idle = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    a.simple_query("create table drain (a int); begin; insert into drain values (1)").await.unwrap();
    s.terminate();
    assert!(wait_until(Duration::from_secs(20), || try_connect_blocking(s.port)), "still accepting after SIGTERM");
    // the idle client is closed; the one in a transaction can finish it
    let idle_closed = common::eventually(Duration::from_secs(20), || async { idle.is_closed() }).await;
    assert!(idle_closed, "idle client was not closed on SIGTERM");
    a.simple_query("insert into drain values (2); commit").await.unwrap();
    assert!(s.wait_exit(Duration::from_secs(10)).is_some(), "did not exit after the last transaction");
    assert_eq!(pg.psql("select count(*) from drain"), "2");
}

/// True when a new TCP connection is refused (the listener is closed).
fn try_connect_blocking(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_err()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_exits_promptly_and_logs_connections() {
    let pg = PgCluster::start();
    let mut s = Sluice::builder(&pg).start();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    a.simple_query("begin").await.unwrap();
    drop(connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await);
    assert!(s.wait_log("login", Duration::from_secs(20)));
    assert!(s.wait_log("client disconnected", Duration::from_secs(20)));
    s.interrupt();
    // Well under shutdown_timeout (30 s), which a wait for the open transaction would take.
    assert!(s.wait_exit(Duration::from_secs(15)).is_some(), "SIGINT did not stop sluice promptly");
    assert!(
        wait_until(Duration::from_secs(10), || pg.backends("usename = 'u_scram'") == 0),
        "server connections left open after exit"
    );
}

/// A second SIGTERM during the drain, or a SIGQUIT, exits at once, not after the open
/// transaction or `shutdown_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigterm_or_sigquit_exits_at_once() {
    let pg = PgCluster::start();
    for second_term in [true, false] {
        let mut s = Sluice::builder(&pg).general("shutdown_timeout", "60").general("workers", "2").start();
        let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
        a.simple_query("begin").await.unwrap();
        if second_term {
            s.terminate();
            assert!(wait_until(Duration::from_secs(20), || try_connect_blocking(s.port)), "still accepting");
            // The drain is in effect: it must not exit while the transaction is open.
            assert!(s.wait_exit(Duration::from_millis(300)).is_none(), "exited with a transaction open");
            s.terminate();
        } else {
            s.signal(libc::SIGQUIT);
        }
        let how = if second_term { "a second SIGTERM" } else { "SIGQUIT" };
        let status = s.wait_exit(Duration::from_secs(15));
        // A clean exit, not the signal's default action, that removes its Unix socket.
        assert!(status.is_some_and(|st| st.success()), "{how} did not stop sluice promptly and cleanly: {status:?}");
        let socket = s.socket_dir.join(format!(".s.PGSQL.{}", s.port));
        assert!(!socket.exists(), "{how} left {} behind", socket.display());
    }
}

/// Started by systemd with `Type=notify` (`NOTIFY_SOCKET` set), Sluice says `READY=1`
/// once it listens, and `STOPPING=1` when it begins to shut down.
#[test]
fn tells_the_service_manager_when_ready_and_stopping() {
    let pg = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let s = Sluice::builder(&pg).env("NOTIFY_SOCKET", path.to_str().unwrap()).start();
    let mut buf = [0u8; 64];
    let mut next = || {
        let n = socket.recv(&mut buf).expect("a message from sluice");
        String::from_utf8_lossy(&buf[..n]).into_owned()
    };
    assert_eq!(next(), "READY=1");
    s.terminate();
    assert_eq!(next(), "STOPPING=1");
}

/// A SIGHUP the instant `READY=1` is out (a service manager, or logrotate, sending it
/// then) is a reload, not the signal's default action, which ends the process: the
/// handlers are in place from the start of the runtime. (Run without the harness, which
/// waits for the port before returning, and so would not send the signal that early.)
#[test]
fn a_sighup_at_ready_is_a_reload() {
    let pg = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify");
    let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    socket.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let config = dir.path().join("sluice.toml");
    let text = Sluice::builder(&pg).general("unix_socket_dir", "\"\"").config_text();
    std::fs::write(&config, text).unwrap();
    let log = std::fs::File::create(dir.path().join("log")).unwrap();
    for round in 0..5 {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_sluice"))
            .arg("--config")
            .arg(&config)
            .env("NOTIFY_SOCKET", &path)
            .stderr(log.try_clone().unwrap())
            .spawn()
            .unwrap();
        let mut buf = [0u8; 64];
        let n = socket.recv(&mut buf).expect("READY=1");
        assert_eq!(&buf[..n], b"READY=1");
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGHUP) };
        let reloaded =
            || std::fs::read_to_string(dir.path().join("log")).unwrap().matches("configuration reloaded").count();
        let alive = common::wait_until(Duration::from_secs(10), || reloaded() > round);
        let status = child.try_wait().unwrap();
        assert!(alive && status.is_none(), "round {round}: {status:?}");
        // SAFETY: as above.
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
        assert_eq!(socket.recv(&mut buf).ok().map(|n| buf[..n].to_vec()), Some(b"STOPPING=1".to_vec()));
        assert!(common::wait_exit(&mut child, Duration::from_secs(20)).is_some(), "round {round}: no exit");
    }
}

/// PgBouncer's userlist.txt read as it is (`auth_file`): a user only in the file logs
/// in with the SCRAM secret it holds (here copied from pg_authid, as userlist files
/// often are), one also under `[users]` with the file's md5 hash; a reload reads the
/// file again (a user taken out of it is refused, with the wrong-password error).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_passwords_from_a_pgbouncer_userlist() {
    let pg = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("userlist.txt");
    let scram = pg.scram_secret(Role::SCRAM.name);
    let md5 = common::md5_secret(Role::MD5.name, Role::MD5.password);
    let both = format!("; from PgBouncer\n\"{}\" \"{scram}\"\n\"{}\" \"{md5}\"\n", Role::SCRAM.name, Role::MD5.name);
    std::fs::write(&file, &both).unwrap();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"md5\"")
        .general("auth_file", &common::toml_str(file.to_str().unwrap()))
        .without_user(Role::SCRAM.name)
        .without_user(Role::MD5.name)
        .user(Role::MD5.name, &[("pool_mode", "\"session\"")])
        .start();
    for role in [Role::SCRAM, Role::MD5] {
        let c = connect(s.port, role.name, role.password, "app").await;
        assert_eq!(value(&c, "select current_user").await, role.name);
    }
    let md5_only = format!("\"{}\" \"{md5}\"\n", Role::MD5.name);
    std::fs::write(&file, md5_only).unwrap();
    s.reload();
    let refused = common::eventually(Duration::from_secs(10), || async {
        try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await.is_err()
    })
    .await;
    assert!(refused, "a user taken out of the auth_file still logs in after a reload");
    // The file was read again, not dropped: its other user still logs in.
    let c = connect(s.port, Role::MD5.name, Role::MD5.password, "app").await;
    assert_eq!(value(&c, "select 1").await, "1");
    let e = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await.unwrap_err();
    assert_eq!(common::code(&e), "28P01", "{e}");
}

/// Under `scram-sha-256` an `auth_file` holding an md5 hash for one user loads, as in
/// PgBouncer, with a warning naming the file's line (logged, and printed by `--check`):
/// the file's other user logs in, and that one is refused as a wrong password is (28P01,
/// after `auth_failure_delay`, a "login failed" line saying why).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_md5_hash_in_the_auth_file_under_scram_refuses_only_that_user() {
    let pg = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("userlist.txt");
    let (scram, md5) = (pg.scram_secret(Role::SCRAM.name), common::md5_secret(Role::MD5.name, Role::MD5.password));
    std::fs::write(&file, format!("\"{}\" \"{scram}\"\n\"{}\" \"{md5}\"\n", Role::SCRAM.name, Role::MD5.name)).unwrap();
    let s = Sluice::builder(&pg)
        .general("auth_file", &common::toml_str(file.to_str().unwrap()))
        .general("auth_failure_delay", "0.5")
        .without_user(Role::SCRAM.name)
        .without_user(Role::MD5.name)
        .start();
    let warning = format!("{}:2: u_md5: an md5 hash cannot check SCRAM logins", file.display());
    assert!(s.wait_log(&warning, Duration::from_secs(10)), "{}", s.log());
    let sluice = env!("CARGO_BIN_EXE_sluice");
    let check = std::process::Command::new(sluice).arg("--check").arg("-c").arg(&s.config_path).output().unwrap();
    let stderr = String::from_utf8_lossy(&check.stderr);
    assert!(check.status.success() && stderr.contains(&warning), "--check: {stderr}");
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&c, "select current_user").await, Role::SCRAM.name);
    let asked = std::time::Instant::now();
    let e = try_connect(s.port, Role::MD5.name, Role::MD5.password, "app").await.unwrap_err();
    assert!(asked.elapsed() >= Duration::from_millis(500), "refused before auth_failure_delay");
    assert_eq!(common::code(&e), "28P01", "{e}");
    let message = e.as_db_error().map(|d| d.message().to_string());
    assert_eq!(message.as_deref(), Some("password authentication failed for user \"u_md5\""));
    let log = s.log();
    assert!(log.contains("its password is an md5 hash, which cannot check SCRAM"), "{log}");
    assert_eq!(value(&c, "select 1").await, "1", "the other user's session goes on");
    // A reload logs the warning again.
    s.reload();
    assert!(s.wait_log_times(&warning, 2, Duration::from_secs(10)), "{}", s.log());
}

/// `sluice --from-pgbouncer pgbouncer.ini` prints a config that `--check` accepts and
/// that serves the databases the ini had, with what it could not convert on stderr.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pgbouncer_ini_converted_serves_its_databases() {
    let pg = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("userlist.txt"), "\"u_md5\" \"pw_md5\"\n").unwrap();
    let port = common::free_port();
    let ini = format!(
        "[databases]\nmain = host=127.0.0.1 port={} dbname=app pool_size=2 application_name=x\n\
         [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
         auth_file = {}\npool_mode = transaction\nlogfile = /var/log/pgbouncer.log\n",
        pg.port,
        dir.path().join("userlist.txt").display()
    );
    std::fs::write(dir.path().join("pgbouncer.ini"), ini).unwrap();
    let sluice = env!("CARGO_BIN_EXE_sluice");
    let out = std::process::Command::new(sluice)
        .arg("--from-pgbouncer")
        .arg(dir.path().join("pgbouncer.ini"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let notes = String::from_utf8_lossy(&out.stderr);
    assert!(notes.contains("logfile") && notes.contains("application_name"), "{notes}");
    let converted = dir.path().join("sluice.toml");
    std::fs::write(&converted, &out.stdout).unwrap();
    let check = std::process::Command::new(sluice).arg("--check").arg("--config").arg(&converted).output().unwrap();
    assert!(
        check.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&check.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    let s = Sluice::start(&String::from_utf8_lossy(&out.stdout));
    let c = connect(s.port, Role::MD5.name, Role::MD5.password, "main").await;
    assert_eq!(value(&c, "select current_database()").await, "app");
}

/// `listen_addr` takes a host name, resolved when Sluice starts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listens_on_a_host_name() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("listen_addr", r#"["localhost"]"#).start();
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&c, "select 7").await, "7");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listens_on_ipv6_loopback_too() {
    if !common::has_ipv6_loopback() {
        eprintln!("no ::1 on this machine; IPv6 listening not exercised");
        return;
    }
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("listen_addr", "[\"127.0.0.1\", \"::1\"]").start();
    let url =
        format!("host=::1 port={} user={} password={} dbname=app", s.port, Role::SCRAM.name, Role::SCRAM.password);
    let (c, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    assert_eq!(value(&c, "select 6").await, "6");
}

#[test]
fn json_logs_are_one_object_per_line() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("log_format", "\"json\"").start();
    let out = common::psql_cmd(s.port, "127.0.0.1", Role::SCRAM.name, Role::SCRAM.password, "app")
        .args(["-c", "select 1"])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert!(s.wait_log("client disconnected", Duration::from_secs(20)));
    for line in s.log().lines().filter(|l| !l.trim().is_empty()) {
        assert!(line.starts_with('{') && line.ends_with('}'), "not a JSON object: {line}");
    }
}

/// The Unix socket file gets `unix_socket_mode` and `unix_socket_group` (the group of
/// the PostgreSQL server's OS user here, not the one Sluice runs as), and serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_unix_socket_has_its_mode_and_group() {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // scripts/test.sh, run as root (as CI runs it), makes the skip a failure.
        assert!(std::env::var_os("SLUICE_REQUIRE_ROOT").is_none(), "not root, though the test script runs as root");
        eprintln!("skipped: giving the socket another group needs root (CI runs as root)");
        return;
    }
    let gid = std::process::Command::new("id").args(["-g", "postgres"]).output().expect("id runs");
    let gid: u32 = String::from_utf8(gid.stdout).unwrap().trim().parse().expect("the postgres user's group");
    assert_ne!(gid, 0, "a group other than root's");
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("unix_socket_mode", &common::toml_str("0770"))
        .general("unix_socket_group", &common::toml_str("postgres"))
        .start();
    let meta = std::fs::metadata(s.socket_dir.join(format!(".s.PGSQL.{}", s.port))).unwrap();
    assert_eq!((meta.permissions().mode() & 0o777, meta.gid()), (0o770, gid));
    let c = common::connect_unix(&s.socket_dir, s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&c, "select 1").await, "1");
    // Run as the postgres OS user, with a group it is not in: the start fails at the
    // socket's chown, and leaves no socket file behind.
    let dir = tempfile::tempdir().unwrap();
    let port = common::free_port();
    let config = format!(
        "[general]\nlisten_addr = []\nlisten_port = {port}\nunix_socket_dir = {}\nunix_socket_group = \"root\"\n\
         [databases.app]\n",
        common::toml_str(&dir.path().display().to_string())
    );
    std::fs::write(dir.path().join("sluice.toml"), config).unwrap();
    let uid = std::process::Command::new("id").args(["-u", "postgres"]).output().expect("id runs");
    let uid: u32 = String::from_utf8(uid.stdout).unwrap().trim().parse().expect("the postgres user's id");
    for path in [dir.path().to_path_buf(), dir.path().join("sluice.toml")] {
        std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
    }
    let run = std::process::Command::new("setpriv")
        .args(["--reuid=postgres", "--regid=postgres", "--init-groups", "--"])
        .arg(env!("CARGO_BIN_EXE_sluice"))
        .arg("--config")
        .arg(dir.path().join("sluice.toml"))
        .output()
        .unwrap();
    assert!(!run.status.success(), "started with a group it is not in");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(stderr.contains("giving the socket the group root (unix_socket_group)"), "{stderr}");
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(left, [std::ffi::OsString::from("sluice.toml")], "{}", String::from_utf8_lossy(&run.stderr));
}

/// `so_reuseport`: a second Sluice (its own Unix socket off) starts on the first's port,
/// where without the option it cannot; the kernel spreads connections over both; once
/// the first stops, the second takes every new connection (a restart that refuses
/// none).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn so_reuseport_lets_a_second_process_share_the_port() {
    let pg = PgCluster::start();
    let mut first = Sluice::builder(&pg).general("so_reuseport", "true").start();
    // The first's config, with no Unix socket (a path cannot be shared).
    let config = |reuse: bool| {
        let text = first.config();
        fn own_socket(l: &str) -> &str {
            if l.starts_with("unix_socket_dir =") { "unix_socket_dir = \"\"" } else { l }
        }
        let lines: Vec<&str> = text.lines().map(own_socket).collect();
        lines.join("\n").replace("so_reuseport = true", &format!("so_reuseport = {reuse}"))
    };
    // (Run by hand: the harness's readiness check would see the first's listener.)
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("second.toml");
    std::fs::write(&path, config(false)).unwrap();
    let refused = std::process::Command::new(env!("CARGO_BIN_EXE_sluice")).arg("--config").arg(&path).output().unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success() && stderr.contains("in use"), "{stderr}");
    let second = Sluice::start(&config(true));
    assert!(second.wait_log("listening on 127.0.0.1", Duration::from_secs(10)), "{}", second.log());
    for _ in 0..24 {
        let c = connect(first.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
        assert_eq!(value(&c, "select 1").await, "1");
    }
    for s in [&first, &second] {
        assert!(s.log().contains("login peer="), "one process got no connection:\n{}", s.log());
    }
    first.terminate();
    assert!(first.wait_exit(Duration::from_secs(20)).is_some(), "the first did not stop");
    let before = second.log().matches("login peer=").count();
    for _ in 0..4 {
        let c = connect(second.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
        assert_eq!(value(&c, "select 1").await, "1");
    }
    assert_eq!(second.log().matches("login peer=").count(), before + 4);
}

/// A CancelRequest for (`pid`, `secret`) sent to `port`; returns once Sluice closes the
/// connection (None if it did not within 10 s).
fn raw_cancel(port: u16, pid: u32, secret: u32) -> Option<Duration> {
    use std::io::{Read, Write};
    let started = std::time::Instant::now();
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&common::raw::cancel_request(pid, secret)).unwrap();
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).ok().map(|_| started.elapsed())
}

/// Peering (`peer_id`, `[peers]`): a cancel request that reaches another process of the
/// group (as a load balancer or `so_reuseport` may route it) is forwarded to the one
/// whose key it is, over its Unix socket or TCP, in transaction and session mode, also
/// once that process has begun its shutdown (its Unix socket then takes cancel requests
/// only); a request for a peer without an entry, or one sent round in circles by a
/// wrong `[peers]` list, is dropped and its connection closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn peers_forward_cancel_requests_to_the_process_whose_key_it_is() {
    let pg = PgCluster::start();
    let (a, b) = (Sluice::builder(&pg), Sluice::builder(&pg));
    let (a_port, b_port, a_dir) = (a.port(), b.port(), a.socket_dir().display().to_string());
    let peers = |s: common::SluiceBuilder| {
        let (pa, pb, a_dir) = (a_port.to_string(), b_port.to_string(), common::toml_str(&a_dir));
        s.peer(1, &[("host", &a_dir), ("port", &pa)])
            .peer(2, &[("host", "\"127.0.0.1\""), ("port", &pb)])
            // A wrong entry: peer 3 is said to be process 1.
            .peer(3, &[("host", &a_dir), ("port", &pa)])
            .general("admin_users", "[\"u_scram\"]")
            .general("log_level", "\"info,sluice::cancel=debug\"")
    };
    let mut a = peers(a).general("peer_id", "1").start();
    let b = peers(b).general("peer_id", "2").general("pool_mode", "\"session\"").start();
    for (client_of, sent_to) in [(&a, &b), (&b, &a)] {
        let c = connect(client_of.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
        let token = c.cancel_token();
        let sleeper = tokio::spawn(async move { c.simple_query("select pg_sleep(30)").await.map(|_| ()) });
        assert!(pg.running("pg_sleep(30)"), "the query to cancel never started");
        common::cancel_processed(sent_to.port, &token).await;
        let r = tokio::time::timeout(Duration::from_secs(10), sleeper).await.unwrap().unwrap();
        assert_eq!(r.err().map(|e| common::code(&e)).as_deref(), Some("57014"), "client of {}", client_of.port);
    }
    assert!(b.log().contains(&format!("cancel request forwarded to peer 1 ({a_dir}:")), "{}", b.log());
    assert!(a.log().contains("cancel request forwarded to peer 2 (127.0.0.1:"), "{}", a.log());
    // SHOW PEERS lists the others, not the process itself.
    let console = common::console::admin(a.port).await;
    let ids: Vec<String> =
        common::console::rows(&console, "SHOW PEERS").await.iter().map(|r| r.get(0).unwrap().into()).collect();
    assert_eq!(ids, ["2", "3"]);
    let pools = common::console::rows(&console, "SHOW PEER_POOLS").await;
    assert_eq!(pools.iter().map(|r| r.get("cl_active_cancel_req").unwrap()).collect::<Vec<_>>(), ["0", "0"]);
    // A key of peer 3 sent to process 1 goes round three times, then is dropped; a key
    // of peer 9, which has no entry, is dropped at once. Neither connection hangs.
    let mark = |peer: u32| (3 << 30) | (peer << 16) | 0x1234;
    assert!(raw_cancel(a.port, 77, mark(3)).is_some(), "a request sent round in circles hangs");
    assert!(a.wait_log("cancel request for peer 3 dropped: it was forwarded three times", Duration::from_secs(5)));
    assert_eq!(a.log().matches("cancel request forwarded to peer 3").count(), 3, "{}", a.log());
    assert!(raw_cancel(b.port, 77, mark(9)).is_some(), "a request for an unknown peer hangs");
    assert!(b.wait_log("cancel request for peer 9 dropped: [peers] has no entry 9", Duration::from_secs(5)));
    // Process 1 shuts down (SIGTERM) while its client's query runs: the request that
    // process 2 takes is still forwarded to it, and its Unix socket refuses logins.
    let c = connect(a.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let token = c.cancel_token();
    let sleeper = tokio::spawn(async move { c.simple_query("select pg_sleep(30)").await.map(|_| ()) });
    assert!(pg.running("pg_sleep(30)"), "the query to cancel never started");
    // A connection taken on the Unix socket before the shutdown that never sends its
    // startup packet stops counting as a client when the shutdown begins: it holds up
    // no exit either (else it would until client_login_timeout).
    let socket = a.socket_dir.join(format!(".s.PGSQL.{}", a.port));
    let _early = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let logging_in = || common::console::cell(&console, "SHOW LISTS", "list", "login_clients", "items");
    assert!(common::eventually(Duration::from_secs(10), || async { logging_in().await.as_deref() == Some("1") }).await);
    a.terminate();
    assert!(a.wait_log("SIGTERM", Duration::from_secs(10)), "{}", a.log());
    let mut unix = tokio_postgres::Config::new();
    unix.host_path(&a.socket_dir).port(a.port).user(Role::SCRAM.name).password(Role::SCRAM.password).dbname("app");
    let refused = tokio::time::timeout(Duration::from_secs(10), unix.connect(tokio_postgres::NoTls));
    match refused.await.expect("a login hangs") {
        Err(e) => assert_eq!(common::code(&e), "57P03", "{e}"),
        Ok(_) => panic!("a login taken while shutting down"),
    }
    // A connection that sends nothing holds up no exit (not counted as a client).
    let _silent = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    common::cancel_processed(b.port, &token).await;
    let r = tokio::time::timeout(Duration::from_secs(10), sleeper).await.unwrap().unwrap();
    assert_eq!(r.err().map(|e| common::code(&e)).as_deref(), Some("57014"), "not cancelled while draining");
    assert!(a.wait_exit(Duration::from_secs(20)).is_some(), "process 1 did not stop once its client left");
}

/// A peer that takes cancel requests and never answers them (keeps each connection open),
/// handing what each connection sent to the test.
fn silent_peer() -> (u16, std::sync::mpsc::Receiver<Vec<u8>>) {
    use std::io::Read;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (sent, got) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for mut s in listener.incoming().flatten() {
            let mut packet = vec![0u8; 16];
            if s.read_exact(&mut packet).is_ok() && sent.send(packet).is_err() {
                return;
            }
            held.push(s);
        }
    });
    (port, got)
}

/// Forwards to a peer: at most its `pool_size` at once (the others wait, SHOW PEER_POOLS
/// and the metrics count both), each given up after `cancel_wait_timeout`, one hop fewer
/// marked; a reload moving the peer takes effect for the next request.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forwards_to_a_peer_are_limited_bounded_and_follow_reloads() {
    let pg = PgCluster::start();
    let ((first, got), (second, got_second)) = (silent_peer(), silent_peer());
    let metrics = common::free_port();
    let s = Sluice::builder(&pg)
        .general("metrics_listen", &format!("\"127.0.0.1:{metrics}\""))
        .general("peer_id", "1")
        .general("cancel_wait_timeout", "3")
        .general("admin_users", "[\"u_scram\"]")
        .general("log_level", "\"info,sluice::cancel=debug\"")
        .peer(2, &[("host", "\"127.0.0.1\""), ("port", &first.to_string()), ("pool_size", "1")])
        .start();
    let secret = (3 << 30) | (2 << 16) | 0x4321;
    let port = s.port;
    let console = common::console::admin(s.port).await;
    let requests: Vec<_> = (0..2).map(|_| std::thread::spawn(move || raw_cancel(port, 5, secret))).collect();
    let counts = || async {
        let rows = common::console::rows(&console, "SHOW PEER_POOLS").await;
        let n = |col: &str| rows[0].get(col).unwrap().to_string();
        (n("cl_active_cancel_req"), n("cl_waiting_cancel_req"))
    };
    let one_each = || async {
        let got = tokio::task::spawn_blocking(move || common::http::http_get(metrics, "/metrics")).await.unwrap();
        let text = got.map(|(_, body)| body).unwrap_or_default();
        let metric = |state: &str| {
            common::http::sample(&text, &format!("sluice_peer_cancel_requests{{peer_id=\"2\",state=\"{state}\"}}"))
        };
        (metric("active"), metric("waiting")) == (Some(1.0), Some(1.0))
            && counts().await == ("1".to_string(), "1".to_string())
    };
    assert!(common::eventually(Duration::from_secs(5), one_each).await, "not one forward and one waiting for the slot");
    let packet = got.recv_timeout(Duration::from_secs(5)).expect("nothing forwarded");
    let want = common::raw::cancel_request(5, (2 << 30) | (2 << 16) | 0x4321);
    assert_eq!(packet, want, "forwarded as sent, with one hop fewer");
    for r in requests {
        let took = tokio::task::block_in_place(|| r.join().unwrap()).expect("a forward hangs");
        assert!(took >= Duration::from_millis(2500), "given up after {took:?}");
    }
    assert!(s.wait_log_times("not through within cancel_wait_timeout", 2, Duration::from_secs(5)), "{}", s.log());
    assert_eq!(counts().await, ("0".to_string(), "0".to_string()));
    s.reload_replacing(&format!("port = {first}"), &format!("port = {second}"));
    let moved = std::thread::spawn(move || raw_cancel(port, 5, secret));
    assert_eq!(got_second.recv_timeout(Duration::from_secs(10)).expect("not sent to the moved peer"), want);
    assert!(tokio::task::block_in_place(|| moved.join().unwrap()).is_some());
}
