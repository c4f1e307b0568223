//! The bounds of every number a config file can give, the tighter lower bounds the topology
//! sets, and the values used when a file does not give one.

use super::{Limits, Timing};
use crate::topology::{SwitchId, Topology};

// Bounds. Every number a config file can give has a lower and an upper bound, checked when the
// file is read: a value outside them is refused with an error naming the key, the value and the
// allowed range, never clamped or raised. The upper bounds lie far above anything a deployment
// needs; they are there so that a slip of the keyboard (three zeros too many) is an error, not a
// cluster that stalls for an hour, allocates gigabytes or overflows a deadline. Some keys have
// a tighter lower bound that depends on the topology (see [`check_bounds`]). Pulse rates quoted
// below are the ~2 500 pulses/s of a loopback cluster (`docs/bench.md`).

/// `[timing] token-timeout-us`, lower bound: below 0.1 ms the timer fires before a token has
/// crossed even a loopback link (or the node has been scheduled), so an idle cluster would
/// send little but repeats.
pub const TOKEN_TIMEOUT_US_MIN: u64 = 100;
/// `[timing] token-timeout-us`, upper bound (10 s): the AM layer gives up on a request after
/// 10 s without an answer and the link breaks (a new generation recovers it), so a longer
/// timer never gets to repair a lost token; it only stalls logical time for longer.
pub const TOKEN_TIMEOUT_US_MAX: u64 = 10_000_000;
/// `[timing] idle-pace-us` when not written (and the token timeout is above twice it): half the
/// default token timer (10 ms), the most it allows. An idle cluster pulses 120–170 times a
/// second instead of 10 000–20 000; an idle token manager with 4 SIUs measured 2.6–2.9 % of a
/// core over UDP and 4.5–6.3 % over QUIC (each idle wave wakes it several times: at 2 500 µs
/// 4.5–5.6 % and 6.2–8.8 %, `docs/bench.md`). The first isochron after a quiet spell pays no
/// pace.
pub const IDLE_PACE_US_DEFAULT: u64 = 5_000;
/// `[timing] idle-pace-us`, lower bound: 0 turns idle pacing off (waves at full speed always).
pub const IDLE_PACE_US_MIN: u64 = 0;
/// `[timing] idle-pace-us`, upper bound (1 s): an idle cluster then pulses once a second,
/// which already costs nothing measurable; longer only delays what a false idle holds up. It
/// must also be at most half of `token-timeout-us` (see [`check_bounds`]).
pub const IDLE_PACE_US_MAX: u64 = 1_000_000;
/// `[timing] epoch-pulses`, lower bound: an epoch has two pulses at least; it must also exceed
/// the largest logical distance, so signals reach every TM before the epoch's last wave.
pub const EPOCH_PULSES_MIN: u32 = 2;
/// `[timing] epoch-pulses`, upper bound: signals raised in an epoch are delivered at its last
/// pulse, and 65 536 pulses are already ~26 s of logical time: a signal that late is useless.
pub const EPOCH_PULSES_MAX: u32 = 65_536;
/// `[limits] channels`, lower bound: every isochron names a channel.
pub const CHANNELS_MIN: u8 = 1;
/// `[limits] channels`, upper bound: the wire's channel field is one byte (a channel costs an
/// SIU 16 bytes, so nothing smaller is needed).
pub const CHANNELS_MAX: u8 = u8::MAX;
/// `[limits] isochron-messages-max`, lower bound: an isochron carries a message at least.
pub const ISOCHRON_MESSAGES_MAX_MIN: u32 = 1;
/// `[limits] isochron-messages-max`, upper bound (2^20): every message of an isochron carries
/// one TS and is delivered in one pulse; a million messages (1 GiB at 1 KiB each) in one pulse
/// is far beyond any application's atomic step.
pub const ISOCHRON_MESSAGES_MAX_MAX: u32 = 1 << 20;
/// `[limits] pulses-ahead-max`, lower bound: more than twice the smallest logical distance (1).
/// Checked against the topology it must exceed twice the largest logical distance: an
/// isochron's TS is at least `distance` ahead of its sender's sendclock, and its receivers'
/// recvclocks may be up to `distance` behind that sendclock (`SiuError::BeyondWindow`).
pub const PULSES_AHEAD_MAX_MIN: u32 = 3;
/// `[limits] pulses-ahead-max`, upper bound: an SIU keeps a slot per open pulse, and a message
/// 65 536 pulses (~26 s of logical time) ahead comes from a broken sender.
pub const PULSES_AHEAD_MAX_MAX: u32 = 65_536;
/// `[limits] queue-packets-max`, lower bound: one input may put two packets on an SIU's queue.
/// Checked against the topology it must be at least twice the links of the busiest TM: a TM
/// takes input only with room for a reset wave and a token wave on every link.
pub const QUEUE_PACKETS_MAX_MIN: usize = 2;
/// `[limits] queue-packets-max`, upper bound (2^20): a link queues this many fragments of up to
/// 1 KiB towards a slow or lost peer, 1 GiB each; beyond that back-pressure, not memory, must
/// absorb the slowness.
pub const QUEUE_PACKETS_MAX_MAX: usize = 1 << 20;
/// `[limits] isochron-open-us-max`, lower bound (1 ms): shorter would close isochrons while a
/// host that was merely descheduled is still sending them.
pub const ISOCHRON_OPEN_US_MAX_MIN: u64 = 1_000;
/// `[limits] isochron-open-us-max`, upper bound (60 s): an open isochron holds the wave
/// (requirement 26), so it stalls logical time for the whole cluster for up to this long.
pub const ISOCHRON_OPEN_US_MAX_MAX: u64 = 60_000_000;
/// `[transport] spin-us` when not written: under load a daemon's next datagram comes tens of
/// microseconds after its last, so a wait that polls that long before it sleeps usually skips
/// the wake-up (`bench transfers --idiom add` 69–89k → 124–143k transfers/s on the 2-core VM,
/// `docs/bench.md`, "Spin before sleeping").
pub const SPIN_US_DEFAULT: u64 = 50;
/// `[transport] spin-us`, lower bound: 0 never spins (every wait sleeps in the kernel).
pub const SPIN_US_MIN: u64 = 0;
/// `[transport] spin-us`, upper bound (1 ms): past it a wait is a busy loop that holds a core
/// for as long as the gap between waves.
pub const SPIN_US_MAX: u64 = 1_000;
/// `[transport] tag`, lower bound: 0 matches no message.
pub const TAG_MIN: u64 = 1;
/// `[transport] tag`, upper bound: `u64::MAX` matches every tag.
pub const TAG_MAX: u64 = u64::MAX - 1;

/// A number of the config: its dotted key and its range (inclusive), whatever the topology.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bound {
    /// The dotted key, e.g. `limits.pulses-ahead-max`.
    pub key: &'static str,
    /// The smallest value allowed.
    pub min: u64,
    /// The largest value allowed.
    pub max: u64,
}

/// The bounds of every number in `[timing]`, `[limits]` and `[transport]`.
pub const BOUNDS: [Bound; 10] = [
    Bound {
        key: "timing.token-timeout-us",
        min: TOKEN_TIMEOUT_US_MIN,
        max: TOKEN_TIMEOUT_US_MAX,
    },
    Bound {
        key: "timing.epoch-pulses",
        min: EPOCH_PULSES_MIN as u64,
        max: EPOCH_PULSES_MAX as u64,
    },
    Bound {
        key: "timing.idle-pace-us",
        min: IDLE_PACE_US_MIN,
        max: IDLE_PACE_US_MAX,
    },
    Bound {
        key: "limits.channels",
        min: CHANNELS_MIN as u64,
        max: CHANNELS_MAX as u64,
    },
    Bound {
        key: "limits.isochron-messages-max",
        min: ISOCHRON_MESSAGES_MAX_MIN as u64,
        max: ISOCHRON_MESSAGES_MAX_MAX as u64,
    },
    Bound {
        key: "limits.pulses-ahead-max",
        min: PULSES_AHEAD_MAX_MIN as u64,
        max: PULSES_AHEAD_MAX_MAX as u64,
    },
    Bound {
        key: "limits.queue-packets-max",
        min: QUEUE_PACKETS_MAX_MIN as u64,
        max: QUEUE_PACKETS_MAX_MAX as u64,
    },
    Bound {
        key: "limits.isochron-open-us-max",
        min: ISOCHRON_OPEN_US_MAX_MIN,
        max: ISOCHRON_OPEN_US_MAX_MAX,
    },
    Bound {
        key: "transport.tag",
        min: TAG_MIN,
        max: TAG_MAX,
    },
    Bound {
        key: "transport.spin-us",
        min: SPIN_US_MIN,
        max: SPIN_US_MAX,
    },
];

/// The bound of `key` in [`BOUNDS`].
pub(super) fn bound(key: &str) -> Bound {
    *BOUNDS
        .iter()
        .find(|b| b.key == key)
        .expect("every bounded key is in BOUNDS")
}

/// Why `value` of `key` is refused, when it is outside `min..=max` (`why`: what sets a bound
/// other than the key's own, e.g. the topology).
pub(super) fn out_of_range(value: impl std::fmt::Display, min: u64, max: u64, why: &str) -> String {
    let why = if why.is_empty() {
        String::new()
    } else {
        format!(" ({why})")
    };
    format!("{value} is out of range: allowed {min}..={max}{why}")
}

/// How far the window (`limits.pulses-ahead-max`) reaches beyond twice the largest logical
/// distance when a config does not give it: room for an isochron's send delta and for the
/// latest logged TS of the other sequence set (requirements 24-29), which may put its TS that
/// much further ahead of the sendclock. Twice the distance alone (the lower bound) admits only
/// isochrons stamped at the earliest TS to the farthest host.
pub const PULSES_AHEAD_SLACK: u32 = 16;

impl Timing {
    /// The defaults, with the epoch long enough for `topology`: at least
    /// [`Timing::default`]'s, and at least twice the largest logical distance D, so that a
    /// signal raised in the first half of an epoch still goes out in it (an SIU puts signals
    /// on token `w` only if `w + D` is within the epoch). The lower bound is D + 1.
    pub fn sized_for(topology: &Topology) -> Self {
        let d = u32::from(topology.max_distance());
        let default = Self::default();
        Self {
            epoch_pulses: default.epoch_pulses.max(2 * d),
            ..default
        }
    }
}

impl Limits {
    /// The defaults, with tables large enough for `topology`: the window
    /// (`pulses_ahead_max`) at least [`Limits::default`]'s and at least twice the largest
    /// logical distance plus [`PULSES_AHEAD_SLACK`]; `queue_packets_max` at least twice the
    /// links of the busiest TM.
    pub fn sized_for(topology: &Topology) -> Self {
        let d = u32::from(topology.max_distance());
        let default = Self::default();
        Self {
            pulses_ahead_max: default.pulses_ahead_max.max(2 * d + PULSES_AHEAD_SLACK),
            queue_packets_max: default
                .queue_packets_max
                .max(2 * busiest_tm_links(topology)),
            ..default
        }
    }
}

/// Links of the busiest token manager: its hosts and its trunks.
fn busiest_tm_links(topology: &Topology) -> usize {
    (0..topology.switch_count())
        .map(|s| {
            let s = s as SwitchId;
            topology.hosts_at(s).count() + topology.switch_neighbours(s).len()
        })
        .max()
        .unwrap_or(0)
}

/// The range `key` must lie in for `topology`: its [`Bound`], with the lower bound raised where
/// the topology needs more (and then why, else `""`).
pub(super) fn range_for(key: &str, topology: &Topology) -> (u64, u64, String) {
    let b = bound(key);
    let reach = u64::from(topology.max_distance());
    let (floor, why) = match key {
        "timing.epoch-pulses" => (
            reach + 1,
            format!("more than the largest logical distance, {reach}, so signals can be delivered"),
        ),
        "limits.pulses-ahead-max" => (
            2 * reach + 1,
            format!(
                "more than twice the largest logical distance, {reach}, so an isochron to the \
                 farthest host fits in its receivers' windows"
            ),
        ),
        "limits.queue-packets-max" => {
            let links = busiest_tm_links(topology) as u64;
            (
                2 * links,
                format!(
                    "at least twice the links of the busiest TM, {links}: a TM takes input only \
                     with room for a reset wave and a token wave on every link"
                ),
            )
        }
        _ => (0, String::new()),
    };
    if floor > b.min {
        (floor, b.max, why)
    } else {
        (b.min, b.max, String::new())
    }
}

/// Checks timing and limits built in memory (the loader checks them as it reads a file): every
/// value within its [`Bound`], and within the tighter lower bounds the topology sets:
/// `epoch-pulses` above the largest logical distance D, `pulses-ahead-max` above 2·D,
/// `queue-packets-max` at least twice the links of the busiest TM; and `idle-pace-us` (unless
/// 0) at most half of `token-timeout-us`. `Err` gives the dotted key and what is wrong.
pub fn check_bounds(
    timing: &Timing,
    limits: &Limits,
    topology: &Topology,
) -> Result<(), (&'static str, String)> {
    let values = [
        timing.token_timeout_us,
        u64::from(timing.epoch_pulses),
        timing.idle_pace_us,
        u64::from(limits.channels),
        u64::from(limits.isochron_messages_max),
        u64::from(limits.pulses_ahead_max),
        limits.queue_packets_max as u64,
        limits.isochron_open_us_max,
    ];
    for (b, v) in BOUNDS.iter().zip(values) {
        let (min, max, why) = range_for(b.key, topology);
        if !(min..=max).contains(&v) {
            return Err((b.key, out_of_range(v, min, max, &why)));
        }
    }
    check_idle_pace(timing)
}

/// `idle-pace-us` (unless 0) must be below `token-timeout-us`, with room to spare: an idle
/// SIU's lost-token timer runs from its own token, and the TM's next wave reaches it a pace
/// plus the driver's timer granularity (about 1 ms with tokio) and a round trip later. At most
/// half the timer keeps that room (2.5 ms at the default 5 ms), so the timer never fires on a
/// paced wave; closer to it, every idle SIU would resend its tokens each wave.
fn check_idle_pace(timing: &Timing) -> Result<(), (&'static str, String)> {
    let (pace, timeout) = (timing.idle_pace_us, timing.token_timeout_us);
    if pace == 0 || pace <= timeout / 2 {
        return Ok(());
    }
    Err((
        "timing.idle-pace-us",
        format!(
            "{pace} must be below timing.token-timeout-us ({timeout}) by half of it at least \
             (at most {}), so the lost-token timer never fires on a paced wave (a paced wave \
             also waits for the driver's timer granularity and a round trip): lower it, raise \
             token-timeout-us, or set 0 to turn idle pacing off",
            timeout / 2
        ),
    ))
}
