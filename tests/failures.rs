//! What clients see when things break: servers killed mid-transaction, PostgreSQL
//! restarted under load, clients vanishing mid-transaction or mid-query, limits and
//! timeouts. No server connection may leak or stay stuck in a transaction.

mod common;

use std::time::Duration;

use common::raw::{Raw, bind, execute, first_value, flush, parse, query, sync, tags};
use common::{PgCluster, Role, Sluice, Stopped, code, connect, eventually, try_connect, value, wait_until};

/// Polls the admin console (as `u_scram`, an admin user) until the pool of `db` and
/// `user` has a client waiting; false after 10 s.
fn queued(port: u16, db: &str, user: &str) -> bool {
    // SHOW POOLS: database|user|cl_active|cl_waiting|...
    let cl_waiting = || console(port, "SHOW POOLS", &[db, user], 3);
    tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || cl_waiting().is_some_and(|n| n != "0")))
}

/// A cell of the admin console's reply, read as `u_scram` (see `console_cell_where`).
fn console(port: u16, show: &str, key: &[&str], column: usize) -> Option<String> {
    common::console_cell_where(port, Role::SCRAM.name, Role::SCRAM.password, show, key, column)
}

fn sluice(pg: &PgCluster, extra: &[(&str, &str)], pool_size: usize) -> Sluice {
    let mut b = Sluice::builder(pg).database("app", &[("pool_size", &pool_size.to_string())]);
    for (k, v) in extra {
        b = b.general(k, v);
    }
    b.start()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_terminated_mid_transaction_gives_08006_and_frees_the_slot() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[], 1);
    // A query running when the server dies fails with 08006.
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    a.simple_query("begin").await.unwrap();
    let pid = value(&a, "select pg_backend_pid()").await;
    let running = tokio::spawn(async move { a.simple_query("select pg_sleep(30)").await.map(|_| ()) });
    assert!(wait_until(Duration::from_secs(20), || pg.backends("query like '%pg_sleep(30)%'") == 1));
    pg.psql(&format!("select pg_terminate_backend({pid})"));
    let Err(e) = running.await.unwrap() else { panic!("the server is gone") };
    assert_eq!(code(&e), "08006", "{e}");
    // The only slot is free again: a new client gets a new server.
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_ne!(value(&b, "select pg_backend_pid()").await, pid);
}

#[test]
fn server_terminated_while_client_idle_in_transaction() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("auth_type", "\"trust\"").database("app", &[("pool_size", "1")]).start();
    let mut a = Raw::login(s.port, "u_trust", "app");
    a.send(&query("begin; select pg_backend_pid()"));
    let pid = first_value(&a.until_ready());
    pg.psql(&format!("select pg_terminate_backend({pid})"));
    a.expect_error("08006", "terminating connection due to administrator command");
    assert!(a.closed());
    let mut b = Raw::login(s.port, "u_trust", "app");
    b.send(&query("select pg_backend_pid()"));
    assert_ne!(first_value(&b.until_ready()), pid);
}

/// `client_idle_timeout` ends a client idle between transactions (FATAL 08P01 naming the
/// setting), counting from its last transaction: a statement that runs longer than the
/// timeout is not cut short, and the server stays in the pool.
#[test]
fn client_idle_timeout_closes_an_idle_client() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("client_idle_timeout", "1.5")
        .database("app", &[("pool_size", "1")])
        .start();
    let mut a = Raw::login(s.port, "u_trust", "app");
    let sent = std::time::Instant::now();
    a.send(&query("select pg_backend_pid() from pg_sleep(2)"));
    let pid = first_value(&a.until_ready());
    a.expect_error("08P01", "client_idle_timeout");
    // Two seconds running, then one and a half idle.
    assert!(sent.elapsed() >= Duration::from_millis(3400), "closed after {:?}", sent.elapsed());
    assert!(a.closed());
    // The server was not closed with the client: the next client gets the same one.
    let mut b = Raw::login(s.port, "u_trust", "app");
    b.send(&query("select pg_backend_pid()"));
    assert_eq!(first_value(&b.until_ready()), pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_restart_under_load_is_survived() {
    let mut pg = PgCluster::start();
    // The connects that fail while PostgreSQL is down hold new ones back for 1 s (15 s
    // by default): service is back within that of PostgreSQL.
    let s = sluice(&pg, &[("server_login_retry", "1")], 4);
    let port = s.port;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let served = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
    let mut workers = Vec::new();
    for _ in 0..6 {
        let stop = stop.clone();
        let served = served.clone();
        workers.push(tokio::spawn(async move {
            // What each failure was: "connect"/"query", its SQLSTATE and message, with a count.
            let mut errors = std::collections::BTreeMap::<(&str, String, String), u32>::new();
            let key = |what, e: &tokio_postgres::Error| (what, code(e), format!("{e:?}"));
            let mut config = tokio_postgres::Config::new();
            config.host("127.0.0.1").port(port).user(Role::SCRAM.name).password(Role::SCRAM.password).dbname("app");
            config.connect_timeout(Duration::from_secs(10));
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                match config.connect(tokio_postgres::NoTls).await {
                    Ok((c, conn)) => {
                        let mut conn = Some(tokio::spawn(conn));
                        for _ in 0..20 {
                            match c.simple_query("select 1").await {
                                Ok(_) => {
                                    served.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                                }
                                Err(e) if e.code().is_none() => {
                                    // The connection ended with no request of the client's
                                    // on its way (a server lost just as its transaction
                                    // ended): the FATAL it ended with, if any.
                                    let ended = tokio::time::timeout(Duration::from_secs(10), conn.take().unwrap());
                                    let key = match ended.await {
                                        Ok(Ok(Err(end))) => key("ended between queries", &end),
                                        other => ("query", code(&e), format!("{e}; the connection: {other:?}")),
                                    };
                                    *errors.entry(key).or_default() += 1;
                                    break;
                                }
                                Err(e) => {
                                    *errors.entry(key("query", &e)).or_default() += 1;
                                    break;
                                }
                            }
                        }
                    }
                    Err(e) => {
                        *errors.entry(key("connect", &e)).or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            }
            errors
        }));
    }
    // Restart once the load is flowing.
    let flowing =
        eventually(Duration::from_secs(10), || async { served.load(std::sync::atomic::Ordering::Relaxed) >= 50 }).await;
    assert!(flowing, "no load before the restart");
    tokio::task::block_in_place(|| pg.restart());
    // After the restart, service comes back without restarting Sluice.
    let back = eventually(Duration::from_secs(20), || async {
        match try_connect(port, Role::SCRAM.name, Role::SCRAM.password, "app").await {
            Ok((c, _h)) => c.simple_query("select 1").await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
    assert!(back, "Sluice did not recover after PostgreSQL restarted:\n{}", s.log());
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut errors = std::collections::BTreeMap::new();
    for w in workers {
        for (what, n) in w.await.unwrap() {
            *errors.entry(what).or_insert(0) += n;
        }
    }
    // Every failure is one docs/behaviour.md gives for a restart: 08006 for a server
    // connection lost (PostgreSQL's fast shutdown ends it) or a server not reached, 57P03
    // for PostgreSQL's own refusal of a server login while it shuts down or starts up
    // (and, within server_login_retry, that same failure repeated). A connection that
    // ended without an error from Sluice ("no sqlstate") is not one of them.
    assert!(!errors.is_empty(), "no worker noticed the restart");
    let unexpected: Vec<_> =
        errors.keys().filter(|(_, code, _)| !["08006", "57P03"].contains(&code.as_str())).collect();
    assert!(unexpected.is_empty(), "unexpected failures during the restart: {unexpected:?}\nall: {errors:#?}");
    let c = connect(port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&c, "select 2").await, "2");
    // No server connection leaked: at most the pool's 4, none left in a transaction.
    let servers = pg.backends("usename = 'u_scram'");
    assert!((1..=4).contains(&servers), "{servers} server connections for a pool of 4");
    assert_eq!(pg.backends("usename = 'u_scram' and state like 'idle in transaction%'"), 0);
}

#[test]
fn client_vanishing_mid_transaction_leaves_nothing_behind() {
    let pg = PgCluster::start();
    pg.psql("create table vanish (a int); grant all on vanish to u_trust");
    let s = Sluice::builder(&pg).general("auth_type", "\"trust\"").database("app", &[("pool_size", "1")]).start();
    let mut a = Raw::login(s.port, "u_trust", "app");
    a.send(&query("begin; insert into vanish values (1)"));
    a.until_ready();
    drop(a);
    assert!(
        wait_until(Duration::from_secs(10), || pg.backends("state like 'idle in transaction%'") == 0),
        "a server stayed in the vanished client's transaction"
    );
    let mut b = Raw::login(s.port, "u_trust", "app");
    b.send(&query("select count(*) from vanish"));
    assert_eq!(first_value(&b.until_ready()), "0", "the transaction must have been rolled back");
    // Vanishing during a running query: the server is cancelled and closed, the slot freed.
    b.send(&query("select pg_sleep(60)"));
    assert!(
        wait_until(Duration::from_secs(10), || pg.backends("query like '%pg_sleep(60)%' and state = 'active'") == 1),
        "the query never started"
    );
    drop(b);
    assert!(
        wait_until(Duration::from_secs(10), || pg.backends("query like '%pg_sleep(60)%' and state = 'active'") == 0),
        "the abandoned query kept running"
    );
    let mut c = Raw::login(s.port, "u_trust", "app");
    c.send(&query("select 5"));
    assert_eq!(first_value(&c.until_ready()), "5");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_client_conn_gives_53300() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[("max_client_conn", "2"), ("admin_users", r#"["u_scram"]"#)], 2);
    let _a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let _b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let e = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await.err().unwrap();
    assert_eq!(code(&e), "53300");
    // The console is let in all the same (and counted), as in PgBouncer.
    let console = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "pgbouncer").await;
    let clients = common::console::rows(&console, "SHOW CLIENTS").await;
    assert_eq!(clients.len(), 3, "the console's client is listed beside the two");
}

/// A new client of `app` running `select 1` in the background: the task gives the
/// SQLSTATE of its error, None if it succeeds.
async fn select_in_background(port: u16) -> tokio::task::JoinHandle<Option<String>> {
    let c = connect(port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    tokio::spawn(async move { c.simple_query("select 1").await.err().map(|e| code(&e)) })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_wait_timeout_then_recovery() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[("query_wait_timeout", "0.5")], 1);
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    a.simple_query("begin").await.unwrap();
    // Several waiters queue behind the one server: each times out, in turn; then a
    // second round (the pool's expiry task stops when the queue empties, and starts
    // again with the next wait).
    for round in 0..2 {
        let started = std::time::Instant::now();
        let mut waits = Vec::new();
        for _ in 0..3 {
            waits.push(select_in_background(s.port).await);
        }
        for w in waits {
            assert_eq!(w.await.unwrap().as_deref(), Some("57014"), "round {round}");
        }
        assert!(started.elapsed() >= Duration::from_millis(500), "timed out early: {:?}", started.elapsed());
    }
    a.simple_query("commit").await.unwrap();
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&c, "select 1").await, "1");
}

/// A change of the client timeouts (admin SET, as a reload) reaches clients already
/// connected, as in PgBouncer, waits under way included: a statement begun after it is
/// cut at the new `query_timeout`; a client idle since before it is closed at the new
/// `client_idle_timeout`, one idle in a transaction at the new
/// `idle_transaction_timeout`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timeouts_changed_from_the_console_reach_connected_clients() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[("admin_users", r#"["u_scram"]"#)], 3);
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&a, "select 1").await, "1");
    assert_eq!(value(&b, "select 1").await, "1");
    let idle_from = std::time::Instant::now();
    c.simple_query("begin").await.unwrap();
    let console = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "pgbouncer").await;
    for set in ["SET query_timeout = 2", "SET idle_transaction_timeout = 3"] {
        console.simple_query(set).await.unwrap();
    }
    let started = std::time::Instant::now();
    let e = a.simple_query("select pg_sleep(15)").await.expect_err("the statement ran past query_timeout");
    assert_eq!(code(&e), "57014", "{e}");
    assert!(started.elapsed() < Duration::from_secs(12), "cut after {:?}", started.elapsed());
    let closed = eventually(Duration::from_secs(20), || async { c.is_closed() }).await;
    assert!(closed, "the client idle in a transaction since before the change was not closed");
    // b has been idle 7 s when a 5 s client_idle_timeout is set: it is closed at once,
    // its idle time counted from its last query, not from the change.
    tokio::time::sleep_until((idle_from + Duration::from_secs(7)).into()).await;
    assert!(!b.is_closed(), "b closed before client_idle_timeout was set");
    console.simple_query("SET client_idle_timeout = 5").await.unwrap();
    let set_at = std::time::Instant::now();
    let closed = eventually(Duration::from_secs(20), || async { b.is_closed() }).await;
    assert!(closed, "the client idle since before the change was not closed");
    assert!(set_at.elapsed() < Duration::from_millis(3500), "closed {:?} after the change", set_at.elapsed());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_transaction_and_query_timeouts() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[("idle_transaction_timeout", "0.5"), ("query_timeout", "3")], 1);
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    a.simple_query("create table idle_t (a int)").await.unwrap();
    a.simple_query("begin; insert into idle_t values (1)").await.unwrap();
    let closed = eventually(Duration::from_secs(10), || async { a.is_closed() }).await;
    assert!(closed, "idle transaction was not ended");
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&b, "select count(*) from idle_t").await, "0");
    let e = b.simple_query("select pg_sleep(20)").await.err().unwrap();
    assert_eq!(code(&e), "57014", "{e}");
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&c, "select 3").await, "3");
    assert!(
        wait_until(Duration::from_secs(10), || pg.backends("query like '%pg_sleep(20)%' and state = 'active'") == 0),
        "timed-out query still running"
    );
}

/// The timeouts follow what runs: an Execute sent with a Flush (no Sync yet) inside a
/// transaction is running, not idle (`idle_transaction_timeout` leaves it be); idle
/// time counts from the last answer, not from the long query's start; and a pipeline
/// of quick queries is not one long query (`query_timeout` counts from the last
/// answer).
#[test]
fn timeouts_follow_pipelined_and_unsynced_requests() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("idle_transaction_timeout", "2")
        .general("query_timeout", "5")
        .database("app", &[("pool_size", "1")])
        .start();
    let mut c = Raw::login(s.port, "u_trust", "app");
    // A pause well within idle_transaction_timeout, after a query that ran longer.
    let pause = || std::thread::sleep(Duration::from_millis(300));
    c.send(&query("begin"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    let mut b = parse("", "select pg_sleep(2.5)");
    b.extend(bind("", "", &[]));
    b.extend(execute("", 0));
    b.extend(flush());
    c.send(&b);
    let m = c.take(4);
    assert_eq!(tags(&m), "12DC", "the running Execute was ended: {m:?}");
    pause();
    c.send(&sync());
    assert_eq!(tags(&c.until_ready()), "Z", "ended while idle for less than the timeout");
    c.send(&query("select pg_sleep(2.5)"));
    assert_eq!(tags(&c.until_ready()), "TDCZ");
    pause();
    c.send(&query("commit"));
    let m = c.until_ready();
    assert_eq!(tags(&m), "CZ", "ended while idle for less than the timeout: {m:?}");
    // Six queries of 1 s in one write: 6 s in all, each well within query_timeout.
    c.send(&(0..6).flat_map(|_| query("select pg_sleep(1)")).collect::<Vec<_>>());
    let m: Vec<_> = (0..6).flat_map(|_| c.until_ready()).collect();
    assert_eq!(tags(&m), "TDCZ".repeat(6), "{m:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_server_gives_a_clear_error() {
    let pg = PgCluster::start();
    let dead_port = common::free_port();
    let s = Sluice::builder(&pg)
        .database("gone", &[("port", &dead_port.to_string()), ("dbname", "\"app\"")])
        .general("server_connect_timeout", "2")
        .start();
    let e = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "gone").await.err().unwrap();
    assert_eq!(code(&e), "08006", "{e}");
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&c, "select 1").await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_servers_are_retired_and_min_pool_size_kept() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("server_idle_timeout", "1")
        .database("app", &[("pool_size", "4"), ("min_pool_size", "2")])
        .start();
    let clients: Vec<_> =
        futures_util::future::join_all((0..4).map(|_| connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app")))
            .await;
    // Four transactions open at once hold four servers while they are counted.
    futures_util::future::join_all(clients.iter().map(|c| c.simple_query("begin"))).await;
    let n = |pg: &PgCluster| pg.backends(&format!("usename = '{}'", Role::SCRAM.name));
    assert!(wait_until(Duration::from_secs(20), || n(&pg) == 4), "expected 4 servers, saw {}", n(&pg));
    futures_util::future::join_all(clients.iter().map(|c| c.simple_query("commit"))).await;
    assert!(wait_until(Duration::from_secs(20), || n(&pg) == 2), "idle servers not retired down to min_pool_size");
    // and min_pool_size is restored after servers die: two others, the killed ones gone
    let killed = pg.psql(&format!(
        "select string_agg(pid::text, ',') from pg_stat_activity where usename = '{}'",
        Role::SCRAM.name
    ));
    pg.psql(&format!("select pg_terminate_backend(pid) from pg_stat_activity where pid in ({killed})"));
    let restored = || n(&pg) == 2 && pg.backends(&format!("pid in ({killed})")) == 0;
    assert!(wait_until(Duration::from_secs(20), restored), "min_pool_size not restored");
}

/// `query_wait_timeout` is the one in force, counted from when each wait began (as in
/// PgBouncer): a wait queued while none was set, or a longer one, runs out once a
/// reload sets a shorter one, and does not hold up the waits queued behind it (the
/// expiry task looks at the oldest wait, and is woken from a sleep toward the old
/// deadline). So does a wait held by PAUSE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_setting_query_wait_timeout_bounds_waits_already_queued() {
    let pg = PgCluster::start();
    for paused in [false, true] {
        for before in ["0", "120"] {
            let s = sluice(&pg, &[("query_wait_timeout", before), ("admin_users", "[\"u_scram\"]")], 1);
            let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
            let admin = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "pgbouncer").await;
            admin.simple_query(if paused { "PAUSE app" } else { "SHOW VERSION" }).await.unwrap();
            if !paused {
                a.simple_query("begin").await.unwrap();
            }
            let waiting = select_in_background(s.port).await;
            assert!(queued(s.port, "app", Role::SCRAM.name), "the second client did not queue");
            s.reload_replacing(&format!("query_wait_timeout = {before}"), "query_wait_timeout = 1");
            let later = select_in_background(s.port).await;
            for (who, w) in [("queued before the reload", waiting), ("queued after it", later)] {
                let r = tokio::time::timeout(Duration::from_secs(10), w).await;
                assert_eq!(r.expect(who).unwrap().as_deref(), Some("57014"), "{who}, from {before}, paused {paused}");
            }
        }
    }
}

/// A reload that lengthens `query_wait_timeout` lengthens the waits already queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_lengthening_query_wait_timeout_lengthens_waits_already_queued() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[("query_wait_timeout", "5"), ("admin_users", "[\"u_scram\"]")], 1);
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    a.simple_query("begin").await.unwrap();
    let waiting = select_in_background(s.port).await;
    assert!(queued(s.port, "app", Role::SCRAM.name), "the second client did not queue");
    s.reload_replacing("query_wait_timeout = 5", "query_wait_timeout = 120");
    // Past the old timeout (a wait for something not to happen: no condition to poll).
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(!waiting.is_finished(), "the wait ran out by the old timeout");
    a.simple_query("commit").await.unwrap();
    let r = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("served after the commit");
    assert_eq!(r.unwrap(), None, "the wait failed");
}

/// A min_pool_size beyond the pool's size fills the pool and stops there: the janitor's
/// refill ends when the pool is full instead of spinning (which, with one worker,
/// stopped every client from being served).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_pool_size_beyond_the_pool_fills_it_and_stops() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("workers", "1")
        .general("default_pool_size", "2")
        .general("min_pool_size", "9223372036854775807")
        .start();
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    c.simple_query("select 1").await.unwrap();
    let n = |pg: &PgCluster| pg.backends(&format!("usename = '{}'", Role::SCRAM.name));
    assert!(wait_until(Duration::from_secs(10), || n(&pg) == 2), "expected 2 servers, saw {}", n(&pg));
    // Clients keep being served over the next janitor rounds (one a second).
    let until = std::time::Instant::now() + Duration::from_millis(2500);
    while std::time::Instant::now() < until {
        let other = tokio::time::timeout(Duration::from_secs(20), async {
            let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
            c.simple_query("select 1").await.map(|_| ())
        });
        other.await.expect("a client was not served within 20 s").unwrap();
    }
    assert_eq!(n(&pg), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_connection_limits_queue_then_rebalance() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"md5\"")
        .general("max_db_connections", "1")
        // Room under the shared limit is made by the janitor's once-a-second pass (it
        // closes another pool's idle connection): a wait must outlast one pass even on
        // a loaded machine (at 1 s, a's `begin` itself could time out).
        .general("query_wait_timeout", "3")
        .database("app", &[("pool_size", "5")])
        .database("app2", &[("dbname", "\"app\""), ("max_db_connections", "5")])
        .user(Role::SCRAM.name, &[("password", "\"pw_scram\""), ("max_user_connections", "1")])
        .start();
    let servers = |pg: &PgCluster| pg.backends("true");
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let b = connect(s.port, Role::MD5.name, Role::MD5.password, "app").await;
    // a holds the database's only server in a transaction: b waits, then times out.
    a.simple_query("begin").await.unwrap();
    let Err(e) = b.simple_query("select 1").await else { panic!("max_db_connections = 1 was exceeded") };
    assert_eq!(code(&e), "57014", "{e}");
    a.simple_query("commit").await.unwrap();
    // a's server is idle in its own pool: b's pool gets room by closing it.
    let b = connect(s.port, Role::MD5.name, Role::MD5.password, "app").await;
    assert_eq!(value(&b, "select current_user").await, Role::MD5.name);
    // (The closed server's backend may take a moment to leave pg_stat_activity.)
    let one = tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || servers(&pg) == 1));
    assert!(one, "{} server connections under max_db_connections = 1", servers(&pg));
    // max_user_connections = 1 across databases for u_scram
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app2").await;
    c.simple_query("begin").await.unwrap();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let Err(e) = a.simple_query("select 1").await else { panic!("max_user_connections = 1 was exceeded") };
    assert_eq!(code(&e), "57014", "{e}");
}

/// Room freed under a shared limit by a connection another pool closed (here: past
/// `server_lifetime` when it came back) reaches this pool's waiting clients, not only
/// the closing pool's own queue.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_freed_under_a_shared_limit_reaches_another_pools_queue() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"md5\"")
        .general("max_db_connections", "1")
        .general("server_lifetime", "1")
        .general("query_wait_timeout", "30")
        .general("admin_users", r#"["u_scram"]"#)
        .database("app", &[("pool_size", "5")])
        .start();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let b = connect(s.port, Role::MD5.name, Role::MD5.password, "app").await;
    // a holds the database's only server while it ages past server_lifetime; b queues.
    a.simple_query("begin").await.unwrap();
    let b_query = tokio::spawn(async move { value(&b, "select current_user").await });
    assert!(queued(s.port, "app", Role::MD5.name), "b never queued");
    a.simple_query("select pg_sleep(1.2)").await.unwrap();
    // The server comes back too old and is closed: the limit has room for b's pool.
    a.simple_query("commit").await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(10), b_query).await;
    assert_eq!(got.expect("b still waits though the limit has room").unwrap(), Role::MD5.name);
}

/// Session-mode clients that reset their connection right after the startup packet:
/// the server checked out and set up for each is closed when the login reply cannot be
/// written, not left counted in the pool, so the only slot is free for the next client.
#[test]
fn client_gone_before_its_session_mode_login_reply_frees_the_server() {
    use std::io::Write;
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("pool_mode", "\"session\"")
        .general("query_wait_timeout", "5")
        .database("app", &[("pool_size", "1")])
        .start();
    // Sessions PostgreSQL counted on `app` (read from another database), as they end.
    let sessions = || pg.psql_db("postgres", "select sessions from pg_stat_database where datname = 'app'");
    let before: u64 = sessions().parse().unwrap();
    let hello =
        common::raw::startup(&[("user", "u_trust"), ("database", "app"), ("application_name", "gone")], 3 << 16);
    for _ in 0..3 {
        let sock = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        (&sock).write_all(&hello).unwrap();
        // Linger 0: the close sends a reset, so Sluice's write of the login reply fails.
        socket2::SockRef::from(&sock).set_linger(Some(Duration::ZERO)).unwrap();
        drop(sock);
    }
    // The logins got as far as a server (a session on `app` that has ended), so the
    // failed write of the reply was met; the pool must not count those servers still.
    let ended = wait_until(Duration::from_secs(10), || sessions().parse::<u64>().unwrap() > before);
    assert!(ended, "no vanished client's login reached a server: the case was not exercised");
    let mut b = Raw::login(s.port, "u_trust", "app");
    b.send(&query("select 1"));
    assert_eq!(first_value(&b.until_ready()), "1");
}

/// A reset query that does not finish within `internal_query_timeout` closes the
/// server instead of holding its slot (the next client gets a new server at once), and
/// is cancelled on PostgreSQL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_query_past_internal_query_timeout_closes_the_server() {
    let pg = PgCluster::start();
    let extra = [
        ("server_reset_query", "\"select pg_sleep(30)\""),
        ("server_reset_query_always", "true"),
        ("internal_query_timeout", "1"),
        ("query_wait_timeout", "20"),
    ];
    let s = sluice(&pg, &extra, 1);
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let first = value(&a, "select pg_backend_pid()").await;
    // Without the limit the only server stays in its reset for 30 s, then comes back.
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let started = std::time::Instant::now();
    assert_ne!(value(&b, "select pg_backend_pid()").await, first, "the server was kept after its reset timed out");
    assert!(started.elapsed() < Duration::from_secs(15), "waited {:?} for the reset", started.elapsed());
    // The reset was cancelled on the server, not left running there.
    let sleeping = || pg.backends("query = 'select pg_sleep(30)' and state = 'active'");
    assert!(wait_until(Duration::from_secs(10), || sleeping() == 0), "the timed-out reset query still runs");
}

/// A server that stops answering (its backend frozen with SIGSTOP) fails its check
/// query within `internal_query_timeout`: it is closed, and the client is served by a
/// new server instead of hanging.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_fails_its_check_within_internal_query_timeout() {
    let pg = PgCluster::start();
    // server_check_delay 0: every loan checks the server first.
    let extra = [("server_check_delay", "0"), ("internal_query_timeout", "8")];
    let s = sluice(&pg, &extra, 1);
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let first = value(&a, "select pg_backend_pid()").await;
    let _frozen = Stopped::new(&first);
    let next = tokio::time::timeout(Duration::from_secs(40), value(&a, "select pg_backend_pid()"))
        .await
        .expect("the client hung on a frozen server");
    assert_ne!(next, first);
}

/// The same in session mode, where the check runs when a login takes its server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_server_fails_its_check_at_a_session_mode_login() {
    let pg = PgCluster::start();
    let extra = [("server_check_delay", "0"), ("internal_query_timeout", "8"), ("pool_mode", "\"session\"")];
    let s = sluice(&pg, &extra, 1);
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let first = value(&a, "select pg_backend_pid()").await;
    drop(a);
    // Reset (DISCARD ALL) and back in the pool before it is frozen.
    let reset = format!("pid = {first} and state = 'idle' and query = 'DISCARD ALL'");
    assert!(tokio::task::block_in_place(|| wait_until(Duration::from_secs(30), || pg.backends(&reset) == 1)));
    let _frozen = Stopped::new(&first);
    let b = tokio::time::timeout(Duration::from_secs(40), async {
        let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
        value(&b, "select pg_backend_pid()").await
    });
    assert_ne!(b.await.expect("the login hung on a frozen server"), first);
}

/// A reload that raises `max_db_connections` lets a client queued behind the old limit
/// in at once, without waiting for any connection to close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_raised_shared_limit_lets_queued_clients_in() {
    let pg = PgCluster::start();
    let extra = [("max_db_connections", "1"), ("query_wait_timeout", "30"), ("admin_users", r#"["u_scram"]"#)];
    let s = sluice(&pg, &extra, 5);
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    a.simple_query("begin").await.unwrap();
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let b_query = tokio::spawn(async move { value(&b, "select 2").await });
    assert!(queued(s.port, "app", Role::SCRAM.name), "b never queued");
    s.reload_replacing("max_db_connections = 1", "max_db_connections = 2");
    let got = tokio::time::timeout(Duration::from_secs(10), b_query).await;
    assert_eq!(got.expect("b still waits though the limit was raised").unwrap(), "2");
}

/// A PAUSE that waits for a server connection still being opened returns when that
/// open fails (PostgreSQL's postmaster frozen, so the login gets no answer within
/// `server_connect_timeout`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_returns_when_a_pending_connect_fails() {
    let pg = PgCluster::start();
    let extra = [("server_connect_timeout", "3"), ("admin_users", r#"["u_scram"]"#)];
    let s = sluice(&pg, &extra, 2);
    let holder = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    holder.simple_query("begin").await.unwrap();
    let pid = std::fs::read_to_string(pg.data_dir.join("postmaster.pid")).expect("postmaster.pid");
    let frozen = Stopped::new(pid.lines().next().expect("the postmaster's pid"));
    // A second client needs a second connection, whose login now hangs.
    let second = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let query = tokio::spawn(async move { second.simple_query("select 1").await.map(|_| ()) });
    // The connect is under way (its client counts as waiting) before PAUSE, and PAUSE
    // in effect before the holder's server comes back and is closed.
    assert!(queued(s.port, "app", Role::SCRAM.name), "the second client's connect never started");
    let admin = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "pgbouncer").await;
    let pausing = tokio::spawn(async move { admin.simple_query("PAUSE app").await.map(|_| ()) });
    // SHOW DATABASES: name|...|paused (16th column)
    let paused_now = || console(s.port, "SHOW DATABASES", &["app"], 15).as_deref() == Some("1");
    assert!(tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), paused_now)), "PAUSE not in effect");
    holder.simple_query("commit").await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), query).await.expect("the connect never failed").unwrap();
    let e = e.expect_err("the second client was served by a frozen server");
    // server_connect_timeout: the connect's failure, FATAL 08001 (docs/config.md).
    assert_eq!(code(&e), "08001", "{e:?}");
    let message = e.as_db_error().map(|d| d.message().to_string()).unwrap_or_default();
    assert!(message.contains("timed out connecting to the server"), "{message}");
    let paused = tokio::time::timeout(Duration::from_secs(10), pausing).await;
    assert!(paused.expect("PAUSE still waits after the connect failed").unwrap().is_ok());
    drop(frozen);
}

/// A connect under way when RECONNECT comes is not lent: it is closed and opened again,
/// so its client gets a connection of the new generation (WAIT_CLOSE, which counts the
/// marked connections it can see, never saw that one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_under_way_at_reconnect_is_opened_again() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[("admin_users", r#"["u_scram"]"#)], 2);
    let holder = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    holder.simple_query("begin").await.unwrap();
    let pid = std::fs::read_to_string(pg.data_dir.join("postmaster.pid")).expect("postmaster.pid");
    let frozen = Stopped::new(pid.lines().next().expect("the postmaster's pid"));
    let second = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let begun = tokio::spawn(async move { second.simple_query("begin").await.map(|_| second) });
    assert!(queued(s.port, "app", Role::SCRAM.name), "the second client's connect never started");
    let admin = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "pgbouncer").await;
    admin.simple_query("RECONNECT app").await.unwrap();
    drop(frozen);
    let second = tokio::time::timeout(Duration::from_secs(10), begun).await.expect("the second client hangs");
    let _second = second.unwrap().expect("the second client's transaction began");
    let servers: Vec<_> = admin
        .simple_query("SHOW SERVERS")
        .await
        .unwrap()
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((r.get("state").map(String::from), r.get("close_needed").map(String::from)))
            }
            _ => None,
        })
        .collect();
    let marked = |n: &str| servers.iter().filter(|(_, c)| c.as_deref() == Some(n)).count();
    assert_eq!((marked("1"), marked("0")), (1, 1), "the holder's server marked, the second's new: {servers:?}");
}

/// A client that keeps sending while it waits for a server (here a pipeline of
/// queries) is held back by TCP once Sluice has buffered a little of it: Sluice does
/// not read it all into memory.
#[test]
fn a_waiting_client_is_held_back_not_buffered() {
    use std::io::Write;
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("auth_type", "\"trust\"").database("app", &[("pool_size", "1")]).start();
    let mut holder = Raw::login(s.port, "u_trust", "app");
    holder.send(&query("begin"));
    holder.until_ready();
    let mut waiting = Raw::login(s.port, "u_trust", "app");
    waiting.s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let chunk: Vec<u8> = std::iter::repeat_n(query("select 1"), 1 << 20 >> 4).flatten().collect();
    let (mut sent, limit) = (0usize, 64 << 20);
    while sent < limit {
        match waiting.s.write(&chunk) {
            Ok(n) => sent += n,
            Err(_) => break,
        }
    }
    // Kernel socket buffers on both sides take a few MB; the rest must wait.
    assert!(sent < 32 << 20, "Sluice took {sent} bytes from a client waiting for a server");
    drop(waiting);
    holder.send(&query("commit"));
    holder.until_ready();
    holder.send(&query("select 7"));
    assert_eq!(first_value(&holder.until_ready()), "7");
}

/// A pool that finds a shared limit full while another pool holds an idle connection
/// under it gets room at once, as PgBouncer evicts that connection when it finds the
/// limit full, not at the janitor's next once-a-second pass: two users taking turns on
/// a database limited to one server connection switch each time in a fraction of the
/// janitor's second. Waiting for the janitor, every switch after the first would take
/// about a second (each waits for the pass after the one that made the last switch);
/// most switches must take under 300 ms, a few slower ones allowed for a loaded
/// machine running a debug build.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn room_under_a_shared_limit_is_made_at_once() {
    let pg = PgCluster::start();
    let s = sluice(&pg, &[("max_db_connections", "1"), ("admin_users", r#"["u_scram"]"#)], 5);
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let b = connect(s.port, Role::MD5.name, Role::MD5.password, "app").await;
    let mut switches = Vec::new();
    for round in 0..6 {
        for (who, c) in [("a", &a), ("b", &b)] {
            let started = std::time::Instant::now();
            assert_eq!(value(c, "select 1").await, "1");
            switches.push((round, who, started.elapsed()));
        }
    }
    let slow: Vec<_> = switches.iter().filter(|(.., took)| *took >= Duration::from_millis(300)).collect();
    assert!(slow.len() <= 4, "switches waiting for room: {slow:?} of {}", switches.len());
    // Also when the connection becomes idle after the other pool queued: a holds it in
    // a transaction, b queues, a's COMMIT makes the room. Waiting for the janitor, b
    // would be served 0-1 s after the COMMIT (the pass comes at any moment): over six
    // rounds, most must be served within 250 ms.
    let b = std::sync::Arc::new(b);
    let mut served_after = Vec::new();
    for _ in 0..6 {
        a.simple_query("begin").await.unwrap();
        let bq = b.clone();
        let waiting = tokio::spawn(async move {
            bq.simple_query("select 1").await.unwrap();
            std::time::Instant::now()
        });
        assert!(queued(s.port, "app", Role::MD5.name), "b did not queue");
        let committed = std::time::Instant::now();
        a.simple_query("commit").await.unwrap();
        let served = tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap();
        served_after.push(served.duration_since(committed));
    }
    let slow: Vec<_> = served_after.iter().filter(|took| **took >= Duration::from_millis(250)).collect();
    assert!(slow.len() <= 2, "served after the room was made: {served_after:?}");
}

/// PostgreSQL ending a server (pg_terminate_backend) just after the answer that ended a
/// client's transaction, read by Sluice together with that answer (Sluice is stopped
/// meanwhile so both wait in its socket): the client lost nothing, so in transaction
/// mode it keeps its connection, and its next query runs on another server; in session
/// mode, its own server gone, it gets 08006.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_ended_right_after_a_transaction_ends_no_pooled_client() {
    for mode in ["transaction", "session"] {
        let pg = PgCluster::start();
        let s = sluice(&pg, &[("pool_mode", &format!("\"{mode}\""))], 2);
        let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
        let pid = value(&c, "select pg_backend_pid()").await;
        let sleeping = tokio::spawn(async move {
            let r = c.simple_query("select pg_sleep(0.3)").await.map(drop);
            (c, r)
        });
        let running = format!("pid = {pid} and state = 'active' and query like 'select pg_sleep%'");
        assert!(tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || pg.backends(&running) == 1)));
        // Stopped until the query is answered and the server ended behind its answer.
        let _stopped = StoppedProcess::new(s.pid());
        let idle = format!("pid = {pid} and state = 'idle'");
        assert!(tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || pg.backends(&idle) == 1)));
        pg.psql(&format!("select pg_terminate_backend({pid})"));
        drop(_stopped);
        let (c, r) = tokio::time::timeout(Duration::from_secs(10), sleeping).await.expect("no answer").unwrap();
        assert!(r.is_ok(), "{mode}: the query's answer was lost: {r:?}");
        let next = c.simple_query("select pg_backend_pid()").await;
        match mode {
            "transaction" => {
                let rows = next.unwrap_or_else(|e| panic!("the client was ended with its server: {e:?}"));
                let row = rows.iter().find_map(|m| match m {
                    tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
                    _ => None,
                });
                assert_ne!(row.expect("a row").get(0), Some(pid.as_str()), "the ended server was lent again");
            }
            _ => assert!(next.is_err() || c.is_closed(), "session mode went on without its server"),
        }
    }
}

/// A process stopped (SIGSTOP) until dropped.
struct StoppedProcess(i32);

impl StoppedProcess {
    fn new(pid: u32) -> Self {
        let pid = i32::try_from(pid).expect("a pid");
        // SAFETY: kill(2) on the test's own Sluice process.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
        StoppedProcess(pid)
    }
}

impl Drop for StoppedProcess {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}
