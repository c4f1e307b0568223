//! Security of the daemons as processes: QUIC with mutual TLS on every link (certificates
//! made with `isotach cert`), a daemon whose certificate another CA signed is refused by
//! everyone, and the AM tag keeps an application of another cluster away from an SIU. No
//! timed assertions: every deadline is a liveness guard, and every process a test starts is
//! killed when the test ends (also on failure).

mod common;

use common::{
    BIN, GUARD, Procs, free_addrs, logs, make_pki, scratch, sigterm, spawn, spawn_siu, spawn_tm,
    wait_guarded,
};
use isotach_proto::packet::StartOfIsochron;
use isotach_tests::ByteGenerator;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const HOSTS: [&str; 3] = ["alpha", "beta", "gamma"];

/// Starts the token manager and the SIUs of `hosts`, none with an admin service.
fn daemons(dir: &Path, cfg: &str, hosts: &[&str]) -> Procs {
    let mut procs = Procs(vec![spawn_tm(dir, cfg, &["--no-admin"])]);
    for h in hosts {
        procs.0.push(spawn_siu(dir, cfg, h, &["--no-admin"]));
    }
    procs
}

fn isotach(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

/// A cluster config: one TM `tm0`, hosts alpha, beta, gamma; `a` = [tm, then siu and app of
/// each host]; `transport` is the body of the `[transport]` table.
fn config(a: &[String], transport: &str) -> String {
    common::hosts_config(&HOSTS, a, transport)
}

/// Waits until a line of `DIR/LABEL.log` satisfies `ok`; returns it.
fn log_until(
    dir: &Path,
    label: &str,
    what: &str,
    until: Instant,
    ok: impl Fn(&str) -> bool,
) -> String {
    loop {
        let text = std::fs::read_to_string(dir.join(format!("{label}.log"))).unwrap_or_default();
        if let Some(l) = text.lines().find(|l| ok(l)) {
            return l.to_string();
        }
        assert!(
            Instant::now() < until,
            "{label}: no line with {what}\n{}",
            logs(dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until `DIR/LABEL.log` contains every one of `needles` on one line.
fn log_line(dir: &Path, label: &str, needles: &[&str], until: Instant) -> String {
    log_until(dir, label, &format!("{needles:?}"), until, |l| {
        needles.iter().all(|n| l.contains(n))
    })
}

fn log_of(dir: &Path, label: &str) -> String {
    std::fs::read_to_string(dir.join(format!("{label}.log"))).unwrap_or_default()
}

/// The number after `key=` in `line`.
fn field(line: &str, key: &str) -> u64 {
    let at = line
        .find(&format!("{key}="))
        .unwrap_or_else(|| panic!("no {key} in {line}"));
    line[at + key.len() + 1..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("{key} in {line}"))
}

/// SIGTERM to every daemon of `procs` (by label prefix) and their exit 0.
fn stop_daemons(procs: &mut Procs, dir: &Path, until: Instant) {
    for (label, c) in &mut procs.0 {
        if label.starts_with("tm") || label.starts_with("siu") {
            if c.try_wait().unwrap().is_some() {
                continue;
            }
            sigterm(c);
            let s = wait_guarded(c, until);
            assert!(
                s.is_some_and(|s| s.success()),
                "{label} ended with {s:?}\n{}",
                logs(dir)
            );
        }
    }
}

/// Starts the philosophers of every host with `cfg` and waits for each to exit 0.
fn philosophers_eat(procs: &mut Procs, dir: &Path, cfg: &str, until: Instant) {
    let first = procs.0.len();
    for h in HOSTS {
        let label = format!("philo-{h}");
        procs.0.push(spawn(
            dir,
            &label,
            &["philo", "--config", cfg, "--host", h, "--meals", "5"],
        ));
    }
    for i in first..procs.0.len() {
        let status = wait_guarded(&mut procs.0[i].1, until);
        assert!(
            status.is_some_and(|s| s.success()),
            "{} ended with {status:?}\n{}",
            procs.0[i].0,
            logs(dir)
        );
    }
}

#[test]
fn three_hosts_run_philo_over_quic_daemons() {
    let dir = scratch("sec-quic");
    make_pki(&dir.join("pki"), "sec", &["tm0", "alpha", "beta", "gamma"]);
    let a = free_addrs(7);
    // No `kind`: QUIC is the default.
    let cfg = dir.join("cluster.toml");
    std::fs::write(&cfg, config(&a, "ca = \"pki/ca.pem\"\ncerts = \"pki\"")).unwrap();
    let cfg = cfg.to_str().unwrap();
    let out = isotach(&["check-config", cfg, "--json"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["transport"].as_str(), v["certificates_checked"].as_u64()),
        (Some("quic"), Some(4))
    );

    let until = Instant::now() + GUARD;
    let mut procs = daemons(&dir, cfg, &HOSTS);
    philosophers_eat(&mut procs, &dir, cfg, until);
    tools_speak_quic(&dir, cfg, until);
    stop_daemons(&mut procs, &dir, until);
    // Everyone presented a certificate from the cluster CA: no handshake was refused.
    let end = log_line(&dir, "tm0", &["QUIC transport stopped"], until);
    assert_eq!(field(&end, "handshakes_refused"), 0, "{end}");
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The SIU test tools follow the config's transport: `tool send` plays alpha's application
/// (alpha's certificate) and sends an isochron writing a variable at beta; `tool recv` plays
/// beta's application and prints the write.
fn tools_speak_quic(dir: &Path, cfg: &str, until: Instant) {
    let mut alpha = ByteGenerator::new(0);
    let soi = StartOfIsochron {
        iso_id: 7,
        distance: 1,
        ..StartOfIsochron::default()
    };
    let hex: String = alpha
        .isochron(soi, &[(1, 0x77)])
        .iter()
        .map(|p| p.iter().map(|b| format!("{b:02x}")).collect::<String>() + "\n")
        .collect();
    let file = dir.join("isochron.hex");
    std::fs::write(&file, hex).unwrap();
    // beta's SIU drops what reaches it for its host while no application is attached (the
    // philosopher has gone): send only once `tool recv` is attached, which the SIU logs as
    // one more `peer up` of the application.
    let attached = || {
        log_of(dir, "siu-beta")
            .lines()
            .filter(|l| l.contains("peer up") && l.contains("peer=\"application\""))
            .count()
    };
    let before = attached();
    let recv = Command::new(BIN)
        .args([
            "tool", "recv", "--config", cfg, "--host", "beta", "--no-eop",
        ])
        .args(["--json", "--timeout-s", "120"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut recv = Procs(vec![("tool recv".into(), recv)]);
    while attached() == before {
        assert!(
            Instant::now() < until,
            "tool recv never attached\n{}",
            logs(dir)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let send = isotach(&[
        "tool",
        "send",
        "--config",
        cfg,
        "--host",
        "alpha",
        file.to_str().unwrap(),
        "--timeout-s",
        "120",
    ]);
    assert!(send.status.success(), "tool send: {send:?}");
    // The first message it prints (it exits at its timeout at the latest, ending the read).
    let stdout = recv.0[0].1.stdout.take().unwrap();
    let message = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .find(|v| v["kind"] == "message");
    drop(recv);
    let v = message.unwrap_or_else(|| panic!("tool recv printed no message\n{}", logs(dir)));
    assert_eq!(v["sref"]["value"], 0x77, "{v}");
}

#[test]
fn a_daemon_whose_certificate_another_ca_signed_is_refused() {
    let dir = scratch("sec-rogue");
    make_pki(
        &dir.join("pki"),
        "cluster",
        &["tm0", "alpha", "beta", "gamma"],
    );
    // Another CA's `gamma`: a well-formed certificate for the right name and address.
    make_pki(&dir.join("rogue-pki"), "rogue", &["gamma"]);
    let a = free_addrs(7);
    let good = dir.join("cluster.toml");
    std::fs::write(
        &good,
        config(&a, "kind = \"quic\"\nca = \"pki/ca.pem\"\ncerts = \"pki\""),
    )
    .unwrap();
    let rogue = dir.join("rogue.toml");
    let rogue_transport = "kind = \"quic\"\nca = \"rogue-pki/ca.pem\"\ncerts = \"rogue-pki\"";
    std::fs::write(&rogue, config(&a, rogue_transport)).unwrap();
    let (good, rogue) = (good.to_str().unwrap(), rogue.to_str().unwrap());
    // The cluster's config is complete and consistent: the refusal happens on the wire.
    let out = isotach(&["check-config", good]);
    assert!(out.status.success(), "{out:?}");

    let until = Instant::now() + GUARD;
    let mut procs = daemons(&dir, good, &["alpha", "beta"]);
    procs.0.push(spawn(
        &dir,
        "rogue-gamma",
        &["siu", "--config", rogue, "--host", "gamma", "--no-admin"],
    ));
    // The TM refuses the rogue's handshakes and logs it; the rogue's own attempts fail (it
    // refuses the TM's certificate, the TM refuses its). SIUs link to each other on demand
    // (docs/operations.md) and the rogue has nothing to send the other SIUs, so only its TM
    // sees its handshakes (the transport refuses a foreign CA for every peer alike:
    // am/tests/conformance.rs).
    let l = log_until(&dir, "tm0", "a refused handshake", until, |l| {
        l.contains("QUIC handshakes failed") && field(l, "handshakes_refused") >= 1
    });
    // The log names the peer: the rogue's address.
    assert!(l.contains(&format!("{}:", a[5])), "tm0: {l}");
    let l = log_line(&dir, "rogue-gamma", &["QUIC handshakes failed"], until);
    assert!(
        field(&l, "connects_failed") + field(&l, "handshakes_refused") >= 1,
        "{l}"
    );
    // The genuine daemons are up with each other; the rogue is up with nobody, and nobody
    // with it: no packet of it ever reached a daemon.
    for label in ["siu-alpha", "siu-beta"] {
        log_line(&dir, label, &["peer up", "token manager"], until);
    }
    let rogue_idx = procs.0.iter().position(|p| p.0 == "rogue-gamma").unwrap();
    sigterm(&procs.0[rogue_idx].1);
    let s = wait_guarded(&mut procs.0[rogue_idx].1, until);
    assert!(
        s.is_some_and(|s| s.success()),
        "rogue ended with {s:?}\n{}",
        logs(&dir)
    );
    let rogue_log = log_of(&dir, "rogue-gamma");
    assert!(!rogue_log.contains("peer up"), "{rogue_log}");
    let stopped = log_line(&dir, "rogue-gamma", &["SIU stopped"], until);
    assert!(stopped.contains("packets_received: 0"), "{stopped}");
    assert!(!rogue_log.contains("starting logical time"), "{rogue_log}");
    for label in ["tm0", "siu-alpha", "siu-beta"] {
        let text = log_of(&dir, label);
        let from_gamma = text.lines().any(|l| {
            (l.contains("neighbour up") && l.contains("Host(2)"))
                || (l.contains("peer up") && l.contains("SIU of host 2"))
        });
        assert!(!from_gamma, "{label} accepted the rogue:\n{text}");
    }

    // The genuine gamma takes its place: the cluster runs.
    procs
        .0
        .push(spawn_siu(&dir, good, "gamma", &["--no-admin"]));
    philosophers_eat(&mut procs, &dir, good, until);
    stop_daemons(&mut procs, &dir, until);
    let end = log_line(&dir, "tm0", &["QUIC transport stopped"], until);
    assert!(field(&end, "handshakes_refused") >= 1, "{end}");
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn an_application_with_another_tag_cannot_reach_its_siu() {
    let dir = scratch("sec-tag");
    let a = free_addrs(7);
    // A trusted LAN (UDP): the tag is what keeps another cluster's application out.
    let good = dir.join("cluster.toml");
    std::fs::write(
        &good,
        config(&a, "kind = \"udp\"\ntag = \"0x1507ac4000000001\""),
    )
    .unwrap();
    let foreign = dir.join("foreign.toml");
    std::fs::write(&foreign, config(&a, "kind = \"udp\"\ntag = \"0xf0e1d2c3\"")).unwrap();
    let (good, foreign) = (good.to_str().unwrap(), foreign.to_str().unwrap());

    let until = Instant::now() + GUARD;
    let mut procs = daemons(&dir, good, &HOSTS);
    log_line(&dir, "siu-alpha", &["SIU up"], until);
    // The foreign application gives up at its deadline with an error naming the tags.
    let out = Command::new(BIN)
        .args([
            "philo",
            "--config",
            foreign,
            "--host",
            "alpha",
            "--timeout-s",
            "3",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}\n{}", logs(&dir));
    assert!(
        stderr.contains("BadTag") && stderr.contains("0xf0e1d2c3") && stderr.contains(&a[1]),
        "{stderr}"
    );
    // Its SIU never took it for its application.
    let siu_log = log_of(&dir, "siu-alpha");
    assert!(
        !siu_log
            .lines()
            .any(|l| l.contains("peer up") && l.contains("application")),
        "{siu_log}"
    );
    // The cluster's own applications (same tag) run.
    philosophers_eat(&mut procs, &dir, good, until);
    log_line(&dir, "siu-alpha", &["peer up", "application"], until);
    stop_daemons(&mut procs, &dir, until);
    // The SIU's AM layer counted the foreign hellos it refused (its shutdown line).
    let siu_log = log_of(&dir, "siu-alpha");
    let refused: u64 = siu_log
        .split("bad_tag: ")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no bad_tag count in\n{siu_log}"));
    assert!(refused > 0, "{siu_log}");
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_embedded_demo_runs_over_quic_and_in_process() {
    for transport in ["quic", "mem"] {
        let out = isotach(&[
            "demo",
            "philo",
            "--philosophers",
            "3",
            "--meals",
            "5",
            "--transport",
            transport,
            "--json",
        ]);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{transport}: {:?}\n{stdout}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(v["transport"], transport);
        assert_eq!(v["meals"], 15);
        assert_eq!(v["safety_violations"], 0);
        assert_eq!(v["ok"], true);
    }
}
