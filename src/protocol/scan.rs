//! Frame scanning for the relay. Bytes are forwarded as they arrive: only headers are
//! read, except for the few message types the caller needs whole. A message can be
//! dropped or bytes inserted; output stays a slice of the input (no copy) unless that
//! happens.

use std::ops::Range;

use bytes::BytesMut;

use super::{HEADER_LEN, Header, MAX_MESSAGE_LEN, ProtocolError};

/// How much of a message the caller must see before it is passed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Header only; the body streams through.
    Stream,
    /// The whole frame, up to the given length (longer is a protocol error).
    Whole(usize),
    /// The first `n` bytes of the frame (or all of it, if shorter); the rest streams.
    Prefix(usize),
    /// Not taken at all: [`ProtocolError::Disallowed`], saying why.
    Refused(&'static str),
}

impl Need {
    /// How many bytes of a frame of `frame_len` must be in before it is passed on; None
    /// when the whole frame is needed and longer than allowed.
    pub fn wanted(self, frame_len: usize) -> Option<usize> {
        match self {
            Need::Stream => Some(0),
            Need::Whole(max) if frame_len > max => None,
            Need::Whole(_) => Some(frame_len),
            Need::Prefix(n) => Some(n.min(frame_len)),
            Need::Refused(_) => None,
        }
    }

    /// Why a message of this need that `wanted` gave no length for is refused.
    #[cold]
    pub fn refusal(self, h: Header) -> ProtocolError {
        match self {
            Need::Refused(why) => ProtocolError::Disallowed(why),
            _ => ProtocolError::TooLarge { tag: h.tag, len: h.frame_len },
        }
    }
}

/// Tracks the message boundary across reads.
#[derive(Debug, Clone, Copy)]
pub struct Scanner {
    /// Bytes of a streamed message's body not yet seen.
    remaining: usize,
    /// The caller dropped that message: its remaining bytes are dropped as they come.
    dropping: bool,
    /// The largest length field let through (`max_packet_size`: `length_limit`).
    limit: usize,
}

impl Default for Scanner {
    fn default() -> Self {
        Scanner { remaining: 0, dropping: false, limit: MAX_MESSAGE_LEN }
    }
}

/// One message start seen by the scanner.
pub struct Msg<'a> {
    pub tag: u8,
    /// Offset of the message in the scanned buffer.
    pub start: usize,
    pub frame_len: usize,
    /// The whole frame (or its prefix), for tags the caller asked to see.
    pub frame: Option<&'a [u8]>,
}

impl Scanner {
    /// Scanning starts again at a message boundary; the limit stays.
    pub fn restart(&mut self) {
        *self = Scanner { limit: self.limit, ..Scanner::default() };
    }

    /// Messages whose length field says more than `limit` are refused with
    /// [`ProtocolError::OverLimit`]; PostgreSQL's own bound, 1 GiB, is the most.
    pub fn set_limit(&mut self, limit: usize) {
        self.limit = limit.min(MAX_MESSAGE_LEN);
    }

    /// Whether the scanner is in the middle of a streamed message.
    pub fn mid_message(&self) -> bool {
        self.remaining > 0
    }

    /// How many bytes of a message the output has part of are still to come (0 when
    /// none, or when that message is being dropped): the next `scan` passes them on
    /// before it reads a header, so they are whole in any buffer a scan fails on.
    pub fn passing(&self) -> usize {
        if self.dropping { 0 } else { self.remaining }
    }

    /// Walks `buf` from the start. `need(tag)` says how much of each message `on` must
    /// see; a message is reported once that much is in, and its remaining bytes pass
    /// through in pieces. Returns how many bytes were consumed (the rest is an
    /// incomplete header or an incomplete needed part: keep it for next time).
    ///
    /// `#[inline(always)]`: each use is its own instance (its closures), called from one
    /// place per direction; left to itself the compiler sometimes keeps it out of line,
    /// for ~+3% instructions per transaction (callgrind), and a plain `#[inline]` was not
    /// always enough (it was not once `client::extended` grew a method).
    #[inline(always)]
    pub fn scan<'a>(
        &mut self,
        buf: &'a [u8],
        need: impl Fn(u8) -> Need,
        mut on: impl FnMut(Msg<'a>, &mut Splice) -> Result<(), ProtocolError>,
        splice: &mut Splice,
    ) -> Result<usize, ProtocolError> {
        let mut pos = self.remaining.min(buf.len());
        self.remaining -= pos;
        if self.dropping && pos > 0 {
            splice.drop_range(0, pos);
        }
        self.dropping &= self.remaining > 0;
        while self.remaining == 0 {
            let Some(h) = Header::peek_within(&buf[pos..], self.limit)? else { break };
            let start = pos;
            let need = need(h.tag);
            let want = need.wanted(h.frame_len).ok_or_else(|| need.refusal(h))?;
            let avail = (buf.len() - pos).min(h.frame_len);
            if avail < want {
                break;
            }
            pos += avail;
            self.remaining = h.frame_len - avail;
            let frame = (want > 0).then(|| &buf[start..start + want]);
            let edits = splice.edits.len();
            on(Msg { tag: h.tag, start, frame_len: h.frame_len, frame }, splice)?;
            if splice.stop == Some(start) {
                // Held back: this message is scanned again, from its start, next time.
                self.remaining = 0;
                pos = start;
                break;
            }
            // Dropped, but only partly here: the rest goes as it arrives.
            self.dropping = self.remaining > 0 && splice.drops_whole(edits, start, start + h.frame_len);
        }
        Ok(pos)
    }
}

/// An edit of the input, in increasing offset order.
#[derive(Debug)]
enum Edit {
    Drop(Range<usize>),
    /// Bytes `inserted[range]` go before input offset `at`.
    Insert {
        at: usize,
        range: Range<usize>,
    },
}

/// The output of one scan: the input with some messages dropped and some bytes
/// inserted. Without edits the output is the input slice itself (no copy); only an edit
/// makes it assemble a copy in the scratch buffer.
#[derive(Debug, Default)]
pub struct Splice {
    edits: Vec<Edit>,
    inserted: BytesMut,
    scratch: BytesMut,
    /// The scan stops before the message at this offset (see [`Splice::stop_before`]).
    stop: Option<usize>,
}

impl Splice {
    pub fn new() -> Self {
        Self::default()
    }

    /// Drops `start..end` of the input from the output. Edits stay in offset order: a
    /// drop decided after bytes were inserted past its start (Sluice's own replies placed
    /// after a ReadyForQuery that statement mode then drops) goes before those inserts.
    #[inline]
    pub fn drop_range(&mut self, start: usize, end: usize) {
        let mut at = self.edits.len();
        while at > 0 && matches!(self.edits[at - 1], Edit::Insert { at: i, .. } if i > start) {
            at -= 1;
        }
        self.edits.insert(at, Edit::Drop(start..end));
    }

    /// Inserts bytes before input offset `at`.
    pub fn insert(&mut self, at: usize, bytes: &[u8]) {
        let from = self.inserted.len();
        self.inserted.extend_from_slice(bytes);
        self.edits.push(Edit::Insert { at, range: from..self.inserted.len() });
    }

    /// Buffer to build inserted bytes in place; follow with [`Splice::commit_insert`].
    pub fn insert_buf(&mut self) -> (&mut BytesMut, usize) {
        let from = self.inserted.len();
        (&mut self.inserted, from)
    }

    /// Records bytes appended to [`Splice::insert_buf`] since `from` as an insert at `at`.
    pub fn commit_insert(&mut self, at: usize, from: usize) {
        self.edits.push(Edit::Insert { at, range: from..self.inserted.len() });
    }

    /// Ends the scan before the message at input offset `start` (the one being
    /// handled): it is neither consumed nor passed on, and the next scan sees it again.
    /// Bytes inserted before it still go out.
    pub fn stop_before(&mut self, start: usize) {
        self.stop = Some(start);
    }

    /// Whether an edit since the first `from` drops all of `start..end`.
    fn drops_whole(&self, from: usize, start: usize, end: usize) -> bool {
        self.edits[from..].iter().any(|e| matches!(e, Edit::Drop(r) if r.start <= start && r.end >= end))
    }

    /// Whether this scan has edits so far.
    pub fn edited(&self) -> bool {
        !self.edits.is_empty()
    }

    /// The output for `src[..end]`. Call [`Splice::reset`] after writing it.
    pub fn finish<'a>(&'a mut self, src: &'a [u8], end: usize) -> &'a [u8] {
        if self.edits.is_empty() {
            return &src[..end];
        }
        let mut mark = 0;
        for e in &self.edits {
            match e {
                // A message dropped before all of it is in: up to `end` now, the rest
                // by the next scans (`Scanner::dropping`).
                Edit::Drop(r) => {
                    self.scratch.extend_from_slice(&src[mark..r.start.min(end).max(mark)]);
                    mark = mark.max(r.end.min(end));
                }
                Edit::Insert { at, range } => {
                    let at = (*at).min(end);
                    self.scratch.extend_from_slice(&src[mark..at.max(mark)]);
                    mark = mark.max(at);
                    self.scratch.extend_from_slice(&self.inserted[range.clone()]);
                }
            }
        }
        self.scratch.extend_from_slice(&src[mark..end.max(mark)]);
        &self.scratch
    }

    /// Clears the state for the next scan, keeping the allocations.
    pub fn reset(&mut self) {
        self.edits.clear();
        self.inserted.clear();
        self.scratch.clear();
        self.stop = None;
    }
}

/// Length of a header, re-exported for callers computing offsets.
pub const HEADER: usize = HEADER_LEN;

#[cfg(test)]
mod tests;
