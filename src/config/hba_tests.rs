use super::*;

fn parse(text: &str) -> Hba {
    Hba::parse(text, Path::new("/etc/sluice/hba.conf")).unwrap_or_else(|e| panic!("{e}"))
}

fn error(text: &str) -> String {
    Hba::parse(text, Path::new("/etc/sluice/hba.conf")).expect_err("an error").to_string()
}

fn tcp(addr: &str, tls: bool, database: &'static str, user: &'static str) -> Login<'static> {
    Login { addr: Some(addr.parse().unwrap()), tls, database, user }
}

fn local(database: &'static str, user: &'static str) -> Login<'static> {
    Login { addr: None, tls: false, database, user }
}

/// The line deciding `login`, and what it says.
fn decided(hba: &Hba, login: Login<'_>) -> Option<(usize, Action)> {
    hba.rule_for(&login).map(|r| (r.line, r.action))
}

const SCRAM: Action = Action::Authenticate(Method::ScramSha256);
const MD5: Action = Action::Authenticate(Method::Md5);
const TRUST: Action = Action::Authenticate(Method::Trust);

#[test]
fn the_first_fitting_line_decides_and_none_fitting_refuses() {
    let hba = parse(
        "# TYPE  DATABASE  USER   ADDRESS        METHOD\n\
         local   all       all                   peer\n\
         hostssl app       alice  10.0.0.0/8     cert\n\
         host    app       alice  10.1.0.0/16    reject\n\
         host    app,\"all\" bob  10.0.0.0 255.0.0.0  md5   # a netmask field\n\
         hostnossl all     all    0.0.0.0/0      scram-sha-256\n\
         host    sameuser  all    ::1/128        trust\n",
    );
    assert_eq!(decided(&hba, local("app", "alice")), Some((2, Action::Authenticate(Method::Peer))));
    assert_eq!(decided(&hba, tcp("10.1.2.3", true, "app", "alice")), Some((3, Action::Authenticate(Method::Cert))));
    assert_eq!(decided(&hba, tcp("10.1.2.3", false, "app", "alice")), Some((4, Action::Reject)));
    // "all" in quotes is a database named all.
    assert_eq!(decided(&hba, tcp("10.9.9.9", true, "all", "bob")), Some((5, MD5)));
    assert_eq!(decided(&hba, tcp("10.9.9.9", true, "other", "bob")), None);
    assert_eq!(decided(&hba, tcp("192.168.1.1", false, "other", "bob")), Some((6, SCRAM)));
    assert_eq!(decided(&hba, tcp("::1", true, "carol", "carol")), Some((7, TRUST)));
    assert_eq!(decided(&hba, tcp("::1", true, "app", "carol")), None);
    // An IPv4 client on a dual-stack socket is matched as IPv4.
    assert_eq!(decided(&hba, tcp("::ffff:10.1.2.3", false, "app", "alice")), Some((4, Action::Reject)));
    let uses = |m| hba.first(m).is_some();
    assert!(uses(Method::Cert) && uses(Method::Peer) && !uses(Method::Password));
}

#[test]
fn keywords_lists_and_continued_lines() {
    let hba = parse(
        "host \"sameuser\",replication all 127.0.0.1/32 trust\n\
         host all \\\n   a,  b, \"c d\" 127.0.0.1/32 md5\n\
         hostgssenc all all all trust\n\
         hostnogssenc all all all password\n",
    );
    // A quoted keyword is a name; `replication` fits no login here.
    assert_eq!(decided(&hba, tcp("127.0.0.1", false, "sameuser", "x")), Some((1, TRUST)));
    assert_eq!(
        decided(&hba, tcp("127.0.0.1", false, "replication", "x")),
        Some((5, Action::Authenticate(Method::Password)))
    );
    // A list may go on after a comma and a line break, and the line number is the first.
    assert_eq!(decided(&hba, tcp("127.0.0.1", false, "db", "c d")), Some((2, MD5)));
    assert_eq!(decided(&hba, tcp("127.0.0.1", false, "db", "a")), Some((2, MD5)));
    assert_eq!(decided(&hba, local("db", "a")), None, "no local line");
}

#[test]
fn at_files_list_names_relative_to_the_file() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("admins"), "# the admins\nalice, bob\n  carol\n@more\n").unwrap();
    std::fs::write(dir.path().join("more"), "dave\n").unwrap();
    let file = dir.path().join("hba.conf");
    std::fs::write(&file, "host all @admins 127.0.0.1/32 scram-sha-256\nhost all all all reject\n").unwrap();
    let hba = Hba::load(&file).unwrap();
    for user in ["alice", "bob", "carol", "dave"] {
        assert_eq!(decided(&hba, tcp("127.0.0.1", false, "db", user)).map(|d| d.0), Some(1), "{user}");
    }
    assert_eq!(decided(&hba, tcp("127.0.0.1", false, "db", "eve")), Some((2, Action::Reject)));
    std::fs::write(&file, "host all @missing 127.0.0.1/32 trust\n").unwrap();
    let e = Hba::load(&file).unwrap_err().to_string();
    assert!(e.contains("hba.conf:1: user: cannot read") && e.contains("missing"), "{e}");
    std::fs::write(dir.path().join("loop"), "@loop\n").unwrap();
    std::fs::write(&file, "host all @loop 127.0.0.1/32 trust\n").unwrap();
    assert!(Hba::load(&file).unwrap_err().to_string().contains("more than 10 deep"));
}

#[test]
fn what_cannot_be_honoured_is_an_error_naming_its_line() {
    let cases = [
        ("local all all md5\nhost all +admins all md5\n", "hba.conf:2: user: groups (\"+admins\")"),
        ("host samerole all all md5\n", ":1: database: \"samerole\" is not supported"),
        ("host all /^a all md5\n", ":1: user: regular expressions"),
        ("host all all db.example.com md5\n", ":1: address: host names (\"db.example.com\")"),
        ("host all all samenet md5\n", ":1: address: \"samenet\" is not supported"),
        ("host all all 10.0.0.1 md5\n", ":1: netmask: \"md5\" is not a netmask"),
        ("host all all 10.0.0.1 255.0.255.0 md5\n", ":1: netmask: \"255.0.255.0\""),
        ("host all all 10.0.0.0/33 md5\n", ":1: address: \"10.0.0.0/33\" is not an address range"),
        ("host all all all ldap\n", ":1: method: authentication method \"ldap\" is not supported"),
        ("host all all all cert\n", ":1: method: cert authentication is only supported on hostssl"),
        ("host all all all peer\n", ":1: method: peer authentication is only supported on local"),
        ("host all all all md5 map=omicron\n", ":1: method: options are not supported (\"map=omicron\")"),
        ("local all all peer clientcert=verify-full\n", ":1: method: the only option of peer and cert is map="),
        ("local all all peer map=a map=b\n", ":1: method: the only option of peer and cert is map= (\"map=b\")"),
        ("local all all peer map=a,b\n", ":1: method: the only option of peer and cert is map= (\"map=a,b\")"),
        ("include other.conf\n", ":1: connection type: \"include\" is not supported"),
        ("hots all all all md5\n", ":1: connection type: unknown connection type \"hots\""),
        ("host all all\n", ":1: address: the line ends before its address"),
        ("local all\n", ":1: user: the line ends before its user"),
        ("host all \"al all all md5\n", ":1: -: a double quote is not closed"),
        ("host a,,b all all md5\n", ":1: -: a name is missing"),
        ("host a, all all\n", ":1: address: the line ends before its address"),
    ];
    for (text, expected) in cases {
        let e = error(text);
        assert!(e.starts_with("/etc/sluice/hba.conf:") && e.contains(expected), "{text:?}: {e}");
    }
}

#[test]
fn address_ranges_mask_their_host_bits() {
    let hba = parse("host all all 10.1.2.3/16 trust\nhost all all fe80::1/10 md5\nhost all all ::/0 reject\n");
    assert_eq!(decided(&hba, tcp("10.1.200.9", false, "d", "u")).map(|d| d.0), Some(1));
    assert_eq!(decided(&hba, tcp("10.2.0.1", false, "d", "u")), None);
    assert_eq!(decided(&hba, tcp("fe80::abcd", false, "d", "u")).map(|d| d.0), Some(2));
    assert_eq!(decided(&hba, tcp("2001:db8::1", false, "d", "u")).map(|d| d.0), Some(3));
    let zero = parse("host all all 0.0.0.0 0.0.0.0 trust\n");
    assert_eq!(decided(&zero, tcp("192.0.2.1", false, "d", "u")).map(|d| d.0), Some(1));
    assert_eq!(decided(&zero, tcp("2001:db8::1", false, "d", "u")), None, "an IPv4 range fits no IPv6 client");
}

#[test]
fn quotes_continuations_and_line_ends_read_as_postgresql_reads_them() {
    // Two double quotes inside quotes are one; only a leading quote makes a name of a
    // keyword (`al"l"` is still `all`); CRLF line ends; a list continued after a comma on
    // the next line; a comment ending with a backslash takes the next line with it.
    let hba = parse(
        "host \"a\"\"b\" al\"l\" 127.0.0.1/32 trust\r\n\
         host db x, \\\r\n  y 127.0.0.1/32 md5\r\n\
         # a comment \\\n\
         host all all all reject\n\
         host all all all password\n",
    );
    assert_eq!(decided(&hba, tcp("127.0.0.1", false, "a\"b", "anyone")), Some((1, TRUST)));
    assert_eq!(decided(&hba, tcp("127.0.0.1", false, "db", "y")), Some((2, MD5)));
    assert_eq!(decided(&hba, tcp("127.0.0.1", false, "db", "z")), Some((6, Action::Authenticate(Method::Password))));
}

#[test]
fn a_quoted_address_is_a_host_name_and_mapped_ranges_are_refused() {
    let e = error("host all all \"all\" trust\n");
    assert!(e.contains(":1: address: host names (\"all\") are not supported"), "{e}");
    for range in ["::ffff:10.1.2.3/128", "::ffff:0:0/96", "::ffff:10.0.0.0 ffff:ffff:ffff:ffff:ffff:ffff:ff00:0"] {
        let e = error(&format!("host all all {range} reject\n"));
        assert!(e.contains(":1: address: IPv4-mapped ranges"), "{range}: {e}");
    }
}

#[test]
fn map_options_name_maps_of_the_ident_file() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hba.conf");
    std::fs::write(&file, "local all all peer map=web\n").unwrap();
    std::fs::write(dir.path().join("ident.conf"), "web www-data app\n").unwrap();
    let g = |ident: &str| General {
        auth_type: AuthType::Hba,
        auth_hba_file: "hba.conf".into(),
        auth_ident_file: ident.into(),
        ..General::default()
    };
    let config = dir.path().join("sluice.toml");
    let unplaced =
        |k: &str, m: String| ConfigError::Invalid { file: String::new(), line: 0, key: k.into(), message: m };
    let e = for_config(&g(""), &config, &unplaced).unwrap_err().to_string();
    assert!(e.ends_with("hba.conf:1: method: map=\"web\" needs an auth_ident_file"), "{e}");
    let hba = for_config(&g("ident.conf"), &config, &unplaced).unwrap().unwrap();
    let rule = hba.rule_for(&local("app", "app")).unwrap();
    let map = rule.user_map(&hba).unwrap().expect("the line's map");
    assert!(map.allows("www-data", "app") && !map.allows("www-data", "postgres") && !map.allows("app", "app"));
    std::fs::write(dir.path().join("ident.conf"), "other www-data app\n").unwrap();
    let e = for_config(&g("ident.conf"), &config, &unplaced).unwrap_err().to_string();
    assert!(e.contains("hba.conf:1: method: map \"web\" is not in ") && e.ends_with("ident.conf"), "{e}");
}
