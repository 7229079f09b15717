//! COPY through Sluice (raw sockets, trust auth): COPY IN and OUT inside a
//! transaction, extended-protocol COPY with Syncs sent early, behind a query or at
//! once, COPY that fails with Syncs inside it, and the probe Sluice sends to tell
//! when a server left unsure by such a COPY is done.

use super::*;

#[test]
fn copy_in_and_out_inside_a_transaction() {
    let (pg, s) = setup(2, "transaction");
    pg.psql("CREATE TABLE copy_t (a int, b text); GRANT ALL ON copy_t TO u_trust");
    let mut c = trust(&s);
    c.send(&query("begin"));
    c.until_ready();
    c.send(&query("copy copy_t from stdin"));
    assert_eq!(c.recv().unwrap().0, b'G');
    let mut data = Vec::new();
    for i in 0..1000 {
        data.extend(msg(b'd', format!("{i}\tvalue {i}\n").as_bytes()));
    }
    data.extend(msg(b'c', b""));
    c.send(&data);
    let m = c.until_ready();
    assert_eq!(tags(&m), "CZ");
    assert_eq!(m[1].1, b"T");
    c.send(&query("copy (select * from copy_t order by a) to stdout"));
    let m = c.until_ready();
    assert_eq!(m[0].0, b'H');
    assert_eq!(m.iter().filter(|(t, _)| *t == b'd').count(), 1000);
    assert_eq!(tags(&m[m.len() - 3..]), "cCZ");
    c.send(&query("commit"));
    c.until_ready();
    assert_eq!(pg.psql("select count(*) from copy_t"), "1000");
}

#[test]
fn extended_copy_in_with_early_sync_releases_the_server() {
    let (pg, s) = setup(1, "transaction");
    pg.psql("CREATE TABLE copy_x (a int); GRANT ALL ON copy_x TO u_trust");
    let mut c = trust(&s);
    // As tokio-postgres does: Bind/Execute/Sync, then the data, CopyDone and Sync.
    let b = extended_query("copy copy_x from stdin");
    c.send(&b);
    let m = c.take(3);
    assert_eq!(tags(&m), "12G");
    let mut data = copy_rows(b"1\n2\n");
    data.extend(sync());
    c.send(&data);
    assert_eq!(tags(&c.until_ready()), "CZ");
    // the single server went back to the pool
    assert_eq!(from_another_client(&s, "select count(*) from copy_x"), "2");
}

/// An extended-protocol COPY FROM STDIN pipelined behind a simple query: the query's
/// ReadyForQuery must not make Sluice forget the Sync sent after the COPY's Execute,
/// which the server ignores; the server then goes back to the pool (of one).
#[test]
fn extended_copy_in_pipelined_behind_a_query_releases_the_server() {
    let (pg, s) = setup(1, "transaction");
    pg.psql("CREATE TABLE copy_y (a int); GRANT ALL ON copy_y TO u_trust");
    let mut c = trust(&s);
    let mut b = query("select 1");
    b.extend(extended_query("copy copy_y from stdin"));
    c.send(&b);
    assert_eq!(tags(&c.until_ready()), "TDCZ");
    assert_eq!(tags(&c.take(3)), "12G");
    let mut data = copy_rows(b"1\n");
    data.extend(sync());
    c.send(&data);
    assert_eq!(tags(&c.until_ready()), "CZ");
    // the single server went back to the pool
    assert_eq!(from_another_client(&s, "select count(*) from copy_y"), "1");
}

/// A whole COPY FROM STDIN sent at once (Execute, Sync, data, CopyDone, Sync) before the
/// server's CopyInResponse: only the first Sync is ignored by the server, the last one
/// is answered, and the server goes back to the pool. Also with requests behind it, two
/// COPYs in one query, and a COPY sent at once whose query fails before it begins.
#[test]
fn extended_copy_in_sent_at_once_releases_the_server() {
    let (pg, s) = setup(1, "transaction");
    pg.psql("CREATE TABLE copy_z (a int); GRANT ALL ON copy_z TO u_trust");
    let mut c = trust(&s);
    let mut b = extended_query("copy copy_z from stdin");
    b.extend(copy_rows(b"1\n2\n3\n"));
    b.extend(sync());
    c.send(&b);
    let m = c.until_ready();
    assert_eq!(tags(&m), "12GCZ", "{m:?}");
    assert_eq!(from_another_client(&s, "select count(*) from copy_z"), "3");
    // The same for a simple-query COPY; an extended query after it is answered.
    let mut b = query("copy copy_z from stdin");
    b.extend(copy_rows(b"4\n"));
    c.send(&b);
    assert_eq!(tags(&c.until_ready()), "GCZ");
    let b = extended_query("select count(*) from copy_z");
    c.send(&b);
    let m = c.until_ready();
    assert_eq!(tags(&m), "12DCZ", "{m:?}");
    assert_eq!(first_value(&m), "4");
    // The count as another client sees it: served only if the server went back to the
    // pool (of one).
    let served_elsewhere = |s: &Sluice| from_another_client(s, "select count(*) from copy_z");
    let extended_count = |c: &mut Raw| {
        c.send(&extended_query("select count(*) from copy_z"));
        let m = c.until_ready();
        assert_eq!(tags(&m), "12DCZ", "{m:?}");
        first_value(&m)
    };
    // A COPY sent at once with another request behind it, in either protocol.
    let mut b = extended_query("copy copy_z from stdin");
    b.extend(copy_rows(b"5\n"));
    b.extend(sync());
    b.extend(extended_query("select 6"));
    c.send(&b);
    assert_eq!(tags(&c.until_ready()), "12GCZ");
    assert_eq!(first_value(&c.until_ready()), "6");
    assert_eq!(served_elsewhere(&s), "5", "the server stayed with the client");
    let mut b = query("copy copy_z from stdin");
    b.extend(copy_rows(b"7\n"));
    b.extend(query("select 8"));
    c.send(&b);
    assert_eq!(tags(&c.until_ready()), "GCZ");
    assert_eq!(first_value(&c.until_ready()), "8");
    assert_eq!(served_elsewhere(&s), "6", "the server stayed with the client");
    assert_eq!(extended_count(&mut c), "6");
    // Two COPYs in one query, each fed after the server began it.
    c.send(&query("copy copy_z from stdin; copy copy_z from stdin"));
    assert_eq!(tags(&c.take(1)), "G");
    c.send(&copy_rows(b"9\n"));
    assert_eq!(tags(&c.take(2)), "CG");
    c.send(&copy_rows(b"10\n"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(served_elsewhere(&s), "8", "the server stayed with the client");
    assert_eq!(extended_count(&mut c), "8");
    // A COPY sent at once whose query fails before it begins: its data is ignored.
    let mut b = query("copy no_such_table from stdin");
    b.extend(copy_rows(b"1\n"));
    c.send(&b);
    assert_eq!(tags(&c.until_ready()), "EZ");
    assert_eq!(served_elsewhere(&s), "8", "the server stayed with the client");
    c.send(&query("copy copy_z from stdin"));
    assert_eq!(tags(&c.take(1)), "G");
    c.send(&copy_rows(b"11\n"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(extended_count(&mut c), "9");
    assert_eq!(served_elsewhere(&s), "9");
}

/// An extended-protocol COPY FROM STDIN that fails on a bad row: the server then
/// skips everything up to the client's next Sync, so it stays with this client until
/// that Sync is answered; the next client on the single server is served correctly.
#[test]
fn failed_extended_copy_in_keeps_the_server_until_sync() {
    let (pg, s) = setup(1, "transaction");
    pg.psql("CREATE TABLE copy_bad (a int); GRANT ALL ON copy_bad TO u_trust");
    let mut c = trust(&s);
    let b = extended_query("copy copy_bad from stdin");
    c.send(&b);
    assert_eq!(tags(&c.take(3)), "12G");
    let data = copy_rows(b"1\nnot a number\n");
    c.send(&data);
    c.expect_error("22P02", "");
    // Another client asks for the only server meanwhile: it must not get it before
    // the first client's Sync.
    let mut d = trust(&s);
    d.send(&query("select 5"));
    assert!(one_client_queued(s.port, "u_trust", "", "app"), "the second client never queued");
    c.send(&sync());
    assert_eq!(tags(&c.until_ready()), "Z");
    assert_eq!(first_value(&d.until_ready()), "5");
    c.send(&query("select count(*) from copy_bad"));
    assert_eq!(first_value(&c.until_ready()), "0");
}

/// A simple-query COPY FROM STDIN that fails on a bad row, from a client that stops
/// there without ending the COPY: PostgreSQL leaves COPY mode with its ReadyForQuery,
/// so the client's next request (a Sync among it) is answered as usual, and the server
/// goes back to the pool afterwards; data the client still sends for the failed COPY
/// is ignored.
#[test]
fn a_failed_simple_copy_in_ends_with_its_ready_for_query() {
    let (pg, s) = setup(1, "transaction");
    pg.psql("CREATE TABLE copy_v (a int); GRANT ALL ON copy_v TO u_trust");
    let mut c = trust(&s);
    c.send(&query("copy copy_v from stdin"));
    assert_eq!(tags(&c.take(1)), "G");
    c.send(&msg(b'd', b"1\nnot a number\n"));
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "22P02".to_string()));
    c.send(&extended_query("select 7"));
    let m = c.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("12DCZ".to_string(), "7".to_string()));
    assert_eq!(from_another_client(&s, "select 3"), "3", "the server stayed with the client");
    // Late data and the end of the failed COPY: ignored by PostgreSQL, and not taken
    // for a later COPY's.
    c.send(&copy_rows(b"2\n"));
    c.send(&extended_query("copy copy_v from stdin"));
    assert_eq!(tags(&c.take(3)), "12G");
    c.send(&[copy_rows(b"4\n"), sync()].concat());
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(from_another_client(&s, "select string_agg(a::text, ',') from copy_v"), "4");
}

/// Two COPYs in one query sent at once with their data and a Sync inside the first:
/// PostgreSQL ignores the Sync (it reads it in COPY mode); the second COPY's end must
/// still be known as sent (a Sync after it counts again), and the server is free when
/// the transaction ends.
#[test]
fn a_sync_inside_the_first_of_two_copies_sent_at_once() {
    let (pg, s) = setup(1, "transaction");
    pg.psql("CREATE TABLE copy_u (a int); GRANT ALL ON copy_u TO u_trust");
    let mut c = trust(&s);
    // In a transaction block: what follows runs on the same link.
    c.send(&query("begin"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    let mut b = query("copy copy_u from stdin; copy copy_u from stdin");
    b.extend([msg(b'd', b"1\n"), sync(), msg(b'c', b""), copy_rows(b"2\n")].concat());
    c.send(&b);
    assert_eq!(tags(&c.until_ready()), "GCGCZ");
    c.send(&extended_query("select count(*) from copy_u"));
    let m = c.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("12DCZ".to_string(), "2".to_string()));
    c.send(&query("commit"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    assert_eq!(from_another_client(&s, "select 3"), "3", "the server stayed with the client");
}

/// Two extended-protocol COPYs sent whole under one Sync: that Sync ends both, and
/// the server goes back to the pool once it is answered.
#[test]
fn two_extended_copies_under_one_sync_release_the_server() {
    for mode in ["transaction", "session"] {
        let (pg, s) = setup(1, mode);
        pg.psql("CREATE TABLE copy_two (a int); GRANT ALL ON copy_two TO u_trust");
        let mut c = trust(&s);
        let copy = [bind("", "", &[]), execute("", 0), copy_rows(b"1\n")].concat();
        c.send(&[parse("", "copy copy_two from stdin"), copy.clone(), copy, sync()].concat());
        assert_eq!(tags(&c.until_ready()), "12GC2GCZ", "{mode}");
        server_free_after(&s, mode, c);
    }
}

/// A pool of one in transaction mode, a table and a view on it for the failed-COPY
/// tests, and a client whose server is the backend `pid`.
fn copy_setup() -> (PgCluster, Sluice, Raw, String) {
    let (pg, s) = setup(1, "transaction");
    pg.psql(
        "CREATE TABLE copy_t (a int); CREATE VIEW copy_tv AS SELECT * FROM copy_t; \
         GRANT ALL ON copy_t, copy_tv TO u_trust",
    );
    let mut c = trust(&s);
    c.send(&query("select pg_backend_pid()"));
    let pid = first_value(&c.until_ready());
    (pg, s, c, pid)
}

/// A COPY begun, then a bad row, a Sync, its end and `behind` sent at once: PostgreSQL
/// fails on the row, then answers the Sync, which Sluice cannot tell from a Sync read
/// in COPY mode and ignored. Before the server goes back to the pool Sluice probes it,
/// and all that comes before the probe's answer is the client's.
fn failed_copy_with_a_sync_inside(c: &mut Raw, behind: &[u8]) {
    c.send(&query("copy copy_t from stdin"));
    assert_eq!(tags(&c.take(1)), "G");
    c.send(&[msg(b'd', b"not a number\n"), sync(), msg(b'c', b""), behind.to_vec()].concat());
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "22P02".to_string()));
    assert_eq!(tags(&c.until_ready()), "Z", "the Sync's answer");
}

/// A COPY into a view sent at once with a Sync before its data and one after, and a
/// query behind: it fails right after CopyInResponse, before reading the first Sync, so
/// PostgreSQL answers both Syncs, where a COPY that reads its input ignores the first.
#[test]
fn a_copy_failing_before_its_early_sync_is_read_does_not_reach_the_next_client() {
    let (_pg, s, mut c, pid) = copy_setup();
    let mut b = [parse("", "copy copy_tv from stdin"), bind("", "", &[]), execute("", 0), sync()].concat();
    b.extend([copy_rows(b"1\n"), sync(), query("select 42")].concat());
    c.send(&b);
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[3].1)), ("12GEZ".to_string(), "42809".to_string()));
    assert_eq!(tags(&c.until_ready()), "Z", "the second Sync's answer");
    let m = c.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("TDCZ".to_string(), "42".to_string()));
    others_served_by_the_same_server(&s, &pid);
}

/// A Sync sent inside a COPY the server began, behind a row that fails.
#[test]
fn a_sync_inside_a_copy_failing_on_its_data_does_not_reach_the_next_client() {
    let (_pg, s, mut c, pid) = copy_setup();
    failed_copy_with_a_sync_inside(&mut c, b"");
    others_served_by_the_same_server(&s, &pid);
}

/// A COPY with an early Sync that fails on its data (the Sync read in COPY mode and
/// ignored, as with tokio-postgres): nothing more comes, and the server is kept.
#[test]
fn an_early_sync_read_inside_a_failing_copy_is_not_answered() {
    let (_pg, s, mut c, pid) = copy_setup();
    c.send(&[parse("", "copy copy_t from stdin"), bind("", "", &[]), execute("", 0), sync()].concat());
    assert_eq!(tags(&c.take(3)), "12G");
    c.send(&[copy_rows(b"not a number\n"), sync()].concat());
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "22P02".to_string()));
    others_served_by_the_same_server(&s, &pid);
}

/// With a transaction begun and failed behind the late answer: the probe finds the
/// server in that failed transaction and answers all the same; the server stays with
/// the client until its ROLLBACK.
#[test]
fn the_probe_answers_in_a_failed_transaction() {
    let (_pg, s, mut c, pid) = copy_setup();
    failed_copy_with_a_sync_inside(&mut c, &query("begin; select 1/0"));
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[1].1), &m[2].1[..]), ("CEZ".to_string(), "22012".to_string(), &b"E"[..]));
    c.send(&query("select 1"));
    let m = c.until_ready();
    assert_eq!((tags(&m), sqlstate(&m[0].1)), ("EZ".to_string(), "25P02".to_string()), "in the failed transaction");
    c.send(&query("rollback"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    others_served_by_the_same_server(&s, &pid);
}

/// With DISCARD ALL behind it, answered before or after the probe went out: still
/// recorded (the server's statements are gone, and a client preparing the same text
/// gets it parsed again, not taken as there).
#[test]
fn a_discard_all_answered_around_the_probe_is_recorded() {
    let (_pg, s, mut c, pid) = copy_setup();
    c.send(&[parse("s1", "select 1"), sync()].concat());
    assert_eq!(tags(&c.until_ready()), "1Z");
    failed_copy_with_a_sync_inside(&mut c, &query("discard all"));
    assert_eq!(tags(&c.until_ready()), "CZ");
    let mut other = trust(&s);
    other.send(&[parse("s2", "select 1"), bind("", "s2", &[]), execute("", 0), sync()].concat());
    let m = other.until_ready();
    assert_eq!((tags(&m), first_value(&m)), ("12DCZ".to_string(), "1".to_string()), "{m:?}");
    drop(other);
    others_served_by_the_same_server(&s, &pid);
}

/// With the server ending itself behind it (answered before or after the probe went
/// out): the client gets one FATAL, Sluice's 08006 quoting the server's 57P01, then the
/// connection closes; not the server's FATAL and Sluice's after it.
#[test]
fn a_server_ending_around_the_probe_is_told_once() {
    let (_pg, _s, mut c, _pid) = copy_setup();
    failed_copy_with_a_sync_inside(&mut c, &query("select pg_terminate_backend(pg_backend_pid())"));
    let rest: Vec<_> = std::iter::from_fn(|| c.recv()).collect();
    let errors: Vec<_> = rest.iter().filter(|(t, _)| *t == b'E').collect();
    assert_eq!(errors.iter().map(|(_, b)| sqlstate(b)).collect::<Vec<_>>(), ["08006"], "{rest:?}");
    let told = field(&errors[0].1, b'M');
    assert!(told.contains("57P01"), "the server's reason not quoted: {told}");
}

/// With a whole COPY behind it (its data and end sent before the probe): it runs.
#[test]
fn a_whole_copy_behind_the_probe_runs() {
    let (_pg, s, mut c, pid) = copy_setup();
    failed_copy_with_a_sync_inside(&mut c, &[query("copy copy_t from stdin"), copy_rows(b"5\n")].concat());
    assert_eq!(tags(&c.until_ready()), "GCZ");
    c.send(&query("select count(*) from copy_t"));
    assert_eq!(first_value(&c.until_ready()), "1");
    others_served_by_the_same_server(&s, &pid);
}

/// With an extended-protocol COPY behind it, a Sync inside that one too, failing on
/// its data: the late answer is not taken for that Sync, which the server ignores.
#[test]
fn an_extended_copy_behind_the_probe_keeps_its_own_sync_ignored() {
    let (_pg, s, mut c, pid) = copy_setup();
    let behind = [extended_query("copy copy_t from stdin"), msg(b'd', b"not a number\n")].concat();
    failed_copy_with_a_sync_inside(&mut c, &behind);
    let m = c.take(4);
    assert_eq!((tags(&m), sqlstate(&m[3].1)), ("12GE".to_string(), "22P02".to_string()));
    c.send(&[msg(b'c', b""), sync()].concat());
    assert_eq!(tags(&c.until_ready()), "Z");
    others_served_by_the_same_server(&s, &pid);
}

/// With a COPY behind it whose data comes later. If the server began it before Sluice
/// probed, the probe waits for its end; if after, the server read the probe as that
/// COPY's data and failed it: the client is told, and the server closed. (Which one
/// depends on timing; `client::copy`'s unit tests pin both down.) The server's
/// CopyInResponse and its error for the probe may come in one read: the client then
/// gets only the error.
#[test]
fn a_copy_behind_the_probe_with_its_data_later_runs_or_ends_the_link() {
    let (_pg, s, mut c, pid) = copy_setup();
    failed_copy_with_a_sync_inside(&mut c, &query("copy copy_t from stdin"));
    let (mut tag, mut body) = c.recv().expect("a reply");
    if tag == b'G' {
        c.send(&copy_rows(b"6\n"));
        (tag, body) = c.recv().expect("a reply");
    }
    if tag == b'C' {
        assert_eq!(tags(&c.take(1)), "Z");
        c.send(&query("select count(*) from copy_t"));
        assert_eq!(first_value(&c.until_ready()), "1");
        return others_served_by_the_same_server(&s, &pid);
    }
    assert_eq!((tag, sqlstate(&body)), (b'E', "08P01".to_string()), "{}", field(&body, b'M'));
    assert!(field(&body, b'M').contains("probe"), "{}", field(&body, b'M'));
    assert!(c.closed());
    assert_ne!(another_clients_backend(&s), pid, "the server was kept");
}

/// Session mode: the same COPY into a view passes through as PostgreSQL answers it, and
/// when the client leaves, its server, which may still answer, is closed, not reset for
/// the next client.
#[test]
fn session_mode_closes_a_server_left_unsure_by_a_failed_copy() {
    let (pg, s) = setup(1, "session");
    pg.psql(
        "CREATE TABLE copy_s (a int); CREATE VIEW copy_sv AS SELECT * FROM copy_s; GRANT ALL ON copy_sv TO u_trust",
    );
    let mut c = trust(&s);
    c.send(&query("select pg_backend_pid()"));
    let pid = first_value(&c.until_ready());
    let mut b = [parse("", "copy copy_sv from stdin"), bind("", "", &[]), execute("", 0), sync()].concat();
    b.extend([copy_rows(b"1\n"), sync(), query("select 42")].concat());
    c.send(&b);
    assert_eq!(tags(&c.until_ready()), "12GEZ");
    assert_eq!(tags(&c.until_ready()), "Z", "the second Sync's answer");
    assert_eq!(first_value(&c.until_ready()), "42");
    c.send(&msg(b'X', b""));
    assert!(c.closed());
    assert_ne!(another_clients_backend(&s), pid, "the server was kept");
}

/// Three clients in turn get their own answer, from the backend `pid` (the only server,
/// kept and lent again).
fn others_served_by_the_same_server(s: &Sluice, pid: &str) {
    for _ in 0..3 {
        assert_eq!(another_clients_backend(s), pid, "the server was not kept");
    }
}

/// The backend a new client's query runs on; its answer must be exactly its own.
fn another_clients_backend(s: &Sluice) -> String {
    let mut other = trust(s);
    other.send(&query("select pg_backend_pid()"));
    let m = other.until_ready();
    assert_eq!(tags(&m), "TDCZ", "another client got a reply that was not its own");
    first_value(&m)
}

/// CopyDone after CopyDone outside any COPY (PostgreSQL reads and ignores them, so the
/// server holds nothing back) behind an unsynced Execute: each is noted as a COPY end
/// sent ahead, and past 16,384 the client is refused with 53400 instead of growing
/// Sluice's memory without end. The server, left mid-request, is not lent again.
#[test]
fn copy_ends_sent_ahead_without_end_are_refused() {
    let (_pg, s) = setup(1, "transaction");
    let mut c = trust(&s);
    let mut burst = [parse("", "select 1"), bind("", "", &[]), execute("", 0)].concat();
    for _ in 0..20_000 {
        burst.extend(msg(b'c', b""));
    }
    c.send(&burst);
    // (The Execute's answers come before the refusal when the burst was read in pieces.)
    let refusal = std::iter::from_fn(|| c.recv()).find(|(t, _)| !b"12DC".contains(t)).expect("the refusal");
    assert_eq!((refusal.0, sqlstate(&refusal.1)), (b'E', "53400".to_string()), "{refusal:?}");
    assert!(field(&refusal.1, b'M').contains("too many COPY ends"), "{refusal:?}");
    assert!(c.closed());
    assert_eq!(from_another_client(&s, "select 7"), "7");
}
