//! Finds the line of a key in a TOML text, so validation errors can point at it.

/// The 1-based line where `key` is set inside `[section]` (dotted section names as
/// written in the file), or the section header's line, or 0 when neither is found.
pub fn locate_key(text: &str, section: &str, key: &str) -> usize {
    let mut current = String::new();
    let mut header_line = 0;
    for (i, raw) in text.lines().enumerate() {
        let line = without_comment(raw);
        if let Some(h) = header(line) {
            current = normalize(h);
            if current == normalize(section) {
                header_line = i + 1;
            }
            continue;
        }
        if current != normalize(section) {
            continue;
        }
        if let Some((k, _)) = line.split_once('=') {
            if k.trim().trim_matches('"') == key {
                return i + 1;
            }
        }
    }
    header_line
}

/// The dotted name (`section.key`) of the setting on the line holding byte `offset`,
/// for errors the TOML parser reports by position (a wrong type, an unknown value);
/// "-" when that line sets nothing.
pub fn key_at(text: &str, offset: usize) -> String {
    let offset = offset.min(text.len());
    let start = text[..offset].rfind('\n').map_or(0, |i| i + 1);
    let line = text[start..].lines().next().unwrap_or("").trim();
    let Some((key, _)) = line.split_once('=') else { return "-".to_string() };
    let key = key.trim().trim_matches('"');
    let section = text[..start].lines().rev().find_map(|l| header(without_comment(l)).map(normalize));
    match section {
        Some(s) if !s.is_empty() => format!("{s}.{key}"),
        _ => key.to_string(),
    }
}

/// The name inside a `[section]` header line.
fn header(line: &str) -> Option<&str> {
    line.strip_prefix('[').and_then(|l| l.strip_suffix(']'))
}

/// A line without its `# comment` (a `#` inside a quoted string is kept), trimmed.
fn without_comment(line: &str) -> &str {
    let mut quote = None;
    let mut escaped = false;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (Some('"'), '\\') if !escaped => {
                escaped = true;
                continue;
            }
            (Some(q), c) if c == q && !escaped => quote = None,
            (None, '"' | '\'') => quote = Some(c),
            (None, '#') => return line[..i].trim(),
            _ => {}
        }
        escaped = false;
    }
    line.trim()
}

fn normalize(section: &str) -> String {
    section.split('.').map(|p| p.trim().trim_matches('"')).collect::<Vec<_>>().join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_keys_in_sections() {
        let text = "[general]\nlisten_port = 1\n\n[databases.\"app\"]\nport = 0\n";
        assert_eq!(locate_key(text, "general", "listen_port"), 2);
        assert_eq!(locate_key(text, "databases.app", "port"), 5);
        assert_eq!(locate_key(text, "databases.app", "host"), 4);
        assert_eq!(locate_key(text, "users.x", "password"), 0);
        // Comments after a header or a value; a `#` inside a string is not one.
        let text = "[databases.app]  # primary\nhost = \"h#1\" # note\nport = 0\n";
        assert_eq!(locate_key(text, "databases.app", "port"), 3);
        assert_eq!(key_at(text, text.find('0').unwrap()), "databases.app.port");
        assert_eq!(without_comment(r##"a = "x\"#y" # z"##), r##"a = "x\"#y""##);
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
