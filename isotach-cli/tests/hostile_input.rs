//! Bad input (issue 5, item 10): while two philosopher processes run over a real token manager
//! and two real SIU daemons on loopback, extra UDP sockets throw a few thousand junk datagrams
//! at every listening port (the TM's, each SIU's, each application's): random bytes, truncated
//! and bit-flipped AM frames, well-formed AM frames with random header fields, and AM frames
//! carrying real (and corrupted) isotach packets built with `isotach_proto`.
//!
//! Checked: every philosopher still eats all its meals and exits 0 (logical time kept
//! advancing for the well-behaved hosts), every daemon is still running afterwards and exits
//! 0 on SIGTERM, and every daemon counted the junk in its shutdown line (the AM layer's
//! `bad_frames` for datagrams that are not frames, the packet port's `unknown_peer` for frames
//! from addresses that are not configured peers).
//!
//! The junk is a deterministic function of a seed (printed; set `ISOTACH_HOSTILE_SEED` to
//! replay one). No timed assertions: every deadline is a liveness guard.

mod common;

use common::{
    GUARD, Procs, free_addrs, logs, scratch, sigterm, spawn, spawn_siu, spawn_tm, two_host_config,
    wait_guarded, write_config,
};
use isotach_am::frame::{self, Header, Kind as AmKind};
use isotach_am::port::DEFAULT_TAG;
use isotach_am::{Class, MAX_ARGS, MAX_MEDIUM_BYTES, MAX_SLOTS, Status};
use isotach_proto::Pulse;
use isotach_proto::packet::{
    EndOfIsochron, IsotachMessage, Packet, PlainMessage, Sref, SrefOp, StartOfIsochron, Token,
    Width,
};
use isotach_proto::{Generation, WaveSeq};
use std::net::{SocketAddr, UdpSocket};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Junk datagrams to send at least (the thrower keeps going until the philosophers finish).
const JUNK_MIN: u64 = 3000;
/// Junk sent before the philosophers start (so they start under fire).
const JUNK_BEFORE_APPS: u64 = 500;
/// Sockets the junk comes from (each a distinct unknown peer of every target).
const JUNK_SOCKETS: usize = 4;
const MEALS: &str = "100";

/// The junk's random source: the workspace's seeded RNG ([`isotach_rng::Rng`]), plus the AM
/// incarnations it hands out.
struct JunkRng {
    rng: isotach_rng::Rng,
    inc: u64,
}

impl JunkRng {
    fn new(seed: u64) -> Self {
        Self {
            rng: isotach_rng::Rng::new(seed),
            inc: 0,
        }
    }
    fn next(&mut self) -> u64 {
        self.rng.next_u64()
    }
    fn below(&mut self, n: u64) -> u64 {
        self.rng.below(n)
    }
    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
    fn pick<'a, T>(&mut self, xs: &'a [T]) -> &'a T {
        &xs[self.below(xs.len() as u64) as usize]
    }
}

/// Real isotach packets (what the SIU and TM links carry), encoded.
fn isotach_packets() -> Vec<Vec<u8>> {
    let token = |seq, source_port| Token {
        seq,
        source_port,
        ..Token::default()
    };
    [
        Packet::Token(token(WaveSeq::from_bits(1), 0x8000)),
        Packet::Token(token(WaveSeq::from_bits(2), 0)),
        Packet::Token(Token {
            reset: true,
            end_of_epoch: true,
            ..token(WaveSeq::from_bits(3), 1)
        }),
        Packet::StartOfIsochron(StartOfIsochron {
            iso_id: 7,
            distance: 1,
            ..StartOfIsochron::default()
        }),
        Packet::IsotachMessage(IsotachMessage {
            ts: Pulse::new(0),
            source: 0,
            dest: 1,
            sequum: 0,
            generation: Generation::new(1),
            sref: Sref::Mem {
                op: SrefOp::Write,
                width: Width::W64,
                addr: 0x10,
                value: 42,
                ref_id: 1,
            },
        }),
        Packet::EndOfIsochron(EndOfIsochron { iso_id: 7 }),
        Packet::Plain(PlainMessage {
            source: 1,
            dest: 0,
            payload: b"not from a peer".to_vec(),
        }),
    ]
    .iter()
    .map(Packet::to_vec)
    .collect()
}

/// An AM frame with a valid CRC: a packet-port data fragment or hello, as a configured peer
/// would send it (but from an unknown address), or — `wild` — random header fields. Each
/// frame claims a newer sender incarnation, so the receiver's AM layer takes it as a fresh
/// request rather than a stale one, and the packet port sees it.
fn am_frame(rng: &mut JunkRng, payload: &[u8], wild: bool) -> Vec<u8> {
    let payload = &payload[..payload.len().min(MAX_MEDIUM_BYTES)];
    let mut h = Header::new(AmKind::Request, Class::Medium);
    let mut args = vec![0u64];
    let mut body = payload.to_vec();
    if rng.below(4) == 0 {
        // A hello (short request, argument = the cluster tag).
        h.class = Class::Short;
        h.handler = 2;
        args = vec![DEFAULT_TAG.0];
        body.clear();
    } else {
        h.handler = 1;
        args[0] = rng.below(2);
    }
    h.slot = rng.below(MAX_SLOTS as u64) as u16;
    h.seq = rng.next() as u32;
    rng.inc += 1;
    h.src_inc = rng.inc;
    h.tag = DEFAULT_TAG.0;
    if rng.below(2) == 0 {
        h.flags = frame::FLAG_FIFO;
        h.fifo_seq = rng.below(4) as u32;
    }
    if wild {
        let kinds = [
            AmKind::Request,
            AmKind::Reply,
            AmKind::Ack,
            AmKind::Nack,
            AmKind::ReplyNack,
            AmKind::ReplyNackAck,
        ];
        h.kind = *rng.pick(&kinds);
        h.class = *rng.pick(&[Class::Short, Class::Medium, Class::Xfer, Class::Get]);
        if matches!(h.kind, AmKind::Nack | AmKind::ReplyNack) {
            h.status = Some(*rng.pick(&[Status::BadArgs, Status::Congestion, Status::Unreachable]));
        }
        h.src_ep = rng.below(3) as u16;
        h.dst_ep = rng.below(3) as u16;
        h.slot = rng.next() as u16;
        h.handler = rng.below(8) as u16;
        h.epoch = rng.below(4) as u32;
        h.dst_inc = if rng.below(2) == 0 { 0 } else { rng.next() };
        h.tag = if rng.below(2) == 0 {
            DEFAULT_TAG.0
        } else {
            rng.next()
        };
        h.dest_offset = rng.below(4096) as u32;
        h.src_offset = rng.below(4096) as u32;
        h.frag_offset = if rng.below(2) == 0 {
            0
        } else {
            rng.below(1 << 16) as u32
        };
        h.frag_chunk = *rng.pick(&[0u16, 256, 512, 1024]);
        let nargs = rng.below(MAX_ARGS as u64 + 1) as usize;
        args = (0..nargs).map(|_| rng.next()).collect();
        if rng.below(3) == 0 {
            body.clear();
        }
    }
    h.nargs = args.len() as u8;
    h.frag_len = body.len() as u16;
    h.total_len = if wild && rng.below(3) == 0 {
        rng.below(1 << 20) as u32
    } else {
        body.len() as u32
    };
    let mut out = Vec::new();
    frame::encode(&h, &args, &body, &mut out);
    out
}

fn flip_bits(rng: &mut JunkRng, mut b: Vec<u8>) -> Vec<u8> {
    if b.is_empty() {
        return b;
    }
    for _ in 0..=rng.below(3) {
        let i = rng.below(b.len() as u64) as usize;
        b[i] ^= 1 << rng.below(8);
    }
    b
}

/// Kinds of junk, counted separately for the report.
const KINDS: [&str; 7] = [
    "random bytes",
    "truncated AM frame",
    "bit-flipped AM frame",
    "AM frame, corrupted isotach packet",
    "AM frame, real isotach packet",
    "AM frame, random header",
    "bare isotach packet",
];

/// One junk datagram and its kind (an index into [`KINDS`]).
fn junk(rng: &mut JunkRng, real: &[Vec<u8>]) -> (usize, Vec<u8>) {
    let kind = rng.below(KINDS.len() as u64) as usize;
    let packet = rng.pick(real).clone();
    let bytes = match kind {
        0 => {
            let n = rng.below(1500) as usize;
            rng.bytes(n)
        }
        1 => {
            let f = am_frame(rng, &packet, false);
            let n = rng.below(f.len() as u64) as usize;
            f[..n].to_vec()
        }
        2 => {
            let f = am_frame(rng, &packet, false);
            flip_bits(rng, f)
        }
        3 => {
            let p = flip_bits(rng, packet);
            let n = p.len() - rng.below(p.len() as u64 / 2 + 1) as usize;
            am_frame(rng, &p[..n], false)
        }
        4 => am_frame(rng, &packet, false),
        5 => am_frame(rng, &packet, true),
        _ => flip_bits(rng, packet),
    };
    (kind, bytes)
}

/// Throws junk at `targets` until `stop` is set and at least [`JUNK_MIN`] datagrams went
/// out; returns the datagrams sent per kind.
fn throw(
    seed: u64,
    targets: Vec<SocketAddr>,
    stop: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
) -> [u64; KINDS.len()] {
    let mut rng = JunkRng::new(seed);
    let real = isotach_packets();
    let socks: Vec<UdpSocket> = (0..JUNK_SOCKETS)
        .map(|_| UdpSocket::bind("127.0.0.1:0").unwrap())
        .collect();
    for s in &socks {
        s.set_nonblocking(true).unwrap();
    }
    let mut per_kind = [0u64; KINDS.len()];
    let mut buf = [0u8; 2048];
    let guard = Instant::now() + GUARD;
    while (!stop.load(Ordering::Relaxed) || sent.load(Ordering::Relaxed) < JUNK_MIN)
        && Instant::now() < guard
    {
        for _ in 0..20 {
            let (kind, bytes) = junk(&mut rng, &real);
            let sock = rng.pick(&socks);
            let to = rng.pick(&targets);
            // Errors (an application not bound yet) do not matter: this is junk.
            let _ = sock.send_to(&bytes, to);
            per_kind[kind] += 1;
            sent.fetch_add(1, Ordering::Relaxed);
        }
        // Drain whatever the targets answered (acks, nacks), so our buffers never fill.
        for s in &socks {
            while s.recv_from(&mut buf).is_ok() {}
        }
        // Past the minimum, keep the pressure on at a gentler rate until the apps are done.
        let pause = if sent.load(Ordering::Relaxed) < JUNK_MIN {
            2
        } else {
            20
        };
        std::thread::sleep(Duration::from_millis(pause));
    }
    per_kind
}

/// The number after `key: ` in the line of `log` that contains `marker`.
fn counter(log: &str, marker: &str, key: &str) -> Option<u64> {
    let line = log.lines().rev().find(|l| l.contains(marker))?;
    let at = line.find(&format!("{key}: "))? + key.len() + 2;
    let digits: String = line[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[test]
fn daemons_survive_junk_on_every_port_and_count_it() {
    let seed = std::env::var("ISOTACH_HOSTILE_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    println!("hostile input seed: {seed} (replay with ISOTACH_HOSTILE_SEED={seed})");
    let dir = scratch("hostile");
    let a = free_addrs(5);
    let cfg = &write_config(&dir, &two_host_config(&a));
    let targets: Vec<SocketAddr> = a.iter().map(|s| s.parse().unwrap()).collect();

    let mut procs = Procs(vec![
        spawn_tm(&dir, cfg, &[]),
        spawn_siu(&dir, cfg, "alpha", &[]),
        spawn_siu(&dir, cfg, "beta", &[]),
    ]);
    let daemons = 0..3;

    let stop = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let thrower = {
        let (stop, sent) = (Arc::clone(&stop), Arc::clone(&sent));
        std::thread::spawn(move || throw(seed, targets, stop, sent))
    };
    // The applications start under fire.
    let until = Instant::now() + GUARD;
    while sent.load(Ordering::Relaxed) < JUNK_BEFORE_APPS && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(10));
    }
    for (label, host) in [("philo-alpha", "alpha"), ("philo-beta", "beta")] {
        let args = ["philo", "--config", cfg, "--host", host, "--meals", MEALS];
        procs.0.push(spawn(&dir, label, &args));
    }

    // Logical time kept advancing: every philosopher ate all its meals.
    let until = Instant::now() + GUARD;
    for i in [3, 4] {
        let status = wait_guarded(&mut procs.0[i].1, until);
        assert!(
            status.is_some_and(|s| s.success()),
            "seed {seed}: {} ended with {status:?}\n{}",
            procs.0[i].0,
            logs(&dir)
        );
    }
    stop.store(true, Ordering::Relaxed);
    let per_kind = thrower.join().unwrap();
    let total: u64 = per_kind.iter().sum();
    println!("junk sent: {total}");
    for (k, n) in KINDS.iter().zip(per_kind) {
        println!("  {k}: {n}");
    }
    assert!(total >= JUNK_MIN, "seed {seed}: the thrower hit its guard");

    // The daemons are still up, and stop cleanly.
    for i in daemons.clone() {
        let (label, child) = &mut procs.0[i];
        assert!(
            child.try_wait().unwrap().is_none(),
            "seed {seed}: {label} died under junk\n{}",
            logs(&dir)
        );
    }
    for i in daemons.clone() {
        sigterm(&procs.0[i].1);
    }
    for i in daemons.clone() {
        let status = wait_guarded(&mut procs.0[i].1, Instant::now() + GUARD);
        assert!(
            status.is_some_and(|s| s.success()),
            "seed {seed}: {} ended with {status:?}\n{}",
            procs.0[i].0,
            logs(&dir)
        );
    }

    // Every daemon counted junk it could not decode and frames from strangers.
    for (i, marker) in [
        (0, "token manager stopped"),
        (1, "SIU stopped"),
        (2, "SIU stopped"),
    ] {
        let label = &procs.0[i].0;
        let log = std::fs::read_to_string(dir.join(format!("{label}.log"))).unwrap();
        let bad = counter(&log, marker, "bad_frames");
        let strangers = counter(&log, marker, "unknown_peer");
        println!("{label}: bad_frames {bad:?}, unknown_peer {strangers:?}");
        assert!(
            bad.is_some_and(|n| n > 0) && strangers.is_some_and(|n| n > 0),
            "seed {seed}: {label} did not count the junk\n{log}"
        );
    }
    drop(procs);
    let _ = std::fs::remove_dir_all(&dir);
}
