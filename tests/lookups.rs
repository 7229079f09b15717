//! Databases and users the config does not list: users looked up with `auth_query`
//! (`auth_user`, `auth_dbname`), and databases served by the fallback entry `*`.

mod common;

use std::time::Duration;

use common::{PgCluster, Role, Sluice, connect, try_connect, value, wait_until};

/// Users the config does not list are looked up with `auth_query` as `auth_user`, at
/// every login: a SCRAM secret (the server login by pass-through) and an md5 hash (the
/// server login answering md5 with it) both work; a wrong password, an unknown role
/// and an expired password get 28P01; a changed password counts at the next login and
/// for the pool's next server connection; the users are listed by SHOW USERS and keep
/// their sessions over a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_query_looks_up_users_the_config_does_not_list() {
    let pg = PgCluster::start();
    let admin = Role::ADMIN;
    let s = md5_lookups_as_admin(&pg)
        .general("admin_users", &format!("[{}]", common::toml_str(admin.name)))
        .without_user(Role::SCRAM.name)
        .start();
    let scram = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&scram, "select current_user").await, Role::SCRAM.name);
    let md5 = connect(s.port, Role::MD5.name, Role::MD5.password, "app").await;
    assert_eq!(value(&md5, "select current_user").await, Role::MD5.name);
    for (user, password) in [(Role::SCRAM.name, "wrong"), (Role::MD5.name, "wrong"), ("nobody", "pw")] {
        let e = try_connect(s.port, user, password, "app").await.unwrap_err();
        assert_eq!(common::code(&e), "28P01", "{user}: {e}");
        let want = format!("password authentication failed for user \"{user}\"");
        assert_eq!(common::console::message(&e), want);
    }
    let console = connect(s.port, admin.name, admin.password, "pgbouncer").await;
    let users: Vec<String> = common::console::rows(&console, "SHOW USERS")
        .await
        .iter()
        .filter_map(|r| r.get("name").map(String::from))
        .collect();
    assert!(users.contains(&Role::SCRAM.name.to_string()) && users.contains(&Role::MD5.name.to_string()), "{users:?}");
    assert!(!users.contains(&"nobody".to_string()), "{users:?}");

    // A new password: the old one is refused, the new one logs in, and the pool opens
    // its next server connection with it (the open ones are closed first).
    pg.psql_db("app", "SET password_encryption = 'md5'; ALTER ROLE u_md5 PASSWORD 'changed'");
    let e = try_connect(s.port, Role::MD5.name, Role::MD5.password, "app").await.unwrap_err();
    assert_eq!(common::code(&e), "28P01", "{e}");
    drop(md5);
    pg.psql("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = 'u_md5'");
    assert!(wait_until(Duration::from_secs(10), || pg.backends("usename = 'u_md5'") == 0));
    let md5 = connect(s.port, Role::MD5.name, "changed", "app").await;
    assert_eq!(value(&md5, "select current_user").await, Role::MD5.name);
    // Expired: refused as a wrong password is.
    pg.psql("ALTER ROLE u_md5 VALID UNTIL '2000-01-01'");
    let e = try_connect(s.port, Role::MD5.name, "changed", "app").await.unwrap_err();
    assert_eq!(common::code(&e), "28P01", "{e}");

    // A reload keeps the found users' sessions and pools.
    s.reload();
    assert!(s.wait_log("configuration reloaded", Duration::from_secs(10)), "{}", s.log());
    assert_eq!(value(&scram, "select current_user").await, Role::SCRAM.name);
    assert_eq!(value(&md5, "select 1").await, "1");
    let again = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&again, "select current_user").await, Role::SCRAM.name);
}

/// A lookup that fails (the auth_user may not read pg_authid) refuses the login with
/// 28000, the server's error in the log, and Sluice goes on serving; a database with an
/// `auth_query` of its own calling a SECURITY DEFINER function, run in another
/// database (`auth_dbname`), lets an unprivileged auth_user look passwords up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_lookup_refuses_with_28000_and_a_database_may_have_its_own() {
    let pg = PgCluster::start();
    pg.psql_db(
        "app",
        "CREATE ROLE u_found LOGIN PASSWORD 'pw_found'; \
         CREATE FUNCTION public.lookup(p_user name, OUT uname name, OUT phash text) RETURNS record \
         LANGUAGE sql SECURITY DEFINER SET search_path = pg_catalog AS $$ SELECT rolname, rolpassword \
         FROM pg_authid WHERE rolname = p_user AND rolcanlogin $$; \
         REVOKE ALL ON FUNCTION public.lookup(name) FROM public; \
         GRANT EXECUTE ON FUNCTION public.lookup(name) TO u_scram;",
    );
    let s = Sluice::builder(&pg)
        .general("auth_user", &common::toml_str(Role::SCRAM.name))
        .general("admin_users", &format!("[{}]", common::toml_str(Role::SCRAM.name)))
        .database(
            "looked_up",
            &[
                ("auth_query", &common::toml_str("SELECT uname, phash FROM public.lookup($1)")),
                ("auth_dbname", &common::toml_str("app")),
            ],
        )
        .database("other", &[])
        .start();
    let e = try_connect(s.port, "u_found", "pw_found", "other").await.unwrap_err();
    assert_eq!(common::code(&e), "28000", "{e}");
    let want = "could not look up the password of user \"u_found\" (auth_query failed: see the pooler's log)";
    assert_eq!(common::console::message(&e), want);
    assert!(s.wait_log("permission denied for table pg_authid", Duration::from_secs(10)), "{}", s.log());
    let listed = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "other").await;
    assert_eq!(value(&listed, "select current_user").await, Role::SCRAM.name);
    // Through the function: the SCRAM secret it returns checks the client, and the key
    // the client proved logs it in to the server (SCRAM pass-through).
    let found = connect(s.port, "u_found", "pw_found", "looked_up").await;
    assert_eq!(value(&found, "select current_user").await, "u_found");
    let e = try_connect(s.port, "u_found", "wrong", "looked_up").await.unwrap_err();
    assert_eq!(common::code(&e), "28P01", "{e}");
    // DISABLE of the lookups' database refuses the logins that need a lookup there.
    let console = common::console::admin(s.port).await;
    console.simple_query("DISABLE app").await.unwrap();
    let e = try_connect(s.port, "u_found", "pw_found", "looked_up").await.unwrap_err();
    assert_eq!(common::code(&e), "28000", "{e}");
    assert!(s.wait_log("the auth_query database app is disabled", Duration::from_secs(10)), "{}", s.log());
    console.simple_query("ENABLE app").await.unwrap();
    let found = connect(s.port, "u_found", "pw_found", "looked_up").await;
    assert_eq!(value(&found, "select current_user").await, "u_found");
}

/// A lookup runs on connections of its own, never lent to a client: a client of the
/// `auth_user` that sets `search_path` to a schema with its own `pg_authid` changes
/// nothing for an unqualified `auth_query`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_client_setting_reaches_a_lookup() {
    let pg = PgCluster::start();
    let admin = Role::ADMIN;
    let s = md5_lookups_as_admin(&pg)
        .general("auth_query", &common::toml_str("SELECT rolname, rolpassword FROM pg_authid WHERE rolname = $1"))
        .database("app", &[("pool_size", "1")])
        .start();
    let c = connect(s.port, admin.name, admin.password, "app").await;
    let planted = common::md5_secret(Role::MD5.name, "planted");
    c.batch_execute(&format!(
        "CREATE SCHEMA evil; CREATE TABLE evil.pg_authid (rolname name, rolpassword text); \
         INSERT INTO evil.pg_authid VALUES ('u_md5', '{planted}'); SET search_path = evil, pg_catalog"
    ))
    .await
    .unwrap();
    // The pool's one connection, idle now, carries that search_path.
    assert_eq!(value(&c, "SELECT count(*) FROM pg_authid").await, "1");
    let e = try_connect(s.port, Role::MD5.name, "planted", "app").await.unwrap_err();
    assert_eq!(common::code(&e), "28P01", "{e}");
    let md5 = connect(s.port, Role::MD5.name, Role::MD5.password, "app").await;
    assert_eq!(value(&md5, "select current_user").await, Role::MD5.name);
}

/// A lookup with no server to run on (the auth_user's password is wrong) refuses with
/// 28000, naming neither the auth_user nor its error to the client; the log has it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lookup_without_a_server_refuses_with_28000() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg)
        .general("auth_user", &common::toml_str(Role::SCRAM.name))
        .user(Role::SCRAM.name, &[("password", &common::toml_str("not its password"))])
        .without_user(Role::MD5.name)
        .start();
    let e = try_connect(s.port, Role::MD5.name, Role::MD5.password, "app").await.unwrap_err();
    assert_eq!(common::code(&e), "28000", "{e}");
    let message = common::console::message(&e);
    assert!(message.starts_with("could not look up the password of user \"u_md5\""), "{message}");
    assert!(s.wait_log("auth_query found no server to run on", Duration::from_secs(10)), "{}", s.log());
}

/// Found users belong to the database whose lookup found them: a database without
/// lookups does not know them, nor does SHOW USERS list a name whose login failed; a
/// reload that takes the lookups away closes their pools and refuses their logins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn found_users_belong_to_their_database_and_logins() {
    let pg = PgCluster::start();
    let admin = Role::ADMIN;
    let b = Sluice::builder(&pg)
        .general("admin_users", &format!("[{}]", common::toml_str(admin.name)))
        .without_user(Role::SCRAM.name)
        .user(admin.name, &[("password", &common::toml_str(admin.password))])
        .database("other", &[]);
    let with_lookups = b.database("app", &[("auth_user", &common::toml_str(admin.name))]);
    let s = with_lookups.start();
    let found = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&found, "select current_user").await, Role::SCRAM.name);
    let e = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "other").await.unwrap_err();
    assert_eq!(common::code(&e), "28P01", "known in app only: {e}");
    // A failed login of an existing role enters nothing.
    let e = try_connect(s.port, "u_trust", "guess", "app").await.unwrap_err();
    assert_eq!(common::code(&e), "28P01", "{e}");
    let console = connect(s.port, admin.name, admin.password, "pgbouncer").await;
    let users = || async {
        let rows = common::console::rows(&console, "SHOW USERS").await;
        rows.iter().filter_map(|r| r.get("name").map(String::from)).collect::<Vec<_>>()
    };
    let listed = users().await;
    assert!(listed.contains(&Role::SCRAM.name.to_string()) && !listed.contains(&"u_trust".to_string()), "{listed:?}");
    // The lookups go: so do the found user, its pool and its logins.
    s.reload_replacing(&format!("auth_user = {}\n", common::toml_str(admin.name)), "");
    let refused = common::eventually(Duration::from_secs(10), || async {
        try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await.is_err()
    })
    .await;
    assert!(refused, "a found user logs in after its lookups were removed");
    assert!(!users().await.contains(&Role::SCRAM.name.to_string()));
    let pools = common::console::rows(&console, "SHOW POOLS").await;
    assert!(!pools.iter().any(|r| r.get("user") == Some(Role::SCRAM.name)), "its pool is still listed");
}

/// The fallback entry `*` serves every database the config does not list, each in pools
/// of its own reaching the server database of the name asked for; a name the server does
/// not have gets its error (3D000). SHOW DATABASES lists the databases it serves, and
/// their pools go once unused for `autodb_idle_timeout`, while a pool a client holds stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fallback_database_serves_databases_not_listed() {
    let pg = PgCluster::start();
    pg.psql("CREATE DATABASE other");
    let b = Sluice::builder(&pg)
        .without_database("app")
        .database("*", &[])
        .general("autodb_idle_timeout", "3")
        .general("auth_user", &common::toml_str(Role::ADMIN.name))
        .user(Role::ADMIN.name, &[("password", &common::toml_str(Role::ADMIN.password))])
        .general("server_idle_timeout", "1")
        .general("admin_users", &format!("[{}]", common::toml_str(Role::SCRAM.name)));
    // The builder gives every entry `dbname = "app"`: the fallback takes the name asked for.
    let text = remove_line_after(&b.config_text(), "[databases.\"*\"]", "dbname = ");
    let s = Sluice::start(&text);
    let app = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&app, "select current_database()").await, "app");
    {
        let other = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "other").await;
        assert_eq!(value(&other, "select current_database()").await, "other");
        let console = common::console::admin(s.port).await;
        let dbs: Vec<String> = common::console::rows(&console, "SHOW DATABASES")
            .await
            .iter()
            .filter_map(|r| r.get("name").map(String::from))
            .collect();
        assert!(["*", "app", "other"].iter().all(|d| dbs.contains(&d.to_string())), "{dbs:?}");
        // The fallback entry has no statistics of its own: the databases it serves do.
        let stats = common::console::rows(&console, "SHOW STATS").await;
        let names: Vec<_> = stats.iter().filter_map(|r| r.get("database")).collect();
        assert!(names.contains(&"other") && !names.contains(&"*"), "{names:?}");
    }
    let e = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "nope").await.unwrap_err();
    assert_eq!(common::code(&e), "3D000", "{e}");
    let console = common::console::admin(s.port).await;
    let pools = || async {
        let rows = common::console::rows(&console, "SHOW POOLS").await;
        rows.iter().filter_map(|r| r.get("database").map(String::from)).collect::<Vec<_>>()
    };
    let before = pools().await;
    assert!(before.contains(&"other".to_string()) && before.contains(&"nope".to_string()), "{before:?}");
    let e = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "*").await.unwrap_err();
    assert_eq!(common::console::message(&e), "database \"*\" does not exist");
    // The console's name is not one the fallback serves: no lookup for its logins (the
    // server has no such database: a lookup there would refuse with 28000).
    let e = try_connect(s.port, "u_trust", "guess", "pgbouncer").await.unwrap_err();
    assert_eq!(common::code(&e), "28P01", "{e}");
    let gone = common::eventually(Duration::from_secs(20), || async {
        let p = pools().await;
        !p.contains(&"other".to_string()) && !p.contains(&"nope".to_string())
    })
    .await;
    assert!(gone, "unused fallback pools are still there: {:?}", pools().await);
    assert!(pools().await.contains(&"app".to_string()), "the pool a client holds was dropped");
    assert_eq!(value(&app, "select current_database()").await, "app");
    // A dropped pool is made again at the next login.
    let other = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "other").await;
    assert_eq!(value(&other, "select current_database()").await, "other");
    // As in PgBouncer, a database the fallback would serve can be disabled (or paused)
    // before its first client; RESUME and ENABLE take only one it serves now.
    let e = console.simple_query("RESUME later").await.unwrap_err();
    assert_eq!(common::code(&e), "42704", "{e}");
    console.simple_query("DISABLE later").await.unwrap();
    let e = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "later").await.unwrap_err();
    assert_eq!(common::code(&e), "55000", "{e}");
    console.simple_query("ENABLE later").await.unwrap();
    // Not the console's own database, which the fallback only seems to serve.
    for cmd in ["PAUSE", "DISABLE", "KILL", "RECONNECT", "WAIT_CLOSE"] {
        let e = console.simple_query(&format!("{cmd} pgbouncer")).await.unwrap_err();
        assert_eq!(common::code(&e), "55000", "{cmd}: {e}");
    }
    let dbs = common::console::rows(&console, "SHOW DATABASES").await;
    assert_eq!(dbs.iter().filter(|r| r.get("name") == Some("pgbouncer")).count(), 1);
}

/// A user the config lists without a password (only its settings, as a converted
/// PgBouncer `[users]` line has them) has its password looked up, as PgBouncer looks up
/// a `[users]` entry `auth_file` has no password for: the login succeeds, the server
/// login uses what the lookup found, and the entry's settings hold (its pool size).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_listed_without_a_password_is_looked_up() {
    let pg = PgCluster::start();
    let s = md5_lookups_as_admin(&pg)
        .user(Role::MD5.name, &[("pool_size", "1")])
        .general("admin_users", &format!("[{}]", common::toml_str(Role::ADMIN.name)))
        .start();
    let a = connect(s.port, Role::MD5.name, Role::MD5.password, "app").await;
    assert_eq!(value(&a, "select current_user").await, Role::MD5.name);
    let e = try_connect(s.port, Role::MD5.name, "wrong", "app").await.unwrap_err();
    assert_eq!(common::code(&e), "28P01", "{e}");
    // Its pool of one: a second client's query waits for the first one's transaction.
    a.simple_query("begin").await.unwrap();
    let b = connect(s.port, Role::MD5.name, Role::MD5.password, "app").await;
    let waiting = tokio::spawn(async move { value(&b, "select 2").await });
    let console = connect(s.port, Role::ADMIN.name, Role::ADMIN.password, "pgbouncer").await;
    let held = common::eventually(Duration::from_secs(10), || async {
        common::console::cell(&console, "SHOW POOLS", "user", Role::MD5.name, "cl_waiting").await.as_deref()
            == Some("1")
    })
    .await;
    assert!(held, "the listed pool_size did not hold");
    a.simple_query("commit").await.unwrap();
    assert_eq!(tokio::time::timeout(Duration::from_secs(10), waiting).await.unwrap().unwrap(), "2");
}

/// md5 client logins, transaction mode, lookups as the superuser `u_admin` (listed with
/// its password), `u_md5` not listed.
fn md5_lookups_as_admin(pg: &PgCluster) -> common::SluiceBuilder {
    let admin = Role::ADMIN;
    Sluice::builder(pg)
        .general("auth_type", "\"md5\"")
        .general("auth_user", &common::toml_str(admin.name))
        .general("pool_mode", "\"transaction\"")
        .without_user(Role::MD5.name)
        .user(admin.name, &[("password", &common::toml_str(admin.password))])
}

/// `text` without the first line starting with `prefix` after the line `after`.
fn remove_line_after(text: &str, after: &str, prefix: &str) -> String {
    let mut seen = false;
    let mut removed = false;
    let mut out = String::new();
    for line in text.lines() {
        if line == after {
            seen = true;
        } else if seen && !removed && line.starts_with(prefix) {
            removed = true;
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    assert!(removed, "no {prefix} after {after} in {text}");
    out
}
