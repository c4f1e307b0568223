//! Checks shared by the fuzz targets in `fuzz_targets/`.
//!
//! * [`check_decoder`] / [`check_packet`]: a decoder never panics, its errors agree with the
//!   input, and whatever it accepts re-encodes to exactly the input bytes. Each input is tried
//!   twice: as given (so the CRC check itself is fuzzed) and with its last four bytes replaced
//!   by the correct CRC (so the fuzzer reaches the field checks behind the CRC).
//! * [`check_cluster_config`]: `ClusterConfig::parse` never panics; an accepted config,
//!   rendered back to canonical TOML, parses to the same value.
//! * [`run_siu`] / [`run_tm`]: the sans-IO state machines fed an arbitrary interleaving of
//!   raw bytes, well-formed packets built from fuzz bytes, timer ticks and output drains; they
//!   never panic and every packet they emit decodes.
//!
//! * [`check_am_datagram`]: the AM datagram decoder (one frame or several back to back).
//!
//! A failing input is replayed with `cargo fuzz run <target> <file>`; inputs that found bugs
//! are kept in `fuzz/regressions/`.

use isotach_proto::config::{
    CHANNELS_MIN, ClusterConfig, EPOCH_PULSES_MIN, ISOCHRON_MESSAGES_MAX_MIN,
    ISOCHRON_OPEN_US_MAX_MIN, Limits, PULSES_AHEAD_MAX_MIN, QUEUE_PACKETS_MAX_MIN,
    TOKEN_TIMEOUT_US_MIN, Timing, TransportKind, check_bounds,
};
use isotach_proto::packet::{
    self, BarrierSignalMarker, DecodeError, EndOfIsochron, EopMarker, IsochronMarker,
    IsotachMessage, Kind, Packet, PlainMessage, RmwOp, RmwSref, Sref, SrefOp, StartOfIsochron,
    Token, Width,
};
use isotach_proto::topology::{Hop, SwitchId, Topology};
use isotach_proto::{Generation, Pulse, WaveSeq};
use isotach_siu::{Mode, Route, Side, Siu, SiuConfig};
use isotach_tm::{TmConfig, TokenManager};
use std::sync::Arc;

mod am_datagram;
pub use am_datagram::{check_am_datagram, with_frame_crcs};

// ---------------------------------------------------------------------------------------------
// Decoders

/// A packet type with a kind-specific decoder.
pub trait Wire: Sized + std::fmt::Debug + PartialEq {
    /// The kind byte this decoder accepts.
    const KIND: Kind;
    /// The kind-specific decoder.
    fn decode(bytes: &[u8]) -> Result<Self, DecodeError>;
    /// Appends the encoding; returns its CRC.
    fn encode(&self, out: &mut Vec<u8>) -> u32;
    /// Wraps the value as a [`Packet`].
    fn into_packet(self) -> Packet;
    /// Extra properties of a value that decoded from `bytes`.
    fn extra_checks(&self, _bytes: &[u8]) {}
}

/// No properties beyond the shared ones.
fn no_extra_checks<T>(_: &T, _: &[u8]) {}

macro_rules! wire {
    ($ty:ident, $kind:ident) => {
        wire!($ty, $kind, no_extra_checks);
    };
    ($ty:ident, $kind:ident, $extra:path) => {
        impl Wire for $ty {
            const KIND: Kind = Kind::$kind;
            fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
                $ty::decode(bytes)
            }
            fn encode(&self, out: &mut Vec<u8>) -> u32 {
                $ty::encode(self, out)
            }
            fn into_packet(self) -> Packet {
                Packet::$kind(self)
            }
            fn extra_checks(&self, bytes: &[u8]) {
                $extra(self, bytes)
            }
        }
    };
}

wire!(Token, Token, token_checks);
wire!(StartOfIsochron, StartOfIsochron);
wire!(IsotachMessage, IsotachMessage, message_checks);
wire!(EndOfIsochron, EndOfIsochron);
wire!(IsochronMarker, IsochronMarker);
wire!(EopMarker, EopMarker, eop_checks);
wire!(BarrierSignalMarker, BarrierSignalMarker);
wire!(PlainMessage, Plain, plain_checks);

fn token_checks(t: &Token, bytes: &[u8]) {
    assert!(
        t.seq.bits() <= 3 && t.barrier <= packet::BARRIER_MASK,
        "{t:?}"
    );
    assert_eq!(
        t.to_bytes().as_slice(),
        bytes,
        "to_bytes differs from encode"
    );
}

fn eop_checks(e: &EopMarker, _bytes: &[u8]) {
    let n = e.sort_vector.len();
    assert!(
        n <= packet::SORT_VECTOR_MAX && n as u64 <= u64::from(e.count),
        "{e:?}"
    );
    let mut sorted = e.sort_vector.clone();
    sorted.sort_unstable();
    assert!(
        sorted.iter().copied().eq(0..n as u8),
        "not a permutation: {e:?}"
    );
}

fn plain_checks(m: &PlainMessage, bytes: &[u8]) {
    assert!(m.payload.len() <= packet::PLAIN_PAYLOAD_MAX);
    assert!(bytes.len() <= packet::PACKET_LEN_MAX);
}

/// The SIU's hot path: stamping a valid message in place keeps it valid, changes exactly the
/// stamped fields, and the peek helpers read what was stamped.
fn message_checks(m: &IsotachMessage, bytes: &[u8]) {
    assert_eq!(m.encoded_len(), bytes.len());
    assert_eq!(IsotachMessage::peek_dest(bytes), Some(m.dest));
    assert_eq!(
        IsotachMessage::peek_stamp(bytes),
        Some((m.ts, m.source, m.sequum))
    );
    assert_eq!(IsotachMessage::peek_generation(bytes), Some(m.generation));
    if let Sref::Mem { width, value, .. } = &m.sref {
        assert!(*value <= width.max_value());
    }
    // Stamp values derived from the input so they vary with it.
    let h = u64::from(packet::crc32(bytes));
    let (ts, source, sequum) = (
        Pulse::new(h.rotate_left(17) ^ m.sequum),
        (h >> 7) as u16,
        !m.ts.get() ^ h,
    );
    let generation = Generation::new((h >> 3) as u32 ^ m.generation.get());
    let mut stamped = bytes.to_vec();
    let stamp = packet::Stamp {
        ts,
        source,
        sequum,
        generation,
    };
    let crc = IsotachMessage::stamp_in_place(&mut stamped, stamp);
    assert_eq!(crc, packet::carried_crc(&stamped));
    let back = IsotachMessage::decode(&stamped).expect("a stamped valid message must decode");
    assert_eq!(
        back,
        IsotachMessage {
            ts,
            source,
            sequum,
            generation,
            ..m.clone()
        }
    );
    let mut re = Vec::new();
    back.encode(&mut re);
    assert_eq!(re, stamped, "stamp_in_place differs from re-encoding");
}

/// The bytes with the last four replaced by the CRC-32 of the rest (`None` if too short).
pub fn with_fixed_crc(data: &[u8]) -> Option<Vec<u8>> {
    let at = data.len().checked_sub(packet::CRC_LEN)?;
    let mut v = data.to_vec();
    let crc = packet::crc32(&v[..at]);
    v[at..].copy_from_slice(&crc.to_be_bytes());
    Some(v)
}

/// Properties every decoder error must have with respect to its input.
fn check_error(bytes: &[u8], e: &DecodeError) {
    let len = bytes.len();
    match *e {
        DecodeError::Short { need, got } => {
            assert_eq!(got, len, "{e}");
            assert!(need > got, "{e}");
        }
        DecodeError::Long { max, got } => {
            assert_eq!(got, len, "{e}");
            assert!(max < got, "{e}");
        }
        DecodeError::BadVersion(v) => {
            assert_eq!(v, bytes[0], "{e}");
            assert_ne!(v, packet::VERSION, "{e}");
        }
        DecodeError::UnknownKind(k) => {
            assert_eq!(k, bytes[1], "{e}");
            assert!(Kind::from_byte(k).is_err(), "{e}");
        }
        DecodeError::WrongKind { expected, found } => {
            assert_ne!(expected, found, "{e}");
            assert_eq!(found as u8, bytes[1], "{e}");
        }
        DecodeError::BadCrc { found, computed } => {
            assert_ne!(found, computed, "{e}");
            assert_eq!(found, packet::carried_crc(bytes), "{e}");
            assert_eq!(
                computed,
                packet::crc32(&bytes[..len - packet::CRC_LEN]),
                "{e}"
            );
        }
        DecodeError::OutOfRange { field, .. } => assert!(!field.is_empty()),
    }
}

fn check_decoder_once<T: Wire>(bytes: &[u8]) -> Result<(), DecodeError> {
    let decoded = T::decode(bytes);
    let any = Packet::decode(bytes);
    match decoded {
        Ok(v) => {
            let mut out = Vec::new();
            let crc = v.encode(&mut out);
            assert_eq!(out, bytes, "decode → encode changed the bytes of {v:?}");
            assert_eq!(crc, packet::carried_crc(bytes));
            assert_eq!(bytes[1], T::KIND as u8);
            v.extra_checks(bytes);
            assert_eq!(any, Ok(v.into_packet()), "Packet::decode disagrees");
            Ok(())
        }
        Err(e) => {
            check_error(bytes, &e);
            // On bytes of this decoder's kind, Packet::decode must fail the same way.
            if bytes.len() >= 2 && bytes[1] == T::KIND as u8 {
                assert_eq!(any, Err(e.clone()), "Packet::decode disagrees");
            }
            Err(e)
        }
    }
}

/// Fuzzes one kind-specific decoder (see the module documentation).
pub fn check_decoder<T: Wire>(data: &[u8]) {
    let _ = check_decoder_once::<T>(data);
    if let Some(fixed) = with_fixed_crc(data)
        && let Err(e) = check_decoder_once::<T>(&fixed)
    {
        assert!(
            !matches!(e, DecodeError::BadCrc { .. }),
            "a repaired CRC was refused: {e}"
        );
    }
}

fn check_packet_once(bytes: &[u8]) {
    let any = Packet::decode(bytes);
    match &any {
        Ok(p) => {
            assert_eq!(
                p.to_vec(),
                bytes,
                "decode → encode changed the bytes of {p:?}"
            );
            assert_eq!(p.kind() as u8, bytes[1]);
            assert_eq!(packet::peek_kind(bytes), Ok(p.kind()));
        }
        Err(e) => check_error(bytes, e),
    }
    // The dispatcher and the kind's own decoder agree.
    let own = match packet::peek_kind(bytes) {
        Err(e) => Err(e),
        Ok(Kind::Token) => Token::decode(bytes).map(Packet::Token),
        Ok(Kind::StartOfIsochron) => StartOfIsochron::decode(bytes).map(Packet::StartOfIsochron),
        Ok(Kind::IsotachMessage) => IsotachMessage::decode(bytes).map(Packet::IsotachMessage),
        Ok(Kind::EndOfIsochron) => EndOfIsochron::decode(bytes).map(Packet::EndOfIsochron),
        Ok(Kind::IsochronMarker) => IsochronMarker::decode(bytes).map(Packet::IsochronMarker),
        Ok(Kind::EopMarker) => EopMarker::decode(bytes).map(Packet::EopMarker),
        Ok(Kind::BarrierSignalMarker) => {
            BarrierSignalMarker::decode(bytes).map(Packet::BarrierSignalMarker)
        }
        Ok(Kind::Plain) => PlainMessage::decode(bytes).map(Packet::Plain),
    };
    assert_eq!(any, own);
}

/// Fuzzes `Packet::decode` (see the module documentation).
pub fn check_packet(data: &[u8]) {
    check_packet_once(data);
    if let Some(fixed) = with_fixed_crc(data) {
        check_packet_once(&fixed);
    }
}

// ---------------------------------------------------------------------------------------------
// SMM replies (non-isotach payloads)

/// Fuzzes `HostReply::decode` and `ImageEntry::decode_all`: never panics; whatever decodes
/// re-encodes to exactly the input bytes; an image chunk's entries re-encode to its body.
pub fn check_host_reply(data: &[u8]) {
    use isotach_proto::reply::{HostReply, ImageEntry};
    if let Ok(r) = HostReply::decode(data) {
        let mut out = Vec::new();
        r.encode(&mut out);
        assert_eq!(out, data, "decode → encode changed the bytes of {r:?}");
        if let HostReply::PageImage { entries, .. } = r
            && let Ok(list) = ImageEntry::decode_all(entries)
        {
            let mut body = Vec::new();
            for e in &list {
                assert!(e.pending.is_none_or(|p| usize::from(p) < e.scheds.len()));
                e.encode(&mut body);
            }
            assert_eq!(body, entries, "image entries changed on re-encoding");
        }
    }
    if let Ok(list) = ImageEntry::decode_all(data) {
        let len: usize = list.iter().map(ImageEntry::encoded_len).sum();
        assert_eq!(len, data.len());
    }
}

// ---------------------------------------------------------------------------------------------
// Cluster configuration

/// A TOML string literal (escaped by the `toml` crate itself).
fn toml_str(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

/// Canonical TOML for an accepted configuration.
pub fn render_config(c: &ClusterConfig) -> String {
    use std::fmt::Write;
    let mut t = String::new();
    if let Some(map) = &c.map_file {
        let _ = writeln!(t, "map = {}\n", toml_str(&map.display().to_string()));
    }
    let kind = match c.transport.kind {
        TransportKind::Udp => "udp",
        TransportKind::Quic => "quic",
    };
    let _ = writeln!(t, "[transport]\nkind = {}", toml_str(kind));
    let _ = writeln!(t, "tag = {}", toml_str(&format!("{:#x}", c.transport.tag)));
    for (key, path) in [("ca", &c.transport.ca), ("certs", &c.transport.certs)] {
        if let Some(p) = path {
            let _ = writeln!(t, "{key} = {}", toml_str(&p.display().to_string()));
        }
    }
    t.push('\n');
    let _ = writeln!(
        t,
        "[timing]\ntoken-timeout-us = {}\nepoch-pulses = {}\nidle-pace-us = {}\n",
        c.timing.token_timeout_us, c.timing.epoch_pulses, c.timing.idle_pace_us
    );
    let l = &c.limits;
    let _ = writeln!(
        t,
        "[limits]\nchannels = {}\nisochron-messages-max = {}\npulses-ahead-max = {}\n\
         queue-packets-max = {}\nisochron-open-us-max = {}\n",
        l.channels,
        l.isochron_messages_max,
        l.pulses_ahead_max,
        l.queue_packets_max,
        l.isochron_open_us_max
    );
    for (i, s) in c.switch_names.iter().enumerate() {
        let _ = writeln!(t, "[[switch]]\nname = {}", toml_str(s));
        if let Some(a) = c.switch_listen.get(i).copied().flatten() {
            let _ = writeln!(t, "listen = {}", toml_str(&a.to_string()));
        }
        if let Some(a) = c.switch_admin.get(i).copied().flatten() {
            let _ = writeln!(t, "admin = {}", toml_str(&a.to_string()));
        }
    }
    for (h, name) in c.host_names.iter().enumerate() {
        let sw = &c.switch_names[usize::from(c.topology.switch_of(h as u16))];
        let _ = writeln!(
            t,
            "[[host]]\nname = {}\nswitch = {}",
            toml_str(name),
            toml_str(sw)
        );
        if let Some(a) = c.host_siu.get(h).copied().flatten() {
            let _ = writeln!(t, "siu = {}", toml_str(&a.to_string()));
        }
        if let Some(a) = c.host_app.get(h).copied().flatten() {
            let _ = writeln!(t, "app = {}", toml_str(&a.to_string()));
        }
        if let Some(a) = c.host_admin.get(h).copied().flatten() {
            let _ = writeln!(t, "admin = {}", toml_str(&a.to_string()));
        }
    }
    for &(a, b) in c.topology.trunks() {
        let (a, b) = (
            &c.switch_names[usize::from(a)],
            &c.switch_names[usize::from(b)],
        );
        let _ = writeln!(t, "[[trunk]]\nbetween = [{}, {}]", toml_str(a), toml_str(b));
    }
    t
}

/// Fuzzes `ClusterConfig::parse` (see the module documentation).
pub fn check_cluster_config(text: &str) {
    match ClusterConfig::parse(text, "fuzz.toml") {
        Ok(c) => {
            assert_eq!(c.switch_names.len(), c.topology.switch_count());
            assert_eq!(c.host_names.len(), c.topology.host_count());
            assert!(c.timing.token_timeout_us >= 1 && c.timing.epoch_pulses >= 2);
            assert!(c.limits.channels >= 1);
            // What the loader accepts, the in-memory check accepts too.
            if let Err((key, why)) = check_bounds(&c.timing, &c.limits, &c.topology) {
                panic!("accepted a config check_bounds refuses: {key} = {why}");
            }
            // Routes and distances exist between every pair of hosts.
            let hosts = c.topology.host_count().min(64) as u16;
            for a in 0..hosts {
                for b in 0..hosts {
                    assert!(c.topology.distance(a, b) >= 1);
                    let _ = c.topology.next_hop(c.topology.switch_of(a), b);
                }
            }
            let _ = c.topology.max_distance();
            let canonical = render_config(&c);
            match ClusterConfig::parse(&canonical, "canonical.toml") {
                Ok(again) => {
                    assert_eq!(again, c, "canonical form parses differently:\n{canonical}")
                }
                Err(e) => panic!("canonical form refused: {e}\n{canonical}"),
            }
        }
        Err(e) => {
            assert_eq!(e.file, "fuzz.toml");
            assert!(e.line >= 1 && e.column >= 1, "{e}");
            assert!(!e.key.is_empty(), "{e}");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// State machines

/// A cursor over the fuzz input.
#[derive(Debug)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// A cursor at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }
    /// Next `n` bytes, or what is left.
    pub fn take(&mut self, n: usize) -> &'a [u8] {
        let n = n.min(self.data.len());
        let (a, b) = self.data.split_at(n);
        self.data = b;
        a
    }
    /// Next byte, or `None` at the end.
    pub fn byte(&mut self) -> Option<u8> {
        self.take(1).first().copied()
    }
    /// Next byte, 0 past the end.
    pub fn u8(&mut self) -> u8 {
        self.byte().unwrap_or(0)
    }
    /// Next big-endian u16, zero-padded past the end.
    pub fn u16(&mut self) -> u16 {
        u16::from_be_bytes([self.u8(), self.u8()])
    }
    /// Next big-endian u32, zero-padded past the end.
    pub fn u32(&mut self) -> u32 {
        u32::from(self.u16()) << 16 | u32::from(self.u16())
    }
    /// Next big-endian u64, zero-padded past the end.
    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) << 32 | u64::from(self.u32())
    }
    /// A length-prefixed byte string (prefix: u16 modulo `max + 1`).
    pub fn blob(&mut self, max: usize) -> &'a [u8] {
        let n = usize::from(self.u16()) % (max + 1);
        self.take(n)
    }
}

/// Links of the busiest token manager of `topology` (hosts plus neighbour switches).
fn busiest_tm_links(topology: &Topology) -> usize {
    (0..topology.switch_count())
        .map(|s| {
            let s = SwitchId::try_from(s).expect("switch ids fit");
            topology.hosts_at(s).count() + topology.switch_neighbours(s).len()
        })
        .max()
        .unwrap_or(0)
}

/// Limits and timing a config file could give for `topology`, small ones when `small` so
/// queues, windows and isochron limits are actually reached: each at or just above the lowest
/// value `check_bounds` accepts (its [`BOUNDS`](isotach_proto::config::BOUNDS), raised by the
/// topology where it says so). Panics if they do not pass `check_bounds`: the state machines
/// assert the bounds the config loader keeps, so a harness that built values no config can
/// give would only find its own mistakes.
fn limits_timing(flags: u8, topology: &Topology, inp: &mut Input<'_>) -> (Limits, Timing) {
    let reach = u32::from(topology.max_distance());
    let small = flags & 0x02 != 0;
    let limits = if small {
        let queue_min = QUEUE_PACKETS_MAX_MIN.max(2 * busiest_tm_links(topology));
        Limits {
            channels: CHANNELS_MIN + inp.u8() % 4,
            isochron_messages_max: ISOCHRON_MESSAGES_MAX_MIN + u32::from(inp.u8() % 4),
            // More than twice the largest logical distance.
            pulses_ahead_max: PULSES_AHEAD_MAX_MIN.max(2 * reach + 1) + u32::from(inp.u8() % 5),
            queue_packets_max: queue_min + usize::from(inp.u8() % 12),
            isochron_open_us_max: ISOCHRON_OPEN_US_MAX_MIN + u64::from(inp.u16()),
        }
    } else {
        Limits::default()
    };
    let token_timeout_us = TOKEN_TIMEOUT_US_MIN + u64::from(inp.u16());
    let timing = Timing {
        token_timeout_us,
        // More than the largest logical distance.
        epoch_pulses: EPOCH_PULSES_MIN.max(reach + 1) + u32::from(inp.u8() % 8),
        // Off, or at most half the token timeout (`check_bounds`).
        idle_pace_us: u64::from(inp.u16()) % (token_timeout_us / 2 + 1),
    };
    if let Err((key, why)) = check_bounds(&timing, &limits, topology) {
        panic!("the fuzz harness built {key} = {why}: {limits:?} {timing:?}");
    }
    (limits, timing)
}

/// The cluster a state-machine run starts from, read from the head of the fuzz input: flags
/// (bit 0 host mode, bit 1 small limits, bit 2 the SIU initiates the reset), a line topology
/// of 1-8 hosts over 1-4 switches (no more switches than hosts), the node's index byte (reduced by the caller), then limits
/// and timing.
struct FuzzCluster {
    flags: u8,
    hosts: usize,
    switches: usize,
    node: u8,
    topology: Arc<Topology>,
    limits: Limits,
    timing: Timing,
}

impl FuzzCluster {
    fn read(inp: &mut Input<'_>) -> Self {
        let flags = inp.u8();
        let hosts = 1 + usize::from(inp.u8() % 8);
        // Every switch of a line takes a host (`TopologyError::TooFewHosts`).
        let switches = 1 + usize::from(inp.u8()) % hosts.min(4);
        let node = inp.u8();
        let topology = Arc::new(Topology::line(hosts, switches).expect("a line topology is valid"));
        let (limits, timing) = limits_timing(flags, &topology, inp);
        Self {
            flags,
            hosts,
            switches,
            node,
            topology,
            limits,
            timing,
        }
    }

    /// The SIU of the host the node byte picks (flags: mode, whether it initiates the reset,
    /// host turns).
    fn siu_config(self) -> SiuConfig {
        SiuConfig {
            host: (usize::from(self.node) % self.hosts) as u16,
            mode: if self.flags & 0x01 != 0 {
                Mode::Host
            } else {
                Mode::Siu
            },
            topology: self.topology,
            timing: self.timing,
            limits: self.limits,
            initiates_reset: self.flags & 0x04 != 0,
            host_turns: self.flags & 0x08 != 0,
        }
    }

    /// The token manager of the switch the node byte picks.
    fn tm_config(self) -> TmConfig {
        TmConfig {
            switch: (usize::from(self.node) % self.switches) as u16,
            topology: self.topology,
            timing: self.timing,
            limits: self.limits,
        }
    }
}

/// The timers of a state machine, as the op loops drive them.
trait Timers {
    fn poll_timeout(&self) -> Option<u64>;
    fn handle_timeout(&mut self, now_us: u64);
}

impl Timers for Siu {
    fn poll_timeout(&self) -> Option<u64> {
        Siu::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now_us: u64) {
        Siu::handle_timeout(self, now_us)
    }
}

impl Timers for TokenManager {
    fn poll_timeout(&self) -> Option<u64> {
        TokenManager::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now_us: u64) {
        TokenManager::handle_timeout(self, now_us)
    }
}

/// Time passes, by a fuzzed step or (`to_deadline`) up to the machine's next timer; its timers
/// run.
fn pass_time(m: &mut impl Timers, inp: &mut Input<'_>, now: &mut u64, to_deadline: bool) {
    if to_deadline {
        if let Some(t) = m.poll_timeout() {
            *now = (*now).max(t);
        }
    } else {
        *now += u64::from(inp.u16());
    }
    m.handle_timeout(*now);
}

/// A token built from fuzz bytes; `port`/`generation` are the plausible values, which the
/// fuzzer may override.
fn fuzz_token(inp: &mut Input<'_>, port: u16, generation: Generation) -> Token {
    let f = inp.u8();
    let g = inp.u8();
    Token {
        seq: WaveSeq::from_bits(f),
        repeat: f & 0x04 != 0,
        reset: f & 0x08 != 0,
        end_of_epoch: f & 0x10 != 0,
        restart: g & 0x40 != 0,
        busy: g & 0x20 != 0,
        barrier: (f >> 5) & 3,
        signals: if f & 0x80 != 0 { inp.u8() } else { 0 },
        source_port: if g & 0x80 != 0 { inp.u16() } else { port },
        generation: match g & 3 {
            0 => generation,
            1 => generation.next(),
            2 => Generation::new(generation.get().wrapping_sub(1)),
            _ => Generation::new(inp.u32()),
        },
    }
}

fn fuzz_sref(inp: &mut Input<'_>) -> Sref {
    let f = inp.u8();
    if f % 7 >= 5 {
        let width = if f & 0x80 != 0 {
            Width::W64
        } else {
            Width::W32
        };
        let op = match inp.u8() % 3 {
            0 => RmwOp::Add,
            1 => RmwOp::CompareAndSwap,
            _ => RmwOp::Apply(u16::from(inp.u8() % 4)),
        };
        let arg2 = if op == RmwOp::CompareAndSwap {
            inp.u64() & width.max_value()
        } else {
            0
        };
        Sref::Rmw(RmwSref {
            op,
            width,
            addr: u64::from(inp.u16()),
            arg: inp.u64() & width.max_value(),
            arg2,
            ref_id: u32::from(inp.u8()),
            answer: f & 0x40 != 0,
        })
    } else if f % 7 == 4 {
        let n = usize::from(inp.u8() % 48);
        Sref::Msg {
            handler: u16::from(inp.u8()),
            payload: inp.take(n).to_vec(),
        }
    } else {
        let op = [SrefOp::Read, SrefOp::Write, SrefOp::Sched, SrefOp::Assign][usize::from(f % 7)];
        let width = if f & 0x80 != 0 {
            Width::W64
        } else {
            Width::W32
        };
        Sref::Mem {
            op,
            width,
            addr: u64::from(inp.u16()),
            value: inp.u64() & width.max_value(),
            ref_id: u32::from(inp.u8()),
        }
    }
}

fn fuzz_message(inp: &mut Input<'_>, hosts: usize) -> IsotachMessage {
    IsotachMessage {
        ts: Pulse::ZERO,
        source: 0,
        dest: u16::from(inp.u8()) % (hosts as u16 + 1),
        sequum: 0,
        generation: Generation::NONE,
        sref: fuzz_sref(inp),
    }
}

/// Maybe flips one byte of an encoded packet (a corrupted or malformed packet).
fn maybe_corrupt(inp: &mut Input<'_>, flag: bool, bytes: &mut [u8]) {
    if flag && !bytes.is_empty() {
        let at = usize::from(inp.u8()) % bytes.len();
        bytes[at] ^= inp.u8() | 1;
    }
}

fn encode(p: &Packet) -> Vec<u8> {
    p.to_vec()
}

/// `p` encoded, one byte maybe flipped (`corrupt`).
fn encode_maybe_corrupt(inp: &mut Input<'_>, corrupt: bool, p: &Packet) -> Vec<u8> {
    let mut b = encode(p);
    maybe_corrupt(inp, corrupt, &mut b);
    b
}

/// A token built from fuzz fields (see [`fuzz_token`]), encoded, one byte maybe flipped.
fn fuzz_token_bytes(
    inp: &mut Input<'_>,
    corrupt: bool,
    port: u16,
    generation: Generation,
) -> Vec<u8> {
    let t = fuzz_token(inp, port, generation);
    let mut b = t.to_bytes().to_vec();
    maybe_corrupt(inp, corrupt, &mut b);
    b
}

/// A non-isotach message built from fuzz fields, encoded, one byte maybe flipped.
fn fuzz_plain_bytes(inp: &mut Input<'_>, corrupt: bool) -> Vec<u8> {
    let n = usize::from(inp.u8());
    let m = PlainMessage {
        source: u16::from(inp.u8() % 8),
        dest: u16::from(inp.u8() % 9),
        payload: inp.take(n).to_vec(),
    };
    encode_maybe_corrupt(inp, corrupt, &Packet::Plain(m))
}

/// Every packet a state machine emits must decode.
fn must_decode(bytes: &[u8], who: &str) -> Packet {
    match Packet::decode(bytes) {
        Ok(p) => p,
        Err(e) => panic!("{who} emitted an undecodable packet ({e}): {bytes:02x?}"),
    }
}

fn drain_siu(siu: &mut Siu, hosts: usize) {
    while let Some(b) = siu.poll_host() {
        let p = must_decode(&b, "SIU (to host)");
        assert!(
            matches!(
                p.kind(),
                Kind::IsotachMessage | Kind::IsochronMarker | Kind::EopMarker | Kind::Plain
            ),
            "SIU sent a {:?} to its host",
            p.kind()
        );
    }
    while let Some(t) = siu.poll_net() {
        let p = must_decode(&t.bytes, "SIU (to net)");
        match (t.route, p.kind()) {
            (Route::Tm, Kind::Token | Kind::IsotachMessage) => {}
            (Route::Host(h), Kind::Plain) => assert!(usize::from(h) < hosts),
            (route, kind) => panic!("SIU sent a {kind:?} to {route:?}"),
        }
    }
}

/// Drives one SIU with the fuzz input. Layout: a header (mode and limit flags, hosts,
/// switches, host id, limits, timing), then operations of one opcode byte each followed by
/// their operands; missing bytes read as zero.
pub fn run_siu(data: &[u8]) {
    let mut inp = Input::new(data);
    let cluster = FuzzCluster::read(&mut inp);
    let hosts = cluster.hosts;
    let cfg = cluster.siu_config();
    let (host, mode, initiates_reset) = (cfg.host, cfg.mode, cfg.initiates_reset);
    let tm_port = Topology::switch_port(cfg.topology.switch_of(host));
    let port = Topology::host_port(host);
    let mut siu = Siu::new(cfg);
    let mut now: u64 = 0;
    if initiates_reset {
        siu.start(now);
    }
    while let Some(op) = inp.byte() {
        let corrupt = op & 0x80 != 0;
        match op & 0x7f {
            // Raw bytes from either side (the corrupt bit: in a buffer the SIU may take).
            0 => {
                let b = inp.blob(packet::PACKET_LEN_MAX + 8);
                if corrupt {
                    siu_input_owned(&mut siu, now, Side::Host, b.to_vec());
                } else {
                    let _ = siu.handle_host(now, b);
                }
            }
            1 => {
                let b = inp.blob(packet::PACKET_LEN_MAX + 8);
                if corrupt {
                    siu_input_owned(&mut siu, now, Side::Net, b.to_vec());
                } else {
                    let _ = siu.handle_net(now, b);
                }
            }
            // Time passes; timers run.
            2 | 3 => pass_time(&mut siu, &mut inp, &mut now, op & 0x7f == 3),
            // A token from the network built from fuzz fields.
            4 => {
                let b = fuzz_token_bytes(&mut inp, corrupt, tm_port, siu.generation());
                let _ = siu.handle_net(now, &b);
            }
            // The token manager's next token, as a well-behaved TM would send it.
            5 => {
                let f = inp.u8();
                let t = Token {
                    seq: WaveSeq::of_wave(siu.recvclock().wrapping_add(1)),
                    end_of_epoch: f & 0x04 != 0,
                    barrier: f & 3,
                    signals: if f & 0x08 != 0 { inp.u8() } else { 0 },
                    source_port: tm_port,
                    generation: siu.generation(),
                    ..Token::default()
                };
                let _ = siu.handle_net(now, &t.to_bytes());
            }
            // A token from the host (host mode), built from fuzz fields.
            6 => {
                let b = fuzz_token_bytes(&mut inp, corrupt, port, siu.generation());
                let _ = siu.handle_host(now, &b);
            }
            // The host's next token (host mode).
            7 => {
                let f = inp.u8();
                let t = Token {
                    seq: WaveSeq::of_wave(siu.sendclock().wrapping_add(1)),
                    barrier: f & 3,
                    source_port: port,
                    generation: siu.generation(),
                    ..Token::default()
                };
                let _ = siu.handle_host(now, &t.to_bytes());
            }
            // Isochrons from the host.
            8 => {
                let f = inp.u8();
                let soi = StartOfIsochron {
                    iso_id: u32::from(inp.u8() % 4),
                    channel: inp.u8() % 6,
                    seqset: f & 1,
                    logged: f & 2 != 0,
                    host_gap: f & 4 != 0,
                    gap: if f & 8 != 0 {
                        inp.u32()
                    } else {
                        u32::from(inp.u8())
                    },
                    send_delta: if f & 16 != 0 {
                        inp.u32()
                    } else {
                        u32::from(inp.u8() % 8)
                    },
                    distance: if f & 32 != 0 {
                        inp.u16()
                    } else {
                        u16::from(inp.u8() % 6)
                    },
                };
                let b = encode_maybe_corrupt(&mut inp, corrupt, &Packet::StartOfIsochron(soi));
                let _ = siu.handle_host(now, &b);
            }
            9 => {
                let m = fuzz_message(&mut inp, hosts);
                let b = encode_maybe_corrupt(&mut inp, corrupt, &Packet::IsotachMessage(m));
                siu_input_owned(&mut siu, now, Side::Host, b);
            }
            10 => {
                let eoi = EndOfIsochron {
                    iso_id: u32::from(inp.u8() % 4),
                };
                let _ = siu.handle_host(now, &encode(&Packet::EndOfIsochron(eoi)));
            }
            // Barrier/signal markers from the host.
            11 => {
                let f = inp.u8();
                let m = BarrierSignalMarker {
                    barrier: f & 3,
                    barrier_count: u32::from(inp.u8() % 8),
                    signals: if f & 4 != 0 { inp.u8() } else { 0 },
                    reset: f & 8 != 0,
                };
                let _ = siu.handle_host(now, &encode(&Packet::BarrierSignalMarker(m)));
            }
            // An isotach message from the network, near the receive clock.
            12 => {
                let f = inp.u8();
                let mut m = fuzz_message(&mut inp, hosts);
                if f & 1 == 0 {
                    m.dest = host;
                }
                let delta = i64::from(inp.u8() as i8);
                m.ts = Pulse::new(siu.recvclock().saturating_add_signed(delta % 8));
                if f & 2 != 0 {
                    m.ts = Pulse::new(inp.u64());
                }
                m.source = u16::from(inp.u8() % 8);
                m.sequum = u64::from(inp.u8());
                // Mostly of the SIU's generation (else stale and dropped at once).
                m.generation =
                    Generation::new(siu.generation().get().wrapping_sub(u32::from(f & 4 != 0)));
                let b = encode_maybe_corrupt(&mut inp, corrupt, &Packet::IsotachMessage(m));
                siu_input_owned(&mut siu, now, Side::Net, b);
            }
            // Non-isotach traffic, either way.
            13 => {
                let f = inp.u8();
                let b = fuzz_plain_bytes(&mut inp, corrupt);
                if f & 1 == 0 {
                    let _ = siu.handle_host(now, &b);
                } else {
                    let _ = siu.handle_net(now, &b);
                }
            }
            // Other kinds either way (markers the host must never send, etc.).
            14 => {
                let f = inp.u8();
                let p = match f % 3 {
                    0 => Packet::EopMarker(EopMarker {
                        count: u32::from(inp.u8()),
                        ..EopMarker::default()
                    }),
                    1 => Packet::IsochronMarker(IsochronMarker {
                        iso_id: u32::from(inp.u8()),
                        ..IsochronMarker::default()
                    }),
                    _ => Packet::StartOfIsochron(StartOfIsochron {
                        distance: 1,
                        ..StartOfIsochron::default()
                    }),
                };
                let b = encode(&p);
                if f & 0x80 == 0 {
                    let _ = siu.handle_host(now, &b);
                } else {
                    let _ = siu.handle_net(now, &b);
                }
            }
            15 => siu.start(now),
            // The application goes away: what the SIU holds for the host comes back to it;
            // or a new application attaches.
            16 => {
                while let Some(b) = siu.poll_host() {
                    let _ = siu.host_absent(&b);
                }
                let b = inp.blob(packet::PACKET_LEN_MAX + 8);
                let _ = siu.host_absent(b);
            }
            17 => siu.host_attached(),
            // The in-process host's turn ends (host turns).
            18 => siu.end_host_turn(now),
            _ => drain_siu(&mut siu, hosts),
        }
        if mode == Mode::Siu && siu.started() {
            assert!(
                siu.sendclock() <= siu.recvclock() + 1,
                "SIU mode sent token {} before token {} arrived",
                siu.sendclock(),
                siu.sendclock() - 1
            );
        }
    }
    drain_siu(&mut siu, hosts);
}

fn hop_port(h: Hop) -> u16 {
    match h {
        Hop::Host(h) => Topology::host_port(h),
        Hop::Switch(s) => Topology::switch_port(s),
    }
}

/// Drives an input with a buffer the state machine may take, checked: consumed, the buffer is
/// taken whole or left as it was; refused or not consumed, it is left as it was.
fn owned_input<E: std::fmt::Display>(
    bytes: Vec<u8>,
    input: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) {
    let mut buf = bytes.clone();
    match input(&mut buf) {
        Ok(()) => assert!(buf.is_empty() || buf == bytes, "a buffer taken in part"),
        Err(e) => assert_eq!(buf, bytes, "refused ({e}) yet its buffer changed"),
    }
}

/// `Siu::handle_host_owned` / `handle_net_owned` through [`owned_input`].
fn siu_input_owned(siu: &mut Siu, now: u64, side: Side, bytes: Vec<u8>) {
    owned_input(bytes, |buf| match side {
        Side::Host => siu.handle_host_owned(now, buf),
        Side::Net => siu.handle_net_owned(now, buf),
    });
}

fn drain_tm(tm: &mut TokenManager, links: usize, port: u16) {
    while let Some((link, b)) = tm.poll_transmit() {
        assert!(link < links, "TM sent on link {link} of {links}");
        let p = must_decode(&b, "TM");
        match p {
            Packet::Token(t) => assert_eq!(t.source_port, port, "TM token with a foreign port"),
            Packet::IsotachMessage(_) | Packet::Plain(_) => {}
            other => panic!("TM forwarded a {:?}", other.kind()),
        }
    }
}

/// Drives one token manager with the fuzz input (same layout idea as [`run_siu`]).
pub fn run_tm(data: &[u8]) {
    let mut inp = Input::new(data);
    let cluster = FuzzCluster::read(&mut inp);
    let hosts = cluster.hosts;
    let cfg = cluster.tm_config();
    let switch = cfg.switch;
    let mut tm = TokenManager::new(cfg);
    let port = Topology::switch_port(switch);
    let ports: Vec<u16> = tm.links().map(hop_port).collect();
    let links = ports.len();
    let mut now: u64 = 0;
    // A link index, sometimes one past the last (which the TM must refuse).
    let pick = |inp: &mut Input<'_>| usize::from(inp.u8()) % (links + 1);
    let port_of = |l: usize| ports.get(l).copied().unwrap_or(0x7fff);
    while let Some(op) = inp.byte() {
        let corrupt = op & 0x80 != 0;
        match op & 0x7f {
            0 => {
                let l = pick(&mut inp);
                let b = inp.blob(packet::PACKET_LEN_MAX + 8);
                if corrupt {
                    owned_input(b.to_vec(), |buf| tm.handle_input_owned(now, l, buf));
                } else {
                    let _ = tm.handle_input(now, l, b);
                }
            }
            1 | 2 => pass_time(&mut tm, &mut inp, &mut now, op & 0x7f == 2),
            // A token from fuzz fields on some link.
            3 => {
                let l = pick(&mut inp);
                let b = fuzz_token_bytes(&mut inp, corrupt, port_of(l), tm.generation());
                let _ = tm.handle_input(now, l, &b);
            }
            // A neighbour's reply to the last wave on one link.
            4 => {
                let l = pick(&mut inp);
                let f = inp.u8();
                let t = Token {
                    seq: WaveSeq::of_wave(tm.waves()),
                    barrier: f & 3,
                    signals: if f & 4 != 0 { inp.u8() } else { 0 },
                    source_port: port_of(l),
                    generation: tm.generation(),
                    ..Token::default()
                };
                let _ = tm.handle_input(now, l, &t.to_bytes());
            }
            // Every neighbour replies to the last wave (the next wave goes out).
            5 => {
                let f = inp.u8();
                for (l, &p) in ports.iter().enumerate() {
                    let t = Token {
                        seq: WaveSeq::of_wave(tm.waves()),
                        barrier: (f >> (l % 4)) & 3,
                        source_port: p,
                        generation: tm.generation(),
                        ..Token::default()
                    };
                    let _ = tm.handle_input(now, l, &t.to_bytes());
                }
            }
            // A restart token of a newer generation from some neighbour.
            6 => {
                let l = pick(&mut inp);
                let t = Token {
                    restart: true,
                    source_port: port_of(l),
                    generation: tm.generation().next(),
                    ..Token::default()
                };
                let _ = tm.handle_input(now, l, &t.to_bytes());
            }
            // Isotach and non-isotach messages to forward.
            7 => {
                let l = pick(&mut inp);
                let mut m = fuzz_message(&mut inp, hosts);
                m.ts = Pulse::new(u64::from(inp.u8()));
                m.source = u16::from(inp.u8() % 8);
                // Mostly of the TM's generation (else stale and dropped at once).
                m.generation = Generation::new(
                    tm.generation()
                        .get()
                        .wrapping_sub(u32::from(inp.u8() & 3 == 0)),
                );
                let b = encode_maybe_corrupt(&mut inp, corrupt, &Packet::IsotachMessage(m));
                // The driver's path: the TM may take the buffer.
                owned_input(b, |buf| tm.handle_input_owned(now, l, buf));
            }
            8 => {
                let l = pick(&mut inp);
                let b = fuzz_plain_bytes(&mut inp, corrupt);
                let _ = tm.handle_input(now, l, &b);
            }
            // Kinds a TM never handles.
            9 => {
                let l = pick(&mut inp);
                let p = match inp.u8() % 3 {
                    0 => Packet::EopMarker(EopMarker::default()),
                    1 => Packet::EndOfIsochron(EndOfIsochron { iso_id: 1 }),
                    _ => Packet::BarrierSignalMarker(BarrierSignalMarker::default()),
                };
                let _ = tm.handle_input(now, l, &encode(&p));
            }
            _ => drain_tm(&mut tm, links, port),
        }
    }
    drain_tm(&mut tm, links, port);
}

// ---------------------------------------------------------------------------------------------
// Link layer: batches and the link core

/// Fuzzes the batch decoder (`isotach_am_proto::link::batch`): never panics; yields at most
/// `BATCH_PACKETS_MAX` packets and then at most one error, then nothing; the error agrees with
/// the bytes left; re-encoding the packets it accepted gives back exactly the bytes they came
/// from (all of them when there was no error).
pub fn check_link_batch(data: &[u8]) {
    use isotach_am_proto::link::FRAGMENT_MAX;
    use isotach_am_proto::link::batch::{self, BATCH_PACKETS_MAX, BatchError, LEN_PREFIX};
    let mut it = batch::packets(data);
    let (mut accepted, mut error) = (Vec::new(), None);
    for item in it.by_ref() {
        match item {
            Ok(p) => accepted.push(p),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    assert!(it.next().is_none(), "nothing after an error or the end");
    assert!(accepted.len() <= BATCH_PACKETS_MAX);
    let used: usize = accepted.iter().map(|p| batch::entry_len(p.len())).sum();
    let rest = &data[used..];
    match error {
        None => assert!(
            rest.is_empty() && !accepted.is_empty(),
            "a clean end is the end"
        ),
        Some(BatchError::Empty) => assert!(data.is_empty()),
        Some(BatchError::TooMany) => {
            assert_eq!(accepted.len(), BATCH_PACKETS_MAX);
            assert!(!rest.is_empty());
        }
        Some(BatchError::Truncated) => {
            assert!(!rest.is_empty() && accepted.len() < BATCH_PACKETS_MAX);
            let announced = rest
                .get(..LEN_PREFIX)
                .map(|b| usize::from(u16::from_le_bytes([b[0], b[1]])));
            assert!(announced.is_none_or(|n| LEN_PREFIX + n > rest.len()));
        }
    }
    // Decode → encode: the encoder writes exactly the bytes the decoder read.
    let mut again = Vec::new();
    for p in &accepted {
        if data.len() <= FRAGMENT_MAX {
            assert!(
                batch::push(&mut again, p),
                "a packet of a medium payload fits one"
            );
        } else {
            again.extend_from_slice(&(p.len() as u16).to_le_bytes());
            again.extend_from_slice(p);
        }
    }
    assert_eq!(again, &data[..used], "decode → encode changed the bytes");
}

/// A peer at `Mem(1)` that speaks the link's AM messages with whatever arguments and payloads
/// the fuzzer picks: a bare AM core that answers hellos, acks everything and keeps nothing.
#[derive(Debug)]
struct RawPeer;

impl isotach_am_proto::Dispatch for RawPeer {
    fn handler_kind(
        &self,
        _ep: isotach_am_proto::EpId,
        h: isotach_am_proto::HandlerId,
    ) -> isotach_am_proto::HandlerKind {
        use isotach_am_proto::HandlerKind;
        use isotach_am_proto::link::{H_BATCH, H_CREDIT, H_DATA, H_HELLO, H_HELLO_ACK};
        match h {
            H_HELLO_ACK => HandlerKind::Reply,
            H_DATA | H_HELLO | H_CREDIT | H_BATCH => HandlerKind::Request,
            _ => HandlerKind::Unset,
        }
    }
    fn on_request(&mut self, req: isotach_am_proto::Request<'_>) {
        use isotach_am_proto::link::{H_HELLO, H_HELLO_ACK};
        if req.handler() == H_HELLO {
            let _ = req.reply_short(H_HELLO_ACK, &[7]);
        }
    }
    fn on_reply(&mut self, _rep: isotach_am_proto::Reply<'_>) {}
}

/// Runs a `Links` (node `Mem(0)`, one peer `Mem(1)`, a small queue) against a scripted raw
/// peer. Each operation is one opcode byte and its operands (missing bytes read as 0):
/// batches, data fragments, credit and hellos with fuzz arguments and payloads, raw
/// datagrams, packets sent and received, time passing. Checks: no panic (the link core's
/// debug assertions are on), the window and the queue bound hold, every received packet is
/// within `PACKET_MAX`, the counters agree with what the peer sent. Returns the links'
/// counters (for probes).
pub fn run_links(data: &[u8]) -> isotach_am_proto::link::LinkStats {
    use isotach_am_proto::link::{
        self, BATCH_VERSION, DEFAULT_TAG, FRAGMENT_MAX, H_BATCH, H_CREDIT, H_DATA, H_HELLO,
        LINK_EP, Links, PACKET_MAX,
    };
    use isotach_am_proto::{Core, EndpointName, NodeAddr, SendReq, Time};
    use std::time::Duration;

    /// UDP's datagram over Ethernet, as the daemons run (allocates less per input than 64 KiB).
    const DATAGRAM: usize = 1472;
    let mut input = Input::new(data);
    let (us, them) = (NodeAddr::Mem(0), NodeAddr::Mem(1));
    let mut links = Links::new(Links::am_config(), us, 1, DATAGRAM, &[them], DEFAULT_TAG)
        .expect("one peer at another address");
    let queue_max = 1 + usize::from(input.u8()) * 4;
    links.set_queue_max(queue_max);
    let mut peer = Core::new(Links::am_config(), them, 1, DATAGRAM).expect("peer core");
    let ep = peer.alloc_endpoint().expect("endpoint");
    peer.set_tag(ep, DEFAULT_TAG).expect("tag");
    let idx = peer
        .map_any(
            ep,
            EndpointName {
                node: us,
                ep: LINK_EP,
            },
            DEFAULT_TAG,
        )
        .expect("translation");
    peer.set_fifo(us, true).expect("fifo");
    let mut now = Time(0);
    let (mut batches_v1, mut batches_other, mut received) = (0u64, 0u64, 0u64);
    let mut ops = 0;
    while !input.data.is_empty() && ops < 256 {
        ops += 1;
        let op = input.u8();
        // Mostly the current stream (0) or the next; sometimes anything.
        let stream = match input.u8() {
            0..=200 => 0,
            201..=250 => 1,
            b => u64::from(b) << 32,
        };
        match op % 8 {
            0 | 1 => {
                let version = if op & 0x80 == 0 {
                    BATCH_VERSION
                } else {
                    u64::from(input.u8())
                };
                let len = usize::from(input.u16()) % (FRAGMENT_MAX + 1);
                let payload = input.take(len);
                let args = [version, stream];
                let sent =
                    peer.send_request(now, SendReq::medium(ep, idx, H_BATCH, payload, &args));
                if sent.is_ok() {
                    *(if version == BATCH_VERSION {
                        &mut batches_v1
                    } else {
                        &mut batches_other
                    }) += 1;
                }
            }
            2 => {
                let more = u64::from(op & 0x80 != 0);
                let len = usize::from(input.u16()) % (FRAGMENT_MAX + 1);
                let payload = input.take(len);
                let args = [more, stream];
                let _ = peer.send_request(now, SendReq::medium(ep, idx, H_DATA, payload, &args));
            }
            3 => {
                let args = [u64::from(input.u8()), stream];
                let _ = peer.send_request(now, SendReq::short(ep, idx, H_CREDIT, &args));
            }
            4 => {
                let args = [DEFAULT_TAG.0, u64::from(input.u8())];
                let _ = peer.send_request(now, SendReq::short(ep, idx, H_HELLO, &args));
            }
            5 => {
                let len = usize::from(input.u16()) % 1500;
                let raw = input.take(len);
                links.handle_datagram(now, them, raw);
            }
            6 => {
                for _ in 0..input.u8() {
                    let len = match input.u8() {
                        0..=239 => usize::from(input.u8()),
                        b => usize::from(b - 239) * 4099,
                    };
                    if links.has_room(0) {
                        links
                            .send(0, vec![op; len.min(PACKET_MAX)])
                            .expect("a peer");
                    }
                }
            }
            _ => {
                for _ in 0..input.u8() {
                    if let Some((p, bytes)) = links.recv() {
                        assert_eq!(p, 0);
                        assert!(bytes.len() <= PACKET_MAX);
                        received += 1;
                    }
                }
                now = now.plus(Duration::from_millis(u64::from(input.u8()) * 50));
                links.handle_timeout(now);
                peer.handle_timeout(now);
            }
        }
        // Both ways until quiet (bounded: a hostile script may keep the link busy).
        for _ in 0..64 {
            let mut moved = 0;
            while let Some((to, bytes)) = peer.poll_transmit() {
                assert_eq!(to, us);
                links.handle_datagram(now, them, bytes);
                moved += 1;
            }
            while let Some((to, bytes)) = links.poll_transmit(now) {
                assert_eq!(to, them);
                peer.handle_datagram(now, us, bytes, &mut RawPeer);
                moved += 1;
            }
            while peer.poll_returned().is_some() {}
            if moved == 0 {
                break;
            }
        }
        assert!(links.in_flight(0) <= links.window(), "window overrun");
        assert!(links.queued() <= queue_max, "queue bound overrun");
        let s = links.stats();
        assert!(s.batches_received <= batches_v1, "{s:?}");
        assert!(s.batch_bad_version <= batches_other, "{s:?}");
        assert!(s.packets_batched <= s.packets_received, "{s:?}");
        assert!(s.batch_truncated <= s.batches_received, "{s:?}");
        assert!(
            s.packets_batched <= s.batches_received * link::BATCH_PACKETS_MAX as u64,
            "{s:?}"
        );
        assert!(received <= s.packets_received);
    }
    links.stats()
}

#[cfg(test)]
mod tests {
    /// The link session reaches what it is for: a batch read, a truncated batch, a batch of
    /// an unknown version, and our own batches out.
    #[test]
    fn run_links_reaches_batches_good_and_bad() {
        let mut script = vec![0u8]; // queue bound 1
        script.extend([7, 0, 0, 0]); // settle: hello both ways
        // A batch of two packets ("ab", "c"), stream 0 (payload length: big-endian u16).
        script.extend([0, 0, 0, 7, 2, 0, b'a', b'b', 1, 0, b'c']);
        // A truncated one: announces 9 bytes, holds 1.
        script.extend([0, 0, 0, 3, 9, 0, b'x']);
        // Version 2 (the version byte follows the stream byte).
        script.extend([0x80, 0, 2, 0, 3, 1, 0, b'y']);
        let s = super::run_links(&script);
        assert_eq!(s.batches_received, 2, "{s:?}");
        assert_eq!(s.packets_batched, 2, "{s:?}");
        assert_eq!((s.batch_truncated, s.batch_bad_version), (1, 1), "{s:?}");
        // Our side: three small packets at once with room for many go as one batch.
        let s = super::run_links(&[255, 7, 0, 0, 0, 6, 0, 3, 0, 1, 0, 1, 0, 1]);
        assert_eq!((s.batches_sent, s.packets_in_batches), (1, 3), "{s:?}");
    }
}
