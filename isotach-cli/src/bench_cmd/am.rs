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

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use serde::Serialize;

use isotach_am::backend::quic::{
    QuicConfig, QuicIdentity, QuicTransport, make_ca, make_node_identity,
};
use isotach_am::backend::udp::{UdpConfig, UdpTransport};
use isotach_am::{
    AmError, Bundle, Config, EndpointName, EpId, HandlerId, NodeAddr, Tag, TransIdx, Transport,
};

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
    /// `am_udp_rtt_p50_us / raw_udp_rtt_p50_us`.
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
    /// `am_quic_rtt_p50_us / raw_udp_rtt_p50_us`.
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

// ------------------------------------------------------------------ the peer

/// Raw stream counters, published with relaxed atomics (no lock on the receive path).
#[derive(Default)]
struct StreamStats {
    bytes: AtomicU64,
    datagrams: AtomicU64,
    first_ns: AtomicU64,
    last_ns: AtomicU64,
}

impl StreamStats {
    /// Counts `bytes` received in `datagrams` datagrams, `origin.elapsed()` after the start.
    fn add(&self, origin: Instant, bytes: usize, datagrams: u64) {
        let now = origin.elapsed().as_nanos() as u64 + 1;
        self.bytes.fetch_add(bytes as u64, Ordering::Relaxed);
        self.datagrams.fetch_add(datagrams, Ordering::Relaxed);
        if self.first_ns.load(Ordering::Relaxed) == 0 {
            self.first_ns.store(now, Ordering::Relaxed);
        }
        self.last_ns.store(now, Ordering::Relaxed);
    }
}

/// A loopback UDP socket with a 4 MiB receive buffer, for a raw stream sink.
fn sink_socket() -> Result<UdpSocket, BenchError> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    let _ = s.set_recv_buffer_size(4 << 20);
    s.bind(
        &"127.0.0.1:0"
            .parse::<SocketAddr>()
            .expect("literal address")
            .into(),
    )?;
    let s: UdpSocket = s.into();
    s.set_read_timeout(Some(Duration::from_millis(100)))?;
    Ok(s)
}

fn am_server<T: Transport + 'static>(
    mut b: Bundle<T>,
    stop: Arc<AtomicBool>,
) -> Result<(), BenchError> {
    let ep = b.alloc_endpoint()?;
    b.set_tag(ep, TAG)?;
    b.set_segment(ep, BENCH_SEG)?;
    b.set_request_handler(ep, H_ECHO, |req| {
        let n = req.data().len() as u64;
        let _ = req.reply_short(H_DONE, &[n]);
    })?;
    b.set_return_handler(ep, |_r| {})?;
    while !stop.load(Ordering::Relaxed) {
        if b.wait(Duration::from_millis(50))? {
            b.poll()?;
        }
    }
    Ok(())
}

/// Serves bundle `b` on a thread of `threads` until `stop`; returns its port.
fn spawn_am_server<T: Transport + 'static>(
    b: Bundle<T>,
    stop: &Arc<AtomicBool>,
    threads: &mut Vec<std::thread::JoinHandle<Result<(), BenchError>>>,
) -> u16 {
    let p = port(b.local_addr());
    let st = Arc::clone(stop);
    threads.push(std::thread::spawn(move || am_server(b, st)));
    p
}

fn udp_bundle(datagram_bytes: usize, cfg: &Config) -> Result<Bundle<UdpTransport>, BenchError> {
    let mut c = UdpConfig::new("127.0.0.1:0".parse().expect("literal address"));
    c.max_datagram = datagram_bytes;
    Ok(Bundle::new(UdpTransport::with_config(c)?, cfg.clone())?)
}

fn quic_bundle(id: QuicIdentity, cfg: &Config) -> Result<Bundle<QuicTransport>, BenchError> {
    let q = QuicConfig::new("127.0.0.1:0".parse().expect("literal address"), id);
    Ok(Bundle::new(QuicTransport::bind(q)?, cfg.clone())?)
}

fn port(a: NodeAddr) -> u16 {
    match a {
        NodeAddr::Ip(s) => s.port(),
        NodeAddr::Mem(_) => 0,
    }
}

/// The peer side. Reads `<datagram_bytes> <ca_hex> <cert_hex> <key_hex>` from `input`,
/// prints `READY <raw_udp> <raw_stream> <tcp> <am_udp> <am_quic> <raw_gso_stream>` (ports),
/// then answers `STREAM` / `GSOSTREAM` with `<bytes> <datagrams> <span_ns>` until `QUIT` or
/// end of input.
pub(crate) fn run_peer(input: impl Read, mut output: impl Write) -> Result<(), BenchError> {
    let mut input = BufReader::new(input);
    let mut line = String::new();
    input.read_line(&mut line)?;
    let f: Vec<&str> = line.split_whitespace().collect();
    if f.len() != 4 {
        return Err(BenchError::Peer(format!("bad setup line: {line:?}")));
    }
    let datagram_bytes: usize = f[0]
        .parse()
        .map_err(|_| BenchError::Peer("bad datagram size".into()))?;
    let id = QuicIdentity {
        ca_der: unhex(f[1])?,
        cert_der: unhex(f[2])?,
        key_der: unhex(f[3])?,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();

    // Raw UDP echo.
    let echo = UdpSocket::bind("127.0.0.1:0")?;
    echo.set_read_timeout(Some(Duration::from_millis(100)))?;
    let echo_port = echo.local_addr()?.port();
    let st = stop.clone();
    threads.push(std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        while !st.load(Ordering::Relaxed) {
            if let Ok((n, from)) = echo.recv_from(&mut buf) {
                let _ = echo.send_to(&buf[..n], from);
            }
        }
        Ok(())
    }));

    // Raw UDP stream sink.
    let sink = sink_socket()?;
    let sink_port = sink.local_addr()?.port();
    let stats = Arc::new(StreamStats::default());
    let origin = Instant::now();
    let (st, ss) = (stop.clone(), stats.clone());
    threads.push(std::thread::spawn(move || {
        let mut buf = vec![0u8; 65_536];
        while !st.load(Ordering::Relaxed) {
            if let Ok(n) = sink.recv(&mut buf) {
                ss.add(origin, n, 1);
            }
        }
        Ok(())
    }));

    // Raw UDP stream sink with GRO (for the GSO stream): one receive per coalesced batch.
    let gsink = sink_socket()?;
    let _ = nix::sys::socket::setsockopt(&gsink, nix::sys::socket::sockopt::UdpGroSegment, &true);
    let gsink_port = gsink.local_addr()?.port();
    let gstats = Arc::new(StreamStats::default());
    let (st, ss) = (stop.clone(), gstats.clone());
    threads.push(std::thread::spawn(move || {
        use nix::sys::socket::{ControlMessageOwned, MsgFlags, SockaddrStorage, recvmsg};
        use std::os::fd::AsRawFd;
        let mut buf = vec![0u8; 65_536];
        let mut cmsg = nix::cmsg_space!(i32);
        while !st.load(Ordering::Relaxed) {
            let mut iov = [std::io::IoSliceMut::new(&mut buf)];
            let Ok(m) = recvmsg::<SockaddrStorage>(
                gsink.as_raw_fd(),
                &mut iov,
                Some(&mut cmsg[..]),
                MsgFlags::empty(),
            ) else {
                continue;
            };
            let n = m.bytes;
            let mut stride = n.max(1);
            if let Ok(cm) = m.cmsgs() {
                for c in cm {
                    if let ControlMessageOwned::UdpGroSegments(g) = c {
                        stride = usize::try_from(g).unwrap_or(stride).max(1);
                    }
                }
            }
            ss.add(origin, n, n.div_ceil(stride) as u64);
        }
        Ok(())
    }));

    // TCP echo (one connection at a time).
    let tcp = TcpListener::bind("127.0.0.1:0")?;
    tcp.set_nonblocking(true)?;
    let tcp_port = tcp.local_addr()?.port();
    let st = stop.clone();
    threads.push(std::thread::spawn(move || {
        while !st.load(Ordering::Relaxed) {
            match tcp.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false)?;
                    s.set_nodelay(true)?;
                    s.set_read_timeout(Some(Duration::from_millis(200)))?;
                    let mut buf = [0u8; RAW_PING_BYTES];
                    while !st.load(Ordering::Relaxed) {
                        match s.read_exact(&mut buf) {
                            Ok(()) => s.write_all(&buf)?,
                            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
                            Err(_) => {}
                        }
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(5)),
            }
        }
        Ok(())
    }));

    // AM servers.
    let cfg = Config::default();
    let am_udp_port = spawn_am_server(udp_bundle(datagram_bytes, &cfg)?, &stop, &mut threads);
    let am_quic_port = spawn_am_server(quic_bundle(id, &cfg)?, &stop, &mut threads);

    writeln!(
        output,
        "READY {echo_port} {sink_port} {tcp_port} {am_udp_port} {am_quic_port} {gsink_port}"
    )?;
    output.flush()?;
    loop {
        line.clear();
        if input.read_line(&mut line)? == 0 {
            break;
        }
        let which = match line.trim() {
            "STREAM" => Some(&stats),
            "GSOSTREAM" => Some(&gstats),
            _ => None,
        };
        match line.trim() {
            "STREAM" | "GSOSTREAM" => {
                let s = which.expect("matched above");
                let span = s
                    .last_ns
                    .load(Ordering::Relaxed)
                    .saturating_sub(s.first_ns.load(Ordering::Relaxed));
                let (b, d) = (
                    s.bytes.load(Ordering::Relaxed),
                    s.datagrams.load(Ordering::Relaxed),
                );
                writeln!(output, "{b} {d} {span}")?;
                output.flush()?;
                for a in [&s.bytes, &s.datagrams, &s.first_ns, &s.last_ns] {
                    a.store(0, Ordering::Relaxed);
                }
            }
            "QUIT" => break,
            other => return Err(BenchError::Peer(format!("unknown command {other:?}"))),
        }
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        join_peer(t)?;
    }
    Ok(())
}

/// Joins a thread of the peer: its error, or a panic as an error.
fn join_peer(t: std::thread::JoinHandle<Result<(), BenchError>>) -> Result<(), BenchError> {
    t.join()
        .map_err(|_| BenchError::Peer("peer thread panicked".into()))?
}

/// Entry point of the hidden peer subcommand: `args` are ignored (everything comes over
/// stdin). Runs [`run_peer`] on stdin/stdout.
pub(crate) fn bench_peer_main(_args: &[String]) -> Result<(), BenchError> {
    pin_to_cpu(Side::Peer);
    run_peer(std::io::stdin(), std::io::stdout())
}

/// Which process of the benchmark.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Driver,
    Peer,
}

/// Pins the calling process (and the threads it starts later) to its own CPU when there are
/// two or more, so the driver and the peer never share a core: otherwise the scheduler
/// sometimes puts both on one core and a round trip pays two context switches, which made runs
/// bimodal. Baselines and AM series run under the same pinning. Best effort: without the CPUs
/// or the permission the processes run unpinned.
fn pin_to_cpu(side: Side) {
    use nix::sched::{CpuSet, sched_getaffinity, sched_setaffinity};
    use nix::unistd::Pid;
    let Ok(allowed) = sched_getaffinity(Pid::from_raw(0)) else {
        return;
    };
    let cpus: Vec<usize> = (0..CpuSet::count())
        .filter(|&c| allowed.is_set(c).unwrap_or(false))
        .collect();
    if cpus.len() < 2 {
        return;
    }
    let cpu = match side {
        Side::Driver => cpus[0],
        Side::Peer => cpus[cpus.len() - 1],
    };
    let mut set = CpuSet::new();
    if set.set(cpu).is_ok() {
        let _ = sched_setaffinity(Pid::from_raw(0), &set);
    }
}

// ------------------------------------------------------------------ the driver

struct PeerLink {
    out: Box<dyn Write + Send>,
    inp: BufReader<Box<dyn Read + Send>>,
    child: Option<std::process::Child>,
    thread: Option<std::thread::JoinHandle<Result<(), BenchError>>>,
}

impl PeerLink {
    fn line(&mut self) -> Result<String, BenchError> {
        let mut l = String::new();
        if self.inp.read_line(&mut l)? == 0 {
            return Err(BenchError::Peer("peer closed its output".into()));
        }
        Ok(l)
    }
    /// Sends the peer its setup line (see [`run_peer`]); returns the six ports of its
    /// `READY` line.
    fn setup(&mut self, datagram_bytes: usize, id: &QuicIdentity) -> Result<[u16; 6], BenchError> {
        writeln!(
            self.out,
            "{datagram_bytes} {} {} {}",
            hex(&id.ca_der),
            hex(&id.cert_der),
            hex(&id.key_der)
        )?;
        self.out.flush()?;
        let ready = self.line()?;
        let ports: Vec<u16> = ready
            .split_whitespace()
            .skip(1)
            .filter_map(|p| p.parse().ok())
            .collect();
        match <[u16; 6]>::try_from(ports) {
            Ok(ports) if ready.starts_with("READY") => Ok(ports),
            _ => Err(BenchError::Peer(format!("bad READY line {ready:?}"))),
        }
    }

    fn finish(mut self) -> Result<(), BenchError> {
        let _ = writeln!(self.out, "QUIT");
        let _ = self.out.flush();
        drop(self.out);
        if let Some(mut c) = self.child.take() {
            let st = c.wait()?;
            if !st.success() {
                return Err(BenchError::Peer(format!("peer exited with {st}")));
            }
        }
        if let Some(t) = self.thread.take() {
            join_peer(t)?;
        }
        Ok(())
    }
}

fn start_peer(opts: &BenchOptions) -> Result<PeerLink, BenchError> {
    if opts.in_process {
        let (r1, w1) = std::io::pipe()?;
        let (r2, w2) = std::io::pipe()?;
        let thread = std::thread::spawn(move || run_peer(r1, w2));
        return Ok(PeerLink {
            out: Box::new(w1),
            inp: BufReader::new(Box::new(r2)),
            child: None,
            thread: Some(thread),
        });
    }
    let exe = match &opts.peer_exe {
        Some(p) => p.clone(),
        None => std::env::current_exe()?,
    };
    let mut child = Command::new(exe)
        .args(&opts.peer_args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    let out = child
        .stdin
        .take()
        .ok_or_else(|| BenchError::Peer("no stdin".into()))?;
    let inp = child
        .stdout
        .take()
        .ok_or_else(|| BenchError::Peer("no stdout".into()))?;
    Ok(PeerLink {
        out: Box::new(out),
        inp: BufReader::new(Box::new(inp)),
        child: Some(child),
        thread: None,
    })
}

/// Round-trip series are measured in this many interleaved blocks (raw UDP, TCP, AM short,
/// in turn), so that load from other processes on the machine hits every series alike.
const RTT_BLOCKS: usize = 10;

/// Raw UDP ping-pong client (blocking `send` + `recv`).
struct RawUdp {
    s: UdpSocket,
    /// `Some(peer)`: unconnected (`send_to`/`recv_from`).
    to: Option<SocketAddr>,
    buf: [u8; 2048],
    lost: usize,
}

impl RawUdp {
    fn new(peer: SocketAddr, connected: bool) -> Result<Self, BenchError> {
        let s = UdpSocket::bind("127.0.0.1:0")?;
        if connected {
            s.connect(peer)?;
        }
        s.set_read_timeout(Some(Duration::from_millis(200)))?;
        Ok(Self {
            s,
            to: (!connected).then_some(peer),
            buf: [0; 2048],
            lost: 0,
        })
    }

    /// `iters` round trips; the first tenth are warm-up and not recorded.
    fn block(&mut self, iters: usize, h: &mut Histogram<u64>) -> Result<(), BenchError> {
        let msg = [0x5Au8; RAW_PING_BYTES];
        for i in 0..iters {
            let t0 = Instant::now();
            let got = match self.to {
                None => self.s.send(&msg).and_then(|_| self.s.recv(&mut self.buf)),
                Some(to) => self
                    .s
                    .send_to(&msg, to)
                    .and_then(|_| self.s.recv_from(&mut self.buf).map(|(n, _)| n)),
            };
            match got {
                Ok(_) if i >= iters / 10 => record(h, t0.elapsed()),
                Ok(_) => {}
                Err(_) => self.lost += 1,
            }
            if self.lost > 100 {
                return Err(BenchError::Peer(
                    "raw UDP echo lost too many packets".into(),
                ));
            }
        }
        Ok(())
    }
}

/// TCP_NODELAY ping-pong client.
struct RawTcp(TcpStream);

impl RawTcp {
    fn new(peer: SocketAddr) -> Result<Self, BenchError> {
        let s = TcpStream::connect(peer)?;
        s.set_nodelay(true)?;
        Ok(Self(s))
    }

    fn block(&mut self, iters: usize, h: &mut Histogram<u64>) -> Result<(), BenchError> {
        let msg = [0x5Au8; RAW_PING_BYTES];
        let mut buf = [0u8; RAW_PING_BYTES];
        for i in 0..iters {
            let t0 = Instant::now();
            self.0.write_all(&msg)?;
            self.0.read_exact(&mut buf)?;
            if i >= iters / 10 {
                record(h, t0.elapsed());
            }
        }
        Ok(())
    }
}

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

/// Stream `bytes` in `dgram`-byte datagrams to `peer` and ask the peer what arrived. Plain:
/// one `send` per datagram. GSO: `UDP_SEGMENT`, up to 44 datagrams per `send` (the peer's
/// GSO sink has GRO on).
fn raw_stream(
    link: &mut PeerLink,
    peer: SocketAddr,
    bytes: usize,
    dgram: usize,
    gso: bool,
) -> Result<(f64, f64), BenchError> {
    let s = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::DGRAM, None)?;
    let _ = s.set_send_buffer_size(4 << 20);
    let s: UdpSocket = s.into();
    s.connect(peer)?;
    let n = bytes.div_ceil(dgram);
    let per_send = if gso {
        let seg = i32::try_from(dgram).unwrap_or(0);
        nix::sys::socket::setsockopt(&s, nix::sys::socket::sockopt::UdpGsoSegment, &seg)
            .map_err(std::io::Error::from)?;
        (65_507 / dgram).clamp(1, 64)
    } else {
        1
    };
    let buf = vec![0x77u8; dgram * per_send];
    let mut left = n;
    while left > 0 {
        let k = left.min(per_send);
        let _ = s.send(&buf[..k * dgram]);
        left -= k;
    }
    std::thread::sleep(Duration::from_millis(50));
    writeln!(link.out, "{}", if gso { "GSOSTREAM" } else { "STREAM" })?;
    link.out.flush()?;
    let l = link.line()?;
    let f: Vec<u128> = l
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    let [got, dgrams, span_ns] = f[..] else {
        return Err(BenchError::Peer(format!("bad STREAM answer {l:?}")));
    };
    if span_ns == 0 {
        return Err(BenchError::Peer("raw stream: nothing arrived".into()));
    }
    let mbps = got as f64 / (span_ns as f64 / 1e9) / 1e6;
    Ok((mbps, dgrams as f64 / n as f64))
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
    let mut tcp = RawTcp::new(at(ports[2]))?;
    let mut c = Client::new(udp_bundle(opts.datagram_bytes, &cfg)?, at(ports[3]))?;
    let (mut hu, mut huu, mut ht, mut ha) = (hist(), hist(), hist(), hist());
    let per = opts.rtt_iters.div_ceil(RTT_BLOCKS);
    for _ in 0..RTT_BLOCKS {
        udp.block(per + per / 9, &mut hu)?;
        c.rtt_into(0, per, per / 10, &mut ha)?;
        tcp.block(per + per / 9, &mut ht)?;
        udp_unc.block(per + per / 9, &mut huu)?;
    }
    drop((udp, udp_unc, tcp));
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
    r.rtt_ratio_udp = ratio(r.am_udp_rtt_p50_us, r.raw_udp_rtt_p50_us);
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
        r.rtt_ratio_quic = ratio(r.am_quic_rtt_p50_us, r.raw_udp_rtt_p50_us);
    }
    link.finish()?;
    r.elapsed_s = start.elapsed().as_secs_f64();
    Ok(r)
}

// ------------------------------------------------- the raw baseline for other benchmarks

/// The raw UDP ping-pong of [`run_bench`] on its own, for benchmarks of higher layers that
/// report their numbers against the raw round trip between two processes measured in the same
/// run (`isotach bench tokens` / `isotach bench isochrons`).
///
/// [`RawUdpBaseline::start`] starts the same peer as [`run_bench`] (a second process, or a
/// thread with [`BenchOptions::in_process`]); each [`RawUdpBaseline::measure`] adds a block of
/// round trips to one histogram, so a caller can measure before and after its own run. In
/// two-process mode the ping-pong runs on a thread pinned to the driver's CPU (the peer pins
/// itself to the peer's), the placement `isotach bench am` measures in; the caller's other
/// threads are not pinned.
pub(crate) struct RawUdpBaseline {
    link: PeerLink,
    udp: RawUdp,
    hist: Histogram<u64>,
    pin: bool,
}

impl std::fmt::Debug for RawUdpBaseline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RawUdpBaseline")
            .field("samples", &self.hist.len())
            .field("pin", &self.pin)
            .finish_non_exhaustive()
    }
}

impl RawUdpBaseline {
    /// Starts the peer (only `peer_args`, `peer_exe` and `in_process` of `opts` matter).
    pub(crate) fn start(opts: &BenchOptions) -> Result<Self, BenchError> {
        let ca = make_ca("isotach bench CA")?;
        let theirs = make_node_identity(&ca, "bench-peer")?;
        let mut link = start_peer(opts)?;
        let ports = link.setup(opts.datagram_bytes, &theirs)?;
        let udp = RawUdp::new(SocketAddr::from(([127, 0, 0, 1], ports[0])), true)?;
        Ok(Self {
            link,
            udp,
            hist: hist(),
            pin: !opts.in_process,
        })
    }

    /// Adds `iters` round trips (the first tenth are warm-up, not recorded).
    pub(crate) fn measure(&mut self, iters: usize) -> Result<(), BenchError> {
        let (udp, h, pin) = (&mut self.udp, &mut self.hist, self.pin);
        std::thread::scope(|s| {
            s.spawn(move || {
                if pin {
                    pin_to_cpu(Side::Driver);
                }
                udp.block(iters, h)
            })
            .join()
            .map_err(|_| BenchError::Peer("raw ping-pong thread panicked".into()))?
        })
    }

    /// Median round trip so far, µs (0 before any sample).
    pub(crate) fn p50_us(&self) -> f64 {
        us(&self.hist, 0.5)
    }

    /// 99th percentile round trip so far, µs.
    pub(crate) fn p99_us(&self) -> f64 {
        us(&self.hist, 0.99)
    }

    /// Round trips recorded so far.
    pub(crate) fn samples(&self) -> u64 {
        self.hist.len()
    }

    /// `"two_processes"` or `"threads"`.
    pub(crate) fn mode(&self) -> &'static str {
        mode(!self.pin)
    }

    /// Stops the peer and waits for it.
    pub(crate) fn finish(self) -> Result<(), BenchError> {
        drop(self.udp);
        self.link.finish()
    }
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
        let mut b = RawUdpBaseline::start(&opts).unwrap();
        b.measure(100).unwrap();
        b.measure(100).unwrap();
        assert_eq!(b.samples(), 180);
        assert!(b.p50_us() > 0.0 && b.p99_us() >= b.p50_us());
        assert_eq!(b.mode(), "threads");
        b.finish().unwrap();
    }
}
