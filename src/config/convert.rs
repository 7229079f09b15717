//! `sluice --from-pgbouncer pgbouncer.ini`: a PgBouncer config turned into a Sluice
//! one. `[pgbouncer]` settings Sluice has under the same name are carried over with
//! their TOML types; `[databases]` connection strings and `[users]` lines become
//! tables; what Sluice does not have is kept as a comment with a note saying so, so
//! nothing is dropped silently. Where PgBouncer's default differs from Sluice's
//! (`auth_type`, `listen_addr`, `tcp_keepidle`, `listen_backlog`), PgBouncer's is
//! written out, so the converted file behaves as the old one did.

use toml::Value;

use super::General;

/// The converted config (TOML text, with the notes as comments where they belong)
/// and the notes, one line each.
pub struct Converted {
    pub toml: String,
    pub notes: Vec<String>,
}

/// What PgBouncer settings that Sluice spells differently or lacks become.
fn unsupported_why(key: &str) -> &'static str {
    match key {
        "logfile" | "syslog" | "syslog_ident" | "syslog_facility" => "Sluice logs to stderr",
        "pidfile" | "user" => "Sluice runs in the foreground under a service manager",
        "ignore_startup_parameters" => "not needed: Sluice applies every startup parameter",
        "client_tls_dheparams" => "not needed: Sluice offers no DHE suites (its TLS 1.2 suites are ECDHE)",
        "pkt_buf" | "sbuf_loopcnt" => "not needed: Sluice sizes its buffers to the messages and takes turns itself",
        "suspend_timeout" => "not there: Sluice has no SUSPEND (online restart is not built)",
        "dns_zone_check_period" => "not needed: Sluice looks host names up again every dns_max_ttl while they are used",
        "resolv_conf" => "Sluice uses the system's resolver (/etc/resolv.conf)",
        "service_name" | "job_name" => "Windows service settings: not needed",
        "track_extra_parameters" => {
            "not needed: Sluice applies every startup parameter, and follows SETs of the settings PostgreSQL reports"
        }
        _ => "no such setting in Sluice",
    }
}

/// How deep `%include`s may nest: deeper is taken for a loop (a file including itself).
const MAX_INCLUDE_DEPTH: usize = 10;

/// A line of the config: where it is (`line N`, or `FILE line N` in an included
/// file) and its text.
struct Line {
    at: String,
    text: String,
}

/// Converts a PgBouncer config; its `%include FILE` lines are read in their place
/// (a relative path from the current directory, as PgBouncer reads them).
pub fn from_pgbouncer_ini(text: &str) -> Result<Converted, String> {
    let mut lines = Vec::new();
    expand(&mut lines, text, None, 0)?;
    convert(&lines)
}

/// `text`'s lines into `lines`, each `%include` replaced by the lines of its file.
fn expand(lines: &mut Vec<Line>, text: &str, file: Option<&str>, depth: usize) -> Result<(), String> {
    let place = |n: usize| match file {
        Some(f) => format!("{f} line {n}"),
        None => format!("line {n}"),
    };
    for (i, raw) in text.lines().enumerate() {
        let Some(path) = raw.trim().strip_prefix("%include").filter(|p| p.starts_with([' ', '\t'])) else {
            lines.push(Line { at: place(i + 1), text: raw.to_string() });
            continue;
        };
        let path = path.trim();
        if depth == MAX_INCLUDE_DEPTH {
            return Err(format!("{}: %include {path}: nested more than {MAX_INCLUDE_DEPTH} deep", place(i + 1)));
        }
        let included = std::fs::read_to_string(path).map_err(|e| format!("{}: %include {path}: {e}", place(i + 1)))?;
        expand(lines, &included, Some(path), depth + 1)?;
    }
    Ok(())
}

fn convert(lines: &[Line]) -> Result<Converted, String> {
    let known = match Value::try_from(General::default()) {
        Ok(Value::Table(t)) => t,
        _ => return Err("internal: the general section does not serialize".into()),
    };
    let mut out = Converted { toml: String::new(), notes: Vec::new() };
    let (mut general, mut databases, mut users) = (Entries::default(), Entries::default(), Entries::default());
    let mut peers = Entries::default();
    let (mut seen, mut socket_dir, mut pam) = (Vec::new(), "/tmp".to_string(), false);
    let mut section = String::new();
    for Line { at, text: raw } in lines {
        let line = raw.trim();
        if line.is_empty() || line.starts_with(';') || line.starts_with('#') {
            continue;
        }
        // (What follows the `]` is a comment to PgBouncer: `[databases] ; main`.)
        if let Some((name, _)) = line.strip_prefix('[').and_then(|l| l.split_once(']')) {
            section = name.trim().to_ascii_lowercase();
            continue;
        }
        let Some((key, value)) = line.split_once('=') else {
            let note = format!("{at}: not converted: {line}");
            general.put(at, at, format!("# {note}\n"), &mut out.notes);
            out.notes.push(note);
            continue;
        };
        let (key, value) = (key.trim(), value.trim());
        match section.as_str() {
            "pgbouncer" => {
                let key = key.to_ascii_lowercase();
                match key.as_str() {
                    "unix_socket_dir" => socket_dir = value.to_string(),
                    "auth_type" => pam = value.eq_ignore_ascii_case("pam"),
                    _ => {}
                }
                seen.push(key.clone());
                if key == "auth_user" {
                    out.notes.push(format!(
                        "{at}: auth_user = {value}: Sluice logs in as it with the password from auth_file or \
                         [users]; one the server trusts needs an entry too: [users.\"{value}\"] without a password"
                    ));
                }
                let (key, value) = verbosity(&key, value).unwrap_or((key.as_str(), value));
                let text = match setting(key, value, known.get(key)) {
                    Ok(v) => format!("{key} = {v}\n"),
                    Err(why) => {
                        let note = format!("{at}: {key} = {value}: {why}");
                        out.notes.push(note.clone());
                        format!("# {note}\n")
                    }
                };
                general.put(key, at, text, &mut out.notes);
            }
            "databases" => {
                let (name, notes) = (unquote_name(key), &mut out.notes);
                let text = database(&name, value, at, notes);
                databases.put(&format!("database {name}"), at, text, notes);
            }
            "users" => {
                let (name, notes) = (unquote_name(key), &mut out.notes);
                let text = user(&name, value, at, notes);
                users.put(&format!("user {name}"), at, text, notes);
            }
            "peers" => {
                let notes = &mut out.notes;
                peers.put(&format!("peer {key}"), at, peer(key, value, at, notes), notes);
            }
            other => out.notes.push(format!("{at}: section [{other}] not converted")),
        }
    }
    let general = general.text() + &pgbouncer_defaults(&seen, pam);
    let tables = databases.text() + &users.text() + &peers.text();
    // A database or peer without a host is reached on PgBouncer's Unix socket directory.
    let tables = tables.replace(NO_HOST, &format!("host = {}\n", Value::String(socket_dir)));
    out.toml = format!(
        "# Converted from a PgBouncer config by `sluice --from-pgbouncer`; check it with\n\
         # `sluice --check --config FILE`, and see docs/from-pgbouncer.md.\n\n[general]\n{general}{tables}"
    );
    Ok(out)
}

/// PgBouncer's defaults where Sluice's differ, for the settings not `seen`; its PAM
/// service under `auth_type = pam`.
fn pgbouncer_defaults(seen: &[String], pam: bool) -> String {
    const PAM_SERVICE: &str =
        "# PgBouncer's PAM service (Sluice's default is \"sluice\")\npam_service = \"pgbouncer\"\n";
    const DEFAULTS: [(&str, &str); 4] = [
        ("auth_type", "# PgBouncer's default (Sluice's is scram-sha-256)\nauth_type = \"md5\"\n"),
        ("listen_addr", "# PgBouncer's default: no TCP listener, the Unix socket only\nlisten_addr = []\n"),
        ("tcp_keepidle", "# PgBouncer's default: the kernel's (Sluice's is 60)\ntcp_keepidle = 0\n"),
        ("listen_backlog", "# PgBouncer's default (Sluice's is 4096)\nlisten_backlog = 128\n"),
    ];
    let unseen = DEFAULTS.iter().filter(|(key, _)| !seen.iter().any(|k| k == key)).map(|(_, text)| *text);
    let pam = pam.then_some(PAM_SERVICE).filter(|_| !seen.iter().any(|k| k == "pam_service"));
    unseen.chain(pam).collect()
}

/// Converted settings (or databases, users, peers) in the order met; one set again
/// replaces the earlier (PgBouncer takes the last, often from an `%include` meant to
/// override), with a note, and takes the later one's place.
#[derive(Default)]
struct Entries {
    /// (where, text) per entry; None where one was replaced.
    list: Vec<Option<(String, String)>>,
    /// Each key's place in `list`.
    at: std::collections::HashMap<String, usize>,
}

impl Entries {
    /// Puts the `text` converted from `key`'s line at `at`.
    fn put(&mut self, key: &str, at: &str, text: String, notes: &mut Vec<String>) {
        if let Some(i) = self.at.insert(key.to_string(), self.list.len())
            && let Some((before, _)) = self.list[i].take()
        {
            notes.push(format!("{at}: {key} set again: this replaces {before} (PgBouncer takes the last)"));
        }
        self.list.push(Some((at.to_string(), text)));
    }

    fn text(&self) -> String {
        self.list.iter().flatten().map(|(_, text)| text.as_str()).collect()
    }
}

/// PgBouncer's `verbose` (0: its usual log, 1 and up: more) as Sluice's `log_level`.
fn verbosity<'a>(key: &str, value: &'a str) -> Option<(&'static str, &'a str)> {
    (key == "verbose").then(|| match value.trim().parse::<u32>() {
        Ok(0) => ("log_level", "info"),
        Ok(1) => ("log_level", "debug"),
        Ok(_) => ("log_level", "trace"),
        Err(_) => ("verbose", value),
    })
}

/// Marks a database entry that named no host, filled in once the whole file is read.
const NO_HOST: &str = "host = @PGBOUNCER_UNIX_SOCKET@\n";

/// A `[pgbouncer]` value as the TOML Sluice's same-named key takes, or why not.
fn setting(key: &str, value: &str, default: Option<&Value>) -> Result<Value, String> {
    let Some(default) = default else {
        return Err(unsupported_why(key).to_string());
    };
    let bad = |what: &str| format!("not {what}");
    Ok(match default {
        Value::Integer(_) => Value::Integer(c_integer(value).ok_or_else(|| bad("an integer"))?),
        // An integer to PgBouncer (0777 octal, 0x1ff hex, 511 decimal); octal text to Sluice.
        Value::String(_) if key == "unix_socket_mode" => {
            let mode = c_integer(value).filter(|m| *m >= 0).ok_or_else(|| bad("an integer"))?;
            Value::String(format!("0{mode:o}"))
        }
        Value::Float(_) => Value::Float(value.parse().map_err(|_| bad("a number of seconds"))?),
        Value::Boolean(_) => Value::Boolean(match value.to_ascii_lowercase().as_str() {
            "1" | "on" | "true" | "yes" => true,
            "0" | "off" | "false" | "no" => false,
            _ => return Err(bad("a boolean")),
        }),
        Value::Array(_) if key.ends_with("_tls_protocols") => return tls_protocols(value),
        // PgBouncer's user lists take spaces between names as well as commas.
        Value::Array(_) if key == "admin_users" || key == "stats_users" => {
            let items = value.split([',', ' ', '\t']).filter(|s| !s.is_empty());
            Value::Array(items.map(|s| Value::String(s.to_string())).collect())
        }
        Value::Array(_) => {
            let items = value.split(',').map(str::trim).filter(|s| !s.is_empty());
            Value::Array(items.map(|s| Value::String(s.to_string())).collect())
        }
        // Names PgBouncer reads in any case (`MD5`, `Transaction`).
        _ if LOWERCASE.contains(&key) => {
            let value = value.to_ascii_lowercase();
            if key == "auth_type" && Value::String(value.clone()).try_into::<super::AuthType>().is_err() {
                return Err("Sluice supports md5, scram-sha-256, trust, cert, plain, hba, any and pam".into());
            }
            Value::String(value)
        }
        _ => Value::String(value.to_string()),
    })
}

/// Settings whose values PgBouncer reads in any case, and Sluice in lower case.
const LOWERCASE: [&str; 4] = ["auth_type", "pool_mode", "client_tls_sslmode", "server_tls_sslmode"];

/// An integer as PgBouncer reads one (C's `strtol` with base 0): `0x` hexadecimal, a
/// leading `0` octal, else decimal, with an optional sign.
fn c_integer(value: &str) -> Option<i64> {
    let value = value.trim();
    let (negative, digits) = match value.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, value.strip_prefix('+').unwrap_or(value)),
    };
    let (radix, digits) = match digits.strip_prefix("0x").or_else(|| digits.strip_prefix("0X")) {
        Some(hex) => (16, hex),
        None if digits.len() > 1 && digits.starts_with('0') => (8, &digits[1..]),
        None => (10, digits),
    };
    if digits.is_empty() || digits.starts_with(['+', '-']) {
        return None;
    }
    let n = i64::from_str_radix(digits, radix).ok()?;
    Some(if negative { -n } else { n })
}

fn tls_protocols(value: &str) -> Result<Value, String> {
    match value.to_ascii_lowercase().as_str() {
        "secure" | "default" => Err("Sluice's default (TLS 1.2 and 1.3) is the same; left out".into()),
        "all" | "legacy" => Err("TLS before 1.2 is not supported; Sluice's default is TLS 1.2 and 1.3".into()),
        list => {
            let items = list.split(',').map(str::trim).filter(|s| !s.is_empty());
            Ok(Value::Array(items.map(|s| Value::String(s.to_string())).collect()))
        }
    }
}

/// A `[databases]` or `[users]` name as PgBouncer reads it: in double quotes (a double
/// quote inside written twice) it may hold what an SQL identifier may.
fn unquote_name(key: &str) -> String {
    match key.strip_prefix('"').and_then(|k| k.strip_suffix('"')) {
        Some(inner) => inner.replace("\"\"", "\""),
        None => key.to_string(),
    }
}

/// `key=value key='quoted value' ...` as PgBouncer's `[databases]` and `[users]`
/// lines write them (inside single quotes, `''` stands for a quote; a backslash is a
/// backslash, as PgBouncer reads it).
fn pairs(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s.trim();
    while let Some((key, after)) = rest.split_once('=') {
        let after = after.trim_start();
        let (value, next) = match after.strip_prefix('\'') {
            Some(q) => quoted_value(q),
            None => {
                let (v, n) = after.split_once(char::is_whitespace).unwrap_or((after, ""));
                (v.to_string(), n)
            }
        };
        out.push((key.trim().to_ascii_lowercase(), value));
        rest = next.trim_start();
    }
    out
}

/// The value of a single-quoted field whose opening quote is gone, and what follows it.
fn quoted_value(s: &str) -> (String, &str) {
    let mut value = String::new();
    let mut chars = s.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        match c {
            '\'' if chars.peek().is_some_and(|&(_, n)| n == '\'') => {
                chars.next();
                value.push('\'');
            }
            '\'' => return (value, &s[i + 1..]),
            c => value.push(c),
        }
    }
    (value, "")
}

/// A `[databases]` line as a `[databases."NAME"]` table.
fn database(name: &str, conn: &str, line: &str, notes: &mut Vec<String>) -> String {
    let mut settings = Vec::new();
    for (key, value) in pairs(conn) {
        match key.as_str() {
            "reserve_pool" => settings.push(("reserve_pool_size".to_string(), value)),
            // PgBouncer tries the hosts of a list in turn; Sluice takes one.
            "host" if value.contains(',') => {
                let first = value.split(',').next().unwrap_or_default().trim().to_string();
                notes
                    .push(format!("{line}: database {name}: host={value}: host lists are not supported: {first} kept"));
                settings.push((key, first));
            }
            _ => settings.push((key, value)),
        }
    }
    let (mut out, host) = table(("databases", "database", name), settings, line, notes, |key, value| match key {
        "pool_mode" => Ok(Value::String(value.to_ascii_lowercase())),
        "host" | "dbname" | "user" | "password" | "auth_user" | "auth_query" | "auth_dbname" | "client_encoding"
        | "datestyle" | "timezone" | "connect_query" => Ok(Value::String(value.to_string())),
        "port" | "pool_size" | "min_pool_size" | "reserve_pool_size" | "max_db_connections" => integer(value),
        _ => Err("no such database setting in Sluice".to_string()),
    });
    if !host {
        socket_dir_host(&mut out);
    }
    out
}

/// A `[users]` line as a `[users."NAME"]` table.
fn user(name: &str, settings: &str, line: &str, notes: &mut Vec<String>) -> String {
    let (out, _) = table(("users", "user", name), pairs(settings), line, notes, |key, value| match key {
        "pool_mode" => Ok(Value::String(value.to_ascii_lowercase())),
        "pool_size" | "max_user_connections" => integer(value),
        _ => Err("no such user setting in Sluice".to_string()),
    });
    out
}

/// A `[peers]` line as a `[peers."ID"]` table.
fn peer(id: &str, conn: &str, line: &str, notes: &mut Vec<String>) -> String {
    let (mut out, host) = table(("peers", "peer", id), pairs(conn), line, notes, |key, value| match key {
        "host" => Ok(Value::String(value.to_string())),
        "port" | "pool_size" => integer(value),
        _ => Err("no such peer setting in Sluice".to_string()),
    });
    if !host {
        // The directory is this config's own: right only for a peer that shares it.
        notes.push(format!("{line}: peer {id}: no host: PgBouncer's unix_socket_dir of this config is used"));
        socket_dir_host(&mut out);
    }
    out
}

/// What an entry without a host gets: PgBouncer's Unix socket directory (`NO_HOST`).
fn socket_dir_host(out: &mut String) {
    out.push_str("# PgBouncer's default: its Unix socket directory\n");
    out.push_str(NO_HOST);
}

/// The table `[SECTION."NAME"]` of one `[databases]`, `[users]` or `[peers]` line
/// (`(section, what an entry is called in notes, name)`): each setting converted by
/// `value_of`, or kept as a comment with a note; and whether it set `host`.
fn table(
    (section, whose, name): (&str, &str, &str),
    settings: impl IntoIterator<Item = (String, String)>,
    line: &str,
    notes: &mut Vec<String>,
    value_of: impl Fn(&str, &str) -> Result<Value, String>,
) -> (String, bool) {
    let mut out = format!("\n[{section}.{}]\n", Value::String(name.to_string()));
    let (mut host, whose) = (false, format!("{whose} {name}"));
    for (key, value) in settings {
        host |= key == "host";
        entry(&mut out, notes, (line, &whose), (&key, &value), value_of(&key, &value));
    }
    (out, host)
}

fn integer(value: &str) -> Result<Value, String> {
    value.parse().map(Value::Integer).map_err(|_| "not an integer".to_string())
}

/// One setting of a `[databases]` or `[users]` line (`at`: its line and whose it is):
/// converted into `out`, or kept there as a comment with a note saying why.
fn entry(out: &mut String, notes: &mut Vec<String>, at: (&str, &str), kv: (&str, &str), v: Result<Value, String>) {
    let ((line, whose), (key, value)) = (at, kv);
    match v {
        Ok(v) => out.push_str(&format!("{key} = {v}\n")),
        Err(why) => {
            notes.push(format!("{line}: {whose}: {key}={value}: {why}"));
            out.push_str(&format!("# not converted ({why}): {key} = {value}\n"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INI: &str = "\
;; a production-like pgbouncer.ini
[databases]
app = host=db1 port=5433 dbname=app_prod pool_size=40 reserve_pool=5 auth_user=alice
local = dbname=app user=owner password='s3 c''r\\et' pool_size=3
\"my-db\" = host=db2
* = host=db1
[users]
alice = pool_mode=session pool_size=5
[pgbouncer]
listen_addr = 127.0.0.1, ::1
listen_port = 6432
unix_socket_dir = /var/run/postgresql
auth_file = /etc/pgbouncer/userlist.txt
pool_mode = transaction
max_client_conn = 1000
server_reset_query_always = 0
query_wait_timeout = 30
admin_users = postgres, alice
auth_user = postgres
auth_query = SELECT usename, passwd FROM pg_shadow WHERE usename=$1
logfile = /var/log/pgbouncer/pgbouncer.log
client_tls_protocols = secure
tcp_keepidle = 120
tcp_user_timeout = 30000
dns_max_ttl = 30
";

    #[test]
    fn a_pgbouncer_ini_becomes_a_config_sluice_loads() {
        let c = from_pgbouncer_ini(INI).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let userlist = "\"alice\" \"md5abcdefabcdefabcdefabcdefabcdefab\"\n\"postgres\" \"pw\"\n";
        std::fs::write(dir.path().join("userlist.txt"), userlist).unwrap();
        let toml = c.toml.replace("/etc/pgbouncer/userlist.txt", "userlist.txt");
        let cfg = super::super::Config::parse(&toml, &dir.path().join("sluice.toml"))
            .unwrap_or_else(|e| panic!("{e}\n{toml}"));
        let g = &cfg.general;
        assert_eq!(g.listen_addr, vec!["127.0.0.1".to_string(), "::1".to_string()]);
        assert_eq!(
            (g.pool_mode, g.max_client_conn, g.query_wait_timeout),
            (super::super::PoolMode::Transaction, 1000, 30.0)
        );
        assert_eq!((g.auth_type, g.server_reset_query_always), (super::super::AuthType::Md5, false));
        assert_eq!(g.admin_users, vec!["postgres".to_string(), "alice".to_string()]);
        assert_eq!((g.tcp_keepidle, g.tcp_user_timeout, g.dns_max_ttl), (120, 30000, 30.0), "same units");
        let lookups = (g.auth_user.as_str(), g.auth_query.as_str());
        assert_eq!(lookups, ("postgres", "SELECT usename, passwd FROM pg_shadow WHERE usename=$1"));
        let app = &cfg.databases["app"];
        assert_eq!((app.host.as_str(), app.port, app.dbname.as_deref()), ("db1", 5433, Some("app_prod")));
        assert_eq!((app.pool_size, app.reserve_pool_size), (Some(40), Some(5)));
        assert_eq!(app.auth_user.as_deref(), Some("alice"));
        let local = &cfg.databases["local"];
        assert_eq!((local.host.as_str(), local.password.as_deref()), ("/var/run/postgresql", Some("s3 c'r\\et")));
        assert_eq!(local.pool_size, Some(3), "what follows a quoted value is read too");
        assert_eq!(cfg.databases["my-db"].host, "db2", "a quoted name, unquoted");
        assert_eq!(cfg.database("elsewhere").map(|d| d.host.as_str()), Some("db1"), "the `*` fallback");
        assert_eq!(cfg.users["alice"].pool_size, Some(5));
        assert!(cfg.users["alice"].password.is_some(), "from the auth_file");
        // What has no place in Sluice is named, in the notes and in the file.
        for what in ["logfile", "client_tls_protocols"] {
            assert!(c.notes.iter().any(|n| n.contains(what)), "{what}: {:?}", c.notes);
        }
        assert!(toml.contains("# line 21: logfile = /var/log/pgbouncer/pgbouncer.log"), "{toml}");
    }

    #[test]
    fn includes_are_read_in_place_and_named_in_notes() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let (db, more, looped) = (dir.join("db.ini"), dir.join("more.ini"), dir.join("loop.ini"));
        let dbs = format!("[databases]\nother = host=db3\nother = host=db4 port=5433\n%include {}\n", more.display());
        std::fs::write(&db, dbs).unwrap();
        std::fs::write(&more, "[pgbouncer]\nno_such_key = 1\nmax_client_conn = 100\n").unwrap();
        std::fs::write(&looped, format!("%include {}\n", looped.display())).unwrap();
        let ini = format!("[pgbouncer]\nlisten_port = 6433\n%include {}\nmax_client_conn = 7\n", db.display());
        let c = from_pgbouncer_ini(&ini).unwrap();
        // The included file's last section goes on, as in PgBouncer, and what is set
        // again replaces what was set before.
        let cfg = super::super::Config::parse(&c.toml, &dir.join("sluice.toml")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((cfg.general.listen_port, cfg.general.max_client_conn), (6433, 7));
        assert_eq!((cfg.databases["other"].host.as_str(), cfg.databases["other"].port), ("db4", 5433));
        let notes = [
            format!("{} line 2: no_such_key = 1: no such setting in Sluice", more.display()),
            format!(
                "{} line 3: database other set again: this replaces {} line 2 (PgBouncer takes the last)",
                db.display(),
                db.display()
            ),
            format!(
                "line 4: max_client_conn set again: this replaces {} line 3 (PgBouncer takes the last)",
                more.display()
            ),
        ];
        for note in notes {
            assert!(c.notes.contains(&note), "{note} not in {:?}", c.notes);
        }
        let e = from_pgbouncer_ini(&format!("%include {}", looped.display())).err().unwrap();
        assert!(e.contains("line 1: %include") && e.contains("nested more than 10 deep"), "{e}");
        let missing = dir.join("missing.ini");
        let e = from_pgbouncer_ini(&format!("[pgbouncer]\n%include {}", missing.display())).err().unwrap();
        assert!(e.starts_with(&format!("line 2: %include {}: ", missing.display())), "{e}");
    }

    #[test]
    fn pgbouncer_defaults_are_kept_where_sluices_differ() {
        let c = from_pgbouncer_ini("[databases]\napp = host=127.0.0.1\n[pgbouncer]\nauth_type = trust\n").unwrap();
        let cfg = super::super::Config::parse(&c.toml, std::path::Path::new("x.toml")).unwrap();
        assert!(cfg.listen.is_empty(), "PgBouncer listens on no TCP address unless told");
        assert_eq!(cfg.general.auth_type, super::super::AuthType::Trust);
        assert_eq!((cfg.general.tcp_keepidle, cfg.general.listen_backlog), (0, 128));
        let c = from_pgbouncer_ini("[pgbouncer]\nlisten_addr = *\n").unwrap();
        let cfg = super::super::Config::parse(&c.toml, std::path::Path::new("x.toml")).unwrap();
        assert_eq!(cfg.general.auth_type, super::super::AuthType::Md5);
        let loud = from_pgbouncer_ini("[pgbouncer]\nverbose = 2\n").unwrap();
        let cfg = super::super::Config::parse(&loud.toml, std::path::Path::new("x.toml")).unwrap();
        assert_eq!((cfg.general.log_level.as_str(), loud.notes.len()), ("trace", 0), "{:?}", loud.notes);
        let bad = from_pgbouncer_ini("[pgbouncer]\nauth_type = ldap\nmax_client_conn = many\n").unwrap();
        assert_eq!(bad.notes.len(), 2, "{:?}", bad.notes);
        let pam = from_pgbouncer_ini("[pgbouncer]\nauth_type = pam\n").unwrap();
        let cfg = super::super::Config::parse(&pam.toml, std::path::Path::new("x.toml")).unwrap();
        assert_eq!(
            (cfg.general.auth_type, cfg.general.pam_service.as_str()),
            (super::super::AuthType::Pam, "pgbouncer")
        );
        let any =
            from_pgbouncer_ini("[databases]\napp = host=127.0.0.1 user=app\n[pgbouncer]\nauth_type = any\n").unwrap();
        let cfg = super::super::Config::parse(&any.toml, std::path::Path::new("x.toml")).unwrap();
        assert_eq!((cfg.general.auth_type, any.notes.len()), (super::super::AuthType::Any, 0), "{:?}", any.notes);
    }

    #[test]
    fn an_hba_setup_is_kept() {
        let ini = "[pgbouncer]\nauth_type = hba\nauth_hba_file = /etc/pgbouncer/hba.conf\nauth_ident_file = /etc/i\n";
        let c = from_pgbouncer_ini(ini).unwrap();
        let kept = "auth_type = \"hba\"\nauth_hba_file = \"/etc/pgbouncer/hba.conf\"\nauth_ident_file = \"/etc/i\"";
        assert!(c.toml.contains(kept), "{}", c.toml);
        assert!(c.notes.is_empty(), "{:?}", c.notes);
    }

    #[test]
    fn peers_are_carried_over() {
        let ini = "[pgbouncer]\npeer_id = 2\nunix_socket_dir = /run/pgb2\nso_reuseport = 1\n\
                   [peers]\n1 = host=/run/pgb1\n2 = host=10.0.0.2 port=6433 pool_size=4 sslmode=x\n3 =\n";
        let c = from_pgbouncer_ini(ini).unwrap();
        let cfg =
            super::super::Config::parse(&c.toml, std::path::Path::new("x.toml")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((cfg.general.peer_id, cfg.general.so_reuseport), (2, true));
        assert_eq!((cfg.peers[&1].host.as_str(), cfg.peers[&1].port), ("/run/pgb1", 6432));
        let two = &cfg.peers[&2];
        assert_eq!((two.host.as_str(), two.port, two.pool_size), ("10.0.0.2", 6433, Some(4)));
        assert_eq!(cfg.peers[&3].host, "/run/pgb2", "PgBouncer's Unix socket directory");
        let notes = [
            "line 7: peer 2: sslmode=x: no such peer setting in Sluice",
            "line 8: peer 3: no host: \
                      PgBouncer's unix_socket_dir of this config is used",
        ];
        assert_eq!(c.notes, notes);
    }

    /// Integers as PgBouncer reads them (strtol, base 0), the socket mode included, and
    /// user lists split at spaces as well as commas.
    #[test]
    fn integers_and_user_lists_read_as_pgbouncer_reads_them() {
        for (text, n) in [("6432", 6432), ("06432", 3354), ("0x1f", 31), ("-1", -1), ("0", 0), (" 7 ", 7)] {
            assert_eq!(c_integer(text), Some(n), "{text}");
        }
        for text in ["", "0x", "09", "abc", "--1", "1.5"] {
            assert_eq!(c_integer(text), None, "{text}");
        }
        let ini = "[pgbouncer]\nlisten_port = 06432\nunix_socket_mode = 0777\n";
        let c = from_pgbouncer_ini(ini).unwrap();
        let cfg =
            super::super::Config::parse(&c.toml, std::path::Path::new("x.toml")).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((cfg.general.listen_port, cfg.general.unix_socket_mode.as_str()), (3354, "0777"));
        let c = from_pgbouncer_ini("[pgbouncer]\nadmin_users = alice bob,  carol\n").unwrap();
        assert!(c.toml.contains("admin_users = [\"alice\", \"bob\", \"carol\"]"), "{}", c.toml);
        let c = from_pgbouncer_ini("[pgbouncer]\nunix_socket_mode = 511\n").unwrap();
        assert!(c.toml.contains("unix_socket_mode = \"0777\""), "{}", c.toml);
    }

    /// What PgBouncer reads leniently: values of names in any case, a comment after a
    /// section header; a host list keeps its first host (noted), not Sluice's default.
    #[test]
    fn lenient_pgbouncer_spellings_convert() {
        let ini = "[databases] ; the pools\napp = host=db1,db2 pool_mode=Transaction\n\
                   [users]\nalice = pool_mode=SESSION\n\
                   [pgbouncer] # settings\nauth_type = MD5\npool_mode = Statement\nserver_tls_sslmode = Require\n";
        let c = from_pgbouncer_ini(ini).unwrap();
        let cfg = super::super::Config::parse(&c.toml, std::path::Path::new("x.toml"))
            .unwrap_or_else(|e| panic!("{e}\n{}", c.toml));
        let g = &cfg.general;
        assert_eq!(g.auth_type, super::super::AuthType::Md5);
        assert_eq!(g.pool_mode, super::super::PoolMode::Statement);
        assert_eq!(g.server_tls_sslmode, super::super::ServerTlsMode::Require);
        let app = &cfg.databases["app"];
        assert_eq!((app.host.as_str(), app.pool_mode), ("db1", Some(super::super::PoolMode::Transaction)));
        assert_eq!(cfg.users["alice"].pool_mode, Some(super::super::PoolMode::Session));
        assert_eq!(c.notes, ["line 2: database app: host=db1,db2: host lists are not supported: db1 kept"]);
    }
}
