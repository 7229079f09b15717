//! PgBouncer settings and behaviours, against a real PostgreSQL: the console's own user
//! `pgbouncer` on the Unix socket, the check of an idle server before a
//! loan (`server_check_query`), the bound on forwarding a cancel request
//! (`cancel_wait_timeout`), the log of the errors Sluice itself sends clients
//! (`log_pooler_errors`), session-mode servers closed with their clients
//! (`server_fast_close`), `max_packet_size`, `application_name_add_host`, and
//! `auth_type = "any"`.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering::SeqCst};
use std::time::{Duration, Instant};

use tokio::io::AsyncReadExt;
use tokio::net::{TcpListener, TcpStream};

use common::{PgCluster, Role, Sluice, Stopped, connect, try_connect, value, wait_until};

/// `proxy`'s `hold`: hold the next connection; one is held.
const HOLD_NEXT: u8 = 1;
const HELD: u8 = 2;

fn sluice(pg: &PgCluster, extra: &[(&str, &str)]) -> Sluice {
    let mut b = Sluice::builder(pg).database("app", &[("pool_size", "1")]);
    for (k, v) in extra {
        b = b.general(k, v);
    }
    b.start()
}

/// A TCP proxy to PostgreSQL at `target`: connections are relayed, except the first
/// opened once `hold` is `HOLD_NEXT`, which is read and never answered or closed (a
/// server that cannot be reached, for a cancel request); `hold` is `HELD` then.
async fn proxy(target: u16, hold: Arc<AtomicU8>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            let held = hold.compare_exchange(HOLD_NEXT, HELD, SeqCst, SeqCst).is_ok();
            tokio::spawn(async move {
                if held {
                    let mut sink = [0u8; 64];
                    while matches!(client.read(&mut sink).await, Ok(n) if n > 0) {}
                    std::future::pending::<()>().await;
                }
                let Ok(mut server) = TcpStream::connect(("127.0.0.1", target)).await else { return };
                let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
            });
        }
    });
    port
}

/// `server_check_query` is what a loan's check runs (`server_check_delay = 0`: before
/// every loan): each transaction's check advances the sequence once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_check_runs_server_check_query() {
    let pg = PgCluster::start();
    pg.psql("create sequence checks; grant usage on sequence checks to public");
    let s = sluice(&pg, &[("server_check_delay", "0"), ("server_check_query", "\"select nextval('checks')\"")]);
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    // (The first loan is of a connection that has just logged in: not checked.)
    for _ in 0..6 {
        assert_eq!(value(&a, "select 1").await, "1");
    }
    let checks: i64 = pg.psql("select last_value from checks where is_called").parse().unwrap_or(0);
    assert!(checks >= 5, "{checks} checks for 6 loans");
}

/// A check query that fails (an ERROR, or a transaction left open) closes that server,
/// with a warning, and the client is served by a new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_check_replaces_the_server() {
    let pg = PgCluster::start();
    for (query, why) in [("select no_such_function()", "does not exist"), ("begin", "left a transaction open")] {
        let s = sluice(&pg, &[("server_check_delay", "0"), ("server_check_query", &common::toml_str(query))]);
        let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
        let first = value(&a, "select pg_backend_pid()").await;
        let next = value(&a, "select pg_backend_pid()").await;
        assert_ne!(next, first, "the server that failed its check was lent");
        let warned = s.log().lines().any(|l| l.contains("server check failed") && l.contains(why));
        assert!(warned, "{}", s.log());
    }
}

/// `server_check_query = ""` turns the check off: a frozen server is lent without one
/// (the query waits for it), where the default check would have replaced it
/// (`failures.rs`, `a_frozen_server_fails_its_check_within_internal_query_timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_check_query_turns_the_check_off() {
    let pg = PgCluster::start();
    let s =
        sluice(&pg, &[("server_check_delay", "0"), ("server_check_query", "\"\""), ("internal_query_timeout", "1")]);
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let first = value(&a, "select pg_backend_pid()").await;
    let frozen = Stopped::new(&first);
    let query = tokio::spawn(async move { value(&a, "select pg_backend_pid()").await });
    // A check would have failed within internal_query_timeout (1 s) and the query gone to
    // a new server; unchecked, it waits for the frozen one.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!query.is_finished(), "the query was served elsewhere: the server was checked");
    drop(frozen);
    let next = tokio::time::timeout(Duration::from_secs(20), query).await.expect("no answer once thawed").unwrap();
    assert_eq!(next, first);
}

/// A client of a Sluice whose server is behind `proxy` (`cancel_wait_timeout` as given)
/// running `select pg_sleep(secs)`, cancelled once the proxy holds new connections: the
/// Sluice, the query's task (giving the client back), and the server's pid.
async fn cancel_held(
    pg: &PgCluster,
    cancel_wait: &str,
    secs: u32,
) -> (Sluice, tokio::task::JoinHandle<tokio_postgres::Client>, String) {
    let hold = Arc::new(AtomicU8::new(0));
    let port = proxy(pg.port, hold.clone()).await;
    let s = Sluice::builder(pg)
        .database("app", &[("pool_size", "1"), ("port", &port.to_string())])
        .general("cancel_wait_timeout", cancel_wait)
        .start();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let pid = value(&a, "select pg_backend_pid()").await;
    let token = a.cancel_token();
    let sql = format!("select pg_sleep({secs})");
    let query = sql.clone();
    let sleeper = tokio::spawn(async move {
        // The cancel never reaches PostgreSQL: the query runs to its end.
        a.simple_query(&query).await.expect("the query was cancelled");
        a
    });
    let running = format!("state = 'active' and query = '{sql}'");
    assert!(tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || pg.backends(&running) == 1)));
    hold.store(HOLD_NEXT, SeqCst);
    token.cancel_query(tokio_postgres::NoTls).await.expect("the cancel request was not taken");
    let held = || hold.load(SeqCst) == HELD;
    assert!(tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), held)), "no cancel was forwarded");
    (s, sleeper, pid)
}

/// `cancel_wait_timeout` bounds the forwarding of a cancel request: to a server that
/// takes the connection and never answers, the forwarding gives up after it (1 s here,
/// not the default 10), and the server whose cancel is not through is closed rather
/// than lent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_wait_timeout_bounds_the_forwarding() {
    let pg = PgCluster::start();
    let (s, sleeper, pid) = cancel_held(&pg, "1", 3).await;
    // Timed from the proxy's holding the cancel connection (seen by polling, so up to
    // a few milliseconds late): the failure is logged as the forwarding gives up.
    let held = Instant::now();
    assert!(s.wait_log("forwarding cancel request", Duration::from_secs(5)), "{}", s.log());
    let took = held.elapsed();
    assert!(took >= Duration::from_millis(800), "the forwarding gave up after {took:?}");
    let a = sleeper.await.unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), value(&a, "select pg_backend_pid()")).await;
    assert_ne!(next.expect("the next query was not served"), pid, "the server was lent again");
    let gone = format!("pid = {pid}");
    assert!(tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || pg.backends(&gone) == 0)));
}

/// `cancel_wait_timeout = 0`: the forwarding has no limit, so a transaction that ends
/// while its cancel is still on its way does not wait for it: its server is closed at
/// once, and the client's next query runs on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_no_cancel_limit_the_server_is_closed_not_waited_for() {
    let pg = PgCluster::start();
    let (_s, sleeper, first) = cancel_held(&pg, "0", 1).await;
    let a = tokio::time::timeout(Duration::from_secs(10), sleeper).await.expect("the query's end waited").unwrap();
    let next = tokio::time::timeout(Duration::from_secs(10), value(&a, "select pg_backend_pid()")).await;
    assert_ne!(next.expect("the next query waited for the cancel"), first);
    let gone = format!("pid = {first}");
    assert!(tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || pg.backends(&gone) == 0)));
}

/// `log_pooler_errors` logs the FATAL that ends a connection and the admin console's
/// errors; off, neither is logged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_pooler_errors_logs_what_sluice_sends() {
    let pg = PgCluster::start();
    for on in [true, false] {
        let s = sluice(&pg, &[("log_pooler_errors", &on.to_string()), ("admin_users", r#"["u_scram"]"#)]);
        let refused = try_connect(s.port, Role::SCRAM.name, "wrong", "app").await;
        let Err(refused) = refused else { panic!("a wrong password was taken") };
        assert_eq!(common::code(&refused), "28P01");
        let admin = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "pgbouncer").await;
        assert!(admin.simple_query("SHOW NO_SUCH_THING").await.is_err());
        // The console's error is logged before its answer: the FATAL's, after the
        // connection closed; the admin's disconnection comes after both.
        drop(admin);
        assert!(s.wait_log_times("client disconnected", 2, Duration::from_secs(10)), "{}", s.log());
        let log = s.log();
        let logged = |needle: &str| log.lines().any(|l| l.contains("pooler error") && l.contains(needle));
        assert_eq!(logged("password authentication failed"), on, "{log}");
        assert_eq!(logged("unknown SHOW item"), on, "{log}");
        assert!(!log.contains("NO_SUCH_THING"), "the command's text is not logged (it may hold a password)");
    }
}

/// `server_fast_close` in session mode: after RECONNECT a client idle between
/// transactions is closed at once with its server; one inside a transaction finishes
/// it, then is closed. Without it both go on with their servers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_fast_close_ends_session_mode_clients_with_marked_servers() {
    let pg = PgCluster::start();
    for fast in [true, false] {
        let s = Sluice::builder(&pg)
            .database("app", &[("pool_size", "2"), ("pool_mode", "\"session\"")])
            .general("server_fast_close", &fast.to_string())
            .general("admin_users", r#"["u_scram"]"#)
            .start();
        let (idle, idle_task) = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await.unwrap();
        let (busy, busy_task) = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await.unwrap();
        let idle_pid = value(&idle, "select pg_backend_pid()").await;
        busy.simple_query("begin").await.unwrap();
        let busy_pid = value(&busy, "select pg_backend_pid()").await;
        let admin = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "pgbouncer").await;
        admin.simple_query("RECONNECT").await.unwrap();
        // The transaction goes on either way.
        assert_eq!(value(&busy, "select 1").await, "1");
        busy.simple_query("commit").await.unwrap();
        if fast {
            // Both connections end (their tasks finish) and both servers close.
            tokio::time::timeout(Duration::from_secs(10), idle_task).await.expect("the idle client stayed").unwrap();
            tokio::time::timeout(Duration::from_secs(10), busy_task).await.expect("the client stayed").unwrap();
            let gone = format!("pid in ({idle_pid}, {busy_pid})");
            assert!(tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || pg.backends(&gone) == 0)));
            assert!(s.log().contains("server_fast_close"), "{}", s.log());
        } else {
            assert_eq!(value(&idle, "select pg_backend_pid()").await, idle_pid);
            assert_eq!(value(&busy, "select pg_backend_pid()").await, busy_pid);
        }
    }
}

/// `pgbouncer` logs in to the console without a password over the Unix socket from a
/// process of Sluice's own OS user (this test's), as an admin, as PgBouncer lets it;
/// over TCP it goes through the usual authentication, and to a pooled database too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbouncer_logs_in_on_the_socket_as_sluices_own_user() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[]);
    let on_socket = |db: &str| {
        let mut config = tokio_postgres::Config::new();
        config.host_path(&s.socket_dir).port(s.port).user("pgbouncer").dbname(db);
        config
    };
    let (admin, task) = on_socket("pgbouncer").connect(tokio_postgres::NoTls).await.expect("refused on the socket");
    tokio::spawn(task);
    admin.simple_query("RECONNECT").await.expect("not an admin");
    // To a pooled database it is an ordinary (here unknown) user: Sluice asks for a
    // password and refuses the wrong one itself.
    let Err(e) = on_socket("app").password("wrong").connect(tokio_postgres::NoTls).await else {
        panic!("a pooled login with a wrong password")
    };
    assert_eq!(common::code(&e), "28P01", "{e:?}");
    let Err(e) = try_connect(s.port, "pgbouncer", "", "pgbouncer").await else { panic!("let in over TCP") };
    assert!(format!("{e:?}").contains("password"), "{e:?}");
}

/// `server_fast_close` after a reload that moves the database (here to another
/// `dbname`): a session-mode client idle between transactions is closed at once with
/// its server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_fast_close_follows_a_reload_moving_the_database() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .database("app", &[("pool_size", "2"), ("pool_mode", "\"session\"")])
        .general("server_fast_close", "true")
        .start();
    let (idle, task) = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await.unwrap();
    let pid = value(&idle, "select pg_backend_pid()").await;
    s.reload_replacing("dbname = \"app\"", "dbname = \"postgres\"");
    tokio::time::timeout(Duration::from_secs(10), task).await.expect("the idle client stayed").unwrap();
    let gone = format!("pid = {pid}");
    assert!(tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || pg.backends(&gone) == 0)));
}

/// `max_packet_size`: a client's message over it ends that client with 08P01 naming the
/// key, before any of it reaches the server (which serves the next client); a server's
/// row over it ends the client too, and that server connection is closed; a reload
/// raising it lets connected clients send more from their next message, within a
/// transaction too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_packet_size_bounds_each_message_either_way() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[("max_packet_size", "2048")]);
    let long = |n: usize| format!("select length('{}')", "x".repeat(n));
    let message = |e: &tokio_postgres::Error| e.as_db_error().map(|d| d.message().to_string()).unwrap_or_default();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let server = value(&a, "select pg_backend_pid()").await;
    assert_eq!(value(&a, &long(1500)).await, "1500", "under the limit");
    let e = a.simple_query(&long(3000)).await.expect_err("a query over max_packet_size went through");
    assert_eq!(common::code(&e), "08P01", "{e}");
    assert!(message(&e).contains("is 3023 bytes long, over max_packet_size (2048)"), "{e:?}");
    assert!(a.is_closed() || a.simple_query("select 1").await.is_err(), "the client was kept");
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&b, "select pg_backend_pid()").await, server, "the server was not given back");
    // A row of 3,000 bytes from the server.
    let e = b.simple_query("select repeat('y', 3000)").await.expect_err("a row over max_packet_size went through");
    assert_eq!(common::code(&e), "08P01", "{e}");
    assert!(message(&e).starts_with("server sent invalid data: message of type 'D'"), "{e:?}");
    let gone = format!("pid = {server}");
    assert!(tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || pg.backends(&gone) == 0)));
    // Raised by a reload: a connected client sends more from its next message, also
    // inside the transaction it is in (its server linked, the relay waiting).
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    c.simple_query("begin").await.unwrap();
    assert!(c.simple_query(&long(1500)).await.is_ok());
    s.reload_replacing("max_packet_size = 2048", "max_packet_size = 65536");
    assert_eq!(value(&c, &long(3000)).await, "3000");
    assert_eq!(value(&c, "select repeat('y', 3000)").await.len(), 3000);
    c.simple_query("commit").await.unwrap();
    assert_eq!(value(&c, &long(3000)).await, "3000");
}

/// `application_name_add_host`: each client's `application_name` gets its address and
/// port (`app` when it sent none), as the server sees and reports it; a login with such
/// a name of its own needs no server (it completes while the only one is in another
/// client's transaction); the name follows the client from server to server, and a
/// later SET is applied as sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn application_name_add_host_names_each_client_by_its_address() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[("application_name_add_host", "true")]);
    let open = |name: Option<&'static str>| {
        let mut c = tokio_postgres::Config::new();
        c.host("127.0.0.1").port(s.port).user(Role::SCRAM.name).password(Role::SCRAM.password).dbname("app");
        if let Some(name) = name {
            c.application_name(name);
        }
        async move {
            let (client, connection) = c.connect(tokio_postgres::NoTls).await.expect("login");
            tokio::spawn(connection);
            client
        }
    };
    let a = open(Some("web")).await;
    let named = value(&a, "show application_name").await;
    let port = named.strip_prefix("web - 127.0.0.1:").and_then(|p| p.parse::<u16>().ok());
    assert!(port.is_some_and(|p| p > 0), "{named}");
    let seen = "select application_name from pg_stat_activity where pid = pg_backend_pid()";
    assert_eq!(value(&a, seen).await, named, "what the server has");
    let b = open(None).await;
    b.simple_query("begin").await.unwrap();
    let other = value(&b, "show application_name").await;
    assert!(other.starts_with("app - 127.0.0.1:") && other != named, "{other}");
    let c = tokio::time::timeout(Duration::from_secs(5), open(Some("batch"))).await;
    let c = c.expect("the login waited for the server held by a transaction");
    b.simple_query("commit").await.unwrap();
    assert!(value(&c, "show application_name").await.starts_with("batch - 127.0.0.1:"));
    assert_eq!(value(&a, seen).await, named, "a's name on the server others used");
    a.simple_query("set application_name = 'renamed'").await.unwrap();
    assert_eq!(value(&a, seen).await, "renamed");
    assert_eq!(value(&b, seen).await, other);
}

/// `auth_type = "any"`: no password asked whatever name a client gives, every client
/// served by the database's own user's pool (one server for two names), and the console
/// open to anyone, as in PgBouncer: as an admin to the names `admin_users` lists, SHOW
/// only to others.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_auth_serves_every_name_as_the_databases_own_user() {
    let pg = PgCluster::start();
    let user = common::toml_str(Role::SCRAM.name);
    let forced = [("user", user.as_str()), ("pool_size", "1")];
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"any\"")
        .general("admin_users", "[\"ops\"]")
        .database("app", &forced)
        .start();
    let a = connect(s.port, "nobody_listed", "", "app").await;
    assert_eq!(value(&a, "select current_user").await, Role::SCRAM.name);
    let b = connect(s.port, Role::MD5.name, "not its password", "app").await;
    assert_eq!(value(&b, "select current_user").await, Role::SCRAM.name);
    assert_eq!(value(&a, "select pg_backend_pid()").await, value(&b, "select pg_backend_pid()").await);
    let console = connect(s.port, "a_stranger", "", "pgbouncer").await;
    let Err(e) = console.simple_query("RECONNECT").await else { panic!("a stranger ran RECONNECT") };
    assert_eq!(common::code(&e), "42501", "{e:?}");
    console.simple_query("SHOW POOLS").await.expect("SHOW refused");
    let ops = connect(s.port, "ops", "", "pgbouncer").await;
    ops.simple_query("RECONNECT").await.expect("not an admin");
    let Err(e) = try_connect(s.port, "nobody_listed", "", "no_such_db").await else { panic!("an unknown database") };
    assert_eq!(common::code(&e), "3D000", "{e:?}");
}

/// `disable_pqexec`: a simple Query ends the client with 08P01 (here inside a
/// transaction begun with the extended protocol, which keeps working), its server goes
/// back rolled back (a pool of one serves the next client), the console still takes
/// simple queries, and a reload turning it off applies to a connected client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_pqexec_refuses_simple_queries() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[("disable_pqexec", "true"), ("admin_users", "[\"u_scram\"]")]);
    let login = || connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app");
    let a = login().await;
    // Statements kept: one dropped sends a Close ahead of the Query, which the FATAL
    // would then answer in tokio-postgres's eyes.
    let (begin, create) =
        (a.prepare("begin").await.unwrap(), a.prepare("create table kept_out (x int)").await.unwrap());
    a.execute(&begin, &[]).await.expect("extended BEGIN");
    a.execute(&create, &[]).await.expect("extended statement");
    let Err(e) = a.simple_query("select 1").await else { panic!("a simple query ran") };
    assert_eq!(common::code(&e), "08P01", "{e:?}");
    assert!(format!("{e:?}").contains("PQexec disallowed"), "{e:?}");
    assert!(a.is_closed() || a.execute("select 1", &[]).await.is_err(), "the client goes on");
    let b = login().await;
    let row = b.query_one("select count(*) from pg_tables where tablename = 'kept_out'", &[]).await.unwrap();
    assert_eq!(row.get::<_, i64>(0), 0, "the transaction was not rolled back");
    let console = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "pgbouncer").await;
    console.simple_query("SHOW POOLS").await.expect("the console takes simple queries");
    s.reload_replacing("disable_pqexec = true", "disable_pqexec = false");
    b.simple_query("select 1").await.expect("refused after the reload");
}

/// A server restarted with another default (here ALTER DATABASE and RECONNECT): a client
/// keeps the value it was told at login, on the new server too; a client that logs in
/// after is told the new one, and each gets its own on the one server of the pool.
#[tokio::test]
async fn clients_keep_the_defaults_they_were_told_when_the_servers_change() {
    let pg = PgCluster::start();
    pg.psql("create database tzdb");
    let s = Sluice::builder(&pg)
        .general("admin_users", r#"["u_scram"]"#)
        .database("tz", &[("dbname", "\"tzdb\""), ("pool_size", "1")])
        .start();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "tz").await;
    let before = value(&a, "show timezone").await;
    let server = value(&a, "select pg_backend_pid()").await;
    let zone = if before == "Asia/Tokyo" { "America/Denver" } else { "Asia/Tokyo" };
    pg.psql(&format!("alter database tzdb set timezone = '{zone}'"));
    common::console::rows(&common::console::admin(s.port).await, "RECONNECT tz").await;
    assert_eq!(value(&a, "show timezone").await, before, "changed under a client");
    assert_ne!(value(&a, "select pg_backend_pid()").await, server, "not reconnected");
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "tz").await;
    assert_eq!(value(&c, "show timezone").await, zone);
    assert_eq!(value(&a, "show timezone").await, before);
    assert_eq!(value(&c, "show timezone").await, zone);
}

/// A database's `timezone` and `datestyle` are its server connections' startup settings:
/// a client without its own gets them, one with its own (`options`) keeps its own on the
/// same server; `connect_query` runs once per new server connection, and an ERROR in it
/// is logged and the connection used; a reload changing it replaces the connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_startup_settings_and_connect_query() {
    let pg = PgCluster::start();
    pg.psql("create sequence connects; grant usage on sequence connects to public");
    let db = [
        ("pool_size", "1"),
        ("timezone", "\"Asia/Tokyo\""),
        ("datestyle", "\"SQL, DMY\""),
        ("connect_query", "\"select nextval('connects'); set timezone = 'Europe/Paris'\""),
    ];
    let s = Sluice::builder(&pg).database("app", &db).start();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    // (The connect_query's SET of a reported setting is undone before the first loan.)
    assert_eq!(value(&a, "show timezone").await, "Asia/Tokyo");
    assert_eq!(value(&a, "show datestyle").await, "SQL, DMY");
    let server = value(&a, "select pg_backend_pid()").await;
    let mut own = tokio_postgres::Config::new();
    own.host("127.0.0.1").port(s.port).user(Role::SCRAM.name).password(Role::SCRAM.password).dbname("app");
    let (b, task) = own.options("-c TimeZone=UTC").connect(tokio_postgres::NoTls).await.expect("login");
    tokio::spawn(task);
    assert_eq!(value(&b, "show timezone").await, "UTC");
    assert_eq!(value(&b, "select pg_backend_pid()").await, server, "a pool of one");
    assert_eq!(value(&a, "show timezone").await, "Asia/Tokyo");
    assert_eq!(pg.psql("select last_value from connects where is_called"), "1", "one server, one connect_query");
    s.reload_replacing("select nextval('connects'); set", "select no_such_function(); set");
    let next = value(&a, "select pg_backend_pid()").await;
    assert_ne!(next, server, "the connection from before the reload was lent");
    assert!(s.wait_log("connect_query failed", Duration::from_secs(10)), "{}", s.log());
    assert_eq!(value(&a, "show timezone").await, "Asia/Tokyo");
    // A reload changing the database's timezone: a client from before keeps the value
    // it was told at login, a new one gets the new value, on the same server.
    s.reload_replacing("\"Asia/Tokyo\"", "\"America/Denver\"");
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&c, "show timezone").await, "America/Denver");
    assert_eq!(value(&a, "show timezone").await, "Asia/Tokyo", "changed under a client");
    assert_eq!(value(&c, "show timezone").await, "America/Denver");
    assert_eq!(value(&c, "select pg_backend_pid()").await, value(&a, "select pg_backend_pid()").await);
    assert_ne!(value(&a, "select pg_backend_pid()").await, next, "replaced by the reload");
    // What a client is told at login is what it runs with: the startup setting, not the
    // connect_query's SET (the first login learns the pool's defaults).
    let trust = Sluice::builder(&pg).general("auth_type", "\"trust\"").database("app", &db).start();
    let mut raw = common::raw::Raw::open(trust.port);
    raw.send(&common::raw::startup(&[("user", Role::TRUST.name), ("database", "app")], 3 << 16));
    let told = raw.until_ready().into_iter().find(|(tag, body)| *tag == b'S' && body.starts_with(b"TimeZone\0"));
    assert_eq!(told.map(|(_, body)| body), Some(b"TimeZone\0Asia/Tokyo\0".to_vec()), "told another TimeZone");
    // One that leaves a transaction open (or aborted) fails the connect: no client gets
    // that server.
    for query in ["\"begin\"", "\"begin; select 1/0\""] {
        let open = Sluice::builder(&pg).database("app", &[("connect_query", query)]).start();
        let Err(e) = try_connect(open.port, Role::SCRAM.name, Role::SCRAM.password, "app").await else {
            panic!("served by a server left in a transaction by {query}")
        };
        assert!(format!("{e:?}").contains("connect_query left a transaction open"), "{query}: {e:?}");
    }
}
