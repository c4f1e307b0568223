//! Faults of the daemons themselves: pauses, and crashes with a fresh process restarted in
//! their place.

use super::node::{self, Build};
use super::{Event, NodeId, Sim};
use crate::host::{Host, Observer};
use crate::rng::SimRng;
use isotach_proto::topology::{HostId, SwitchId};

impl<H: Host, O: Observer> Sim<H, O> {
    pub(super) fn pick_daemon(rng: &mut SimRng, sius: usize, tms: usize) -> NodeId {
        let pick = rng.below((sius + tms) as u64) as usize;
        if pick < sius {
            NodeId::Siu(pick as HostId)
        } else {
            NodeId::Tm((pick - sius) as SwitchId)
        }
    }

    pub(super) fn pause(&mut self) {
        let Some(p) = self.cfg.net.pauses else { return };
        self.schedule(self.now_us + p.every_us, Event::Pause);
        let node = Self::pick_daemon(&mut self.pause_rng, self.sius.len(), self.tms.len());
        let duration = p.duration_us.draw(&mut self.pause_rng);
        let rt = self.runtime(node);
        if rt.paused || rt.down {
            return;
        }
        rt.paused = true;
        self.stats.pauses += 1;
        self.schedule(self.now_us + duration, Event::Resume { node });
    }

    pub(super) fn resume(&mut self, node: NodeId) {
        let rt = self.runtime(node);
        if rt.down {
            return;
        }
        rt.paused = false;
        while let Some(ev) = self.runtime(node).deferred.pop_front() {
            self.handle(ev);
        }
        // Timers that came due while paused fire now.
        self.run_node(node);
    }

    /// A TM or SIU crashes: everything it held is gone; it comes back as a new process.
    pub(super) fn crash(&mut self) {
        let Some(r) = self.cfg.net.restarts else {
            return;
        };
        self.restarts_left = self.restarts_left.saturating_sub(1);
        if self.restarts_left > 0 {
            self.schedule(self.now_us + r.every_us, Event::Crash);
        }
        let node = Self::pick_daemon(&mut self.restart_rng, self.sius.len(), self.tms.len());
        let down_for = r.down_us.draw(&mut self.restart_rng);
        let rt = self.runtime(node);
        if rt.down {
            return;
        }
        rt.down = true;
        rt.paused = false;
        rt.deferred.clear();
        rt.timer_armed_us = None;
        rt.links_lost_seen = 0;
        self.stats.restarts += 1;
        self.observer.on_loss(self.now_us);
        self.schedule(self.now_us + down_for, Event::Revive { node });
    }

    pub(super) fn revive(&mut self, node: NodeId) {
        let incarnation = self.runtime(node).incarnation + 1;
        if let NodeId::Siu(h) = node {
            self.touch(h);
        }
        let build = Build::new(&self.cfg, &self.topology, &self.am, &self.siu_dir);
        match node {
            NodeId::Tm(s) => {
                self.tms[usize::from(s)].pump = node::tm_pump(&build, s, incarnation);
            }
            NodeId::Siu(h) => {
                let n = &mut self.sius[usize::from(h)];
                n.pump = node::siu_pump(&build, h, incarnation);
                n.backlog.clear();
                n.attached = false;
                n.detaching = false;
                n.turn_asked = false;
            }
            NodeId::Host(_) => unreachable!("only daemons restart"),
        }
        for n in &mut self.sius {
            n.rt.restarted = true;
        }
        for n in &mut self.tms {
            n.rt.restarted = true;
        }
        let rt = self.runtime(node);
        rt.down = false;
        rt.incarnation = incarnation;
        if let NodeId::Siu(host) = node {
            self.report_generation(host, true);
            // The application loses its SIU: it is told, and attaches to the new one.
            self.with_host(host, |h, ctx| h.on_siu_restart(ctx));
            if self.hosts[usize::from(host)].attached() {
                self.attach(host);
            }
        }
        self.run_node(node);
    }
}
