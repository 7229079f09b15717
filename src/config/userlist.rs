//! `auth_file`: PgBouncer's userlist.txt, read as it is, so an installation moving
//! over keeps its file. Each line holds a user name and a password (plain, an md5 hash
//! or a SCRAM secret) in double quotes, a double quote inside written twice; further
//! fields are ignored; blank lines and lines starting with `;` or `#` are skipped.

use std::collections::BTreeMap;
use std::path::Path;

use super::entries::md5_under_scram;
use super::{Config, ConfigError, User};

/// An entry of a userlist: its line, the user, the password.
type Entry = (usize, String, String);

/// Each entry of a userlist text, or the line and what is wrong with it.
fn parse(text: &str) -> Result<Vec<Entry>, (usize, String)> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i + 1;
        let rest = line.trim_start();
        if rest.is_empty() || rest.starts_with(';') || rest.starts_with('#') {
            continue;
        }
        let (user, rest) = quoted(rest).ok_or((line_no, "expected \"user\" \"password\"".to_string()))?;
        let (password, _) =
            quoted(rest.trim_start()).ok_or((line_no, format!("expected a quoted password after \"{user}\"")))?;
        out.push((line_no, user, password));
    }
    Ok(out)
}

/// A field in double quotes at the start of `s` (`""` inside stands for `"`), and what
/// follows it.
fn quoted(s: &str) -> Option<(String, &str)> {
    let mut chars = s.strip_prefix('"')?.char_indices().peekable();
    let mut value = String::new();
    while let Some((i, c)) = chars.next() {
        if c != '"' {
            value.push(c);
        } else if chars.peek().is_some_and(|&(_, n)| n == '"') {
            chars.next();
            value.push('"');
        } else {
            return Some((value, &s[i + 2..]));
        }
    }
    None
}

/// Reads `file` (named in the config as `auth_file`) into `users`: a user listed under
/// `[users]` with a password keeps it; one listed without a password takes the file's;
/// one only in the file is added with its password and the defaults. A user listed
/// twice in the file takes its last line. An empty password is no password (such a user
/// logs in with `trust` or `cert` only, as PgBouncer refuses empty passwords at login).
/// `check` validates an added or completed user (its error is reported at the file's
/// line). Gives the users whose password is now the file's, with its line.
pub fn merge(
    file: &Path,
    users: &mut BTreeMap<String, User>,
    check: &dyn Fn(&User) -> Result<(), String>,
) -> Result<BTreeMap<String, usize>, ConfigError> {
    let text = super::read(file)?;
    let at = |line: usize, key: &str, message: String| ConfigError::at(file, line, key, message);
    let own: std::collections::BTreeSet<String> =
        users.iter().filter(|(_, u)| u.password.is_some()).map(|(n, _)| n.clone()).collect();
    let mut taken = BTreeMap::new();
    for (line, user, password) in parse(&text).map_err(|(line, m)| at(line, "-", m))? {
        if own.contains(&user) {
            continue;
        }
        let entry = users.entry(user.clone()).or_default();
        entry.password = (!password.is_empty()).then_some(password);
        check(entry).map_err(|m| at(line, &user, m))?;
        taken.insert(user, line);
    }
    Ok(taken)
}

impl Config {
    /// What loads but cannot work, for the log: each `auth_file` user whose md5 hash
    /// cannot check logins under `scram-sha-256` (that user's logins are refused, as
    /// with a wrong password), named with the file's line; `auth_hba_file` lines that
    /// fit no login, and md5 hashes its `scram-sha-256` lines cannot check.
    pub fn warnings(&self) -> Vec<String> {
        let file = self.resolve(&self.general.auth_file);
        let md5 = |name: &String| self.users.get(name).is_some_and(|u| md5_under_scram(u, &self.general));
        let mut out: Vec<String> = (self.from_auth_file.iter().filter(|(name, _)| md5(name)))
            .map(|(name, line)| {
                format!(
                    "{}:{line}: {name}: an md5 hash cannot check SCRAM logins (auth_type = \"scram-sha-256\"): \
                     this user's logins are refused; give a plain password or a SCRAM secret",
                    file.display()
                )
            })
            .collect();
        if let Some(hba) = &self.hba {
            let md5_users: Vec<&str> =
                self.users.iter().filter(|(_, u)| u.has_md5_hash()).map(|(n, _)| n.as_str()).collect();
            out.extend(super::hba::warnings(&self.general, hba, &md5_users));
        }
        out.extend(super::peers::warnings(&self.general, &self.peers));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pgbouncer_userlists() {
        let text = "; comment\n\n\"alice\" \"md5abc\"\n  \"bo\"\"b\" \"pa\"\"ss\" \"ignored\"\n# more\n";
        let got = parse(text).unwrap();
        assert_eq!(got, vec![(3, "alice".into(), "md5abc".into()), (4, "bo\"b".into(), "pa\"ss".into())]);
        assert_eq!(parse("\"alice\"\n").unwrap_err().0, 1);
        assert_eq!(parse("\"a\" \"b\"\nalice secret\n").unwrap_err().0, 2);
        assert_eq!(parse("\"a\" \"unterminated\n").unwrap_err().0, 1);
    }

    #[test]
    fn merges_into_the_users_of_the_config() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("userlist.txt");
        let text = "\"listed\" \"from-file\"\n\"open\" \"from-file\"\n\"new\" \"old\"\n\"new\" \"p\"\n\"none\" \"\"\n";
        std::fs::write(&file, text).unwrap();
        let mut users = BTreeMap::new();
        users.insert("listed".to_string(), User { password: Some("own".into()), ..User::default() });
        users.insert("open".to_string(), User { pool_size: Some(3), ..User::default() });
        let taken = merge(&file, &mut users, &|_| Ok(())).unwrap();
        let lines: Vec<_> = taken.iter().map(|(u, l)| (u.as_str(), *l)).collect();
        assert_eq!(lines, [("new", 4), ("none", 5), ("open", 2)], "the users given the file's password, at their line");
        let password = |n: &str| users[n].password.clone();
        assert_eq!(password("listed").as_deref(), Some("own"));
        assert_eq!((password("open").as_deref(), users["open"].pool_size), (Some("from-file"), Some(3)));
        assert_eq!(password("new").as_deref(), Some("p"), "the last line of a user counts");
        assert_eq!(password("none"), None, "an empty password is none");
        // A bad entry names the file's line and the user.
        std::fs::write(&file, "\"x\" \"p\"\n\"bad\" \"SCRAM-SHA-256$x\"\n").unwrap();
        let refuse_scram = |u: &User| match u.password.as_deref() {
            Some(p) if p.starts_with("SCRAM") => Err("is not a valid SCRAM-SHA-256 secret".to_string()),
            _ => Ok(()),
        };
        let e = merge(&file, &mut BTreeMap::new(), &refuse_scram).unwrap_err().to_string();
        assert!(e.ends_with("userlist.txt:2: bad: is not a valid SCRAM-SHA-256 secret"), "{e}");
    }
}
