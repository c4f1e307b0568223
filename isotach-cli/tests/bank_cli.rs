//! The bank example (`smm/examples/bank.rs`, built on `Smm::connect`) against real daemons:
//! one TM and four SIU processes stay up while four application processes run, exit and run
//! again (the rerun that used to lose writes), over UDP and over QUIC; every snapshot's total
//! is conserved and the copies of every account agree at the end of every run. And an SIU
//! killed and restarted under running applications makes them exit naming the restart, not
//! time out. Deadlines are liveness guards; every process is killed when a test ends.

mod common;

use common::{
    BIN, GUARD, Procs, Watchdog, free_addrs, free_tcp, logs, make_pki, scratch, spawn, wait_guarded,
};
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const HOSTS: [&str; 4] = ["h0", "h1", "h2", "h3"];
/// Reruns of the four applications against the same daemons.
const RERUNS: usize = 10;
/// Transfers per application and run.
const TRANSFERS: &str = "30";

/// The example's binary: next to `isotach` in the target directory. Built (or found up to
/// date) by cargo once per test binary: `cargo nextest` does not build examples, and a stale
/// one would test old code.
fn bank_bin() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let dir = Path::new(BIN).parent().expect("isotach is in a directory");
    let bin = dir.join("examples").join("bank");
    BUILT.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let profile = if dir.ends_with("release") {
            vec!["--release"]
        } else {
            vec![]
        };
        let out = Command::new(cargo)
            .args([
                "build",
                "-p",
                "isotach-smm",
                "--features",
                "daemon",
                "--example",
                "bank",
            ])
            .args(profile)
            .output()
            .unwrap();
        assert!(out.status.success(), "building the bank example: {out:?}");
    });
    bin
}

/// A four-host cluster on one TM with the bank's map (account pages on two hosts each);
/// `a` = [tm, then siu and app of each host].
fn cluster(dir: &Path, a: &[String], transport: &str) -> PathBuf {
    let t = format!(
        "map = \"bank.map\"\n\n{}",
        common::hosts_config(&HOSTS, a, transport)
    );
    std::fs::write(dir.join("bank.map"), "0 h0 h1\n1 h1 h2\n2 h2 h3\n3 h3 h0\n").unwrap();
    let cfg = dir.join("cluster.toml");
    std::fs::write(&cfg, t).unwrap();
    cfg
}

/// [`cluster`] over QUIC with mutual TLS: a cluster CA and a certificate for every node.
fn quic_cluster(dir: &Path) -> PathBuf {
    let mut nodes = vec!["tm0"];
    nodes.extend(HOSTS);
    make_pki(&dir.join("pki"), "bank", &nodes);
    cluster(
        dir,
        &free_addrs(9),
        "kind = \"quic\"\nca = \"pki/ca.pem\"\ncerts = \"pki\"",
    )
}

/// Starts the TM and the SIUs, each with an admin service, and a watchdog over them.
fn start_daemons(dir: &Path, cfg: &str) -> (Procs, Watchdog) {
    start_daemons_for(dir, cfg, &HOSTS)
}

/// [`start_daemons`] with SIU daemons for `sius` only (the other hosts embed theirs).
fn start_daemons_for(dir: &Path, cfg: &str, sius: &[&str]) -> (Procs, Watchdog) {
    let mut procs = Procs::default();
    let mut admins = Vec::new();
    let admin = free_tcp();
    procs.0.push(spawn(
        dir,
        "tm0",
        &["tm", "--config", cfg, "--name", "tm0", "--admin", &admin],
    ));
    admins.push(("tm0".to_string(), admin));
    for &h in sius {
        let (label, admin) = (format!("siu-{h}"), free_tcp());
        procs.0.push(spawn(
            dir,
            &label,
            &["siu", "--config", cfg, "--host", h, "--admin", &admin],
        ));
        admins.push((label, admin));
    }
    let admins: Vec<(&str, &str)> = admins
        .iter()
        .map(|(l, a)| (l.as_str(), a.as_str()))
        .collect();
    (procs, Watchdog::new(dir, &admins))
}

/// Starts the bank application of `host`: stdout in `DIR/LABEL.out`, stderr in `.log`.
fn bank(dir: &Path, label: &str, cfg: &str, host: &str, transfers: &str) -> Child {
    bank_with(dir, label, cfg, host, transfers, &[])
}

/// [`bank`] with extra flags.
fn bank_with(
    dir: &Path,
    label: &str,
    cfg: &str,
    host: &str,
    transfers: &str,
    extra: &[&str],
) -> Child {
    let out = File::create(dir.join(format!("{label}.out"))).unwrap();
    let err = File::create(dir.join(format!("{label}.log"))).unwrap();
    Command::new(bank_bin())
        .args(["--config", cfg, "--host", host, "--transfers", transfers])
        .args(["--timeout-s", "60"])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .spawn()
        .unwrap()
}

/// Runs the four applications `RERUNS` times against the same daemons and checks each run;
/// `watch` fails it within seconds should logical time stop.
fn reruns(dir: &Path, cfg: &str, watch: &mut Watchdog) {
    let until = Instant::now() + GUARD;
    for run in 0..RERUNS {
        run_once(dir, cfg, watch, run, until, &[]);
    }
}

/// Runs the four applications once (those of `embedded` with `--embedded-siu`) and checks
/// that every one saw the total unchanged and that every copy agrees at the end.
fn run_once(
    dir: &Path,
    cfg: &str,
    watch: &mut Watchdog,
    run: usize,
    until: Instant,
    embedded: &[&str],
) {
    let mut apps: Vec<Child> = HOSTS
        .iter()
        .map(|h| {
            let extra: &[&str] = if embedded.contains(h) {
                &["--embedded-siu"]
            } else {
                &[]
            };
            bank_with(dir, &format!("run{run}-{h}"), cfg, h, TRANSFERS, extra)
        })
        .collect();
    let mut copies: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for (h, app) in HOSTS.iter().zip(&mut apps) {
        let status = watch.wait(app, until);
        let out = std::fs::read_to_string(dir.join(format!("run{run}-{h}.out"))).unwrap();
        assert!(
            status.is_some_and(|s| s.success()),
            "run {run}: bank {h} ended with {status:?}: {out}\n{}",
            logs(dir)
        );
        let v: serde_json::Value = serde_json::from_str(&out).unwrap();
        let expected = v["expected"].as_u64().unwrap();
        let totals = v["totals"].as_array().unwrap();
        assert!(totals.len() >= 2, "{out}");
        assert!(
            totals.iter().all(|t| t.as_u64() == Some(expected)),
            "run {run}: {h} saw the total change: {out}"
        );
        for (addr, value) in v["copies"].as_object().unwrap() {
            copies
                .entry(addr.clone())
                .or_default()
                .push(value.as_u64().unwrap());
        }
    }
    // Four pages of four accounts, each held by two hosts: every copy agrees.
    assert_eq!(copies.len(), 16, "run {run}: {copies:?}");
    for (addr, values) in &copies {
        assert_eq!(values.len(), 2, "run {run}: {addr} {values:?}");
        assert_eq!(values[0], values[1], "run {run}: copies of {addr} differ");
    }
}

/// Two hosts embed their SIUs in the bank (`ConnectOptions::embedded_siu`), two attach to SIU
/// daemons; over QUIC with mutual TLS, so the embedded SIUs present their host's certificate.
#[test]
fn banks_with_embedded_sius_beside_siu_daemons_over_quic_lose_nothing() {
    let dir = scratch("bank-embedded");
    let cfg = quic_cluster(&dir);
    let cfg = cfg.to_str().unwrap();
    let embedded = [HOSTS[0], HOSTS[2]];
    let daemons: Vec<&str> = HOSTS
        .iter()
        .copied()
        .filter(|h| !embedded.contains(h))
        .collect();
    let (_daemons, mut watch) = start_daemons_for(&dir, cfg, &daemons);
    run_once(&dir, cfg, &mut watch, 0, Instant::now() + GUARD, &embedded);
}

#[test]
fn applications_rerun_against_running_udp_daemons_lose_nothing() {
    let dir = scratch("bank-udp");
    let cfg = cluster(&dir, &free_addrs(9), "kind = \"udp\"");
    let cfg = cfg.to_str().unwrap();
    let (_daemons, mut watch) = start_daemons(&dir, cfg);
    reruns(&dir, cfg, &mut watch);
}

#[test]
fn applications_rerun_against_running_quic_daemons_lose_nothing() {
    let dir = scratch("bank-quic");
    let cfg = quic_cluster(&dir);
    let cfg = cfg.to_str().unwrap();
    let (_daemons, mut watch) = start_daemons(&dir, cfg);
    reruns(&dir, cfg, &mut watch);
}

#[test]
fn a_second_application_on_a_host_is_refused_clearly() {
    let dir = scratch("bank-second");
    let cfg = cluster(&dir, &free_addrs(9), "kind = \"udp\"");
    let cfg = cfg.to_str().unwrap();
    let _daemons = start_daemons(&dir, cfg);
    // The first application holds h0's app address while it waits in its start barrier.
    let mut first = bank(&dir, "first", cfg, "h0", "1");
    std::thread::sleep(Duration::from_millis(500));
    let mut second = bank(&dir, "second", cfg, "h0", "1");
    let status = wait_guarded(&mut second, Instant::now() + GUARD);
    let err = std::fs::read_to_string(dir.join("second.log")).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(1), "{err}");
    assert!(
        err.contains("another application of host `h0` is attached")
            && err.contains("one application per host"),
        "{err}"
    );
    let _ = first.kill();
    let _ = first.wait();
}

#[test]
fn an_siu_restarted_under_running_applications_reports_restarted() {
    let dir = scratch("bank-restart");
    let cfg = cluster(&dir, &free_addrs(9), "kind = \"udp\"");
    let cfg = cfg.to_str().unwrap();
    let (mut daemons, _) = start_daemons(&dir, cfg);
    let mut apps: Vec<Child> = HOSTS
        .iter()
        .map(|h| bank(&dir, &format!("long-{h}"), cfg, h, "100000000"))
        .collect();
    // Let them get going (a liveness wait, not a measurement), then kill h2's SIU and start it
    // again.
    std::thread::sleep(Duration::from_secs(3));
    let (label, siu) = &mut daemons.0[3];
    assert_eq!(label, "siu-h2");
    siu.kill().unwrap();
    siu.wait().unwrap();
    daemons.0.push(spawn(
        &dir,
        "siu-h2-again",
        &["siu", "--config", cfg, "--host", "h2", "--no-admin"],
    ));
    let until = Instant::now() + GUARD;
    for (h, app) in HOSTS.iter().zip(&mut apps) {
        let status = wait_guarded(app, until);
        let err = std::fs::read_to_string(dir.join(format!("long-{h}.log"))).unwrap();
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(1),
            "bank {h} did not fail: {err}\n{}",
            logs(&dir)
        );
        assert!(err.contains("restarted"), "bank {h}: {err}");
        assert!(
            !err.contains("timed out"),
            "bank {h} timed out instead: {err}"
        );
    }
}

#[test]
fn the_async_twin_connects_joins_and_reads_as_a_future() {
    use isotach_smm::testkit::block_on;
    use isotach_smm::{Addr, ConnectOptions, Width, connect_shared};
    let dir = scratch("bank-async");
    let cfg = cluster(&dir, &free_addrs(9), "kind = \"udp\"");
    let _daemons = start_daemons(&dir, cfg.to_str().unwrap());
    let (smm, pump, report) = connect_shared(&cfg, "h0", &ConnectOptions::default()).unwrap();
    // Nobody else is attached: h0's pages had no current copy and start empty.
    let mut empty = report.pages_started_empty.clone();
    empty.sort_unstable();
    assert_eq!(empty, vec![0, 3], "{report:?}");
    let x = Addr::new(0, 1);
    let r = smm.with(|n| {
        let mut iso = n.isochron();
        iso.write(x, Width::W64, 77).unwrap();
        let r = iso.read(x, Width::W64).unwrap();
        iso.end().unwrap();
        r
    });
    assert_eq!(block_on(smm.read(r)), Ok(77));
    drop(pump);
}
