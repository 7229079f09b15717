//! Pooling semantics through Sluice with a real client crate (tokio-postgres):
//! sharing, parameter isolation, session-mode transparency, cancel, NOTIFY, COPY,
//! every auth method on both sides.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::raw::{Raw, first_value, query, startup};
use common::{
    PgCluster, Role, Sluice, cancel_processed, clients_waiting, code, connect, one_client_queued, try_connect, value,
    wait_until,
};
use futures_util::StreamExt;
use tokio_postgres::{AsyncMessage, NoTls};

fn pooled(pg: &PgCluster, mode: &str, size: usize) -> Sluice {
    Sluice::builder(pg)
        .general("pool_mode", &format!("\"{mode}\""))
        .database("app", &[("pool_size", &size.to_string())])
        .start()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_auth_method_both_sides() {
    let pg = PgCluster::start();
    for auth in ["scram-sha-256", "md5"] {
        let s = Sluice::builder(&pg).general("auth_type", &format!("\"{auth}\"")).start();
        for role in [Role::SCRAM, Role::MD5, Role::PLAIN] {
            let c = connect(s.port, role.name, role.password, "app").await;
            assert_eq!(value(&c, "select current_user").await, role.name, "{auth} {}", role.name);
            let Err(bad) = try_connect(s.port, role.name, "wrong", "app").await else {
                panic!("wrong password must fail")
            };
            assert_eq!(code(&bad), "28P01", "{auth}: {bad}");
        }
        let Err(unknown) = try_connect(s.port, "nobody", "x", "app").await else { panic!("unknown user must fail") };
        assert_eq!(code(&unknown), "28P01");
        let nodb = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "nope").await.err().unwrap();
        assert_eq!(code(&nodb), "3D000");
    }
    let s = Sluice::builder(&pg).general("auth_type", "\"trust\"").start();
    let c = connect(s.port, Role::TRUST.name, "", "app").await;
    assert_eq!(value(&c, "select current_user").await, Role::TRUST.name);
}

/// User and database names longer than PostgreSQL's 63 bytes are cut to 63 before
/// anything looks at them, as PostgreSQL cuts them; `replication` is read as a boolean
/// (or `database`) as PostgreSQL reads it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_names_and_replication_read_as_postgresql_reads_them() {
    let pg = PgCluster::start();
    let (user, db) = ("u".repeat(63), "d".repeat(63));
    pg.psql(&format!("create role {user} login password 'pw_long'"));
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .user(&user, &[("password", "\"pw_long\"")])
        .database(&db, &[("dbname", "\"app\"")])
        .start();
    let c = connect(s.port, &format!("{user}_and_more"), "", &format!("{db}_and_more")).await;
    assert_eq!(value(&c, "select current_user || ' ' || current_database()").await, format!("{user} app"));
    let login = |replication: &str| {
        let mut r = Raw::open(s.port);
        r.send(&startup(&[("user", Role::TRUST.name), ("database", "app"), ("replication", replication)], 3 << 16));
        r
    };
    for not in ["false", "OFF", "no", "f", "0"] {
        let msgs = login(not).until_ready();
        assert_eq!(msgs[0].0, b'R', "replication={not}: {msgs:?}");
    }
    for yes in ["true", "on", "1", "database"] {
        login(yes).expect_error("0A000", "replication connections are not supported");
    }
    login("maybe").expect_error("22023", "invalid value for parameter \"replication\": \"maybe\"");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_secret_and_md5_hash_in_config() {
    let pg = PgCluster::start();
    let secret = pg.scram_secret(Role::SCRAM.name);
    // SCRAM secret only: the server login reuses the client's proof (pass-through).
    let s = Sluice::builder(&pg).user(Role::SCRAM.name, &[("password", &common::toml_str(&secret))]).start();
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&c, "select current_user").await, Role::SCRAM.name);
    assert!(try_connect(s.port, Role::SCRAM.name, "wrong", "app").await.is_err());
    // md5 hash for md5 clients and md5 server auth
    let hash = common::md5_secret(Role::MD5.name, Role::MD5.password);
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"md5\"")
        .user(Role::MD5.name, &[("password", &common::toml_str(&hash))])
        .user(Role::SCRAM.name, &[("password", &common::toml_str(&secret))])
        .start();
    let c = connect(s.port, Role::MD5.name, Role::MD5.password, "app").await;
    assert_eq!(value(&c, "select current_user").await, Role::MD5.name);
    // Under md5, a user whose password is a SCRAM secret logs in with SCRAM (as in
    // PgBouncer): an md5 response could not be checked against it.
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&c, "select current_user").await, Role::SCRAM.name);
    let e = try_connect(s.port, Role::SCRAM.name, "wrong", "app").await.unwrap_err();
    assert_eq!(code(&e), "28P01", "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_clients_interleave_on_a_pool_of_one() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("pool_mode", "\"transaction\"")
        .general("admin_users", r#"["u_scram"]"#)
        .database("app", &[("pool_size", "1")])
        .start();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    a.simple_query("create table t_inter (who text); begin; insert into t_inter values ('a')").await.unwrap();
    let pid_a = value(&a, "select pg_backend_pid()").await;
    // b waits for the only server until a commits
    let waiter = tokio::spawn(async move {
        let pid = value(&b, "select pg_backend_pid()").await;
        let seen = value(&b, "select count(*) from t_inter").await;
        (pid, seen)
    });
    // b's query is in the pool's queue (not served) while a holds the server.
    let port = s.port;
    let queued =
        tokio::task::spawn_blocking(move || one_client_queued(port, Role::SCRAM.name, Role::SCRAM.password, "app"));
    assert!(queued.await.unwrap(), "b never queued for the only server");
    assert!(!waiter.is_finished(), "b was served while a held the only server in a transaction");
    a.simple_query("commit").await.unwrap();
    let (pid_b, seen) = tokio::time::timeout(Duration::from_secs(10), waiter).await.unwrap().unwrap();
    assert_eq!(pid_a, pid_b, "pool of one: same server");
    assert_eq!(seen, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_are_isolated_between_clients() {
    let pg = PgCluster::start();
    let s = pooled(&pg, "transaction", 1);
    let url = |app: &str, tz: &str| {
        format!(
            "host=127.0.0.1 port={} user={} password={} dbname=app application_name={app} options='-c TimeZone={tz} -c search_path=s_{app},public -c statement_timeout=4321'",
            s.port,
            Role::SCRAM.name,
            Role::SCRAM.password
        )
    };
    let (a, ca) = tokio_postgres::connect(&url("alpha", "UTC"), NoTls).await.unwrap();
    tokio::spawn(ca);
    let (b, cb) = tokio_postgres::connect(&url("beta", "Asia/Tokyo"), NoTls).await.unwrap();
    tokio::spawn(cb);
    for _ in 0..3 {
        assert_eq!(value(&a, "select current_setting('application_name')").await, "alpha");
        assert_eq!(value(&b, "select current_setting('application_name')").await, "beta");
        assert_eq!(value(&a, "show TimeZone").await, "UTC");
        assert_eq!(value(&b, "show TimeZone").await, "Asia/Tokyo");
        assert_eq!(value(&a, "show search_path").await, "s_alpha,public");
        assert_eq!(value(&b, "show statement_timeout").await, "4321ms");
    }
    // A SET outside a transaction is remembered for that client only.
    a.simple_query("set TimeZone = 'Europe/Paris'").await.unwrap();
    assert_eq!(value(&b, "show TimeZone").await, "Asia/Tokyo");
    assert_eq!(value(&a, "show TimeZone").await, "Europe/Paris");
    // A client without settings gets the server defaults back: what a fresh session
    // straight to the cluster shows, not a or b's values (a's SET is on the only server).
    let server_tz = pg.psql("show TimeZone");
    assert!(!server_tz.is_empty(), "no TimeZone from the cluster");
    assert!(
        !["Asia/Tokyo", "Europe/Paris"].contains(&server_tz.as_str()),
        "the cluster's default TimeZone {server_tz} is one the clients set: a leak would not show"
    );
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&c, "select current_setting('application_name')").await, "");
    assert_eq!(value(&c, "show TimeZone").await, server_tz);
    assert_eq!(value(&c, "show search_path").await, pg.psql("show search_path"));
    assert_eq!(value(&c, "show statement_timeout").await, "0");
}

/// A client of database `app` with `option` (`name=value`) set at connect time.
async fn with_option(s: &Sluice, option: &str) -> tokio_postgres::Client {
    let url = format!(
        "host=127.0.0.1 port={} user={} password={} dbname=app options='-c {option}'",
        s.port,
        Role::SCRAM.name,
        Role::SCRAM.password
    );
    let (c, conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(conn);
    c
}

/// A client's SET or RESET of a setting PostgreSQL does not report (ParameterStatus)
/// can undo, on the server it shares, a setting another client asked for at connect
/// time (`options`): that client is given its setting again on its next transaction
/// there. (Both clients ask for the same settings, so the server was taken to carry
/// them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_time_settings_hold_after_another_clients_set_or_reset() {
    let pg = PgCluster::start();
    let s = pooled(&pg, "transaction", 1);
    let rounds = [
        ("statement_timeout=4321", "statement_timeout", "4321ms", "set statement_timeout = 0"),
        ("statement_timeout=4321", "statement_timeout", "4321ms", "reset all"),
        ("search_path=s_x,public", "search_path", "s_x,public", "reset all"),
        ("search_path=s_x,public", "search_path", "s_x,public", "set search_path = public"),
    ];
    for (option, name, want, change) in rounds {
        let (a, b) = (with_option(&s, option).await, with_option(&s, option).await);
        assert_eq!(value(&b, &format!("show {name}")).await, want);
        // The change took effect on the server the two share.
        assert_ne!(value(&a, &format!("{change}; show {name}")).await, want, "{change}");
        assert_eq!(value(&b, &format!("show {name}")).await, want, "after the other client's {change}");
    }
}

/// A role one client takes on the server it shares (a session `SET ROLE`, or `role`
/// asked for at connect time and then another session SET that leaves Sluice unsure
/// of the server's settings) does not pass to the next client: `RESET ALL` leaves the
/// role as it is, so the server is also given `RESET ROLE` (and `RESET SESSION
/// AUTHORIZATION`) before another client's settings.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_taken_on_a_shared_server_stays_with_its_client() {
    let pg = PgCluster::start();
    pg.psql(&format!("create role tenant_a; grant tenant_a to {}", Role::SCRAM.name));
    let s = pooled(&pg, "transaction", 1);
    let plain = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let taker = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&taker, "set role tenant_a; select current_user").await, "tenant_a");
    assert_eq!(value(&plain, "select current_user").await, Role::SCRAM.name, "after a session SET ROLE");
    taker.simple_query("set \"role\" = 'tenant_a'").await.unwrap();
    assert_eq!(value(&plain, "select current_user").await, Role::SCRAM.name, "after a SET of the quoted name");
    let asked = with_option(&s, "role=tenant_a").await;
    assert_eq!(value(&asked, "set work_mem = '8MB'; select current_user").await, "tenant_a");
    assert_eq!(value(&plain, "select current_user").await, Role::SCRAM.name, "after a connect-time role");
    assert_eq!(value(&asked, "select current_user").await, "tenant_a", "the role asked for at connect time");
}

/// A client whose `client_encoding` is not UTF8 is given its settings again (after a
/// session SET left the server's settings unknown) in a query PostgreSQL reads in that
/// encoding: a value beyond ASCII goes as a Unicode escape and arrives as sent.
#[test]
fn settings_beyond_ascii_are_given_again_under_a_clients_encoding() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("pool_mode", "\"transaction\"")
        .database("app", &[("pool_size", "1")])
        .start();
    let mut c = common::raw::Raw::open(s.port);
    let params = [
        ("user", Role::TRUST.name),
        ("database", "app"),
        ("client_encoding", "LATIN1"),
        ("options", "-c app.label=café"),
    ];
    c.send(&startup(&params, 3 << 16));
    c.until_ready();
    let label = |c: &mut Raw| {
        c.send(&query("show app.label"));
        let m = c.until_ready();
        m.iter().find(|(t, _)| *t == b'D').map(|(_, row)| row[6..].to_vec()).expect("a row")
    };
    // café in LATIN1.
    assert_eq!(label(&mut c), b"caf\xe9");
    c.send(&query("set work_mem = '8MB'"));
    c.until_ready();
    assert_eq!(label(&mut c), b"caf\xe9", "given again in the client's encoding");
}

/// A client's `SET LOCAL`, `SET TRANSACTION` or SET of a reported setting leaves the
/// record of what a server carries for clients standing: the next client with the
/// same connect-time settings is served without them being set again (no `RESET ALL`
/// per transaction), and still has them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_scoped_sets_leave_the_record_of_a_servers_settings_standing() {
    let pg = PgCluster::start();
    pg.psql("alter role u_scram set log_statement = 'all'");
    let s = pooled(&pg, "transaction", 1);
    let option = "statement_timeout=4321";
    let (a, b) = (with_option(&s, option).await, with_option(&s, option).await);
    assert_eq!(value(&b, "show statement_timeout").await, "4321ms");
    let resets = || pg.log().matches("RESET ALL").count();
    let before = resets();
    for _ in 0..3 {
        for sql in
            ["begin", "set transaction isolation level repeatable read", "set local statement_timeout = 5", "commit"]
        {
            a.simple_query(sql).await.unwrap();
        }
        a.simple_query("set application_name = 'a'").await.unwrap();
        assert_eq!(value(&b, "show statement_timeout").await, "4321ms");
    }
    assert_eq!(resets(), before, "RESET ALL sent after transaction-scoped SETs:\n{}", pg.log());
    // The count can move: a session SET of that setting is followed by one.
    a.simple_query("set statement_timeout = 0").await.unwrap();
    assert_eq!(value(&b, "show statement_timeout").await, "4321ms");
    let counted = tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || resets() > before));
    assert!(counted, "no RESET ALL logged after a session SET:\n{}", pg.log());
}

/// A client that leaves in the middle of a transaction after a SET: Sluice's ROLLBACK
/// undoes the SET on the server, and the next client with that setting gets it applied
/// again (before, the connection was still taken to carry it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_by_sluice_undoes_the_settings_it_reverts() {
    let pg = PgCluster::start();
    let s = pooled(&pg, "transaction", 1);
    let url = format!(
        "host=127.0.0.1 port={} user={} password={} dbname=app options='-c TimeZone=Asia/Tokyo'",
        s.port,
        Role::SCRAM.name,
        Role::SCRAM.password
    );
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    a.batch_execute("begin; set TimeZone = 'Asia/Tokyo'").await.unwrap();
    assert_eq!(value(&a, "show TimeZone").await, "Asia/Tokyo");
    drop(a);
    let (b, cb) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    tokio::spawn(cb);
    assert_eq!(value(&b, "show TimeZone").await, "Asia/Tokyo");
}

/// Sluice's ROLLBACK can bring back a server-only setting too (`is_superuser`, after a
/// superuser's `SET LOCAL ROLE`): the next client is served, not refused for a setting
/// no SET can give back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollback_bringing_back_a_server_only_setting_is_harmless() {
    let pg = PgCluster::start();
    pg.psql("create role u_super superuser login password 'pw_super'");
    let s = Sluice::builder(&pg)
        .general("pool_mode", "\"transaction\"")
        .database("app", &[("pool_size", "1")])
        .user("u_super", &[("password", "\"pw_super\"")])
        .start();
    let a = connect(s.port, "u_super", "pw_super", "app").await;
    a.batch_execute("begin; set local role u_scram").await.unwrap();
    drop(a);
    let b = connect(s.port, "u_super", "pw_super", "app").await;
    assert_eq!(value(&b, "select current_setting('is_superuser')").await, "on");
}

/// In transaction mode a login is answered from what the pool learned: the reply for
/// one set of startup settings is worked out once (through a server, which checks the
/// values) and reused, and every client still hears its own values in the server's
/// spelling and runs with them. Known settings need no server at login.
#[test]
fn login_replies_are_reused_per_settings() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("pool_mode", "\"transaction\"")
        .general("query_wait_timeout", "1")
        .database("app", &[("pool_size", "1")])
        .start();
    let start = |key: &str, tz: &str, app: &str| {
        let mut r = Raw::open(s.port);
        let params = [("user", "u_trust"), ("database", "app"), (key, tz), ("application_name", app)];
        r.send(&startup(&params, 3 << 16));
        r
    };
    let login = |key: &str, tz: &str, app: &str| {
        let mut r = start(key, tz, app);
        let reported: BTreeMap<String, String> = r
            .until_ready()
            .iter()
            .filter(|(tag, _)| *tag == b'S')
            .map(|(_, body)| {
                let mut parts = body.split(|&b| b == 0).map(|p| String::from_utf8_lossy(p).into_owned());
                (parts.next().unwrap(), parts.next().unwrap())
            })
            .collect();
        (r, reported)
    };
    let (mut a, first) = login("TimeZone", "asia/tokyo", "same");
    assert_eq!(first["TimeZone"], "Asia/Tokyo", "the server's spelling: {first:?}");
    assert_eq!(first["application_name"], "same");
    // The only server is busy: a login with known settings is answered anyway, one
    // with new settings waits for a server to check them, and runs out of time.
    a.send(&query("begin"));
    a.until_ready();
    let (mut b, again) = login("timezone", "asia/tokyo", "same");
    assert_eq!(first, again, "equal settings (names in any case), equal reply");
    let mut waits = start("TimeZone", "Europe/Paris", "new");
    let refused = std::iter::from_fn(|| waits.recv()).find(|(tag, _)| *tag == b'E').expect("an error");
    assert_eq!(common::raw::sqlstate(&refused.1), "57014");
    a.send(&query("commit"));
    a.until_ready();
    let (mut c, other) = login("TimeZone", "UTC", "other");
    assert_eq!(other["TimeZone"], "UTC");
    assert_eq!(other["application_name"], "other");
    assert_eq!(other.keys().collect::<Vec<_>>(), first.keys().collect::<Vec<_>>());
    // One server for all three: each checkout sets the client's own values.
    for _ in 0..2 {
        for (r, tz, app) in [(&mut a, "Asia/Tokyo", "same"), (&mut c, "UTC", "other"), (&mut b, "Asia/Tokyo", "same")] {
            r.send(&query("select current_setting('TimeZone') || ' ' || current_setting('application_name')"));
            assert_eq!(first_value(&r.until_ready()), format!("{tz} {app}"));
        }
    }
}

/// `server_reset_query_always`: the reset query runs after every transaction in
/// transaction mode (a temporary table does not outlive it); without it, the server
/// keeps such state until a session ends.
#[test]
fn reset_query_always_runs_after_each_transaction() {
    let pg = PgCluster::start();
    for always in [true, false] {
        let s = Sluice::builder(&pg)
            .general("auth_type", "\"trust\"")
            .general("pool_mode", "\"transaction\"")
            .general("server_reset_query_always", &always.to_string())
            .database("app", &[("pool_size", "1")])
            .start();
        let mut r = Raw::login(s.port, "u_trust", "app");
        r.send(&query("create temp table t_reset (x int)"));
        r.until_ready();
        r.send(&query("select to_regclass('pg_temp.t_reset') is null"));
        let gone = first_value(&r.until_ready());
        assert_eq!(gone, if always { "t" } else { "f" }, "server_reset_query_always = {always}");
    }
    // A reset that fails part way leaves the connection in an unknown state: closed, not
    // lent again (the next transaction runs on a new backend).
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("pool_mode", "\"transaction\"")
        .general("server_reset_query_always", "true")
        .general("server_reset_query", "\"RESET ALL; SELECT 1/0\"")
        .database("app", &[("pool_size", "1")])
        .start();
    let mut r = Raw::login(s.port, "u_trust", "app");
    let mut pid = || {
        r.send(&query("select pg_backend_pid()"));
        first_value(&r.until_ready())
    };
    let first = pid();
    assert_ne!(pid(), first, "a server whose reset failed was lent again");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_startup_setting_is_refused_like_postgres() {
    let pg = PgCluster::start();
    let s = pooled(&pg, "transaction", 2);
    let url = format!(
        "host=127.0.0.1 port={} user={} password={} dbname=app options='-c TimeZone=Nowhere/Atlantis'",
        s.port,
        Role::SCRAM.name,
        Role::SCRAM.password
    );
    let Err(e) = tokio_postgres::connect(&url, NoTls).await else { panic!("bad TimeZone must fail") };
    assert_eq!(code(&e), "22023", "{e}");
    let ok = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&ok, "select 1").await, "1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_is_transparent() {
    let pg = PgCluster::start();
    let s = pooled(&pg, "session", 2);
    let url = format!(
        "host=127.0.0.1 port={} user={} password={} dbname=app application_name=sess options='-c client_min_messages=warning'",
        s.port,
        Role::SCRAM.name,
        Role::SCRAM.password
    );
    let (a, mut conn) = tokio_postgres::connect(&url, NoTls).await.unwrap();
    let (tx, mut notes) = tokio::sync::mpsc::unbounded_channel();
    // The connection's end: the error it ended with (None when it closed without one).
    let ended = tokio::spawn(async move {
        let mut stream = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        loop {
            match stream.next().await {
                Some(Ok(AsyncMessage::Notification(n))) => {
                    let _ = tx.send((n.process_id(), n.channel().to_string(), n.payload().to_string()));
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Some(e),
                None => return None,
            }
        }
    });
    let pid = value(&a, "select pg_backend_pid()").await;
    assert_eq!(value(&a, "show client_min_messages").await, "warning");
    assert_eq!(value(&a, "select application_name from pg_stat_activity where pid = pg_backend_pid()").await, "sess");
    for _ in 0..5 {
        assert_eq!(value(&a, "select pg_backend_pid()").await, pid, "session keeps its server");
    }
    a.simple_query("listen chan").await.unwrap();
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let pid_b = value(&b, "select pg_backend_pid()").await;
    assert_ne!(pid, pid_b);
    b.simple_query("notify chan, 'hello'").await.unwrap();
    let (sender, chan, payload) = tokio::time::timeout(Duration::from_secs(10), notes.recv()).await.unwrap().unwrap();
    assert_eq!((sender.to_string(), chan.as_str(), payload.as_str()), (pid_b.clone(), "chan", "hello"));
    // The cancel key carries the server's process id: cancelling through Sluice reaches it.
    let token = a.cancel_token();
    let a = std::sync::Arc::new(a);
    let sleeping = a.clone();
    let sleeper = tokio::spawn(async move { sleeping.simple_query("select pg_sleep(30)").await });
    assert!(pg.running("pg_sleep(30)"), "the query to cancel never started");
    cancel_processed(s.port, &token).await;
    let r = tokio::time::timeout(Duration::from_secs(10), sleeper).await.unwrap().unwrap();
    assert_eq!(r.err().map(|e| code(&e)).as_deref(), Some("57014"));
    assert_eq!(value(&a, "select pg_backend_pid()").await, pid, "the cancel left the session on its server");
    // pg_terminate_backend on the pid the client sees ends that client (and only it).
    assert_eq!(value(&b, &format!("select pg_terminate_backend({pid})")).await, "t");
    let end = tokio::time::timeout(Duration::from_secs(10), ended).await.expect("a's connection stayed open").unwrap();
    let end = end.expect("a's connection closed without an error");
    assert_eq!(code(&end), "08006", "{end}");
    assert!(a.is_closed());
    assert!(a.simple_query("select 1").await.is_err(), "a still ran a query");
    assert_eq!(value(&b, "select pg_backend_pid()").await, pid_b, "b lost its server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_resets_servers_between_clients() {
    let pg = PgCluster::start();
    let s = pooled(&pg, "session", 1);
    let pid_a = {
        let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
        a.simple_query("set work_mem = '7MB'; prepare p as select 1; create temp table tt(a int)").await.unwrap();
        assert_eq!(value(&a, "select count(*) from pg_prepared_statements").await, "1");
        assert_eq!(value(&a, "select count(*) from pg_class where relname = 'tt' and relpersistence = 't'").await, "1");
        value(&a, "select pg_backend_pid()").await
    };
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    // The same server (a pool of one), reset: a's setting, statement and temp table are gone.
    assert_eq!(value(&b, "select pg_backend_pid()").await, pid_a, "else no reset is shown");
    assert_eq!(value(&b, "show work_mem").await, pg.psql("show work_mem"));
    assert_eq!(value(&b, "select count(*) from pg_prepared_statements").await, "0");
    assert_eq!(value(&b, "select count(*) from pg_class where relname = 'tt' and relpersistence = 't'").await, "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_in_transaction_mode_hits_only_that_client() {
    cancel_hits_only_that_client("transaction").await;
}

/// In session mode the client's key carries its server's process id, and the cancel
/// goes through Sluice to that server only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_in_session_mode_hits_only_that_client() {
    cancel_hits_only_that_client("session").await;
}

/// A CancelRequest for a client waiting in the pool's queue cancels its request as
/// PostgreSQL cancels a running statement: 57014, and the statement never runs, not
/// even once a server is free; the client goes on with its next request. Both
/// protocols: a simple Query, and tokio-postgres's extended-protocol `execute` (which
/// prepares first: its Parse/Describe/Sync is what waits and is cancelled).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_reaches_a_client_waiting_for_a_server() {
    let pg = PgCluster::start();
    let http = common::free_port();
    let s = Sluice::builder(&pg)
        .general("pool_mode", "\"transaction\"")
        .general("admin_users", r#"["u_scram"]"#)
        .general("metrics_listen", &format!("\"127.0.0.1:{http}\""))
        .database("app", &[("pool_size", "1")])
        .start();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    a.simple_query("create table t_waited (a int); begin").await.unwrap();
    let b = std::sync::Arc::new(connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await);
    for extended in [false, true] {
        let bq = b.clone();
        let waiting = tokio::spawn(async move {
            let sql = "insert into t_waited values (1)";
            if extended { bq.execute(sql, &[]).await.map(|_| ()) } else { bq.simple_query(sql).await.map(|_| ()) }
        });
        let port = s.port;
        let queued =
            tokio::task::spawn_blocking(move || one_client_queued(port, Role::SCRAM.name, Role::SCRAM.password, "app"));
        assert!(queued.await.unwrap(), "b never queued for the only server");
        cancel_processed(s.port, &b.cancel_token()).await;
        let r = tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("the cancel ends the wait");
        let e = r.unwrap().expect_err("the waiting statement was cancelled");
        assert_eq!(code(&e), "57014", "extended: {extended}: {e}");
        let waiting =
            tokio::task::block_in_place(|| clients_waiting(port, Role::SCRAM.name, Role::SCRAM.password, "app"));
        assert_eq!(waiting, Some(0), "SHOW POOLS cl_waiting after the cancel");
    }
    a.simple_query("commit").await.unwrap();
    assert_eq!(value(&b, "select count(*) from t_waited").await, "0", "a cancelled statement ran");
    assert_eq!(value(&a, "select 5").await, "5");
    // Counted as the errors the client got.
    let cancelled = tokio::task::spawn_blocking(move || {
        let errors = || {
            let text = common::http::http_get(http, "/metrics").map(|r| r.1).unwrap_or_default();
            common::http::sample(&text, r#"sluice_errors_total{database="app",user="u_scram",class="57"}"#)
        };
        wait_until(Duration::from_secs(10), || errors() == Some(2.0)).then_some(()).ok_or_else(errors)
    });
    cancelled.await.unwrap().expect("two cancelled requests in the error statistics");
}

/// A cancelled wait, message by message: an extended-protocol request whose Sync has
/// not been sent gets its ErrorResponse at once; what follows up to the Sync (here a
/// Query) is skipped, as PostgreSQL skips a failed request, and the Sync gets the
/// ReadyForQuery; the next request is served. Then a whole request with a Query
/// pipelined behind it: only the request is cancelled.
#[test]
fn a_cancelled_wait_skips_its_request_through_the_sync() {
    use common::raw::{bind, execute, parse, sync, tags};
    use std::io::{Read, Write};
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("pool_mode", "\"transaction\"")
        .general("admin_users", r#"["u_scram"]"#)
        .database("app", &[("pool_size", "1")])
        .start();
    let mut a = Raw::login(s.port, "u_trust", "app");
    a.send(&query("begin"));
    a.until_ready();
    let mut b = Raw::open(s.port);
    b.send(&startup(&[("user", "u_trust"), ("database", "app")], 3 << 16));
    let login = b.until_ready();
    let key = &login.iter().find(|m| m.0 == b'K').expect("BackendKeyData").1;
    let mut req = parse("", "select 1");
    req.extend(bind("", "", &[]));
    req.extend(execute("", 0));
    b.send(&req);
    // Once b waits in the queue: its CancelRequest, sent as psql sends it.
    let cancel_waiting = || {
        let queued = one_client_queued(s.port, Role::SCRAM.name, Role::SCRAM.password, "app");
        assert!(queued, "b never queued for the only server");
        let mut cancel = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        let mut packet = bytes::BytesMut::new();
        let word = |at: usize| u32::from_be_bytes(key[at..at + 4].try_into().unwrap());
        sluice::protocol::build::cancel_request(&mut packet, word(0), word(4));
        cancel.write_all(&packet).unwrap();
        cancel.read_to_end(&mut Vec::new()).unwrap();
    };
    cancel_waiting();
    b.expect_error("57014", "canceling statement due to user request");
    let mut rest = query("select 7");
    rest.extend(sync());
    b.send(&rest);
    assert_eq!(tags(&b.until_ready()), "Z", "the Query before the Sync was not skipped");
    a.send(&query("commit"));
    a.until_ready();
    b.send(&query("select 8"));
    assert_eq!(first_value(&b.until_ready()), "8");
    // A whole extended request with a Query behind it in one write: the request is
    // answered (the error, and ReadyForQuery for its Sync); the Query waits its turn.
    a.send(&query("begin"));
    a.until_ready();
    let mut pipeline = parse("", "select 1");
    pipeline.extend(bind("", "", &[]));
    pipeline.extend(execute("", 0));
    pipeline.extend(sync());
    pipeline.extend(query("select 9"));
    b.send(&pipeline);
    cancel_waiting();
    b.expect_error("57014", "canceling statement due to user request");
    assert_eq!(tags(&b.until_ready()), "Z");
    a.send(&query("commit"));
    a.until_ready();
    assert_eq!(first_value(&b.until_ready()), "9");
}

/// A client that has given its server back cannot cancel the query the next client
/// runs on that server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_after_release_does_not_reach_the_next_client() {
    let pg = PgCluster::start();
    let s = pooled(&pg, "transaction", 1);
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let pid = value(&a, "select pg_backend_pid()").await;
    let slow_b = tokio::spawn(async move { b.simple_query("select pg_sleep(6)").await.map(|_| ()) });
    assert!(pg.running("pg_sleep(6)"), "the query never started");
    assert_eq!(pg.backends(&format!("pid = {pid} and query like '%pg_sleep(6)%'")), 1, "not on A's former server");
    cancel_processed(s.port, &a.cancel_token()).await;
    let rb = tokio::time::timeout(Duration::from_secs(20), slow_b).await.unwrap().unwrap();
    assert!(rb.is_ok(), "A's cancel reached B's query: {rb:?}");
}

/// Session mode: a client that has left cannot cancel the queries of the next client
/// of its server, though both see that server's process id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_cancel_key_dies_with_its_client() {
    let pg = PgCluster::start();
    let s = pooled(&pg, "session", 1);
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let pid = value(&a, "select pg_backend_pid()").await;
    let token = a.cancel_token();
    drop(a);
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&b, "select pg_backend_pid()").await, pid, "not the same server");
    let slow_b = tokio::spawn(async move { b.simple_query("select pg_sleep(6)").await.map(|_| ()) });
    assert!(pg.running("pg_sleep(6)"), "the query never started");
    cancel_processed(s.port, &token).await;
    let rb = tokio::time::timeout(Duration::from_secs(20), slow_b).await.unwrap().unwrap();
    assert!(rb.is_ok(), "the departed client's cancel reached the next client's query: {rb:?}");
}

async fn cancel_hits_only_that_client(mode: &str) {
    let pg = PgCluster::start();
    let s = pooled(&pg, mode, 2);
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    if mode != "session" {
        // Cancelling a client between transactions sends nothing (in session mode the
        // client's own server would get it, and the signal could land on the next query).
        cancel_processed(s.port, &a.cancel_token()).await;
        assert_eq!(value(&a, "select 1").await, "1");
    }
    let token = a.cancel_token();
    let slow_a = tokio::spawn(async move { a.simple_query("select pg_sleep(30)").await.map(|_| ()) });
    let slow_b = tokio::spawn(async move { b.simple_query("select pg_sleep(5)").await.map(|_| ()) });
    // Both seen running in one look (b's query must still run when the cancel comes).
    let both = "state = 'active' and (query like '%pg_sleep(30)%' or query like '%pg_sleep(5)%')";
    let started = tokio::task::block_in_place(|| wait_until(Duration::from_secs(20), || pg.backends(both) == 2));
    assert!(started, "the queries never started");
    cancel_processed(s.port, &token).await;
    let ra = tokio::time::timeout(Duration::from_secs(20), slow_a).await.unwrap().unwrap();
    assert_eq!(ra.err().map(|e| code(&e)).as_deref(), Some("57014"));
    let rb = tokio::time::timeout(Duration::from_secs(20), slow_b).await.unwrap().unwrap();
    assert!(rb.is_ok(), "the other client's query must not be cancelled: {rb:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_through_tokio_postgres() {
    use futures_util::SinkExt;
    let pg = PgCluster::start();
    let s = pooled(&pg, "transaction", 2);
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    c.simple_query("create table cp (a int)").await.unwrap();
    let sink = c.copy_in("copy cp from stdin").await.unwrap();
    futures_util::pin_mut!(sink);
    for i in 0..5000 {
        sink.send(bytes::Bytes::from(format!("{i}\n"))).await.unwrap();
    }
    assert_eq!(sink.finish().await.unwrap(), 5000);
    let out = c.copy_out("copy cp to stdout").await.unwrap();
    let chunks: Vec<_> = out.collect().await;
    let total: usize = chunks.iter().map(|c| c.as_ref().unwrap().iter().filter(|&&b| b == b'\n').count()).sum();
    assert_eq!(total, 5000);
}

/// A client pipelining megabytes while it reads the answers (tokio-postgres writes and
/// reads at once): PostgreSQL stops reading its input while its output is blocked, so
/// Sluice must keep reading the server while a write to the server waits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_huge_pipeline_both_ways_does_not_deadlock() {
    let pg = PgCluster::start();
    let s = pooled(&pg, "transaction", 1);
    common::huge_pipeline(s.port).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_socket_and_psql() {
    let pg = PgCluster::start();
    let s = pooled(&pg, "transaction", 2);
    let out = common::psql_cmd(s.port, s.socket_dir.to_str().unwrap(), Role::SCRAM.name, Role::SCRAM.password, "app")
        .args(["-c", "select 'via-unix'"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "via-unix");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forced_server_user_and_server_lifetime() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("server_lifetime", "0.5")
        .database("forced", &[("dbname", "\"app\""), ("user", "\"u_md5\""), ("password", "\"pw_md5\"")])
        .start();
    // PostgreSQL logs a client's EOF without Terminate at DEBUG1 only.
    pg.psql("alter role u_md5 set log_min_messages = debug1");
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "forced").await;
    assert_eq!(value(&c, "select current_user").await, Role::MD5.name);
    let first = value(&c, "select pg_backend_pid()").await;
    assert_eq!(value(&c, "show log_min_messages").await, "debug1", "else the log check below proves nothing");
    // Idle past server_lifetime (time passing is the condition itself), the connection is
    // retired and a new one used.
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_ne!(value(&c, "select pg_backend_pid()").await, first, "server_lifetime did not retire the connection");
    // Retired with a Terminate, like every server connection Sluice closes: at this
    // check-out, or (about one run in five) by the janitor's once-a-second pass first.
    let gone = tokio::task::block_in_place(|| {
        wait_until(Duration::from_secs(10), || pg.backends(&format!("pid = {first}")) == 0)
    });
    assert!(gone, "the retired server connection is still open");
    let log = pg.log();
    assert!(!log.contains("unexpected EOF on client connection"), "closed without Terminate:\n{log}");
}

/// `server_lifetime = 0` means what it means in PgBouncer: each server connection is
/// used once, then closed (before, 0 meant "never retire").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_lifetime_zero_uses_each_connection_once() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("server_lifetime", "0").database("app", &[("pool_size", "1")]).start();
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let mut pids = Vec::new();
    for _ in 0..3 {
        pids.push(value(&c, "select pg_backend_pid()").await);
    }
    let distinct: std::collections::BTreeSet<&String> = pids.iter().collect();
    assert_eq!(distinct.len(), 3, "a server connection was used twice: {pids:?}");
    let closed =
        tokio::task::block_in_place(|| wait_until(Duration::from_secs(10), || pg.backends("usename = 'u_scram'") == 0));
    assert!(closed, "a used connection stayed open");
}

/// `reserve_pool_size` as in PgBouncer: a client that has waited `reserve_pool_timeout`
/// for a server gets one beyond the pool's size; the reserve connection is closed once
/// nobody waits for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reserve_pool_serves_a_client_that_waited_reserve_pool_timeout() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("reserve_pool_size", "1")
        .general("reserve_pool_timeout", "1")
        .general("server_idle_timeout", "3")
        .database("app", &[("pool_size", "1")])
        .start();
    let a = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    a.simple_query("begin").await.unwrap();
    let pid_a = value(&a, "select pg_backend_pid()").await;
    let b = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    let asked = std::time::Instant::now();
    let served = tokio::time::timeout(Duration::from_secs(10), value(&b, "select pg_backend_pid()")).await;
    let pid_b = served.expect("the reserve never served the waiting client");
    assert!(asked.elapsed() >= Duration::from_secs(1), "served before reserve_pool_timeout");
    assert_ne!(pid_b, pid_a, "a holds the pool's only connection in its transaction");
    // The reserve connection goes on serving while it is needed, also after pauses
    // longer than the janitor's pass (not closed and opened again, each time after
    // another reserve_pool_timeout): idle, it goes by server_idle_timeout, as in
    // PgBouncer. (The pauses are the point: no condition to poll.)
    let mut pids = vec![pid_b.clone()];
    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1200)).await;
        pids.push(value(&b, "select pg_backend_pid()").await);
    }
    assert!(pids.iter().all(|p| *p == pid_b), "the reserve connection was replaced: {pids:?}");
    let closed = tokio::task::block_in_place(|| {
        wait_until(Duration::from_secs(10), || pg.backends(&format!("usename = 'u_scram' and pid <> {pid_a}")) == 0)
    });
    assert!(closed, "the reserve connection stayed open past server_idle_timeout");
    a.simple_query("commit").await.unwrap();
}

/// `server_round_robin`: idle connections are lent oldest first, so one client's
/// statements go round all of them; by default the one given back last serves again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_round_robin_takes_the_idle_connections_in_turn() {
    let pg = PgCluster::start();
    for round_robin in [false, true] {
        let s = Sluice::builder(&pg)
            .general("default_pool_size", "3")
            .general("server_round_robin", &round_robin.to_string())
            .start();
        let mut clients = Vec::new();
        for _ in 0..3 {
            clients.push(connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await);
        }
        // Three transactions at once open three connections; then all are idle.
        for c in &clients {
            c.batch_execute("BEGIN; SELECT 1").await.unwrap();
        }
        for c in &clients {
            c.batch_execute("COMMIT").await.unwrap();
        }
        let mut pids = Vec::new();
        for _ in 0..6 {
            pids.push(value(&clients[0], "select pg_backend_pid()").await);
        }
        let distinct: std::collections::BTreeSet<_> = pids.iter().collect();
        if round_robin {
            assert_eq!(distinct.len(), 3, "{pids:?}");
            assert_eq!(pids[..3], pids[3..], "in turn: {pids:?}");
        } else {
            assert_eq!(distinct.len(), 1, "{pids:?}");
        }
    }
}
