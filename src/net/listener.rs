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
/// `TCP_NODELAY`, `SO_KEEPALIVE`, `TCP_KEEPIDLE`, `TCP_KEEPINTVL`, `TCP_KEEPCNT` and
/// `TCP_USER_TIMEOUT` from the listening socket to each connection it accepts, so they
/// are set once on the listener instead of with system calls per connection (tested:
/// `accepted_connections_inherit_the_listeners_options`); elsewhere they are set on
/// each connection.
const INHERITS_OPTIONS: bool = cfg!(target_os = "linux");

/// The TCP options of client and server connections (`tcp_keepalive`, `tcp_keepidle`,
/// `tcp_keepintvl`, `tcp_keepcnt`, `tcp_user_timeout`); 0 leaves the kernel's value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TcpOptions {
    pub keepalive: bool,
    /// Seconds of silence before the first keepalive probe.
    pub keepidle: u32,
    /// Seconds between probes.
    pub keepintvl: u32,
    /// Probes unanswered before the connection is dropped.
    pub keepcnt: u32,
    /// Milliseconds sent data may stay unacknowledged before the connection is dropped.
    pub user_timeout: u32,
    /// `TCP_DEFER_ACCEPT` (a listening socket's only, Linux): connections wait in the
    /// kernel until their first data comes (`tcp_defer_accept`).
    pub defer_accept: bool,
    /// Bytes of a connection's send and receive buffers, 0 for the kernel's
    /// (`tcp_socket_buffer`). Set on each connection, never on a listening socket: a
    /// size set there cannot be taken back by a reload (the kernel stops sizing the
    /// buffers of every connection it passes the size to).
    pub socket_buffer: u32,
}

/// How long a connection with no data yet waits in the kernel under `TCP_DEFER_ACCEPT`
/// (PgBouncer's value: 1, which Linux turns into about a second, the first SYN-ACK
/// retransmission); after it, it is accepted anyway, and `client_login_timeout` takes
/// over. (A larger value keeps a silent connection out of sight, of SHOW CLIENTS and of
/// the login timeout, for a minute or more.)
#[cfg(target_os = "linux")]
const DEFER_ACCEPT_SECS: libc::c_int = 1;

impl TcpOptions {
    pub fn of(g: &crate::config::General) -> Self {
        TcpOptions {
            keepalive: g.tcp_keepalive,
            keepidle: g.tcp_keepidle,
            keepintvl: g.tcp_keepintvl,
            keepcnt: g.tcp_keepcnt,
            user_timeout: g.tcp_user_timeout,
            defer_accept: g.tcp_defer_accept,
            socket_buffer: g.tcp_socket_buffer,
        }
    }

    /// `apply` on a listening socket, and `TCP_DEFER_ACCEPT` (Linux; set or cleared
    /// whenever the socket is not fresh).
    fn apply_listening(&self, sock: socket2::SockRef<'_>, fresh: bool) {
        #[cfg(target_os = "linux")]
        let fd = std::os::fd::AsRawFd::as_raw_fd(&*sock);
        self.apply(sock, fresh);
        #[cfg(target_os = "linux")]
        if self.defer_accept || !fresh {
            let secs: libc::c_int = if self.defer_accept { DEFER_ACCEPT_SECS } else { 0 };
            let size = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
            let value = (&secs as *const libc::c_int).cast();
            // SAFETY: a valid socket, and an int option given by pointer and size.
            let r = unsafe { libc::setsockopt(fd, libc::IPPROTO_TCP, libc::TCP_DEFER_ACCEPT, value, size) };
            failed(if r == 0 { Ok(()) } else { Err(std::io::Error::last_os_error()) }, fresh);
        }
    }

    /// Sets the buffer sizes on a new connection (best effort; a server connection's
    /// are set before it connects, `ServerAddr::open`).
    pub fn apply_buffers(&self, sock: &socket2::SockRef<'_>) {
        size_buffers(sock, self.socket_buffer);
    }

    /// Sets the options other than the buffer sizes (those a listening socket passes on
    /// to its connections; best effort). A `fresh` socket has the kernel's values: those
    /// left at 0 take no system call. On one set before (a listening socket, at a
    /// reload), a 0 puts the kernel's value back.
    pub fn apply(&self, sock: socket2::SockRef<'_>, fresh: bool) {
        // The value to set: none for a 0 on a fresh socket, the kernel's for a 0 else.
        let value = |v: u32, sysctl: &str| match v {
            0 if fresh => None,
            0 => kernel_default(sysctl),
            v => Some(v),
        };
        let secs = |v: u32| std::time::Duration::from_secs(v.into());
        if self.keepalive {
            let mut k = socket2::TcpKeepalive::new();
            if let Some(t) = value(self.keepidle, "tcp_keepalive_time") {
                k = k.with_time(secs(t));
            }
            if let Some(t) = value(self.keepintvl, "tcp_keepalive_intvl") {
                k = k.with_interval(secs(t));
            }
            if let Some(n) = value(self.keepcnt, "tcp_keepalive_probes") {
                k = k.with_retries(n);
            }
            failed(sock.set_tcp_keepalive(&k), fresh);
        } else if !fresh {
            failed(sock.set_keepalive(false), fresh);
        }
        #[cfg(any(target_os = "linux", target_os = "android"))]
        if self.user_timeout > 0 || !fresh {
            let t = (self.user_timeout > 0).then(|| std::time::Duration::from_millis(self.user_timeout.into()));
            failed(sock.set_tcp_user_timeout(t), fresh);
        }
    }

    /// The options as the reload log names them.
    pub fn describe(&self) -> String {
        let v = |n: u32, unit: &str| if n == 0 { "the kernel's".to_string() } else { format!("{n}{unit}") };
        let mut out = match self.keepalive {
            true => format!(
                "tcp_keepalive on (tcp_keepidle {}, tcp_keepintvl {}, tcp_keepcnt {})",
                v(self.keepidle, " s"),
                v(self.keepintvl, " s"),
                v(self.keepcnt, "")
            ),
            false => "tcp_keepalive off".to_string(),
        };
        if self.user_timeout > 0 {
            out.push_str(&format!(", tcp_user_timeout {} ms", self.user_timeout));
        }
        if self.socket_buffer > 0 {
            out.push_str(&format!(", tcp_socket_buffer {} bytes", self.socket_buffer));
        }
        out.push_str(match (self.defer_accept, cfg!(target_os = "linux")) {
            (true, true) => ", tcp_defer_accept on",
            (true, false) => ", tcp_defer_accept on (ignored: Linux only)",
            (false, _) => ", tcp_defer_accept off",
        });
        out
    }
}

/// Sets a socket's send and receive buffers to `size` bytes (best effort; 0 leaves the
/// kernel's).
pub fn size_buffers(sock: &socket2::SockRef<'_>, size: u32) {
    if size > 0 {
        let _ = sock.set_send_buffer_size(size as usize);
        let _ = sock.set_recv_buffer_size(size as usize);
    }
}

/// A failure to set an option: warned of on a listening socket (a reload then leaves
/// its last value in place); on a new connection it stays best effort.
fn failed(r: std::io::Result<()>, fresh: bool) {
    if let (Err(e), false) = (r, fresh) {
        tracing::warn!("setting the TCP options on a listening socket failed: {e}");
    }
}

/// A `net.ipv4.*` keepalive default of the kernel (Linux), for putting it back (as a
/// fixed value: a socket option cannot be unset), within what the option takes.
fn kernel_default(sysctl: &str) -> Option<u32> {
    let most = if sysctl == "tcp_keepalive_probes" { 127 } else { 32767 };
    let v: u64 = std::fs::read_to_string(format!("/proc/sys/net/ipv4/{sysctl}")).ok()?.trim().parse().ok()?;
    Some(v.min(most) as u32)
}

impl Listener {
    /// Binds a TCP listener with `backlog` (and `SO_REUSEPORT` when `reuse_port`:
    /// `so_reuseport`); accepted connections get `TCP_NODELAY`, and the TCP options
    /// `tcp` (changed later with `set_listener_options`).
    pub fn tcp(ip: IpAddr, port: u16, tcp: TcpOptions, backlog: u32, reuse_port: bool) -> std::io::Result<Self> {
        let addr = SocketAddr::new(ip, port);
        let socket = socket2::Socket::new(
            socket2::Domain::for_address(addr),
            socket2::Type::STREAM,
            Some(socket2::Protocol::TCP),
        )?;
        socket.set_reuse_address(true)?;
        if reuse_port {
            socket.set_reuse_port(true)?;
        }
        if ip.is_ipv6() {
            socket.set_only_v6(true)?;
        }
        socket.set_nonblocking(true)?;
        if INHERITS_OPTIONS {
            socket.set_nodelay(true)?;
            tcp.apply_listening(socket2::SockRef::from(&socket), true);
        }
        socket.bind(&addr.into())?;
        socket.listen(backlog.try_into().unwrap_or(i32::MAX))?;
        Ok(Listener::Tcp(Arc::new(TcpListener::from_std(socket.into())?)))
    }

    /// Binds `<dir>/.s.PGSQL.<port>` with `backlog`, the file's mode `mode` and (when
    /// given) its group `group`, replacing a stale socket file left by a crash.
    pub fn unix(dir: &str, port: u16, mode: u32, group: Option<&str>, backlog: u32) -> std::io::Result<Self> {
        // Looked up before anything is bound: an unknown group leaves no file behind.
        let gid = group.map(crate::os::group_id).transpose()?;
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
        let socket = socket2::Socket::new(socket2::Domain::UNIX, socket2::Type::STREAM, None)?;
        socket.set_nonblocking(true)?;
        socket.bind(&socket2::SockAddr::unix(&path)?)?;
        // Its mode before it listens: no connection is taken under a looser one. A
        // failure from here on leaves no socket file behind (a group the user is not in).
        let listening = || {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode))?;
            if let Some(gid) = gid {
                std::os::unix::fs::chown(&path, None, Some(gid)).map_err(|e| {
                    let group = group.unwrap_or_default();
                    std::io::Error::new(
                        e.kind(),
                        format!("giving the socket the group {group} (unix_socket_group): {e}"),
                    )
                })?;
            }
            socket.listen(backlog.try_into().unwrap_or(i32::MAX))
        };
        if let Err(e) = listening() {
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
        let l = UnixListener::from_std(std::os::unix::net::UnixListener::from(std::os::fd::OwnedFd::from(socket)))?;
        Ok(Listener::Unix(l, path))
    }

    /// The listening TCP socket, for changing its options later (`set_listener_options`).
    pub fn tcp_socket(&self) -> Option<Weak<TcpListener>> {
        match self {
            Listener::Tcp(l) => Some(Arc::downgrade(l)),
            Listener::Unix(..) => None,
        }
    }

    /// Accepts a connection. `tcp` (the TCP options in force) is set on it: the buffer
    /// sizes, and the rest too where accepted connections do not inherit the listening
    /// socket's options.
    pub async fn accept(&self, tcp: impl FnOnce() -> TcpOptions) -> std::io::Result<(Stream, Peer)> {
        match self {
            Listener::Tcp(l) => {
                let (s, addr) = l.accept().await?;
                let (tcp, sock) = (tcp(), socket2::SockRef::from(&s));
                tcp.apply_buffers(&sock);
                if !INHERITS_OPTIONS {
                    let _ = s.set_nodelay(true);
                    tcp.apply(sock, true);
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

/// Gives connections whose handshake completes from now on the TCP options `tcp`
/// (changed by a reload). Linux only: elsewhere `accept` sets them.
pub fn set_listener_options(l: &TcpListener, tcp: &TcpOptions) {
    if INHERITS_OPTIONS {
        tcp.apply_listening(socket2::SockRef::from(l), false);
    }
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

    /// Accepts one connection made after `accept` starts, the listener's options set to
    /// `tcp` first when `reload` (as a reload does); gives its nodelay and its TCP
    /// options as the kernel reports them.
    #[cfg(target_os = "linux")]
    async fn accept_one(l: &Listener, tcp: TcpOptions, reload: bool) -> (bool, TcpOptions) {
        let Listener::Tcp(listener) = l else { panic!("not TCP") };
        let addr = listener.local_addr().unwrap();
        if reload {
            set_listener_options(listener, &tcp);
        }
        let (accepted, client) = tokio::join!(l.accept(|| tcp), tokio::net::TcpStream::connect(addr));
        let _client = client.unwrap();
        let (stream, peer) = accepted.unwrap();
        assert!(matches!(peer, Peer::Tcp(_)));
        let Stream::Tcp(s) = &stream else { panic!("not a TCP stream") };
        let sock = socket2::SockRef::from(s);
        let secs = |d: std::time::Duration| u32::try_from(d.as_secs()).unwrap();
        let got = TcpOptions {
            keepalive: sock.keepalive().unwrap(),
            keepidle: secs(sock.keepalive_time().unwrap()),
            keepintvl: secs(sock.keepalive_interval().unwrap()),
            keepcnt: sock.keepalive_retries().unwrap(),
            user_timeout: sock.tcp_user_timeout().unwrap().map_or(0, |d| d.as_millis() as u32),
            defer_accept: tcp.defer_accept,
            socket_buffer: tcp.socket_buffer,
        };
        (sock.nodelay().unwrap(), got)
    }

    /// The kernel's keepalive values, as a socket reports them when none is set.
    #[cfg(target_os = "linux")]
    fn kernel(keepalive: bool) -> TcpOptions {
        let d = |name| kernel_default(name).unwrap();
        TcpOptions {
            keepalive,
            keepidle: d("tcp_keepalive_time"),
            keepintvl: d("tcp_keepalive_intvl"),
            keepcnt: d("tcp_keepalive_probes"),
            user_timeout: 0,
            defer_accept: false,
            socket_buffer: 0,
        }
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn accepted_connections_inherit_the_listeners_options() {
        let sixty = TcpOptions { keepidle: 60, ..kernel(true) };
        let set =
            TcpOptions { keepalive: true, keepidle: 45, keepintvl: 7, keepcnt: 3, user_timeout: 2500, ..kernel(true) };
        let set_at_start = || TcpOptions { keepidle: 50, keepintvl: 6, keepcnt: 4, user_timeout: 1500, ..set };
        let ip = "127.0.0.1".parse().unwrap();
        // As bound at start-up (no reload yet).
        let l = Listener::tcp(ip, 0, TcpOptions { keepintvl: 0, keepcnt: 0, ..sixty }, 16, false).unwrap();
        assert_eq!(accept_one(&l, sixty, false).await, (true, sixty));
        let bound = Listener::tcp(ip, 0, set_at_start(), 16, false).unwrap();
        assert_eq!(accept_one(&bound, set_at_start(), false).await, (true, set_at_start()));
        // Changed by reloads: each value set, then the kernel's put back, then keepalive off.
        assert_eq!(accept_one(&l, set, true).await, (true, set));
        let zeros = TcpOptions { keepalive: true, keepidle: 0, keepintvl: 0, keepcnt: 0, user_timeout: 0, ..set };
        assert_eq!(accept_one(&l, zeros, true).await, (true, kernel(true)));
        let off = TcpOptions { keepalive: false, ..zeros };
        assert!(!accept_one(&l, off, true).await.1.keepalive);
        assert_eq!(accept_one(&l, set, true).await, (true, set));
        let fresh_off = Listener::tcp(ip, 0, off, 16, false).unwrap();
        assert_eq!(accept_one(&fresh_off, off, false).await, (true, kernel(false)));
    }

    /// `tcp_socket_buffer` sizes each accepted connection's buffers (Linux reports
    /// twice the size asked for), not the listening socket's: a reload back to 0
    /// leaves the next connections sized by the kernel again.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn buffer_sizes_are_set_per_connection() {
        let ip = "127.0.0.1".parse().unwrap();
        let sizes = |s: &Stream| {
            let Stream::Tcp(s) = s else { panic!("not TCP") };
            let sock = socket2::SockRef::from(s);
            (sock.send_buffer_size().unwrap(), sock.recv_buffer_size().unwrap())
        };
        let accept = |l: Listener, tcp: TcpOptions| async move {
            let Listener::Tcp(listener) = &l else { panic!("not TCP") };
            let connect = tokio::net::TcpStream::connect(listener.local_addr().unwrap());
            let (accepted, client) = tokio::join!(l.accept(|| tcp), connect);
            (accepted.unwrap().0, client.unwrap())
        };
        let plain = TcpOptions { defer_accept: false, ..kernel(true) };
        let sized = TcpOptions { socket_buffer: 50_000, ..plain };
        let (kernels, _c) = accept(Listener::tcp(ip, 0, plain, 16, false).unwrap(), plain).await;
        assert_ne!(sizes(&kernels), (100_000, 100_000));
        let (set, _c) = accept(Listener::tcp(ip, 0, sized, 16, false).unwrap(), sized).await;
        assert_eq!(sizes(&set), (100_000, 100_000));
        let (reloaded, _c) = accept(Listener::tcp(ip, 0, sized, 16, false).unwrap(), plain).await;
        assert_eq!(sizes(&reloaded), sizes(&kernels), "the listener passed a size on");
    }

    /// Under `TCP_DEFER_ACCEPT` a connection that has sent nothing is not accepted, and
    /// one that has sent its first bytes is, though it came later; a reload turns it
    /// on and off for the connections that come next.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn deferred_accepts_wait_for_the_first_data() {
        use tokio::io::AsyncWriteExt;
        let on = TcpOptions { defer_accept: true, ..kernel(true) };
        let off = TcpOptions { defer_accept: false, ..on };
        let ip = "127.0.0.1".parse().unwrap();
        let accepted_port = |a: (Stream, Peer)| match a.1 {
            Peer::Tcp(addr) => addr.port(),
            Peer::Unix => panic!("not TCP"),
        };
        let within = std::time::Duration::from_secs(10);
        for (bound, reloaded) in [(on, None), (off, Some(on))] {
            let l = Listener::tcp(ip, 0, bound, 16, false).unwrap();
            let Listener::Tcp(listener) = &l else { panic!("not TCP") };
            if let Some(tcp) = reloaded {
                set_listener_options(listener, &tcp);
            }
            let addr = listener.local_addr().unwrap();
            let _silent = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut talking = tokio::net::TcpStream::connect(addr).await.unwrap();
            talking.write_all(&[0, 0, 0, 8]).await.unwrap();
            let first = tokio::time::timeout(within, l.accept(|| on)).await.expect("not accepted").unwrap();
            assert_eq!(accepted_port(first), talking.local_addr().unwrap().port(), "the silent one first");
        }
        let l = Listener::tcp(ip, 0, on, 16, false).unwrap();
        let Listener::Tcp(listener) = &l else { panic!("not TCP") };
        set_listener_options(listener, &off);
        let silent = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let first = tokio::time::timeout(within, l.accept(|| off)).await.expect("deferred after a reload off").unwrap();
        assert_eq!(accepted_port(first), silent.local_addr().unwrap().port());
    }
}
