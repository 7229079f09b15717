//! Sluice, a PostgreSQL connection pooler.
//!
//! Bytes flow `net` → `client` (handshake, `auth`, session, relay) ⇄ `server`
//! connections lent by a `pool`; `protocol` is the I/O-free wire codec; `tls` sets up
//! TLS on either side; `app` wires the handles together; `config` loads and validates
//! the TOML file; `admin` is the PgBouncer-compatible console and `metrics` the
//! Prometheus endpoint, live view and stats task.

pub mod admin;
pub mod app;
pub mod auth;
pub mod cancel;
pub mod client;
pub mod clock;
pub mod config;
pub mod metrics;
pub mod net;
pub mod os;
pub mod params;
pub mod pool;
pub mod prepared;
pub mod protocol;
pub mod server;
pub mod stats;
pub mod tls;
