//! The admin console from outside: psql (simple protocol) sees PgBouncer 1.25's exact
//! columns, tokio-postgres (extended protocol) reads typed rows, and the commands act
//! on real pools: PAUSE/RESUME, KILL_CLIENT, DISABLE/ENABLE, RECONNECT, SET; who may
//! log in and who may only SHOW.

mod common;

use std::time::Duration;

use common::console::{admin, cell, message, rows};
use common::raw::{Raw, sqlstate, startup};
use common::{PgCluster, Role, Sluice, SluiceBuilder, code, connect, eventually, psql_cmd, try_connect, value};

/// Admin (u_scram) and stats (u_md5) users on top of the default test config.
fn with_console(b: SluiceBuilder) -> SluiceBuilder {
    b.general("admin_users", r#"["u_scram"]"#).general("stats_users", r#"["u_md5"]"#)
}

/// Runs `sql` on the console with psql; returns the header and the rows, split at `|`.
fn psql_show(port: u16, sql: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let out = psql_cmd(port, "127.0.0.1", Role::SCRAM.name, Role::SCRAM.password, "pgbouncer")
        .args(["-P", "tuples_only=off", "-P", "footer=off", "-F", "|", "-c", sql])
        .output()
        .expect("run psql");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "psql {sql}: {}{stdout}", String::from_utf8_lossy(&out.stderr));
    let mut lines = stdout.lines().map(|l| l.split('|').map(str::to_string).collect::<Vec<_>>());
    let header = lines.next().unwrap_or_default();
    (header, lines.collect())
}

fn cols(list: &str) -> Vec<String> {
    list.split_whitespace().map(str::to_string).collect()
}

const CONNECTION_COLUMNS: &str = "type user database replication state addr port local_addr local_port connect_time \
    request_time wait wait_us close_needed ptr link remote_pid tls application_name prepared_statements id";

/// Every SHOW and its exact columns (PgBouncer 1.25's, Sluice's own for the last three).
fn expected_columns() -> Vec<(&'static str, Vec<String>)> {
    let stats_part = "database server_assignment_count xact_count query_count bytes_received bytes_sent xact_time \
        query_time wait_time client_parse_count server_parse_count bind_count";
    let mut latency = cols("database user window_s");
    for what in ["xact", "query", "wait"] {
        latency.push(format!("{what}_count"));
        latency.extend(["p50", "p90", "p99", "p99_9"].iter().map(|q| format!("{what}_{q}_us")));
    }
    vec![
        (
            "POOLS",
            cols(
                "database user cl_active cl_waiting cl_active_cancel_req cl_waiting_cancel_req sv_active \
            sv_active_cancel sv_being_canceled sv_idle sv_used sv_tested sv_login maxwait maxwait_us pool_mode \
            load_balance_hosts",
            ),
        ),
        (
            "STATS",
            cols(
                "database total_server_assignment_count total_xact_count total_query_count total_received \
            total_sent total_xact_time total_query_time total_wait_time total_client_parse_count \
            total_server_parse_count total_bind_count avg_server_assignment_count avg_xact_count avg_query_count \
            avg_recv avg_sent avg_xact_time avg_query_time avg_wait_time avg_client_parse_count \
            avg_server_parse_count avg_bind_count",
            ),
        ),
        ("STATS_TOTALS", cols(stats_part)),
        ("STATS_AVERAGES", cols(stats_part)),
        ("TOTALS", cols("name value")),
        ("CLIENTS", cols(CONNECTION_COLUMNS)),
        ("SERVERS", cols(CONNECTION_COLUMNS)),
        (
            "DATABASES",
            cols(
                "name host port database force_user pool_size min_pool_size reserve_pool_size \
            server_lifetime pool_mode load_balance_hosts max_connections current_connections max_client_connections \
            current_client_connections paused disabled",
            ),
        ),
        (
            "USERS",
            cols(
                "name pool_size reserve_pool_size pool_mode max_user_connections current_connections \
            max_user_client_connections current_client_connections",
            ),
        ),
        ("CONFIG", cols("key value default changeable")),
        ("LISTS", cols("list items")),
        ("STATE", cols("key value")),
        ("VERSION", cols("version")),
        ("MEM", cols("name size used free memtotal")),
        (
            "PREPARED_STATEMENTS",
            cols(
                "database user client_statements server_statements cache_hits cache_misses \
            client_parse_count server_parse_count bind_count",
            ),
        ),
        ("LATENCY", latency),
    ]
}

async fn app_client(port: u16) -> tokio_postgres::Client {
    connect(port, Role::SCRAM.name, Role::SCRAM.password, "app").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_show_has_pgbouncer_columns_over_psql() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg)).start();
    let c = app_client(s.port).await;
    value(&c, "select 1").await;
    for (what, expected) in expected_columns() {
        let (header, rows) =
            tokio::task::spawn_blocking(move || psql_show(s.port, &format!("SHOW {what}"))).await.unwrap();
        assert_eq!(header, expected, "SHOW {what}");
        for r in &rows {
            assert_eq!(r.len(), expected.len(), "SHOW {what}: row {r:?}");
        }
    }
    let (_, pools) = psql_show(s.port, "show pools;");
    assert!(pools.iter().any(|r| r[0] == "app" && r[1] == "u_scram" && r[15] == "transaction"), "{pools:?}");
    let (_, dbs) = psql_show(s.port, "SHOW DATABASES");
    assert!(dbs.iter().any(|r| r[0] == "pgbouncer") && dbs.iter().any(|r| r[0] == "app"), "{dbs:?}");
    // SHOW HELP is a notice; two statements in one Query; the alias reaches the console
    let out = psql_cmd(s.port, "127.0.0.1", Role::SCRAM.name, Role::SCRAM.password, "sluice")
        .args(["-c", "SHOW HELP", "-c", "SHOW VERSION; SHOW STATE"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("SHOW HELP|CONFIG") && text.contains("Sluice ") && text.contains("paused|no"), "{text}");
    drop(s);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_protocol_and_stats_after_traffic() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg)).general("stats_period", "1").start();
    let c = app_client(s.port).await;
    for _ in 0..20 {
        c.query_one("select 1::int8", &[]).await.unwrap();
    }
    let a = admin(s.port).await;
    // tokio-postgres: Parse/Describe/Sync, then Bind (binary results)/Execute/Sync
    let pools = a.query("SHOW POOLS", &[]).await.unwrap();
    let p = pools.iter().find(|r| r.get::<_, &str>("database") == "app").expect("app pool");
    assert_eq!(p.get::<_, &str>("user"), "u_scram");
    assert_eq!(p.get::<_, i64>("cl_active"), 1);
    assert_eq!(p.get::<_, i64>("sv_idle") + p.get::<_, i64>("sv_active"), 1);
    let stmt = a.prepare("SHOW STATS").await.unwrap();
    assert_eq!(stmt.columns()[1].name(), "total_server_assignment_count");
    let stats = a.query(&stmt, &[]).await.unwrap();
    let app = stats.iter().find(|r| r.get::<_, &str>("database") == "app").expect("app stats");
    assert!(app.get::<_, i64>("total_xact_count") >= 20);
    assert!(app.get::<_, i64>("total_query_count") >= 20);
    assert!(app.get::<_, i64>("total_received") > 0 && app.get::<_, i64>("total_sent") > 0);
    assert!(app.get::<_, i64>("total_bind_count") >= 20);
    // errors skip to Sync and the session goes on
    let e = a.query("SHOW NOTHING", &[]).await.unwrap_err();
    assert_eq!(code(&e), tokio_postgres::error::SqlState::SYNTAX_ERROR.code(), "{e}");
    assert!(a.execute("RESUME", &[]).await.is_ok());
    // averages over stats_period = 1 s while traffic flows
    let busy = tokio::spawn(async move {
        for _ in 0..1_000_000 {
            if c.query_one("select 1::int8", &[]).await.is_err() {
                break;
            }
        }
    });
    let averaged = eventually(Duration::from_secs(10), || async {
        cell(&a, "SHOW STATS_AVERAGES", "database", "app", "xact_count").await.is_some_and(|v| v != "0")
    })
    .await;
    assert!(averaged, "no average after traffic");
    let xacts = cell(&a, "SHOW LATENCY", "database", "app", "xact_count").await.unwrap();
    assert!(xacts.parse::<u64>().unwrap() > 0, "{xacts}");
    let p99 = cell(&a, "SHOW LATENCY", "database", "app", "xact_p99_us").await.unwrap();
    assert!(p99.parse::<u64>().unwrap() > 0, "{p99}");
    let total: u64 = cell(&a, "SHOW TOTALS", "name", "total_xact_count", "value").await.unwrap().parse().unwrap();
    assert!(total >= 20);
    // Every row named as PgBouncer's SHOW TOTALS names it (its stats fields).
    let names: Vec<String> =
        rows(&a, "SHOW TOTALS").await.iter().filter_map(|r| r.get("name").map(String::from)).collect();
    let fields = "server_assignment_count xact_count query_count client_bytes server_bytes xact_time \
                  query_time wait_time ps_client_parse_count ps_server_parse_count ps_bind_count";
    let want: Vec<String> =
        ["total", "avg"].iter().flat_map(|p| fields.split_whitespace().map(move |f| format!("{p}_{f}"))).collect();
    assert_eq!(names, want);
    busy.abort();
    let logged = s.log().lines().any(|l| l.contains("stats: ") && l.contains(" binds/s, in "));
    assert!(logged, "no log_stats line of all databases:\n{}", s.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_new_transactions_until_resume() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg)).start();
    let c = app_client(s.port).await;
    let pid_before = value(&c, "select pg_backend_pid()").await;
    let a = admin(s.port).await;
    a.simple_query("PAUSE app").await.unwrap();
    // PAUSE returned: every server connection of the database is closed
    assert_eq!(cell(&a, "SHOW SERVERS", "database", "app", "id").await, None);
    assert_eq!(cell(&a, "SHOW DATABASES", "name", "app", "paused").await.as_deref(), Some("1"));
    let held = tokio::spawn(async move { value(&c, "select pg_backend_pid()").await });
    let waiting = eventually(Duration::from_secs(10), || async {
        cell(&a, "SHOW POOLS", "database", "app", "cl_waiting").await.as_deref() == Some("1")
    })
    .await;
    assert!(waiting, "the client did not wait while paused");
    assert!(!held.is_finished());
    a.simple_query("RESUME app").await.unwrap();
    let pid_after = tokio::time::timeout(Duration::from_secs(10), held).await.expect("held after RESUME").unwrap();
    assert_ne!(pid_before, pid_after, "PAUSE closes server connections");
    assert_eq!(cell(&a, "SHOW DATABASES", "name", "app", "paused").await.as_deref(), Some("0"));
    // PAUSE waits for transactions in progress to end
    let c = app_client(s.port).await;
    c.simple_query("begin").await.unwrap();
    let pausing = tokio::spawn(async move {
        let p = admin(s.port).await;
        p.simple_query("PAUSE").await.map(|_| ())
    });
    let flagged = eventually(Duration::from_secs(10), || async {
        cell(&a, "SHOW STATE", "key", "paused", "value").await.as_deref() == Some("yes")
    })
    .await;
    assert!(flagged && !pausing.is_finished(), "PAUSE returned while a transaction was open");
    assert_eq!(value(&c, "select 8").await, "8", "the open transaction goes on while pausing");
    c.simple_query("commit").await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), pausing).await.expect("PAUSE returns after commit").unwrap().unwrap();
    a.simple_query("RESUME").await.unwrap();
    assert_eq!(value(&c, "select 9").await, "9");
    // SIGUSR1 pauses everything, SIGUSR2 resumes
    for (signal, paused) in [(libc::SIGUSR1, "yes"), (libc::SIGUSR2, "no")] {
        // SAFETY: kill(2) on our own child process.
        assert_eq!(unsafe { libc::kill(s.pid() as libc::pid_t, signal) }, 0);
        let seen = eventually(Duration::from_secs(10), || async {
            cell(&a, "SHOW STATE", "key", "paused", "value").await.as_deref() == Some(paused)
        })
        .await;
        assert!(seen, "signal {signal}: SHOW STATE paused is not {paused}");
    }
}

/// A client still logging in is listed and waits as `waiting` for the server its login
/// needs (session mode, the only server taken), and KILL ends that login at once with
/// 57P01, not after RESUME.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_reaches_a_client_still_logging_in() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg))
        .general("pool_mode", "\"session\"")
        .database("app", &[("pool_size", "1")])
        .start();
    let holder = app_client(s.port).await;
    let port = s.port;
    let login = tokio::spawn(async move { try_connect(port, Role::SCRAM.name, Role::SCRAM.password, "app").await });
    let a = admin(s.port).await;
    let queued = eventually(Duration::from_secs(10), || async {
        cell(&a, "SHOW POOLS", "database", "app", "cl_waiting").await.as_deref() == Some("1")
    })
    .await;
    assert!(queued, "the login never waited for the server");
    assert_eq!(cell(&a, "SHOW CLIENTS", "state", "waiting", "database").await.as_deref(), Some("app"));
    a.simple_query("KILL app").await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), login).await.expect("KILL did not end the login");
    let Err(e) = ended.unwrap() else { panic!("the killed login succeeded") };
    assert_eq!(code(&e), "57P01", "{e}");
    assert!(holder.simple_query("select 1").await.is_err(), "KILL ends the connected client too");
    a.simple_query("RESUME app").await.unwrap();
    assert_eq!(value(&app_client(s.port).await, "select 2").await, "2");
}

/// A client still in its authentication exchange (SCRAM, silent after Sluice's first
/// message) is listed as `login` (not yet among the database's clients); KILL_CLIENT
/// ends it with 57P01, and a SIGTERM shutdown does not wait for such a client, nor for
/// a console login in the same state or a connection yet to send its startup packet (as
/// it would, up to client_login_timeout).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_and_shutdown_reach_a_client_in_authentication() {
    let pg = PgCluster::start();
    let mut s = with_console(Sluice::builder(&pg))
        .general("client_login_timeout", "60")
        .general("shutdown_timeout", "60")
        .start();
    let silent = |port, database| {
        let mut r = Raw::open(port);
        r.send(&startup(
            &[("user", Role::SCRAM.name), ("database", database), ("application_name", "silent")],
            3 << 16,
        ));
        assert_eq!(r.recv().expect("an authentication request").0, b'R');
        r
    };
    // The FATAL a silent client gets, and whether the connection then closes.
    let ending = |mut r: Raw| {
        tokio::task::spawn_blocking(move || {
            let m = r.recv().expect("an error before the connection closes");
            (m.0, sqlstate(&m.1), r.recv().is_none())
        })
    };
    let first = silent(s.port, "app");
    let a = admin(s.port).await;
    let id = cell(&a, "SHOW CLIENTS", "state", "login", "id").await.expect("listed while authenticating");
    assert_eq!(cell(&a, "SHOW CLIENTS", "id", &id, "user").await.as_deref(), Some(Role::SCRAM.name));
    assert_eq!(cell(&a, "SHOW CLIENTS", "id", &id, "application_name").await.as_deref(), Some("silent"));
    // Not logged in yet: not one of the database's clients.
    let current = cell(&a, "SHOW DATABASES", "name", "app", "current_client_connections").await;
    assert_eq!(current.as_deref(), Some("0"));
    a.simple_query(&format!("KILL_CLIENT {id}")).await.unwrap();
    assert_eq!(ending(first).await.unwrap(), (b'E', "57P01".to_string(), true));
    // A pooled login and a console login, both authenticating, and a connection that
    // has sent only part of its startup packet (refused as new logins are while shutting
    // down). `mute` first: the others' answers show it was accepted before the SIGTERM.
    let mut mute = Raw::open(s.port);
    mute.send(&[0, 0, 0]);
    let second = silent(s.port, "app");
    let console = silent(s.port, "pgbouncer");
    drop(a);
    s.terminate();
    assert_eq!(ending(second).await.unwrap(), (b'E', "57P01".to_string(), true));
    assert_eq!(ending(console).await.unwrap(), (b'E', "57P01".to_string(), true));
    assert_eq!(ending(mute).await.unwrap(), (b'E', "57P03".to_string(), true));
    let exit = s.wait_exit(Duration::from_secs(20));
    assert!(exit.is_some_and(|st| st.success()), "shutdown waited for the login: {exit:?}\n{}", s.log());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_client_disable_and_reconnect() {
    let pg = PgCluster::start();
    // Two workers: the console's KILL wakes a session on another thread.
    let s = with_console(Sluice::builder(&pg).general("workers", "2")).database("app", &[("pool_size", "1")]).start();
    // the victim's connection task keeps its result: the FATAL the client received
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(s.port).user(Role::SCRAM.name).password(Role::SCRAM.password).dbname("app");
    let (victim, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
    let task = tokio::spawn(connection);
    value(&victim, "select 1").await;
    let a = admin(s.port).await;
    let id = cell(&a, "SHOW CLIENTS", "database", "app", "id").await.expect("client listed");
    a.simple_query(&format!("KILL_CLIENT {id}")).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), task).await.expect("killed client's connection ends");
    let fatal = ended.unwrap().expect_err("the client got an error");
    assert_eq!(code(&fatal), "57P01", "{fatal:?}");
    assert!(victim.simple_query("select 1").await.is_err());
    let e = a.simple_query("KILL_CLIENT 999999").await.unwrap_err();
    assert!(message(&e).contains("no such client"), "{e}");

    // RECONNECT: the next transaction gets a new server connection
    let c = app_client(s.port).await;
    let pid1 = value(&c, "select pg_backend_pid()").await;
    assert_eq!(value(&c, "select pg_backend_pid()").await, pid1);
    a.simple_query("RECONNECT app").await.unwrap();
    a.simple_query("WAIT_CLOSE app").await.unwrap();
    assert_ne!(value(&c, "select pg_backend_pid()").await, pid1);

    // DISABLE refuses new logins, connected clients go on; ENABLE lets them in again
    a.simple_query("DISABLE app").await.unwrap();
    let Err(e) = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await else {
        panic!("login was not refused")
    };
    assert_eq!(code(&e), "55000", "{e}");
    assert_eq!(value(&c, "select 7").await, "7");
    assert_eq!(cell(&a, "SHOW DATABASES", "name", "app", "disabled").await.as_deref(), Some("1"));
    a.simple_query("ENABLE app").await.unwrap();
    app_client(s.port).await;
    // SET changes a runtime key, validated
    a.simple_query("SET default_pool_size = 7").await.unwrap();
    assert_eq!(cell(&a, "SHOW CONFIG", "key", "default_pool_size", "value").await.as_deref(), Some("7"));
    let e = a.simple_query("SET default_pool_size = 0").await.unwrap_err();
    assert!(message(&e).contains("at least 1"), "{e}");
    assert_eq!(code(&e), "22023", "{e}");
    let e = a.simple_query("SET listen_port = 1").await.unwrap_err();
    assert!(message(&e).contains("restart"), "{e}");
    assert_eq!(code(&e), "55P02", "{e}");
    let e = a.simple_query("SET no_such_key = 1").await.unwrap_err();
    assert_eq!(code(&e), "42704", "{e}");
    let e = a.simple_query("SUSPEND").await.unwrap_err();
    assert_eq!(code(&e), "0A000", "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn who_may_use_the_console() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg)).start();
    // not listed: refused after authentication
    let Err(e) = try_connect(s.port, Role::PLAIN.name, Role::PLAIN.password, "pgbouncer").await else {
        panic!("login was not refused")
    };
    assert_eq!(code(&e), "42501", "{e}");
    // listed, wrong password
    let Err(e) = try_connect(s.port, Role::SCRAM.name, "wrong", "pgbouncer").await else {
        panic!("login was not refused")
    };
    assert_eq!(code(&e), "28P01", "{e}");
    // stats user: SHOW yes, commands no
    let st = connect(s.port, Role::MD5.name, Role::MD5.password, "pgbouncer").await;
    assert!(!rows(&st, "SHOW USERS").await.is_empty());
    for cmd in ["PAUSE", "RESUME", "RELOAD", "KILL app", "SET log_stats = 0", "SHUTDOWN"] {
        let e = st.simple_query(cmd).await.unwrap_err();
        assert_eq!(code(&e), "42501", "{cmd}: {e}");
        let e = st.execute(cmd, &[]).await.unwrap_err();
        assert_eq!(code(&e), "42501", "{cmd}: {e}");
    }
    // the console itself is listed among the clients; a client without a console role
    // still reaches its databases
    let a = admin(s.port).await;
    assert!(cell(&a, "SHOW CLIENTS", "database", "pgbouncer", "user").await.is_some());
    let plain = connect(s.port, Role::PLAIN.name, Role::PLAIN.password, "app").await;
    assert_eq!(value(&plain, "select 3").await, "3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_from_the_console() {
    let pg = PgCluster::start();
    let mut s = with_console(Sluice::builder(&pg)).start();
    // The client's connection task, kept to read the error that ends it.
    let mut config = tokio_postgres::Config::new();
    config.host("127.0.0.1").port(s.port).user(Role::SCRAM.name).password(Role::SCRAM.password).dbname("app");
    let (c, conn) = config.connect(tokio_postgres::NoTls).await.unwrap();
    let conn = tokio::spawn(conn);
    c.simple_query("create table shut (a int); begin; insert into shut values (1)").await.unwrap();
    let a = admin(s.port).await;
    // WAIT_FOR_SERVERS (docs/admin.md): as SIGTERM, stop accepting, close each client
    // when its transaction ends, exit when none is left.
    a.simple_query("SHUTDOWN WAIT_FOR_SERVERS").await.expect("SHUTDOWN WAIT_FOR_SERVERS is accepted");
    // New logins are refused: the listener is closed (refused, or reset if the connection
    // reached its backlog as it closed), or one accepted meanwhile gets 57P03.
    let (port, last) = (s.port, &std::sync::Mutex::new(String::new()));
    let refused = eventually(Duration::from_secs(10), || async move {
        let Err(e) = try_connect(port, Role::SCRAM.name, Role::SCRAM.password, "app").await else {
            *last.lock().unwrap() = "a login was accepted".into();
            return false;
        };
        use std::io::ErrorKind::{ConnectionRefused, ConnectionReset};
        let io = std::error::Error::source(&e).and_then(|s| s.downcast_ref::<std::io::Error>());
        *last.lock().unwrap() = format!("{e:?}");
        code(&e) == "57P03" || io.is_some_and(|io| matches!(io.kind(), ConnectionRefused | ConnectionReset))
    })
    .await;
    assert!(refused, "new logins are not refused during the shutdown: {}", last.lock().unwrap());
    // The idle console client is closed at once; the open transaction goes on, and its
    // commit succeeds.
    assert!(eventually(Duration::from_secs(10), || async { a.is_closed() }).await, "the idle console client stayed");
    assert!(!c.is_closed(), "the client was closed in its transaction");
    assert_eq!(value(&c, "select 5").await, "5");
    c.simple_query("commit").await.expect("the open transaction commits");
    assert_eq!(pg.psql("select count(*) from shut"), "1", "the commit did not reach the server");
    // Then the client is closed with 57P01, and Sluice exits.
    let end = tokio::time::timeout(Duration::from_secs(10), conn).await.expect("the client stayed after its commit");
    let end = end.unwrap().expect_err("the client's connection ended without an error");
    assert_eq!(code(&end), "57P01", "{end}");
    assert!(s.wait_exit(Duration::from_secs(20)).is_some_and(|st| st.success()), "{}", s.log());
}

/// A client that a KILL_CLIENT finds waiting for a server (the pool's only connection
/// is in a transaction) leaves at once with 57P01, and the statement it had sent never
/// runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_client_reaches_a_client_waiting_for_a_server() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg)).database("app", &[("pool_size", "1")]).start();
    let holder = app_client(s.port).await;
    holder.simple_query("create table killed_waiting (a int)").await.unwrap();
    holder.simple_query("begin").await.unwrap();
    let victim = app_client(s.port).await;
    let insert = tokio::spawn(async move { victim.simple_query("insert into killed_waiting values (1)").await });
    let a = admin(s.port).await;
    let waiting = eventually(Duration::from_secs(10), || async {
        cell(&a, "SHOW CLIENTS", "state", "waiting", "id").await.is_some()
    })
    .await;
    assert!(waiting, "the victim never waited");
    let id = cell(&a, "SHOW CLIENTS", "state", "waiting", "id").await.expect("a waiting client");
    a.simple_query(&format!("KILL_CLIENT {id}")).await.unwrap();
    // Ends while the holder's transaction is still open: the wait itself was cut short.
    let ended = tokio::time::timeout(Duration::from_secs(10), insert).await.expect("the waiting client was not killed");
    let e = ended.unwrap().expect_err("the client got an error");
    assert_eq!(code(&e), "57P01", "{e}");
    holder.simple_query("commit").await.unwrap();
    assert_eq!(value(&holder, "select count(*) from killed_waiting").await, "0", "the killed client's insert ran");
}

/// RESUME of a database that is not paused on its own is refused, as in PgBouncer:
/// not paused at all, or paused only as part of everything (`PAUSE`, `KILL` or SIGUSR1
/// without a name), where it resumed nothing and said RESUME.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_of_a_database_not_paused_on_its_own_is_refused() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg)).start();
    let a = admin(s.port).await;
    let e = a.simple_query("RESUME app").await.unwrap_err();
    assert_eq!((code(&e), message(&e)), ("55000".to_string(), "database app is not paused".to_string()));
    a.simple_query("PAUSE").await.unwrap();
    let e = a.simple_query("RESUME app").await.unwrap_err();
    assert_eq!(code(&e), "55000");
    assert!(message(&e).contains("RESUME without a name"), "{e}");
    assert_eq!(cell(&a, "SHOW DATABASES", "name", "app", "paused").await.as_deref(), Some("1"));
    a.simple_query("RESUME").await.unwrap();
    assert_eq!(cell(&a, "SHOW DATABASES", "name", "app", "paused").await.as_deref(), Some("0"));
    assert_eq!(value(&app_client(s.port).await, "select 1").await, "1");
}

/// Console errors: a RELOAD of a broken file is PostgreSQL's config file error
/// (F0000); a statement sent to the console by mistake is refused, and the log, which
/// names the error, does not echo the statement (it may hold a password).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_errors_name_their_kind_and_keep_statements_out_of_the_log() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg)).start();
    let a = admin(s.port).await;
    let e = a.simple_query("ALTER ROLE app PASSWORD 'hunter2'").await.unwrap_err();
    assert!(message(&e).starts_with("invalid command"), "{e}");
    assert!(s.wait_log("pooler error: invalid command", Duration::from_secs(10)), "{}", s.log());
    assert!(!s.log().contains("hunter2"), "{}", s.log());
    s.write_config("[general]\nlisten_port = \"nope\"\n");
    let e = a.simple_query("RELOAD").await.unwrap_err();
    assert_eq!(code(&e), "F0000", "{e}");
}

/// A pool of one whose connection is checked before every loan, by a check that takes
/// 2 s (`pg_sleep(2)`, which `PgCluster::running` can see).
fn checked_slowly(pg: &PgCluster) -> Sluice {
    with_console(Sluice::builder(pg))
        .general("server_check_delay", "0")
        .general("server_check_query", "\"select pg_sleep(2)\"")
        .database("app", &[("pool_size", "1")])
        .start()
}

/// A client killed while the server it got is being checked (`server_check_query`,
/// here one that takes a while) leaves without its request being sent: the check's end
/// does not let the request through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_killed_during_its_servers_check_sends_nothing() {
    let pg = PgCluster::start();
    let s = checked_slowly(&pg);
    let victim = app_client(s.port).await;
    victim.simple_query("create table killed_checking (a int)").await.unwrap();
    let insert = tokio::spawn(async move { victim.simple_query("insert into killed_checking values (1)").await });
    assert!(pg.running("pg_sleep(2)"), "the server check never ran");
    let a = admin(s.port).await;
    let id = cell(&a, "SHOW CLIENTS", "state", "waiting", "id").await.expect("the victim waits for its check");
    a.simple_query(&format!("KILL_CLIENT {id}")).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), insert).await.expect("the victim was not killed");
    let e = ended.unwrap().expect_err("the client got an error");
    assert_eq!(code(&e), "57P01", "{e}");
    // The check over, the server is lent to the next client: the insert never ran.
    let next = app_client(s.port).await;
    assert_eq!(value(&next, "select count(*) from killed_checking").await, "0", "the killed client's insert ran");
}

/// RECONNECT while a connection is being checked before its loan: once the check
/// passes it is closed, not lent even once, and the client gets a new connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_marked_during_its_check_is_not_lent() {
    let pg = PgCluster::start();
    let s = checked_slowly(&pg);
    let c = app_client(s.port).await;
    let first = value(&c, "select pg_backend_pid()").await;
    let second = tokio::spawn(async move { value(&c, "select pg_backend_pid()").await });
    assert!(pg.running("pg_sleep(2)"), "the server check never ran");
    admin(s.port).await.simple_query("RECONNECT app").await.unwrap();
    let second = tokio::time::timeout(Duration::from_secs(20), second).await.expect("no answer").unwrap();
    assert_ne!(second, first, "the connection marked during its check was lent");
}

/// Sends `PAUSE app` from a console client of its own, and returns once the console
/// `a` shows it in effect; the task ends when the PAUSE does.
async fn start_pause(
    port: u16,
    a: &tokio_postgres::Client,
) -> tokio::task::JoinHandle<Result<(), tokio_postgres::Error>> {
    let pausing = tokio::spawn(async move { admin(port).await.simple_query("PAUSE app").await.map(|_| ()) });
    let flagged = eventually(Duration::from_secs(10), || async {
        cell(a, "SHOW DATABASES", "name", "app", "paused").await.as_deref() == Some("1")
    })
    .await;
    assert!(flagged, "PAUSE not in effect");
    pausing
}

/// Clients queued for a server when PAUSE arrives wait for RESUME: the connection
/// coming back during the pause is closed, not replaced for them. A RESUME while the
/// PAUSE still waits for a transaction ends that PAUSE with an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_queued_clients_and_resume_ends_a_pending_pause() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg)).database("app", &[("pool_size", "1")]).start();
    let a = admin(s.port).await;
    let holder = app_client(s.port).await;
    holder.simple_query("begin").await.unwrap();
    let queued = app_client(s.port).await;
    let query = tokio::spawn(async move { value(&queued, "select 42").await });
    let waiting = eventually(Duration::from_secs(10), || async {
        cell(&a, "SHOW POOLS", "database", "app", "cl_waiting").await.as_deref() == Some("1")
    })
    .await;
    assert!(waiting, "the second client never queued");
    let port = s.port;
    let pausing = start_pause(port, &a).await;
    holder.simple_query("commit").await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), pausing).await.expect("PAUSE returns").unwrap().unwrap();
    assert_eq!(cell(&a, "SHOW SERVERS", "database", "app", "id").await, None, "a server is open while paused");
    assert!(!query.is_finished(), "a queued client was served while paused");
    let held = cell(&a, "SHOW POOLS", "database", "app", "cl_waiting").await;
    assert_eq!(held.as_deref(), Some("1"), "the queued client is not held by the PAUSE");
    a.simple_query("RESUME app").await.unwrap();
    assert_eq!(tokio::time::timeout(Duration::from_secs(10), query).await.expect("served after RESUME").unwrap(), "42");

    // RESUME during a PAUSE that waits for an open transaction.
    holder.simple_query("begin").await.unwrap();
    let pausing = start_pause(port, &a).await;
    a.simple_query("RESUME app").await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), pausing).await.expect("the PAUSE still waits").unwrap();
    let e = r.expect_err("a PAUSE ended by RESUME reports it");
    assert_eq!(code(&e), "57014", "{e}");
    assert!(message(&e).contains("RESUME"), "{e}");
    assert_eq!(value(&holder, "select 5").await, "5");
    holder.simple_query("commit").await.unwrap();
}

/// A database removed by a reload while PAUSEd: its clients waiting for RESUME get
/// `57P03` at once instead of waiting out `query_wait_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_waiting_on_a_paused_database_learn_it_was_removed() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg))
        .general("query_wait_timeout", "30")
        .database("gone", &[("dbname", "\"app\"")])
        .start();
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "gone").await;
    assert_eq!(value(&c, "select 1").await, "1");
    let a = admin(s.port).await;
    a.simple_query("PAUSE gone").await.unwrap();
    let waiting = tokio::spawn(async move { c.simple_query("select 2").await.map(|_| ()) });
    let held = eventually(Duration::from_secs(10), || async {
        cell(&a, "SHOW POOLS", "database", "gone", "cl_waiting").await.as_deref() == Some("1")
    })
    .await;
    assert!(held, "the client is not held by the PAUSE");
    reload_without(&s, "[databases.gone]");
    let r = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("still waiting").unwrap();
    let e = r.expect_err("an error");
    assert_eq!(code(&e), "57P03");
    assert!(message(&e).contains("its database was removed by a reload"), "{e}");
}

/// Reloads `s` with the config section `header` removed.
fn reload_without(s: &Sluice, header: &str) {
    let cfg = s.config();
    let start = cfg.find(header).unwrap_or_else(|| panic!("no {header} in\n{cfg}"));
    let end = cfg[start + 1..].find("\n[").map_or(cfg.len(), |i| start + 2 + i);
    s.write_config(&format!("{}{}", &cfg[..start], &cfg[end..]));
    s.reload();
    assert!(s.wait_log("configuration reloaded", Duration::from_secs(10)));
}

/// A user removed by a reload: its transaction-mode clients are told so at their next
/// transaction (57P03, naming the reason), as the clients of a removed database are;
/// other users' clients go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_of_a_removed_user_learn_why_at_their_next_transaction() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg)).start();
    let gone = connect(s.port, Role::PLAIN.name, Role::PLAIN.password, "app").await;
    let kept = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&gone, "select 1").await, "1");
    reload_without(&s, &format!("[users.{}]", Role::PLAIN.name));
    let e = gone.simple_query("select 2").await.expect_err("the removed user's client was served");
    assert_eq!(code(&e), "57P03", "{e}");
    assert!(message(&e).contains("a reload removed its user"), "{e}");
    assert_eq!(value(&kept, "select 3").await, "3");
}

/// The byte Sluice answers an SSLRequest with: `S` (TLS offered) or `N`.
fn ssl_answer(port: u16) -> u8 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    s.write_all(&[0, 0, 0, 8, 0x04, 0xd2, 0x16, 0x2f]).unwrap();
    let mut b = [0u8; 1];
    s.read_exact(&mut b).unwrap();
    b[0]
}

/// SET of a TLS key loads that side's TLS setup for connections from now on; one whose
/// files cannot be used is refused and changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_of_a_tls_key_takes_effect_or_is_refused() {
    let pg = PgCluster::start();
    let certs = common::TestCerts::generate();
    let quoted = |p: &std::path::Path| format!("\"{}\"", p.display());
    let s = with_console(Sluice::builder(&pg))
        .general("client_tls_sslmode", "\"allow\"")
        .general("client_tls_cert_file", &quoted(&certs.server.cert))
        .general("client_tls_key_file", &quoted(&certs.server.key))
        .start();
    assert_eq!(ssl_answer(s.port), b'S');
    let a = admin(s.port).await;
    let e = a.simple_query("SET client_tls_cert_file = '/nonexistent/server.crt'").await.unwrap_err();
    assert_eq!(code(&e), "22023");
    assert!(message(&e).contains("client_tls_cert_file"), "{}", message(&e));
    assert_eq!(ssl_answer(s.port), b'S', "a refused SET changed the TLS setup");
    let shown = |rows: Vec<tokio_postgres::SimpleQueryRow>| {
        rows.iter()
            .find(|r| r.get("key") == Some("client_tls_cert_file"))
            .and_then(|r| r.get("value").map(String::from))
    };
    assert_eq!(shown(rows(&a, "SHOW CONFIG").await), Some(certs.server.cert.display().to_string()));
    a.simple_query("SET client_tls_sslmode = 'disable'").await.unwrap();
    assert_eq!(ssl_answer(s.port), b'N');
    a.simple_query("SET client_tls_sslmode = 'allow'").await.unwrap();
    assert_eq!(ssl_answer(s.port), b'S');
}

/// A console client stays one after a reload renames `admin_database`: a `KILL` of
/// every database leaves it connected (it would have ended it as a pooled client of a
/// database called `pgbouncer`), and SHOW DATABASES counts it on the console's row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_spares_console_clients_after_admin_database_is_renamed() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg)).general("admin_database", "\"pgbouncer\"").start();
    let old = admin(s.port).await;
    let c = app_client(s.port).await;
    assert_eq!(value(&c, "select 1").await, "1");
    s.reload_replacing("admin_database = \"pgbouncer\"", "admin_database = \"console\"");
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "console").await;
    let counted = cell(&a, "SHOW DATABASES", "name", "console", "current_client_connections").await;
    assert_eq!(counted.as_deref(), Some("2"), "both console clients on the console's row");
    a.simple_query("KILL").await.unwrap();
    c.simple_query("select 2").await.expect_err("the pooled client is killed");
    assert!(!rows(&old, "SHOW VERSION").await.is_empty(), "the console client from before the rename was killed");
    a.simple_query("RESUME").await.unwrap();
    assert_eq!(value(&app_client(s.port).await, "select 3").await, "3");
}

/// A reload keeps the running value of a key read only at start-up: SHOW CONFIG shows
/// the value in force, and the log names the key whose file value changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_config_after_a_reload_shows_the_start_up_keys_in_force() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg)).general("log_level", "\"info\"").start();
    s.reload_replacing("log_level = \"info\"", "log_level = \"warn\"");
    assert!(s.log().contains("general.log_level: changed in the file"), "{}", s.log());
    let a = admin(s.port).await;
    assert_eq!(cell(&a, "SHOW CONFIG", "key", "log_level", "value").await.as_deref(), Some("info"));
}

/// A Query of thousands of SHOW statements from a client that does not read its
/// answers: the console sends them as it goes, at the client's pace, instead of
/// building all of them (here ~200 MB) in memory first.
#[test]
fn a_huge_console_query_is_answered_at_the_clients_pace() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("auth_type", "\"trust\"").general("stats_users", r#"["u_trust"]"#).start();
    let rss_kb = || {
        let status = std::fs::read_to_string(format!("/proc/{}/status", s.pid())).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS").to_string();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap()
    };
    let before = rss_kb();
    let mut c = Raw::login(s.port, "u_trust", "pgbouncer");
    c.send(&common::raw::query(&"show config;".repeat(80_000)));
    // Watched for 10 s (what is checked is that something does not happen; all of
    // it built in memory took ~200 MB within a few seconds).
    let mut most = before;
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline && most < before + 50_000 {
        most = most.max(rss_kb());
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(most < before + 50_000, "resident memory grew from {before} kB to {most} kB");
    // It was being answered all along: the first answers wait in the socket.
    let first = c.recv().expect("no answer to the query");
    assert_eq!(first.0, b'T', "{first:?}");
    drop(c);
}

/// After an error in an extended-protocol message the console ignores everything up to
/// the Sync, a simple Query too, as PostgreSQL does: one ReadyForQuery, for the Sync.
#[test]
fn the_console_skips_a_query_behind_an_extended_error() {
    use common::raw::{parse, query, sync, tags};
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("auth_type", "\"trust\"").general("stats_users", r#"["u_trust"]"#).start();
    let mut c = Raw::login(s.port, "u_trust", "pgbouncer");
    c.send(&[parse("", "SHOW NOTHING"), query("SHOW VERSION"), sync(), query("SHOW STATE")].concat());
    let m = c.until_ready();
    assert_eq!(tags(&m), "EZ", "{m:?}");
    assert_eq!(sqlstate(&m[0].1), "42601");
    let m = c.until_ready();
    assert_eq!(tags(&m), "TDDDCZ", "the next query's answer: {m:?}");
}
