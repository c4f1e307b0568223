//! The admin gRPC service of the daemons (`--admin ADDR`) read by `isotach status`. No timed
//! assertions: every deadline here is a liveness guard, and every process the test starts is
//! killed when the test ends (also on failure).

mod common;

use common::{
    BIN, GUARD, Procs, Watchdog, free_addrs, free_tcp, logs, scratch, spawn_philo, spawn_siu,
    spawn_tm, status, status_until, two_host_config, wait_guarded, write_config,
};
use std::process::Command;
use std::time::Instant;

fn clock(v: &serde_json::Value) -> u64 {
    let key = if v["role"] == "tm" {
        "waves"
    } else {
        "recvclock"
    };
    v[key].as_u64().unwrap()
}

#[test]
fn status_shows_clocks_advancing_and_shutdown_stops_the_daemons() {
    let dir = scratch("admin");
    let cfg = &write_config(&dir, &two_host_config(&free_addrs(5)));
    let (adm_tm, adm_alpha, adm_beta) = (free_tcp(), free_tcp(), free_tcp());
    let mut procs = Procs(vec![
        spawn_tm(&dir, cfg, &["--admin", &adm_tm]),
        spawn_siu(&dir, cfg, "alpha", &["--admin", &adm_alpha]),
        spawn_siu(&dir, cfg, "beta", &["--admin", &adm_beta]),
        spawn_philo(&dir, cfg, "alpha", "5"),
        spawn_philo(&dir, cfg, "beta", "5"),
    ]);
    let until = Instant::now() + GUARD;
    let mut watch = Watchdog::new(
        &dir,
        &[
            ("tm0", &adm_tm),
            ("siu-alpha", &adm_alpha),
            ("siu-beta", &adm_beta),
        ],
    );
    for (admin, role, name) in [
        (&adm_tm, "tm", "tm0"),
        (&adm_alpha, "siu", "alpha"),
        (&adm_beta, "siu", "beta"),
    ] {
        let first = watch.status_until(admin, until, |v| v["started"] == true && clock(v) > 0);
        assert_eq!(first["role"], role, "{first}");
        assert_eq!(first["name"], name, "{first}");
        for key in ["generation", "uptime_ms", "waves", "sendclock", "recvclock"] {
            assert!(first[key].is_u64(), "missing {key}: {first}");
        }
        assert!(first["queues"].is_object(), "{first}");
        assert!(
            first["counters"]["port.packets_received"].as_u64().unwrap() > 0,
            "{first}"
        );
        let c1 = clock(&first);
        let second = watch.status_until(admin, until, |v| clock(v) > c1);
        assert!(clock(&second) > c1);
    }
    // The table form, once.
    let out = Command::new(BIN)
        .args(["status", "--admin", &adm_alpha])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{table}");
    assert!(
        table.contains("recvclock") && table.contains("siu"),
        "{table}"
    );
    // Shutdown over the admin service: each daemon exits 0.
    for (i, admin) in [(0, &adm_tm), (1, &adm_alpha), (2, &adm_beta)] {
        assert!(status(admin, &["--shutdown"]).is_some(), "{}", logs(&dir));
        let s = wait_guarded(&mut procs.0[i].1, until);
        assert!(
            s.is_some_and(|s| s.success()),
            "{} exited {s:?}\n{}",
            procs.0[i].0,
            logs(&dir)
        );
    }
}

#[test]
fn status_exits_1_without_a_daemon_and_2_on_bad_flags() {
    let addr = free_tcp();
    let out = Command::new(BIN)
        .args(["status", "--admin", &addr, "--timeout-s", "2"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    for bad in [
        vec!["status", "--admin", "not-an-address"],
        vec!["status", "--admin", &addr, "--bogus"],
    ] {
        let out = Command::new(BIN).args(&bad).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad:?}: {out:?}");
    }
}

/// `GET /metrics` over plain HTTP; the whole response.
fn http_get(addr: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

#[test]
fn stats_log_level_peers_and_metrics() {
    let dir = scratch("admin-stats");
    let a = free_addrs(5);
    let cfg = &write_config(&dir, &two_host_config(&a));
    let (adm_tm, adm_alpha, metrics) = (free_tcp(), free_tcp(), free_tcp());
    let _procs = Procs(vec![
        spawn_tm(&dir, cfg, &["--admin", &adm_tm]),
        spawn_siu(
            &dir,
            cfg,
            "alpha",
            &["--admin", &adm_alpha, "--metrics", &metrics],
        ),
        spawn_siu(&dir, cfg, "beta", &["--no-admin"]),
        spawn_philo(&dir, cfg, "alpha", "400"),
        spawn_philo(&dir, cfg, "beta", "400"),
    ]);
    let until = Instant::now() + GUARD;
    // Peers and the pulse rate (measured over a full second).
    let v = status_until(&dir, &adm_alpha, until, |v| {
        v["pulse_rate_per_s"].as_f64().is_some_and(|r| r > 0.0)
    });
    let peers = v["peers"].as_array().unwrap();
    let names: Vec<&str> = peers.iter().map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        ["token manager", "application", "SIU of host 1"],
        "{v}"
    );
    assert!(peers[0]["up"] == true && peers[0]["addr"].as_str().unwrap().contains(&a[0]));
    assert!(v["outstanding_isochrons"].is_u64(), "{v}");
    let tm = status_until(&dir, &adm_tm, until, |v| {
        v["pulse_rate_per_s"].as_f64().is_some_and(|r| r > 0.0)
    });
    let tm_peers: Vec<&str> = tm["peers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(tm_peers, ["SIU of host 0", "SIU of host 1"], "{tm}");

    // Histograms.
    let s = status_until(&dir, &adm_alpha, until, |_| true);
    assert!(s.get("histograms").is_none(), "only with --stats");
    let with = status(&adm_alpha, &["--stats"]).expect("stats");
    let hists = with["histograms"].as_array().unwrap();
    let count = |name: &str| {
        hists
            .iter()
            .find(|h| h["name"] == name)
            .unwrap_or_else(|| panic!("no {name}: {with}"))["count"]
            .as_u64()
            .unwrap()
    };
    assert!(
        count("pulse_period_us") > 0 && count("token_turnaround_us") > 0,
        "{with}"
    );
    assert!(count("pass_us") > 0, "{with}");
    let tm_stats = status(&adm_tm, &["--stats"]).expect("tm stats");
    assert!(
        tm_stats["histograms"]
            .as_array()
            .unwrap()
            .iter()
            .any(|h| h["name"] == "wave_period_us" && h["count"].as_u64().unwrap() > 0),
        "{tm_stats}"
    );
    assert!(status(&adm_alpha, &["--reset-stats"]).is_some());

    // The log filter.
    let out = Command::new(BIN)
        .args(["status", "--admin", &adm_alpha, "--log-level", "debug"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("replaces `info`"), "{err}");
    let out = Command::new(BIN)
        .args(["status", "--admin", &adm_alpha, "--log-level", "=[{bad"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("bad log filter"));

    // Prometheus.
    let text = http_get(&metrics, "/metrics").expect("metrics answer");
    assert!(text.starts_with("HTTP/1.1 200 OK"), "{text}");
    for needle in [
        "isotach_recvclock{role=\"siu\",name=\"alpha\"}",
        "isotach_pulse_period_microseconds_count{",
        "isotach_peer_up{role=\"siu\",name=\"alpha\",peer=\"token manager\"",
    ] {
        assert!(text.contains(needle), "no `{needle}` in\n{text}");
    }
    let missing = http_get(&metrics, "/nope").unwrap();
    assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
}
