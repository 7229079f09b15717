//! Prepared statements in pipelines, byte-exact: errors that make the server skip
//! to the next Sync (no phantom statements, Sluice's own replies in their place),
//! several Sync segments whose Parses and Closes an earlier error skipped (the
//! server's books follow what it did), DISCARD ALL with statements parsed behind it,
//! and a copy the books missed costing one 42P05.

mod common;

use common::raw::*;
use common::stmts::*;
use common::{PgCluster, Sluice};

#[test]
fn errors_in_pipelines_leave_no_phantoms() {
    let (_pg, s) = setup(1, &[]);
    let mut c = login(&s);
    // A failed Parse then messages the server skips up to Sync.
    let mut b = parse("bad", "select from nowhere_table");
    b.extend(bind("", "bad", &[]));
    b.extend(execute("", 0));
    b.extend(parse("good", "select 7"));
    b.extend(sync());
    b.extend(parse("good", "select 7"));
    b.extend(bind("", "good", &[]));
    b.extend(execute("", 0));
    b.extend(sync());
    c.send(&b);
    let m = c.until_ready();
    assert_eq!(tags(&m), "EZ", "{m:?}");
    assert_eq!(sqlstate(&m[0].1), "42P01");
    let m = c.until_ready();
    assert_eq!(tags(&m), "12DCZ", "{m:?}");
    assert_eq!(first_value(&m), "7");
    let m = run(&mut c, "bad", &[]);
    assert_eq!(sqlstate(&m[0].1), "26000", "a failed Parse must not leave a statement");
    // Parse of a name in use fails as on a real server.
    let m = {
        c.send(&[parse("good", "select 8"), sync()].concat());
        c.until_ready()
    };
    assert_eq!(tags(&m), "EZ");
    assert_eq!(sqlstate(&m[0].1), "42P05");
    assert_eq!(first_value(&run(&mut c, "good", &[])), "7");
    // A Close the server skips after an error closes nothing: the name still stands.
    c.send(&[bind("", "nosuch", &[]), close_stmt("good"), sync()].concat());
    let m = c.until_ready();
    assert_eq!(tags(&m), "EZ", "{m:?}");
    assert_eq!(sqlstate(&m[0].1), "26000");
    assert_eq!(first_value(&run(&mut c, "good", &[])), "7", "a skipped Close forgot the statement");
}

#[test]
fn synthetic_replies_keep_their_place_in_pipelines() {
    let (_pg, s) = setup(1, &[]);
    let mut a = login(&s);
    assert_eq!(prepare(&mut a, "x", "select 'x'"), "1Z");
    let mut b = login(&s);
    // b's Parse of the same text is answered by Sluice, between server replies.
    let mut batch = parse("u", "select 'u'");
    batch.extend(bind("", "u", &[]));
    batch.extend(execute("", 0));
    batch.extend(parse("y", "select 'x'"));
    batch.extend(close_stmt("nothing"));
    batch.extend(bind("", "y", &[]));
    batch.extend(execute("", 0));
    batch.extend(flush());
    b.send(&batch);
    let m = b.take(9);
    assert_eq!(tags(&m), "12DC132DC", "{m:?}");
    b.send(&sync());
    assert_eq!(tags(&b.until_ready()), "Z");
}

/// A pipeline of two Sync segments on a server new to the client's statements: the
/// first fails before the statement Sluice parses for it, so the server skips that
/// Parse; the second segment, independent on PostgreSQL, must not take the statement
/// as there.
#[test]
fn a_parse_skipped_in_one_segment_is_not_trusted_in_the_next() {
    let (pg, s) = setup(2, &[]);
    pg.psql("create table seg_t (a int primary key); insert into seg_t values (1); grant all on seg_t to u_trust");
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "ins", "insert into seg_t values (1)"), "1Z");
    assert_eq!(prepare(&mut c, "one", "select 1"), "1Z");
    c.send(&query("select pg_backend_pid()"));
    let prepared_on = first_value(&c.until_ready());
    // Another client holds the server that has them: the pipeline goes to a new one.
    let mut holder = login(&s);
    holder.send(&query("begin"));
    assert_eq!(tags(&holder.until_ready()), "CZ");
    holder.send(&query("select pg_backend_pid()"));
    assert_eq!(first_value(&holder.until_ready()), prepared_on, "the holder got another server");
    c.send(&[segment("ins"), segment("one"), sync(), segment("one"), sync()].concat());
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[1].1)), ("2EZ".to_string(), "23505".to_string()), "{m:?}");
    let m = c.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("2DCZ".to_string(), "1".to_string()), "{m:?}");
    // The second segment parsed it again: the server holds it, and so say the books
    // (the first segment's skipped Parse does not undo the second's).
    runs_one(&mut c);
}

/// A segment that fails before Sluice closes a statement (evicted) and parses it again
/// (used again): both skipped, the server still holds its copy, which must be closed
/// before Sluice parses it next (not 42P05).
#[test]
fn a_close_and_parse_skipped_in_one_segment_leave_the_books_right() {
    let (_pg, s, mut c) = one_statement_per_server();
    c.send(&[segment("bad"), segment("one"), segment("bad"), sync()].concat());
    fails_by_zero(&mut c, "the pipeline");
    for round in ["first", "second"] {
        both_run(&mut c, round);
    }
    books_never_missed_a_copy(&s);
}

/// The eviction half: with room for one statement per server, the second segment's
/// statement was closed by Sluice (evicted) in the first segment after its error, so
/// the server skipped that Close and still holds it; Sluice must not parse it again as
/// if gone (PostgreSQL: 42P05), and the statement runs to its own error.
#[test]
fn an_eviction_close_skipped_in_one_segment_is_not_trusted_in_the_next() {
    let (_pg, s, mut c) = one_statement_per_server();
    c.send(&[segment("bad"), segment("one"), sync(), segment("bad"), sync()].concat());
    fails_by_zero(&mut c, "first");
    fails_by_zero(&mut c, "second");
    // Parsed again by the second segment: not closed again behind the client's back.
    both_run(&mut c, "third");
    books_never_missed_a_copy(&s);
}

/// The same with the statement's next Parse in the later segment being a client's
/// second Parse of its name (refused as a duplicate, as PostgreSQL does): Sluice's
/// Parse behind it, meant to make the server refuse it, closes the statement first,
/// and the statement goes on working.
#[test]
fn a_duplicate_parse_behind_a_skipped_eviction_close_leaves_the_books_right() {
    let (_pg, s, mut c) = one_statement_per_server();
    c.send(&[segment("bad"), segment("one"), sync(), parse("bad", "select 1/0"), sync()].concat());
    fails_by_zero(&mut c, "first");
    refused_as_a_duplicate(&mut c, "second");
    for round in ["third", "fourth"] {
        both_run(&mut c, round);
    }
    books_never_missed_a_copy(&s);
}

/// A client's second Parse of a name it holds, behind a segment whose error made the
/// server skip the statement's Parse (and Close) Sluice sent: still refused as a
/// duplicate (the books' "there" came from Sluice's own skipped Parse, not the
/// client's), and the statement goes on working (not closed behind the books: 26000).
#[test]
fn a_duplicate_parse_behind_a_skipped_parse_of_sluices_own_is_refused() {
    for first in [&["bad", "one"][..], &["bad", "one", "bad", "one"]] {
        let (_pg, s, mut c) = one_statement_per_server();
        let mut pipeline: Vec<u8> = first.iter().flat_map(|n| segment(n)).collect();
        pipeline.extend([sync(), parse("one", "select 1"), sync()].concat());
        c.send(&pipeline);
        fails_by_zero(&mut c, "first");
        refused_as_a_duplicate(&mut c, &format!("{first:?}"));
        runs_one(&mut c);
        both_run(&mut c, "then");
        books_never_missed_a_copy(&s);
    }
}

/// A client's second Parse of a name whose first Parse an error skipped defines it (as
/// on PostgreSQL), and the books follow the server through what is pipelined behind:
/// another statement's Parse that evicts it (the server closes it after parsing it
/// again), or a second error that skips it too.
#[test]
fn a_name_parsed_again_after_a_skipped_parse_is_kept_in_the_books() {
    // Evicted behind the second Parse: parsed again on next use, not trusted (26000).
    let (_pg, s, mut c) = one_statement_per_server();
    let again = [parse("a", "select 2"), parse("b", "select 3"), sync()].concat();
    c.send(&[segment("bad"), parse("a", "select 2"), sync(), again].concat());
    fails_by_zero(&mut c, "first");
    assert_eq!(tags(&c.until_ready()), "11Z");
    for (name, value) in [("a", "2"), ("b", "3"), ("a", "2")] {
        let m = run(&mut c, name, &[]);
        assert_eq!((tags(&m), first_value(&m)), ("2DCZ".to_string(), value.to_string()), "{name}: {m:?}");
    }
    books_never_missed_a_copy(&s);
    // Both Parses skipped: the name is not defined, and the server holds no copy the
    // books miss.
    let (_pg, s, mut c) = one_statement_per_server();
    let skipped = [segment("bad"), parse("a", "select 2"), sync()].concat();
    c.send(&[skipped.clone(), skipped].concat());
    fails_by_zero(&mut c, "first");
    fails_by_zero(&mut c, "second");
    let m = run(&mut c, "a", &[]);
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "26000".to_string()), "{m:?}");
    assert_eq!(prepare(&mut c, "a", "select 2"), "1Z");
    let m = run(&mut c, "a", &[]);
    assert_eq!((tags(&m), first_value(&m)), ("2DCZ".to_string(), "2".to_string()), "{m:?}");
    books_never_missed_a_copy(&s);
    // One skipped, then one refused as a duplicate (`a` held before) or defining it
    // (`a` new): either way the server holds `a`, and so say the books.
    for held_before in [true, false] {
        let (_pg, s) = setup(1, &[]);
        let mut c = login(&s);
        assert_eq!(prepare(&mut c, "bad", "select 1/0"), "1Z");
        if held_before {
            assert_eq!(prepare(&mut c, "a", "select 2"), "1Z");
        }
        let skipped = [segment("bad"), parse("a", "select 2"), sync()].concat();
        c.send(&[skipped, parse("a", "select 2"), sync()].concat());
        fails_by_zero(&mut c, "first");
        if held_before {
            refused_as_a_duplicate(&mut c, "second");
        } else {
            assert_eq!(tags(&c.until_ready()), "1Z");
        }
        for round in 0..2 {
            let m = run(&mut c, "a", &[]);
            assert_eq!((tags(&m), first_value(&m)), ("2DCZ".to_string(), "2".to_string()), "{round}: {m:?}");
        }
        books_never_missed_a_copy(&s);
    }
}

/// A pool of one server with room for one statement, and a client that prepared `one`
/// (`select 1`) and `bad` (`select 1/0`): the server holds `bad`.
fn one_statement_per_server() -> (PgCluster, Sluice, Raw) {
    let (pg, s) = setup(1, &[("max_prepared_statements", "1")]);
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "one", "select 1"), "1Z");
    assert_eq!(prepare(&mut c, "bad", "select 1/0"), "1Z");
    (pg, s, c)
}

/// Bind and Execute of the client's statement `name` into the unnamed portal.
fn segment(name: &str) -> Vec<u8> {
    [bind("", name, &[]), execute("", 0)].concat()
}

/// `bad` failed (PostgreSQL folds 1/0 when it plans the statement: the Bind fails).
fn fails_by_zero(c: &mut Raw, what: &str) {
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "22012".to_string()), "{what}: {m:?}");
}

/// The second Parse of a name the client holds was refused, as by PostgreSQL.
fn refused_as_a_duplicate(c: &mut Raw, what: &str) {
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "42P05".to_string()), "{what}: {m:?}");
}

/// `bad` runs to its error, then `one` to its row.
fn both_run(c: &mut Raw, round: &str) {
    c.send(&[segment("bad"), sync()].concat());
    fails_by_zero(c, round);
    runs_one(c);
}

/// The books never missed a copy the server held (the 42P05 that would reveal it is
/// mended by closing the copy, which would hide a wrong rule from the replies alone).
fn books_never_missed_a_copy(s: &Sluice) {
    assert!(!s.log().contains("books missed"), "{}", s.log());
}

fn runs_one(c: &mut Raw) {
    c.send(&[segment("one"), sync()].concat());
    let m = c.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("2DCZ".to_string(), "1".to_string()), "{m:?}");
}

/// DISCARD ALL through the extended protocol with a Parse behind it in the same
/// pipeline: the server holds that statement after the DISCARD, and Sluice must know
/// it, or another client preparing the same text on that server gets 42P05.
#[test]
fn a_statement_parsed_behind_an_extended_discard_all_stays_known() {
    let (_pg, s) = setup(1, &[]);
    let mut c = login(&s);
    c.send(&[parse("", "discard all"), bind("", "", &[]), execute("", 0), parse("s1", "select 71"), sync()].concat());
    assert_eq!(tags(&c.until_ready()), "12C1Z");
    drop(c);
    let mut other = login(&s);
    other.send(&[parse("t1", "select 71"), bind("", "t1", &[]), execute("", 0), sync()].concat());
    let m = other.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("12DCZ".to_string(), "71".to_string()), "{m:?}");
}

/// DISCARD ALL as a simple query with the client's own Parses behind it in the same
/// write (Npgsql's reset of a pooled connection goes out ahead of the next command
/// so): PostgreSQL runs the DISCARD first, so a new name and a name the client held,
/// parsed again behind it, both stand, also when every answer comes in one read.
#[test]
fn names_parsed_behind_a_simple_discard_all_stay_the_clients() {
    let (_pg, s) = setup(1, &[]);
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "held", "select 3"), "1Z");
    let describe = |name: &str| msg(b'D', &[b"S", name.as_bytes(), b"\0"].concat());
    let after = [parse("new", "select 4"), describe("new"), parse("held", "select 3"), sync()].concat();
    c.send(&[query("discard all"), after].concat());
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(tags(&c.until_ready()), "1tT1Z");
    for (name, want) in [("new", "4"), ("held", "3")] {
        let m = run(&mut c, name, &[]);
        assert_eq!((tags(&m), first_value(&m)), ("2DCZ".to_string(), want.to_string()), "{name}: {m:?}");
    }
    books_never_missed_a_copy(&s);
}

/// Behind a DISCARD ALL in the same write: a name parsed and closed again is gone; a
/// name held from before, closed where an error makes the server skip the Close, is
/// gone too (the DISCARD took it, as on PostgreSQL: 26000); a Parse of a text the
/// server already held (answered from its cache otherwise) still defines the name,
/// although the DISCARD emptied that server.
#[test]
fn names_closed_or_cached_behind_a_discard_all_end_as_on_postgresql() {
    let (_pg, s) = setup(1, &[]);
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "old", "select 8"), "1Z");
    let failing = [parse("", "select 1/0"), bind("", "", &[]), execute("", 0)].concat();
    let after = [parse("gone", "select 10"), close_stmt("gone"), failing, close_stmt("old"), sync()].concat();
    c.send(&[query("discard all"), after].concat());
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(tags(&c.until_ready()), "131EZ");
    for name in ["gone", "old"] {
        let m = run(&mut c, name, &[]);
        assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "26000".to_string()), "{name}: {m:?}");
    }
    // The server holds `select 9` when the DISCARD comes.
    assert_eq!(prepare(&mut c, "shared", "select 9"), "1Z");
    c.send(&[query("discard all"), parse("cached", "select 9"), msg(b'D', b"Scached\0"), sync()].concat());
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(tags(&c.until_ready()), "1tTZ");
    let m = run(&mut c, "cached", &[]);
    assert_eq!((tags(&m), first_value(&m)), ("2DCZ".to_string(), "9".to_string()), "{m:?}");
    books_never_missed_a_copy(&s);
}

/// A prepared DISCARD ALL bound to one portal while another portal runs: what empties
/// the statements is the command that completes, told by its tag, not the last Bind.
/// Bound and not run, the DISCARD leaves the client's statements as they were; run
/// from a named portal after a later Bind, it empties them.
#[test]
fn an_extended_discard_all_counts_when_its_portal_runs() {
    let (_pg, s) = setup(1, &[]);
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "d", "discard all"), "1Z");
    assert_eq!(prepare(&mut c, "s", "select 6"), "1Z");
    c.send(&[bind("p", "s", &[]), bind("", "d", &[]), execute("p", 0), sync()].concat());
    assert_eq!(tags(&c.until_ready()), "22DCZ");
    let m = run(&mut c, "s", &[]);
    assert_eq!((tags(&m), first_value(&m)), ("2DCZ".to_string(), "6".to_string()), "{m:?}");
    c.send(&[bind("p", "d", &[]), bind("", "s", &[]), execute("p", 0), sync()].concat());
    assert_eq!(tags(&c.until_ready()), "22CZ");
    c.send(&[bind("", "s", &[]), execute("", 0), sync()].concat());
    let m = c.until_ready();
    assert_eq!(tags(&m), "EZ", "{m:?}");
    assert_eq!(sqlstate(&m[0].1), "26000", "{m:?}");
    books_never_missed_a_copy(&s);
}

/// A server holding a copy the books do not know of (here one PREPAREd by hand under
/// the name Sluice gives the text, after DISCARD ALL emptied server and books): the
/// Parse Sluice sends fails with 42P05. The client gets that one error; Sluice closes
/// the copy, and the next Parse of the text runs the client's statement, not the one
/// by hand.
#[test]
fn a_copy_the_books_missed_costs_one_error() {
    let (_pg, s) = setup(1, &[]);
    let mut c = with_a_copy_the_books_miss(&s);
    c.send(&[parse("again", "select 42"), sync()].concat());
    refused_as_a_duplicate(&mut c, "first");
    the_copy_was_closed(&s, &mut c);
}

/// The window between a skipped Parse of a name and the answer to the client's Parse of
/// it again: a Bind of the name sent meanwhile finds it (as on PostgreSQL, where the
/// second Parse defines it), not 26000. `nap` keeps the second Parse unanswered while
/// the first segment's answers are in.
#[test]
fn a_name_parsed_again_is_usable_before_that_parse_is_answered() {
    let (_pg, s) = setup(1, &[]);
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "bad", "select 1/0"), "1Z");
    assert_eq!(prepare(&mut c, "nap", "select pg_sleep(1)"), "1Z");
    let first = [segment("bad"), parse("a", "select 2"), sync()].concat();
    c.send(&[first, segment("nap"), parse("a", "select 2"), sync()].concat());
    fails_by_zero(&mut c, "first");
    c.send(&[segment("a"), sync()].concat());
    assert_eq!(tags(&c.until_ready()), "2DC1Z");
    let m = c.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("2DCZ".to_string(), "2".to_string()), "{m:?}");
    books_never_missed_a_copy(&s);
}

/// A copy the books missed met by a client's Parse with a second Parse of the name
/// behind it: both are refused (the copy is not the client's), the copy is closed, and
/// the name then prepares and runs the client's statement.
#[test]
fn a_copy_the_books_missed_is_closed_with_a_second_parse_behind() {
    let (_pg, s) = setup(1, &[]);
    let mut c = with_a_copy_the_books_miss(&s);
    let once = [parse("again", "select 42"), sync()].concat();
    c.send(&[once.clone(), once].concat());
    for round in ["first", "second"] {
        refused_as_a_duplicate(&mut c, round);
    }
    the_copy_was_closed(&s, &mut c);
}

/// An extended DISCARD ALL with a client's Parse of a name it held behind it (defining
/// it again, as on PostgreSQL): once the DISCARD is answered the server still gets that
/// statement from the Parse behind, and another name for the same text, sent in the
/// same segment before that Parse is answered, uses it (not a second Parse of it:
/// 42P05). The unnamed `pg_sleep` keeps that Parse unanswered meanwhile.
#[test]
fn a_name_parsed_again_behind_an_extended_discard_all_stays_known() {
    let (_pg, s) = setup(1, &[]);
    let mut c = login(&s);
    assert_eq!(prepare(&mut c, "a", "select 2"), "1Z");
    let unnamed = |sql| [parse("", sql), bind("", "", &[]), execute("", 0)].concat();
    let nap = unnamed("select pg_sleep(1)");
    c.send(&[unnamed("discard all"), flush(), nap, parse("a", "select 2")].concat());
    assert_eq!(tags(&c.take(3)), "12C");
    c.send(&[parse("b", "select 2"), segment("b"), sync()].concat());
    let m = c.until_ready();
    assert_eq!(tags(&m), "12DC112DCZ", "{m:?}");
    assert_eq!(common::raw::first_column(&m[7].1), "2", "{m:?}");
    books_never_missed_a_copy(&s);
}

/// A client on a server that holds a copy of `select 42` the books do not know of: one
/// PREPAREd by hand (as `select 7`) under the name Sluice gives that text, after
/// DISCARD ALL emptied server and books.
fn with_a_copy_the_books_miss(s: &Sluice) -> Raw {
    let mut c = login(s);
    assert_eq!(prepare(&mut c, "mine", "select 42"), "1Z");
    c.send(&query("select name from pg_prepared_statements"));
    let name = first_value(&c.until_ready());
    assert!(name.starts_with("sluice_"), "{name}");
    for sql in ["discard all".to_string(), format!("prepare {name} as select 7")] {
        c.send(&query(&sql));
        assert_eq!(tags(&c.until_ready()), "CZ", "{sql}");
    }
    books_never_missed_a_copy(s);
    c
}

/// After `with_a_copy_the_books_miss`'s copy was met: it was logged and closed, and the
/// client's `select 42` now prepares and runs as its own.
fn the_copy_was_closed(s: &Sluice, c: &mut Raw) {
    assert!(s.log().contains("books missed"), "{}", s.log());
    assert_eq!(prepare(c, "again", "select 42"), "1Z");
    let m = run(c, "again", &[]);
    assert_eq!((tags(&m), first_value(&m)), ("2DCZ".to_string(), "42".to_string()), "{m:?}");
}
