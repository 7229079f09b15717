//! Listening sockets: TCP on each configured address and the Unix socket file
//! `.s.PGSQL.<port>` in `unix_socket_dir`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

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

pub enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener, PathBuf),
}

impl Listener {
    pub fn tcp(ip: IpAddr, port: u16) -> std::io::Result<Self> {
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
        socket.bind(&addr.into())?;
        socket.listen(4096)?;
        Ok(Listener::Tcp(TcpListener::from_std(socket.into())?))
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

    pub async fn accept(&self) -> std::io::Result<(Stream, Peer)> {
        match self {
            Listener::Tcp(l) => {
                let (s, addr) = l.accept().await?;
                let _ = s.set_nodelay(true);
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

/// Enables TCP keepalive on a connected socket (best effort).
pub fn set_keepalive(stream: &Stream) {
    if let Stream::Tcp(s) = stream {
        let sock = socket2::SockRef::from(s);
        let ka = socket2::TcpKeepalive::new().with_time(std::time::Duration::from_secs(60));
        let _ = sock.set_tcp_keepalive(&ka);
    }
}
