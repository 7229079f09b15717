//! Documented behaviours checked end to end against a real PostgreSQL, each test naming
//! the passage of docs/ it holds Sluice to: the per-client bound on prepared statements,
//! `trust` and `plain` logins, the connection log switches, `SET default_pool_size` on a
//! live pool, KILL_CLIENT inside a transaction, `SHUTDOWN WAIT_FOR_CLIENTS` and
//! `shutdown_timeout`.

mod common;

use std::time::{Duration, Instant};

use common::console::{admin, cell, message, rows};
use common::raw::{Raw, sqlstate, startup};
use common::{
    PgCluster, Role, Sluice, SluiceBuilder, code, connect, eventually, md5_secret, toml_str, try_connect, value,
    wait_until,
};

/// The default test config with u_scram (the console helpers' user) in `admin_users`.
fn with_console(b: SluiceBuilder) -> SluiceBuilder {
    b.general("admin_users", r#"["u_scram"]"#)
}

async fn app_client(port: u16) -> tokio_postgres::Client {
    connect(port, Role::SCRAM.name, Role::SCRAM.password, "app").await
}

/// A client of `app` as u_scram whose connection task yields the connection's end: the
/// FATAL Sluice sent, or Ok when it closed without one.
async fn client_with_end(
    port: u16,
) -> (tokio_postgres::Client, tokio::task::JoinHandle<Result<(), tokio_postgres::Error>>) {
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(port)
        .user(Role::SCRAM.name)
        .password(Role::SCRAM.password)
        .dbname("app")
        .ssl_mode(tokio_postgres::config::SslMode::Disable)
        .connect_timeout(Duration::from_secs(10));
    let (client, connection) = config.connect(tokio_postgres::NoTls).await.expect("login through sluice");
    (client, tokio::spawn(connection))
}

/// How many clients Sluice counts (SHOW LISTS: logged in plus logging in), the console
/// asking included. A client's count drops only after its last log line is written.
async fn clients_counted(a: &tokio_postgres::Client) -> usize {
    let lists = rows(a, "SHOW LISTS").await;
    let item = |name: &str| -> usize {
        let row =
            lists.iter().find(|r| r.get("list") == Some(name)).unwrap_or_else(|| panic!("no {name} in SHOW LISTS"));
        row.get("items").and_then(|v| v.parse().ok()).expect("a count")
    };
    item("used_clients") + item("login_clients")
}

/// docs/config.md `max_client_prepared_statements`: the named prepared statements one
/// client may hold in transaction mode are bounded; one closed makes room again, and a
/// client that prepares one more than the bound is disconnected with `FATAL 53400`.
/// The bound is per client: another client prepares its own at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn preparing_beyond_max_client_prepared_statements_is_fatal_53400() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("max_client_prepared_statements", "4").start();
    let (c, end) = client_with_end(s.port).await;
    let mut held = Vec::new();
    for i in 0..4 {
        held.push(c.prepare(&format!("select {i}::int4")).await.unwrap_or_else(|e| panic!("statement {i}: {e}")));
    }
    // Dropping a tokio-postgres Statement sends its Close: the client holds three.
    held.pop();
    held.push(c.prepare("select 4::int4").await.expect("a statement in place of the one closed"));
    for (st, want) in held.iter().zip([0, 1, 2, 4]) {
        assert_eq!(c.query_one(st, &[]).await.unwrap().get::<_, i32>(0), want);
    }
    let other = app_client(s.port).await;
    let theirs = other.prepare("select 5::int4").await.expect("another client's own statement");
    assert_eq!(other.query_one(&theirs, &[]).await.unwrap().get::<_, i32>(0), 5);
    // Four held: a fifth is one too many.
    let e = c.prepare("select 5::int4").await.expect_err("a fifth statement was accepted");
    assert_eq!(code(&e), "53400", "{e:?}");
    assert!(message(&e).contains("max_client_prepared_statements"), "{e}");
    assert_eq!(e.as_db_error().map(|d| d.severity()), Some("FATAL"), "{e:?}");
    let ended = tokio::time::timeout(Duration::from_secs(10), end).await.expect("the connection stays open");
    let _ = ended.unwrap();
    assert!(c.simple_query("select 1").await.is_err(), "the client goes on after its FATAL");
    assert_eq!(other.query_one(&theirs, &[]).await.unwrap().get::<_, i32>(0), 5, "the other client was touched");
}

/// docs/behaviour.md (errors table, `28000`): under `auth_type = "trust"`, a user in
/// the config logs in without a password, and one not in it is refused with `FATAL
/// 28000`, also a role PostgreSQL itself would let in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_refuses_a_user_not_in_the_config_with_28000() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("auth_type", "\"trust\"").start();
    let c = connect(s.port, Role::TRUST.name, "", "app").await;
    assert_eq!(value(&c, "select current_user").await, Role::TRUST.name);
    // u_admin is a role of the cluster (PostgreSQL would take it) but not in Sluice's users.
    for user in [Role::ADMIN.name, "nobody_at_all"] {
        let Err(e) = try_connect(s.port, user, "", "app").await else { panic!("{user} logged in under trust") };
        assert_eq!(code(&e), "28000", "{user}: {e:?}");
        assert!(message(&e).contains(user), "{user}: {e}");
    }
}

/// docs/config.md `log_connections` / `log_disconnections`: by default each login and
/// each disconnection is logged; with both false neither is (nor the console's login).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_connections_and_log_disconnections_switch_their_lines() {
    let pg = PgCluster::start();
    for quiet in [false, true] {
        let mut b = with_console(Sluice::builder(&pg));
        if quiet {
            b = b.general("log_connections", "false").general("log_disconnections", "false");
        }
        let s = b.start();
        let c = connect(s.port, Role::MD5.name, Role::MD5.password, "app").await;
        assert_eq!(value(&c, "select 1").await, "1");
        drop(c);
        let a = admin(s.port).await;
        // Only the console left: Sluice is done with u_md5's connection, log lines and all.
        let done = eventually(Duration::from_secs(10), || async { clients_counted(&a).await == 1 }).await;
        assert!(done, "the client that left is still counted");
        let log = s.log();
        let login = log.lines().any(|l| l.contains(" login ") && l.contains("u_md5"));
        let disconnected = log.lines().any(|l| l.contains("client disconnected"));
        let console_login = log.contains("admin console login");
        if quiet {
            assert!(!login && !disconnected && !console_login, "logged with both off:\n{log}");
        } else {
            assert!(login && disconnected && console_login, "not logged by default:\n{log}");
        }
    }
}

/// docs/admin.md `SET key = value` and docs/config.md `default_pool_size`: `SET
/// default_pool_size` resizes a pool that already exists at once: with the pool at the
/// default 20 and two server connections open, right after `SET default_pool_size = 1`
/// (before the janitor's next pass) a client holds a transaction and another waits
/// (`cl_waiting` 1) instead of being lent the idle connection beyond the new size, which
/// is closed; the waiter goes on once that transaction ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_default_pool_size_resizes_an_existing_pool() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg)).start();
    let holder = app_client(s.port).await;
    let other = app_client(s.port).await;
    // The pool exists and has room for both at once.
    holder.simple_query("begin").await.unwrap();
    assert_eq!(value(&other, "select 1").await, "1");
    holder.simple_query("commit").await.unwrap();
    let servers = || pg.backends("usename = 'u_scram'");
    assert_eq!(servers(), 2);
    let a = admin(s.port).await;
    assert_eq!(cell(&a, "SHOW CONFIG", "key", "default_pool_size", "value").await.as_deref(), Some("20"));
    a.simple_query("SET default_pool_size = 1").await.unwrap();
    assert_eq!(cell(&a, "SHOW CONFIG", "key", "default_pool_size", "value").await.as_deref(), Some("1"));
    holder.simple_query("begin").await.unwrap();
    let waiter = tokio::spawn(async move { value(&other, "select 2").await });
    let waiting = eventually(Duration::from_secs(10), || async {
        cell(&a, "SHOW POOLS", "database", "app", "cl_waiting").await.as_deref() == Some("1")
    })
    .await;
    assert!(waiting, "the second client did not wait: finished {}", waiter.is_finished());
    assert!(!waiter.is_finished(), "the second client got a server beside the open transaction");
    let shrunk = tokio::task::block_in_place(|| wait_until(Duration::from_secs(5), || servers() == 1));
    assert!(shrunk, "{} server connections after SET default_pool_size = 1", servers());
    holder.simple_query("commit").await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(10), waiter).await.expect("served after the commit");
    assert_eq!(answer.unwrap(), "2");
}

/// docs/config.md `auth_type`: `plain` asks for the password in clear text
/// (AuthenticationCleartextPassword) and checks it against the user's password of any
/// kind (plain, md5 hash, SCRAM secret); a wrong password, or an unknown user, gets
/// `FATAL 28P01`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_auth_takes_a_clear_text_password_against_any_kind_of_secret() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"plain\"")
        .user(Role::SCRAM.name, &[("password", &toml_str(&pg.scram_secret(Role::SCRAM.name)))])
        .user(Role::MD5.name, &[("password", &toml_str(&md5_secret(Role::MD5.name, Role::MD5.password)))])
        .start();
    // The request on the wire: AuthenticationCleartextPassword (code 3).
    let mut raw = Raw::open(s.port);
    raw.send(&startup(&[("user", Role::PLAIN.name), ("database", "app")], 3 << 16));
    let (tag, body) = raw.recv().expect("an authentication request");
    assert_eq!((tag, body.as_slice()), (b'R', &3u32.to_be_bytes()[..]), "not a clear-text password request");
    // u_plain: a plain password; u_scram: a SCRAM secret; u_md5: an md5 hash.
    for role in [Role::PLAIN, Role::SCRAM, Role::MD5] {
        let c = connect(s.port, role.name, role.password, "app").await;
        assert_eq!(value(&c, "select current_user").await, role.name);
        let Err(e) = try_connect(s.port, role.name, "wrong", "app").await else {
            panic!("{} logged in with a wrong password", role.name)
        };
        assert_eq!(code(&e), "28P01", "{}: {e:?}", role.name);
    }
    let Err(e) = try_connect(s.port, "nobody_at_all", "whatever", "app").await else {
        panic!("an unknown user logged in")
    };
    assert_eq!(code(&e), "28P01", "{e:?}");
}

/// docs/admin.md `KILL_CLIENT id`: the client gets `FATAL 57P01 terminated by the
/// admin console` and its open transaction is rolled back: another client does not see
/// its insert, no server is left idle in a transaction, and (as for any client that
/// leaves mid-transaction, docs/behaviour.md "Failures") its server is rolled back and
/// given back to the pool: the next client of the pool of one gets the same backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_client_rolls_back_its_open_transaction() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg)).general("workers", "2").database("app", &[("pool_size", "1")]).start();
    let (victim, end) = client_with_end(s.port).await;
    victim.simple_query("create table killed_tx (a int)").await.unwrap();
    victim.simple_query("begin; insert into killed_tx values (1)").await.unwrap();
    let backend = value(&victim, "select pg_backend_pid()").await;
    assert_eq!(value(&victim, "select count(*) from killed_tx").await, "1");
    let a = admin(s.port).await;
    let id = cell(&a, "SHOW CLIENTS", "database", "app", "id").await.expect("the victim is listed");
    a.simple_query(&format!("KILL_CLIENT {id}")).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), end).await.expect("the killed client's connection ends");
    let fatal = ended.unwrap().expect_err("the killed client got no FATAL");
    assert_eq!(code(&fatal), "57P01", "{fatal:?}");
    assert_eq!(message(&fatal), "terminated by the admin console");
    let next = app_client(s.port).await;
    assert_eq!(value(&next, "select count(*) from killed_tx").await, "0", "the killed client's insert survived");
    assert_eq!(value(&next, "select pg_backend_pid()").await, backend, "the server was not given back");
    assert_eq!(pg.backends("state like 'idle in transaction%'"), 0);
}

/// docs/admin.md `SHUTDOWN WAIT_FOR_CLIENTS`: Sluice stops accepting and exits only
/// once every client has left by itself, with no time limit (`shutdown_timeout` does not
/// apply); clients in a transaction or idle go on meanwhile. A connection still before
/// its startup packet gets `FATAL 57P03` at once, and new connections are not taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_wait_for_clients_exits_once_the_clients_leave() {
    let pg = PgCluster::start();
    let mut s = with_console(Sluice::builder(&pg)).general("shutdown_timeout", "1").start();
    let busy = app_client(s.port).await;
    busy.simple_query("create table quiescing (a int)").await.unwrap();
    busy.simple_query("begin; insert into quiescing values (1)").await.unwrap();
    let idle = app_client(s.port).await;
    // Part of a startup packet, sent before the console's login: accepted before the SHUTDOWN.
    let mut early = Raw::open(s.port);
    early.send(&[0, 0, 0]);
    let a = admin(s.port).await;
    a.simple_query("SHUTDOWN WAIT_FOR_CLIENTS").await.unwrap();
    let refused = tokio::task::spawn_blocking(move || {
        let (tag, body) = early.recv().expect("an error for the connection before its startup packet");
        (tag, sqlstate(&body), early.recv().is_none())
    });
    let refused = tokio::time::timeout(Duration::from_secs(10), refused).await.expect("57P03 at once").unwrap();
    assert_eq!(refused, (b'E', "57P03".to_string(), true));
    let stopped =
        eventually(Duration::from_secs(10), || async { std::net::TcpStream::connect(("127.0.0.1", s.port)).is_err() })
            .await;
    assert!(stopped, "still accepting connections after SHUTDOWN WAIT_FOR_CLIENTS");
    match try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await {
        Ok(_) => panic!("a login went through after SHUTDOWN WAIT_FOR_CLIENTS"),
        Err(e) => assert!(e.code().is_none_or(|c| c.code() == "57P03"), "{e:?}"),
    }
    drop(a);
    // Past shutdown_timeout (1 s) it still runs, and its clients go on.
    assert!(s.wait_exit(Duration::from_millis(1500)).is_none(), "exited with clients connected");
    assert_eq!(value(&busy, "select count(*) from quiescing").await, "1");
    busy.simple_query("commit").await.unwrap();
    assert_eq!(value(&idle, "select count(*) from quiescing").await, "1", "the commit was lost");
    drop(busy);
    assert_eq!(value(&idle, "select 2").await, "2", "a client was closed before leaving by itself");
    assert!(s.wait_exit(Duration::from_millis(300)).is_none(), "exited with a client connected");
    drop(idle);
    let status = s.wait_exit(Duration::from_secs(10));
    assert!(status.is_some_and(|st| st.success()), "no clean exit once the clients left: {status:?}\n{}", s.log());
}

/// docs/config.md `shutdown_timeout`: after SIGTERM Sluice waits for the open
/// transaction, but only `shutdown_timeout` seconds: with 1 and a transaction left
/// open, it exits about a second after the signal, the transaction going on until then
/// and never committed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_exits_after_shutdown_timeout_with_a_transaction_open() {
    let pg = PgCluster::start();
    let mut s = Sluice::builder(&pg).general("shutdown_timeout", "1").start();
    let c = app_client(s.port).await;
    c.simple_query("create table held_open (a int)").await.unwrap();
    c.simple_query("begin; insert into held_open values (1)").await.unwrap();
    let signalled = Instant::now();
    s.terminate();
    assert_eq!(value(&c, "select count(*) from held_open").await, "1", "the transaction was cut short");
    let status = s.wait_exit(Duration::from_secs(10));
    let took = signalled.elapsed();
    assert!(status.is_some_and(|st| st.success()), "no clean exit 10 s after SIGTERM: {status:?}");
    assert!(took >= Duration::from_secs(1), "exited after {took:?}, before shutdown_timeout");
    assert!(took < Duration::from_secs(4), "exited only after {took:?}");
    assert!(s.log().contains("shutdown_timeout reached with 1 clients left"), "{}", s.log());
    assert!(c.simple_query("select 1").await.is_err(), "the client outlived sluice");
    assert_eq!(pg.psql("select count(*) from held_open"), "0", "the open transaction was committed");
}

/// docs/admin.md `SHOW STATS` (`total_server_assignment_count`, `total_wait_time`): a
/// session-mode client is assigned its server once, at login, and a login that waited
/// for one counts its wait, as a transaction's assignment does in the pooled modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_logins_count_their_assignment_and_wait() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg))
        .general("pool_mode", "\"session\"")
        .database("app", &[("pool_size", "1")])
        .start();
    let first = app_client(s.port).await;
    let port = s.port;
    let second = tokio::spawn(async move { app_client(port).await });
    let a = admin(s.port).await;
    let waiting = eventually(Duration::from_secs(10), || async {
        cell(&a, "SHOW POOLS", "database", "app", "cl_waiting").await.as_deref() == Some("1")
    })
    .await;
    assert!(waiting, "the second login did not wait for the one server");
    drop(first);
    let second = tokio::time::timeout(Duration::from_secs(10), second).await.expect("never served").unwrap();
    assert_eq!(value(&second, "select 1").await, "1");
    let stat = |col: &'static str| {
        let a = &a;
        async move { cell(a, "SHOW STATS", "database", "app", col).await.unwrap().parse::<u64>().unwrap() }
    };
    assert_eq!(stat("total_server_assignment_count").await, 2);
    assert!(stat("total_wait_time").await > 0, "the second login's wait not counted");
}

/// docs/admin.md `SHOW CLIENTS` / `SHOW SERVERS` `request_time`: a session-mode client's
/// last request, not its login, though it keeps its server (and state) throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_request_time_follows_requests() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg)).general("pool_mode", "\"session\"").start();
    let c = app_client(s.port).await;
    let pid = value(&c, "select pg_backend_pid()").await;
    let a = admin(s.port).await;
    let row = |sql: &'static str, key: &'static str, at: String| {
        let a = &a;
        async move { rows(a, sql).await.into_iter().find(|r| r.get(key) == Some(at.as_str())).expect("a row") }
    };
    let times = |r: &tokio_postgres::SimpleQueryRow| {
        (r.get("connect_time").unwrap().to_string(), r.get("request_time").unwrap().to_string())
    };
    // (The times are shown to the second: a second passes first.)
    tokio::time::sleep(Duration::from_millis(1100)).await;
    assert_eq!(value(&c, "select 1").await, "1");
    let client = row("SHOW CLIENTS", "database", "app".into()).await;
    let (connected, requested) = times(&client);
    assert!(requested > connected, "client: request_time {requested} not after connect_time {connected}");
    let server = row("SHOW SERVERS", "remote_pid", pid).await;
    let (_, server_requested) = times(&server);
    assert_eq!(server_requested, requested, "the server's request_time");
}

/// docs/behaviour.md ("Signals"): at the shutdown's last phase a running query is
/// cancelled before the process exits, not left running on PostgreSQL (holding its
/// locks with no pooler): with `shutdown_timeout` out, and with the last client leaving
/// during the drain while its query runs. The client in the first case gets 57P01.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queries_running_at_exit_are_cancelled_first() {
    for leaves in [false, true] {
        let pg = PgCluster::start();
        let timeout = if leaves { "30" } else { "1" };
        let mut s = Sluice::builder(&pg).general("shutdown_timeout", timeout).start();
        let (c, end) = client_with_end(s.port).await;
        let sleeping = tokio::spawn(async move { c.simple_query("select pg_sleep(30)").await.map(drop) });
        let running = "state = 'active' and query = 'select pg_sleep(30)'";
        assert!(tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || pg.backends(running) == 1)));
        s.terminate();
        if leaves {
            // The client's socket closes while its query runs (its app stopping too:
            // no Terminate).
            end.abort();
        }
        let status = tokio::task::block_in_place(|| s.wait_exit(Duration::from_secs(15)));
        assert!(status.is_some_and(|st| st.success()), "leaves {leaves}: no clean exit: {status:?}");
        // Checked once the process is gone: nothing is left to send the cancel after.
        let gone = tokio::task::block_in_place(|| wait_until(Duration::from_secs(2), || pg.backends(running) == 0));
        assert!(gone, "leaves {leaves}: the query still runs after Sluice exited");
        let r = tokio::time::timeout(Duration::from_secs(5), sleeping).await.expect("no answer").unwrap();
        if !leaves {
            let e = r.expect_err("the query ran to its end");
            let ended = tokio::time::timeout(Duration::from_secs(5), end).await.expect("no end").unwrap();
            // (The FATAL reaches the query's caller or the connection's task.)
            let told = [Some(code(&e)), ended.as_ref().err().map(code)];
            assert!(told.contains(&Some("57P01".to_string())), "no 57P01: {e:?} / {ended:?}");
        }
    }
}

/// docs/behaviour.md (Parameters): settings given at connect time are set again after
/// another client's SET, also when that SET comes behind a comment (a query tag, as
/// Rails or sqlcommenter prepend them): `/* ... */ SET statement_timeout = 0` by one
/// client leaves the next client, on the same server, with its own value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_behind_a_comment_does_not_reach_the_next_client() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).database("app", &[("pool_size", "1")]).start();
    let client = || async {
        let mut cfg = tokio_postgres::Config::new();
        cfg.host("127.0.0.1").port(s.port).user(Role::SCRAM.name).password(Role::SCRAM.password).dbname("app");
        cfg.options("-c statement_timeout=5000");
        let (c, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("login");
        tokio::spawn(conn);
        c
    };
    let (a, b) = (client().await, client().await);
    for sql in ["/* app:web */ SET statement_timeout = 0", "-- tagged\nSET statement_timeout = 0"] {
        a.simple_query(sql).await.unwrap();
        assert_eq!(value(&b, "show statement_timeout").await, "5s", "after {sql:?}");
    }
}

/// docs/config.md `server_reset_query`: a reset query other than `DISCARD ALL` (from an
/// older PgBouncer setup) resets only what it resets. `RESET ALL` run after every
/// transaction leaves prepared statements in place (a client's statement runs again
/// without 42P05); `DEALLOCATE ALL` at the end of a session leaves the settings, so the
/// next session gets the server reset before its own are set (not the last client's
/// time zone).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_query_other_than_discard_all_is_taken_for_what_it_does() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("server_reset_query", "\"RESET ALL\"")
        .general("server_reset_query_always", "true")
        .general("pool_mode", "\"transaction\"")
        .database("app", &[("pool_size", "1")])
        .start();
    let c = app_client(s.port).await;
    let stmt = c.prepare("select 41 + 1").await.unwrap();
    for _ in 0..3 {
        let row = c.query_one(&stmt, &[]).await.expect("the statement ran again after RESET ALL");
        assert_eq!(row.get::<_, i32>(0), 42);
    }
    let pg2 = PgCluster::start();
    let s = Sluice::builder(&pg2)
        .general("server_reset_query", "\"DEALLOCATE ALL\"")
        .general("pool_mode", "\"session\"")
        .database("app", &[("pool_size", "1")])
        .start();
    let default = pg2.psql("show timezone");
    assert_ne!(default, "Asia/Tokyo");
    let mut cfg = tokio_postgres::Config::new();
    cfg.host("127.0.0.1").port(s.port).user(Role::SCRAM.name).password(Role::SCRAM.password).dbname("app");
    cfg.options("-c TimeZone=Asia/Tokyo");
    let (a, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("login");
    let conn = tokio::spawn(conn);
    let pid = value(&a, "select pg_backend_pid()").await;
    assert_eq!(value(&a, "show timezone").await, "Asia/Tokyo");
    drop(a);
    let _ = conn.await;
    let b = app_client(s.port).await;
    assert_eq!(value(&b, "select pg_backend_pid()").await, pid, "the same server");
    assert_eq!(value(&b, "show timezone").await, default, "the last session's setting stayed");
}

/// docs/config.md `tcp_defer_accept`: a connection that sends nothing waits in the
/// kernel about a second (PgBouncer's value), then is taken up and so bounded by
/// `client_login_timeout` (here 1 s): closed with its FATAL within seconds, not after
/// the minute a larger value keeps it out of sight.
#[test]
fn a_silent_connection_is_taken_up_within_seconds() {
    use std::io::Read;
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("client_login_timeout", "1").start();
    let mut silent = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
    silent.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let started = Instant::now();
    let mut got = Vec::new();
    let _ = silent.read_to_end(&mut got);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(10), "closed only after {took:?}");
    assert_eq!(got.first(), Some(&b'E'), "no FATAL: {got:?}");
    assert!(String::from_utf8_lossy(&got).contains("client_login_timeout"), "{got:?}");
}

/// docs/admin.md `PAUSE`: one cut short because a reload removed the database says so
/// (`57014`, naming the removal), not "ended by RESUME", which nobody sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_cut_short_by_a_removal_says_why() {
    let pg = PgCluster::start();
    let s = with_console(Sluice::builder(&pg))
        .general("pool_mode", "\"session\"")
        .database("gone", &[("dbname", "\"app\"")])
        .start();
    let held = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "gone").await;
    assert_eq!(value(&held, "select 1").await, "1");
    let port = s.port;
    let pausing = tokio::spawn(async move {
        let a = admin(port).await;
        a.simple_query("PAUSE gone").await.map(drop)
    });
    let a = admin(s.port).await;
    let paused = eventually(Duration::from_secs(10), || async {
        cell(&a, "SHOW DATABASES", "name", "gone", "paused").await.as_deref() == Some("1")
    })
    .await;
    assert!(paused, "PAUSE not in effect");
    let cfg = s.config();
    let start = cfg.find("[databases.gone]").expect("the section");
    let end = cfg[start + 1..].find("\n[").map_or(cfg.len(), |i| start + 2 + i);
    s.write_config(&format!("{}{}", &cfg[..start], &cfg[end..]));
    s.reload();
    let e = tokio::time::timeout(Duration::from_secs(10), pausing).await.expect("PAUSE still waits").unwrap();
    let e = e.expect_err("PAUSE completed with the client's server held");
    assert_eq!(code(&e), "57014");
    assert!(message(&e).contains("its database was removed by a reload"), "{e}");
}

/// docs/config.md `shutdown_timeout`: a reload during the drain that lowers it applies
/// to that drain (counted from its start), as a SET would: an operator can cut short a
/// drain held by an open transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_during_the_drain_applies_its_shutdown_timeout() {
    let pg = PgCluster::start();
    let mut s = Sluice::builder(&pg).general("shutdown_timeout", "60").start();
    let c = app_client(s.port).await;
    c.simple_query("begin").await.unwrap();
    s.terminate();
    assert_eq!(value(&c, "select 1").await, "1", "the transaction goes on during the drain");
    s.reload_replacing("shutdown_timeout = 60", "shutdown_timeout = 1");
    let reloaded = Instant::now();
    let status = tokio::task::block_in_place(|| s.wait_exit(Duration::from_secs(20)));
    assert!(status.is_some_and(|st| st.success()), "no clean exit: {status:?}");
    assert!(reloaded.elapsed() < Duration::from_secs(10), "the drain kept its 60 s: {:?}", reloaded.elapsed());
    assert!(s.log().contains("shutdown_timeout reached with 1 clients left"), "{}", s.log());
}
