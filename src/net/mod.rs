//! Sockets: listeners (TCP, Unix), socket options, and the stream type every other
//! module reads and writes (plain TCP or Unix socket; TLS slots in here).

pub mod listener;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

use crate::protocol::{Header, MAX_INSPECTED_LEN, ProtocolError};

/// A connection to a client or a server.
#[derive(Debug)]
pub enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    /// Whether the peer has closed or sent unexpected bytes while the connection sat
    /// idle. Used before lending a pooled server connection: an idle server must be
    /// silent, so any readable byte or EOF means it is unusable.
    pub fn is_dead_or_noisy(&self) -> bool {
        let mut probe = [0u8; 1];
        let r = match self {
            Stream::Tcp(s) => s.try_read(&mut probe),
            Stream::Unix(s) => s.try_read(&mut probe),
        };
        !matches!(r, Err(ref e) if e.kind() == io::ErrorKind::WouldBlock)
    }

    pub fn set_nodelay(&self) {
        if let Stream::Tcp(s) = self {
            let _ = s.set_nodelay(true);
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Unix(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Unix(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Unix(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Unix(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
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
