use super::*;
use crate::protocol::MAX_INSPECTED_LEN;

fn whole_if(tags: &'static [u8]) -> impl Fn(u8) -> Need {
    move |t| if tags.contains(&t) { Need::Whole(MAX_INSPECTED_LEN) } else { Need::Stream }
}
use proptest::prelude::*;

use crate::protocol::build::message as msg;

fn collect(sc: &mut Scanner, buf: &[u8], whole: &[u8]) -> (usize, Vec<(u8, bool)>) {
    let mut seen = Vec::new();
    let mut sp = Splice::new();
    let n = sc
        .scan(
            buf,
            |t| if whole.contains(&t) { Need::Whole(MAX_INSPECTED_LEN) } else { Need::Stream },
            |m, _| {
                seen.push((m.tag, m.frame.is_some()));
                Ok(())
            },
            &mut sp,
        )
        .unwrap();
    (n, seen)
}

#[test]
fn streams_and_waits_for_whole() {
    let mut buf = msg(b'D', &[7; 100]);
    buf.extend(msg(b'Z', b"I"));
    let mut sc = Scanner::default();
    // only part of the DataRow: it streams
    let (n, seen) = collect(&mut sc, &buf[..50], b"Z");
    assert_eq!((n, seen), (50, vec![(b'D', false)]));
    assert!(sc.mid_message());
    // rest of the DataRow and half of ReadyForQuery: RFQ must wait
    let (n, seen) = collect(&mut sc, &buf[50..108], b"Z");
    assert_eq!((n, seen), (55, vec![]));
    let (n, seen) = collect(&mut sc, &buf[105..], b"Z");
    assert_eq!((n, seen), (6, vec![(b'Z', true)]));
}

#[test]
fn rejects_bad_lengths_and_oversized_whole_messages() {
    let mut sc = Scanner::default();
    let mut sp = Splice::new();
    assert!(sc.scan(b"Q\0\0\0\x01", |_| Need::Stream, |_, _| Ok(()), &mut sp).is_err());
    let big = [b'E', 0x10, 0, 0, 0];
    assert!(matches!(
        sc.scan(&big, |_| Need::Whole(MAX_INSPECTED_LEN), |_, _| Ok(()), &mut sp),
        Err(ProtocolError::TooLarge { .. })
    ));
    // the same length streamed is fine
    assert_eq!(sc.scan(&big, |_| Need::Stream, |_, _| Ok(()), &mut sp).unwrap(), 5);
}

/// `max_packet_size`: a message whose length field says more than the limit is refused
/// at its header, one exactly at it passes, and a restart keeps the limit.
#[test]
fn messages_over_the_limit_are_refused_at_their_header() {
    let mut sc = Scanner::default();
    sc.set_limit(104);
    let at_limit = msg(b'D', &[7; 100]);
    assert_eq!(collect(&mut sc, &at_limit, b"").0, at_limit.len());
    let over = msg(b'D', &[7; 101]);
    let mut sp = Splice::new();
    let mut seen = 0;
    let r = sc.scan(
        &over[..5],
        |_| Need::Stream,
        |_, _| {
            seen += 1;
            Ok(())
        },
        &mut sp,
    );
    assert_eq!(r, Err(ProtocolError::OverLimit { tag: b'D', len: 106, limit: 105 }));
    assert_eq!(seen, 0, "reported before any of it passed");
    sc.restart();
    assert!(sc.scan(&over, |_| Need::Stream, |_, _| Ok(()), &mut sp).is_err(), "the limit was lost");
    sc.set_limit(usize::MAX);
    assert_eq!(sc.limit, MAX_MESSAGE_LEN, "PostgreSQL's bound is the most");
}

#[test]
fn prefix_is_seen_then_the_rest_streams() {
    let m = msg(b'B', &[1; 100]);
    let mut sc = Scanner::default();
    let mut sp = Splice::new();
    let mut seen = Vec::new();
    let need = |t| if t == b'B' { Need::Prefix(20) } else { Need::Stream };
    // fewer than 20 bytes: wait
    assert_eq!(sc.scan(&m[..10], need, |_, _| Ok(()), &mut sp).unwrap(), 0);
    let n = sc
        .scan(
            &m[..30],
            need,
            |x, _| {
                seen.push(x.frame.unwrap().len());
                Ok(())
            },
            &mut sp,
        )
        .unwrap();
    assert_eq!((n, seen), (30, vec![20]));
    assert!(sc.mid_message());
    assert_eq!(sc.scan(&m[30..], need, |_, _| panic!("no new message"), &mut sp).unwrap(), m.len() - 30);
    assert!(!sc.mid_message());
}

#[test]
fn splice_drops_and_inserts() {
    let a = msg(b'A', b"1");
    let x = msg(b'X', b"");
    let b = msg(b'B', b"22");
    let src: Vec<u8> = [a.clone(), x.clone(), b.clone()].concat();
    let mut sp = Splice::new();
    assert_eq!(sp.finish(&src, src.len()), &src[..]);
    sp.reset();
    sp.drop_range(a.len(), a.len() + x.len());
    sp.insert(a.len() + x.len(), b"ins");
    let out = sp.finish(&src, src.len()).to_vec();
    assert_eq!(out, [a.clone(), b"ins".to_vec(), b.clone()].concat());
    sp.reset();
    // A drop decided after an insert at its end (or an insert at its start, before it)
    // still drops the message and keeps the inserted bytes.
    sp.insert(a.len(), b"<");
    sp.insert(a.len() + x.len(), b"ins");
    sp.drop_range(a.len(), a.len() + x.len());
    let out = sp.finish(&src, src.len()).to_vec();
    assert_eq!(out, [a.clone(), b"<ins".to_vec(), b.clone()].concat());
    sp.reset();
    sp.insert(0, b"pre");
    assert_eq!(sp.finish(&src, a.len()), [b"pre".to_vec(), a].concat());
}

/// A message held back is neither consumed nor passed on, even partly in; bytes
/// inserted before it go out; the next scan starts with it.
#[test]
fn a_held_message_is_scanned_again_next_time() {
    let a = msg(b'A', b"1");
    let b = msg(b'B', &[2; 50]);
    let src: Vec<u8> = [a.clone(), b.clone()].concat();
    let mut sc = Scanner::default();
    let mut sp = Splice::new();
    let mut seen = Vec::new();
    // B's header and part of its body: streamed, were it not held.
    let n = sc
        .scan(
            &src[..a.len() + 20],
            |_| Need::Stream,
            |m, sp| {
                seen.push(m.tag);
                if m.tag == b'B' {
                    sp.insert(m.start, b"ins");
                    sp.stop_before(m.start);
                }
                Ok(())
            },
            &mut sp,
        )
        .unwrap();
    assert_eq!((n, &seen[..]), (a.len(), &b"AB"[..]));
    assert!(!sc.mid_message());
    assert_eq!(sp.finish(&src, n), [a.clone(), b"ins".to_vec()].concat());
    sp.reset();
    let n = sc
        .scan(
            &src[a.len()..],
            |_| Need::Stream,
            |m, _| {
                seen.push(m.tag);
                Ok(())
            },
            &mut sp,
        )
        .unwrap();
    assert_eq!((n, &seen[..]), (b.len(), &b"ABB"[..]));
    assert_eq!(sp.finish(&src[a.len()..], n), &b[..]);
}

proptest! {
    /// Messages the caller drops are gone from the output whole, however the stream
    /// is cut into reads (a dropped message may span several).
    #[test]
    fn dropped_messages_leave_nothing_however_cut(
        bodies in proptest::collection::vec((prop::sample::select(vec![b'D', b'Z', b'C']), proptest::collection::vec(any::<u8>(), 0..60)), 1..20),
        cuts in proptest::collection::vec(1usize..30, 1..50),
    ) {
        let stream: Vec<u8> = bodies.iter().flat_map(|(t, b)| msg(*t, b)).collect();
        let kept: Vec<u8> = bodies.iter().filter(|(t, _)| *t != b'D').flat_map(|(t, b)| msg(*t, b)).collect();
        let (mut sc, mut sp) = (Scanner::default(), Splice::new());
        let (mut pending, mut out, mut pos) = (Vec::new(), Vec::new(), 0);
        let mut cut = cuts.iter().cycle();
        while pos < stream.len() {
            let step = (*cut.next().unwrap()).min(stream.len() - pos);
            pending.extend_from_slice(&stream[pos..pos + step]);
            pos += step;
            let n = sc.scan(&pending, whole_if(b"Z"), |m, sp| {
                if m.tag == b'D' {
                    sp.drop_range(m.start, m.start + m.frame_len);
                }
                Ok(())
            }, &mut sp).unwrap();
            out.extend_from_slice(sp.finish(&pending, n));
            sp.reset();
            pending.drain(..n);
        }
        prop_assert_eq!(out, kept);
    }

    /// However a stream of messages is cut into reads, every message is seen exactly
    /// once, in order, and all bytes are consumed.
    #[test]
    fn any_chunking_sees_every_message(
        bodies in proptest::collection::vec((prop::sample::select(vec![b'D', b'Z', b'C', b'S']), proptest::collection::vec(any::<u8>(), 0..40)), 1..20),
        cuts in proptest::collection::vec(1usize..30, 1..50),
    ) {
        let stream: Vec<u8> = bodies.iter().flat_map(|(t, b)| msg(*t, b)).collect();
        let mut sc = Scanner::default();
        let mut pending: Vec<u8> = Vec::new();
        let mut seen = Vec::new();
        let mut consumed_total = 0;
        let mut pos = 0;
        let mut cut = cuts.iter().cycle();
        while pos < stream.len() {
            let step = (*cut.next().unwrap()).min(stream.len() - pos);
            pending.extend_from_slice(&stream[pos..pos + step]);
            pos += step;
            let mut sp = Splice::new();
            let n = sc.scan(&pending, whole_if(b"ZS"), |m, _| { seen.push(m.tag); Ok(()) }, &mut sp).unwrap();
            consumed_total += n;
            pending.drain(..n);
        }
        prop_assert!(pending.is_empty());
        prop_assert_eq!(consumed_total, stream.len());
        prop_assert_eq!(seen, bodies.iter().map(|(t, _)| *t).collect::<Vec<_>>());
    }
}
