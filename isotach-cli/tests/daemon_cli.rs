//! The daemons, `isotach philo` and `isotach demo philo` as processes. No timed assertions:
//! every deadline here is a liveness guard, and every process a test starts is killed when the
//! test ends (also on failure).

mod common;

use common::{
    BIN, GUARD, Procs, Scratch, Watchdog, free_addrs, free_tcp, logs, scratch, sigterm, spawn,
    two_host_config, wait_guarded,
};
use std::process::{Command, Output};
use std::time::Instant;

#[test]
fn demo_philo_json_exits_0_with_the_keys() {
    let out: Output = Command::new(BIN)
        .args([
            "demo",
            "philo",
            "--philosophers",
            "3",
            "--meals",
            "5",
            "--json",
        ])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "status {:?}\nstdout {stdout}\nstderr {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
    for key in [
        "philosophers",
        "meals",
        "meals_per_s",
        "pulses_per_s",
        "isochron_latency_p50_us",
        "isochron_latency_p99_us",
        "safety_violations",
        "elapsed_s",
        "ok",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert_eq!(v["meals"], 15);
    assert_eq!(v["safety_violations"], 0);
    assert_eq!(v["ok"], true);
}

/// The applications `apps` exit 0 (the watchdog fails the test within seconds should logical
/// time stop first); then graceful shutdown: SIGTERM to `daemons`, and each exits 0.
fn finish_then_stop(
    dir: &std::path::Path,
    procs: &mut Procs,
    watch: &mut Watchdog,
    apps: &[usize],
    daemons: &[usize],
) {
    let ended_ok = |procs: &Procs, i: usize, status: Option<std::process::ExitStatus>| {
        assert!(
            status.is_some_and(|s| s.success()),
            "{} ended with {status:?}\n{}",
            procs.0[i].0,
            logs(dir)
        );
    };
    let until = Instant::now() + GUARD;
    for &i in apps {
        let status = watch.wait(&mut procs.0[i].1, until);
        ended_ok(procs, i, status);
    }
    for &i in daemons {
        sigterm(&procs.0[i].1);
    }
    for &i in daemons {
        let status = wait_guarded(&mut procs.0[i].1, Instant::now() + GUARD);
        ended_ok(procs, i, status);
    }
}

#[test]
fn daemons_and_two_philosopher_processes_on_loopback() {
    let dir = scratch("daemons");
    let a = free_addrs(5);
    let config = two_host_config(&a);
    let cfg = dir.join("cluster.toml");
    std::fs::write(&cfg, config).unwrap();
    let cfg = cfg.to_str().unwrap();
    let mut procs = Procs(Vec::new());
    let (adm_tm, adm_alpha, adm_beta) = (free_tcp(), free_tcp(), free_tcp());
    // Start in an awkward order: applications and the non-initiating SIU first.
    for (label, args) in [
        (
            "philo-beta",
            vec!["philo", "--config", cfg, "--host", "beta", "--meals", "5"],
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
            "siu-alpha",
            vec![
                "siu", "--config", cfg, "--host", "alpha", "--admin", &adm_alpha,
            ],
        ),
        (
            "tm0",
            vec!["tm", "--config", cfg, "--name", "tm0", "--admin", &adm_tm],
        ),
    ] {
        procs.0.push(spawn(&dir, label, &args));
    }
    // The philosophers finish; should logical time stop first, the watchdog says where.
    let mut watch = Watchdog::new(
        &dir,
        &[
            ("tm0", &adm_tm),
            ("siu-alpha", &adm_alpha),
            ("siu-beta", &adm_beta),
        ],
    );
    finish_then_stop(&dir, &mut procs, &mut watch, &[0, 2], &[1, 3, 4]);
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A two-host cluster where host `alpha` runs `app ARGS --embedded-siu` (its SIU in its own
/// process) and host `beta` runs `app ARGS` over an SIU daemon: both placements in one
/// cluster, the same wire between them. Both applications must exit 0 and the daemons stop
/// cleanly; returns the directory holding `app-alpha.log` and `app-beta.log`.
fn embedded_beside_daemon(name: &str, app: &str, args: &[&str]) -> Scratch {
    let dir = scratch(name);
    let cfg = dir.join("cluster.toml");
    std::fs::write(&cfg, two_host_config(&free_addrs(5))).unwrap();
    let cfg = cfg.to_str().unwrap();
    let (adm_tm, adm_beta) = (free_tcp(), free_tcp());
    let on = |host: &'static str| [&[app, "--config", cfg, "--host", host][..], args].concat();
    let mut procs = Procs(Vec::new());
    for (label, args) in [
        ("app-alpha", [on("alpha"), vec!["--embedded-siu"]].concat()),
        ("app-beta", on("beta")),
        (
            "siu-beta",
            vec![
                "siu", "--config", cfg, "--host", "beta", "--admin", &adm_beta,
            ],
        ),
        (
            "tm0",
            vec!["tm", "--config", cfg, "--name", "tm0", "--admin", &adm_tm],
        ),
    ] {
        procs.0.push(spawn(&dir, label, &args));
    }
    let mut watch = Watchdog::new(&dir, &[("tm0", &adm_tm), ("siu-beta", &adm_beta)]);
    finish_then_stop(&dir, &mut procs, &mut watch, &[0, 1], &[2, 3]);
    dir
}

#[test]
fn a_philosopher_with_an_embedded_siu_eats_beside_a_daemon_host() {
    embedded_beside_daemon("embedded", "philo", &["--meals", "5"]);
}

/// The bank workload (`isotach transfers`): host 0's audit finds the total conserved.
#[test]
fn a_transfers_host_with_an_embedded_siu_runs_beside_a_daemon_host() {
    let run = [
        "--seconds",
        "0.3",
        "--accounts",
        "16",
        "--idiom",
        "add",
        "--json",
    ];
    let dir = embedded_beside_daemon("transfers-embedded", "transfers", &run);
    // Host 0 (alpha) audits: its JSON line says where its SIU ran and that the total held.
    let out = std::fs::read_to_string(dir.join("app-alpha.log")).unwrap();
    let line = out
        .lines()
        .find(|l| l.starts_with('{'))
        .expect("a JSON line");
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["siu"], "embedded", "{out}");
    assert_eq!(v["total_conserved"], true, "{out}");
    assert!(v["transfers"].as_u64().is_some_and(|n| n > 0), "{out}");
}

#[test]
fn bad_address_in_config_exits_2_naming_file_line_and_key() {
    let dir = scratch("badcfg");
    let cfg = dir.join("bad.toml");
    std::fs::write(
        &cfg,
        "[[switch]]\nname = \"tm0\"\nlisten = \"127.0.0.1:7000\"\n\n[[host]]\nname = \"a\"\nswitch = \"tm0\"\nsiu = \"not-an-address\"\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["tm", "--config", cfg.to_str().unwrap(), "--name", "tm0"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("bad.toml:8:"), "{stderr}");
    assert!(stderr.contains("host.siu"), "{stderr}");
    // A missing address the daemon needs, and an unknown name, are usage errors too.
    std::fs::write(
        &cfg,
        "[[switch]]\nname = \"tm0\"\n\n[[host]]\nname = \"a\"\nswitch = \"tm0\"\n",
    )
    .unwrap();
    for args in [
        vec!["tm", "--name", "tm0"],
        vec!["siu", "--host", "a"],
        vec!["tm", "--name", "nope"],
    ] {
        let out = Command::new(BIN)
            .args(&args)
            .args(["--config", cfg.to_str().unwrap()])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains("bad.toml"), "{args:?}: {stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
