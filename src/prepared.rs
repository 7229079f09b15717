//! Named prepared statements in transaction and statement mode. A client's statement
//! names map to server-side names derived from the query text (`sluice_<hash>`), so a
//! statement is parsed once per server connection whatever the number of clients
//! preparing it. This module holds the state (per client, per server) and the message
//! views and builders; `client::extended` applies them to the relayed stream.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};

use crate::protocol::{ProtocolError, body, build, read_cstr};

/// Largest Parse message Sluice holds whole to learn its query text.
pub const MAX_PARSE_LEN: usize = 64 << 20;

/// How much of a Bind or Describe must be seen to rename its statement.
pub const NAME_PREFIX: usize = 5 + 2 * 1024;

/// A statement as prepared on servers.
#[derive(Debug)]
pub struct Statement {
    /// Hash of the query text and parameter types; names it on servers.
    pub id: u64,
    /// The server-side name, `sluice_<id>`.
    pub name: Bytes,
    /// The Parse frame Sluice sends to a server, with the server-side name.
    pub parse: Bytes,
    /// The pool's schema epoch when the client parsed it: copies prepared before that
    /// are older than the client's Parse and must not stand in for it.
    pub epoch: u64,
    /// What executing it does beyond its result.
    pub effects: TextEffects,
    /// The reply (RowDescription or NoData frame) the client got when it described
    /// the statement, the statement generation it was seen at, and its hash; a copy
    /// that was not checked against that shape on its server (prepared by Sluice, or by
    /// another client: `ServerStatements::lookup_checked`), or of a later generation, is
    /// checked against it before use.
    pub shape: parking_lot::Mutex<Option<(Bytes, u64, u64)>>,
}

impl Statement {
    pub fn server_name(id: u64) -> String {
        format!("sluice_{id:016x}")
    }
}

/// A Parse message's parts.
pub struct ParseView<'a> {
    pub name: &'a [u8],
    pub query: &'a [u8],
    /// Parameter count and types, as sent.
    pub types: &'a [u8],
}

pub fn parse_view(frame: &[u8]) -> Result<ParseView<'_>, ProtocolError> {
    let bad = ProtocolError::Malformed("Parse");
    let (name, rest) = read_cstr(body(frame)).ok_or(bad.clone())?;
    let (query, types) = read_cstr(rest).ok_or(bad.clone())?;
    // The parameter types must be all there is: PostgreSQL would fail the message while
    // reading it, before it drops the previous unnamed statement, which could be
    // another client's.
    // Unsigned, as PostgreSQL reads it (up to 65535 parameter types).
    let count = types.get(..2).map(|c| u16::from_be_bytes([c[0], c[1]])).ok_or(bad.clone())?;
    if types.len() != 2 + 4 * count as usize {
        return Err(bad);
    }
    Ok(ParseView { name, query, types })
}

/// Builds the statement a client's Parse describes, parsed in schema `epoch` by a
/// client whose settings that may change parsing hash to `settings`
/// (`ClientParams::parse_hash`): the same text parsed under another `TimeZone`,
/// `DateStyle`, `search_path` or `client_encoding` may mean something else (a literal
/// converted at parse time, a parameter type inferred from another table), so clients
/// share a server's copy only when those settings agree.
pub fn statement(p: &ParseView, epoch: u64, settings: u64) -> Statement {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    p.query.hash(&mut h);
    p.types.hash(&mut h);
    settings.hash(&mut h);
    let id = h.finish();
    let name = Bytes::from(Statement::server_name(id));
    let mut out = BytesMut::with_capacity(p.query.len() + p.types.len() + 32);
    out.put_u8(b'P');
    out.put_u32(0);
    out.put_slice(&name);
    out.put_u8(0);
    out.put_slice(p.query);
    out.put_u8(0);
    out.put_slice(p.types);
    let len = (out.len() - 1) as u32;
    out[1..5].copy_from_slice(&len.to_be_bytes());
    Statement { id, name, parse: out.freeze(), epoch, effects: TextEffects::of(p.query), shape: Default::default() }
}

/// The statement name field of a Bind (after the portal name) or a Describe/Close
/// (after the kind byte): its offset within the frame and its bytes.
pub fn name_field(frame: &[u8], tag: u8) -> Result<(usize, &[u8]), ProtocolError> {
    let b = body(frame);
    let skip = match tag {
        b'B' => read_cstr(b).map(|(portal, _)| portal.len() + 1).ok_or(ProtocolError::Malformed("Bind"))?,
        _ => 1,
    };
    let rest = b.get(skip..).ok_or(ProtocolError::Malformed("Describe/Close"))?;
    let (name, _) = read_cstr(rest).ok_or(ProtocolError::Malformed("statement name too long or unterminated"))?;
    Ok((5 + skip, name))
}

/// Rewrites the statement name of a Bind/Describe whose first `prefix.len()` bytes
/// are given: appends the new prefix (header with adjusted length, fields up to and
/// including the new name) to `out` and returns how many bytes of the original it
/// replaces.
pub fn renamed_prefix(
    out: &mut BytesMut,
    prefix: &[u8],
    frame_len: usize,
    tag: u8,
    new_name: &[u8],
) -> Result<usize, ProtocolError> {
    let (at, old) = name_field(prefix, tag)?;
    let replaced = at + old.len() + 1;
    let new_len = frame_len - old.len() + new_name.len() - 1;
    out.put_u8(tag);
    out.put_u32(new_len as u32);
    out.put_slice(&prefix[5..at]);
    out.put_slice(new_name);
    out.put_u8(0);
    Ok(replaced)
}

/// The statements a client prepared, by its names.
#[derive(Debug, Default)]
pub struct ClientStatements {
    map: HashMap<Bytes, Arc<Statement>>,
    /// The client's latest unnamed-statement Parse.
    pub unnamed: Option<Unnamed>,
    /// The buffer of a forgotten unnamed Parse, reused for the next one.
    spare: Vec<u8>,
}

/// A statement name as PostgreSQL keys its prepared statements: its first 63 bytes
/// (NAMEDATALEN − 1), so two names alike that far are one name, as on PostgreSQL.
/// (Names kept elsewhere, in the expected replies' effects, are kept so too.)
#[inline]
pub fn key(name: &[u8]) -> &[u8] {
    &name[..name.len().min(63)]
}

impl ClientStatements {
    #[inline]
    pub fn get(&self, name: &[u8]) -> Option<&Arc<Statement>> {
        self.map.get(key(name))
    }

    pub fn insert(&mut self, name: &[u8], s: Arc<Statement>) {
        self.map.insert(Bytes::copy_from_slice(key(name)), s);
    }

    /// Forgets `name` if it still stands for `st` (a later Parse may have reused it).
    pub fn undefine(&mut self, name: &[u8], st: &Arc<Statement>) {
        if self.get(name).is_some_and(|cur| Arc::ptr_eq(cur, st)) {
            self.map.remove(key(name));
        }
    }

    /// Removes `name`; gives back the name (as kept, no copy) and its statement.
    pub fn remove(&mut self, name: &[u8]) -> Option<(Bytes, Arc<Statement>)> {
        self.map.remove_entry(key(name))
    }

    /// Gives `name` back to `st` unless it was defined again meanwhile (a Close the
    /// server skipped after an error: the name still stands).
    pub fn restore(&mut self, name: Bytes, st: Arc<Statement>) {
        let name = name.slice(..name.len().min(63));
        self.map.entry(name).or_insert(st);
    }

    /// Forgets the named statements (DEALLOCATE ALL, DISCARD ALL). The unnamed one stays,
    /// as on PostgreSQL, which keeps it apart from the named ones.
    pub fn clear(&mut self) {
        self.map.clear();
    }

    /// Keeps `frame` as the client's unnamed-statement Parse, in a reused buffer (an
    /// unnamed Parse comes with nearly every extended-protocol query).
    pub fn set_unnamed(&mut self, frame: &[u8], id: u64, effects: TextEffects) {
        let mut parse = match self.unnamed.take() {
            Some(u) => u.parse,
            None => std::mem::take(&mut self.spare),
        };
        parse.clear();
        parse.extend_from_slice(frame);
        self.unnamed = Some(Unnamed { parse, id, effects });
    }

    pub fn forget_unnamed(&mut self) {
        if let Some(u) = self.unnamed.take() {
            self.spare = u.parse;
        }
    }

    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// Whether a server holds a statement, and of which generation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presence {
    Absent,
    /// Prepared before a schema change made it stale: close it, then prepare again.
    Stale,
    Fresh,
}

/// Statement generations of a pool: an id is bumped when a server reports its plan
/// stale (a result type changed), so copies of older generations on other servers are
/// re-prepared. Absent ids are generation 0.
pub type Generations = HashMap<u64, u64>;

/// The statements a server connection holds, with least-recently-used eviction.
#[derive(Debug, Default)]
pub struct ServerStatements {
    /// id → (last use tick, generation prepared, schema epoch prepared in, hash of the
    /// shape a client's Describe of this copy showed, 0 before any).
    used: HashMap<u64, (u64, u64, u64, u64)>,
    tick: u64,
    /// Statements to Close on the server before its next use (evicted or stale).
    pub to_close: Vec<u64>,
    /// Id of the client unnamed statement the server currently holds (0: none known).
    pub unnamed: u64,
}

impl ServerStatements {
    /// Whether the server holds `id` at generation `gen` (and marks it used).
    pub fn lookup(&mut self, id: u64, generation: u64) -> Presence {
        self.lookup_since(id, generation, 0)
    }

    /// Like [`ServerStatements::lookup`], but a copy prepared before schema epoch
    /// `epoch` is stale too: a new client Parse must get what PostgreSQL would parse
    /// now, not a copy planned before a DDL.
    pub fn lookup_since(&mut self, id: u64, generation: u64, epoch: u64) -> Presence {
        self.lookup_checked(id, generation, epoch).0
    }

    /// `lookup_since`, and the hash of the shape a Describe of the copy showed
    /// (`checked`), in one look.
    #[inline]
    pub fn lookup_checked(&mut self, id: u64, generation: u64, epoch: u64) -> (Presence, u64) {
        self.tick += 1;
        match self.used.get_mut(&id) {
            Some((t, g, e, c)) if *g == generation && *e >= epoch => {
                *t = self.tick;
                (Presence::Fresh, *c)
            }
            Some((_, _, _, c)) => (Presence::Stale, *c),
            None => (Presence::Absent, 0),
        }
    }

    pub fn contains(&mut self, id: u64) -> bool {
        self.lookup(id, self.generation(id).unwrap_or(0)) == Presence::Fresh
    }

    /// The generation the server holds `id` at.
    pub fn generation(&self, id: u64) -> Option<u64> {
        self.used.get(&id).map(|(_, g, _, _)| *g)
    }

    /// A client's Describe of this copy showed the shape that hashes to `hash`.
    pub fn set_checked(&mut self, id: u64, hash: u64) {
        if let Some((_, _, _, c)) = self.used.get_mut(&id) {
            *c = hash;
        }
    }

    /// Records a statement as prepared; returns the one evicted to stay within `cap`.
    pub fn add(&mut self, id: u64, cap: usize) -> Option<u64> {
        self.add_gen(id, 0, 0, cap)
    }

    /// Records `id` prepared at `generation` in schema `epoch`.
    pub fn add_gen(&mut self, id: u64, generation: u64, epoch: u64, cap: usize) -> Option<u64> {
        self.tick += 1;
        self.used.insert(id, (self.tick, generation, epoch, 0));
        if self.used.len() <= cap.max(1) {
            return None;
        }
        let (&oldest, _) = self.used.iter().filter(|(k, _)| **k != id).min_by_key(|(_, (t, _, _, _))| *t)?;
        self.used.remove(&oldest);
        Some(oldest)
    }

    pub fn forget(&mut self, id: u64) {
        self.used.remove(&id);
    }

    /// After DISCARD ALL / DEALLOCATE ALL on the server.
    pub fn clear(&mut self) {
        self.used.clear();
        self.to_close.clear();
        self.unnamed = 0;
    }

    /// After DISCARD ALL / DEALLOCATE ALL on the server, with the statements in `after`
    /// parsed behind it in the same pipeline: those the server holds (those whose
    /// Parse fails are forgotten when it does).
    pub fn clear_except(&mut self, after: impl Iterator<Item = u64>) {
        let after: Vec<u64> = after.collect();
        self.used.retain(|id, _| after.contains(id));
        self.to_close.clear();
        self.unnamed = 0;
    }

    pub fn len(&self) -> usize {
        self.used.len()
    }

    pub fn is_empty(&self) -> bool {
        self.used.is_empty()
    }
}

/// A Describe of a server-side statement.
pub fn describe_frame(buf: &mut BytesMut, name: &[u8]) {
    build::describe(buf, b'S', name);
}

/// A Close of a server-side statement.
pub fn close_frame(buf: &mut BytesMut, id: u64) {
    build::close(buf, b'S', Statement::server_name(id).as_bytes());
}

/// A Bind the server always refuses: of a statement Sluice never prepares (its names
/// are `sluice_` and 16 hex digits), so 26000; and were a client to have prepared one
/// by that name with SQL, with two parameter formats for no parameters, so 08P01 (an
/// ERROR, checked once the statement is found). It fails the exchange where PostgreSQL
/// itself would have, aborting the transaction the same way.
pub fn failing_bind_frame(buf: &mut BytesMut) {
    build::bind_with_formats(buf, b"", b"sluice_refused", &[0, 0]);
}

/// SQL commands about prepared statements that Sluice answers or follows itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SqlCommand {
    Deallocate(String),
    DeallocateAll,
    DiscardAll,
}

impl SqlCommand {
    /// Whether it removes every prepared statement of the session.
    pub fn empties(&self) -> bool {
        matches!(self, SqlCommand::DeallocateAll | SqlCommand::DiscardAll)
    }
}

/// A client's latest unnamed-statement Parse.
#[derive(Debug)]
pub struct Unnamed {
    pub parse: Vec<u8>,
    /// Tells this Parse apart from others (a server remembers which one it holds).
    pub id: u64,
    pub effects: TextEffects,
}

/// What executing a statement text does beyond its result, worked out once at Parse
/// (a statement is bound far more often than parsed), and what the statements of an
/// exchange may have done, together (`|=`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TextEffects {
    /// May change what later statements parse to (`SetTarget::changes_parsing`).
    pub sets_parsing: bool,
    /// May change a session setting PostgreSQL does not report
    /// (`SetTarget::sets_session`).
    pub sets_session: bool,
    /// May change the role (`SetTarget::sets_role`).
    pub sets_role: bool,
}

impl TextEffects {
    /// Anything at all: what a statement text not read counts as.
    pub const ALL: TextEffects = TextEffects { sets_parsing: true, sets_session: true, sets_role: true };

    pub fn of(sql: &[u8]) -> TextEffects {
        TextEffects::of_target(SetTarget::of(sql), Some(sql))
    }

    /// Of a text's `SetTarget` (`sql`, None when the text was not read whole).
    pub fn of_target(set: SetTarget, sql: Option<&[u8]>) -> TextEffects {
        TextEffects {
            sets_parsing: set.changes_parsing(),
            sets_session: set.sets_session(),
            sets_role: set.sets_role(sql),
        }
    }
}

impl std::ops::BitOrAssign for TextEffects {
    #[inline]
    fn bitor_assign(&mut self, other: TextEffects) {
        self.sets_parsing |= other.sets_parsing;
        self.sets_session |= other.sets_session;
        self.sets_role |= other.sets_role;
    }
}

/// The first word of a statement text (letters only), without allocating.
fn first_word(sql: &[u8]) -> &[u8] {
    let word = skip_blank(sql);
    &word[..word.iter().position(|b| !b.is_ascii_alphabetic()).unwrap_or(word.len())]
}

/// `sql` past white space and comments, as PostgreSQL reads them: `--` to the end of
/// the line, `/* ... */` nested. (Query tags put comments ahead of statements: a
/// `/* app */ SET ROLE ...` is a SET.) An unterminated comment is left in place.
#[inline]
fn skip_blank(sql: &[u8]) -> &[u8] {
    let s = sql.trim_ascii_start();
    // (Every Query and Parse passes here: one byte looked at for the usual text.)
    match s.first() {
        Some(b'-' | b'/') => skip_comments(s),
        _ => s,
    }
}

#[cold]
#[inline(never)]
fn skip_comments(mut s: &[u8]) -> &[u8] {
    loop {
        if s.starts_with(b"--") {
            // (PostgreSQL ends it at either of `\n` and `\r`.)
            s = memchr::memchr2(b'\n', b'\r', s).map_or(&[][..], |i| &s[i + 1..]);
        } else if s.starts_with(b"/*") {
            let Some(end) = block_comment_end(s) else { return s };
            s = &s[end..];
        } else {
            return s;
        }
        s = s.trim_ascii_start();
    }
}

/// Where the block comment `s` starts with ends (past its `*/`), nested ones counted.
fn block_comment_end(s: &[u8]) -> Option<usize> {
    let (mut depth, mut i) = (0usize, 0);
    while i + 1 < s.len() {
        match (s[i], s[i + 1]) {
            (b'/', b'*') => (depth, i) = (depth + 1, i + 2),
            (b'*', b'/') if depth == 1 => return Some(i + 2),
            (b'*', b'/') => (depth, i) = (depth - 1, i + 2),
            _ => i += 1,
        }
    }
    None
}

/// Whether a setting is one of the few known not to change what statements parse to.
pub fn parse_neutral(name: &[u8]) -> bool {
    PARSE_NEUTRAL.iter().any(|n| n.eq_ignore_ascii_case(name))
}

/// Settings whose value never changes how PostgreSQL reads a statement or what it
/// returns: a SET or RESET of one of these leaves prepared statements shareable.
const PARSE_NEUTRAL: [&[u8]; 8] = [
    b"statement_timeout",
    b"lock_timeout",
    b"idle_in_transaction_session_timeout",
    b"idle_session_timeout",
    b"application_name",
    b"work_mem",
    b"synchronous_commit",
    b"transaction",
];

/// What a statement text SETs or RESETs, as far as its first words tell. Cheap for the
/// usual text: one word compared and one byte searched.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetTarget<'a> {
    /// One statement, not a SET or RESET.
    Nothing,
    /// More than one statement (or a text not read whole): any may SET anything.
    Unknown,
    /// `SET [SESSION | LOCAL] name ...` or `RESET name` (`name` empty when it is not a
    /// plain identifier).
    Setting { reset: bool, local: bool, name: &'a [u8] },
}

impl SetTarget<'_> {
    pub fn of(sql: &[u8]) -> SetTarget<'_> {
        let word = first_word(sql);
        let set = word.eq_ignore_ascii_case(b"set");
        if !set && !word.eq_ignore_ascii_case(b"reset") {
            // A text that does not start with a word (after comments: an unterminated
            // one) is not read further: it may hold anything. (Not one that starts with
            // a parenthesis, `(SELECT ...) UNION ...`: no SET can.)
            let unread = word.is_empty() && skip_blank(sql).first().is_some_and(|b| *b != b'(');
            return if unread || more_than_one_statement(sql) { SetTarget::Unknown } else { SetTarget::Nothing };
        }
        if more_than_one_statement(sql) {
            return SetTarget::Unknown;
        }
        let mut rest = after_word(sql);
        let mut local = false;
        if set {
            let scope = first_word(rest);
            // A word of its own (`SET session_authorization` names a setting).
            let alone =
                skip_blank(rest).get(scope.len()).is_some_and(|b| b.is_ascii_whitespace() || *b == b'/' || *b == b'-');
            local = alone && scope.eq_ignore_ascii_case(b"local");
            if local || (alone && scope.eq_ignore_ascii_case(b"session")) {
                rest = after_word(rest);
            }
        }
        SetTarget::Setting { reset: !set, local, name: setting_name(rest) }
    }

    /// Whether it may change what later statements parse to or return (`search_path`,
    /// the role, `DateStyle`, `standard_conforming_strings`, `RESET ALL`...): every SET
    /// and RESET counts except those of the few settings in `PARSE_NEUTRAL` (`SET LOCAL
    /// statement_timeout`, `SET TRANSACTION ...`).
    pub fn changes_parsing(self) -> bool {
        match self {
            SetTarget::Nothing => false,
            SetTarget::Unknown => true,
            SetTarget::Setting { name, .. } => !parse_neutral(name),
        }
    }

    /// Whether it may change the session's role or authorization (`SET ROLE`, `SET
    /// SESSION AUTHORIZATION`), which `RESET ALL` leaves as they are: the server's
    /// settings are then taken as unknown, so the next client's are applied after a
    /// reset of those too (`ServerConn::apply_params`). Of several statements, when
    /// the text (`sql`, None when not read whole) mentions a role or authorization.
    pub fn sets_role(self, sql: Option<&[u8]>) -> bool {
        let mentions = |word: &[u8]| sql.is_none_or(|s| s.windows(word.len()).any(|w| w.eq_ignore_ascii_case(word)));
        match self {
            SetTarget::Nothing | SetTarget::Setting { local: true, .. } | SetTarget::Setting { reset: true, .. } => {
                false
            }
            SetTarget::Unknown => mentions(b"role") || mentions(b"authorization"),
            // (A quoted name, `SET "role" = ...`, is empty here: it may be the role.)
            SetTarget::Setting { name, .. } => {
                name.is_empty()
                    || [&b"role"[..], b"authorization", b"session_authorization"]
                        .iter()
                        .any(|r| name.eq_ignore_ascii_case(r))
            }
        }
    }

    /// Whether it may change a session setting PostgreSQL does not report, so that
    /// what a server is recorded as carrying for clients may no longer hold
    /// (`ServerConn::settings_changed`). `SET LOCAL`, `SET TRANSACTION` and `SET
    /// CONSTRAINTS` last only to the transaction's end, and a reported setting is
    /// followed through ParameterStatus: those do not count.
    pub fn sets_session(self) -> bool {
        match self {
            SetTarget::Nothing | SetTarget::Setting { local: true, .. } => false,
            SetTarget::Unknown => true,
            SetTarget::Setting { reset, name, .. } => {
                let scoped =
                    !reset && (name.eq_ignore_ascii_case(b"transaction") || name.eq_ignore_ascii_case(b"constraints"));
                // A setting reported whatever the server's version (`params::REPORTED`
                // but `search_path`, reported only from PostgreSQL 18 on).
                let reported = std::str::from_utf8(name)
                    .is_ok_and(|n| crate::params::is_reported(n) && !n.eq_ignore_ascii_case("search_path"));
                !scoped && !reported
            }
        }
    }
}

/// What follows the first word.
fn after_word(sql: &[u8]) -> &[u8] {
    let sql = skip_blank(sql);
    &sql[first_word(sql).len()..]
}

/// A setting name at the start of `sql` (unquoted identifier); empty otherwise.
fn setting_name(sql: &[u8]) -> &[u8] {
    let name = skip_blank(sql);
    let end = name.iter().position(|b| !(b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.')).unwrap_or(name.len());
    let (name, rest) = name.split_at(end);
    // Followed by `=`, `TO`, a value or the end: anything else (a quoted name) counts.
    match rest.first() {
        None | Some(b' ' | b'\t' | b'\n' | b'\r' | b'=' | b';') => name,
        _ => b"",
    }
}

/// A `;` followed by anything but white space (or a string literal holding one).
fn more_than_one_statement(sql: &[u8]) -> bool {
    // Every Query and Parse passes here: find the `;` with memchr, not byte by byte.
    memchr::memchr(b';', sql)
        .is_some_and(|i| sql[i + 1..].iter().any(|b| !b.is_ascii_whitespace() && *b != b';' && *b != 0))
}

/// Recognises a simple Query consisting of exactly one DEALLOCATE or DISCARD ALL.
pub fn sql_command(query: &[u8]) -> Option<SqlCommand> {
    // Cheap pre-check without allocating: every query passes here, and almost none
    // is one of these.
    let word = first_word(query);
    if !word.eq_ignore_ascii_case(b"deallocate") && !word.eq_ignore_ascii_case(b"discard") {
        return None;
    }
    let text = std::str::from_utf8(query).ok()?.trim().trim_end_matches(';').trim();
    let words: Vec<&str> = text.split_whitespace().collect();
    let upper: Vec<String> = words.iter().map(|w| w.to_ascii_uppercase()).collect();
    match upper.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["DISCARD", "ALL"] => Some(SqlCommand::DiscardAll),
        ["DEALLOCATE", "ALL"] | ["DEALLOCATE", "PREPARE", "ALL"] => Some(SqlCommand::DeallocateAll),
        ["DEALLOCATE", _] | ["DEALLOCATE", "PREPARE", _] => {
            let name = words.last()?;
            Some(SqlCommand::Deallocate(unquote(name)))
        }
        _ => None,
    }
}

fn unquote(name: &str) -> String {
    match name.strip_prefix('"').and_then(|n| n.strip_suffix('"')) {
        Some(q) => q.replace("\"\"", "\""),
        None => name.to_ascii_lowercase(),
    }
}

#[cfg(test)]
mod tests;
