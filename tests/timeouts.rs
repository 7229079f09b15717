//! Which clock bounds a client while it logs in or waits for a server, as in PgBouncer:
//! `client_login_timeout` for the handshake and authentication (and a wait for a pool's
//! first server), never for the `auth_failure_delay` after a refusal; `query_wait_timeout`
//! for every other wait for a server, a session-mode login's and one for a connect under
//! way included.

mod common;

use std::io::Write;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use common::console::{admin, cell, message};
use common::{PgCluster, Role, Sluice, Stopped, code, connect, eventually, try_connect, value};

/// A login in a task of its own: the client and its connection's task, or the SQLSTATE
/// of the error that ended it.
type Login = tokio::task::JoinHandle<Result<(tokio_postgres::Client, tokio::task::JoinHandle<()>), String>>;

/// Logs in to `db` as `u_scram` with `password`.
fn login(port: u16, password: &'static str, db: &'static str) -> Login {
    tokio::spawn(async move { try_connect(port, Role::SCRAM.name, password, db).await.map_err(|e| code(&e)) })
}

/// Whether the gate holds the connections it accepts, forwards them, or closes them at
/// once (a server refusing connections).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GateState {
    Holding,
    Open,
    Refusing,
}

/// A stand-in for PostgreSQL's address: it accepts connections and leaves them
/// unanswered (a server that does not answer) until `open`; from then on it forwards
/// each one, held or new, to PostgreSQL.
struct Gate {
    port: u16,
    shared: Arc<GateShared>,
}

struct GateShared {
    state: Mutex<GateState>,
    opened: Condvar,
    accepted: AtomicUsize,
}

impl Gate {
    fn holding(pg_port: u16) -> Gate {
        Gate::new(pg_port, GateState::Holding)
    }

    fn new(pg_port: u16, state: GateState) -> Gate {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the gate");
        let port = listener.local_addr().expect("the gate's address").port();
        let shared = Arc::new(GateShared { state: Mutex::new(state), opened: Condvar::new(), accepted: 0.into() });
        let accepting = shared.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming().flatten() {
                accepting.accepted.fetch_add(1, SeqCst);
                if *accepting.state.lock().unwrap() == GateState::Refusing {
                    continue; // closed at once
                }
                let gate = accepting.clone();
                std::thread::spawn(move || gate.forward_once_open(conn, pg_port));
            }
        });
        Gate { port, shared }
    }

    fn open(&self) {
        self.set(GateState::Open);
    }

    fn set(&self, state: GateState) {
        *self.shared.state.lock().unwrap() = state;
        self.shared.opened.notify_all();
    }

    /// Connections accepted so far.
    fn accepted(&self) -> usize {
        self.shared.accepted.load(SeqCst)
    }
}

impl GateShared {
    fn forward_once_open(&self, client: TcpStream, pg_port: u16) {
        let state = self.state.lock().unwrap();
        if *self.opened.wait_while(state, |s| *s == GateState::Holding).unwrap() == GateState::Refusing {
            return;
        }
        let Ok(server) = TcpStream::connect(("127.0.0.1", pg_port)) else { return };
        let (client_in, server_out) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        std::thread::spawn(move || pipe(client_in, server_out));
        pipe(server, client);
    }
}

/// Copies `from` to `to` until `from` ends, then ends `to`'s writing side.
fn pipe(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.flush();
    let _ = to.shutdown(Shutdown::Write);
}

/// A session-mode login queued for a server (the pool's one server is lent) waits as
/// any request does, under `query_wait_timeout` (30 s): `client_login_timeout` (2 s)
/// bounds its handshake and authentication only. It still waits after 4 s, and logs in
/// once the holder leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_mode_login_queued_for_a_server_outlasts_client_login_timeout() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("pool_mode", "\"session\"")
        .general("client_login_timeout", "2")
        .general("query_wait_timeout", "30")
        .general("admin_users", r#"["u_scram"]"#)
        .database("app", &[("pool_size", "1")])
        .start();
    let holder = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let started = Instant::now();
    let waiting = login(s.port, Role::SCRAM.password, "app");
    let a = admin(s.port).await;
    let queued = eventually(Duration::from_secs(20), || async {
        cell(&a, "SHOW POOLS", "database", "app", "cl_waiting").await.as_deref() == Some("1")
    })
    .await;
    assert!(queued, "the login never queued for the server");
    // Twice client_login_timeout since the login began, at least.
    if eventually(Duration::from_secs(4), || async { waiting.is_finished() }).await {
        let ended = waiting.await.unwrap().map(|_| ());
        panic!("the queued login ended after {:?}: {ended:?}", started.elapsed());
    }
    drop(holder);
    let got = tokio::time::timeout(Duration::from_secs(20), waiting).await;
    let got = got.expect("the login did not get the server the holder left").unwrap();
    let (client, _task) = got.expect("the login succeeded");
    assert_eq!(value(&client, "select 1").await, "1");
}

/// A login waiting for its pool's first server (one that accepts the connection and
/// never answers) stays bounded by `client_login_timeout` (2 s), though
/// `query_wait_timeout` and `server_connect_timeout` are longer: PgBouncer's
/// "client_login_timeout (server down)".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_waiting_for_a_pools_first_server_is_bounded_by_client_login_timeout() {
    let pg = PgCluster::start();
    let gate = Gate::holding(pg.port);
    let s = Sluice::builder(&pg)
        .general("client_login_timeout", "2")
        .general("query_wait_timeout", "30")
        .general("server_connect_timeout", "30")
        .database("gated", &[("port", &gate.port.to_string())])
        .start();
    let started = Instant::now();
    let e = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "gated").await.err();
    let (e, took) = (e.expect("a login with no server got in"), started.elapsed());
    assert_eq!(code(&e), "08P01", "{e} after {took:?}");
    assert!(message(&e).contains("client_login_timeout"), "{e}");
    assert!((Duration::from_secs(2)..Duration::from_secs(8)).contains(&took), "ended after {took:?}");
    assert_eq!(gate.accepted(), 1, "the connect never reached the server");
}

/// A refused login whose `auth_failure_delay` (6 s) outlasts `client_login_timeout`
/// (2 s) gets its own error (28P01) after the whole delay, not the login timeout's
/// 08P01. The failure is logged before the delay, and a KILL_CLIENT during the delay
/// still ends it at once with 57P01.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_failure_delay_is_not_cut_short_by_client_login_timeout() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_failure_delay", "6")
        .general("client_login_timeout", "2")
        .general("admin_users", r#"["u_scram"]"#)
        .start();
    let started = Instant::now();
    let e = try_connect(s.port, Role::SCRAM.name, "wrong", "app").await.err();
    let (e, took) = (e.expect("a wrong password got in"), started.elapsed());
    assert_eq!(code(&e), "28P01", "{e} after {took:?}");
    assert!(took >= Duration::from_secs(6), "answered after {took:?}, before the delay ran out");
    // Another, killed during its delay (it has been logged by then).
    let refused = login(s.port, "wrong", "app");
    let logged = tokio::task::block_in_place(|| s.wait_log_times("login failed", 2, Duration::from_secs(10)));
    assert!(logged, "the second failure was not logged before its delay");
    let a = admin(s.port).await;
    let id = cell(&a, "SHOW CLIENTS", "state", "login", "id").await.expect("the refused client, in its delay");
    a.simple_query(&format!("KILL_CLIENT {id}")).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(10), refused).await.expect("KILL_CLIENT did not end it");
    assert_eq!(ended.unwrap().map(|_| ()), Err("57P01".to_string()));
}

/// A client that sends Terminate instead of its password (it had none to give) is not
/// a failed login: closed at once, with no error, no `auth_failure_delay` and no
/// "login failed" line.
#[test]
fn a_terminate_instead_of_a_password_is_no_failed_login() {
    use common::raw::{Raw, startup};
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("auth_failure_delay", "10").start();
    let mut c = Raw::open(s.port);
    c.send(&startup(&[("user", Role::SCRAM.name), ("database", "app")], 3 << 16));
    let asked = c.recv().expect("an authentication request");
    assert_eq!(asked.0, b'R', "{asked:?}");
    let started = Instant::now();
    c.send(&[b'X', 0, 0, 0, 4]);
    assert_eq!(c.recv(), None, "answered instead of closed");
    assert!(started.elapsed() < Duration::from_secs(5), "closed after {:?}", started.elapsed());
    assert!(!s.log().contains("login failed"), "{}", s.log());
}

/// A client waiting while a connection is opened for it (the server accepts, and does
/// not answer) gets `query_wait_timeout`'s 57014 when that runs out (1 s), not the
/// connect's own error at `server_connect_timeout` (10 s). The connect goes on: once the
/// server answers, the connection joins the pool and serves the next client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_wait_timeout_bounds_a_wait_for_a_connect_under_way() {
    let pg = PgCluster::start();
    let gate = Gate::holding(pg.port);
    let s = Sluice::builder(&pg)
        .general("query_wait_timeout", "1")
        .general("server_connect_timeout", "10")
        .general("admin_users", r#"["u_scram"]"#)
        .database("gated", &[("port", &gate.port.to_string()), ("pool_size", "1")])
        .start();
    let started = Instant::now();
    let e = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "gated").await.err();
    let (e, took) = (e.expect("a login with no server got in"), started.elapsed());
    assert_eq!(code(&e), "57014", "{e} after {took:?}");
    assert!(message(&e).contains("query_wait_timeout"), "{e}");
    assert!((Duration::from_secs(1)..Duration::from_secs(8)).contains(&took), "ended after {took:?}");
    assert_eq!(gate.accepted(), 1);
    gate.open();
    let a = admin(s.port).await;
    let pooled = eventually(Duration::from_secs(20), || async {
        cell(&a, "SHOW POOLS", "database", "gated", "sv_idle").await.as_deref() == Some("1")
    })
    .await;
    assert!(pooled, "the connection opened for the client that left never joined the pool");
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "gated").await;
    assert_eq!(value(&c, "select 1").await, "1");
    assert_eq!(gate.accepted(), 1, "the next client needed a connection of its own");
}

/// The login of a client that needs a server in pool `db` (its settings are learned
/// from one: the first login of a pool), and the error it ends with.
async fn failed_login(port: u16, db: &str) -> tokio_postgres::Error {
    let r = try_connect(port, Role::SCRAM.name, Role::SCRAM.password, db).await;
    r.err().unwrap_or_else(|| panic!("a login to {db} got in"))
}

/// After a connect to the server fails, `server_login_retry` (3 s) holds new connects
/// back: logins meanwhile get the failure at once ("server_login_retry" and the first
/// failure's 08006), with no connect; once it is over, the next login connects again;
/// and a reload ends the wait at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_login_retry_holds_connects_back_after_a_failure() {
    let pg = PgCluster::start();
    let down = Gate::new(pg.port, GateState::Refusing);
    let s = Sluice::builder(&pg)
        .general("server_login_retry", "3")
        .database("down", &[("port", &down.port.to_string())])
        .start();
    let first = failed_login(s.port, "down").await;
    // (The failure came a moment before: the bound below allows for that moment.)
    let failed_at = Instant::now();
    assert_eq!((code(&first), down.accepted()), ("08006".to_string(), 1), "{}", message(&first));
    assert!(!message(&first).contains("server_login_retry"), "{}", message(&first));
    for _ in 0..5 {
        let e = failed_login(s.port, "down").await;
        assert_eq!(code(&e), "08006", "{e}");
        let (now, then) = (message(&e), message(&first));
        assert!(
            now.contains("server_login_retry") && now.contains(then.trim_start_matches("server connection failed: ")),
            "{now} / {then}"
        );
    }
    assert_eq!(down.accepted(), 1, "connects tried during server_login_retry");
    let retried = eventually(Duration::from_secs(20), || async {
        failed_login(s.port, "down").await;
        down.accepted() == 2
    })
    .await;
    assert!(retried, "no connect after server_login_retry");
    let after = failed_at.elapsed();
    assert!(after >= Duration::from_millis(2900), "tried again {after:?} after the failure");
    // Held back again by that failure; a reload ends it: the next login connects.
    assert!(message(&failed_login(s.port, "down").await).contains("server_login_retry"));
    s.reload_replacing("server_login_retry = 3", "server_login_retry = 4");
    let e = failed_login(s.port, "down").await;
    assert!(!message(&e).contains("server_login_retry"), "{}", message(&e));
    assert_eq!(down.accepted(), 3, "the login after the reload did not connect");
}

/// With a connection open in the pool, a client that needs another while
/// `server_login_retry` holds connects back waits for that one, as in PgBouncer,
/// instead of failing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_login_retry_queues_clients_when_a_connection_is_open() {
    let pg = PgCluster::start();
    let gate = Gate::new(pg.port, GateState::Open);
    let s = Sluice::builder(&pg)
        .general("server_login_retry", "60")
        .general("query_wait_timeout", "30")
        .general("admin_users", r#"["u_scram"]"#)
        .database("gated", &[("port", &gate.port.to_string()), ("pool_size", "2")])
        .start();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "gated").await;
    a.simple_query("begin").await.unwrap();
    gate.set(GateState::Refusing);
    // b needs a second connection: its connect fails, with the server's error.
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "gated").await;
    let e = b.simple_query("select 1").await.expect_err("a connect through a refusing gate");
    assert!(!message(&e).contains("server_login_retry"), "{}", message(&e));
    let tried = gate.accepted();
    // c waits for a's connection, and gets it when a's transaction ends.
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "gated").await;
    let waiting = tokio::spawn(async move { value(&c, "select 3").await });
    let queued = tokio::task::block_in_place(|| {
        common::one_client_queued(s.port, Role::SCRAM.name, Role::SCRAM.password, "gated")
    });
    assert!(queued, "c did not wait for the open connection");
    a.simple_query("commit").await.unwrap();
    let got = tokio::time::timeout(Duration::from_secs(20), waiting).await.expect("c was not served");
    assert_eq!(got.unwrap(), "3");
    assert_eq!(gate.accepted(), tried, "c's request tried a connect");
}

/// A client that leaves while its login waits for a server (session mode, the pool's
/// one server lent) leaves the queue at once: it is no longer counted as waiting, and
/// the server goes to the next client when its holder leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_that_leaves_while_queued_for_a_server_leaves_the_queue() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("pool_mode", "\"session\"")
        .general("query_wait_timeout", "60")
        .general("admin_users", r#"["u_scram"]"#)
        .database("app", &[("pool_size", "1")])
        .start();
    let holder = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let leaving = login(s.port, Role::SCRAM.password, "app");
    let a = admin(s.port).await;
    let waiting = |n: &'static str| {
        let a = &a;
        move || async move { cell(a, "SHOW POOLS", "database", "app", "cl_waiting").await.as_deref() == Some(n) }
    };
    assert!(eventually(Duration::from_secs(20), waiting("1")).await, "the login never queued");
    // Its socket closes with its task.
    leaving.abort();
    assert!(eventually(Duration::from_secs(20), waiting("0")).await, "the departed login stayed in the queue");
    drop(holder);
    let next = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&next, "select 1").await, "1");
}

/// While `server_login_retry` holds connects back, clients queued behind the pool's
/// last open connection get the failure as soon as that connection closes: nothing is
/// left for them to wait for.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_login_retry_fails_the_queue_when_the_last_connection_closes() {
    let pg = PgCluster::start();
    let gate = Gate::new(pg.port, GateState::Open);
    let s = Sluice::builder(&pg)
        .general("server_login_retry", "60")
        .general("query_wait_timeout", "60")
        .general("admin_users", r#"["u_scram"]"#)
        .database("gated", &[("port", &gate.port.to_string()), ("pool_size", "2")])
        .start();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "gated").await;
    a.simple_query("begin").await.unwrap();
    let pid = value(&a, "select pg_backend_pid()").await;
    gate.set(GateState::Refusing);
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "gated").await;
    b.simple_query("select 1").await.expect_err("a connect through a refusing gate");
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "gated").await;
    let waiting = tokio::spawn(async move { c.simple_query("select 3").await.map(|_| ()) });
    let queued = tokio::task::block_in_place(|| {
        common::one_client_queued(s.port, Role::SCRAM.name, Role::SCRAM.password, "gated")
    });
    assert!(queued, "c did not wait for the open connection");
    pg.psql(&format!("select pg_terminate_backend({pid})"));
    let got = tokio::time::timeout(Duration::from_secs(20), waiting).await.expect("c still waits");
    let e = got.unwrap().expect_err("c was served with no server to be had");
    assert!(message(&e).contains("server_login_retry"), "{}", message(&e));
}

/// A client ended with a FATAL while its server does not answer (frozen): it is told at
/// once, as PgBouncer tells it, not after Sluice's ROLLBACK on that server has waited
/// out `internal_query_timeout` (8 s).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fatal_goes_out_before_the_servers_cleanup() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("idle_transaction_timeout", "2")
        .general("internal_query_timeout", "8")
        .start();
    let mut c = common::raw::Raw::login(s.port, "u_trust", "app");
    c.send(&common::raw::query("begin; select pg_backend_pid()"));
    let pid = common::raw::first_value(&c.until_ready());
    let _frozen = Stopped::new(&pid);
    let started = Instant::now();
    c.expect_error("25P03", "idle_transaction_timeout");
    assert!(started.elapsed() < Duration::from_secs(6), "told after {:?}", started.elapsed());
}

/// A connect begun before a reload that fails after it does not start a
/// `server_login_retry` wait: the reload may have mended what failed, and the next
/// login tries a connect of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connect_failing_after_a_reload_starts_no_retry_wait() {
    let pg = PgCluster::start();
    let gate = Gate::holding(pg.port);
    let s = Sluice::builder(&pg)
        .general("server_login_retry", "60")
        .general("client_login_timeout", "30")
        .database("gated", &[("port", &gate.port.to_string())])
        .start();
    let first = tokio::spawn(async move { failed_login(s.port, "gated").await });
    let held = eventually(Duration::from_secs(20), || async { gate.accepted() == 1 }).await;
    assert!(held, "the first login's connect never reached the gate");
    s.reload_replacing("server_login_retry = 60", "server_login_retry = 61");
    gate.set(GateState::Refusing);
    let e = tokio::time::timeout(Duration::from_secs(20), first).await.expect("the first login hangs").unwrap();
    assert!(!message(&e).contains("server_login_retry"), "{}", message(&e));
    let e = failed_login(s.port, "gated").await;
    assert!(!message(&e).contains("server_login_retry"), "held back by a wait the reload ended: {}", message(&e));
    assert_eq!(gate.accepted(), 2, "the next login did not connect");
}

/// `idle_transaction_timeout` also bounds the implicit transaction of extended messages
/// the client has answered through a Flush but not synced (an INSERT's row lock held
/// until the Sync): the client is ended with 25P03 and its server given back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unsynced_exchange_left_idle_is_timed_out() {
    use common::raw::{bind, execute, flush, parse, query};
    let pg = PgCluster::start();
    pg.psql("CREATE TABLE unsynced (a int); GRANT ALL ON unsynced TO u_trust");
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("idle_transaction_timeout", "1")
        .database("app", &[("pool_size", "1")])
        .start();
    let mut c = common::raw::Raw::login(s.port, "u_trust", "app");
    c.send(&[parse("", "insert into unsynced values (1)"), bind("", "", &[]), execute("", 0), flush()].concat());
    let m = c.take(3);
    assert_eq!(common::raw::tags(&m), "12C", "{m:?}");
    let started = Instant::now();
    c.expect_error("25P03", "idle_transaction_timeout");
    assert!(started.elapsed() < Duration::from_secs(10), "told after {:?}", started.elapsed());
    // The implicit transaction was rolled back, and the server serves the next client.
    let mut d = common::raw::Raw::login(s.port, "u_trust", "app");
    d.send(&query("select count(*) from unsynced"));
    assert_eq!(common::raw::first_value(&d.until_ready()), "0");
}

/// A server that stopped answering (its end not seen at check-out, and not checked yet)
/// found by the SET of a client's own settings: the client's request has not been sent,
/// so another server serves it, as after a failed check, instead of the client being
/// ended with "cannot apply session settings".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_found_gone_by_the_settings_set_is_replaced() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("internal_query_timeout", "1").start();
    // Logged in first (its login's round trip on the one server), then that server
    // given another client's settings, then frozen.
    let mut cfg = tokio_postgres::Config::new();
    cfg.host("127.0.0.1").port(s.port).user(Role::SCRAM.name).password(Role::SCRAM.password).dbname("app");
    cfg.options("-c TimeZone=Asia/Tokyo");
    let (c, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("login");
    tokio::spawn(conn);
    let first = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let pid = value(&first, "select pg_backend_pid()").await;
    assert_eq!(pg.backends(&format!("usename = '{}'", Role::SCRAM.name)), 1, "one server so far");
    let _frozen = Stopped::new(&pid);
    let started = Instant::now();
    assert_eq!(value(&c, "show timezone").await, "Asia/Tokyo");
    assert_ne!(value(&c, "select pg_backend_pid()").await, pid);
    assert!(started.elapsed() < Duration::from_secs(10), "served after {:?}", started.elapsed());
}

/// The same at login, where a client's new settings take a server for a round trip
/// (to learn how the server spells them): the login is served by another server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_found_gone_at_a_logins_round_trip_is_replaced() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("internal_query_timeout", "1").start();
    let first = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let pid = value(&first, "select pg_backend_pid()").await;
    let _frozen = Stopped::new(&pid);
    let mut cfg = tokio_postgres::Config::new();
    cfg.host("127.0.0.1").port(s.port).user(Role::SCRAM.name).password(Role::SCRAM.password).dbname("app");
    cfg.options("-c TimeZone=Asia/Tokyo");
    let (c, conn) = cfg.connect(tokio_postgres::NoTls).await.expect("login");
    tokio::spawn(conn);
    assert_eq!(value(&c, "show timezone").await, "Asia/Tokyo");
}
