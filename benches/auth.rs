//! Authentication micro-benchmarks: what a client login costs Sluice when the config
//! holds a SCRAM secret (no PBKDF2: one exchange of HMACs and hashes), against the
//! PBKDF2 derivation a plain password would need per login without caching.
//! Run with `cargo bench --bench auth`; see bench/README.md.

mod common;

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use sluice::auth::scram::{ClientKeys, ScramClient, ScramSecret, ScramServer};

const PASSWORD: &str = "bench-password";
const SALT: &[u8] = b"sixteen byte sal";
const ITERATIONS: u32 = 4096;
const CLIENT_NONCE: &str = "rOprNGfwEbeRWgbNEkqO";
const SERVER_NONCE: &str = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0";

/// A server that has answered the client-first message, ready for the final one.
fn awaiting_final(secret: &ScramSecret, client_first: &[u8]) -> ScramServer {
    let mut server = ScramServer::new(secret.clone(), SERVER_NONCE.to_string());
    server.handle_client_first(client_first).expect("valid client-first");
    server
}

fn scram(c: &mut Criterion) {
    let secret = ScramSecret::derive(PASSWORD, SALT, ITERATIONS);
    let keys = ClientKeys::derive(PASSWORD, SALT, ITERATIONS);
    let mut client = ScramClient::new(CLIENT_NONCE.to_string());
    let client_first = client.client_first();
    let mut server = ScramServer::new(secret.clone(), SERVER_NONCE.to_string());
    let server_first = server.handle_client_first(&client_first).expect("valid client-first");
    let client_final = client.handle_server_first(&server_first, |_, _| Ok(keys.clone())).expect("valid server-first");
    let (server_final, _) = server.handle_client_final(&client_final).expect("the proof verifies");
    client.handle_server_final(&server_final).expect("the server signature verifies");

    let mut g = c.benchmark_group("scram_server");
    // Guards a login's cost with a stored SCRAM secret: verifying the client's proof.
    g.bench_function("client_final", |b| {
        b.iter_batched(
            || awaiting_final(&secret, &client_first),
            |mut server| server.handle_client_final(black_box(&client_final)).expect("the proof verifies"),
            BatchSize::SmallInput,
        )
    });
    // Guards the whole server side of a login's exchange (both SCRAM messages).
    g.bench_function("exchange", |b| {
        b.iter(|| {
            let mut server = awaiting_final(&secret, black_box(&client_first));
            server.handle_client_final(black_box(&client_final)).expect("the proof verifies")
        })
    });
    g.finish();
}

fn pbkdf2(c: &mut Criterion) {
    // Guards the PBKDF2 cost that caching ClientKeys avoids per login (4096 iterations).
    let mut g = c.benchmark_group("pbkdf2");
    g.sample_size(10);
    g.bench_function("client_keys_derive_4096", |b| {
        b.iter(|| ClientKeys::derive(black_box(PASSWORD), black_box(SALT), ITERATIONS))
    });
    g.finish();
}

criterion_group! {
    name = benches;
    config = common::config();
    targets = scram, pbkdf2
}
criterion_main!(benches);
