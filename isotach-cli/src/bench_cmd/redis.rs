//! Redis on the bank workload, for `bench transfers`: a `redis-server` on a free loopback port
//! with persistence off, and `redis-benchmark` running an `EVAL` that moves an amount between
//! two random account keys atomically, with [`REDIS_CLIENTS`] clients plain and
//! [`REDIS_PIPELINE`] deep pipelined. The server is stopped on every path (a guard).
//!
//! Nothing here is needed by a test: without the programs on PATH the comparison is skipped
//! and the reason reported.

use serde::Serialize;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Concurrent redis-benchmark clients.
pub(crate) const REDIS_CLIENTS: u32 = 4;
/// Pipeline depth of the pipelined run.
pub(crate) const REDIS_PIPELINE: u32 = 16;
/// How long the server may take to answer PING.
const STARTUP_MAX: Duration = Duration::from_secs(10);
/// The transfer: debit KEYS[1], credit KEYS[2] by ARGV[1], in one atomic script.
const TRANSFER_SCRIPT: &str = "local v = tonumber(ARGV[1]); redis.call('DECRBY', KEYS[1], v); \
                               redis.call('INCRBY', KEYS[2], v); return v";

/// What Redis did on the workload.
#[derive(Debug, Serialize)]
pub(crate) struct RedisNumbers {
    pub(crate) version: String,
    pub(crate) clients: u32,
    pub(crate) pipeline: u32,
    pub(crate) requests: u64,
    /// Reported once, as the report's `redis_transfers_per_s`.
    #[serde(skip)]
    pub(crate) transfers_per_s: f64,
    pub(crate) latency_p50_us: f64,
    pub(crate) latency_p99_us: f64,
    /// Reported once, as the report's `redis_pipelined_transfers_per_s`.
    #[serde(skip)]
    pub(crate) pipelined_transfers_per_s: f64,
    pub(crate) pipelined_latency_p50_us: f64,
}

/// One redis-benchmark run's CSV line.
#[derive(Debug, PartialEq)]
struct Run {
    per_s: f64,
    p50_us: f64,
    p99_us: f64,
}

/// A program on PATH, if there is one.
fn on_path(program: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Stops the server when dropped, on every path.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("no free port: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("no free port: {e}"))
}

fn answers_ping(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut buf = [0u8; 16];
    s.write_all(b"PING\r\n").is_ok()
        && s.read(&mut buf)
            .is_ok_and(|n| buf[..n].starts_with(b"+PONG"))
}

fn start_server(server: &PathBuf, port: u16) -> Result<Server, String> {
    let child = Command::new(server)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args([
            "--appendonly",
            "no",
            "--daemonize",
            "no",
            "--loglevel",
            "warning",
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("starting {}: {e}", server.display()))?;
    let guard = Server(child);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let limit = Instant::now() + STARTUP_MAX;
    while !answers_ping(addr) {
        if Instant::now() >= limit {
            return Err(format!(
                "redis-server on port {port} did not answer within {} s",
                STARTUP_MAX.as_secs()
            ));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(guard)
}

/// Parses redis-benchmark's `--csv` output: a header, then
/// `"test","rps","avg_latency_ms","min_latency_ms","p50_latency_ms","p95_latency_ms",
/// "p99_latency_ms","max_latency_ms"`.
fn parse_csv(out: &str) -> Result<Run, String> {
    let line = out
        .lines()
        .find(|l| !l.starts_with("\"test\"") && l.starts_with('"'))
        .ok_or_else(|| format!("no result line in redis-benchmark's output: {out:?}"))?;
    // The test name holds the script (commas, quotes): read the numbers from the end.
    let fields: Vec<f64> = line
        .rsplit(',')
        .take(7)
        .map(|f| f.trim_matches('"').parse::<f64>())
        .collect::<Result<_, _>>()
        .map_err(|e| format!("unexpected redis-benchmark line {line:?}: {e}"))?;
    // Reversed: max, p99, p95, p50, min, avg, rps.
    let [_max, p99, _p95, p50, _min, _avg, rps] = fields[..] else {
        return Err(format!("unexpected redis-benchmark line {line:?}"));
    };
    Ok(Run {
        per_s: rps,
        p50_us: p50 * 1000.0,
        p99_us: p99 * 1000.0,
    })
}

fn bench(
    tool: &PathBuf,
    port: u16,
    accounts: u32,
    requests: u64,
    pipeline: u32,
) -> Result<Run, String> {
    let out = Command::new(tool)
        .args(["-p", &port.to_string(), "-c", &REDIS_CLIENTS.to_string()])
        .args(["-n", &requests.to_string(), "-r", &accounts.to_string()])
        .args([
            "-P",
            &pipeline.to_string(),
            "--csv",
            "EVAL",
            TRANSFER_SCRIPT,
            "2",
        ])
        .args(["acct:__rand_int__", "acct:__rand_int__", "7"])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map_err(|e| format!("running {}: {e}", tool.display()))?;
    if !out.status.success() {
        return Err(format!("redis-benchmark exited with {}", out.status));
    }
    parse_csv(&String::from_utf8_lossy(&out.stdout))
}

fn version(server: &PathBuf) -> String {
    Command::new(server)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            let text = String::from_utf8_lossy(&o.stdout).into_owned();
            text.split_whitespace()
                .find_map(|w| w.strip_prefix("v=").map(str::to_string))
        })
        .unwrap_or_else(|| "unknown".into())
}

/// Redis on the workload, or why it was skipped.
pub(crate) fn redis_transfers(accounts: u32, requests: u64) -> Result<RedisNumbers, String> {
    let server = on_path("redis-server").ok_or("redis-server is not on PATH")?;
    let tool = on_path("redis-benchmark").ok_or("redis-benchmark is not on PATH")?;
    let port = free_port()?;
    let _running = start_server(&server, port)?;
    let plain = bench(&tool, port, accounts, requests, 1)?;
    let piped = bench(&tool, port, accounts, requests * 4, REDIS_PIPELINE)?;
    Ok(RedisNumbers {
        version: version(&server),
        clients: REDIS_CLIENTS,
        pipeline: REDIS_PIPELINE,
        requests,
        transfers_per_s: plain.per_s,
        latency_p50_us: plain.p50_us,
        latency_p99_us: plain.p99_us,
        pipelined_transfers_per_s: piped.per_s,
        pipelined_latency_p50_us: piped.p50_us,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_csv_numbers_are_read_from_the_end_of_the_line() {
        let out = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\
                   \"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                   \"EVAL local v = tonumber(ARGV[1]), x\",\"61957.87\",\"0.050\",\"0.016\",\
                   \"0.047\",\"0.087\",\"0.151\",\"2.031\"\n";
        let r = parse_csv(out).unwrap();
        assert_eq!(r.per_s, 61957.87);
        assert!((r.p50_us - 47.0).abs() < 1e-9 && (r.p99_us - 151.0).abs() < 1e-9);
        assert!(parse_csv("\"test\",\"rps\"\n").is_err());
        assert!(parse_csv("\"x\",\"fast\",\"1\"\n").is_err());
    }

    #[test]
    fn a_missing_program_is_a_reason_not_an_error() {
        assert_eq!(on_path("surely-not-a-program-isotach"), None);
    }
}
