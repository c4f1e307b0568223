//! The raw baselines of `isotach bench am` (UDP and TCP ping-pong, raw UDP streams) and the
//! raw UDP round trip other benchmarks report against ([`RawUdpBaseline`]).

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use isotach_am::backend::{poll_readable, spin};

use super::peer::{PeerLink, Side, pin_to_cpu, start_peer};
use super::{BenchError, BenchOptions, RAW_PING_BYTES, hist, mode, record, us};
use isotach_am::backend::quic::{make_ca, make_node_identity};

/// How long the peer's spinning echo polls before it sleeps: longer than any round trip of
/// the ping-pong, so while the baseline runs it never sleeps.
pub(super) const ECHO_SPIN: Duration = Duration::from_millis(1);

/// How long a receive on a non-blocking socket waits in all (a lost datagram).
const RECV_TIMEOUT: Duration = Duration::from_millis(200);

/// Receives one datagram on the non-blocking socket `s`, spinning for up to `spin` before it
/// sleeps in `poll(2)` (at most `timeout` in all): the AM backends' spin-then-sleep
/// (`[transport] spin-us`) with their own spin (`spin::until_readable`), on a raw socket.
pub(super) fn recv_spinning(
    s: &UdpSocket,
    buf: &mut [u8],
    spin: Duration,
    timeout: Duration,
) -> io::Result<(usize, SocketAddr)> {
    let start = Instant::now();
    let (spin_end, deadline) = (start + spin.min(timeout), start + timeout);
    loop {
        let ready = spin::until_readable(s.as_fd(), spin_end)? || {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(io::ErrorKind::TimedOut.into());
            }
            poll_readable(s.as_fd(), Some(left))?
        };
        if ready {
            match s.recv_from(buf) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                got => return got,
            }
        }
    }
}

/// Raw UDP ping-pong client (`send` + `recv`: blocking, or spinning first).
pub(super) struct RawUdp {
    s: UdpSocket,
    /// `Some(peer)`: unconnected (`send_to`/`recv_from`).
    to: Option<SocketAddr>,
    /// `Some(budget)`: the socket is non-blocking and every receive spins first.
    spin: Option<Duration>,
    buf: [u8; 2048],
    lost: usize,
}

impl RawUdp {
    pub(super) fn new(peer: SocketAddr, connected: bool) -> Result<Self, BenchError> {
        let s = UdpSocket::bind("127.0.0.1:0")?;
        if connected {
            s.connect(peer)?;
        }
        s.set_read_timeout(Some(RECV_TIMEOUT))?;
        Ok(Self {
            s,
            to: (!connected).then_some(peer),
            spin: None,
            buf: [0; 2048],
            lost: 0,
        })
    }

    /// A connected client whose receives poll for up to `spin` before they sleep (the peer
    /// at `peer` must echo the same way: its spinning echo).
    pub(super) fn spinning(peer: SocketAddr, spin: Duration) -> Result<Self, BenchError> {
        let mut c = Self::new(peer, true)?;
        c.s.set_nonblocking(true)?;
        c.spin = Some(spin);
        Ok(c)
    }

    /// `iters` round trips; the first tenth are warm-up and not recorded.
    pub(super) fn block(&mut self, iters: usize, h: &mut Histogram<u64>) -> Result<(), BenchError> {
        let msg = [0x5Au8; RAW_PING_BYTES];
        for i in 0..iters {
            let t0 = Instant::now();
            let got = match (self.to, self.spin) {
                (None, Some(spin)) => self.s.send(&msg).and_then(|_| {
                    recv_spinning(&self.s, &mut self.buf, spin, RECV_TIMEOUT).map(|(n, _)| n)
                }),
                (None, None) => self.s.send(&msg).and_then(|_| self.s.recv(&mut self.buf)),
                (Some(to), _) => self
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
            .map_err(io::Error::from)?;
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
    /// The same ping-pong against the peer's spinning echo, spinning on this side too (when
    /// the run under test spins: `[transport] spin-us` > 0).
    spin: Option<(RawUdp, Histogram<u64>)>,
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
    /// Starts the peer (only `peer_args`, `peer_exe` and `in_process` of `opts` matter). With
    /// a `spin` budget every block is also measured spinning on both sides.
    pub(crate) fn start(opts: &BenchOptions, spin: Duration) -> Result<Self, BenchError> {
        let ca = make_ca("isotach bench CA")?;
        let theirs = make_node_identity(&ca, "bench-peer")?;
        let mut link = start_peer(opts)?;
        let ports = link.setup(opts.datagram_bytes, &theirs)?;
        let at = |p: u16| SocketAddr::from(([127, 0, 0, 1], p));
        let udp = RawUdp::new(at(ports[0]), true)?;
        let spin = if spin.is_zero() {
            None
        } else {
            Some((RawUdp::spinning(at(ports[6]), spin)?, hist()))
        };
        Ok(Self {
            link,
            udp,
            hist: hist(),
            spin,
            pin: !opts.in_process,
        })
    }

    /// Adds `iters` round trips (the first tenth are warm-up, not recorded).
    pub(crate) fn measure(&mut self, iters: usize) -> Result<(), BenchError> {
        let (udp, h, pin) = (&mut self.udp, &mut self.hist, self.pin);
        let spin = self.spin.as_mut();
        std::thread::scope(|s| {
            s.spawn(move || {
                if pin {
                    pin_to_cpu(Side::Driver);
                }
                udp.block(iters, h)?;
                match spin {
                    Some((udp, h)) => udp.block(iters, h),
                    None => Ok(()),
                }
            })
            .join()
            .map_err(|_| BenchError::Peer("raw ping-pong thread panicked".into()))?
        })
    }

    /// Median round trip so far, µs (0 before any sample).
    pub(crate) fn p50_us(&self) -> f64 {
        us(&self.hist, 0.5)
    }

    /// Median round trip so far with both sides spinning, µs (`None`: started without a spin
    /// budget).
    pub(crate) fn spin_p50_us(&self) -> Option<f64> {
        self.spin.as_ref().map(|(_, h)| us(h, 0.5))
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
        drop((self.udp, self.spin));
        self.link.finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spinning_receive_takes_a_datagram_and_times_out_on_none() {
        let rx = UdpSocket::bind("127.0.0.1:0").unwrap();
        rx.set_nonblocking(true).unwrap();
        let tx = UdpSocket::bind("127.0.0.1:0").unwrap();
        let mut buf = [0u8; 64];
        let spin = Duration::from_micros(50);
        let err = recv_spinning(&rx, &mut buf, spin, Duration::from_millis(5)).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut, "nothing was sent");
        tx.send_to(b"ping", rx.local_addr().unwrap()).unwrap();
        // Spinning or asleep, whichever it is doing when the datagram lands.
        let (n, from) = recv_spinning(&rx, &mut buf, spin, Duration::from_secs(5)).unwrap();
        assert_eq!((&buf[..n], from), (&b"ping"[..], tx.local_addr().unwrap()));
    }
}
