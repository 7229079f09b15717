//! Password lookups for users the config does not list (PgBouncer's `auth_user` and
//! `auth_query`): which lookup a database uses, the messages that run it on a server
//! connection, and what its rows say. The login runs it (`client::lookup`); the users
//! clients log in as are kept in the `UserStore` (`found::FoundUsers::adopt`).

use bytes::BytesMut;

use super::Secret;
use crate::config::Config;
use crate::protocol::build;
use crate::server::{Row, ServerConn, ServerError};

/// PgBouncer's default (1.21 on): a role's password unless it has expired, for roles
/// that may log in; the catalog and `now()` named with their schema, so a `search_path`
/// set for the `auth_user` cannot stand in a table of its own. Reading `pg_authid`
/// takes a superuser; see docs/config.md for a `SECURITY DEFINER` function that lets an
/// unprivileged `auth_user` do it.
pub const DEFAULT_QUERY: &str = "SELECT rolname, CASE WHEN rolvaliduntil < pg_catalog.now() THEN NULL ELSE \
                                 rolpassword END FROM pg_catalog.pg_authid WHERE rolname = $1 AND rolcanlogin";

/// How the passwords of a database's unlisted users are looked up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lookup<'a> {
    /// The user Sluice logs in to the server as to run the query.
    pub user: &'a str,
    pub query: &'a str,
    /// The `[databases]` entry whose server runs it.
    pub database: &'a str,
}

/// The lookup for clients of `database` (a `[databases]` entry, or a name the fallback
/// entry serves), if it has one: the entry's `auth_user`, `auth_query` and
/// `auth_dbname`, else `[general]`'s.
pub fn lookup_for<'a>(cfg: &'a Config, database: &'a str) -> Option<Lookup<'a>> {
    lookup_with(cfg, cfg.database(database)?, database)
}

/// The lookup the entry `db` gives clients of `database` (the entry's own name, or a
/// name the fallback entry serves).
pub fn lookup_with<'a>(cfg: &'a Config, db: &'a crate::config::Database, database: &'a str) -> Option<Lookup<'a>> {
    let g = &cfg.general;
    let user = db.auth_user.as_deref().unwrap_or(&g.auth_user);
    if user.is_empty() {
        return None;
    }
    let dbname = db.auth_dbname.as_deref().unwrap_or(&g.auth_dbname);
    Some(Lookup {
        user,
        query: db.auth_query.as_deref().unwrap_or(&g.auth_query),
        database: if dbname.is_empty() { database } else { dbname },
    })
}

/// What a lookup found.
#[derive(Debug, PartialEq)]
pub enum Found {
    /// No row: no such user (or one that may not log in).
    NoUser,
    /// The user, with its password: None when the query gave NULL (expired, or none
    /// set), or a value Sluice cannot read as a password, md5 hash or SCRAM secret.
    User(Option<Secret>),
}

/// Runs `query` for `name` on `server` (unnamed statement and portal, text
/// parameter), within `limits`.
pub async fn run(
    server: &mut ServerConn,
    query: &str,
    name: &str,
    limits: crate::server::QueryBounds,
) -> Result<Found, LookupError> {
    let mut out = BytesMut::with_capacity(query.len() + name.len() + 64);
    build::parse(&mut out, b"", query.as_bytes(), &[]);
    build::bind_text(&mut out, b"", b"", &[Some(name.as_bytes())]);
    build::execute(&mut out, b"");
    build::sync(&mut out);
    let row = server.fetch_last_row(&out, limits).await.map_err(LookupError::Server)?;
    found(row.as_ref())
}

/// Reads a lookup's answer, as PgBouncer does: two columns, the user name and the
/// password, and the last row wins.
pub fn found(last_row: Option<&Row>) -> Result<Found, LookupError> {
    let Some(row) = last_row else { return Ok(Found::NoUser) };
    let [_, password] = row.as_slice() else { return Err(LookupError::Columns(row.len())) };
    let secret = password
        .as_deref()
        .filter(|p| !p.is_empty())
        .and_then(|p| std::str::from_utf8(p).ok())
        .and_then(|p| Secret::parse(p).ok());
    Ok(Found::User(secret))
}

/// Why a lookup gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum LookupError {
    #[error("auth_query found no server to run on: {0}")]
    Pool(crate::pool::PoolError),
    #[error("auth_query failed: {0}")]
    Server(ServerError),
    #[error("auth_query returned {0} column(s); it must return two: the user name and its password")]
    Columns(usize),
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::auth::md5;

    fn cfg(text: &str) -> Config {
        Config::parse(text, Path::new("sluice.toml")).expect("a valid config")
    }

    #[test]
    fn a_database_takes_its_own_lookup_settings_or_the_general_ones() {
        let c = cfg("[general]\nauth_user = \"a\"\n[databases.x]\n[databases.y]\nauth_user = \"b\"\n\
                     auth_query = \"SELECT u, p FROM t WHERE u = $1\"\nauth_dbname = \"x\"\n\
                     [users.a]\npassword = \"p\"\n[users.b]\npassword = \"p\"\n");
        assert_eq!(lookup_for(&c, "x"), Some(Lookup { user: "a", query: DEFAULT_QUERY, database: "x" }));
        let y = Lookup { user: "b", query: "SELECT u, p FROM t WHERE u = $1", database: "x" };
        assert_eq!(lookup_for(&c, "y"), Some(y));
        assert_eq!(lookup_for(&c, "pgbouncer"), None, "the admin console is not a [databases] entry");
        let off = cfg("[databases.x]\n[users.a]\npassword = \"p\"\n");
        assert_eq!(lookup_for(&off, "x"), None);
    }

    #[test]
    fn the_password_is_the_second_of_two_columns() {
        let row = |p: Option<&str>| vec![Some(b"u".to_vec()), p.map(|p| p.as_bytes().to_vec())];
        assert_eq!(found(None).unwrap(), Found::NoUser);
        let hash = md5::password_hash("u", "pw");
        assert_eq!(found(Some(&row(Some(&hash)))).unwrap(), Found::User(Some(Secret::Md5(hash))));
        assert_eq!(found(Some(&row(Some("plain")))).unwrap(), Found::User(Some(Secret::Plain("plain".into()))));
        // NULL (expired), empty, or a broken SCRAM secret: a user without a password.
        for p in [None, Some(""), Some("SCRAM-SHA-256$broken")] {
            assert_eq!(found(Some(&row(p))).unwrap(), Found::User(None));
        }
        assert!(matches!(found(Some(&vec![Some(b"u".to_vec())])), Err(LookupError::Columns(1))));
        let three = vec![Some(b"u".to_vec()), None, None];
        assert!(matches!(found(Some(&three)), Err(LookupError::Columns(3))));
    }
}
