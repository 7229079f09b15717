//! `auth_ident_file`: user name maps for the `map=` option of `peer` and `cert` lines
//! of the `auth_hba_file` (PostgreSQL's pg_ident.conf format, PgBouncer's
//! `auth_ident_file`). Each line is `MAPNAME SYSTEM-USERNAME DATABASE-USERNAME`: under
//! that map, the OS user (or certificate name) may log in as that user; `all` as the
//! database user lets it log in as any. Regular expressions (`/...`) and `+group` are
//! errors naming the file and line.

use std::path::{Path, PathBuf};

use super::ConfigError;
use super::hba::{logical_lines, split};

#[derive(Debug, Clone, PartialEq)]
pub struct Ident {
    pub file: PathBuf,
    entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq)]
struct Entry {
    map: String,
    system: String,
    /// `None`: any user (`all`).
    user: Option<String>,
}

/// One map of an `Ident`, as a login under a `map=` line checks it.
#[derive(Debug, Clone, Copy)]
pub struct UserMap<'a> {
    pub ident: &'a Ident,
    pub name: &'a str,
}

impl UserMap<'_> {
    /// Whether `system` (the OS user, the certificate's name) may log in as `user`.
    pub fn allows(&self, system: &str, user: &str) -> bool {
        let fits = |e: &&Entry| e.map == self.name && e.system == system;
        self.ident.entries.iter().filter(fits).any(|e| e.user.as_deref().is_none_or(|u| u == user))
    }
}

impl Ident {
    pub fn load(file: &Path) -> Result<Ident, ConfigError> {
        Self::parse(&super::read(file)?, file)
    }

    pub fn parse(text: &str, file: &Path) -> Result<Ident, ConfigError> {
        let mut entries = Vec::new();
        for (line, body) in logical_lines(text) {
            let at = |key: &str, message: String| ConfigError::at(file, line, key, message);
            let fields = split(&body).map_err(|m| at("-", m))?;
            if fields.is_empty() {
                continue;
            }
            if fields[0].first().is_some_and(|t| {
                !t.quoted && matches!(t.text.as_str(), "include" | "include_if_exists" | "include_dir")
            }) {
                return Err(at("-", "include lines are not supported: list the entries in this file".into()));
            }
            let words: Vec<_> = fields.into_iter().map(|mut f| (f.len() == 1).then(|| f.remove(0))).collect();
            let [Some(map), Some(system), Some(user)] = <[_; 3]>::try_from(words).unwrap_or_default() else {
                return Err(at("-", "expected MAPNAME SYSTEM-USERNAME DATABASE-USERNAME, one word each".into()));
            };
            if !system.quoted && system.text.starts_with('/') {
                return Err(at("system user", format!("regular expressions (\"{}\") are not supported", system.text)));
            }
            let user = match user.text.as_str() {
                _ if user.quoted => Some(user.text),
                "all" => None,
                t if t.starts_with('+') || t.starts_with('/') => {
                    return Err(at("database user", format!("\"{t}\" is not supported: name the user, or all")));
                }
                _ => Some(user.text),
            };
            entries.push(Entry { map: map.text, system: system.text, user });
        }
        Ok(Ident { file: file.to_path_buf(), entries })
    }

    /// Whether the file has a line of map `name`.
    pub fn has_map(&self, name: &str) -> bool {
        self.entries.iter().any(|e| e.map == name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_let_system_names_log_in_as_the_users_listed() {
        let text = "# MAP  SYSTEM  USER\nweb  www-data  app\nweb  www-data  reports\nops  \"root\"  all\n\
                    include_app  www-data  app\n";
        let ident = Ident::parse(text, Path::new("ident.conf")).unwrap();
        // A map whose name starts with "include" is a map, not an include line.
        assert!(UserMap { ident: &ident, name: "include_app" }.allows("www-data", "app"));
        let web = UserMap { ident: &ident, name: "web" };
        assert!(web.allows("www-data", "app") && web.allows("www-data", "reports"));
        assert!(!web.allows("www-data", "postgres") && !web.allows("root", "app"));
        let ops = UserMap { ident: &ident, name: "ops" };
        assert!(ops.allows("root", "anyone") && !ops.allows("www-data", "anyone"));
        assert!(ident.has_map("web") && !ident.has_map("none"));
    }

    #[test]
    fn what_cannot_be_honoured_is_an_error_naming_its_line() {
        let cases = [
            ("web /^(.*)$ \\1\n", "ident.conf:1: system user: regular expressions"),
            ("\nweb alice +admins\n", "ident.conf:2: database user: \"+admins\" is not supported"),
            ("web alice\n", "ident.conf:1: -: expected MAPNAME SYSTEM-USERNAME DATABASE-USERNAME"),
            ("web alice a,b\n", "ident.conf:1: -: expected MAPNAME"),
            ("web alice bob extra\n", "ident.conf:1: -: expected MAPNAME"),
            ("include_dir conf.d\n", "ident.conf:1: -: include lines are not supported"),
        ];
        for (text, want) in cases {
            let e = Ident::parse(text, Path::new("ident.conf")).unwrap_err().to_string();
            assert!(e.starts_with(want), "{text:?}: {e}");
        }
    }
}
