//! Profiling harness for the UDP fast path (issue 4): one phase per run, the peer on a
//! thread of this process, so `strace -f -c`, `perf record` and `valgrind --tool=callgrind`
//! see exactly one workload.
//!
//! `cargo run --release -p isotach-am --example am_prof -- <mode> <count>` with mode
//! `am-rtt` (short request/reply round trips), `raw-rtt` (84-byte UDP ping-pong),
//! `am-bulk` (64 KiB transfers, full credits) or `raw-stream` (1472-byte datagrams).
//! Prints the mean time per operation.

use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use isotach_am::backend::udp::UdpTransport;
use isotach_am::{AmError, Bundle, Config, EndpointName, EpId, HandlerId, NodeAddr, Tag, TransIdx};

const TAG: Tag = Tag(7);
const EP: EpId = EpId(0);
const PEER: TransIdx = TransIdx(0);

fn lo() -> SocketAddr {
    "127.0.0.1:0".parse().expect("literal")
}

/// A loopback socket for a raw echo or sink thread, and its address. The read timeout lets
/// the thread see its stop flag.
fn raw_server_socket() -> (UdpSocket, SocketAddr) {
    let s = UdpSocket::bind(lo()).expect("bind");
    s.set_read_timeout(Some(Duration::from_millis(20)))
        .expect("timeout");
    let addr = s.local_addr().expect("addr");
    (s, addr)
}

fn server(stop: Arc<AtomicBool>) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let mut b =
        Bundle::new(UdpTransport::bind(lo()).expect("bind"), Config::default()).expect("bundle");
    let ep = b.alloc_endpoint().expect("ep");
    b.set_tag(ep, TAG).expect("tag");
    b.set_segment(ep, 1 << 20).expect("seg");
    b.set_request_handler(ep, HandlerId(1), |req| {
        let n = req.data().len() as u64;
        let _ = req.reply_short(HandlerId(2), &[n]);
    })
    .expect("handler");
    let NodeAddr::Ip(addr) = b.local_addr() else {
        unreachable!()
    };
    let t = std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if b.wait(Duration::from_millis(20)).expect("wait") {
                b.poll().expect("poll");
            }
        }
    });
    (addr, t)
}

fn client(server: SocketAddr) -> (Bundle<UdpTransport>, Arc<AtomicU64>) {
    let mut b =
        Bundle::new(UdpTransport::bind(lo()).expect("bind"), Config::default()).expect("bundle");
    let ep = b.alloc_endpoint().expect("ep");
    b.set_tag(ep, TAG).expect("tag");
    b.set_segment(ep, 1 << 20).expect("seg");
    b.map(
        ep,
        PEER,
        EndpointName {
            node: NodeAddr::Ip(server),
            ep: EP,
        },
        TAG,
    )
    .expect("map");
    let done = Arc::new(AtomicU64::new(0));
    let d = done.clone();
    b.set_reply_handler(ep, HandlerId(2), move |_| {
        d.fetch_add(1, Ordering::Relaxed);
    })
    .expect("reply handler");
    b.set_return_handler(ep, |r| panic!("returned: {r:?}"))
        .expect("return handler");
    (b, done)
}

fn wait_done(b: &mut Bundle<UdpTransport>, done: &AtomicU64, want: u64) {
    while done.load(Ordering::Relaxed) < want {
        if b.wait(Duration::from_millis(100)).expect("wait") {
            b.poll().expect("poll");
        }
    }
}

struct EpollSock {
    sock: UdpSocket,
    poll: mio::Poll,
    events: mio::Events,
    _reg: mio::net::UdpSocket,
    state: quinn_udp::UdpSocketState,
    mmsg: bool,
    buf: Vec<u8>,
}

impl EpollSock {
    fn new(mmsg: bool) -> Self {
        let sock = UdpSocket::bind(lo()).expect("bind");
        sock.set_nonblocking(true).expect("nonblocking");
        let poll = mio::Poll::new().expect("poll");
        let mut reg = mio::net::UdpSocket::from_std(sock.try_clone().expect("clone"));
        poll.registry()
            .register(&mut reg, mio::Token(0), mio::Interest::READABLE)
            .expect("register");
        let state = quinn_udp::UdpSocketState::new((&sock).into()).expect("state");
        Self {
            sock,
            poll,
            events: mio::Events::with_capacity(4),
            _reg: reg,
            state,
            mmsg,
            buf: vec![0; 64 * 1024],
        }
    }

    fn try_recv(&mut self) -> Option<(usize, SocketAddr)> {
        if self.mmsg {
            let mut meta = [quinn_udp::RecvMeta::default(); 1];
            let mut iov = [std::io::IoSliceMut::new(&mut self.buf)];
            match self.state.recv((&self.sock).into(), &mut iov, &mut meta) {
                Ok(1) => Some((meta[0].len, meta[0].addr)),
                _ => None,
            }
        } else {
            self.sock.recv_from(&mut self.buf).ok()
        }
    }

    fn recv(&mut self, timeout: Option<Duration>) -> Option<(usize, SocketAddr)> {
        // Ping-pong: the previous receive emptied the socket, so the edge-triggered epoll
        // goes first (as the AM backend does after a drain).
        loop {
            self.poll.poll(&mut self.events, timeout).expect("epoll");
            if self.events.is_empty() {
                return None;
            }
            if let Some(r) = self.try_recv() {
                return Some(r);
            }
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map_or("am-rtt", String::as_str);
    let n: u64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(20_000);
    let stop = Arc::new(AtomicBool::new(false));
    let t0;
    match mode {
        "am-rtt" => {
            let (addr, th) = server(stop.clone());
            let (mut b, done) = client(addr);
            for i in 0..100 {
                b.request_short(EP, PEER, HandlerId(1), &[i]).expect("send");
                wait_done(&mut b, &done, i + 1);
            }
            t0 = Instant::now();
            for i in 0..n {
                let want = done.load(Ordering::Relaxed) + 1;
                b.request_short(EP, PEER, HandlerId(1), &[i]).expect("send");
                wait_done(&mut b, &done, want);
            }
            println!(
                "{mode}: {:.3} us/op",
                t0.elapsed().as_secs_f64() * 1e6 / n as f64
            );
            stop.store(true, Ordering::Relaxed);
            th.join().expect("server");
        }
        "am-bulk" => {
            let (addr, th) = server(stop.clone());
            let (mut b, done) = client(addr);
            let data = vec![0x3Cu8; 64 * 1024];
            t0 = Instant::now();
            let mut sent = 0u64;
            while done.load(Ordering::Relaxed) < n {
                while sent < n {
                    match b.request_xfer_async(
                        EP,
                        PEER,
                        (sent % 8 * 65_536) as u32,
                        HandlerId(1),
                        &data,
                        &[],
                    ) {
                        Ok(()) => sent += 1,
                        Err(AmError::WouldBlock) => break,
                        Err(e) => panic!("{e}"),
                    }
                }
                if b.wait(Duration::from_millis(100)).expect("wait") {
                    b.poll().expect("poll");
                }
            }
            let s = t0.elapsed().as_secs_f64();
            println!(
                "{mode}: {:.1} MB/s, {} retransmits",
                (n * 65_536) as f64 / s / 1e6,
                b.stats().retransmits
            );
            stop.store(true, Ordering::Relaxed);
            th.join().expect("server");
        }
        "raw-rtt" => {
            let (echo, addr) = raw_server_socket();
            let st = stop.clone();
            let th = std::thread::spawn(move || {
                let mut buf = [0u8; 2048];
                while !st.load(Ordering::Relaxed) {
                    if let Ok((k, from)) = echo.recv_from(&mut buf) {
                        let _ = echo.send_to(&buf[..k], from);
                    }
                }
            });
            // `unconnected`: the client sends with sendto and receives with recvfrom, as a
            // bundle must (it talks to many peers): a route lookup per send.
            let unconnected = args.get(2).is_some_and(|a| a == "unconnected");
            let s = UdpSocket::bind(lo()).expect("bind");
            if !unconnected {
                s.connect(addr).expect("connect");
            }
            let msg = [0x5Au8; 84];
            let mut buf = [0u8; 2048];
            let mut once = |s: &UdpSocket| {
                if unconnected {
                    s.send_to(&msg, addr).expect("send");
                    s.recv_from(&mut buf).expect("recv");
                } else {
                    s.send(&msg).expect("send");
                    s.recv(&mut buf).expect("recv");
                }
            };
            for _ in 0..100 {
                once(&s);
            }
            t0 = Instant::now();
            for _ in 0..n {
                once(&s);
            }
            println!(
                "{mode}{}: {:.3} us/op",
                if unconnected { " unconnected" } else { "" },
                t0.elapsed().as_secs_f64() * 1e6 / n as f64
            );
            stop.store(true, Ordering::Relaxed);
            th.join().expect("echo");
        }
        "raw-epoll-rtt" => {
            // Raw ping-pong waiting like the AM UDP backend: non-blocking sockets, an
            // edge-triggered epoll_wait, then a receive (recv_from, or recvmmsg through
            // quinn-udp with `mmsg`).
            let mmsg = args.get(2).is_some_and(|a| a == "mmsg");
            let echo = EpollSock::new(mmsg);
            let addr = echo.sock.local_addr().expect("addr");
            let st = stop.clone();
            let th = std::thread::spawn(move || {
                let mut echo = echo;
                while !st.load(Ordering::Relaxed) {
                    if let Some((k, from)) = echo.recv(Some(Duration::from_millis(20))) {
                        let _ = echo.sock.send_to(&echo.buf[..k], from);
                    }
                }
            });
            let mut s = EpollSock::new(mmsg);
            let msg = [0x5Au8; 84];
            for _ in 0..100 {
                s.sock.send_to(&msg, addr).expect("send");
                s.recv(None).expect("recv");
            }
            t0 = Instant::now();
            for _ in 0..n {
                s.sock.send_to(&msg, addr).expect("send");
                s.recv(None).expect("recv");
            }
            println!(
                "{mode}{}: {:.3} us/op",
                if mmsg { " mmsg" } else { "" },
                t0.elapsed().as_secs_f64() * 1e6 / n as f64
            );
            stop.store(true, Ordering::Relaxed);
            th.join().expect("echo");
        }
        "raw-stream" => {
            let (sink, addr) = raw_server_socket();
            let st = stop.clone();
            let got = Arc::new(AtomicU64::new(0));
            let g = got.clone();
            let th = std::thread::spawn(move || {
                let mut buf = vec![0u8; 65_536];
                while !st.load(Ordering::Relaxed) {
                    if let Ok(k) = sink.recv(&mut buf) {
                        g.fetch_add(k as u64, Ordering::Relaxed);
                    }
                }
            });
            let s = UdpSocket::bind(lo()).expect("bind");
            s.connect(addr).expect("connect");
            let buf = vec![0x77u8; 1472];
            t0 = Instant::now();
            for _ in 0..n {
                let _ = s.send(&buf);
            }
            let sp = t0.elapsed().as_secs_f64();
            std::thread::sleep(Duration::from_millis(50));
            println!(
                "{mode}: sent {:.1} MB/s, delivered {:.1}%",
                (n * 1472) as f64 / sp / 1e6,
                got.load(Ordering::Relaxed) as f64 * 100.0 / (n * 1472) as f64
            );
            stop.store(true, Ordering::Relaxed);
            th.join().expect("sink");
        }
        other => panic!("unknown mode {other}"),
    }
}
