//! The SHOW commands: PgBouncer 1.25's column names and order (text for names, int8
//! for numbers), filled from the pools, the registries and the stats task; columns
//! Sluice has no value for carry 0 or an empty string. Sluice's own views: MEM,
//! PREPARED_STATEMENTS, LATENCY. Every column is described in docs/admin.md.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use super::table::{Table, int, text};
use crate::app::App;
use crate::config::Config;
use crate::metrics::{self, Totals, pool_views};
use crate::stats::{ClientInfo, ClientState, ServerState, now_us};

/// What SHOW can list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    Pools,
    Stats,
    StatsTotals,
    StatsAverages,
    Totals,
    Clients,
    Servers,
    Databases,
    Users,
    Config,
    Lists,
    State,
    Version,
    Help,
    Mem,
    PreparedStatements,
    Latency,
    DnsHosts,
    DnsZones,
    Peers,
    PeerPools,
}

impl Show {
    pub const ALL: [(&'static str, Show); 21] = [
        ("POOLS", Show::Pools),
        ("STATS", Show::Stats),
        ("STATS_TOTALS", Show::StatsTotals),
        ("STATS_AVERAGES", Show::StatsAverages),
        ("TOTALS", Show::Totals),
        ("CLIENTS", Show::Clients),
        ("SERVERS", Show::Servers),
        ("DATABASES", Show::Databases),
        ("USERS", Show::Users),
        ("CONFIG", Show::Config),
        ("LISTS", Show::Lists),
        ("STATE", Show::State),
        ("VERSION", Show::Version),
        ("HELP", Show::Help),
        ("MEM", Show::Mem),
        ("PREPARED_STATEMENTS", Show::PreparedStatements),
        ("LATENCY", Show::Latency),
        ("DNS_HOSTS", Show::DnsHosts),
        ("DNS_ZONES", Show::DnsZones),
        ("PEERS", Show::Peers),
        ("PEER_POOLS", Show::PeerPools),
    ];

    pub fn parse(word: &str) -> Option<Show> {
        Self::ALL.iter().find(|(n, _)| n.eq_ignore_ascii_case(word)).map(|(_, s)| *s)
    }
}

/// Runs a SHOW (HELP has no table: see `commands`).
pub fn table(app: &App, what: Show) -> Table {
    let cfg = app.config.load_full();
    match what {
        Show::Pools => pools(app),
        Show::Stats => stats(app, &cfg),
        Show::StatsTotals => stats_part(app, false),
        Show::StatsAverages => stats_part(app, true),
        Show::Totals => totals(app),
        Show::Clients => clients(app),
        Show::Servers => servers(app),
        Show::Databases => databases(app, &cfg),
        Show::Users => users(app, &cfg),
        Show::Config => super::config::show(&cfg),
        Show::Lists => lists(app, &cfg),
        Show::State => state(app),
        Show::Version => {
            let mut t = Table::new(&["version"], "s");
            t.push(vec![text(format!("Sluice {}", env!("CARGO_PKG_VERSION")))]);
            t
        }
        Show::Help => Table::new(&[], ""),
        Show::Mem => mem(app),
        Show::PreparedStatements => prepared(app),
        Show::Latency => latency(app, &cfg),
        Show::DnsHosts => dns_hosts(app, &cfg),
        // Zones are c-ares' (`dns_zone_check_period`): Sluice has none.
        Show::DnsZones => Table::new(&["zonename", "serial", "count"], "sii"),
        Show::Peers => peers(&cfg),
        Show::PeerPools => peer_pools(app, &cfg),
    }
}

/// SHOW PEERS: each peer's id, where its cancel requests go, and how many may be
/// forwarded to it at once.
fn peers(cfg: &Config) -> Table {
    let mut t = Table::new(&["peer_id", "host", "port", "pool_size"], "isii");
    for (id, p) in cfg.other_peers() {
        t.push(vec![int(*id), text(&p.host), int(p.port), int(p.slots(&cfg.general))]);
    }
    t
}

/// SHOW PEER_POOLS: each peer's cancel requests being forwarded and waiting for a
/// slot; every forward has a connection of its own (`sv_active_cancel`), opened as
/// part of it (`sv_login` is 0).
fn peer_pools(app: &App, cfg: &Config) -> Table {
    let names = ["peer_id", "cl_active_cancel_req", "cl_waiting_cancel_req", "sv_active_cancel", "sv_login"];
    let mut t = Table::new(&names, "iiiii");
    for (id, _) in cfg.other_peers() {
        let (waiting, active) = app.peer_pools.counts(*id);
        t.push(vec![int(*id), int(active), int(waiting), int(active), int(0)]);
    }
    t
}

/// SHOW DNS_HOSTS: each server host name some pool has, the seconds its last answer is
/// still used for (`dns_max_ttl`; 0: looked up again at the next connect), and the
/// addresses it gave (empty before the first answer).
fn dns_hosts(app: &App, cfg: &Config) -> Table {
    let ttl = std::time::Duration::from_secs_f64(cfg.general.dns_max_ttl);
    let mut t = Table::new(&["hostname", "ttl", "addrs"], "sis");
    for (name, last) in app.pools.host_answers() {
        let (left, addrs) = match last {
            Some((addrs, age)) => {
                let list: Vec<String> = addrs.iter().map(|a| a.to_string()).collect();
                (ttl.saturating_sub(age).as_secs(), list.join(","))
            }
            None => (0, String::new()),
        };
        t.push(vec![text(&*name), int(left), text(addrs)]);
    }
    t
}

const POOLS: [&str; 17] = [
    "database",
    "user",
    "cl_active",
    "cl_waiting",
    "cl_active_cancel_req",
    "cl_waiting_cancel_req",
    "sv_active",
    "sv_active_cancel",
    "sv_being_canceled",
    "sv_idle",
    "sv_used",
    "sv_tested",
    "sv_login",
    "maxwait",
    "maxwait_us",
    "pool_mode",
    "load_balance_hosts",
];

fn pools(app: &App) -> Table {
    let mut t = Table::new(&POOLS, "ssiiiiiiiiiiiiiss");
    for v in pool_views(app) {
        let k = &v.pool.key;
        t.push(vec![
            text(&k.database),
            text(&k.user),
            int(v.cl_active),
            int(v.cl_waiting),
            int(0),
            int(0),
            int(v.sv_active),
            int(0),
            int(0),
            int(v.sv_idle),
            int(0),
            int(0),
            int(v.sv_login),
            int(v.maxwait_us / 1_000_000),
            int(v.maxwait_us % 1_000_000),
            text(v.pool.settings().mode.as_str()),
            text("disable"),
        ]);
    }
    t
}

/// The SHOW STATS counters in order: (total column, average column, STATS_TOTALS /
/// STATS_AVERAGES column, value).
/// A statistic's names: SHOW STATS' total and average columns, SHOW STATS_TOTALS' and
/// STATS_AVERAGES' column, and SHOW TOTALS' row (`total_`/`avg_` and PgBouncer's field
/// name there, which differs for bytes and parses); and its value.
struct StatColumn {
    total: &'static str,
    avg: &'static str,
    plain: &'static str,
    field: &'static str,
    value: u64,
}

fn stat_columns(x: &Totals) -> [StatColumn; 11] {
    let c = |total, avg, plain, field, value| StatColumn { total, avg, plain, field, value };
    [
        c(
            "total_server_assignment_count",
            "avg_server_assignment_count",
            "server_assignment_count",
            "server_assignment_count",
            x.server_assignment_count,
        ),
        c("total_xact_count", "avg_xact_count", "xact_count", "xact_count", x.xact_count),
        c("total_query_count", "avg_query_count", "query_count", "query_count", x.query_count),
        c("total_received", "avg_recv", "bytes_received", "client_bytes", x.received),
        c("total_sent", "avg_sent", "bytes_sent", "server_bytes", x.sent),
        c("total_xact_time", "avg_xact_time", "xact_time", "xact_time", x.xact_time),
        c("total_query_time", "avg_query_time", "query_time", "query_time", x.query_time),
        c("total_wait_time", "avg_wait_time", "wait_time", "wait_time", x.wait_time),
        c(
            "total_client_parse_count",
            "avg_client_parse_count",
            "client_parse_count",
            "ps_client_parse_count",
            x.client_parse_count,
        ),
        c(
            "total_server_parse_count",
            "avg_server_parse_count",
            "server_parse_count",
            "ps_server_parse_count",
            x.server_parse_count,
        ),
        c("total_bind_count", "avg_bind_count", "bind_count", "ps_bind_count", x.bind_count),
    ]
}

fn stats(app: &App, cfg: &Config) -> Table {
    let zero = stat_columns(&Totals::default());
    let mut names = vec!["database"];
    names.extend(zero.iter().map(|c| c.total));
    names.extend(zero.iter().map(|c| c.avg));
    if cfg.general.admin_legacy_columns {
        names.push("total_requests");
    }
    let mut t = Table::new(&names, &format!("s{}", "i".repeat(names.len() - 1)));
    let averages = app.monitor.averages();
    for (db, totals) in metrics::db_totals(app) {
        let avg = averages.get(&db).copied().unwrap_or_default();
        let mut row = vec![text(&db)];
        row.extend(stat_columns(&totals).iter().map(|c| int(c.value)));
        row.extend(stat_columns(&avg).iter().map(|c| int(c.value)));
        if cfg.general.admin_legacy_columns {
            row.push(int(totals.query_count));
        }
        t.push(row);
    }
    t
}

fn stats_part(app: &App, averages: bool) -> Table {
    let zero = stat_columns(&Totals::default());
    let mut names = vec!["database"];
    names.extend(zero.iter().map(|c| c.plain));
    let mut t = Table::new(&names, &format!("s{}", "i".repeat(names.len() - 1)));
    let avg = app.monitor.averages();
    for (db, totals) in metrics::db_totals(app) {
        let x = if averages { avg.get(&db).copied().unwrap_or_default() } else { totals };
        let mut row = vec![text(&db)];
        row.extend(stat_columns(&x).iter().map(|c| int(c.value)));
        t.push(row);
    }
    t
}

/// SHOW TOTALS: SHOW STATS summed over every database, one (name, value) row each.
fn totals(app: &App) -> Table {
    let mut total = Totals::default();
    metrics::db_totals(app).values().for_each(|t| total.sum(t));
    // Rates add up; mean times are worked out from the summed totals (weighted).
    let avg = app.monitor.overall_averages();
    let mut t = Table::new(&["name", "value"], "si");
    // Named as PgBouncer names these rows (`total_client_bytes`, `avg_ps_bind_count`).
    for c in stat_columns(&total) {
        t.push(vec![text(format!("total_{}", c.field)), int(c.value)]);
    }
    for c in stat_columns(&avg) {
        t.push(vec![text(format!("avg_{}", c.field)), int(c.value)]);
    }
    t
}

const CONNECTIONS: [&str; 21] = [
    "type",
    "user",
    "database",
    "replication",
    "state",
    "addr",
    "port",
    "local_addr",
    "local_port",
    "connect_time",
    "request_time",
    "wait",
    "wait_us",
    "close_needed",
    "ptr",
    "link",
    "remote_pid",
    "tls",
    "application_name",
    "prepared_statements",
    "id",
];
const CONNECTION_KINDS: &str = "ssssssisissiiississii";

/// The `ptr`/`link` text of a client or server connection.
fn ptr(server: bool, id: u64) -> String {
    format!("0x{:x}", id | if server { 0x2000_0000_0000 } else { 0x1000_0000_0000 })
}

fn clients(app: &App) -> Table {
    let mut t = Table::new(&CONNECTIONS, CONNECTION_KINDS);
    let now = now_us();
    for c in app.client_infos.list() {
        let state = c.state();
        let waited =
            if state == ClientState::Waiting { now.saturating_sub(c.request_time_us.load(Relaxed)) } else { 0 };
        let server = c.server_id.load(Relaxed);
        let app_name = c.application_name.lock().clone();
        let (addr, port) = c.peer.addr_port();
        t.push(vec![
            text("C"),
            text(&c.user),
            text(&c.database),
            text("none"),
            text(match state {
                ClientState::Waiting => "waiting",
                ClientState::Login => "login",
                ClientState::Idle | ClientState::Active => "active",
            }),
            text(&addr),
            int(port),
            // local_addr, local_port: not tracked
            text(""),
            int(0),
            text(timestamp(c.connect_time_us)),
            text(timestamp(c.request_time_us.load(Relaxed))),
            int(waited / 1_000_000),
            int(waited % 1_000_000),
            int(0),
            text(ptr(false, c.id)),
            text(if server == 0 { String::new() } else { ptr(true, server) }),
            int(0),
            text(if c.tls { "yes" } else { "" }),
            text(app_name),
            int(c.prepared_statements.load(Relaxed)),
            int(c.id),
        ]);
    }
    t
}

fn servers(app: &App) -> Table {
    let mut t = Table::new(&CONNECTIONS, CONNECTION_KINDS);
    // The lookups' connections too (listed under auth_user).
    for pool in app.pools.upkeep() {
        for s in pool.servers.list() {
            let client = s.client_id.load(Relaxed);
            t.push(vec![
                text("S"),
                text(&pool.key.user),
                text(&pool.key.database),
                text("none"),
                text(match s.state() {
                    ServerState::Active => "active",
                    ServerState::Idle => "idle",
                    // Being opened and logging in: PgBouncer's name for that state.
                    ServerState::Login => "new",
                }),
                // The address its host name gave it (PgBouncer shows the address).
                text(s.peer().map_or_else(|| s.addr.host.to_string(), |at| at.ip().to_string())),
                int(s.addr.port),
                text(""),
                int(0),
                text(timestamp(s.connect_time_us)),
                text(timestamp(s.request_time_us.load(Relaxed))),
                int(0),
                int(0),
                int((pool.close_needed(&s) || pool.left_behind(&s)) as u64),
                text(ptr(true, s.id)),
                text(if client == 0 { String::new() } else { ptr(false, client) }),
                int(s.cancel_key().0),
                text(""),
                text(""),
                int(s.prepared_statements.load(Relaxed)),
                int(s.id),
            ]);
        }
    }
    t
}

const DATABASES: [&str; 17] = [
    "name",
    "host",
    "port",
    "database",
    "force_user",
    "pool_size",
    "min_pool_size",
    "reserve_pool_size",
    "server_lifetime",
    "pool_mode",
    "load_balance_hosts",
    "max_connections",
    "current_connections",
    "max_client_connections",
    "current_client_connections",
    "paused",
    "disabled",
];

fn databases(app: &App, cfg: &Config) -> Table {
    let g = &cfg.general;
    let mut names = DATABASES.to_vec();
    if g.admin_legacy_columns {
        names.push("reserve_pool");
    }
    let kinds = if g.admin_legacy_columns { "ssissiiiissiiiiiii" } else { "ssissiiiissiiiiii" };
    let mut t = Table::new(&names, kinds);
    let clients = logged_in_clients(app);
    let lifetime = g.server_lifetime.round() as u64;
    let mut admin = vec![
        text(&g.admin_database),
        text(""),
        int(g.listen_port),
        text(&g.admin_database),
        text(""),
        int(0),
        int(0),
        int(0),
        int(0),
        text("statement"),
        text("disable"),
        int(0),
        int(0),
        int(0),
        int(clients.iter().filter(|c| c.console).count()),
        int(0),
        int(0),
    ];
    if g.admin_legacy_columns {
        admin.push(int(0));
    }
    t.push(admin);
    // The config's entries, then the databases the fallback entry `*` serves now (those
    // with a pool, the lookups' included, or paused or disabled by name), as PgBouncer
    // lists its automatic databases.
    let mut served: Vec<String> = app.pools.upkeep().into_iter().map(|p| p.key.database.clone()).collect();
    served.extend(app.pools.flagged());
    served.sort();
    served.dedup();
    let fallback = cfg.databases.get(crate::config::FALLBACK_DATABASE);
    let served = served.into_iter().filter(|d| cfg.is_fallback_served(d)).filter_map(|d| Some((d, fallback?)));
    for (name, db) in cfg.databases.iter().map(|(n, d)| (n.clone(), d)).chain(served) {
        let name = &name;
        let mut row = vec![
            text(name),
            text(&db.host),
            int(db.port),
            text(db.dbname.as_deref().unwrap_or(name)),
            text(db.user.as_deref().unwrap_or("")),
            int(db.pool_size.unwrap_or(g.default_pool_size)),
            // Not kept for the databases the fallback serves.
            int(if cfg.databases.contains_key(name) { db.min_pool_size.unwrap_or(g.min_pool_size) } else { 0 }),
            int(db.reserve_pool_size.unwrap_or(g.reserve_pool_size)),
            int(lifetime),
            text(db.pool_mode.unwrap_or(g.pool_mode).as_str()),
            text("disable"),
            int(db.max_db_connections.unwrap_or(g.max_db_connections)),
            int(app.pools.db_connections(name)),
            int(0),
            int(clients.iter().filter(|c| !c.console && c.database == *name).count()),
            int(app.pools.is_paused(name) as u64),
            int(app.pools.is_disabled(name) as u64),
        ];
        if g.admin_legacy_columns {
            row.push(int(db.reserve_pool_size.unwrap_or(g.reserve_pool_size)));
        }
        t.push(row);
    }
    t
}

fn users(app: &App, cfg: &Config) -> Table {
    let names = [
        "name",
        "pool_size",
        "reserve_pool_size",
        "pool_mode",
        "max_user_connections",
        "current_connections",
        "max_user_client_connections",
        "current_client_connections",
    ];
    let mut t = Table::new(&names, "siisiiii");
    let g = &cfg.general;
    let clients = logged_in_clients(app);
    // The config's users, then those `auth_query` lookups found (general settings).
    let found = app.users.load().found_names(cfg);
    let unlisted = crate::config::User::default();
    let listed = cfg.users.iter();
    let found = found.iter().filter(|n| !cfg.users.contains_key(*n)).map(|n| (n, &unlisted));
    for (name, u) in listed.chain(found) {
        t.push(vec![
            text(name),
            int(u.pool_size.unwrap_or(g.default_pool_size)),
            int(0),
            text(u.pool_mode.map_or("", |m| m.as_str())),
            int(u.max_user_connections.unwrap_or(g.max_user_connections)),
            int(app.pools.user_connections(name)),
            int(0),
            int(clients.iter().filter(|c| c.user == *name).count()),
        ]);
    }
    t
}

/// The listed clients past their login (`ClientInfo::logged_in`): those still
/// authenticating or waiting for their login reply are not yet a database's clients.
fn logged_in_clients(app: &App) -> Vec<Arc<ClientInfo>> {
    app.client_infos.list().into_iter().filter(|c| c.logged_in()).collect()
}

fn lists(app: &App, cfg: &Config) -> Table {
    let pools = app.pools.all();
    // Listed clients still in their login count as logging in.
    let used_clients = logged_in_clients(app).len();
    let servers: usize = pools.iter().map(|p| p.counts().total).sum();
    let rows: [(&str, usize); 14] = [
        ("databases", cfg.databases.len() + 1),
        ("users", cfg.users.len()),
        ("peers", cfg.other_peers().count()),
        ("pools", pools.len()),
        ("peer_pools", cfg.other_peers().count()),
        ("free_clients", 0),
        ("used_clients", used_clients),
        ("login_clients", app.client_count().saturating_sub(used_clients)),
        ("free_servers", 0),
        ("used_servers", servers),
        ("dns_names", app.pools.host_names()),
        ("dns_zones", 0),
        ("dns_queries", 0),
        ("dns_pending", 0),
    ];
    let mut t = Table::new(&["list", "items"], "si");
    for (name, n) in rows {
        t.push(vec![text(name), int(n)]);
    }
    t
}

fn state(app: &App) -> Table {
    let paused = app.pools.all_paused();
    let running = *app.phase().borrow() == crate::app::Phase::Running;
    let yes = |b: bool| text(if b { "yes" } else { "no" });
    let mut t = Table::new(&["key", "value"], "ss");
    t.push(vec![text("active"), yes(running && !paused)]);
    t.push(vec![text("paused"), yes(paused)]);
    t.push(vec![text("suspended"), yes(false)]);
    t
}

/// SHOW MEM: Sluice's estimate of what its connections and caches hold.
fn mem(app: &App) -> Table {
    let views = pool_views(app);
    let clients = app.client_count() as u64;
    let servers: u64 = views.iter().map(|v| v.sv_active + v.sv_idle + v.sv_login).sum();
    let client_stmts: u64 = views.iter().map(|v| v.client_statements).sum();
    let server_stmts: u64 = views.iter().map(|v| v.server_statements).sum();
    let samples = app.monitor.samples();
    let sample_size = 64 + views.len() as u64 * 560;
    let rows: [(&str, u64, u64); 6] = [
        // The read buffer: 1 KB, grown in 8 KB steps only for clients that stream.
        ("client", (std::mem::size_of::<crate::stats::ClientInfo>() + 1024) as u64, clients),
        ("server", (std::mem::size_of::<crate::server::ServerConn>() + 16 * 1024) as u64, servers),
        ("client_prepared_statement", 64, client_stmts),
        ("server_prepared_statement", 160, server_stmts),
        ("pool", (std::mem::size_of::<crate::pool::Pool>()) as u64, views.len() as u64),
        ("stats_sample", sample_size, samples.len() as u64),
    ];
    let mut t = Table::new(&["name", "size", "used", "free", "memtotal"], "siiii");
    for (name, size, used) in rows {
        t.push(vec![text(name), int(size), int(used), int(0), int(size * used)]);
    }
    t
}

fn prepared(app: &App) -> Table {
    let names = [
        "database",
        "user",
        "client_statements",
        "server_statements",
        "cache_hits",
        "cache_misses",
        "client_parse_count",
        "server_parse_count",
        "bind_count",
    ];
    let mut t = Table::new(&names, "ssiiiiiii");
    for v in pool_views(app) {
        let s = &v.pool.stats;
        t.push(vec![
            text(&v.pool.key.database),
            text(&v.pool.key.user),
            int(v.client_statements),
            int(v.server_statements),
            int(s.prepared_hits.load(Relaxed)),
            int(s.prepared_misses.load(Relaxed)),
            int(s.client_parse_count.load(Relaxed)),
            int(s.server_parse_count.load(Relaxed)),
            int(s.bind_count.load(Relaxed)),
        ]);
    }
    t
}

/// SHOW LATENCY: percentiles over the last `stats_period` (at most the ten minutes of
/// samples kept), per pool.
fn latency(app: &App, cfg: &Config) -> Table {
    let mut names: Vec<String> = vec!["database".into(), "user".into(), "window_s".into()];
    let mut kinds = String::from("ssi");
    for what in ["xact", "query", "wait"] {
        names.push(format!("{what}_count"));
        for q in ["p50", "p90", "p99", "p99_9"] {
            names.push(format!("{what}_{q}_us"));
        }
        kinds.push_str("iiiii");
    }
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut t = Table::new(&names, &kinds);
    let window = (cfg.general.stats_period.round() as usize).clamp(1, metrics::RING_LEN);
    let kept = app.monitor.samples().len().max(1);
    for v in pool_views(app) {
        let mut row = vec![text(&v.pool.key.database), text(&v.pool.key.user), int(window.min(kept))];
        for h in metrics::recent_latency(app, &v.pool, window) {
            row.push(int(h.count));
            row.extend(metrics::percentiles(&h).iter().map(|&q| int(q)));
        }
        t.push(row);
    }
    t
}

/// `YYYY-MM-DD HH:MM:SS UTC` of a time in µs since the epoch (PgBouncer's format).
pub fn timestamp(us: u64) -> String {
    let secs = us / 1_000_000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (y, m, d) = civil_from_days(days as i64);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Gregorian date of a day count since 1970-01-01 (proleptic calendar, era arithmetic).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests;
