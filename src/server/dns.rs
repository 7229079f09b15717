//! Servers given by host name: what each name resolved to, shared by every pool whose
//! server has that name (`Hosts`), used for `dns_max_ttl` before it is looked up again,
//! and numbered by change (`HostAddrs::epoch`), so that connections to an address the
//! name no longer has are closed as they come back (PgBouncer's behaviour when a
//! lookup's answer changes). IP addresses and Unix socket directories have no record.

use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::{AcqRel, Acquire, Relaxed, Release};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use foldhash::HashMap;
use parking_lot::Mutex;
use tracing::info;

/// The records of the host names the pools' servers have, one per name (held by the
/// pools' settings: a name no pool has any more is forgotten).
#[derive(Debug, Default)]
pub struct Hosts {
    map: Mutex<HashMap<Arc<str>, Weak<HostAddrs>>>,
}

impl Hosts {
    /// The record of `host`; None for an IP address or a Unix socket directory.
    pub fn record(&self, host: &str) -> Option<Arc<HostAddrs>> {
        if host.starts_with('/') || host.parse::<IpAddr>().is_ok() {
            return None;
        }
        // Names are case-insensitive (DNS, /etc/hosts).
        let host = host.to_ascii_lowercase();
        let mut map = self.map.lock();
        if let Some(r) = map.get(host.as_str()).and_then(Weak::upgrade) {
            return Some(r);
        }
        map.retain(|_, r| r.strong_count() > 0);
        let r = Arc::new(HostAddrs::new(&host));
        map.insert(r.name.clone(), Arc::downgrade(&r));
        Some(r)
    }

    /// How many names some pool has.
    pub fn names(&self) -> usize {
        self.map.lock().values().filter(|r| r.strong_count() > 0).count()
    }

    /// The names some pool has, sorted, each with its last answer and how long ago that
    /// was confirmed (None before the first lookup answered): SHOW DNS_HOSTS.
    pub fn list(&self) -> Vec<(Arc<str>, LastAnswer)> {
        let records: Vec<Arc<HostAddrs>> = self.map.lock().values().filter_map(Weak::upgrade).collect();
        let mut rows: Vec<_> = records
            .iter()
            .map(|r| {
                let last = r.last.lock().as_ref().map(|f| (f.addrs.clone(), f.at.elapsed()));
                (r.name.clone(), last)
            })
            .collect();
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        rows
    }
}

/// How long a lookup's outcome is used before the name is looked up again: an answer
/// (`dns_max_ttl`), and a failure when no answer is on record (`dns_nxdomain_ttl`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DnsTtl {
    pub answer: Duration,
    pub failure: Duration,
}

/// A name's last answer and how long ago it was confirmed; None before the first.
pub type LastAnswer = Option<(Arc<[IpAddr]>, Duration)>;

/// What a host name resolved to last.
#[derive(Debug)]
pub struct HostAddrs {
    name: Arc<str>,
    /// The newest lookup's answer (in the resolver's order) and when it answered.
    last: Mutex<Option<Found>>,
    /// How many times a lookup's addresses differed from the ones before.
    epoch: AtomicU64,
    /// Lookups begun, numbering them: an answer older than the one recorded is dropped.
    begun: AtomicU64,
    /// Connects so far, for taking the addresses in turn.
    turn: AtomicUsize,
    /// A lookup of the janitor's is running (`refresh`).
    refreshing: AtomicBool,
    /// The last lookup's failure while no answer was on record: the connects within
    /// `dns_nxdomain_ttl` of it fail with it, without a lookup each.
    failed: Mutex<Option<(Instant, std::io::ErrorKind, String)>>,
    /// Held for a lookup: one runs at a time, and the connects that wait for it take
    /// its outcome rather than look the name up again each. Held by the lookup's own
    /// task: a connect given up while it waits (its timeout, its client gone) leaves
    /// the lookup running for the others.
    gate: Arc<tokio::sync::Mutex<()>>,
    /// Lookups finished.
    done: AtomicU64,
}

#[derive(Debug, Clone)]
struct Found {
    addrs: Arc<[IpAddr]>,
    /// When it was last confirmed (or last tried, after a failed lookup).
    at: Instant,
    /// The number of the lookup that gave it.
    lookup: u64,
}

impl HostAddrs {
    fn new(name: &str) -> Self {
        HostAddrs {
            name: name.into(),
            last: Mutex::new(None),
            epoch: AtomicU64::new(0),
            begun: AtomicU64::new(0),
            turn: AtomicUsize::new(0),
            refreshing: AtomicBool::new(false),
            failed: Mutex::new(None),
            gate: Arc::new(tokio::sync::Mutex::new(())),
            done: AtomicU64::new(0),
        }
    }

    /// Changes seen so far; a connection made at one epoch is checked against the
    /// name's addresses once the epoch moves on (`ServerTarget::left_behind`).
    pub fn epoch(&self) -> u64 {
        self.epoch.load(Acquire)
    }

    /// The addresses to connect to, in the order to try them, and the epoch they belong
    /// to: the last answer while younger than `ttl.answer`, else a new lookup's (or,
    /// with no answer on record, the last lookup's failure while younger than
    /// `ttl.failure`). Each connect starts at the next address of the answer (round
    /// robin, as PgBouncer). Connects that find a lookup running wait for it and take
    /// its outcome.
    pub async fn addrs(self: &Arc<Self>, port: u16, ttl: DnsTtl) -> std::io::Result<(Vec<SocketAddr>, u64)> {
        let (addrs, epoch) = match self.answer_within(ttl.answer) {
            Some(c) => c,
            None => {
                self.failure_within(ttl.failure)?;
                self.lookup_shared(port, ttl.answer).await?
            }
        };
        let first = self.turn.fetch_add(1, Relaxed) % addrs.len();
        let order = addrs[first..].iter().chain(&addrs[..first]);
        Ok((order.map(|ip| SocketAddr::new(*ip, port)).collect(), epoch))
    }

    /// The last answer and its epoch, while younger than `ttl`.
    fn answer_within(&self, ttl: Duration) -> Option<(Arc<[IpAddr]>, u64)> {
        // The epoch is moved on under this lock (`note`): read with the answer, it is
        // the one the answer belongs to.
        let last = self.last.lock();
        last.as_ref().filter(|f| f.at.elapsed() < ttl).map(|f| (f.addrs.clone(), self.epoch()))
    }

    /// The failure of the last lookup, while younger than `ttl` and no answer is on
    /// record.
    fn failure_within(&self, ttl: Duration) -> std::io::Result<()> {
        match self.failed.lock().as_ref() {
            Some((at, kind, message)) if at.elapsed() < ttl => {
                Err(std::io::Error::new(*kind, format!("{message} (looked up {:.0?} ago)", at.elapsed())))
            }
            _ => Ok(()),
        }
    }

    /// A lookup's outcome: that of a lookup which finished while this caller waited for
    /// its turn (the answer on record, else that lookup's failure), an answer younger
    /// than `ttl` on record by then, or a lookup of its own, run in a task of its own.
    async fn lookup_shared(self: &Arc<Self>, port: u16, ttl: Duration) -> std::io::Result<(Arc<[IpAddr]>, u64)> {
        let seen = self.done.load(Acquire);
        let turn = self.gate.clone().lock_owned().await;
        if self.done.load(Acquire) == seen {
            if let Some(fresh) = self.answer_within(ttl) {
                return Ok(fresh);
            }
            let this = self.clone();
            let lookup = tokio::spawn(async move {
                let outcome = this.lookup(port).await;
                drop(turn);
                outcome
            });
            return lookup.await.unwrap_or_else(|e| Err(std::io::Error::other(e)));
        }
        drop(turn);
        if let Some(last) = self.last.lock().as_ref() {
            return Ok((last.addrs.clone(), self.epoch()));
        }
        self.failure_within(Duration::MAX)?;
        Err(std::io::Error::other(format!("host name \"{}\" was not resolved", self.name)))
    }

    /// Looks the name up. A failure with an answer on record keeps that answer for
    /// another `dns_max_ttl` (the server is likely where it was; the lookup is not
    /// repeated at every connect and janitor pass meanwhile).
    async fn lookup(&self, port: u16) -> std::io::Result<(Arc<[IpAddr]>, u64)> {
        let number = self.begun.fetch_add(1, Relaxed) + 1;
        let found = resolve(&self.name, port).await;
        let outcome = self.record(found, number);
        self.done.fetch_add(1, Release);
        outcome
    }

    /// Records the outcome of lookup `number`: see [`Self::lookup`].
    fn record(&self, found: std::io::Result<Vec<IpAddr>>, number: u64) -> std::io::Result<(Arc<[IpAddr]>, u64)> {
        let e = match found {
            Ok(found) if !found.is_empty() => return Ok(self.note(found, number)),
            Ok(_) => {
                std::io::Error::new(std::io::ErrorKind::NotFound, format!("host name \"{}\" has no address", self.name))
            }
            Err(e) => e,
        };
        let mut last = self.last.lock();
        let Some(kept) = last.as_mut() else {
            *self.failed.lock() = Some((Instant::now(), e.kind(), e.to_string()));
            return Err(e);
        };
        kept.at = Instant::now();
        let kept = (kept.addrs.clone(), self.epoch());
        drop(last);
        tracing::warn!(host = %self.name, "looking up the server's host name failed: {e}; its last answer {:?} is used", kept.0);
        Ok(kept)
    }

    /// Records the answer of lookup `number` (unless a later lookup's is on record); a
    /// set of addresses other than the last one starts a new epoch. Gives the answer on
    /// record and its epoch.
    fn note(&self, mut found: Vec<IpAddr>, number: u64) -> (Arc<[IpAddr]>, u64) {
        let mut seen = std::collections::HashSet::new();
        found.retain(|ip| seen.insert(*ip));
        let addrs: Arc<[IpAddr]> = found.into();
        let mut last = self.last.lock();
        if let Some(newer) = last.as_ref().filter(|f| f.lookup > number) {
            return (newer.addrs.clone(), self.epoch());
        }
        let before = last.as_ref().filter(|b| !same_set(&b.addrs, &addrs)).map(|b| b.addrs.clone());
        if before.is_some() {
            self.epoch.fetch_add(1, AcqRel);
        }
        *last = Some(Found { addrs: addrs.clone(), at: Instant::now(), lookup: number });
        let epoch = self.epoch();
        drop(last);
        *self.failed.lock() = None;
        if let Some(before) = before {
            info!(host = %self.name, "host name now resolves to {addrs:?} (was {before:?}): connections to addresses it no longer has are closed as they come back");
        }
        (addrs, epoch)
    }

    /// Whether a connection to `peer` goes to an address this name no longer has, by
    /// its last answer.
    pub fn lost(&self, peer: IpAddr) -> bool {
        self.last.lock().as_ref().is_some_and(|f| !f.addrs.contains(&peer))
    }

    /// Looks the name up again in a task of its own when the last answer is `ttl` old
    /// (one at a time), so that a change is seen while no new connection is opened.
    pub fn refresh(self: &Arc<Self>, port: u16, ttl: Duration) {
        if self.answer_within(ttl).is_some() || self.refreshing.swap(true, AcqRel) {
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            // A failure with no answer on record: the next connect reports it.
            let _ = this.lookup_shared(port, ttl).await;
            this.refreshing.store(false, Relaxed);
        });
    }
}

fn same_set(a: &[IpAddr], b: &[IpAddr]) -> bool {
    a.len() == b.len() && a.iter().all(|ip| b.contains(ip))
}

/// The system resolver's addresses for `name` (getaddrinfo, on tokio's blocking pool).
#[cfg(not(test))]
async fn resolve(name: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
    tokio::net::lookup_host((name, port)).await.map(|a| a.map(|a| a.ip()).collect())
}

/// In unit tests a name under `.invalid` fails at once: the tests' failing lookups ask
/// no resolver (which would send a query off this machine, or wait on an unreachable
/// one).
#[cfg(test)]
async fn resolve(name: &str, port: u16) -> std::io::Result<Vec<IpAddr>> {
    if name.to_ascii_lowercase().ends_with(".invalid") {
        return Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("{name}: no such name (test)")));
    }
    tokio::net::lookup_host((name, port)).await.map(|a| a.map(|a| a.ip()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_and_directories_have_no_record_and_names_share_one() {
        let hosts = Hosts::default();
        for h in ["127.0.0.1", "::1", "/var/run/postgresql"] {
            assert!(hosts.record(h).is_none(), "{h}");
        }
        let a = hosts.record("db.example").unwrap();
        let b = hosts.record("db.example").unwrap();
        assert!(Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &hosts.record("other.example").unwrap()));
        assert_eq!(hosts.names(), 1, "the other name is held by none");
        // Forgotten once no pool holds it.
        drop((a, b));
        assert_eq!(hosts.names(), 0);
        let c = hosts.record("db.example").unwrap();
        assert_eq!(c.epoch(), 0);
    }

    /// The epoch moves on only when the set of addresses changes (not its order, nor
    /// a repeated address), and `lost` follows the last answer; an answer older than
    /// the one on record (lookups finishing out of order) is dropped.
    #[test]
    fn a_changed_answer_starts_an_epoch() {
        let h = HostAddrs::new("db.example");
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let (a, b, c) = (ip("10.0.0.1"), ip("10.0.0.2"), ip("10.0.0.3"));
        assert!(!h.lost(a), "nothing known yet: nothing lost");
        h.note(vec![a, b], 1);
        assert_eq!(h.epoch(), 0, "the first answer is no change");
        h.note(vec![b, a, b], 2);
        assert_eq!(h.epoch(), 0, "the same set in another order");
        assert!(!h.lost(a) && !h.lost(b) && h.lost(c));
        assert_eq!(h.note(vec![b, c], 4).1, 1);
        assert!(h.lost(a) && !h.lost(b) && !h.lost(c));
        let (kept, epoch) = h.note(vec![a], 3);
        assert_eq!((&*kept, epoch), (&[b, c][..], 1), "an older lookup's answer changes nothing");
        h.note(vec![b], 5);
        assert_eq!(h.epoch(), 2);
    }

    #[tokio::test]
    async fn a_fresh_answer_is_used_until_it_is_ttl_old_and_taken_in_turn() {
        let h = Arc::new(HostAddrs::new("localhost"));
        let (x, y) = ("10.9.9.9".parse::<IpAddr>().unwrap(), "10.9.9.8".parse::<IpAddr>().unwrap());
        h.note(vec![x, y], 1);
        let hour = DnsTtl { answer: Duration::from_secs(3600), failure: Duration::ZERO };
        let at = |ip| SocketAddr::new(ip, 5432);
        assert_eq!(h.addrs(5432, hour).await.unwrap().0, vec![at(x), at(y)], "the cached answer");
        assert_eq!(h.addrs(5432, hour).await.unwrap().0, vec![at(y), at(x)], "the next connect starts at the next");
        let (addrs, epoch) = h.addrs(5432, DnsTtl::default()).await.unwrap();
        assert!(!addrs.is_empty() && !addrs.contains(&at(x)), "looked up: {addrs:?}");
        assert_eq!(epoch, 1, "localhost is not 10.9.9.x: a change");
    }

    /// A failed lookup keeps the answer on record (for another `ttl`: not tried again
    /// at once), and fails only when there is none.
    #[tokio::test]
    async fn a_failed_lookup_keeps_the_last_answer() {
        let hosts = Hosts::default();
        let h = hosts.record("Nowhere.Invalid").unwrap();
        assert!(Arc::ptr_eq(&h, &hosts.record("nowhere.invalid").unwrap()), "names are case-insensitive");
        assert!(h.addrs(5432, DnsTtl::default()).await.is_err(), "no answer on record");
        let ip = "10.9.9.9".parse::<IpAddr>().unwrap();
        h.note(vec![ip], 1);
        let (addrs, epoch) = h.addrs(5432, DnsTtl::default()).await.unwrap();
        assert_eq!((addrs, epoch), (vec![SocketAddr::new(ip, 5432)], 0));
        let fresh = h.last.lock().as_ref().unwrap().at.elapsed() < Duration::from_secs(60);
        assert!(fresh, "the failure counts as a try");
    }

    /// Connects that find the answer too old all at once share one lookup: those that
    /// wait for the running one take its answer, or its failure.
    #[tokio::test]
    async fn concurrent_connects_share_one_lookup() {
        let h = Arc::new(HostAddrs::new("localhost"));
        let stale = DnsTtl::default();
        let all = futures_util::future::join_all((0..20).map(|_| h.addrs(5432, stale))).await;
        assert_eq!(h.begun.load(Relaxed), 1, "one lookup for twenty connects");
        // Each took the one answer (each starting at its own turn of it).
        let sorted = |r: &std::io::Result<(Vec<SocketAddr>, u64)>| {
            let mut a = r.as_ref().unwrap().0.clone();
            a.sort();
            a
        };
        assert!(all.iter().all(|r| sorted(r) == sorted(&all[0])), "{all:?}");
        h.addrs(5432, stale).await.unwrap();
        assert_eq!(h.begun.load(Relaxed), 2, "a later connect looks up again");
        let nowhere = Arc::new(HostAddrs::new("nowhere.invalid"));
        let all = futures_util::future::join_all((0..5).map(|_| nowhere.addrs(5432, stale))).await;
        assert!(all.iter().all(Result::is_err));
        assert_eq!(nowhere.begun.load(Relaxed), 1, "the waiters took the failure");
    }

    /// A connect given up while its lookup runs (polled once, then dropped) leaves the
    /// lookup to finish in its task: the next connect takes its answer.
    #[tokio::test]
    async fn a_lookup_outlives_the_connect_that_began_it() {
        use futures_util::FutureExt;
        let h = Arc::new(HostAddrs::new("localhost"));
        let stale = DnsTtl::default();
        assert!(h.addrs(5432, stale).now_or_never().is_none(), "answered before the lookup ran");
        let (addrs, _) = h.addrs(5432, stale).await.unwrap();
        assert!(!addrs.is_empty());
        assert_eq!(h.begun.load(Relaxed), 1, "the given-up connect's lookup served the next one");
    }

    /// A failed lookup with no answer on record is used for `dns_nxdomain_ttl`: the
    /// connects meanwhile fail with it without a lookup each; after it, and after an
    /// answer, the name is looked up again.
    #[tokio::test]
    async fn a_failure_with_no_answer_is_used_for_the_nxdomain_ttl() {
        let h = Arc::new(HostAddrs::new("nowhere.invalid"));
        let remembered = DnsTtl { answer: Duration::ZERO, failure: Duration::from_secs(3600) };
        let first = h.addrs(5432, remembered).await.expect_err("no such name");
        let again = h.addrs(5432, remembered).await.expect_err("still failing");
        assert_eq!((h.begun.load(Relaxed), again.kind()), (1, first.kind()), "looked up once");
        assert!(again.to_string().starts_with(&first.to_string()), "{again} after {first}");
        let off = DnsTtl { answer: Duration::ZERO, failure: Duration::ZERO };
        assert!(h.addrs(5432, off).await.is_err());
        assert_eq!(h.begun.load(Relaxed), 2, "looked up again once the failure is that old");
        h.note(vec!["10.9.9.9".parse().unwrap()], 3);
        assert!(h.failed.lock().is_none(), "an answer ends the failure");
    }
}
