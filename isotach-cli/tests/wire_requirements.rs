//! SIU requirements checked end to end on the real wire: each test starts a real `isotach siu`
//! daemon (the built binary) on loopback ports and drives it with the roles
//! `isotach tool` runs (`isotach-tests`: [`TokenBouncer`], [`ByteGenerator`], [`Receiver`]),
//! each behind a `PacketPort` bound where the SIU expects its token manager and its
//! application. Assertions are made only on what crosses those two links; the order the
//! bouncer saw the TM link in is kept in a trace. No assertion is timed: every wait is for an
//! observable event, with a generous deadline only as a failure guard.
//!
//! The cluster: hosts h0 and h2 on switch s0, h1 and h3 on switch s1, one trunk. The SIU under
//! test is h0 (host 0: it initiates the reset); h2 is at distance 1, h1 and h3 at distance 2.
//! Requirement numbers are those of `docs/requirements.md`.

mod common;

use isotach_am::NodeAddr;
use isotach_am::backend::udp::UdpTransport;
use isotach_am::port::{DEFAULT_TAG, PacketPort};
use isotach_proto::Generation;
use isotach_proto::Pulse;
use isotach_proto::WaveSeq;
use isotach_proto::packet::{
    IsotachMessage, Kind, Packet, SORT_VECTOR_MAX, Sref, SrefOp, StartOfIsochron, Token, Width,
    carried_crc,
};
use isotach_proto::topology::HostId;
use isotach_proto::wave::Arrival;
use isotach_tests::{ByteGenerator, Receiver, TokenBits, TokenBouncer, Wire, XorShift};
use std::collections::HashSet;
use std::net::{SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The host whose SIU runs.
const HOST: HostId = 0;
/// A host on the same switch (distance 1).
const NEAR: HostId = 2;
/// A host on the other switch (distance 2).
const FAR: HostId = 1;
/// Failure guard of every wait.
const GUARD: Duration = Duration::from_secs(60);

/// The SIU's address: a port no other test gets (the daemon binds it after we pick it).
fn free_addr() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], common::free_port()))
}

/// A real SIU daemon for h0 with its token manager and application links played by the test.
struct WireRig {
    tm: PacketPort<UdpTransport>,
    app: PacketPort<UdpTransport>,
    bouncer: TokenBouncer,
    host: ByteGenerator,
    receiver: Receiver,
    /// The TM link in the order the bouncer saw it.
    trace: Vec<Wire>,
    daemon: Child,
    dir: PathBuf,
    /// Bound placeholders for the peers nobody plays (their packets are absorbed).
    _placeholders: Vec<UdpSocket>,
}

impl Drop for WireRig {
    fn drop(&mut self) {
        let _ = self.daemon.kill();
        let _ = self.daemon.wait();
        if std::thread::panicking()
            && let Ok(log) = std::fs::read_to_string(self.dir.join("siu.log"))
        {
            let tail: Vec<&str> = log.lines().rev().take(30).collect();
            eprintln!("--- SIU daemon log (last lines, newest first) ---");
            for l in tail {
                eprintln!("{l}");
            }
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

impl WireRig {
    /// Starts the daemon and waits until logical time runs: the SIU's reset was answered with
    /// wave 1 and the SIU answered that (the bouncer then pauses).
    fn start(name: &str) -> Self {
        let tm_t = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).expect("bind tm");
        let app_t = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).expect("bind app");
        let tm_addr = tm_t.socket_addr();
        let app_addr = app_t.socket_addr();
        let placeholders: Vec<UdpSocket> = (0..7)
            .map(|_| UdpSocket::bind("127.0.0.1:0").expect("bind"))
            .collect();
        let ph: Vec<SocketAddr> = placeholders
            .iter()
            .map(|s| s.local_addr().unwrap())
            .collect();
        let siu = free_addr();
        let config = format!(
            r#"
[transport]
kind = "udp"

[timing]
token-timeout-us = 20000
epoch-pulses = 64

[[switch]]
name = "s0"
listen = "{tm_addr}"

[[switch]]
name = "s1"
listen = "{s1}"

[[trunk]]
between = ["s0", "s1"]

[[host]]
name = "h0"
switch = "s0"
siu = "{siu}"
app = "{app_addr}"

[[host]]
name = "h1"
switch = "s1"
siu = "{h1s}"
app = "{h1a}"

[[host]]
name = "h2"
switch = "s0"
siu = "{h2s}"
app = "{h2a}"

[[host]]
name = "h3"
switch = "s1"
siu = "{h3s}"
app = "{h3a}"
"#,
            s1 = ph[0],
            h1s = ph[1],
            h1a = ph[2],
            h2s = ph[3],
            h2a = ph[4],
            h3s = ph[5],
            h3a = ph[6],
        );
        let dir = std::env::temp_dir().join(format!(
            "isotach-wire-{}-{name}-{}",
            std::process::id(),
            siu.port()
        ));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let cfg = dir.join("cluster.toml");
        std::fs::write(&cfg, config).expect("write config");
        let log = std::fs::File::create(dir.join("siu.log")).expect("log file");
        let daemon = Command::new(env!("CARGO_BIN_EXE_isotach"))
            .arg("siu")
            .arg("--config")
            .arg(&cfg)
            .args(["--host", "h0"])
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start isotach siu");
        let peer = [NodeAddr::Ip(siu)];
        let mut bouncer = TokenBouncer::new(0);
        bouncer.pause_after(1);
        let mut rig = Self {
            tm: PacketPort::new(tm_t, &peer, DEFAULT_TAG).expect("tm port"),
            app: PacketPort::new(app_t, &peer, DEFAULT_TAG).expect("app port"),
            bouncer,
            host: ByteGenerator::new(HOST),
            receiver: Receiver::new(),
            trace: Vec::new(),
            daemon,
            dir,
            _placeholders: placeholders,
        };
        rig.settle();
        assert_eq!(
            rig.bouncer.generation(),
            Generation::new(1),
            "the SIU's reset started generation 1"
        );
        rig
    }

    /// Moves packets across both links once.
    fn pump(&mut self) {
        self.tm.poll().expect("tm poll");
        // Bouncer output goes out (and into the trace) right after the packet that caused it,
        // so the trace keeps a causal order of the link.
        self.flush_bouncer();
        while let Some((_, b)) = self.tm.recv() {
            self.bouncer.handle(&b);
            self.trace.push(Wire::ToTm(b));
            self.flush_bouncer();
        }
        self.tm.poll().expect("tm poll");
        self.app.poll().expect("app poll");
        while let Some((_, b)) = self.app.recv() {
            self.receiver.push(&b);
        }
        if let Ok(Some(status)) = self.daemon.try_wait() {
            panic!("the SIU daemon exited: {status}");
        }
    }

    fn flush_bouncer(&mut self) {
        while let Some(b) = self.bouncer.poll() {
            self.tm.send(0, &b).expect("tm send");
            self.trace.push(Wire::FromTm(b));
        }
    }

    /// Pumps until `cond` holds; panics after [`GUARD`] (a liveness guard, not a timing check).
    fn until(&mut self, what: &str, cond: impl Fn(&Self) -> bool) {
        let deadline = Instant::now() + GUARD;
        loop {
            self.pump();
            if cond(self) {
                return;
            }
            assert!(Instant::now() < deadline, "liveness guard: {what}");
            self.tm.wait(Duration::from_millis(1)).expect("wait");
        }
    }

    /// Waits until the SIU answered every wave sent (its token k + 1 answers wave k).
    fn settle(&mut self) {
        self.until("the SIU answers every wave", |r| {
            r.bouncer.waves_sent() >= 1 && r.bouncer.accepted() == r.bouncer.waves_sent() + 1
        });
    }

    /// Lets `n` more waves go and waits until the SIU answered them.
    fn run_pulses(&mut self, n: u64) {
        self.bouncer.release(n);
        self.settle();
    }

    /// The SIU's current pulse (its recvclock): waves delivered.
    fn pulse(&self) -> u64 {
        self.bouncer.waves_sent()
    }

    /// Sends host packets to the SIU.
    fn host_send(&mut self, packets: &[Vec<u8>]) {
        for p in packets {
            self.app.send(0, p).expect("app send");
        }
        self.pump();
    }

    /// Sends an isochron (`dests` get one write each, values unique) and waits for its marker.
    fn isochron(&mut self, soi: StartOfIsochron, dests: &[HostId]) -> (Vec<Vec<u8>>, u64) {
        let before = self.to_tm_messages().len();
        let writes: Vec<(HostId, u64)> = dests
            .iter()
            .enumerate()
            .map(|(i, &d)| (d, (u64::from(soi.iso_id) << 32) | i as u64))
            .collect();
        let packets = self.host.isochron(soi, &writes);
        self.host_send(&packets);
        let id = soi.iso_id;
        self.until("the isochron's marker and messages", |r| {
            r.receiver.markers().iter().any(|m| m.iso_id == id)
                && r.to_tm_messages().len() >= before + dests.len()
        });
        let ts = self
            .receiver
            .markers()
            .iter()
            .find(|m| m.iso_id == id)
            .unwrap()
            .ts;
        (self.to_tm_messages()[before..].to_vec(), ts.get())
    }

    /// Raw bytes of the isotach messages the SIU sent its token manager, in order.
    fn to_tm_messages(&self) -> Vec<Vec<u8>> {
        self.trace
            .iter()
            .filter_map(|w| match w {
                Wire::ToTm(b) if b.get(1) == Some(&(Kind::IsotachMessage as u8)) => Some(b.clone()),
                _ => None,
            })
            .collect()
    }

    /// Normal (in-sequence) tokens the SIU sent, in order.
    fn siu_tokens(&self) -> Vec<Token> {
        self.bouncer.accepted_tokens().copied().collect()
    }
}

fn soi(iso_id: u32, distance: u16, send_delta: u32) -> StartOfIsochron {
    StartOfIsochron {
        iso_id,
        logged: true,
        distance,
        send_delta,
        ..StartOfIsochron::default()
    }
}

/// A message for [`HOST`] as a token manager would forward it.
fn net_message(ts: u64, source: u16, sequum: u64, payload: usize) -> IsotachMessage {
    let sref = if payload == 0 {
        Sref::Mem {
            op: SrefOp::Write,
            width: Width::W64,
            addr: sequum,
            value: ts,
            ref_id: 0,
        }
    } else {
        Sref::Msg {
            handler: 1,
            payload: (0..payload).map(|i| (i as u64 ^ sequum) as u8).collect(),
        }
    };
    IsotachMessage {
        ts: Pulse::new(ts),
        source,
        dest: HOST,
        sequum,
        // `TokenBouncer::send_message` stamps its generation.
        generation: Generation::new(0),
        sref,
    }
}

/// A run with traffic in both directions: every pulse the token manager forwards 0..=`max`
/// messages of the current pulse (random sources, unique random sequums), and, if `isochrons`,
/// the host sends a one-message isochron. Ends when every packet arrived and every pulse with
/// packets got its EOP marker. Returns the rig and the count of network messages per TS.
fn traffic_run(name: &str, seed: u64, pulses: u64, max: u64, isochrons: bool) -> WireRig {
    let mut rng = XorShift::new(seed);
    let mut rig = WireRig::start(name);
    let mut sequums = HashSet::new();
    let mut sent = 0usize;
    let mut markers = 0usize;
    for i in 0..pulses {
        let ts = rig.pulse();
        for _ in 0..rng.range(0, max) {
            let mut sequum = rng.below(1 << 20);
            while !sequums.insert(sequum) {
                sequum = rng.below(1 << 20);
            }
            let source = [1, 2, 3][rng.below(3) as usize];
            let m = net_message(ts, source, sequum, rng.below(40) as usize);
            rig.bouncer.send_message(&m);
            sent += 1;
        }
        if isochrons && rng.chance(1, 2) {
            let packets = rig.host.isochron(soi(i as u32, 1, 0), &[(NEAR, i)]);
            rig.host_send(&packets);
            markers += 1;
        }
        rig.run_pulses(1);
    }
    rig.run_pulses(3);
    rig.until("every packet reached the host", |r| {
        r.receiver.messages().len() == sent && r.receiver.markers().len() == markers
    });
    let ended = rig.pulse();
    rig.until("every pulse with packets got its EOP", |r| {
        r.receiver
            .isotach_packets()
            .iter()
            .filter(|p| p.1 < ended)
            .all(|p| r.receiver.eop_for(p.1).is_some())
    });
    rig
}

// ---------------------------------------------------------------------------------------------

/// Req 1: the first token the SIU sends and the first it receives carry `start` = 1 (the
/// initiating SIU sends its reset first).
#[test]
fn wire_req_01_start_sequence_is_one() {
    let rig = WireRig::start("r01");
    let heard = rig.bouncer.heard_tokens();
    assert!(
        heard[0].0.restart && heard[0].0.generation == Generation::new(1),
        "{heard:?}"
    );
    let first = heard
        .iter()
        .find(|(t, _)| !t.restart)
        .expect("a normal token");
    assert_eq!(
        first.0.seq,
        WaveSeq::from_bits(1),
        "the SIU's first token carries start = 1"
    );
    assert!(!first.0.repeat && !first.0.reset);
    assert_eq!(first.1, Some(Arrival::InSequence));
    let wave1 = rig.bouncer.wave_token(1).expect("wave 1");
    assert_eq!(
        wave1.token.seq,
        WaveSeq::from_bits(1),
        "the first token received carries start = 1"
    );
    assert_eq!(
        rig.siu_tokens()
            .iter()
            .map(|t| t.seq.bits())
            .collect::<Vec<_>>(),
        vec![1, 2],
        "receiving start lets the SIU send start + 1"
    );
}

/// Req 2: after receiving normal token `r` the SIU sends `(r + 1) mod 4`, after it on the link.
#[test]
fn wire_req_02_reply_is_receiveseq_plus_one() {
    let mut rig = WireRig::start("r02");
    rig.run_pulses(21);
    let mut waves_seen = 0u64;
    let mut replies = 0u64;
    for w in &rig.trace {
        let (Wire::FromTm(b) | Wire::ToTm(b)) = w;
        let Ok(Packet::Token(t)) = Packet::decode(b) else {
            continue;
        };
        if t.restart || t.repeat {
            continue;
        }
        match w {
            Wire::FromTm(_) => {
                waves_seen += 1;
                assert_eq!(t.seq, WaveSeq::of_wave(waves_seen));
            }
            Wire::ToTm(_) => {
                replies += 1;
                if replies > 1 {
                    // SIU token r answers wave r - 1, so it follows it on the link.
                    assert!(
                        waves_seen >= replies - 1,
                        "SIU token {replies} before wave {}",
                        replies - 1
                    );
                    let answered = WaveSeq::of_wave(replies - 1);
                    assert_eq!(t.seq.after(answered), 1, "reply to {answered}");
                }
            }
        }
    }
    assert_eq!((waves_seen, replies), (22, 23));
    let seqs: Vec<u8> = rig.siu_tokens().iter().map(|t| t.seq.bits()).collect();
    assert_eq!(&seqs[..6], &[1, 2, 3, 0, 1, 2], "wraps mod 4");
}

/// Req 4: the sendclock counts non-duplicate tokens: timer repeats during a pause leave it
/// unchanged (TS probe), one more wave raises it by one.
#[test]
fn wire_req_04_sendclock_counts_normal_tokens() {
    let mut rig = WireRig::start("r04");
    rig.run_pulses(9);
    let heard = rig.bouncer.heard_tokens().len();
    rig.until("the SIU's timer resent tokens twice", |r| {
        r.bouncer.heard_tokens()[heard..]
            .iter()
            .filter(|t| t.0.repeat)
            .count()
            >= 4
    });
    let s = rig.bouncer.accepted();
    assert_eq!(s, 11);
    let (_, ts1) = rig.isochron(soi(1, 1, 0), &[NEAR]);
    assert_eq!(
        ts1,
        s + 1,
        "TS = sendclock + distance: repeats did not count"
    );
    rig.run_pulses(1);
    let (_, ts2) = rig.isochron(soi(2, 1, 0), &[NEAR]);
    assert_eq!(ts2, ts1 + 1, "one more token, one more tick");
}

/// Req 7: a token with a bad CRC from the network is dropped; the good one works after it.
#[test]
fn wire_req_07_bad_crc_tokens_dropped() {
    let mut rig = WireRig::start("r07");
    let good = Token {
        seq: WaveSeq::of_wave(2),
        source_port: rig.bouncer.port(),
        generation: rig.bouncer.generation(),
        ..Token::default()
    };
    let bad = ByteGenerator::corrupt_crc(&good.to_bytes());
    rig.tm.send(0, &bad).unwrap();
    rig.trace.push(Wire::FromTm(bad));
    // A fence behind it on the FIFO link: a message of the current pulse.
    rig.bouncer.send_message(&net_message(1, 1, 7, 0));
    rig.until("the fence message", |r| r.receiver.messages().len() == 1);
    // A fence on the way back: an isochron sent after the SIU handled the bad token.
    let (msgs, _) = rig.isochron(soi(1, 1, 0), &[NEAR]);
    assert_eq!(msgs.len(), 1);
    assert_eq!(
        rig.bouncer.accepted(),
        2,
        "the corrupt token was not answered"
    );
    assert!(
        rig.receiver.eops().is_empty(),
        "the corrupt token ended no pulse"
    );
    rig.run_pulses(1);
    rig.until("EOP 1", |r| r.receiver.eop_for(1).is_some());
    assert_eq!(rig.receiver.eop_for(1).unwrap().count, 1);
}

/// Req 9: when the token timer expires the SIU resends its last two tokens, oldest first,
/// marked repeat, other fields kept.
#[test]
fn wire_req_09_token_timer_resends_last_two() {
    let mut rig = WireRig::start("r09");
    rig.run_pulses(4);
    let originals = rig.siu_tokens();
    assert_eq!(originals.len(), 6);
    let heard = rig.bouncer.heard_tokens().len();
    rig.until("two repeats", |r| {
        r.bouncer.heard_tokens().len() >= heard + 2
    });
    let repeats: Vec<Token> = rig.bouncer.heard_tokens()[heard..heard + 2]
        .iter()
        .map(|t| t.0)
        .collect();
    let expected: Vec<Token> = originals[4..]
        .iter()
        .map(|t| Token { repeat: true, ..*t })
        .collect();
    assert_eq!(
        repeats, expected,
        "the last two tokens, oldest first, marked repeat"
    );
    assert_eq!(rig.bouncer.accepted(), 6, "repeats are duplicates");
    assert!(rig.bouncer.duplicates() >= 2);
}

/// Req 10: an EOP marker for pulse i iff pulse i is significant (traffic, or a reset signal).
#[test]
fn wire_req_10_eop_iff_significant() {
    let mut rng = XorShift::new(10);
    let mut rig = WireRig::start("r10");
    let mut significant = HashSet::new();
    let mut sent = 0;
    const RESET_PULSE: u64 = 7;
    rig.bouncer.set_bits(
        RESET_PULSE + 1,
        TokenBits {
            reset: true,
            ..TokenBits::default()
        },
    );
    significant.insert(RESET_PULSE);
    for _ in 0..20 {
        let ts = rig.pulse();
        if ts != RESET_PULSE && (rng.chance(1, 2) || ts == 20) {
            for k in 0..rng.range(1, 3) {
                rig.bouncer
                    .send_message(&net_message(ts, 1, ts * 10 + k, 0));
                sent += 1;
            }
            significant.insert(ts);
        }
        rig.run_pulses(1);
    }
    let last = rig.pulse() - 1;
    assert!(significant.contains(&last));
    rig.until("every message and the last EOP", |r| {
        r.receiver.messages().len() == sent && r.receiver.eop_for(last).is_some()
    });
    let got: HashSet<u64> = rig.receiver.eops().iter().map(|e| e.ts.get()).collect();
    assert_eq!(got, significant);
    assert!(rig.receiver.eop_for(RESET_PULSE).unwrap().reset);
    assert!(significant.len() < 20, "insignificant pulses occurred");
}

/// Req 13: the EOP for pulse i comes after every isotach message with TS i; it is produced by
/// token i + 1.
#[test]
fn wire_req_13_eop_after_messages_of_its_pulse() {
    let rig = traffic_run("r13", 13, 25, 6, true);
    let mut checked = 0;
    for (pos, ts, ..) in rig.receiver.isotach_packets() {
        let eop = rig.receiver.eop_position(ts).expect("its EOP");
        assert!(
            pos < eop,
            "packet at {pos} with TS {ts} after its EOP at {eop}"
        );
        checked += 1;
    }
    assert!(checked > 30, "{checked}");
}

/// Req 16: each EOP marker copies the kind byte and CRC of token i + 1.
#[test]
fn wire_req_16_eop_copies_token_kind_and_crc() {
    let rig = traffic_run("r16", 16, 15, 3, false);
    let eops = rig.receiver.eops();
    assert!(eops.len() > 5);
    for e in eops {
        let t = rig
            .bouncer
            .wave_token(e.ts.get() + 1)
            .expect("token ts + 1");
        assert_eq!(e.token_kind, Kind::Token as u8);
        assert_eq!(e.token_crc, carried_crc(&t.bytes), "pulse {}", e.ts);
    }
}

/// Req 17: delivering token w + 1 yields exactly the EOP marker for pulse w (TS w).
#[test]
fn wire_req_17_eop_ts_is_pulse() {
    let mut rig = WireRig::start("r17");
    for k in 0..10 {
        let ts = rig.pulse();
        rig.bouncer.send_message(&net_message(ts, 3, k, 0));
        let before = rig.receiver.eops().len();
        rig.run_pulses(1);
        rig.until("the EOP of this pulse", |r| {
            r.receiver.eops().len() > before
        });
        let eops = rig.receiver.eops();
        assert_eq!(eops.len(), before + 1);
        assert_eq!(eops[before].ts, Pulse::new(ts));
    }
}

/// Req 19: the EOP count is the number of isotach messages plus isochron markers with TS i,
/// also above the sort-vector size.
#[test]
fn wire_req_19_eop_count_messages_and_markers() {
    let rig = traffic_run("r19", 19, 20, 40, true);
    let (mut over, mut with_marker) = (0, 0);
    for e in rig.receiver.eops() {
        let n = rig.receiver.pulse_packets(e.ts.get()).len();
        assert_eq!(e.count as usize, n, "pulse {}", e.ts);
        over += usize::from(n > SORT_VECTOR_MAX);
    }
    for m in rig.receiver.markers() {
        with_marker += usize::from(rig.receiver.eop_for(m.ts.get()).is_some());
    }
    assert!(over > 0, "counts above the bucket size occurred");
    assert!(with_marker > 0, "markers were counted");
}

/// Req 21: isotach messages leave in arrival order, in each direction.
#[test]
fn wire_req_21_isotach_messages_fifo() {
    let mut rig = WireRig::start("r21");
    let mut rng = XorShift::new(21);
    // Network to host: mixed TS of the open window.
    let ts = rig.pulse();
    let order: Vec<u64> = (0..30).collect();
    for &k in &order {
        let m = net_message(ts + rng.below(3), 1 + rng.below(3) as u16, 1000 - k, 0);
        rig.bouncer.send_message(&m);
    }
    rig.until("30 messages", |r| r.receiver.messages().len() == 30);
    let got: Vec<u64> = rig
        .receiver
        .messages()
        .iter()
        .map(|m| 1000 - m.sequum)
        .collect();
    assert_eq!(got, order);
    // Host to network: several isochrons, tokens released in between.
    let mut sent = Vec::new();
    for iso in 0..6u32 {
        let dests: Vec<HostId> = (0..rng.range(1, 5))
            .map(|_| [NEAR, FAR, HOST][rng.below(3) as usize])
            .collect();
        let (msgs, _) = rig.isochron(soi(iso, 2, 0), &dests);
        sent.extend(msgs.iter().map(|b| IsotachMessage::decode(b).unwrap()));
        rig.run_pulses(rng.below(2));
    }
    let values: Vec<u64> = sent
        .iter()
        .map(|m| match m.sref {
            Sref::Mem { value, .. } => value,
            _ => unreachable!(),
        })
        .collect();
    let mut sorted = values.clone();
    sorted.sort_unstable();
    assert_eq!(
        values, sorted,
        "messages reached the TM in the order the host sent them"
    );
}

/// Req 24: every message of an isochron gets the same TS (the marker's).
#[test]
fn wire_req_24_one_ts_per_isochron() {
    let mut rig = WireRig::start("r24");
    let mut rng = XorShift::new(24);
    for iso in 0..12u32 {
        let dests: Vec<HostId> = (0..rng.range(1, 6))
            .map(|_| [NEAR, FAR, HOST][rng.below(3) as usize])
            .collect();
        let (msgs, ts) = rig.isochron(soi(iso, 2, rng.below(3) as u32), &dests);
        assert_eq!(msgs.len(), dests.len());
        for b in msgs {
            assert_eq!(
                IsotachMessage::decode(&b).unwrap().ts,
                Pulse::new(ts),
                "isochron {iso}"
            );
        }
        rig.run_pulses(rng.below(3));
    }
}

/// Req 30: isochron markers return in isochron order, even when TS decrease.
#[test]
fn wire_req_30_markers_fifo() {
    let mut rig = WireRig::start("r30");
    let mut order = Vec::new();
    for iso in 0..8u32 {
        let delta = if iso % 2 == 0 { 4 } else { 0 };
        let packets = rig
            .host
            .isochron(soi(iso, 1, delta), &[(NEAR, u64::from(iso))]);
        rig.host_send(&packets);
        order.push(iso);
    }
    rig.until("8 markers", |r| r.receiver.markers().len() == 8);
    let markers = rig.receiver.markers();
    let ids: Vec<u32> = markers.iter().map(|m| m.iso_id).collect();
    assert_eq!(ids, order);
    assert!(
        markers.windows(2).any(|w| w[1].ts < w[0].ts),
        "a TS decrease occurred"
    );
}

/// Req 32: the marker's CRC field is the XOR of the CRCs of its messages as the TM got them.
#[test]
fn wire_req_32_marker_crc_is_xor_of_message_crcs() {
    let mut rig = WireRig::start("r32");
    let mut rng = XorShift::new(32);
    for iso in 0..10u32 {
        let n = rng.below(5);
        let mut packets = vec![rig.host.soi(iso, 2)];
        for _ in 0..n {
            let len = rng.below(200) as usize;
            let payload = (0..len).map(|_| rng.next_u64() as u8).collect();
            let dest = [NEAR, FAR][rng.below(2) as usize];
            packets.push(rig.host.message(
                dest,
                Sref::Msg {
                    handler: 2,
                    payload,
                },
            ));
        }
        packets.push(rig.host.eoi(iso));
        let before = rig.to_tm_messages().len();
        rig.host_send(&packets);
        rig.until("the marker and messages", |r| {
            r.receiver.markers().iter().any(|m| m.iso_id == iso)
                && r.to_tm_messages().len() == before + n as usize
        });
        let xor = rig.to_tm_messages()[before..]
            .iter()
            .fold(0u32, |x, b| x ^ carried_crc(b));
        let marker = *rig
            .receiver
            .markers()
            .into_iter()
            .find(|m| m.iso_id == iso)
            .unwrap();
        assert_eq!(marker.crc_xor, xor, "isochron {iso} ({n} messages)");
        rig.run_pulses(rng.below(2));
    }
}

/// Req 33: every EOP marker of a pulse with packets carries a sort vector.
#[test]
fn wire_req_33_eop_carries_sort_vector() {
    let rig = traffic_run("r33", 33, 15, 8, true);
    let eops = rig.receiver.eops();
    assert!(!eops.is_empty());
    for e in eops {
        assert!(!e.repeat);
        assert_eq!(e.sort_vector.len(), (e.count as usize).min(SORT_VECTOR_MAX));
        assert_eq!(
            e.sort_vector.is_empty(),
            e.count == 0,
            "pulse {} has packets, so a vector",
            e.ts
        );
    }
}

/// Req 34: the sort vector has one entry per isotach packet with TS t, up to 32: a
/// permutation of `0..min(count, 32)`.
#[test]
fn wire_req_34_sort_vector_one_entry_per_packet() {
    let rig = traffic_run("r34", 34, 15, 45, true);
    let mut full = 0;
    for e in rig.receiver.eops() {
        let n = rig
            .receiver
            .pulse_packets(e.ts.get())
            .len()
            .min(SORT_VECTOR_MAX);
        assert_eq!(e.sort_vector.len(), n, "pulse {}", e.ts);
        let mut seen = e.sort_vector.clone();
        seen.sort_unstable();
        assert!(
            seen.iter().copied().eq(0..n as u8),
            "a permutation of 0..{n}"
        );
        full += usize::from(n == SORT_VECTOR_MAX);
    }
    assert!(full > 0, "full vectors occurred");
}

/// Req 35: the sort vector lists the first 32 packets of the pulse in (source, sequum) order.
#[test]
fn wire_req_35_sort_vector_source_then_sequum() {
    let rig = traffic_run("r35", 35, 20, 40, true);
    let mut reordered = 0;
    for e in rig.receiver.eops() {
        let packets = rig.receiver.pulse_packets(e.ts.get());
        let first = &packets[..packets.len().min(SORT_VECTOR_MAX)];
        let order: Vec<(u16, u64)> = e
            .sort_vector
            .iter()
            .map(|&i| first[usize::from(i)])
            .collect();
        let mut expect = first.to_vec();
        expect.sort_unstable();
        assert_eq!(order, expect, "pulse {}", e.ts);
        reordered += usize::from(first.windows(2).any(|w| w[0] > w[1]));
    }
    assert!(
        reordered > 3,
        "arrival order differed from sorted order: {reordered}"
    );
}
