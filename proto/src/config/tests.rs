//! Tests of the loader: errors name file, line and key; bounds; the topology's checks.

use super::*;

const GOOD: &str = r#"
[timing]
token-timeout-us = 2000

[[switch]]
name = "tm0"
[[switch]]
name = "tm1"

[[host]]
name = "alpha"
switch = "tm0"
[[host]]
name = "beta"
switch = "tm1"

[[trunk]]
between = ["tm0", "tm1"]
"#;

#[test]
fn good_config_builds_a_topology() {
    let c = ClusterConfig::parse(GOOD, "good.toml").unwrap();
    assert_eq!(c.host_names, ["alpha", "beta"]);
    assert_eq!(c.timing.token_timeout_us, 2000);
    assert_eq!(c.timing.epoch_pulses, Timing::default().epoch_pulses);
    assert_eq!(c.topology.distance(0, 1), 2);
}

#[test]
fn unknown_key_names_file_line_and_key() {
    let text = GOOD.replace("token-timeout-us", "token-timeout-ms");
    let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
    assert_eq!(
        (e.file.as_str(), e.line, e.key.as_str()),
        ("c.toml", 3, "timing.token-timeout-ms")
    );
    assert!(e.to_string().starts_with("c.toml:3:"), "{e}");
}

#[test]
fn unknown_keys_are_named_by_their_dotted_path() {
    // (text, line, column, key): arrays of tables, tables, dotted keys, inline tables,
    // sub-tables, the top level.
    let cases = [
        (
            GOOD.replace("name = \"tm1\"", "name = \"tm1\"\nlisen = \"x\""),
            9,
            1,
            "switch.lisen",
        ),
        (
            GOOD.replace("[timing]", "[timing]\nbogus = 1"),
            3,
            1,
            "timing.bogus",
        ),
        (format!("limits.bogus = 1\n{GOOD}"), 1, 8, "limits.bogus"),
        (
            format!("transport = {{ kind = \"udp\", colour = 1 }}\n{GOOD}"),
            1,
            29,
            "transport.colour",
        ),
        (
            format!("{GOOD}[transport.extra]\nx = 1\n"),
            19,
            12,
            "transport.extra",
        ),
        (
            format!("{GOOD}[[host]]\nname = \"g\"\nswitch = \"tm0\"\nsui = \"x\"\n"),
            22,
            1,
            "host.sui",
        ),
        (format!("mapp = \"m\"\n{GOOD}"), 1, 1, "mapp"),
        // Keys that are not bare are named as TOML spells them (found by the fuzzer: an
        // empty key gave "c.toml:1:1: : unknown field ``").
        (format!("\"\" = 1\n{GOOD}"), 1, 1, "\"\""),
        (
            GOOD.replace("[timing]", "[timing]\n\"a b\" = 1"),
            3,
            1,
            "timing.\"a b\"",
        ),
    ];
    for (text, line, column, key) in cases {
        let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
        assert_eq!(
            (e.line, e.column, e.key.as_str()),
            (line, column, key),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with(&format!("c.toml:{line}:{column}: {key}: unknown field")),
            "{e}"
        );
    }
}

#[test]
fn missing_and_mistyped_values_are_named_by_their_dotted_path() {
    let e = ClusterConfig::parse(&format!("{GOOD}[[switch]]\n"), "c.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (19, "switch.name"), "{e}");
    assert!(e.message.contains("missing field"), "{e}");
    let text = GOOD.replace("name = \"beta\"", "name = 7");
    let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (14, "host.name"), "{e}");
    let text = GOOD.replace("token-timeout-us = 2000", "token-timeout-us = \"fast\"");
    let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
    assert_eq!(
        (e.line, e.key.as_str()),
        (3, "timing.token-timeout-us"),
        "{e}"
    );
    // A syntax error is not about a key.
    let e = ClusterConfig::parse("[[switch]\n", "c.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (1, "-"), "{e}");
}

#[test]
fn unknown_switch_names_the_host_line() {
    let text = GOOD.replace("switch = \"tm1\"", "switch = \"tm9\"");
    let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (15, "host.switch"), "{e}");
    assert!(e.message.contains("tm9"));
}

#[test]
fn a_trunk_from_a_switch_to_itself_is_refused_at_its_line() {
    let text = GOOD.replace(
        "between = [\"tm0\", \"tm1\"]",
        "between = [\"tm0\", \"tm0\"]",
    );
    let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (18, "trunk.between"), "{e}");
    assert!(e.message.contains("not `tm0` to itself"), "{e}");
}

/// `switches` switches `s0`.. with one host each (`h0`..), then the trunks given by index.
fn graph(switches: usize, trunks: &[(usize, usize)]) -> String {
    let mut t = String::new();
    for s in 0..switches {
        t +=
            &format!("[[switch]]\nname = \"s{s}\"\n[[host]]\nname = \"h{s}\"\nswitch = \"s{s}\"\n");
    }
    for (a, b) in trunks {
        t += &format!("[[trunk]]\nbetween = [\"s{a}\", \"s{b}\"]\n");
    }
    t
}

/// The 1-based line of the `n`-th (from 0) line of `text` that starts with `prefix`.
fn line_of(text: &str, prefix: &str, n: usize) -> usize {
    let mut lines = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.starts_with(prefix));
    lines.nth(n).map(|(i, _)| i + 1).expect("the line is there")
}

#[test]
fn a_cycle_of_trunks_is_refused_at_the_trunk_that_closes_it_naming_the_cycle() {
    // A tree 0-1, 1-2, 2-3 plus 3-1: the fourth trunk closes 3 - 2 - 1 - 3.
    let text = graph(4, &[(0, 1), (1, 2), (2, 3), (3, 1)]);
    let e = ClusterConfig::parse(&text, "ring.toml").unwrap_err();
    assert_eq!(
        (e.line, e.column, e.key.as_str()),
        (line_of(&text, "between", 3), 11, "trunk.between"),
        "{e}"
    );
    assert!(
        e.message
            .starts_with("this trunk closes the cycle `s3` - `s2` - `s1` - `s3`"),
        "{e}"
    );
    assert!(e.message.contains("remove a trunk of the cycle"), "{e}");
    assert!(e.to_string().starts_with("ring.toml:"), "{e}");
    // The same trunk listed twice is a cycle of two.
    let text = graph(3, &[(0, 1), (1, 2), (2, 1)]);
    let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
    assert_eq!(
        (e.line, e.key.as_str()),
        (line_of(&text, "between", 2), "trunk.between"),
        "{e}"
    );
    assert!(e.message.contains("listed twice"), "{e}");
    // Without the closing trunk, it loads.
    ClusterConfig::parse(&graph(4, &[(0, 1), (1, 2), (2, 3)]), "c.toml").unwrap();
}

#[test]
fn a_switch_no_trunk_reaches_is_refused_at_its_line_naming_its_hosts() {
    // s2 and its host h2 hang off nothing.
    let text = graph(3, &[(0, 1)]);
    let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
    assert_eq!(
        (e.line, e.key.as_str()),
        (line_of(&text, "name = \"s2\"", 0), "switch.name"),
        "{e}"
    );
    assert!(
        e.message
            .starts_with("switch `s2` and its hosts `h2` cannot be reached: no path of trunks"),
        "{e}"
    );
    // Two switches joined to each other, apart from s0: the first one unreachable is named.
    let text = graph(3, &[(1, 2)]);
    let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
    assert!(
        e.message.starts_with("switch `s1` and its hosts `h1`"),
        "{e}"
    );
}

#[test]
fn a_host_named_like_a_switch_is_refused() {
    let text = GOOD.replace("name = \"beta\"", "name = \"tm0\"");
    let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (14, "host.name"), "{e}");
    assert!(e.message.contains("`tm0` names a switch too"), "{e}");
}

#[test]
fn an_empty_cluster_is_refused_naming_what_is_missing() {
    let e = ClusterConfig::parse("", "c.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (1, "switch"), "{e}");
    let e = ClusterConfig::parse("[[switch]]\nname = \"a\"\n", "c.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (1, "host"), "{e}");
    assert!(e.message.contains("[[host]]"), "{e}");
}

#[test]
fn a_long_line_gets_an_epoch_and_window_sized_for_its_distance_unless_written() {
    // 40 switches in a line: the largest logical distance is 40.
    let trunks: Vec<(usize, usize)> = (1..40).map(|s| (s - 1, s)).collect();
    let text = graph(40, &trunks);
    let c = ClusterConfig::parse(&text, "long.toml").unwrap();
    assert_eq!(c.topology.max_distance(), 40);
    assert_eq!(c.timing.epoch_pulses, 80, "twice the distance");
    assert_eq!(c.limits.pulses_ahead_max, 2 * 40 + PULSES_AHEAD_SLACK);
    assert_eq!(c.timing, Timing::sized_for(&c.topology));
    assert_eq!(c.limits, Limits::sized_for(&c.topology));
    check_bounds(&c.timing, &c.limits, &c.topology).unwrap();
    // Written too small, each is refused at its line, saying which values work.
    for (key, value, allowed) in [
        (
            "epoch-pulses",
            40,
            "allowed 41..=65536 (more than the largest logical distance, 40",
        ),
        (
            "pulses-ahead-max",
            80,
            "allowed 81..=65536 (more than twice the largest logical distance, 40",
        ),
    ] {
        let table = if key == "epoch-pulses" {
            "timing"
        } else {
            "limits"
        };
        let e = ClusterConfig::parse(&format!("[{table}]\n{key} = {value}\n{text}"), "long.toml")
            .unwrap_err();
        assert_eq!(
            (e.line, e.key.clone()),
            (2, format!("{table}.{key}")),
            "{e}"
        );
        assert!(e.message.contains(allowed), "{e}");
    }
    // A small topology keeps the plain defaults.
    let c = ClusterConfig::parse(GOOD, "c.toml").unwrap();
    assert_eq!(c.timing.epoch_pulses, Timing::default().epoch_pulses);
    assert_eq!(c.limits, Limits::default());
}

#[test]
fn epoch_shorter_than_the_network_is_refused() {
    let text = GOOD.replace("token-timeout-us = 2000", "epoch-pulses = 2");
    let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
    assert_eq!(e.key, "timing.epoch-pulses", "{e}");
}

const ADDRS: &str = r#"
map = "forks.map"

[transport]
kind = "udp"

[[switch]]
name = "tm0"
listen = "127.0.0.1:7000"

[[host]]
name = "alpha"
switch = "tm0"
siu = "127.0.0.1:7100"
app = "127.0.0.1:7200"
[[host]]
name = "beta"
switch = "tm0"
"#;

#[test]
fn addresses_transport_and_map_are_read() {
    let c = ClusterConfig::parse(ADDRS, "a.toml").unwrap();
    assert_eq!(c.switch_listen, [Some("127.0.0.1:7000".parse().unwrap())]);
    assert_eq!(c.host_siu[0], Some("127.0.0.1:7100".parse().unwrap()));
    assert_eq!(c.host_app, [Some("127.0.0.1:7200".parse().unwrap()), None]);
    assert_eq!(c.transport.kind, TransportKind::Udp);
    assert_eq!(c.map_file, Some(PathBuf::from("forks.map")));
    assert_eq!((c.switch_id("tm0"), c.host_id("beta")), (Some(0), Some(1)));
    assert_eq!(c.host_id("zeta"), None);
}

#[test]
fn bad_address_names_line_and_key() {
    let text = ADDRS.replace("127.0.0.1:7100", "localhost");
    let e = ClusterConfig::parse(&text, "a.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (14, "host.siu"), "{e}");
    assert!(e.to_string().starts_with("a.toml:14:"), "{e}");
}

#[test]
fn duplicate_address_is_refused() {
    let text = ADDRS.replace("127.0.0.1:7200", "127.0.0.1:7000");
    let e = ClusterConfig::parse(&text, "a.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (15, "host.app"), "{e}");
}

#[test]
fn unknown_transport_kind_is_refused() {
    let text = ADDRS.replace("kind = \"udp\"", "kind = \"tcp\"");
    let e = ClusterConfig::parse(&text, "a.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (5, "transport.kind"), "{e}");
    assert!(e.message.contains("tcp"), "{e}");
}

#[test]
fn unknown_host_key_is_refused() {
    let text = ADDRS.replace("app = ", "application = ");
    let e = ClusterConfig::parse(&text, "a.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (15, "host.application"), "{e}");
}

#[test]
fn transport_defaults_to_quic_with_the_default_tag() {
    let c = ClusterConfig::parse(GOOD, "c.toml").unwrap();
    assert_eq!(c.transport, TransportConfig::default());
    assert_eq!(c.transport.kind, TransportKind::Quic);
    assert_eq!(c.transport.tag, DEFAULT_TAG);
    let (key, msg) = c.quic_files("alpha").unwrap_err();
    assert_eq!(key, "transport.ca");
    assert!(msg.contains("udp"), "{msg}");
}

const QUIC: &str = r#"
[transport]
kind = "quic"
tag = "0x1507_ac40_0000_0002"
ca = "pki/ca.pem"
certs = "pki"

[[switch]]
name = "tm0"
listen = "127.0.0.1:7000"
admin = "127.0.0.1:7070"

[[host]]
name = "alpha"
switch = "tm0"
siu = "127.0.0.1:7100"
app = "127.0.0.1:7200"
admin = "127.0.0.1:7071"
[[host]]
name = "beta"
switch = "tm0"
"#;

#[test]
fn quic_keys_tag_and_admin_addresses_are_read() {
    let c = ClusterConfig::parse(QUIC, "q.toml").unwrap();
    assert_eq!(c.transport.kind, TransportKind::Quic);
    assert_eq!(c.transport.tag, 0x1507_AC40_0000_0002);
    assert_eq!(c.transport.ca, Some(PathBuf::from("pki/ca.pem")));
    let f = c.quic_files("alpha").unwrap();
    assert_eq!(f.cert, PathBuf::from("pki/alpha.pem"));
    assert_eq!(f.key, PathBuf::from("pki/alpha.key"));
    assert_eq!(c.switch_admin, [Some("127.0.0.1:7070".parse().unwrap())]);
    assert_eq!(
        c.host_admin,
        [Some("127.0.0.1:7071".parse().unwrap()), None]
    );
    // A node name that is not a plain file name cannot name a certificate.
    assert_eq!(c.quic_files("../x").unwrap_err().0, "transport.certs");
    assert_eq!(c.quic_files("ca").unwrap_err().0, "transport.certs");
}

#[test]
fn quic_paths_are_relative_to_the_config_file() {
    let dir = std::env::temp_dir().join(format!("isotach-proto-cfg-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("q.toml");
    std::fs::write(&file, QUIC).unwrap();
    let c = ClusterConfig::load(&file).unwrap();
    assert_eq!(c.transport.ca, Some(dir.join("pki/ca.pem")));
    assert_eq!(c.quic_files("tm0").unwrap().key, dir.join("pki/tm0.key"));
    // Absolute paths are taken as they are.
    let elsewhere = std::env::temp_dir().join("isotach-elsewhere/pki");
    let text = QUIC
        .replace("\"pki/ca.pem\"", &format!("{:?}", elsewhere.join("ca.pem")))
        .replace("\"pki\"", &format!("{elsewhere:?}"));
    std::fs::write(&file, text).unwrap();
    let c = ClusterConfig::load(&file).unwrap();
    assert_eq!(c.transport.ca, Some(elsewhere.join("ca.pem")));
    assert_eq!(c.quic_files("tm0").unwrap().key, elsewhere.join("tm0.key"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn tags_parse_as_integers_decimal_or_hex_strings() {
    for (v, want) in [
        ("7", 7u64),
        ("\"42\"", 42),
        ("\"0xFF\"", 255),
        ("\"0x1507_AC40_0000_0001\"", DEFAULT_TAG),
        ("\"18446744073709551614\"", u64::MAX - 1),
    ] {
        let text = QUIC.replace("\"0x1507_ac40_0000_0002\"", v);
        let c = ClusterConfig::parse(&text, "q.toml").unwrap_or_else(|e| panic!("{v}: {e}"));
        assert_eq!(c.transport.tag, want, "{v}");
    }
    for v in [
        "0",
        "-1",
        "\"0x\"",
        "\"zz\"",
        "\"0x1_0000_0000_0000_0000\"",
        "\"0xffffffffffffffff\"",
        "true",
    ] {
        let text = QUIC.replace("\"0x1507_ac40_0000_0002\"", v);
        let e = ClusterConfig::parse(&text, "q.toml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (4, "transport.tag"), "{v}: {e}");
    }
}

#[test]
fn bad_quic_keys_name_line_and_key() {
    let e = ClusterConfig::parse(&QUIC.replace("\"pki\"", "\" \""), "q.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (6, "transport.certs"), "{e}");
    let text = QUIC.replace("\"pki/ca.pem\"", "\"~/.isotach/pki/ca.pem\"");
    let e = ClusterConfig::parse(&text, "q.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (5, "transport.ca"), "{e}");
    assert!(e.message.contains("absolute path"), "{e}");
    let e =
        ClusterConfig::parse(&QUIC.replace("ca = ", "cert-authority = "), "q.toml").unwrap_err();
    assert_eq!(
        (e.line, e.key.as_str()),
        (5, "transport.cert-authority"),
        "{e}"
    );
}

#[test]
fn bad_or_duplicate_admin_address_is_refused() {
    let text = QUIC.replace("127.0.0.1:7071", "nowhere");
    let e = ClusterConfig::parse(&text, "q.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (18, "host.admin"), "{e}");
    let text = QUIC.replace("127.0.0.1:7071", "127.0.0.1:7070");
    let e = ClusterConfig::parse(&text, "q.toml").unwrap_err();
    assert_eq!((e.line, e.key.as_str()), (18, "host.admin"), "{e}");
    // Admin is TCP: it may share an address with a UDP link.
    let text = QUIC.replace("127.0.0.1:7071", "127.0.0.1:7100");
    ClusterConfig::parse(&text, "q.toml").unwrap();
}

#[test]
fn unspecified_addresses_are_warned_about_naming_node_and_key() {
    let (_, w) = ClusterConfig::parse_checked(QUIC, "q.toml").unwrap();
    assert!(w.is_empty(), "{w:?}");
    let text = QUIC
        .replace("127.0.0.1:7000", "0.0.0.0:7000")
        .replace("127.0.0.1:7200", "[::]:7200")
        .replace("127.0.0.1:7071", "0.0.0.0:7071");
    let (c, w) = ClusterConfig::parse_checked(&text, "q.toml").unwrap();
    assert_eq!(c, ClusterConfig::parse(&text, "q.toml").unwrap());
    let got: Vec<_> = w
        .iter()
        .map(|w| (w.line, w.key.as_str(), w.node.as_str(), w.addr.to_string()))
        .collect();
    assert_eq!(
        got,
        [
            (10, "switch.listen", "tm0", "0.0.0.0:7000".to_string()),
            (17, "host.app", "alpha", "[::]:7200".to_string()),
            (18, "host.admin", "alpha", "0.0.0.0:7071".to_string()),
        ]
    );
    let first = w[0].to_string();
    assert!(
        first.starts_with(
            "q.toml:10:10: switch.listen: switch `tm0` would listen on every interface"
        ),
        "{first}"
    );
    assert!(w[2].message.contains("no authentication"), "{}", w[2]);
}

/// One switch, one host: the largest logical distance is 1 and the TM has one link, so the
/// topology sets no bound tighter than [`BOUNDS`].
const TINY: &str = "[[switch]]\nname = \"tm0\"\n[[host]]\nname = \"h\"\nswitch = \"tm0\"\n";

/// `key = value` in its table, on line 2, before [`TINY`]. With `idle-pace-us` the token
/// timeout is the largest allowed, so every pace within its own bounds is below it.
fn with(key: &str, value: &str) -> String {
    let (table, name) = key.split_once('.').unwrap();
    let timeout = if key == "timing.idle-pace-us" {
        format!("token-timeout-us = {TOKEN_TIMEOUT_US_MAX}\n")
    } else {
        String::new()
    };
    format!("[{table}]\n{name} = {value}\n{timeout}{TINY}")
}

#[test]
fn every_bound_admits_its_range_and_refuses_one_beyond_naming_key_value_and_range() {
    assert_eq!(
        BOUNDS.map(|b| b.key),
        [
            "timing.token-timeout-us",
            "timing.epoch-pulses",
            "timing.idle-pace-us",
            "limits.channels",
            "limits.isochron-messages-max",
            "limits.pulses-ahead-max",
            "limits.queue-packets-max",
            "limits.isochron-open-us-max",
            "transport.tag",
            "transport.spin-us",
        ]
    );
    for b in BOUNDS {
        // Only idle pacing and spinning have a meaningful 0 (off).
        assert!(
            (b.min >= 1 || ["timing.idle-pace-us", "transport.spin-us"].contains(&b.key))
                && b.min < b.max,
            "{b:?}"
        );
        // Tags beyond i64 are written as strings.
        let lit = |v: u64| match i64::try_from(v) {
            Ok(v) if b.key != "transport.tag" => v.to_string(),
            _ => format!("\"{v}\""),
        };
        for v in [b.min, b.max] {
            let c = ClusterConfig::parse(&with(b.key, &lit(v)), "b.toml")
                .unwrap_or_else(|e| panic!("{}: {v}: {e}", b.key));
            let got = match b.key {
                "timing.token-timeout-us" => c.timing.token_timeout_us,
                "timing.epoch-pulses" => u64::from(c.timing.epoch_pulses),
                "timing.idle-pace-us" => c.timing.idle_pace_us,
                "limits.channels" => u64::from(c.limits.channels),
                "limits.isochron-messages-max" => u64::from(c.limits.isochron_messages_max),
                "limits.pulses-ahead-max" => u64::from(c.limits.pulses_ahead_max),
                "limits.queue-packets-max" => c.limits.queue_packets_max as u64,
                "limits.isochron-open-us-max" => c.limits.isochron_open_us_max,
                "transport.spin-us" => c.transport.spin_us,
                _ => c.transport.tag,
            };
            assert_eq!(got, v, "{} taken as written", b.key);
        }
        // Below 0 is a negative literal (checked in the next test).
        for v in b.min.checked_sub(1).into_iter().chain([b.max + 1]) {
            let e = ClusterConfig::parse(&with(b.key, &lit(v)), "b.toml").unwrap_err();
            // The value, after `name = `.
            let column = b.key.split_once('.').unwrap().1.len() + 4;
            assert_eq!(
                (e.line, e.column, e.key.as_str()),
                (2, column, b.key),
                "{e}"
            );
            let (value, range) = (v.to_string(), format!("allowed {}..={}", b.min, b.max));
            let hex = format!("{v:#x}");
            assert!(
                (e.message.contains(&value) || e.message.contains(&hex))
                    && e.message.contains(&range),
                "{e}"
            );
            assert!(e.to_string().starts_with("b.toml:2:"), "{e}");
        }
    }
}

#[test]
fn negative_and_huge_values_get_the_range_error_too() {
    for (key, v) in [
        ("limits.channels", "-1"),
        ("limits.channels", "300"),
        ("limits.queue-packets-max", "9223372036854775807"),
        ("timing.token-timeout-us", "-5000"),
        ("timing.idle-pace-us", "-1"),
        ("transport.tag", "-1"),
    ] {
        let e = ClusterConfig::parse(&with(key, v), "b.toml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (2, key), "{e}");
        assert!(
            e.message.contains(v) && e.message.contains("is out of range: allowed"),
            "{e}"
        );
    }
}

#[test]
fn the_topology_tightens_the_lower_bounds() {
    // GOOD: the largest logical distance is 2; each TM has one host and one trunk.
    for (key, refused, admitted, why) in [
        ("timing.epoch-pulses", 2, 3, "largest logical distance, 2"),
        (
            "limits.pulses-ahead-max",
            4,
            5,
            "twice the largest logical distance, 2",
        ),
        (
            "limits.queue-packets-max",
            3,
            4,
            "links of the busiest TM, 2",
        ),
    ] {
        let (table, name) = key.split_once('.').unwrap();
        let text = |v: u32| format!("{GOOD}[{table}]\n{name} = {v}\n");
        let text = |v| {
            // GOOD already has a [timing] table.
            if table == "timing" {
                GOOD.replace("token-timeout-us = 2000", &format!("{name} = {v}"))
            } else {
                text(v)
            }
        };
        let e = ClusterConfig::parse(&text(refused), "c.toml").unwrap_err();
        assert_eq!(e.key, key, "{e}");
        let b = bound(key);
        let range = format!("allowed {admitted}..={}", b.max);
        assert!(
            e.message
                .starts_with(&format!("{refused} is out of range: {range} (")),
            "{e}"
        );
        assert!(e.message.contains(why), "{e}");
        // The error points at the value when it is written.
        let line = text(refused)
            .lines()
            .position(|l| l.starts_with(name))
            .unwrap()
            + 1;
        assert_eq!(e.line, line, "{e}");
        ClusterConfig::parse(&text(admitted), "c.toml").unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn defaults_are_within_bounds() {
    let c = ClusterConfig::generated(8, 4).unwrap();
    check_bounds(&c.timing, &c.limits, &c.topology).unwrap();
    assert!((TAG_MIN..=TAG_MAX).contains(&DEFAULT_TAG));
    let l = Limits {
        pulses_ahead_max: 0,
        ..Limits::default()
    };
    let (key, msg) = check_bounds(&c.timing, &l, &c.topology).unwrap_err();
    assert_eq!(key, "limits.pulses-ahead-max", "{msg}");
}

#[test]
fn idle_pace_must_be_at_most_half_the_token_timeout_or_zero() {
    let c = ClusterConfig::parse(GOOD, "c.toml").unwrap();
    assert_eq!(
        c.timing.idle_pace_us, 1_000,
        "the default, below the 2000 µs timer"
    );
    let pace = |v: &str| GOOD.replace("[timing]\n", &format!("[timing]\nidle-pace-us = {v}\n"));
    for ok in ["0", "1", "1000"] {
        let c = ClusterConfig::parse(&pace(ok), "c.toml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.timing.idle_pace_us.to_string(), ok);
    }
    for bad in ["1001", "2000", "5000"] {
        let e = ClusterConfig::parse(&pace(bad), "c.toml").unwrap_err();
        assert_eq!((e.key.as_str(), e.line), ("timing.idle-pace-us", 3), "{e}");
        assert!(
            e.message.starts_with(&format!(
                "{bad} must be below timing.token-timeout-us (2000) by half of it at least \
                 (at most 1000), so the lost-token timer never fires on a paced wave"
            )) && e.message.contains("set 0 to turn idle pacing off"),
            "{e}"
        );
    }
    // Not written, it stays below a short timer: half of it.
    for (timeout, default) in [
        (800, 400),
        (100, 50),
        (2000, 1000),
        (5_000, 2500),
        (10_000, 5000),
        (20_000, 5000),
    ] {
        let text = GOOD.replace("2000", &timeout.to_string());
        let c = ClusterConfig::parse(&text, "c.toml").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(c.timing.idle_pace_us, default, "timer {timeout}");
    }
    // The in-memory check refuses what the loader refuses.
    let t = Timing {
        token_timeout_us: 800,
        ..Timing::default()
    };
    let (key, _) = check_bounds(&t, &Limits::default(), &c.topology).unwrap_err();
    assert_eq!(key, "timing.idle-pace-us");
    let off = Timing {
        idle_pace_us: 0,
        ..t
    };
    check_bounds(&off, &Limits::default(), &c.topology).unwrap();
}

#[test]
fn zero_timeout_is_refused() {
    let text = GOOD.replace("2000", "0");
    let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
    assert_eq!(e.key, "timing.token-timeout-us");
}

mod examples {
    use super::*;

    #[test]
    fn example_configs_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
        let mut parsed = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let c = ClusterConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
                assert!(c.topology.host_count() > 0);
                parsed += 1;
            }
        }
        assert!(parsed > 0, "no example configs in {}", dir.display());
    }
}
