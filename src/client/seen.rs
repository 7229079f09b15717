//! What the commands a server completed may have changed on it: what statements parse
//! to, and the settings it carries for clients. Noted by the tracker (`track.rs`) from
//! CommandComplete tags, read by the relay when the server is released.

use crate::prepared::TextEffects;

/// What the commands completed since the last look may have changed on the server.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Seen {
    /// What statements parse to (DDL, SET search_path...): prepared statements'
    /// shapes are checked again (`Pool::schema_epoch`).
    pub schema: bool,
    /// Settings, with SET or RESET: the settings the server is recorded as carrying
    /// for clients may no longer hold (`ServerConn::settings_changed`).
    pub settings: bool,
    /// The role, with SET ROLE or SET SESSION AUTHORIZATION: the server's settings are
    /// unknown (`ServerConn::settings_unknown`).
    pub role: bool,
}

impl Seen {
    /// Notes a CommandComplete tag. DDL (`ALTER`, `CREATE`, `DROP`, `DISCARD`,
    /// `IMPORT`) changes what statements parse to; so do SET and RESET when the exchange
    /// ran a statement that may set something other than the few settings
    /// `prepared::SetTarget::changes_parsing` knows to be neutral (`sets.sets_parsing`);
    /// they change the settings a server carries for clients when it ran one that may
    /// set a session setting PostgreSQL does not report (`sets_session`: not `SET
    /// LOCAL`, say), and the role when it ran one that may set that (`sets_role`). The
    /// first byte picks the comparisons (most tags are SELECT, INSERT, UPDATE...).
    #[inline]
    pub(super) fn note(&mut self, tag: &[u8], sets: TextEffects) {
        const DDL: [&[u8]; 5] = [b"ALTER ", b"CREATE ", b"DROP ", b"DISCARD", b"IMPORT "];
        match tag.first() {
            Some(b'S' | b'R') if tag.starts_with(b"SET") || tag.starts_with(b"RESET") => {
                self.settings |= sets.sets_session;
                self.schema |= sets.sets_parsing;
                self.role |= sets.sets_role;
            }
            Some(b'A' | b'C' | b'D' | b'I') => self.schema |= DDL.iter().any(|p| tag.starts_with(p)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_tags_are_seen_for_what_they_change() {
        let seen = |tag: &[u8], set: bool| {
            let mut s = Seen::default();
            s.note(tag, if set { TextEffects::ALL } else { TextEffects::default() });
            (s.schema, s.settings && s.role)
        };
        assert_eq!(seen(b"SELECT 1\0", true), (false, false));
        assert_eq!(seen(b"INSERT 0 1\0", true), (false, false));
        assert_eq!(seen(b"COMMIT\0", true), (false, false));
        assert_eq!(seen(b"DELETE 3\0", true), (false, false));
        assert_eq!(seen(b"CREATE TABLE\0", false), (true, false));
        assert_eq!(seen(b"DROP INDEX\0", false), (true, false));
        assert_eq!(seen(b"DISCARD ALL\0", false), (true, false));
        assert_eq!(seen(b"ALTER TABLE\0", false), (true, false));
        assert_eq!(seen(b"IMPORT FOREIGN SCHEMA\0", false), (true, false));
        assert_eq!(seen(b"SET\0", false), (false, false));
        assert_eq!(seen(b"SET\0", true), (true, true));
        assert_eq!(seen(b"RESET\0", false), (false, false));
        assert_eq!(seen(b"RESET\0", true), (true, true));
    }
}
