//! What a pool learns from its servers about clients' session settings, so logins in
//! transaction and statement mode need no server: the server defaults (ParameterStatus
//! of a fresh connection), the server's spelling of setting values clients sent, the
//! distinct settings lists seen (shared, so the check on each checkout is a pointer
//! comparison), and the finished login reply for each distinct set of startup settings.

use std::sync::Arc;

use bytes::Bytes;
use foldhash::HashMap;
use parking_lot::Mutex;

use super::ParamList;
use crate::params::ClientParams;

/// How many distinct settings lists (and login replies) a pool keeps.
const MAX_SETS: usize = 64;
/// How many learned value spellings a pool keeps.
const MAX_SPELLINGS: usize = 10_000;
/// How many bytes of learned spellings (names, values and spellings) a pool keeps:
/// clients choose the values (an `application_name` may be kilobytes long), so the
/// count alone would let distinct long values hold ~100 MB per pool.
const MAX_SPELLING_BYTES: usize = 1 << 20;

#[derive(Debug, Default)]
pub struct Learned {
    /// ParameterStatus values of a fresh server connection: what clients are told at
    /// login before any server is lent to them.
    defaults: Mutex<Option<Arc<ParamList>>>,
    /// Server spellings of client-supplied setting values already proven valid:
    /// name → the client's value → the server's spelling of it.
    canonical: Mutex<Spellings>,
    /// Distinct client settings seen at login (bounded), shared by equal clients.
    param_sets: Mutex<Vec<ClientParams>>,
    /// Login replies already worked out, by the settings the client asked for.
    replies: Mutex<Vec<Remembered>>,
}

/// Server spellings of client values (`Learned::canonical`), and what they hold.
#[derive(Debug, Default)]
struct Spellings {
    /// Setting name → the client's value → the server's spelling of it.
    by_name: HashMap<String, HashMap<String, Arc<str>>>,
    count: usize,
    bytes: usize,
}

/// What a client is told at login and the settings its session keeps.
#[derive(Debug, Clone)]
pub struct LoginReply {
    /// The settings asked for less those equal to a server default, interned.
    pub kept: ClientParams,
    /// The ParameterStatus messages of the login reply.
    pub status: Bytes,
    /// The server defaults it was worked out from (`ClientSettings`): it is used only
    /// while they are still the pool's.
    pub told: Arc<ParamList>,
}

#[derive(Debug)]
struct Remembered {
    asked: ClientParams,
    reply: LoginReply,
}

impl Learned {
    pub fn defaults(&self) -> Option<Arc<ParamList>> {
        self.defaults.lock().clone()
    }

    /// The parameters a fresh server connection reported at login, shared with the
    /// pool's other connections that reported the same (the defaults, when they are
    /// equal). When `learn`, other values than those known (a restarted or upgraded
    /// server) become the defaults, which retires the login replies worked out from the
    /// old ones; a connection opened before a reload moved the pool does not `learn`.
    pub fn share(&self, startup: &Arc<ParamList>, learn: bool) -> Arc<ParamList> {
        let mut defaults = self.defaults.lock();
        match defaults.as_ref() {
            Some(known) if **known == **startup => known.clone(),
            _ if learn => defaults.insert(startup.clone()).clone(),
            _ => startup.clone(),
        }
    }

    /// The pool now reaches another server or database: nothing learned holds.
    pub fn forget(&self) {
        *self.defaults.lock() = None;
        *self.canonical.lock() = Spellings::default();
        self.replies.lock().clear();
    }

    pub fn canonical(&self, name: &str, value: &str) -> Option<Arc<str>> {
        self.canonical.lock().by_name.get(name)?.get(value).cloned()
    }

    /// The server's spelling of a client's value: for an `application_name` of at most
    /// 63 printable ASCII characters the value itself (PostgreSQL keeps such a name as
    /// sent; it cuts longer ones and replaces other characters), else as learned.
    /// (Names that differ per client, as `application_name_add_host` makes them, need
    /// no server at login.)
    pub fn spelling(&self, name: &str, value: &str) -> Option<Arc<str>> {
        if name == "application_name" && value.len() < 64 && value.bytes().all(|b| (b' '..=b'~').contains(&b)) {
            return Some(value.into());
        }
        self.canonical(name, value)
    }

    /// Keeps the server's spelling of a client's value, within the pool's caps on
    /// count and bytes (past them the value is checked by a server again at the next
    /// such login).
    pub fn learn_canonical(&self, name: &str, value: &str, canonical: &str) {
        let mut c = self.canonical.lock();
        let known = c.by_name.get(name).and_then(|v| v.get(value)).map(|old| old.len());
        let bytes = match known {
            // Spelled anew (an upgraded server): only the spelling's size changes.
            Some(old) => c.bytes - old + canonical.len(),
            None => c.bytes + name.len() + value.len() + canonical.len(),
        };
        if bytes > MAX_SPELLING_BYTES || (known.is_none() && c.count >= MAX_SPELLINGS) {
            return;
        }
        c.by_name.entry(name.to_string()).or_default().insert(value.to_string(), canonical.into());
        c.bytes = bytes;
        c.count += usize::from(known.is_none());
    }

    /// Makes `p` share the list of an earlier client's equal settings, so the check on
    /// every checkout (does the server carry them?) is a pointer comparison.
    pub fn intern(&self, p: &mut ClientParams) {
        let mut known = self.param_sets.lock();
        if !known.iter().any(|k| p.share(k)) && known.len() < MAX_SETS {
            known.push(p.clone());
        }
    }

    /// The login reply for a client asking for `asked`, if one was worked out from
    /// the current defaults.
    pub fn reply(&self, asked: &ClientParams) -> Option<LoginReply> {
        let defaults = self.defaults()?;
        let replies = self.replies.lock();
        let r = replies.iter().find(|r| Arc::ptr_eq(&r.reply.told, &defaults) && r.asked.same(asked))?;
        Some(r.reply.clone())
    }

    /// Keeps a login reply worked out from the defaults it names (bounded; stale ones
    /// are replaced).
    pub fn remember_reply(&self, asked: ClientParams, reply: &LoginReply) {
        let defaults = &reply.told;
        if !self.defaults().is_some_and(|d| Arc::ptr_eq(&d, defaults)) {
            return;
        }
        let mut replies = self.replies.lock();
        replies.retain(|r| Arc::ptr_eq(&r.reply.told, defaults));
        if replies.len() < MAX_SETS && !replies.iter().any(|r| r.asked.same(&asked)) {
            replies.push(Remembered { asked, reply: reply.clone() });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(list: &[(&str, &str)]) -> ClientParams {
        ClientParams::new(list.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect())
    }

    /// The defaults learned from a connection that reported `zone`.
    fn learn(l: &Learned, zone: &str) -> Arc<ParamList> {
        l.share(&Arc::new(vec![("TimeZone".to_string(), zone.to_string())]), true)
    }

    fn reply(kept: &ClientParams, status: &'static [u8], told: &Arc<ParamList>) -> LoginReply {
        LoginReply { kept: kept.clone(), status: Bytes::from_static(status), told: told.clone() }
    }

    #[test]
    fn application_names_postgresql_keeps_as_sent_are_spelled_without_a_server() {
        let l = Learned::default();
        let name = "web - [::1]:5000";
        assert_eq!(l.spelling("application_name", name).as_deref(), Some(name));
        assert_eq!(l.spelling("application_name", &"a".repeat(63)).map(|s| s.len()), Some(63));
        assert!(l.spelling("application_name", &"a".repeat(64)).is_none(), "cut by PostgreSQL");
        assert!(l.spelling("application_name", "café").is_none());
        assert!(l.spelling("application_name", "tab\there").is_none());
        assert!(l.spelling("timezone", "UTC").is_none(), "other settings are learned");
        l.learn_canonical("timezone", "utc", "UTC");
        assert_eq!(l.spelling("timezone", "utc").as_deref(), Some("UTC"));
    }

    #[test]
    fn replies_hold_only_for_the_defaults_they_came_from() {
        let l = Learned::default();
        let asked = params(&[("application_name", "a")]);
        assert!(l.reply(&asked).is_none(), "no defaults yet");
        let d = learn(&l, "UTC");
        assert!(Arc::ptr_eq(&d, &l.defaults().unwrap()));
        l.remember_reply(asked.clone(), &reply(&asked, b"S", &d));
        assert_eq!(l.reply(&asked).unwrap().status, Bytes::from_static(b"S"));
        assert!(l.reply(&params(&[("application_name", "b")])).is_none());
        // The same defaults reported again keep the reply; other ones retire it.
        assert!(Arc::ptr_eq(&d, &learn(&l, "UTC")), "shared");
        let other = Arc::new(vec![("TimeZone".to_string(), "Asia/Tokyo".to_string())]);
        assert!(Arc::ptr_eq(&d, &l.share(&Arc::new((*d).clone()), false)), "equal values shared");
        assert!(
            Arc::ptr_eq(&other, &l.share(&other, false)) && l.defaults().unwrap()[0].1 == "UTC",
            "others not learned"
        );
        assert!(l.reply(&asked).is_some());
        learn(&l, "Europe/Paris");
        assert!(l.reply(&asked).is_none());
        l.remember_reply(asked.clone(), &reply(&asked, b"S", &l.defaults().unwrap()));
        // Forgotten (the pool moved to another server): the old reply is not used.
        l.forget();
        learn(&l, "UTC");
        assert!(l.reply(&asked).is_none());
        assert!(l.canonical("timezone", "utc").is_none());
        // A reply worked out from defaults replaced meanwhile is not kept, and does
        // not displace current ones.
        let now = l.defaults().unwrap();
        l.remember_reply(asked.clone(), &reply(&asked, b"T", &now));
        l.remember_reply(asked.clone(), &reply(&asked, b"", &d));
        assert_eq!(l.reply(&asked).unwrap().status, Bytes::from_static(b"T"));
    }

    #[test]
    fn spellings_stop_at_the_cap() {
        let l = Learned::default();
        for i in 0..MAX_SPELLINGS {
            l.learn_canonical("application_name", &format!("app {i}"), &format!("app {i}"));
        }
        assert_eq!(l.canonical("application_name", "app 0").as_deref(), Some("app 0"));
        let last = format!("app {}", MAX_SPELLINGS - 1);
        assert_eq!(l.canonical("application_name", &last).as_deref(), Some(last.as_str()));
        l.learn_canonical("timezone", "utc", "UTC");
        l.learn_canonical("application_name", "one more", "one more");
        assert!(l.canonical("timezone", "utc").is_none(), "past the cap nothing is learned");
        assert!(l.canonical("application_name", "one more").is_none());
    }

    /// Long values stop at the byte cap, well before the count's (a client can choose
    /// kilobyte-long values); values already learned stay.
    #[test]
    fn long_spellings_stop_at_the_byte_cap() {
        let l = Learned::default();
        let long = |i: usize| format!("{i:08}{}", "x".repeat(8_000));
        let fits = MAX_SPELLING_BYTES / ("application_name".len() + 2 * long(0).len());
        for i in 0..fits + 10 {
            l.learn_canonical("application_name", &long(i), &long(i));
        }
        assert!(fits < MAX_SPELLINGS / 10);
        assert!(l.canonical("application_name", &long(fits - 1)).is_some());
        assert!(l.canonical("application_name", &long(fits)).is_none(), "past the byte cap nothing is learned");
        assert!(l.canonical.lock().bytes <= MAX_SPELLING_BYTES);
        // Learning a value again does not count it twice; a new spelling of a known
        // value replaces the old one, its bytes counted once.
        let bytes = l.canonical.lock().bytes;
        l.learn_canonical("application_name", &long(0), &long(0));
        let c = l.canonical.lock();
        assert_eq!((c.count, c.bytes), (fits, bytes));
        drop(c);
        l.learn_canonical("application_name", &long(0), "short");
        assert_eq!(l.canonical("application_name", &long(0)).as_deref(), Some("short"));
        assert_eq!(l.canonical.lock().bytes, bytes - long(0).len() + "short".len());
    }

    #[test]
    fn equal_settings_share_one_list() {
        let l = Learned::default();
        let mut a = params(&[("search_path", "s")]);
        let mut b = params(&[("search_path", "s")]);
        l.intern(&mut a);
        l.intern(&mut b);
        assert!(a.is_shared_with(&b));
    }
}
