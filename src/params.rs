//! Session parameters a client asked for (startup packet, `options -c`, and values
//! the server reported while lent to it), kept so any server lent to the client can
//! be made to match with SET/RESET before the client's first message.

use std::hash::BuildHasher;
use std::sync::Arc;

/// Parameters PostgreSQL reports with ParameterStatus and a pooler must keep per client.
pub const REPORTED: &[&str] = &[
    "application_name",
    "client_encoding",
    "datestyle",
    "intervalstyle",
    "timezone",
    "standard_conforming_strings",
    "search_path",
];

/// Startup packet keys that are not session settings.
pub const NOT_SETTINGS: &[&str] = &["user", "database", "options", "replication"];

/// A client's settings: lowercase names, sorted, with a hash for a cheap comparison
/// on every checkout. The list is shared: clones are cheap, and clients of a pool with
/// the same settings share one list (`Learned::intern`), so the comparison on
/// checkout is usually a pointer comparison.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientParams {
    list: Arc<Vec<(String, String)>>,
    hash: u64,
    /// Hash of the settings that may change what a statement parses to (all but
    /// `prepared::parse_neutral` ones): clients that differ in it do not share
    /// prepared statements on servers.
    parse_hash: u64,
}

/// No settings: one shared empty list, hashed like any other, so `same` holds between
/// empty lists however made and making one allocates nothing.
impl Default for ClientParams {
    fn default() -> Self {
        static EMPTY: std::sync::LazyLock<ClientParams> = std::sync::LazyLock::new(|| ClientParams::new(Vec::new()));
        EMPTY.clone()
    }
}

impl ClientParams {
    pub fn new(mut list: Vec<(String, String)>) -> Self {
        for (k, _) in list.iter_mut() {
            k.make_ascii_lowercase();
        }
        list.sort_by(|a, b| a.0.cmp(&b.0));
        // a later setting of the same name wins, as in a startup packet
        list.reverse();
        list.dedup_by(|a, b| a.0 == b.0);
        list.reverse();
        let mut p = ClientParams { list: Arc::new(list), hash: 0, parse_hash: 0 };
        p.rehash();
        p
    }

    fn rehash(&mut self) {
        use std::hash::{Hash, Hasher};
        let state = foldhash::fast::FixedState::default();
        self.hash = state.hash_one(&*self.list);
        let mut h = state.build_hasher();
        self.list.iter().filter(|(k, _)| !crate::prepared::parse_neutral(k.as_bytes())).for_each(|s| s.hash(&mut h));
        self.parse_hash = h.finish();
    }

    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// The hash of the settings that may change what statements parse to.
    pub fn parse_hash(&self) -> u64 {
        self.parse_hash
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.list.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        let i = self.list.binary_search_by(|(k, _)| k.as_str().cmp(name)).ok()?;
        Some(&self.list[i].1)
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    /// Records a value the server reported for a tracked parameter. Returns whether
    /// anything changed.
    pub fn set(&mut self, name: &str, value: &str) -> bool {
        let name = name.to_ascii_lowercase();
        match self.list.binary_search_by(|(k, _)| k.as_str().cmp(&name)) {
            Ok(i) if self.list[i].1 == value => return false,
            Ok(i) => Arc::make_mut(&mut self.list)[i].1 = value.to_string(),
            Err(i) => Arc::make_mut(&mut self.list).insert(i, (name, value.to_string())),
        }
        self.rehash();
        true
    }

    /// `application_name_add_host`: the client's address and port after its
    /// `application_name` ("app" when it sent none), as PgBouncer writes them.
    pub fn add_host(&mut self, peer: &crate::net::listener::Peer) {
        use crate::net::listener::Peer;
        let name = self.get("application_name").unwrap_or("app");
        let named = match peer {
            Peer::Tcp(addr) => format!("{name} - {addr}"),
            Peer::Unix => format!("{name} - unix"),
        };
        self.set("application_name", &named);
    }

    /// Drops a parameter (it falls back to the server default).
    pub fn remove(&mut self, name: &str) {
        if let Ok(i) = self.list.binary_search_by(|(k, _)| k.as_str().cmp(name)) {
            Arc::make_mut(&mut self.list).remove(i);
            self.rehash();
        }
    }

    /// Whether both hold the same settings.
    pub fn same(&self, other: &ClientParams) -> bool {
        Arc::ptr_eq(&self.list, &other.list) || (self.hash == other.hash && self.list == other.list)
    }

    /// Shares `other`'s list when both hold the same settings; returns whether it did.
    pub fn share(&mut self, other: &ClientParams) -> bool {
        let same = self.same(other);
        if same {
            self.list = other.list.clone();
        }
        same
    }

    /// Whether both are the one shared list.
    #[cfg(test)]
    pub fn is_shared_with(&self, other: &ClientParams) -> bool {
        Arc::ptr_eq(&self.list, &other.list)
    }

    /// The SQL that turns a server whose settings are `from` into one with `self`'s.
    /// None when nothing differs. Values go through `set_config`, which parses them as
    /// the startup packet does (`search_path=a,b` is a list of two, as with libpq);
    /// `ascii`: written in ASCII whatever they hold (`build::quote_literal`).
    pub fn diff_sql(&self, from: &ClientParams, ascii: bool) -> Option<String> {
        use crate::protocol::build::{quote_ident, quote_literal};
        let quote_literal = |s: &str| quote_literal(s, ascii);
        if self.same(from) {
            return None;
        }
        let sets: Vec<String> = self
            .list
            .iter()
            .filter(|(k, v)| from.get(k) != Some(v.as_str()))
            .map(|(k, v)| format!("pg_catalog.set_config({}, {}, false)", quote_literal(k), quote_literal(v)))
            .collect();
        let mut sql = String::new();
        if !sets.is_empty() {
            sql = format!("SELECT {};", sets.join(", "));
        }
        for (k, _) in from.list.iter() {
            if self.get(k).is_none() {
                sql.push_str(&format!("RESET {};", quote_ident(k)));
            }
        }
        (!sql.is_empty()).then_some(sql)
    }
}

pub fn is_reported(name: &str) -> bool {
    REPORTED.iter().any(|r| r.eq_ignore_ascii_case(name))
}

/// (name, value) pairs as a server reports them.
pub type ParamList = Vec<(String, String)>;

/// A session's settings: those it keeps (`kept`: asked for or set, less those equal to
/// a server default at login) and the server defaults it was told at login (`told`:
/// what it believes of every reported setting it did not set). A server that started
/// with other values than those told (a reload changed the database's `timezone`, the
/// server was restarted with other defaults) is given the told ones too, so a client
/// never finds a setting changed under it by the pooling; PgBouncer keeps each client's
/// values the same way. (A `RESET` the client runs gives it the default of the server
/// it runs on, which PostgreSQL tells it of, as after DISCARD ALL.)
#[derive(Debug)]
pub struct ClientSettings {
    pub kept: ClientParams,
    told: Arc<ParamList>,
    /// What a server started with `startup` is given, worked out from `kept` as it was
    /// (`from`); one kept, for the servers of a pool whose defaults moved.
    other: Option<Box<Other>>,
}

#[derive(Debug)]
struct Other {
    startup: Arc<ParamList>,
    from: ClientParams,
    want: ClientParams,
}

impl ClientSettings {
    pub fn new(kept: ClientParams, told: Arc<ParamList>) -> Self {
        ClientSettings { kept, told, other: None }
    }

    /// Whether a server that started with `startup` needs no more than `kept`.
    #[inline]
    pub fn told_as(&self, startup: &Arc<ParamList>) -> bool {
        Arc::ptr_eq(&self.told, startup)
    }

    /// The settings a server that started with `startup` must carry for this client.
    pub fn wanted_on(&mut self, startup: &Arc<ParamList>) -> ClientParams {
        if self.told_as(startup) {
            return self.kept.clone();
        }
        if let Some(o) = &self.other
            && Arc::ptr_eq(&o.startup, startup)
            && o.from.same(&self.kept)
        {
            return o.want.clone();
        }
        match carried_over(&self.kept, &self.told, startup) {
            // The two agree on every setting the client did not set: told as well.
            None => {
                self.told = startup.clone();
                self.other = None;
                self.kept.clone()
            }
            Some(want) => {
                let (startup, from) = (startup.clone(), self.kept.clone());
                self.other = Some(Box::new(Other { startup, from, want: want.clone() }));
                want
            }
        }
    }

    /// DISCARD ALL ran on a server that started with `startup`: the client's settings
    /// are that server's defaults now (PostgreSQL told it of each one that changed).
    pub fn discarded(&mut self, startup: &Arc<ParamList>) {
        *self = ClientSettings::new(ClientParams::default(), startup.clone());
    }
}

/// `kept`, plus the value it was told of each reported setting it did not set where a
/// server that started with `startup` has another; None when there is none.
fn carried_over(kept: &ClientParams, told: &ParamList, startup: &ParamList) -> Option<ClientParams> {
    let mut want: Option<ClientParams> = None;
    for (name, value) in told {
        let theirs = || startup.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v);
        if !is_reported(name) || theirs() == Some(value) {
            continue;
        }
        let name = name.to_ascii_lowercase();
        if kept.get(&name).is_none() {
            want.get_or_insert_with(|| kept.clone()).set(&name, value);
        }
    }
    want
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(list: &[(&str, &str)]) -> ClientParams {
        ClientParams::new(list.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect())
    }

    fn list(l: &[(&str, &str)]) -> Arc<ParamList> {
        Arc::new(l.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect())
    }

    #[test]
    fn servers_started_otherwise_get_the_values_a_client_was_told() {
        let told = list(&[("TimeZone", "UTC"), ("DateStyle", "ISO, MDY"), ("server_version", "15.1")]);
        let mut s = ClientSettings::new(p(&[("application_name", "a")]), told.clone());
        assert!(s.told_as(&told));
        // Only a reported setting the client did not set, where the server's differs.
        let moved = list(&[("TimeZone", "Asia/Tokyo"), ("DateStyle", "ISO, MDY"), ("server_version", "15.2")]);
        assert!(!s.told_as(&moved));
        let want = s.wanted_on(&moved);
        assert_eq!(want, p(&[("application_name", "a"), ("timezone", "UTC")]));
        assert!(s.wanted_on(&moved).is_shared_with(&want), "worked out once");
        // A setting the client made its own wins over the value it was told.
        s.kept.set("TimeZone", "Europe/Paris");
        assert_eq!(s.wanted_on(&moved), p(&[("application_name", "a"), ("timezone", "Europe/Paris")]));
        // Servers that differ only where it does not matter: told as well, from then on.
        let mut s = ClientSettings::new(ClientParams::default(), told);
        let upgraded = list(&[("TimeZone", "UTC"), ("DateStyle", "ISO, MDY"), ("server_version", "15.2")]);
        assert!(s.wanted_on(&upgraded).same(&ClientParams::default()));
        assert!(s.told_as(&upgraded));
        s.discarded(&moved);
        assert!(s.told_as(&moved) && s.kept.is_empty());
    }

    #[test]
    fn normalizes_and_dedups() {
        let a = p(&[("TimeZone", "UTC"), ("application_name", "x"), ("timezone", "Europe/Paris")]);
        assert_eq!(a.get("timezone"), Some("Europe/Paris"));
        assert_eq!(a.iter().count(), 2);
        assert_eq!(a, p(&[("application_name", "x"), ("TIMEZONE", "Europe/Paris")]));
    }

    #[test]
    fn diff_sets_and_resets() {
        let a = p(&[("timezone", "UTC"), ("application_name", "a")]);
        let b = p(&[("application_name", "b"), ("search_path", "s")]);
        assert_eq!(a.diff_sql(&a, false), None);
        let sql = a.diff_sql(&b, false).unwrap();
        assert_eq!(
            sql,
            "SELECT pg_catalog.set_config(E'application_name', E'a', false), \
             pg_catalog.set_config(E'timezone', E'UTC', false);RESET \"search_path\";"
        );
        assert_eq!(ClientParams::default().diff_sql(&ClientParams::default(), false), None);
    }

    #[test]
    fn empty_lists_are_the_same_however_made() {
        assert!(ClientParams::default().same(&p(&[])));
        assert!(ClientParams::default().is_shared_with(&ClientParams::default()));
        let mut a = p(&[("timezone", "UTC")]);
        a.remove("timezone");
        assert!(a.same(&ClientParams::default()));
    }

    #[test]
    fn set_tracks_changes() {
        let mut a = p(&[("timezone", "UTC")]);
        let h = a.hash();
        assert!(!a.set("TimeZone", "UTC"));
        assert!(a.set("TimeZone", "Asia/Tokyo"));
        assert_ne!(a.hash(), h);
        assert!(a.set("DateStyle", "ISO, MDY"));
        assert_eq!(a.get("datestyle"), Some("ISO, MDY"));
        a.remove("datestyle");
        assert_eq!(a.get("datestyle"), None);
    }

    #[test]
    fn add_host_follows_the_name_with_the_peer() {
        use crate::net::listener::Peer;
        let mut a = p(&[("application_name", "web")]);
        a.add_host(&Peer::Tcp("10.0.0.7:51234".parse().unwrap()));
        assert_eq!(a.get("application_name"), Some("web - 10.0.0.7:51234"));
        let mut b = ClientParams::default();
        b.add_host(&Peer::Tcp("[::1]:40022".parse().unwrap()));
        assert_eq!(b.get("application_name"), Some("app - [::1]:40022"));
        assert!(ClientParams::default().is_empty(), "the shared empty list is left alone");
        let mut c = p(&[("timezone", "UTC")]);
        c.add_host(&Peer::Unix);
        assert_eq!((c.get("application_name"), c.get("timezone")), (Some("app - unix"), Some("UTC")));
    }
}
