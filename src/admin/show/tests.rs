use super::*;

#[test]
fn timestamps() {
    assert_eq!(timestamp(0), "1970-01-01 00:00:00 UTC");
    assert_eq!(timestamp(951_782_400_000_000), "2000-02-29 00:00:00 UTC");
    assert_eq!(timestamp(1_700_000_000_123_456), "2023-11-14 22:13:20 UTC");
}

#[test]
fn show_names_parse() {
    assert_eq!(Show::parse("stats_totals"), Some(Show::StatsTotals));
    assert_eq!(Show::parse("Pools"), Some(Show::Pools));
    assert_eq!(Show::parse("nope"), None);
    assert_eq!(CONNECTIONS.len(), CONNECTION_KINDS.len());
}
