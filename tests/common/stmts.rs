//! Prepared-statement helpers for the raw-protocol tests (tests/prepared.rs,
//! tests/pipelines.rs): a Sluice in transaction mode with trust logins, and the
//! Parse / Bind / Describe / Close exchanges they repeat.

use super::raw::*;
use super::{PgCluster, Sluice};

pub fn setup(pool_size: usize, extra: &[(&str, &str)]) -> (PgCluster, Sluice) {
    let pg = PgCluster::start();
    let mut b = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("pool_mode", "\"transaction\"")
        .database("app", &[("pool_size", &pool_size.to_string())]);
    for (k, v) in extra {
        b = b.general(k, v);
    }
    (pg, b.start())
}

pub fn login(s: &Sluice) -> Raw {
    Raw::login(s.port, "u_trust", "app")
}

/// Parse + Sync; returns the tags received.
pub fn prepare(c: &mut Raw, name: &str, sql: &str) -> String {
    let mut b = parse(name, sql);
    b.extend(sync());
    c.send(&b);
    tags(&c.until_ready())
}

/// Bind + Execute + Sync of a named statement; returns the messages.
pub fn run(c: &mut Raw, name: &str, params: &[&str]) -> Vec<(u8, Vec<u8>)> {
    let mut b = bind("", name, params);
    b.extend(execute("", 0));
    b.extend(sync());
    c.send(&b);
    c.until_ready()
}

/// Describe of a named statement + Sync, as drivers describe what they prepared;
/// returns the tags received.
pub fn describe_stmt(c: &mut Raw, name: &str) -> String {
    let mut b = vec![b'S'];
    b.extend_from_slice(name.as_bytes());
    b.push(0);
    let mut m = msg(b'D', &b);
    m.extend(sync());
    c.send(&m);
    tags(&c.until_ready())
}

pub fn close_stmt(name: &str) -> Vec<u8> {
    let mut b = vec![b'S'];
    b.extend_from_slice(name.as_bytes());
    b.push(0);
    msg(b'C', &b)
}
