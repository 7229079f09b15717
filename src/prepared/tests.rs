use super::*;

fn parse_frame(name: &str, query: &str) -> BytesMut {
    let mut b = BytesMut::new();
    build::parse(&mut b, name.as_bytes(), query.as_bytes(), &[23]);
    b
}

#[test]
fn a_parse_reads_up_to_65535_parameter_types() {
    let types = vec![23u32; 40_000];
    let mut b = BytesMut::new();
    build::parse(&mut b, b"s", b"select 1", &types);
    assert_eq!(parse_view(&b).unwrap().types.len(), 2 + 4 * 40_000);
    // A count that does not match the types sent is refused.
    let frame = &b[..b.len() - 4];
    assert!(parse_view(frame).is_err());
}

#[test]
fn same_text_same_server_statement() {
    let a = parse_frame("a", "select $1");
    let b = parse_frame("other", "select $1");
    let c = parse_frame("a", "select $1 + 1");
    let sa = statement(&parse_view(&a).unwrap(), 0, 7);
    let sb = statement(&parse_view(&b).unwrap(), 0, 7);
    let sc = statement(&parse_view(&c).unwrap(), 0, 7);
    assert_eq!(sa.id, sb.id);
    assert_ne!(sa.id, sc.id);
    // Parsed under other settings, the same text is another statement.
    assert_ne!(sa.id, statement(&parse_view(&a).unwrap(), 0, 8).id);
    let v = parse_view(&sa.parse).unwrap();
    assert_eq!(v.name, Statement::server_name(sa.id).as_bytes());
    assert_eq!(&sa.name[..], v.name);
    assert_eq!(v.query, b"select $1");
    assert_eq!(v.types, &[0, 1, 0, 0, 0, 23]);
    assert_eq!(crate::protocol::Header::peek(&sa.parse).unwrap().unwrap().frame_len, sa.parse.len());
}

#[test]
fn bind_and_describe_are_renamed() {
    let mut bind = BytesMut::new();
    bind.put_u8(b'B');
    bind.put_u32(0);
    bind.put_slice(b"portal\0P_1\0rest-of-bind");
    let len = (bind.len() - 1) as u32;
    bind[1..5].copy_from_slice(&len.to_be_bytes());
    let (at, name) = name_field(&bind, b'B').unwrap();
    assert_eq!((at, name), (12, &b"P_1"[..]));
    let mut prefix = BytesMut::new();
    let replaced = renamed_prefix(&mut prefix, &bind, bind.len(), b'B', b"sluice_x").unwrap();
    let mut out = prefix.to_vec();
    out.extend_from_slice(&bind[replaced..]);
    assert_eq!(&out[5..], b"portal\0sluice_x\0rest-of-bind");
    assert_eq!(u32::from_be_bytes(out[1..5].try_into().unwrap()) as usize, out.len() - 1);
    let mut d = BytesMut::new();
    build::close(&mut d, b'S', b"stmt");
    d[0] = b'D';
    assert_eq!(name_field(&d, b'D').unwrap(), (6, &b"stmt"[..]));
    assert!(name_field(b"B\0\0\0\x08abc", b'B').is_err());
}

#[test]
fn server_lru_evicts_oldest() {
    let mut s = ServerStatements::default();
    assert_eq!(s.add(1, 2), None);
    assert_eq!(s.add(2, 2), None);
    assert!(s.contains(1));
    assert_eq!(s.add(3, 2), Some(2));
    assert!(s.contains(1) && s.contains(3) && !s.contains(2));
}

#[test]
fn recognises_deallocate_and_discard() {
    assert_eq!(sql_command(b"DEALLOCATE foo;"), Some(SqlCommand::Deallocate("foo".into())));
    assert_eq!(sql_command(b"  deallocate prepare \"S_1\" "), Some(SqlCommand::Deallocate("S_1".into())));
    assert_eq!(sql_command(b"DEALLOCATE ALL"), Some(SqlCommand::DeallocateAll));
    assert_eq!(sql_command(b"discard all;"), Some(SqlCommand::DiscardAll));
    assert_eq!(sql_command(b"select 1; deallocate x"), None);
    assert_eq!(sql_command(b"discard plans"), None);
}

#[test]
fn session_sets_of_settings_not_reported_are_seen() {
    for sql in [
        "SET statement_timeout = 0",
        "set session statement_timeout to 5",
        "RESET ALL",
        "reset extra_float_digits",
        "SET search_path = app",
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        "SET \"statement_timeout\" = 5",
        "set time zone 'UTC'",
        "set local statement_timeout = 5; set work_mem = '1MB'",
        "select 1; select 2",
    ] {
        assert!(SetTarget::of(sql.as_bytes()).sets_session(), "{sql}");
    }
    for sql in [
        "SET LOCAL statement_timeout = 5000",
        "set local app.tenant = '42'",
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        "SET CONSTRAINTS ALL DEFERRED",
        "SET application_name = 'installer'",
        "reset TimeZone",
        "SET SESSION DateStyle = ISO",
        "select set_config('a.b', 'c', false)",
        "select 1",
        "",
    ] {
        assert!(!SetTarget::of(sql.as_bytes()).sets_session(), "{sql}");
    }
}

#[test]
fn sets_of_the_role_are_seen() {
    let sets_role = |sql: &str| SetTarget::of(sql.as_bytes()).sets_role(Some(sql.as_bytes()));
    for sql in [
        "SET ROLE tenant",
        "set session role tenant",
        "SET SESSION AUTHORIZATION bob",
        "select 1; set Role x",
        "SET \"role\" = 'tenant'",
        "set session_authorization = 'bob'",
        // Behind comments (query tags), nested too, and between the words.
        "/* app:web */ SET ROLE tenant",
        "-- tagged\n  SET ROLE tenant",
        "/* a /* nested */ comment */ set role tenant",
        "SET /* x */ ROLE tenant",
        "/* unterminated SET ROLE tenant",
        "-- a tag ending in a carriage return\rSET ROLE tenant",
    ] {
        assert!(sets_role(sql), "{sql}");
    }
    assert_eq!(
        SetTarget::of(b"/* c */ SET statement_timeout = 0"),
        SetTarget::Setting { reset: false, local: false, name: b"statement_timeout" }
    );
    assert_eq!(
        SetTarget::of(b"SET /* c */ LOCAL role x"),
        SetTarget::Setting { reset: false, local: true, name: b"role" }
    );
    assert_eq!(SetTarget::of(b"/* c */ select 1"), SetTarget::Nothing);
    assert_eq!(SetTarget::of(b"-- only a comment"), SetTarget::Nothing);
    assert_eq!(SetTarget::of(b"(select 1) union (select 2)"), SetTarget::Nothing);
    for sql in ["SET LOCAL ROLE tenant", "RESET ROLE", "SET work_mem = '1MB'", "select 1", "select 1; set x = 1"] {
        assert!(!sets_role(sql), "{sql}");
    }
    // A text not read whole may hold anything.
    assert!(SetTarget::Unknown.sets_role(None));
}

#[test]
fn every_set_but_a_few_neutral_ones_changes_parsing() {
    for sql in [
        "SET search_path = app, public",
        "set local SEARCH_PATH to x",
        "SET ROLE reporting",
        "reset role",
        "SET SESSION AUTHORIZATION alice",
        "RESET ALL",
        "SET DateStyle = 'DMY'",
        "set time zone 'UTC'",
        "SET standard_conforming_strings = off",
        "SET \"statement_timeout\" = 5",
        "set statement_timeout = 5; set search_path = x",
        "select 1; set statement_timeout = 5",
    ] {
        assert!(SetTarget::of(sql.as_bytes()).changes_parsing(), "{sql}");
    }
    for sql in [
        "SET statement_timeout = 5000",
        "set statement_timeout=5000",
        "set local lock_timeout to '1s';",
        "SET SESSION idle_in_transaction_session_timeout TO 0",
        "RESET statement_timeout",
        "SET TRANSACTION ISOLATION LEVEL SERIALIZABLE",
        "SET application_name = 'installer'",
        "select 1",
        "select 'a' ;  ",
        "",
        "   ",
    ] {
        assert!(!SetTarget::of(sql.as_bytes()).changes_parsing(), "{sql}");
    }
}
