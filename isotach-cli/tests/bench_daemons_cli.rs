//! `isotach bench tokens`, `isochrons`, `transfers` and `idle` run the real daemons over loopback and
//! report their numbers with the baselines of the same run. Tiny durations; nothing
//! here asserts on timings, only that the keys are there and positive.

mod common;

use common::isotach;
use std::process::Output;

fn json_ok(out: &Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The report's `cores` are this machine's; its `busy_threads` a token manager and
/// `per_host` threads for each of `hosts`.
fn threads(v: &serde_json::Value, hosts: u64, per_host: u64) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert_eq!(v["cores"].as_u64(), Some(cores), "{v}");
    assert_eq!(
        v["busy_threads"].as_u64(),
        Some(1 + hosts * per_host),
        "{v}"
    );
}

fn positive(v: &serde_json::Value, keys: &[&str]) {
    for key in keys {
        let x = v[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing in {v}"));
        assert!(x > 0.0, "{key} = {x} in {v}");
    }
}

#[test]
fn bench_tokens_reports_pulse_rate_and_baseline() {
    let v = json_ok(&isotach(&[
        "bench",
        "tokens",
        "--seconds",
        "0.2",
        "--rtt-iters",
        "100",
        "--json",
    ]));
    assert_eq!(v["hosts"], 4);
    threads(&v, 4, 1);
    assert_eq!(v["mode"], "two_processes");
    assert_eq!(v["ok"], true);
    positive(
        &v,
        &[
            "pulses_per_s",
            "pulse_period_us",
            "raw_udp_rtt_p50_us",
            "raw_udp_spin_rtt_p50_us",
            "period_to_raw_rtt_ratio",
        ],
    );
    // The daemons spin before they sleep (the default), so the ratio's baseline does too.
    let period = v["pulse_period_us"].as_f64().unwrap();
    let spin_rtt = v["raw_udp_spin_rtt_p50_us"].as_f64().unwrap();
    assert_eq!(v["spin_us"], 50);
    assert!((v["period_to_raw_rtt_ratio"].as_f64().unwrap() - period / spin_rtt).abs() < 1e-6);
}

#[test]
fn bench_isochrons_reports_latency_rate_and_baseline() {
    // Both placements of the SIU: embedded in each application (the default) and daemons,
    // the second with waits that never spin (then the baseline does not either); and
    // applications that poll instead of waiting.
    for (siu, spin_us, driver) in [
        ("embedded", "50", "wait"),
        ("daemon", "0", "wait"),
        ("embedded", "50", "poll"),
    ] {
        let v = json_ok(&isotach(&[
            "bench",
            "isochrons",
            "--hosts",
            "3",
            "--siu",
            siu,
            "--spin-us",
            spin_us,
            "--driver",
            driver,
            "--seconds",
            "0.2",
            "--rtt-iters",
            "100",
            "--json",
        ]));
        assert_eq!(v["hosts"], 3);
        assert_eq!(v["siu"], siu);
        assert_eq!(v["driver"], driver);
        threads(&v, 3, if siu == "daemon" { 2 } else { 1 });
        assert_eq!(v["ok"], true);
        positive(
            &v,
            &[
                "isochron_latency_p50_us",
                "isochron_latency_p99_us",
                "latency_to_raw_rtt_ratio",
                "srefs_per_s",
                "isochrons_per_s",
                "raw_udp_rtt_p50_us",
            ],
        );
        let raw = match spin_us {
            "0" => {
                assert!(v["raw_udp_spin_rtt_p50_us"].is_null());
                v["raw_udp_rtt_p50_us"].as_f64().unwrap()
            }
            _ => v["raw_udp_spin_rtt_p50_us"].as_f64().unwrap(),
        };
        let p50 = v["isochron_latency_p50_us"].as_f64().unwrap();
        assert!((v["latency_to_raw_rtt_ratio"].as_f64().unwrap() - p50 / raw).abs() < 1e-6);
    }
}

#[test]
fn bench_transfers_conserves_the_total_and_reports_its_baselines() {
    // Each idiom with one placement of the SIU (both are covered, and the run stays short).
    for (idiom, siu) in [("sched-assign", "embedded"), ("add", "daemon")] {
        // --no-redis: tests never depend on Redis; the comparison's absence is reported.
        let v = json_ok(&isotach(&[
            "bench",
            "transfers",
            "--siu",
            siu,
            "--hosts",
            "3",
            "--accounts",
            "60",
            "--idiom",
            idiom,
            "--seconds",
            "0.3",
            "--rtt-iters",
            "100",
            "--no-redis",
            "--json",
        ]));
        assert_eq!(
            (v["hosts"].as_u64(), v["accounts"].as_u64()),
            (Some(3), Some(60))
        );
        assert_eq!(v["idiom"], idiom);
        assert_eq!(v["siu"], siu);
        threads(&v, 3, if siu == "daemon" { 2 } else { 1 });
        assert_eq!(v["ok"], true);
        assert_eq!(v["total_conserved"], true);
        assert_eq!(v["redis_skipped"], "--no-redis");
        assert!(v["redis_transfers_per_s"].is_null() && v["ratio_vs_redis"].is_null());
        assert!(v["redis_pipelined_transfers_in_flight"].is_null());
        // Three hosts at the default four clients each.
        assert_eq!(v["transfers_in_flight"].as_u64(), Some(12));
        positive(
            &v,
            &[
                "transfers_per_s",
                "transfer_latency_p50_us",
                "unordered_transfers_per_s",
                "ordered_to_unordered_ratio",
                "raw_udp_rtt_p50_us",
                "pulses_per_s",
                "cpu_us_per_transfer",
                "cpu_cores_busy",
                "unordered_cpu_us_per_transfer",
            ],
        );
        // The process's CPU over the window: never more than the machine's cores.
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let busy = v["cpu_cores_busy"].as_f64().unwrap();
        assert!(busy <= cores + 0.1, "{busy} cores busy of {cores}");
        // In microseconds: a transfer costs several system calls, far more than half a µs; and
        // per transfer × transfers/s is the cores busy, give or take how late host 0 closed
        // its window (a bound, not a timing: no equality between two clocks' readings).
        let per = v["cpu_us_per_transfer"].as_f64().unwrap();
        let rate = v["transfers_per_s"].as_f64().unwrap();
        assert!(per >= 0.5, "{per} µs of CPU per transfer");
        assert!(
            per * rate / 1e6 <= 2.0 * cores + 0.1,
            "{per} µs × {rate}/s is more than the machine's {cores} cores"
        );
    }
}

#[test]
fn bench_daemons_bad_flags_exit_2() {
    for args in [
        &["bench", "tokens", "--hosts", "1"][..],
        &["bench", "tokens", "--seconds", "0"],
        &["bench", "tokens", "--seconds", "soon"],
        &["bench", "tokens", "--outstanding", "2"],
        &["bench", "isochrons", "--outstanding", "0"],
        &["bench", "isochrons", "--ops", "0"],
        &["bench", "isochrons", "--hosts", "65"],
        &["bench", "isochrons", "--driver", "spin"],
        &["bench", "isochrons", "--bogus"],
        &["bench", "isochrons", "--spin-us", "1001"],
        &["bench", "transfers", "--spin-us", "-1"],
        &["bench", "transfers", "--accounts", "1"],
        &["bench", "transfers", "--clients", "0"],
        &["bench", "transfers", "--idiom", "locks"],
        &["bench", "idle", "--transport", "tcp"],
        // More accounts per page than a page has slots.
        &["bench", "transfers", "--hosts", "2", "--accounts", "4096"],
    ] {
        let out = isotach(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
}

/// `isotach bench idle` runs a TM and SIU daemons as processes, measures them idle with idle
/// pacing off and on, and times isochrons after quiet spells, over either transport (QUIC
/// with certificates it makes): only the report's keys and their sanity are checked, never
/// a timing.
#[test]
fn bench_idle_reports_cpu_per_daemon_and_first_isochron_latency_for_both_phases() {
    for transport in ["udp", "quic"] {
        bench_idle_over(transport);
    }
}

fn bench_idle_over(transport: &str) {
    let v = json_ok(&isotach(&[
        "bench",
        "idle",
        "--hosts",
        "2",
        "--seconds",
        "1",
        "--samples",
        "2",
        "--idle-ms",
        "20",
        "--transport",
        transport,
        "--json",
    ]));
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["transport"], transport, "{v}");
    assert_eq!(
        (v["hosts"].as_u64(), v["idle_pace_us"].as_u64()),
        (Some(2), Some(5000))
    );
    for phase in ["full", "paced"] {
        let sius = v[format!("{phase}_siu_cpu_pct")].as_array().unwrap();
        assert_eq!(sius.len(), 2, "one share per SIU: {v}");
        for key in ["tm_cpu_pct", "siu_cpu_pct_max"] {
            let x = v[format!("{phase}_{key}")].as_f64().unwrap();
            assert!(x >= 0.0 && x.is_finite(), "{phase}_{key} = {x}");
        }
        for key in [
            "pulses_per_s",
            "pulse_period_us",
            "first_isochron_p50_us",
            "first_isochron_max_us",
        ] {
            let x = v[format!("{phase}_{key}")].as_f64().unwrap();
            assert!(x > 0.0, "{phase}_{key} = {x} in {v}");
        }
    }
    for key in [
        "clk_tck",
        "cpu_target_pct",
        "paced_first_isochron_to_full_period_ratio",
        "paced_to_full_first_isochron_ratio",
    ] {
        assert!(v[key].as_f64().unwrap() > 0.0, "{key} in {v}");
    }
    assert!(v["paced_within_cpu_target"].is_boolean());
    // Behaviour, not timing: with pacing off no wave waits; idle and paced, waves do.
    assert_eq!(v["full_tm_waves_paced"], 0, "{v}");
    assert!(v["paced_tm_waves_paced"].as_u64().unwrap() > 0, "{v}");
    assert!(v["paced_tm_tokens_repeated"].is_u64());
}
