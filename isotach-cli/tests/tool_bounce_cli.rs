//! `isotach tool bounce` plays a real SIU daemon's token manager (`docs/operations.md`, "SIU
//! test tools"): it starts logical time with the SIU, answers its tokens wave after wave with
//! isotach messages for its host in between, and exits 0 once the waves asked for were
//! answered. No timed assertion: `--timeout-s` is a liveness guard.

mod common;

use common::{Procs, free_addrs, isotach, scratch, spawn_siu, stderr, write_config};
use serde_json::Value;

/// Waves the bouncer sends and waits to see answered.
const WAVES: u64 = 30;

#[test]
fn bounce_drives_an_siu_daemon_through_its_waves_with_messages_for_its_host() {
    let dir = scratch("tool-bounce");
    let cfg = &write_config(&dir, &common::two_host_config(&free_addrs(5)));
    let _siu = Procs(vec![spawn_siu(&dir, cfg, "alpha", &["--no-admin"])]);
    let waves = WAVES.to_string();
    let out = isotach(&[
        "tool",
        "bounce",
        "--config",
        cfg,
        "--host",
        "alpha",
        "--waves",
        &waves,
        "--messages-max",
        "3",
        "--seed",
        "7",
        "--json",
        "--timeout-s",
        "120",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .expect("utf-8")
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    let count = |dir: &str, kind: &str| {
        lines
            .iter()
            .filter(|v| v["dir"] == dir && v["kind"] == kind)
            .count() as u64
    };
    let seen = format!(
        "{} lines: in tokens {}, out tokens {}, out messages {}",
        lines.len(),
        count("in", "token"),
        count("out", "token"),
        count("out", "message")
    );
    // The SIU's tokens: one per wave (its restart token first), and the bouncer's waves.
    assert!(count("in", "token") >= WAVES, "{seen}");
    assert!(count("out", "token") >= WAVES, "{seen}");
    // Isotach messages for the SIU's host went out between tokens (0..=3 per gap, seeded),
    // each stamped with a pulse the SIU had not yet ended.
    assert!(count("out", "message") > 0, "{seen}");
    for m in lines.iter().filter(|v| v["kind"] == "message") {
        assert_eq!(m["dest"], 0, "for alpha, host 0: {m}");
        assert!(m["ts"].as_u64().is_some_and(|ts| ts >= 1), "{m}");
    }
    // Every line is a decoded packet.
    assert!(lines.iter().all(|v| v["kind"] != "undecodable"), "{seen}");
}
