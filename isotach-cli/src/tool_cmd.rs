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
use isotach_proto::topology::{HostId, SwitchId};
use isotach_tools::ByteGenerator;
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

mod describe;
mod plot_scale;

use describe::print;

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

// After the macro: `bounce` uses it (macros are in scope from their definition on).
mod bounce;
use bounce::bounce;

fn deadline(t: &Target) -> Option<Instant> {
    t.timeout_s.map(|s| Instant::now() + Duration::from_secs(s))
}

fn timed_out(d: Option<Instant>) -> bool {
    d.is_some_and(|d| Instant::now() >= d)
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
}
