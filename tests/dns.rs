//! A database given by host name: when the name comes to resolve to another address
//! (a failover moving the name), connections to the old address are closed as they
//! come back, new ones go to the new address, and a cancel still reaches the server the
//! query runs on. The name is a line of /etc/hosts this test writes (glibc reads the
//! file at each lookup), the two servers two real PostgreSQL clusters on one port, each
//! on its own loopback address.

mod common;

use std::time::Duration;

use common::{PgCluster, PgOptions, Role, Sluice, connect, toml_str, value};

const HOSTS: &str = "/etc/hosts";

/// A line `ADDRESS NAME` of /etc/hosts for this test's own name, taken out again when
/// dropped.
struct HostsLine {
    name: String,
}

impl HostsLine {
    /// None when /etc/hosts cannot be written (not root).
    fn new(addr: &str) -> Option<HostsLine> {
        let writable = std::fs::OpenOptions::new().append(true).open(HOSTS).is_ok();
        let line = HostsLine { name: format!("sluice-dns-test-{}.invalid", std::process::id()) };
        writable.then(|| {
            line.point_to(addr);
            line
        })
    }

    /// Points the name at `addr`.
    fn point_to(&self, addr: &str) {
        self.point_to_all(&[addr]);
    }

    /// Points the name at every one of `addrs`, a line each.
    fn point_to_all(&self, addrs: &[&str]) {
        let mut text = Self::others(&self.name);
        addrs.iter().for_each(|addr| text.push_str(&format!("{addr} {}\n", self.name)));
        write_hosts(&text);
    }

    fn others(name: &str) -> String {
        let text = std::fs::read_to_string(HOSTS).unwrap_or_else(|e| panic!("read {HOSTS}: {e}"));
        text.lines().filter(|l| !l.split_whitespace().any(|w| w == name)).map(|l| format!("{l}\n")).collect()
    }
}

impl Drop for HostsLine {
    fn drop(&mut self) {
        write_hosts(&Self::others(&self.name));
    }
}

/// Replaces /etc/hosts by a rename (readers never see it half written), or in place
/// where it is a mount point (a container's), which cannot be renamed over.
fn write_hosts(text: &str) {
    let tmp = format!("{HOSTS}.sluice-test-{}", std::process::id());
    std::fs::write(&tmp, text).unwrap_or_else(|e| panic!("write {tmp}: {e}"));
    if let Ok(m) = std::fs::metadata(HOSTS) {
        let _ = std::fs::set_permissions(&tmp, m.permissions());
    }
    if std::fs::rename(&tmp, HOSTS).is_err() {
        let _ = std::fs::remove_file(&tmp);
        std::fs::write(HOSTS, text).unwrap_or_else(|e| panic!("write {HOSTS}: {e}"));
    }
}

/// A cluster listening on `addr` only, at `port` when given.
fn cluster_on(addr: &str, port: Option<u16>) -> PgCluster {
    // Sluice's connections may come from the address they go to.
    let hba_first = vec![format!("host all all {addr}/32 scram-sha-256")];
    PgCluster::start_with(PgOptions { listen: Some(addr.into()), port, hba_first, ..PgOptions::default() })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_follow_a_host_name_to_its_new_address() {
    let old = cluster_on("127.0.0.2", None);
    let new = cluster_on("127.0.0.3", Some(old.port));
    let Some(line) = HostsLine::new("127.0.0.2") else {
        // scripts/test.sh, run as root (as CI runs it), makes the skip a failure.
        assert!(std::env::var_os("SLUICE_REQUIRE_ROOT").is_none(), "{HOSTS} is not writable as root");
        eprintln!("skipped: this test writes {HOSTS} (run it as root, as CI does)");
        return;
    };
    let sluice = Sluice::builder(&old)
        .database("app", &[("host", &toml_str(&line.name))])
        .general("dns_max_ttl", "1")
        .general("admin_users", r#"["u_scram"]"#)
        .start();
    let port = sluice.port;
    let (scram, plain) = (Role::SCRAM, Role::PLAIN);
    let server_addr = "select host(inet_server_addr())";

    // Three server connections to the old address, in two pools: one in a transaction,
    // one running a long query, one idle.
    let in_tx = connect(port, scram.name, scram.password, "app").await;
    in_tx.batch_execute("BEGIN").await.unwrap();
    assert_eq!(value(&in_tx, server_addr).await, "127.0.0.2");
    let sleeper = connect(port, scram.name, scram.password, "app").await;
    let token = sleeper.cancel_token();
    let sleeping = tokio::spawn(async move { sleeper.simple_query("select pg_sleep(60)").await.map(|_| ()) });
    let idle = connect(port, plain.name, plain.password, "app").await;
    assert_eq!(value(&idle, server_addr).await, "127.0.0.2");
    assert!(common::wait_until(Duration::from_secs(10), || old.backends("query like '%pg_sleep(60)%'") == 1));

    line.point_to("127.0.0.3");
    // The janitor looks the name up again (its answer is over `dns_max_ttl` old while the
    // pools have connections).
    let change = "now resolves to [127.0.0.3] (was [127.0.0.2])";
    let noticed = common::wait_until(Duration::from_secs(15), || sluice.log().contains(change));
    assert!(noticed, "{}", sluice.log());
    // The idle connection is not lent again (checked at once, before the janitor's next
    // pass would close it), and goes.
    assert_eq!(value(&idle, server_addr).await, "127.0.0.3");
    let idle_gone = common::wait_until(Duration::from_secs(10), || old.backends("usename = 'u_plain'") == 0);
    assert!(idle_gone, "the idle connection to the old address stays\n{}", sluice.log());
    // The lent one is marked, and shown at the address it went to.
    let console = common::console::admin(port).await;
    let rows = common::console::rows(&console, "SHOW SERVERS").await;
    let mine = rows.iter().filter(|r| r.get("user") == Some("u_scram")).collect::<Vec<_>>();
    assert_eq!(mine.len(), 2, "the transaction's and the query's");
    for r in mine {
        assert_eq!((r.get("addr"), r.get("close_needed")), (Some("127.0.0.2"), Some("1")));
    }

    // The cancel goes where the query runs (a lookup now would give the new server,
    // which does not know the backend).
    token.cancel_query(tokio_postgres::NoTls).await.unwrap();
    let ended = tokio::time::timeout(Duration::from_secs(20), sleeping).await.expect("the cancel reached the server");
    let e = ended.unwrap().expect_err("the query was cancelled");
    assert_eq!(common::code(&e), "57014", "{e}");
    // Given back after the cancel, and at COMMIT: both closed, not lent again (the
    // next statement at once gets a new connection, to the new address).
    in_tx.batch_execute("COMMIT").await.unwrap();
    assert_eq!(value(&in_tx, server_addr).await, "127.0.0.3");
    let all_gone = common::wait_until(Duration::from_secs(10), || old.backends("true") == 0);
    assert!(all_gone, "connections to the old address stay open\n{}", sluice.log());
    assert_eq!(new.backends("usename in ('u_scram', 'u_plain')"), 2);
    let rows = common::console::rows(&console, "SHOW SERVERS").await;
    assert!(rows.iter().all(|r| r.get("addr") == Some("127.0.0.3") && r.get("close_needed") == Some("0")));
    let names = common::console::cell(&console, "SHOW LISTS", "list", "dns_names", "items").await;
    assert_eq!(names.as_deref(), Some("1"), "both pools share the name");
    let hosts = common::console::rows(&console, "SHOW DNS_HOSTS").await;
    let name = line.name.to_ascii_lowercase();
    assert_eq!(hosts.len(), 1);
    assert_eq!((hosts[0].get("hostname"), hosts[0].get("addrs")), (Some(name.as_str()), Some("127.0.0.3")));
    assert!(hosts[0].get("ttl").is_some_and(|t| t == "0" || t == "1"), "ttl {:?}", hosts[0].get("ttl"));
    assert!(common::console::rows(&console, "SHOW DNS_ZONES").await.is_empty());
}

/// A `listen_addr` host name resolving to an address this machine lacks (192.0.2.1,
/// TEST-NET-1) beside one it has: the one it lacks is skipped with a warning, as in
/// PgBouncer, and Sluice serves on the other (an IPv6 `localhost` without `::1`, say).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listen_name_with_an_address_the_machine_lacks_still_listens() {
    let pg = PgCluster::start();
    let Some(line) = HostsLine::new("127.0.0.1") else {
        assert!(std::env::var_os("SLUICE_REQUIRE_ROOT").is_none(), "{HOSTS} is not writable as root");
        eprintln!("skipped: this test writes {HOSTS} (run it as root, as CI does)");
        return;
    };
    line.point_to_all(&["192.0.2.1", "127.0.0.1"]);
    let s = Sluice::builder(&pg).general("listen_addr", &format!("[{}]", toml_str(&line.name))).start();
    let c = connect(s.port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
    assert_eq!(value(&c, "select 1").await, "1");
    assert!(s.log().contains("cannot listen on 192.0.2.1"), "{}", s.log());
}
