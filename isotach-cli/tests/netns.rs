//! `deploy/netns/cluster.sh`: three network namespaces joined by a bridge, a TM, an SIU and a
//! philosopher per namespace (one TM for all, then one TM per namespace). Runs only as root
//! with `ip netns`; otherwise prints why it skipped and passes. Every namespace the run made is
//! gone when the test ends, also when it fails: the script tears down on exit and on SIGTERM,
//! and a guard here kills what is left in this run's namespaces and deletes them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_isotach");
/// The script's own deadline for the philosophers (a liveness guard, never an assertion).
const DEADLINE_S: u64 = 30;
/// How long this test lets one script run before stopping it.
const GUARD: Duration = Duration::from_secs(45);

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/netns/cluster.sh")
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
                let _ = Command::new("kill")
                    .args(["-TERM", &c.id().to_string()])
                    .status();
                let until = Instant::now() + Duration::from_secs(10);
                while Instant::now() < until && c.try_wait().ok().flatten().is_none() {
                    std::thread::sleep(Duration::from_millis(50));
                }
                let _ = c.kill();
            }
            let _ = c.wait();
        }
        for ns in namespaces(&self.prefix) {
            if let Ok(out) = Command::new("ip").args(["netns", "pids", &ns]).output() {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-KILL", pid]).status();
                }
            }
            let _ = Command::new("ip").args(["netns", "del", &ns]).status();
        }
    }
}

/// Whether this machine can run the script (root, `ip netns`, bridge and veth); why not.
fn can_run() -> Result<(), String> {
    let out = Command::new("bash")
        .arg(script())
        .arg("--probe")
        .output()
        .map_err(|e| format!("cannot run bash: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// Runs `cluster.sh 3 MEALS` with `tms` token managers; returns its stdout.
fn run_cluster(tms: u32, meals: u32) -> String {
    let prefix = format!("isotach-t{}-{tms}", std::process::id());
    let mut t = Teardown {
        prefix: format!("{prefix}-"),
        child: None,
    };
    let dir = std::env::temp_dir().join(format!("{prefix}-out"));
    std::fs::create_dir_all(&dir).unwrap();
    let (out_path, err_path) = (dir.join("stdout"), dir.join("stderr"));
    let child = Command::new("bash")
        .arg(script())
        .args(["3", &meals.to_string()])
        .env("ISOTACH", BIN)
        .env("ISOTACH_NETNS_PREFIX", &prefix)
        .env("TMS", tms.to_string())
        .env("DEADLINE_S", DEADLINE_S.to_string())
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .unwrap();
    let child = t.child.insert(child);
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
        "cluster.sh still running after {GUARD:?}\n{stdout}\n{stderr}"
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "cluster.sh exited with {status:?}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    assert!(left.is_empty(), "cluster.sh left namespaces: {left:?}");
    stdout
}

#[test]
fn three_namespace_cluster_runs_philosophers_and_tears_down() {
    if let Err(why) = can_run() {
        eprintln!(
            "SKIPPED three_namespace_cluster_runs_philosophers_and_tears_down: {why} \
             (run as root with `ip netns` to exercise deploy/netns/cluster.sh)"
        );
        return;
    }
    for tms in [1, 3] {
        let meals = 10;
        let out = run_cluster(tms, meals);
        let summary = format!("netns cluster: K=3 tms={tms} meals={meals}: ok:");
        assert!(out.contains(&summary), "{out}");
        for h in 0..3 {
            let line = format!("philosopher h{h}: {meals} meals");
            assert!(out.contains(&line), "no `{line}` in\n{out}");
        }
        eprintln!("{}", out.trim_end());
    }
}
