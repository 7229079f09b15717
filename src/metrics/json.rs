//! `/api/stats`: the live view's data as JSON: per pool the counts now, rates and
//! latency percentiles over the last minute, and per-second series from the ring.

use serde_json::{Value, json};

use super::{RING_LEN, Sample, percentiles, pool_views, recent_latency};
use crate::app::App;
use crate::pool::PoolKey;
use crate::stats::{HistogramSnapshot, now_us};

/// Seconds of samples the latency series' points look back over (smooths them).
const SMOOTH: usize = 5;

/// The document `/api/stats` serves; `seconds` bounds the series (1..=600).
pub fn stats(app: &App, seconds: usize) -> Value {
    let samples = app.monitor.samples();
    let keep = seconds.clamp(1, RING_LEN);
    let start = samples.len().saturating_sub(keep);
    let mut pools = Vec::new();
    let (mut clients, mut servers, mut waiting, mut tps) = (0, 0, 0.0f64, 0.0f64);
    for v in pool_views(app) {
        let key = &v.pool.key;
        let [xact, query, wait] = recent_latency(app, &v.pool, 60);
        let rate = rate(&samples, key, SMOOTH);
        clients += v.cl_active + v.cl_waiting;
        servers += v.sv_active + v.sv_idle + v.sv_login;
        waiting += v.cl_waiting as f64;
        tps += rate.0;
        pools.push(json!({
            "database": key.database,
            "user": key.user,
            "mode": v.pool.settings().mode.as_str(),
            "paused": v.pool.is_paused(),
            "clients_active": v.cl_linked,
            "clients_idle": v.cl_active - v.cl_linked,
            "clients_waiting": v.cl_waiting,
            "servers_active": v.sv_active,
            "servers_idle": v.sv_idle,
            "servers_login": v.sv_login,
            "pool_size": v.pool.settings().size,
            "maxwait_us": v.maxwait_us,
            "tps": round1(rate.0),
            "qps": round1(rate.1),
            "latency_us": {
                "xact": latency(&xact),
                "query": latency(&query),
                "wait": latency(&wait),
            },
            "series": series(&samples[start..], start, &samples, key),
        }));
    }
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "time_ms": now_us() / 1000,
        "client_connections": app.client_count(),
        "totals": { "clients": clients, "servers": servers, "waiting": waiting, "tps": round1(tps) },
        "pools": pools,
    })
}

fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}

fn latency(h: &HistogramSnapshot) -> Value {
    let [p50, p90, p99, p999] = percentiles(h);
    json!({ "count": h.count, "p50": p50, "p90": p90, "p99": p99, "p999": p999 })
}

/// Transactions and queries per second over the last `window` samples.
fn rate(samples: &[std::sync::Arc<Sample>], key: &PoolKey, window: usize) -> (f64, f64) {
    let n = samples.len();
    if n < 2 {
        return (0.0, 0.0);
    }
    let (a, b) = (&samples[n.saturating_sub(window + 1)], &samples[n - 1]);
    let (Some(pa), Some(pb)) = (a.pool(key), b.pool(key)) else { return (0.0, 0.0) };
    let secs = (b.time_us.saturating_sub(a.time_us) as f64 / 1e6).max(0.001);
    (
        pb.xact_count.saturating_sub(pa.xact_count) as f64 / secs,
        pb.query_count.saturating_sub(pa.query_count) as f64 / secs,
    )
}

/// Per-second series of one pool: seconds before now, clients, waiting clients, active
/// servers, transactions per second, and transaction/wait percentiles (µs).
fn series(window: &[std::sync::Arc<Sample>], offset: usize, all: &[std::sync::Arc<Sample>], key: &PoolKey) -> Value {
    let newest = all.last().map_or(0, |s| s.time_us);
    let (mut t, mut clients, mut waiting, mut servers, mut tps) = (vec![], vec![], vec![], vec![], vec![]);
    let (mut p50, mut p99, mut wait99) = (vec![], vec![], vec![]);
    for (i, s) in window.iter().enumerate() {
        let Some(p) = s.pool(key) else { continue };
        let prev = all[(offset + i).saturating_sub(1)].pool(key);
        let old = all[(offset + i).saturating_sub(SMOOTH)].pool(key);
        t.push(-((newest.saturating_sub(s.time_us) / 1_000_000) as i64));
        clients.push(p.cl_active + p.cl_waiting);
        waiting.push(p.cl_waiting);
        servers.push(p.sv_active + p.sv_idle);
        tps.push(prev.map_or(0, |q| p.xact_count.saturating_sub(q.xact_count)));
        let xact = old.map_or_else(|| p.xact.clone(), |o| p.xact.since(&o.xact));
        let wait = old.map_or_else(|| p.wait.clone(), |o| p.wait.since(&o.wait));
        p50.push(xact.quantile(0.5));
        p99.push(xact.quantile(0.99));
        wait99.push(wait.quantile(0.99));
    }
    json!({
        "t": t, "clients": clients, "waiting": waiting, "servers": servers, "tps": tps,
        "xact_p50_us": p50, "xact_p99_us": p99, "wait_p99_us": wait99,
    })
}
