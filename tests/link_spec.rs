//! The link layer as written down in `docs/wire.md`, section 6, checked against the code.
//!
//! A decoder written from the docs alone — the AM frame header of `docs/am.md` section 5, the
//! link messages of `docs/wire.md` section 6.2 and the packet kinds of its sections 1–3, with
//! its own CRC-32 — is driven two ways:
//!
//! 1. **By the doc's own examples** (table-driven): every `example:` / `hex:` / `decoded:` block
//!    of section 6.9 is decoded and every field the doc lists is checked; the same bytes are
//!    also decoded and re-encoded by `isotach_am::frame`, so the examples are the encoder's
//!    exact output.
//! 2. **By a real run**: a token manager and two SIU daemons run in-process over UDP with a
//!    relay spliced into every link (TM↔SIU, SIU↔SIU; each SIU's application address is a
//!    recording sink). Each daemon is configured with the relay's sockets as its peers'
//!    addresses — one relay socket per (node, peer), so every node still sees each peer at one
//!    fixed source address. The relay records every datagram in both directions. After some
//!    dozens of pulses the daemons stop and every recorded datagram must decode to documented
//!    link messages (one AM frame or several back to back, and some datagrams must carry
//!    several: a token and the acknowledgement it takes along); hellos, hello replies, data fragments and batches (reassembled and split
//!    into known packet kinds, in FIFO order), credit and acks must all appear, and the credit
//!    arithmetic of section 6.4 must hold (one window slot per data message).
//!
//! So the spec and the code cannot drift apart. No timed assertions: deadlines are liveness
//! guards only.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use isotach_am::backend::udp::UdpTransport;
use isotach_am::link::{self, DEFAULT_TAG, Links};
use isotach_am::{NodeAddr, Tag, Transport};
use isotach_daemon::run::{SiuDaemon, TmDaemon};
use isotach_daemon::siu::siu_plan;
use isotach_daemon::tm::tm_plan;
use isotach_proto::config::ClusterConfig;

// =============================================================================================
// The decoder, from the docs only (no isotach_am / isotach_proto decoding here).
// =============================================================================================

/// CRC-32/IEEE (reflected 0xEDB88320, init and final XOR 0xFFFFFFFF), as both docs define it.
fn crc32(bytes: &[u8]) -> u32 {
    let mut crc = 0xFFFF_FFFFu32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 != 0 {
                (crc >> 1) ^ 0xEDB8_8320
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}
fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}
fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

/// An AM frame as `docs/am.md` section 5 lays it out.
#[derive(Debug, Clone)]
struct AmFrame {
    kind: u8,
    class: u8,
    flags: u8,
    nargs: u8,
    status: u8,
    src_ep: u16,
    dst_ep: u16,
    slot: u16,
    handler: u16,
    seq: u32,
    epoch: u32,
    src_inc: u64,
    dst_inc: u64,
    tag: u64,
    fifo_seq: u32,
    total_len: u32,
    frag_len: u16,
    args: Vec<u64>,
    payload: Vec<u8>,
}

const AM_HEADER: usize = 72;
const KIND_REQUEST: u8 = 1;
const KIND_REPLY: u8 = 2;
const KIND_ACK: u8 = 3;
const KIND_NACK: u8 = 4;
const CLASS_SHORT: u8 = 0;
const CLASS_MEDIUM: u8 = 1;

fn kind_name(k: u8) -> &'static str {
    match k {
        1 => "request",
        2 => "reply",
        3 => "ack",
        4 => "nack",
        5 => "reply-nack",
        6 => "reply-nack-ack",
        _ => "?",
    }
}

fn class_name(c: u8) -> &'static str {
    ["short", "medium", "xfer", "get"]
        .get(usize::from(c))
        .copied()
        .unwrap_or("?")
}

/// Decodes a datagram of exactly one AM frame (docs/am.md section 5).
fn decode_frame(b: &[u8]) -> Result<AmFrame, String> {
    let (f, len) = decode_first_frame(b)?;
    if len != b.len() {
        return Err(format!(
            "one frame of {len} bytes in a datagram of {}",
            b.len()
        ));
    }
    Ok(f)
}

/// Decodes every frame of a datagram: one or several back to back, each as long as its
/// header says (docs/am.md section 5).
fn decode_datagram(mut b: &[u8]) -> Result<Vec<AmFrame>, String> {
    let mut frames = Vec::new();
    loop {
        let (f, len) = decode_first_frame(b)?;
        frames.push(f);
        b = &b[len..];
        if b.is_empty() {
            return Ok(frames);
        }
    }
}

/// Decodes the AM frame at the start of `b` (docs/am.md section 5), checking what that
/// section says a decoder rejects; returns it and its length.
fn decode_first_frame(b: &[u8]) -> Result<(AmFrame, usize), String> {
    if b.len() < AM_HEADER + 4 {
        return Err(format!("{} bytes: shorter than a frame", b.len()));
    }
    if &b[0..2] != b"AM" || b[2] != 1 {
        return Err("bad magic or version".into());
    }
    let (kind, class, flags, nargs, status) = (b[3], b[4], b[5], b[6], b[7]);
    if !(1..=6).contains(&kind) || class > 3 || flags & !1 != 0 || nargs > 8 {
        return Err(format!(
            "bad kind/class/flags/nargs {kind}/{class}/{flags}/{nargs}"
        ));
    }
    let has_status = kind == KIND_NACK || kind == 5;
    if has_status != (status != 0) || status > 10 {
        return Err(format!("status {status} on kind {kind}"));
    }
    let frag_len = le16(b, 68);
    let args_end = AM_HEADER + 8 * usize::from(nargs);
    let len = args_end + usize::from(frag_len) + 4;
    if len > b.len() {
        return Err(format!("header says {len} bytes, {} are left", b.len()));
    }
    let b = &b[..len];
    let body = len - 4;
    if crc32(&b[..body]) != le32(b, body) {
        return Err("bad CRC".into());
    }
    let f = AmFrame {
        kind,
        class,
        flags,
        nargs,
        status,
        src_ep: le16(b, 8),
        dst_ep: le16(b, 10),
        slot: le16(b, 12),
        handler: le16(b, 14),
        seq: le32(b, 16),
        epoch: le32(b, 20),
        src_inc: le64(b, 24),
        dst_inc: le64(b, 32),
        tag: le64(b, 40),
        fifo_seq: le32(b, 48),
        total_len: le32(b, 52),
        frag_len,
        args: (0..usize::from(nargs))
            .map(|i| le64(b, AM_HEADER + 8 * i))
            .collect(),
        payload: b[args_end..body].to_vec(),
    };
    let carries_msg = kind == KIND_REQUEST || kind == KIND_REPLY;
    if !carries_msg && (frag_len != 0 || nargs != 0) {
        return Err("a control frame with arguments or payload".into());
    }
    if carries_msg && class == CLASS_SHORT && frag_len != 0 {
        return Err("a short message with payload".into());
    }
    if carries_msg
        && class == CLASS_MEDIUM
        && (frag_len > 1024 || f.total_len != u32::from(frag_len))
    {
        return Err("bad medium geometry".into());
    }
    Ok((f, len))
}

/// A link message (docs/wire.md section 6.2).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Link {
    Hello { tag: u64, incarnation: u64 },
    HelloReply,
    Data { more: bool, stream: u64 },
    Batch { version: u64, stream: u64 },
    Credit { messages: u64, stream: Option<u64> },
    Ack,
    Nack { status: u8 },
}

impl Link {
    fn name(&self) -> &'static str {
        match self {
            Self::Hello { .. } => "hello",
            Self::HelloReply => "hello-reply",
            Self::Data { .. } => "data",
            Self::Batch { .. } => "batch",
            Self::Credit { .. } => "credit",
            Self::Ack => "ack",
            Self::Nack { .. } => "nack",
        }
    }
}

/// Which link message a frame is, by the message table of section 6.2 (endpoint 0 both ends,
/// requests FIFO).
fn link_message(f: &AmFrame) -> Result<Link, String> {
    if f.src_ep != 0 || f.dst_ep != 0 {
        return Err(format!("endpoints {} -> {}, not 0", f.src_ep, f.dst_ep));
    }
    let fifo = f.flags & 1 != 0;
    match (f.kind, f.class, f.handler, f.nargs) {
        (KIND_REQUEST, CLASS_SHORT, 2, 2) if fifo => Ok(Link::Hello {
            tag: f.args[0],
            incarnation: f.args[1],
        }),
        (KIND_REPLY, CLASS_SHORT, 3, _) if !fifo => Ok(Link::HelloReply),
        (KIND_REQUEST, CLASS_MEDIUM, 1, 2) if fifo && f.args[0] <= 1 => Ok(Link::Data {
            more: f.args[0] == 1,
            stream: f.args[1],
        }),
        (KIND_REQUEST, CLASS_MEDIUM, 5, 2) if fifo => Ok(Link::Batch {
            version: f.args[0],
            stream: f.args[1],
        }),
        (KIND_REQUEST, CLASS_SHORT, 4, 1 | 2) if fifo => Ok(Link::Credit {
            messages: f.args[0],
            stream: f.args.get(1).copied(),
        }),
        (KIND_ACK, _, 0, 0) if !fifo => Ok(Link::Ack),
        (KIND_NACK, _, 0, 0) if !fifo => Ok(Link::Nack { status: f.status }),
        _ => Err(format!(
            "not a link message: {} {} handler {} nargs {} flags {}",
            kind_name(f.kind),
            class_name(f.class),
            f.handler,
            f.nargs,
            f.flags
        )),
    }
}

/// The packets of a batch's payload (section 6.3): each a little-endian u16 length, then that
/// many bytes, to the payload's end; at least one.
fn batch_packets(payload: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut out = Vec::new();
    let mut at = 0;
    while at < payload.len() {
        if at + 2 > payload.len() {
            return Err(format!("batch: half a length at {at}"));
        }
        let len = usize::from(le16(payload, at));
        if at + 2 + len > payload.len() {
            return Err(format!(
                "batch: packet of {len} bytes at {at} runs past the end"
            ));
        }
        out.push(&payload[at + 2..at + 2 + len]);
        at += 2 + len;
    }
    if out.is_empty() || out.len() > 64 {
        return Err(format!("batch of {} packets", out.len()));
    }
    Ok(out)
}

/// The kind name of a whole Isotach packet (docs/wire.md sections 1–3): version, kind, the
/// length its table gives, the big-endian CRC-32 trailer. Tokens are decoded field by field.
fn decode_packet(p: &[u8]) -> Result<(&'static str, BTreeMap<&'static str, u64>), String> {
    if p.len() < 6 || p[0] != 1 {
        return Err(format!("{} bytes, version {:?}", p.len(), p.first()));
    }
    let n = p.len();
    let var = |at: usize, base: usize| (at + 2 <= n).then(|| base + usize::from(be16(p, at)));
    let (name, want) = match p[1] {
        1 => ("token", Some(16)),
        2 => ("start-of-isochron", Some(24)),
        3 if n > 2 && p[2] == 5 => ("isotach-message", var(26, 32)),
        3 => ("isotach-message", Some(48)),
        4 => ("end-of-isochron", Some(12)),
        5 => ("isochron-marker", Some(32)),
        6 => ("eop-marker", (n > 5).then(|| 32 + usize::from(p[5]))),
        7 => ("barrier-signal-marker", Some(16)),
        8 => ("non-isotach-message", var(6, 12)),
        k => return Err(format!("unknown packet kind {k}")),
    };
    if want != Some(n) {
        return Err(format!("{name}: {n} bytes, its layout says {want:?}"));
    }
    if crc32(&p[..n - 4]) != be32(p, n - 4) {
        return Err(format!("{name}: bad CRC"));
    }
    let mut fields = BTreeMap::new();
    if name == "token" {
        let flags = p[2];
        if flags & 0xC0 != 0 || p[3] & !3 != 0 || p[7] != 0 {
            return Err("token: reserved bits set".into());
        }
        fields.insert("token.seq", u64::from(flags & 3));
        fields.insert("token.repeat", u64::from(flags >> 2 & 1));
        fields.insert("token.reset", u64::from(flags >> 3 & 1));
        fields.insert("token.end_of_epoch", u64::from(flags >> 4 & 1));
        fields.insert("token.restart", u64::from(flags >> 5 & 1));
        fields.insert("token.barrier", u64::from(p[3]));
        fields.insert("token.source_port", u64::from(be16(p, 4)));
        fields.insert("token.signals", u64::from(p[6]));
        fields.insert("token.generation", u64::from(be32(p, 8)));
    }
    Ok((name, fields))
}

/// A field value of a `decoded:` line.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    Int(u64),
    Text(String),
    List(Vec<u64>),
}

fn parse_int(s: &str) -> Option<u64> {
    match s.strip_prefix("0x") {
        Some(h) => u64::from_str_radix(&h.replace('_', ""), 16).ok(),
        None => s.replace('_', "").parse().ok(),
    }
}

fn parse_value(key: &str, v: &str) -> Value {
    if key == "args" {
        return Value::List(v.split(',').map(|a| parse_int(a).expect(a)).collect());
    }
    parse_int(v).map_or_else(|| Value::Text(v.to_string()), Value::Int)
}

/// Everything the doc decoder says about one datagram, with the keys of section 6.9. A data
/// fragment's payload is taken as a whole packet (the examples are single fragments).
fn describe(b: &[u8]) -> Result<BTreeMap<String, Value>, String> {
    let f = decode_frame(b)?;
    let link = link_message(&f)?;
    let mut m = BTreeMap::new();
    let mut int = |k: &str, v: u64| m.insert(k.to_string(), Value::Int(v));
    int("len", b.len() as u64);
    int("fifo", u64::from(f.flags & 1));
    int("nargs", u64::from(f.nargs));
    int("status", u64::from(f.status));
    int("src_ep", u64::from(f.src_ep));
    int("dst_ep", u64::from(f.dst_ep));
    int("slot", u64::from(f.slot));
    int("handler", u64::from(f.handler));
    int("seq", u64::from(f.seq));
    int("epoch", u64::from(f.epoch));
    int("src_inc", f.src_inc);
    int("dst_inc", f.dst_inc);
    int("tag", f.tag);
    int("fifo_seq", u64::from(f.fifo_seq));
    int("total_len", u64::from(f.total_len));
    int("frag_len", u64::from(f.frag_len));
    match &link {
        Link::Hello { tag, incarnation } => {
            int("hello.tag", *tag);
            int("hello.incarnation", *incarnation);
        }
        Link::Data { more, stream } => {
            int("data.more", u64::from(*more));
            int("data.stream", *stream);
            int("data.bytes", f.payload.len() as u64);
        }
        Link::Batch { version, stream } => {
            int("batch.version", *version);
            int("batch.stream", *stream);
            int("batch.packets", batch_packets(&f.payload)?.len() as u64);
        }
        Link::Credit { messages, stream } => {
            int("credit.messages", *messages);
            if let Some(stream) = stream {
                int("credit.stream", *stream);
            }
        }
        Link::HelloReply | Link::Ack | Link::Nack { .. } => {}
    }
    let text = |k: &str, v: &str| (k.to_string(), Value::Text(v.to_string()));
    m.extend([
        text("kind", kind_name(f.kind)),
        text("class", class_name(f.class)),
        text("link", link.name()),
        ("args".to_string(), Value::List(f.args.clone())),
    ]);
    if matches!(link, Link::Data { more: false, .. }) {
        let (name, fields) = decode_packet(&f.payload)?;
        m.insert("packet".into(), Value::Text(name.into()));
        m.extend(
            fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), Value::Int(v))),
        );
    }
    if let Link::Batch { .. } = link {
        // Packet i's kind and token fields, keyed `packet<i>` and `packet<i>.token.*`.
        for (i, p) in batch_packets(&f.payload)?.into_iter().enumerate() {
            let (name, fields) = decode_packet(p)?;
            m.insert(format!("packet{i}"), Value::Text(name.into()));
            m.extend(
                fields
                    .into_iter()
                    .map(|(k, v)| (format!("packet{i}.{k}"), Value::Int(v))),
            );
        }
    }
    Ok(m)
}

// =============================================================================================
// The doc's examples.
// =============================================================================================

const WIRE_MD: &str = include_str!("../docs/wire.md");

#[derive(Debug)]
struct Example {
    title: String,
    bytes: Vec<u8>,
    expect: Vec<(String, Value)>,
}

/// The `example:` blocks of section 6 of docs/wire.md.
fn doc_examples() -> Vec<Example> {
    let start = WIRE_MD
        .find("\n## 6. Link layer")
        .expect("docs/wire.md has section 6, the link layer");
    let mut out: Vec<Example> = Vec::new();
    for line in WIRE_MD[start..].lines().map(str::trim) {
        if let Some(title) = line.strip_prefix("example:") {
            out.push(Example {
                title: title.trim().to_string(),
                bytes: Vec::new(),
                expect: Vec::new(),
            });
        } else if let Some(hex) = line.strip_prefix("hex:") {
            let e = out.last_mut().expect("hex: inside an example");
            assert!(e.expect.is_empty(), "{}: hex after decoded", e.title);
            for byte in hex.split_whitespace() {
                e.bytes.push(u8::from_str_radix(byte, 16).expect(byte));
            }
        } else if let Some(fields) = line.strip_prefix("decoded:") {
            let e = out.last_mut().expect("decoded: inside an example");
            for kv in fields.split_whitespace() {
                let (k, v) = kv.split_once('=').expect(kv);
                e.expect.push((k.to_string(), parse_value(k, v)));
            }
        }
    }
    out
}

#[test]
fn doc_examples_decode_as_documented() {
    let examples = doc_examples();
    assert!(examples.len() >= 7, "{} examples", examples.len());
    let mut links = HashSet::new();
    for e in &examples {
        assert!(!e.bytes.is_empty() && !e.expect.is_empty(), "{}", e.title);
        let got = describe(&e.bytes).unwrap_or_else(|err| panic!("{}: {err}", e.title));
        for (k, want) in &e.expect {
            assert_eq!(got.get(k), Some(want), "{}: field {k}", e.title);
        }
        if let Some(Value::Text(l)) = got.get("link") {
            links.insert(l.clone());
        }
    }
    for l in [
        "hello",
        "hello-reply",
        "data",
        "batch",
        "credit",
        "ack",
        "nack",
    ] {
        assert!(links.contains(l), "no example of a {l}");
    }
}

/// The doc's examples are exactly what `isotach_am::frame` encodes for those fields, and the
/// crate's decoder reads the same header as the doc decoder.
#[test]
fn doc_examples_are_the_encoders_output() {
    for e in doc_examples() {
        let f =
            isotach_am::frame::decode(&e.bytes).unwrap_or_else(|err| panic!("{}: {err}", e.title));
        let ours = decode_frame(&e.bytes).unwrap();
        let h = f.h;
        assert_eq!(
            (
                h.kind as u8,
                h.class as u8,
                h.flags,
                h.nargs,
                h.slot,
                h.handler
            ),
            (
                ours.kind,
                ours.class,
                ours.flags,
                ours.nargs,
                ours.slot,
                ours.handler
            ),
            "{}",
            e.title
        );
        assert_eq!(
            (h.seq, h.epoch, h.src_inc, h.dst_inc, h.tag, h.fifo_seq),
            (
                ours.seq,
                ours.epoch,
                ours.src_inc,
                ours.dst_inc,
                ours.tag,
                ours.fifo_seq
            ),
            "{}",
            e.title
        );
        assert_eq!(h.status.map_or(0, |s| s as u8), ours.status, "{}", e.title);
        let args = &f.args[..usize::from(h.nargs)];
        assert_eq!(args, &ours.args[..], "{}", e.title);
        let mut again = Vec::new();
        isotach_am::frame::encode(&h, args, f.payload, &mut again);
        assert_eq!(again, e.bytes, "{}: not the encoder's bytes", e.title);
    }
}

/// The numbers section 6 states are the code's.
#[test]
fn doc_constants_are_the_codes() {
    assert_eq!(link::PACKET_MAX, 65_536);
    assert_eq!(link::WINDOW_MIN, 65);
    assert_eq!(link::WINDOW_MAX, 1024);
    assert_eq!(link::CREDIT_BATCH, 16);
    assert_eq!(link::H_BATCH.0, 5);
    assert_eq!(link::BATCH_VERSION, 1);
    assert_eq!(link::BATCH_PACKETS_MAX, 64);
    assert_eq!(link::BATCH_PACKET_MAX, 1022);
    assert_eq!(isotach_am::MAX_MEDIUM_BYTES, 1024);
    let am = Links::am_config();
    assert_eq!(am.credits, isotach_am::MAX_SLOTS);
    assert_eq!(am.credits, 64);
    assert_eq!(am.give_up, Duration::from_secs(10));
    assert_eq!(
        (am.rto_initial, am.rto_min, am.rto_max),
        (
            Duration::from_millis(10),
            Duration::from_millis(10),
            Duration::from_secs(1)
        )
    );
    assert_eq!(DEFAULT_TAG, Tag(0x1507_AC40_0000_0001));
    assert!(WIRE_MD.contains("`0x1507_AC40_0000_0001`"));
    let limits = ClusterConfig::generated(1, 1).unwrap().limits;
    assert_eq!(limits.queue_packets_max, 65_536, "so the window is 1024");
}

// =============================================================================================
// A real run through a recording relay.
// =============================================================================================

/// One recorded datagram: which node sent it to which.
#[derive(Debug, Clone)]
struct Rec {
    from: &'static str,
    to: &'static str,
    bytes: Vec<u8>,
}

#[derive(Debug, Default)]
struct Relay {
    records: Arc<Mutex<Vec<Rec>>>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
    /// Datagrams from an address that is not the node a relay socket faces.
    strays: Arc<Mutex<Vec<SocketAddr>>>,
}

fn loopback() -> UdpSocket {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    s
}

impl Relay {
    /// Records what arrives at `sock` from `node` (named `from`, sent to `to`) and forwards it
    /// to `dest` from `out` (when given).
    fn pump(
        &mut self,
        sock: UdpSocket,
        node: SocketAddr,
        names: (&'static str, &'static str),
        forward: Option<(UdpSocket, SocketAddr)>,
    ) {
        let (records, stop, strays) = (
            Arc::clone(&self.records),
            Arc::clone(&self.stop),
            Arc::clone(&self.strays),
        );
        self.threads.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; 65_536];
            while !stop.load(Ordering::Relaxed) {
                let Ok((n, src)) = sock.recv_from(&mut buf) else {
                    continue;
                };
                if src != node {
                    strays.lock().unwrap().push(src);
                    continue;
                }
                records.lock().unwrap().push(Rec {
                    from: names.0,
                    to: names.1,
                    bytes: buf[..n].to_vec(),
                });
                if let Some((out, dest)) = &forward {
                    let _ = out.send_to(&buf[..n], dest);
                }
            }
        }));
    }

    /// Splices the relay into the link between `x` (at `xa`) and `y` (at `ya`). Returns the
    /// address `x` must use for `y`, and the one `y` must use for `x`.
    fn splice(
        &mut self,
        (x, xa): (&'static str, SocketAddr),
        (y, ya): (&'static str, SocketAddr),
    ) -> (SocketAddr, SocketAddr) {
        let (for_x, for_y) = (loopback(), loopback());
        let addrs = (for_x.local_addr().unwrap(), for_y.local_addr().unwrap());
        let (for_x2, for_y2) = (for_x.try_clone().unwrap(), for_y.try_clone().unwrap());
        self.pump(for_x, xa, (x, y), Some((for_y2, ya)));
        self.pump(for_y, ya, (y, x), Some((for_x2, xa)));
        addrs
    }

    /// A sink that records what `x` sends to a peer that never answers (`y`).
    fn sink(&mut self, (x, xa): (&'static str, SocketAddr), y: &'static str) -> SocketAddr {
        let s = loopback();
        let addr = s.local_addr().unwrap();
        self.pump(s, xa, (x, y), None);
        addr
    }

    fn finish(self) -> (Vec<Rec>, Vec<SocketAddr>) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join().unwrap();
        }
        let records = std::mem::take(&mut *self.records.lock().unwrap());
        let strays = std::mem::take(&mut *self.strays.lock().unwrap());
        (records, strays)
    }
}

fn udp() -> (UdpTransport, SocketAddr) {
    let t = UdpTransport::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let NodeAddr::Ip(a) = t.local_addr() else {
        unreachable!("UDP addresses are IP")
    };
    (t, a)
}

/// Pulses both SIUs must have seen before the run stops.
const PULSES: u64 = 100;
const GUARD: Duration = Duration::from_secs(60);

/// Runs a TM and two SIUs (hosts 0 and 1 of switch 0) through the relay; returns every
/// datagram the relay saw.
fn real_run() -> Vec<Rec> {
    let (tm_t, tm_a) = udp();
    let (siu0_t, siu0_a) = udp();
    let (siu1_t, siu1_a) = udp();
    let mut relay = Relay::default();
    // `a_sees_b`: the address node a is configured with for node b (a relay socket).
    let (tm_sees_siu0, siu0_sees_tm) = relay.splice(("tm", tm_a), ("siu0", siu0_a));
    let (tm_sees_siu1, siu1_sees_tm) = relay.splice(("tm", tm_a), ("siu1", siu1_a));
    let (siu0_sees_siu1, siu1_sees_siu0) = relay.splice(("siu0", siu0_a), ("siu1", siu1_a));
    let app0 = relay.sink(("siu0", siu0_a), "app0");
    let app1 = relay.sink(("siu1", siu1_a), "app1");

    let base = ClusterConfig::generated(2, 1).unwrap();
    let tag = Tag(base.transport.tag);
    // Each node's view of the cluster: its peers at the relay's sockets.
    let mut for_tm = base.clone();
    for_tm.switch_listen[0] = Some(tm_a);
    for_tm.host_siu = vec![Some(tm_sees_siu0), Some(tm_sees_siu1)];
    let mut for_siu = [base.clone(), base];
    for c in &mut for_siu {
        c.host_app = vec![Some(app0), Some(app1)];
    }
    for_siu[0].switch_listen[0] = Some(siu0_sees_tm);
    for_siu[0].host_siu = vec![Some(siu0_a), Some(siu0_sees_siu1)];
    for_siu[1].switch_listen[0] = Some(siu1_sees_tm);
    for_siu[1].host_siu = vec![Some(siu1_sees_siu0), Some(siu1_a)];

    let tm_plan = tm_plan(&for_tm, 0).unwrap();
    assert_eq!(
        tm_plan.peers,
        vec![NodeAddr::Ip(tm_sees_siu0), NodeAddr::Ip(tm_sees_siu1)],
        "TM peers: its hosts' SIUs in host-id order (section 6.1)"
    );
    let tm = TmDaemon::tm(tm_plan, tm_t, tag).unwrap();
    let mut sius = Vec::new();
    for (h, (t, c)) in [siu0_t, siu1_t].into_iter().zip(&for_siu).enumerate() {
        let plan = siu_plan(c, h as u16).unwrap();
        let other = if h == 0 {
            siu0_sees_siu1
        } else {
            siu1_sees_siu0
        };
        let tm_addr = c.switch_listen[0].unwrap();
        assert_eq!(
            plan.peers,
            vec![
                NodeAddr::Ip(tm_addr),
                NodeAddr::Ip(c.host_app[h].unwrap()),
                NodeAddr::Ip(other)
            ],
            "SIU peers: TM, application, other SIUs (section 6.1)"
        );
        sius.push(SiuDaemon::siu(plan, t, tag).unwrap());
    }
    let gauges: Vec<_> = sius.iter().map(SiuDaemon::gauges).collect();

    // Each daemon on a thread of its own, as `isotach tm` / `isotach siu` run it.
    let stop = Arc::new(AtomicBool::new(false));
    let run = |name: &str, d: Box<dyn FnOnce(&AtomicBool) + Send>| {
        let stop = Arc::clone(&stop);
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || d(&stop))
            .unwrap()
    };
    let mut threads = vec![run(
        "tm",
        Box::new(move |stop| drop(tm.run_blocking(stop).unwrap())),
    )];
    for d in sius {
        threads.push(run(
            "siu",
            Box::new(move |stop| drop(d.run_blocking(stop).unwrap())),
        ));
    }

    let until = Instant::now() + GUARD;
    while gauges
        .iter()
        .any(|g| g.recvclock.load(Ordering::Relaxed) < PULSES)
    {
        assert!(
            Instant::now() < until,
            "liveness guard: logical time stalled; {} datagrams relayed, {} strays",
            relay.records.lock().unwrap().len(),
            relay.strays.lock().unwrap().len()
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("a daemon thread ended without panicking");
    }
    let (records, strays) = relay.finish();
    assert!(
        strays.is_empty(),
        "datagrams from unexpected addresses: {strays:?}"
    );
    records
}

/// A request's identity in the AM layer: retransmissions repeat it.
type ReqId = (u64, u32, u16, u32);

fn req_id(f: &AmFrame) -> ReqId {
    (f.src_inc, f.epoch, f.slot, f.seq)
}

#[test]
fn every_datagram_of_a_real_run_is_a_documented_link_message() {
    let records = real_run();
    let tag = DEFAULT_TAG.0;
    // Per direction: distinct requests in arrival order, and what was seen.
    let mut requests: HashMap<(&str, &str), Vec<(AmFrame, Link)>> = HashMap::new();
    let mut seen_ids: HashSet<(&str, &str, ReqId)> = HashSet::new();
    let mut by_link: HashMap<(&str, &str, &str), usize> = HashMap::new();
    // Credit arithmetic (section 6.4), per sending direction of the data.
    let (mut sent, mut credited) = (HashMap::new(), HashMap::new());
    let window = link::WINDOW_MAX as u64;
    let shared = records
        .iter()
        .filter(|r| decode_datagram(&r.bytes).is_ok_and(|f| f.len() > 1))
        .count();
    assert!(
        shared > 0,
        "no datagram of {} carried several frames",
        records.len()
    );
    let frames = records.iter().enumerate().flat_map(|(i, r)| {
        let frames = decode_datagram(&r.bytes)
            .unwrap_or_else(|e| panic!("datagram {i} {}->{}: {e}", r.from, r.to));
        frames.into_iter().map(move |f| (i, r, f))
    });
    for (i, r, f) in frames {
        let link =
            link_message(&f).unwrap_or_else(|e| panic!("datagram {i} {}->{}: {e}", r.from, r.to));
        *by_link.entry((r.from, r.to, link.name())).or_default() += 1;
        match &link {
            Link::HelloReply | Link::Ack | Link::Nack { .. } => {
                // Answers a request recorded earlier in the other direction.
                let asked = requests.get(&(r.to, r.from)).and_then(|rs| {
                    rs.iter().find(|(q, _)| {
                        (q.slot, q.seq, q.epoch, q.src_inc) == (f.slot, f.seq, f.epoch, f.dst_inc)
                    })
                });
                let (q, ql) = asked.unwrap_or_else(|| {
                    panic!(
                        "datagram {i} {}->{}: {link:?} answers nothing",
                        r.from, r.to
                    )
                });
                match link {
                    Link::HelloReply => assert!(matches!(ql, Link::Hello { .. }), "{ql:?}"),
                    Link::Ack => assert!(
                        matches!(
                            ql,
                            Link::Data { .. } | Link::Batch { .. } | Link::Credit { .. }
                        ),
                        "datagram {i}: an ack of {ql:?}"
                    ),
                    _ => {}
                }
                assert_eq!(f.class, q.class, "datagram {i}: answers echo the class");
                let want_tag = if link == Link::HelloReply { tag } else { 0 };
                assert_eq!(
                    f.tag, want_tag,
                    "datagram {i}: replies echo the tag, acks carry 0"
                );
            }
            _ => {
                assert_eq!(f.tag, tag, "datagram {i}: requests carry the cluster tag");
                if !seen_ids.insert((r.from, r.to, req_id(&f))) {
                    continue; // an AM retransmission
                }
                match link {
                    Link::Hello {
                        tag: t,
                        incarnation,
                    } => {
                        assert_eq!((t, incarnation), (tag, f.src_inc), "datagram {i}");
                    }
                    Link::Data { .. } | Link::Batch { .. } => {
                        // One window slot per data message, fragment or batch.
                        let n = sent.entry((r.from, r.to)).or_insert(0u64);
                        *n += 1;
                        let c = credited.get(&(r.from, r.to)).copied().unwrap_or(0);
                        assert!(*n - c.min(*n) <= window, "datagram {i}: beyond the window");
                    }
                    Link::Credit { messages, .. } => {
                        assert!(messages >= 16, "datagram {i}: credit is batched by 16");
                        *credited.entry((r.to, r.from)).or_insert(0u64) += messages;
                    }
                    _ => {}
                }
                requests.entry((r.from, r.to)).or_default().push((f, link));
            }
        }
    }

    // Every link the daemons have said hello both ways and came up (hello replies); the
    // applications never answer, so the SIUs only said hello to them. An SIU daemon says
    // hello to every other SIU at start (it may be a restart: `Links::link_every_peer`), and
    // these had nothing else to say to each other: hellos and their replies, nothing more.
    let siu_to_siu: Vec<_> = by_link
        .keys()
        .filter(|(a, b, _)| a.starts_with("siu") && b.starts_with("siu"))
        .collect();
    assert!(
        siu_to_siu
            .iter()
            .all(|(_, _, l)| *l == "hello" || *l == "hello-reply"),
        "SIU to SIU traffic without a packet to send: {by_link:?}"
    );
    for (a, b) in [("siu0", "siu1"), ("siu1", "siu0")] {
        assert!(
            by_link.contains_key(&(a, b, "hello")),
            "no start hello {a}->{b}: {by_link:?}"
        );
    }
    for (x, y) in [("tm", "siu0"), ("tm", "siu1")] {
        for (a, b) in [(x, y), (y, x)] {
            for l in ["hello", "hello-reply"] {
                assert!(
                    by_link.contains_key(&(a, b, l)),
                    "no {l} {a}->{b}: {by_link:?}"
                );
            }
        }
    }
    for (s, app) in [("siu0", "app0"), ("siu1", "app1")] {
        let only_hellos = by_link
            .iter()
            .filter(|((a, b, _), _)| (*a, *b) == (s, app))
            .all(|((_, _, l), _)| *l == "hello");
        assert!(
            only_hellos && by_link.contains_key(&(s, app, "hello")),
            "{by_link:?}"
        );
    }
    // Data (fragments or batches), credit and acks on the token path, both ways.
    for s in ["siu0", "siu1"] {
        for (a, b) in [("tm", s), (s, "tm")] {
            for l in ["credit", "ack"] {
                assert!(
                    by_link.contains_key(&(a, b, l)),
                    "no {l} {a}->{b}: {by_link:?}"
                );
            }
            assert!(
                by_link.contains_key(&(a, b, "data")) || by_link.contains_key(&(a, b, "batch")),
                "no data {a}->{b}: {by_link:?}"
            );
            // Credit never exceeds the data messages it answers.
            let c = credited.get(&(a, b)).copied().unwrap_or(0);
            assert!(
                c <= sent[&(a, b)],
                "{a}->{b}: credit {c} for {} data messages",
                sent[&(a, b)]
            );
        }
    }

    // The doc's examples are what the daemons really send: host 0's SIU opens its stream to
    // the TM with the hello (slot 0, seq 0, fifo_seq 0, TM incarnation unknown) and then the
    // restart token of the example, in slot 0 again with seq 1 and fifo_seq 1 — alone, as the
    // example's data fragment, or first in a batch when the TM's answer came in the same pass
    // and the SIU's first wave token followed it; the TM answers SIU 0 the same way, with a
    // batch that starts with the packets of the batch example (its restart token and wave 1's
    // token).
    let examples = doc_examples();
    let example = |needle: &str| {
        let e = examples
            .iter()
            .find(|e| e.title.contains(needle))
            .expect(needle);
        decode_frame(&e.bytes).unwrap()
    };
    let mut opening: Vec<&AmFrame> = requests[&("siu0", "tm")].iter().map(|(f, _)| f).collect();
    opening.sort_by_key(|f| f.fifo_seq);
    let shape = |f: &AmFrame| {
        let (epoch, dst_known) = (f.epoch, f.dst_inc != 0);
        (
            f.kind, f.class, f.flags, f.handler, f.slot, f.seq, epoch, dst_known, f.fifo_seq,
        )
    };
    let (hello, restart) = (example("hello, SIU"), example("restart token"));
    assert_eq!(shape(opening[0]), shape(&hello), "the hello example");
    assert_eq!(opening[0].tag, hello.tag);
    // The slot, sequence numbers and packets of a data message, fragment or batch.
    fn first(f: &AmFrame) -> ((u16, u32, u32, u32), Vec<&[u8]>) {
        let packets = match f.handler {
            5 => batch_packets(&f.payload).unwrap(),
            _ => vec![&f.payload[..]],
        };
        ((f.slot, f.seq, f.epoch, f.fifo_seq), packets)
    }
    if opening[1].handler == 1 {
        assert_eq!(
            shape(opening[1]),
            shape(&restart),
            "the restart-token example"
        );
        assert_eq!(
            (&opening[1].args, &opening[1].payload),
            (&restart.args, &restart.payload),
            "the restart-token example"
        );
    } else {
        let (at, packets) = first(opening[1]);
        assert_eq!(at, first(&restart).0, "the restart-token example, batched");
        assert_eq!(packets[0], &restart.payload[..], "the restart token first");
    }
    let mut answer: Vec<&AmFrame> = requests[&("tm", "siu0")].iter().map(|(f, _)| f).collect();
    answer.sort_by_key(|f| f.fifo_seq);
    let batch = example("wave 1");
    assert_eq!(shape(answer[1]), shape(&batch), "the batch example");
    assert_eq!(answer[1].args, batch.args, "the batch example");
    let (want, got) = (first(&batch).1, first(answer[1]).1);
    assert!(
        got.len() >= want.len() && got[..want.len()] == want[..],
        "the batch example: the TM's restart token and wave 1 first"
    );

    // Reassembly (section 6.3): per direction and AM stream (incarnation, epoch), the requests
    // in fifo_seq order, data payloads concatenated up to `more` = 0, a batch's packets in
    // their order, between packets.
    let mut kinds: HashMap<(&str, &str, &str), usize> = HashMap::new();
    for ((from, to), reqs) in &requests {
        let mut streams: BTreeMap<(u64, u32), Vec<&(AmFrame, Link)>> = BTreeMap::new();
        for r in reqs {
            streams.entry((r.0.src_inc, r.0.epoch)).or_default().push(r);
        }
        assert_eq!(
            streams.len(),
            1,
            "{from}->{to}: one incarnation and epoch in a clean run"
        );
        for mut stream in streams.into_values() {
            stream.sort_by_key(|(f, _)| f.fifo_seq);
            let order: Vec<u32> = stream.iter().map(|(f, _)| f.fifo_seq).collect();
            let expected: Vec<u32> = (0..order.len() as u32).collect();
            assert_eq!(
                order, expected,
                "{from}->{to}: one FIFO stream from 0, no gaps"
            );
            assert!(
                matches!(stream[0].1, Link::Hello { .. }),
                "{from}->{to}: the hello opens the stream"
            );
            let (mut packet, mut packets) = (Vec::new(), Vec::new());
            for (f, link) in stream {
                match link {
                    Link::Data { more, stream } => {
                        assert_eq!(*stream, 0, "{from}->{to}: the link never broke");
                        packet.extend_from_slice(&f.payload);
                        if !more {
                            packets.push(std::mem::take(&mut packet));
                        }
                    }
                    Link::Batch { version, stream } => {
                        assert_eq!((*version, *stream), (1, 0), "{from}->{to}: a batch");
                        assert!(packet.is_empty(), "{from}->{to}: a batch inside a packet");
                        let inner = batch_packets(&f.payload)
                            .unwrap_or_else(|e| panic!("{from}->{to}: {e}"));
                        packets.extend(inner.into_iter().map(<[u8]>::to_vec));
                    }
                    _ => {}
                }
            }
            for (i, p) in packets.iter().enumerate() {
                let (kind, fields) =
                    decode_packet(p).unwrap_or_else(|e| panic!("{from}->{to} packet {i}: {e}"));
                *kinds.entry((from, to, kind)).or_default() += 1;
                if kind != "token" {
                    continue;
                }
                let port = fields["token.source_port"];
                let want = match *from {
                    "tm" => 0x8000,
                    "siu0" => 0,
                    _ => 1,
                };
                assert_eq!(port, want, "{from}->{to} packet {i}: source port");
                if i == 0 {
                    // Logical time starts with a restart token of generation 1 (section 6.6):
                    // host 0's to the TM, the TM's restart wave to every SIU; host 1's first
                    // packet is its first wave token.
                    let restart = u64::from(*from != "siu1");
                    assert_eq!(
                        (fields["token.restart"], fields["token.generation"]),
                        (restart, 1),
                        "{from}->{to}: the first packet"
                    );
                }
            }
        }
    }
    for s in ["siu0", "siu1"] {
        for (a, b) in [("tm", s), (s, "tm")] {
            let tokens = kinds.get(&(a, b, "token")).copied().unwrap_or(0) as u64;
            assert!(tokens >= PULSES, "{a}->{b}: {tokens} tokens: {kinds:?}");
        }
    }
    println!(
        "{} datagrams; link messages {by_link:?}; packets {kinds:?}",
        records.len()
    );
}
