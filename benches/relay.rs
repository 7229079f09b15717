//! Relay tracking micro-benchmarks: the protocol bookkeeping of one whole transaction
//! (`Track::scan_client` + `Track::scan_server`, with prepared-statement rewriting in
//! transaction mode), and the heap allocations it makes, counted by a wrapping global
//! allocator. Run with `cargo bench --bench relay`; see bench/README.md.
//! `SLUICE_ALLOC_TRACE=1` prints a backtrace of each allocation of one transaction.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::hint::black_box;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use criterion::{Criterion, criterion_group};
use sluice::client::bench_support::Link;
use sluice::config::PoolMode;

/// The system allocator, counting allocations (and reallocations, which may move).
struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);
static TRACE: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Set while a traced allocation is being reported (reporting allocates too).
    static IN_TRACE: Cell<bool> = const { Cell::new(false) };
}

fn counted(size: usize) {
    ALLOCS.fetch_add(1, Relaxed);
    if TRACE.load(Relaxed) && !IN_TRACE.with(|t| t.replace(true)) {
        trace(size);
        IN_TRACE.with(|t| t.set(false));
    }
}

/// Prints where an allocation comes from: the Sluice frames of its backtrace, innermost
/// first, with their source lines.
fn trace(size: usize) {
    let bt = std::backtrace::Backtrace::force_capture().to_string();
    let mut lines = bt.lines();
    let mut frames = Vec::new();
    while let Some(line) = lines.next() {
        let symbol = line.trim_start().split_once(": ").map_or("", |(_, s)| s);
        if symbol.starts_with("sluice::") && !symbol.contains("bench_support") {
            let at = lines.next().unwrap_or("").trim().trim_start_matches("at ");
            frames.push(format!("    {symbol} ({at})"));
        }
    }
    eprintln!("  {size} bytes:\n{}", frames.join("\n"));
}

// SAFETY: every call is forwarded unchanged to the system allocator.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        counted(layout.size());
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        counted(layout.size());
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        counted(new_size);
        unsafe { System.realloc(ptr, layout, new_size) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// A client's statement name, as pgJDBC names them.
const STMT: &[u8] = b"S_1";

/// A link where the client prepared [`STMT`] on this server in an earlier transaction.
fn prepared_link() -> Link {
    let mut link = Link::new(PoolMode::Transaction);
    link.link();
    let out = link.client(&common::prepare_request(STMT)).expect("valid Parse/Sync").to_vec();
    assert!(out.windows(7).any(|w| w == b"sluice_"), "the Parse is renamed");
    link.server(&common::prepare_reply()).expect("valid reply");
    assert!(link.releasable());
    link.release();
    link
}

/// One transaction through a link: link, request, reply, release; returns the bytes
/// forwarded both ways.
fn transaction(link: &mut Link, request: &[u8], reply: &[u8]) -> usize {
    link.link();
    let sent = link.client(request).expect("valid request").len();
    let received = link.server(reply).expect("valid reply").len();
    debug_assert!(link.releasable());
    link.release();
    sent + received
}

/// The flows measured: name, link, client batch, server reply.
fn flows() -> Vec<(&'static str, Link, Vec<u8>, Vec<u8>)> {
    let simple = (common::simple_request().to_vec(), common::simple_reply().to_vec());
    vec![
        ("simple_txn/transaction_mode", Link::new(PoolMode::Transaction), simple.0.clone(), simple.1.clone()),
        ("simple_txn/session_mode", Link::new(PoolMode::Session), simple.0, simple.1),
        (
            "prepared_txn/transaction_mode",
            prepared_link(),
            common::prepared_request(STMT).to_vec(),
            common::prepared_reply().to_vec(),
        ),
        (
            "extended_txn/transaction_mode",
            Link::new(PoolMode::Transaction),
            common::extended_request().to_vec(),
            common::extended_reply().to_vec(),
        ),
    ]
}

/// Allocations since `*mark`, which moves to now.
fn since(mark: &mut u64) -> u64 {
    let now = ALLOCS.load(Relaxed);
    now - std::mem::replace(mark, now)
}

/// Allocations per transaction in the steady state (after warm-up transactions have
/// grown the reused buffers), in total and by step, printed before the timings.
fn report_allocations() {
    const TXNS: u64 = 1000;
    println!("allocations per transaction (steady state, mean of {TXNS}):");
    println!("  {:<32} {:>6} {:>7} {:>7} {:>7}", "flow", "total", "client", "server", "release");
    for (name, mut link, request, reply) in flows() {
        for _ in 0..100 {
            transaction(&mut link, &request, &reply);
        }
        let [mut client, mut server, mut other] = [0u64; 3];
        let mut mark = ALLOCS.load(Relaxed);
        for _ in 0..TXNS {
            link.link();
            other += since(&mut mark);
            black_box(link.client(&request).expect("valid request"));
            client += since(&mut mark);
            black_box(link.server(&reply).expect("valid reply"));
            server += since(&mut mark);
            link.release();
            other += since(&mut mark);
        }
        let per = |n: u64| n as f64 / TXNS as f64;
        let total = per(client + server + other);
        println!("  {name:<32} {total:>6.2} {:>7.2} {:>7.2} {:>7.2}", per(client), per(server), per(other));
        if std::env::var_os("SLUICE_ALLOC_TRACE").is_some() {
            eprintln!("allocations of one {name} transaction:");
            TRACE.store(true, Relaxed);
            transaction(&mut link, &request, &reply);
            TRACE.store(false, Relaxed);
        }
    }
}

fn relay(c: &mut Criterion) {
    // Guards the tracking cost of a whole transaction in each flow: simple protocol in
    // transaction mode (with prepared-statement bookkeeping) and in session mode (none),
    // a prepared Bind/Execute/Sync whose statement is renamed for the server, and an
    // unnamed Parse/Bind/Execute/Sync (pgbench -M extended).
    for (name, mut link, request, reply) in flows() {
        c.bench_function(name, |b| b.iter(|| transaction(&mut link, black_box(&request), black_box(&reply))));
    }
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = relay
}

fn main() {
    report_allocations();
    benches();
    Criterion::default().configure_from_args().final_summary();
}
