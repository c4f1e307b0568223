//! The admin gRPC service of the daemons (`--admin ADDR`); its client, `isotach status`, is in [`status`].
//!
//! The service and its messages are generated from `proto/admin.proto` by `build.rs`
//! (protox; no protoc). The daemon's driver loop publishes a snapshot of its state on a watch
//! channel every few milliseconds and records latencies in its [`Telemetry`]; `Status` reads
//! the latest snapshot, `Stats` the histograms, `SetLogLevel` swaps the log filter
//! ([`logs`]), `Shutdown` stops the daemon as SIGTERM does. [`metrics`] serves the same
//! numbers to Prometheus.

pub(crate) mod logs;
pub(crate) mod metrics;
mod status;

pub(crate) use status::{StatusArgs, run_status};

use isotach_am::backend::quic::QuicCounters;
use isotach_am::link::{LinkStats as PortStats, PeerStatus};
use isotach_daemon::run::{SiuSnapshot, TmSnapshot};
use isotach_daemon::telemetry::{HistSummary, Telemetry};
use isotach_siu::SiuStats;
use isotach_tm::TmStats;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::sync::{Notify, watch};
use tonic::{Request, Response, Status};

/// Code generated from `proto/admin.proto`.
#[allow(
    missing_debug_implementations,
    unreachable_pub,
    unused_qualifications,
    clippy::all,
    clippy::pedantic,
    clippy::use_self,
    missing_docs
)]
pub(crate) mod pb {
    tonic::include_proto!("isotach.admin");
}

use pb::admin_server::{Admin, AdminServer};
use pb::{
    Histogram, Peer, SetLogLevelReply, SetLogLevelRequest, ShutdownReply, ShutdownRequest,
    StatsReply, StatsRequest, StatusReply, StatusRequest,
};

/// The default admin address of a token manager.
pub(crate) const TM_ADMIN_DEFAULT: &str = "127.0.0.1:7070";
/// The default admin address of an SIU (and of `isotach status`).
pub(crate) const SIU_ADMIN_DEFAULT: &str = "127.0.0.1:7071";

/// Where a daemon's state comes from.
#[derive(Debug, Clone)]
pub(crate) enum Source {
    /// A token manager's snapshots.
    Tm(watch::Receiver<TmSnapshot>),
    /// An SIU's snapshots.
    Siu(watch::Receiver<SiuSnapshot>),
}

/// The admin service of one daemon.
#[derive(Debug, Clone)]
struct AdminService {
    name: String,
    source: Source,
    telemetry: Arc<Telemetry>,
    quic: Option<QuicCounters>,
    shutdown: Arc<Notify>,
}

fn map(entries: &[(&str, u64)]) -> HashMap<String, u64> {
    entries.iter().map(|&(k, v)| (k.to_string(), v)).collect()
}

fn port_counters(p: &PortStats) -> [(&'static str, u64); 16] {
    [
        ("port.packets_sent", p.packets_sent),
        ("port.packets_received", p.packets_received),
        ("port.unknown_peer", p.unknown_peer),
        ("port.oversize", p.oversize),
        ("port.fragments_lost", p.fragments_lost),
        ("port.hellos", p.hellos),
        ("port.links_lost", p.links_lost),
        ("port.fragments_dropped", p.fragments_dropped),
        ("port.inbox_overflow", p.inbox_overflow),
        ("port.batches_sent", p.batches_sent),
        ("port.packets_in_batches", p.packets_in_batches),
        ("port.batches_received", p.batches_received),
        ("port.packets_batched", p.packets_batched),
        ("port.batch_bad_version", p.batch_bad_version),
        ("port.batch_truncated", p.batch_truncated),
        ("port.batch_mid_packet", p.batch_mid_packet),
    ]
}

/// The QUIC transport's counters of failed handshakes and lost datagrams (`quic.*`).
fn quic_counters(q: &QuicCounters) -> [(&'static str, u64); 6] {
    [
        ("quic.handshakes_refused", q.refused()),
        ("quic.connects_failed", q.connects_failed()),
        ("quic.datagrams_refused", q.send_refused()),
        ("quic.datagrams_dropped", q.send_dropped()),
        ("quic.datagrams_recv_dropped", q.recv_dropped()),
        ("quic.transmits_failed", q.send_failed()),
    ]
}

fn peers(status: &[PeerStatus], name: impl Fn(usize) -> String) -> Vec<Peer> {
    status
        .iter()
        .enumerate()
        .map(|(i, p)| Peer {
            name: name(i),
            addr: format!("{:?}", p.addr),
            up: p.up,
            queued: p.queued as u64,
            links_lost: p.links_lost,
            idle: p.idle,
        })
        .collect()
}

fn histogram(h: &HistSummary) -> Histogram {
    Histogram {
        name: h.name.to_string(),
        count: h.count,
        min_us: h.min_us,
        p50_us: h.p50_us,
        p90_us: h.p90_us,
        p99_us: h.p99_us,
        p999_us: h.p999_us,
        max_us: h.max_us,
        mean_us: h.mean_us,
    }
}

fn tm_counters(s: &TmStats) -> [(&'static str, u64); 14] {
    [
        ("waves", s.waves),
        ("tokens_accepted", s.tokens_accepted),
        ("tokens_duplicate", s.tokens_duplicate),
        ("tokens_early", s.tokens_early),
        ("tokens_dropped", s.tokens_dropped),
        ("tokens_repeated", s.tokens_repeated),
        ("waves_paced", s.waves_paced),
        ("waves_released", s.waves_released),
        ("messages_forwarded", s.messages_forwarded),
        ("messages_held", s.messages_held),
        ("riding_released_for_room", s.riding_released_for_room),
        ("barrier_rounds", s.barrier_rounds),
        ("resets", s.resets),
        ("errors", s.errors),
    ]
}

fn siu_counters(s: &SiuStats) -> [(&'static str, u64); 27] {
    [
        ("tokens_sent", s.tokens_sent),
        ("tokens_repeated", s.tokens_repeated),
        ("tokens_busy", s.tokens_busy),
        ("tokens_wake", s.tokens_wake),
        ("tokens_held_for_host", s.tokens_held_for_host),
        ("tokens_held_for_reply", s.tokens_held_for_reply),
        ("isochrons_in_turn", s.isochrons_in_turn),
        ("tokens_accepted", s.tokens_accepted),
        ("tokens_duplicate", s.tokens_duplicate),
        ("tokens_early", s.tokens_early),
        ("tokens_bad", s.tokens_bad),
        ("tokens_stale", s.tokens_stale),
        ("resets", s.resets),
        ("eops_sent", s.eops_sent),
        ("isochrons", s.isochrons),
        ("isochrons_forced_closed", s.isochrons_forced_closed),
        ("messages_sent", s.messages_sent),
        ("messages_delivered", s.messages_delivered),
        ("messages_late", s.messages_late),
        ("messages_refused", s.messages_refused),
        ("markers_sent", s.markers_sent),
        ("barriers_completed", s.barriers_completed),
        ("plain_to_net", s.plain_to_net),
        ("plain_to_host", s.plain_to_host),
        ("errors", s.errors),
        ("absent_dropped", s.absent_dropped),
        ("absent_replies", s.absent_replies),
    ]
}

impl AdminService {
    fn reply(&self) -> StatusReply {
        let mut reply = self.state();
        if let Some(q) = &self.quic {
            reply.counters.extend(map(&quic_counters(q)));
        }
        reply
    }

    /// The status from the daemon's latest snapshot.
    fn state(&self) -> StatusReply {
        match &self.source {
            Source::Tm(rx) => {
                let s = rx.borrow().clone();
                let mut counters = map(&tm_counters(&s.stats));
                counters.extend(map(&port_counters(&s.port)));
                let up = s.peers.iter().filter(|p| p.up).count();
                counters.insert("peers_up".into(), up as u64);
                counters.insert("links".into(), s.peers.len() as u64);
                StatusReply {
                    role: "tm".into(),
                    name: self.name.clone(),
                    started: s.started,
                    generation: s.generation,
                    uptime_ms: s.uptime_us / 1000,
                    waves: s.waves,
                    sendclock: 0,
                    recvclock: 0,
                    queues: map(&[("out", s.queue_depth as u64), ("held", s.held as u64)]),
                    counters,
                    pulse_rate_per_s: s.wave_rate_per_s,
                    peers: peers(&s.peers, |i| {
                        s.peer_names
                            .get(i)
                            .cloned()
                            .unwrap_or_else(|| format!("link {i}"))
                    }),
                    outstanding_isochrons: 0,
                }
            }
            Source::Siu(rx) => {
                let s = rx.borrow().clone();
                let mut counters = map(&siu_counters(&s.stats));
                counters.extend(map(&port_counters(&s.port)));
                StatusReply {
                    role: "siu".into(),
                    name: self.name.clone(),
                    started: s.started,
                    generation: s.generation,
                    uptime_ms: s.uptime_us / 1000,
                    waves: 0,
                    sendclock: s.sendclock,
                    recvclock: s.recvclock,
                    queues: map(&[
                        ("to_host", s.to_host as u64),
                        ("to_net", s.to_net as u64),
                        ("host_held", s.host_held as u64),
                        ("net_held", s.net_held as u64),
                        ("pending_pulse_packets", s.pending_pulse_packets),
                    ]),
                    counters,
                    pulse_rate_per_s: s.pulse_rate_per_s,
                    peers: peers(&s.peers, |i| {
                        s.peer_names
                            .get(i)
                            .cloned()
                            .unwrap_or_else(|| format!("peer {i}"))
                    }),
                    outstanding_isochrons: s.outstanding_isochrons,
                }
            }
        }
    }

    fn metrics(&self) -> String {
        metrics::render(&self.reply(), &self.telemetry.summaries())
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    async fn status(&self, _: Request<StatusRequest>) -> Result<Response<StatusReply>, Status> {
        Ok(Response::new(self.reply()))
    }

    async fn stats(&self, r: Request<StatsRequest>) -> Result<Response<StatsReply>, Status> {
        let histograms = self.telemetry.summaries().iter().map(histogram).collect();
        if r.into_inner().reset {
            self.telemetry.reset();
        }
        Ok(Response::new(StatsReply { histograms }))
    }

    async fn set_log_level(
        &self,
        r: Request<SetLogLevelRequest>,
    ) -> Result<Response<SetLogLevelReply>, Status> {
        let filter = r.into_inner().filter;
        let previous = logs::set_filter(&filter).map_err(Status::invalid_argument)?;
        tracing::info!(%filter, %previous, "log filter replaced over the admin service");
        Ok(Response::new(SetLogLevelReply { previous }))
    }

    async fn shutdown(
        &self,
        _: Request<ShutdownRequest>,
    ) -> Result<Response<ShutdownReply>, Status> {
        tracing::info!("shutdown requested over the admin service");
        self.shutdown.notify_one();
        Ok(Response::new(ShutdownReply {}))
    }
}

/// What a daemon exposes: its name, snapshots and histograms.
#[derive(Debug)]
pub(crate) struct Exposed {
    /// The switch or host name.
    pub(crate) name: String,
    /// Its snapshots.
    pub(crate) source: Source,
    /// Its histograms.
    pub(crate) telemetry: Arc<Telemetry>,
    /// Its QUIC transport's counters (`None` over UDP).
    pub(crate) quic: Option<QuicCounters>,
}

/// Binds `addr` and serves the admin service of a daemon on the current runtime, plus the
/// Prometheus endpoint on `metrics` if given. Returns the bound admin address (port 0 picks a
/// free one) and a notifier the service fires on `Shutdown`.
pub(crate) async fn serve(
    addr: SocketAddr,
    metrics_addr: Option<SocketAddr>,
    exposed: Exposed,
) -> anyhow::Result<(SocketAddr, Arc<Notify>)> {
    let incoming = tonic::transport::server::TcpIncoming::bind(addr)
        .map_err(|e| anyhow::anyhow!("admin: bind {addr}: {e}"))?;
    let local = incoming.local_addr()?;
    let shutdown = Arc::new(Notify::new());
    let svc = AdminService {
        name: exposed.name,
        source: exposed.source,
        telemetry: exposed.telemetry,
        quic: exposed.quic,
        shutdown: Arc::clone(&shutdown),
    };
    if let Some(m) = metrics_addr {
        let view = svc.clone();
        metrics::serve(m, Arc::new(move || view.metrics())).await?;
    }
    tokio::spawn(async move {
        let r = tonic::transport::Server::builder()
            .add_service(AdminServer::new(svc))
            .serve_with_incoming(incoming)
            .await;
        if let Err(e) = r {
            tracing::error!(%e, "admin service stopped");
        }
    });
    tracing::info!(admin = %local, "admin service listening");
    Ok((local, shutdown))
}

/// Serves only the Prometheus endpoint (the daemon runs with `--no-admin --metrics ADDR`).
pub(crate) async fn serve_metrics_only(addr: SocketAddr, exposed: Exposed) -> anyhow::Result<()> {
    let view = AdminService {
        name: exposed.name,
        source: exposed.source,
        telemetry: exposed.telemetry,
        quic: exposed.quic,
        shutdown: Arc::new(Notify::new()),
    };
    metrics::serve(addr, Arc::new(move || view.metrics())).await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use isotach_am::backend::quic::{
        CONNECT_QUEUE, QuicConfig, QuicTransport, make_ca, make_node_identity,
    };
    use isotach_am::{NodeAddr, Transport};

    /// A TM's admin service over a real QUIC transport that dropped datagrams: more than
    /// `CONNECT_QUEUE` sent towards an address that never completes a handshake.
    #[test]
    fn quic_losses_are_in_the_status_and_the_metrics() {
        let ca = make_ca("test CA").unwrap();
        let id = make_node_identity(&ca, "tm0").unwrap();
        let mut t =
            QuicTransport::bind(QuicConfig::new("127.0.0.1:0".parse().unwrap(), id)).unwrap();
        let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = NodeAddr::Ip(silent.local_addr().unwrap());
        for _ in 0..1 + CONNECT_QUEUE + 5 {
            t.send(to, b"x").unwrap();
        }
        // Sends reach quinn (and the counters) when flushed.
        t.flush().unwrap();
        let (_tx, rx) = watch::channel(TmSnapshot::default());
        let svc = AdminService {
            name: "tm0".into(),
            source: Source::Tm(rx),
            telemetry: Arc::new(Telemetry::new(&[])),
            quic: Some(t.counters()),
            shutdown: Arc::new(Notify::new()),
        };
        let reply = svc.reply();
        let dropped = reply.counters["quic.datagrams_dropped"];
        assert!(dropped >= 5, "{reply:?}");
        for key in [
            "quic.datagrams_refused",
            "quic.datagrams_recv_dropped",
            "quic.handshakes_refused",
            "quic.connects_failed",
        ] {
            assert!(reply.counters.contains_key(key), "{key}: {reply:?}");
        }
        let line =
            format!("isotach_quic_datagrams_dropped_total{{role=\"tm\",name=\"tm0\"}} {dropped}");
        let text = svc.metrics();
        assert!(
            text.lines().any(|l| l == line),
            "missing `{line}` in\n{text}"
        );
        // `isotach status --json` shows them with the other counters.
        let v = status::json(&reply, None);
        assert_eq!(v["counters"]["quic.datagrams_dropped"], dropped);
        // Over UDP there is no QUIC transport: no `quic.*` counters.
        let udp = AdminService { quic: None, ..svc };
        assert!(!udp.reply().counters.keys().any(|k| k.starts_with("quic.")));
    }
}
