//! `auth_hba_file`: which authentication method a login gets, read from a file in
//! PostgreSQL's pg_hba.conf format (the part PgBouncer reads, and a little more), for
//! `auth_type = "hba"`. The first line whose connection type, database, user and client
//! address fit the login decides; no fitting line refuses it.
//!
//! Read: `local`, `host`, `hostssl`, `hostnossl` (and `hostgssenc`, which fits nothing
//! as Sluice has no GSSAPI encryption, `hostnogssenc`, which is `host`); databases `all`,
//! `sameuser`, `replication` (fits nothing: Sluice serves no replication connections),
//! names, `@file`; users `all`, names, `@file`; addresses `all`, CIDR ranges, an address
//! and a netmask; methods `trust`, `reject`, `md5`, `password`, `scram-sha-256`, `cert`
//! (on `hostssl` lines) and `peer` (on `local` lines). Lists are comma-separated, double
//! quotes keep a keyword as a name, `#` starts a comment, a line ending with `\` goes on
//! on the next; `peer` and `cert` lines take `map=` (`auth_ident_file`). What Sluice
//! cannot honour (`+group`, regular expressions, host names, `samehost`, IPv4-mapped
//! ranges, `include`, other options, other methods) is an error naming the file and
//! line, never a line silently skipped.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::ident::{Ident, UserMap};
use super::{AuthType, ClientTlsMode, ConfigError, General, Invalid};
use crate::auth::client::Method;

/// The rules of an `auth_hba_file`.
#[derive(Debug, Clone, PartialEq)]
pub struct Hba {
    pub file: PathBuf,
    rules: Vec<Rule>,
    /// The `auth_ident_file`'s maps, for `map=` options.
    pub ident: Option<Ident>,
}

/// One line of the file.
#[derive(Debug, Clone, PartialEq)]
pub struct Rule {
    /// Its line in the file (the first, for a line continued with `\`).
    pub line: usize,
    kind: Kind,
    databases: Vec<Name>,
    users: Vec<Name>,
    /// `None`: every address (and `local` lines, which have none).
    net: Option<(IpAddr, u8)>,
    pub action: Action,
    /// `map=`: the `auth_ident_file` map that says which names may log in as which users.
    map: Option<String>,
}

/// What a line tells a login to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Authenticate(Method),
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Local,
    Host,
    HostSsl,
    HostNoSsl,
    /// `hostgssenc`: GSSAPI-encrypted connections, which Sluice does not take.
    Never,
}

#[derive(Debug, Clone, PartialEq)]
enum Name {
    All,
    SameUser,
    /// `replication`: physical replication connections, which Sluice does not take.
    Replication,
    Is(String),
}

/// A line's `map=` with no `auth_ident_file` to read it from (`Rule::user_map`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapWithoutIdent;

/// A login as the file's lines see it.
#[derive(Debug, Clone, Copy)]
pub struct Login<'a> {
    /// The client's address; `None` on the Unix socket.
    pub addr: Option<IpAddr>,
    pub tls: bool,
    pub database: &'a str,
    pub user: &'a str,
}

/// A token of a line: its text, and whether it starts with a double quote (a name,
/// never a keyword).
#[derive(Debug)]
pub(super) struct Token {
    pub(super) text: String,
    pub(super) quoted: bool,
}

/// How deep `@file` inclusions may nest.
const MAX_INCLUDE_DEPTH: usize = 10;

/// The `auth_hba_file` `g` names, read under `auth_type = "hba"` (relative to the config
/// at `config`); `None` for the other auth types, which do not read it (PgBouncer's rule).
pub(super) fn for_config(g: &General, config: &Path, invalid: Invalid) -> Result<Option<Arc<Hba>>, ConfigError> {
    if g.auth_type != AuthType::Hba {
        return Ok(None);
    }
    if g.auth_hba_file.is_empty() {
        return Err(invalid("auth_hba_file", "auth_type = \"hba\" needs an auth_hba_file".into()));
    }
    let mut hba = Hba::load(&super::resolve_from(config, &g.auth_hba_file))?;
    if !g.auth_ident_file.is_empty() {
        hba.ident = Some(Ident::load(&super::resolve_from(config, &g.auth_ident_file))?);
    }
    for rule in &hba.rules {
        let Some(map) = &rule.map else { continue };
        let message = match &hba.ident {
            None => format!("map=\"{map}\" needs an auth_ident_file"),
            Some(i) if !i.has_map(map) => format!("map \"{map}\" is not in {}", i.file.display()),
            Some(_) => continue,
        };
        return Err(hba.invalid(rule.line, "method", message));
    }
    if hba.rules.is_empty() {
        // As PostgreSQL refuses a pg_hba.conf without entries: every login would be.
        return Err(hba.invalid(1, "-", "the file has no rules: every login would be refused".into()));
    }
    check_tls(g, &hba)?;
    Ok(Some(Arc::new(hba)))
}

/// Whether `g`'s client TLS lets `hba`'s lines fit: `hostssl` lines need TLS on (as
/// PostgreSQL refuses them with `ssl = off`), `cert` lines a CA to check certificates
/// with (at load, for SET, and for a reload that kept the running TLS keys).
pub fn check_tls(g: &General, hba: &Hba) -> Result<(), ConfigError> {
    if g.client_tls_sslmode == ClientTlsMode::Disable
        && let Some(r) = hba.rules.iter().find(|r| r.kind == Kind::HostSsl)
    {
        let message = "hostssl cannot fit a login: client_tls_sslmode is \"disable\"";
        return Err(hba.invalid(r.line, "connection type", message.into()));
    }
    match hba.first(Method::Cert) {
        Some(r) if g.client_tls_ca_file.is_empty() => {
            Err(hba.invalid(r.line, "method", "cert needs client_tls_ca_file to check certificates".into()))
        }
        _ => Ok(()),
    }
}

/// What in `hba` fits no login under `g` though it loads: `hostnossl` lines when TLS is
/// required (plaintext is refused before the file is read), `local` lines without a
/// Unix socket; and users whose md5 hash cannot check the file's `scram-sha-256` lines.
pub(super) fn warnings(g: &General, hba: &Hba, md5_users: &[&str]) -> Vec<String> {
    let file = hba.file.display();
    let mut out = Vec::new();
    for r in &hba.rules {
        let never = match r.kind {
            Kind::HostNoSsl if g.client_tls_sslmode.requires_tls() => "client_tls_sslmode refuses plaintext TCP logins",
            Kind::Local if g.unix_socket_dir.is_empty() => "unix_socket_dir is empty (no Unix socket)",
            _ => continue,
        };
        out.push(format!("{file}:{}: this line fits no login: {never}", r.line));
    }
    if !md5_users.is_empty()
        && let Some(r) = hba.first(Method::ScramSha256)
    {
        out.push(format!(
            "{file}:{}: an md5 hash cannot check SCRAM logins: the logins of {} on scram-sha-256 lines are refused",
            r.line,
            md5_users.join(", ")
        ));
    }
    out
}

impl Hba {
    pub fn load(file: &Path) -> Result<Hba, ConfigError> {
        Self::parse(&super::read(file)?, file)
    }

    /// An error at `line` of the file.
    fn invalid(&self, line: usize, key: &str, message: String) -> ConfigError {
        ConfigError::at(&self.file, line, key, message)
    }

    /// The rules of `text`, read from `file` (`@file` names are relative to its
    /// directory).
    pub fn parse(text: &str, file: &Path) -> Result<Hba, ConfigError> {
        let mut rules = Vec::new();
        for (line, fields) in logical_lines(text) {
            let at = |(key, message): (&str, String)| ConfigError::at(file, line, key, message);
            let fields = split(&fields).map_err(|m| at(("-", m)))?;
            if fields.is_empty() {
                continue;
            }
            rules.push(rule(line, fields, file).map_err(at)?);
        }
        Ok(Hba { file: file.to_path_buf(), rules, ident: None })
    }

    /// The line that decides `login`, if one fits it.
    pub fn rule_for(&self, login: &Login<'_>) -> Option<&Rule> {
        self.rules.iter().find(|r| r.fits(login))
    }

    /// The first line that authenticates with `method`, if one does.
    pub fn first(&self, method: Method) -> Option<&Rule> {
        self.rules.iter().find(|r| r.action == Action::Authenticate(method))
    }
}

impl Rule {
    /// The user name map of a `map=` option, with the maps it names: `Err` when the
    /// line has one but `hba` has no `auth_ident_file` (loading refuses that; a login
    /// refused, never let in as if the line had no map).
    pub fn user_map<'a>(&'a self, hba: &'a Hba) -> Result<Option<UserMap<'a>>, MapWithoutIdent> {
        match (&self.map, &hba.ident) {
            (None, _) => Ok(None),
            (Some(name), Some(ident)) => Ok(Some(UserMap { ident, name })),
            (Some(_), None) => Err(MapWithoutIdent),
        }
    }

    fn fits(&self, login: &Login<'_>) -> bool {
        let kind = match (self.kind, login.addr) {
            (Kind::Local, addr) => addr.is_none(),
            (Kind::Never, _) | (_, None) => false,
            (Kind::Host, Some(_)) => true,
            (Kind::HostSsl, Some(_)) => login.tls,
            (Kind::HostNoSsl, Some(_)) => !login.tls,
        };
        let net = match (self.net, login.addr) {
            (Some((net, prefix)), Some(addr)) => in_net(addr.to_canonical(), net, prefix),
            _ => true,
        };
        let database = self.databases.iter().any(|d| match d {
            Name::All => true,
            Name::SameUser => login.database == login.user,
            Name::Replication => false,
            Name::Is(n) => n == login.database,
        });
        let user = self.users.iter().any(|u| matches!(u, Name::All) || matches!(u, Name::Is(n) if n == login.user));
        kind && net && database && user
    }
}

/// Whether `addr` is inside `net`/`prefix` (of the same family).
fn in_net(addr: IpAddr, net: IpAddr, prefix: u8) -> bool {
    match (addr, net) {
        (IpAddr::V4(a), IpAddr::V4(n)) => {
            let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            u32::from(a) & mask == u32::from(n) & mask
        }
        (IpAddr::V6(a), IpAddr::V6(n)) => {
            let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            u128::from(a) & mask == u128::from(n) & mask
        }
        _ => false,
    }
}

/// The file's lines with their line numbers, a line ending with `\` joined with the next.
pub(super) fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut out: Vec<(usize, String)> = Vec::new();
    let mut open = false;
    for (i, line) in text.lines().enumerate() {
        let line = line.strip_suffix('\r').unwrap_or(line);
        let (body, continued) = match line.strip_suffix('\\') {
            Some(body) => (body, true),
            None => (line, false),
        };
        match out.last_mut() {
            Some((_, joined)) if open => joined.push_str(body),
            _ => out.push((i + 1, body.to_string())),
        }
        open = continued;
    }
    out
}

/// A line's fields, each a comma-separated list of tokens; a comment ends it. As in
/// PostgreSQL, a token that starts with a double quote is a name, never a keyword, and
/// two double quotes inside quotes stand for one.
pub(super) fn split(line: &str) -> Result<Vec<Vec<Token>>, String> {
    let mut fields = Vec::new();
    let mut field: Vec<Token> = Vec::new();
    let mut text = String::new();
    let (mut quoted, mut started, mut in_quotes, mut after_comma) = (false, false, false, false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        if in_quotes {
            match c {
                '"' if chars.next_if_eq(&'"').is_some() => text.push('"'),
                '"' => in_quotes = false,
                c => text.push(c),
            }
            continue;
        }
        match c {
            '#' => break,
            '"' => (in_quotes, quoted, started, after_comma) = (true, quoted || !started, true, false),
            ',' if !started => return Err("a name is missing in a comma-separated list".into()),
            ',' => {
                field.push(Token { text: std::mem::take(&mut text), quoted });
                (quoted, started, after_comma) = (false, false, true);
            }
            c if c.is_whitespace() => {
                if started {
                    field.push(Token { text: std::mem::take(&mut text), quoted });
                    (quoted, started) = (false, false);
                }
                if !after_comma && !field.is_empty() {
                    fields.push(std::mem::take(&mut field));
                }
            }
            c => {
                text.push(c);
                (started, after_comma) = (true, false);
            }
        }
    }
    if in_quotes {
        return Err("a double quote is not closed".into());
    }
    if started {
        field.push(Token { text, quoted });
    } else if after_comma {
        return Err("a comma-separated list ends with a comma".into());
    }
    if !field.is_empty() {
        fields.push(field);
    }
    Ok(fields)
}

type Failure = (&'static str, String);

/// One line's rule from its fields.
fn rule(line: usize, fields: Vec<Vec<Token>>, file: &Path) -> Result<Rule, Failure> {
    let mut fields = fields.into_iter();
    let kind = single(fields.next(), "connection type")?.text;
    let kind = match kind.as_str() {
        "local" => Kind::Local,
        "host" | "hostnogssenc" => Kind::Host,
        "hostssl" => Kind::HostSsl,
        "hostnossl" => Kind::HostNoSsl,
        "hostgssenc" => Kind::Never,
        "include" | "include_if_exists" | "include_dir" => {
            return Err(("connection type", format!("\"{kind}\" is not supported: list the lines in this file")));
        }
        other => return Err(("connection type", format!("unknown connection type \"{other}\""))),
    };
    let dir = file.parent().unwrap_or(Path::new("."));
    let databases = names(fields.next(), "database", dir)?;
    let users = names(fields.next(), "user", dir)?;
    let net = if kind == Kind::Local { None } else { address(&mut fields)? };
    let action = method(&single(fields.next(), "method")?.text, kind)?;
    let names = matches!(action, Action::Authenticate(Method::Peer | Method::Cert));
    let mut map = None;
    for option in fields {
        let single = option.len() == 1;
        let option = option.iter().map(|t| t.text.as_str()).collect::<Vec<_>>().join(",");
        match option.strip_prefix("map=") {
            Some(name) if names && single && !name.is_empty() && map.is_none() => map = Some(name.to_string()),
            _ if names => return Err(("method", format!("the only option of peer and cert is map= (\"{option}\")"))),
            _ => return Err(("method", format!("options are not supported (\"{option}\")"))),
        }
    }
    Ok(Rule { line, kind, databases, users, net, action, map })
}

/// A field the line must have.
fn present(field: Option<Vec<Token>>, what: &'static str) -> Result<Vec<Token>, Failure> {
    field.ok_or((what, format!("the line ends before its {what}")))
}

/// A field that must be one word.
fn single(field: Option<Vec<Token>>, what: &'static str) -> Result<Token, Failure> {
    let mut field = present(field, what)?;
    if field.len() != 1 {
        return Err((what, format!("the {what} must be a single word")));
    }
    Ok(field.remove(0))
}

/// The database or user field.
fn names(field: Option<Vec<Token>>, what: &'static str, dir: &Path) -> Result<Vec<Name>, Failure> {
    let mut out = Vec::new();
    for token in present(field, what)? {
        expand(token, what, dir, 0, &mut out)?;
    }
    Ok(out)
}

/// One name of a database or user field into `out` (an `@file`'s names, read).
fn expand(token: Token, what: &'static str, dir: &Path, depth: usize, out: &mut Vec<Name>) -> Result<(), Failure> {
    let database = what == "database";
    let name = match token.text.as_str() {
        _ if token.quoted => Name::Is(token.text),
        "all" => Name::All,
        "sameuser" if database => Name::SameUser,
        "replication" if database => Name::Replication,
        "samerole" | "samegroup" if database => {
            return Err((what, format!("\"{}\" is not supported (Sluice does not read role memberships)", token.text)));
        }
        t if t.starts_with('+') && !database => {
            return Err((what, format!("groups (\"{t}\") are not supported: list the users")));
        }
        t if t.starts_with('/') => return Err((what, format!("regular expressions (\"{t}\") are not supported"))),
        t if t.starts_with('@') && t.len() > 1 => return include(&t[1..], what, dir, depth, out),
        _ => Name::Is(token.text),
    };
    out.push(name);
    Ok(())
}

/// The names listed in the file `@name` refers to (relative to the including file).
fn include(name: &str, what: &'static str, dir: &Path, depth: usize, out: &mut Vec<Name>) -> Result<(), Failure> {
    if depth == MAX_INCLUDE_DEPTH {
        return Err((what, format!("@{name}: files included more than {MAX_INCLUDE_DEPTH} deep")));
    }
    let path = dir.join(name);
    let text = std::fs::read_to_string(&path).map_err(|e| (what, format!("cannot read {}: {e}", path.display())))?;
    let inner = path.parent().unwrap_or(dir);
    for (line, body) in logical_lines(&text) {
        let fields = split(&body).map_err(|m| (what, format!("{}:{line}: {m}", path.display())))?;
        for token in fields.into_iter().flatten() {
            expand(token, what, inner, depth + 1, out)?;
        }
    }
    Ok(())
}

/// The address field of a `host*` line (and the netmask field after an address).
fn address(fields: &mut impl Iterator<Item = Vec<Token>>) -> Result<Option<(IpAddr, u8)>, Failure> {
    const WHAT: &str = "address";
    let Token { text, quoted } = single(fields.next(), WHAT)?;
    let host_name = || Err((WHAT, format!("host names (\"{text}\") are not supported: give an address range")));
    if quoted {
        // A name, as PostgreSQL reads a quoted keyword there too.
        return host_name();
    }
    if text == "all" {
        return Ok(None);
    }
    if text == "samehost" || text == "samenet" {
        return Err((WHAT, format!("\"{text}\" is not supported: give an address range")));
    }
    let bad_range = || (WHAT, format!("\"{text}\" is not an address range (such as 10.0.0.0/8 or ::1/128)"));
    if let Some((addr, prefix)) = text.split_once('/') {
        let addr: IpAddr = addr.parse().map_err(|_| bad_range())?;
        let prefix: u8 = prefix.parse().map_err(|_| bad_range())?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        return if prefix <= max { range(addr, prefix).map(Some) } else { Err(bad_range()) };
    }
    let Ok(addr) = text.parse::<IpAddr>() else { return host_name() };
    let mask = single(fields.next(), "netmask")?.text;
    let prefix = match (addr, mask.parse::<IpAddr>()) {
        (IpAddr::V4(_), Ok(IpAddr::V4(m))) => prefix_of(u128::from(u32::from(m)) << 96),
        (IpAddr::V6(_), Ok(IpAddr::V6(m))) => prefix_of(u128::from(m)),
        _ => None,
    };
    let prefix = prefix.ok_or((
        "netmask",
        format!("\"{mask}\" is not a netmask for {text} (or give the range in CIDR notation, {text}/32)"),
    ))?;
    range(addr, prefix).map(Some)
}

/// A range, refused when it is IPv4-mapped IPv6 (`::ffff:10.0.0.0/104`): PostgreSQL's
/// IPv6 sockets never see IPv4 clients, so there such a line fits none, while Sluice
/// matches an IPv4 client on a dual-stack socket by its IPv4 address (`Rule::fits`).
/// Either reading would surprise someone: the line must say which it means.
fn range(addr: IpAddr, prefix: u8) -> Result<(IpAddr, u8), Failure> {
    match addr {
        IpAddr::V6(v6) if v6.to_ipv4_mapped().is_some() => Err((
            "address",
            format!("IPv4-mapped ranges (\"{addr}/{prefix}\") are not supported: write the IPv4 range"),
        )),
        _ => Ok((addr, prefix)),
    }
}

/// The prefix length of a contiguous mask (its bits from the top).
fn prefix_of(mask: u128) -> Option<u8> {
    let ones = mask.leading_ones();
    (mask.checked_shl(ones).unwrap_or(0) == 0).then_some(ones as u8)
}

fn method(name: &str, kind: Kind) -> Result<Action, Failure> {
    const WHAT: &str = "method";
    let method = match name {
        "reject" => return Ok(Action::Reject),
        "trust" => Method::Trust,
        "md5" => Method::Md5,
        "password" => Method::Password,
        "scram-sha-256" => Method::ScramSha256,
        "cert" if kind != Kind::HostSsl => {
            return Err((WHAT, "cert authentication is only supported on hostssl lines".into()));
        }
        "cert" => Method::Cert,
        "peer" if kind != Kind::Local => {
            return Err((WHAT, "peer authentication is only supported on local lines".into()));
        }
        "peer" => Method::Peer,
        other => return Err((WHAT, format!("authentication method \"{other}\" is not supported"))),
    };
    Ok(Action::Authenticate(method))
}

#[cfg(test)]
#[path = "hba_tests.rs"]
mod tests;
