//! Listening sockets: TCP on each configured address and the Unix socket file
//! `.s.PGSQL.<port>` in `unix_socket_dir`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use tokio::net::{TcpListener, UnixListener};

use super::Stream;

/// Where a client connected from, for logs and the admin views.
#[derive(Clone, Debug)]
pub enum Peer {
    Tcp(SocketAddr),
    Unix,
}

impl Peer {
    /// Address and port as the admin console lists them ("unix", 0 for a Unix socket).
    pub fn addr_port(&self) -> (String, u16) {
        match self {
            Peer::Tcp(a) => (a.ip().to_string(), a.port()),
            Peer::Unix => ("unix".to_string(), 0),
        }
    }
}

impl std::fmt::Display for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Peer::Tcp(a) => write!(f, "{a}"),
            Peer::Unix => f.write_str("unix"),
        }
    }
}

/// A listening socket. The TCP one is shared (`tcp_socket`) so a reload can change its
/// options while its accept loop waits.
pub enum Listener {
    Tcp(Arc<TcpListener>),
    Unix(UnixListener, PathBuf),
}

/// Where the options of an accepted TCP connection come from. Linux copies
/// `TCP_NODELAY`, `SO_KEEPALIVE` and `TCP_KEEPIDLE` from the listening socket to each
/// connection it accepts, so they are set once on the listener instead of with three
/// system calls per connection; elsewhere they are set on each connection.
const INHERITS_OPTIONS: bool = cfg!(target_os = "linux");

/// Idle time before the first keepalive probe on client connections.
const KEEPALIVE_IDLE: std::time::Duration = std::time::Duration::from_secs(60);

impl Listener {
    /// Binds a TCP listener; accepted connections get `TCP_NODELAY`, and keepalive as
    /// `keepalive` says (changed later with `set_listener_keepalive`).
    pub fn tcp(ip: IpAddr, port: u16, keepalive: bool) -> std::io::Result<Self> {
        let addr = SocketAddr::new(ip, port);
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        if ip.is_ipv6() {
            socket.set_only_v6(true)?;
        }
        socket.set_nonblocking(true)?;
        if INHERITS_OPTIONS {
            socket.set_nodelay(true)?;
            set_keepalive(socket2::SockRef::from(&socket), keepalive);
        }
        socket.bind(&addr.into())?;
        socket.listen(4096)?;
        Ok(Listener::Tcp(Arc::new(TcpListener::from_std(socket.into())?)))
    }

    /// Binds `<dir>/.s.PGSQL.<port>`, replacing a stale socket file left by a crash.
    pub fn unix(dir: &str, port: u16, mode: u32) -> std::io::Result<Self> {
        let path = PathBuf::from(dir).join(format!(".s.PGSQL.{port}"));
        if path.exists() {
            if std::os::unix::net::UnixStream::connect(&path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("{} is in use by another process", path.display()),
                ));
            }
            std::fs::remove_file(&path)?;
        }
        let l = UnixListener::bind(&path)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
        Ok(Listener::Unix(l, path))
    }

    /// The listening TCP socket, for changing its options later (`set_listener_keepalive`).
    pub fn tcp_socket(&self) -> Option<Weak<TcpListener>> {
        match self {
            Listener::Tcp(l) => Some(Arc::downgrade(l)),
            Listener::Unix(..) => None,
        }
    }

    /// Accepts a connection. `keepalive` (the `tcp_keepalive` setting, asked only where
    /// accepted connections do not inherit the listening socket's options) is set on it.
    pub async fn accept(&self, keepalive: impl FnOnce() -> bool) -> std::io::Result<(Stream, Peer)> {
        match self {
            Listener::Tcp(l) => {
                let (s, addr) = l.accept().await?;
                if !INHERITS_OPTIONS {
                    let _ = s.set_nodelay(true);
                    if keepalive() {
                        set_keepalive(socket2::SockRef::from(&s), true);
                    }
                }
                Ok((Stream::Tcp(s), Peer::Tcp(addr)))
            }
            Listener::Unix(l, _) => {
                let (s, _) = l.accept().await?;
                Ok((Stream::Unix(s), Peer::Unix))
            }
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Listener::Tcp(l) => l.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            Listener::Unix(_, p) => p.display().to_string(),
        }
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Listener::Unix(_, path) = self {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Makes connections whose handshake completes from now on carry TCP keepalive or not
/// (`tcp_keepalive` changed by a reload). Linux only: elsewhere `accept` sets it.
pub fn set_listener_keepalive(l: &TcpListener, on: bool) {
    if INHERITS_OPTIONS {
        set_keepalive(socket2::SockRef::from(l), on);
    }
}

/// Turns TCP keepalive on (first probe after `KEEPALIVE_IDLE`) or off on a socket
/// (best effort).
pub fn set_keepalive(sock: socket2::SockRef<'_>, on: bool) {
    let _ = if on {
        sock.set_tcp_keepalive(&socket2::TcpKeepalive::new().with_time(KEEPALIVE_IDLE))
    } else {
        sock.set_keepalive(false)
    };
}

/// Failed accepts (EMFILE and the like come many times a second while they last): one
/// warning per `LOG_EVERY` saying how many failed since the last, and a pause before
/// the next try instead of a spin.
#[derive(Debug, Default)]
pub struct AcceptFailures {
    logged_at: Option<std::time::Instant>,
    unlogged: u64,
}

impl AcceptFailures {
    const LOG_EVERY: std::time::Duration = std::time::Duration::from_secs(10);
    const BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

    /// Logs `e` (for `what`, a listener) if it is time to, then waits `BACKOFF`.
    pub async fn failed(&mut self, what: &str, e: &std::io::Error) {
        if let Some(line) = self.note(e, std::time::Instant::now()) {
            tracing::warn!("{what}: {line}");
        }
        tokio::time::sleep(Self::BACKOFF).await;
    }

    /// Counts a failure at `now`; the line to log, when the last was `LOG_EVERY` ago.
    fn note(&mut self, e: &std::io::Error, now: std::time::Instant) -> Option<String> {
        self.unlogged += 1;
        if self.logged_at.is_some_and(|t| now.duration_since(t) < Self::LOG_EVERY) {
            return None;
        }
        self.logged_at = Some(now);
        Some(match std::mem::take(&mut self.unlogged) {
            1 => format!("accept failed: {e}"),
            n => format!("accept failed: {e} ({n} failures since the last warning)"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_accepts_are_logged_once_per_interval_with_a_count() {
        let e = std::io::Error::from_raw_os_error(libc::EMFILE);
        let mut f = AcceptFailures::default();
        let t0 = std::time::Instant::now();
        let first = f.note(&e, t0).expect("the first failure is logged");
        assert!(first.starts_with("accept failed: ") && !first.contains("since"), "{first}");
        // ~20 a second (the back-off): none logged until the interval has passed.
        let step = AcceptFailures::BACKOFF;
        let mut at = t0;
        for _ in 0..(AcceptFailures::LOG_EVERY.as_millis() / step.as_millis() - 1) {
            at += step;
            assert_eq!(f.note(&e, at), None);
        }
        at += step;
        let next = f.note(&e, at).expect("logged again after LOG_EVERY");
        assert!(next.ends_with("(200 failures since the last warning)"), "{next}");
        assert_eq!(f.note(&e, at + step), None);
    }

    /// Accepts one connection made after `accept` starts; gives its socket options
    /// (nodelay, keepalive, idle time before the first probe when on).
    async fn accept_one(l: &Listener, keepalive: bool) -> (bool, bool, Option<std::time::Duration>) {
        let Listener::Tcp(tcp) = l else { panic!("not TCP") };
        let addr = tcp.local_addr().unwrap();
        set_listener_keepalive(tcp, keepalive);
        let (accepted, client) = tokio::join!(l.accept(|| keepalive), tokio::net::TcpStream::connect(addr));
        let _client = client.unwrap();
        let (stream, peer) = accepted.unwrap();
        assert!(matches!(peer, Peer::Tcp(_)));
        let Stream::Tcp(s) = &stream else { panic!("not a TCP stream") };
        let sock = socket2::SockRef::from(s);
        let on = sock.keepalive().unwrap();
        (sock.nodelay().unwrap(), on, on.then(|| sock.keepalive_time().unwrap()))
    }

    #[tokio::test]
    async fn accepted_connections_get_nodelay_and_keepalive_as_configured() {
        let l = Listener::tcp("127.0.0.1".parse().unwrap(), 0, true).unwrap();
        assert_eq!(accept_one(&l, true).await, (true, true, Some(KEEPALIVE_IDLE)));
        // tcp_keepalive turned off by a reload, then on again.
        assert_eq!(accept_one(&l, false).await, (true, false, None));
        assert_eq!(accept_one(&l, true).await, (true, true, Some(KEEPALIVE_IDLE)));
        let off = Listener::tcp("127.0.0.1".parse().unwrap(), 0, false).unwrap();
        assert_eq!(accept_one(&off, false).await, (true, false, None));
    }
}
