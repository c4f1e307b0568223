//! The raw baselines of `isotach bench am` (UDP and TCP ping-pong, raw UDP streams) and the
//! raw UDP round trip other benchmarks report against ([`RawUdpBaseline`]).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

use super::peer::{PeerLink, Side, pin_to_cpu, start_peer};
use super::{BenchError, BenchOptions, RAW_PING_BYTES, hist, mode, record, us};
use isotach_am::backend::quic::{make_ca, make_node_identity};

/// Raw UDP ping-pong client (blocking `send` + `recv`).
pub(super) struct RawUdp {
    s: UdpSocket,
    /// `Some(peer)`: unconnected (`send_to`/`recv_from`).
    to: Option<SocketAddr>,
    buf: [u8; 2048],
    lost: usize,
}

impl RawUdp {
    pub(super) fn new(peer: SocketAddr, connected: bool) -> Result<Self, BenchError> {
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
    pub(super) fn block(&mut self, iters: usize, h: &mut Histogram<u64>) -> Result<(), BenchError> {
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
pub(super) struct RawTcp(TcpStream);

impl RawTcp {
    pub(super) fn new(peer: SocketAddr) -> Result<Self, BenchError> {
        let s = TcpStream::connect(peer)?;
        s.set_nodelay(true)?;
        Ok(Self(s))
    }

    pub(super) fn block(&mut self, iters: usize, h: &mut Histogram<u64>) -> Result<(), BenchError> {
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

/// Stream `bytes` in `dgram`-byte datagrams to `peer` and ask the peer what arrived. Plain:
/// one `send` per datagram. GSO: `UDP_SEGMENT`, up to 44 datagrams per `send` (the peer's
/// GSO sink has GRO on).
pub(super) fn raw_stream(
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
