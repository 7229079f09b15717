use super::*;

#[test]
fn reset_leaves_nothing_of_the_previous_link() {
    let mut t = Track::default();
    t.stats.queries = 3;
    t.xact_start = Some(Instant::now());
    t.xact_done = Some(Duration::from_millis(1));
    t.errors.push("40001".into());
    t.seen = Seen { schema: true, settings: true, role: true };
    t.query_times.push(Duration::from_micros(5));
    t.pending = 2;
    t.unsynced = true;
    t.last_simple = true;
    t.terminated = true;
    t.violation = true;
    t.server_fatal = Some("57P01".into());
    t.tx = Some(TxStatus::InTransaction);
    t.busy_since = Some(Instant::now());
    t.timed_from = Some(Instant::now());
    t.idle_since = Some(Instant::now());
    t.param_updates.push(("TimeZone".into(), "UTC".into()));
    t.discard_mark = Some(1);
    t.ext.sets.sets_parsing = true;
    t.copy_in = CopyIn::Simple;
    t.syncs_after_execute = 1;
    t.before_execute = 1;
    t.ended_ahead.push_back(EndedAhead { unit: 1, ignored: 1, synced: true });
    t.units_sent = 2;
    t.last_begin = Some(1);
    t.ignored_since_ready = 1;
    t.early_syncs = EarlySyncs::Unsure;
    t.ext.on_client_forwarded(fe::SYNC);
    // Both scanners in the middle of a 100-byte message.
    let partial = [b'Q', 0, 0, 0, 100, b's', b'e', b'l'];
    let mut sp = Splice::new();
    for scan in [&mut t.client_scan, &mut t.server_scan] {
        scan.scan(&partial, |_| crate::protocol::scan::Need::Stream, |_, _| Ok(()), &mut sp).unwrap();
        assert!(scan.mid_message());
    }
    t.reset();
    assert_eq!(format!("{t:?}"), format!("{:?}", Track::default()));
}
