//! An application in a few lines (feature `daemon`): [`Smm::connect`] reads the cluster
//! config and the map file, attaches to the host's SIU daemon over UDP or QUIC (with the
//! host's certificate), joins by state transfer and returns a ready node; [`connect_shared`]
//! is its async twin (a [`SharedSmm`] whose reads are futures, with a pump thread).
//!
//! One application attaches to a host's SIU at a time: the SIU has one application peer,
//! the host's `app` address in the config. A second one fails with
//! [`ConnectError::AlreadyAttached`].
//!
//! ```no_run
//! use isotach_smm::{Addr, Smm, Width};
//! use std::time::Duration;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut smm = Smm::connect("cluster.toml", "alpha")?; // joined: every copy current
//! let timeout = Duration::from_secs(10);
//! let (x, y) = (Addr::new(0, 0), Addr::new(0, 1));
//! let mut iso = smm.node().isochron();
//! let (rx, ry) = (iso.read(x, Width::W64)?, iso.read(y, Width::W64)?);
//! iso.sched(x)?;
//! iso.sched(y)?;
//! iso.end()?;
//! let (vx, vy) = (smm.wait(rx, timeout)?, smm.wait(ry, timeout)?);
//! let mut iso = smm.node().isochron();
//! iso.assign(x, Width::W64, vx.saturating_sub(1))?;
//! iso.assign(y, Width::W64, vy + u64::from(vx > 0))?;
//! iso.end()?;
//! smm.barrier(0, 1, timeout)?;
//! # Ok(())
//! # }
//! ```

use crate::am_link::AmSiuLink;
use crate::driver::{HeldInput, LinkError, SharedSmm, SiuLink, Smm, WaitError};
use crate::embedded::EmbeddedSiu;
use crate::{JoinReport, MemoryMap, SmmConfig, SmmLimits, SmmNode};
use isotach_am::Tag;
use isotach_am::backend::quic::{QuicConfig, QuicTransport, identity_from_pem};
use isotach_am::backend::udp::{UdpConfig, UdpTransport};
use isotach_proto::config::{ClusterConfig, TransportKind};
use isotach_proto::topology::HostId;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use thiserror::Error;

/// How long a pump thread waits for the SIU in one go.
const PUMP_SLICE: Duration = Duration::from_millis(2);

/// What [`Smm::connect_with`] may be told besides the config and the host.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The map file; default: the config's `map` key.
    pub map: Option<PathBuf>,
    /// How long to wait for the SIU and then for the state transfer, each.
    pub timeout: Duration,
    /// The node's table limits.
    pub limits: SmmLimits,
    /// Keep execution records (for an oracle).
    pub record: bool,
    /// Run the host's SIU in this process, on the thread that waits ([`EmbeddedSiu`]), bound
    /// to the host's `siu` address, instead of attaching to an SIU daemon: no kernel hop
    /// between the application and its SIU. Start no `isotach siu` for the host then
    /// (`docs/operations.md`, "Embedded SIU").
    pub embedded_siu: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        Self {
            map: None,
            timeout: Duration::from_secs(30),
            limits: SmmLimits::default(),
            record: false,
            embedded_siu: false,
        }
    }
}

/// Why an application could not attach.
#[derive(Debug, Error)]
pub enum ConnectError {
    /// The cluster config, its certificates or the map file are unusable.
    #[error("{0}")]
    Config(String),
    /// Another application of this host holds its `app` address.
    #[error(
        "another application of host `{host}` is attached (its app address {addr} is in use): \
         one application per host"
    )]
    AlreadyAttached {
        /// The host.
        host: String,
        /// Its `app` address.
        addr: std::net::SocketAddr,
    },
    /// The SIU did not answer (or refused our tag).
    #[error(transparent)]
    Link(#[from] LinkError),
    /// The state transfer did not finish.
    #[error("joining: {0}")]
    Join(#[from] WaitError),
}

/// The link of an application to its host's SIU, over the transport the config names.
#[derive(Debug)]
pub enum AmLink {
    /// AM over UDP.
    Udp(AmSiuLink<UdpTransport>),
    /// AM over QUIC with mutual TLS.
    Quic(AmSiuLink<QuicTransport>),
    /// The host's SIU in this process; its network side over UDP.
    EmbeddedUdp(Box<EmbeddedSiu<UdpTransport>>),
    /// The host's SIU in this process; its network side over QUIC with mutual TLS.
    EmbeddedQuic(Box<EmbeddedSiu<QuicTransport>>),
}

impl SiuLink for AmLink {
    fn send(&mut self, packet: Vec<u8>) -> Result<(), LinkError> {
        match self {
            Self::Udp(l) => l.send(packet),
            Self::Quic(l) => l.send(packet),
            Self::EmbeddedUdp(l) => SiuLink::send(l.as_mut(), packet),
            Self::EmbeddedQuic(l) => SiuLink::send(l.as_mut(), packet),
        }
    }

    fn try_recv(&mut self) -> Option<Vec<u8>> {
        match self {
            Self::Udp(l) => l.try_recv(),
            Self::Quic(l) => l.try_recv(),
            Self::EmbeddedUdp(l) => SiuLink::try_recv(l.as_mut()),
            Self::EmbeddedQuic(l) => SiuLink::try_recv(l.as_mut()),
        }
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        match self {
            Self::Udp(l) => l.recycle(buf),
            Self::Quic(l) => l.recycle(buf),
            Self::EmbeddedUdp(l) => SiuLink::recycle(l.as_mut(), buf),
            Self::EmbeddedQuic(l) => SiuLink::recycle(l.as_mut(), buf),
        }
    }

    fn take_spare(&mut self) -> Option<Vec<u8>> {
        match self {
            Self::Udp(l) => l.take_spare(),
            Self::Quic(l) => l.take_spare(),
            Self::EmbeddedUdp(l) => SiuLink::take_spare(l.as_mut()),
            Self::EmbeddedQuic(l) => SiuLink::take_spare(l.as_mut()),
        }
    }

    fn flush(&mut self) -> Result<(), LinkError> {
        match self {
            Self::Udp(l) => l.flush(),
            Self::Quic(l) => l.flush(),
            Self::EmbeddedUdp(l) => SiuLink::flush(l.as_mut()),
            Self::EmbeddedQuic(l) => SiuLink::flush(l.as_mut()),
        }
    }

    fn recv(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, LinkError> {
        match self {
            Self::Udp(l) => l.recv(timeout),
            Self::Quic(l) => l.recv(timeout),
            Self::EmbeddedUdp(l) => SiuLink::recv(l.as_mut(), timeout),
            Self::EmbeddedQuic(l) => SiuLink::recv(l.as_mut(), timeout),
        }
    }

    fn broken(&mut self) -> Option<String> {
        match self {
            Self::Udp(l) => l.broken(),
            Self::Quic(l) => l.broken(),
            // In this process: a restart of its logical time reaches the node as a reset EOP.
            Self::EmbeddedUdp(_) | Self::EmbeddedQuic(_) => None,
        }
    }

    fn in_host_turn(&self) -> bool {
        match self {
            // A daemon sends its tokens without waiting for the application.
            Self::Udp(_) | Self::Quic(_) => false,
            Self::EmbeddedUdp(l) => SiuLink::in_host_turn(l.as_ref()),
            Self::EmbeddedQuic(l) => SiuLink::in_host_turn(l.as_ref()),
        }
    }

    fn end_host_turn(&mut self) -> Result<(), LinkError> {
        match self {
            Self::Udp(_) | Self::Quic(_) => Ok(()),
            Self::EmbeddedUdp(l) => SiuLink::end_host_turn(l.as_mut()),
            Self::EmbeddedQuic(l) => SiuLink::end_host_turn(l.as_mut()),
        }
    }
}

/// The node's configuration and the link's addresses and transport, from the config files.
struct Plan {
    cfg: SmmConfig,
    app: std::net::SocketAddr,
    siu: std::net::SocketAddr,
    tag: Tag,
}

fn plan(
    config: &Path,
    host_name: &str,
    opts: &ConnectOptions,
) -> Result<(Plan, ClusterConfig), ConnectError> {
    let cluster = ClusterConfig::load(config).map_err(|e| ConnectError::Config(e.to_string()))?;
    let file = config.display();
    let host: HostId = cluster
        .host_id(host_name)
        .ok_or_else(|| ConnectError::Config(format!("{file}: no host named `{host_name}`")))?;
    let h = usize::from(host);
    let (Some(app), Some(siu)) = (cluster.host_app[h], cluster.host_siu[h]) else {
        return Err(ConnectError::Config(format!(
            "{file}: host `{host_name}` needs siu and app addresses"
        )));
    };
    let map_path = opts
        .map
        .clone()
        .or_else(|| cluster.map_file.clone())
        .ok_or_else(|| {
            ConnectError::Config(format!(
                "{file}: no map file: set `map = \"FILE\"` in the config or ConnectOptions::map"
            ))
        })?;
    let map = MemoryMap::load(&map_path, &cluster.host_names)
        .map_err(|e| ConnectError::Config(e.to_string()))?;
    map.check_hosts(&cluster.topology)
        .map_err(|e| ConnectError::Config(format!("{}: {e}", map_path.display())))?;
    let cfg = SmmConfig {
        host,
        topology: Arc::new(cluster.topology.clone()),
        map: Arc::new(map),
        limits: opts.limits,
        record: opts.record,
    };
    let tag = Tag(cluster.transport.tag);
    Ok((Plan { cfg, app, siu, tag }, cluster))
}

/// Binds the host's `app` address and attaches to its SIU (or, with
/// [`ConnectOptions::embedded_siu`], binds its `siu` address and runs the SIU here).
fn attach(
    cluster: &ClusterConfig,
    config: &Path,
    host_name: &str,
    plan: &Plan,
    opts: &ConnectOptions,
) -> Result<AmLink, ConnectError> {
    let in_use = |e: &LinkError| e.0.contains("in use");
    let (timeout, embedded) = (opts.timeout, opts.embedded_siu);
    let spin = cluster.transport.spin();
    let taken = || ConnectError::AlreadyAttached {
        host: host_name.to_string(),
        addr: if embedded { plan.siu } else { plan.app },
    };
    let bind_err = |e: isotach_am::AmError| {
        let addr = plan.siu;
        if e.to_string().contains("in use") {
            taken()
        } else {
            ConnectError::Link(LinkError(format!("bind {addr}: {e}")))
        }
    };
    let siu_plan = || {
        isotach_daemon::siu::siu_plan(cluster, plan.cfg.host)
            .map_err(|e| ConnectError::Config(format!("{}: {e}", config.display())))
    };
    let embed_err = |e: isotach_daemon::DaemonError| LinkError(format!("embedded SIU: {e}"));
    match cluster.transport.kind {
        TransportKind::Udp if embedded => {
            let sp = siu_plan()?;
            let udp = UdpConfig::new(sp.listen).with_spin(spin);
            let t = UdpTransport::with_config(udp).map_err(bind_err)?;
            let siu = EmbeddedSiu::new(sp, t, plan.tag).map_err(embed_err)?;
            Ok(AmLink::EmbeddedUdp(Box::new(siu)))
        }
        TransportKind::Udp => AmSiuLink::connect_udp(plan.app, plan.siu, plan.tag, timeout, spin)
            .map(AmLink::Udp)
            .map_err(|e| if in_use(&e) { taken() } else { e.into() }),
        TransportKind::Quic => {
            let files = cluster.quic_files(host_name).map_err(|(key, msg)| {
                ConnectError::Config(format!("{}: {key}: {msg}", config.display()))
            })?;
            let read = |p: &Path| {
                std::fs::read(p)
                    .map_err(|e| ConnectError::Config(format!("{}: cannot read: {e}", p.display())))
            };
            let identity =
                identity_from_pem(&read(&files.ca)?, &read(&files.cert)?, &read(&files.key)?)
                    .map_err(|e| ConnectError::Config(format!("{}: {e}", files.cert.display())))?;
            if embedded {
                let sp = siu_plan()?;
                let quic = QuicConfig::new(sp.listen, identity).with_spin(spin);
                let t = QuicTransport::bind(quic).map_err(bind_err)?;
                let siu = EmbeddedSiu::new(sp, t, plan.tag).map_err(embed_err)?;
                return Ok(AmLink::EmbeddedQuic(Box::new(siu)));
            }
            AmSiuLink::connect_quic(plan.app, plan.siu, identity, plan.tag, timeout, spin)
                .map(AmLink::Quic)
                .map_err(|e| if in_use(&e) { taken() } else { e.into() })
        }
    }
}

impl Smm<AmLink> {
    /// Attaches an application to host `host_name` of the cluster config at `config` with
    /// the defaults of [`ConnectOptions`] (map file from the config's `map` key, 30 s).
    pub fn connect(config: impl AsRef<Path>, host_name: &str) -> Result<Self, ConnectError> {
        Self::connect_with(config, host_name, &ConnectOptions::default()).map(|(smm, _)| smm)
    }

    /// Attaches an application: reads the config and the map file, connects to the host's SIU
    /// over the config's transport, and joins by state transfer (every page current before it
    /// returns). Returns the node and what the transfer found (pages recovered from another
    /// copy, pages that started empty because no current copy was left).
    pub fn connect_with(
        config: impl AsRef<Path>,
        host_name: &str,
        opts: &ConnectOptions,
    ) -> Result<(Self, JoinReport), ConnectError> {
        let config = config.as_ref();
        let (plan, cluster) = plan(config, host_name, opts)?;
        let link = attach(&cluster, config, host_name, &plan, opts)?;
        let mut node = SmmNode::new(plan.cfg);
        node.start_read_ids_at(read_ids_start());
        let mut smm = Self::new(node, link);
        let report = smm.join(opts.timeout)?;
        Ok((smm, report))
    }
}

/// Where a new application's read ids start: answers to an earlier application's reads on
/// this host carry only the read id and may still come after a restart, so each application
/// starts in its own block of 2^24 ids, picked from the clock (a nonce, not a decision).
fn read_ids_start() -> u32 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() ^ d.as_secs() as u32);
    nanos & 0xff00_0000
}

/// A running pump thread of [`connect_shared`]; stops (and joins) when dropped.
#[derive(Debug)]
pub struct Pump {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for Pump {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The async twin of [`Smm::connect_with`]: attaches and joins (blocking, bounded by the
/// timeout: call it from a blocking context such as `spawn_blocking`), then returns a
/// [`SharedSmm`] whose reads are futures for any executor and the pump thread that moves its
/// packets. Dropping the [`Pump`] detaches.
pub fn connect_shared(
    config: impl AsRef<Path>,
    host_name: &str,
    opts: &ConnectOptions,
) -> Result<(SharedSmm, Pump, JoinReport), ConnectError> {
    let (smm, report) = Smm::connect_with(config, host_name, opts)?;
    let (node, link) = smm.into_parts();
    let shared = SharedSmm::new(node);
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let (shared, stop) = (shared.clone(), Arc::clone(&stop));
        std::thread::spawn(move || pump(&shared, link, &stop))
    };
    Ok((
        shared,
        Pump {
            stop,
            thread: Some(thread),
        },
        report,
    ))
}

/// Moves packets between a shared node and its link until told to stop or the link fails.
/// Input refused for a limit is held as [`crate::Smm`] holds it.
fn pump(shared: &SharedSmm, mut link: AmLink, stop: &AtomicBool) {
    let mut held = HeldInput::default();
    let refused = |p: &[u8]| matches!(shared.handle_siu(p), Err(crate::SmmError::Limit(_)));
    while !stop.load(Ordering::Relaxed) {
        let mut sent = false;
        while let Some(p) = shared.poll_siu() {
            if let Err(e) = link.send(p) {
                shared.link_broken(e.0);
                return;
            }
            sent = true;
        }
        if sent && let Err(e) = link.flush() {
            shared.link_broken(e.0);
            return;
        }
        if let Some(reason) = link.broken() {
            shared.link_broken(reason);
            return;
        }
        while let Some(p) = held.pop_front() {
            if refused(&p) {
                held.push_front(p);
                break;
            }
        }
        if held.full() {
            std::thread::sleep(PUMP_SLICE);
            continue;
        }
        match link.recv(PUMP_SLICE) {
            Ok(Some(p)) => {
                if let Some(p) = held.hold_if_behind(p)
                    && refused(&p)
                {
                    held.push_front(p);
                }
            }
            Ok(None) => {}
            Err(e) => {
                shared.link_broken(e.0);
                return;
            }
        }
    }
}
