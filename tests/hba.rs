//! `auth_type = "hba"`: each login's method from the `auth_hba_file` line that fits its
//! connection type, database, user and address, against a real PostgreSQL; and
//! `auth_type = "pam"`; and passwords beyond ASCII (SASLprep) under SCRAM.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{PgCluster, Role, Sluice, connect, toml_str, try_connect, value};

/// The name of the OS user running the tests (what `peer` compares).
fn os_user() -> String {
    let out = std::process::Command::new("id").arg("-un").output().expect("run id -un");
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// A login over the Unix socket (no password), its error kept.
async fn try_unix(
    dir: &Path,
    port: u16,
    user: &str,
    db: &str,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config = tokio_postgres::Config::new();
    config.host_path(dir).port(port).user(user).dbname(db).connect_timeout(Duration::from_secs(10));
    let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}

/// The SQLSTATE and message of a refused login.
fn refusal(e: &tokio_postgres::Error) -> (String, String) {
    (common::code(e), common::console::message(e))
}

const RULES: &str = "\
# TYPE  DATABASE   USER     ADDRESS        METHOD
local   peerdb     all                     peer
local   mapped     all                     peer  map=omap
host    app        u_scram  127.0.0.1/32   scram-sha-256
host    app        u_md5    127.0.0.1/32   md5
host    app        u_plain  127.0.0.1/32   password
host    app        blocked  127.0.0.1/32   reject
host    other      u_scram  127.0.0.1/32   password
host    other      u_md5    127.0.0.1/32   scram-sha-256
host    other      nobody   127.0.0.1/32   password
host    pgbouncer  u_admin  127.0.0.1/32   scram-sha-256
host    all        u_trust  127.0.0.1/32   trust
";

/// Each line's method is the one a login gets: SCRAM, md5 (with an md5 hash that could
/// not check SCRAM), clear text (against a plain password, and against a SCRAM secret,
/// whose derived key then logs in to PostgreSQL by pass-through), trust, peer on the
/// Unix socket (as itself, or as the users an `auth_ident_file` map lists); `reject` and no fitting line refuse with 28000 and PostgreSQL's words;
/// the console goes through the file too, by either of its names. A reload takes a changed file, and a broken
/// one keeps the running rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fitting_line_decides_each_logins_method() {
    let pg = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let hba = dir.path().join("hba.conf");
    std::fs::write(&hba, RULES).unwrap();
    let me = os_user();
    let ident = dir.path().join("ident.conf");
    std::fs::write(&ident, format!("# MAP SYSTEM USER\nomap {me} u_md5\n")).unwrap();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"hba\"")
        .general("auth_hba_file", &toml_str(&hba.display().to_string()))
        .general("auth_ident_file", &toml_str(&ident.display().to_string()))
        .general("admin_users", "[\"u_admin\"]")
        .user("u_scram", &[("password", &toml_str(&pg.scram_secret("u_scram")))])
        .user("u_md5", &[("password", &toml_str(&common::md5_secret("u_md5", "pw_md5")))])
        .user("u_admin", &[("password", "\"pw_admin\"")])
        .user("u_trust", &[])
        .user(&me, &[])
        .database("other", &[])
        .database("peerdb", &[("user", "\"u_plain\""), ("password", "\"pw_plain\"")])
        .database("mapped", &[("user", "\"u_plain\""), ("password", "\"pw_plain\"")])
        .start();

    // u_scram to `other` first: its clear-text password's derived key is the first
    // u_scram's server logins get for pass-through.
    for (role, db) in [(Role::SCRAM, "other"), (Role::SCRAM, "app"), (Role::MD5, "app"), (Role::PLAIN, "app")] {
        let c = connect(s.port, role.name, role.password, db).await;
        assert_eq!(value(&c, "select current_user").await, role.name, "{} to {db}", role.name);
        let wrong = try_connect(s.port, role.name, "wrong", db).await.unwrap_err();
        assert_eq!(common::code(&wrong), "28P01", "{} to {db} with a wrong password: {wrong}", role.name);
    }
    // The md5 hash cannot check SCRAM: the `other` line's method is the one used.
    let e = try_connect(s.port, Role::MD5.name, Role::MD5.password, "other").await.unwrap_err();
    assert_eq!(common::code(&e), "28P01", "{e}");
    assert!(s.wait_log("its password is an md5 hash", Duration::from_secs(10)), "{}", s.log());
    // An unknown user on a clear-text line: a wrong password's refusal (after PBKDF2
    // against a mock secret).
    let e = try_connect(s.port, "nobody", "pw", "other").await.unwrap_err();
    let want = "password authentication failed for user \"nobody\"";
    assert_eq!(refusal(&e), ("28P01".to_string(), want.to_string()));
    let trusted = connect(s.port, "u_trust", "", "app").await;
    assert_eq!(value(&trusted, "select current_user").await, "u_trust");
    let console = connect(s.port, "u_admin", "pw_admin", "pgbouncer").await;
    assert!(!common::console::rows(&console, "SHOW POOLS").await.is_empty());
    // The console's alias is matched as its name: the `pgbouncer` line decides there too.
    let e = try_connect(s.port, "u_admin", "wrong", "sluice").await.unwrap_err();
    assert_eq!(common::code(&e), "28P01", "{e}");
    let aliased = connect(s.port, "u_admin", "pw_admin", "sluice").await;
    assert!(!common::console::rows(&aliased, "SHOW POOLS").await.is_empty());

    let e = try_connect(s.port, "blocked", "pw", "app").await.unwrap_err();
    let want =
        "pg_hba.conf rejects connection for host \"127.0.0.1\", user \"blocked\", database \"app\", no encryption";
    assert_eq!(refusal(&e), ("28000".to_string(), want.to_string()));
    assert!(s.wait_log("hba_line=7", Duration::from_secs(10)), "the log names the line:\n{}", s.log());
    let e = try_connect(s.port, "u_plain", "pw_plain", "other").await.unwrap_err();
    let want = "no pg_hba.conf entry for host \"127.0.0.1\", user \"u_plain\", database \"other\", no encryption";
    assert_eq!(refusal(&e), ("28000".to_string(), want.to_string()));

    // peer: the socket's OS user must be the user asked for; no line for TCP.
    let peer = try_unix(&s.socket_dir, s.port, &me, "peerdb").await.expect("peer login as the OS user");
    assert_eq!(value(&peer, "select current_user").await, "u_plain");
    let e = try_unix(&s.socket_dir, s.port, "u_scram", "peerdb").await.unwrap_err();
    let want = "Peer authentication failed for user \"u_scram\"";
    assert_eq!(refusal(&e), ("28000".to_string(), want.to_string()));
    // map=: the OS user logs in as the users its map lists, and only as those.
    let mapped = try_unix(&s.socket_dir, s.port, "u_md5", "mapped").await.expect("mapped peer login");
    assert_eq!(value(&mapped, "select current_user").await, "u_plain");
    for user in ["u_scram", me.as_str()] {
        let e = try_unix(&s.socket_dir, s.port, user, "mapped").await.unwrap_err();
        let want = format!("Peer authentication failed for user \"{user}\"");
        assert_eq!(refusal(&e), ("28000".to_string(), want));
    }
    assert!(s.wait_log("map=\"omap\"", Duration::from_secs(10)), "the log names the map:\n{}", s.log());
    let e = try_unix(&s.socket_dir, s.port, &me, "app").await.unwrap_err();
    let want = format!("no pg_hba.conf entry for host \"[local]\", user \"{me}\", database \"app\", no encryption");
    assert_eq!(refusal(&e), ("28000".to_string(), want));

    // A reload takes the changed file; connected clients stay.
    std::fs::write(&hba, format!("host app u_scram 127.0.0.1/32 reject\n{RULES}")).unwrap();
    s.reload();
    assert!(s.wait_log("configuration reloaded", Duration::from_secs(10)), "{}", s.log());
    let e = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await.unwrap_err();
    assert_eq!(common::code(&e), "28000", "{e}");
    assert_eq!(value(&trusted, "select 1").await, "1");
    // A broken file: the reload fails naming its line, and the running rules stay.
    std::fs::write(&hba, format!("{RULES}host all all all ldap\n")).unwrap();
    s.reload();
    let line = "hba.conf:13: method: authentication method \"ldap\" is not supported";
    assert!(s.wait_log(line, Duration::from_secs(10)), "{}", s.log());
    let e = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await.unwrap_err();
    assert_eq!(common::code(&e), "28000", "still the reloaded rules: {e}");
    let c = connect(s.port, Role::MD5.name, Role::MD5.password, "app").await;
    assert_eq!(value(&c, "select 1").await, "1");

    // The ident file loses the map a line uses: the reload fails naming that line, and
    // the running maps stay.
    std::fs::write(&hba, format!("host app u_scram 127.0.0.1/32 reject\n{RULES}")).unwrap();
    std::fs::write(&ident, "# no maps left\n").unwrap();
    s.reload();
    let line = format!("hba.conf:4: method: map \"omap\" is not in {}", ident.display());
    assert!(s.wait_log(&line, Duration::from_secs(10)), "{}", s.log());
    let mapped = try_unix(&s.socket_dir, s.port, "u_md5", "mapped").await.expect("the running map stays");
    assert_eq!(value(&mapped, "select current_user").await, "u_plain");
    // A changed map is taken: the OS user may now log in there as u_scram, not u_md5.
    std::fs::write(&ident, format!("omap {me} u_scram\n")).unwrap();
    s.reload();
    let (dir, port) = (s.socket_dir.clone(), s.port);
    let taken = common::eventually(Duration::from_secs(10), || {
        let dir = dir.clone();
        async move { try_unix(&dir, port, "u_scram", "mapped").await.is_ok() }
    });
    assert!(taken.await, "the changed map is not in force\n{}", s.log());
    let e = try_unix(&s.socket_dir, s.port, "u_md5", "mapped").await.unwrap_err();
    assert_eq!(refusal(&e).0, "28000");
}

/// A file Sluice cannot honour stops start-up with its file, line and field named.
#[test]
fn a_broken_file_stops_start_up_naming_its_line() {
    let pg = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let hba = dir.path().join("hba.conf");
    std::fs::write(&hba, "local all all peer\nhost all +admins 10.0.0.0/8 md5\n").unwrap();
    let e = Sluice::builder(&pg)
        .general("auth_type", "\"hba\"")
        .general("auth_hba_file", &toml_str(&hba.display().to_string()))
        .try_start()
        .err()
        .expect("start-up must fail");
    let want = format!("{}:2: user: groups (\"+admins\") are not supported", hba.display());
    assert!(e.contains(&want), "{e}");
}

/// A PAM check still running (here one that sleeps) holds up no exit: SIGINT ends the
/// process at once, without waiting for the blocking thread the check runs on.
#[tokio::test]
async fn a_pam_check_under_way_holds_up_no_exit() {
    use std::os::unix::fs::PermissionsExt;
    let pg = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("check.sh");
    std::fs::write(&script, "#!/bin/sh\nexec sleep 30\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let service = format!("auth required pam_exec.so quiet {}\naccount required pam_permit.so\n", script.display());
    std::fs::write(dir.path().join("sluice-test"), service).unwrap();
    let mut s = Sluice::builder(&pg)
        .general("auth_type", "\"pam\"")
        .general("pam_service", "\"sluice-test\"")
        .general("pam_config_dir", &toml_str(&dir.path().display().to_string()))
        .start();
    let port = s.port;
    let _login =
        tokio::spawn(async move { try_connect(port, Role::MD5.name, Role::MD5.password, "app").await.is_ok() });
    let pid = s.pid();
    let sleeping = || {
        std::fs::read_dir("/proc")
            .unwrap()
            .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
            .any(|stat| {
                // pid (comm) state ppid ...
                let (comm, rest) =
                    stat.split_once(") ").map(|(a, b)| (a.rsplit('(').next().unwrap_or(""), b)).unwrap_or(("", ""));
                comm == "sleep" && rest.split(' ').nth(1) == Some(pid.to_string().as_str())
            })
    };
    assert!(common::eventually(Duration::from_secs(10), || async { sleeping() }).await, "the PAM check never ran");
    s.interrupt();
    assert!(s.wait_exit(Duration::from_secs(10)).is_some(), "the exit waited for the PAM check");
}

/// `auth_type = "pam"`: PAM (here a service file in `pam_config_dir` whose check, run by
/// pam_exec, knows three users' passwords) checks the clear-text password, whatever the
/// config lists: a user PAM lets in logs in to PostgreSQL with the password it gave,
/// listed (with another password) or not, unless its entry sets `server_password`; a
/// password PAM refuses is refused (28P01), the config's too.
#[tokio::test]
async fn pam_checks_passwords_and_unlisted_users_log_in_with_theirs() {
    use std::os::unix::fs::PermissionsExt;
    let pg = PgCluster::start();
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("check.sh");
    let known = "u_md5:pw_md5|u_scram:pw_scram|u_plain:pam_plain";
    let check = format!("#!/bin/sh\nread -r pw\ncase \"$PAM_USER:$pw\" in {known}) exit 0;; esac\nexit 1\n");
    std::fs::write(&script, check).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let service = format!(
        "auth required pam_exec.so expose_authtok quiet {}\naccount required pam_permit.so\n",
        script.display()
    );
    std::fs::write(dir.path().join("sluice-test"), service).unwrap();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"pam\"")
        .general("pam_service", "\"sluice-test\"")
        .general("pam_config_dir", &toml_str(&dir.path().display().to_string()))
        .without_user(Role::MD5.name)
        .user(Role::SCRAM.name, &[("password", "\"not-the-servers\"")])
        .user(Role::PLAIN.name, &[("server_password", &toml_str(Role::PLAIN.password))])
        .start();
    let unlisted = connect(s.port, Role::MD5.name, Role::MD5.password, "app").await;
    assert_eq!(value(&unlisted, "select current_user").await, Role::MD5.name);
    let listed = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&listed, "select current_user").await, Role::SCRAM.name);
    let own_login = connect(s.port, Role::PLAIN.name, "pam_plain", "app").await;
    assert_eq!(value(&own_login, "select current_user").await, Role::PLAIN.name);
    for (user, password) in [(Role::MD5.name, "wrong"), (Role::PLAIN.name, Role::PLAIN.password)] {
        let Err(e) = try_connect(s.port, user, password, "app").await else { panic!("{user} let in") };
        assert_eq!(common::code(&e), "28P01", "{user}: {e}");
    }
    assert!(s.wait_log("login failed: password authentication failed", Duration::from_secs(5)), "{}", s.log());
    // A service PAM cannot start (no file, no `other` in the directory): XX000, and the
    // log names the service.
    s.reload_replacing("pam_service = \"sluice-test\"", "pam_service = \"missing\"");
    let Err(e) = try_connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await else { panic!("let in") };
    assert_eq!(common::code(&e), "XX000", "{e}");
    assert!(s.wait_log("pam_start failed for service", Duration::from_secs(5)), "{}", s.log());
}

/// A password beyond ASCII that SASLprep changes (`º²` normalized to `o2`, a no-break
/// space to a space), given as a plain password: clients (libpq, tokio-postgres) run
/// SASLprep before SCRAM, and so does PostgreSQL; Sluice derives its keys the same way on
/// both sides, so the client logs in and Sluice logs in to the server with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_password_saslprep_changes_logs_in_both_ways() {
    let pg = PgCluster::start();
    let password = "clave\u{ba}\u{b2}\u{a0}x";
    pg.psql(&format!("CREATE ROLE u_uni LOGIN PASSWORD '{password}'; GRANT ALL ON DATABASE app TO u_uni"));
    let s = Sluice::builder(&pg).user("u_uni", &[("password", &toml_str(password))]).start();
    let c = connect(s.port, "u_uni", password, "app").await;
    assert_eq!(value(&c, "select current_user").await, "u_uni");
    let e = try_connect(s.port, "u_uni", "claveo2 x", "app").await.err();
    assert!(e.is_none(), "the normalized form is the same password to PostgreSQL: {e:?}");
    let e = try_connect(s.port, "u_uni", "clave", "app").await.unwrap_err();
    assert_eq!(common::code(&e), "28P01", "{e}");
}
