//! A whole cluster in this process, for the demo and the daemon benches: a token manager and N
//! SIUs — daemon threads (the same drivers as `isotach tm` / `isotach siu`) or embedded in the
//! applications' threads — over loopback UDP, loopback QUIC with mutual TLS, or an in-process
//! real-time network, with a generated cluster config whose addresses are the bound sockets.

use crate::UsageError;
use clap::ValueEnum;
use isotach_am::backend::chan::{ChanNet, ChanTransport};
use isotach_am::backend::quic::{
    QuicConfig, QuicIdentity, QuicTransport, make_ca, make_node_identity,
};
use isotach_am::backend::spin::SPIN_DEFAULT;
use isotach_am::backend::udp::{UdpConfig, UdpTransport};
use isotach_am::port::DEFAULT_TAG;
use isotach_am::{NodeAddr, Tag, Transport};
use isotach_daemon::DaemonError;
use isotach_daemon::embedded::EmbeddedSiu;
use isotach_daemon::run::{Daemon, Publish, SiuDaemon, TmDaemon};
use isotach_daemon::siu::{SiuGauges, siu_plan};
use isotach_daemon::tm::tm_plan;
use isotach_proto::config::{ClusterConfig, Timing};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

fn bind(spin: Duration) -> anyhow::Result<UdpTransport> {
    let cfg = UdpConfig::new("127.0.0.1:0".parse()?).with_spin(spin);
    UdpTransport::with_config(cfg).map_err(|e| anyhow::anyhow!("bind a loopback UDP socket: {e}"))
}

fn bind_quic(identity: QuicIdentity) -> anyhow::Result<QuicTransport> {
    let any: SocketAddr = "127.0.0.1:0".parse()?;
    QuicTransport::bind(QuicConfig::new(any, identity))
        .map_err(|e| anyhow::anyhow!("bind a loopback QUIC endpoint: {e}"))
}

/// A token manager and N SIU daemons running on their own tokio runtime, plus the N (not yet
/// used) transports of the hosts' applications. With embedded SIUs the runtime runs the token
/// manager only, and each host's SIU waits in `embedded` for its application's thread.
pub(crate) struct LoopbackCluster<A = UdpTransport> {
    /// The generated cluster config, with every address filled in.
    pub(crate) cluster: ClusterConfig,
    /// Each SIU's gauges, by host.
    pub(crate) gauges: Vec<Arc<SiuGauges>>,
    /// Each host's SIU when it is to run embedded in its application, by host (empty when
    /// the SIUs run as daemons).
    pub(crate) embedded: Vec<EmbeddedSiu<UdpTransport>>,
    /// Each host's application transport (blocking; for [`AmSiuLink`]), by host.
    pub(crate) app_ts: Vec<A>,
    /// The address each host's application reaches its SIU at, by host.
    pub(crate) siu_addrs: Vec<NodeAddr>,
    /// The running daemon tasks.
    pub(crate) daemons: RunningDaemons,
}

/// The daemon threads of a [`LoopbackCluster`], one per daemon (each runs its passes to
/// completion and blocks in its transport between them).
pub(crate) struct RunningDaemons {
    stop: Arc<AtomicBool>,
    threads: Vec<(String, std::thread::JoinHandle<Result<(), DaemonError>>)>,
}

/// The transports of one embedded cluster before the daemons start: the token manager's,
/// each SIU's and each application's, and the socket address the generated config gives
/// each (for in-process transports, a placeholder that `real` maps to the node).
struct Nodes<D, A> {
    tm: (D, SocketAddr),
    sius: Vec<(D, SocketAddr)>,
    apps: Vec<(A, SocketAddr)>,
    /// Config address → transport address, where they differ (in-process transports).
    real: HashMap<SocketAddr, NodeAddr>,
}

/// Starts a token manager and `n` SIU daemons (the same drivers as `isotach tm` / `isotach
/// siu`) on a two-worker tokio runtime, over fresh loopback UDP sockets.
pub(crate) fn start_loopback_cluster(n: usize) -> anyhow::Result<LoopbackCluster> {
    let spin = SPIN_DEFAULT;
    start_loopback_cluster_with(n, SiuPlacement::Daemon, Timing::default(), spin)
}

/// Where each host's SIU runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum SiuPlacement {
    /// In the application's process, on its thread (`EmbeddedSiu`): no kernel hop between
    /// the application and its SIU.
    Embedded,
    /// A separate SIU daemon the application reaches over AM on loopback UDP.
    Daemon,
}

impl SiuPlacement {
    /// The name reports use.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Embedded => "embedded",
            Self::Daemon => "daemon",
        }
    }
}

/// [`start_loopback_cluster`] with the SIUs placed as `placement` says (embedded SIUs are
/// built, bound and not yet running, and left in [`LoopbackCluster::embedded`]) and the given
/// protocol timing (e.g. idle pacing off); every wait spins up to `spin` while traffic flows.
pub(crate) fn start_loopback_cluster_with(
    n: usize,
    placement: SiuPlacement,
    timing: Timing,
    spin: Duration,
) -> anyhow::Result<LoopbackCluster> {
    // Every socket is a plain blocking one: each daemon, application and embedded SIU waits
    // in its own on its own thread.
    let tm = bind(spin)?;
    let sius = (0..n)
        .map(|_| bind(spin))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let apps = (0..n)
        .map(|_| bind(spin))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let with_addr = |t: UdpTransport| {
        let a = t.socket_addr();
        (t, a)
    };
    let nodes = Nodes {
        tm: with_addr(tm),
        sius: sius.into_iter().map(with_addr).collect(),
        apps: apps.into_iter().map(with_addr).collect(),
        real: HashMap::new(),
    };
    if placement == SiuPlacement::Daemon {
        return start_cluster(nodes, DEFAULT_TAG, timing);
    }
    let Nodes { tm, sius, apps, .. } = nodes;
    let (siu_ts, siu_addrs): (Vec<UdpTransport>, Vec<SocketAddr>) = sius.into_iter().unzip();
    let nodes = Nodes {
        tm,
        sius: Vec::new(),
        apps,
        real: HashMap::new(),
    };
    let mut lc = start_cluster_with(nodes, &siu_addrs, DEFAULT_TAG, timing)?;
    for (h, t) in siu_ts.into_iter().enumerate() {
        let plan = siu_plan(&lc.cluster, h as u16)?;
        let siu = EmbeddedSiu::new(plan, t, DEFAULT_TAG)?;
        lc.gauges.push(siu.gauges());
        lc.embedded.push(siu);
    }
    Ok(lc)
}

/// The same over QUIC on loopback: an ephemeral cluster CA made in-process issues every
/// daemon's and application's certificate (mutual TLS on every link).
pub(super) fn start_quic_cluster(n: usize) -> anyhow::Result<LoopbackCluster<QuicTransport>> {
    let ca = make_ca("isotach demo cluster CA")?;
    let bound = |name: &str| -> anyhow::Result<(QuicTransport, SocketAddr)> {
        let t = bind_quic(make_node_identity(&ca, name)?)?;
        let a = t.socket_addr();
        Ok((t, a))
    };
    let tm = bound("tm0")?;
    let sius = (0..n)
        .map(|h| bound(&format!("host{h}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let apps = (0..n)
        .map(|h| bound(&format!("host{h}-app")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let nodes = Nodes {
        tm,
        sius,
        apps,
        real: HashMap::new(),
    };
    start_cluster(nodes, DEFAULT_TAG, Timing::default())
}

/// The same in one process without sockets: an in-process real-time network
/// ([`ChanNet`]). The generated config holds placeholder addresses (TEST-NET-1, never bound)
/// that name the in-process nodes.
pub(super) fn start_chan_cluster(n: usize) -> anyhow::Result<LoopbackCluster<ChanTransport>> {
    let net = ChanNet::new();
    let mut real = HashMap::new();
    let mut next = 1u16;
    let mut node = || {
        let t = net.node();
        let a = SocketAddr::from(([192, 0, 2, 1], next));
        next += 1;
        real.insert(a, t.local_addr());
        (t, a)
    };
    let tm = node();
    let sius = (0..n).map(|_| node()).collect();
    let apps = (0..n).map(|_| node()).collect();
    let nodes = Nodes {
        tm,
        sius,
        apps,
        real,
    };
    start_cluster(nodes, DEFAULT_TAG, Timing::default())
}

/// Fills the generated config with the nodes' addresses and starts the daemons, each on its
/// own thread.
fn start_cluster<D: Transport + Send + 'static, A>(
    nodes: Nodes<D, A>,
    tag: Tag,
    timing: Timing,
) -> anyhow::Result<LoopbackCluster<A>> {
    let siu_addrs: Vec<SocketAddr> = nodes.sius.iter().map(|s| s.1).collect();
    start_cluster_with(nodes, &siu_addrs, tag, timing)
}

/// [`start_cluster`] with the SIUs' addresses given: SIU daemons run for `nodes.sius` (all
/// hosts, or none when the SIUs are embedded and started by the caller).
fn start_cluster_with<D: Transport + Send + 'static, A>(
    nodes: Nodes<D, A>,
    siu_listen: &[SocketAddr],
    tag: Tag,
    timing: Timing,
) -> anyhow::Result<LoopbackCluster<A>> {
    let Nodes {
        tm,
        sius,
        apps,
        real,
    } = nodes;
    let addr = |a: SocketAddr| real.get(&a).copied().unwrap_or(NodeAddr::Ip(a));
    let n = siu_listen.len();
    debug_assert!(sius.is_empty() || sius.len() == n);
    let mut cluster = ClusterConfig::generated(n, 1).map_err(|e| UsageError(e.to_string()))?;
    cluster.timing = timing;
    cluster.switch_listen[0] = Some(tm.1);
    for h in 0..n {
        cluster.host_siu[h] = Some(siu_listen[h]);
        cluster.host_app[h] = Some(apps[h].1);
    }
    let siu_addrs: Vec<NodeAddr> = siu_listen.iter().map(|&a| addr(a)).collect();
    let real = |peers: Vec<NodeAddr>| -> Vec<NodeAddr> {
        peers
            .into_iter()
            .map(|p| match p {
                NodeAddr::Ip(a) => addr(a),
                other => other,
            })
            .collect()
    };
    let mut daemons = RunningDaemons {
        stop: Arc::new(AtomicBool::new(false)),
        threads: Vec::new(),
    };
    let mut gauges: Vec<Arc<SiuGauges>> = Vec::new();
    let mut plan = tm_plan(&cluster, 0)?;
    plan.peers = real(plan.peers);
    daemons.spawn("token manager", "tm-0", TmDaemon::tm(plan, tm.0, tag)?)?;
    for (h, (t, _)) in sius.into_iter().enumerate() {
        let mut plan = siu_plan(&cluster, h as u16)?;
        plan.peers = real(plan.peers);
        let d = SiuDaemon::siu(plan, t, tag)?;
        gauges.push(d.gauges());
        daemons.spawn(&format!("SIU {h}"), &format!("siu-{h}"), d)?;
    }
    Ok(LoopbackCluster {
        cluster,
        gauges,
        embedded: Vec::new(),
        app_ts: apps.into_iter().map(|a| a.0).collect(),
        siu_addrs,
        daemons,
    })
}

/// How long [`RunningDaemons::stop`] waits for the daemon threads.
const STOP_MAX: Duration = Duration::from_secs(10);

impl RunningDaemons {
    /// Runs `daemon` on its own thread (named `thread`; `what` names it in errors).
    fn spawn<R: Publish + Send + 'static, T: Transport + Send + 'static>(
        &mut self,
        what: &str,
        thread: &str,
        daemon: Daemon<R, T>,
    ) -> anyhow::Result<()> {
        let stop = Arc::clone(&self.stop);
        let handle = std::thread::Builder::new()
            .name(thread.to_string())
            .spawn(move || daemon.run_blocking(&stop).map(drop))?;
        self.threads.push((what.to_string(), handle));
        Ok(())
    }

    /// Tells every daemon thread to stop and waits for them (at most [`STOP_MAX`]); returns
    /// the daemons' errors and a note when they did not stop in time.
    pub(crate) fn stop(self) -> Vec<String> {
        self.stop.store(true, Ordering::Relaxed);
        let limit = Instant::now() + STOP_MAX;
        let mut problems = Vec::new();
        for (what, t) in self.threads {
            while !t.is_finished() && Instant::now() < limit {
                std::thread::sleep(Duration::from_millis(2));
            }
            if !t.is_finished() {
                problems.push(format!(
                    "{what} did not stop within {} s",
                    STOP_MAX.as_secs()
                ));
                continue;
            }
            match t.join() {
                Ok(Ok(())) => {}
                Ok(Err(e)) => problems.push(format!("{what}: {e}")),
                Err(_) => problems.push(format!("{what} panicked")),
            }
        }
        problems
    }
}
