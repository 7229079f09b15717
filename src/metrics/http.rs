//! The HTTP endpoint (`metrics_listen`): `/metrics` (Prometheus text format), `/`
//! (the live view, one self-contained page) and `/api/stats` (its JSON). HTTP/1.1 by
//! hyper; every request is answered from memory, nothing touches the pools' locks
//! for longer than a copy.

use std::convert::Infallible;
use std::sync::Arc;

use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{CACHE_CONTROL, CONTENT_TYPE};
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tracing::debug;

use crate::app::{App, Phase};

/// The live view: HTML, CSS and JS in one file, no external assets.
const LIVE_PAGE: &str = include_str!("live.html");

/// Connections served at once; one more is closed at once (its file descriptor is
/// taken from the pooler's clients' limit).
pub const MAX_CONNECTIONS: usize = 64;

/// How long one connection may last, requests and the reading of the replies together
/// (a client that stops reading does not keep its task and reply for ever).
const CONNECTION_LIFETIME: std::time::Duration = std::time::Duration::from_secs(60);

/// Serves HTTP on `listener` until Sluice stops.
pub async fn serve(app: Arc<App>, listener: TcpListener) {
    let mut phase = app.phase();
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut failures = crate::net::listener::AcceptFailures::default();
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = phase.wait_for(|p| *p == Phase::Stopping) => return,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                failures.failed("metrics endpoint", &e).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            debug!(%peer, "metrics endpoint: {MAX_CONNECTIONS} connections open already; closed");
            continue;
        };
        let app = app.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let service = service_fn(move |req| {
                let app = app.clone();
                async move { Ok::<_, Infallible>(respond(&app, &req)) }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(hyper_util::rt::TokioTimer::new())
                .header_read_timeout(std::time::Duration::from_secs(10))
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_LIFETIME, conn).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => debug!(%peer, "metrics endpoint connection: {e}"),
                Err(_) => debug!(%peer, "metrics endpoint connection closed after {CONNECTION_LIFETIME:?}"),
            }
        });
    }
}

fn reply(status: StatusCode, content_type: &str, body: impl Into<Bytes>) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    if let Ok(v) = content_type.parse() {
        r.headers_mut().insert(CONTENT_TYPE, v);
    }
    r.headers_mut().insert(CACHE_CONTROL, hyper::header::HeaderValue::from_static("no-store"));
    r
}

/// Answers one request.
pub fn respond<B>(app: &App, req: &Request<B>) -> Response<Full<Bytes>> {
    if req.method() != Method::GET && req.method() != Method::HEAD {
        return reply(StatusCode::METHOD_NOT_ALLOWED, "text/plain", "only GET\n");
    }
    match req.uri().path() {
        "/metrics" => reply(StatusCode::OK, super::prom::CONTENT_TYPE, super::prom::render(app)),
        "/" | "/index.html" => reply(StatusCode::OK, "text/html; charset=utf-8", LIVE_PAGE),
        "/api/stats" => {
            let seconds = query_param(req.uri().query().unwrap_or(""), "seconds").unwrap_or(super::RING_LEN);
            let body = super::json::stats(app, seconds).to_string();
            reply(StatusCode::OK, "application/json", body)
        }
        _ => reply(StatusCode::NOT_FOUND, "text/plain", "not found: try /, /metrics or /api/stats\n"),
    }
}

fn query_param(query: &str, name: &str) -> Option<usize> {
    query.split('&').find_map(|kv| kv.strip_prefix(name)?.strip_prefix('=')?.parse().ok())
}

#[cfg(test)]
mod tests {
    #[test]
    fn query_params() {
        assert_eq!(super::query_param("a=1&seconds=30", "seconds"), Some(30));
        assert_eq!(super::query_param("seconds=x", "seconds"), None);
        assert_eq!(super::query_param("", "seconds"), None);
    }
}
