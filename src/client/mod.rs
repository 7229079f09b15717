//! The per-client task: handshake and login (`login`), then the session state
//! machine (`session`) that lends and returns server connections, and the relay
//! (`relay`) that forwards frames while a server is linked.

#[doc(hidden)]
pub mod bench_support;
mod cancelled;
mod copy;
mod extended;
mod handshake;
mod interrupt;
mod login;
mod lookup;
mod method;
mod needs;
mod relay;
mod seen;
mod session;
mod track;

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncWrite, AsyncWriteExt};
use tracing::{debug, info, warn};

use crate::app::{App, ClientGuard};
use crate::config::secs;
use crate::net::Stream;
use crate::net::listener::Peer;
use crate::protocol::build::{self, Severity};
use crate::protocol::sqlstate;

/// Bytes a client may send ahead while it waits for a server (pool queue, PAUSE, an
/// admin command): beyond it Sluice stops reading, and TCP holds the client back.
pub(crate) const WAITING_INPUT_LIMIT: usize = 64 * 1024;

/// A client's socket and read buffer.
pub struct ClientConn {
    pub stream: Stream,
    pub buf: BytesMut,
    pub peer: Peer,
    /// The relay's output assembly, kept to reuse its buffers (here rather than in the
    /// session, so the relay borrows it beside the session).
    pub splice: crate::protocol::scan::Splice,
    /// Counts the connection as a client until it ends. None for one taken on a peered
    /// process's Unix socket during its shutdown (for a cancel request), and dropped
    /// when the shutdown begins while such a connection is still before its startup
    /// packet (`handshake`), so it holds up no shutdown (`app::accept_loop`).
    pub guard: Option<ClientGuard>,
}

/// Why a client connection ended.
#[derive(Debug)]
pub enum Exit {
    /// The client sent Terminate.
    Terminated,
    /// The client closed its socket (or it broke).
    Closed,
    /// Sluice ends the connection with a FATAL error.
    Fatal { code: String, message: String },
    /// Sluice ends the connection in the middle of a message it was relaying to the
    /// client (part of a large row sent): a FATAL written there would be read as part
    /// of that message, so the connection is closed without one (the reason is logged).
    Cut(String),
    /// A cancel request was handled.
    Cancel,
    /// The TLS handshake failed (nothing more can be sent to the client).
    Tls(String),
    /// A FATAL already written (`Exit::told_at_once`), with its tail the socket did
    /// not take then (sent with the last words).
    Told { reason: String, rest: bytes::Bytes },
}

impl Exit {
    pub fn fatal(code: &str, message: impl Into<String>) -> Exit {
        Exit::Fatal { code: code.to_string(), message: message.into() }
    }

    pub fn protocol(message: impl std::fmt::Display) -> Exit {
        Exit::fatal(sqlstate::PROTOCOL_VIOLATION, message.to_string())
    }

    /// This exit, for a connection whose client output stops in the middle of a
    /// message: no ErrorResponse can follow (`Exit::Cut`).
    pub fn mid_message(self) -> Exit {
        match self {
            Exit::Fatal { code, message } => Exit::Cut(format!("{message} ({code})")),
            other => other,
        }
    }

    /// The exit of a client ended from the admin console (KILL_CLIENT, KILL db).
    pub fn killed() -> Exit {
        Exit::fatal(sqlstate::ADMIN_SHUTDOWN, "terminated by the admin console")
    }

    /// The exit of a client closed because the pooler shuts down.
    pub fn shutting_down() -> Exit {
        Exit::fatal(sqlstate::ADMIN_SHUTDOWN, "terminating connection: the pooler is shutting down")
    }

    /// Writes this FATAL to the client at once, before the session's server is
    /// cleaned up (a ROLLBACK, the reset query: with a frozen server, up to
    /// `internal_query_timeout` each), as PgBouncer sends the error first. The write is
    /// tried without waiting; when the socket takes none of it, the FATAL stays for the
    /// last words (`finish`), and so does a tail it did not take.
    pub fn told_at_once(self, stream: &mut Stream) -> Exit {
        let Exit::Fatal { code, message } = &self else { return self };
        let mut out = BytesMut::new();
        build::error_response(&mut out, Severity::Fatal, code, message);
        let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
        let mut stream = std::pin::Pin::new(stream);
        match stream.as_mut().poll_write(&mut cx, &out) {
            std::task::Poll::Ready(Ok(n)) if n > 0 => {
                // (TLS: records rustls holds go out with the last words' flush.)
                let _ = stream.poll_flush(&mut cx);
                Exit::Told { reason: self.reason(), rest: out.split_off(n).freeze() }
            }
            _ => self,
        }
    }

    fn reason(&self) -> String {
        match self {
            Exit::Terminated => "client terminated".into(),
            Exit::Closed => "client closed the connection".into(),
            Exit::Fatal { code, message } => format!("{message} ({code})"),
            Exit::Cut(reason) => format!("{reason}; closed in the middle of a message to the client"),
            Exit::Cancel => "cancel request".into(),
            Exit::Tls(reason) | Exit::Told { reason, .. } => reason.clone(),
        }
    }
}

/// Serves one client connection from accept to close; `guard` counts it as a client
/// (`ClientConn::guard`).
pub async fn serve(app: Arc<App>, stream: Stream, peer: Peer, guard: Option<ClientGuard>) {
    let mut conn = ClientConn { stream, buf: BytesMut::with_capacity(1024), peer, splice: Default::default(), guard };
    let deadline = login::LoginDeadline::after(secs(app.config.load().general.client_login_timeout));
    // Boxed: the login (TLS handshake, SCRAM) is the largest state of a client task and
    // is over after the first round trips; the task then keeps only the session's.
    let result = Box::pin(login::login(&app, &mut conn, deadline)).await;
    let exit = match result {
        // Boxed once per client: keeps the task's own state small (one copy of the
        // session, on the heap) while it sits idle.
        Ok(login::LoggedIn::Pool(session)) => Box::pin(session.run(&mut conn)).await,
        Ok(login::LoggedIn::Admin(console)) => Box::pin(console.run(&mut conn)).await,
        Err(exit) => exit,
    };
    finish(&app, &mut conn, exit).await;
}

/// How long the last words to a client (its FATAL, TLS close_notify) may wait for a
/// client that does not read them; it holds only its own connection meanwhile.
const LAST_WORDS_TIMEOUT: Duration = Duration::from_secs(5);

async fn finish(app: &App, conn: &mut ClientConn, exit: Exit) {
    let fatal = matches!(exit, Exit::Fatal { .. } | Exit::Told { .. });
    // TLS: send close_notify. Plain sockets are simply closed when dropped (a shutdown
    // first would add a system call per connection and change nothing on the wire).
    if fatal || conn.stream.is_tls() {
        let last_words = async {
            match &exit {
                Exit::Fatal { code, message } => send_error(&mut conn.stream, Severity::Fatal, code, message).await,
                Exit::Told { rest, .. } if !rest.is_empty() => {
                    let _ = conn.stream.send(rest).await;
                }
                _ => {}
            }
            if conn.stream.is_tls() {
                let _ = conn.stream.shutdown().await;
            }
        };
        let _ = tokio::time::timeout(LAST_WORDS_TIMEOUT, last_words).await;
    }
    let general = &app.config.load().general;
    if fatal && general.log_pooler_errors {
        warn!(peer = %conn.peer, "pooler error: {}", exit.reason());
    }
    match &exit {
        Exit::Cancel => debug!(peer = %conn.peer, "cancel request handled"),
        _ if general.log_disconnections => {
            info!(peer = %conn.peer, "client disconnected: {}", exit.reason())
        }
        _ => {}
    }
}

/// Writes an ErrorResponse to a client (best effort: the client may be gone).
pub async fn send_error(stream: &mut Stream, severity: Severity, code: &str, message: &str) {
    let mut out = BytesMut::new();
    build::error_response(&mut out, severity, code, message);
    let _ = stream.send(&out).await;
}
