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

use crate::topology::{Shape, SwitchId, Topology, TopologyError};
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
            token_timeout_us: 10_000,
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

mod bounds;
mod graph;
mod raw;
use raw::{
    RawConfig, check_unique_addrs, check_unique_admin, key_of, line_column, span_of, timing_limits,
    transport, unspecified,
};
#[cfg(test)]
mod tests;

pub use bounds::*;

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
    /// How long a daemon's or application's wait polls its socket, yielding the CPU, before
    /// it sleeps in the kernel while traffic flows (`spin-us`, µs; 0: never).
    pub spin_us: u64,
}

impl TransportConfig {
    /// `spin_us` as a duration.
    pub fn spin(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.spin_us)
    }
}

impl Default for TransportConfig {
    fn default() -> Self {
        Self {
            kind: TransportKind::default(),
            tag: DEFAULT_TAG,
            ca: None,
            certs: None,
            spin_us: SPIN_US_DEFAULT,
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
        Self::generate(Shape::Line, hosts, switches)
    }

    /// A generated cluster of `switches` switches joined as `shape` says, `hosts` hosts spread
    /// round robin over the switches that take hosts ([`Topology::generate`]), and timing and
    /// limits sized for it ([`Timing::sized_for`], [`Limits::sized_for`]): the epoch and the
    /// window grow with the largest logical distance.
    pub fn generate(shape: Shape, hosts: usize, switches: usize) -> Result<Self, TopologyError> {
        let topology = Topology::generate(shape, hosts, switches)?;
        Ok(Self {
            switch_names: (0..switches).map(|s| format!("tm{s}")).collect(),
            host_names: (0..hosts).map(|h| format!("host{h}")).collect(),
            timing: Timing::sized_for(&topology),
            limits: Limits::sized_for(&topology),
            topology,
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
            if switch_ids.contains_key(h.name.get_ref().as_str()) {
                let msg = format!(
                    "`{}` names a switch too: a node's name picks its certificate \
                     (CERTS/NAME.pem) and its daemon (--name, --host), so names are unique \
                     among switches and hosts",
                    h.name.get_ref()
                );
                return Err(err(Some(h.name.span()), "host.name", msg));
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
        let topology = Topology::new(raw.switches.len(), host_switch, trunks).map_err(|e| {
            let (span, key, msg) = graph::topology_error(&raw, &e);
            err(span, key, msg)
        })?;
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
