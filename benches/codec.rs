//! Codec micro-benchmarks: what the relay pays per read apart from protocol tracking:
//! header peeking, frame scanning with the relay's need functions, and splicing.
//! Run with `cargo bench --bench codec`; see bench/README.md.

mod common;

use std::hint::black_box;

use bytes::BytesMut;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use sluice::client::bench_support::{client_need, server_need};
use sluice::prepared::renamed_prefix;
use sluice::protocol::scan::{Need, Scanner, Splice};
use sluice::protocol::{Header, build};

/// Scans `buf` from a fresh scanner; returns the bytes consumed plus the messages seen
/// (so nothing is optimised away).
fn scan(buf: &[u8], need: impl Fn(u8) -> Need, splice: &mut Splice) -> usize {
    let mut seen = 0;
    let n = Scanner::default()
        .scan(
            buf,
            need,
            |m, _| {
                seen += 1;
                black_box(m.frame);
                Ok(())
            },
            splice,
        )
        .expect("valid traffic");
    n + seen
}

fn header_peek(c: &mut Criterion) {
    // Guards the per-message cost every frame pays: reading and checking its header.
    let reply = common::rows_reply(1);
    c.bench_function("header_peek", |b| b.iter(|| Header::peek(black_box(&reply[..]))));
}

fn scan_server(c: &mut Criterion) {
    // Guards scanning of server replies: streamed DataRows must cost a header peek each
    // and nothing per byte; RowDescription/CommandComplete/ReadyForQuery are held whole.
    let mut g = c.benchmark_group("scan_server");
    let mut splice = Splice::new();
    for rows in [1, 10, 1000] {
        let reply = common::rows_reply(rows);
        assert_eq!(scan(&reply, server_need, &mut splice), reply.len() + rows + 3);
        g.throughput(Throughput::Bytes(reply.len() as u64));
        g.bench_with_input(BenchmarkId::new("rows", rows), &reply, |b, reply| {
            b.iter(|| scan(black_box(reply), server_need, &mut splice))
        });
    }
    g.finish();
}

fn scan_client(c: &mut Criterion) {
    // Guards scanning of client requests with the pooled-mode need function (Query and
    // Bind prefixes are held for prepared-statement handling).
    let mut g = c.benchmark_group("scan_client");
    let mut splice = Splice::new();
    let cases = [("query", common::simple_request()), ("bind_execute_sync", common::prepared_request(b"P0_1"))];
    for (name, req) in cases {
        g.throughput(Throughput::Bytes(req.len() as u64));
        g.bench_function(name, |b| b.iter(|| scan(black_box(&req), client_need(true), &mut splice)));
    }
    g.finish();
}

/// Scans `buf`, applies the edits `edit` makes for each message, then produces the
/// output as the relay does before writing it; returns its length.
fn splice_out(buf: &[u8], splice: &mut Splice, edit: impl Fn(u8, usize, usize, &mut Splice)) -> usize {
    let n = Scanner::default()
        .scan(
            buf,
            server_need,
            |m, sp| {
                edit(m.tag, m.start, m.frame_len, sp);
                Ok(())
            },
            splice,
        )
        .expect("valid traffic");
    let len = black_box(splice.finish(buf, n)).len();
    splice.reset();
    len
}

fn splice(c: &mut Criterion) {
    // Guards the no-copy promise: with no edits the output is the input slice, so
    // no_edit must cost what scan_server costs; an edit copies the batch once.
    let mut g = c.benchmark_group("splice");
    let mut splice = Splice::new();
    for rows in [10, 1000] {
        // An extended-protocol reply led by the ParseComplete of a Parse Sluice injected.
        let mut reply = BytesMut::new();
        build::parse_complete(&mut reply);
        build::bind_complete(&mut reply);
        reply.extend_from_slice(&common::rows_reply(rows));
        let z_at = reply.len() - 6;
        // Drop the injected Parse's reply; insert a synthetic CloseComplete before ReadyForQuery.
        let drop_insert = |tag: u8, start: usize, len: usize, sp: &mut Splice| match tag {
            b'1' => sp.drop_range(start, start + len),
            b'Z' => sp.insert(z_at, b"3\0\0\0\x04"),
            _ => {}
        };
        assert_eq!(splice_out(&reply, &mut splice, |_, _, _, _| {}), reply.len());
        assert_eq!(splice_out(&reply, &mut splice, drop_insert), reply.len());
        g.throughput(Throughput::Bytes(reply.len() as u64));
        g.bench_with_input(BenchmarkId::new("no_edit", rows), &reply, |b, reply| {
            b.iter(|| splice_out(black_box(reply), &mut splice, |_, _, _, _| {}))
        });
        g.bench_with_input(BenchmarkId::new("drop_insert", rows), &reply, |b, reply| {
            b.iter(|| splice_out(black_box(reply), &mut splice, drop_insert))
        });
    }
    // Guards the statement rename of a Bind (drop its prefix, insert the renamed one),
    // the edit Extended makes on every prepared execution.
    let req = common::prepared_request(b"P0_1");
    let new_name = b"sluice_0123456789abcdef";
    g.throughput(Throughput::Bytes(req.len() as u64));
    g.bench_function("rename_bind", |b| {
        b.iter(|| {
            let buf = black_box(&req[..]);
            let n = Scanner::default()
                .scan(
                    buf,
                    client_need(true),
                    |m, sp| {
                        if m.tag == b'B' {
                            let prefix = m.frame.expect("Bind prefix is needed");
                            let (out, from) = sp.insert_buf();
                            let replaced = renamed_prefix(out, prefix, m.frame_len, m.tag, new_name)?;
                            sp.drop_range(m.start, m.start + replaced);
                            sp.commit_insert(m.start, from);
                        }
                        Ok(())
                    },
                    &mut splice,
                )
                .expect("valid traffic");
            let len = black_box(splice.finish(buf, n)).len();
            splice.reset();
            len
        })
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = header_peek, scan_server, scan_client, splice
}
criterion_main!(benches);
