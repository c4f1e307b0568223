//! Transport backends: drivers around the sans-IO core.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::Time;

pub mod chan;
pub mod fault;
pub mod mem;
pub mod quic;
pub mod udp;

/// The incarnation of a real-time node: the wall clock in microseconds, so a process that
/// restarts on an address gets a larger one. Never 0 (0 is "no incarnation seen" to the
/// link layer), even on a clock set before 1970.
pub(crate) fn wall_incarnation() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(1, |d| d.as_micros() as u64)
        .max(1)
}

/// A real-time backend's clock reading: nanoseconds since its `origin`.
pub(crate) fn real_now(origin: Instant) -> Time {
    Time(origin.elapsed().as_nanos() as u64)
}

/// The instant that time `t` of a real-time backend's clock (started at `origin`) stands for.
pub(crate) fn real_instant(origin: Instant, t: Time) -> Instant {
    origin + Duration::from_nanos(t.0)
}

/// [`real_instant`] as a tokio deadline.
pub(crate) fn tokio_deadline(origin: Instant, t: Time) -> tokio::time::Instant {
    tokio::time::Instant::from_std(real_instant(origin, t))
}

/// Sleeps the thread from `now` until `t` on a real-time backend's clock (at once if `t`
/// has passed).
pub(crate) fn sleep_until_real(now: Time, t: Time) {
    if t > now {
        std::thread::sleep(t.since(now));
    }
}
