//! `auth_query` at login: a client whose user the config does not list, logging in to a
//! database with lookups (`auth_user`), has its password looked up on a connection of
//! the lookups' pool before it authenticates, on every login, so a changed or expired
//! password counts at once (as in PgBouncer).

use std::sync::Arc;

use tracing::warn;

use super::Exit;
use super::session::pool_failure;
use crate::app::App;
use crate::auth::query::{self, Found, LookupError};
use crate::auth::{UserAuth, UserStore};
use crate::pool::{Borrowed, Pool, WaitSlot};
use crate::protocol::sqlstate;

/// The user `name` of `database` as a lookup finds it: None when the database has no
/// lookups or no such user can log in (the client then goes through the exchange of an
/// unknown user). A lookup that fails (no server, the query's error) refuses the login.
pub(super) async fn looked_up(
    app: &App,
    users: &UserStore,
    database: &str,
    name: &str,
) -> Result<Option<Arc<UserAuth>>, Exit> {
    let Some((pool, sql)) = lookup_pool(app, database) else { return Ok(None) };
    let found = run(&pool, &sql, name).await?;
    match found {
        Ok(Found::NoUser) => {
            users.forget(database, name);
            Ok(None)
        }
        Ok(Found::User(secret)) => {
            let (user, changed) = users.remember(database, name, secret);
            if changed {
                app.pools.refresh_login(&app.config.load(), &app.users.load(), database, name);
            }
            Ok(Some(user))
        }
        Err(e) => {
            warn!(user = name, database, lookup_pool = %format!("{}/{}", pool.key.database, pool.key.user), "login failed: {e}");
            Err(Exit::fatal(
                sqlstate::INVALID_AUTHORIZATION,
                format!("could not look up the password of user \"{name}\" (auth_query failed: see the pooler's log)"),
            ))
        }
    }
}

/// The pool the lookups for `database` run in, and their query, from the config as it
/// is now (as the client's own pool is found).
fn lookup_pool(app: &App, database: &str) -> Option<(Arc<Pool>, String)> {
    loop {
        let seen = app.pools.reloads();
        let (cfg, users) = (app.config.load(), app.users.load());
        let lookup = query::lookup_for(&cfg, database)?;
        if let Ok(pool) = app.pools.lookup_pool(seen, &cfg, &users, &lookup) {
            return pool.map(|p| (p, lookup.query.to_string()));
        }
    }
}

/// Runs the lookup on a server of `pool` (checked first as for any loan after
/// `server_check_delay`), bounded by `internal_query_timeout`. The outer error is the
/// pool's (no server); the inner one the lookup's.
async fn run(pool: &Arc<Pool>, sql: &str, name: &str) -> Result<Result<Found, LookupError>, Exit> {
    let (mut since, slot) = (None, WaitSlot::new());
    let server = loop {
        let server = pool.checkout_since(&mut since, &slot).await.map_err(pool_failure)?;
        if !pool.needs_check(&server) {
            break server;
        }
        if let Some(server) = Box::pin(pool.checked(server)).await {
            break server;
        }
    };
    let mut server = Borrowed::new(pool, server);
    let found = query::run(&mut server, sql, name, pool.internal_timeout()).await;
    // A server's ERROR leaves the connection usable; any other failure marked it broken,
    // and the pool closes it.
    server.checkin();
    Ok(found)
}
