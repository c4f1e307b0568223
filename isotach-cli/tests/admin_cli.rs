//! The admin gRPC service of the daemons (`--admin ADDR`) read by `isotach status`. No timed
//! assertions: every deadline here is a liveness guard, and every process the test starts is
//! killed when the test ends (also on failure).

mod common;

use common::{BIN, GUARD, Procs, free_addrs, logs, scratch, spawn, two_host_config, wait_guarded};
use std::net::TcpListener;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// A free loopback TCP address (bound to port 0 and released).
fn free_tcp() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// `isotach status --admin ADDR --json ARGS`: the JSON object, or `None` if it failed (the
/// daemon may not be listening yet).
fn status(admin: &str, extra: &[&str]) -> Option<serde_json::Value> {
    let out = Command::new(BIN)
        .args(["status", "--admin", admin, "--json"])
        .args(extra)
        .output()
        .unwrap();
    if !out.status.success() {
        return None;
    }
    serde_json::from_slice(&out.stdout).ok()
}

/// Polls `status` until `done` holds for the reply; panics with the logs at the guard.
fn status_until(
    dir: &Path,
    admin: &str,
    until: Instant,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    loop {
        if let Some(v) = status(admin, &[])
            && done(&v)
        {
            return v;
        }
        assert!(
            Instant::now() < until,
            "status of {admin} never satisfied the condition\n{}",
            logs(dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

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
    let a = free_addrs(5);
    let cfg = dir.join("cluster.toml");
    std::fs::write(&cfg, two_host_config(&a)).unwrap();
    let cfg = cfg.to_str().unwrap();
    let (adm_tm, adm_alpha, adm_beta) = (free_tcp(), free_tcp(), free_tcp());
    let mut procs = Procs(Vec::new());
    for (label, args) in [
        (
            "tm0",
            vec!["tm", "--config", cfg, "--name", "tm0", "--admin", &adm_tm],
        ),
        (
            "siu-alpha",
            vec![
                "siu", "--config", cfg, "--host", "alpha", "--admin", &adm_alpha,
            ],
        ),
        (
            "siu-beta",
            vec![
                "siu", "--config", cfg, "--host", "beta", "--admin", &adm_beta,
            ],
        ),
        (
            "philo-alpha",
            vec!["philo", "--config", cfg, "--host", "alpha", "--meals", "5"],
        ),
        (
            "philo-beta",
            vec!["philo", "--config", cfg, "--host", "beta", "--meals", "5"],
        ),
    ] {
        procs.0.push(spawn(&dir, label, &args));
    }
    let until = Instant::now() + GUARD;
    for (admin, role, name) in [
        (&adm_tm, "tm", "tm0"),
        (&adm_alpha, "siu", "alpha"),
        (&adm_beta, "siu", "beta"),
    ] {
        let first = status_until(&dir, admin, until, |v| v["started"] == true && clock(v) > 0);
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
        let second = status_until(&dir, admin, until, |v| clock(v) > c1);
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
