#[test]
fn private_loopback_and_metadata_addresses_are_never_fetched() {
    for ip in [
        "127.0.0.1",
        "10.1.2.3",
        "172.16.0.1",
        "192.168.1.1",
        "169.254.169.254",
        "100.64.0.1",
        "0.0.0.0",
        "::1",
        "fe80::1",
        "fd00::1",
        "::ffff:127.0.0.1",
        "0.1.2.3",
        "192.0.0.8",
        "198.18.0.1",
        "192.0.2.1",
        "240.0.0.1",
        "255.255.255.255",
        "::127.0.0.1",
        "64:ff9b::a9fe:a9fe",
        "64:ff9b::7f00:1",
        "64:ff9b:1::1",
        "2002:7f00:1::",
        "2002:a9fe:a9fe::1",
        "2001:0:4136:e378::1",
        "2001:db8::1",
        "fec0::1",
        "100::1",
        "::ffff:0:7f00:1",
    ] {
        assert!(forbidden_ip(ip.parse().expect("ip")), "{ip}");
    }
    assert!(!forbidden_ip("2002:5db8:d822::1".parse().expect("ip")), "6to4 of a public address");
    for ip in ["93.184.216.34", "2606:2800:220:1:248:1893:25c8:1946"] {
        assert!(!forbidden_ip(ip.parse().expect("ip")), "{ip}");
    }
    // Development lets private addresses through, never link-local ones (cloud metadata).
    for ip in ["169.254.169.254", "fe80::1", "::ffff:169.254.169.254"] {
        assert!(always_refused(ip.parse().expect("ip")).is_some(), "{ip}");
    }
    for ip in ["127.0.0.1", "10.1.2.3", "::1", "fd00::1"] {
        assert!(always_refused(ip.parse().expect("ip")).is_none(), "{ip}");
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("ip")
}

/// The entry that refuses `text`, asserting it is refused in production and in development
/// with a message that names the entry.
fn refused_everywhere(text: &str) -> AlwaysRefused {
    let hit = always_refused(ip(text)).unwrap_or_else(|| panic!("{text}: not always refused"));
    assert!(forbidden_ip(ip(text)), "{text}");
    for dev in [false, true] {
        let why = refusal(&[ip(text)], dev).unwrap_or_else(|| panic!("{text}: allowed, dev {dev}"));
        assert!(why.contains(hit.what), "{text}, dev {dev}: {why}");
        assert!(why.starts_with(&ip(text).to_string()), "{text}, dev {dev}: {why}");
    }
    hit
}

#[test]
fn every_link_local_and_metadata_entry_is_refused_in_production_and_development() {
    // One address per entry, with the entry it must match: removing an entry lets its
    // address through or names a broader entry, and the case fails.
    let cases = [
        ("169.254.169.254", "169.254.169.254/32", "cloud metadata address (AWS, GCP, Azure"),
        ("169.254.170.2", "169.254.170.2/32", "ECS"),
        ("169.254.170.23", "169.254.170.23/32", "EKS Pod Identity"),
        ("169.254.0.23", "169.254.0.23/32", "Tencent"),
        ("169.254.42.42", "169.254.42.42/32", "Scaleway"),
        ("100.100.100.200", "100.100.100.200/32", "Alibaba"),
        ("192.0.0.192", "192.0.0.192/32", "Oracle"),
        ("168.63.129.16", "168.63.129.16/32", "Azure WireServer"),
        ("fd00:ec2::254", "fd00:ec2::254/128", "AWS IPv6 instance metadata"),
        ("fd00:ec2::23", "fd00:ec2::23/128", "EKS Pod Identity IPv6"),
        ("fd20:ce::254", "fd20:ce::254/128", "GCP IPv6"),
        ("fd00:c1::a9fe:a9fe", "fd00:c1::a9fe:a9fe/128", "OCI IPv6"),
        ("fd00:a9fe:a9fe::1", "fd00:a9fe:a9fe::1/128", "Linode"),
        ("fd00:42::42", "fd00:42::42/128", "Scaleway IPv6"),
        ("fe80::a9fe:a9fe", "fe80::a9fe:a9fe/128", "OpenStack IPv6"),
        ("169.254.1.1", "169.254.0.0/16", "IPv4 link-local"),
        ("169.254.255.254", "169.254.0.0/16", "IPv4 link-local"),
        ("fe80::1", "fe80::/10", "IPv6 link-local"),
        ("febf:ffff::1", "fe80::/10", "IPv6 link-local"),
    ];
    for (text, net, what) in cases {
        let hit = refused_everywhere(text);
        assert_eq!(hit.net.to_string(), net, "{text}");
        assert!(hit.what.contains(what), "{text}: {}", hit.what);
        assert!(hit.via.is_none(), "{text}");
    }
    // Every entry has its case, so a new entry comes with one.
    for (what, net) in ALWAYS_REFUSED {
        assert!(cases.iter().any(|(_, n, _)| *n == net.to_string()), "no case for {what}");
    }
    // The message names the entry, as the client reads it.
    assert_eq!(
        refusal(&[ip("169.254.169.254")], true).as_deref(),
        Some(
            "169.254.169.254 is a cloud metadata address (AWS, GCP, Azure, OCI, OpenStack, \
             DigitalOcean, Akamai…), which is never fetched (refused range 169.254.169.254/32)"
        )
    );
    // A metadata address among public ones is named, whatever its place.
    let why = refusal(&[ip("93.184.216.34"), ip("10.0.0.1"), ip("fd00:ec2::254")], false);
    assert!(why.is_some_and(|w| w.starts_with("fd00:ec2::254 is the AWS IPv6")));
    // Just outside an entry is not that entry.
    for text in ["169.253.255.255", "169.255.0.0", "100.100.100.201", "192.0.0.193", "fec0::1"] {
        assert!(always_refused(ip(text)).is_none(), "{text}");
    }
}

#[test]
fn ipv4_inside_every_ipv6_form_is_judged_as_the_ipv4_address() {
    // 169.254.169.254 = a9fe:a9fe, 100.100.100.200 = 6464:64c8, 169.254.170.2 = a9fe:aa02;
    // Teredo carries its client inverted (!a9fe = 5601).
    let metadata = [
        ("::ffff:169.254.169.254", "IPv4-mapped", "169.254.169.254"),
        ("::ffff:0:a9fe:a9fe", "IPv4-translated", "169.254.169.254"),
        ("::169.254.169.254", "IPv4-compatible", "169.254.169.254"),
        ("64:ff9b::a9fe:a9fe", "NAT64", "169.254.169.254"),
        ("64:ff9b:1:a9fe:a9:fe00::", "local-use NAT64 /48", "169.254.169.254"),
        ("64:ff9b:1:a9:fe:a9fe::", "local-use NAT64 /56", "169.254.169.254"),
        ("64:ff9b:1:0:a9:fea9:fe00:0", "local-use NAT64 /64", "169.254.169.254"),
        ("64:ff9b:1::a9fe:a9fe", "local-use NAT64 /96", "169.254.169.254"),
        ("2002:a9fe:a9fe::1", "6to4", "169.254.169.254"),
        ("2001:0:4136:e378:8000:63bf:5601:5601", "Teredo client", "169.254.169.254"),
        ("2001:0:a9fe:a9fe::1", "Teredo server", "169.254.169.254"),
        ("::ffff:100.100.100.200", "IPv4-mapped", "100.100.100.200"),
        ("2002:6464:64c8::1", "6to4", "100.100.100.200"),
        ("64:ff9b::a9fe:aa02", "NAT64", "169.254.170.2"),
        ("::ffff:169.254.7.7", "IPv4-mapped", "169.254.7.7"),
    ];
    for (text, form, v4) in metadata {
        let hit = refused_everywhere(text);
        let (got_form, got_v4) = hit.via.unwrap_or_else(|| panic!("{text}: matched directly"));
        assert_eq!((got_form, got_v4.to_string().as_str()), (form, v4), "{text}");
        assert!(hit.to_string().contains(&format!("carries {v4} ({form}), and {v4} is ")), "{hit}");
    }
    // Loopback and private addresses inside a form are refused in production and
    // allowed in development, like the IPv4 address itself.
    for text in [
        "::ffff:127.0.0.1",
        "::ffff:10.0.0.1",
        "::ffff:0:7f00:1",
        "::127.0.0.1",
        "64:ff9b::a00:1",
        "64:ff9b:1::a00:1",
        "2002:7f00:1::",
        "2002:c0a8:101::1",
        "2001:0:4136:e378:8000:63bf:f5ff:fffe",
    ] {
        assert!(forbidden_ip(ip(text)), "{text}");
        assert!(refusal(&[ip(text)], false).is_some(), "{text}: allowed in production");
        assert!(refusal(&[ip(text)], true).is_none(), "{text}: refused in development");
    }
    // A public address inside a form that is otherwise public stays allowed.
    for text in ["::ffff:93.184.216.34", "2002:5db8:d822::1"] {
        assert!(refusal(&[ip(text)], false).is_none(), "{text}");
    }
}

#[test]
fn public_addresses_pass_and_development_still_reaches_loopback_and_private_ones() {
    for text in ["93.184.216.34", "2606:4700::1111", "1.1.1.1", "2a00:1450:4001:80b::200e"] {
        assert!(!forbidden_ip(ip(text)), "{text}");
        assert_eq!(refusal(&[ip(text)], false), None, "{text}");
        assert_eq!(refusal(&[ip(text)], true), None, "{text}");
    }
    for text in
        ["127.0.0.1", "10.0.0.1", "192.168.1.1", "172.16.0.1", "::1", "fd00::1", "100.64.0.1"]
    {
        assert_eq!(
            refusal(&[ip(text)], false).as_deref(),
            Some(
                "the host resolves to a private, loopback or link-local address, which is \
                 never fetched"
            ),
            "{text}"
        );
        assert_eq!(refusal(&[ip(text)], true), None, "{text}: development reaches it");
    }
}

use super::*;

#[test]
fn pkce_accepts_only_the_matching_s256_verifier() {
    // RFC 7636 appendix B.
    let verifier = "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXk";
    assert!(pkce_matches(verifier, "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"));
    assert!(!pkce_matches(
        "dBjftJeZ4CVP-mB92K27uhbUJU1p1r_wW1gFWFOEjXX",
        "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"
    ));
    assert!(!pkce_matches("short", "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM"));
}

#[test]
fn redirect_uris_are_parsed_never_string_matched() {
    let ok = |u: &str| parse_redirect_uri(u).is_ok();
    assert!(ok("https://app.example.com/cb"));
    assert!(ok("http://127.0.0.1:33418/callback"));
    assert!(ok("http://[::1]:8080/cb"));
    assert!(ok("http://localhost/cb"));
    for bad in [
        "http://evil.example.com/cb",
        "http://localhost.evil.example/cb",
        "http://127.0.0.1.evil.example/cb",
        "https://app.example.com/cb#frag",
        "https://user:pass@app.example.com/cb",
        "https://app.example.com@evil.example/cb",
        "javascript:alert(1)",
        "https://",
        "not a url",
        "",
    ] {
        assert!(!ok(bad), "{bad}");
    }
    assert!(!ok(&format!("https://app.example.com/{}", "a".repeat(MAX_REDIRECT_URI_LEN))));
    // Loopback redirects may use any port at request time; nothing else may differ.
    assert!(redirect_matches("http://127.0.0.1/cb", "http://127.0.0.1:51234/cb"));
    assert!(!redirect_matches("http://127.0.0.1/cb", "http://127.0.0.1:51234/other"));
    assert!(!redirect_matches("http://127.0.0.1/cb", "http://localhost:51234/cb"));
    assert!(!redirect_matches("https://app.example.com/cb", "https://app.example.com:8443/cb"));
    assert!(!redirect_matches("https://app.example.com/cb", "https://app.example.com/cb?x=1"));
}

#[test]
fn client_names_are_display_text() {
    assert_eq!(display_name(Some("  Claude\u{202E}  \u{0007}Code "), "x"), "Claude  Code");
    assert_eq!(display_name(Some("\u{0000}"), "fallback"), "fallback");
    let tags: String =
        "x".chars().map(|c| char::from_u32(0xE0000 + c as u32).unwrap_or(c)).collect();
    assert_eq!(
        display_name(
            Some(&format!("Claude\u{FEFF}\u{2060}\u{00AD}{tags}\u{180E}\u{FE00} Desktop")),
            "x"
        ),
        "Claude Desktop"
    );
    assert_eq!(display_name(Some(&"n".repeat(500)), "x").chars().count(), MAX_CLIENT_NAME_CHARS);
}

#[test]
fn unknown_scopes_are_invalid() {
    assert!(check_scope(Some("bookings:read customers:read")).is_ok());
    assert_eq!(
        check_scope(Some("bookings:read admin:everything")).map_err(|e| e.error),
        Err("invalid_scope")
    );
    assert!(check_scope(None).is_ok());
}
