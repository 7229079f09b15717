use std::path::Path;

use super::*;

/// Pools of databases `a` and `b` for users `u1` and `u2`, with `limits` added to
/// `[general]`.
fn pools_with(limits: &str) -> (Pools, [Arc<Pool>; 3]) {
    let text = format!(
        "[general]\n{limits}\n[databases.a]\nhost = \"127.0.0.1\"\n[databases.b]\nhost = \"127.0.0.1\"\n\
         [users.u1]\npassword = \"p1\"\n[users.u2]\npassword = \"p2\"\n"
    );
    let cfg = Config::parse(&text, Path::new("sluice.toml")).expect("a valid config");
    let users = UserStore::from_config(&cfg).expect("valid users");
    let pools = Pools::default();
    let get = |db, user| pools.get(&cfg, &users, db, user).expect("a configured database");
    let trio = [get("a", "u1"), get("a", "u2"), get("b", "u1")];
    (pools, trio)
}

#[test]
fn room_is_made_only_by_pools_under_every_full_limit() {
    // (a, u1) starved on its user's limit: (b, u1) shares it, (a, u2) only the
    // database's, which has room.
    let (_pools, [a_u1, a_u2, b_u1]) = pools_with("max_user_connections = 1");
    assert!(!a_u2.can_make_room_for(&a_u1), "nothing is full yet");
    assert!(ConnLimit::acquire_pair(&b_u1.db_limit, &b_u1.user_limit));
    assert!(b_u1.can_make_room_for(&a_u1));
    assert!(!a_u2.can_make_room_for(&a_u1), "its connections count against another user");
    // Both of (a, u1)'s limits full: only a pool under both would help.
    let (_pools, [a_u1, a_u2, b_u1]) = pools_with("max_user_connections = 1\nmax_db_connections = 1");
    assert!(ConnLimit::acquire_pair(&a_u2.db_limit, &a_u2.user_limit));
    assert!(ConnLimit::acquire_pair(&b_u1.db_limit, &b_u1.user_limit));
    assert!(a_u1.db_limit.is_full() && a_u1.user_limit.is_full());
    assert!(!a_u2.can_make_room_for(&a_u1) && !b_u1.can_make_room_for(&a_u1));
}

#[test]
fn a_login_with_an_older_config_keeps_the_reloaded_limit() {
    let (pools, [a_u1, ..]) = pools_with("max_db_connections = 1");
    let newer = "[general]\nmax_db_connections = 5\n[databases.a]\nhost = \"127.0.0.1\"\n\
                 [databases.b]\nhost = \"127.0.0.1\"\n[users.u1]\npassword = \"p1\"\n[users.u2]\npassword = \"p2\"\n";
    let newer = Config::parse(newer, Path::new("sluice.toml")).expect("a valid config");
    pools.reload(&newer, &UserStore::from_config(&newer).expect("valid users"));
    assert_eq!(a_u1.db_limit.max(), 5);
    // A login still holding the old config creates a new pool of `a`: the limit
    // stays at 5.
    let old = Config::parse(
        "[general]\nmax_db_connections = 1\n[databases.a]\nhost = \"127.0.0.1\"\n[users.u3]\npassword = \"p3\"\n",
        Path::new("sluice.toml"),
    )
    .expect("a valid config");
    let a_u3 = pools.get(&old, &UserStore::from_config(&old).expect("valid users"), "a", "u3").expect("a pool");
    assert!(Arc::ptr_eq(&a_u3.db_limit, &a_u1.db_limit));
    assert_eq!(a_u1.db_limit.max(), 5);
}

/// A database's own user and password: its server login (and the SCRAM keys it
/// caches) survives a reload that leaves them as they were, not one that changes them.
#[test]
fn a_databases_own_login_survives_a_reload_that_keeps_it() {
    let text = |pw: &str| {
        format!(
            "[databases.a]\nhost = \"127.0.0.1\"\nuser = \"owner\"\npassword = \"{pw}\"\n\
             [users.u1]\npassword = \"p1\"\n[users.owner]\npassword = \"o\"\n"
        )
    };
    let cfg = |pw: &str| Config::parse(&text(pw), Path::new("sluice.toml")).expect("a valid config");
    let (first, same, changed) = (cfg("x"), cfg("x"), cfg("y"));
    let users = UserStore::from_config(&first).expect("valid users");
    let pools = Pools::default();
    let pool = pools.get(&first, &users, "a", "u1").expect("a pool");
    let login = pool.settings().login.clone();
    pools.reload(&same, &users);
    assert!(Arc::ptr_eq(&pool.settings().login, &login));
    pools.reload(&changed, &users);
    assert!(!Arc::ptr_eq(&pool.settings().login, &login));
    assert!(!pool.settings().login.same_credentials(&login));
    // An md5 hash is used as one, not sent as a password.
    let hash = crate::auth::md5::password_hash("owner", "x");
    pools.reload(&cfg(&hash), &users);
    let login = pool.settings().login.clone();
    assert_eq!((login.md5.as_deref(), login.password.as_deref()), (Some(hash.as_str()), None));
}

/// A pool dropped by a reload (its user taken away) leaves its SHOW STATS counters
/// with its database, so the totals never go back, also when the database's last pool
/// goes (a configured database keeps its SHOW STATS row); they go with the database.
#[test]
fn a_dropped_pools_counters_stay_with_its_database() {
    let cfg = |users: &str| {
        let text = format!("[databases.a]\nhost = \"127.0.0.1\"\n{users}");
        Config::parse(&text, Path::new("sluice.toml")).expect("a valid config")
    };
    let both = cfg("[users.u1]\npassword = \"p\"\n[users.u2]\npassword = \"p\"\n");
    let users = UserStore::from_config(&both).expect("valid users");
    let pools = Pools::default();
    for user in ["u1", "u2"] {
        let pool = pools.get(&both, &users, "a", user).expect("a pool");
        pool.stats.xact_count.fetch_add(5, std::sync::atomic::Ordering::Relaxed);
    }
    let retired = |pools: &Pools| {
        let mut v = Vec::new();
        pools.retired_stats(|db, s| v.push((db.to_string(), s.xact_count.load(std::sync::atomic::Ordering::Relaxed))));
        v
    };
    let one = cfg("[users.u1]\npassword = \"p\"\n");
    pools.reload(&one, &UserStore::from_config(&one).unwrap());
    assert_eq!(retired(&pools), [("a".to_string(), 5)]);
    let none = cfg("");
    pools.reload(&none, &UserStore::from_config(&none).unwrap());
    assert_eq!(retired(&pools), [("a".to_string(), 10)], "the last pool's counters went");
    // Removed with no pool left (none was made again since): its counters go too.
    let gone = Config::parse("[databases.b]\nhost = \"127.0.0.1\"\n", Path::new("sluice.toml")).unwrap();
    pools.reload(&gone, &UserStore::from_config(&gone).unwrap());
    assert_eq!(retired(&pools), [], "a database removed keeps counters");
}

/// A refresh of a pool's login read before a reload is refused (the caller reads
/// the configuration again) rather than putting the older settings back: here the
/// older configuration had the pool's database on another host.
#[test]
fn a_login_refresh_read_before_a_reload_is_refused() {
    let cfg = |host: &str| {
        let text = format!("[databases.a]\nhost = \"{host}\"\n[users.u1]\npassword = \"p1\"\n");
        Config::parse(&text, Path::new("sluice.toml")).expect("a valid config")
    };
    let (old, new) = (cfg("127.0.0.1"), cfg("127.0.0.2"));
    let users = UserStore::from_config(&old).expect("valid users");
    let pools = Pools::default();
    let pool = pools.get(&old, &users, "a", "u1").expect("a pool");
    let seen = pools.reloads();
    pools.reload(&new, &users);
    let host = |p: &Pool| p.settings().target.addr.host.to_string();
    assert_eq!(host(&pool), "127.0.0.2");
    assert!(pools.refresh_login(seen, &old, &users, "a", "u1").is_err());
    assert_eq!(host(&pool), "127.0.0.2");
    assert!(pools.refresh_login(pools.reloads(), &new, &users, "a", "u1").is_ok());
}

/// The lookups' pool is one of its own, beside the pool clients of `auth_user` get,
/// also in a database with a forced user (where `auth_user` has no client pool); a
/// reload that takes the lookups away closes it, and a user a lookup found has a
/// pool only in the database it was found in.
#[test]
fn lookups_have_pools_of_their_own() {
    use crate::auth::{Secret, UserAuth, query::lookup_for};
    let text = |lookups: &str| {
        format!(
            "[general]\n{lookups}\n[databases.a]\nhost = \"127.0.0.1\"\n[databases.f]\nhost = \"127.0.0.1\"\n\
             user = \"owner\"\npassword = \"o\"\n[users.auth]\npassword = \"p\"\n"
        )
    };
    let cfg = Config::parse(&text("auth_user = \"auth\""), Path::new("sluice.toml")).expect("a valid config");
    let users = UserStore::from_config(&cfg).expect("valid users");
    let pools = Pools::default();
    let seen = pools.reloads();
    let lookup = lookup_for(&cfg, "a").expect("lookups");
    let for_lookups = pools.lookup_pool(seen, &cfg, &users, &lookup).unwrap().expect("a lookup pool");
    let for_clients = pools.get(&cfg, &users, "a", "auth").expect("auth's own pool");
    assert!(!Arc::ptr_eq(&for_lookups, &for_clients));
    assert!(!pools.all().iter().any(|p| Arc::ptr_eq(p, &for_lookups)), "SHOW POOLS does not list it");
    assert!(pools.of(Some("a")).iter().any(|p| Arc::ptr_eq(p, &for_lookups)), "PAUSE a reaches it");
    let forced = lookup_for(&cfg, "f").expect("lookups");
    let in_forced = pools.lookup_pool(seen, &cfg, &users, &forced).unwrap().expect("a lookup pool");
    assert_eq!((in_forced.key.database.as_str(), in_forced.key.user.as_str()), ("f", "auth"));
    assert_eq!(pools.get(&cfg, &users, "f", "auth").expect("the forced pool").key.user, "owner");
    // A found user: a pool in its database only.
    let found = Arc::new(UserAuth::found("dyn", Some(Secret::Plain("x".into()))));
    users.found().adopt("a", found, users.found().begin());
    assert!(pools.get(&cfg, &users, "a", "dyn").is_some());
    let no_lookups = Config::parse(&text(""), Path::new("sluice.toml")).expect("a valid config");
    assert!(pools.get(&no_lookups, &users, "a", "dyn").is_none());
    // The lookups go with the reload that removes them.
    pools.reload(&no_lookups, &users);
    assert_eq!(pools.upkeep().len(), pools.all().len());
    assert!(!pools.all().iter().any(|p| p.key.user == "dyn"), "the found user's pool is closed");
}

/// The fallback entry's own lookups (its `auth_user` and `auth_dbname`) have their
/// pool, for the databases it serves.
#[test]
fn the_fallback_entrys_own_lookups_have_a_pool() {
    use crate::auth::query::lookup_for;
    let text = "[databases.\"*\"]\nhost = \"127.0.0.1\"\nauth_user = \"fb\"\nauth_dbname = \"meta\"\n\
                [databases.meta]\nhost = \"127.0.0.1\"\n[users.fb]\npassword = \"p\"\n";
    let cfg = Config::parse(text, Path::new("sluice.toml")).expect("a valid config");
    let users = UserStore::from_config(&cfg).expect("valid users");
    let pools = Pools::default();
    let lookup = lookup_for(&cfg, "anything").expect("the fallback's lookups");
    assert_eq!((lookup.user, lookup.database), ("fb", "meta"));
    let pool = pools.lookup_pool(pools.reloads(), &cfg, &users, &lookup).unwrap();
    assert_eq!(pool.map(|p| p.key.database.clone()).as_deref(), Some("meta"));
    pools.reload(&cfg, &users);
    assert_eq!(pools.upkeep().len(), 1, "a reload closed the lookups' pool");
}

/// The pools of databases the fallback entry serves go once unused, with their
/// lookups' pools, the users found there and their limits; one a client holds stays
/// until it lets go, and a paused database keeps its pools.
#[test]
fn unused_fallback_pools_go_unless_held_or_paused() {
    use crate::auth::{Secret, UserAuth, query::lookup_for};
    let text = "[general]\nautodb_idle_timeout = 0.001\nauth_user = \"auth\"\n[databases.\"*\"]\n\
                host = \"127.0.0.1\"\n[users.auth]\npassword = \"p\"\n[users.u]\npassword = \"p\"\n";
    let cfg = Config::parse(text, Path::new("sluice.toml")).expect("a valid config");
    let users = UserStore::from_config(&cfg).expect("valid users");
    let pools = Pools::default();
    let held = pools.get(&cfg, &users, "x", "u").expect("a pool of x");
    drop(pools.get(&cfg, &users, "y", "u").expect("a pool of y"));
    drop(pools.get(&cfg, &users, "w", "u").expect("a pool of w"));
    pools.pause(Some("w"));
    // A database with a client connected (`busy`) keeps its pool.
    drop(pools.get(&cfg, &users, "v", "u").expect("a pool of v"));
    let lookup = lookup_for(&cfg, "z").expect("lookups");
    drop(pools.lookup_pool(pools.reloads(), &cfg, &users, &lookup).unwrap().expect("a lookup pool"));
    let found = Arc::new(UserAuth::found("dyn", Some(Secret::Plain("x".into()))));
    users.found().adopt("y", found, users.found().begin());
    let retire_until = |done: &dyn Fn() -> bool| {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while !done() && std::time::Instant::now() < deadline {
            let now = std::time::Instant::now();
            pools.retire_unused_fallback_pools(pools.reloads(), &cfg, users.found(), &|db| db == "v", now);
        }
        done()
    };
    let dbs = || pools.upkeep().iter().map(|p| p.key.database.clone()).collect::<Vec<_>>();
    assert!(retire_until(&|| !dbs().contains(&"y".to_string())), "{:?}", dbs());
    assert!(retire_until(&|| !dbs().contains(&"z".to_string())), "the lookups' pool stays: {:?}", dbs());
    let kept = ["x", "w", "v"].map(String::from);
    assert!(kept.iter().all(|d| dbs().contains(d)), "{:?}", dbs());
    assert!(users.found().get("y", "dyn").is_none(), "the user found in y stays");
    assert!(!pools.db_limits.lock().contains_key("y"), "y's limit stays");
    // A reload since the janitor read its config: nothing goes in that pass.
    drop(held);
    pools.reload(&cfg, &users);
    pools.retire_unused_fallback_pools(0, &cfg, users.found(), &|_| false, std::time::Instant::now());
    assert!(dbs().contains(&"x".to_string()));
    assert!(retire_until(&|| !dbs().contains(&"x".to_string())), "{:?}", dbs());
    assert!(dbs().contains(&"w".to_string()), "a paused database lost its pool");
}

/// A full limit is marked only for a queue that needs room (not for `min_pool_size`'s
/// refill), and the janitor's pass clears a mark no queue needs any more: it would
/// otherwise have every check-in under the limit wake the janitor.
#[tokio::test]
async fn marks_of_full_limits_last_while_a_queue_needs_room() {
    let (pools, [a_u1, _, b_u1]) = pools_with("max_user_connections = 1\nmin_pool_size = 1");
    assert!(ConnLimit::acquire_pair(&b_u1.db_limit, &b_u1.user_limit));
    assert!(!a_u1.prefill().await.expect("no connect tried"), "a refill past the limit");
    assert!(!a_u1.user_limit.is_contended(), "a refill marked the limit");
    // A client finding the limit full marks it, and the mark stays while it waits.
    let waiting = tokio::spawn({
        let pool = a_u1.clone();
        async move { pool.checkout().await.map(drop) }
    });
    while !a_u1.has_waiters() {
        tokio::task::yield_now().await;
    }
    assert!(a_u1.user_limit.is_contended());
    pools.rebalance();
    assert!(a_u1.user_limit.is_contended(), "cleared with a client queued");
    waiting.abort();
    // A mark whose client went its way (no queue anywhere): cleared by the next pass.
    let (pools, [a_u1, _, b_u1]) = pools_with("max_user_connections = 1");
    assert!(ConnLimit::acquire_pair(&b_u1.db_limit, &b_u1.user_limit));
    assert!(!ConnLimit::acquire_pair(&a_u1.db_limit, &a_u1.user_limit));
    assert!(a_u1.user_limit.is_contended());
    pools.rebalance();
    assert!(!a_u1.user_limit.is_contended(), "the mark outlived its queue");
}

/// Room freed while the janitor's pass had a limit's mark down woke nobody (the
/// freeing found no mark): the pass wakes the queues it finds, so a queued client is
/// handed the room then, not at a later pass.
#[tokio::test]
async fn room_freed_while_a_mark_is_down_reaches_the_queue() {
    let (pools, [a_u1, _, b_u1]) = pools_with("max_user_connections = 1");
    assert!(ConnLimit::acquire_pair(&b_u1.db_limit, &b_u1.user_limit));
    let waiting = tokio::spawn({
        let pool = a_u1.clone();
        async move { pool.checkout().await.map(drop) }
    });
    while !a_u1.has_waiters() {
        tokio::task::yield_now().await;
    }
    // Freed with no wake-up, as when the freeing's look found the mark down.
    ConnLimit::release_pair(&b_u1.db_limit, &b_u1.user_limit);
    assert!(a_u1.has_waiters());
    pools.rebalance();
    assert!(!a_u1.has_waiters(), "the queued client was not handed the room");
    waiting.abort();
}
