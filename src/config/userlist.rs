//! `auth_file`: PgBouncer's userlist.txt, read as it is, so an installation moving
//! over keeps its file. Each line holds a user name and a password (plain, an md5 hash
//! or a SCRAM secret) in double quotes, a double quote inside written twice; further
//! fields are ignored; blank lines and lines starting with `;` or `#` are skipped.

use std::collections::BTreeMap;
use std::path::Path;

use super::{ConfigError, User};

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
/// line).
pub fn merge(
    file: &Path,
    users: &mut BTreeMap<String, User>,
    check: &dyn Fn(&User) -> Result<(), String>,
) -> Result<(), ConfigError> {
    let name = file.display().to_string();
    let text = std::fs::read_to_string(file).map_err(|source| ConfigError::Io { file: name.clone(), source })?;
    let at = |line: usize, key: &str, message: String| ConfigError::Invalid {
        file: name.clone(),
        line,
        key: key.to_string(),
        message,
    };
    let own: std::collections::BTreeSet<String> =
        users.iter().filter(|(_, u)| u.password.is_some()).map(|(n, _)| n.clone()).collect();
    for (line, user, password) in parse(&text).map_err(|(line, m)| at(line, "-", m))? {
        if own.contains(&user) {
            continue;
        }
        let entry = users.entry(user.clone()).or_default();
        entry.password = (!password.is_empty()).then_some(password);
        check(entry).map_err(|m| at(line, &user, m))?;
    }
    Ok(())
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
        merge(&file, &mut users, &|_| Ok(())).unwrap();
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
