//! The network-namespace scripts of `deploy/netns/`, run for real when this machine can (root,
//! `ip netns`; for the bench also `ping`, and `tc` netem to shape the links), otherwise each
//! test prints why it skipped and passes.
//!
//! - `cluster.sh`: three namespaces joined by a bridge, a TM, an SIU and a philosopher per
//!   namespace (one TM for all, then one TM per namespace).
//! - `bench.sh`: a tree of three token managers (a root and two leaves) over eight host
//!   namespaces, the bank workload for two seconds, the ping baseline and the figures; then
//!   the same interrupted by SIGTERM and the same failing on its deadline. Its application,
//!   `isotach transfers`, refusing bad usage is checked anywhere (no root needed).
//!
//! Every namespace a run made is gone when the test ends, also when it fails: the scripts tear
//! down on exit and on SIGTERM (checked here before anything else cleans up), and a guard here
//! kills what is left in the run's namespaces and deletes them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_isotach");
/// The cluster script's own deadline for the philosophers (a liveness guard, never an
/// assertion).
const DEADLINE_S: u64 = 30;
/// How long this test lets one script run before stopping it.
const GUARD: Duration = Duration::from_secs(45);

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/netns")
        .join(name)
}

/// Names of the network namespaces that start with `prefix`.
fn namespaces(prefix: &str) -> Vec<String> {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return Vec::new();
    };
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(prefix))
        .map(str::to_string)
        .collect()
}

/// Processes running in namespace `ns`.
fn pids_in(ns: &str) -> Vec<String> {
    Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default()
}

fn sigterm(c: &Child) {
    let _ = Command::new("kill")
        .args(["-TERM", &c.id().to_string()])
        .status();
}

/// Stops the script if it still runs, then removes whatever the run left in its namespaces.
struct Teardown {
    prefix: String,
    child: Option<Child>,
}

impl Drop for Teardown {
    fn drop(&mut self) {
        if let Some(c) = &mut self.child {
            if c.try_wait().ok().flatten().is_none() {
                // SIGTERM first: the script's trap tears down in order.
                sigterm(c);
                let until = Instant::now() + Duration::from_secs(10);
                while Instant::now() < until && c.try_wait().ok().flatten().is_none() {
                    std::thread::sleep(Duration::from_millis(50));
                }
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        for ns in namespaces(&self.prefix) {
            for pid in pids_in(&ns) {
                let _ = Command::new("kill").args(["-KILL", &pid]).status();
            }
            let _ = Command::new("ip").args(["netns", "del", &ns]).status();
        }
    }
}

/// Runs `bash SCRIPT --probe`: its first line when it can run here, or why not.
fn probe(name: &str) -> Result<String, String> {
    let out = Command::new("bash")
        .arg(script(name))
        .arg("--probe")
        .output()
        .map_err(|e| format!("cannot run bash: {e}"))?;
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    if out.status.success() {
        Ok(said)
    } else {
        Err(said)
    }
}

/// What one run of a script did.
struct Run {
    /// `None`: still running when the guard ran out (then stopped).
    status: Option<ExitStatus>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn code(&self) -> Option<i32> {
        self.status.and_then(|s| s.code())
    }
}

/// Runs `bash SCRIPT ARGS` with `env`, its namespaces named `PREFIX-…`; `during` may act on
/// the running script (it returns once it has). Asserts that the script removed every
/// namespace of the run itself once it exited.
fn run_script(
    name: &str,
    args: &[&str],
    env: &[(&str, &str)],
    prefix: &str,
    during: impl FnOnce(&Child),
) -> Run {
    let mut t = Teardown {
        prefix: format!("{prefix}-"),
        child: None,
    };
    let dir = std::env::temp_dir().join(format!("{prefix}-out"));
    std::fs::create_dir_all(&dir).unwrap();
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let child = Command::new("bash")
        .arg(script(name))
        .args(args)
        .env("ISOTACH", BIN)
        .env("ISOTACH_NETNS_PREFIX", prefix)
        .env("NO_COLOR", "1")
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let child = t.child.insert(child);
    during(child);
    let until = Instant::now() + GUARD;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if Instant::now() >= until {
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    let _ = std::fs::remove_dir_all(&dir);
    // The script's own teardown leaves nothing behind (checked before the guard's cleanup).
    let left = if status.is_some() {
        namespaces(&t.prefix)
    } else {
        Vec::new()
    };
    drop(t);
    assert!(
        namespaces(&format!("{prefix}-")).is_empty(),
        "namespaces left behind"
    );
    assert!(
        status.is_some(),
        "{name} still running after {GUARD:?}\n{stdout}\n{stderr}"
    );
    assert!(
        left.is_empty(),
        "{name} left namespaces: {left:?}\n{stderr}"
    );
    Run {
        status,
        stdout,
        stderr,
    }
}

/// Asserts the run exited 0; returns its stdout.
fn succeeded(name: &str, r: Run) -> String {
    assert!(
        r.status.is_some_and(|s| s.success()),
        "{name} exited with {:?}\nstdout:\n{}\nstderr:\n{}",
        r.status,
        r.stdout,
        r.stderr
    );
    r.stdout
}

#[test]
fn three_namespace_cluster_runs_philosophers_and_tears_down() {
    if let Err(why) = probe("cluster.sh") {
        eprintln!(
            "SKIPPED three_namespace_cluster_runs_philosophers_and_tears_down: {why} \
             (run as root with `ip netns` to exercise deploy/netns/cluster.sh)"
        );
        return;
    }
    for tms in [1, 3] {
        let meals = 10;
        let prefix = format!("isotach-t{}-{tms}", std::process::id());
        let (tms_s, deadline) = (tms.to_string(), DEADLINE_S.to_string());
        let env = [("TMS", tms_s.as_str()), ("DEADLINE_S", deadline.as_str())];
        let run = run_script(
            "cluster.sh",
            &["3", &meals.to_string()],
            &env,
            &prefix,
            |_| (),
        );
        let out = succeeded("cluster.sh", run);
        let summary = format!("netns cluster: K=3 tms={tms} meals={meals}: ok:");
        assert!(out.contains(&summary), "{out}");
        for h in 0..3 {
            let line = format!("philosopher h{h}: {meals} meals");
            assert!(out.contains(&line), "no `{line}` in\n{out}");
        }
        eprintln!("{}", out.trim_end());
    }
}

/// Whether the bench can run here; with `--unshaped` when the kernel has no netem. `None`
/// (after saying why) when it cannot run at all.
fn bench_shaping(test: &str) -> Option<Vec<&'static str>> {
    match probe("bench.sh") {
        Err(why) => {
            eprintln!(
                "SKIPPED {test}: {why} (run as root with `ip netns` and `ping` to exercise \
                 deploy/netns/bench.sh)"
            );
            None
        }
        Ok(said) if said.contains("unshaped only") => {
            eprintln!(
                "{test}: {said}; running the bench on unshaped veth links (the netem shaping \
                 is not exercised on this machine)"
            );
            Some(vec!["--unshaped"])
        }
        Ok(_) => Some(vec!["--delay-us", "50", "--jitter-us", "5"]),
    }
}

/// The small bench: 8 hosts under 2 leaves of a root switch (3 TMs), 2 s of transfers.
const SMALL: [&str; 10] = [
    "--hosts",
    "8",
    "--leaves",
    "2",
    "--seconds",
    "2",
    "--clients",
    "2",
    "--pings",
    "50",
];

fn number(v: &serde_json::Value, key: &str) -> f64 {
    v[key]
        .as_f64()
        .unwrap_or_else(|| panic!("no number `{key}` in {v}"))
}

/// Runs `bench.sh ARGS` with the shaping this machine allows and `--json` (namespaces named
/// `isotach-TAG<pid>-…`); its report, with the shaping flags used. `None` (with a message)
/// when the machine cannot run it.
fn bench_json(
    test: &str,
    tag: &str,
    args: &[&str],
) -> Option<(serde_json::Value, Vec<&'static str>)> {
    let shaping = bench_shaping(test)?;
    let prefix = format!("isotach-{tag}{}", std::process::id());
    let mut args = args.to_vec();
    args.extend(&shaping);
    args.push("--json");
    let deadline = DEADLINE_S.to_string();
    let out = succeeded(
        "bench.sh",
        run_script(
            "bench.sh",
            &args,
            &[("DEADLINE_S", &deadline)],
            &prefix,
            |_| (),
        ),
    );
    eprintln!("{}", out.trim_end());
    let line = out.lines().last().unwrap_or_default();
    let v = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {out}"));
    Some((v, shaping))
}

#[test]
fn netns_bench_runs_the_bank_over_a_tree_and_reports_ratios_to_ping() {
    let test = "netns_bench_runs_the_bank_over_a_tree_and_reports_ratios_to_ping";
    let Some((v, shaping)) = bench_json(test, "b", &SMALL) else {
        return;
    };
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["total_conserved"], true, "{v}");
    assert_eq!(v["siu"], "daemon", "{v}");
    assert_eq!((v["hosts"].as_u64(), v["tms"].as_u64()), (Some(8), Some(3)));
    assert_eq!(v["shaped"], shaping[0] != "--unshaped", "{v}");
    // 50 µs links (or none) leave the config's 10 ms lost-token timer as it is.
    assert_eq!(v["token_timeout_us"], 10_000, "{v}");
    assert!(number(&v, "transfers") > 0.0, "{v}");
    // Every token manager of the tree sent waves.
    for s in ["s0", "s1", "s2"] {
        assert!(v["tm_waves"][s].as_u64().is_some_and(|w| w > 0), "{v}");
    }
    assert_eq!(
        v["ping_links"], 4,
        "h0 and h7 hang off different leaves: {v}"
    );
    let ping = number(&v, "ping_rtt_p50_us");
    assert!(ping > 0.0 && number(&v, "ping_samples") >= 40.0, "{v}");
    let (p50, p99) = (
        number(&v, "transfer_latency_p50_us"),
        number(&v, "transfer_latency_p99_us"),
    );
    let period = number(&v, "pulse_period_us");
    assert!(0.0 < p50 && p50 <= p99 && period > 0.0, "{v}");
    // The ratios are the figures over the same run's ping.
    for (ratio, figure) in [
        ("latency_p50_to_ping_ratio", p50),
        ("latency_p99_to_ping_ratio", p99),
        ("pulse_period_to_ping_ratio", period),
    ] {
        let r = number(&v, ratio);
        assert!((r - figure / ping).abs() <= 0.01 + r * 0.01, "{ratio}: {v}");
    }
    let per_rtt = number(&v, "transfers_per_ping_rtt");
    let expect = number(&v, "transfers_per_s") * ping / 1e6;
    assert!((per_rtt - expect).abs() <= 0.01 + expect * 0.01, "{v}");
    if shaping[0] != "--unshaped" {
        // Four shaped links of 50 µs each way: the ping across the root takes 400 µs at least
        // (jitter of ±5 µs per link); two links, half that. Only these floors, which netem
        // guarantees, are asserted: how far above them a loaded machine lands is not.
        // (Unshaped, the two differ by a few µs, less than a loaded machine's noise.)
        assert!(ping >= 350.0, "{v}");
        let same = number(&v, "ping_same_leaf_rtt_p50_us");
        assert!(same >= 175.0, "{v}");
    }
}

/// Runs `bash vm.sh ARGS` with `env` added and no stdin: its status, stdout and stderr.
fn vm_run(args: &[&str], env: &[(&str, &str)]) -> (ExitStatus, String, String) {
    let out = Command::new("bash")
        .arg(script("vm.sh"))
        .args(args)
        .envs(env.iter().copied())
        .stdin(Stdio::null())
        .output()
        .unwrap();
    (
        out.status,
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The bench on netem-shaped links inside a throwaway VM (`deploy/netns/vm.sh`: a stock kernel
/// booted over this machine's root file system), for machines whose own kernel has no netem:
/// there the tests above run unshaped, and this is where the shaping is exercised. Small (two
/// hosts under one leaf, one second): under an emulating accelerator every instruction is
/// interpreted, so the links get 2 ms each way: a floor well above what emulation adds to a
/// ping (a few hundred µs), which the test asserts, with the bank balanced.
#[test]
fn netns_bench_shapes_links_with_netem_inside_a_vm() {
    let test = "netns_bench_shapes_links_with_netem_inside_a_vm";
    if let Ok(said) = probe("bench.sh")
        && !said.contains("unshaped only")
    {
        eprintln!("{test}: not needed: this kernel shapes links itself ({said})");
        return;
    }
    let said = match probe("vm.sh") {
        Ok(said) => said,
        Err(why) => {
            eprintln!(
                "SKIPPED {test}: {why} (install qemu-system-x86, busybox-static and \
                 linux-image-amd64 to exercise deploy/netns/vm.sh)"
            );
            return;
        }
    };
    eprintln!("{test}: {said}");
    let bench = script("bench.sh");
    let bench = bench.to_str().expect("a UTF-8 path");
    #[rustfmt::skip]
    let args = [
        "--timeout", "300", "--", "bash", bench, "--hosts", "2", "--leaves", "1",
        "--seconds", "1", "--clients", "2", "--pings", "20", "--delay-us", "2000",
        "--jitter-us", "0", "--json",
    ];
    let (status, stdout, stderr) = vm_run(
        &args,
        &[("ISOTACH", BIN), ("DEADLINE_S", "120"), ("NO_COLOR", "1")],
    );
    assert!(
        status.success(),
        "vm.sh exited with {status:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    eprintln!("{}", stdout.trim_end());
    let line = stdout.lines().last().unwrap_or_default();
    let v: serde_json::Value =
        serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {stdout}"));
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["shaped"], true, "{v}");
    assert_eq!(v["total_conserved"], true, "{v}");
    assert!(number(&v, "transfers") > 0.0, "{v}");
    // The lost-token timer outlasts a link's round trip: 8 × (2 ms + 0 jitter).
    assert_eq!(v["token_timeout_us"], 16_000, "{v}");
    // h0 and h1 share the leaf: two links, 2 ms each way on each.
    assert_eq!(v["ping_links"], 2, "{v}");
    assert!(number(&v, "ping_rtt_p50_us") >= 8_000.0, "{v}");
}

/// `vm.sh` itself: the command's stdout, stderr and exit status come back as they were, the
/// guest's writes stay in the guest, a command past `--timeout` is stopped with 124, SIGTERM
/// stops the VM with 130, and no run leaves its work directory behind.
#[test]
fn vm_passes_output_and_status_back_and_stops_at_its_timeout_or_sigterm() {
    let test = "vm_passes_output_and_status_back_and_stops_at_its_timeout_or_sigterm";
    if let Err(why) = probe("vm.sh") {
        eprintln!("SKIPPED {test}: {why}");
        return;
    }
    // The runs' work directories go in a directory of this test's own (other tests boot VMs
    // at the same time), which must be empty at the end.
    let work = std::env::temp_dir().join(format!("isotach-vm-work-{}", std::process::id()));
    std::fs::create_dir_all(&work).unwrap();
    let marker = std::env::temp_dir().join(format!("isotach-vm-test-{}", std::process::id()));
    let inner = format!(
        "echo to-stdout; echo to-stderr >&2; echo written > {}; exit 7",
        marker.display()
    );
    let work_dir = work.to_str().expect("a UTF-8 path");
    let (status, stdout, stderr) = vm_run(
        &["--timeout", "120", "--", "bash", "-c", &inner],
        &[("TMPDIR", work_dir)],
    );
    assert_eq!(status.code(), Some(7), "{stdout}\n{stderr}");
    assert_eq!(stdout, "to-stdout\n", "{stderr}");
    assert!(stderr.contains("to-stderr"), "{stderr}");
    assert!(
        !marker.exists(),
        "the guest wrote to the host's file system"
    );

    let (status, _, stderr) = vm_run(
        &["--timeout", "10", "--", "sleep", "600"],
        &[("TMPDIR", work_dir)],
    );
    assert_eq!(status.code(), Some(124), "{stderr}");
    assert!(stderr.contains("--timeout 10"), "{stderr}");

    // SIGTERM while the VM runs: exit 130, and by then QEMU (whose command line names the
    // run's work directory) is gone with the directory.
    let mut child = Command::new("bash")
        .arg(script("vm.sh"))
        .args(["--timeout", "120", "--", "sleep", "600"])
        .env("TMPDIR", &work)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let booting = |work: &Path| {
        Command::new("pgrep")
            .args(["-f", &format!("{}/isotach-vm.", work.display())])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    let until = Instant::now() + Duration::from_secs(30);
    while Instant::now() < until && !booting(&work) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(booting(&work), "QEMU never started");
    sigterm(&child);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    assert!(!booting(&work), "QEMU outlived vm.sh");

    let left: Vec<_> = std::fs::read_dir(&work).unwrap().flatten().collect();
    assert!(left.is_empty(), "work directories left behind: {left:?}");
    let _ = std::fs::remove_dir(&work);
}

/// The same bench with every host's SIU inside its application (`--embedded-siu`: no `isotach
/// siu` daemons), smaller: the bank still balances over the tree.
#[test]
fn netns_bench_runs_the_bank_with_embedded_sius() {
    let test = "netns_bench_runs_the_bank_with_embedded_sius";
    let args = [
        "--hosts",
        "4",
        "--leaves",
        "1",
        "--seconds",
        "1",
        "--pings",
        "20",
        "--embedded-siu",
    ];
    let Some((v, _)) = bench_json(test, "e", &args) else {
        return;
    };
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["siu"], "embedded", "{v}");
    assert_eq!(v["total_conserved"], true, "{v}");
    assert_eq!((v["hosts"].as_u64(), v["tms"].as_u64()), (Some(4), Some(2)));
    assert!(number(&v, "transfers") > 0.0, "{v}");
}

#[test]
fn netns_bench_tears_down_on_sigterm_and_on_failure() {
    let test = "netns_bench_tears_down_on_sigterm_and_on_failure";
    let Some(shaping) = bench_shaping(test) else {
        return;
    };
    // SIGTERM once the applications run (two processes in the last host's namespace: its SIU
    // and its application).
    let prefix = format!("isotach-i{}", std::process::id());
    let mut args = SMALL.to_vec();
    args[5] = "30";
    args.extend(&shaping);
    let last = format!("{prefix}-h7");
    let run = run_script("bench.sh", &args, &[], &prefix, |child| {
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until && pids_in(&last).len() < 2 {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(pids_in(&last).len() >= 2, "the applications never started");
        sigterm(child);
    });
    assert_eq!(run.code(), Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("interrupted"), "{}", run.stderr);

    // A deadline shorter than the window: the run fails, prints the logs and tears down.
    let prefix = format!("isotach-f{}", std::process::id());
    let run = run_script("bench.sh", &args, &[("DEADLINE_S", "2")], &prefix, |_| ());
    assert_eq!(run.code(), Some(1), "{}", run.stderr);
    assert!(run.stderr.contains("FAILED"), "{}", run.stderr);
    assert!(run.stderr.contains("--- app-h0.log"), "{}", run.stderr);
}

/// `isotach transfers` (the bench's application) refuses bad usage with exit 2 and a message
/// naming what is wrong, before it connects to anything: runs anywhere.
#[test]
fn transfers_app_refuses_bad_usage_before_connecting() {
    let dir = std::env::temp_dir().join(format!("isotach-transfers-usage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("cluster.toml");
    std::fs::write(
        &config,
        "[transport]\nkind = \"udp\"\n\n[[switch]]\nname = \"s0\"\nlisten = \"127.0.0.1:1\"\n\n\
         [[host]]\nname = \"h0\"\nswitch = \"s0\"\nsiu = \"127.0.0.1:2\"\napp = \"127.0.0.1:3\"\n\n\
         [[host]]\nname = \"h1\"\nswitch = \"s0\"\nsiu = \"127.0.0.1:4\"\napp = \"127.0.0.1:5\"\n",
    )
    .unwrap();
    let cfg = config.to_str().unwrap();
    let cases: [(&[&str], &str); 4] = [
        (&["--host", "h9"], "no host named `h9`"),
        // 4096 accounts on 2 pages: 2048 a page, more than a page's 1024 slots.
        (&["--host", "h0", "--accounts", "4096"], "slots of a page"),
        (&["--host", "h0", "--seconds", "0"], "0.01..=3600"),
        (&["--host", "h0", "--idiom", "swap"], "swap"),
    ];
    for (args, says) in cases {
        let out = Command::new(BIN)
            .args(["transfers", "--config", cfg])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: no `{says}` in {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
