//! Finds the line of a key in a TOML text, so validation errors can point at it.
//! Works line by line: a key is found under its `[section]` header, as a dotted key, or
//! inside a one-line inline table.

/// The 1-based line where the setting at `path` (its dotted name split into parts:
/// `["databases", "app", "port"]`) is written: as `key = ...` under its `[section]`,
/// as a dotted key (`app.port = ...`), or inside an inline table (`app = { port = 0 }`).
/// When the setting itself is not written, the first line that opens its nearest
/// enclosing table (a `[section]` header, or a key of that table); 0 when none does.
pub fn locate_key(text: &str, path: &[&str]) -> usize {
    let mut current: Vec<String> = Vec::new();
    // The closest enclosing table seen so far: (parts in common, line).
    let mut enclosing = (0, 0);
    let mut at = |written: &[String], line: usize| -> bool {
        let common = written.iter().zip(path).take_while(|(a, b)| a == b).count();
        if common == path.len() && written.len() == path.len() {
            return true;
        }
        if common > enclosing.0 {
            enclosing = (common, line);
        }
        false
    };
    for (i, raw) in text.lines().enumerate() {
        let line = without_comment(raw);
        if let Some(h) = header(line) {
            current = split_path(h);
            if at(&current, i + 1) {
                return i + 1;
            }
            continue;
        }
        let Some((k, v)) = split_assignment(line) else { continue };
        let mut written = current.clone();
        written.extend(split_path(k));
        if at(&written, i + 1) {
            return i + 1;
        }
        for (_, inner) in inline_keys(v) {
            let mut full = written.clone();
            full.extend(split_path(inner));
            if at(&full, i + 1) {
                return i + 1;
            }
        }
    }
    enclosing.1
}

/// The characters of `line` outside its quoted strings (`"..."` with backslash
/// escapes, `'...'` literal), with their byte offsets; the quotes are not given.
fn unquoted(line: &str) -> impl Iterator<Item = (usize, char)> + '_ {
    let (mut quote, mut escaped) = (None, false);
    line.char_indices().filter(move |&(_, c)| {
        match quote {
            Some(_) if escaped => escaped = false,
            Some('"') if c == '\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '"' || c == '\'' => quote = Some(c),
            None => return true,
        }
        false
    })
}

/// `key = value` split at the first `=` outside quotes; None when the line sets
/// nothing (no `=`, or what precedes it is not a key: the tail of a multi-line value).
fn split_assignment(line: &str) -> Option<(&str, &str)> {
    let (i, _) = unquoted(line).find(|&(_, c)| c == '=')?;
    let key = &line[..i];
    let bare = |c: char| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.') || c.is_whitespace();
    unquoted(key).all(|(_, c)| bare(c)).then(|| (key, &line[i + 1..]))
}

/// The keys of a one-line inline table (`{ a = 1, b.c = "x" }`, its top level only),
/// each with the offset in `value` where its pair starts; none when `value` is not one.
/// A pair whose value goes on past the line is left out.
fn inline_keys(value: &str) -> Vec<(usize, &str)> {
    let Some(inner) = value.trim_start().strip_prefix('{') else { return Vec::new() };
    let base = value.len() - inner.len();
    let mut keys = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in unquoted(inner) {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' if depth > 0 => depth -= 1,
            ',' | '}' if depth == 0 => {
                keys.extend(split_assignment(&inner[start..i]).map(|(k, _)| (base + start, k)));
                start = i + 1;
            }
            _ => {}
        }
    }
    keys
}

/// A dotted key or section name split into its parts: quotes removed, what is inside
/// them kept as written, whitespace outside them dropped (`databases." a.b"` is
/// `["databases", " a.b"]`).
fn split_path(name: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let (mut part, mut quote, mut escaped) = (String::new(), None, false);
    for c in name.chars() {
        match quote {
            Some(_) if escaped => {
                part.push(c);
                escaped = false;
            }
            Some('"') if c == '\\' => escaped = true,
            Some(q) if c == q => quote = None,
            Some(_) => part.push(c),
            None if c == '"' || c == '\'' => quote = Some(c),
            None if c == '.' => parts.push(std::mem::take(&mut part)),
            None if c.is_whitespace() => {}
            None => part.push(c),
        }
    }
    parts.push(part);
    parts
}

/// The dotted name (`section.key`) of the setting on the line holding byte `offset`,
/// for errors the TOML parser reports by position (a wrong type, an unknown value);
/// inside an inline table, the key of the pair there. "-" when that line sets nothing.
pub fn key_at(text: &str, offset: usize) -> String {
    let offset = offset.min(text.len());
    let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next().unwrap_or("");
    let Some((key, value)) = split_assignment(line) else { return "-".to_string() };
    let mut path =
        text[..start].lines().rev().find_map(|l| header(without_comment(l)).map(split_path)).unwrap_or_default();
    path.extend(split_path(key));
    let in_value = (offset - start).saturating_sub(key.len() + 1);
    if let Some((_, inner)) = inline_keys(value).into_iter().rev().find(|(at, _)| *at <= in_value) {
        path.extend(split_path(inner));
    }
    path.join(".")
}

/// The name inside a `[section]` header line.
fn header(line: &str) -> Option<&str> {
    line.strip_prefix('[').and_then(|l| l.strip_suffix(']'))
}

/// A line without its `# comment` (a `#` inside a quoted string is kept), trimmed.
fn without_comment(line: &str) -> &str {
    match unquoted(line).find(|&(_, c)| c == '#') {
        Some((i, _)) => line[..i].trim(),
        None => line.trim(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_keys_in_sections() {
        let text = "[general]\nlisten_port = 1\n\n[databases.\"app\"]\nport = 0\n";
        assert_eq!(locate_key(text, &["general", "listen_port"]), 2);
        assert_eq!(locate_key(text, &["databases", "app", "port"]), 5);
        assert_eq!(locate_key(text, &["databases", "app", "host"]), 4);
        assert_eq!(locate_key(text, &["users", "x", "password"]), 0);
        // Comments after a header or a value; a `#` inside a string is not one.
        let text = "[databases.app]  # primary\nhost = \"h#1\" # note\nport = 0\n";
        assert_eq!(locate_key(text, &["databases", "app", "port"]), 3);
        assert_eq!(key_at(text, text.find('0').unwrap()), "databases.app.port");
        assert_eq!(without_comment(r##"a = "x\"#y" # z"##), r##"a = "x\"#y""##);
    }

    #[test]
    fn finds_dotted_keys_and_inline_tables() {
        let text =
            "[databases]\napp = { host = \"h\", port = 0 }\n\"a.b\".port = 1\n\n[users]\nx = { password = \"p\" }\n";
        assert_eq!(locate_key(text, &["databases", "app", "port"]), 2);
        assert_eq!(locate_key(text, &["databases", "a.b", "port"]), 3);
        // Not written: the line that starts the nearest enclosing table.
        assert_eq!(locate_key(text, &["databases", "app", "dbname"]), 2);
        assert_eq!(locate_key(text, &["users", "x", "pool_mode"]), 6);
        assert_eq!(locate_key(text, &["users", "y", "password"]), 5);
        let text = "databases.app.port = 0\ngeneral = { listen_port = 1, admin_users = [\"a\", \"b\"], workers = 2 }\n";
        assert_eq!(locate_key(text, &["databases", "app", "port"]), 1);
        assert_eq!(locate_key(text, &["general", "workers"]), 2);
        assert_eq!(key_at(text, text.find("2 }").unwrap()), "general.workers");
        assert_eq!(key_at(text, text.find('1').unwrap()), "general.listen_port");
        assert_eq!(key_at(text, text.find('0').unwrap()), "databases.app.port");
        // A table opened only by dotted keys; escaped quotes; a quoted name with spaces.
        let text = "databases.big.host = \"h\"\n[databases]\napp = { host = \"a\\\"b\", port = \"x\" }\n";
        assert_eq!(locate_key(text, &["databases", "big", "dbname"]), 1);
        assert_eq!(key_at(text, text.find("\"x\"").unwrap()), "databases.app.port");
        let text = "[databases.\" app\"]\nport = 0\n";
        assert_eq!(locate_key(text, &["databases", " app", "port"]), 2);
        // A multi-line array inside an inline table: no key made of its tail.
        let text = "general = { admin_users = [\n\"a\"\n], workers = 2000 }\n";
        assert_eq!(key_at(text, text.find("2000").unwrap()), "-");
        assert_eq!(locate_key(text, &["general", "workers"]), 1);
    }

    #[test]
    fn names_the_key_at_a_position() {
        let text = "top = 1\n[general]\nlisten_port = \"x\"\n\n[databases.\"app\"]\nport = true\n";
        assert_eq!(key_at(text, text.find("\"x\"").unwrap()), "general.listen_port");
        assert_eq!(key_at(text, text.find("true").unwrap()), "databases.app.port");
        assert_eq!(key_at(text, 2), "top");
        assert_eq!(key_at(text, text.find("[general]").unwrap()), "-");
    }
}
