//! `isotach bench am`: AM round trips, message rate and bulk bandwidth over UDP and QUIC,
//! against raw UDP ping-pong, TCP_NODELAY ping-pong and raw UDP streaming measured in the
//! same run between the same two processes.
//!
//! [`run_bench`] re-executes the current executable with [`BenchOptions::peer_args`] (the
//! CLI must route that hidden subcommand to [`bench_peer_main`]); the peer serves every
//! baseline and AM service at once and is driven over its stdin/stdout. With
//! [`BenchOptions::in_process`] the peer runs on a thread of this process instead (used by
//! tests; the report says `"mode": "threads"`).
//!
//! Wait mode: every side blocks in the kernel between messages (raw sockets in `recv`, AM
//! bundles in `recvmsg` through [`Bundle::wait`]); nobody busy-polls. The small-message
//! round trips (raw UDP, AM short, TCP, raw UDP from an unconnected socket) run in
//! interleaved blocks, so load from other processes hits every series alike. Bulk is
//! compared with a plain raw stream (one `send` per datagram; `bulk_ratio_udp`) and, for
//! information, with a GSO/GRO raw stream (`bulk_ratio_udp_vs_gso`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use isotach_am::backend::quic::{make_ca, make_node_identity};
use isotach_am::backend::spin::SPIN_DEFAULT;
use isotach_am::{
    AmError, Bundle, Config, EndpointName, EpId, HandlerId, NodeAddr, Tag, TransIdx, Transport,
};

mod peer;
mod raw;

pub(crate) use peer::bench_peer_main;
use peer::{Side, pin_to_cpu, quic_bundle, start_peer, udp_bundle};
pub(crate) use raw::RawUdpBaseline;
use raw::{RawTcp, RawUdp, raw_stream};

const TAG: Tag = Tag(0xBE7C_0000_0000_0001);
const EP: EpId = EpId(0);
const PEER: TransIdx = TransIdx(0);
const H_ECHO: HandlerId = HandlerId(1);
const H_DONE: HandlerId = HandlerId(2);
/// Segment each AM endpoint exposes in the benchmark.
const BENCH_SEG: usize = 1 << 20;
/// Payload of the raw ping-pongs: the wire size of an AM short frame with one argument.
const RAW_PING_BYTES: usize = isotach_am::frame::overhead(1);

/// What to run.
#[derive(Clone, Debug)]
pub(crate) struct BenchOptions {
    /// Arguments that make the executable run [`bench_peer_main`] (the CLI's hidden subcommand).
    pub(crate) peer_args: Vec<String>,
    /// Executable to start as the peer; `None` = `std::env::current_exe()`.
    pub(crate) peer_exe: Option<PathBuf>,
    /// Run the peer on a thread of this process instead of a second process.
    pub(crate) in_process: bool,
    /// Round trips per small-message series.
    pub(crate) rtt_iters: usize,
    /// Round trips of the 64 KiB bulk series.
    pub(crate) bulk_rtt_iters: usize,
    /// Requests of the message-rate run.
    pub(crate) rate_msgs: usize,
    /// 64 KiB transfers of the bandwidth run (the raw stream sends as many bytes).
    pub(crate) bulk_msgs: usize,
    /// UDP datagram size for AM frames and the raw stream.
    pub(crate) datagram_bytes: usize,
    /// Also measure QUIC.
    pub(crate) quic: bool,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            peer_args: vec!["__am-bench-peer".to_string()],
            peer_exe: None,
            in_process: false,
            rtt_iters: 5000,
            bulk_rtt_iters: 300,
            rate_msgs: 50_000,
            bulk_msgs: 4000,
            datagram_bytes: 1472,
            quic: true,
        }
    }
}

impl BenchOptions {
    /// Small counts for smoke tests.
    #[cfg(test)]
    pub(crate) fn quick() -> Self {
        Self {
            rtt_iters: 200,
            bulk_rtt_iters: 20,
            rate_msgs: 2000,
            bulk_msgs: 50,
            ..Self::default()
        }
    }
}

/// Results; every key carries its unit. Ratios are AM / baseline (lower is better for round
/// trips, higher for bandwidth).
#[derive(Clone, Debug, Default, Serialize)]
pub(crate) struct BenchReport {
    /// `"two_processes"` or `"threads"`.
    pub(crate) mode: String,
    /// UDP datagram size used by AM and the raw stream.
    pub(crate) datagram_bytes: usize,
    /// Raw UDP ping-pong, 84-byte payload.
    pub raw_udp_rtt_p50_us: f64,
    /// 99th percentile of the same.
    pub raw_udp_rtt_p99_us: f64,
    /// Raw UDP ping-pong with both sides polling before they sleep, as AM's waits do
    /// (`SPIN_DEFAULT`, `[transport] spin-us`): the baseline of `rtt_ratio_udp` and
    /// `rtt_ratio_quic`.
    pub raw_udp_spin_rtt_p50_us: f64,
    /// Raw UDP ping-pong from an unconnected client socket (`sendto`/`recvfrom`, a route
    /// lookup per send, as an AM bundle that talks to many peers must do). Information only:
    /// `rtt_ratio_udp` is against the connected `raw_udp_rtt_p50_us`.
    pub raw_udp_unconnected_rtt_p50_us: f64,
    /// TCP_NODELAY ping-pong, 84-byte payload.
    pub raw_tcp_rtt_p50_us: f64,
    /// 99th percentile of the same.
    pub raw_tcp_rtt_p99_us: f64,
    /// AM over UDP: short request (1 word) and short reply.
    pub am_udp_rtt_p50_us: f64,
    /// 99th percentile of the same.
    pub am_udp_rtt_p99_us: f64,
    /// AM over UDP: 1 KiB medium request, short reply.
    pub am_udp_medium_1k_rtt_p50_us: f64,
    /// 99th percentile of the same.
    pub am_udp_medium_1k_rtt_p99_us: f64,
    /// AM over UDP: 64 KiB bulk request, short reply.
    pub am_udp_bulk_64k_rtt_p50_us: f64,
    /// 99th percentile of the same.
    pub am_udp_bulk_64k_rtt_p99_us: f64,
    /// `am_udp_rtt_p50_us / raw_udp_spin_rtt_p50_us` (both spin before they sleep).
    pub(crate) rtt_ratio_udp: f64,
    /// `am_udp_rtt_p50_us / raw_tcp_rtt_p50_us`.
    pub(crate) rtt_ratio_udp_vs_tcp: f64,
    /// Short requests per second with full credits (one peer).
    pub(crate) am_udp_msgs_per_s: f64,
    /// 64 KiB bulk transfers with full credits, payload MB/s (10^6 bytes).
    pub(crate) am_udp_bulk_mb_per_s: f64,
    /// Raw UDP streaming of the same bytes in the same datagram size, received MB/s.
    pub(crate) raw_udp_stream_mb_per_s: f64,
    /// Fraction of raw stream datagrams the receiver got.
    pub(crate) raw_udp_stream_delivered_ratio: f64,
    /// `am_udp_bulk_mb_per_s / raw_udp_stream_mb_per_s` (the target ratio).
    pub(crate) bulk_ratio_udp: f64,
    /// Raw UDP streaming of the same bytes with the kernel offloads AM/UDP uses: GSO sends
    /// (`UDP_SEGMENT`, 44 datagrams per `sendmsg`) into a GRO receiver. MB/s received.
    pub(crate) raw_udp_gso_stream_mb_per_s: f64,
    /// Fraction of GSO stream datagrams the receiver got.
    pub(crate) raw_udp_gso_stream_delivered_ratio: f64,
    /// `am_udp_bulk_mb_per_s / raw_udp_gso_stream_mb_per_s` (like-for-like offloads).
    pub(crate) bulk_ratio_udp_vs_gso: f64,
    /// Whole-message retransmissions during the AM/UDP runs.
    pub(crate) am_udp_retransmits: u64,
    /// AM over QUIC (datagrams): short round trip.
    pub am_quic_rtt_p50_us: f64,
    /// 99th percentile of the same.
    pub am_quic_rtt_p99_us: f64,
    /// AM over QUIC: 1 KiB medium round trip.
    pub am_quic_medium_1k_rtt_p50_us: f64,
    /// 99th percentile of the same.
    pub am_quic_medium_1k_rtt_p99_us: f64,
    /// AM over QUIC: 64 KiB bulk round trip.
    pub am_quic_bulk_64k_rtt_p50_us: f64,
    /// 99th percentile of the same.
    pub am_quic_bulk_64k_rtt_p99_us: f64,
    /// `am_quic_rtt_p50_us / raw_udp_spin_rtt_p50_us`.
    pub(crate) rtt_ratio_quic: f64,
    /// Short requests per second over QUIC with full credits.
    pub(crate) am_quic_msgs_per_s: f64,
    /// 64 KiB bulk over QUIC with full credits, MB/s.
    pub(crate) am_quic_bulk_mb_per_s: f64,
    /// Wall time of the whole benchmark.
    pub(crate) elapsed_s: f64,
}

/// Why the benchmark failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub(crate) enum BenchError {
    /// Socket, pipe or process I/O failed.
    #[error("I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The AM layer failed.
    #[error("AM: {0}")]
    Am(#[from] AmError),
    /// The peer misbehaved or died.
    #[error("bench peer: {0}")]
    Peer(String),
    /// A message did not complete (returned to handler 0).
    #[error("message returned during the benchmark: {0}")]
    Returned(String),
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Result<Vec<u8>, BenchError> {
    if !s.len().is_multiple_of(2) {
        return Err(BenchError::Peer("odd hex length".into()));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&s[i..i + 2], 16).map_err(|_| BenchError::Peer("bad hex".into()))
        })
        .collect()
}

fn us(h: &Histogram<u64>, q: f64) -> f64 {
    h.value_at_quantile(q) as f64 / 1000.0
}

/// (p50, p99) of `h`, µs.
fn p50_p99(h: &Histogram<u64>) -> (f64, f64) {
    (us(h, 0.5), us(h, 0.99))
}

/// The report's `mode`.
fn mode(in_process: bool) -> &'static str {
    if in_process {
        "threads"
    } else {
        "two_processes"
    }
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("static histogram bounds")
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    let _ = h.record((d.as_nanos() as u64).max(1));
}

/// Round-trip series are measured in this many interleaved blocks (raw UDP, TCP, AM short,
/// in turn), so that load from other processes on the machine hits every series alike.
const RTT_BLOCKS: usize = 10;

/// Bytes of one bulk request.
const BULK_BYTES: usize = 64 * 1024;

/// What [`Client::series`] measured: (p50, p99) round trips in µs, rates.
struct AmSeries {
    medium_1k_rtt_us: (f64, f64),
    bulk_64k_rtt_us: (f64, f64),
    msgs_per_s: f64,
    bulk_mb_per_s: f64,
}

struct Client<T: Transport> {
    b: Bundle<T>,
    done: Arc<AtomicU64>,
    returned: Arc<Mutex<Option<String>>>,
    /// Set with `returned`, so the per-iteration check is one load, not a lock (the raw
    /// ping-pongs have no such bookkeeping).
    any_returned: Arc<AtomicBool>,
}

impl<T: Transport + 'static> Client<T> {
    fn new(mut b: Bundle<T>, server: SocketAddr) -> Result<Self, BenchError> {
        let ep = b.alloc_endpoint()?;
        b.set_tag(ep, TAG)?;
        b.set_segment(ep, BENCH_SEG)?;
        b.map(
            ep,
            PEER,
            EndpointName {
                node: NodeAddr::Ip(server),
                ep: EP,
            },
            TAG,
        )?;
        let done = Arc::new(AtomicU64::new(0));
        let d = done.clone();
        b.set_reply_handler(ep, H_DONE, move |_r| {
            d.fetch_add(1, Ordering::Relaxed);
        })?;
        let returned: Arc<Mutex<Option<String>>> = Arc::default();
        let any_returned = Arc::new(AtomicBool::new(false));
        let (r, a) = (returned.clone(), any_returned.clone());
        b.set_return_handler(ep, move |m| {
            *r.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(format!("{m:?}"));
            a.store(true, Ordering::Relaxed);
        })?;
        Ok(Self {
            b,
            done,
            returned,
            any_returned,
        })
    }

    fn check(&self) -> Result<(), BenchError> {
        if !self.any_returned.load(Ordering::Relaxed) {
            return Ok(());
        }
        match self
            .returned
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            Some(m) => Err(BenchError::Returned(m)),
            None => Ok(()),
        }
    }

    fn wait_done(&mut self, want: u64) -> Result<(), BenchError> {
        while self.done.load(Ordering::Relaxed) < want {
            if self.b.wait(Duration::from_millis(100))? {
                self.b.poll()?;
            }
            self.check()?;
        }
        Ok(())
    }

    /// Round trips of `kind` (0 short, 1 medium 1 KiB, 2 bulk 64 KiB).
    fn rtt(&mut self, kind: u8, iters: usize) -> Result<Histogram<u64>, BenchError> {
        let mut h = hist();
        self.rtt_into(kind, iters, iters / 10, &mut h)?;
        Ok(h)
    }

    /// `iters + warm` round trips of `kind`, the first `warm` not recorded.
    fn rtt_into(
        &mut self,
        kind: u8,
        iters: usize,
        warm: usize,
        h: &mut Histogram<u64>,
    ) -> Result<(), BenchError> {
        let data = vec![0xA5u8; if kind == 1 { 1024 } else { BULK_BYTES }];
        for i in 0..iters + warm {
            let want = self.done.load(Ordering::Relaxed) + 1;
            let t0 = Instant::now();
            match kind {
                0 => self.b.request_short(EP, PEER, H_ECHO, &[i as u64])?,
                1 => self
                    .b
                    .request_medium(EP, PEER, H_ECHO, &data, &[i as u64])?,
                _ => self
                    .b
                    .request_xfer(EP, PEER, 0, H_ECHO, &data, &[i as u64])?,
            }
            self.wait_done(want)?;
            if i >= warm {
                record(h, t0.elapsed());
            }
        }
        Ok(())
    }

    /// The series after the short round trips: `medium_iters` 1 KiB and `bulk_iters` 64 KiB
    /// round trips, then `msgs` short requests and `bulk_msgs` 64 KiB transfers with full
    /// credits.
    fn series(
        &mut self,
        medium_iters: usize,
        bulk_iters: usize,
        msgs: usize,
        bulk_msgs: usize,
    ) -> Result<AmSeries, BenchError> {
        let medium_1k_rtt_us = p50_p99(&self.rtt(1, medium_iters)?);
        let bulk_64k_rtt_us = p50_p99(&self.rtt(2, bulk_iters)?);
        let d = self.flood(false, msgs as u64)?;
        let msgs_per_s = msgs as f64 / d.as_secs_f64();
        let d = self.flood(true, bulk_msgs as u64)?;
        let bulk_mb_per_s = (bulk_msgs * BULK_BYTES) as f64 / d.as_secs_f64() / 1e6;
        Ok(AmSeries {
            medium_1k_rtt_us,
            bulk_64k_rtt_us,
            msgs_per_s,
            bulk_mb_per_s,
        })
    }

    /// Keep every credit busy until `n` requests completed; returns the elapsed time.
    fn flood(&mut self, bulk: bool, n: u64) -> Result<Duration, BenchError> {
        let data = vec![0x3Cu8; BULK_BYTES];
        let base = self.done.load(Ordering::Relaxed);
        let t0 = Instant::now();
        let mut sent = 0;
        while self.done.load(Ordering::Relaxed) < base + n {
            while sent < n {
                let r = if bulk {
                    self.b.request_xfer_async(
                        EP,
                        PEER,
                        (sent % 8 * 65_536) as u32,
                        H_ECHO,
                        &data,
                        &[],
                    )
                } else {
                    self.b.try_request_short(EP, PEER, H_ECHO, &[sent])
                };
                match r {
                    Ok(()) => sent += 1,
                    Err(AmError::WouldBlock) => break,
                    Err(e) => return Err(e.into()),
                }
            }
            if self.b.wait(Duration::from_millis(100))? {
                self.b.poll()?;
            }
            self.check()?;
        }
        Ok(t0.elapsed())
    }
}

fn ratio(a: f64, b: f64) -> f64 {
    if b > 0.0 { a / b } else { 0.0 }
}

/// Run the whole benchmark (see the module docs).
pub(crate) fn run_bench(opts: BenchOptions) -> Result<BenchReport, BenchError> {
    let start = Instant::now();
    let ca = make_ca("isotach bench CA")?;
    let mine = make_node_identity(&ca, "bench-driver")?;
    let theirs = make_node_identity(&ca, "bench-peer")?;
    let mut link = start_peer(&opts)?;
    if !opts.in_process {
        pin_to_cpu(Side::Driver);
    }
    let ports = link.setup(opts.datagram_bytes, &theirs)?;
    let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
    let mut r = BenchReport {
        mode: mode(opts.in_process).to_string(),
        datagram_bytes: opts.datagram_bytes,
        ..BenchReport::default()
    };

    // Small-message round trips: raw UDP, TCP and AM/UDP in interleaved blocks.
    let cfg = Config::default();
    let mut udp = RawUdp::new(at(ports[0]), true)?;
    let mut udp_unc = RawUdp::new(at(ports[0]), false)?;
    let mut udp_spin = RawUdp::spinning(at(ports[6]), SPIN_DEFAULT)?;
    let mut tcp = RawTcp::new(at(ports[2]))?;
    let mut c = Client::new(udp_bundle(opts.datagram_bytes, &cfg)?, at(ports[3]))?;
    let (mut hu, mut huu, mut ht, mut ha, mut hs) = (hist(), hist(), hist(), hist(), hist());
    let per = opts.rtt_iters.div_ceil(RTT_BLOCKS);
    for _ in 0..RTT_BLOCKS {
        udp.block(per + per / 9, &mut hu)?;
        c.rtt_into(0, per, per / 10, &mut ha)?;
        tcp.block(per + per / 9, &mut ht)?;
        udp_unc.block(per + per / 9, &mut huu)?;
        udp_spin.block(per + per / 9, &mut hs)?;
    }
    drop((udp, udp_unc, tcp, udp_spin));
    r.raw_udp_spin_rtt_p50_us = us(&hs, 0.5);
    (r.raw_udp_rtt_p50_us, r.raw_udp_rtt_p99_us) = p50_p99(&hu);
    r.raw_udp_unconnected_rtt_p50_us = us(&huu, 0.5);
    (r.raw_tcp_rtt_p50_us, r.raw_tcp_rtt_p99_us) = p50_p99(&ht);
    (r.am_udp_rtt_p50_us, r.am_udp_rtt_p99_us) = p50_p99(&ha);
    let s = c.series(
        opts.rtt_iters / 2,
        opts.bulk_rtt_iters,
        opts.rate_msgs,
        opts.bulk_msgs,
    )?;
    (r.am_udp_medium_1k_rtt_p50_us, r.am_udp_medium_1k_rtt_p99_us) = s.medium_1k_rtt_us;
    (r.am_udp_bulk_64k_rtt_p50_us, r.am_udp_bulk_64k_rtt_p99_us) = s.bulk_64k_rtt_us;
    (r.am_udp_msgs_per_s, r.am_udp_bulk_mb_per_s) = (s.msgs_per_s, s.bulk_mb_per_s);
    let bulk_bytes = opts.bulk_msgs * BULK_BYTES;
    r.am_udp_retransmits = c.b.stats().retransmits;
    drop(c);
    (r.raw_udp_stream_mb_per_s, r.raw_udp_stream_delivered_ratio) = raw_stream(
        &mut link,
        at(ports[1]),
        bulk_bytes,
        opts.datagram_bytes,
        false,
    )?;
    (
        r.raw_udp_gso_stream_mb_per_s,
        r.raw_udp_gso_stream_delivered_ratio,
    ) = raw_stream(
        &mut link,
        at(ports[5]),
        bulk_bytes,
        opts.datagram_bytes,
        true,
    )?;
    r.rtt_ratio_udp = ratio(r.am_udp_rtt_p50_us, r.raw_udp_spin_rtt_p50_us);
    r.rtt_ratio_udp_vs_tcp = ratio(r.am_udp_rtt_p50_us, r.raw_tcp_rtt_p50_us);
    r.bulk_ratio_udp = ratio(r.am_udp_bulk_mb_per_s, r.raw_udp_stream_mb_per_s);
    r.bulk_ratio_udp_vs_gso = ratio(r.am_udp_bulk_mb_per_s, r.raw_udp_gso_stream_mb_per_s);

    if opts.quic {
        let mut c = Client::new(quic_bundle(mine, &cfg)?, at(ports[4]))?;
        let h = c.rtt(0, opts.rtt_iters / 2)?;
        (r.am_quic_rtt_p50_us, r.am_quic_rtt_p99_us) = p50_p99(&h);
        let s = c.series(
            opts.rtt_iters / 4,
            opts.bulk_rtt_iters / 2,
            opts.rate_msgs / 2,
            (opts.bulk_msgs / 4).max(1),
        )?;
        (
            r.am_quic_medium_1k_rtt_p50_us,
            r.am_quic_medium_1k_rtt_p99_us,
        ) = s.medium_1k_rtt_us;
        (r.am_quic_bulk_64k_rtt_p50_us, r.am_quic_bulk_64k_rtt_p99_us) = s.bulk_64k_rtt_us;
        (r.am_quic_msgs_per_s, r.am_quic_bulk_mb_per_s) = (s.msgs_per_s, s.bulk_mb_per_s);
        r.rtt_ratio_quic = ratio(r.am_quic_rtt_p50_us, r.raw_udp_spin_rtt_p50_us);
    }
    link.finish()?;
    r.elapsed_s = start.elapsed().as_secs_f64();
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bench_runs_in_process_quick() {
        let opts = BenchOptions {
            in_process: true,
            ..BenchOptions::quick()
        };
        let r = run_bench(opts).unwrap();
        let v = serde_json::to_value(&r).unwrap();
        for k in [
            "am_udp_rtt_p50_us",
            "raw_udp_rtt_p50_us",
            "rtt_ratio_udp",
            "am_quic_rtt_p50_us",
            "raw_tcp_rtt_p50_us",
            "raw_udp_spin_rtt_p50_us",
            "am_udp_msgs_per_s",
            "am_udp_bulk_mb_per_s",
            "raw_udp_stream_mb_per_s",
            "bulk_ratio_udp",
        ] {
            assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k} = {}", v[k]);
        }
    }

    #[test]
    fn raw_baseline_in_process() {
        let opts = BenchOptions {
            in_process: true,
            ..BenchOptions::quick()
        };
        let mut b = RawUdpBaseline::start(&opts, Duration::ZERO).unwrap();
        b.measure(100).unwrap();
        b.measure(100).unwrap();
        assert_eq!(b.samples(), 180);
        assert!(b.p50_us() > 0.0 && b.p99_us() >= b.p50_us());
        assert_eq!(
            b.spin_p50_us(),
            None,
            "no spin budget, no spinning baseline"
        );
        assert_eq!(b.mode(), "threads");
        b.finish().unwrap();
        // With a budget every block is measured both ways, against the peer's spinning echo.
        let mut b = RawUdpBaseline::start(&opts, SPIN_DEFAULT).unwrap();
        b.measure(100).unwrap();
        assert!(b.spin_p50_us().is_some_and(|us| us > 0.0));
        b.finish().unwrap();
    }
}
