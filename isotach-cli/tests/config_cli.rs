//! `isotach check-config` through the built binary: the example config passes, and every bad
//! config or map exits 2 with one error line naming the file, the line and the key.

mod common;

use common::{isotach, scratch};
use std::path::{Path, PathBuf};

fn example() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples/cluster.toml")
}

/// Writes `text` to `name` in `dir`; returns its path as an argument.
fn write(dir: &Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.to_str().unwrap().to_string()
}

const GOOD: &str = r#"[timing]
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

[transport]
kind = "udp"
"#;

/// `isotach cert init` in `dir/pki` and `isotach cert issue` for each node.
fn make_pki(dir: &Path, ca_name: &str, nodes: &[&str]) {
    let pki = dir.join("pki");
    let pki = pki.to_str().unwrap();
    let out = isotach(&["cert", "init", "--dir", pki, "--name", ca_name, "--force"]);
    assert!(out.status.success(), "{out:?}");
    for n in nodes {
        let out = isotach(&["cert", "issue", "--dir", pki, "--node", n, "--force"]);
        assert!(out.status.success(), "{out:?}");
    }
}

const EXAMPLE_NODES: [&str; 6] = ["tm-a", "tm-b", "alpha", "beta", "gamma", "delta"];

/// Runs check-config and expects exit 2 with exactly one error line starting with
/// `file:line:`; returns that line.
fn refused(args: &[&str], file: &str, line: usize) -> String {
    let out = isotach(args);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "one error line: {stderr}");
    let want = format!("error: {file}:{line}:");
    assert!(stderr.starts_with(&want), "want {want}…, got {stderr}");
    stderr
}

#[test]
fn the_example_config_passes() {
    // The example is a QUIC config: it passes once its certificates exist (made here, in a
    // copy's directory, the way its header says).
    let dir = scratch("config");
    let f = write(
        &dir,
        "cluster.toml",
        &std::fs::read_to_string(example()).unwrap(),
    );
    let out = isotach(&["check-config", &f]);
    assert_eq!(out.status.code(), Some(2), "no certificates yet: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("transport.ca") && stderr.contains("cert init"),
        "{stderr}"
    );
    make_pki(&dir, "example", &EXAMPLE_NODES);
    let f = f.as_str();
    let out = isotach(&["check-config", f]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    for want in [
        "switches:",
        "hosts:",
        "trunks:",
        "max logical distance:",
        "epoch:",
        "window:",
        "transport:            quic (mutual TLS)",
        "6 node certificates ok",
        "spin:                 50 us",
    ] {
        assert!(text.contains(want), "{want} missing in {text}");
    }

    let out = isotach(&["check-config", f, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert_eq!(stdout.lines().count(), 1, "one JSON object: {stdout}");
    let v: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(v["switches"], 2);
    assert_eq!(v["hosts"], 4);
    assert_eq!(v["trunks"], 1);
    assert_eq!(v["max_logical_distance"], 2);
    assert_eq!(v["epoch_pulses"], 64);
    assert_eq!(v["pulses_ahead_max"], 64);
    assert_eq!(v["token_timeout_us"], 10000);
    assert_eq!(v["idle_pace_us"], 5000);
    assert_eq!(v["transport"], "quic");
    assert_eq!(v["tag"], "0x1507ac4000000001");
    assert_eq!(v["certificates_checked"], 6);
    assert_eq!(v["spin_us"], 50);
}

/// A two-node QUIC config in `dir` (certificates in `dir/pki`).
const QUIC: &str = r#"[transport]
kind = "quic"
ca = "pki/ca.pem"
certs = "pki"

[[switch]]
name = "tm0"

[[host]]
name = "alpha"
switch = "tm0"
"#;

#[test]
fn quic_certificates_are_checked_naming_the_key() {
    let dir = scratch("config");
    let c = write(&dir, "c.toml", QUIC);
    // No CA file: the `ca` line.
    let e = refused(&["check-config", &c], &c, 3);
    assert!(e.contains("transport.ca") && e.contains("ca.pem"), "{e}");
    // The CA but no certificate for alpha: the `certs` line.
    make_pki(&dir, "one", &["tm0"]);
    let e = refused(&["check-config", &c], &c, 4);
    assert!(
        e.contains("transport.certs") && e.contains("alpha.pem"),
        "{e}"
    );
    assert!(e.contains("--node alpha"), "{e}");
    // alpha's certificate from another CA: refused as not chaining to the cluster CA.
    let other = scratch("config");
    make_pki(&other, "two", &["alpha"]);
    for f in ["alpha.pem", "alpha.key"] {
        std::fs::copy(other.join("pki").join(f), dir.join("pki").join(f)).unwrap();
    }
    let e = refused(&["check-config", &c], &c, 4);
    assert!(
        e.contains("node certificate") && e.contains("alpha.pem"),
        "{e}"
    );
    // Issued by the right CA: ok.
    make_pki(&dir, "one", &["tm0", "alpha"]);
    let out = isotach(&["check-config", &c, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["certificates_checked"], 2);
    // Without `ca` at all, the error points at the [transport] table.
    let c = write(&dir, "d.toml", &QUIC.replace("ca = \"pki/ca.pem\"\n", ""));
    let e = refused(&["check-config", &c], &c, 1);
    assert!(e.contains("transport.ca") && e.contains("udp"), "{e}");
}

#[test]
fn a_bad_tag_names_its_line() {
    let dir = scratch("config");
    let c = write(&dir, "c.toml", &format!("{GOOD}tag = \"0xnope\"\n"));
    let e = refused(&["check-config", &c], &c, 21);
    assert!(e.contains("transport.tag"), "{e}");
}

#[test]
fn a_config_with_a_map_passes() {
    let dir = scratch("config");
    let c = write(&dir, "c.toml", GOOD);
    let m = write(&dir, "c.map", "# forks\n0-3 alpha beta\n4 1\n");
    let out = isotach(&["check-config", &c, "--map", &m, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["map"]["ranges"], 2);
    assert_eq!(v["map"]["pages"], 5);
}

#[test]
fn unknown_key_names_file_line_and_key() {
    let dir = scratch("config");
    let c = write(
        &dir,
        "c.toml",
        &GOOD.replace("token-timeout-us", "token-timeout-ms"),
    );
    let e = refused(&["check-config", &c], &c, 2);
    assert!(e.contains("token-timeout-ms"), "{e}");
}

#[test]
fn unknown_keys_name_their_dotted_path() {
    let dir = scratch("config");
    for (text, line, key) in [
        // In the second [[switch]] table.
        (
            GOOD.replace("name = \"tm1\"", "name = \"tm1\"\nlisen = \"x\""),
            8,
            "switch.lisen",
        ),
        (
            GOOD.replace("kind = \"udp\"", "kind = \"udp\"\ncerts-dir = \"x\""),
            21,
            "transport.certs-dir",
        ),
        (
            format!("{GOOD}[limits]\nchanels = 2\n"),
            22,
            "limits.chanels",
        ),
    ] {
        let c = write(&dir, "c.toml", &text);
        let e = refused(&["check-config", &c], &c, line);
        let want = format!("error: {c}:{line}:1: {key}: unknown field");
        assert!(e.starts_with(&want), "want {want}…, got {e}");
    }
}

#[test]
fn unspecified_addresses_are_warned_about_and_still_pass() {
    let dir = scratch("config");
    let text = GOOD
        .replace(
            "name = \"tm0\"",
            "name = \"tm0\"\nlisten = \"0.0.0.0:7400\"\nadmin = \"127.0.0.1:7070\"",
        )
        .replace(
            "switch = \"tm1\"",
            "switch = \"tm1\"\nsiu = \"127.0.0.1:7411\"\napp = \"[::]:7421\"\nadmin = \"0.0.0.0:7071\"",
        );
    let c = write(&dir, "c.toml", &text);
    let out = isotach(&["check-config", &c]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "one line per warning: {stderr}");
    for (line, want) in lines.iter().zip([
        format!("warning: {c}:6:10: switch.listen: switch `tm0` would listen on every interface (0.0.0.0:7400)"),
        format!("warning: {c}:18:7: host.app: host `beta` would listen on every interface ([::]:7421)"),
        format!("warning: {c}:19:9: host.admin: host `beta` would serve its admin service on every interface (0.0.0.0:7071)"),
    ]) {
        assert!(line.starts_with(&want), "want {want}…, got {line}");
    }
    assert!(String::from_utf8(out.stdout).unwrap().contains(": ok"));

    let out = isotach(&["check-config", &c, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let w = v["warnings"].as_array().unwrap();
    let got: Vec<_> = w
        .iter()
        .map(|w| {
            let s = |k: &str| w[k].as_str().unwrap().to_string();
            (s("node"), s("key"), s("addr"), w["line"].as_u64().unwrap())
        })
        .collect();
    let want = [
        ("tm0", "switch.listen", "0.0.0.0:7400", 6),
        ("beta", "host.app", "[::]:7421", 18),
        ("beta", "host.admin", "0.0.0.0:7071", 19),
    ];
    let want: Vec<_> = want
        .iter()
        .map(|&(n, k, a, l)| (n.to_string(), k.to_string(), a.to_string(), l))
        .collect();
    assert_eq!(got, want);
    assert!(
        w[0]["message"]
            .as_str()
            .unwrap()
            .contains("every interface"),
        "{v}"
    );
    assert_eq!(String::from_utf8(out.stderr).unwrap().lines().count(), 3);

    // Without such addresses: no warning, an empty array.
    let c = write(&dir, "d.toml", GOOD);
    let out = isotach(&["check-config", &c, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["warnings"], serde_json::json!([]));
}

#[test]
fn certificates_in_an_absolute_directory_elsewhere_pass() {
    // The certificates live outside the config's directory (as the operations walkthrough
    // keeps them out of the repository): by absolute path, or relative to the config file.
    let certs = scratch("config");
    make_pki(&certs, "elsewhere", &["tm0", "alpha"]);
    let pki = certs.join("pki");
    assert!(pki.is_absolute());
    let config = scratch("config");
    let absolute = QUIC
        .replace(
            "\"pki/ca.pem\"",
            &format!("\"{}\"", pki.join("ca.pem").display()),
        )
        .replace("\"pki\"", &format!("\"{}\"", pki.display()));
    let c = write(&config, "abs.toml", &absolute);
    let out = isotach(&["check-config", &c, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["certificates_checked"], 2);
    // The same files by a path relative to the config file (not to the working directory:
    // this runs from the crate's directory).
    let up = format!("../{}/pki", certs.file_name().unwrap().to_str().unwrap());
    let relative = QUIC
        .replace("\"pki/ca.pem\"", &format!("\"{up}/ca.pem\""))
        .replace("\"pki\"", &format!("\"{up}\""));
    let c = write(&config, "rel.toml", &relative);
    let out = isotach(&["check-config", &c, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    // `~` is not expanded: said so at the key's line.
    let c = write(
        &config,
        "tilde.toml",
        &QUIC.replace("\"pki/ca.pem\"", "\"~/.isotach/pki/ca.pem\""),
    );
    let e = refused(&["check-config", &c], &c, 3);
    assert!(
        e.contains("transport.ca") && e.contains("not expanded"),
        "{e}"
    );
}

#[test]
fn bad_switch_name_names_the_host_line() {
    let dir = scratch("config");
    let c = write(
        &dir,
        "c.toml",
        &GOOD.replace("switch = \"tm1\"", "switch = \"tm9\""),
    );
    let e = refused(&["check-config", &c], &c, 14);
    assert!(e.contains("host.switch") && e.contains("tm9"), "{e}");
}

#[test]
fn bad_switch_graphs_exit_2_naming_the_line_and_key() {
    let dir = scratch("config");
    let three = GOOD.replace(
        "[[trunk]]",
        "[[switch]]\nname = \"tm2\"\n[[host]]\nname = \"gamma\"\nswitch = \"tm2\"\n[[trunk]]",
    );
    // A cycle: tm0-tm1, tm1-tm2, tm2-tm0. The third trunk closes it.
    let ring = format!(
        "{three}[[trunk]]\nbetween = [\"tm1\", \"tm2\"]\n[[trunk]]\nbetween = [\"tm2\", \"tm0\"]\n"
    );
    let c = write(&dir, "ring.toml", &ring);
    let line = ring.lines().count();
    let e = refused(&["check-config", &c], &c, line);
    assert!(
        e.contains("trunk.between: this trunk closes the cycle `tm2` - `tm1` - `tm0` - `tm2`"),
        "{e}"
    );
    // tm2 and its host joined to nothing.
    let c = write(&dir, "island.toml", &three);
    let line = three.lines().position(|l| l == "name = \"tm2\"").unwrap() + 1;
    let e = refused(&["check-config", &c, "--json"], &c, line);
    assert!(
        e.contains("switch.name: switch `tm2` and its hosts `gamma` cannot be reached"),
        "{e}"
    );
    // A host named like a switch.
    let c = write(
        &dir,
        "same.toml",
        &GOOD.replace("name = \"beta\"", "name = \"tm1\""),
    );
    let e = refused(&["check-config", &c], &c, 13);
    assert!(e.contains("host.name: `tm1` names a switch too"), "{e}");
    // Two nodes on one address.
    let addrs = GOOD
        .replace(
            "name = \"tm1\"",
            "name = \"tm1\"\nlisten = \"127.0.0.1:7000\"",
        )
        .replace(
            "switch = \"tm0\"",
            "switch = \"tm0\"\nsiu = \"127.0.0.1:7000\"",
        );
    let c = write(&dir, "addr.toml", &addrs);
    let e = refused(&["check-config", &c], &c, 13);
    assert!(
        e.contains("host.siu: address 127.0.0.1:7000 is used twice"),
        "{e}"
    );
}

#[test]
fn a_long_line_gets_its_epoch_and_window_sized_and_a_short_epoch_is_refused() {
    let dir = scratch("config");
    let mut text = String::from("[transport]\nkind = \"udp\"\n");
    for s in 0..40 {
        text +=
            &format!("[[switch]]\nname = \"s{s}\"\n[[host]]\nname = \"h{s}\"\nswitch = \"s{s}\"\n");
    }
    for s in 1..40 {
        text += &format!("[[trunk]]\nbetween = [\"s{}\", \"s{s}\"]\n", s - 1);
    }
    let c = write(&dir, "long.toml", &text);
    let out = isotach(&["check-config", &c, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["max_logical_distance"], 40);
    assert_eq!(v["epoch_pulses"], 80);
    assert_eq!(v["pulses_ahead_max"], 96);
    let c = write(
        &dir,
        "short.toml",
        &format!("[timing]\nepoch-pulses = 40\n{text}"),
    );
    let e = refused(&["check-config", &c], &c, 2);
    assert!(
        e.contains("timing.epoch-pulses: 40 is out of range: allowed 41..=65536 (more than the largest logical distance, 40"),
        "{e}"
    );
}

#[test]
fn zero_timeout_names_the_key_line() {
    let dir = scratch("config");
    let c = write(&dir, "c.toml", &GOOD.replace("2000", "0"));
    let e = refused(&["check-config", &c], &c, 2);
    assert!(e.contains("timing.token-timeout-us"), "{e}");
}

#[test]
fn out_of_bounds_values_exit_2_naming_key_value_and_range() {
    let dir = scratch("config");
    // Too large: refused, not clamped; the error points at the value.
    let c = write(
        &dir,
        "c.toml",
        &format!("{GOOD}\n[limits]\npulses-ahead-max = 1000000\n"),
    );
    let line = std::fs::read_to_string(&c).unwrap().lines().count();
    let e = refused(&["check-config", &c, "--json"], &c, line);
    let want = format!(
        "{c}:{line}:20: limits.pulses-ahead-max: 1000000 is out of range: allowed 5..={}",
        isotach_proto::config::PULSES_AHEAD_MAX_MAX
    );
    assert!(e.contains(&want), "want {want}, got {e}");
    // Too small for this topology (largest logical distance 2): the range says why.
    std::fs::write(&c, format!("{GOOD}\n[limits]\npulses-ahead-max = 4\n")).unwrap();
    let e = refused(&["check-config", &c], &c, line);
    assert!(
        e.contains("4 is out of range: allowed 5..=") && e.contains("largest logical distance, 2"),
        "{e}"
    );
    // Timing too: a timeout of an hour.
    let c = write(&dir, "t.toml", &GOOD.replace("2000", "3600000000"));
    let e = refused(&["check-config", &c], &c, 2);
    assert!(
        e.contains("timing.token-timeout-us: 3600000000 is out of range: allowed 100..=10000000"),
        "{e}"
    );
}

#[test]
fn bad_map_line_names_the_map_file_and_line() {
    let dir = scratch("config");
    let c = write(&dir, "c.toml", GOOD);
    let m = write(&dir, "c.map", "0-3 alpha beta\n4 zeta\n");
    let e = refused(&["check-config", &c, "--map", &m], &m, 2);
    assert!(e.contains("zeta"), "{e}");
    let m = write(&dir, "overlap.map", "0-3 alpha\n\n2 beta\n");
    refused(&["check-config", &c, "--map", &m], &m, 3);
}

#[test]
fn missing_files_exit_2() {
    let dir = scratch("config");
    let c = dir.join("nope.toml");
    let c = c.to_str().unwrap();
    let e = refused(&["check-config", c], c, 0);
    assert!(e.contains("cannot read"), "{e}");
    let good = write(&dir, "c.toml", GOOD);
    let m = dir.join("nope.map");
    let m = m.to_str().unwrap();
    refused(&["check-config", &good, "--map", m], m, 0);
}

#[test]
fn the_config_map_key_is_checked_relative_to_the_config() {
    let dir = scratch("config");
    let c = write(&dir, "c.toml", &format!("map = \"c.map\"\n{GOOD}"));
    let m = write(&dir, "c.map", "0-3 alpha beta\n");
    let out = isotach(&["check-config", &c, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["map"]["file"], m.as_str());
    assert_eq!(v["map"]["pages"], 4);
    // A bad line in the map the config names is reported in the map file.
    std::fs::write(&m, "0-3 alpha beta\n\n4 zeta\n").unwrap();
    let e = refused(&["check-config", &c], &m, 3);
    assert!(e.contains("zeta"), "{e}");
    // --map wins over the config's key.
    let other = write(&dir, "other.map", "7 beta\n");
    let out = isotach(&["check-config", &c, "--map", &other, "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["map"]["file"], other.as_str());
}
