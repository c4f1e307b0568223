//! Event order on the host→SIU link while the SIU is paused.

use super::{Event, NetFaults, NodeId, Sim, SimConfig};
use crate::host::{Host, HostCtx};
use isotach_proto::config::ClusterConfig;
use isotach_proto::packet::{self, BarrierSignalMarker, EopMarker, Kind};
use isotach_siu::SiuError;

/// When the host acts (logical time runs by then).
const ACT_AT_US: u64 = 5_000;
/// How long SIU 0 is paused around that.
const PAUSE_US: u64 = 2_000;

/// A host that starts `apps` applications in a row, each entering barrier 0 (as a host does
/// after restarts of logical time in quick succession): attach, marker, attach, marker, ...
#[derive(Debug, Default)]
struct Apps {
    apps: u32,
    refused: Vec<String>,
    barrier_completions: u32,
}

fn start_barrier() -> Vec<u8> {
    let mut out = Vec::new();
    BarrierSignalMarker {
        barrier: 1,
        barrier_count: 1,
        ..BarrierSignalMarker::default()
    }
    .encode(&mut out);
    out
}

impl Host for Apps {
    fn on_start(&mut self, ctx: &mut HostCtx<'_>) {
        ctx.wake_at(ACT_AT_US, 0);
    }

    fn on_wake(&mut self, ctx: &mut HostCtx<'_>, _token: u64) {
        for _ in 0..self.apps {
            ctx.attach();
            ctx.send(start_barrier());
        }
    }

    fn on_packet(&mut self, _ctx: &mut HostCtx<'_>, bytes: &[u8]) {
        if packet::peek_kind(bytes) == Ok(Kind::EopMarker)
            && EopMarker::decode(bytes).is_ok_and(|e| e.barrier & 1 != 0)
        {
            self.barrier_completions += 1;
        }
    }

    fn on_refused(&mut self, _ctx: &mut HostCtx<'_>, _bytes: &[u8], error: &SiuError) {
        self.refused.push(error.to_string());
    }
}

/// A new application's attach travels the host→SIU link behind the previous application's
/// packets, paused SIU or not. It used to skip the pause: both attaches reached the SIU first,
/// then both barrier markers, and the SIU refused the second one as a barrier already in
/// progress (`isotach sim philo --seed 321 --philosophers 6 --switches 2 --meals 20 --loss
/// 0.02 --dup 0.02 --reorder 0.05 --token-corrupt 0.01 --pause-every-us 5000 --restarts 3
/// --restart-every-us 4000`, host 0, after two restarts of logical time at once). In order,
/// the second application takes over the barrier the first entered.
#[test]
fn an_attach_waits_behind_host_packets_while_the_siu_is_paused() {
    let cluster = ClusterConfig::generated(2, 1).unwrap();
    let cfg = SimConfig::new(1, cluster, NetFaults::default());
    // Host 0 starts two applications while its SIU is paused, host 1 one (the barrier
    // spans both hosts).
    let hosts = [2, 1]
        .map(|apps| Apps {
            apps,
            ..Apps::default()
        })
        .into();
    let mut sim = Sim::new(cfg, hosts, ()).unwrap();
    sim.run_for(ACT_AT_US - PAUSE_US / 2);
    assert!(
        sim.siu(0).started(),
        "logical time runs before the host acts"
    );
    let siu = NodeId::Siu(0);
    sim.runtime(siu).paused = true;
    sim.schedule(sim.now_us + PAUSE_US, Event::Resume { node: siu });
    sim.run_for(PAUSE_US * 4);
    let host = &sim.hosts()[0];
    assert_eq!(
        host.refused,
        Vec::<String>::new(),
        "the SIU refused a marker"
    );
    assert_eq!(host.barrier_completions, 1, "barrier 0 completes once");
}
