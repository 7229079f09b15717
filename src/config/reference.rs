//! The list of every configuration key, derived from the config structs, so the
//! reference page (docs/config.md) is checked against the code by a test.

use super::{Database, General, Peer, PoolMode, User};

/// (section, key) for every key Sluice accepts; sections are `general`,
/// `databases.NAME`, `users.NAME` and `peers.ID`.
pub fn keys() -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    // Struct literals without `..`: adding a field breaks the build here until it is
    // listed, and the docs test then asks for its documentation.
    let db = Database {
        host: String::new(),
        port: 1,
        dbname: Some(String::new()),
        user: Some(String::new()),
        password: Some(String::new()),
        pool_size: Some(1),
        min_pool_size: Some(1),
        reserve_pool_size: Some(1),
        pool_mode: Some(PoolMode::Session),
        max_db_connections: Some(1),
        auth_user: Some(String::new()),
        auth_query: Some(String::new()),
        auth_dbname: Some(String::new()),
        client_encoding: Some(String::new()),
        datestyle: Some(String::new()),
        timezone: Some(String::new()),
        connect_query: Some(String::new()),
    };
    let user = User {
        password: Some(String::new()),
        server_password: Some(String::new()),
        pool_mode: Some(PoolMode::Session),
        pool_size: Some(1),
        max_user_connections: Some(1),
    };
    let peer = Peer { host: String::new(), port: 1, pool_size: Some(1) };
    for (section, value) in [
        ("general", toml::Value::try_from(General::default())),
        ("databases.NAME", toml::Value::try_from(db)),
        ("users.NAME", toml::Value::try_from(user)),
        ("peers.ID", toml::Value::try_from(peer)),
    ] {
        let value = value.expect("config structs serialize");
        for k in value.as_table().expect("a table").keys() {
            out.push((section, k.clone()));
        }
    }
    out
}
