//! Noise: clients that send random sequences of valid, mangled and made-up protocol
//! messages, cancel themselves at random moments and leave in every way (a clean finish,
//! a bad length, a half-sent message, a dropped socket), in all three pool modes at once,
//! while a witness client checks its own answers. Afterwards Sluice must still run, have
//! logged no panic, hold no server connection or client, and have left no server
//! connection in a transaction; no client may have seen another client's data, and a
//! client that finished cleanly must have got its last answer or a closed connection,
//! never a hang. The same runs again while servers are killed at random, and again
//! while the admin console pauses, kills and reconnects and gets noise of its own;
//! another test sends noise into SCRAM logins.
//!
//! The sequences come from a seed (printed; set `SLUICE_NOISE_SEED` to replay one).

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use common::raw::*;
use common::{PgCluster, PgOptions, PgSsl, Sluice, TestCerts, console_cell_where, wait_until};

const POOL_SIZE: usize = 2;
const DATABASES: [&str; 3] = ["app", "app_statement", "app_session"];
const THREADS: u64 = 6;
const CLIENTS_PER_THREAD: u64 = 40;
/// How long a cleanly finishing client may wait for its last answer.
const ANSWER_WITHIN: Duration = Duration::from_secs(15);

/// xorshift64*: small, seedable, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len())]
    }

    /// Up to `max - 1` random bytes.
    fn bytes(&mut self, max: usize) -> Vec<u8> {
        let n = self.below(max);
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// SQL the noise runs; `{m}` is replaced by the client's own marker.
const SQL: &[&str] = &[
    "select '{m}'",
    "select $1::text || '{m}'",
    "begin",
    "commit",
    "rollback",
    "select 1/0",
    "selec nonsense",
    "select pg_sleep(0.02), '{m}'",
    "copy (select '{m}' from generate_series(1, 3)) to stdout",
    "copy noise from stdin",
    "set application_name = '{m}'",
    // Not the marker: SQL-level PREPARE stays on the server in transaction mode, by design.
    "prepare p1 as select 1",
    "execute p1",
    "deallocate all",
    "discard all",
    "listen noise_channel",
    "select 1; select '{m}'",
    // Schema and settings changes under prepared statements: plans go stale, result
    // types change, what a name resolves to moves.
    "select * from noise",
    "alter table noise add column if not exists c int",
    "alter table noise drop column if exists c",
    "set search_path = pg_catalog, public",
    "reset search_path",
    "",
];
const NAMES: &[&str] = &["", "s1", "s2", "s3", "p1", "s_{m}"];

fn sql(rng: &mut Rng, marker: &str, texts: &[&str]) -> String {
    rng.pick(texts).replace("{m}", marker)
}

fn name(rng: &mut Rng, marker: &str) -> String {
    rng.pick(NAMES).replace("{m}", marker)
}

fn target(kind: u8, name: &str) -> Vec<u8> {
    [&[kind][..], name.as_bytes(), &[0]].concat()
}

/// One well-formed message (which the server may still refuse).
fn valid_message(rng: &mut Rng, marker: &str, texts: &[&str]) -> Vec<u8> {
    let (sql, n1, n2) = (sql(rng, marker, texts), name(rng, marker), name(rng, marker));
    match rng.below(15) {
        0 | 1 => query(&sql),
        // Long enough to arrive in pieces and to pass Sluice's read buffer.
        13 => query(&format!("select '{marker}' /* {} */", "x".repeat(rng.below(70_000)))),
        14 => bind(&n1, &n2, &[&"y".repeat(rng.below(70_000))]),
        2 | 3 => parse(&n1, &sql),
        4 | 5 => {
            let params: [&[&str]; 3] = [&[], &[marker], &["1", "2"]];
            bind(&n1, &n2, params[rng.below(params.len())])
        }
        6 => execute(&n1, *rng.pick(&[0, 1, 2])),
        7 => msg(b'D', &target(*rng.pick(b"SP"), &n1)),
        8 => msg(b'C', &target(*rng.pick(b"SP"), &n1)),
        9 => sync(),
        10 => flush(),
        11 => msg(*rng.pick(b"dcf"), format!("{marker}\n\0").as_bytes()),
        _ => msg(b'F', &[0, 0, 0x04, 0xd2, 0, 0, 0, 0, 0, 0]),
    }
}

/// A message with a consistent length whose tag or body is wrong.
fn mangled_message(rng: &mut Rng, marker: &str, texts: &[&str]) -> Vec<u8> {
    let mut m = valid_message(rng, marker, texts);
    match rng.below(4) {
        0 => {
            // Cut the body short (a Parse without its NUL, a Bind missing its counts).
            let keep = 5 + rng.below(m.len() - 4);
            m.truncate(keep);
            let len = (keep - 1) as u32;
            m[1..5].copy_from_slice(&len.to_be_bytes());
        }
        1 => {
            for _ in 0..1 + rng.below(4) {
                let at = 5 + rng.below((m.len() - 5).max(1));
                if at < m.len() {
                    // High bit set: never a digit, so a flip cannot forge another marker.
                    m[at] = rng.next() as u8 | 0x80;
                }
            }
        }
        2 => m[0] = rng.next() as u8,
        _ => {
            let tag = rng.next() as u8;
            m = msg(tag, &rng.bytes(40));
        }
    }
    m
}

/// A valid message, or one time in `one_in` a mangled one.
fn some_message(rng: &mut Rng, marker: &str, texts: &[&str], one_in: usize) -> Vec<u8> {
    if rng.below(one_in) == 0 { mangled_message(rng, marker, texts) } else { valid_message(rng, marker, texts) }
}

/// How a noise client leaves.
#[derive(Debug, Clone, Copy)]
enum Leave {
    /// Ends any COPY and error state, then asks for its marker and reads the answer.
    Clean,
    /// Drops the socket.
    Drop,
    /// Sends half a message, then drops the socket.
    HalfMessage,
    /// Sends a length field below 4 or beyond any limit.
    BadLength,
}

struct Client {
    raw: Raw,
    pid: u32,
    secret: u32,
    marker: String,
    seen: Vec<u8>,
}

impl Client {
    /// None when the login failed with FATAL (its server was killed during it).
    fn login(port: u16, db: &str, marker: String) -> Result<Option<Client>, String> {
        let Some((raw, reply)) = try_login(port, "u_trust", db)? else { return Ok(None) };
        let key = reply.iter().find(|(t, _)| *t == b'K').expect("BackendKeyData").1.clone();
        let word = |at: usize| u32::from_be_bytes(key[at..at + 4].try_into().unwrap());
        raw.s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        Ok(Some(Client { pid: word(0), secret: word(4), raw, marker, seen: Vec::new() }))
    }

    /// Reads whatever has arrived without waiting for more.
    fn drain(&mut self) -> bool {
        use std::io::Read;
        let mut buf = [0u8; 8192];
        loop {
            match self.raw.s.read(&mut buf) {
                Ok(0) => return false,
                Ok(n) => self.seen.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return true;
                }
                Err(_) => return false,
            }
        }
    }

    fn send(&mut self, bytes: &[u8]) -> bool {
        use std::io::Write;
        self.raw.s.write_all(bytes).is_ok()
    }

    /// Sends `bytes` in up to four writes cut at random places (inside headers too).
    fn send_split(&mut self, bytes: &[u8], rng: &mut Rng) -> bool {
        let mut cuts: Vec<usize> = (0..rng.below(4)).map(|_| rng.below(bytes.len())).collect();
        cuts.sort_unstable();
        let mut from = 0;
        for cut in cuts.into_iter().chain([bytes.len()]) {
            if !self.send(&bytes[from..cut.max(from)]) {
                return false;
            }
            from = cut.max(from);
        }
        true
    }

    fn cancel(&self, port: u16) {
        let mut packet = BytesMut::new();
        sluice::protocol::build::cancel_request(&mut packet, self.pid, self.secret);
        let mut c = Raw::open(port);
        c.send(&packet);
        c.closed();
    }

    /// After `Leave::Clean`: reads until its marker's row and the ReadyForQuery after it
    /// (true), or until the connection closes (false). Err on a timeout, with what was
    /// read.
    fn finish(&mut self) -> Result<bool, String> {
        use std::io::Read;
        let end = format!("end{}", self.marker);
        let deadline = Instant::now() + ANSWER_WITHIN;
        self.raw.s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        let mut buf = [0u8; 8192];
        while Instant::now() < deadline {
            match self.raw.s.read(&mut buf) {
                Ok(0) => return Ok(false),
                Ok(n) => self.seen.extend_from_slice(&buf[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                Err(_) => return Ok(false),
            }
            if answered(&self.seen, end.as_bytes()) {
                return Ok(true);
            }
        }
        Err(format!("no answer within {ANSWER_WITHIN:?}; got {:?}", String::from_utf8_lossy(&self.seen)))
    }
}

/// Whether `seen` holds `end` followed later by a ReadyForQuery ('Z', length 5).
fn answered(seen: &[u8], end: &[u8]) -> bool {
    let Some(at) = seen.windows(end.len()).position(|w| w == end) else { return false };
    seen[at..].windows(5).any(|w| w == [b'Z', 0, 0, 0, 5])
}

/// Markers of other clients in `seen` ("mark", five digits, "x", not `own`), and any
/// answer of the witness's.
fn foreign_markers(seen: &[u8], own: &str) -> Vec<String> {
    let mut out = Vec::new();
    if seen.windows(7).any(|w| w == b"witness") {
        out.push("witness".to_string());
    }
    for w in seen.windows(own.len()) {
        let digits = &w[4..9];
        if w.starts_with(b"mark") && w[9] == b'x' && digits.iter().all(u8::is_ascii_digit) && w != own.as_bytes() {
            out.push(String::from_utf8_lossy(w).into_owned());
        }
    }
    out
}

/// One noise client's life: whether it finished cleanly with its last answer; Err
/// describes a hang or another client's data.
fn noise_client(port: u16, seed: u64, id: u64) -> Result<bool, String> {
    let mut rng = Rng(seed ^ id.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let marker = format!("mark{id:05}x");
    let db = *rng.pick(&DATABASES);
    let Some(mut c) = Client::login(port, db, marker.clone())? else { return Ok(false) };
    let leave =
        *rng.pick(&[Leave::Clean, Leave::Clean, Leave::Clean, Leave::Drop, Leave::HalfMessage, Leave::BadLength]);
    let mut alive = true;
    for _ in 0..1 + rng.below(25) {
        // One message, or a pipeline of a few.
        let mut m = Vec::new();
        for _ in 0..*rng.pick(&[1, 1, 1, 2, 3, 5]) {
            // Mangled ones mostly end the session (an unknown tag gets FATAL): rare
            // enough that most clients live on to the clean finish.
            m.extend(some_message(&mut rng, &marker, SQL, 15));
        }
        alive = c.send_split(&m, &mut rng) && c.drain();
        if !alive {
            break;
        }
        if rng.below(10) == 0 {
            c.cancel(port);
        }
    }
    let mut result = Ok(false);
    if alive {
        match leave {
            Leave::Clean => {
                let bye = [msg(b'f', b"noise\0"), sync(), query("rollback"), query(&format!("select 'end{marker}'"))];
                if c.send(&bye.concat()) {
                    result = c.finish();
                }
            }
            Leave::Drop => {}
            Leave::HalfMessage => {
                let m = valid_message(&mut rng, &marker, SQL);
                c.send(&m[..1 + rng.below(m.len() - 1)]);
            }
            Leave::BadLength => {
                let len: u32 = *rng.pick(&[0, 1, 3, 0x7fff_ffff, u32::MAX]);
                c.send(&[&[b'Q'][..], &len.to_be_bytes()].concat());
                c.drain();
            }
        }
    }
    let foreign = foreign_markers(&c.seen, &marker);
    if !foreign.is_empty() {
        return Err(format!("client {marker} ({db}) saw other clients' data: {foreign:?}"));
    }
    result.map_err(|e| format!("client {marker} ({db}, seed {seed}, {leave:?}): {e}"))
}

/// What the witness saw: answers checked, and logins after the first.
#[derive(Debug, Default)]
struct Witnessed {
    answers: u64,
    relogins: u64,
}

/// A client that checks every answer is its own, in simple and extended protocol. A
/// FATAL error or a closed connection (its server was killed) makes it log in again.
fn witness(port: u16, stop: &AtomicBool) -> Result<Witnessed, String> {
    let mut conn = None;
    let mut n = 0u64;
    let mut seen = Witnessed::default();
    while !stop.load(Ordering::Relaxed) {
        if conn.is_none() {
            seen.relogins += u64::from(n > 0);
            conn = try_login(port, "u_trust", "app")?.map(|(raw, _)| raw);
        }
        let Some(c) = conn.as_mut() else { continue };
        n += 1;
        let want = format!("witness{n}");
        let sql = format!("select '{want}'");
        c.send(&if n % 2 == 0 { query(&sql) } else { extended_query(&sql) });
        match witness_answer(c)? {
            Some(got) if got == want => seen.answers += 1,
            Some(got) => return Err(format!("witness asked for {want:?}, got {got:?}")),
            None => conn = None,
        }
    }
    Ok(seen)
}

/// The witness's value up to ReadyForQuery; None when the connection ended (after a
/// FATAL), Err on any other error.
fn witness_answer(c: &mut Raw) -> Result<Option<String>, String> {
    let mut value = None;
    while let Some((tag, body)) = next_message(c)? {
        match tag {
            b'D' => value = Some(first_column(&body)),
            b'E' if field(&body, b'V') != "FATAL" => {
                return Err(format!("witness got {:?}", String::from_utf8_lossy(&body)));
            }
            b'Z' => return Ok(Some(value.unwrap_or_default())),
            _ => {}
        }
    }
    Ok(None)
}

/// Terminates a random third of the test user's backends, over and over, until `stop`
/// (over one connection straight to PostgreSQL, as that user, kept for the run: a psql
/// per round could time out connecting on a loaded machine). Should PostgreSQL restart
/// its backends meanwhile (a crash-restart ends this connection too: 57P02), it logs in
/// again once PostgreSQL takes logins.
fn kill_servers(pg: &PgCluster, stop: &AtomicBool) -> usize {
    let sql = "select count(pg_terminate_backend(pid)) from pg_stat_activity \
               where usename = 'u_trust' and pid <> pg_backend_pid() and random() < 0.3";
    let mut killed = 0;
    let mut c = None;
    while !stop.load(Ordering::Relaxed) {
        if c.is_none() {
            c = try_login(pg.port, "u_trust", "app").ok().flatten().map(|(raw, _)| raw);
            if c.is_none() {
                // Refused while PostgreSQL recovers: again shortly.
                thread::sleep(Duration::from_millis(200));
                continue;
            }
        }
        let conn = c.as_mut().expect("logged in");
        conn.send(&query(sql));
        let answer: Vec<_> = std::iter::from_fn(|| conn.recv()).take_while(|(t, _)| *t != b'Z').collect();
        match answer.iter().find(|(t, _)| *t == b'D') {
            Some(_) => killed += first_value(&answer).parse::<usize>().unwrap(),
            None => {
                // Ended: connect again.
                c = None;
                continue;
            }
        }
        // Pace the kills so that most requests still get through.
        thread::sleep(Duration::from_millis(30));
    }
    killed
}

/// What console noise sends: SHOW commands, commands a stats user may not run, junk.
const CONSOLE_SQL: &[&str] = &[
    "SHOW POOLS",
    "SHOW CLIENTS",
    "SHOW SERVERS",
    "SHOW STATS",
    "SHOW CONFIG",
    "SHOW HELP",
    "SHOW PREPARED_STATEMENTS",
    "SHOW {m}",
    "SHOW POOLS; SHOW STATS",
    "PAUSE app",
    "KILL app",
    "select 1",
    "",
];

/// Noise clients on the console, as a stats user, until `stop`: random and mangled
/// messages, then a request whose error names the client's marker, which must come
/// back (or the connection close) in time. How many got that answer; Err describes a
/// hang.
fn console_noise(port: u16, seed: u64, stop: &AtomicBool) -> Result<u64, String> {
    let (mut n, mut answered) = (0u64, 0u64);
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let mut rng = Rng(seed.rotate_left(29) ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let marker = format!("console{n}x");
        let Some((raw, _)) = try_login(port, "u_plain", "pgbouncer")? else { continue };
        let mut c = Client { pid: 0, secret: 0, raw, marker: marker.clone(), seen: Vec::new() };
        c.raw.s.set_read_timeout(Some(Duration::from_millis(1))).unwrap();
        let mut alive = true;
        for _ in 0..1 + rng.below(10) {
            let m = some_message(&mut rng, &marker, CONSOLE_SQL, 10);
            alive = c.send_split(&m, &mut rng) && c.drain();
            if !alive {
                break;
            }
        }
        if alive && c.send(&[msg(b'f', b"noise\0"), sync(), query(&format!("SHOW end{marker}"))].concat()) {
            let got = c.finish().map_err(|e| format!("console client {marker} (seed {seed}): {e}"))?;
            answered += u64::from(got);
        }
    }
    Ok(answered)
}

/// Random console commands until `stop`; each pause, kill or disable is undone in the
/// same step. Returns how many steps ran.
fn console_commands(port: u16, seed: u64, stop: &AtomicBool) -> usize {
    let mut rng = Rng(seed.rotate_left(17) | 1);
    let mut console = Raw::login(port, "u_trust", "pgbouncer");
    let mut second = Raw::login(port, "u_trust", "pgbouncer");
    let run = |c: &mut Raw, sql: &str| {
        c.send(&query(sql));
        c.until_ready()
    };
    let mut steps = 0;
    while !stop.load(Ordering::Relaxed) {
        steps += 1;
        let db = *rng.pick(&DATABASES);
        match rng.below(8) {
            0 => {
                // PAUSE waits for the lent servers: RESUME from a second console ends it,
                // once the database shows as paused (a RESUME before would be lost).
                console.send(&query(&format!("PAUSE {db}")));
                let paused = wait_until(ANSWER_WITHIN, || paused(&run(&mut second, "SHOW DATABASES"), db));
                assert!(paused, "{db} never showed as paused");
                run(&mut second, &format!("RESUME {db}"));
                console.until_ready();
            }
            1 => {
                run(&mut console, &format!("KILL {db}"));
                run(&mut console, &format!("RESUME {db}"));
            }
            2 => {
                run(&mut console, &format!("DISABLE {db}"));
                run(&mut console, &format!("ENABLE {db}"));
            }
            3 => drop(run(&mut console, &format!("RECONNECT {db}"))),
            4 => drop(run(&mut console, "RELOAD")),
            _ => {
                let show = rng.pick(&["POOLS", "CLIENTS", "SERVERS", "STATS", "PREPARED_STATEMENTS", "LATENCY", "MEM"]);
                drop(run(&mut console, &format!("SHOW {show}")));
            }
        }
    }
    steps
}

/// Whether SHOW DATABASES (its messages) has `db` paused.
fn paused(reply: &[(u8, Vec<u8>)], db: &str) -> bool {
    reply.iter().filter(|(t, _)| *t == b'D').any(|(_, row)| {
        let mut cols = Vec::new();
        let mut at = 2;
        while at + 4 <= row.len() {
            let len = i32::from_be_bytes(row[at..at + 4].try_into().unwrap());
            let value = if len < 0 { &[][..] } else { &row[at + 4..at + 4 + len as usize] };
            cols.push(value);
            at += 4 + len.max(0) as usize;
        }
        cols.first() == Some(&db.as_bytes()) && cols.get(15) == Some(&&b"1"[..])
    })
}

fn seed() -> u64 {
    match std::env::var("SLUICE_NOISE_SEED") {
        Ok(s) => s.parse().expect("SLUICE_NOISE_SEED is a number"),
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64,
    }
}

fn pool_cell(s: &Sluice, db: &str, column: usize) -> Option<usize> {
    console_cell_where(s.port, "u_trust", "", "SHOW POOLS", &[db, "u_trust"], column)?.parse().ok()
}

#[test]
fn noise_in_every_pool_mode_leaves_sluice_clean() {
    noise_run(Chaos::None);
}

/// The same noise while a third of the servers is killed every few tens of milliseconds;
/// Sluice reaches PostgreSQL over TLS here.
#[test]
fn noise_with_servers_killed_leaves_sluice_clean() {
    noise_run(Chaos::KillServers);
}

/// The same noise while the admin console pauses, resumes, kills, disables, enables,
/// reconnects and reloads the databases at random, and reads every SHOW.
#[test]
fn noise_with_console_commands_leaves_sluice_clean() {
    noise_run(Chaos::Console);
}

/// What else goes on during a noise run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Chaos {
    None,
    KillServers,
    Console,
}

fn noise_run(chaos: Chaos) {
    let certs = TestCerts::generate();
    let pg = if chaos == Chaos::KillServers {
        let ssl = PgSsl { cert: certs.server.cert.clone(), key: certs.server.key.clone(), ca: None };
        PgCluster::start_with(PgOptions { ssl: Some(ssl), ..PgOptions::default() })
    } else {
        PgCluster::start()
    };
    pg.psql_db("app", "create table noise (t text); alter table noise owner to u_trust");
    let pool = POOL_SIZE.to_string();
    let s = Sluice::builder(&pg)
        .general("auth_type", "\"trust\"")
        .general("pool_mode", "\"transaction\"")
        .general("admin_users", r#"["u_trust"]"#)
        .general("stats_users", r#"["u_plain"]"#)
        .general("max_prepared_statements", "3")
        .general("max_client_prepared_statements", "4")
        // Two workers (the multi-threaded runtime: sessions, pools and cancels race for
        // real) except while servers are killed.
        .general("workers", if chaos == Chaos::KillServers { "1" } else { "2" })
        .general("server_tls_sslmode", if chaos == Chaos::KillServers { "\"require\"" } else { "\"disable\"" })
        // Servers checked before nearly every loan (Sluice's own query between clients'
        // exchanges) and retired every second.
        .general("server_check_delay", "0.001")
        .general("server_lifetime", "1")
        .database("app", &[("pool_size", &pool)])
        .database("app_statement", &[("pool_size", &pool), ("pool_mode", "\"statement\"")])
        .database("app_session", &[("pool_size", &pool), ("pool_mode", "\"session\"")])
        .start();
    let seed = seed();
    println!("SLUICE_NOISE_SEED={seed}");
    let stop = AtomicBool::new(false);
    let (witnessed, killed, results) = thread::scope(|scope| {
        let w = scope.spawn(|| witness(s.port, &stop));
        let k = scope.spawn(|| match chaos {
            Chaos::None => 0,
            Chaos::KillServers => kill_servers(&pg, &stop),
            Chaos::Console => {
                let noise = scope.spawn(|| console_noise(s.port, seed, &stop));
                let steps = console_commands(s.port, seed, &stop);
                let answered = noise.join().unwrap().unwrap_or_else(|e| panic!("{e}"));
                assert!(answered > 0, "no console noise client got its last answer");
                steps
            }
        });
        let noise: Vec<_> = (0..THREADS)
            .map(|t| {
                scope.spawn(move || {
                    let ids = t * CLIENTS_PER_THREAD..(t + 1) * CLIENTS_PER_THREAD;
                    ids.map(|id| noise_client(s.port, seed, id)).collect::<Vec<_>>()
                })
            })
            .collect();
        let results: Vec<_> = noise.into_iter().flat_map(|h| h.join().unwrap()).collect();
        stop.store(true, Ordering::Relaxed);
        (w.join().unwrap(), k.join().unwrap(), results)
    });
    let failures: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(failures.is_empty(), "seed {seed}: {failures:#?}");
    // A Sluice that closed every connection would pass the checks above.
    let answered = results.iter().filter(|r| matches!(r, Ok(true))).count();
    assert!(answered > 0, "seed {seed}: no noise client got its last answer");
    let witnessed = witnessed.unwrap_or_else(|e| panic!("seed {seed}: {e}"));
    assert!(witnessed.answers > 0, "seed {seed}: {witnessed:?}");
    if chaos == Chaos::None {
        assert_eq!(witnessed.relogins, 0, "seed {seed}: the witness lost its connection with nothing killing it");
    }
    assert_eq!(chaos != Chaos::None, killed > 0, "{chaos:?}: {killed} servers killed or commands run");

    // Every client is gone; nothing may stay lent, queued or in a transaction.
    for db in DATABASES {
        let settled =
            wait_until(Duration::from_secs(20), || [2, 3, 6, 12].iter().all(|&col| pool_cell(&s, db, col) == Some(0)));
        assert!(settled, "seed {seed}: pool {db} did not settle: {:?}", [2, 3, 6, 9, 12].map(|c| pool_cell(&s, db, c)));
        assert!(pool_cell(&s, db, 9).unwrap() <= POOL_SIZE);
    }
    let idle = wait_until(Duration::from_secs(20), || pg.backends("usename = 'u_trust' and state <> 'idle'") == 0);
    assert!(idle, "seed {seed}: server connections left busy or in a transaction");
    let within_pools =
        wait_until(Duration::from_secs(20), || pg.backends("usename = 'u_trust'") <= POOL_SIZE * DATABASES.len());
    assert!(within_pools, "seed {seed}: more server connections than the pools hold");
    let log = s.log();
    assert!(!log.contains("panicked"), "seed {seed}: Sluice panicked:\n{log}");

    // And it still serves.
    for db in DATABASES {
        let mut c = Raw::login(s.port, "u_trust", db);
        c.send(&query("select 'after'"));
        assert_eq!(first_value(&c.until_ready()), "after");
    }
}

/// One login that goes wrong: a mangled startup packet, or a SCRAM exchange with garbage
/// at a random step. Err when Sluice neither refuses nor closes it in time, or lets it in.
fn bad_login(port: u16, rng: &mut Rng) -> Result<(), String> {
    let mut c = Raw::open(port);
    c.s.set_read_timeout(Some(ANSWER_WITHIN)).unwrap();
    let good = startup(&[("user", "u_scram"), ("database", "app")], 3 << 16);
    let step = rng.below(6);
    if step == 0 {
        let mut m = good.clone();
        let at = rng.below(m.len());
        m[at] = rng.next() as u8;
        m.truncate(m.len() - rng.below(3));
        c.send(&m);
        // A cut-short packet is waited for: end it with an EOF.
        c.s.shutdown(std::net::Shutdown::Write).unwrap();
        return refused(&mut c, rng, "mangled startup");
    }
    c.send(&good);
    if c.recv().map(|m| m.0) != Some(b'R') {
        return Err("no AuthenticationSASL".into());
    }
    let first = b"n,,n=,r=noisenoisenoise";
    let initial = [&b"SCRAM-SHA-256\0"[..], &(first.len() as i32).to_be_bytes(), first].concat();
    let garbage = match step {
        1 => msg(b'p', &rng.bytes(60)),
        2 => {
            let tag = rng.next() as u8;
            msg(tag, &rng.bytes(20))
        }
        3 => {
            let mut m = msg(b'p', &initial);
            let at = 5 + rng.below(m.len() - 5);
            m[at] = rng.next() as u8;
            m
        }
        _ => {
            c.send(&msg(b'p', &initial));
            if c.recv().map(|m| m.0) != Some(b'R') {
                return Err("no SASLContinue".into());
            }
            let last = rng.bytes(120);
            if step == 4 { msg(b'p', &last) } else { msg(b'p', &last)[..3].to_vec() }
        }
    };
    c.send(&garbage);
    if step == 5 {
        drop(c); // half a message, then gone
        return Ok(());
    }
    refused(&mut c, rng, &format!("garbage at step {step}"))
}

type Messages = Vec<(u8, Vec<u8>)>;

/// Logs in as `user`: the connection and the messages up to ReadyForQuery; None when
/// the login ends with a FATAL error and a close.
fn try_login(port: u16, user: &str, db: &str) -> Result<Option<(Raw, Messages)>, String> {
    let mut raw = Raw::open(port);
    raw.send(&startup(&[("user", user), ("database", db)], 3 << 16));
    let mut reply = Vec::new();
    while let Some(m) = next_message(&mut raw)? {
        match m.0 {
            b'Z' => return Ok(Some((raw, reply))),
            b'E' if field(&m.1, b'V') != "FATAL" => {
                return Err(format!("login error {:?}", String::from_utf8_lossy(&m.1)));
            }
            _ => reply.push(m),
        }
    }
    Ok(None)
}

/// The next message; None when the connection closed, Err when none came in time.
fn next_message(c: &mut Raw) -> Result<Option<(u8, Vec<u8>)>, String> {
    use std::io::{ErrorKind::*, Read};
    let mut head = [0u8; 5];
    if let Err(e) = c.s.read_exact(&mut head) {
        return if matches!(e.kind(), WouldBlock | TimedOut) {
            Err(format!("no answer in {ANSWER_WITHIN:?}"))
        } else {
            Ok(None)
        };
    }
    let len = u32::from_be_bytes(head[1..5].try_into().unwrap()) as usize;
    let mut body = vec![0u8; len.saturating_sub(4)];
    Ok(c.s.read_exact(&mut body).ok().map(|()| (head[0], body)))
}

/// The connection ends, after at most ErrorResponses, and never with AuthenticationOk. A
/// corruption can leave the login valid (another user name, another nonce): each further
/// authentication request is answered with garbage.
fn refused(c: &mut Raw, rng: &mut Rng, what: &str) -> Result<(), String> {
    for _ in 0..4 {
        match next_message(c).map_err(|e| format!("{what}: {e}"))? {
            None => return Ok(()),
            Some((b'E', _)) => return if c.closed() { Ok(()) } else { Err(format!("{what}: open after an error")) },
            Some((b'R', body)) if body.starts_with(&0u32.to_be_bytes()) => return Err(format!("{what}: logged in")),
            // A corrupted minor version: negotiated down, the login goes on.
            Some((b'v', _)) => continue,
            Some((b'R', _)) => {
                // Ignore a failed write: Sluice may have closed already.
                let _ = std::io::Write::write_all(&mut c.s, &msg(b'p', &rng.bytes(60)));
            }
            Some((tag, body)) => return Err(format!("{what}: unexpected {} {body:?}", tag as char)),
        }
    }
    Err(format!("{what}: still asked to authenticate after three garbage answers"))
}

#[test]
fn noise_in_scram_logins_is_refused_and_leaves_sluice_serving() {
    let pg = PgCluster::start();
    let s = Sluice::builder(&pg).general("auth_type", "\"scram-sha-256\"").start();
    let seed = seed();
    println!("SLUICE_NOISE_SEED={seed}");
    let failures: Vec<String> = thread::scope(|scope| {
        let threads: Vec<_> = (0..THREADS)
            .map(|t| {
                scope.spawn(move || {
                    let mut rng = Rng(seed ^ (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
                    (0..CLIENTS_PER_THREAD).filter_map(|_| bad_login(s.port, &mut rng).err()).collect::<Vec<_>>()
                })
            })
            .collect();
        threads.into_iter().flat_map(|h| h.join().unwrap()).collect()
    });
    assert!(failures.is_empty(), "seed {seed}: {failures:#?}");
    let log = s.log();
    assert!(!log.contains("panicked"), "seed {seed}: Sluice panicked:\n{log}");
    let out = common::psql_cmd(s.port, "127.0.0.1", "u_scram", "pw_scram", "app")
        .args(["-tAc", "select 'after'"])
        .output()
        .expect("psql runs");
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "after", "{}", String::from_utf8_lossy(&out.stderr));
}
