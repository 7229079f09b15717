//! pgbench through a transaction pool smaller than the client count: TPC-B with the
//! simple and the extended protocol, zero failed transactions.

mod common;

use common::{PgCluster, Role, Sluice};

fn pgbench(port: u16, args: &[&str]) -> String {
    let out = std::process::Command::new("pgbench")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", Role::SCRAM.name])
        .args(args)
        .arg("app")
        .env("PGPASSWORD", Role::SCRAM.password)
        .env("PGSSLMODE", "disable")
        .output()
        .expect("pgbench runs");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "pgbench {args:?} failed:\n{text}");
    text
}

fn processed(out: &str) -> u64 {
    let line = out.lines().find(|l| l.contains("number of transactions actually processed")).expect("summary");
    line.split(':').nth(1).unwrap().trim().split('/').next().unwrap().parse().unwrap()
}

#[test]
fn tpcb_through_a_pool_of_ten() {
    let pg = PgCluster::start();
    pg.psql("alter database app owner to u_scram");
    let s = Sluice::builder(&pg).general("max_client_conn", "100").database("app", &[("pool_size", "10")]).start();
    pgbench(s.port, &["-i", "-s", "2", "-q"]);
    for proto in ["simple", "extended"] {
        let out = pgbench(s.port, &["-c", "50", "-j", "2", "-T", "10", "-M", proto]);
        assert!(out.contains("number of failed transactions: 0 "), "{proto}:\n{out}");
        assert!(!out.contains("aborted"), "{proto}:\n{out}");
        assert!(processed(&out) > 100, "{proto}: too few transactions:\n{out}");
    }
    let servers: u32 = pg.psql("select count(*) from pg_stat_activity where usename = 'u_scram'").parse().unwrap();
    assert!(servers <= 10, "pool of 10 opened {servers} server connections");
}
