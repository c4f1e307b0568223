//! Helpers shared by the tests that run `isotach` daemons and applications as processes:
//! loopback configs on free ports, spawning with a log file per process, liveness-guarded
//! waits, and killing every child when a test ends (also on failure).
// Each test file uses a different subset.
#![allow(dead_code)]

use std::fs::File;
use std::net::{TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_isotach");
/// Liveness guard for whole runs (a loaded 2-core machine may be slow; never an assertion).
pub(crate) const GUARD: Duration = Duration::from_secs(180);

/// Kills every child it holds when dropped.
#[derive(Debug, Default)]
pub(crate) struct Procs(pub(crate) Vec<(String, Child)>);

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// A fresh scratch directory for one test.
pub(crate) fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("isotach-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Free loopback UDP ports: bound to port 0 and released (all held until every one is picked,
/// so they are distinct).
pub(crate) fn free_addrs(n: usize) -> Vec<String> {
    let socks: Vec<UdpSocket> = (0..n)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    socks
        .iter()
        .map(|s| s.local_addr().unwrap().to_string())
        .collect()
}

/// A UDP cluster config with one token manager `tm0` and hosts `alpha` and `beta`;
/// `a` = [tm listen, alpha siu, alpha app, beta siu, beta app].
pub(crate) fn two_host_config(a: &[String]) -> String {
    format!(
        r#"
[transport]
kind = "udp"

[[switch]]
name = "tm0"
listen = "{}"

[[host]]
name = "alpha"
switch = "tm0"
siu = "{}"
app = "{}"

[[host]]
name = "beta"
switch = "tm0"
siu = "{}"
app = "{}"
"#,
        a[0], a[1], a[2], a[3], a[4]
    )
}

/// Starts `isotach ARGS` with stdout and stderr in `DIR/LABEL.log`.
pub(crate) fn spawn(dir: &Path, label: &str, args: &[&str]) -> (String, Child) {
    let log = File::create(dir.join(format!("{label}.log"))).unwrap();
    let child = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap();
    (label.to_string(), child)
}

/// The child's exit status, or `None` if it is still running at `until`.
pub(crate) fn wait_guarded(c: &mut Child, until: Instant) -> Option<ExitStatus> {
    while Instant::now() < until {
        if let Some(s) = c.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Sends SIGTERM to the child.
pub(crate) fn sigterm(c: &Child) {
    let pid = c.id().to_string();
    let ok = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
    assert!(ok.success(), "kill -TERM {pid}");
}

/// Every `.log` file of the directory, for failure messages.
pub(crate) fn logs(dir: &Path) -> String {
    let mut all = String::new();
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        if e.path().extension().is_some_and(|x| x == "log") {
            let text = std::fs::read_to_string(e.path()).unwrap_or_default();
            all.push_str(&format!("--- {}\n{text}\n", e.path().display()));
        }
    }
    all
}

/// A free loopback TCP address (bound to port 0 and released).
pub(crate) fn free_tcp() -> String {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// `isotach status --admin ADDR --json ARGS`: the JSON object, or `None` if it failed (the
/// daemon may not be listening yet).
pub(crate) fn status(admin: &str, extra: &[&str]) -> Option<serde_json::Value> {
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
pub(crate) fn status_until(
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

/// `isotach cert init --dir DIR --name CLUSTER` and `cert issue` for each node.
pub(crate) fn make_pki(dir: &Path, cluster: &str, nodes: &[&str]) {
    let d = dir.to_str().unwrap();
    let isotach = |args: &[&str]| Command::new(BIN).args(args).output().unwrap();
    let out = isotach(&["cert", "init", "--dir", d, "--name", cluster]);
    assert!(out.status.success(), "cert init: {out:?}");
    for n in nodes {
        let out = isotach(&[
            "cert",
            "issue",
            "--dir",
            d,
            "--node",
            n,
            "--san",
            "127.0.0.1",
        ]);
        assert!(out.status.success(), "cert issue {n}: {out:?}");
    }
}
