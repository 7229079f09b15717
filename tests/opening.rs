//! Server connections being opened: listed by SHOW SERVERS (state `new`) while they log
//! in, and waited for by WAIT_CLOSE when a RECONNECT marked them.

mod common;

use std::time::Duration;

use common::console::{admin, cell, message, rows};
use common::{PgCluster, Sluice, SluiceBuilder, connect, eventually, try_connect, value};

/// Admin (u_scram) on top of the default test config.
fn with_console(b: SluiceBuilder) -> SluiceBuilder {
    b.general("admin_users", r#"["u_scram"]"#)
}

/// A server connection being opened is listed by SHOW SERVERS in state `new` (as in
/// PgBouncer) while its login lasts, and goes from the list when the login fails.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_servers_lists_connections_being_opened() {
    let pg = PgCluster::start();
    // A "server" that accepts and never answers: the login waits for it.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_port = silent.local_addr().unwrap().port();
    let s = with_console(Sluice::builder(&pg))
        .database("silent", &[("port", &silent_port.to_string())])
        .general("server_connect_timeout", "3")
        .start();
    let port = s.port;
    let client = tokio::spawn(async move { try_connect(port, "u_scram", "pw_scram", "silent").await.map(|_| ()) });
    let a = admin(s.port).await;
    let listed = eventually(Duration::from_secs(10), || async {
        cell(&a, "SHOW SERVERS", "database", "silent", "state").await.as_deref() == Some("new")
    })
    .await;
    let states = rows(&a, "SHOW SERVERS").await.iter().map(|r| r.get("state").map(String::from)).collect::<Vec<_>>();
    assert!(listed, "{states:?}");
    let e = client.await.unwrap().expect_err("the silent server let the client in");
    assert!(message(&e).contains("timed out connecting to the server"), "{}", message(&e));
    assert_eq!(cell(&a, "SHOW SERVERS", "database", "silent", "state").await, None, "the failed login is still listed");
}

/// A TCP proxy to `target` whose first connection waits for `gate` before it is
/// forwarded (a server slow to answer its first login); later ones go through at once.
async fn gated_proxy(target: u16, gate: std::sync::Arc<tokio::sync::Notify>) -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut first = true;
        while let Ok((mut inbound, _)) = listener.accept().await {
            let wait = std::mem::replace(&mut first, false).then(|| gate.clone());
            tokio::spawn(async move {
                if let Some(gate) = wait {
                    gate.notified().await;
                }
                let mut outbound = tokio::net::TcpStream::connect(("127.0.0.1", target)).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            });
        }
    });
    port
}

/// A connection being opened when RECONNECT comes is marked: WAIT_CLOSE waits for it,
/// and returns once it has been opened, closed unlent and opened again for its client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_close_returns_after_a_marked_connect_is_replaced() {
    let pg = PgCluster::start();
    let gate = std::sync::Arc::new(tokio::sync::Notify::new());
    let proxy = gated_proxy(pg.port, gate.clone()).await;
    // Session mode: the client keeps the connection that replaces the marked one, so
    // only its listing going away tells WAIT_CLOSE.
    let gated = [("port", proxy.to_string()), ("pool_mode", "\"session\"".to_string())];
    let gated = gated.iter().map(|(k, v)| (*k, v.as_str())).collect::<Vec<_>>();
    let s = with_console(Sluice::builder(&pg)).database("gated", &gated).start();
    let port = s.port;
    let client = tokio::spawn(async move { connect(port, "u_scram", "pw_scram", "gated").await });
    let a = admin(s.port).await;
    let opening = eventually(Duration::from_secs(10), || async {
        cell(&a, "SHOW SERVERS", "database", "gated", "state").await.as_deref() == Some("new")
    })
    .await;
    assert!(opening, "no connection being opened is listed");
    a.simple_query("RECONNECT gated").await.unwrap();
    let marked = cell(&a, "SHOW SERVERS", "database", "gated", "close_needed").await;
    assert_eq!(marked.as_deref(), Some("1"), "the connection being opened is not marked");
    let waiter = admin(s.port).await;
    let mut wait_close = tokio::spawn(async move { waiter.simple_query("WAIT_CLOSE gated").await.map(|_| ()) });
    // It waits for the marked connection (absence of an answer, over a bounded wait).
    let early = tokio::time::timeout(Duration::from_millis(500), &mut wait_close).await;
    assert!(early.is_err(), "WAIT_CLOSE returned while a marked connection was being opened: {early:?}");
    gate.notify_one();
    let closed = tokio::time::timeout(Duration::from_secs(20), wait_close).await;
    assert!(matches!(closed, Ok(Ok(Ok(())))), "WAIT_CLOSE did not return: {closed:?}");
    let c = client.await.unwrap();
    assert_eq!(value(&c, "select 1").await, "1");
}
