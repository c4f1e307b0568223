//! The hosts' side of the driver: a packet reaching a host, a host callback and what it asks
//! for (sends to its SIU, wakes, attaching and leaving), and which hosts ran.

use super::{Event, NodeId, Sim};
use crate::host::{Host, HostAction, HostCtx, Observer};
use isotach_daemon::pump::Role;
use isotach_daemon::siu::PEER_APP;
use isotach_proto::topology::HostId;

impl<H: Host, O: Observer> Sim<H, O> {
    /// Host `h` or its SIU ran (see [`Sim::run_until_hosts`]).
    pub(super) fn touch(&mut self, h: HostId) {
        let flag = &mut self.touched_flag[usize::from(h)];
        if !*flag {
            *flag = true;
            self.touched.push(h);
        }
    }

    pub(super) fn clear_touched(&mut self) {
        for h in std::mem::take(&mut self.touched) {
            self.touched_flag[usize::from(h)] = false;
        }
    }

    pub(super) fn host_packet(&mut self, host: HostId, bytes: Vec<u8>) {
        self.trace(NodeId::Host(host), &bytes);
        self.observer.on_host_packet(self.now_us, host, &bytes);
        let h = usize::from(host);
        if !self.hosts[h].attached() || !self.sius[h].attached {
            // On its way when the application left: back to the SIU, which answers requests
            // for the absent host.
            if !self.sius[h].rt.down {
                let now_us = self.now_us;
                self.sius[h]
                    .pump
                    .role_mut()
                    .undelivered(now_us, PEER_APP, bytes);
                self.run_node(NodeId::Siu(host));
            }
            return;
        }
        self.with_host(host, |h, ctx| h.on_packet(ctx, &bytes));
    }

    /// Runs a host callback and applies what it asked for.
    pub(super) fn with_host(&mut self, host: HostId, f: impl FnOnce(&mut H, &mut HostCtx<'_>)) {
        self.touch(host);
        let h = usize::from(host);
        let mut actions = std::mem::take(&mut self.actions);
        {
            let mut ctx = HostCtx {
                now_us: self.now_us,
                host,
                topology: &self.topology,
                rng: &mut self.host_rngs[h],
                actions: &mut actions,
                siu_generation: self.generations[h],
                siu_recvclock: self.recvclocks[h],
            };
            f(&mut self.hosts[h], &mut ctx);
        }
        // The application left: the SIU learns it after everything it sent, as a daemon
        // learns it after the data on the link.
        let left = self.sius[h].attached && !self.sius[h].detaching && !self.hosts[h].attached();
        for action in actions.drain(..) {
            match action {
                HostAction::Send { at_us, bytes } => {
                    let at = self.sius[h].from_host.fixed_transit(at_us);
                    let incarnation = self.sius[h].rt.incarnation;
                    self.schedule(
                        at,
                        Event::SiuHost {
                            host,
                            bytes,
                            incarnation,
                        },
                    );
                }
                HostAction::Wake { at_us, token } => {
                    self.schedule(at_us, Event::HostWake { host, token });
                }
                HostAction::Attach if self.sius[h].attached => {
                    // A new application on a link that stayed up: the SIU learns of it after
                    // everything the previous one sent (its hello follows their data).
                    let at = self.sius[h].from_host.fixed_transit(self.now_us);
                    self.schedule(at, Event::SiuReattach { host });
                }
                HostAction::Attach => {
                    self.attach(host);
                    self.run_node(NodeId::Siu(host));
                }
            }
        }
        if left {
            self.sius[h].detaching = true;
            let at = self.sius[h].from_host.fixed_transit(self.now_us);
            self.schedule(at, Event::SiuDetach { host });
        }
        self.actions = actions;
    }
}
