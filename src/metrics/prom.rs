//! The Prometheus text exposition format (version 0.0.4) of Sluice's metrics: every
//! family with HELP and TYPE, labels escaped, histograms as cumulative `le` buckets in
//! seconds. Each metric is described in docs/admin.md.

use std::fmt::Write;
use std::sync::atomic::Ordering::Relaxed;

use super::{PoolView, errors_of, pool_views};
use crate::app::App;
use crate::stats::{BUCKETS_US, HistogramSnapshot};

/// The content type of [`render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Escapes a label value (backslash, double quote, newline).
pub fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Microseconds as a decimal number of seconds without float noise ("0.00005").
pub fn seconds(us: u64) -> String {
    let (whole, frac) = (us / 1_000_000, us % 1_000_000);
    if frac == 0 {
        return whole.to_string();
    }
    let f = format!("{frac:06}");
    format!("{whole}.{}", f.trim_end_matches('0'))
}

struct Out {
    text: String,
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn line(&mut self, name: &str, labels: &str, value: impl std::fmt::Display) {
        if labels.is_empty() {
            let _ = writeln!(self.text, "{name} {value}");
        } else {
            let _ = writeln!(self.text, "{name}{{{labels}}} {value}");
        }
    }

    fn histogram(&mut self, name: &str, labels: &str, h: &HistogramSnapshot) {
        let mut cumulative = 0;
        for (i, n) in h.buckets.iter().enumerate() {
            cumulative += n;
            let le = BUCKETS_US.get(i).map_or("+Inf".to_string(), |&b| seconds(b));
            self.line(&format!("{name}_bucket"), &format!("{labels},le=\"{le}\""), cumulative);
        }
        self.line(&format!("{name}_sum"), labels, seconds(h.sum_us));
        self.line(&format!("{name}_count"), labels, h.count);
    }
}

fn labels(v: &PoolView) -> String {
    format!("database=\"{}\",user=\"{}\"", escape(&v.pool.key.database), escape(&v.pool.key.user))
}

/// A gauge or counter family with one value per pool.
fn per_pool(out: &mut Out, views: &[PoolView], name: &str, kind: &str, help: &str, f: impl Fn(&PoolView) -> u64) {
    out.family(name, kind, help);
    for v in views {
        out.line(name, &labels(v), f(v));
    }
}

/// Renders every metric.
pub fn render(app: &App) -> String {
    let views = pool_views(app);
    let mut out = Out { text: String::with_capacity(4096 + views.len() * 8192) };
    process(&mut out, app);
    states(&mut out, &views);
    counters(&mut out, &views);
    histograms(&mut out, &views);
    out.text
}

fn process(out: &mut Out, app: &App) {
    out.family("sluice_info", "gauge", "Sluice's version (always 1).");
    out.line("sluice_info", &format!("version=\"{}\"", env!("CARGO_PKG_VERSION")), 1);
    out.family("sluice_client_connections", "gauge", "Client connections open now, logging in included.");
    out.line("sluice_client_connections", "", app.client_count());
    let cfg = app.config.load();
    out.family("sluice_max_client_connections", "gauge", "The max_client_conn limit.");
    out.line("sluice_max_client_connections", "", cfg.general.max_client_conn);
    out.family(
        "sluice_peer_cancel_requests",
        "gauge",
        "Cancel requests for a [peers] entry by state (active: being forwarded; waiting: for one of its slots).",
    );
    for (id, _) in cfg.other_peers() {
        let (waiting, active) = app.peer_pools.counts(*id);
        out.line("sluice_peer_cancel_requests", &format!("peer_id=\"{id}\",state=\"active\""), active);
        out.line("sluice_peer_cancel_requests", &format!("peer_id=\"{id}\",state=\"waiting\""), waiting);
    }
}

fn states(out: &mut Out, views: &[PoolView]) {
    out.family(
        "sluice_pool_clients",
        "gauge",
        "Logged-in clients of the pool by state (active: linked to a server; idle; waiting: queued for a server).",
    );
    for v in views {
        let l = labels(v);
        out.line("sluice_pool_clients", &format!("{l},state=\"active\""), v.cl_linked);
        out.line("sluice_pool_clients", &format!("{l},state=\"idle\""), v.cl_active - v.cl_linked);
        out.line("sluice_pool_clients", &format!("{l},state=\"waiting\""), v.cl_waiting);
    }
    out.family(
        "sluice_pool_servers",
        "gauge",
        "Server connections of the pool by state (active: lent to a client; idle; login: being opened).",
    );
    for v in views {
        let l = labels(v);
        out.line("sluice_pool_servers", &format!("{l},state=\"active\""), v.sv_active);
        out.line("sluice_pool_servers", &format!("{l},state=\"idle\""), v.sv_idle);
        out.line("sluice_pool_servers", &format!("{l},state=\"login\""), v.sv_login);
    }
    per_pool(
        out,
        views,
        "sluice_pool_wait_queue",
        "gauge",
        "Checkouts queued for a server connection of the pool.",
        |v| v.pool.counts().waiting as u64,
    );
    out.family("sluice_pool_max_wait_seconds", "gauge", "How long the pool's oldest waiting client has waited.");
    for v in views {
        out.line("sluice_pool_max_wait_seconds", &labels(v), seconds(v.maxwait_us));
    }
    per_pool(out, views, "sluice_pool_size", "gauge", "Configured pool size.", |v| v.pool.settings().size as u64);
    per_pool(out, views, "sluice_pool_paused", "gauge", "1 while the pool is paused (admin PAUSE).", |v| {
        v.pool.is_paused() as u64
    });
    per_pool(
        out,
        views,
        "sluice_prepared_statements_client",
        "gauge",
        "Named prepared statements the pool's clients hold.",
        |v| v.client_statements,
    );
    per_pool(
        out,
        views,
        "sluice_prepared_statements_server",
        "gauge",
        "Prepared statements the pool's server connections hold.",
        |v| v.server_statements,
    );
}

fn counters(out: &mut Out, views: &[PoolView]) {
    type Field = fn(&crate::stats::PoolStats) -> &std::sync::atomic::AtomicU64;
    let list: [(&str, &str, Field); 12] = [
        ("sluice_transactions_total", "Transactions completed.", |s| &s.xact_count),
        ("sluice_queries_total", "Queries (requests answered by ReadyForQuery) completed.", |s| &s.query_count),
        ("sluice_received_bytes_total", "Bytes received from clients.", |s| &s.received),
        ("sluice_sent_bytes_total", "Bytes sent to clients.", |s| &s.sent),
        ("sluice_server_assignments_total", "Times a server connection was lent to a client.", |s| {
            &s.server_assignment_count
        }),
        ("sluice_server_connects_total", "Server connections opened.", |s| &s.server_connects),
        ("sluice_server_connect_failures_total", "Server connections that failed to open.", |s| {
            &s.server_connect_failures
        }),
        (
            "sluice_prepared_cache_hits_total",
            "Client Parse messages answered from a server's prepared statement cache.",
            |s| &s.prepared_hits,
        ),
        ("sluice_prepared_cache_misses_total", "Statements Sluice had to prepare on a server.", |s| &s.prepared_misses),
        ("sluice_client_parses_total", "Parse messages from clients.", |s| &s.client_parse_count),
        ("sluice_server_parses_total", "Parse messages sent to servers.", |s| &s.server_parse_count),
        ("sluice_binds_total", "Bind messages from clients.", |s| &s.bind_count),
    ];
    for (name, help, field) in list {
        per_pool(out, views, name, "counter", help, |v| field(&v.pool.stats).load(Relaxed));
    }
    out.family(
        "sluice_errors_total",
        "counter",
        "ErrorResponses from servers by SQLSTATE class (first two characters; other: a class PostgreSQL does not define).",
    );
    for v in views {
        for (class, n) in errors_of(&v.pool.stats) {
            out.line("sluice_errors_total", &format!("{},class=\"{}\"", labels(v), escape(&class)), n);
        }
    }
}

fn histograms(out: &mut Out, views: &[PoolView]) {
    type Hist = fn(&crate::stats::PoolStats) -> &crate::stats::Histogram;
    let list: [(&str, &str, Hist); 4] = [
        ("sluice_transaction_duration_seconds", "Transaction durations (first request to ReadyForQuery idle).", |s| {
            &s.xact_hist
        }),
        ("sluice_query_duration_seconds", "Query durations (request to its last ReadyForQuery).", |s| &s.query_hist),
        ("sluice_wait_duration_seconds", "Time clients waited for a server connection (checkout).", |s| &s.wait_hist),
        ("sluice_server_connect_duration_seconds", "Time to open and authenticate a server connection.", |s| {
            &s.connect_hist
        }),
    ];
    for (name, help, hist) in list {
        out.family(name, "histogram", help);
        for v in views {
            out.histogram(name, &labels(v), &hist(&v.pool.stats).snapshot());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_are_exact_decimals() {
        assert_eq!(seconds(50), "0.00005");
        assert_eq!(seconds(1_000_000), "1");
        assert_eq!(seconds(2_500_000), "2.5");
        assert_eq!(seconds(0), "0");
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = crate::stats::Histogram::default();
        h.observe(std::time::Duration::from_micros(40));
        h.observe(std::time::Duration::from_micros(150));
        h.observe(std::time::Duration::from_secs(60));
        let mut out = Out { text: String::new() };
        out.histogram("x", "a=\"b\"", &h.snapshot());
        assert!(out.text.contains("x_bucket{a=\"b\",le=\"0.00005\"} 1\n"), "{}", out.text);
        assert!(out.text.contains("x_bucket{a=\"b\",le=\"0.0002\"} 2\n"), "{}", out.text);
        assert!(out.text.contains("x_bucket{a=\"b\",le=\"10\"} 2\n"), "{}", out.text);
        assert!(out.text.contains("x_bucket{a=\"b\",le=\"+Inf\"} 3\n"), "{}", out.text);
        assert!(out.text.contains("x_count{a=\"b\"} 3\n"), "{}", out.text);
        assert_eq!(escape("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
    }
}
