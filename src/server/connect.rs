//! Opening a server connection: TCP or Unix socket, TLS when configured (see
//! `tls::negotiate`), StartupMessage, answering the server's authentication request (trust, cleartext, md5, SCRAM-SHA-256), and
//! collecting ParameterStatus and BackendKeyData up to the first ReadyForQuery.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixStream};

use super::dns::HostAddrs;
use super::{ServerConn, ServerError};
use crate::auth::ServerLogin;
use crate::auth::scram::{self, ScramClient, ScramError};
use crate::net::{Stream, read_message};
use crate::protocol::fields::ErrorFields;
use crate::protocol::{ProtocolError, TxStatus, auth_code, be, body, build, read_i32};
use crate::stats::ServerInfo;
use crate::tls::{self, ServerTls};

/// Where a server lives; also what a CancelRequest is sent to. Cloned per server
/// connection and per forwarded cancel, hence the shared host name (whose comparison
/// checks the pointer first).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerAddr {
    /// A host name / IP, or a directory holding the Unix socket when it starts with '/'.
    pub host: Arc<str>,
    pub port: u16,
}

impl ServerAddr {
    /// A socket to the server: its Unix socket, or TCP to `at` (the address a host name
    /// gave a connection: a cancel goes where the connection went) or else to the host,
    /// with buffers of `buffers` bytes (`tcp_socket_buffer`; 0: the kernel's).
    pub async fn open(&self, at: Option<SocketAddr>, buffers: u32) -> std::io::Result<Stream> {
        if self.host.starts_with('/') {
            let path = format!("{}/.s.PGSQL.{}", self.host, self.port);
            return Ok(Stream::Unix(UnixStream::connect(path).await?));
        }
        let s = match (at, buffers) {
            (Some(a), 0) => TcpStream::connect(a).await?,
            (None, 0) => TcpStream::connect((&*self.host, self.port)).await?,
            (at, size) => self.connect_sized(at, size).await?,
        };
        s.set_nodelay(true)?;
        Ok(Stream::Tcp(s))
    }

    /// TCP to `at`, else to the first of the host's addresses that takes it, on a socket
    /// whose buffers are `size` bytes, set before it connects (as the kernel needs for
    /// the window it offers to use them).
    async fn connect_sized(&self, at: Option<SocketAddr>, size: u32) -> std::io::Result<TcpStream> {
        let addrs: Vec<SocketAddr> = match at {
            Some(a) => vec![a],
            None => tokio::net::lookup_host((&*self.host, self.port)).await?.collect(),
        };
        let (s, _) = first_reached(addrs, |a| async move {
            let sock = if a.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
            crate::net::listener::size_buffers(&socket2::SockRef::from(&sock), size);
            sock.connect(a).await
        })
        .await?;
        Ok(s)
    }

    /// Sends a CancelRequest for the given backend key to the server at `at` (see
    /// `open`) and waits until the server has processed it (PostgreSQL closes the
    /// connection once it has signalled the backend), giving up after `limit`
    /// (`cancel_wait_timeout`: a server that cannot be reached would otherwise have the
    /// kernel keep trying to connect for about two minutes).
    pub async fn cancel(
        &self,
        at: Option<SocketAddr>,
        pid: u32,
        secret: u32,
        limit: Option<Duration>,
    ) -> std::io::Result<()> {
        let send = async {
            let mut s = self.open(at, 0).await?;
            let mut out = BytesMut::new();
            build::cancel_request(&mut out, pid, secret);
            s.write_all(&out).await?;
            s.shutdown().await?;
            let mut rest = [0u8; 64];
            while s.read(&mut rest).await? > 0 {}
            Ok(())
        };
        let Some(limit) = limit else { return send.await };
        tokio::time::timeout(limit, send)
            .await
            .unwrap_or_else(|_| Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "no answer from the server")))
    }
}

impl std::fmt::Display for ServerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// Everything needed to open a server connection for a pool.
#[derive(Clone, Debug)]
pub struct ServerTarget {
    pub addr: ServerAddr,
    pub database: String,
    pub user: String,
    /// The TCP options of the connection (`tcp_keepalive`..., as on client
    /// connections), so that a server lost without a reset is noticed.
    pub tcp: crate::net::listener::TcpOptions,
    /// TLS towards the server (`server_tls_*`); used for TCP hosts only.
    pub tls: Arc<ServerTls>,
    /// What the host name resolved to, shared with the other pools naming it; None for
    /// an IP address or a Unix socket directory.
    pub dns: Option<Arc<HostAddrs>>,
    /// How long a lookup of the host name is used (`dns_max_ttl`, and
    /// `dns_nxdomain_ttl` for a failed one).
    pub dns_ttl: super::dns::DnsTtl,
    /// Settings sent in each connection's startup packet after `user` and `database`
    /// (the database's `client_encoding`, `datestyle`, `timezone`): the server's
    /// defaults, which the pool learns as its connections' settings.
    pub params: Vec<(&'static str, String)>,
    /// Run on each new connection before it is lent (the database's `connect_query`).
    pub connect_query: Option<String>,
}

impl ServerTarget {
    /// Whether connections to `other` are interchangeable with this target's: the same
    /// server, database, startup settings and `connect_query` (not necessarily the
    /// same TCP or DNS options).
    pub fn same_sessions(&self, other: &ServerTarget) -> bool {
        self.addr == other.addr
            && self.database == other.database
            && self.params == other.params
            && self.connect_query == other.connect_query
    }

    /// A socket to the server and, for a host name, the address it went to and the
    /// name's epoch then: the first of the name's addresses that accepts.
    async fn open(&self) -> std::io::Result<(Stream, Option<(SocketAddr, u64)>)> {
        let Some(dns) = &self.dns else {
            return Ok((self.addr.open(None, self.tcp.socket_buffer).await?, None));
        };
        let (addrs, epoch) = dns.addrs(self.addr.port, self.dns_ttl).await?;
        let (s, at) = first_reached(addrs, |at| self.addr.open(Some(at), self.tcp.socket_buffer)).await?;
        Ok((s, Some((at, epoch))))
    }

    /// Whether `s` goes to an address its host name no longer has (then it is closed,
    /// not lent again); checked only once the name's epoch has moved on since `s` was
    /// stamped, and `s` is stamped again when its address stays.
    pub fn left_behind(&self, s: &mut ServerConn) -> bool {
        let Some(dns) = &self.dns else { return false };
        let now = dns.epoch();
        if s.dns_epoch == now {
            return false;
        }
        let lost = self.lost(&s.info);
        if !lost {
            s.dns_epoch = now;
        }
        lost
    }

    /// Whether the connection `info` lists went to an address its host name no longer
    /// has, by the name's last answer (SHOW SERVERS close_needed).
    pub fn lost(&self, info: &ServerInfo) -> bool {
        self.dns.as_ref().zip(info.peer()).is_some_and(|(dns, at)| dns.lost(at.ip()))
    }
}

/// The first of `addrs` that `open` reaches, with its address; else the last failure.
async fn first_reached<T, F: Future<Output = std::io::Result<T>>>(
    addrs: impl IntoIterator<Item = SocketAddr>,
    open: impl Fn(SocketAddr) -> F,
) -> std::io::Result<(T, SocketAddr)> {
    let mut failed = None;
    for at in addrs {
        match open(at).await {
            Ok(s) => return Ok((s, at)),
            Err(e) => failed = Some(e),
        }
    }
    Err(failed.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address")))
}

/// Opens and authenticates a server connection within `timeout`, and runs the target's
/// `connect_query` within `bounds` (the pool's for its own queries); `info` lists it (in
/// state `new` until the pool lends it).
pub async fn connect(
    target: &ServerTarget,
    login: &ServerLogin,
    timeout: Option<Duration>,
    bounds: super::QueryBounds,
    info: Arc<ServerInfo>,
) -> Result<Box<ServerConn>, ServerError> {
    let fut = connect_inner(target, login, bounds, info);
    match timeout {
        Some(t) => tokio::time::timeout(t, fut).await.map_err(|_| ServerError::ConnectTimeout)?,
        None => fut.await,
    }
}

async fn connect_inner(
    target: &ServerTarget,
    login: &ServerLogin,
    bounds: super::QueryBounds,
    info: Arc<ServerInfo>,
) -> Result<Box<ServerConn>, ServerError> {
    let (stream, at) = target.open().await?;
    if let Some((at, _)) = at {
        info.set_peer(at);
    }
    // A new socket has the kernel's options: only those set take system calls.
    if let Some(tcp) = stream.tcp() {
        target.tcp.apply(socket2::SockRef::from(tcp), true);
    }
    let stream = tls::negotiate(stream, &target.tls, &target.addr.host).await?;
    let mut conn = Box::new(ServerConn::new(stream, info));
    conn.dns_epoch = at.map_or(0, |(_, epoch)| epoch);
    let mut out = BytesMut::new();
    let mut params = vec![("user", target.user.as_str()), ("database", target.database.as_str())];
    params.extend(target.params.iter().map(|(k, v)| (*k, v.as_str())));
    build::startup_message(&mut out, &params);
    conn.stream.send(&out).await?;
    authenticate(&mut conn, target, login).await?;
    let mut conn = logged_in(conn).await?;
    conn.startup = Arc::new(conn.reported.clone());
    match &target.connect_query {
        Some(query) => run_connect_query(conn, query, bounds).await,
        None => Ok(conn),
    }
}

/// Reads the login reply up to the first ReadyForQuery.
async fn logged_in(mut conn: Box<ServerConn>) -> Result<Box<ServerConn>, ServerError> {
    loop {
        let frame = read_message(&mut conn.stream, &mut conn.buf).await?;
        match frame[0] {
            be::PARAMETER_STATUS => {
                conn.note_parameter(&frame)?;
            }
            be::BACKEND_KEY_DATA => {
                let b = body(&frame);
                let (pid, rest) = read_i32(b).ok_or(ProtocolError::Malformed("BackendKeyData"))?;
                let (secret, _) = read_i32(rest).ok_or(ProtocolError::Malformed("BackendKeyData"))?;
                conn.info.set_cancel_key(pid as u32, secret as u32);
            }
            be::READY_FOR_QUERY => {
                conn.tx = TxStatus::Idle;
                // Idle from the end of its login (`Pool::needs_check`).
                conn.last_used = crate::clock::CoarseInstant::now();
                return Ok(conn);
            }
            be::ERROR_RESPONSE => return Err(ServerError::Server(ErrorFields::parse(body(&frame))?)),
            _ => {} // NoticeResponse, NegotiateProtocolVersion: nothing to do
        }
    }
}

/// Runs the database's `connect_query` on a new connection (within `bounds`, and with
/// the login within `server_connect_timeout`). An ERROR is logged and the connection
/// kept, as in PgBouncer; one left in a transaction (aborted too), or any other failure,
/// fails the connect. The settings the login reported (`startup`) stay the ones the
/// pool learns: a SET of a reported setting in the query is undone before the first
/// loan (the connection counts as carrying it for a client, and the loan applies the
/// client's).
async fn run_connect_query(
    mut conn: Box<ServerConn>,
    query: &str,
    bounds: super::QueryBounds,
) -> Result<Box<ServerConn>, ServerError> {
    match conn.exec(query, bounds).await {
        Err(e) if conn.broken => Err(e),
        _ if conn.tx != TxStatus::Idle => Err(ServerError::ConnectQueryOpen),
        Err(ServerError::Server(e)) => {
            tracing::warn!(server = conn.id, "connect_query failed (the connection is used anyway): {}", e.message);
            Ok(conn)
        }
        ran => ran.map(|()| conn),
    }
}

/// Answers authentication requests until AuthenticationOk.
async fn authenticate(conn: &mut ServerConn, target: &ServerTarget, login: &ServerLogin) -> Result<(), ServerError> {
    let mut scram: Option<ScramClient> = None;
    let mut out = BytesMut::new();
    loop {
        let frame = read_message(&mut conn.stream, &mut conn.buf).await?;
        match frame[0] {
            be::AUTHENTICATION => {}
            be::ERROR_RESPONSE => return Err(ServerError::Server(ErrorFields::parse(body(&frame))?)),
            be::NEGOTIATE_PROTOCOL_VERSION | be::NOTICE_RESPONSE => continue,
            _ => return Err(ProtocolError::Malformed("authentication request").into()),
        }
        let (code, data) = read_i32(body(&frame)).ok_or(ProtocolError::Malformed("Authentication"))?;
        out.clear();
        match code {
            // After SCRAM began, only once the server proved it knows the password
            // (SASLFinal): else anyone between Sluice and PostgreSQL could pose as it.
            auth_code::OK if scram.as_ref().is_some_and(|c| !c.is_done()) => {
                return Err(ScramError::Unfinished.into());
            }
            auth_code::OK => return Ok(()),
            auth_code::CLEARTEXT => {
                let p = login.password.as_deref().ok_or(crate::auth::LoginError::NoPassword("cleartext"))?;
                build::password(&mut out, p.as_bytes());
            }
            auth_code::MD5 => {
                let salt: [u8; 4] =
                    data.get(..4).and_then(|s| s.try_into().ok()).ok_or(ProtocolError::Malformed("MD5 salt"))?;
                build::password(&mut out, login.md5_response(&target.user, salt)?.as_bytes());
            }
            auth_code::SASL => {
                if !sasl_offers(data, scram::SCRAM_SHA_256) {
                    return Err(ServerError::UnsupportedAuth(code));
                }
                let client = ScramClient::new(scram::nonce());
                build::sasl_initial_response(&mut out, scram::SCRAM_SHA_256, &client.client_first());
                scram = Some(client);
            }
            auth_code::SASL_CONTINUE => {
                let client = scram.as_mut().ok_or(ProtocolError::Malformed("SASL continue"))?;
                let (salt, iterations) = client.server_first_params(data)?;
                let keys = login.scram_keys(&salt, iterations).await?;
                let reply = client.handle_server_first(data, |_, _| Ok(keys))?;
                build::sasl_response(&mut out, &reply);
            }
            auth_code::SASL_FINAL => {
                scram.as_mut().ok_or(ProtocolError::Malformed("SASL final"))?.handle_server_final(data)?;
                continue;
            }
            other => return Err(ServerError::UnsupportedAuth(other)),
        }
        conn.stream.send(&out).await?;
    }
}

fn sasl_offers(mut data: &[u8], mechanism: &str) -> bool {
    while let Some((m, rest)) = crate::protocol::read_cstr(data) {
        if m.is_empty() {
            break;
        }
        if m == mechanism.as_bytes() {
            return true;
        }
        data = rest;
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `tcp_socket_buffer` sizes a server connection's buffers (Linux reports twice the
    /// size asked for), to an address or a host; 0 leaves the kernel's.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn server_connections_get_their_buffer_sizes() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let to = listener.local_addr().unwrap();
        let addr = ServerAddr { host: "127.0.0.1".into(), port: to.port() };
        let sizes = |s: &Stream| {
            let sock = socket2::SockRef::from(s.tcp().expect("TCP"));
            (sock.send_buffer_size().unwrap(), sock.recv_buffer_size().unwrap())
        };
        for at in [None, Some(to)] {
            assert_eq!(sizes(&addr.open(at, 50_000).await.unwrap()), (100_000, 100_000));
            assert_ne!(sizes(&addr.open(at, 0).await.unwrap()), (100_000, 100_000));
        }
    }

    /// A server whose listen queue is full drops the connection attempt, which the
    /// kernel would retry for minutes: the cancel gives up at its limit.
    #[tokio::test]
    async fn a_cancel_to_an_unanswering_server_gives_up() {
        let socket = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None).unwrap();
        socket.bind(&std::net::SocketAddr::from(([127, 0, 0, 1], 0)).into()).unwrap();
        socket.listen(0).unwrap();
        let port = socket.local_addr().unwrap().as_socket().unwrap().port();
        // Fill the queue (never accepted); the attempt that finds it full times out.
        let to = std::net::SocketAddr::from(([127, 0, 0, 1], port));
        let short = std::time::Duration::from_millis(200);
        let _held: Vec<_> = (0..2).filter_map(|_| std::net::TcpStream::connect_timeout(&to, short).ok()).collect();
        let addr = ServerAddr { host: "127.0.0.1".into(), port };
        let started = std::time::Instant::now();
        let r = addr.cancel(None, 1, 2, Some(std::time::Duration::from_millis(300))).await;
        assert_eq!(r.map_err(|e| e.kind()), Err(std::io::ErrorKind::TimedOut));
        assert!(started.elapsed() < std::time::Duration::from_secs(5));
    }

    /// Something posing as PostgreSQL (not PostgreSQL: it misbehaves on purpose) that
    /// starts SCRAM and then sends AuthenticationOk without SASLFinal, i.e. without
    /// proving it knows the password, is refused.
    #[tokio::test]
    async fn authentication_ok_without_the_scram_signature_is_refused() {
        use base64::Engine;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let impostor = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.unwrap();
            let body = |len: i32| vec![0u8; len as usize - 4];
            let mut startup = body(s.read_i32().await.unwrap());
            s.read_exact(&mut startup).await.unwrap();
            let mut out = BytesMut::new();
            build::auth_sasl(&mut out, &[scram::SCRAM_SHA_256]);
            s.write_all(&out).await.unwrap();
            assert_eq!(s.read_u8().await.unwrap(), b'p');
            let mut first = body(s.read_i32().await.unwrap());
            s.read_exact(&mut first).await.unwrap();
            let text = String::from_utf8_lossy(&first).into_owned();
            let nonce = text.split("r=").nth(1).expect("a client nonce").to_string();
            let salt = base64::engine::general_purpose::STANDARD.encode(b"any salt");
            out.clear();
            build::auth_sasl_continue(&mut out, format!("r={nonce}more,s={salt},i=4096").as_bytes());
            s.write_all(&out).await.unwrap();
            assert_eq!(s.read_u8().await.unwrap(), b'p');
            let mut last = body(s.read_i32().await.unwrap());
            s.read_exact(&mut last).await.unwrap();
            // AuthenticationOk at once, no SASLFinal; then ReadyForQuery.
            s.write_all(&[b'R', 0, 0, 0, 8, 0, 0, 0, 0, b'Z', 0, 0, 0, 5, b'I']).await.unwrap();
            let mut rest = Vec::new();
            let _ = s.read_to_end(&mut rest).await;
        });
        let target = ServerTarget {
            addr: ServerAddr { host: "127.0.0.1".into(), port },
            database: "d".into(),
            user: "u".into(),
            tcp: crate::net::listener::TcpOptions::of(&Default::default()),
            tls: Arc::new(Default::default()),
            dns: None,
            dns_ttl: Default::default(),
            params: Vec::new(),
            connect_query: None,
        };
        let login = ServerLogin::plain("secret");
        let info = Arc::new(ServerInfo::new(1, target.addr.clone()));
        let r = connect(&target, &login, Some(Duration::from_secs(10)), Default::default(), info).await;
        let e = r.expect_err("the impostor was taken for the server");
        assert!(e.to_string().contains("without its SCRAM signature"), "{e}");
        impostor.await.unwrap();
    }
}
