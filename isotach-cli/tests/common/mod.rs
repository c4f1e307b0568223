//! Helpers shared by the tests that run `isotach` daemons and applications as processes:
//! loopback configs on ports no other test gets, spawning with a log file per process,
//! liveness-guarded waits, and killing every child when a test ends (also on failure).
// Each test file uses a different subset.
#![allow(dead_code)]

use std::fs::File;
use std::net::{Ipv4Addr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
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

/// Runs the built `isotach` with `args` to its end (`ISOTACH_SEED` unset, so a seed comes
/// only from the flags).
pub(crate) fn isotach(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .env_remove("ISOTACH_SEED")
        .output()
        .expect("run the isotach binary")
}

/// A run's stderr, as text.
pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The one JSON object on a run's stdout.
pub(crate) fn json(out: &Output) -> serde_json::Value {
    let stdout = String::from_utf8(out.stdout.clone()).expect("utf-8 stdout");
    assert_eq!(stdout.lines().count(), 1, "one JSON object: {stdout}");
    serde_json::from_str(&stdout).expect("stdout is JSON")
}

/// The JSON report of a run that must exit 0 (its stderr says why when it did not).
pub(crate) fn ok_json(out: &Output) -> serde_json::Value {
    assert_eq!(out.status.code(), Some(0), "{}", stderr(out));
    json(out)
}

/// A fresh scratch directory for one test: removed when the test passes, kept when it fails
/// (its logs say why). Declare it before the processes that write into it, so they are
/// stopped first (locals drop in reverse order).
pub(crate) fn scratch(name: &str) -> Scratch {
    use std::sync::atomic::{AtomicUsize, Ordering};
    // Unique within the process too: tests of one binary run in parallel.
    static N: AtomicUsize = AtomicUsize::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("isotach-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// A test's scratch directory ([`scratch`]).
#[derive(Debug)]
pub(crate) struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl AsRef<Path> for Scratch {
    fn as_ref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("kept for the failure: {}", self.0.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
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

/// Writes `text` as `DIR/cluster.toml`; returns its path.
pub(crate) fn write_config(dir: &Path, text: &str) -> String {
    let cfg = dir.join("cluster.toml");
    std::fs::write(&cfg, text).unwrap();
    cfg.to_str().unwrap().to_string()
}

/// Starts token manager `tm0` of config `cfg` (label `tm0`), with `ops` (`--admin ADDR`,
/// `--no-admin`, …).
pub(crate) fn spawn_tm(dir: &Path, cfg: &str, ops: &[&str]) -> (String, Child) {
    let mut args = vec!["tm", "--config", cfg, "--name", "tm0"];
    args.extend(ops);
    spawn(dir, "tm0", &args)
}

/// Starts the SIU of `host` of config `cfg` (label `siu-HOST`), with `ops`.
pub(crate) fn spawn_siu(dir: &Path, cfg: &str, host: &str, ops: &[&str]) -> (String, Child) {
    let mut args = vec!["siu", "--config", cfg, "--host", host];
    args.extend(ops);
    spawn(dir, &format!("siu-{host}"), &args)
}

/// Starts the philosopher of `host` of config `cfg` (label `philo-HOST`), eating `meals`.
pub(crate) fn spawn_philo(dir: &Path, cfg: &str, host: &str, meals: &str) -> (String, Child) {
    let args = ["philo", "--config", cfg, "--host", host, "--meals", meals];
    spawn(dir, &format!("philo-{host}"), &args)
}

/// The child's exit status, or `None` if it is still running at `until`.
pub(crate) fn wait_guarded(c: &mut Child, until: Instant) -> Option<ExitStatus> {
    wait_checking(c, until, || {})
}

/// [`wait_guarded`], calling `check` between polls.
fn wait_checking(c: &mut Child, until: Instant, mut check: impl FnMut()) -> Option<ExitStatus> {
    while Instant::now() < until {
        if let Some(s) = c.try_wait().unwrap() {
            return Some(s);
        }
        check();
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
    status_checking(dir, admin, until, done, || {})
}

/// [`status_until`], calling `check` between polls.
fn status_checking(
    dir: &Path,
    admin: &str,
    until: Instant,
    done: impl Fn(&serde_json::Value) -> bool,
    mut check: impl FnMut(),
) -> serde_json::Value {
    let mut last = None;
    loop {
        if let Some(v) = status(admin, &[]) {
            if done(&v) {
                return v;
            }
            last = Some(v);
        }
        check();
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

/// How long a running cluster's logical time may stand still before a [`Watchdog`] fails the
/// test. A healthy loopback cluster advances thousands of pulses a second, also on a loaded
/// 2-core machine; no test here pauses logical time on purpose while it is watched.
pub(crate) const STALL: Duration = Duration::from_secs(5);
/// How long a watched daemon may take to start logical time (or to resume it in a new
/// generation after [`Watchdog::restarting`]): process start, links up (AM retransmits a hello
/// to a peer that was not up yet after up to 1 s), QUIC handshakes.
pub(crate) const STARTUP: Duration = Duration::from_secs(30);
/// How often a [`Watchdog`] asks every daemon for its status.
const WATCH_EVERY: Duration = Duration::from_millis(300);
/// A daemon whose last status reply is older than this has stopped answering.
const SILENT: Duration = Duration::from_millis(2500);

/// One daemon a [`Watchdog`] watches.
#[derive(Debug)]
struct Watched {
    label: String,
    admin: String,
    /// `(generation, waves, sendclock, recvclock)` when it last changed.
    clocks: Option<(u64, u64, u64, u64)>,
    /// When the clocks last changed (or when watching began or restarted).
    since: Instant,
    /// Whether they ever changed since watching began or restarted.
    moved: bool,
    /// The last status reply, and when it came.
    last: Option<(serde_json::Value, Instant)>,
}

/// Watches that logical time advances at every daemon of a test, through `isotach status
/// --json` of their admin services, and fails the test within [`STALL`] of it stopping —
/// instead of at the test's long liveness guard — naming the daemon(s) that stopped, with
/// their last status and the tail of every log in the test's directory.
///
/// Progress is any change of a daemon's generation, waves, sendclock or recvclock. Until a
/// daemon's clocks first move it has [`STARTUP`] instead; a running daemon that stops
/// answering for [`STALL`] is stuck too. Call [`Watchdog::check`] (or wait
/// with [`Watchdog::status_until`] / [`Watchdog::wait`], which check as they poll) only while
/// logical time is expected to advance, and [`Watchdog::restarting`] when the test stops it
/// on purpose (a daemon killed or frozen) and expects it to resume.
#[derive(Debug)]
pub(crate) struct Watchdog {
    dir: PathBuf,
    daemons: Vec<Watched>,
    stall: Duration,
    polled: Option<Instant>,
}

impl Watchdog {
    /// Watches the daemons `(label, admin address)`; logs are read from `dir`.
    pub(crate) fn new(dir: &Path, daemons: &[(&str, &str)]) -> Self {
        let now = Instant::now();
        Self {
            dir: dir.to_path_buf(),
            daemons: daemons
                .iter()
                .map(|(label, admin)| Watched {
                    label: label.to_string(),
                    admin: admin.to_string(),
                    clocks: None,
                    since: now,
                    moved: false,
                    last: None,
                })
                .collect(),
            stall: STALL,
            polled: None,
        }
    }

    /// Fails after `stall` without progress instead of [`STALL`].
    pub(crate) fn with_stall(mut self, stall: Duration) -> Self {
        self.stall = stall;
        self
    }

    /// Logical time stops on purpose now (a daemon is killed, restarted or frozen) and is
    /// expected to resume: every daemon gets [`STARTUP`] again.
    pub(crate) fn restarting(&mut self) {
        let now = Instant::now();
        for d in &mut self.daemons {
            d.since = now;
            d.moved = false;
        }
    }

    /// Asks every daemon for its status (at most every 300 ms) and panics with a diagnostic
    /// when one has not progressed for too long; `Err` instead of the panic from
    /// [`Watchdog::try_check`].
    pub(crate) fn check(&mut self) {
        if let Err(e) = self.try_check() {
            panic!("{e}");
        }
    }

    /// [`Watchdog::check`], returning the diagnostic.
    pub(crate) fn try_check(&mut self) -> Result<(), String> {
        let now = Instant::now();
        if self.polled.is_some_and(|t| now < t + WATCH_EVERY) {
            return Ok(());
        }
        self.polled = Some(now);
        for d in &mut self.daemons {
            let Some(v) = status(&d.admin, &["--timeout-s", "1"]) else {
                continue;
            };
            let at = Instant::now();
            let n = |k: &str| v[k].as_u64().unwrap_or(0);
            let clocks = (n("generation"), n("waves"), n("sendclock"), n("recvclock"));
            if d.clocks.is_some_and(|c| c != clocks) {
                d.moved = true;
                d.since = at;
            }
            d.clocks = Some(clocks);
            d.last = Some((v, at));
        }
        let now = Instant::now();
        // Stuck: no progress for the stall limit (the startup limit before the first), or,
        // once running, no answer for the stall limit.
        let stuck: Vec<&Watched> = self
            .daemons
            .iter()
            .filter(|d| {
                if !d.moved {
                    return now - d.since > STARTUP;
                }
                let answered = d
                    .last
                    .as_ref()
                    .map_or(d.since, |(_, at)| (*at).max(d.since));
                now - d.since > self.stall || now - answered > self.stall
            })
            .collect();
        if stuck.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = stuck.iter().map(|d| d.label.as_str()).collect();
        // A daemon that stopped answering is the likely culprit: the others wait for it.
        let silent: Vec<&str> = self
            .daemons
            .iter()
            .filter(|d| d.last.as_ref().is_none_or(|(_, at)| now - *at > SILENT))
            .map(|d| d.label.as_str())
            .collect();
        let mut msg = format!(
            "logical time stopped: no progress at {} (stall limit {:?}, startup limit {:?}); \
             not answering status: {}\n",
            names.join(", "),
            self.stall,
            STARTUP,
            if silent.is_empty() {
                "none".to_string()
            } else {
                silent.join(", ")
            }
        );
        for d in &self.daemons {
            msg.push_str(&d.describe(now));
        }
        msg.push_str(&log_tails(&self.dir, 25));
        Err(msg)
    }

    /// Waits until logical time has been seen advancing at every watched daemon (checking, so
    /// a daemon that never starts fails at [`STARTUP`]); panics with the logs at `until`.
    pub(crate) fn until_running(&mut self, until: Instant) {
        while !self.daemons.iter().all(|d| d.moved) {
            self.check();
            assert!(
                Instant::now() < until,
                "logical time never ran everywhere\n{}",
                logs(&self.dir)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// [`status_until`], checking the watched daemons' progress as it polls.
    pub(crate) fn status_until(
        &mut self,
        admin: &str,
        until: Instant,
        done: impl Fn(&serde_json::Value) -> bool,
    ) -> serde_json::Value {
        let dir = self.dir.clone();
        status_checking(&dir, admin, until, done, || self.check())
    }

    /// [`wait_guarded`] (an application finishing, say), checking the watched daemons'
    /// progress as it waits.
    pub(crate) fn wait(&mut self, c: &mut Child, until: Instant) -> Option<ExitStatus> {
        wait_checking(c, until, || self.check())
    }
}

impl Watched {
    /// One paragraph on this daemon for a diagnostic.
    fn describe(&self, now: Instant) -> String {
        let still = now - self.since;
        let mut s = format!(
            "--- {} (admin {}): {} for {:.1} s\n",
            self.label,
            self.admin,
            if self.moved {
                "no progress"
            } else {
                "not started (or not resumed)"
            },
            still.as_secs_f64()
        );
        match &self.last {
            None => s.push_str("    never answered status\n"),
            Some((v, at)) => {
                let age = (now - *at).as_secs_f64();
                if now - *at > SILENT {
                    s.push_str(&format!(
                        "    no answer for {age:.1} s (stopped, hung or gone?); last status:\n"
                    ));
                }
                let peers: Vec<String> = v["peers"]
                    .as_array()
                    .map(|ps| {
                        ps.iter()
                            .map(|p| {
                                format!(
                                    "{} {} (queued {})",
                                    p["name"].as_str().unwrap_or("?"),
                                    if p["up"] == true { "up" } else { "DOWN" },
                                    p["queued"]
                                )
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                s.push_str(&format!(
                    "    role {} started {} generation {} waves {} sendclock {} recvclock {} \
                     outstanding isochrons {}\n    queues {}\n    peers: {}\n",
                    v["role"],
                    v["started"],
                    v["generation"],
                    v["waves"],
                    v["sendclock"],
                    v["recvclock"],
                    v["outstanding_isochrons"],
                    v["queues"],
                    peers.join("; ")
                ));
            }
        }
        s
    }
}

/// The last `n` lines of every `.log` file of the directory, for diagnostics.
pub(crate) fn log_tails(dir: &Path, n: usize) -> String {
    let mut all = String::new();
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    files.sort();
    for p in files {
        if p.extension().is_some_and(|x| x == "log") {
            let text = std::fs::read_to_string(&p).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(n)..];
            all.push_str(&format!(
                "--- {} (last {} of {} lines)\n{}\n",
                p.display(),
                tail.len(),
                lines.len(),
                tail.join("\n")
            ));
        }
    }
    all
}
