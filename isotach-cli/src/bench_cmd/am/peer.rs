//! The peer of `isotach bench am`: the process (or thread) that serves every baseline and AM
//! service at once, the line protocol the driver speaks to it over its stdin/stdout, and the
//! CPU pinning both sides use.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use isotach_am::backend::quic::{QuicConfig, QuicIdentity, QuicTransport};
use isotach_am::backend::udp::{UdpConfig, UdpTransport};
use isotach_am::{Bundle, Config, NodeAddr, Transport};

use super::raw::{ECHO_SPIN, recv_spinning};
use super::{BENCH_SEG, BenchError, BenchOptions, H_DONE, H_ECHO, RAW_PING_BYTES, TAG, hex, unhex};

/// Raw stream counters, published with relaxed atomics (no lock on the receive path).
#[derive(Default)]
pub(super) struct StreamStats {
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
pub(super) fn sink_socket() -> Result<UdpSocket, BenchError> {
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
pub(super) fn spawn_am_server<T: Transport + 'static>(
    b: Bundle<T>,
    stop: &Arc<AtomicBool>,
    threads: &mut Vec<std::thread::JoinHandle<Result<(), BenchError>>>,
) -> u16 {
    let p = port(b.local_addr());
    let st = Arc::clone(stop);
    threads.push(std::thread::spawn(move || am_server(b, st)));
    p
}

pub(super) fn udp_bundle(
    datagram_bytes: usize,
    cfg: &Config,
) -> Result<Bundle<UdpTransport>, BenchError> {
    let mut c = UdpConfig::new("127.0.0.1:0".parse().expect("literal address"));
    c.max_datagram = datagram_bytes;
    Ok(Bundle::new(UdpTransport::with_config(c)?, cfg.clone())?)
}

pub(super) fn quic_bundle(
    id: QuicIdentity,
    cfg: &Config,
) -> Result<Bundle<QuicTransport>, BenchError> {
    let q = QuicConfig::new("127.0.0.1:0".parse().expect("literal address"), id);
    Ok(Bundle::new(QuicTransport::bind(q)?, cfg.clone())?)
}

pub(super) fn port(a: NodeAddr) -> u16 {
    match a {
        NodeAddr::Ip(s) => s.port(),
        NodeAddr::Mem(_) => 0,
    }
}

/// The ports of the peer's `READY` line: raw UDP echo, stream sink, TCP echo, AM over UDP, AM
/// over QUIC, GSO stream sink, spinning raw UDP echo.
pub(super) const PEER_PORTS: usize = 7;

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

    // Raw UDP echo that spins before it sleeps (the baseline of runs whose waits spin).
    let spin_echo = UdpSocket::bind("127.0.0.1:0")?;
    spin_echo.set_nonblocking(true)?;
    let spin_echo_port = spin_echo.local_addr()?.port();
    let st = stop.clone();
    threads.push(std::thread::spawn(move || {
        let mut buf = [0u8; 2048];
        let idle = Duration::from_millis(100);
        while !st.load(Ordering::Relaxed) {
            if let Ok((n, from)) = recv_spinning(&spin_echo, &mut buf, ECHO_SPIN, idle) {
                let _ = spin_echo.send_to(&buf[..n], from);
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
        "READY {echo_port} {sink_port} {tcp_port} {am_udp_port} {am_quic_port} {gsink_port} \
         {spin_echo_port}"
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
pub(super) fn join_peer(
    t: std::thread::JoinHandle<Result<(), BenchError>>,
) -> Result<(), BenchError> {
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
pub(super) enum Side {
    Driver,
    Peer,
}

/// Pins the calling process (and the threads it starts later) to its own CPU when there are
/// two or more, so the driver and the peer never share a core: otherwise the scheduler
/// sometimes puts both on one core and a round trip pays two context switches, which made runs
/// bimodal. Baselines and AM series run under the same pinning. Best effort: without the CPUs
/// or the permission the processes run unpinned.
pub(super) fn pin_to_cpu(side: Side) {
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

pub(super) struct PeerLink {
    pub(super) out: Box<dyn Write + Send>,
    inp: BufReader<Box<dyn Read + Send>>,
    child: Option<std::process::Child>,
    thread: Option<std::thread::JoinHandle<Result<(), BenchError>>>,
}

impl PeerLink {
    pub(super) fn line(&mut self) -> Result<String, BenchError> {
        let mut l = String::new();
        if self.inp.read_line(&mut l)? == 0 {
            return Err(BenchError::Peer("peer closed its output".into()));
        }
        Ok(l)
    }
    /// Sends the peer its setup line (see [`run_peer`]); returns the seven ports of its
    /// `READY` line.
    pub(super) fn setup(
        &mut self,
        datagram_bytes: usize,
        id: &QuicIdentity,
    ) -> Result<[u16; PEER_PORTS], BenchError> {
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
        match <[u16; PEER_PORTS]>::try_from(ports) {
            Ok(ports) if ready.starts_with("READY") => Ok(ports),
            _ => Err(BenchError::Peer(format!("bad READY line {ready:?}"))),
        }
    }

    pub(super) fn finish(mut self) -> Result<(), BenchError> {
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

pub(super) fn start_peer(opts: &BenchOptions) -> Result<PeerLink, BenchError> {
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
