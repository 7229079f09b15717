//! Writes that never wait: what the socket does not take at once is kept in a
//! [`Backlog`] and written as the socket drains, while the caller goes on reading.
//! The relay needs this towards the server: PostgreSQL stops reading its input while
//! its own output is blocked, so a relay that waited on a write to the server without
//! reading the server's output would deadlock on a large pipeline.

use std::io;
use std::pin::{Pin, pin};
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

/// Bytes for a peer that its socket has not taken yet (empty in the usual case).
#[derive(Debug, Default)]
pub struct Backlog {
    bytes: BytesMut,
    /// A TLS stream took every byte but holds some of them inside rustls until a
    /// flush gets them onto the socket.
    unflushed: bool,
}

/// What [`Backlog::read_or_drain`] saw first.
#[derive(Debug)]
pub enum Event {
    /// A read into the buffer: its byte count (0: end of stream).
    Read(io::Result<usize>),
    /// The backlog was written out (or failed).
    Drained(io::Result<()>),
}

impl Backlog {
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty() && !self.unflushed
    }

    /// Forgets what was kept (the connection is being given up).
    pub fn clear(&mut self) {
        self.bytes.clear();
        self.unflushed = false;
    }

    /// Writes `buf` as far as the socket takes it now, keeping the rest (all of it
    /// behind a backlog already there: output stays in order).
    pub async fn write<S: AsyncWrite + Unpin>(&mut self, stream: &mut S, buf: &[u8]) -> io::Result<()> {
        if !self.is_empty() {
            self.bytes.extend_from_slice(buf);
            return Ok(());
        }
        let (taken, flushed) = std::future::poll_fn(|cx| Poll::Ready(write_some(stream, cx, buf))).await?;
        if taken < buf.len() {
            self.bytes.extend_from_slice(&buf[taken..]);
        }
        self.unflushed = !flushed;
        Ok(())
    }

    /// Waits until either `buf` has new bytes from `stream` or the backlog is written
    /// out: reading goes on while a write waits. (With nothing kept, a plain read: the
    /// relay's usual loop reads directly and comes here only with a backlog or a held
    /// message.)
    pub async fn read_or_drain<S: AsyncRead + AsyncWrite + Unpin>(
        &mut self,
        stream: &mut S,
        buf: &mut BytesMut,
    ) -> Event {
        std::future::poll_fn(|cx| {
            if !self.is_empty()
                && let Poll::Ready(r) = self.poll_drain(stream, cx)
            {
                return Poll::Ready(Event::Drained(r));
            }
            pin!(stream.read_buf(buf)).poll(cx).map(Event::Read)
        })
        .await
    }

    fn poll_drain<S: AsyncWrite + Unpin>(&mut self, stream: &mut S, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match write_some(stream, cx, &self.bytes) {
            Err(e) => Poll::Ready(Err(e)),
            Ok((taken, flushed)) => {
                self.bytes.advance(taken);
                self.unflushed = !flushed;
                if self.is_empty() { Poll::Ready(Ok(())) } else { Poll::Pending }
            }
        }
    }
}

/// Writes without waiting: (bytes the stream took, whether it has flushed them all).
/// Pending leaves the task woken when the socket has room again.
fn write_some<S: AsyncWrite + Unpin>(stream: &mut S, cx: &mut Context<'_>, buf: &[u8]) -> io::Result<(usize, bool)> {
    let mut taken = 0;
    while taken < buf.len() {
        match Pin::new(&mut *stream).poll_write(cx, &buf[taken..]) {
            Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
            Poll::Ready(Ok(n)) => taken += n,
            Poll::Ready(Err(e)) => return Err(e),
            Poll::Pending => return Ok((taken, false)),
        }
    }
    match Pin::new(&mut *stream).poll_flush(cx) {
        Poll::Ready(Ok(())) => Ok((taken, true)),
        Poll::Ready(Err(e)) => Err(e),
        Poll::Pending => Ok((taken, false)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncWriteExt, duplex};

    #[tokio::test]
    async fn keeps_what_the_peer_does_not_take_and_reads_meanwhile() {
        // A pipe holding 16 bytes each way.
        let (mut near, mut far) = duplex(16);
        let mut backlog = Backlog::default();
        backlog.write(&mut near, &[7u8; 40]).await.unwrap();
        assert!(!backlog.is_empty(), "40 bytes cannot fit in 16");
        // The far side writes before reading: the near side sees it while its own
        // write still waits.
        far.write_all(b"hello").await.unwrap();
        let mut inbox = BytesMut::with_capacity(64);
        let Event::Read(Ok(5)) = backlog.read_or_drain(&mut near, &mut inbox).await else {
            panic!("the read did not come first")
        };
        assert_eq!(&inbox[..], b"hello");
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            far.read_to_end(&mut got).await.unwrap();
            got
        });
        while !backlog.is_empty() {
            match backlog.read_or_drain(&mut near, &mut inbox).await {
                Event::Drained(r) => r.unwrap(),
                Event::Read(r) => panic!("nothing more to read, got {r:?}"),
            }
        }
        drop(near);
        assert_eq!(reader.await.unwrap(), vec![7u8; 40], "every byte, in order");
    }

    #[tokio::test]
    async fn a_write_the_socket_takes_leaves_no_backlog() {
        let (mut near, _far) = duplex(1024);
        let mut backlog = Backlog::default();
        backlog.write(&mut near, b"short").await.unwrap();
        assert!(backlog.is_empty());
    }
}
