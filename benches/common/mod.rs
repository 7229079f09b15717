//! Shared by the benches: criterion settings that keep the suite near a minute, and
//! realistic protocol traffic (pgbench-like queries and replies) built once per bench.
#![allow(dead_code)] // each bench uses a part

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use criterion::Criterion;
use sluice::protocol::TxStatus;
use sluice::protocol::build;

/// Short runs: 0.5 s warm-up, 2 s measurement (command-line flags still override).
pub fn config() -> Criterion {
    Criterion::default().warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2))
}

/// pgbench -S's statement, with the literal the simple protocol carries.
pub const SELECT_SQL: &str = "SELECT abalance FROM pgbench_accounts WHERE aid = 4242;";
/// The same, as pgbench -M prepared/extended parses it.
pub const SELECT_PARAM_SQL: &str = "SELECT abalance FROM pgbench_accounts WHERE aid = $1;";

/// Bind of `stmt` to the unnamed portal with text parameters and text results.
pub fn bind(buf: &mut BytesMut, stmt: &[u8], params: &[&[u8]]) {
    build::frame(buf, b'B', |b| {
        b.put_u8(0); // unnamed portal
        b.put_slice(stmt);
        b.put_u8(0);
        b.put_u16(0); // parameter formats: all text
        b.put_u16(params.len() as u16);
        for p in params {
            b.put_i32(p.len() as i32);
            b.put_slice(p);
        }
        b.put_u16(0); // result formats: all text
    });
}

/// Execute of the unnamed portal, all rows.
pub fn execute(buf: &mut BytesMut) {
    build::frame(buf, b'E', |b| {
        b.put_u8(0);
        b.put_i32(0);
    });
}

/// Client batch of the simple protocol: one Query.
pub fn simple_request() -> BytesMut {
    let mut b = BytesMut::new();
    build::query(&mut b, SELECT_SQL);
    b
}

/// Client batch of the extended protocol with a prepared statement: Bind/Execute/Sync.
pub fn prepared_request(stmt: &[u8]) -> BytesMut {
    let mut b = BytesMut::new();
    bind(&mut b, stmt, &[b"4242"]);
    execute(&mut b);
    build::sync(&mut b);
    b
}

/// Client batch of the extended protocol without a named statement (pgbench -M
/// extended): Parse/Bind/Execute/Sync of the unnamed statement.
pub fn extended_request() -> BytesMut {
    let mut b = BytesMut::new();
    build::parse(&mut b, b"", SELECT_PARAM_SQL.as_bytes(), &[23]);
    b.extend_from_slice(&prepared_request(b""));
    b
}

/// Server reply to Parse/Bind/Execute/Sync.
pub fn extended_reply() -> BytesMut {
    let mut b = BytesMut::new();
    build::parse_complete(&mut b);
    b.extend_from_slice(&prepared_reply());
    b
}

/// Client batch preparing `stmt`: Parse/Sync.
pub fn prepare_request(stmt: &[u8]) -> BytesMut {
    let mut b = BytesMut::new();
    build::parse(&mut b, stmt, SELECT_PARAM_SQL.as_bytes(), &[23]);
    build::sync(&mut b);
    b
}

/// Server reply to a simple query: RowDescription, `rows` DataRows of pgbench_accounts
/// (aid, bid, abalance, filler: about 110 bytes each), CommandComplete, ReadyForQuery.
pub fn rows_reply(rows: usize) -> BytesMut {
    let mut b = BytesMut::new();
    let text = 0;
    build::row_description(
        &mut b,
        &[("aid", 23, 4, text), ("bid", 23, 4, text), ("abalance", 23, 4, text), ("filler", 1042, -1, text)],
    );
    let filler = [b' '; 84];
    for i in 0..rows {
        let aid = (i + 1).to_string();
        build::data_row(&mut b, &[Some(aid.as_bytes()), Some(b"1"), Some(b"-2817"), Some(&filler)]);
    }
    build::command_complete(&mut b, &format!("SELECT {rows}"));
    build::ready_for_query(&mut b, TxStatus::Idle);
    b
}

/// Server reply to pgbench -S through the simple protocol.
pub fn simple_reply() -> BytesMut {
    let mut b = BytesMut::new();
    build::row_description(&mut b, &[("abalance", 23, 4, 0)]);
    build::data_row(&mut b, &[Some(b"-2817")]);
    build::command_complete(&mut b, "SELECT 1");
    build::ready_for_query(&mut b, TxStatus::Idle);
    b
}

/// Server reply to Bind/Execute/Sync: BindComplete, DataRow, CommandComplete, ReadyForQuery.
pub fn prepared_reply() -> BytesMut {
    let mut b = BytesMut::new();
    build::bind_complete(&mut b);
    build::data_row(&mut b, &[Some(b"-2817")]);
    build::command_complete(&mut b, "SELECT 1");
    build::ready_for_query(&mut b, TxStatus::Idle);
    b
}

/// Server reply to Parse/Sync.
pub fn prepare_reply() -> BytesMut {
    let mut b = BytesMut::new();
    build::parse_complete(&mut b);
    build::ready_for_query(&mut b, TxStatus::Idle);
    b
}
