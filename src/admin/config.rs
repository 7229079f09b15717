//! SHOW CONFIG and SET: the `[general]` keys as (key, value, default, changeable), and
//! run-time changes of the keys that take effect without a restart, validated as the
//! config file is.

use super::table::{Table, text};
use crate::config::{Config, General};

/// Keys SET refuses: read only at start-up (listeners, threads, logging), or taken
/// by a reload only (`auth_type`, `admin_database`, `stats_period`).
const RESTART_ONLY: [&str; 11] = [
    "listen_addr",
    "listen_port",
    "unix_socket_dir",
    "unix_socket_mode",
    "workers",
    "log_level",
    "log_format",
    "metrics_listen",
    "auth_type",
    "admin_database",
    "stats_period",
];

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
        let changeable = if RESTART_ONLY.contains(&key.as_str()) { "no" } else { "yes" };
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

/// The configuration with `key` set to `value`, validated; or why not.
pub fn set(cfg: &Config, key: &str, value: &str) -> Result<Config, String> {
    let key = key.to_ascii_lowercase();
    let mut table = table_of(&cfg.general);
    let current = table.get(&key).ok_or_else(|| format!("unknown config parameter: {key}"))?;
    if RESTART_ONLY.contains(&key.as_str()) {
        return Err(format!("{key} cannot be changed at run time (it needs a restart)"));
    }
    let v = typed(&key, current, value)?;
    table.insert(key.clone(), v);
    let general: General = toml::Value::Table(table).try_into().map_err(|e| format!("invalid value for {key}: {e}"))?;
    cfg.with_general(general)
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
        assert!(set(&c, "stats_users", "nobody").unwrap_err().contains("not in [users]"));
        assert!(set(&c, "default_pool_size", "0").unwrap_err().contains("at least 1"));
        assert!(set(&c, "default_pool_size", "x").unwrap_err().contains("invalid value"));
        assert!(set(&c, "listen_port", "1").unwrap_err().contains("restart"));
        assert!(set(&c, "nope", "1").unwrap_err().contains("unknown"));
        // A value a database's own setting does not fit names that database.
        let text = "[general]\nauth_type = \"trust\"\n[databases.app]\nmin_pool_size = 3\n";
        let c = Config::parse(text, std::path::Path::new("x.toml")).unwrap();
        let e = set(&c, "default_pool_size", "2").unwrap_err();
        assert!(e.starts_with("databases.app.min_pool_size: is larger than the pool size (2)"), "{e}");
    }

    #[test]
    fn show_lists_every_general_key() {
        let t = show(&cfg());
        assert_eq!(t.names(), vec!["key", "value", "default", "changeable"]);
        assert_eq!(t.rows.len(), table_of(&General::default()).len());
    }
}
