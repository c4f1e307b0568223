//! Test harness shared by the conformance suite: N bundles of one backend, stepped from one
//! thread. The in-memory backend runs on virtual time; the socket backends on real time
//! (with a generous liveness guard, which is not a timing assertion).
#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use isotach_am::backend::chan::{ChanNet, ChanTransport};
use isotach_am::backend::fault::Faulty;
use isotach_am::backend::mem::{FaultModel, MemNet, MemTransport};
use isotach_am::backend::quic::{
    QuicConfig, QuicIdentity, QuicTransport, make_ca, make_node_identity,
};
use isotach_am::backend::udp::{UdpConfig, UdpTransport};
use isotach_am::{
    Bundle, Config, EndpointName, EpId, HandlerId, NodeAddr, Returned, Tag, Time, TransIdx,
    Transport,
};

pub const TAG: Tag = Tag(0x1507_AC4E);
pub const EP: EpId = EpId(0);

/// Seed from `AM_SEED` or a default; always printed (shown by cargo on failure).
pub fn seed(default: u64) -> u64 {
    let s = std::env::var("AM_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default);
    eprintln!("seed = {s} (replay with AM_SEED={s})");
    s
}

pub type Log = Arc<Mutex<Vec<Returned>>>;

pub struct H<T: Transport> {
    pub nodes: Vec<Bundle<T>>,
    pub net: Option<MemNet>,
    pub seed: u64,
    pub returned: Vec<Log>,
}

pub fn mem(n: usize, faults: FaultModel, cfg: &Config, seed: u64) -> H<MemTransport> {
    let net = MemNet::new(seed, faults);
    let nodes = (0..n)
        .map(|_| Bundle::new(net.node(), cfg.clone()).unwrap())
        .collect();
    H {
        nodes,
        net: Some(net),
        seed,
        returned: Vec::new(),
    }
}

pub fn udp_cfg() -> Config {
    Config {
        rto_initial: Duration::from_millis(2),
        ..Config::default()
    }
}

/// `n` real-time nodes made by `make(i)`, each dropping a sent datagram with probability
/// `loss` and sending it twice with probability `dup` (node `i` seeded `seed + i`).
fn faulty<T: Transport>(
    n: usize,
    cfg: &Config,
    loss: f64,
    dup: f64,
    seed: u64,
    mut make: impl FnMut(usize) -> T,
) -> H<Faulty<T>> {
    let nodes = (0..n)
        .map(|i| {
            let t = Faulty::with_faults(make(i), seed.wrapping_add(i as u64), loss, dup);
            Bundle::new(t, cfg.clone()).unwrap()
        })
        .collect();
    H {
        nodes,
        net: None,
        seed,
        returned: Vec::new(),
    }
}

pub fn udp(n: usize, cfg: &Config, loss: f64, dup: f64, seed: u64) -> H<Faulty<UdpTransport>> {
    faulty(n, cfg, loss, dup, seed, |_| {
        UdpTransport::with_config(UdpConfig::new("127.0.0.1:0".parse().unwrap())).unwrap()
    })
}

/// `n` nodes of one in-process real-time network.
pub fn chan(n: usize, cfg: &Config, loss: f64, dup: f64, seed: u64) -> H<Faulty<ChanTransport>> {
    let net = ChanNet::new();
    faulty(n, cfg, loss, dup, seed, |_| net.node())
}

pub struct Pki {
    pub ca: isotach_am::backend::quic::CertAuthority,
}

pub fn quic_identity(ca: &isotach_am::backend::quic::CertAuthority, name: &str) -> QuicIdentity {
    make_node_identity(ca, name).unwrap()
}

pub fn quic(n: usize, cfg: &Config, loss: f64, dup: f64, seed: u64) -> H<Faulty<QuicTransport>> {
    quic_wire_loss(n, cfg, loss, dup, 0.0, seed)
}

/// As [`quic`], each node also losing `wire_loss` of the UDP datagrams quinn sends (below
/// QUIC, so QUIC sees the loss; node `i`'s draws seeded `seed + i`).
pub fn quic_wire_loss(
    n: usize,
    cfg: &Config,
    loss: f64,
    dup: f64,
    wire_loss: f64,
    seed: u64,
) -> H<Faulty<QuicTransport>> {
    let ca = make_ca("isotach test CA").unwrap();
    faulty(n, cfg, loss, dup, seed, |i| {
        let id = quic_identity(&ca, &format!("node{i}"));
        let mut q = QuicConfig::new("127.0.0.1:0".parse().unwrap(), id);
        q.wire_loss = wire_loss;
        q.wire_loss_seed = seed.wrapping_add(i as u64);
        QuicTransport::bind(q).unwrap()
    })
}

impl<T: Transport> H<T> {
    /// Every node gets endpoint 0 with tag TAG, a segment of `seg` bytes, a recording
    /// handler 0, and translation i -> node i endpoint 0.
    pub fn setup(&mut self, seg: usize) {
        let names: Vec<EndpointName> = self.nodes.iter().map(|b| b.name(EP)).collect();
        for b in &mut self.nodes {
            let ep = b.alloc_endpoint().unwrap();
            assert_eq!(ep, EP);
            b.set_tag(ep, TAG).unwrap();
            b.set_segment(ep, seg).unwrap();
            let log: Log = Arc::default();
            let l = log.clone();
            b.set_return_handler(ep, move |r| l.lock().unwrap().push(*r))
                .unwrap();
            self.returned.push(log);
            for (i, n) in names.iter().enumerate() {
                b.map(ep, TransIdx(i as u16), *n, TAG).unwrap();
            }
        }
    }

    pub fn addr(&self, i: usize) -> NodeAddr {
        self.nodes[i].local_addr()
    }

    pub fn returned(&self, i: usize) -> Vec<Returned> {
        self.returned[i].lock().unwrap().clone()
    }

    pub fn now(&self) -> Time {
        match &self.net {
            Some(n) => n.now(),
            None => self.nodes[0].transport().now(),
        }
    }

    /// Poll everyone; if nobody had work, move time (virtual) or sleep a little (real).
    /// False when nothing can happen any more (virtual time only).
    pub fn step(&mut self) -> bool {
        let mut work = 0;
        for b in &mut self.nodes {
            work += b.poll().expect("poll");
        }
        if work > 0 {
            return true;
        }
        match &self.net {
            Some(net) => {
                let now = net.now();
                let next = self
                    .nodes
                    .iter()
                    .filter_map(Bundle::next_deadline)
                    .chain(net.next_delivery())
                    .min();
                match next {
                    None => false,
                    Some(t) => {
                        net.advance_to(t.max(Time(now.0 + 1)));
                        true
                    }
                }
            }
            None => {
                std::thread::sleep(Duration::from_micros(50));
                true
            }
        }
    }

    /// Step until `done`; panics (printing the seed) if the network goes quiet first or the
    /// liveness guard (600 s virtual / 60 s real) runs out.
    pub fn run(&mut self, what: &str, mut done: impl FnMut(&mut Self) -> bool) {
        let real = Instant::now();
        let virt = self.now();
        loop {
            if done(self) {
                return;
            }
            let alive = self.step();
            if !alive {
                assert!(
                    done(self),
                    "{what}: network went quiet before completion (seed {})",
                    self.seed
                );
                return;
            }
            let stuck = match self.net {
                Some(_) => self.now().since(virt) > Duration::from_secs(600),
                None => real.elapsed() > Duration::from_secs(60),
            };
            assert!(
                !stuck,
                "{what}: liveness guard expired (seed {})",
                self.seed
            );
        }
    }

    /// Step for `d` of (virtual or real) time.
    pub fn run_for(&mut self, d: Duration) {
        let end = self.now().plus(d);
        while self.now() < end {
            if !self.step() {
                if let Some(net) = &self.net {
                    net.advance_to(end);
                }
                return;
            }
        }
    }
}

/// Bind a reply handler that counts runs and records args.
pub fn reply_recorder<T: Transport>(b: &mut Bundle<T>, h: HandlerId) -> Arc<Mutex<Vec<Vec<u64>>>> {
    let log: Arc<Mutex<Vec<Vec<u64>>>> = Arc::default();
    let l = log.clone();
    b.set_reply_handler(EP, h, move |r| l.lock().unwrap().push(r.args().to_vec()))
        .unwrap();
    log
}
