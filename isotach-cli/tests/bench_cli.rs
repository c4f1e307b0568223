//! `isotach bench am` runs its two processes and reports the baseline with the ratios.

use std::process::Command;

#[test]
fn bench_am_reports_baseline_and_ratios() {
    let out = Command::new(env!("CARGO_BIN_EXE_isotach"))
        .args([
            "bench",
            "am",
            "--rtt-iters",
            "50",
            "--rate-msgs",
            "50",
            "--bulk-msgs",
            "2",
            "--no-quic",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["mode"], "two_processes");
    for key in [
        "raw_udp_rtt_p50_us",
        "raw_udp_spin_rtt_p50_us",
        "raw_tcp_rtt_p50_us",
        "am_udp_rtt_p50_us",
        "rtt_ratio_udp",
        "am_udp_msgs_per_s",
        "am_udp_bulk_mb_per_s",
        "raw_udp_stream_mb_per_s",
        "bulk_ratio_udp",
    ] {
        let x = v[key]
            .as_f64()
            .unwrap_or_else(|| panic!("{key} missing: {v}"));
        assert!(x > 0.0, "{key} = {x}");
    }
    // AM's waits spin before they sleep, so its baseline is the raw ping-pong that does too.
    let ratio =
        v["am_udp_rtt_p50_us"].as_f64().unwrap() / v["raw_udp_spin_rtt_p50_us"].as_f64().unwrap();
    assert!(
        (ratio - v["rtt_ratio_udp"].as_f64().unwrap()).abs() < 1e-6,
        "the ratio is AM over the spinning raw round trip"
    );
}

#[test]
fn bench_am_refuses_bad_counts() {
    let out = Command::new(env!("CARGO_BIN_EXE_isotach"))
        .args(["bench", "am", "--rtt-iters", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
