//! An optional Prometheus endpoint (`--metrics ADDR`): `GET /metrics` answers the daemon's
//! status and histograms in the text exposition format over plain HTTP/1.1.
//!
//! Deliberately small: one request per connection, requests over [`REQUEST_MAX`] bytes or
//! slower than [`REQUEST_TIMEOUT`] are cut off, and at most [`CONNECTIONS_MAX`] connections
//! are served at once (more wait in the kernel's backlog).

use super::pb::StatusReply;
use isotach_daemon::telemetry::HistSummary;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

/// Largest request head read.
pub(crate) const REQUEST_MAX: usize = 8 * 1024;
/// Longest time a client may take to send its request.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once.
pub(crate) const CONNECTIONS_MAX: usize = 16;

/// A metric name: `isotach_` plus the key with anything but [a-z0-9_] replaced by `_`.
fn metric(key: &str) -> String {
    let clean: String = key
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '_' {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    format!("isotach_{clean}")
}

/// Escapes a label value.
fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// The text exposition of a status and its histograms.
pub(crate) fn render(s: &StatusReply, hists: &[HistSummary]) -> String {
    let mut out = String::new();
    let who = format!("role=\"{}\",name=\"{}\"", label(&s.role), label(&s.name));
    let mut gauge = |name: &str, help: &str, v: f64| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name}{{{who}}} {v}"
        );
    };
    gauge(
        "isotach_started",
        "Logical time has started (1) or not (0).",
        f64::from(u8::from(s.started)),
    );
    gauge(
        "isotach_generation",
        "Current logical-time generation.",
        f64::from(s.generation),
    );
    gauge(
        "isotach_uptime_seconds",
        "Seconds since the daemon started.",
        s.uptime_ms as f64 / 1000.0,
    );
    gauge(
        "isotach_pulse_rate_per_s",
        "Pulses (SIU) or waves (TM) per second over the last full second.",
        s.pulse_rate_per_s,
    );
    if s.role == "tm" {
        gauge(
            "isotach_waves",
            "Waves sent in this generation.",
            s.waves as f64,
        );
    } else {
        gauge(
            "isotach_recvclock",
            "The current pulse.",
            s.recvclock as f64,
        );
        gauge(
            "isotach_sendclock",
            "Normal tokens sent in this generation.",
            s.sendclock as f64,
        );
        gauge(
            "isotach_outstanding_isochrons",
            "This host's isochrons stamped for pulses that have not ended.",
            s.outstanding_isochrons as f64,
        );
    }
    let queues: BTreeMap<_, _> = s.queues.iter().collect();
    let _ = writeln!(
        out,
        "# HELP isotach_queue_packets Queue depth in packets.\n# TYPE isotach_queue_packets gauge"
    );
    for (q, v) in queues {
        let _ = writeln!(
            out,
            "isotach_queue_packets{{{who},queue=\"{}\"}} {v}",
            label(q)
        );
    }
    let _ = writeln!(
        out,
        "# HELP isotach_peer_up Peer link up (1) or down (0); idle on-demand peers (other \
         hosts' SIUs never used) are left out.\n# TYPE isotach_peer_up gauge"
    );
    for p in s.peers.iter().filter(|p| !p.idle) {
        let _ = writeln!(
            out,
            "isotach_peer_up{{{who},peer=\"{}\",addr=\"{}\"}} {}",
            label(&p.name),
            label(&p.addr),
            u8::from(p.up)
        );
    }
    let counters: BTreeMap<_, _> = s.counters.iter().collect();
    for (k, v) in counters {
        let name = format!("{}_total", metric(k));
        let _ = writeln!(out, "# TYPE {name} counter\n{name}{{{who}}} {v}");
    }
    for h in hists {
        let base = metric(&h.name.replace("_us", "_microseconds"));
        let _ = writeln!(out, "# TYPE {base} summary");
        for (q, v) in [
            ("0.5", h.p50_us),
            ("0.9", h.p90_us),
            ("0.99", h.p99_us),
            ("0.999", h.p999_us),
        ] {
            let _ = writeln!(out, "{base}{{{who},quantile=\"{q}\"}} {v}");
        }
        let sum = h.mean_us * h.count as f64;
        let _ = writeln!(
            out,
            "{base}_sum{{{who}}} {sum}\n{base}_count{{{who}}} {}",
            h.count
        );
    }
    out
}

/// What the endpoint serves: a fresh rendering per request.
pub(crate) type Render = Arc<dyn Fn() -> String + Send + Sync>;

/// Binds `addr` and serves `/metrics` on the current runtime; returns the bound address.
pub(crate) async fn serve(addr: SocketAddr, render: Render) -> anyhow::Result<SocketAddr> {
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("metrics: bind {addr}: {e}"))?;
    let local = listener.local_addr()?;
    let slots = Arc::new(Semaphore::new(CONNECTIONS_MAX));
    tokio::spawn(async move {
        loop {
            let Ok(permit) = Arc::clone(&slots).acquire_owned().await else {
                return;
            };
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let render = Arc::clone(&render);
            tokio::spawn(async move {
                let _permit = permit;
                if let Err(e) = answer(stream, render).await {
                    tracing::debug!(%e, "metrics request failed");
                }
            });
        }
    });
    tracing::info!(metrics = %local, "Prometheus metrics listening");
    Ok(local)
}

/// Reads one request head and answers it.
async fn answer(mut stream: TcpStream, render: Render) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let read = tokio::time::timeout(REQUEST_TIMEOUT, async {
        while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < REQUEST_MAX {
            let n = stream.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            head.extend_from_slice(&buf[..n]);
        }
        std::io::Result::Ok(())
    })
    .await;
    if !matches!(read, Ok(Ok(()))) {
        return Ok(());
    }
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let (status, body, kind) = match line {
        b"GET /metrics HTTP/1.1" | b"GET /metrics HTTP/1.0" => {
            ("200 OK", render(), "text/plain; version=0.0.4")
        }
        _ if line.starts_with(b"GET ") => ("404 Not Found", "not found\n".into(), "text/plain"),
        _ => ("400 Bad Request", "bad request\n".into(), "text/plain"),
    };
    let reply = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(reply.as_bytes()).await?;
    stream.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::pb::Peer;

    fn status() -> StatusReply {
        StatusReply {
            role: "siu".into(),
            name: "al\"pha".into(),
            started: true,
            generation: 3,
            uptime_ms: 1500,
            recvclock: 42,
            pulse_rate_per_s: 1000.5,
            queues: [("to_host".to_string(), 2)].into_iter().collect(),
            counters: [("port.hellos".to_string(), 7)].into_iter().collect(),
            peers: vec![
                Peer {
                    name: "token manager".into(),
                    addr: "127.0.0.1:1".into(),
                    up: true,
                    queued: 0,
                    links_lost: 1,
                    idle: false,
                },
                Peer {
                    name: "SIU of host 1".into(),
                    addr: "127.0.0.1:2".into(),
                    up: false,
                    queued: 0,
                    links_lost: 0,
                    idle: true,
                },
            ],
            ..StatusReply::default()
        }
    }

    #[test]
    fn the_exposition_names_every_value_with_its_labels() {
        let h = HistSummary {
            name: "pulse_period_us",
            count: 4,
            min_us: 1,
            p50_us: 50,
            p90_us: 90,
            p99_us: 99,
            p999_us: 100,
            max_us: 100,
            mean_us: 60.0,
        };
        let text = render(&status(), &[h]);
        let who = r#"role="siu",name="al\"pha""#;
        for line in [
            format!("isotach_generation{{{who}}} 3"),
            format!("isotach_recvclock{{{who}}} 42"),
            format!("isotach_pulse_rate_per_s{{{who}}} 1000.5"),
            format!("isotach_queue_packets{{{who},queue=\"to_host\"}} 2"),
            format!("isotach_peer_up{{{who},peer=\"token manager\",addr=\"127.0.0.1:1\"}} 1"),
            format!("isotach_port_hellos_total{{{who}}} 7"),
            format!("isotach_pulse_period_microseconds{{{who},quantile=\"0.99\"}} 99"),
            format!("isotach_pulse_period_microseconds_count{{{who}}} 4"),
            format!("isotach_pulse_period_microseconds_sum{{{who}}} 240"),
        ] {
            assert!(
                text.lines().any(|l| l == line),
                "missing `{line}` in\n{text}"
            );
        }
        assert!(
            !text.contains("SIU of host 1"),
            "an idle peer is no gauge:\n{text}"
        );
    }

    #[tokio::test]
    async fn the_endpoint_answers_metrics_and_refuses_the_rest() {
        let render: Render = Arc::new(|| render(&status(), &[]));
        let addr = serve("127.0.0.1:0".parse().unwrap(), render).await.unwrap();
        let ask = |req: &'static [u8]| async move {
            let mut s = TcpStream::connect(addr).await.unwrap();
            s.write_all(req).await.unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            out
        };
        let ok = ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").await;
        assert!(ok.starts_with("HTTP/1.1 200 OK"), "{ok}");
        assert!(ok.contains("isotach_recvclock{"), "{ok}");
        let missing = ask(b"GET /other HTTP/1.1\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404"), "{missing}");
        let junk = ask(b"\x00\xff junk\r\n\r\n").await;
        assert!(junk.starts_with("HTTP/1.1 400"), "{junk}");
    }
}
