//! `isotach tm`, `isotach siu` and `isotach philo`: the daemons and one application process.
//!
//! The drivers live with their state machines (`isotach_tm::daemon`, `isotach_siu::daemon`,
//! feature `daemon`); this module loads the config, binds the sockets, installs the signal
//! handlers and runs them.

use crate::admin::{Exposed, SIU_ADMIN_DEFAULT, Source, TM_ADMIN_DEFAULT};
use crate::cluster_io::{Link, load};
use crate::philo_app::{PhiloParams, forks_map, latency_summary, run_philosopher};
use crate::{EXIT_FAILED, UsageError};
use clap::Args;
use isotach_am::backend::quic::{QuicConfig, QuicCounters, QuicTransport};
use isotach_am::backend::udp::{UdpConfig, UdpTransport};
use isotach_am::{Tag, Transport};
use isotach_daemon::DaemonError;
use isotach_daemon::run::{Daemon, Publish, SiuDaemon, SiuSnapshot, TmDaemon, TmSnapshot};
use isotach_daemon::siu::{SiuPlan, SiuRole, siu_plan};
use isotach_daemon::tm::{TmPlan, TmRole, tm_plan};
use isotach_proto::config::ClusterConfig;
use isotach_proto::topology::HostId;
use isotach_smm::am_link::AmSiuLink;
use isotach_smm::embedded::EmbeddedSiu;
use isotach_smm::{SmmConfig, SmmLimits, SmmNode};
use serde::Serialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};
use tokio::sync::{Notify, watch};

/// Run a token manager (one per switch).
#[derive(Debug, Args)]
pub(crate) struct TmArgs {
    /// Cluster config (TOML).
    #[arg(long, value_name = "FILE", env = "ISOTACH_CONFIG")]
    config: PathBuf,
    /// This token manager's switch name (`[[switch]] name`).
    #[arg(long, env = "ISOTACH_NAME")]
    name: String,
    #[command(flatten)]
    ops: OpsArgs,
}

/// Where a daemon serves its admin service and metrics.
#[derive(Debug, Args)]
pub(crate) struct OpsArgs {
    /// Serve the admin gRPC service (`isotach status`) here (port 0 picks a free one; the
    /// address is logged). Default: the node's `admin` key in the config, else 127.0.0.1:7070
    /// for a TM and 127.0.0.1:7071 for an SIU (skipped with a warning when taken).
    #[arg(long, value_name = "ADDR")]
    admin: Option<SocketAddr>,
    /// Serve no admin service.
    #[arg(long, conflicts_with = "admin")]
    no_admin: bool,
    /// Serve Prometheus metrics (`GET /metrics`, plain HTTP) here. Off by default.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<SocketAddr>,
}

/// Run an SIU (one per host).
#[derive(Debug, Args)]
pub(crate) struct SiuArgs {
    /// Cluster config (TOML).
    #[arg(long, value_name = "FILE", env = "ISOTACH_CONFIG")]
    config: PathBuf,
    /// This SIU's host name (`[[host]] name`).
    #[arg(long, env = "ISOTACH_HOST")]
    host: String,
    #[command(flatten)]
    ops: OpsArgs,
}

/// Run one dining philosopher on this host, over its SIU daemon. Every host of the config
/// runs one; forks are shared variables held by neighbouring hosts. Exits 0 when this
/// philosopher ate every meal and every philosopher reached the end barrier.
#[derive(Debug, Args)]
pub(crate) struct PhiloArgs {
    /// Cluster config (TOML).
    #[arg(long, value_name = "FILE", env = "ISOTACH_CONFIG")]
    config: PathBuf,
    /// This host's name (`[[host]] name`).
    #[arg(long, env = "ISOTACH_HOST")]
    host: String,
    /// Meals to eat.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    meals: u64,
    /// Give up (exit 1) after this many seconds.
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    timeout_s: u64,
    /// Run this host's SIU inside this process, on the philosopher's thread, at the host's
    /// `siu` address (start no `isotach siu` for this host): no kernel hop between the
    /// application and its SIU. See docs/operations.md, "Embedded SIU".
    #[arg(long)]
    embedded_siu: bool,
    /// Print one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// A daemon's transport, of the kind the config names.
pub(crate) enum Bound {
    Udp(UdpTransport),
    Quic(QuicTransport, QuicCounters),
}

/// Logs to stderr; `RUST_LOG` overrides `default`; the admin service can change the filter.
fn init_logs(default: &str) {
    crate::admin::logs::init(default);
}

fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?)
}

/// Completes on SIGINT or SIGTERM.
pub(crate) async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    tracing::info!("signal received: shutting down");
}

/// Starts the admin service (and metrics) as [`OpsArgs`] says; returns what its `Shutdown`
/// fires. An address from the flag or the config must bind; the built-in default is skipped
/// with a warning when another daemon on this machine holds it.
async fn admin(
    ops: &OpsArgs,
    configured: Option<SocketAddr>,
    default: &str,
    exposed: Exposed,
) -> anyhow::Result<Option<Arc<Notify>>> {
    if ops.no_admin {
        if let Some(m) = ops.metrics {
            let view = exposed;
            crate::admin::serve_metrics_only(m, view).await?;
        }
        return Ok(None);
    }
    let (addr, explicit) = match ops.admin.or(configured) {
        Some(a) => (a, true),
        None => (default.parse()?, false),
    };
    match crate::admin::serve(addr, ops.metrics, exposed).await {
        Ok((_, stop)) => Ok(Some(stop)),
        Err(e) if !explicit => {
            tracing::warn!(%e, "admin service not started (use --admin ADDR to pick another address)");
            Ok(None)
        }
        Err(e) => Err(e),
    }
}

/// Completes on SIGINT, SIGTERM or the admin service's `Shutdown`.
async fn shutdown_or(admin: Option<Arc<Notify>>) {
    match admin {
        Some(n) => {
            tokio::select! {
                () = shutdown_signal() => {}
                () = n.notified() => {}
            }
        }
        None => shutdown_signal().await,
    }
}

/// A node named in the config, or a usage error naming the config file.
fn named<T>(found: Option<T>, config: &Path, what: &str, name: &str) -> anyhow::Result<T> {
    found
        .ok_or_else(|| UsageError(format!("{}: no {what} named `{name}`", config.display())).into())
}

/// Binds the daemon's transport at `listen`.
pub(crate) fn bind(link: Link, listen: SocketAddr, spin: Duration) -> anyhow::Result<Bound> {
    let bind_err = |e: isotach_am::AmError| anyhow::anyhow!("bind {listen}: {e}");
    Ok(match link {
        Link::Udp => {
            let cfg = UdpConfig::new(listen).with_spin(spin);
            Bound::Udp(UdpTransport::with_config(cfg).map_err(bind_err)?)
        }
        Link::Quic(identity) => {
            let t = QuicTransport::bind(QuicConfig::new(listen, identity).with_spin(spin))
                .map_err(bind_err)?;
            let counters = t.counters();
            Bound::Quic(t, counters)
        }
    })
}

/// Logs failed QUIC handshakes as they happen (at most once a second): a peer whose
/// certificate the cluster CA did not sign, or one that refused ours. Never returns.
async fn watch_handshakes(h: QuicCounters) {
    let (mut refused, mut failed) = (0, 0);
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let (r, f) = (h.refused(), h.connects_failed());
        if (r, f) != (refused, failed) {
            (refused, failed) = (r, f);
            tracing::warn!(
                handshakes_refused = r,
                connects_failed = f,
                last = h.last_error().unwrap_or_default(),
                "QUIC handshakes failed (a peer without a certificate from the cluster CA, or a peer that refused ours)"
            );
        }
    }
}

/// Runs `run` (a daemon) while logging failed QUIC handshakes; logs their totals at the end.
async fn with_handshake_log<F: Future>(h: Option<QuicCounters>, run: F) -> F::Output {
    let Some(h) = h else { return run.await };
    let watcher = tokio::spawn(watch_handshakes(h.clone()));
    let out = run.await;
    watcher.abort();
    tracing::info!(
        handshakes_refused = h.refused(),
        connects_failed = h.connects_failed(),
        datagrams_refused = h.send_refused(),
        datagrams_dropped = h.send_dropped(),
        datagrams_recv_dropped = h.recv_dropped(),
        transmits_failed = h.send_failed(),
        "QUIC transport stopped"
    );
    out
}

/// What differs between `isotach tm` and `isotach siu`: the plan of the node, the daemon it
/// makes and how the admin service reads it.
trait NodePlan: Sized {
    /// The daemon's role.
    type Role: Publish + Send + 'static;
    /// The admin address when neither `--admin` nor the config names one.
    const ADMIN_DEFAULT: &'static str;
    /// The name of the daemon's thread.
    const THREAD: &'static str;
    /// Where the daemon's transport binds.
    fn listen(&self) -> SocketAddr;
    /// The daemon over `transport`.
    fn daemon<T: Transport>(
        self,
        transport: T,
        tag: Tag,
    ) -> Result<Daemon<Self::Role, T>, DaemonError>;
    /// The admin service's view of its snapshots.
    fn source(rx: watch::Receiver<<Self::Role as Publish>::Snapshot>) -> Source;
}

impl NodePlan for TmPlan {
    type Role = TmRole;
    const ADMIN_DEFAULT: &'static str = TM_ADMIN_DEFAULT;
    const THREAD: &'static str = "tm";
    fn listen(&self) -> SocketAddr {
        self.listen
    }
    fn daemon<T: Transport>(self, transport: T, tag: Tag) -> Result<TmDaemon<T>, DaemonError> {
        TmDaemon::tm(self, transport, tag)
    }
    fn source(rx: watch::Receiver<TmSnapshot>) -> Source {
        Source::Tm(rx)
    }
}

impl NodePlan for SiuPlan {
    type Role = SiuRole;
    const ADMIN_DEFAULT: &'static str = SIU_ADMIN_DEFAULT;
    const THREAD: &'static str = "siu";
    fn listen(&self) -> SocketAddr {
        self.listen
    }
    fn daemon<T: Transport>(self, transport: T, tag: Tag) -> Result<SiuDaemon<T>, DaemonError> {
        SiuDaemon::siu(self, transport, tag)
    }
    fn source(rx: watch::Receiver<SiuSnapshot>) -> Source {
        Source::Siu(rx)
    }
}

/// Runs the daemon of `plan` over `transport` with its admin service until it is told to stop.
async fn serve<P: NodePlan, T: Transport + Send + 'static>(
    plan: P,
    transport: T,
    tag: Tag,
    handshakes: Option<QuicCounters>,
    name: &str,
    ops: &OpsArgs,
    configured: Option<SocketAddr>,
) -> anyhow::Result<()> {
    let daemon = plan.daemon(transport, tag)?;
    let exposed = Exposed {
        name: name.to_string(),
        source: P::source(daemon.snapshot()),
        telemetry: daemon.telemetry(),
        quic: handshakes.clone(),
    };
    let stop = admin(ops, configured, P::ADMIN_DEFAULT, exposed).await?;
    // The daemon's passes run to completion on a thread of their own, blocking in the
    // transport between them; the runtime keeps the admin service and the signals.
    let running = Arc::new(AtomicBool::new(false));
    let stopping = Arc::clone(&running);
    let pump = std::thread::Builder::new()
        .name(P::THREAD.to_string())
        .spawn(move || daemon.run_blocking(&stopping))?;
    with_handshake_log(handshakes, async {
        let mut shutdown = std::pin::pin!(shutdown_or(stop));
        let mut tick = tokio::time::interval(PUMP_CHECK);
        loop {
            tokio::select! {
                () = &mut shutdown => break,
                _ = tick.tick() => if pump.is_finished() { break },
            }
        }
    })
    .await;
    running.store(true, Ordering::Relaxed);
    match tokio::task::spawn_blocking(move || pump.join()).await? {
        Ok(result) => result.map(drop).map_err(Into::into),
        Err(_) => Err(anyhow::anyhow!("the daemon's thread panicked")),
    }
}

/// How often the runtime checks that the daemon's thread still runs (it ends early only on
/// a transport error, which then ends the process).
const PUMP_CHECK: Duration = Duration::from_millis(50);

/// Loads `config` and finds the node `name` (a `what`: switch or host) in it with `id`, then
/// binds its transport and runs its daemon (planned by `plan`; its configured admin address
/// from `admin`) until SIGINT, SIGTERM or the admin service's `Shutdown`.
fn run_daemon<P: NodePlan>(
    config: &Path,
    name: &str,
    ops: &OpsArgs,
    what: &str,
    id: fn(&ClusterConfig, &str) -> Option<u16>,
    plan: fn(&ClusterConfig, u16) -> Result<P, DaemonError>,
    admin: fn(&ClusterConfig) -> &[Option<SocketAddr>],
) -> anyhow::Result<ExitCode> {
    let cluster = load(config)?;
    let node = named(id(&cluster, name), config, what, name)?;
    let plan =
        plan(&cluster, node).map_err(|e| UsageError(format!("{}: {e}", config.display())))?;
    let link = Link::of(&cluster, config, name)?;
    let tag = Tag(cluster.transport.tag);
    let configured = admin(&cluster)[usize::from(node)];
    init_logs("info");
    // Bound outside the runtime: the daemon's own thread waits on the socket, and a socket
    // registered with the runtime's reactor would wake it on every datagram for nothing.
    let bound = bind(link, plan.listen(), cluster.transport.spin())?;
    runtime()?.block_on(async move {
        match bound {
            Bound::Udp(t) => serve(plan, t, tag, None, name, ops, configured).await?,
            Bound::Quic(t, h) => serve(plan, t, tag, Some(h), name, ops, configured).await?,
        }
        anyhow::Ok(ExitCode::SUCCESS)
    })
}

pub(crate) fn run_tm(args: TmArgs) -> anyhow::Result<ExitCode> {
    run_daemon(
        &args.config,
        &args.name,
        &args.ops,
        "switch",
        ClusterConfig::switch_id,
        tm_plan,
        |c| &c.switch_admin,
    )
}

pub(crate) fn run_siu(args: SiuArgs) -> anyhow::Result<ExitCode> {
    run_daemon(
        &args.config,
        &args.host,
        &args.ops,
        "host",
        ClusterConfig::host_id,
        siu_plan,
        |c| &c.host_admin,
    )
}

/// `isotach philo --json` output.
#[derive(Debug, Serialize)]
struct PhiloSummary {
    host: String,
    meals: u64,
    retries: u64,
    elapsed_s: f64,
    isochron_latency_p50_us: u64,
    isochron_latency_p99_us: u64,
    ok: bool,
}

/// The host `name` of `cluster` (read from `config`) that runs one process of a multi-host
/// application (`what`, for errors): its id, its application address and its SIU's.
pub(crate) fn app_host(
    cluster: &ClusterConfig,
    config: &Path,
    name: &str,
    what: &str,
) -> Result<(HostId, SocketAddr, SocketAddr), UsageError> {
    let file = config.display();
    let host = cluster
        .host_id(name)
        .ok_or_else(|| UsageError(format!("{file}: no host named `{name}`")))?;
    if cluster.topology.host_count() < 2 {
        return Err(UsageError(format!("{file}: {what} needs at least 2 hosts")));
    }
    let h = usize::from(host);
    let (Some(app), Some(siu)) = (cluster.host_app[h], cluster.host_siu[h]) else {
        return Err(UsageError(format!(
            "{file}: host `{name}` needs siu and app addresses"
        )));
    };
    Ok((host, app, siu))
}

pub(crate) fn run_philo(args: PhiloArgs) -> anyhow::Result<ExitCode> {
    let cluster = load(&args.config)?;
    let (host, app, siu) = app_host(&cluster, &args.config, &args.host, "dining philosophers")?;
    // The application presents its host's certificate on QUIC (it runs beside its SIU).
    let link = Link::of(&cluster, &args.config, &args.host)?;
    let tag = Tag(cluster.transport.tag);
    init_logs("warn");
    let started = Instant::now();
    let timeout = Duration::from_secs(args.timeout_s);
    let spin = cluster.transport.spin();
    if args.embedded_siu {
        let plan = siu_plan(&cluster, host)
            .map_err(|e| UsageError(format!("{}: {e}", args.config.display())))?;
        let listen = plan.listen;
        return match bind(link, listen, spin)? {
            Bound::Udp(t) => philo_over(EmbeddedSiu::new(plan, t, tag)?, &args, &cluster, started),
            Bound::Quic(t, _) => {
                philo_over(EmbeddedSiu::new(plan, t, tag)?, &args, &cluster, started)
            }
        };
    }
    match link {
        Link::Udp => {
            let link = AmSiuLink::connect_udp(app, siu, tag, timeout, spin)?;
            philo_over(link, &args, &cluster, started)
        }
        Link::Quic(identity) => {
            let link = AmSiuLink::connect_quic(app, siu, identity, tag, timeout, spin)?;
            philo_over(link, &args, &cluster, started)
        }
    }
}

/// Runs the philosopher of `args.host` over its connected link.
fn philo_over<L: isotach_smm::SiuLink>(
    link: L,
    args: &PhiloArgs,
    cluster: &ClusterConfig,
    started: Instant,
) -> anyhow::Result<ExitCode> {
    let deadline = started + Duration::from_secs(args.timeout_s);
    let n = cluster.topology.host_count();
    let host = cluster
        .host_id(&args.host)
        .ok_or_else(|| UsageError(format!("no host named `{}`", args.host)))?;
    let h = usize::from(host);
    let node = SmmNode::new(SmmConfig {
        host,
        topology: Arc::new(cluster.topology.clone()),
        map: Arc::new(forks_map(n)),
        limits: SmmLimits::default(),
        record: false,
    });
    let mut smm = isotach_smm::Smm::new(node, link);
    // Current copies of the forks first (a philosopher may start while others eat).
    if let Err(e) = smm.join(deadline.saturating_duration_since(Instant::now())) {
        eprintln!("error: philosopher {}: joining: {e}", args.host);
        return Ok(ExitCode::from(EXIT_FAILED));
    }
    let params = PhiloParams {
        me: h,
        n,
        meals: args.meals,
        deadline,
        progress: Arc::new(AtomicU64::new(0)),
    };
    let out = match run_philosopher(&mut smm, &params) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(ExitCode::from(EXIT_FAILED));
        }
    };
    let (p50, p99, _) = latency_summary(&out.latencies_us);
    let s = PhiloSummary {
        host: args.host.clone(),
        meals: out.meals,
        retries: out.retries,
        elapsed_s: started.elapsed().as_secs_f64(),
        isochron_latency_p50_us: p50,
        isochron_latency_p99_us: p99,
        ok: out.meals == args.meals,
    };
    if args.json {
        println!("{}", serde_json::to_string(&s)?);
    } else {
        println!(
            "philosopher {}: {} meals ({} retries) in {:.2} s; isochron latency p50 {} µs, p99 {} µs",
            s.host,
            s.meals,
            s.retries,
            s.elapsed_s,
            s.isochron_latency_p50_us,
            s.isochron_latency_p99_us
        );
    }
    Ok(if s.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_FAILED)
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_config_default_tag_is_the_ports_default_tag() {
        assert_eq!(
            isotach_proto::config::DEFAULT_TAG,
            isotach_am::port::DEFAULT_TAG.0
        );
    }
}
