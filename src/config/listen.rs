//! The listen addresses: `listen_addr` entries as IP addresses, host names resolved at
//! start-up, and which of them cannot be bound side by side.

use std::net::IpAddr;

use super::Config;

impl Config {
    /// The host names in `listen_addr` (not `*`, not IP addresses).
    pub fn listen_names(&self) -> impl Iterator<Item = &str> {
        self.general.listen_addr.iter().map(String::as_str).filter(|a| *a != "*" && listed_ip(a).is_none())
    }

    /// The addresses to listen on: those listed, and every address the host names
    /// listed resolve to now (not one that a listed address already takes), for
    /// `app::bind` at start-up and `--check`.
    pub fn listen_ips(&self) -> Result<Vec<IpAddr>, String> {
        let mut ips = self.listen.clone();
        for name in self.listen_names() {
            for ip in resolve_listen(name)? {
                if !ips.iter().any(|o| same_socket(o, &ip)) {
                    ips.push(ip);
                }
            }
        }
        Ok(ips)
    }
}

impl Config {
    /// Whether `ip` is an entry of `listen_addr` of its own (not from `*` or a host
    /// name): one that cannot be bound is an error at start-up, where those are skipped
    /// with a warning when the system lacks the address or its family, as in PgBouncer.
    pub fn listed_as_address(&self, ip: &IpAddr) -> bool {
        self.general.listen_addr.iter().filter_map(|a| listed_ip(a)).any(|l| l == *ip)
    }
}

/// The addresses a host name in `listen_addr` resolves to (`localhost`: 127.0.0.1 and
/// ::1 where the system has it), each once, in the resolver's order.
fn resolve_listen(name: &str) -> Result<Vec<IpAddr>, String> {
    use std::net::ToSocketAddrs;
    let found = (name, 0u16)
        .to_socket_addrs()
        .map_err(|e| format!("\"{name}\" is neither an IP address nor a host name that resolves ({e})"))?;
    let mut ips: Vec<IpAddr> = Vec::new();
    for ip in found.map(|a| a.ip()) {
        if !ips.contains(&ip) {
            ips.push(ip);
        }
    }
    Ok(ips)
}

/// A `listen_addr` entry that is an IP address (with or without brackets).
pub(super) fn listed_ip(entry: &str) -> Option<IpAddr> {
    entry.trim_matches(|c| c == '[' || c == ']').parse().ok()
}

/// Whether listeners on `a` and `b` (one port) cannot both be bound: the same address,
/// or a wildcard of the other's family.
pub(super) fn same_socket(a: &IpAddr, b: &IpAddr) -> bool {
    a == b || (a.is_ipv4() == b.is_ipv4() && (a.is_unspecified() || b.is_unspecified()))
}
