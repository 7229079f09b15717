//! The admin console: a virtual database (`admin_database`, default `pgbouncer`, alias
//! `sluice`) that `admin_users` and `stats_users` reach with psql or any driver, over
//! the simple and the extended query protocol. `show` lists, `commands` acts,
//! `config` is SHOW CONFIG and SET, `table` encodes results.

pub mod commands;
mod config;
pub mod show;
mod table;

use std::collections::HashMap;
use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::AsyncReadExt;

use crate::app::{App, Phase};
use crate::client::{ClientConn, Exit};
use crate::config::Config;
use crate::protocol::build::{self, Severity};
use crate::protocol::{Header, MAX_INSPECTED_LEN, TxStatus, body, fe, read_cstr, read_i16, read_i32, sqlstate};
use crate::stats::{ClientInfo, ClientState};
use commands::{AdminError, Command};
use table::{Formats, Table};

/// The database name every config accepts for the console besides `admin_database`
/// (unless a real database has that name).
pub const ALIAS: &str = "sluice";

/// Whether `db` names the admin console.
pub fn is_admin_database(cfg: &Config, db: &str) -> bool {
    db == cfg.general.admin_database || (db == ALIAS && !cfg.databases.contains_key(ALIAS))
}

/// What a console user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// Every command (`admin_users`).
    Admin,
    /// SHOW only (`stats_users`).
    Stats,
}

/// The role of `user` on the console, if any.
pub fn role_of(cfg: &Config, user: &str) -> Option<Role> {
    let g = &cfg.general;
    if g.admin_users.iter().any(|u| u == user) {
        Some(Role::Admin)
    } else if g.stats_users.iter().any(|u| u == user) {
        Some(Role::Stats)
    } else {
        None
    }
}

/// Most prepared statements and portals one console client may hold.
const MAX_NAMED: usize = 100;

struct Portal {
    cmd: Command,
    formats: Formats,
}

/// A logged-in console client.
pub struct AdminSession {
    app: Arc<App>,
    info: Arc<ClientInfo>,
    role: Role,
    statements: HashMap<Vec<u8>, Command>,
    portals: HashMap<Vec<u8>, Portal>,
    /// After an error in the extended protocol: messages are skipped until Sync.
    skipping: bool,
    out: BytesMut,
}

impl AdminSession {
    /// For a client the login has listed in `App::client_infos` already; `run` unlists
    /// it when it leaves.
    pub fn new(app: &Arc<App>, info: Arc<ClientInfo>, role: Role) -> Self {
        info.set_state(ClientState::Active);
        AdminSession {
            app: app.clone(),
            info,
            role,
            statements: HashMap::new(),
            portals: HashMap::new(),
            skipping: false,
            out: BytesMut::new(),
        }
    }

    /// Serves the console until the client leaves.
    pub async fn run(mut self: Box<Self>, conn: &mut ClientConn) -> Exit {
        let exit = self.serve(conn).await;
        self.app.client_infos.remove(self.info.id);
        exit
    }

    async fn serve(&mut self, conn: &mut ClientConn) -> Exit {
        let mut phase = self.app.phase();
        loop {
            while let Some(frame) = match next_frame(&mut conn.buf) {
                Ok(f) => f,
                Err(e) => return e,
            } {
                if let Err(exit) = self.message(conn, &frame).await {
                    return exit;
                }
            }
            if !self.out.is_empty() && conn.stream.send(&self.out).await.is_err() {
                return Exit::Closed;
            }
            self.out.clear();
            tokio::select! {
                r = conn.stream.read_buf(&mut conn.buf) => if matches!(r, Ok(0) | Err(_)) {
                    return Exit::Closed;
                },
                _ = self.info.interrupt.notified() => if self.info.is_killed() {
                    return Exit::killed();
                },
                _ = phase.wait_for(|p| matches!(p, Phase::Draining | Phase::Stopping)) => return Exit::shutting_down(),
            }
        }
    }

    /// Handles one complete frame.
    async fn message(&mut self, conn: &mut ClientConn, frame: &[u8]) -> Result<(), Exit> {
        let tag = frame[0];
        let body = body(frame);
        match tag {
            fe::TERMINATE => return Err(Exit::Terminated),
            fe::SYNC => {
                self.skipping = false;
                build::ready_for_query(&mut self.out, TxStatus::Idle);
                self.flush(conn).await?;
            }
            // After an error in an extended message everything up to the Sync is
            // ignored, a simple Query too (as PostgreSQL does).
            _ if self.skipping => {}
            fe::QUERY => {
                let sql = read_cstr(body).map(|(s, _)| String::from_utf8_lossy(s).into_owned());
                let sql = sql.ok_or_else(|| Exit::protocol("malformed Query message"))?;
                self.simple_query(conn, &sql).await?;
                build::ready_for_query(&mut self.out, TxStatus::Idle);
                self.flush(conn).await?;
            }
            fe::FLUSH => self.flush(conn).await?,
            fe::PARSE | fe::BIND | fe::DESCRIBE | fe::EXECUTE | fe::CLOSE => {
                if let Err(e) = self.extended(conn, tag, body).await? {
                    self.error(&e);
                    self.skipping = true;
                }
                self.flush_if_large(conn).await?;
            }
            fe::COPY_DATA | fe::COPY_DONE | fe::COPY_FAIL => {}
            _ => {
                return Err(Exit::protocol(format!("unsupported message type '{}' on the admin console", tag as char)));
            }
        }
        Ok(())
    }

    /// Answers a command with `e` (logged with `log_pooler_errors`: up to its first
    /// `:` or `'`, as what follows may echo the command, passwords included: `invalid
    /// command 'ALTER ROLE ... PASSWORD ...'`).
    fn error(&mut self, e: &AdminError) {
        if self.app.config.load().general.log_pooler_errors {
            let what = e.message.split([':', '\'']).next().unwrap_or_default().trim_end();
            tracing::warn!(client = self.info.id, "pooler error: {what} ({})", e.code);
        }
        build::error_response(&mut self.out, Severity::Error, e.code, &e.message);
    }

    async fn flush(&mut self, conn: &mut ClientConn) -> Result<(), Exit> {
        let r = conn.stream.send(&self.out).await;
        self.out.clear();
        r.map_err(|_| Exit::Closed)
    }

    /// A Query message: each statement answered in turn; the first error ends it.
    async fn simple_query(&mut self, conn: &mut ClientConn, sql: &str) -> Result<(), Exit> {
        for stmt in commands::statements(sql) {
            let cmd = match commands::parse(stmt).and_then(|c| self.allowed(c)) {
                Ok(c) => c,
                Err(e) => {
                    self.error(&e);
                    return Ok(());
                }
            };
            if let Err(e) = self.execute(conn, &cmd, &Formats::default(), true).await? {
                self.error(&e);
                return Ok(());
            }
            self.flush_if_large(conn).await?;
        }
        Ok(())
    }

    /// Sends what has piled up once it is large, and lets other tasks run: a Query of
    /// many statements (or a pipeline of Executes) is answered as it goes, at the
    /// pace the client reads, instead of whole in memory.
    async fn flush_if_large(&mut self, conn: &mut ClientConn) -> Result<(), Exit> {
        const FLUSH_AT: usize = 64 * 1024;
        if self.out.len() >= FLUSH_AT {
            self.flush(conn).await?;
            tokio::task::yield_now().await;
        }
        Ok(())
    }

    fn allowed(&self, cmd: Command) -> Result<Command, AdminError> {
        if self.role == Role::Stats && !cmd.read_only() {
            return Err(AdminError::new(
                sqlstate::INSUFFICIENT_PRIVILEGE,
                format!("{} needs an admin user (admin_users); stats users may only SHOW", cmd.tag()),
            ));
        }
        Ok(cmd)
    }

    /// Runs a command and writes its result (RowDescription too when `describe`).
    async fn execute(
        &mut self,
        conn: &mut ClientConn,
        cmd: &Command,
        formats: &Formats,
        describe: bool,
    ) -> Result<Result<(), AdminError>, Exit> {
        match cmd {
            Command::Empty => build::empty_query_response(&mut self.out),
            Command::Show(show::Show::Help) => {
                build::notice_response(&mut self.out, commands::HELP);
                build::command_complete(&mut self.out, "SHOW");
            }
            Command::Show(what) => {
                let table = show::table(&self.app, *what);
                if !formats.fits(table.columns.len()) {
                    return Ok(Err(AdminError::new(sqlstate::PROTOCOL_VIOLATION, "result format codes do not fit")));
                }
                if describe {
                    table.describe(&mut self.out, formats);
                }
                table.write_rows(&mut self.out, formats);
                build::command_complete(&mut self.out, "SHOW");
            }
            cmd => {
                // Replies so far go out first: the command may wait (PAUSE, WAIT_CLOSE).
                self.flush(conn).await?;
                let by = self.info.user.clone();
                let app = self.app.clone();
                let run = commands::run(&app, cmd, &by);
                tokio::pin!(run);
                let r = loop {
                    tokio::select! {
                        r = &mut run => break r,
                        // Pipelined input is kept for later; the wait goes on.
                        r = conn.stream.read_buf(&mut conn.buf), if conn.buf.len() < crate::client::WAITING_INPUT_LIMIT => if matches!(r, Ok(0) | Err(_)) {
                            return Err(Exit::Closed);
                        },
                        _ = self.info.interrupt.notified() => if self.info.is_killed() {
                            return Err(Exit::killed());
                        },
                    }
                };
                if let Err(e) = r {
                    return Ok(Err(e));
                }
                build::command_complete(&mut self.out, cmd.tag());
            }
        }
        Ok(Ok(()))
    }

    /// Parse, Bind, Describe, Execute, Close. The outer error ends the connection;
    /// the inner one is reported and skips to Sync.
    async fn extended(&mut self, conn: &mut ClientConn, tag: u8, body: &[u8]) -> Result<Result<(), AdminError>, Exit> {
        let malformed = || Exit::protocol("malformed extended-protocol message");
        match tag {
            fe::PARSE => {
                let (name, rest) = read_cstr(body).ok_or_else(malformed)?;
                let (sql, _) = read_cstr(rest).ok_or_else(malformed)?;
                let cmd = match commands::parse(&String::from_utf8_lossy(sql)).and_then(|c| self.allowed(c)) {
                    Ok(c) => c,
                    Err(e) => return Ok(Err(e)),
                };
                if !name.is_empty() && self.statements.len() >= MAX_NAMED && !self.statements.contains_key(name) {
                    return Ok(Err(AdminError::new(
                        sqlstate::CONFIGURATION_LIMIT_EXCEEDED,
                        "too many prepared statements",
                    )));
                }
                self.statements.insert(name.to_vec(), cmd);
                build::parse_complete(&mut self.out);
            }
            fe::BIND => {
                let (portal, stmt, formats) = parse_bind(body).ok_or_else(malformed)?;
                let Some(cmd) = self.statements.get(stmt).cloned() else {
                    return Ok(Err(no_statement(stmt)));
                };
                if !portal.is_empty() && self.portals.len() >= MAX_NAMED && !self.portals.contains_key(portal) {
                    return Ok(Err(AdminError::new(sqlstate::CONFIGURATION_LIMIT_EXCEEDED, "too many portals")));
                }
                self.portals.insert(portal.to_vec(), Portal { cmd, formats });
                build::bind_complete(&mut self.out);
            }
            fe::DESCRIBE => {
                let (&kind, rest) = body.split_first().ok_or_else(malformed)?;
                let (name, _) = read_cstr(rest).ok_or_else(malformed)?;
                let (cmd, formats) = match kind {
                    b'S' => match self.statements.get(name) {
                        Some(c) => (c.clone(), Formats::default()),
                        None => return Ok(Err(no_statement(name))),
                    },
                    _ => match self.portals.get(name) {
                        Some(p) => (p.cmd.clone(), p.formats.clone()),
                        None => return Ok(Err(AdminError::new(sqlstate::INVALID_CURSOR_NAME, "no such portal"))),
                    },
                };
                if kind == b'S' {
                    build::parameter_description(&mut self.out, &[]);
                }
                self.describe(&cmd, &formats);
            }
            fe::EXECUTE => {
                let (name, _) = read_cstr(body).ok_or_else(malformed)?;
                let Some(p) = self.portals.get(name) else {
                    return Ok(Err(AdminError::new(sqlstate::INVALID_CURSOR_NAME, "no such portal")));
                };
                let (cmd, formats) = (p.cmd.clone(), p.formats.clone());
                if name.is_empty() {
                    self.portals.remove(name);
                }
                return self.execute(conn, &cmd, &formats, false).await;
            }
            _ => {
                let (&kind, rest) = body.split_first().ok_or_else(malformed)?;
                let (name, _) = read_cstr(rest).ok_or_else(malformed)?;
                if kind == b'S' {
                    self.statements.remove(name);
                } else {
                    self.portals.remove(name);
                }
                build::close_complete(&mut self.out);
            }
        }
        Ok(Ok(()))
    }

    /// RowDescription of a SHOW, NoData for everything else.
    fn describe(&mut self, cmd: &Command, formats: &Formats) {
        match cmd {
            Command::Show(what) if *what != show::Show::Help => {
                let table: Table = show::table(&self.app, *what);
                table.describe(&mut self.out, formats);
            }
            _ => build::no_data(&mut self.out),
        }
    }
}

fn no_statement(name: &[u8]) -> AdminError {
    AdminError::new(
        sqlstate::INVALID_SQL_STATEMENT_NAME,
        format!("prepared statement \"{}\" does not exist", String::from_utf8_lossy(name)),
    )
}

/// A Bind's portal name, statement name and result format codes.
fn parse_bind(body: &[u8]) -> Option<(&[u8], &[u8], Formats)> {
    let (portal, rest) = read_cstr(body)?;
    let (stmt, rest) = read_cstr(rest)?;
    let (n, mut rest) = read_i16(rest)?;
    rest = rest.get(2 * usize::try_from(n).ok()?..)?;
    let (params, mut rest) = read_i16(rest)?;
    for _ in 0..params {
        let (len, r) = read_i32(rest)?;
        rest = if len < 0 { r } else { r.get(usize::try_from(len).ok()?..)? };
    }
    let (n, mut rest) = read_i16(rest)?;
    let mut formats = Vec::new();
    for _ in 0..n {
        let (f, r) = read_i16(rest)?;
        formats.push(f);
        rest = r;
    }
    Some((portal, stmt, Formats(formats)))
}

/// Splits off the next complete message, if the buffer holds one.
fn next_frame(buf: &mut BytesMut) -> Result<Option<BytesMut>, Exit> {
    match Header::peek(buf) {
        Err(e) => Err(Exit::protocol(e)),
        Ok(Some(h)) if h.frame_len > MAX_INSPECTED_LEN => {
            Err(Exit::protocol("message too large for the admin console"))
        }
        Ok(Some(h)) if buf.len() >= h.frame_len => {
            let frame = buf.split_to(h.frame_len);
            if buf.is_empty() && buf.capacity() > 64 * 1024 {
                *buf = BytesMut::with_capacity(1024);
            }
            Ok(Some(frame))
        }
        Ok(_) => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bind_is_parsed_without_trusting_lengths() {
        // portal "", statement "s", 1 param format (text), 1 param "x", 1 result format (binary)
        let body = b"\0s\0\0\x01\0\0\0\x01\0\0\0\x01x\0\x01\0\x01";
        let (portal, stmt, f) = parse_bind(body).unwrap();
        assert_eq!((portal, stmt), (&b""[..], &b"s"[..]));
        assert_eq!(f.0, vec![1]);
        assert!(parse_bind(b"\0s\0\0\x01\0\0\0\x01\x7f\xff\xff\xffx").is_none());
        assert!(parse_bind(b"\0s\0\xff\xff").is_none());
        assert!(parse_bind(b"").is_none());
    }

    #[test]
    fn admin_database_and_alias() {
        let cfg = Config::parse("[general]\nauth_type = \"trust\"\n", std::path::Path::new("x.toml")).unwrap();
        assert!(is_admin_database(&cfg, "pgbouncer"));
        assert!(is_admin_database(&cfg, "sluice"));
        assert!(!is_admin_database(&cfg, "app"));
        let cfg =
            Config::parse("[general]\nauth_type = \"trust\"\n[databases.sluice]\n", std::path::Path::new("x.toml"))
                .unwrap();
        assert!(!is_admin_database(&cfg, "sluice"));
    }
}
