//! `auth_query` at login: a client whose user the config does not list, logging in to a
//! database with lookups (`auth_user`), has its password looked up on a connection of
//! the lookups' pool before it authenticates, on every login, so a changed or expired
//! password counts at once (as in PgBouncer).

use std::sync::Arc;

use tracing::warn;

use super::Exit;
use crate::app::App;
use crate::auth::client::{Hidden, PamPlace};
use crate::auth::query::{self, Found, LookupError};
use crate::auth::{Secret, UserAuth, UserStore};
use crate::config::Config;
use crate::net::listener::Peer;
use crate::pool::{Borrowed, Pool};
use crate::protocol::sqlstate;

/// A user a lookup found, to check the client against: entered among the found users
/// only once the client has logged in as it (`adopt`).
pub(super) struct Candidate {
    pub user: Arc<UserAuth>,
    /// The lookup's number (`FoundUsers::begin`).
    seq: u64,
}

/// The user `name` of `database` as a lookup finds it: None when the database has no
/// lookups or no such user can log in (the client then goes through the exchange of an
/// unknown user). A lookup that cannot run (no server, the query's error) refuses the
/// login with 28000, and the log says why.
pub(super) async fn looked_up(
    app: &App,
    users: &UserStore,
    database: &str,
    name: &str,
) -> Result<Option<Candidate>, Exit> {
    let (pool, sql) = match lookup_pool(app, database) {
        None => return Ok(None),
        Some(Ok(found)) => found,
        Some(Err(disabled)) => {
            // As in PgBouncer: DISABLE of the lookups' database stops the logins that
            // need them.
            warn!(user = name, database, "login failed: the auth_query database {disabled} is disabled");
            return Err(refused(name));
        }
    };
    let seq = users.found().begin();
    match run(&pool, &sql, name).await {
        Ok(Found::NoUser) => {
            users.found().forget(database, name, seq);
            Ok(None)
        }
        Ok(Found::User(secret)) => Ok(Some(Candidate { user: Arc::new(UserAuth::found(name, secret)), seq })),
        Err(e) => {
            let pool = format!("{}/{}", pool.key.database, pool.key.user);
            warn!(user = name, database, lookup_pool = %pool, "login failed: {e}");
            Err(refused(name))
        }
    }
}

/// What a client whose lookup could not run is told (the log says why).
fn refused(name: &str) -> Exit {
    Exit::fatal(
        sqlstate::INVALID_AUTHORIZATION,
        format!("could not look up the password of user \"{name}\" (auth_query failed: see the pooler's log)"),
    )
}

/// A client logged in as a user a lookup found: the user is entered among the found
/// ones (or the one entered with the same password kept), and its pool logs in with a
/// new password from now on. Gives the user entered.
pub(super) fn adopt(app: &App, users: &UserStore, database: &str, found: Candidate) -> Arc<UserAuth> {
    let (user, changed) = users.found().adopt(database, found.user, found.seq);
    if changed {
        // Read again after a reload that came meanwhile (`Pools::refresh_login`).
        while app
            .pools
            .refresh_login(app.pools.reloads(), &app.config.load(), &app.users.load(), database, &user.name)
            .is_err()
        {}
    }
    user
}

/// A client PAM let in (`auth_type = "pam"`) as a user whose `[users]` entry sets no
/// `server_password` (or that is not listed): the user is entered among the found users
/// of `database` with the password PAM accepted, which its pool logs in to the server
/// with (PgBouncer ignores `auth_file` passwords under PAM the same way). A password
/// that is not UTF-8 cannot be sent to PostgreSQL: that login is refused.
pub(super) fn adopt_pam(
    app: &App,
    users: &UserStore,
    database: &str,
    name: &str,
    password: Hidden,
) -> Result<Arc<UserAuth>, Exit> {
    let Ok(password) = String::from_utf8(password.0) else {
        warn!(
            user = name,
            database, "login failed: the password PAM accepted is not UTF-8, so no server login can use it"
        );
        let refused = crate::auth::client::AuthFailure::BadPassword(name.to_string());
        return Err(Exit::fatal(refused.sqlstate(), refused.to_string()));
    };
    let user = Arc::new(UserAuth::found(name, Some(Secret::Plain(password))));
    Ok(adopt(app, users, database, Candidate { user, seq: users.found().begin() }))
}

/// Where PAM checks a login (`auth_type = "pam"`): `pam_service`, `pam_config_dir`, and
/// the client's address over TCP.
pub(super) fn pam_place<'a>(cfg: &'a Config, peer: &Peer) -> PamPlace<'a> {
    let dir = Some(cfg.general.pam_config_dir.as_str()).filter(|d| !d.is_empty());
    let host = match peer {
        Peer::Tcp(addr) => Some(addr.ip()),
        _ => None,
    };
    PamPlace { service: &cfg.general.pam_service, config_dir: dir, host }
}

/// The pool the lookups for `database` run in, and their query, from the config as it
/// is now (as the client's own pool is found); Err names the lookups' database when it
/// is disabled (no pool is made for it then).
fn lookup_pool(app: &App, database: &str) -> Option<Result<(Arc<Pool>, String), String>> {
    loop {
        let seen = app.pools.reloads();
        let (cfg, users) = (app.config.load(), app.users.load());
        let lookup = query::lookup_for(&cfg, database)?;
        if app.pools.is_disabled(lookup.database) {
            return Some(Err(lookup.database.to_string()));
        }
        if let Ok(pool) = app.pools.lookup_pool(seen, &cfg, &users, &lookup) {
            return pool.map(|p| Ok((p, lookup.query.to_string())));
        }
    }
}

/// Runs the lookup on a server of `pool` (checked first as for any loan after
/// `server_check_delay`), bounded by `internal_query_timeout`.
async fn run(pool: &Arc<Pool>, sql: &str, name: &str) -> Result<Found, LookupError> {
    let server = pool.checkout_checked().await.map_err(LookupError::Pool)?;
    let mut server = Borrowed::new(pool, server);
    let found = query::run(&mut server, sql, name, pool.internal_limits()).await;
    // A server's ERROR leaves the connection usable; any other failure marked it broken,
    // and the pool closes it.
    server.checkin();
    found
}
