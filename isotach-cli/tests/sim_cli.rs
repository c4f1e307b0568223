//! `isotach sim waves` through the built binary: JSON keys, exit codes, flag validation.

mod common;

use common::{isotach, json, ok_json};

/// Fails naming the first of `keys` that the report `v` lacks.
fn assert_keys(v: &serde_json::Value, keys: &[&str]) {
    for key in keys {
        assert!(v.get(key).is_some(), "missing key {key}: {v}");
    }
}

const SMALL: &[&str] = &[
    "sim",
    "waves",
    "--hosts",
    "4",
    "--switches",
    "2",
    "--pulses",
    "100",
    "--seed",
    "7",
];

#[test]
fn a_clean_run_prints_the_report_and_exits_0() {
    let mut args = SMALL.to_vec();
    args.extend([
        "--loss",
        "0.05",
        "--dup",
        "0.02",
        "--reorder",
        "0.1",
        "--json",
    ]);
    let v = ok_json(&isotach(&args));
    assert_keys(
        &v,
        &[
            "pulses",
            "isochrons",
            "messages_delivered",
            "eop_violations",
            "order_violations",
            "trace_hash",
            "completed",
            "seed",
            "virtual_time_us",
            "wall_time_ms",
            "tokens_repeated",
            "tokens_dropped_bad_crc",
            "duplicates_absorbed",
            "pauses",
        ],
    );
    assert_eq!(v["eop_violations"], 0);
    assert_eq!(v["order_violations"], 0);
    assert_eq!(v["completed"], true);
    assert_eq!(v["seed"], 7);
    assert!(v["pulses"].as_u64().unwrap() >= 100);
    let hash = v["trace_hash"].as_str().unwrap();
    assert_eq!(hash.len(), 16);

    let again = json(&isotach(&args));
    assert_eq!(
        again["trace_hash"], v["trace_hash"],
        "same seed, same trace"
    );
}

#[test]
fn the_human_summary_names_the_verdict() {
    let out = isotach(SMALL);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("sim waves ok"), "{stdout}");
    assert!(stdout.contains("trace_hash"), "{stdout}");
}

#[test]
fn a_failed_check_exits_1_and_names_the_seed() {
    let mut args = SMALL.to_vec();
    args.extend(["--tamper", "swap-sort-vector", "--json"]);
    let out = isotach(&args);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(json(&out)["order_violations"].as_u64().unwrap() > 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--seed 7"), "{stderr}");
}

#[test]
fn bad_flags_exit_2_with_a_clear_error() {
    let cases: &[(&[&str], &str)] = &[
        (&["--loss", "1.0"], "probability"),
        (&["--dup=-0.1"], "probability"),
        (&["--token-corrupt", "x"], "number"),
        (&["--jitter-us", "9..3"], "empty"),
        (&["--latency-us", "a..3"], "whole number"),
        (&["--hosts", "0"], "hosts"),
        (&["--switches", "0"], "switches"),
        (
            &["--hosts", "2", "--switches", "3"],
            "every switch needs a host",
        ),
        (&["--pulses", "0"], "pulses"),
        (
            &["--topology", "ring"],
            "`ring` is not a topology: line, star, tree:FANOUT",
        ),
        (&["--topology", "tree:1"], "the fanout must be at least 2"),
        (
            &[
                "--topology",
                "leaf-spine:4",
                "--hosts",
                "8",
                "--switches",
                "4",
            ],
            "needs more than 4 switches",
        ),
        (
            &["--topology", "star", "--hosts", "3", "--switches", "5"],
            "only 3 hosts for the 4 switches that take hosts",
        ),
        (
            &["--hosts", "64", "--switches", "64", "--epoch-pulses", "64"],
            "--epoch-pulses 64 must exceed the largest logical distance (64): give 65 or more, \
             or leave it out for 128",
        ),
        (&["--token-timeout-us", "0"], "token-timeout-us"),
        (&["--no-such-flag"], "no-such-flag"),
    ];
    for (extra, needle) in cases {
        let mut args = vec!["sim", "waves"];
        args.extend_from_slice(extra);
        let out = isotach(&args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
}

#[test]
fn generated_trees_run_and_report_their_distance() {
    for (topology, switches, distance) in [
        ("star", "5", 3),
        ("tree:2", "7", 5),
        ("leaf-spine", "9", 5),
        ("line", "3", 3),
    ] {
        let out = isotach(&[
            "sim",
            "waves",
            "--hosts",
            "16",
            "--switches",
            switches,
            "--topology",
            topology,
            "--pulses",
            "60",
            "--loss",
            "0.02",
            "--token-corrupt",
            "0.01",
            "--json",
        ]);
        let v = ok_json(&out);
        assert_eq!(v["max_logical_distance"], distance, "{topology}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains(&format!(
                "largest logical distance {distance}, epoch 64 pulses"
            )),
            "{stderr}"
        );
    }
    let out = isotach(&[
        "sim",
        "sc",
        "--hosts",
        "8",
        "--switches",
        "5",
        "--topology",
        "tree:2",
        "--seeds",
        "1",
        "--isochrons",
        "60",
        "--json",
    ]);
    // Leaves 2 (under 0), 3 and 4 (under 1): 3-1-0-2.
    assert_eq!(ok_json(&out)["max_logical_distance"], 4);
    let out = isotach(&[
        "sim",
        "philo",
        "--philosophers",
        "4",
        "--switches",
        "3",
        "--topology",
        "star",
        "--meals",
        "2",
        "--json",
    ]);
    assert_eq!(ok_json(&out)["max_logical_distance"], 3);
}

#[test]
fn an_unexpected_error_fails_the_run_and_is_named_in_problems() {
    let mut args = SMALL.to_vec();
    args.extend(["--tamper", "short-distance", "--json"]);
    let out = isotach(&args);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let v = json(&out);
    let n = v["unexpected_errors"].as_u64().unwrap();
    assert!(n > 0, "{v}");
    assert_eq!(
        v["problems"][0],
        format!("unexpected: {n} host packets the SIU refused")
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("unexpected: "), "{stderr}");
}

#[test]
fn a_missing_config_file_exits_2_naming_it() {
    let out = isotach(&["sim", "waves", "--config", "/no/such/cluster.toml"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("/no/such/cluster.toml"));
}

#[test]
fn every_subcommand_has_help() {
    for args in [
        &["--help"][..],
        &["sim", "--help"],
        &["sim", "waves", "--help"],
    ] {
        let out = isotach(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("Usage"));
    }
    let help = isotach(&["sim", "waves", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    for flag in [
        "--loss",
        "--token-corrupt",
        "--pause-every-us",
        "--jitter-us",
        "--json",
    ] {
        assert!(text.contains(flag), "{flag} missing from help");
    }
    assert!(!text.contains("--tamper"), "test-only flag stays hidden");
}

#[test]
fn sim_sc_and_philo_print_their_reports_and_exit_0() {
    let out = isotach(&[
        "sim",
        "sc",
        "--hosts",
        "4",
        "--switches",
        "2",
        "--seeds",
        "2",
        "--isochrons",
        "100",
        "--json",
    ]);
    let v = ok_json(&out);
    assert_keys(
        &v,
        &[
            "runs",
            "isochrons",
            "reads_checked",
            "sc_violations",
            "atomicity_violations",
            "program_order_violations",
        ],
    );
    assert_eq!(v["runs"], 2);
    assert_eq!(v["sc_violations"], 0);
    let out = isotach(&[
        "sim",
        "philo",
        "--philosophers",
        "4",
        "--meals",
        "3",
        "--json",
    ]);
    let v = ok_json(&out);
    assert_keys(
        &v,
        &["meals", "safety_violations", "max_wait_pulses", "pulses"],
    );
    assert_eq!(v["meals"], 12);
    let out = isotach(&["sim", "philo", "--philosophers", "1"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn sim_waves_crashes_and_restarts_daemons_and_sc_refuses_restarts_with_app_restarts() {
    let out = isotach(&[
        "sim",
        "waves",
        "--hosts",
        "6",
        "--switches",
        "2",
        "--pulses",
        "200",
        "--seed",
        "3",
        "--restarts",
        "2",
        "--restart-every-us",
        "4000",
        "--json",
    ]);
    let r = ok_json(&out);
    assert_eq!(r["ok"], true);
    assert_eq!(r["restarts"], 2);
    assert!(r["links_lost"].as_u64().is_some_and(|n| n > 0), "{r}");
    assert!(r["reset_eops"].as_u64().is_some_and(|n| n > 0), "{r}");
    let out = isotach(&[
        "sim",
        "sc",
        "--hosts",
        "4",
        "--switches",
        "1",
        "--seeds",
        "1",
        "--isochrons",
        "10",
        "--restarts",
        "1",
        "--app-restarts",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("run them apart"), "{err}");
}

#[test]
fn host_turns_are_off_by_default_and_counted_when_asked_for() {
    let run = |turns: bool| {
        let mut a: Vec<&str> =
            "sim sc --hosts 4 --switches 1 --seeds 2 --isochrons 100 --think-us 0..0 --json"
                .split(' ')
                .collect();
        if turns {
            a.push("--host-turns");
        }
        ok_json(&isotach(&a))
    };
    let off = run(false);
    assert_eq!(off["host_turns_ended"], 0);
    assert_eq!(off["isochrons_in_turn"], 0);
    let on = run(true);
    assert!(on["host_turns_ended"].as_u64().unwrap() > 0, "{on}");
    assert!(on["isochrons_in_turn"].as_u64().unwrap() > 0, "{on}");
    assert_eq!(on["sc_violations"], 0);
}
