//! pgbench through a transaction pool smaller than the client count: TPC-B with the
//! simple and the extended protocol, select-only (`-S`) from 1 to 500 clients over 40 servers
//! in each query mode, zero failed transactions; and how often the server parses a statement
//! that 100 clients prepare (counted in its log).

mod common;

use common::{PgCluster, Role, Sluice, libpq_env};

fn pgbench(port: u16, args: &[&str]) -> String {
    pgbench_as(Role::SCRAM, port, args)
}

/// pgbench ARGS on database `app` at 127.0.0.1:`port` as `role` (PGSSLMODE=disable, `libpq_env`).
fn pgbench_as(role: Role, port: u16, args: &[&str]) -> String {
    let mut cmd = std::process::Command::new("pgbench");
    let out = libpq_env(&mut cmd, port, "127.0.0.1", role.name, role.password, common::DB)
        .args(args)
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
    let servers = pg.backends("usename = 'u_scram'");
    assert!(servers <= 10, "pool of 10 opened {servers} server connections");
}

/// Server connections of the select-only runs: the published comparisons use 40.
const SELECT_ONLY_POOL: usize = 40;

/// pgbench `-S` (one primary-key SELECT per transaction) through a transaction pool of 40 with
/// 1, 40, 120 and 500 clients, ~3 s each: zero failed transactions, every client served.
/// Clients log in with `trust`: pgbench's `-T` clock includes connecting, and libpq's SCRAM
/// (PBKDF2) costs ~5 ms per connection on 2 cores, so 500 SCRAM logins would eat the run.
fn select_only_through_a_pool_of_40(protocol: &str) {
    let pg = PgCluster::start();
    pgbench_as(Role::TRUST, pg.port, &["-i", "-s", "1", "-q"]);
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("pool_mode", "\"transaction\"")
        .general("max_client_conn", "600")
        .general("workers", "2")
        .database("app", &[("pool_size", &SELECT_ONLY_POOL.to_string())])
        .start();
    for clients in [1u32, 40, 120, 500] {
        let (c, j) = (clients.to_string(), clients.min(2).to_string());
        let out = pgbench_as(Role::TRUST, s.port, &["-n", "-S", "-M", protocol, "-c", &c, "-j", &j, "-T", "3"]);
        let what = format!("-M {protocol} -c {clients}");
        assert!(out.contains("number of failed transactions: 0 "), "{what}:\n{out}");
        assert!(!out.contains("aborted"), "{what}:\n{out}");
        assert!(processed(&out) >= u64::from(clients), "{what}: fewer transactions than clients:\n{out}");
        eprintln!("{what}: {} transactions", processed(&out));
    }
    let servers = pg.backends("usename = 'u_trust'");
    assert!(servers <= SELECT_ONLY_POOL, "pool of {SELECT_ONLY_POOL} opened {servers} server connections");
}

#[test]
fn select_only_simple_1_to_500_clients() {
    select_only_through_a_pool_of_40("simple");
}

#[test]
fn select_only_extended_1_to_500_clients() {
    select_only_through_a_pool_of_40("extended");
}

#[test]
fn select_only_prepared_1_to_500_clients() {
    select_only_through_a_pool_of_40("prepared");
}

/// The text of pgbench's `-S` statement as `-M prepared` sends it.
const SELECT_ONLY_SQL: &str = "SELECT abalance FROM pgbench_accounts WHERE aid = $1";

/// Sets up a cluster for counting Parses: pgbench tables, and every later session of u_scram
/// logging each protocol message it executes ("duration: ... ms  parse NAME: SQL").
fn parse_counting_cluster() -> PgCluster {
    let pg = PgCluster::start();
    pgbench(pg.port, &["-i", "-s", "1", "-q"]);
    pg.psql("alter role u_scram set log_min_duration_statement = 0");
    pg
}

/// Parse messages of the `-S` statement the server has logged so far, whatever their names.
fn logged_parses(pg: &PgCluster) -> usize {
    pg.log().lines().filter(|line| line.contains("  parse ") && line.contains(SELECT_ONLY_SQL)).count()
}

/// 100 pgbench clients preparing the same statement, 20 transactions each.
const PREPARE_ARGS: [&str; 11] = ["-n", "-S", "-M", "prepared", "-c", "100", "-j", "2", "-t", "20", "-r"];

#[test]
fn parses_are_counted_from_the_server_log() {
    // Straight to PostgreSQL every client parses once: the count the pooled test relies on.
    let pg = parse_counting_cluster();
    let out = pgbench(pg.port, &PREPARE_ARGS);
    assert_eq!(processed(&out), 2000, "{out}");
    assert_eq!(logged_parses(&pg), 100, "one Parse per direct client expected");
}

#[test]
fn hundred_clients_preparing_over_ten_servers_parse_at_most_ten_times() {
    let pg = parse_counting_cluster();
    let s = Sluice::builder(&pg)
        .general("pool_mode", "\"transaction\"")
        .general("max_client_conn", "200")
        .database("app", &[("pool_size", "10")])
        .start();
    let out = pgbench(s.port, &PREPARE_ARGS);
    assert!(out.contains("number of failed transactions: 0 "), "{out}");
    assert_eq!(processed(&out), 2000, "{out}");
    let parses = logged_parses(&pg);
    assert!(
        (1..=10).contains(&parses),
        "100 clients over a pool of 10: the server parsed the statement {parses} times"
    );
}
