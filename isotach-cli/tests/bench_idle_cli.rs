//! `isotach bench idle` runs a TM and SIU daemons as processes, measures them idle with idle
//! pacing off and on, and times isochrons after quiet spells. A short debug run: only the
//! report's keys and their sanity are checked, never a timing.

use std::process::Command;

#[test]
fn bench_idle_reports_cpu_per_daemon_and_first_isochron_latency_for_both_phases() {
    let out = Command::new(env!("CARGO_BIN_EXE_isotach"))
        .args([
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
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "exit {:?}\nstdout: {}\nstderr: {}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(
        (v["hosts"].as_u64(), v["idle_pace_us"].as_u64()),
        (Some(2), Some(2500))
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
