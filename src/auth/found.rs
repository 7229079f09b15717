//! The users `auth_query` lookups found, per database, shared by every `UserStore` a
//! reload builds. A user is entered once a client has logged in as it (a failed login
//! enters nothing, so probing names adds nothing), and replaced when a later lookup
//! finds another password. Lookups are numbered as they start: the result of an older
//! one never replaces a newer one's (a login that began before an `ALTER ROLE ...
//! PASSWORD` and ended after a later login's).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

use super::UserAuth;

#[derive(Debug, Default)]
pub struct FoundUsers {
    begun: AtomicU64,
    by_db: Mutex<foldhash::HashMap<String, UsersOfDb>>,
}

/// The users found in one database.
#[derive(Debug)]
struct UsersOfDb {
    /// user name → (number of the lookup that found it, user).
    users: foldhash::HashMap<String, (u64, Arc<UserAuth>)>,
    /// When a client last logged in as one of them (`drop_database` spares users that
    /// a login entered after its pools went unused).
    adopted: std::time::Instant,
}

impl FoundUsers {
    /// Numbers a lookup as it starts.
    pub fn begin(&self) -> u64 {
        self.begun.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub fn get(&self, database: &str, name: &str) -> Option<Arc<UserAuth>> {
        self.by_db.lock().get(database)?.users.get(name).map(|(_, u)| u.clone())
    }

    /// Enters `user`, found by lookup `seq`, that a client logged in as. Gives the user
    /// now entered, and whether it is new or has another password (its pool then takes
    /// the new server login). One with the same password stays, with the SCRAM keys it
    /// cached; one a newer lookup entered stays too.
    pub fn adopt(&self, database: &str, user: Arc<UserAuth>, seq: u64) -> (Arc<UserAuth>, bool) {
        let mut by_db = self.by_db.lock();
        let now = std::time::Instant::now();
        let of_db =
            by_db.entry(database.to_string()).or_insert_with(|| UsersOfDb { users: Default::default(), adopted: now });
        of_db.adopted = now;
        let users = &mut of_db.users;
        match users.get_mut(&user.name) {
            Some((at, known)) if known.secret == user.secret => {
                *at = (*at).max(seq);
                return (known.clone(), false);
            }
            Some((at, known)) if *at > seq => return (known.clone(), false),
            _ => {}
        }
        users.insert(user.name.clone(), (seq, user.clone()));
        (user, true)
    }

    /// Lookup `seq` found no `name` in `database` (the role was dropped, or may no
    /// longer log in): forgotten, unless a newer lookup found it; its pool closes at the
    /// next reload.
    pub fn forget(&self, database: &str, name: &str, seq: u64) {
        let mut by_db = self.by_db.lock();
        if let Some(of_db) = by_db.get_mut(database)
            && of_db.users.get(name).is_some_and(|(at, _)| *at < seq)
        {
            of_db.users.remove(name);
            if of_db.users.is_empty() {
                by_db.remove(database);
            }
        }
    }

    /// Forgets the users found in `database` (a fallback-served database whose pools
    /// were all dropped as unused since `unused_since`), unless a login entered one
    /// after that (it is about to make the database's pool again).
    pub fn drop_database(&self, database: &str, unused_since: std::time::Instant) {
        let mut by_db = self.by_db.lock();
        if by_db.get(database).is_some_and(|of_db| of_db.adopted < unused_since) {
            by_db.remove(database);
        }
    }

    /// Keeps the users of the databases `keep` accepts (those that still have lookups
    /// after a reload).
    pub fn retain_databases(&self, keep: impl Fn(&str) -> bool) {
        self.by_db.lock().retain(|db, _| keep(db));
    }

    /// The names of the users found in the databases `keep` accepts, each once, sorted.
    pub fn names(&self, keep: impl Fn(&str) -> bool) -> Vec<String> {
        let by_db = self.by_db.lock();
        let names: std::collections::BTreeSet<&String> =
            by_db.iter().filter(|(db, _)| keep(db)).flat_map(|(_, of_db)| of_db.users.keys()).collect();
        names.into_iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::Secret;

    fn user(password: &str) -> Arc<UserAuth> {
        Arc::new(UserAuth::found("u", Some(Secret::Plain(password.into()))))
    }

    #[test]
    fn an_older_lookup_never_replaces_a_newer_ones_user() {
        let found = FoundUsers::default();
        let (old, new) = (found.begin(), found.begin());
        let (entered, changed) = found.adopt("db", user("new"), new);
        assert!(changed);
        // The older lookup (the password before the change) ends last.
        let (kept, changed) = found.adopt("db", user("old"), old);
        assert!(!changed && Arc::ptr_eq(&kept, &entered));
        // The same password again keeps the entry (and its cached keys).
        let (same, changed) = found.adopt("db", user("new"), found.begin());
        assert!(!changed && Arc::ptr_eq(&same, &entered));
        // An older lookup that found nothing does not forget it; a newer one does.
        found.forget("db", "u", old);
        assert!(found.get("db", "u").is_some());
        found.forget("db", "u", found.begin());
        assert!(found.get("db", "u").is_none());
        // Per database.
        found.adopt("db", user("x"), found.begin());
        assert!(found.get("other", "u").is_none());
        assert_eq!(found.names(|d| d == "db"), vec!["u".to_string()]);
        assert!(found.names(|d| d == "other").is_empty());
        // Dropped with its database's pools, unless a login entered it since they went
        // unused.
        let before = std::time::Instant::now();
        found.drop_database("db", before.checked_sub(std::time::Duration::from_secs(1)).expect("a second of uptime"));
        assert!(found.get("db", "u").is_some());
        found.drop_database("db", std::time::Instant::now());
        assert!(found.get("db", "u").is_none());
        found.adopt("db", user("x"), found.begin());
        found.retain_databases(|d| d != "db");
        assert!(found.get("db", "u").is_none());
    }
}
