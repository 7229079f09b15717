//! The HTTP endpoint from outside: /metrics in Prometheus text format while traffic
//! flows, the Grafana dashboard's metrics exist, Debian's prometheus-pgbouncer-exporter
//! reads the admin console unchanged, and the live view renders real numbers in a
//! headless Chromium.

mod common;

use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::http::{http_get, sample};
use common::{PgCluster, Role, Sluice, connect, eventually, free_port, libpq_env, wait_until};

async fn get(port: u16, path: &str) -> (u16, String) {
    let path = path.to_string();
    tokio::task::spawn_blocking(move || http_get(port, &path)).await.unwrap().expect("HTTP GET")
}

/// GETs `path` until `done(body)` or `timeout` (`eventually`); whether it held, and the
/// last body (or the last request's error: a refused or reset request is polled again).
async fn poll_get(port: u16, path: &str, timeout: Duration, done: impl Fn(&str) -> bool) -> (bool, String) {
    let last = std::cell::RefCell::new(String::new());
    let held = eventually(timeout, || async {
        let path = path.to_string();
        let got = tokio::task::spawn_blocking(move || http_get(port, &path)).await.unwrap();
        let (ok, body) = match got {
            Ok((_, body)) => (done(&body), body),
            Err(e) => (false, format!("HTTP GET failed: {e}")),
        };
        *last.borrow_mut() = body;
        ok
    })
    .await;
    (held, last.into_inner())
}

/// Starts Sluice with the console and the metrics endpoint; returns it and the HTTP port.
fn start(pg: &PgCluster) -> (Sluice, u16) {
    let http = free_port();
    let s = Sluice::builder(pg)
        .general("admin_users", r#"["u_scram"]"#)
        .general("metrics_listen", &format!("\"127.0.0.1:{http}\""))
        .general("admin_legacy_columns", "true")
        .start();
    // The endpoint is bound after the pooler's own listeners, which `start` waits for.
    let up = wait_until(Duration::from_secs(10), || TcpStream::connect(("127.0.0.1", http)).is_ok());
    assert!(up, "the metrics endpoint never listened on {http}");
    (s, http)
}

/// Keeps `n` clients running small transactions until the handle is aborted.
async fn traffic(port: u16, n: usize) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let c = connect(port, Role::SCRAM.name, Role::SCRAM.password, "app").await;
        tasks.push(tokio::spawn(async move {
            for i in 0..1_000_000u64 {
                let sql = if i % 50 == 0 { "select nosuchcolumn" } else { "select 1" };
                if c.simple_query(sql).await.is_err() && sql == "select 1" {
                    break;
                }
            }
        }));
    }
    tasks
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_metrics_and_grafana_dashboard() {
    let pg = PgCluster::start();
    let (s, http) = start(&pg);
    let (status, _) = get(http, "/nope").await;
    assert_eq!(status, 404);
    let load = traffic(s.port, 2).await;
    let pool = "{database=\"app\",user=\"u_scram\"";
    let (flowing, text) = poll_get(http, "/metrics", Duration::from_secs(10), |t| {
        sample(t, &format!("sluice_transactions_total{pool}}}")).unwrap_or(0.0) > 10.0
            && sample(t, &format!("sluice_errors_total{pool},class=\"42\"}}")).unwrap_or(0.0) > 0.0
    })
    .await;
    assert!(flowing, "no traffic in /metrics:\n{text}");
    for prefix in [
        "sluice_queries_total",
        "sluice_received_bytes_total",
        "sluice_sent_bytes_total",
        "sluice_server_connects_total",
        "sluice_server_assignments_total",
    ] {
        assert!(sample(&text, &format!("{prefix}{pool}}}")).unwrap_or(0.0) > 0.0, "{prefix}:\n{text}");
    }
    let clients: f64 = ["active", "idle", "waiting"]
        .iter()
        .map(|st| sample(&text, &format!("sluice_pool_clients{pool},state=\"{st}\"}}")).expect("client state"))
        .sum();
    assert_eq!(clients, 2.0, "{text}");
    assert!(text.contains("# TYPE sluice_transaction_duration_seconds histogram\n"), "{text}");
    let inf = sample(&text, &format!("sluice_transaction_duration_seconds_bucket{pool},le=\"+Inf\"}}")).unwrap();
    let count = sample(&text, &format!("sluice_transaction_duration_seconds_count{pool}}}")).unwrap();
    assert_eq!(inf, count);
    assert!(sample(&text, &format!("sluice_transaction_duration_seconds_bucket{pool},le=\"0.00005\"}}")).is_some());
    assert!(sample(&text, &format!("sluice_server_connect_duration_seconds_count{pool}}}")).unwrap() >= 1.0);
    load.iter().for_each(|t| t.abort());

    // every metric the sample dashboard queries is exported
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/grafana-dashboard.json");
    let dash: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).expect("valid JSON");
    let panels = dash["panels"].as_array().expect("panels");
    assert!(panels.len() >= 10);
    for panel in panels {
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{panel}");
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            for name in metric_names(expr) {
                let base = ["_bucket", "_sum", "_count"].iter().find_map(|s| name.strip_suffix(s)).unwrap_or(&name);
                let typed =
                    text.contains(&format!("# TYPE {name} ")) || text.contains(&format!("# TYPE {base} histogram"));
                assert!(typed, "panel {:?} uses {name}, not in /metrics", panel["title"]);
            }
        }
    }
}

fn metric_names(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(i) = rest.find("sluice_") {
        let tail = &rest[i..];
        let end = tail.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(tail.len());
        out.push(tail[..end].to_string());
        rest = &tail[end..];
    }
    out
}

/// SLUICE_REQUIRE_TOOLS (set by scripts/test.sh, which installs them) makes a missing
/// external tool a failure; otherwise the test is skipped with a note.
fn tool(path: &str) -> bool {
    let present = std::path::Path::new(path).exists();
    if !present {
        assert!(std::env::var_os("SLUICE_REQUIRE_TOOLS").is_none(), "{path} is missing (scripts/test.sh installs it)");
        eprintln!("SKIPPED: {path} is not installed (scripts/test.sh installs it)");
    }
    present
}

/// Kills a child process on drop.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debian_pgbouncer_exporter_reads_the_console() {
    if !tool("/usr/bin/prometheus-pgbouncer-exporter") {
        return;
    }
    let pg = PgCluster::start();
    let (s, _) = start(&pg);
    let load = traffic(s.port, 2).await;
    let port = free_port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut exporter = Command::new("/usr/bin/prometheus-pgbouncer-exporter");
    let child = libpq_env(&mut exporter, s.port, "127.0.0.1", Role::SCRAM.name, Role::SCRAM.password, "pgbouncer")
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--pgbouncer-host", "127.0.0.1", "--pgbouncer-port", &s.port.to_string()])
        .args(["--pgbouncer-user", Role::SCRAM.name])
        .env_remove("PORT")
        .env_remove("HOST")
        .stdin(Stdio::null())
        .stdout(log.reopen().unwrap())
        .stderr(log.reopen().unwrap())
        .spawn()
        .expect("start the exporter");
    let _exporter = Reaped(child);
    let exporter_log = || std::fs::read_to_string(log.path()).unwrap_or_default();
    let up = tokio::task::spawn_blocking(move || {
        wait_until(Duration::from_secs(30), || TcpStream::connect(("127.0.0.1", port)).is_ok())
    });
    assert!(up.await.unwrap(), "exporter did not listen:\n{}", exporter_log());
    let (ok, text) = poll_get(port, "/metrics", Duration::from_secs(20), |t| {
        sample(t, "pgbouncer_requests_total{database=\"app\"}").unwrap_or(0.0) > 10.0
    })
    .await;
    assert!(ok, "exporter output:\n{text}\nexporter log:\n{}\nsluice log:\n{}", exporter_log(), s.log());
    assert!(sample(&text, "pgbouncer_received_bytes_total{database=\"app\"}").unwrap() > 0.0, "{text}");
    assert!(sample(&text, "pgbouncer_active_clients{database=\"app\",user=\"u_scram\"}").unwrap() >= 2.0, "{text}");
    assert!(sample(&text, "pgbouncer_used_clients").unwrap() >= 2.0, "{text}");
    assert!(sample(&text, "pgbouncer_pool_size{database=\"app\"}").unwrap() > 0.0, "{text}");
    load.iter().for_each(|t| t.abort());
}

/// The text of the element with `id` in a DOM dump.
fn element(dom: &str, id: &str) -> Option<String> {
    let start = dom.find(&format!("id=\"{id}\""))?;
    let open = dom[start..].find('>')? + start + 1;
    let close = dom[open..].find('<')? + open;
    Some(dom[open..close].trim().to_string())
}

/// Headless Chromium on `url` with one extra flag (dump the DOM, take a screenshot),
/// after four seconds of virtual time (the page refreshes every second).
fn chromium(home: &std::path::Path, url: &str, extra: &str) -> std::process::Output {
    Command::new("/usr/bin/chromium")
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run"])
        .arg(format!("--user-data-dir={}", home.join("profile").display()))
        .args(["--window-size=1280,1000", "--virtual-time-budget=4000", extra, url])
        .env("HOME", home)
        .output()
        .expect("run chromium")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_view_renders_in_chromium() {
    if !tool("/usr/bin/chromium") {
        return;
    }
    let pg = PgCluster::start();
    let (s, http) = start(&pg);
    let load = traffic(s.port, 2).await;
    let ready = eventually(Duration::from_secs(15), || async {
        let (_, body) = get(http, "/api/stats").await;
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        v["totals"]["tps"].as_f64().unwrap_or(0.0) > 0.0
            && v["pools"][0]["series"]["t"].as_array().is_some_and(|t| t.len() >= 3)
    })
    .await;
    assert!(ready, "no rate in /api/stats");
    let dir = tempfile::tempdir().unwrap();
    let shot = dir.path().join("live.png");
    let url = format!("http://127.0.0.1:{http}/");
    let home = dir.path().to_path_buf();
    let (h, u) = (home.clone(), url.clone());
    let out = tokio::task::spawn_blocking(move || chromium(&h, &u, "--dump-dom")).await.unwrap();
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    let tps: f64 = element(&dom, "total-tps").and_then(|v| v.parse().ok()).unwrap_or(0.0);
    assert!(tps > 0.0, "total-tps not rendered:\n{dom}");
    assert_eq!(element(&dom, "total-clients").as_deref(), Some("2"), "{dom}");
    assert_eq!(element(&dom, "pool-0-clients").as_deref(), Some("2"), "{dom}");
    assert!(dom.contains("data-database=\"app\""), "{dom}");
    let p99 = element(&dom, "pool-0-p99").unwrap_or_default();
    assert!(p99.ends_with("µs") || p99.ends_with("ms") || p99.ends_with(" s"), "{p99}");
    assert_eq!(element(&dom, "error").as_deref(), Some(""), "the page reported an error");
    // a screenshot, kept when SLUICE_SCREENSHOT names a path (to look at it)
    let arg = format!("--screenshot={}", shot.display());
    let out = tokio::task::spawn_blocking(move || chromium(&home, &url, &arg)).await.unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let png = std::fs::read(&shot).expect("screenshot written");
    assert!(png.starts_with(b"\x89PNG") && png.len() > 10_000, "screenshot too small");
    if let Some(keep) = std::env::var_os("SLUICE_SCREENSHOT") {
        std::fs::write(keep, &png).unwrap();
    }
    load.iter().for_each(|t| t.abort());
}

/// A pool's `/api/stats` entry as the live view reads it, with `active` clients.
fn pool_json(database: &str, active: u64) -> serde_json::Value {
    let series = serde_json::json!({"t": [-1, 0], "clients": [0, 0], "waiting": [0, 0], "servers": [0, 0],
        "tps": [0, 0], "xact_p50_us": [0, 0], "xact_p99_us": [0, 0], "wait_p99_us": [0, 0]});
    serde_json::json!({"database": database, "user": "u", "mode": "transaction", "paused": false,
        "clients_active": active, "clients_idle": 0, "clients_waiting": 0, "servers_active": 0, "servers_idle": 0,
        "servers_login": 0, "pool_size": 20, "tps": 0, "qps": 0, "maxwait_us": 0,
        "latency_us": {"xact": {"p50": 0, "p99": 0}, "wait": {"p99": 0}}, "series": series})
}

/// The live view keeps each card with its pool as pools come and go: a pool that sorts
/// first appears after the page has drawn another (each card keeps its pool's name and
/// numbers), and a pool gone loses its card. The page (Sluice's own) is served here
/// with stats that change after its first refresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_view_keeps_each_card_with_its_pool() {
    if !tool("/usr/bin/chromium") {
        return;
    }
    let pg = PgCluster::start();
    let (_s, http) = start(&pg);
    let (_, page) = get(http, "/").await;
    let stats = |pools: Vec<serde_json::Value>| {
        serde_json::json!({"version": "test", "time_ms": 0, "pools": pools,
            "totals": {"clients": 0, "waiting": 0, "servers": 0, "tps": 0}})
        .to_string()
    };
    let rounds = [stats(vec![pool_json("b", 1), pool_json("c", 3)]), stats(vec![pool_json("a", 7), pool_json("b", 1)])];
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let served = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut calls = 0;
        loop {
            let (mut sock, _) = listener.accept().await.unwrap();
            let mut buf = vec![0u8; 4096];
            let n = sock.read(&mut buf).await.unwrap_or(0);
            let api = String::from_utf8_lossy(&buf[..n]).starts_with("GET /api/stats");
            let (kind, body) = match api {
                true => {
                    calls += 1;
                    ("application/json", rounds[usize::from(calls > 1)].clone())
                }
                false => ("text/html; charset=utf-8", page.clone()),
            };
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                body.len()
            );
            let _ = sock.write_all(&[head.into_bytes(), body.into_bytes()].concat()).await;
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let (home, url) = (dir.path().to_path_buf(), format!("http://127.0.0.1:{port}/"));
    let out = tokio::task::spawn_blocking(move || chromium(&home, &url, "--dump-dom")).await.unwrap();
    served.abort();
    let dom = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "chromium failed: {}", String::from_utf8_lossy(&out.stderr));
    let card = |database: &str| {
        let at = dom.find(&format!("data-database=\"{database}\""))?;
        let id_at = dom[..at].rfind("id=\"pool-")? + 4;
        Some(dom[id_at..].split('"').next()?.to_string())
    };
    let active = |database: &str| card(database).and_then(|id| element(&dom, &format!("{id}-active")));
    assert_eq!(active("a").as_deref(), Some("7"), "{dom}");
    assert_eq!(active("b").as_deref(), Some("1"), "{dom}");
    assert_eq!(card("c"), None, "a pool gone keeps its card: {dom}");
}

/// The endpoint serves at most 64 connections at once: one more is closed without an
/// answer, and requests are served again once the others have gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_endpoint_caps_its_connections() {
    let pg = PgCluster::start();
    let (_s, http) = start(&pg);
    assert_eq!(get(http, "/metrics").await.0, 200);
    let held: Vec<TcpStream> = (0..64).map(|_| TcpStream::connect(("127.0.0.1", http)).expect("connect")).collect();
    let answered = |r: std::io::Result<(u16, String)>| r.is_ok_and(|(status, _)| status == 200);
    let one_more = tokio::task::spawn_blocking(move || http_get(http, "/metrics")).await.unwrap();
    assert!(!answered(one_more), "a 65th connection was served");
    drop(held);
    let (served, body) = poll_get(http, "/metrics", Duration::from_secs(10), |b| b.contains("sluice_")).await;
    assert!(served, "not served again after the others closed: {body}");
}
