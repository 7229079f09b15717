//! The console's commands: parsing a statement into a [`Command`] (no side effects,
//! so Describe can look at it), and running it with PgBouncer's semantics.

use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use tracing::info;

use super::show::Show;
use crate::app::{App, Phase};
use crate::protocol::sqlstate;

/// How SHUTDOWN ends Sluice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// At once (SIGINT).
    Now,
    /// Stop accepting; close each client when its transaction ends (SIGTERM).
    WaitForServers,
    /// Stop accepting; exit when the clients have left by themselves.
    WaitForClients,
}

/// A parsed console statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Empty,
    Show(Show),
    Pause(Option<String>),
    Resume(Option<String>),
    Reconnect(Option<String>),
    Kill(Option<String>),
    KillClient(u64),
    Disable(String),
    Enable(String),
    WaitClose(Option<String>),
    Suspend,
    Reload,
    Set {
        key: String,
        value: String,
    },
    /// SET of a session parameter drivers send on connect (`application_name`...):
    /// accepted and ignored, as the console has no session state.
    SessionSet,
    Shutdown(Shutdown),
}

/// Session parameters drivers set on connect; not config keys.
const SESSION_PARAMS: [&str; 10] = [
    "application_name",
    "client_encoding",
    "datestyle",
    "timezone",
    "intervalstyle",
    "extra_float_digits",
    "search_path",
    "statement_timeout",
    "lock_timeout",
    "standard_conforming_strings",
];

fn is_session_param(key: &str) -> bool {
    SESSION_PARAMS.iter().any(|p| p.eq_ignore_ascii_case(key))
}

/// An error the console reports to its client (ErrorResponse, the session goes on).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdminError {
    pub code: &'static str,
    pub message: String,
}

impl AdminError {
    pub fn new(code: &'static str, message: impl Into<String>) -> Self {
        AdminError { code, message: message.into() }
    }
}

/// A TLS setup SET's new value cannot load (`App::change_config`): an invalid value.
impl From<crate::app::UnusableTls> for AdminError {
    fn from(e: crate::app::UnusableTls) -> Self {
        AdminError::new(sqlstate::INVALID_PARAMETER_VALUE, e.0)
    }
}

fn syntax(msg: impl Into<String>) -> AdminError {
    AdminError::new(sqlstate::SYNTAX_ERROR, msg)
}

/// Splits a statement into words: whitespace separates, `'...'` and `"..."` quote
/// (doubled quotes escape), `=` stands alone.
fn words(sql: &str) -> Result<Vec<String>, AdminError> {
    let mut out = Vec::new();
    let mut chars = sql.chars().peekable();
    while let Some(&c) = chars.peek() {
        if c.is_whitespace() {
            chars.next();
        } else if c == '=' {
            chars.next();
            out.push("=".to_string());
        } else if c == '\'' || c == '"' {
            chars.next();
            let mut w = String::new();
            loop {
                match chars.next() {
                    Some(q) if q == c && chars.peek() == Some(&c) => {
                        chars.next();
                        w.push(c);
                    }
                    Some(q) if q == c => break,
                    Some(x) => w.push(x),
                    None => return Err(syntax("unterminated quoted string")),
                }
            }
            out.push(w);
        } else {
            let mut w = String::new();
            while let Some(&x) = chars.peek() {
                if x.is_whitespace() || x == '=' {
                    break;
                }
                w.push(x);
                chars.next();
            }
            out.push(w);
        }
    }
    Ok(out)
}

/// Splits a Query message's text into statements at `;` outside quotes.
pub fn statements(sql: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut quote) = (0, None);
    for (i, c) in sql.char_indices() {
        match (c, quote) {
            ('\'' | '"', None) => quote = Some(c),
            (c, Some(q)) if c == q => quote = None,
            (';', None) => {
                out.push(&sql[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&sql[start..]);
    let all_empty = out.iter().all(|s| s.trim().is_empty());
    out.retain(|s| !s.trim().is_empty());
    if all_empty { vec![""] } else { out }
}

/// Parses one statement.
pub fn parse(sql: &str) -> Result<Command, AdminError> {
    let sql = sql.trim().trim_end_matches(';').trim();
    let w = words(sql)?;
    let Some(verb) = w.first() else { return Ok(Command::Empty) };
    let verb = verb.to_ascii_uppercase();
    let arg = w.get(1).cloned();
    let at_most = |n: usize| {
        if w.len() > n { Err(syntax(format!("too many arguments to {verb}"))) } else { Ok(()) }
    };
    let cmd = match verb.as_str() {
        "SHOW" => {
            at_most(2)?;
            let what = arg.ok_or_else(|| syntax("SHOW what? Try SHOW HELP"))?;
            Command::Show(Show::parse(&what).ok_or_else(|| syntax(format!("unknown SHOW item: {what}")))?)
        }
        "PAUSE" => at_most(2).map(|_| Command::Pause(arg))?,
        "RESUME" => at_most(2).map(|_| Command::Resume(arg))?,
        "RECONNECT" => at_most(2).map(|_| Command::Reconnect(arg))?,
        "KILL" => at_most(2).map(|_| Command::Kill(arg))?,
        "WAIT_CLOSE" => at_most(2).map(|_| Command::WaitClose(arg))?,
        "KILL_CLIENT" => {
            at_most(2)?;
            let id = arg.ok_or_else(|| syntax("KILL_CLIENT needs a client id (SHOW CLIENTS)"))?;
            Command::KillClient(id.parse().map_err(|_| syntax(format!("invalid client id: {id}")))?)
        }
        "DISABLE" | "ENABLE" => {
            at_most(2)?;
            let db = arg.ok_or_else(|| syntax(format!("{verb} needs a database name")))?;
            if verb == "DISABLE" { Command::Disable(db) } else { Command::Enable(db) }
        }
        "SUSPEND" => at_most(1).map(|_| Command::Suspend)?,
        "RELOAD" => at_most(1).map(|_| Command::Reload)?,
        "SHUTDOWN" => {
            at_most(2)?;
            match arg.map(|a| a.to_ascii_uppercase()).as_deref() {
                None => Command::Shutdown(Shutdown::Now),
                Some("WAIT_FOR_SERVERS") => Command::Shutdown(Shutdown::WaitForServers),
                Some("WAIT_FOR_CLIENTS") => Command::Shutdown(Shutdown::WaitForClients),
                Some(a) => return Err(syntax(format!("unknown SHUTDOWN mode: {a}"))),
            }
        }
        "SET" => match w.as_slice() {
            [_, key, eq, _] if (eq == "=" || eq.eq_ignore_ascii_case("to")) && is_session_param(key) => {
                Command::SessionSet
            }
            [_, key, eq, value] if eq == "=" || eq.eq_ignore_ascii_case("to") => {
                Command::Set { key: key.clone(), value: value.clone() }
            }
            _ => return Err(syntax("usage: SET key = value")),
        },
        _ => return Err(syntax(format!("invalid command '{sql}', use SHOW HELP;"))),
    };
    Ok(cmd)
}

impl Command {
    /// Whether stats users may run it (read-only).
    pub fn read_only(&self) -> bool {
        matches!(self, Command::Show(_) | Command::Empty | Command::SessionSet)
    }

    /// The CommandComplete tag.
    pub fn tag(&self) -> &'static str {
        match self {
            Command::Empty => "",
            Command::Show(_) => "SHOW",
            Command::Pause(_) => "PAUSE",
            Command::Resume(_) => "RESUME",
            Command::Reconnect(_) => "RECONNECT",
            Command::Kill(_) => "KILL",
            Command::KillClient(_) => "KILL_CLIENT",
            Command::Disable(_) => "DISABLE",
            Command::Enable(_) => "ENABLE",
            Command::WaitClose(_) => "WAIT_CLOSE",
            Command::Suspend => "SUSPEND",
            Command::Reload => "RELOAD",
            Command::Set { .. } | Command::SessionSet => "SET",
            Command::Shutdown(_) => "SHUTDOWN",
        }
    }
}

/// The help text of SHOW HELP.
pub const HELP: &str = "Console usage
\tSHOW HELP|CONFIG|DATABASES|POOLS|CLIENTS|SERVERS|USERS|VERSION
\tSHOW STATS|STATS_TOTALS|STATS_AVERAGES|TOTALS|LISTS|STATE|MEM
\tSHOW PREPARED_STATEMENTS|LATENCY|DNS_HOSTS|DNS_ZONES|PEERS|PEER_POOLS
\tSET key = arg
\tRELOAD
\tPAUSE [<db>]
\tRESUME [<db>]
\tDISABLE <db>
\tENABLE <db>
\tRECONNECT [<db>]
\tKILL [<db>]
\tKILL_CLIENT <client_id>
\tSUSPEND (not supported by Sluice: use PAUSE)
\tSHUTDOWN [WAIT_FOR_SERVERS|WAIT_FOR_CLIENTS]
\tWAIT_CLOSE [<db>]";

/// Checks that a named database is configured: an entry of its own, or one the fallback
/// entry serves. As in PgBouncer, PAUSE, KILL, DISABLE, RECONNECT and WAIT_CLOSE take
/// any name the fallback serves (`ahead`: so a database can be paused or disabled before
/// its first client), RESUME and ENABLE only one it serves now (with a pool, or paused
/// or disabled by name). Never the console's own database (which the fallback would
/// otherwise seem to serve: no entry may take its name).
fn known(app: &App, db: &Option<String>, ahead: bool) -> Result<(), AdminError> {
    let Some(d) = db else { return Ok(()) };
    let cfg = app.config.load();
    if crate::admin::is_admin_database(&cfg, d) {
        let e = format!("not for the admin console's own database: {d}");
        return Err(AdminError::new(sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE, e));
    }
    let served = || ahead || !app.pools.of(Some(d)).is_empty() || app.pools.flagged().contains(d);
    let listed = cfg.databases.contains_key(d) && d != crate::config::FALLBACK_DATABASE;
    if listed || (cfg.is_fallback_served(d) && served()) {
        return Ok(());
    }
    Err(AdminError::new(sqlstate::UNDEFINED_OBJECT, format!("no such database: {d}")))
}

/// Runs a command that is not a SHOW. Waiting commands (PAUSE, WAIT_CLOSE) return
/// when done; the caller races them against the client leaving.
pub async fn run(app: &Arc<App>, cmd: &Command, by: &str) -> Result<(), AdminError> {
    match cmd {
        Command::Empty | Command::Show(_) | Command::SessionSet => Ok(()),
        Command::Pause(db) => {
            known(app, db, true)?;
            info!(by, database = db.as_deref().unwrap_or("*"), "admin: PAUSE");
            app.pools.pause(db.as_deref());
            for p in app.pools.of(db.as_deref()) {
                p.wait_until(|p| p.counts().total == 0 || !p.is_paused()).await;
                if !p.is_paused() {
                    // (A closed pool is unpaused too: a reload removed it, say.)
                    let message = match p.closed_why() {
                        Some(why) => format!("PAUSE ended before it completed: {why}"),
                        None => "PAUSE ended by RESUME before it completed".into(),
                    };
                    return Err(AdminError::new(sqlstate::QUERY_CANCELED, message));
                }
            }
            Ok(())
        }
        Command::Resume(db) => {
            known(app, db, false)?;
            info!(by, database = db.as_deref().unwrap_or("*"), "admin: RESUME");
            app.pools.resume(db.as_deref()).map_err(|e| {
                let db = db.as_deref().unwrap_or_default();
                let message = match e.all {
                    true => format!("database {db} is not paused on its own: everything is (RESUME without a name)"),
                    false => format!("database {db} is not paused"),
                };
                AdminError::new(sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE, message)
            })
        }
        Command::Reconnect(db) => {
            known(app, db, true)?;
            info!(by, database = db.as_deref().unwrap_or("*"), "admin: RECONNECT");
            app.pools.of(db.as_deref()).iter().for_each(|p| p.reconnect());
            if app.config.load().general.server_fast_close {
                // Session-mode clients idle with a marked server end now, not at their
                // next transaction's end (`Session::fast_close`).
                let linked = app.client_infos.list().into_iter().filter(|c| c.server_id.load(Relaxed) != 0);
                linked.filter(|c| db.as_deref().is_none_or(|d| c.database == d)).for_each(|c| c.wake());
            }
            Ok(())
        }
        Command::Kill(db) => {
            known(app, db, true)?;
            info!(by, database = db.as_deref().unwrap_or("*"), "admin: KILL");
            kill(app, db.as_deref());
            Ok(())
        }
        Command::KillClient(id) => {
            let c = app.client_infos.get(*id).ok_or_else(|| {
                AdminError::new(sqlstate::UNDEFINED_OBJECT, format!("no such client: {id} (see SHOW CLIENTS)"))
            })?;
            info!(by, client = id, user = %c.user, database = %c.database, "admin: KILL_CLIENT");
            c.kill();
            Ok(())
        }
        Command::Disable(db) | Command::Enable(db) => {
            let disable = matches!(cmd, Command::Disable(_));
            known(app, &Some(db.clone()), disable)?;
            info!(by, database = %db, "admin: {}", cmd.tag());
            app.pools.set_disabled(db, disable);
            Ok(())
        }
        Command::WaitClose(db) => {
            known(app, db, true)?;
            for p in app.pools.of(db.as_deref()) {
                p.wait_until(|p| p.marked_count() == 0).await;
            }
            Ok(())
        }
        Command::Suspend => Err(AdminError::new(
            sqlstate::FEATURE_NOT_SUPPORTED,
            "SUSPEND is not supported: Sluice cannot hand its sockets to another process; use PAUSE, restart, RESUME",
        )),
        Command::Reload => {
            info!(by, "admin: RELOAD");
            app.reload().map_err(|e| AdminError::new(sqlstate::CONFIG_FILE_ERROR, e))
        }
        Command::Set { key, value } => {
            app.change_config(|cfg| super::config::set(cfg, key, value))?;
            info!(by, key, value, "admin: SET");
            Ok(())
        }
        Command::Shutdown(mode) => {
            info!(by, "admin: SHUTDOWN {mode:?}");
            app.set_phase(match mode {
                Shutdown::Now => Phase::Stopping,
                Shutdown::WaitForServers => Phase::Draining,
                Shutdown::WaitForClients => Phase::Quiescing,
            });
            Ok(())
        }
    }
}

/// KILL: ends the database's clients (or every non-admin client) and closes its
/// server connections; the database stays paused until RESUME, as in PgBouncer.
fn kill(app: &App, db: Option<&str>) {
    app.pools.pause(db);
    for c in app.client_infos.list() {
        if !c.console && db.is_none_or(|d| c.database == d) {
            c.kill();
        }
    }
    app.pools.of(db).iter().for_each(|p| p.reconnect());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_commands() {
        assert_eq!(parse("show pools;").unwrap(), Command::Show(Show::Pools));
        assert_eq!(parse("  SHOW   stats_averages ").unwrap(), Command::Show(Show::StatsAverages));
        assert_eq!(parse("PAUSE").unwrap(), Command::Pause(None));
        assert_eq!(parse("pause \"app\"").unwrap(), Command::Pause(Some("app".into())));
        assert_eq!(parse("kill_client 42").unwrap(), Command::KillClient(42));
        assert_eq!(
            parse("SET default_pool_size = '5'").unwrap(),
            Command::Set { key: "default_pool_size".into(), value: "5".into() }
        );
        assert_eq!(parse("set x=y").unwrap(), Command::Set { key: "x".into(), value: "y".into() });
        assert_eq!(parse("SET x TO 'it''s'").unwrap(), Command::Set { key: "x".into(), value: "it's".into() });
        assert_eq!(parse("shutdown wait_for_clients").unwrap(), Command::Shutdown(Shutdown::WaitForClients));
        assert_eq!(parse("").unwrap(), Command::Empty);
        assert_eq!(parse("SET application_name = 'psql'").unwrap(), Command::SessionSet);
        assert!(parse("SET extra_float_digits TO 3").unwrap().read_only());
        assert!(parse("select 1").is_err());
        assert!(parse("show").is_err());
        assert!(parse("show nope").is_err());
        assert!(parse("kill_client x").is_err());
        assert!(parse("pause a b").is_err());
        assert!(parse("set x = 'open").is_err());
        assert!(parse("disable").is_err());
    }

    #[test]
    fn splits_statements() {
        assert_eq!(statements("show pools; show stats;"), vec!["show pools", " show stats"]);
        assert_eq!(statements("set a = 'x;y'"), vec!["set a = 'x;y'"]);
        assert_eq!(statements(" ; "), vec![""]);
    }

    #[test]
    fn only_show_is_read_only() {
        assert!(parse("show clients").unwrap().read_only());
        assert!(!parse("pause").unwrap().read_only());
        assert!(!parse("set a = b").unwrap().read_only());
    }
}
