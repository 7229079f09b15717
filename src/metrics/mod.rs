//! What the admin console, the Prometheus endpoint and the live view read: live counts
//! per pool (from the client and server registries), per-database totals, and the
//! stats task that keeps a per-second ring of samples (the live view's charts,
//! SHOW LATENCY) and the `stats_period` averages (SHOW STATS, `log_stats`).

pub mod http;
mod json;
pub mod prom;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tracing::info;

use crate::app::{App, Phase};
use crate::config::Config;
use crate::pool::{Pool, PoolKey};
use crate::stats::{ClientInfo, ClientState, HistogramSnapshot, PoolStats, ServerState, now_us};

/// Per-second samples kept for the live view (ten minutes).
pub const RING_LEN: usize = 600;

/// Live counts of one pool.
#[derive(Debug, Clone)]
pub struct PoolView {
    pub pool: Arc<Pool>,
    /// Logged-in clients of the pool that are not waiting (linked or idle).
    pub cl_active: u64,
    /// Of those, the clients linked to a server now.
    pub cl_linked: u64,
    pub cl_waiting: u64,
    pub sv_active: u64,
    pub sv_idle: u64,
    pub sv_login: u64,
    /// How long the oldest waiting client has waited.
    pub maxwait_us: u64,
    /// Named prepared statements held by the pool's clients.
    pub client_statements: u64,
    /// Prepared statements held by the pool's server connections.
    pub server_statements: u64,
}

/// The pool key of a logged-in client, borrowed: its database and the server user (the
/// database's forced user, or the client's own).
fn pool_key_of<'a>(cfg: &'a Config, c: &'a ClientInfo) -> (&'a str, &'a str) {
    let forced = cfg.database(&c.database).and_then(|d| d.user.as_deref());
    (&c.database, forced.unwrap_or(&c.user))
}

/// Live counts of every pool, sorted by key. Allocates per pool, not per client (it
/// runs every second, and at each SHOW and scrape, with up to `max_client_conn`
/// clients).
pub fn pool_views(app: &App) -> Vec<PoolView> {
    let cfg = app.config.load();
    let now = now_us();
    // Sorted by key (`Pools::all`).
    let pools = app.pools.all();
    let mut views: Vec<PoolView> = pools.iter().map(pool_view).collect();
    let index: HashMap<(&str, &str), usize> =
        pools.iter().enumerate().map(|(i, p)| ((p.key.database.as_str(), p.key.user.as_str()), i)).collect();
    for c in app.client_infos.list().iter().filter(|c| !c.console) {
        let Some(&i) = index.get(&pool_key_of(&cfg, c)) else { continue };
        let v = &mut views[i];
        v.client_statements += c.prepared_statements.load(Relaxed);
        match c.state() {
            ClientState::Waiting => {
                v.cl_waiting += 1;
                v.maxwait_us = v.maxwait_us.max(now.saturating_sub(c.request_time_us.load(Relaxed)));
            }
            ClientState::Active => {
                v.cl_active += 1;
                v.cl_linked += 1;
            }
            ClientState::Idle => v.cl_active += 1,
            ClientState::Login => {}
        }
    }
    views
}

/// A pool's server counts, its clients' counts still zero.
fn pool_view(pool: &Arc<Pool>) -> PoolView {
    let counts = pool.counts();
    let servers = pool.servers.list();
    PoolView {
        sv_active: servers.iter().filter(|s| s.state() == ServerState::Active).count() as u64,
        sv_idle: counts.idle as u64,
        sv_login: counts.connecting as u64,
        server_statements: servers.iter().map(|s| s.prepared_statements.load(Relaxed)).sum(),
        pool: pool.clone(),
        cl_active: 0,
        cl_linked: 0,
        cl_waiting: 0,
        maxwait_us: 0,
        client_statements: 0,
    }
}

/// Counters of SHOW STATS: totals since start, or per-second averages (counts and
/// bytes) and per-event averages (times, in µs) over a period.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Totals {
    pub server_assignment_count: u64,
    pub xact_count: u64,
    pub query_count: u64,
    pub received: u64,
    pub sent: u64,
    pub xact_time: u64,
    pub query_time: u64,
    pub wait_time: u64,
    pub client_parse_count: u64,
    pub server_parse_count: u64,
    pub bind_count: u64,
}

impl Totals {
    pub fn add(&mut self, s: &PoolStats) {
        self.server_assignment_count += s.server_assignment_count.load(Relaxed);
        self.xact_count += s.xact_count.load(Relaxed);
        self.query_count += s.query_count.load(Relaxed);
        self.received += s.received.load(Relaxed);
        self.sent += s.sent.load(Relaxed);
        self.xact_time += s.xact_time_us.load(Relaxed);
        self.query_time += s.query_time_us.load(Relaxed);
        self.wait_time += s.wait_time_us.load(Relaxed);
        self.client_parse_count += s.client_parse_count.load(Relaxed);
        self.server_parse_count += s.server_parse_count.load(Relaxed);
        self.bind_count += s.bind_count.load(Relaxed);
    }

    pub fn sum(&mut self, o: &Totals) {
        let Totals {
            server_assignment_count,
            xact_count,
            query_count,
            received,
            sent,
            xact_time,
            query_time,
            wait_time,
            client_parse_count,
            server_parse_count,
            bind_count,
        } = o;
        self.server_assignment_count += server_assignment_count;
        self.xact_count += xact_count;
        self.query_count += query_count;
        self.received += received;
        self.sent += sent;
        self.xact_time += xact_time;
        self.query_time += query_time;
        self.wait_time += wait_time;
        self.client_parse_count += client_parse_count;
        self.server_parse_count += server_parse_count;
        self.bind_count += bind_count;
    }

    /// Averages between an earlier snapshot and this one, `secs` apart.
    pub fn averages(&self, earlier: &Totals, secs: f64) -> Totals {
        let d = |a: u64, b: u64| a.saturating_sub(b);
        let rate = |a: u64, b: u64| (d(a, b) as f64 / secs.max(0.001)).round() as u64;
        let per = |t: u64, tb: u64, n: u64, nb: u64| d(t, tb).checked_div(d(n, nb)).unwrap_or(0);
        let (a, b) = (self, earlier);
        Totals {
            server_assignment_count: rate(a.server_assignment_count, b.server_assignment_count),
            xact_count: rate(a.xact_count, b.xact_count),
            query_count: rate(a.query_count, b.query_count),
            received: rate(a.received, b.received),
            sent: rate(a.sent, b.sent),
            xact_time: per(a.xact_time, b.xact_time, a.xact_count, b.xact_count),
            query_time: per(a.query_time, b.query_time, a.query_count, b.query_count),
            wait_time: per(a.wait_time, b.wait_time, a.server_assignment_count, b.server_assignment_count),
            client_parse_count: rate(a.client_parse_count, b.client_parse_count),
            server_parse_count: rate(a.server_parse_count, b.server_parse_count),
            bind_count: rate(a.bind_count, b.bind_count),
        }
    }
}

/// Totals since start per configured database (SHOW STATS rows), sorted by name;
/// databases without a pool yet have zeros (not the fallback entry `*`, which never
/// has one: the databases it serves have rows of their own).
pub fn db_totals(app: &App) -> BTreeMap<String, Totals> {
    let cfg = app.config.load();
    let listed = cfg.databases.keys().filter(|d| *d != crate::config::FALLBACK_DATABASE);
    let mut out: BTreeMap<String, Totals> = listed.map(|d| (d.clone(), Totals::default())).collect();
    for pool in app.pools.all() {
        out.entry(pool.key.database.clone()).or_default().add(&pool.stats);
    }
    // Pools dropped while their database kept others: its totals never go back.
    app.pools.retired_stats(|db, stats| out.entry(db.to_string()).or_default().add(stats));
    out
}

/// One pool at one second.
#[derive(Debug, Clone)]
pub struct PoolSample {
    pub key: PoolKey,
    pub cl_active: u64,
    pub cl_waiting: u64,
    pub sv_active: u64,
    pub sv_idle: u64,
    pub maxwait_us: u64,
    pub xact_count: u64,
    pub query_count: u64,
    pub xact: HistogramSnapshot,
    pub query: HistogramSnapshot,
    pub wait: HistogramSnapshot,
}

/// Every pool at one second.
#[derive(Debug, Clone)]
pub struct Sample {
    pub time_us: u64,
    /// Sorted by key (as `pool_views` gives them).
    pub pools: Vec<PoolSample>,
}

impl Sample {
    /// A pool's sample: a binary search, as `/api/stats` looks up every pool in each of
    /// up to 600 samples (a linear one made that quadratic in the number of pools).
    pub fn pool(&self, key: &PoolKey) -> Option<&PoolSample> {
        self.pools.binary_search_by(|p| p.key.cmp(key)).ok().map(|i| &self.pools[i])
    }
}

#[derive(Debug, Default)]
struct Period {
    /// The snapshot the current averages end with, and when it was taken.
    last: Option<(Instant, BTreeMap<String, Totals>)>,
    averages: BTreeMap<String, Totals>,
    /// The averages of all databases together (SHOW TOTALS): from the summed totals,
    /// so a mean time is weighted by each database's count, as in PgBouncer.
    overall: Totals,
}

/// The stats task's results.
#[derive(Debug, Default)]
pub struct Monitor {
    ring: Mutex<VecDeque<Arc<Sample>>>,
    period: Mutex<Period>,
}

impl Monitor {
    /// Per-database averages over the last complete `stats_period`.
    pub fn averages(&self) -> BTreeMap<String, Totals> {
        self.period.lock().averages.clone()
    }

    /// The averages of all databases together (`Period::overall`).
    pub fn overall_averages(&self) -> Totals {
        self.period.lock().overall
    }

    /// The per-second samples, oldest first.
    pub fn samples(&self) -> Vec<Arc<Sample>> {
        self.ring.lock().iter().cloned().collect()
    }

    /// The sample about `secs` seconds before the newest one (or the oldest kept).
    pub fn sample_ago(&self, secs: usize) -> Option<Arc<Sample>> {
        let ring = self.ring.lock();
        let i = ring.len().saturating_sub(1 + secs);
        ring.get(i).cloned()
    }

    fn push(&self, s: Sample) {
        let mut ring = self.ring.lock();
        if ring.len() == RING_LEN {
            ring.pop_front();
        }
        ring.push_back(Arc::new(s));
    }

    /// Ends a statistics period: new averages; returns them.
    fn close_period(&self, now: Instant, totals: BTreeMap<String, Totals>) -> BTreeMap<String, Totals> {
        let mut p = self.period.lock();
        if let Some((at, last)) = &p.last {
            let secs = now.duration_since(*at).as_secs_f64();
            let empty = Totals::default();
            let averages =
                totals.iter().map(|(db, t)| (db.clone(), t.averages(last.get(db).unwrap_or(&empty), secs))).collect();
            // Over the databases there now (one gone since would make the differences
            // of the sums wrong), each against its own earlier totals.
            let (mut now_sum, mut then_sum) = (Totals::default(), Totals::default());
            for (db, t) in &totals {
                now_sum.sum(t);
                then_sum.sum(last.get(db).unwrap_or(&empty));
            }
            let overall = now_sum.averages(&then_sum, secs);
            (p.averages, p.overall) = (averages, overall);
        }
        p.last = Some((now, totals));
        p.averages.clone()
    }
}

/// Takes the sample of this second.
pub fn sample(app: &App) -> Sample {
    let pools = pool_views(app)
        .into_iter()
        .map(|v| {
            let s = &v.pool.stats;
            PoolSample {
                key: v.pool.key.clone(),
                cl_active: v.cl_active,
                cl_waiting: v.cl_waiting,
                sv_active: v.sv_active,
                sv_idle: v.sv_idle,
                maxwait_us: v.maxwait_us,
                xact_count: s.xact_count.load(Relaxed),
                query_count: s.query_count.load(Relaxed),
                xact: s.xact_hist.snapshot(),
                query: s.query_hist.snapshot(),
                wait: s.wait_hist.snapshot(),
            }
        })
        .collect();
    Sample { time_us: now_us(), pools }
}

/// The stats task: a sample every second, averages (and `log_stats` lines) every
/// `stats_period`. Started by `app::run`; ends when Sluice stops.
pub async fn stats_task(app: Arc<App>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut phase = app.phase();
    let mut period_start = Instant::now();
    app.monitor.close_period(period_start, db_totals(&app));
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = phase.wait_for(|p| *p == Phase::Stopping) => return,
        }
        app.monitor.push(sample(&app));
        let g = &app.config.load().general;
        let now = Instant::now();
        if now.duration_since(period_start).as_secs_f64() + 0.5 < g.stats_period {
            continue;
        }
        period_start = now;
        let averages = app.monitor.close_period(now, db_totals(&app));
        if g.log_stats {
            // All databases together, in PgBouncer's words; each database's at debug.
            let a = app.monitor.overall_averages();
            info!(
                "stats: {} xacts/s, {} queries/s, {} client parses/s, {} server parses/s, {} binds/s, \
                 in {} B/s, out {} B/s, xact {} us, query {} us, wait {} us",
                a.xact_count,
                a.query_count,
                a.client_parse_count,
                a.server_parse_count,
                a.bind_count,
                a.received,
                a.sent,
                a.xact_time,
                a.query_time,
                a.wait_time
            );
            for (db, a) in &averages {
                tracing::debug!(
                    database = %db,
                    "stats: {} xacts/s, {} queries/s, in {} B/s, out {} B/s, xact {} us, query {} us, wait {} us",
                    a.xact_count, a.query_count, a.received, a.sent, a.xact_time, a.query_time, a.wait_time
                );
            }
        }
    }
}

/// p50/p90/p99/p99.9 in µs.
pub fn percentiles(h: &HistogramSnapshot) -> [u64; 4] {
    [h.quantile(0.5), h.quantile(0.9), h.quantile(0.99), h.quantile(0.999)]
}

/// Latency of one pool over the last `window` seconds of samples (or since start when
/// fewer are kept): (transaction, query, wait) histograms.
pub fn recent_latency(app: &App, pool: &Pool, window: usize) -> [HistogramSnapshot; 3] {
    let s = &pool.stats;
    let now = [s.xact_hist.snapshot(), s.query_hist.snapshot(), s.wait_hist.snapshot()];
    let Some(old) = app.monitor.sample_ago(window) else { return now };
    let Some(old) = old.pool(&pool.key) else { return now };
    [now[0].since(&old.xact), now[1].since(&old.query), now[2].since(&old.wait)]
}

/// Errors by SQLSTATE class, sorted.
pub fn errors_of(stats: &PoolStats) -> Vec<(String, u64)> {
    let map: HashMap<String, u64> = stats.errors.lock().clone();
    let mut v: Vec<_> = map.into_iter().collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SHOW TOTALS' averages: rates added up, mean times weighted by each database's
    /// count (not a sum of the databases' means).
    #[test]
    fn overall_averages_weigh_each_database_by_its_count() {
        let monitor = Monitor::default();
        let start = Instant::now();
        let at = |slow: (u64, u64), fast: (u64, u64)| {
            let t = |(n, time): (u64, u64)| Totals { xact_count: n, xact_time: time, ..Default::default() };
            BTreeMap::from([("a".to_string(), t(slow)), ("b".to_string(), t(fast))])
        };
        monitor.close_period(start, at((0, 0), (0, 0)));
        monitor.close_period(start + Duration::from_secs(1), at((1, 1000), (10_000, 100_000)));
        let overall = monitor.overall_averages();
        assert_eq!((overall.xact_count, overall.xact_time), (10_001, 10));
        assert_eq!(monitor.averages()["a"].xact_time, 1000);
        // A database gone since the last period counts in neither sum.
        let only_b = BTreeMap::from([(
            "b".to_string(),
            Totals { xact_count: 10_010, xact_time: 100_100, ..Default::default() },
        )]);
        monitor.close_period(start + Duration::from_secs(2), only_b);
        let overall = monitor.overall_averages();
        assert_eq!((overall.xact_count, overall.xact_time), (10, 10));
    }

    #[test]
    fn averages_are_rates_and_per_event_times() {
        let a = Totals { xact_count: 10, xact_time: 1000, received: 500, ..Default::default() };
        let b = Totals { xact_count: 30, xact_time: 5000, received: 2500, ..Default::default() };
        let avg = b.averages(&a, 2.0);
        assert_eq!(avg.xact_count, 10);
        assert_eq!(avg.received, 1000);
        assert_eq!(avg.xact_time, 200);
        assert_eq!(avg.query_time, 0);
        let mut s = Totals::default();
        s.sum(&a);
        s.sum(&b);
        assert_eq!(s.xact_count, 40);
    }

    #[test]
    fn a_sample_finds_each_of_its_pools() {
        let key = |d: &str, u: &str| PoolKey { database: d.into(), user: u.into() };
        let keys = [key("a", "x"), key("a", "y"), key("b", "x"), key("c", "a")];
        let pool = |k: &PoolKey, n: u64| PoolSample {
            key: k.clone(),
            cl_active: n,
            cl_waiting: 0,
            sv_active: 0,
            sv_idle: 0,
            maxwait_us: 0,
            xact_count: 0,
            query_count: 0,
            xact: Default::default(),
            query: Default::default(),
            wait: Default::default(),
        };
        let s = Sample { time_us: 0, pools: keys.iter().zip(0..).map(|(k, n)| pool(k, n)).collect() };
        for (k, n) in keys.iter().zip(0..) {
            assert_eq!(s.pool(k).map(|p| p.cl_active), Some(n), "{k:?}");
        }
        assert!(s.pool(&key("b", "y")).is_none());
    }

    #[test]
    fn ring_keeps_ten_minutes() {
        let m = Monitor::default();
        for i in 0..(RING_LEN + 5) {
            m.push(Sample { time_us: i as u64, pools: Vec::new() });
        }
        let s = m.samples();
        assert_eq!(s.len(), RING_LEN);
        assert_eq!(s[0].time_us, 5);
        assert_eq!(m.sample_ago(0).unwrap().time_us, (RING_LEN + 4) as u64);
        assert_eq!(m.sample_ago(10_000).unwrap().time_us, 5);
    }
}
