//! `isotach sim scale` and `isotach tool plot-scale` through the built binary: the sweep's
//! JSON, its points, and the SVG drawn from a sweep.

mod common;

use common::{isotach, ok_json, stderr};
use std::path::PathBuf;

const POINT_KEYS: &[&str] = &[
    "topology",
    "hosts",
    "switches",
    "max_logical_distance",
    "pulses",
    "ok",
    "pulse_period_us",
    "isochron_latency_p50_us",
    "isochron_latency_p99_us",
    "isochron_latency_p50_pulses",
    "isochron_latency_p99_pulses",
    "isochron_latency_samples",
    "messages_per_pulse",
    "datagrams_per_pulse",
    "events",
    "wall_time_ms",
    "peak_rss_kb",
    "rss_per_host_kb",
    "trace_hash",
];

#[test]
fn a_small_sweep_prints_every_point_of_each_topology() {
    let out = isotach(&[
        "sim",
        "scale",
        "--hosts-from",
        "16",
        "--hosts-to",
        "64",
        "--pulses",
        "20",
        "--json",
    ]);
    let v = ok_json(&out);
    assert_eq!(v["ok"], true);
    assert_eq!(v["pulses"], 20);
    let points = v["points"].as_array().expect("points");
    let shape: Vec<(&str, u64, u64, u64)> = points
        .iter()
        .map(|p| {
            for k in POINT_KEYS {
                assert!(p.get(k).is_some(), "missing {k}: {p}");
            }
            (
                p["topology"].as_str().unwrap(),
                p["hosts"].as_u64().unwrap(),
                p["switches"].as_u64().unwrap(),
                p["max_logical_distance"].as_u64().unwrap(),
            )
        })
        .collect();
    // A line of one switch per 16 hosts; a tree:4 as deep as its leaves need.
    assert_eq!(
        shape,
        [
            ("line", 16, 1, 1),
            ("line", 64, 4, 4),
            ("tree:4", 16, 1, 1),
            ("tree:4", 64, 5, 3)
        ]
    );
    for p in points {
        assert_eq!(p["ok"], true, "{p}");
        assert!(p["pulses"].as_u64().unwrap() >= 20, "{p}");
        let period = p["pulse_period_us"].as_f64().unwrap();
        assert!(period > 0.0, "{p}");
        let (p50, p99) = (
            p["isochron_latency_p50_us"].as_u64().unwrap(),
            p["isochron_latency_p99_us"].as_u64().unwrap(),
        );
        assert!(0 < p50 && p50 <= p99, "{p}");
        let pulses = p["isochron_latency_p50_pulses"].as_u64().unwrap();
        let d = p["max_logical_distance"].as_u64().unwrap();
        assert!(
            pulses >= 1 && pulses <= 2 * d + 4,
            "p50 {pulses} pulses at D {d}: {p}"
        );
        assert!(p["isochron_latency_samples"].as_u64().unwrap() > 0, "{p}");
        assert!(p["messages_per_pulse"].as_f64().unwrap() > 0.0, "{p}");
        assert!(
            p["datagrams_per_pulse"].as_f64().unwrap() > p["messages_per_pulse"].as_f64().unwrap(),
            "tokens and acks travel too: {p}"
        );
        assert!(p["peak_rss_kb"].as_u64().unwrap() > 0, "{p}");
        assert_eq!(p["trace_hash"].as_str().unwrap().len(), 16, "{p}");
    }
    // The same cluster gives the same trace in either topology: at 16 hosts both are one
    // switch.
    let tree16 = |v: &serde_json::Value| v["points"][2]["trace_hash"].clone();
    assert_eq!(
        tree16(&v),
        v["points"][0]["trace_hash"],
        "16 hosts: one switch either way"
    );
    // No progress bar escapes when stderr is not a terminal.
    assert!(!stderr(&out).contains('\x1b'), "{}", stderr(&out));
}

#[test]
fn a_sweep_that_runs_backwards_or_too_long_is_refused() {
    let out = isotach(&["sim", "scale", "--hosts-from", "64", "--hosts-to", "16"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--hosts-from 64"), "{}", stderr(&out));
    let out = isotach(&["sim", "scale", "--pulses", "5"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let topologies = vec!["line"; 40].join(",");
    let out = isotach(&["sim", "scale", "--topology", &topologies]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("more than 64"), "{}", stderr(&out));
}

#[test]
fn sim_waves_reports_latency_period_traffic_and_memory() {
    let out = isotach(&[
        "sim",
        "waves",
        "--hosts",
        "8",
        "--switches",
        "3",
        "--topology",
        "tree:2",
        "--pulses",
        "60",
        "--json",
    ]);
    let v = ok_json(&out);
    for k in [
        "pulse_period_us",
        "messages_per_pulse",
        "datagrams_per_pulse",
        "isochron_latency_samples",
        "isochron_latency_p50_us",
        "isochron_latency_p99_us",
        "isochron_latency_p50_pulses",
        "isochron_latency_p99_pulses",
        "isochron_latency_dropped",
        "peak_rss_kb",
    ] {
        assert!(v.get(k).is_some(), "missing {k}: {v}");
    }
    assert!(v["isochron_latency_samples"].as_u64().unwrap() > 0, "{v}");
    assert_eq!(v["isochron_latency_dropped"], 0);
    // Without a terminal, progress is a line per tenth of the pulses.
    let lines = stderr(&out)
        .lines()
        .filter(|l| l.starts_with("sim waves: ") && l.contains("/60"))
        .count();
    assert!((5..=11).contains(&lines), "{}", stderr(&out));
}

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/scale.json")
}

fn scratch(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("isotach-scale-cli-{}-{name}", std::process::id()))
}

#[test]
fn plot_scale_draws_an_svg_with_every_topology() {
    let svg = scratch("plot.svg");
    let out = isotach(&[
        "tool",
        "plot-scale",
        fixture().to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let text = std::fs::read_to_string(&svg).expect("the SVG was written");
    std::fs::remove_file(&svg).unwrap();
    assert!(text.starts_with("<svg"), "{}", &text[..80.min(text.len())]);
    assert!(text.trim_end().ends_with("</svg>"));
    for needle in [
        "pulse period (virtual µs)",
        "isochron latency (virtual µs)",
        "isochron latency p50 (pulses)",
        ">\nline\n<",
        ">\ntree:4 p99\n<",
        "hosts",
    ] {
        assert!(text.contains(needle), "no {needle:?} in the SVG");
    }
    // A line per topology and measure, through each of its 3 points (axes, ticks and legend
    // samples have 2): 2 topologies × (1 + 2 + 1) measures.
    let series = text
        .lines()
        .filter_map(|l| l.split("points=\"").nth(1))
        .filter(|pts| pts.split_whitespace().filter(|c| c.contains(',')).count() == 3)
        .count();
    assert_eq!(series, 8, "{text}");
    // Balanced tags (a truncated file would not be).
    assert_eq!(
        text.matches("<text").count(),
        text.matches("</text>").count()
    );
}

#[test]
fn plot_scale_refuses_a_file_that_is_no_sweep_naming_it() {
    let bad = scratch("bad.json");
    std::fs::write(&bad, r#"{"points": [{"topology": "line"}]}"#).unwrap();
    let svg = scratch("never.svg");
    let out = isotach(&[
        "tool",
        "plot-scale",
        bad.to_str().unwrap(),
        "-o",
        svg.to_str().unwrap(),
    ]);
    std::fs::remove_file(&bad).unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains(bad.to_str().unwrap()) && err.contains("hosts"),
        "{err}"
    );
    assert!(!svg.exists(), "nothing drawn");
}

#[test]
fn progress_asked_for_draws_a_bar_on_stderr_and_leaves_stdout_alone() {
    let out = isotach(&[
        "sim",
        "waves",
        "--hosts",
        "8",
        "--switches",
        "2",
        "--pulses",
        "300",
        "--progress",
        "--json",
    ]);
    let v = ok_json(&out);
    assert_eq!(v["pulses_target"], 300);
    let err = stderr(&out);
    assert!(err.contains("\x1b[2K"), "a bar redrawn in place: {err:?}");
    assert!(
        !err.lines()
            .any(|l| l.starts_with("sim waves: ") && l.contains("/300 ")),
        "no progress lines with a bar: {err:?}"
    );
}
