//! SHOW CONFIG and SET: the `[general]` keys as (key, value, default, changeable), and
//! run-time changes of the keys that take effect without a restart, validated as the
//! config file is.

use super::commands::AdminError;
use super::table::{Table, text};
use crate::config::{Config, General};
use crate::protocol::sqlstate;

/// Keys SET refuses besides those read only at start-up (`General::START_UP_ONLY`):
/// taken by a reload only.
const RELOAD_ONLY: [&str; 6] =
    ["auth_type", "auth_file", "auth_hba_file", "auth_ident_file", "admin_database", "stats_period"];

fn changeable(key: &str) -> bool {
    !General::START_UP_ONLY.contains(&key) && !RELOAD_ONLY.contains(&key)
}

fn table_of(g: &General) -> toml::value::Table {
    match toml::Value::try_from(g) {
        Ok(toml::Value::Table(t)) => t,
        _ => toml::value::Table::new(),
    }
}

/// A config value as SHOW CONFIG prints it: strings bare, lists comma-separated.
fn display(v: &toml::Value) -> String {
    match v {
        toml::Value::String(s) => s.clone(),
        toml::Value::Array(a) => a.iter().map(display).collect::<Vec<_>>().join(","),
        v => v.to_string(),
    }
}

pub fn show(cfg: &Config) -> Table {
    let current = table_of(&cfg.general);
    let defaults = table_of(&General::default());
    let mut t = Table::new(&["key", "value", "default", "changeable"], "ssss");
    for (key, value) in &current {
        let default = defaults.get(key).map(display).unwrap_or_default();
        let changeable = if changeable(key) { "yes" } else { "no" };
        t.push(vec![text(key), text(display(value)), text(default), text(changeable)]);
    }
    t
}

/// Parses `value` as the type `key` has now.
fn typed(key: &str, current: &toml::Value, value: &str) -> Result<toml::Value, String> {
    let bad = || format!("invalid value for {key}: \"{value}\"");
    Ok(match current {
        toml::Value::String(_) => toml::Value::String(value.to_string()),
        toml::Value::Integer(_) => toml::Value::Integer(value.parse().map_err(|_| bad())?),
        toml::Value::Float(_) => {
            let f: f64 = value.parse().map_err(|_| bad())?;
            toml::Value::Float(f)
        }
        toml::Value::Boolean(_) => toml::Value::Boolean(match value.to_ascii_lowercase().as_str() {
            "1" | "on" | "yes" | "true" => true,
            "0" | "off" | "no" | "false" => false,
            _ => return Err(bad()),
        }),
        toml::Value::Array(_) => toml::Value::Array(
            value.split(',').map(str::trim).filter(|s| !s.is_empty()).map(|s| toml::Value::String(s.into())).collect(),
        ),
        _ => return Err(bad()),
    })
}

/// The configuration with `key` set to `value`, validated; or why not, with
/// PostgreSQL's SQLSTATE for a refused SET: 42704 for an unknown key, 55P02 for one
/// that cannot change now, 22023 for a value that does not fit.
pub fn set(cfg: &Config, key: &str, value: &str) -> Result<Config, AdminError> {
    let key = key.to_ascii_lowercase();
    let mut table = table_of(&cfg.general);
    let current = table
        .get(&key)
        .ok_or_else(|| AdminError::new(sqlstate::UNDEFINED_OBJECT, format!("unknown config parameter: {key}")))?;
    let fixed =
        |why: &str| AdminError::new(sqlstate::CANT_CHANGE_RUNTIME_PARAM, format!("{key} cannot be changed {why}"));
    if General::START_UP_ONLY.contains(&key.as_str()) {
        return Err(fixed("at run time (it needs a restart)"));
    }
    if RELOAD_ONLY.contains(&key.as_str()) {
        return Err(fixed("by SET (edit the config file and reload)"));
    }
    let invalid = |e: String| AdminError::new(sqlstate::INVALID_PARAMETER_VALUE, e);
    let v = typed(&key, current, value).map_err(invalid)?;
    table.insert(key.clone(), v);
    let general: General =
        toml::Value::Table(table).try_into().map_err(|e| invalid(format!("invalid value for {key}: {e}")))?;
    cfg.with_general(general).map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config::parse("[general]\nauth_type = \"trust\"\n[users.a]\n", std::path::Path::new("x.toml")).unwrap()
    }

    #[test]
    fn set_validates_and_types() {
        let c = cfg();
        assert_eq!(set(&c, "default_pool_size", "7").unwrap().general.default_pool_size, 7);
        assert_eq!(set(&c, "query_wait_timeout", "2.5").unwrap().general.query_wait_timeout, 2.5);
        assert!(!set(&c, "log_connections", "off").unwrap().general.log_connections);
        assert_eq!(set(&c, "stats_users", "a").unwrap().general.stats_users, vec!["a".to_string()]);
        let e = set(&c, "stats_users", "nobody").unwrap_err().message;
        assert_eq!(e, "stats_users: user \"nobody\" is not in [users]");
        assert!(set(&c, "default_pool_size", "0").unwrap_err().message.contains("at least 1"));
        let refused = |key, value| set(&c, key, value).unwrap_err();
        let e = refused("default_pool_size", "x");
        assert_eq!((e.code, e.message.contains("invalid value")), ("22023", true), "{e:?}");
        let e = refused("listen_port", "1");
        assert_eq!((e.code, e.message.contains("restart")), ("55P02", true), "{e:?}");
        let e = refused("auth_type", "md5");
        assert_eq!((e.code, e.message.contains("reload")), ("55P02", true), "{e:?}");
        let e = refused("nope", "1");
        assert_eq!((e.code, e.message.contains("unknown")), ("42704", true), "{e:?}");
        // A value a database's own setting does not fit names that database.
        let text = "[general]\nauth_type = \"trust\"\n[databases.app]\nmin_pool_size = 3\n";
        let c = Config::parse(text, std::path::Path::new("x.toml")).unwrap();
        let e = set(&c, "default_pool_size", "2").unwrap_err().message;
        assert!(e.starts_with("databases.app.min_pool_size: is larger than the pool size (2)"), "{e}");
    }

    /// The users of the `auth_file` count for `admin_users` and `stats_users`, and the
    /// error for one that is not a user says where users come from.
    #[test]
    fn console_users_may_come_from_the_auth_file() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("userlist.txt"), "\"f\" \"p\"\n").unwrap();
        let text = "[general]\nauth_file = \"userlist.txt\"\n[users.a]\npassword = \"p\"\n";
        let c = Config::parse(text, &dir.path().join("sluice.toml")).unwrap();
        assert_eq!(set(&c, "admin_users", "f, a").unwrap().general.admin_users, ["f", "a"]);
        let e = set(&c, "admin_users", "f, nobody").unwrap_err().message;
        assert_eq!(e, "admin_users: user \"nobody\" is not in [users] or the auth_file");
    }

    #[test]
    fn show_lists_every_general_key() {
        let t = show(&cfg());
        assert_eq!(t.names(), vec!["key", "value", "default", "changeable"]);
        assert_eq!(t.rows.len(), table_of(&General::default()).len());
    }
}
