//! `[peers.ID]`: the other Sluice processes of a peered group (PgBouncer's `[peers]`),
//! to which a cancel request meant for one of them is forwarded (see `cancel::route`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{ConfigError, General, Invalid};

/// The largest `peer_id` (PgBouncer's too): the id takes 14 bits of each cancel key.
pub const MAX_PEER_ID: u16 = 16383;

/// A `[peers.ID]` entry: where the Sluice with `peer_id = ID` takes cancel requests.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Peer {
    /// A host name or IP address, or the directory of the peer's Unix socket when it
    /// starts with `/` (its `unix_socket_dir`).
    pub host: String,
    #[serde(default = "default_peer_port")]
    pub port: u16,
    /// Cancel requests forwarded to this peer at once (default: `default_pool_size`).
    pub pool_size: Option<usize>,
}

fn default_peer_port() -> u16 {
    6432
}

impl Peer {
    /// At most this many cancel requests are forwarded to the peer at once.
    pub fn slots(&self, g: &General) -> usize {
        self.pool_size.unwrap_or(g.default_pool_size)
    }
}

/// The `[peers]` tables by id, validated; `invalid` places an error at `peers.ID.key`
/// (`key` empty: the table's name).
pub(super) fn validate(
    raw: BTreeMap<String, Peer>,
    invalid: &dyn Fn(&str, &str, String) -> ConfigError,
) -> Result<BTreeMap<u16, Peer>, ConfigError> {
    let mut out = BTreeMap::new();
    for (name, peer) in raw {
        let id = match name.parse::<u16>() {
            Ok(id @ 1..=MAX_PEER_ID) if name == id.to_string() => id,
            _ => return Err(invalid(&name, "", format!("a peer is named by its peer_id, 1 to {MAX_PEER_ID}"))),
        };
        if peer.host.is_empty() || peer.host.contains(char::is_whitespace) {
            return Err(invalid(&name, "host", "must be a host name, an IP address or a socket directory".into()));
        }
        if peer.host.starts_with('@') {
            return Err(invalid(&name, "host", "Unix sockets in the abstract namespace are not supported".into()));
        }
        if peer.port == 0 {
            return Err(invalid(&name, "port", "must be between 1 and 65535".into()));
        }
        if peer.pool_size == Some(0) {
            return Err(invalid(&name, "pool_size", "must be at least 1".into()));
        }
        out.insert(id, peer);
    }
    Ok(out)
}

impl super::Config {
    /// The `[peers]` entries other than this process's own (which is ignored, so that
    /// every process of a group can have the same list).
    pub fn other_peers(&self) -> impl Iterator<Item = (&u16, &Peer)> {
        self.peers.iter().filter(|(id, _)| **id != self.general.peer_id)
    }
}

/// `[general] peer_id`'s range.
pub(super) fn validate_peer_id(g: &General, invalid: Invalid) -> Result<(), ConfigError> {
    if g.peer_id > MAX_PEER_ID {
        return Err(invalid("peer_id", format!("must be between 0 (no peering) and {MAX_PEER_ID}")));
    }
    Ok(())
}

/// What loads but does nothing: peers listed without a `peer_id` of this process, or a
/// `peer_id` without another peer to forward to.
pub(super) fn warnings(g: &General, peers: &BTreeMap<u16, Peer>) -> Option<String> {
    if g.peer_id == 0 {
        let listed = !peers.is_empty();
        return listed.then(|| "[peers] is listed but peer_id is 0: cancel requests are not forwarded to peers".into());
    }
    (!peers.keys().any(|id| *id != g.peer_id)).then(|| {
        format!(
            "peer_id is {} but [peers] lists no other process: cancel requests for other keys are dropped",
            g.peer_id
        )
    })
}
