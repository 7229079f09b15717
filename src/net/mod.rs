//! Sockets: listeners (TCP, Unix), socket options, and the stream type every other
//! module reads and writes: plain TCP, Unix socket, or TLS over TCP in either direction
//! (handshakes are in `tls`).

pub mod backlog;
pub mod listener;
pub mod notify;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use rustls::CommonState;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::{client, server};

use crate::protocol::{Header, MAX_INSPECTED_LEN, ProtocolError};

/// A connection to a client or a server. The TLS variants are boxed: a rustls
/// connection is large, and a pool moves server connections around by value.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
    /// TLS accepted from a client (Sluice is the TLS server).
    TlsAccepted(Box<server::TlsStream<TcpStream>>),
    /// TLS to PostgreSQL (Sluice is the TLS client).
    TlsConnected(Box<client::TlsStream<TcpStream>>),
    /// The socket was handed to a TLS handshake that did not finish: reads see EOF,
    /// writes fail.
    Closed,
}

/// Forwards one `AsyncRead`/`AsyncWrite` call to whichever stream is inside; `$closed`
/// is the result for `Stream::Closed`.
macro_rules! each {
    ($self:expr, $method:ident($($arg:expr),*), closed => $closed:expr) => {
        match $self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).$method($($arg),*),
            Stream::Unix(s) => Pin::new(s).$method($($arg),*),
            Stream::TlsAccepted(s) => Pin::new(s.as_mut()).$method($($arg),*),
            Stream::TlsConnected(s) => Pin::new(s.as_mut()).$method($($arg),*),
            Stream::Closed => $closed,
        }
    };
}

impl Stream {
    /// Whether the peer has closed or sent unexpected bytes while the connection sat
    /// idle. Used before lending a pooled server connection: an idle server must be
    /// silent, so any readable byte or EOF means it is unusable. For TLS, decrypted
    /// bytes or a close_notify already inside rustls count, then the TCP socket is
    /// probed (a byte read there is lost, which is fine: the connection is discarded).
    pub fn is_dead_or_noisy(&self) -> bool {
        if self.tls().is_some_and(|(_, tls)| !tls.wants_read()) {
            return true;
        }
        let mut probe = [0u8; 1];
        let r = if let Some(tcp) = self.tcp() {
            tcp.try_read(&mut probe)
        } else if let Stream::Unix(s) = self {
            s.try_read(&mut probe)
        } else {
            return true; // Closed
        };
        !matches!(r, Err(ref e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    pub fn set_nodelay(&self) {
        if let Some(s) = self.tcp() {
            let _ = s.set_nodelay(true);
        }
    }

    /// The TCP socket under a plain or TLS stream.
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            Stream::Tcp(s) => Some(s),
            _ => self.tls().map(|(tcp, _)| tcp),
        }
    }

    /// The TCP socket and the rustls state under either TLS variant.
    fn tls(&self) -> Option<(&TcpStream, &CommonState)> {
        match self {
            Stream::TlsAccepted(s) => Some((s.get_ref().0, s.get_ref().1)),
            Stream::TlsConnected(s) => Some((s.get_ref().0, s.get_ref().1)),
            Stream::Tcp(_) | Stream::Unix(_) | Stream::Closed => None,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, Stream::TlsAccepted(_) | Stream::TlsConnected(_))
    }

    /// Takes the socket of a plain TCP stream out for a TLS handshake, leaving
    /// `Closed` behind; None (and the stream untouched) for anything else.
    pub fn take_tcp(&mut self) -> Option<TcpStream> {
        match std::mem::replace(self, Stream::Closed) {
            Stream::Tcp(s) => Some(s),
            other => {
                *self = other;
                None
            }
        }
    }

    /// Writes `msg` without waiting (best effort) as the last thing sent on this
    /// connection; on TLS it is followed by close_notify. Used to send Terminate to a
    /// server being dropped.
    pub fn try_send_last(&mut self, msg: &[u8]) {
        let _ = match self {
            Stream::Tcp(s) => s.try_write(msg),
            Stream::Unix(s) => s.try_write(msg),
            Stream::TlsConnected(s) => try_send_tls(s.get_mut(), msg),
            Stream::TlsAccepted(s) => try_send_tls(s.get_mut(), msg),
            Stream::Closed => Ok(0),
        };
    }

    /// `write_all` then `flush`: a TLS stream may keep the tail of a write inside rustls
    /// when the socket is full, until it is flushed. A no-op flush on plain sockets.
    pub async fn send(&mut self, buf: &[u8]) -> io::Result<()> {
        send(self, buf).await
    }
}

/// `write_all` then `flush`, for any stream (a TLS stream may hold back unflushed
/// bytes): what every write on an established connection goes through (only the
/// SSLRequest and CancelRequest go straight to a fresh plain socket).
pub async fn send<S: AsyncWrite + Unpin + ?Sized>(stream: &mut S, buf: &[u8]) -> io::Result<()> {
    stream.write_all(buf).await?;
    stream.flush().await
}

/// Encrypts `msg` and a close_notify and writes what the socket takes now, given a TLS
/// stream's `get_mut()`.
fn try_send_tls<C, D>((tcp, tls): (&mut TcpStream, &mut C), msg: &[u8]) -> io::Result<usize>
where
    C: std::ops::DerefMut<Target = rustls::ConnectionCommon<D>>,
{
    use std::io::Write;
    struct NoWait<'a>(&'a TcpStream);
    impl Write for NoWait<'_> {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.try_write(buf)
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }
    tls.writer().write_all(msg)?;
    tls.send_close_notify();
    let mut written = 0;
    while tls.wants_write() {
        match tls.write_tls(&mut NoWait(tcp))? {
            0 => break,
            n => written += n,
        }
    }
    Ok(written)
}

// `#[inline]`: the relay polls these for every read and write; without the hint the
// compiler stopped inlining them into the relay as it grew (+180 instructions per
// extended transaction, callgrind). `poll_read` is `#[inline(always)]`: a plain hint
// was dropped again once the prepared-statement queue items grew (+130 per transaction).
impl AsyncRead for Stream {
    #[inline(always)]
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        each!(self, poll_read(cx, buf), closed => Poll::Ready(Ok(())))
    }
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "connection closed after a failed TLS handshake")
}

impl AsyncWrite for Stream {
    #[inline]
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        each!(self, poll_write(cx, buf), closed => Poll::Ready(Err(closed())))
    }

    #[inline]
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, poll_flush(cx), closed => Poll::Ready(Ok(())))
    }

    /// On TLS: sends close_notify, flushes, then shuts the TCP socket's write side.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        each!(self, poll_shutdown(cx), closed => Poll::Ready(Ok(())))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        each!(self, poll_write_vectored(cx, bufs), closed => Poll::Ready(Err(closed())))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }
}

/// Errors from reading whole messages outside the relay.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("connection closed")]
    Closed,
    #[error(transparent)]
    Io(#[from] io::Error),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
}

/// Reads one complete tagged message into `buf` and splits it off. Only for the
/// handshake and login phases and for Sluice's own queries: the relay streams instead.
/// Messages larger than [`MAX_INSPECTED_LEN`] are refused before they are buffered.
pub async fn read_message<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut BytesMut) -> Result<BytesMut, ReadError> {
    loop {
        if let Some(h) = Header::peek(buf)? {
            if h.frame_len > MAX_INSPECTED_LEN {
                return Err(ProtocolError::TooLarge { tag: h.tag, len: h.frame_len }.into());
            }
            if buf.len() >= h.frame_len {
                return Ok(buf.split_to(h.frame_len));
            }
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(ReadError::Closed);
        }
    }
}

/// Reads an untagged startup packet (length word first) and returns its body.
pub async fn read_startup<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut BytesMut) -> Result<BytesMut, ReadError> {
    loop {
        if buf.len() >= 4 {
            let len = crate::protocol::startup::check_length(u32::from_be_bytes(buf[..4].try_into().unwrap()))?;
            if buf.len() >= len {
                let mut packet = buf.split_to(len);
                packet.advance(4);
                return Ok(packet);
            }
        }
        if stream.read_buf(buf).await? == 0 {
            return Err(ReadError::Closed);
        }
    }
}
