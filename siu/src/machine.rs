//! The SIU state machine: the [`Siu`] struct, its constructor, observers, output queues and
//! timers. The rules live in one file per concept under `machine/`:
//!
//! - `input.rs`: which handler an input goes to, back-pressure before anything is consumed,
//!   and non-isotach traffic passed straight through (requirements 20, 22).
//! - `tokens.rs`: tokens and waves — `sendclock`/`recvclock`, when a token may go out, tokens
//!   from the network and (host mode) from the host, restarts, the lost-token timer.
//! - `isochrons.rs`: isochrons from the host — their TS (requirements 24-29), stamping their
//!   messages, closing them and returning their markers.
//! - `eop.rs`: the host-bound side of a pulse — isotach messages from the network counted per
//!   TS, and the EOP marker with its sort vector when the pulse ends.
//! - `barriers.rs`: barrier rounds and signals the host raised, carried on tokens.
//! - `absent.rs`: no application attached, and a (new) application attaching.
//! - `host_turn.rs`: with an in-process host, the token a significant pulse allows waits for
//!   the host's turn at its EOP, so the isochron it answers with is stamped a pulse sooner.
//! - `pacing.rs`: idle pacing — whether this SIU's tokens say BUSY, and the wake-up repeat
//!   that asks an idle token manager for speed.
//!
//! Per-pulse counting and sort vectors are kept by `crate::pulse`; the counters are
//! [`SiuStats`], bumped where each event happens.

mod absent;
mod barriers;
mod eop;
mod host_turn;
mod input;
mod isochrons;
mod pacing;
mod tokens;

use self::barriers::Barrier;
use self::isochrons::OpenIsochron;
use self::pacing::Pacing;
use crate::pulse::PulseLog;
use crate::{Mode, SiuConfig, SiuStats, Transmit};
use isotach_proto::Generation;
use isotach_proto::config::CHANNELS_MIN;
use isotach_proto::packet::{BARRIERS, BufPool};
use isotach_proto::topology::{HostId, Topology};
use isotach_proto::wave::LastTwo;
use std::collections::{BTreeMap, VecDeque};

/// Sequence sets per channel (requirement 27: an isochron is ordered after the latest logged
/// one of the other set).
const SEQUENCE_SETS: usize = 2;

/// A switch interface unit. See the crate documentation.
#[derive(Debug)]
pub struct Siu {
    cfg: SiuConfig,
    /// Source port of this SIU's tokens and of its token manager's tokens.
    port: u16,
    tm_port: u16,
    started: bool,
    generation: Generation,
    /// Tokens sent to the network (normal ones; repeats do not count).
    sendclock: u64,
    /// In-sequence tokens received from the network.
    recvclock: u64,
    last_two: LastTwo,
    token_deadline_us: Option<u64>,
    next_sequum: u64,
    open: Option<OpenIsochron>,
    /// `latest_ts[channel][set]`: TS of the latest logged isochron (requirement 27). Kept
    /// absolute: 64-bit clocks do not wrap, so `gap = latest_ts - sendclock` is derived.
    latest_ts: Vec<[u64; SEQUENCE_SETS]>,
    /// This host's isochrons by TS, for pulses not yet ended (at most one entry per pulse of
    /// the window ahead of `recvclock`).
    outstanding: BTreeMap<u64, u32>,
    barriers: [Barrier; BARRIERS],
    /// Signals (and the reset signal) the host raised that have not gone out on a token.
    signals_raised: u8,
    reset_signal_raised: bool,
    pulses: PulseLog,
    to_host: VecDeque<Vec<u8>>,
    to_net: VecDeque<Transmit>,
    /// Largest TS of an isotach message handed to the host in this generation.
    host_ts_max: u64,
    /// The host was handed a reset EOP: its application's session ended, and its isotach
    /// packets are refused until a new application attaches.
    host_session_ended: bool,
    /// Idle pacing: what makes this SIU's tokens BUSY, and its wake-ups.
    pacing: Pacing,
    /// Host turns: the next token waits for the host's turn at an EOP.
    token_awaits_host: bool,
    /// Host turns: a plain packet (a reply) reached the host since its last turn ended.
    host_fed_plain: bool,
    /// Buffers for the packets this SIU builds (tokens, EOP and isochron markers), handed in
    /// by its driver ([`Siu::buffers`]).
    pool: BufPool,
    /// The last EOP marker's sort vector, written over by the next (`eop.rs`).
    sort_scratch: Vec<u8>,
    stats: SiuStats,
}

impl Siu {
    /// A new SIU; it waits for a reset token (or [`Siu::start`] if it initiates the reset).
    pub fn new(cfg: SiuConfig) -> Self {
        assert!(
            usize::from(cfg.host) < cfg.topology.host_count(),
            "host not in topology"
        );
        let port = Topology::host_port(cfg.host);
        let tm_port = Topology::switch_port(cfg.topology.switch_of(cfg.host));
        // The config loader (and `check_bounds`) refuse fewer: every isochron names a channel,
        // and `latest_ts` keeps a row per channel.
        assert!(
            cfg.limits.channels >= CHANNELS_MIN,
            "limits.channels is {}, below {CHANNELS_MIN}",
            cfg.limits.channels
        );
        let channels = usize::from(cfg.limits.channels);
        let pulses = PulseLog::new(cfg.limits.pulses_ahead_max);
        Self {
            port,
            tm_port,
            started: false,
            generation: Generation::NONE,
            sendclock: 0,
            recvclock: 0,
            last_two: LastTwo::default(),
            token_deadline_us: None,
            next_sequum: 0,
            open: None,
            latest_ts: vec![[0; SEQUENCE_SETS]; channels],
            outstanding: BTreeMap::new(),
            barriers: [Barrier::default(); BARRIERS],
            signals_raised: 0,
            reset_signal_raised: false,
            pulses,
            to_host: VecDeque::new(),
            to_net: VecDeque::new(),
            host_ts_max: 0,
            host_session_ended: false,
            pacing: Pacing::default(),
            token_awaits_host: false,
            host_fed_plain: false,
            pool: BufPool::default(),
            sort_scratch: Vec::new(),
            stats: SiuStats::default(),
            cfg,
        }
    }

    // ---------------------------------------------------------------------------------------
    // Observers

    /// The configuration.
    pub fn config(&self) -> &SiuConfig {
        &self.cfg
    }
    /// The host this SIU serves.
    pub fn host(&self) -> HostId {
        self.cfg.host
    }
    /// SIU or host mode.
    pub fn mode(&self) -> Mode {
        self.cfg.mode
    }
    /// Logical time has started (a reset token was sent or received).
    pub fn started(&self) -> bool {
        self.started
    }
    /// Current logical-time generation.
    pub fn generation(&self) -> Generation {
        self.generation
    }
    /// Normal tokens sent in this generation.
    pub fn sendclock(&self) -> u64 {
        self.sendclock
    }
    /// In-sequence tokens received in this generation: the current pulse.
    pub fn recvclock(&self) -> u64 {
        self.recvclock
    }
    /// `gap[channel][set]`: how far the latest logged TS is ahead of the sendclock.
    pub fn gap(&self, channel: u8, set: u8) -> u64 {
        self.latest_ts.get(usize::from(channel)).map_or(0, |l| {
            l[usize::from(set & 1)].saturating_sub(self.sendclock)
        })
    }
    /// The buffers this SIU builds its tokens and markers in: its driver hands it buffers it is
    /// done with (a received packet's, a spare of its links') so that those cost no allocation
    /// once buffers circulate (`isotach_proto::packet::BufPool`).
    pub fn buffers(&mut self) -> &mut BufPool {
        &mut self.pool
    }

    /// Counters.
    pub fn stats(&self) -> SiuStats {
        self.stats
    }
    /// Isotach packets handed to the host for pulses not yet ended.
    pub fn pending_pulse_packets(&self) -> u64 {
        self.pulses.pending()
    }
    /// This host's isochrons stamped for pulses that have not ended yet.
    pub fn outstanding_isochrons(&self) -> u64 {
        self.outstanding.values().map(|&n| u64::from(n)).sum()
    }
    /// Packets queued for the host and the network.
    pub fn queue_depths(&self) -> (usize, usize) {
        (self.to_host.len(), self.to_net.len())
    }

    // ---------------------------------------------------------------------------------------
    // Output

    /// Next packet for the host.
    pub fn poll_host(&mut self) -> Option<Vec<u8>> {
        self.to_host.pop_front()
    }

    /// Next packet for the network side.
    pub fn poll_net(&mut self) -> Option<Transmit> {
        self.to_net.pop_front()
    }

    // ---------------------------------------------------------------------------------------
    // Timers

    /// When [`Siu::handle_timeout`] wants to run next.
    /// A token waiting for the host's turn is not a timer: the driver ends the turn
    /// ([`Siu::end_host_turn`]) before it sleeps.
    pub fn poll_timeout(&self) -> Option<u64> {
        match (self.token_deadline_us, self.isochron_deadline_us()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs timers: the open-isochron limit, then the token timer (resend the last two tokens,
    /// marked repeat: requirement 9).
    pub fn handle_timeout(&mut self, now_us: u64) {
        self.expire_isochron(now_us);
        self.expire_token_timer(now_us);
    }
}
