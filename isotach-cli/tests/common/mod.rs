//! Helpers shared by the tests that run `isotach` daemons and applications as processes:
//! loopback configs on ports no other test gets, spawning with a log file per process,
//! liveness-guarded waits, and killing every child when a test ends (also on failure).
// Each test file uses a different subset.
#![allow(dead_code)]

use std::fs::File;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
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

/// Loopback addresses on distinct free ports (see [`free_port`]).
pub(crate) fn free_addrs(n: usize) -> Vec<String> {
    (0..n)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect()
}

/// A loopback port no other caller gets: not this process (any thread, any test) nor another
/// process using this allocator at the same time (a parallel test binary), and not one the
/// kernel hands out for port 0 (the range lies below the ephemeral range), so a daemon can
/// bind it later — also again after a restart — as TCP or UDP on 127.0.0.1.
///
/// Each port is claimed for the life of this process by a UDP socket bound to the same port
/// on [`CLAIM_IP`] (another loopback address, so the claim never stands in the daemon's way;
/// the kernel releases it when the process exits, also on a crash), and checked free for TCP
/// and UDP on 127.0.0.1 before it is handed out.
pub(crate) fn free_port() -> u16 {
    use std::collections::BTreeSet;
    use std::sync::Mutex;
    static CLAIMED: Mutex<(Vec<UdpSocket>, BTreeSet<u16>)> =
        Mutex::new((Vec::new(), BTreeSet::new()));
    let (lo, hi) = port_range();
    let span = u32::from(hi - lo);
    let mut claimed = CLAIMED
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (claims, given) = &mut *claimed;
    // Start where another process is unlikely to, so that processes rarely meet.
    let seed = std::process::id().wrapping_mul(2_654_435_761) ^ given.len() as u32;
    for i in 0..span {
        let port = lo + (seed.wrapping_add(i) % span) as u16;
        if !given.insert(port) {
            continue;
        }
        let Ok(claim) = UdpSocket::bind((CLAIM_IP, port)) else {
            continue; // another process claimed it
        };
        // Kept either way: a port something else holds is not tried again.
        claims.push(claim);
        if TcpListener::bind(("127.0.0.1", port)).is_ok()
            && UdpSocket::bind(("127.0.0.1", port)).is_ok()
        {
            return port;
        }
    }
    panic!("no free port in {lo}..{hi} (claims are bound on {CLAIM_IP})");
}

/// The loopback address port claims are bound to (Linux routes all of 127.0.0.0/8 to `lo`).
const CLAIM_IP: Ipv4Addr = Ipv4Addr::new(127, 77, 0, 1);

/// Ports to hand out: below the kernel's ephemeral range (where port-0 binds and outgoing
/// connections get theirs), above the well-known services.
fn port_range() -> (u16, u16) {
    let ephemeral_lo = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    if ephemeral_lo > 12_000 {
        (10_000, ephemeral_lo)
    } else {
        // An unusual kernel setting: no range is safe from port-0 binds; stay above it.
        (ephemeral_lo.max(61_000), 65_000)
    }
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

/// A free loopback address for a TCP service (admin, metrics; see [`free_port`]).
pub(crate) fn free_tcp() -> String {
    format!("127.0.0.1:{}", free_port())
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
    let mut last = None;
    loop {
        if let Some(v) = status(admin, &[]) {
            if done(&v) {
                return v;
            }
            last = Some(v);
        }
        assert!(
            Instant::now() < until,
            "status of {admin} never satisfied the condition; last reply: {}\n{}",
            last.as_ref()
                .map_or_else(|| "none".to_string(), ToString::to_string),
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

/// A cluster config: one TM `tm0`, then `hosts`; `a` = [tm listen, then siu and app of each
/// host]; `transport` is the body of the `[transport]` table.
pub(crate) fn hosts_config(hosts: &[&str], a: &[String], transport: &str) -> String {
    let mut t = format!(
        "[transport]\n{transport}\n\n[[switch]]\nname = \"tm0\"\nlisten = \"{}\"\n",
        a[0]
    );
    for (i, h) in hosts.iter().enumerate() {
        t.push_str(&format!(
            "\n[[host]]\nname = \"{h}\"\nswitch = \"tm0\"\nsiu = \"{}\"\napp = \"{}\"\n",
            a[1 + 2 * i],
            a[2 + 2 * i]
        ));
    }
    t
}
