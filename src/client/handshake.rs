//! The handshake: the packets a client sends before its StartupMessage (SSLRequest,
//! GSSENCRequest, a direct TLS ClientHello, CancelRequest), each wait of it cut short
//! by the pooler's shutdown.

use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;

use bytes::BytesMut;
use rustls::ServerConfig;
use tokio::io::AsyncReadExt;

use super::{ClientConn, Exit};
use crate::app::{App, Phase};
use crate::net::listener::Peer;
use crate::net::{ReadError, Stream, read_startup};
use crate::protocol::build;
use crate::protocol::sqlstate;
use crate::protocol::startup::{self, StartupMessage, StartupPacket};
use crate::tls::{self, ClientTls, Negotiation};

/// A login refused because the pooler is shutting down.
pub(super) fn refused_shutting_down<T>() -> Result<T, Exit> {
    Err(Exit::fatal(sqlstate::CANNOT_CONNECT_NOW, "the pooler is shutting down"))
}

/// Runs a wait of the handshake (for the client's bytes, or its TLS handshake) until it
/// ends, or until the pooler leaves its running phase: new logins are refused then, and
/// the shutdown does not wait for a connection that has not sent its startup packet.
/// The wait is polled first, so a packet already received (a cancel request) goes on.
///
/// The wait comes pinned by the caller (as `interruptible`'s step): taken by value, it
/// would be stored twice in the login's future, which is moved whole into its box per
/// connection (callgrind: ~9,500 instructions per `-C` connection).
pub(super) async fn until_shutdown<T, F>(app: &App, wait: Pin<&mut F>) -> Result<T, Exit>
where
    F: Future<Output = Result<T, Exit>> + ?Sized,
{
    at_shutdown(app, wait, || Some(refused_shutting_down())).await
}

/// Runs a wait of the handshake until it ends; if the pooler leaves its running phase
/// first, `then` is called once, and the wait ends with what it gives or goes on where
/// it gives None.
async fn at_shutdown<T, F>(
    app: &App,
    mut wait: Pin<&mut F>,
    mut then: impl FnMut() -> Option<Result<T, Exit>>,
) -> Result<T, Exit>
where
    F: Future<Output = Result<T, Exit>> + ?Sized,
{
    // Made before the phase is read: tokio's Notified receives a `notify_waiters` from
    // its creation on, polled or not (it takes the Notify's lock only once polled, when
    // the wait is pending).
    let changed = app.phase_changed.notified();
    tokio::pin!(changed);
    let mut seen = false;
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = wait.as_mut().poll(cx) {
            return Poll::Ready(r);
        }
        if !seen && (app.current_phase() != Phase::Running || changed.as_mut().poll(cx).is_ready()) {
            seen = true;
            if let Some(r) = then() {
                return Poll::Ready(r);
            }
        }
        Poll::Pending
    })
    .await
}

/// Reads packets until a StartupMessage: starts TLS when asked (or when the client
/// opens with a TLS handshake), refuses GSS encryption, answers cancel requests, and
/// refuses plaintext TCP logins when TLS is required.
pub(super) async fn handshake(app: &Arc<App>, conn: &mut ClientConn) -> Result<StartupMessage, Exit> {
    let tls = app.client_tls.load_full();
    {
        let first = direct_tls(conn, &tls);
        tokio::pin!(first);
        until_shutdown(app, first).await?;
    }
    loop {
        let body = {
            let (stream, buf, guard) = (&mut conn.stream, &mut conn.buf, &mut conn.guard);
            let read = async move {
                read_startup(stream, buf).await.map_err(|e| match e {
                    ReadError::Closed | ReadError::Io(_) => Exit::Closed,
                    ReadError::Protocol(p) => Exit::protocol(p),
                })
            };
            tokio::pin!(read);
            // A peered process's Unix socket takes its peers' cancel requests through the
            // shutdown (`app::accept_loop`): a read there is not cut short (a login is
            // refused once read), within the login's deadline as ever, but from the
            // shutdown on the connection no longer counts as a client, so one that sends
            // nothing holds up no exit.
            match app.cancel.peered() && matches!(conn.peer, Peer::Unix) {
                true => {
                    at_shutdown(app, read, || {
                        guard.take();
                        None
                    })
                    .await?
                }
                false => until_shutdown(app, read).await?,
            }
        };
        let parsed = startup::parse(&body).map_err(|e| match e {
            // As PostgreSQL: not a violation, a version it does not speak.
            crate::protocol::ProtocolError::UnsupportedVersion { .. } => {
                Exit::fatal(sqlstate::FEATURE_NOT_SUPPORTED, e.to_string())
            }
            e => Exit::protocol(e),
        });
        match parsed? {
            packet @ (StartupPacket::Ssl | StartupPacket::GssEnc) => {
                if !conn.buf.is_empty() {
                    return Err(Exit::protocol("received unencrypted data after encryption request"));
                }
                if conn.stream.is_tls() {
                    return Err(Exit::protocol("encryption requested on an encrypted connection"));
                }
                match (packet, tls.config()) {
                    (StartupPacket::Ssl, Some(config)) if conn.stream.tcp().is_some() => {
                        conn.stream.send(b"S").await.map_err(|_| Exit::Closed)?;
                        let tls_handshake = start_tls(conn, config.clone(), Negotiation::SslRequest);
                        tokio::pin!(tls_handshake);
                        until_shutdown(app, tls_handshake).await?;
                    }
                    _ => conn.stream.send(b"N").await.map_err(|_| Exit::Closed)?,
                }
            }
            StartupPacket::Cancel { pid, secret } => {
                crate::cancel::answer(app, pid, secret).await;
                return Err(Exit::Cancel);
            }
            StartupPacket::Startup(m) => {
                if app.current_phase() != Phase::Running {
                    return refused_shutting_down();
                }
                if tls.mode.requires_tls() && !conn.stream.is_tls() && matches!(conn.peer, Peer::Tcp(_)) {
                    return Err(Exit::fatal(sqlstate::INVALID_AUTHORIZATION, "SSL required"));
                }
                let options: Vec<&str> = m.protocol_options().collect();
                if m.minor > 0 || !options.is_empty() {
                    let mut out = BytesMut::new();
                    build::negotiate_protocol_version(&mut out, 3 << 16, &options);
                    conn.stream.send(&out).await.map_err(|_| Exit::Closed)?;
                }
                return Ok(m);
            }
        }
    }
}

/// PostgreSQL 17 clients with `sslnegotiation=direct` start with a TLS ClientHello
/// instead of SSLRequest. When client TLS is on, the connection's first read (which
/// usually brings the whole startup packet) tells which: no byte is peeked at first.
async fn direct_tls(conn: &mut ClientConn, tls: &ClientTls) -> Result<(), Exit> {
    let Some(config) = tls.config().filter(|_| matches!(conn.stream, Stream::Tcp(_))) else {
        return Ok(());
    };
    if conn.buf.is_empty() && !matches!(conn.stream.read_buf(&mut conn.buf).await, Ok(1..)) {
        return Err(Exit::Closed);
    }
    if conn.buf[0] == tls::TLS_HANDSHAKE_RECORD {
        start_tls(conn, config.clone(), Negotiation::Direct).await?;
    }
    Ok(())
}

async fn start_tls(conn: &mut ClientConn, config: Arc<ServerConfig>, how: Negotiation) -> Result<(), Exit> {
    tls::accept(&mut conn.stream, config, how, &mut conn.buf).await.map_err(|e| Exit::Tls(e.to_string()))
}
