//! What the SIU and TM harnesses share: the limits and timing a config could give, the fuzz
//! cluster, time passing, and packets built from fuzz bytes.

use super::*;

/// Links of the busiest token manager of `topology` (hosts plus neighbour switches).
pub(super) fn busiest_tm_links(topology: &Topology) -> usize {
    (0..topology.switch_count())
        .map(|s| {
            let s = SwitchId::try_from(s).expect("switch ids fit");
            topology.hosts_at(s).count() + topology.switch_neighbours(s).len()
        })
        .max()
        .unwrap_or(0)
}

/// Limits and timing a config file could give for `topology`, small ones when `small` so
/// queues, windows and isochron limits are actually reached: each at or just above the lowest
/// value `check_bounds` accepts (its [`BOUNDS`](isotach_proto::config::BOUNDS), raised by the
/// topology where it says so). Panics if they do not pass `check_bounds`: the state machines
/// assert the bounds the config loader keeps, so a harness that built values no config can
/// give would only find its own mistakes.
pub(super) fn limits_timing(
    flags: u8,
    topology: &Topology,
    inp: &mut Input<'_>,
) -> (Limits, Timing) {
    let reach = u32::from(topology.max_distance());
    let small = flags & 0x02 != 0;
    let limits = if small {
        let queue_min = QUEUE_PACKETS_MAX_MIN.max(2 * busiest_tm_links(topology));
        Limits {
            channels: CHANNELS_MIN + inp.u8() % 4,
            isochron_messages_max: ISOCHRON_MESSAGES_MAX_MIN + u32::from(inp.u8() % 4),
            // More than twice the largest logical distance.
            pulses_ahead_max: PULSES_AHEAD_MAX_MIN.max(2 * reach + 1) + u32::from(inp.u8() % 5),
            queue_packets_max: queue_min + usize::from(inp.u8() % 12),
            isochron_open_us_max: ISOCHRON_OPEN_US_MAX_MIN + u64::from(inp.u16()),
        }
    } else {
        Limits::default()
    };
    let token_timeout_us = TOKEN_TIMEOUT_US_MIN + u64::from(inp.u16());
    let timing = Timing {
        token_timeout_us,
        // More than the largest logical distance.
        epoch_pulses: EPOCH_PULSES_MIN.max(reach + 1) + u32::from(inp.u8() % 8),
        // Off, or at most half the token timeout (`check_bounds`).
        idle_pace_us: u64::from(inp.u16()) % (token_timeout_us / 2 + 1),
    };
    if let Err((key, why)) = check_bounds(&timing, &limits, topology) {
        panic!("the fuzz harness built {key} = {why}: {limits:?} {timing:?}");
    }
    (limits, timing)
}

/// The cluster a state-machine run starts from, read from the head of the fuzz input: flags
/// (bit 0 host mode, bit 1 small limits, bit 2 the SIU initiates the reset), a line topology
/// of 1-8 hosts over 1-4 switches (no more switches than hosts), the node's index byte (reduced by the caller), then limits
/// and timing.
pub(super) struct FuzzCluster {
    pub(super) flags: u8,
    pub(super) hosts: usize,
    pub(super) switches: usize,
    pub(super) node: u8,
    pub(super) topology: Arc<Topology>,
    pub(super) limits: Limits,
    pub(super) timing: Timing,
}

impl FuzzCluster {
    pub(super) fn read(inp: &mut Input<'_>) -> Self {
        let flags = inp.u8();
        let hosts = 1 + usize::from(inp.u8() % 8);
        // Every switch of a line takes a host (`TopologyError::TooFewHosts`).
        let switches = 1 + usize::from(inp.u8()) % hosts.min(4);
        let node = inp.u8();
        let topology = Arc::new(Topology::line(hosts, switches).expect("a line topology is valid"));
        let (limits, timing) = limits_timing(flags, &topology, inp);
        Self {
            flags,
            hosts,
            switches,
            node,
            topology,
            limits,
            timing,
        }
    }

    /// The SIU of the host the node byte picks (flags: mode, whether it initiates the reset,
    /// host turns).
    pub(super) fn siu_config(self) -> SiuConfig {
        SiuConfig {
            host: (usize::from(self.node) % self.hosts) as u16,
            mode: if self.flags & 0x01 != 0 {
                Mode::Host
            } else {
                Mode::Siu
            },
            topology: self.topology,
            timing: self.timing,
            limits: self.limits,
            initiates_reset: self.flags & 0x04 != 0,
            host_turns: self.flags & 0x08 != 0,
        }
    }

    /// The token manager of the switch the node byte picks.
    pub(super) fn tm_config(self) -> TmConfig {
        TmConfig {
            switch: (usize::from(self.node) % self.switches) as u16,
            topology: self.topology,
            timing: self.timing,
            limits: self.limits,
        }
    }
}

/// The timers of a state machine, as the op loops drive them.
pub(super) trait Timers {
    fn poll_timeout(&self) -> Option<u64>;
    fn handle_timeout(&mut self, now_us: u64);
}

impl Timers for Siu {
    fn poll_timeout(&self) -> Option<u64> {
        Siu::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now_us: u64) {
        Siu::handle_timeout(self, now_us)
    }
}

impl Timers for TokenManager {
    fn poll_timeout(&self) -> Option<u64> {
        TokenManager::poll_timeout(self)
    }
    fn handle_timeout(&mut self, now_us: u64) {
        TokenManager::handle_timeout(self, now_us)
    }
}

/// Time passes, by a fuzzed step or (`to_deadline`) up to the machine's next timer; its timers
/// run.
pub(super) fn pass_time(
    m: &mut impl Timers,
    inp: &mut Input<'_>,
    now: &mut u64,
    to_deadline: bool,
) {
    if to_deadline {
        if let Some(t) = m.poll_timeout() {
            *now = (*now).max(t);
        }
    } else {
        *now += u64::from(inp.u16());
    }
    m.handle_timeout(*now);
}

/// A token built from fuzz bytes; `port`/`generation` are the plausible values, which the
/// fuzzer may override.
pub(super) fn fuzz_token(inp: &mut Input<'_>, port: u16, generation: Generation) -> Token {
    let f = inp.u8();
    let g = inp.u8();
    Token {
        seq: WaveSeq::from_bits(f),
        repeat: f & 0x04 != 0,
        reset: f & 0x08 != 0,
        end_of_epoch: f & 0x10 != 0,
        restart: g & 0x40 != 0,
        busy: g & 0x20 != 0,
        barrier: (f >> 5) & 3,
        signals: if f & 0x80 != 0 { inp.u8() } else { 0 },
        source_port: if g & 0x80 != 0 { inp.u16() } else { port },
        generation: match g & 3 {
            0 => generation,
            1 => generation.next(),
            2 => Generation::new(generation.get().wrapping_sub(1)),
            _ => Generation::new(inp.u32()),
        },
    }
}

pub(super) fn fuzz_sref(inp: &mut Input<'_>) -> Sref {
    let f = inp.u8();
    if f % 7 >= 5 {
        let width = if f & 0x80 != 0 {
            Width::W64
        } else {
            Width::W32
        };
        let op = match inp.u8() % 3 {
            0 => RmwOp::Add,
            1 => RmwOp::CompareAndSwap,
            _ => RmwOp::Apply(u16::from(inp.u8() % 4)),
        };
        let arg2 = if op == RmwOp::CompareAndSwap {
            inp.u64() & width.max_value()
        } else {
            0
        };
        Sref::Rmw(RmwSref {
            op,
            width,
            addr: u64::from(inp.u16()),
            arg: inp.u64() & width.max_value(),
            arg2,
            ref_id: u32::from(inp.u8()),
            answer: f & 0x40 != 0,
        })
    } else if f % 7 == 4 {
        let n = usize::from(inp.u8() % 48);
        Sref::Msg {
            handler: u16::from(inp.u8()),
            payload: inp.take(n).to_vec(),
        }
    } else {
        let op = [SrefOp::Read, SrefOp::Write, SrefOp::Sched, SrefOp::Assign][usize::from(f % 7)];
        let width = if f & 0x80 != 0 {
            Width::W64
        } else {
            Width::W32
        };
        Sref::Mem {
            op,
            width,
            addr: u64::from(inp.u16()),
            value: inp.u64() & width.max_value(),
            ref_id: u32::from(inp.u8()),
        }
    }
}

pub(super) fn fuzz_message(inp: &mut Input<'_>, hosts: usize) -> IsotachMessage {
    IsotachMessage {
        ts: Pulse::ZERO,
        source: 0,
        dest: u16::from(inp.u8()) % (hosts as u16 + 1),
        sequum: 0,
        generation: Generation::NONE,
        sref: fuzz_sref(inp),
    }
}

/// Maybe flips one byte of an encoded packet (a corrupted or malformed packet).
pub(super) fn maybe_corrupt(inp: &mut Input<'_>, flag: bool, bytes: &mut [u8]) {
    if flag && !bytes.is_empty() {
        let at = usize::from(inp.u8()) % bytes.len();
        bytes[at] ^= inp.u8() | 1;
    }
}

pub(super) fn encode(p: &Packet) -> Vec<u8> {
    p.to_vec()
}

/// `p` encoded, one byte maybe flipped (`corrupt`).
pub(super) fn encode_maybe_corrupt(inp: &mut Input<'_>, corrupt: bool, p: &Packet) -> Vec<u8> {
    let mut b = encode(p);
    maybe_corrupt(inp, corrupt, &mut b);
    b
}

/// A token built from fuzz fields (see [`fuzz_token`]), encoded, one byte maybe flipped.
pub(super) fn fuzz_token_bytes(
    inp: &mut Input<'_>,
    corrupt: bool,
    port: u16,
    generation: Generation,
) -> Vec<u8> {
    let t = fuzz_token(inp, port, generation);
    let mut b = t.to_bytes().to_vec();
    maybe_corrupt(inp, corrupt, &mut b);
    b
}

/// A non-isotach message built from fuzz fields, encoded, one byte maybe flipped.
pub(super) fn fuzz_plain_bytes(inp: &mut Input<'_>, corrupt: bool) -> Vec<u8> {
    let n = usize::from(inp.u8());
    let m = PlainMessage {
        source: u16::from(inp.u8() % 8),
        dest: u16::from(inp.u8() % 9),
        payload: inp.take(n).to_vec(),
    };
    encode_maybe_corrupt(inp, corrupt, &Packet::Plain(m))
}

/// Every packet a state machine emits must decode.
pub(super) fn must_decode(bytes: &[u8], who: &str) -> Packet {
    match Packet::decode(bytes) {
        Ok(p) => p,
        Err(e) => panic!("{who} emitted an undecodable packet ({e}): {bytes:02x?}"),
    }
}

/// The port a hop is known by.
pub(super) fn hop_port(h: Hop) -> u16 {
    match h {
        Hop::Host(h) => Topology::host_port(h),
        Hop::Switch(s) => Topology::switch_port(s),
    }
}

/// Drives an input with a buffer the state machine may take, checked: consumed, the buffer is
/// taken whole or left as it was; refused or not consumed, it is left as it was.
pub(super) fn owned_input<E: std::fmt::Display>(
    bytes: Vec<u8>,
    input: impl FnOnce(&mut Vec<u8>) -> Result<(), E>,
) {
    let mut buf = bytes.clone();
    match input(&mut buf) {
        Ok(()) => assert!(buf.is_empty() || buf == bytes, "a buffer taken in part"),
        Err(e) => assert_eq!(buf, bytes, "refused ({e}) yet its buffer changed"),
    }
}
