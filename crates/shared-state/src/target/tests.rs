//! URL parsing: ports, databases, credentials (percent-encoded too), TLS, IPv6, refusals; and
//! that neither `Display` nor `Debug` ever shows the password.

use super::*;

fn parse(url: &str) -> Target {
    Target::parse(url).unwrap_or_else(|e| panic!("{url}: {e}"))
}

fn refused(url: &str) -> String {
    match Target::parse(url) {
        Ok(t) => panic!("{url} parsed as {t:?}"),
        Err(Error::Url(why)) => why,
        Err(e) => panic!("{url}: not a URL error: {e}"),
    }
}

#[test]
fn host_port_and_db() {
    let t = parse("redis://cache.internal:6380/2");
    assert_eq!((t.host.as_str(), t.port, t.db, t.tls), ("cache.internal", 6380, 2, false));
    assert_eq!((t.user, t.password), (None, None));
    let t = parse("redis://10.0.0.7");
    assert_eq!((t.host.as_str(), t.port, t.db), ("10.0.0.7", DEFAULT_PORT, 0));
    assert_eq!(parse("redis://h:1/").db, 0);
    assert_eq!(parse("redis://h:65535/4294967295").port, 65535);
    assert_eq!(parse("redis://h:65535/4294967295").db, u32::MAX);
    assert_eq!(parse("REDIS://h:7").port, 7);
}

#[test]
fn tls_and_ipv6() {
    let t = parse("rediss://[::1]:6390/1");
    assert_eq!((t.host.as_str(), t.port, t.db, t.tls), ("::1", 6390, 1, true));
    assert_eq!(t.addr(), "[::1]:6390");
    assert_eq!(parse("rediss://[fe80::1]").port, DEFAULT_PORT);
}

#[test]
fn credentials() {
    let t = parse("redis://router:s3cret@h:1");
    assert_eq!((t.user.as_deref(), t.password.as_deref()), (Some("router"), Some("s3cret")));
    let t = parse("redis://:s3cret@h:1");
    assert_eq!((t.user.as_deref(), t.password.as_deref()), (None, Some("s3cret")));
    // A user alone: the password may come from a file.
    let t = parse("redis://router@h:1");
    assert_eq!((t.user.as_deref(), t.password.as_deref()), (Some("router"), None));
    // Percent-encoded, including '@', ':' and '/', and a non-ASCII character.
    let t = parse("redis://r%40uter:p%3Aa%2Fss%40%25w%C3%B6rd@h:1/3");
    assert_eq!((t.user.as_deref(), t.password.as_deref()), (Some("r@uter"), Some("p:a/ss@%wörd")));
    assert_eq!(t.db, 3);
    // An unencoded '@' in the password: the last '@' ends the credentials.
    assert_eq!(parse("redis://:a@b@h:1").password.as_deref(), Some("a@b"));
}

#[test]
fn bad_urls_are_refused_with_a_reason() {
    assert!(refused("http://h:1").contains("scheme"));
    assert!(refused("h:6379").contains("scheme"));
    assert!(refused("unix:///tmp/redis.sock").contains("scheme"));
    assert!(refused("redis://").contains("host is empty"));
    assert!(refused("redis://:1").contains("host is empty"));
    assert!(refused("redis://h:").contains("port must be a number"));
    assert!(refused("redis://h:0").contains("1..=65535"));
    assert!(refused("redis://h:65536").contains("1..=65535"));
    assert!(refused("redis://h:x1").contains("number"));
    assert!(refused("redis://h:-1").contains("number"));
    assert!(refused("redis://h:1/x").contains("database number"));
    assert!(refused("redis://h:1/-1").contains("database number"));
    assert!(refused("redis://h:1/4294967296").contains("out of range"));
    assert!(refused("redis://h:1/0/1").contains("database number"));
    assert!(refused("redis://h:1?db=2").contains("query"));
    assert!(refused("redis://:p%zz@h:1").contains("password"));
    assert!(refused("redis://:p%ff@h:1").contains("password"));
    assert!(refused("redis://:p%4@h:1").contains("password"));
    assert!(refused("redis://[::1:1").contains("']'"));
    assert!(refused("redis://[nothost]:1").contains("IPv6"));
    assert!(refused("redis://[::1]1").contains("':'"));
    assert!(refused("redis://h h:1").contains("host"));
    assert!(refused("redis://a:b:c").contains("number"));
}

#[test]
fn display_and_debug_never_show_the_password() {
    for (url, shown) in [
        ("redis://router:s3cret@h:1/2", "redis://router:***@h:1/2"),
        ("rediss://:s3cret@[::1]:1", "rediss://:***@[::1]:1"),
        ("redis://router@h:1", "redis://router@h:1"),
        ("redis://h", "redis://h:6379"),
    ] {
        let t = parse(url);
        assert_eq!(t.to_string(), shown);
        let debug = format!("{t:?}");
        assert!(!debug.contains("s3cret"), "{debug}");
    }
}

#[test]
fn the_password_file_is_trimmed_and_replaces_the_urls() {
    let dir = std::env::temp_dir().join(format!("shared-state-target-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("password");
    std::fs::write(&file, "  from-file\n").unwrap();
    let t = parse("redis://router:from-url@h:1").with_password_file(&file).unwrap();
    assert_eq!((t.user.as_deref(), t.password.as_deref()), (Some("router"), Some("from-file")));
    std::fs::write(&file, "\n \n").unwrap();
    let e = parse("redis://h:1").with_password_file(&file).unwrap_err();
    assert!(matches!(&e, Error::PasswordFile { why, .. } if why == "empty"), "{e}");
    std::fs::write(&file, b"\xff\xfe").unwrap();
    assert!(parse("redis://h:1").with_password_file(&file).is_err());
    let e = parse("redis://h:1").with_password_file(&dir.join("missing")).unwrap_err();
    assert_eq!(e.kind(), "password_file");
    assert!(e.to_string().contains("missing"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
