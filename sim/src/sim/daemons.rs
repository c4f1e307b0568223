//! Running a daemon: its pump at the current time, what it sends on the faulty network, what
//! it hands its in-process host, what the oracles learn from it, and its next timer.

use super::node::{self, Seen};
use super::{Event, NS_PER_US, NodeId, Sim};
use crate::host::{Host, Observer};
use isotach_am_proto::NodeAddr;
use isotach_daemon::pump::Verdict;
use isotach_proto::Generation;
use isotach_proto::topology::HostId;
use isotach_siu::{Route, Transmit};

impl<H: Host, O: Observer> Sim<H, O> {
    // -----------------------------------------------------------------------------------------
    // Running a daemon

    /// Tells SIU `host` its application attached.
    pub(super) fn attach(&mut self, host: HostId) {
        self.touch(host);
        let now = self.now();
        let n = &mut self.sius[usize::from(host)];
        if !n.attached && !n.rt.down {
            n.attached = true;
            n.pump.local_attach(now);
        }
    }

    /// Tells SIU `host` its application left.
    pub(super) fn detach(&mut self, host: HostId) {
        self.touch(host);
        let now = self.now();
        let n = &mut self.sius[usize::from(host)];
        if n.attached && !n.rt.down {
            n.attached = false;
            n.pump.local_detach(now);
            self.run_node(NodeId::Siu(host));
        }
    }

    /// Runs a daemon's pump at the current time and hands on everything it produced.
    pub(super) fn run_node(&mut self, node: NodeId) {
        if let NodeId::Siu(h) = node {
            self.touch(h);
        }
        let now = self.now();
        let rt = self.runtime(node);
        if rt.down || rt.paused {
            return;
        }
        let mut outbox = std::mem::take(&mut self.outbox);
        let result = match node {
            NodeId::Siu(h) => {
                let n = &mut self.sius[usize::from(h)];
                let r = n.pump.advance(now);
                while let Some(b) = n.backlog.pop_front() {
                    if let Err(b) = n.pump.local_send(b) {
                        self.stats.host_backpressure += 1;
                        n.backlog.push_front(b);
                        break;
                    }
                }
                let r = r.and_then(|()| n.pump.advance(now));
                while let Some((to, bytes)) = n.pump.poll_transmit(now) {
                    outbox.push((to, bytes.to_vec()));
                }
                r
            }
            NodeId::Tm(s) => {
                let n = &mut self.tms[usize::from(s)];
                let r = n.pump.advance(now);
                while let Some((to, bytes)) = n.pump.poll_transmit(now) {
                    outbox.push((to, bytes.to_vec()));
                }
                r
            }
            NodeId::Host(_) => unreachable!("hosts are not daemons"),
        };
        if let Err(e) = result {
            self.stats.net_errors += 1;
            self.unexpected_error("errors of a TM's or SIU's pump", format!("{node:?}: {e}"));
        }
        for (to, bytes) in outbox.drain(..) {
            self.transmit(node, to, bytes);
        }
        self.outbox = outbox;
        let lost = match node {
            NodeId::Siu(h) => self.sius[usize::from(h)].pump.links().stats().links_lost,
            NodeId::Tm(s) => self.tms[usize::from(s)].pump.links().stats().links_lost,
            NodeId::Host(_) => 0,
        };
        if lost > self.runtime(node).links_lost_seen {
            self.runtime(node).links_lost_seen = lost;
            self.links_lost += 1;
            self.observer.on_loss(self.now_us);
        }
        if let NodeId::Siu(h) = node {
            self.report_generation(h, false);
        }
        self.take_seen(node);
        if let NodeId::Siu(h) = node {
            self.hand_to_host(h);
            self.track_progress(h);
        }
        self.rearm(node);
    }

    /// What a wrapped role reported: token corruption outcomes, refusals, the SIU's traffic
    /// for the observer.
    pub(super) fn take_seen(&mut self, node: NodeId) {
        let seen = match node {
            NodeId::Siu(h) => std::mem::take(&mut self.sius[usize::from(h)].pump.role_mut().seen),
            NodeId::Tm(s) => std::mem::take(&mut self.tms[usize::from(s)].pump.role_mut().seen),
            NodeId::Host(_) => return,
        };
        let restarted = self.runtime(node).restarted;
        for s in seen {
            match s {
                Seen::NetIn {
                    corrupted: true,
                    verdict,
                } => {
                    self.stats.net.tokens_corrupted += 1;
                    if matches!(verdict, Verdict::Consumed) {
                        self.stats.corrupt_tokens_accepted += 1;
                        let what = format!("{node:?} accepted a corrupted token");
                        self.unexpected_error("corrupted tokens accepted", what);
                    } else {
                        self.stats.corrupt_tokens_dropped += 1;
                    }
                }
                Seen::NetIn { verdict, .. } => {
                    if restarted {
                        self.stats.net_refused_after_restart += 1;
                    } else {
                        self.stats.net_errors += 1;
                        let what = format!("{node:?} refused network input: {verdict:?}");
                        self.unexpected_error("intact network inputs a TM or SIU refused", what);
                    }
                }
                Seen::HostIn { bytes, refused } => {
                    let NodeId::Siu(host) = node else { continue };
                    self.observer
                        .on_siu_host_input(self.now_us, host, &bytes, refused.as_ref());
                    if let Some(e) = refused {
                        self.stats.host_refusals += 1;
                        if e == isotach_siu::SiuError::NotStarted {
                            self.stats.host_refusals_not_started += 1;
                        }
                        self.with_host(host, |h, ctx| h.on_refused(ctx, &bytes, &e));
                    }
                }
                Seen::NetOut {
                    to_tm,
                    bytes,
                    generation,
                } => {
                    let NodeId::Siu(host) = node else { continue };
                    // The oracle tags the stamp with the generation it was made in, which may
                    // be older than the SIU's now (queued before a restart).
                    let now_gen = self.generations[usize::from(host)];
                    if generation != now_gen {
                        self.observer
                            .on_siu_generation(self.now_us, host, generation, false);
                    }
                    let route = if to_tm { Route::Tm } else { Route::Host(host) };
                    let tx = Transmit { route, bytes };
                    self.observer.on_siu_transmit(self.now_us, host, &tx);
                    if generation != now_gen {
                        self.observer
                            .on_siu_generation(self.now_us, host, now_gen, false);
                    }
                }
            }
        }
    }

    /// Packets SIU `host` has for its in-process host go on the fixed-latency host link.
    pub(super) fn hand_to_host(&mut self, host: HostId) {
        let h = usize::from(host);
        let absent: Vec<Vec<u8>> = self.sius[h]
            .pump
            .role_mut()
            .inner
            .take_absent_seen()
            .collect();
        for bytes in absent {
            let at = self.sius[h].to_host.fixed_transit(self.now_us);
            self.schedule(at, Event::HostAbsent { host, bytes });
        }
        while let Some(bytes) = self.sius[h].pump.local_recv() {
            for bytes in self.tamper_host_bound(host, bytes) {
                let at = self.sius[h].to_host.fixed_transit(self.now_us);
                let incarnation = self.sius[h].rt.incarnation;
                self.schedule(
                    at,
                    Event::HostPacket {
                        host,
                        bytes,
                        incarnation,
                    },
                );
            }
        }
        self.ask_host_turn(host);
    }

    /// Host turns: SIU `host` holds a token for its host's turn and has not asked yet — the
    /// request follows the packets of the turn on the host link, and the host's answer to it
    /// follows what the host sent ([`Event::HostTurn`], [`Event::HostTurnEnd`]).
    fn ask_host_turn(&mut self, host: HostId) {
        let n = &mut self.sius[usize::from(host)];
        if n.turn_asked || !n.pump.role().inner.siu().host_turn_pending() {
            return;
        }
        n.turn_asked = true;
        let at = n.to_host.fixed_transit(self.now_us);
        let incarnation = n.rt.incarnation;
        let turn = Event::HostTurn {
            host,
            incarnation,
            reacted: false,
        };
        self.schedule(at, turn);
    }

    /// The host's turn is over: the SIU hears it in its next pass, after what the host sent.
    pub(super) fn end_host_turn(&mut self, host: HostId) {
        let n = &mut self.sius[usize::from(host)];
        n.turn_asked = false;
        n.pump.end_local_turn();
        self.stats.host_turns_ended += 1;
        self.run_node(NodeId::Siu(host));
    }

    /// Tells the observer when SIU `host`'s generation changed (or it is a new process).
    pub(super) fn report_generation(&mut self, host: HostId, fresh: bool) {
        let h = usize::from(host);
        let g = self.sius[h].pump.role().inner.siu().generation();
        if fresh || g != Generation::new(self.generations[h]) {
            // Generation 0: not started; its first start sends the host no reset EOP.
            let first_start = self.generations[h] == 0;
            self.generations[h] = g.get();
            self.observer
                .on_siu_generation(self.now_us, host, g.get(), fresh || first_start);
        }
    }

    pub(super) fn track_progress(&mut self, host: HostId) {
        let h = usize::from(host);
        let recv = self.sius[h].pump.role().inner.siu().recvclock();
        if recv == self.recvclocks[h] {
            return;
        }
        let was_min = self.recvclocks[h] == self.min_recvclock;
        self.recvclocks[h] = recv;
        if was_min || recv < self.min_recvclock {
            let min = self.recvclocks.iter().copied().min().unwrap_or(0);
            if min > self.min_recvclock
                || (min < self.min_recvclock && self.cfg.net.restarts.is_some())
            {
                // Progress; after a restart the clocks count from 1 again, which is progress
                // too (a new generation runs).
                self.progress_at_us = self.now_us;
            }
            self.min_recvclock = min;
        }
    }

    /// One datagram on the faulty network: lost, duplicated, delayed (so reordered).
    pub(super) fn transmit(&mut self, from: NodeId, to: NodeAddr, bytes: Vec<u8>) {
        let Some(dest) = node::node_at(to) else {
            return;
        };
        let faults = &self.cfg.net.faults;
        let rng = &mut self.net_rng;
        self.stats.net.datagrams += 1;
        if rng.chance(faults.loss) {
            self.stats.net.retransmissions += 1;
            return;
        }
        let base = *self
            .latency
            .entry((from, dest))
            .or_insert_with(|| faults.latency_us.draw(rng));
        let copies = if rng.chance(faults.dup) {
            self.stats.net.duplicates_absorbed += 1;
            2
        } else {
            1
        };
        let from_addr = node::addr(from);
        let mut bytes = Some(bytes);
        for copy in 0..copies {
            let rng = &mut self.net_rng;
            let faults = &self.cfg.net.faults;
            let mut at = self.now_us + base + faults.jitter_us.draw(rng);
            if rng.chance(faults.reorder) {
                at += faults.reorder_delay_us.draw(rng);
                self.stats.net.reordered += 1;
            }
            let bytes = if copy + 1 == copies {
                bytes.take().expect("the last copy takes it")
            } else {
                bytes.clone().expect("copies before the last")
            };
            self.schedule(
                at,
                Event::Datagram {
                    to: dest,
                    from: from_addr,
                    bytes,
                },
            );
        }
    }

    pub(super) fn rearm(&mut self, node: NodeId) {
        let now = self.now();
        let deadline = match node {
            NodeId::Siu(h) => self.sius[usize::from(h)].pump.poll_timeout(now),
            NodeId::Tm(s) => self.tms[usize::from(s)].pump.poll_timeout(now),
            NodeId::Host(_) => None,
        }
        .map(|t| t.0.div_ceil(NS_PER_US));
        let now_us = self.now_us;
        let rt = self.runtime(node);
        if rt.paused || rt.down || rt.timer_armed_us == deadline {
            return;
        }
        rt.timer_armed_us = deadline;
        if let Some(d) = deadline {
            self.schedule(
                d.max(now_us),
                Event::Timer {
                    node,
                    deadline_us: d,
                },
            );
        }
    }
}
