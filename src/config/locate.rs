//! Finds the line of a key in a TOML text, so validation errors can point at it.

/// The 1-based line where `key` is set inside `[section]` (dotted section names as
/// written in the file), or the section header's line, or 0 when neither is found.
pub fn locate_key(text: &str, section: &str, key: &str) -> usize {
    let mut current = String::new();
    let mut header_line = 0;
    for (i, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if let Some(h) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
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
    let section = text[..start]
        .lines()
        .rev()
        .find_map(|l| l.trim().strip_prefix('[').and_then(|l| l.strip_suffix(']')).map(normalize));
    match section {
        Some(s) if !s.is_empty() => format!("{s}.{key}"),
        _ => key.to_string(),
    }
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
