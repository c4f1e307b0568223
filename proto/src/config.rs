//! The cluster configuration (TOML): switches, hosts, trunks, protocol timing and limits.
//!
//! Keys are kebab-case and unknown keys are refused. Every number must lie within its bounds
//! ([`BOUNDS`], tightened by the topology for some keys: [`check_bounds`]); a value outside
//! them is refused, never clamped. Every error names the file, the line and column, and the
//! key. The daemons read the addresses (`[[switch]] listen`, `[[host]] siu` and
//! `app`, and the optional `admin`), the transport (`[transport] kind`, `tag`, and for QUIC the
//! `ca` file and the `certs` directory) and the SMM map file (`map`); the simulator builds the
//! same [`ClusterConfig`] in memory without them. Files named by the config are not read here:
//! `isotach check-config` and the daemons check them.

use crate::topology::{SwitchId, Topology, TopologyError};
use serde::Deserialize;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use thiserror::Error;
use toml::Spanned;

/// Where a value is in the config text (bytes).
type Span = std::ops::Range<usize>;

/// Protocol timing shared by token managers and SIUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Timing {
    /// Token timer: when no token was sent for this long, resend the last two (marked repeat).
    pub token_timeout_us: u64,
    /// Pulses per signal epoch; the token that ends an epoch carries the epoch's signals.
    pub epoch_pulses: u32,
    /// Idle pacing: when no token of a wave said BUSY and no message passed a token manager
    /// during it, the TM sends the next wave this long after the last token arrived instead of
    /// at once (`docs/design.md`, "Idle pacing"). 0 = never pace. At most half of
    /// `token_timeout_us`.
    /// Not written in a config file: [`Timing::default_idle_pace_us`].
    pub idle_pace_us: u64,
}

impl Timing {
    /// The idle pace when none is given: [`IDLE_PACE_US_DEFAULT`], or half the token timeout
    /// if that is shorter (the pace must stay well below the lost-token timer, and a config
    /// written before idle pacing existed, with a short timer, stays valid).
    pub fn default_idle_pace_us(token_timeout_us: u64) -> u64 {
        IDLE_PACE_US_DEFAULT.min(token_timeout_us / 2)
    }
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            token_timeout_us: 5_000,
            epoch_pulses: 64,
            idle_pace_us: IDLE_PACE_US_DEFAULT,
        }
    }
}

/// Limits on every table a token manager or SIU keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case", default)]
pub struct Limits {
    /// Channels an SIU tracks (requirement 27); an isochron naming another is refused.
    pub channels: u8,
    /// Messages one isochron may carry.
    pub isochron_messages_max: u32,
    /// How far ahead of the receive clock an arriving message's TS may be.
    pub pulses_ahead_max: u32,
    /// Packets an SIU or TM queues towards one peer before refusing more input.
    pub queue_packets_max: usize,
    /// An isochron left open by its host longer than this is closed by the SIU.
    pub isochron_open_us_max: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            channels: 4,
            isochron_messages_max: 4096,
            pulses_ahead_max: 64,
            queue_packets_max: 65_536,
            isochron_open_us_max: 1_000_000,
        }
    }
}

// Bounds. Every number a config file can give has a lower and an upper bound, checked when the
// file is read: a value outside them is refused with an error naming the key, the value and the
// allowed range, never clamped or raised. The upper bounds lie far above anything a deployment
// needs; they are there so that a slip of the keyboard (three zeros too many) is an error, not a
// cluster that stalls for an hour, allocates gigabytes or overflows a deadline. Some keys have
// a tighter lower bound that depends on the topology (see [`check_bounds`]). Pulse rates quoted
// below are the ~2 500 pulses/s of a loopback cluster (`docs/bench.md`).

/// `[timing] token-timeout-us`, lower bound: below 0.1 ms the timer fires before a token has
/// crossed even a loopback link (or the node has been scheduled), so an idle cluster would
/// send little but repeats.
pub const TOKEN_TIMEOUT_US_MIN: u64 = 100;
/// `[timing] token-timeout-us`, upper bound (10 s): the AM layer gives up on a request after
/// 10 s without an answer and the link breaks (a new generation recovers it), so a longer
/// timer never gets to repair a lost token; it only stalls logical time for longer.
pub const TOKEN_TIMEOUT_US_MAX: u64 = 10_000_000;
/// `[timing] idle-pace-us` when not written (and the token timeout is above twice it): half the
/// default token timer, the most it allows. An idle cluster pulses about 350 times a second
/// instead of 10 000–20 000, and an idle token manager with 4 SIUs stays under 5 % of a core
/// (each idle wave wakes it several times; at 1000 µs it measured 8 %, `docs/bench.md`).
pub const IDLE_PACE_US_DEFAULT: u64 = 2_500;
/// `[timing] idle-pace-us`, lower bound: 0 turns idle pacing off (waves at full speed always).
pub const IDLE_PACE_US_MIN: u64 = 0;
/// `[timing] idle-pace-us`, upper bound (1 s): an idle cluster then pulses once a second,
/// which already costs nothing measurable; longer only delays what a false idle holds up. It
/// must also be at most half of `token-timeout-us` (see [`check_bounds`]).
pub const IDLE_PACE_US_MAX: u64 = 1_000_000;
/// `[timing] epoch-pulses`, lower bound: an epoch has two pulses at least; it must also exceed
/// the largest logical distance, so signals reach every TM before the epoch's last wave.
pub const EPOCH_PULSES_MIN: u32 = 2;
/// `[timing] epoch-pulses`, upper bound: signals raised in an epoch are delivered at its last
/// pulse, and 65 536 pulses are already ~26 s of logical time: a signal that late is useless.
pub const EPOCH_PULSES_MAX: u32 = 65_536;
/// `[limits] channels`, lower bound: every isochron names a channel.
pub const CHANNELS_MIN: u8 = 1;
/// `[limits] channels`, upper bound: the wire's channel field is one byte (a channel costs an
/// SIU 16 bytes, so nothing smaller is needed).
pub const CHANNELS_MAX: u8 = u8::MAX;
/// `[limits] isochron-messages-max`, lower bound: an isochron carries a message at least.
pub const ISOCHRON_MESSAGES_MAX_MIN: u32 = 1;
/// `[limits] isochron-messages-max`, upper bound (2^20): every message of an isochron carries
/// one TS and is delivered in one pulse; a million messages (1 GiB at 1 KiB each) in one pulse
/// is far beyond any application's atomic step.
pub const ISOCHRON_MESSAGES_MAX_MAX: u32 = 1 << 20;
/// `[limits] pulses-ahead-max`, lower bound: more than twice the smallest logical distance (1).
/// Checked against the topology it must exceed twice the largest logical distance: an
/// isochron's TS is at least `distance` ahead of its sender's sendclock, and its receivers'
/// recvclocks may be up to `distance` behind that sendclock (`SiuError::BeyondWindow`).
pub const PULSES_AHEAD_MAX_MIN: u32 = 3;
/// `[limits] pulses-ahead-max`, upper bound: an SIU keeps a slot per open pulse, and a message
/// 65 536 pulses (~26 s of logical time) ahead comes from a broken sender.
pub const PULSES_AHEAD_MAX_MAX: u32 = 65_536;
/// `[limits] queue-packets-max`, lower bound: one input may put two packets on an SIU's queue.
/// Checked against the topology it must be at least twice the links of the busiest TM: a TM
/// takes input only with room for a reset wave and a token wave on every link.
pub const QUEUE_PACKETS_MAX_MIN: usize = 2;
/// `[limits] queue-packets-max`, upper bound (2^20): a link queues this many fragments of up to
/// 1 KiB towards a slow or lost peer, 1 GiB each; beyond that back-pressure, not memory, must
/// absorb the slowness.
pub const QUEUE_PACKETS_MAX_MAX: usize = 1 << 20;
/// `[limits] isochron-open-us-max`, lower bound (1 ms): shorter would close isochrons while a
/// host that was merely descheduled is still sending them.
pub const ISOCHRON_OPEN_US_MAX_MIN: u64 = 1_000;
/// `[limits] isochron-open-us-max`, upper bound (60 s): an open isochron holds the wave
/// (requirement 26), so it stalls logical time for the whole cluster for up to this long.
pub const ISOCHRON_OPEN_US_MAX_MAX: u64 = 60_000_000;
/// `[transport] tag`, lower bound: 0 matches no message.
pub const TAG_MIN: u64 = 1;
/// `[transport] tag`, upper bound: `u64::MAX` matches every tag.
pub const TAG_MAX: u64 = u64::MAX - 1;

/// A number of the config: its dotted key and its range (inclusive), whatever the topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The dotted key, e.g. `limits.pulses-ahead-max`.
    pub key: &'static str,
    /// The smallest value allowed.
    pub min: u64,
    /// The largest value allowed.
    pub max: u64,
}

/// The bounds of every number in `[timing]`, `[limits]` and `[transport]`.
pub const BOUNDS: [Bound; 9] = [
    Bound {
        key: "timing.token-timeout-us",
        min: TOKEN_TIMEOUT_US_MIN,
        max: TOKEN_TIMEOUT_US_MAX,
    },
    Bound {
        key: "timing.epoch-pulses",
        min: EPOCH_PULSES_MIN as u64,
        max: EPOCH_PULSES_MAX as u64,
    },
    Bound {
        key: "timing.idle-pace-us",
        min: IDLE_PACE_US_MIN,
        max: IDLE_PACE_US_MAX,
    },
    Bound {
        key: "limits.channels",
        min: CHANNELS_MIN as u64,
        max: CHANNELS_MAX as u64,
    },
    Bound {
        key: "limits.isochron-messages-max",
        min: ISOCHRON_MESSAGES_MAX_MIN as u64,
        max: ISOCHRON_MESSAGES_MAX_MAX as u64,
    },
    Bound {
        key: "limits.pulses-ahead-max",
        min: PULSES_AHEAD_MAX_MIN as u64,
        max: PULSES_AHEAD_MAX_MAX as u64,
    },
    Bound {
        key: "limits.queue-packets-max",
        min: QUEUE_PACKETS_MAX_MIN as u64,
        max: QUEUE_PACKETS_MAX_MAX as u64,
    },
    Bound {
        key: "limits.isochron-open-us-max",
        min: ISOCHRON_OPEN_US_MAX_MIN,
        max: ISOCHRON_OPEN_US_MAX_MAX,
    },
    Bound {
        key: "transport.tag",
        min: TAG_MIN,
        max: TAG_MAX,
    },
];

/// The bound of `key` in [`BOUNDS`].
fn bound(key: &str) -> Bound {
    *BOUNDS
        .iter()
        .find(|b| b.key == key)
        .expect("every bounded key is in BOUNDS")
}

/// Why `value` of `key` is refused, when it is outside `min..=max` (`why`: what sets a bound
/// other than the key's own, e.g. the topology).
fn out_of_range(value: impl std::fmt::Display, min: u64, max: u64, why: &str) -> String {
    let why = if why.is_empty() {
        String::new()
    } else {
        format!(" ({why})")
    };
    format!("{value} is out of range: allowed {min}..={max}{why}")
}

/// The range `key` must lie in for `topology`: its [`Bound`], with the lower bound raised where
/// the topology needs more (and then why, else `""`).
fn range_for(key: &str, topology: &Topology) -> (u64, u64, String) {
    let b = bound(key);
    let reach = u64::from(topology.max_distance());
    let (floor, why) = match key {
        "timing.epoch-pulses" => (
            reach + 1,
            format!("more than the largest logical distance, {reach}, so signals can be delivered"),
        ),
        "limits.pulses-ahead-max" => (
            2 * reach + 1,
            format!(
                "more than twice the largest logical distance, {reach}, so an isochron to the \
                 farthest host fits in its receivers' windows"
            ),
        ),
        "limits.queue-packets-max" => {
            let links = (0..topology.switch_count())
                .map(|s| {
                    let s = s as SwitchId;
                    topology.hosts_at(s).count() + topology.switch_neighbours(s).len()
                })
                .max()
                .unwrap_or(0) as u64;
            (
                2 * links,
                format!(
                    "at least twice the links of the busiest TM, {links}: a TM takes input only \
                     with room for a reset wave and a token wave on every link"
                ),
            )
        }
        _ => (0, String::new()),
    };
    if floor > b.min {
        (floor, b.max, why)
    } else {
        (b.min, b.max, String::new())
    }
}

/// Checks timing and limits built in memory (the loader checks them as it reads a file): every
/// value within its [`Bound`], and within the tighter lower bounds the topology sets:
/// `epoch-pulses` above the largest logical distance D, `pulses-ahead-max` above 2·D,
/// `queue-packets-max` at least twice the links of the busiest TM; and `idle-pace-us` (unless
/// 0) at most half of `token-timeout-us`. `Err` gives the dotted key and what is wrong.
pub fn check_bounds(
    timing: &Timing,
    limits: &Limits,
    topology: &Topology,
) -> Result<(), (&'static str, String)> {
    let values = [
        timing.token_timeout_us,
        u64::from(timing.epoch_pulses),
        timing.idle_pace_us,
        u64::from(limits.channels),
        u64::from(limits.isochron_messages_max),
        u64::from(limits.pulses_ahead_max),
        limits.queue_packets_max as u64,
        limits.isochron_open_us_max,
    ];
    for (b, v) in BOUNDS.iter().zip(values) {
        let (min, max, why) = range_for(b.key, topology);
        if !(min..=max).contains(&v) {
            return Err((b.key, out_of_range(v, min, max, &why)));
        }
    }
    check_idle_pace(timing)
}

/// `idle-pace-us` (unless 0) must be below `token-timeout-us`, with room to spare: an idle
/// SIU's lost-token timer runs from its own token, and the TM's next wave reaches it a pace
/// plus the driver's timer granularity (about 1 ms with tokio) and a round trip later. At most
/// half the timer keeps that room (2.5 ms at the default 5 ms), so the timer never fires on a
/// paced wave; closer to it, every idle SIU would resend its tokens each wave.
fn check_idle_pace(timing: &Timing) -> Result<(), (&'static str, String)> {
    let (pace, timeout) = (timing.idle_pace_us, timing.token_timeout_us);
    if pace == 0 || pace <= timeout / 2 {
        return Ok(());
    }
    Err((
        "timing.idle-pace-us",
        format!(
            "{pace} must be below timing.token-timeout-us ({timeout}) by half of it at least \
             (at most {}), so the lost-token timer never fires on a paced wave (a paced wave \
             also waits for the driver's timer granularity and a round trip): lower it, raise \
             token-timeout-us, or set 0 to turn idle pacing off",
            timeout / 2
        ),
    ))
}

/// Which transport carries the SIU↔TM, TM↔TM and SMM↔SIU links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum TransportKind {
    /// Active Messages over UDP (reliable, per-peer FIFO), unauthenticated: for trusted LANs.
    Udp,
    /// Active Messages over QUIC with mutual TLS: every node presents a certificate the
    /// cluster CA signed (`[transport] ca` and `certs`). The default.
    #[default]
    Quic,
}

/// The AM tag of Isotach cluster traffic when `[transport] tag` is not given (the value of
/// `isotach_am::port::DEFAULT_TAG`).
pub const DEFAULT_TAG: u64 = 0x1507_AC40_0000_0001;

/// The `[transport]` table: how every link is carried and authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportConfig {
    /// `"quic"` (default) or `"udp"`.
    pub kind: TransportKind,
    /// The AM tag every port of the cluster uses (`tag`): a message with another tag is
    /// refused by the receiving endpoint. Never 0 (matches nothing) or `u64::MAX` (matches
    /// everything).
    pub tag: u64,
    /// The cluster CA certificate (`ca`, PEM), resolved against the config file's directory.
    pub ca: Option<PathBuf>,
    /// The directory holding every node's `NAME.pem` and `NAME.key` (`certs`), as `isotach
    /// cert issue` writes them, resolved against the config file's directory.
    pub certs: Option<PathBuf>,
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            kind: TransportKind::default(),
            tag: DEFAULT_TAG,
            ca: None,
            certs: None,
        }
    }
}

/// The files a node presents on QUIC links (see [`ClusterConfig::quic_files`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuicFiles {
    /// The cluster CA certificate.
    pub ca: PathBuf,
    /// The node's certificate (`CERTS/NAME.pem`).
    pub cert: PathBuf,
    /// The node's PKCS#8 private key (`CERTS/NAME.key`).
    pub key: PathBuf,
}

/// A tag as written: an integer, or a string holding a decimal or `0x` hexadecimal number.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum TagValue {
    Int(i64),
    Str(String),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawTransport {
    #[serde(default)]
    kind: TransportKind,
    #[serde(default)]
    tag: Option<Spanned<TagValue>>,
    #[serde(default)]
    ca: Option<Spanned<String>>,
    #[serde(default)]
    certs: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct SwitchEntry {
    name: Spanned<String>,
    #[serde(default)]
    listen: Option<Spanned<String>>,
    #[serde(default)]
    admin: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct HostEntry {
    name: Spanned<String>,
    switch: Spanned<String>,
    #[serde(default)]
    siu: Option<Spanned<String>>,
    #[serde(default)]
    app: Option<Spanned<String>>,
    #[serde(default)]
    admin: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct TrunkEntry {
    between: Spanned<[String; 2]>,
}

/// `[timing]` as written: each number with where it is, checked against its bounds before it
/// is narrowed to its type (so `-1` or `300` for a `u8` get the same range error as any other
/// out-of-bounds value).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawTiming {
    #[serde(default)]
    token_timeout_us: Option<Spanned<i64>>,
    #[serde(default)]
    epoch_pulses: Option<Spanned<i64>>,
    #[serde(default)]
    idle_pace_us: Option<Spanned<i64>>,
}

/// `[limits]` as written (see [`RawTiming`]).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawLimits {
    #[serde(default)]
    channels: Option<Spanned<i64>>,
    #[serde(default)]
    isochron_messages_max: Option<Spanned<i64>>,
    #[serde(default)]
    pulses_ahead_max: Option<Spanned<i64>>,
    #[serde(default)]
    queue_packets_max: Option<Spanned<i64>>,
    #[serde(default)]
    isochron_open_us_max: Option<Spanned<i64>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct RawConfig {
    #[serde(default)]
    map: Option<Spanned<String>>,
    #[serde(default)]
    transport: RawTransport,
    #[serde(default)]
    timing: RawTiming,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default, rename = "switch")]
    switches: Vec<SwitchEntry>,
    #[serde(default, rename = "host")]
    hosts: Vec<HostEntry>,
    #[serde(default, rename = "trunk")]
    trunks: Vec<TrunkEntry>,
}

/// A configuration error: where and what.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{file}:{line}:{column}: {key}: {message}")]
pub struct ConfigError {
    /// The file (or `<memory>`).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// The key at fault (dotted), or `-` when the file as a whole is at fault.
    pub key: String,
    /// What is wrong.
    pub message: String,
}

/// Something a valid config says that is probably a mistake: where and what. The daemons
/// start anyway; `isotach check-config` prints it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{file}:{line}:{column}: {key}: {message}")]
pub struct ConfigWarning {
    /// The file (or `<memory>`).
    pub file: String,
    /// 1-based line.
    pub line: usize,
    /// 1-based column.
    pub column: usize,
    /// The key (dotted), e.g. `switch.listen`.
    pub key: String,
    /// The switch or host it is about.
    pub node: String,
    /// The address it names.
    pub addr: SocketAddr,
    /// What is wrong with it.
    pub message: String,
}

/// A node address a daemon needs and the configuration lacks.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{node} has no {key} address")]
pub struct MissingAddr {
    /// The node (`switch `tm0``, `host `h1``).
    pub node: String,
    /// The key that is missing (`listen`, `siu`, `app`).
    pub key: &'static str,
}

/// A validated cluster configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterConfig {
    /// Switch (token manager) names, by id.
    pub switch_names: Vec<String>,
    /// Host names, by id.
    pub host_names: Vec<String>,
    /// The topology built from the names.
    pub topology: Topology,
    /// Protocol timing.
    pub timing: Timing,
    /// Table limits.
    pub limits: Limits,
    /// Where each switch's token manager listens (`[[switch]] listen`), by switch id.
    pub switch_listen: Vec<Option<SocketAddr>>,
    /// Where each host's SIU daemon listens (`[[host]] siu`), by host id.
    pub host_siu: Vec<Option<SocketAddr>>,
    /// Where each host's SMM application listens (`[[host]] app`), by host id.
    pub host_app: Vec<Option<SocketAddr>>,
    /// Where each switch's token manager serves the admin service (`[[switch]] admin`), by
    /// switch id.
    pub switch_admin: Vec<Option<SocketAddr>>,
    /// Where each host's SIU daemon serves the admin service (`[[host]] admin`), by host id.
    pub host_admin: Vec<Option<SocketAddr>>,
    /// The transport of every link.
    pub transport: TransportConfig,
    /// The SMM map file (`map`), resolved against the config file's directory.
    pub map_file: Option<PathBuf>,
}

impl ClusterConfig {
    /// A generated cluster: `hosts` hosts round-robin over `switches` switches in a line.
    pub fn generated(hosts: usize, switches: usize) -> Result<Self, TopologyError> {
        Ok(Self {
            switch_names: (0..switches).map(|s| format!("tm{s}")).collect(),
            host_names: (0..hosts).map(|h| format!("host{h}")).collect(),
            topology: Topology::line(hosts, switches)?,
            timing: Timing::default(),
            limits: Limits::default(),
            switch_listen: vec![None; switches],
            host_siu: vec![None; hosts],
            host_app: vec![None; hosts],
            switch_admin: vec![None; switches],
            host_admin: vec![None; hosts],
            transport: TransportConfig::default(),
            map_file: None,
        })
    }

    /// The switch (token manager) called `name`.
    pub fn switch_id(&self, name: &str) -> Option<SwitchId> {
        let i = self.switch_names.iter().position(|n| n == name)?;
        SwitchId::try_from(i).ok()
    }

    /// The host called `name`.
    pub fn host_id(&self, name: &str) -> Option<crate::topology::HostId> {
        let i = self.host_names.iter().position(|n| n == name)?;
        crate::topology::HostId::try_from(i).ok()
    }

    /// Where switch `switch`'s token manager listens (`[[switch]] listen`).
    pub fn switch_addr(&self, switch: SwitchId) -> Result<SocketAddr, MissingAddr> {
        let i = usize::from(switch);
        self.switch_listen
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| MissingAddr {
                node: format!(
                    "switch `{}`",
                    self.switch_names.get(i).map_or("?", String::as_str)
                ),
                key: "listen",
            })
    }

    /// Where host `host`'s SIU daemon listens (`[[host]] siu`).
    pub fn siu_addr(&self, host: crate::topology::HostId) -> Result<SocketAddr, MissingAddr> {
        self.host_addr(host, &self.host_siu, "siu")
    }

    /// Where host `host`'s application listens (`[[host]] app`).
    pub fn app_addr(&self, host: crate::topology::HostId) -> Result<SocketAddr, MissingAddr> {
        self.host_addr(host, &self.host_app, "app")
    }

    fn host_addr(
        &self,
        host: crate::topology::HostId,
        addrs: &[Option<SocketAddr>],
        key: &'static str,
    ) -> Result<SocketAddr, MissingAddr> {
        let i = usize::from(host);
        addrs.get(i).copied().flatten().ok_or_else(|| MissingAddr {
            node: format!(
                "host `{}`",
                self.host_names.get(i).map_or("?", String::as_str)
            ),
            key,
        })
    }

    /// The CA certificate, certificate and key that node `name` (a switch or host name)
    /// presents on QUIC links: `[transport] ca`, `CERTS/NAME.pem` and `CERTS/NAME.key`. `Err`
    /// gives the key at fault (`transport.ca` or `transport.certs`) and what is wrong.
    pub fn quic_files(&self, name: &str) -> Result<QuicFiles, (&'static str, String)> {
        let missing = |key: &'static str, what: &str| {
            let msg = format!("kind \"quic\" needs {what} (or kind = \"udp\" on a trusted LAN)");
            (key, msg)
        };
        let ca =
            self.transport.ca.clone().ok_or_else(|| {
                missing("transport.ca", "the cluster CA certificate: ca = \"FILE\"")
            })?;
        let certs = self.transport.certs.as_ref().ok_or_else(|| {
            missing(
                "transport.certs",
                "the directory of the nodes' certificates: certs = \"DIR\"",
            )
        })?;
        let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
        if name.is_empty() || name == "ca" || name.starts_with('.') || !name.chars().all(plain) {
            return Err((
                "transport.certs",
                format!(
                    "node name `{name}` cannot name a certificate file (letters, digits, `-`, `_`, `.`; not `ca`)"
                ),
            ));
        }
        Ok(QuicFiles {
            ca,
            cert: certs.join(format!("{name}.pem")),
            key: certs.join(format!("{name}.key")),
        })
    }

    /// Reads and validates a configuration file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        Self::load_checked(path).map(|(c, _)| c)
    }

    /// Reads and validates a configuration file, and says what in it is probably a mistake
    /// (see [`ClusterConfig::parse_checked`]).
    pub fn load_checked(path: &Path) -> Result<(Self, Vec<ConfigWarning>), ConfigError> {
        let file = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            file: file.clone(),
            line: 0,
            column: 0,
            key: "-".into(),
            message: format!("cannot read: {e}"),
        })?;
        let (mut c, warnings) = Self::parse_checked(&text, &file)?;
        // Relative paths are relative to the config file, not to the working directory.
        let base = path.parent().unwrap_or(Path::new(""));
        let resolve = |p: PathBuf| if p.is_relative() { base.join(p) } else { p };
        c.map_file = c.map_file.take().map(resolve);
        c.transport.ca = c.transport.ca.take().map(resolve);
        c.transport.certs = c.transport.certs.take().map(resolve);
        Ok((c, warnings))
    }

    /// Parses and validates configuration text; `file` names it in errors.
    pub fn parse(text: &str, file: &str) -> Result<Self, ConfigError> {
        Self::parse_checked(text, file).map(|(c, _)| c)
    }

    /// Parses and validates configuration text, and says what in it is probably a mistake:
    /// a daemon, application or admin service that would listen on an unspecified address
    /// (`0.0.0.0` or `::`).
    pub fn parse_checked(
        text: &str,
        file: &str,
    ) -> Result<(Self, Vec<ConfigWarning>), ConfigError> {
        let err = |span: Option<Span>, key: &str, message: String| {
            let (line, column) = span.map_or((1, 1), |s| line_column(text, s.start));
            ConfigError {
                file: file.to_string(),
                line,
                column,
                key: key.to_string(),
                message,
            }
        };
        let raw: RawConfig = toml::from_str(text).map_err(|e| {
            let key = key_of(&e);
            err(e.span(), &key, e.message().to_string())
        })?;
        let mut switch_ids: HashMap<&str, SwitchId> = HashMap::new();
        for (i, s) in raw.switches.iter().enumerate() {
            if switch_ids.insert(s.name.get_ref(), i as SwitchId).is_some() {
                return Err(err(
                    Some(s.name.span()),
                    "switch.name",
                    "duplicate switch name".into(),
                ));
            }
        }
        let mut host_names = HashMap::new();
        let mut host_switch = Vec::new();
        for h in &raw.hosts {
            if host_names.insert(h.name.get_ref().as_str(), ()).is_some() {
                return Err(err(
                    Some(h.name.span()),
                    "host.name",
                    "duplicate host name".into(),
                ));
            }
            let Some(&s) = switch_ids.get(h.switch.get_ref().as_str()) else {
                let msg = format!("no switch named `{}`", h.switch.get_ref());
                return Err(err(Some(h.switch.span()), "host.switch", msg));
            };
            host_switch.push(s);
        }
        let mut trunks = Vec::new();
        for t in &raw.trunks {
            let [a, b] = t.between.get_ref();
            let ends = (switch_ids.get(a.as_str()), switch_ids.get(b.as_str()));
            let (Some(&a), Some(&b)) = ends else {
                let msg = format!("trunk between `{a}` and `{b}` names an unknown switch");
                return Err(err(Some(t.between.span()), "trunk.between", msg));
            };
            trunks.push((a, b));
        }
        let addr =
            |v: &Option<Spanned<String>>, key: &str| -> Result<Option<SocketAddr>, ConfigError> {
                let Some(v) = v else { return Ok(None) };
                v.get_ref().parse::<SocketAddr>().map(Some).map_err(|_| {
                    let msg = format!("`{}` is not an IP:port socket address", v.get_ref());
                    err(Some(v.span()), key, msg)
                })
            };
        let (mut switch_listen, mut switch_admin) = (Vec::new(), Vec::new());
        for s in &raw.switches {
            switch_listen.push(addr(&s.listen, "switch.listen")?);
            switch_admin.push(addr(&s.admin, "switch.admin")?);
        }
        let (mut host_siu, mut host_app, mut host_admin) = (Vec::new(), Vec::new(), Vec::new());
        for h in &raw.hosts {
            host_siu.push(addr(&h.siu, "host.siu")?);
            host_app.push(addr(&h.app, "host.app")?);
            host_admin.push(addr(&h.admin, "host.admin")?);
        }
        let mut warnings = Vec::new();
        let mut warn = |node: &Spanned<String>, v: &Option<Spanned<String>>, key: &str, a| {
            if let (Some(v), Some(addr)) = (v, a)
                && let Some(message) = unspecified(node.get_ref(), key, addr)
            {
                let (line, column) = line_column(text, v.span().start);
                warnings.push(ConfigWarning {
                    file: file.to_string(),
                    line,
                    column,
                    key: key.to_string(),
                    node: node.get_ref().clone(),
                    addr,
                    message,
                });
            }
        };
        for (i, s) in raw.switches.iter().enumerate() {
            warn(&s.name, &s.listen, "switch.listen", switch_listen[i]);
            warn(&s.name, &s.admin, "switch.admin", switch_admin[i]);
        }
        for (i, h) in raw.hosts.iter().enumerate() {
            warn(&h.name, &h.siu, "host.siu", host_siu[i]);
            warn(&h.name, &h.app, "host.app", host_app[i]);
            warn(&h.name, &h.admin, "host.admin", host_admin[i]);
        }
        check_unique_addrs(&raw, &switch_listen, &host_siu, &host_app)
            .map_err(|(span, key, msg)| err(Some(span), key, msg))?;
        check_unique_admin(&raw, &switch_admin, &host_admin)
            .map_err(|(span, key, msg)| err(Some(span), key, msg))?;
        let transport =
            transport(&raw.transport).map_err(|(span, key, msg)| err(Some(span), key, msg))?;
        let map_file = match &raw.map {
            Some(m) if m.get_ref().trim().is_empty() => {
                return Err(err(Some(m.span()), "map", "empty path".into()));
            }
            Some(m) => Some(PathBuf::from(m.get_ref())),
            None => None,
        };
        let topology = Topology::new(raw.switches.len(), host_switch, trunks)
            .map_err(|e| err(None, "-", e.to_string()))?;
        let (timing, limits) =
            timing_limits(&raw, &topology).map_err(|(span, key, msg)| err(Some(span), key, msg))?;
        check_bounds(&timing, &limits, &topology)
            .map_err(|(key, msg)| err(span_of(&raw, key), key, msg))?;
        let config = Self {
            switch_names: raw
                .switches
                .iter()
                .map(|s| s.name.get_ref().clone())
                .collect(),
            host_names: raw.hosts.iter().map(|h| h.name.get_ref().clone()).collect(),
            topology,
            timing,
            limits,
            switch_listen,
            host_siu,
            host_app,
            switch_admin,
            host_admin,
            transport,
            map_file,
        };
        Ok((config, warnings))
    }
}

/// Why `node`'s `key` should not be the unspecified address `addr`, if it is one.
fn unspecified(node: &str, key: &str, addr: SocketAddr) -> Option<String> {
    if !addr.ip().is_unspecified() {
        return None;
    }
    let (kind, what) = key.split_once('.').unwrap_or(("", key));
    Some(if what == "admin" {
        format!(
            "{kind} `{node}` would serve its admin service on every interface ({addr}): it has \
             no authentication (anyone who reaches it can stop the daemon); keep it on loopback"
        )
    } else {
        format!(
            "{kind} `{node}` would listen on every interface ({addr}): peers send to the \
             configured address and drop packets that come from any other, so name the \
             address peers reach it at"
        )
    })
}

/// No two daemons or applications may be configured to listen on the same address.
fn check_unique_addrs(
    raw: &RawConfig,
    switch_listen: &[Option<SocketAddr>],
    host_siu: &[Option<SocketAddr>],
    host_app: &[Option<SocketAddr>],
) -> Result<(), (Span, &'static str, String)> {
    let mut seen: HashMap<SocketAddr, ()> = HashMap::new();
    let switches = raw.switches.iter().zip(switch_listen);
    let entries = switches
        .filter_map(|(s, a)| Some((s.listen.as_ref()?.span(), "switch.listen", (*a)?)))
        .chain(
            raw.hosts
                .iter()
                .zip(host_siu)
                .filter_map(|(h, a)| Some((h.siu.as_ref()?.span(), "host.siu", (*a)?))),
        )
        .chain(
            raw.hosts
                .iter()
                .zip(host_app)
                .filter_map(|(h, a)| Some((h.app.as_ref()?.span(), "host.app", (*a)?))),
        );
    for (span, key, a) in entries {
        if a.port() != 0 && seen.insert(a, ()).is_some() {
            return Err((span, key, format!("address {a} is used twice")));
        }
    }
    Ok(())
}

/// No two daemons may be configured to serve the admin service on the same address (TCP; the
/// link addresses are UDP, so an admin address may equal one of them).
fn check_unique_admin(
    raw: &RawConfig,
    switch_admin: &[Option<SocketAddr>],
    host_admin: &[Option<SocketAddr>],
) -> Result<(), (Span, &'static str, String)> {
    let mut seen: HashMap<SocketAddr, ()> = HashMap::new();
    let entries = raw
        .switches
        .iter()
        .zip(switch_admin)
        .filter_map(|(s, a)| Some((s.admin.as_ref()?.span(), "switch.admin", (*a)?)))
        .chain(
            raw.hosts
                .iter()
                .zip(host_admin)
                .filter_map(|(h, a)| Some((h.admin.as_ref()?.span(), "host.admin", (*a)?))),
        );
    for (span, key, a) in entries {
        if a.port() != 0 && seen.insert(a, ()).is_some() {
            return Err((span, key, format!("admin address {a} is used twice")));
        }
    }
    Ok(())
}

/// Parses a tag: an integer, or a string with a decimal or `0x` hexadecimal number (`_`
/// between digits allowed).
fn parse_tag(v: &TagValue) -> Result<u64, String> {
    let n = match v {
        TagValue::Int(i) => {
            u64::try_from(*i).map_err(|_| out_of_range(i, TAG_MIN, TAG_MAX, "negative"))?
        }
        TagValue::Str(s) => {
            let t = s.trim().replace('_', "");
            let parsed = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => t.parse::<u64>(),
            };
            parsed.map_err(|_| {
                format!("`{s}` is not a 64-bit number (decimal, or hexadecimal with 0x)")
            })?
        }
    };
    match n {
        TAG_MIN..=TAG_MAX => Ok(n),
        0 => Err(out_of_range(n, TAG_MIN, TAG_MAX, "0 matches no message")),
        _ => Err(out_of_range(
            format_args!("{n:#x}"),
            TAG_MIN,
            TAG_MAX,
            "0xffffffffffffffff matches every tag",
        )),
    }
}

/// The `[transport]` table, checked.
fn transport(raw: &RawTransport) -> Result<TransportConfig, (Span, &'static str, String)> {
    let tag = match &raw.tag {
        None => DEFAULT_TAG,
        Some(t) => parse_tag(t.get_ref()).map_err(|m| (t.span(), "transport.tag", m))?,
    };
    let path = |v: &Option<Spanned<String>>, key: &'static str| match v {
        Some(p) if p.get_ref().trim().is_empty() => Err((p.span(), key, "empty path".into())),
        Some(p) if p.get_ref().starts_with('~') => Err((
            p.span(),
            key,
            "`~` is not expanded: write an absolute path or one relative to this config file"
                .into(),
        )),
        Some(p) => Ok(Some(PathBuf::from(p.get_ref()))),
        None => Ok(None),
    };
    Ok(TransportConfig {
        kind: raw.kind,
        tag,
        ca: path(&raw.ca, "transport.ca")?,
        certs: path(&raw.certs, "transport.certs")?,
    })
}

/// The numbers of `[timing]` and `[limits]` as written, each within its range for `topology`
/// (see [`check_bounds`]; defaults for those not given, which [`check_bounds`] then checks).
/// `Err` gives where the value is, its key and what is wrong.
fn timing_limits(
    raw: &RawConfig,
    topology: &Topology,
) -> Result<(Timing, Limits), (Span, &'static str, String)> {
    let get = |v: &Option<Spanned<i64>>, key: &'static str, default: u64| {
        let Some(v) = v else { return Ok(default) };
        let (min, max, why) = range_for(key, topology);
        u64::try_from(*v.get_ref())
            .ok()
            .filter(|n| (min..=max).contains(n))
            .ok_or_else(|| (v.span(), key, out_of_range(v.get_ref(), min, max, &why)))
    };
    // Every bound fits its field's type.
    fn narrow<T: TryFrom<u64>>(n: u64) -> T {
        T::try_from(n).unwrap_or_else(|_| unreachable!("bounds fit their types"))
    }
    let (t, l, dt, dl) = (
        &raw.timing,
        &raw.limits,
        Timing::default(),
        Limits::default(),
    );
    let timing = Timing {
        token_timeout_us: get(
            &t.token_timeout_us,
            "timing.token-timeout-us",
            dt.token_timeout_us,
        )?,
        epoch_pulses: narrow(get(
            &t.epoch_pulses,
            "timing.epoch-pulses",
            dt.epoch_pulses.into(),
        )?),
        idle_pace_us: 0,
    };
    let timing = Timing {
        idle_pace_us: get(
            &t.idle_pace_us,
            "timing.idle-pace-us",
            Timing::default_idle_pace_us(timing.token_timeout_us),
        )?,
        ..timing
    };
    let limits = Limits {
        channels: narrow(get(&l.channels, "limits.channels", dl.channels.into())?),
        isochron_messages_max: narrow(get(
            &l.isochron_messages_max,
            "limits.isochron-messages-max",
            dl.isochron_messages_max.into(),
        )?),
        pulses_ahead_max: narrow(get(
            &l.pulses_ahead_max,
            "limits.pulses-ahead-max",
            dl.pulses_ahead_max.into(),
        )?),
        queue_packets_max: narrow(get(
            &l.queue_packets_max,
            "limits.queue-packets-max",
            dl.queue_packets_max as u64,
        )?),
        isochron_open_us_max: get(
            &l.isochron_open_us_max,
            "limits.isochron-open-us-max",
            dl.isochron_open_us_max,
        )?,
    };
    Ok((timing, limits))
}

/// Where `key` (of `[timing]` or `[limits]`) is written, if it is.
fn span_of(raw: &RawConfig, key: &str) -> Option<Span> {
    let (t, l) = (&raw.timing, &raw.limits);
    let v = match key {
        "timing.token-timeout-us" => &t.token_timeout_us,
        "timing.epoch-pulses" => &t.epoch_pulses,
        "timing.idle-pace-us" => &t.idle_pace_us,
        "limits.channels" => &l.channels,
        "limits.isochron-messages-max" => &l.isochron_messages_max,
        "limits.pulses-ahead-max" => &l.pulses_ahead_max,
        "limits.queue-packets-max" => &l.queue_packets_max,
        "limits.isochron-open-us-max" => &l.isochron_open_us_max,
        _ => return None,
    };
    v.as_ref().map(Spanned::span)
}

/// 1-based line and column of byte `offset` in `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rfind('\n')
        .map_or(before.len(), |nl| before.len() - nl - 1)
        + 1;
    (line, column)
}

/// The dotted key a deserialization error is about: the path of tables (and arrays of
/// tables) toml was in, plus the field an "unknown field `X`" or "missing field `X`" message
/// names (`switch.lisen`, `transport.kind`, `host.name`); `-` when the error is not about a
/// key (a syntax error).
fn key_of(e: &toml::de::Error) -> String {
    // toml keeps the path private and prints it as a last line "in `a.b`" when it has no
    // input to quote.
    let mut bare = e.clone();
    bare.set_input(None);
    let shown = bare.to_string();
    let path = shown
        .lines()
        .next_back()
        .and_then(|l| l.strip_prefix("in `")?.strip_suffix('`'))
        .unwrap_or("");
    let message = e.message();
    let field = ["unknown field `", "missing field `"]
        .iter()
        .find_map(|p| message.strip_prefix(p)?.split('`').next());
    match (path, field) {
        ("", Some(f)) => f.to_string(),
        (p, Some(f)) => format!("{p}.{f}"),
        ("", None) => "-".to_string(),
        (p, None) => p.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
[timing]
token-timeout-us = 2000

[[switch]]
name = "tm0"
[[switch]]
name = "tm1"

[[host]]
name = "alpha"
switch = "tm0"
[[host]]
name = "beta"
switch = "tm1"

[[trunk]]
between = ["tm0", "tm1"]
"#;

    #[test]
    fn good_config_builds_a_topology() {
        let c = ClusterConfig::parse(GOOD, "good.toml").unwrap();
        assert_eq!(c.host_names, ["alpha", "beta"]);
        assert_eq!(c.timing.token_timeout_us, 2000);
        assert_eq!(c.timing.epoch_pulses, Timing::default().epoch_pulses);
        assert_eq!(c.topology.distance(0, 1), 2);
    }

    #[test]
    fn unknown_key_names_file_line_and_key() {
        let text = GOOD.replace("token-timeout-us", "token-timeout-ms");
        let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
        assert_eq!(
            (e.file.as_str(), e.line, e.key.as_str()),
            ("c.toml", 3, "timing.token-timeout-ms")
        );
        assert!(e.to_string().starts_with("c.toml:3:"), "{e}");
    }

    #[test]
    fn unknown_keys_are_named_by_their_dotted_path() {
        // (text, line, column, key): arrays of tables, tables, dotted keys, inline tables,
        // sub-tables, the top level.
        let cases = [
            (
                GOOD.replace("name = \"tm1\"", "name = \"tm1\"\nlisen = \"x\""),
                9,
                1,
                "switch.lisen",
            ),
            (
                GOOD.replace("[timing]", "[timing]\nbogus = 1"),
                3,
                1,
                "timing.bogus",
            ),
            (format!("limits.bogus = 1\n{GOOD}"), 1, 8, "limits.bogus"),
            (
                format!("transport = {{ kind = \"udp\", colour = 1 }}\n{GOOD}"),
                1,
                29,
                "transport.colour",
            ),
            (
                format!("{GOOD}[transport.extra]\nx = 1\n"),
                19,
                12,
                "transport.extra",
            ),
            (
                format!("{GOOD}[[host]]\nname = \"g\"\nswitch = \"tm0\"\nsui = \"x\"\n"),
                22,
                1,
                "host.sui",
            ),
            (format!("mapp = \"m\"\n{GOOD}"), 1, 1, "mapp"),
        ];
        for (text, line, column, key) in cases {
            let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
            assert_eq!(
                (e.line, e.column, e.key.as_str()),
                (line, column, key),
                "{e}"
            );
            assert!(
                e.to_string()
                    .starts_with(&format!("c.toml:{line}:{column}: {key}: unknown field")),
                "{e}"
            );
        }
    }

    #[test]
    fn missing_and_mistyped_values_are_named_by_their_dotted_path() {
        let e = ClusterConfig::parse(&format!("{GOOD}[[switch]]\n"), "c.toml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (19, "switch.name"), "{e}");
        assert!(e.message.contains("missing field"), "{e}");
        let text = GOOD.replace("name = \"beta\"", "name = 7");
        let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (14, "host.name"), "{e}");
        let text = GOOD.replace("token-timeout-us = 2000", "token-timeout-us = \"fast\"");
        let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
        assert_eq!(
            (e.line, e.key.as_str()),
            (3, "timing.token-timeout-us"),
            "{e}"
        );
        // A syntax error is not about a key.
        let e = ClusterConfig::parse("[[switch]\n", "c.toml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (1, "-"), "{e}");
    }

    #[test]
    fn unknown_switch_names_the_host_line() {
        let text = GOOD.replace("switch = \"tm1\"", "switch = \"tm9\"");
        let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (15, "host.switch"), "{e}");
        assert!(e.message.contains("tm9"));
    }

    #[test]
    fn disconnected_topology_is_refused() {
        let text = GOOD.replace(
            "between = [\"tm0\", \"tm1\"]",
            "between = [\"tm0\", \"tm0\"]",
        );
        let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
        assert!(e.message.contains("trunk"), "{e}");
    }

    #[test]
    fn epoch_shorter_than_the_network_is_refused() {
        let text = GOOD.replace("token-timeout-us = 2000", "epoch-pulses = 2");
        let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
        assert_eq!(e.key, "timing.epoch-pulses", "{e}");
    }

    const ADDRS: &str = r#"
map = "forks.map"

[transport]
kind = "udp"

[[switch]]
name = "tm0"
listen = "127.0.0.1:7000"

[[host]]
name = "alpha"
switch = "tm0"
siu = "127.0.0.1:7100"
app = "127.0.0.1:7200"
[[host]]
name = "beta"
switch = "tm0"
"#;

    #[test]
    fn addresses_transport_and_map_are_read() {
        let c = ClusterConfig::parse(ADDRS, "a.toml").unwrap();
        assert_eq!(c.switch_listen, [Some("127.0.0.1:7000".parse().unwrap())]);
        assert_eq!(c.host_siu[0], Some("127.0.0.1:7100".parse().unwrap()));
        assert_eq!(c.host_app, [Some("127.0.0.1:7200".parse().unwrap()), None]);
        assert_eq!(c.transport.kind, TransportKind::Udp);
        assert_eq!(c.map_file, Some(PathBuf::from("forks.map")));
        assert_eq!((c.switch_id("tm0"), c.host_id("beta")), (Some(0), Some(1)));
        assert_eq!(c.host_id("zeta"), None);
    }

    #[test]
    fn bad_address_names_line_and_key() {
        let text = ADDRS.replace("127.0.0.1:7100", "localhost");
        let e = ClusterConfig::parse(&text, "a.toml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (14, "host.siu"), "{e}");
        assert!(e.to_string().starts_with("a.toml:14:"), "{e}");
    }

    #[test]
    fn duplicate_address_is_refused() {
        let text = ADDRS.replace("127.0.0.1:7200", "127.0.0.1:7000");
        let e = ClusterConfig::parse(&text, "a.toml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (15, "host.app"), "{e}");
    }

    #[test]
    fn unknown_transport_kind_is_refused() {
        let text = ADDRS.replace("kind = \"udp\"", "kind = \"tcp\"");
        let e = ClusterConfig::parse(&text, "a.toml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (5, "transport.kind"), "{e}");
        assert!(e.message.contains("tcp"), "{e}");
    }

    #[test]
    fn unknown_host_key_is_refused() {
        let text = ADDRS.replace("app = ", "application = ");
        let e = ClusterConfig::parse(&text, "a.toml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (15, "host.application"), "{e}");
    }

    #[test]
    fn transport_defaults_to_quic_with_the_default_tag() {
        let c = ClusterConfig::parse(GOOD, "c.toml").unwrap();
        assert_eq!(c.transport, TransportConfig::default());
        assert_eq!(c.transport.kind, TransportKind::Quic);
        assert_eq!(c.transport.tag, DEFAULT_TAG);
        let (key, msg) = c.quic_files("alpha").unwrap_err();
        assert_eq!(key, "transport.ca");
        assert!(msg.contains("udp"), "{msg}");
    }

    const QUIC: &str = r#"
[transport]
kind = "quic"
tag = "0x1507_ac40_0000_0002"
ca = "pki/ca.pem"
certs = "pki"

[[switch]]
name = "tm0"
listen = "127.0.0.1:7000"
admin = "127.0.0.1:7070"

[[host]]
name = "alpha"
switch = "tm0"
siu = "127.0.0.1:7100"
app = "127.0.0.1:7200"
admin = "127.0.0.1:7071"
[[host]]
name = "beta"
switch = "tm0"
"#;

    #[test]
    fn quic_keys_tag_and_admin_addresses_are_read() {
        let c = ClusterConfig::parse(QUIC, "q.toml").unwrap();
        assert_eq!(c.transport.kind, TransportKind::Quic);
        assert_eq!(c.transport.tag, 0x1507_AC40_0000_0002);
        assert_eq!(c.transport.ca, Some(PathBuf::from("pki/ca.pem")));
        let f = c.quic_files("alpha").unwrap();
        assert_eq!(f.cert, PathBuf::from("pki/alpha.pem"));
        assert_eq!(f.key, PathBuf::from("pki/alpha.key"));
        assert_eq!(c.switch_admin, [Some("127.0.0.1:7070".parse().unwrap())]);
        assert_eq!(
            c.host_admin,
            [Some("127.0.0.1:7071".parse().unwrap()), None]
        );
        // A node name that is not a plain file name cannot name a certificate.
        assert_eq!(c.quic_files("../x").unwrap_err().0, "transport.certs");
        assert_eq!(c.quic_files("ca").unwrap_err().0, "transport.certs");
    }

    #[test]
    fn quic_paths_are_relative_to_the_config_file() {
        let dir = std::env::temp_dir().join(format!("isotach-proto-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("q.toml");
        std::fs::write(&file, QUIC).unwrap();
        let c = ClusterConfig::load(&file).unwrap();
        assert_eq!(c.transport.ca, Some(dir.join("pki/ca.pem")));
        assert_eq!(c.quic_files("tm0").unwrap().key, dir.join("pki/tm0.key"));
        // Absolute paths are taken as they are.
        let elsewhere = std::env::temp_dir().join("isotach-elsewhere/pki");
        let text = QUIC
            .replace("\"pki/ca.pem\"", &format!("{:?}", elsewhere.join("ca.pem")))
            .replace("\"pki\"", &format!("{elsewhere:?}"));
        std::fs::write(&file, text).unwrap();
        let c = ClusterConfig::load(&file).unwrap();
        assert_eq!(c.transport.ca, Some(elsewhere.join("ca.pem")));
        assert_eq!(c.quic_files("tm0").unwrap().key, elsewhere.join("tm0.key"));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn tags_parse_as_integers_decimal_or_hex_strings() {
        for (v, want) in [
            ("7", 7u64),
            ("\"42\"", 42),
            ("\"0xFF\"", 255),
            ("\"0x1507_AC40_0000_0001\"", DEFAULT_TAG),
            ("\"18446744073709551614\"", u64::MAX - 1),
        ] {
            let text = QUIC.replace("\"0x1507_ac40_0000_0002\"", v);
            let c = ClusterConfig::parse(&text, "q.toml").unwrap_or_else(|e| panic!("{v}: {e}"));
            assert_eq!(c.transport.tag, want, "{v}");
        }
        for v in [
            "0",
            "-1",
            "\"0x\"",
            "\"zz\"",
            "\"0x1_0000_0000_0000_0000\"",
            "\"0xffffffffffffffff\"",
            "true",
        ] {
            let text = QUIC.replace("\"0x1507_ac40_0000_0002\"", v);
            let e = ClusterConfig::parse(&text, "q.toml").unwrap_err();
            assert_eq!((e.line, e.key.as_str()), (4, "transport.tag"), "{v}: {e}");
        }
    }

    #[test]
    fn bad_quic_keys_name_line_and_key() {
        let e = ClusterConfig::parse(&QUIC.replace("\"pki\"", "\" \""), "q.toml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (6, "transport.certs"), "{e}");
        let text = QUIC.replace("\"pki/ca.pem\"", "\"~/.isotach/pki/ca.pem\"");
        let e = ClusterConfig::parse(&text, "q.toml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (5, "transport.ca"), "{e}");
        assert!(e.message.contains("absolute path"), "{e}");
        let e = ClusterConfig::parse(&QUIC.replace("ca = ", "cert-authority = "), "q.toml")
            .unwrap_err();
        assert_eq!(
            (e.line, e.key.as_str()),
            (5, "transport.cert-authority"),
            "{e}"
        );
    }

    #[test]
    fn bad_or_duplicate_admin_address_is_refused() {
        let text = QUIC.replace("127.0.0.1:7071", "nowhere");
        let e = ClusterConfig::parse(&text, "q.toml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (18, "host.admin"), "{e}");
        let text = QUIC.replace("127.0.0.1:7071", "127.0.0.1:7070");
        let e = ClusterConfig::parse(&text, "q.toml").unwrap_err();
        assert_eq!((e.line, e.key.as_str()), (18, "host.admin"), "{e}");
        // Admin is TCP: it may share an address with a UDP link.
        let text = QUIC.replace("127.0.0.1:7071", "127.0.0.1:7100");
        ClusterConfig::parse(&text, "q.toml").unwrap();
    }

    #[test]
    fn unspecified_addresses_are_warned_about_naming_node_and_key() {
        let (_, w) = ClusterConfig::parse_checked(QUIC, "q.toml").unwrap();
        assert!(w.is_empty(), "{w:?}");
        let text = QUIC
            .replace("127.0.0.1:7000", "0.0.0.0:7000")
            .replace("127.0.0.1:7200", "[::]:7200")
            .replace("127.0.0.1:7071", "0.0.0.0:7071");
        let (c, w) = ClusterConfig::parse_checked(&text, "q.toml").unwrap();
        assert_eq!(c, ClusterConfig::parse(&text, "q.toml").unwrap());
        let got: Vec<_> = w
            .iter()
            .map(|w| (w.line, w.key.as_str(), w.node.as_str(), w.addr.to_string()))
            .collect();
        assert_eq!(
            got,
            [
                (10, "switch.listen", "tm0", "0.0.0.0:7000".to_string()),
                (17, "host.app", "alpha", "[::]:7200".to_string()),
                (18, "host.admin", "alpha", "0.0.0.0:7071".to_string()),
            ]
        );
        let first = w[0].to_string();
        assert!(
            first.starts_with(
                "q.toml:10:10: switch.listen: switch `tm0` would listen on every interface"
            ),
            "{first}"
        );
        assert!(w[2].message.contains("no authentication"), "{}", w[2]);
    }

    /// One switch, one host: the largest logical distance is 1 and the TM has one link, so the
    /// topology sets no bound tighter than [`BOUNDS`].
    const TINY: &str = "[[switch]]\nname = \"tm0\"\n[[host]]\nname = \"h\"\nswitch = \"tm0\"\n";

    /// `key = value` in its table, on line 2, before [`TINY`]. With `idle-pace-us` the token
    /// timeout is the largest allowed, so every pace within its own bounds is below it.
    fn with(key: &str, value: &str) -> String {
        let (table, name) = key.split_once('.').unwrap();
        let timeout = if key == "timing.idle-pace-us" {
            format!("token-timeout-us = {TOKEN_TIMEOUT_US_MAX}\n")
        } else {
            String::new()
        };
        format!("[{table}]\n{name} = {value}\n{timeout}{TINY}")
    }

    #[test]
    fn every_bound_admits_its_range_and_refuses_one_beyond_naming_key_value_and_range() {
        assert_eq!(
            BOUNDS.map(|b| b.key),
            [
                "timing.token-timeout-us",
                "timing.epoch-pulses",
                "timing.idle-pace-us",
                "limits.channels",
                "limits.isochron-messages-max",
                "limits.pulses-ahead-max",
                "limits.queue-packets-max",
                "limits.isochron-open-us-max",
                "transport.tag",
            ]
        );
        for b in BOUNDS {
            // Only idle pacing has a meaningful 0 (off).
            assert!(
                (b.min >= 1 || b.key == "timing.idle-pace-us") && b.min < b.max,
                "{b:?}"
            );
            // Tags beyond i64 are written as strings.
            let lit = |v: u64| match i64::try_from(v) {
                Ok(v) if b.key != "transport.tag" => v.to_string(),
                _ => format!("\"{v}\""),
            };
            for v in [b.min, b.max] {
                let c = ClusterConfig::parse(&with(b.key, &lit(v)), "b.toml")
                    .unwrap_or_else(|e| panic!("{}: {v}: {e}", b.key));
                let got = match b.key {
                    "timing.token-timeout-us" => c.timing.token_timeout_us,
                    "timing.epoch-pulses" => u64::from(c.timing.epoch_pulses),
                    "timing.idle-pace-us" => c.timing.idle_pace_us,
                    "limits.channels" => u64::from(c.limits.channels),
                    "limits.isochron-messages-max" => u64::from(c.limits.isochron_messages_max),
                    "limits.pulses-ahead-max" => u64::from(c.limits.pulses_ahead_max),
                    "limits.queue-packets-max" => c.limits.queue_packets_max as u64,
                    "limits.isochron-open-us-max" => c.limits.isochron_open_us_max,
                    _ => c.transport.tag,
                };
                assert_eq!(got, v, "{} taken as written", b.key);
            }
            // Below 0 is a negative literal (checked in the next test).
            for v in b.min.checked_sub(1).into_iter().chain([b.max + 1]) {
                let e = ClusterConfig::parse(&with(b.key, &lit(v)), "b.toml").unwrap_err();
                // The value, after `name = `.
                let column = b.key.split_once('.').unwrap().1.len() + 4;
                assert_eq!(
                    (e.line, e.column, e.key.as_str()),
                    (2, column, b.key),
                    "{e}"
                );
                let (value, range) = (v.to_string(), format!("allowed {}..={}", b.min, b.max));
                let hex = format!("{v:#x}");
                assert!(
                    (e.message.contains(&value) || e.message.contains(&hex))
                        && e.message.contains(&range),
                    "{e}"
                );
                assert!(e.to_string().starts_with("b.toml:2:"), "{e}");
            }
        }
    }

    #[test]
    fn negative_and_huge_values_get_the_range_error_too() {
        for (key, v) in [
            ("limits.channels", "-1"),
            ("limits.channels", "300"),
            ("limits.queue-packets-max", "9223372036854775807"),
            ("timing.token-timeout-us", "-5000"),
            ("timing.idle-pace-us", "-1"),
            ("transport.tag", "-1"),
        ] {
            let e = ClusterConfig::parse(&with(key, v), "b.toml").unwrap_err();
            assert_eq!((e.line, e.key.as_str()), (2, key), "{e}");
            assert!(
                e.message.contains(v) && e.message.contains("is out of range: allowed"),
                "{e}"
            );
        }
    }

    #[test]
    fn the_topology_tightens_the_lower_bounds() {
        // GOOD: the largest logical distance is 2; each TM has one host and one trunk.
        for (key, refused, admitted, why) in [
            ("timing.epoch-pulses", 2, 3, "largest logical distance, 2"),
            (
                "limits.pulses-ahead-max",
                4,
                5,
                "twice the largest logical distance, 2",
            ),
            (
                "limits.queue-packets-max",
                3,
                4,
                "links of the busiest TM, 2",
            ),
        ] {
            let (table, name) = key.split_once('.').unwrap();
            let text = |v: u32| format!("{GOOD}[{table}]\n{name} = {v}\n");
            let text = |v| {
                // GOOD already has a [timing] table.
                if table == "timing" {
                    GOOD.replace("token-timeout-us = 2000", &format!("{name} = {v}"))
                } else {
                    text(v)
                }
            };
            let e = ClusterConfig::parse(&text(refused), "c.toml").unwrap_err();
            assert_eq!(e.key, key, "{e}");
            let b = bound(key);
            let range = format!("allowed {admitted}..={}", b.max);
            assert!(
                e.message
                    .starts_with(&format!("{refused} is out of range: {range} (")),
                "{e}"
            );
            assert!(e.message.contains(why), "{e}");
            // The error points at the value when it is written.
            let line = text(refused)
                .lines()
                .position(|l| l.starts_with(name))
                .unwrap()
                + 1;
            assert_eq!(e.line, line, "{e}");
            ClusterConfig::parse(&text(admitted), "c.toml").unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn defaults_are_within_bounds() {
        let c = ClusterConfig::generated(8, 4).unwrap();
        check_bounds(&c.timing, &c.limits, &c.topology).unwrap();
        assert!((TAG_MIN..=TAG_MAX).contains(&DEFAULT_TAG));
        let l = Limits {
            pulses_ahead_max: 0,
            ..Limits::default()
        };
        let (key, msg) = check_bounds(&c.timing, &l, &c.topology).unwrap_err();
        assert_eq!(key, "limits.pulses-ahead-max", "{msg}");
    }

    #[test]
    fn idle_pace_must_be_at_most_half_the_token_timeout_or_zero() {
        let c = ClusterConfig::parse(GOOD, "c.toml").unwrap();
        assert_eq!(
            c.timing.idle_pace_us, 1_000,
            "the default, below the 2000 µs timer"
        );
        let pace = |v: &str| GOOD.replace("[timing]\n", &format!("[timing]\nidle-pace-us = {v}\n"));
        for ok in ["0", "1", "1000"] {
            let c = ClusterConfig::parse(&pace(ok), "c.toml").unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(c.timing.idle_pace_us.to_string(), ok);
        }
        for bad in ["1001", "2000", "5000"] {
            let e = ClusterConfig::parse(&pace(bad), "c.toml").unwrap_err();
            assert_eq!((e.key.as_str(), e.line), ("timing.idle-pace-us", 3), "{e}");
            assert!(
                e.message.starts_with(&format!(
                    "{bad} must be below timing.token-timeout-us (2000) by half of it at least \
                     (at most 1000), so the lost-token timer never fires on a paced wave"
                )) && e.message.contains("set 0 to turn idle pacing off"),
                "{e}"
            );
        }
        // Not written, it stays below a short timer: half of it.
        for (timeout, default) in [
            (800, 400),
            (100, 50),
            (2000, 1000),
            (5_000, 2500),
            (10_000, 2500),
        ] {
            let text = GOOD.replace("2000", &timeout.to_string());
            let c = ClusterConfig::parse(&text, "c.toml").unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(c.timing.idle_pace_us, default, "timer {timeout}");
        }
        // The in-memory check refuses what the loader refuses.
        let t = Timing {
            token_timeout_us: 800,
            ..Timing::default()
        };
        let (key, _) = check_bounds(&t, &Limits::default(), &c.topology).unwrap_err();
        assert_eq!(key, "timing.idle-pace-us");
        let off = Timing {
            idle_pace_us: 0,
            ..t
        };
        check_bounds(&off, &Limits::default(), &c.topology).unwrap();
    }

    #[test]
    fn zero_timeout_is_refused() {
        let text = GOOD.replace("2000", "0");
        let e = ClusterConfig::parse(&text, "c.toml").unwrap_err();
        assert_eq!(e.key, "timing.token-timeout-us");
    }
}

#[cfg(test)]
mod example_tests {
    use super::*;

    #[test]
    fn example_configs_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/examples");
        let mut parsed = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|e| e == "toml") {
                let c = ClusterConfig::load(&path).unwrap_or_else(|e| panic!("{e}"));
                assert!(c.topology.host_count() > 0);
                parsed += 1;
            }
        }
        assert!(parsed > 0, "no example configs in {}", dir.display());
    }
}
