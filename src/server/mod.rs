//! Server connections: opening and authenticating them (see `connect`), and the
//! connection object a pool lends out: its socket and read buffer, cancel key,
//! reported parameters and the settings last applied for a client.

pub mod connect;
pub mod dns;

use std::sync::Arc;
use std::time::Duration;

use crate::clock::CoarseInstant;

use bytes::BytesMut;

use crate::net::{ReadError, Stream, read_message};
use crate::params::ClientParams;
use crate::protocol::fields::{ErrorFields, parameter_status};
use crate::protocol::{Header, ProtocolError, TxStatus, be, body, build};

pub use connect::{ServerAddr, ServerTarget, connect};

/// Why a server connection failed or was given up.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("server closed the connection unexpectedly")]
    Closed,
    #[error("protocol error from server: {0}")]
    Protocol(#[from] ProtocolError),
    #[error("timed out connecting to the server")]
    ConnectTimeout,
    #[error("server did not answer within internal_query_timeout")]
    InternalTimeout,
    #[error("the database's connect_query left a transaction open")]
    ConnectQueryOpen,
    #[error("{0}")]
    Login(#[from] crate::auth::LoginError),
    #[error("server login failed: {0}")]
    Scram(#[from] crate::auth::scram::ScramError),
    #[error("server requested an unsupported authentication method ({0})")]
    UnsupportedAuth(i32),
    #[error("{}", .0.message)]
    Server(ErrorFields),
    #[error("{0}")]
    Tls(#[from] crate::tls::TlsConnectError),
}

impl From<ReadError> for ServerError {
    fn from(e: ReadError) -> Self {
        match e {
            ReadError::Closed => ServerError::Closed,
            ReadError::Io(e) => ServerError::Io(e),
            ReadError::Protocol(e) => ServerError::Protocol(e),
        }
    }
}

impl ServerError {
    /// The SQLSTATE a client sees for this failure.
    pub fn sqlstate(&self) -> &str {
        use crate::protocol::sqlstate as s;
        match self {
            ServerError::Server(f) if !f.code.is_empty() => &f.code,
            ServerError::ConnectTimeout | ServerError::Tls(_) => s::SQLCLIENT_UNABLE_TO_ESTABLISH,
            ServerError::Login(_) | ServerError::Scram(_) | ServerError::UnsupportedAuth(_) => s::INVALID_AUTHORIZATION,
            _ => s::CONNECTION_FAILURE,
        }
    }
}

/// Bounds of Sluice's own queries on a server: each query's (`internal_query_timeout`),
/// and forwarding the cancel sent for one that runs over it (`cancel_wait_timeout`);
/// None: no limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueryBounds {
    pub query: Option<Duration>,
    pub cancel: Option<Duration>,
}

/// What a `server_reset_query` leaves on a connection. `DISCARD ALL` (the default)
/// leaves no client settings and no prepared statements; `DEALLOCATE ALL` alone leaves
/// the settings as recorded and no statements; any other (`RESET ALL`, from an older
/// PgBouncer setup) leaves what it does not reset, the role after `RESET ALL` say: the
/// settings are unknown (the next loan resets them in full and sets its own), and the
/// statements gone only where it deallocates them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetEffect {
    Everything,
    Statements,
    Unknown { statements: bool },
}

impl ResetEffect {
    pub fn of(query: &str) -> ResetEffect {
        let words: Vec<String> = query
            .split(|c: char| c.is_whitespace() || c == ';')
            .filter(|w| !w.is_empty())
            .map(str::to_ascii_uppercase)
            .collect();
        let words: Vec<&str> = words.iter().map(String::as_str).collect();
        let all =
            |w: &[&str]| w == ["DISCARD", "ALL"] || w == ["DEALLOCATE", "ALL"] || w == ["DEALLOCATE", "PREPARE", "ALL"];
        match words.as_slice() {
            ["DISCARD", "ALL"] => ResetEffect::Everything,
            w if all(w) => ResetEffect::Statements,
            w => ResetEffect::Unknown { statements: (2..=3).any(|n| w.windows(n).any(all)) },
        }
    }
}

/// A row of Sluice's own query: each column's text, None for NULL.
pub type Row = Vec<Option<Vec<u8>>>;

/// One authenticated connection to PostgreSQL.
#[derive(Debug)]
pub struct ServerConn {
    pub id: u64,
    pub stream: Stream,
    /// Bytes read from the server and not yet forwarded.
    pub buf: BytesMut,
    /// Parameters as the server last reported them (server spelling of names).
    pub reported: Vec<(String, String)>,
    /// Parameters as the server reported them at login (before any `connect_query`),
    /// shared by the pool's connections that reported the same
    /// (`Learned::share`): a client told others is given its values
    /// (`ClientSettings`).
    pub startup: Arc<crate::params::ParamList>,
    /// The client settings this connection currently carries; None when unknown
    /// (after a failed SET), which makes the next checkout start with RESET ALL.
    pub applied: Option<ClientParams>,
    pub tx: TxStatus,
    pub created: CoarseInstant,
    pub last_used: CoarseInstant,
    /// Set when the connection must not be reused (protocol state unknown).
    pub broken: bool,
    /// Given back to its pool at least once (lent, or used for a login's round trips).
    pub returned: bool,
    /// Prepared statements this connection holds (pooled modes).
    pub prepared: crate::prepared::ServerStatements,
    /// What the admin console shows of this connection, and where a cancel for it goes:
    /// its address and backend key live there (`addr`, `cancel_key`).
    pub info: Arc<crate::stats::ServerInfo>,
    /// The epoch of its host name's addresses it was last found current at (0 for an IP
    /// address or a Unix socket; `ServerTarget::left_behind`).
    pub dns_epoch: u64,
}

impl ServerConn {
    /// A connection on `stream`, listed for SHOW SERVERS by `info` from the start of its
    /// login.
    pub(crate) fn new(stream: Stream, info: Arc<crate::stats::ServerInfo>) -> Self {
        let now = CoarseInstant::now();
        ServerConn {
            id: info.id,
            info,
            stream,
            buf: BytesMut::with_capacity(16 * 1024),
            reported: Vec::new(),
            startup: Arc::default(),
            applied: Some(ClientParams::default()),
            tx: TxStatus::Idle,
            created: now,
            last_used: now,
            broken: false,
            returned: false,
            prepared: Default::default(),
            dns_epoch: 0,
        }
    }

    /// Where this connection goes.
    pub fn addr(&self) -> &ServerAddr {
        &self.info.addr
    }

    /// The server's backend key (pid, secret), from its BackendKeyData.
    pub fn cancel_key(&self) -> (u32, u32) {
        self.info.cancel_key()
    }

    /// Records a ParameterStatus the server sent.
    pub fn note_parameter(&mut self, frame: &[u8]) -> Result<(String, String), ProtocolError> {
        let (name, value) = parameter_status(body(frame))?;
        let name = String::from_utf8_lossy(name).into_owned();
        let value = String::from_utf8_lossy(value).into_owned();
        match self.reported.iter_mut().find(|(k, _)| *k == name) {
            Some(slot) => slot.1 = value.clone(),
            None => self.reported.push((name.clone(), value.clone())),
        }
        Ok((name, value))
    }

    /// Updates a reported parameter after the relay saw its ParameterStatus.
    pub fn set_reported(&mut self, name: &str, value: &str) {
        match self.reported.iter_mut().find(|(k, _)| k == name) {
            Some(slot) => slot.1 = value.to_string(),
            None => self.reported.push((name.to_string(), value.to_string())),
        }
    }

    pub fn reported(&self, name: &str) -> Option<&str> {
        self.reported.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    /// Runs Sluice's own simple query (SET, DISCARD ALL, ROLLBACK...) and consumes its
    /// whole response. A server's ERROR is returned after the response is drained, so
    /// the connection stays usable; any other failure (lost connection, FATAL, garbled
    /// reply, no answer within `limits.query`) marks it broken, so it is closed rather than
    /// lent again.
    pub async fn exec(&mut self, sql: &str, limits: QueryBounds) -> Result<(), ServerError> {
        let mut out = BytesMut::new();
        build::query(&mut out, sql);
        self.round_trip(&out, None, limits).await
    }

    /// Runs Sluice's own extended-protocol messages (ending with Sync, as an auth_query
    /// lookup's) and gives the last row they returned; `limits` and failures as for
    /// `exec`. (Only the last is kept: a query returning many holds no more memory.)
    pub async fn fetch_last_row(&mut self, messages: &[u8], limits: QueryBounds) -> Result<Option<Row>, ServerError> {
        let mut row = None;
        self.round_trip(messages, Some(&mut row), limits).await?;
        Ok(row)
    }

    async fn round_trip(
        &mut self,
        messages: &[u8],
        rows: Option<&mut Option<Row>>,
        limits: QueryBounds,
    ) -> Result<(), ServerError> {
        let r = match limits.query {
            Some(t) => match tokio::time::timeout(t, self.exec_drained(messages, rows)).await {
                Ok(r) => r,
                Err(_) => {
                    // The query may still run, or wait for a lock, on the server, which
                    // notices the closed connection only when it ends: cancel it.
                    self.cancel_in_background(limits.cancel);
                    Err(ServerError::InternalTimeout)
                }
            },
            None => self.exec_drained(messages, rows).await,
        };
        if let Err(e) = &r
            && !matches!(e, ServerError::Server(f) if !f.is_fatal())
        {
            self.broken = true;
        }
        r
    }

    async fn exec_drained(&mut self, messages: &[u8], mut last: Option<&mut Option<Row>>) -> Result<(), ServerError> {
        // A simple query, or Sluice's own Parse, replaces the server's unnamed statement.
        self.prepared.unnamed = 0;
        self.stream.send(messages).await?;
        let mut error = None;
        loop {
            let frame = read_message(&mut self.stream, &mut self.buf).await?;
            match frame[0] {
                be::READY_FOR_QUERY => {
                    self.tx = TxStatus::from_byte(*frame.get(5).unwrap_or(&0))
                        .ok_or(ProtocolError::Malformed("ReadyForQuery"))?;
                    return match error {
                        Some(e) => Err(ServerError::Server(e)),
                        None => Ok(()),
                    };
                }
                be::PARAMETER_STATUS => {
                    let (name, value) = self.note_parameter(&frame)?;
                    // Changed by Sluice's own query (a ROLLBACK undoing a client's SET
                    // in its transaction): the settings the connection carries follow,
                    // so the next client's are applied again where they differ. Only the
                    // settings clients hold, as in the relay (not `in_hot_standby` or
                    // `is_superuser`, which no SET can give back).
                    if let Some(applied) = self.applied.as_mut().filter(|_| crate::params::is_reported(&name)) {
                        applied.set(&name, &value);
                    }
                }
                be::DATA_ROW => {
                    if let Some(last) = last.as_deref_mut() {
                        let row = crate::protocol::fields::data_row(body(&frame))?;
                        *last = Some(row.into_iter().map(|v| v.map(<[u8]>::to_vec)).collect());
                    }
                }
                be::ERROR_RESPONSE => {
                    let f = ErrorFields::parse(body(&frame))?;
                    if f.is_fatal() {
                        return Err(ServerError::Server(f));
                    }
                    error.get_or_insert(f);
                }
                _ => {}
            }
        }
    }

    /// Sends the server a cancel of whatever it runs, from a task of its own (the
    /// connection is being closed: nothing waits for the answer), giving up after
    /// `limit` (`cancel_wait_timeout`).
    pub fn cancel_in_background(&self, limit: Option<Duration>) {
        tokio::spawn(self.cancel_now(limit));
    }

    /// Sends the server a cancel of whatever it runs, giving up after `limit`; done
    /// once the server has processed it (or the forwarding gave up).
    pub fn cancel_now(&self, limit: Option<Duration>) -> impl Future<Output = ()> + Send + 'static {
        let (addr, at, (pid, secret)) = (self.addr().clone(), self.info.peer(), self.cancel_key());
        async move {
            let _ = addr.cancel(at, pid, secret, limit).await;
        }
    }

    /// A SET or RESET ran on this connection. Settings this server reports
    /// (ParameterStatus; it sent each at login) follow on their own; any other setting
    /// it is recorded as carrying for clients (`statement_timeout` from a client's
    /// `options`, `search_path` before PostgreSQL 18) may have changed unseen, so the
    /// record is dropped: the next loan starts with RESET ALL and sets the client's
    /// settings again.
    pub fn settings_changed(&mut self) {
        if self.applied.as_ref().is_some_and(|a| a.iter().any(|(k, _)| self.reported(k).is_none())) {
            self.applied = None;
        }
    }

    /// Whether this connection already carries the client's settings.
    #[inline]
    pub fn carries_for(&self, client: &crate::params::ClientSettings) -> bool {
        self.carries(&client.kept) && client.told_as(&self.startup)
    }

    /// Whether this connection already carries `want`'s settings.
    pub fn carries(&self, want: &ClientParams) -> bool {
        self.applied.as_ref().is_some_and(|a| want.same(a))
    }

    /// Makes this connection carry `want`'s settings; `limits` as for `exec`. Settings
    /// unknown (`applied` None: a client's SET of a setting PostgreSQL does not report)
    /// are reset first: `RESET ALL` leaves the role and the session authorization
    /// (PostgreSQL's `GUC_NO_RESET_ALL`), so those are reset by name, as DISCARD ALL
    /// does, else a client's `SET ROLE` would pass to the next client.
    pub async fn apply_params(&mut self, want: &ClientParams, limits: QueryBounds) -> Result<(), ServerError> {
        const RESET: &str = "RESET SESSION AUTHORIZATION;RESET ROLE;RESET ALL;";
        // PostgreSQL reads the query in the connection's client_encoding, which may be
        // a client's (LATIN1): values beyond ASCII go as Unicode escapes where the server
        // takes them: a UTF8 database, or another but SQL_ASCII (which converts nothing)
        // from PostgreSQL 13 on.
        let encoding = self.reported("server_encoding").unwrap_or_default();
        let major = self.reported("server_version").and_then(|v| v.split('.').next()?.parse::<u32>().ok());
        let ascii = encoding.eq_ignore_ascii_case("UTF8")
            || (!encoding.eq_ignore_ascii_case("SQL_ASCII") && major.is_some_and(|m| m >= 13));
        let sql = match &self.applied {
            Some(applied) => want.diff_sql(applied, ascii),
            None => Some(format!("{RESET}{}", want.diff_sql(&ClientParams::default(), ascii).unwrap_or_default())),
        };
        if let Some(sql) = sql {
            self.applied = None;
            self.exec(&sql, limits).await?;
        }
        // Even when nothing differed: from now on the check is a pointer comparison.
        self.applied = Some(want.clone());
        Ok(())
    }

    /// A client may have changed the role (`SET ROLE`), which `RESET ALL` leaves: the
    /// next client's settings are applied after a full reset (`apply_params`), also for
    /// a client whose settings it otherwise carries.
    pub fn settings_unknown(&mut self) {
        self.applied = None;
    }

    /// The reset query ran, with `effect` (`ResetEffect::of` the query, worked out once
    /// per pool settings).
    pub fn was_reset(&mut self, effect: ResetEffect) {
        match effect {
            ResetEffect::Everything => self.applied = Some(ClientParams::default()),
            ResetEffect::Statements => {}
            ResetEffect::Unknown { .. } => self.applied = None,
        }
        if matches!(
            effect,
            ResetEffect::Everything | ResetEffect::Statements | ResetEffect::Unknown { statements: true }
        ) {
            self.prepared.clear();
        }
    }

    /// Whether the connection is idle at the protocol level with no transaction open.
    pub fn is_clean(&self) -> bool {
        !self.broken && self.tx == TxStatus::Idle && self.buf.is_empty()
    }

    /// Sends Terminate (best effort, without waiting) and drops the socket.
    pub fn close(mut self) {
        let mut out = BytesMut::new();
        build::terminate(&mut out);
        self.stream.try_send_last(&out);
    }

    /// Peeks at complete frames buffered from the server: used by tests and asserts.
    pub fn buffered_header(&self) -> Option<Header> {
        Header::peek(&self.buf).ok().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::ResetEffect;

    #[test]
    fn reset_queries_are_read_for_what_they_reset() {
        for q in ["DISCARD ALL", "discard all;", " Discard  All ; "] {
            assert_eq!(ResetEffect::of(q), ResetEffect::Everything, "{q}");
        }
        for q in ["DEALLOCATE ALL", "deallocate prepare all"] {
            assert_eq!(ResetEffect::of(q), ResetEffect::Statements, "{q}");
        }
        assert_eq!(ResetEffect::of("RESET ALL"), ResetEffect::Unknown { statements: false });
        assert_eq!(ResetEffect::of("RESET ALL; DEALLOCATE ALL"), ResetEffect::Unknown { statements: true });
        assert_eq!(ResetEffect::of("SELECT 1; DISCARD ALL"), ResetEffect::Unknown { statements: true });
    }
}
