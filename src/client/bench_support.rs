//! For benches only (`benches/`): drives the relay's per-message protocol tracking
//! ([`Track`] with prepared-statement rewriting) on byte buffers, without sockets, a
//! pool or a runtime. Not an API: hidden from the docs, free to change with the relay.
//! [`Link::client`] and [`Link::server`] are the synchronous halves of the relay's
//! `forward_client` / `forward_server`, [`Link::link`] and [`Link::release`] what a
//! session does to the tracking state when a server is lent and given back.

use bytes::BytesMut;

use super::extended::ClientCtx;
use super::track::Track;
use crate::config::PoolMode;
use crate::prepared::{ClientStatements, Generations, ServerStatements};
use crate::protocol::scan::{Need, Splice};
use crate::protocol::{ProtocolError, TxStatus};
use crate::stats::PoolStats;

/// The relay's need function for client messages (`pooled`: transaction or statement mode).
pub fn client_need(pooled: bool) -> impl Fn(u8) -> Need {
    super::needs::client_need(pooled, false)
}

/// The relay's need function for server messages.
pub fn server_need(tag: u8) -> Need {
    super::needs::server_need(tag)
}

/// One client linked to one server: the tracking state of the relay plus the client's
/// and the server's prepared statements, which outlive a link as they do in a session.
#[derive(Debug)]
pub struct Link {
    mode: PoolMode,
    track: Track,
    splice: Splice,
    stmts: ClientStatements,
    server: ServerStatements,
    gens: Generations,
    tx: TxStatus,
    /// Where flushed statistics go (the pool's, in a session).
    pub stats: PoolStats,
}

impl Link {
    pub fn new(mode: PoolMode) -> Self {
        Link {
            mode,
            track: Track::default(),
            splice: Splice::new(),
            stmts: ClientStatements::default(),
            server: ServerStatements::default(),
            gens: Generations::default(),
            tx: TxStatus::Idle,
            stats: PoolStats::default(),
        }
    }

    /// A server is lent: tracking starts afresh (`Session::link`).
    pub fn link(&mut self) {
        self.track.reset();
    }

    /// Scans client bytes as `forward_client` does; returns what would be written to
    /// the server (valid until the next call).
    pub fn client<'a>(&'a mut self, buf: &'a [u8]) -> Result<&'a [u8], ProtocolError> {
        self.splice.reset();
        let ctx = (self.mode != PoolMode::Session).then_some(ClientCtx {
            gens: &self.gens,
            epoch: 0,
            settings: 0,
            stmts: &mut self.stmts,
            server: &mut self.server,
            cap: 100,
            client_limit: 1000,
            tx: self.tx,
            in_copy: false,
        });
        let n = self.track.scan_client(buf, &mut self.splice, ctx)?;
        let mut local = BytesMut::new();
        self.track.ext.take_leading_synthetic(&mut local);
        std::hint::black_box(&local);
        Ok(self.splice.finish(buf, n))
    }

    /// Scans server bytes as `forward_server` does; returns what would be written to
    /// the client (valid until the next call).
    pub fn server<'a>(&'a mut self, buf: &'a [u8]) -> Result<&'a [u8], ProtocolError> {
        self.splice.reset();
        let n = self.track.scan_server(buf, &mut self.splice, self.mode, &mut self.server)?;
        if let Some(tx) = self.track.tx {
            self.tx = tx;
        }
        self.track.param_updates.clear();
        self.track.ext.settle_names(&mut self.stmts);
        if self.track.xact_done.is_some() || self.track.query_times.len() >= 1024 {
            self.release();
        }
        Ok(self.splice.finish(buf, n))
    }

    /// Whether the relay would give the server back now (`Session::releasable`).
    pub fn releasable(&self) -> bool {
        self.track.protocol_idle() && self.tx == TxStatus::Idle
    }

    /// Flushes the statistics, as `Session::release` does when the server goes back to
    /// the pool (and `forward_server` at each transaction end).
    pub fn release(&mut self) {
        self.track.flush_to(&self.stats, self.mode != PoolMode::Session);
    }
}

#[cfg(test)]
mod tests {
    use bytes::BufMut;

    use super::*;
    use crate::protocol::build;

    /// ParseComplete/BindComplete/CommandComplete/ReadyForQuery frames.
    fn reply(tags: &[u8]) -> BytesMut {
        let mut b = BytesMut::new();
        for &t in tags {
            match t {
                b'C' => build::command_complete(&mut b, "SELECT 1"),
                b'Z' => build::ready_for_query(&mut b, TxStatus::Idle),
                t => b.put_slice(&[t, 0, 0, 0, 4]),
            }
        }
        b
    }

    #[test]
    fn a_prepared_statement_is_renamed_and_the_link_released() {
        let mut link = Link::new(PoolMode::Transaction);
        let mut parse = BytesMut::new();
        build::parse(&mut parse, b"s1", b"select 1", &[]);
        build::sync(&mut parse);
        assert!(link.client(&parse).unwrap().windows(7).any(|w| w == b"sluice_"));
        assert!(!link.releasable());
        link.server(&reply(b"1Z")).unwrap();
        assert!(link.releasable());
        link.release();

        link.link();
        let mut bind = BytesMut::new();
        bind.put_slice(&[b'B', 0, 0, 0, 14, 0, b's', b'1', 0, 0, 0, 0, 0, 0, 0]); // no parameters
        bind.put_slice(&[b'E', 0, 0, 0, 9, 0, 0, 0, 0, 0]); // all rows
        build::sync(&mut bind);
        let out = link.client(&bind).unwrap().to_vec();
        assert!(out.windows(7).any(|w| w == b"sluice_") && out.len() > bind.len());
        assert_eq!(link.server(&reply(b"2CZ")).unwrap().len(), reply(b"2CZ").len());
        assert!(link.releasable());
        link.release();
        assert_eq!(link.stats.xact_count.load(std::sync::atomic::Ordering::Relaxed), 2);
    }
}
