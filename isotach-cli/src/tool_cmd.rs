//! `isotach tool bounce|send|recv`: the SIU test tools of the prototype report, on the real
//! wire.
//!
//! Each tool is one [`PacketPort`] (AM over UDP, reliable per-peer FIFO, hello handshake) that
//! takes the place of one of an SIU daemon's peers, so the daemon talks to it exactly as it
//! talks to its token manager or its application:
//!
//! * `bounce` binds the token manager's address (the config's `[[switch]] listen` of the SIU's
//!   switch) and runs the harness's [`TokenBouncer`] (`isotach-tests`) against the SIU;
//! * `send` binds the application's address (`[[host]] app`, the host side) or another host's
//!   SIU address (`--from-host`, the network side) and sends packets given as hex lines;
//! * `recv` binds the application's address and prints what the SIU hands its host.
//!
//! Packets are printed one per line, decoded (`--json`: one JSON object per line).

use crate::UsageError;
use crate::cluster_io::{Link, load};
use clap::{Args, Subcommand, ValueEnum};
use isotach_am::NodeAddr;
use isotach_am::backend::quic::{QuicConfig, QuicTransport};
use isotach_am::backend::udp::UdpTransport;
use isotach_am::port::{DEFAULT_TAG, PacketPort};
use isotach_am::{Tag, Transport};
use isotach_proto::Generation;
use isotach_proto::Pulse;
use isotach_proto::packet::{
    BARRIER_MASK, IsotachMessage, MSG_PAYLOAD_MAX, Packet, RmwOp, Sref, SrefOp, Width,
};
use isotach_proto::topology::{HostId, SwitchId};
use isotach_tools::{ByteGenerator, TokenBits, TokenBouncer, XorShift};
use serde_json::{Value, json};
use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

/// SIU test tools on the real wire.
#[derive(Debug, Args)]
pub(crate) struct ToolArgs {
    #[command(subcommand)]
    tool: Tool,
}

#[derive(Debug, Subcommand)]
enum Tool {
    /// Token bouncer: plays an SIU's token manager (answers tokens with correct sequence
    /// numbers; pauses, repeat and early tokens, isotach messages, barrier/signal bits).
    Bounce(BounceArgs),
    /// Byte generator: sends packets given as hex lines (file or stdin) to an SIU.
    Send(SendArgs),
    /// Receiver: listens where an SIU delivers to its host and prints decoded packets.
    Recv(RecvArgs),
    /// Draws the scale curve of `isotach sim scale --json` (pulse period and isochron
    /// latency against the hosts, one line per topology) as an SVG.
    PlotScale(plot_scale::PlotScaleArgs),
}

mod plot_scale;

/// Where the SIU is and where the tool listens: from a cluster config, or given directly.
#[derive(Debug, Args)]
struct Target {
    /// Cluster config (TOML) to take addresses and ids from.
    #[arg(long, value_name = "FILE", env = "ISOTACH_CONFIG")]
    config: Option<PathBuf>,
    /// The SIU's host name (`[[host]] name`); needs --config.
    #[arg(long, env = "ISOTACH_HOST")]
    host: Option<String>,
    /// The SIU daemon's address (overrides the config).
    #[arg(long, value_name = "ADDR")]
    siu: Option<SocketAddr>,
    /// The address this tool binds (overrides the config).
    #[arg(long, value_name = "ADDR")]
    local: Option<SocketAddr>,
    /// Print one JSON object per packet.
    #[arg(long)]
    json: bool,
    /// Exit 1 after this many seconds (default: run until interrupted or done).
    #[arg(long, value_name = "S")]
    timeout_s: Option<u64>,
}

/// Whether the bouncer starts logical time itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum StartMode {
    /// Start unless the SIU is host 0 (which initiates the reset itself).
    Auto,
    /// Send a reset token and wave 1 as soon as the SIU answered the hello.
    Yes,
    /// Wait for the SIU's restart token.
    No,
}

/// `isotach tool bounce`.
#[derive(Debug, Args)]
struct BounceArgs {
    #[command(flatten)]
    target: Target,
    /// The SIU's host id (default: from --host and --config, else 0).
    #[arg(long)]
    host_id: Option<HostId>,
    /// The switch whose token manager it plays (default: the SIU's switch in the config, else 0).
    #[arg(long)]
    switch_id: Option<SwitchId>,
    /// Start logical time (send reset + wave 1).
    #[arg(long, value_enum, default_value_t = StartMode::Auto)]
    start: StartMode,
    /// Send no wave beyond this many (then keep listening: the SIU's timer sends repeats).
    #[arg(long, value_name = "N")]
    pause_after: Option<u64>,
    /// After every k-th wave, resend the last two tokens marked repeat.
    #[arg(long, value_name = "K")]
    repeat_every: Option<u64>,
    /// Before every k-th wave, send an early token (the sequence number after it).
    #[arg(long, value_name = "K")]
    early_every: Option<u64>,
    /// Between tokens, send up to this many isotach messages (random count) to the SIU's host,
    /// stamped with the current pulse, from random other hosts.
    #[arg(long, value_name = "N", default_value_t = 0)]
    messages_max: u64,
    /// Largest payload of those messages (`msg` srefs of random size 0..=B bytes).
    #[arg(long, value_name = "B", default_value_t = 64)]
    payload_max: usize,
    /// Barrier bits to set (mask, e.g. 0b01 or 3) on every --bits-every-th wave.
    #[arg(long, value_name = "MASK", value_parser = parse_u8, default_value = "0")]
    barrier: u8,
    /// Signal bits to set on every --bits-every-th wave.
    #[arg(long, value_name = "MASK", value_parser = parse_u8, default_value = "0")]
    signals: u8,
    /// Set --barrier/--signals on every k-th wave.
    #[arg(long, value_name = "K", default_value_t = 1)]
    bits_every: u64,
    /// Mark every wave that is a multiple of E as the end of an epoch.
    #[arg(long, value_name = "E")]
    epoch_pulses: Option<u64>,
    /// Answer a barrier bit on the SIU's token with that bit on the next wave (a TM with one
    /// host).
    #[arg(long)]
    echo_barriers: bool,
    /// Exit 0 once this many waves were sent and answered.
    #[arg(long, value_name = "N")]
    waves: Option<u64>,
    /// Print only packets that are not tokens.
    #[arg(long)]
    only_non_tokens: bool,
    /// Seed of the message sizes and sources.
    #[arg(long, default_value_t = 1)]
    seed: u64,
}

/// `isotach tool send`.
#[derive(Debug, Args)]
struct SendArgs {
    #[command(flatten)]
    target: Target,
    /// Hex packets, one per line (`#` starts a comment, blanks are ignored, `!` resends the
    /// previous packet); `-` or nothing reads stdin.
    file: Option<PathBuf>,
    /// Send from this host's SIU address (the network side, as that SIU would) instead of the
    /// application address (the host side). Needs --config.
    #[arg(long, value_name = "HOST")]
    from_host: Option<String>,
    /// Send every packet this many extra times.
    #[arg(long, value_name = "N", default_value_t = 0)]
    repeat: u32,
    /// Append these bytes (hex) to every packet.
    #[arg(long, value_name = "HEX", value_parser = parse_hex)]
    tail: Option<Vec<u8>>,
    /// Flip a bit of every packet's trailing CRC.
    #[arg(long)]
    corrupt_crc: bool,
    /// After sending, print what the SIU sends back until this many packets arrived.
    #[arg(long, value_name = "N")]
    then_recv: Option<u64>,
}

/// `isotach tool recv`.
#[derive(Debug, Args)]
struct RecvArgs {
    #[command(flatten)]
    target: Target,
    /// Exit 0 after this many packets.
    #[arg(long, value_name = "N")]
    count: Option<u64>,
    /// Print only packets that are not EOP markers.
    #[arg(long)]
    no_eop: bool,
}

pub(crate) fn run(args: ToolArgs) -> anyhow::Result<ExitCode> {
    match args.tool {
        Tool::Bounce(a) => bounce(a),
        Tool::Send(a) => send(a),
        Tool::Recv(a) => recv(a),
        Tool::PlotScale(a) => plot_scale::run(&a),
    }
}

// ---------------------------------------------------------------------------------------------
// Parsing

fn parse_u8(s: &str) -> Result<u8, String> {
    let r = if let Some(b) = s.strip_prefix("0b") {
        u8::from_str_radix(b, 2)
    } else if let Some(h) = s.strip_prefix("0x") {
        u8::from_str_radix(h, 16)
    } else {
        s.parse()
    };
    r.map_err(|e| format!("`{s}`: {e}"))
}

/// Bytes from hex digits; whitespace, `_` and `:` between bytes are ignored.
pub(crate) fn parse_hex(s: &str) -> Result<Vec<u8>, String> {
    let digits: Vec<u8> = s
        .bytes()
        .filter(|c| !c.is_ascii_whitespace() && *c != b'_' && *c != b':')
        .collect();
    if !digits.len().is_multiple_of(2) {
        return Err(format!("odd number of hex digits in `{s}`"));
    }
    digits
        .chunks(2)
        .map(|p| {
            let t = std::str::from_utf8(p).map_err(|e| e.to_string())?;
            u8::from_str_radix(t, 16).map_err(|_| format!("`{t}` is not hex"))
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------------------------------------
// Addresses

/// The SIU, the address to bind, and the ids the bouncer needs.
struct Resolved {
    siu: SocketAddr,
    local: SocketAddr,
    host: Option<HostId>,
    switch: Option<SwitchId>,
    /// The transport and identity of the peer the tool plays (UDP without a config).
    link: Link,
    /// The cluster's AM tag.
    tag: Tag,
}

/// Which of the SIU's peers the tool plays.
enum Plays<'a> {
    Tm,
    App,
    OtherSiu(&'a str),
}

fn resolve(t: &Target, plays: Plays<'_>) -> Result<Resolved, UsageError> {
    let mut r = Resolved {
        siu: t.siu.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
        local: t.local.unwrap_or(SocketAddr::from(([127, 0, 0, 1], 0))),
        host: None,
        switch: None,
        link: Link::Udp,
        tag: DEFAULT_TAG,
    };
    if let Some(path) = &t.config {
        let file = path.display();
        let cluster = load(path)?;
        let name = t
            .host
            .as_deref()
            .ok_or_else(|| UsageError("--config needs --host (the SIU's host name)".into()))?;
        let host = cluster
            .host_id(name)
            .ok_or_else(|| UsageError(format!("{file}: no host named `{name}`")))?;
        let h = usize::from(host);
        let switch = cluster.topology.switch_of(host);
        let missing = |what: &str| UsageError(format!("{file}: {what} has no address"));
        let siu = cluster.host_siu[h].ok_or_else(|| missing(&format!("host `{name}` siu")))?;
        // On QUIC the tool presents the certificate of the node it plays.
        let played = match plays {
            Plays::Tm => cluster.switch_names[usize::from(switch)].as_str(),
            Plays::App => name,
            Plays::OtherSiu(other) => other,
        };
        let link = Link::of(&cluster, path, played)?;
        let local = match plays {
            Plays::Tm => cluster.switch_listen[usize::from(switch)]
                .ok_or_else(|| missing("the SIU's switch"))?,
            Plays::App => {
                cluster.host_app[h].ok_or_else(|| missing(&format!("host `{name}` app")))?
            }
            Plays::OtherSiu(other) => {
                let o = cluster
                    .host_id(other)
                    .ok_or_else(|| UsageError(format!("{file}: no host named `{other}`")))?;
                if o == host {
                    return Err(UsageError(
                        "--from-host must name another host than --host".into(),
                    ));
                }
                cluster.host_siu[usize::from(o)]
                    .ok_or_else(|| missing(&format!("host `{other}` siu")))?
            }
        };
        r = Resolved {
            siu: t.siu.unwrap_or(siu),
            local: t.local.unwrap_or(local),
            host: Some(host),
            switch: Some(switch),
            link,
            tag: Tag(cluster.transport.tag),
        };
    } else if matches!(plays, Plays::OtherSiu(_)) {
        return Err(UsageError("--from-host needs --config".into()));
    }
    if r.siu.port() == 0 {
        return Err(UsageError("give --config and --host, or --siu ADDR".into()));
    }
    if r.local.port() == 0 {
        // The SIU drops packets from addresses that are not its configured peers, so the tool
        // must bind the exact address the SIU expects.
        return Err(UsageError(
            "give --config and --host, or --local ADDR (the address the SIU expects)".into(),
        ));
    }
    Ok(r)
}

/// The tool's port, over the transport the config names.
enum ToolPort {
    Udp(PacketPort<UdpTransport>),
    Quic(PacketPort<QuicTransport>),
}

fn open_port(r: &Resolved) -> anyhow::Result<ToolPort> {
    let bind_err = |e: isotach_am::AmError| anyhow::anyhow!("bind {}: {e}", r.local);
    let peers = [NodeAddr::Ip(r.siu)];
    Ok(match &r.link {
        Link::Udp => {
            let t = UdpTransport::bind(r.local).map_err(bind_err)?;
            ToolPort::Udp(PacketPort::new(t, &peers, r.tag)?)
        }
        Link::Quic(identity) => {
            let cfg = QuicConfig::new(r.local, identity.clone());
            let t = QuicTransport::bind(cfg).map_err(bind_err)?;
            ToolPort::Quic(PacketPort::new(t, &peers, r.tag)?)
        }
    })
}

/// Runs `$body` with `$port` bound to the tool's port, whatever its transport (the body is
/// generic code over `PacketPort<T>`, expanded once per transport).
macro_rules! with_port {
    ($r:expr, $port:ident => $body:block) => {
        match open_port($r)? {
            ToolPort::Udp(mut $port) => $body,
            ToolPort::Quic(mut $port) => $body,
        }
    };
}

fn deadline(t: &Target) -> Option<Instant> {
    t.timeout_s.map(|s| Instant::now() + Duration::from_secs(s))
}

fn timed_out(d: Option<Instant>) -> bool {
    d.is_some_and(|d| Instant::now() >= d)
}

// ---------------------------------------------------------------------------------------------
// Printing

/// One packet as a line of text: `DIR KIND field=value …`.
pub(crate) fn describe(bytes: &[u8]) -> String {
    let p = match Packet::decode(bytes) {
        Ok(p) => p,
        Err(e) => return format!("undecodable ({e}) {}", hex(bytes)),
    };
    let bits = |flags: &[(&str, bool)]| -> String {
        flags
            .iter()
            .filter(|f| f.1)
            .map(|f| format!(" {}", f.0))
            .collect()
    };
    match p {
        Packet::Token(t) => format!(
            "token seq={} gen={} port={:#06x} barrier={:#04b} signals={:#04x}{}",
            t.seq,
            t.generation,
            t.source_port,
            t.barrier,
            t.signals,
            bits(&[
                ("repeat", t.repeat),
                ("reset", t.reset),
                ("end-of-epoch", t.end_of_epoch),
                ("restart", t.restart),
            ])
        ),
        Packet::StartOfIsochron(s) => format!(
            "soi iso={} channel={} set={} distance={} send-delta={} gap={}{}",
            s.iso_id,
            s.channel,
            s.seqset,
            s.distance,
            s.send_delta,
            s.gap,
            bits(&[("logged", s.logged), ("host-gap", s.host_gap)])
        ),
        Packet::IsotachMessage(m) => format!(
            "message ts={} source={} dest={} sequum={} {}",
            m.ts,
            m.source,
            m.dest,
            m.sequum,
            match &m.sref {
                Sref::Mem {
                    op,
                    width,
                    addr,
                    value,
                    ref_id,
                } => format!(
                    "{op:?} w{} addr={addr:#x} value={value} ref={ref_id}",
                    *width as u8 * 8
                ),
                Sref::Rmw(r) => format!(
                    "{:?} w{} addr={:#x} arg={} arg2={} ref={} answer={}",
                    r.op,
                    r.width as u8 * 8,
                    r.addr,
                    r.arg,
                    r.arg2,
                    r.ref_id,
                    r.answer
                ),
                Sref::Msg { handler, payload } =>
                    format!("msg handler={handler} payload={}", hex(payload)),
            }
        ),
        Packet::EndOfIsochron(e) => format!("eoi iso={}", e.iso_id),
        Packet::IsochronMarker(m) => format!(
            "marker iso={} source={} ts={} sequum={} crc-xor={:#010x}",
            m.iso_id, m.source, m.ts, m.sequum, m.crc_xor
        ),
        Packet::EopMarker(e) => format!(
            "eop ts={} count={} barrier={:#04b} signals={:#04x} token-kind={:#04x} token-crc={:#010x} sort={:?}{}",
            e.ts,
            e.count,
            e.barrier,
            e.signals,
            e.token_kind,
            e.token_crc,
            e.sort_vector,
            bits(&[
                ("repeat", e.repeat),
                ("reset", e.reset),
                ("end-of-epoch", e.end_of_epoch)
            ])
        ),
        Packet::BarrierSignalMarker(b) => format!(
            "barrier-signal barrier={:#04b} count={} signals={:#04x}{}",
            b.barrier,
            b.barrier_count,
            b.signals,
            bits(&[("reset", b.reset)])
        ),
        Packet::Plain(m) => format!(
            "plain source={} dest={} payload={}",
            m.source,
            m.dest,
            hex(&m.payload)
        ),
    }
}

/// One packet as a JSON object (`kind` plus its fields; `error` and `hex` if undecodable).
pub(crate) fn to_json(bytes: &[u8]) -> Value {
    let p = match Packet::decode(bytes) {
        Ok(p) => p,
        Err(e) => return json!({"kind": "undecodable", "error": e.to_string(), "hex": hex(bytes)}),
    };
    match p {
        Packet::Token(t) => json!({
            "kind": "token", "seq": t.seq.bits(), "generation": t.generation.get(),
            "source_port": t.source_port, "barrier": t.barrier, "signals": t.signals,
            "repeat": t.repeat, "reset": t.reset, "end_of_epoch": t.end_of_epoch,
            "restart": t.restart,
        }),
        Packet::StartOfIsochron(s) => json!({
            "kind": "soi", "iso_id": s.iso_id, "channel": s.channel, "seqset": s.seqset,
            "logged": s.logged, "host_gap": s.host_gap, "gap": s.gap,
            "send_delta": s.send_delta, "distance": s.distance,
        }),
        Packet::IsotachMessage(m) => {
            let sref = match &m.sref {
                Sref::Mem {
                    op,
                    width,
                    addr,
                    value,
                    ref_id,
                } => json!({"op": format!("{op:?}").to_lowercase(), "width_bits": *width as u8 * 8,
                    "addr": addr, "value": value, "ref_id": ref_id}),
                Sref::Rmw(r) => {
                    let func = if let RmwOp::Apply(f) = r.op {
                        Some(f)
                    } else {
                        None
                    };
                    json!({"op": format!("{:?}", r.op.op()).to_lowercase(), "func": func,
                        "width_bits": r.width as u8 * 8, "addr": r.addr, "arg": r.arg,
                        "arg2": r.arg2, "ref_id": r.ref_id, "answer": r.answer})
                }
                Sref::Msg { handler, payload } => {
                    json!({"op": "msg", "handler": handler, "payload": hex(payload)})
                }
            };
            json!({"kind": "message", "ts": m.ts.get(), "source": m.source, "dest": m.dest,
                "sequum": m.sequum, "sref": sref})
        }
        Packet::EndOfIsochron(e) => json!({"kind": "eoi", "iso_id": e.iso_id}),
        Packet::IsochronMarker(m) => json!({
            "kind": "marker", "iso_id": m.iso_id, "source": m.source, "ts": m.ts.get(),
            "sequum": m.sequum, "crc_xor": m.crc_xor,
        }),
        Packet::EopMarker(e) => json!({
            "kind": "eop", "ts": e.ts.get(), "count": e.count, "repeat": e.repeat, "reset": e.reset,
            "end_of_epoch": e.end_of_epoch, "signals": e.signals, "barrier": e.barrier,
            "token_kind": e.token_kind, "token_crc": e.token_crc, "sort_vector": e.sort_vector,
        }),
        Packet::BarrierSignalMarker(b) => json!({
            "kind": "barrier_signal", "barrier": b.barrier, "barrier_count": b.barrier_count,
            "signals": b.signals, "reset": b.reset,
        }),
        Packet::Plain(m) => json!({
            "kind": "plain", "source": m.source, "dest": m.dest, "payload": hex(&m.payload),
        }),
    }
}

/// Prints one packet; `dir` (`in`/`out`) prefixes text lines and is a `dir` key in JSON.
fn print(out: &mut impl Write, dir: Option<&str>, bytes: &[u8], json: bool) -> std::io::Result<()> {
    if json {
        let mut v = to_json(bytes);
        if let (Some(d), Some(o)) = (dir, v.as_object_mut()) {
            o.insert("dir".into(), Value::from(d));
        }
        writeln!(out, "{v}")
    } else {
        match dir {
            Some(d) => writeln!(out, "{d:<3} {}", describe(bytes)),
            None => writeln!(out, "{}", describe(bytes)),
        }
    }
}

fn is_token(bytes: &[u8]) -> bool {
    matches!(
        isotach_proto::packet::peek_kind(bytes),
        Ok(isotach_proto::packet::Kind::Token)
    )
}

// ---------------------------------------------------------------------------------------------
// bounce

fn bounce(a: BounceArgs) -> anyhow::Result<ExitCode> {
    let r = resolve(&a.target, Plays::Tm)?;
    if a.barrier & !BARRIER_MASK != 0 {
        return Err(UsageError(format!(
            "--barrier {:#b}: only bits 0 and 1 exist",
            a.barrier
        ))
        .into());
    }
    if a.payload_max > MSG_PAYLOAD_MAX {
        return Err(UsageError(format!("--payload-max is at most {MSG_PAYLOAD_MAX}")).into());
    }
    let host = a.host_id.or(r.host).unwrap_or(0);
    let switch = a.switch_id.or(r.switch).unwrap_or(0);
    let start = match a.start {
        StartMode::Auto => host != 0,
        StartMode::Yes => true,
        StartMode::No => false,
    };
    with_port!(&r, port => {
    let mut b = TokenBouncer::new(switch);
    if let Some(n) = a.pause_after {
        b.pause_after(n);
    }
    if let Some(k) = a.repeat_every {
        b.repeat_every(k);
    }
    if let Some(k) = a.early_every {
        b.early_every(k);
    }
    if let Some(e) = a.epoch_pulses {
        b.epoch_pulses(e);
    }
    b.echo_barriers(a.echo_barriers);
    let bits_every = a.bits_every.max(1);
    let bits = TokenBits {
        barrier: a.barrier,
        signals: a.signals,
        ..TokenBits::default()
    };
    let mut rng = XorShift::new(a.seed);
    let deadline = deadline(&a.target);
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut started = false;
    let mut wave_seen = 0;
    let mut sequum = 0u64;
    loop {
        port.poll()?;
        if start && !started && port.is_up(0) {
            started = true;
            b.start(b.generation().next());
        }
        while let Some((_, bytes)) = port.recv() {
            if !(a.only_non_tokens && is_token(&bytes)) {
                print(&mut out, Some("in"), &bytes, a.target.json)?;
            }
            b.handle(&bytes);
        }
        // A new wave went out: bits for the next one, and messages of the current pulse.
        if b.waves_sent() != wave_seen {
            wave_seen = b.waves_sent();
            let next = wave_seen + 1;
            if (bits.barrier | bits.signals) != 0 && next.is_multiple_of(bits_every) {
                b.set_bits(next, bits);
            }
            for _ in 0..rng.range(0, a.messages_max) {
                sequum += 1;
                b.send_message(&random_message(
                    &mut rng,
                    host,
                    wave_seen,
                    sequum,
                    a.payload_max,
                ));
            }
        }
        while let Some(bytes) = b.poll() {
            if !(a.only_non_tokens && is_token(&bytes)) {
                print(&mut out, Some("out"), &bytes, a.target.json)?;
            }
            port.send(0, &bytes)?;
        }
        port.poll()?;
        if a.waves
            .is_some_and(|n| b.waves_sent() >= n && b.accepted() >= n)
        {
            flush(&mut port, deadline)?;
            return Ok(ExitCode::SUCCESS);
        }
        if timed_out(deadline) {
            eprintln!(
                "tool bounce: timed out after {} waves sent, {} tokens accepted",
                b.waves_sent(),
                b.accepted()
            );
            return Ok(ExitCode::from(crate::EXIT_FAILED));
        }
        port.wait(Duration::from_millis(5))?;
    }
    })
}

/// An isotach message for `dest` with TS `ts` from a random other host (a `msg` sref with a
/// random payload of 0..=`payload_max` bytes).
fn random_message(
    rng: &mut XorShift,
    dest: HostId,
    ts: u64,
    sequum: u64,
    payload_max: usize,
) -> IsotachMessage {
    let len = rng.range(0, payload_max as u64) as usize;
    let payload = (0..len).map(|_| rng.next_u64() as u8).collect();
    let source = (dest + 1 + rng.below(7) as u16) & 0x7fff;
    let sref = if len == 0 && rng.chance(1, 2) {
        Sref::Mem {
            op: SrefOp::Write,
            width: Width::W64,
            addr: sequum,
            value: ts,
            ref_id: 0,
        }
    } else {
        Sref::Msg {
            handler: rng.below(4) as u16,
            payload,
        }
    };
    IsotachMessage {
        ts: Pulse::new(ts),
        source,
        dest,
        sequum,
        // `TokenBouncer::send_message` stamps its generation.
        generation: Generation::new(0),
        sref,
    }
}

/// Polls until every queued packet was delivered and acknowledged (or the deadline passed).
fn flush<T: Transport>(port: &mut PacketPort<T>, deadline: Option<Instant>) -> anyhow::Result<()> {
    let guard = Instant::now() + Duration::from_secs(10);
    while port.links().queued() > 0 || port.links().core().outstanding() > 0 {
        if timed_out(deadline) || Instant::now() >= guard {
            anyhow::bail!("{} packets not delivered", port.links().queued());
        }
        port.poll()?;
        port.wait(Duration::from_millis(2))?;
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// send

/// Reads hex packet lines; `!` resends the previous packet.
pub(crate) fn read_packets(input: impl BufRead) -> Result<Vec<Vec<u8>>, String> {
    let mut gen_prev: Option<Vec<u8>> = None;
    let mut out = Vec::new();
    for (i, line) in input.lines().enumerate() {
        let line = line.map_err(|e| e.to_string())?;
        let text = line.split('#').next().unwrap_or("").trim();
        if text.is_empty() {
            continue;
        }
        if text == "!" {
            let p = gen_prev
                .clone()
                .ok_or_else(|| format!("line {}: `!` with no previous packet", i + 1))?;
            out.push(p);
            continue;
        }
        let p = parse_hex(text).map_err(|e| format!("line {}: {e}", i + 1))?;
        gen_prev = Some(p.clone());
        out.push(p);
    }
    Ok(out)
}

fn send(a: SendArgs) -> anyhow::Result<ExitCode> {
    let plays = match a.from_host.as_deref() {
        Some(h) => Plays::OtherSiu(h),
        None => Plays::App,
    };
    let r = resolve(&a.target, plays)?;
    let packets = match a.file.as_deref() {
        Some(p) if p.as_os_str() != "-" => {
            let f =
                std::fs::File::open(p).map_err(|e| UsageError(format!("{}: {e}", p.display())))?;
            read_packets(std::io::BufReader::new(f))
        }
        _ => read_packets(std::io::stdin().lock()),
    }
    .map_err(|e| {
        UsageError(format!(
            "{}: {e}",
            a.file.as_deref().unwrap_or("-".as_ref()).display()
        ))
    })?;
    let deadline = deadline(&a.target);
    with_port!(&r, port => {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for p in &packets {
        let mut p = p.clone();
        if let Some(tail) = &a.tail {
            p.extend_from_slice(tail);
        }
        if a.corrupt_crc {
            p = ByteGenerator::corrupt_crc(&p);
        }
        for _ in 0..=a.repeat {
            print(&mut out, Some("out"), &p, a.target.json)?;
            port.send(0, &p)?;
        }
    }
    while !port.is_up(0) {
        if timed_out(deadline) {
            eprintln!("tool send: the SIU at {} never answered", r.siu);
            return Ok(ExitCode::from(crate::EXIT_FAILED));
        }
        port.poll()?;
        port.wait(Duration::from_millis(5))?;
    }
    flush(&mut port, deadline)?;
    if let Some(n) = a.then_recv {
        return receive(&mut port, n, false, a.target.json, deadline, &mut out);
    }
    Ok(ExitCode::SUCCESS)
    })
}

// ---------------------------------------------------------------------------------------------
// recv

fn recv(a: RecvArgs) -> anyhow::Result<ExitCode> {
    let r = resolve(&a.target, Plays::App)?;
    let deadline = deadline(&a.target);
    with_port!(&r, port => {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    receive(
        &mut port,
        a.count.unwrap_or(u64::MAX),
        a.no_eop,
        a.target.json,
        deadline,
        &mut out,
    )
    })
}

fn receive<T: Transport>(
    port: &mut PacketPort<T>,
    count: u64,
    no_eop: bool,
    json: bool,
    deadline: Option<Instant>,
    out: &mut impl Write,
) -> anyhow::Result<ExitCode> {
    let mut got = 0u64;
    while got < count {
        port.poll()?;
        while let Some((_, bytes)) = port.recv() {
            got += 1;
            let eop = matches!(
                isotach_proto::packet::peek_kind(&bytes),
                Ok(isotach_proto::packet::Kind::EopMarker)
            );
            if !(no_eop && eop) {
                print(out, None, &bytes, json)?;
            }
            if got >= count {
                break;
            }
        }
        if got >= count {
            break;
        }
        if timed_out(deadline) {
            eprintln!("tool recv: timed out after {got} packets");
            return Ok(ExitCode::from(crate::EXIT_FAILED));
        }
        port.wait(Duration::from_millis(20))?;
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use isotach_proto::WaveSeq;

    #[test]
    fn hex_lines_and_resend() {
        let text = "# a token\n 0101 00 ff # trailing\n\n!\naa:bb\n";
        let p = read_packets(text.as_bytes()).unwrap();
        assert_eq!(
            p,
            vec![vec![1, 1, 0, 0xff], vec![1, 1, 0, 0xff], vec![0xaa, 0xbb]]
        );
        assert!(read_packets("!\n".as_bytes()).is_err());
        assert!(read_packets("abc\n".as_bytes()).is_err());
    }

    #[test]
    fn describes_and_jsons_a_token() {
        let t = isotach_proto::packet::Token {
            seq: WaveSeq::from_bits(2),
            repeat: true,
            generation: Generation::new(3),
            source_port: 0x8000,
            ..Default::default()
        };
        let b = t.to_bytes();
        let line = describe(&b);
        assert!(line.starts_with("token seq=2 gen=3 port=0x8000"), "{line}");
        assert!(line.ends_with(" repeat"), "{line}");
        let v = to_json(&b);
        assert_eq!(v["kind"], "token");
        assert_eq!(v["seq"], 2);
        assert_eq!(v["repeat"], true);
        assert_eq!(to_json(&[1, 2])["kind"], "undecodable");
    }
}
