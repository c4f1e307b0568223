//! Bounded queues through real daemons (`docs/operations.md`, "Bounded queues and
//! back-pressure"): with a small `queue-packets-max` and one host's application missing while
//! the other host (`isotach tool send`) writes to it, the SIU queues nothing for the missing
//! application: it drops and counts what no application would read (`absent_dropped`; a later
//! application gets current copies by state transfer, `docs/design.md`), its queues stay within
//! the limit and logical time does not wait; when the application connects it is up in the same
//! generation. No timed assertions: deadlines are liveness guards; every process is killed when
//! the test ends.

mod common;

use common::{
    GUARD, Procs, Watchdog, free_addrs, free_tcp, scratch, spawn, spawn_siu, spawn_tm, write_config,
};
use isotach_proto::packet::StartOfIsochron;
use isotach_tests::ByteGenerator;
use std::fmt::Write as _;
use std::time::Instant;

const QUEUE_MAX: u64 = 64;
/// Isochrons beta sends, each one write to alpha: several times the limit.
const ISOCHRONS: u32 = 400;

/// Hex lines for `isotach tool send`: beta's isochrons, each writing one variable at alpha.
fn beta_writes_to_alpha() -> String {
    let mut host = ByteGenerator::new(1);
    let mut text = String::new();
    for iso_id in 0..ISOCHRONS {
        let soi = StartOfIsochron {
            iso_id,
            distance: 2,
            ..StartOfIsochron::default()
        };
        for packet in host.isochron(soi, &[(0, u64::from(iso_id))]) {
            for b in packet {
                let _ = write!(text, "{b:02x}");
            }
            text.push('\n');
        }
    }
    text
}

/// The SIU's application peer (absent from the very first snapshot, before the driver ran).
fn app_peer(v: &serde_json::Value) -> serde_json::Value {
    v["peers"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "application"))
        .cloned()
        .unwrap_or_default()
}

#[test]
fn a_missing_application_is_counted_not_queued_and_logical_time_goes_on() {
    let dir = scratch("backpressure");
    let a = free_addrs(5);
    let text = format!(
        "{}\n[limits]\nqueue-packets-max = {QUEUE_MAX}\n",
        common::two_host_config(&a)
    );
    let cfg = &write_config(&dir, &text);
    let (adm_alpha, adm_beta) = (free_tcp(), free_tcp());
    let writes = dir.join("writes.hex");
    std::fs::write(&writes, beta_writes_to_alpha()).unwrap();
    let writes = writes.to_str().unwrap();
    let mut procs = Procs(vec![
        spawn_tm(&dir, cfg, &["--no-admin"]),
        spawn_siu(&dir, cfg, "alpha", &["--admin", &adm_alpha]),
        spawn_siu(&dir, cfg, "beta", &["--admin", &adm_beta]),
        spawn(
            &dir,
            "app-beta",
            &[
                "tool",
                "send",
                "--config",
                cfg,
                "--host",
                "beta",
                writes,
                "--then-recv",
                "100000000",
            ],
        ),
    ]);
    let until = Instant::now() + GUARD;
    // Logical time must go on throughout: the watchdog fails the test within seconds if not.
    let mut watch = Watchdog::new(&dir, &[("siu-alpha", &adm_alpha), ("siu-beta", &adm_beta)]);
    // Alpha's application is missing: every write for it is dropped and counted, nothing is
    // queued for it, and logical time does not wait for it.
    let dropped = watch.status_until(&adm_alpha, until, |v| {
        v["counters"]["absent_dropped"].as_u64() >= Some(u64::from(ISOCHRONS))
    });
    let generation = dropped["generation"].as_u64().unwrap();
    let at = dropped["recvclock"].as_u64().unwrap();
    for _ in 0..20 {
        let v = watch.status_until(&adm_alpha, until, |v| !app_peer(v).is_null());
        assert_eq!(app_peer(&v)["up"], false, "{v}");
        assert!(app_peer(&v)["queued"].as_u64().unwrap() <= QUEUE_MAX, "{v}");
        assert_eq!(v["counters"]["port.fragments_dropped"], 0, "{v}");
        assert!(v["queues"]["to_host"].as_u64().unwrap() <= QUEUE_MAX, "{v}");
    }
    let later = watch.status_until(&adm_alpha, until, |v| {
        v["recvclock"].as_u64().unwrap() > at + 1000
    });
    assert_eq!(later["generation"].as_u64(), Some(generation), "{later}");
    // The application comes: it is up in the same generation and logical time goes on.
    procs.0.push(spawn(
        &dir,
        "app-alpha",
        &[
            "tool", "recv", "--config", cfg, "--host", "alpha", "--no-eop",
        ],
    ));
    let after = watch.status_until(&adm_alpha, until, |v| {
        app_peer(v)["up"] == true && v["recvclock"].as_u64().unwrap() > at + 2000
    });
    assert_eq!(after["generation"].as_u64(), Some(generation), "{after}");
    assert_eq!(after["counters"]["port.fragments_dropped"], 0, "{after}");
    let beta = watch.status_until(&adm_beta, until, |v| {
        v["recvclock"].as_u64().unwrap() > at + 2000
    });
    assert_eq!(beta["generation"].as_u64(), Some(generation), "{beta}");
}
