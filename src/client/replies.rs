//! Session mode's view of the extended protocol: the kind of each request sent and not
//! yet answered. An error in an extended-protocol message makes the server skip
//! everything up to the next Sync, simple queries and function calls included, which
//! then get no ReadyForQuery; and a COPY begun by an Execute ends with a Sync. The
//! pooled modes keep the same queue, with what their rewriting needs, in
//! `extended::Extended`; session mode forwards everything as sent and only reads
//! message tags.

use std::collections::VecDeque;

use super::extended::expect::{Kind, drop_syncs_after_head};
use crate::protocol::{be, fe};

/// The requests of a session-mode link the server has not answered yet.
#[derive(Debug, Default)]
pub struct Replies {
    queue: VecDeque<Kind>,
    /// The server reported an error in an extended-protocol message whose Sync has not
    /// come from the client yet: it skips everything until that Sync.
    skipping: bool,
    /// Simple queries and function calls the server skipped: the caller expects no
    /// ReadyForQuery for them, and takes the count.
    pub skipped_requests: u32,
}

impl Replies {
    /// Forgets everything but the allocation (a new link starts).
    pub fn clear(&mut self) {
        self.queue.clear();
        self.skipping = false;
        self.skipped_requests = 0;
    }

    /// Whether the oldest unanswered request is an Execute (a COPY it begins is an
    /// extended-protocol one, ended by a Sync).
    pub fn head_is_execute(&self) -> bool {
        self.queue.front() == Some(&Kind::Execute)
    }

    /// A client message with `tag` is forwarded. True for a simple query or function
    /// call the server will skip (no ReadyForQuery comes for it). (Out of line: the
    /// pooled modes' scan loops, which never call it, stay as small as before.)
    #[inline(never)]
    pub fn on_client(&mut self, tag: u8) -> bool {
        if self.skipping {
            if tag != fe::SYNC {
                return matches!(tag, fe::QUERY | fe::FUNCTION_CALL);
            }
            self.skipping = false;
        }
        let kind = match tag {
            fe::PARSE => Kind::Parse,
            fe::BIND => Kind::Bind,
            fe::DESCRIBE => Kind::Describe,
            fe::EXECUTE => Kind::Execute,
            fe::CLOSE => Kind::Close,
            fe::SYNC => Kind::Sync,
            fe::QUERY => Kind::Query,
            fe::FUNCTION_CALL => Kind::Call,
            // Flush and COPY messages get no reply of their own.
            _ => return false,
        };
        self.queue.push_back(kind);
        false
    }

    /// A server message with `tag` is forwarded.
    #[inline(never)]
    pub fn on_server(&mut self, tag: u8) {
        let Some(&head) = self.queue.front() else { return };
        if tag != be::ERROR_RESPONSE {
            if head.done_by(tag) {
                self.queue.pop_front();
            }
            return;
        }
        // An error in a simple query or function call ends with its ReadyForQuery.
        if !head.starts_skip() {
            return;
        }
        self.queue.pop_front();
        while let Some(&next) = self.queue.front().filter(|k| k.skipped()) {
            self.skipped_requests += u32::from(matches!(next, Kind::Query | Kind::Call));
            self.queue.pop_front();
        }
        // The Sync that ends the skipping is still to come from the client.
        self.skipping = self.queue.is_empty();
    }

    /// Removes the first `n` Syncs after the head (the Execute that began a COPY FROM
    /// STDIN): the server ignores them.
    pub fn drop_ignored_syncs(&mut self, n: usize) {
        drop_syncs_after_head(&mut self.queue, n, |k| *k);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(r: &mut Replies, tags: &[u8]) -> u32 {
        tags.iter().map(|&t| u32::from(r.on_client(t))).sum()
    }

    #[test]
    fn requests_behind_a_failed_extended_message_are_skipped_up_to_the_sync() {
        let mut r = Replies::default();
        let call = fe::FUNCTION_CALL;
        assert_eq!(sent(&mut r, &[fe::PARSE, fe::QUERY, call, fe::FLUSH, fe::SYNC, fe::QUERY]), 0);
        r.on_server(be::ERROR_RESPONSE);
        assert_eq!(r.skipped_requests, 2);
        r.on_server(be::READY_FOR_QUERY); // the Sync's
        assert!(!r.queue.is_empty());
        r.on_server(be::ROW_DESCRIPTION);
        r.on_server(be::READY_FOR_QUERY);
        assert!(r.queue.is_empty());
    }

    #[test]
    fn an_error_before_the_rest_is_sent_skips_it_as_it_comes() {
        let mut r = Replies::default();
        sent(&mut r, &[fe::PARSE, fe::BIND, fe::EXECUTE, fe::FLUSH]);
        r.on_server(be::PARSE_COMPLETE);
        r.on_server(be::BIND_COMPLETE);
        r.on_server(be::ERROR_RESPONSE);
        assert_eq!(r.skipped_requests, 0);
        // Skipped by the server: the query gets no ReadyForQuery, the Sync does.
        assert_eq!(sent(&mut r, &[fe::PARSE, fe::QUERY, fe::SYNC]), 1);
        assert_eq!(sent(&mut r, &[fe::QUERY]), 0);
        r.on_server(be::READY_FOR_QUERY);
        r.on_server(be::READY_FOR_QUERY);
        assert!(r.queue.is_empty());
    }

    #[test]
    fn an_error_in_a_simple_query_skips_nothing() {
        let mut r = Replies::default();
        sent(&mut r, &[fe::QUERY, fe::QUERY]);
        r.on_server(be::ERROR_RESPONSE);
        r.on_server(be::READY_FOR_QUERY);
        assert_eq!((r.skipped_requests, r.queue.len()), (0, 1));
    }

    #[test]
    fn a_copy_begun_by_an_execute_is_told_and_its_early_syncs_dropped() {
        let mut r = Replies::default();
        sent(&mut r, &[fe::BIND, fe::EXECUTE, fe::SYNC, fe::COPY_DONE, fe::SYNC]);
        r.on_server(be::BIND_COMPLETE);
        assert!(r.head_is_execute());
        r.drop_ignored_syncs(1);
        r.on_server(be::COMMAND_COMPLETE);
        r.on_server(be::READY_FOR_QUERY);
        assert!(r.queue.is_empty());
    }
}
