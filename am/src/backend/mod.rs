//! Transport backends: drivers around the sans-IO core.

use std::io;
use std::os::fd::BorrowedFd;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::Time;

pub mod chan;
pub mod fault;
pub mod mem;
pub mod quic;
pub mod spin;
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

/// Blocks in `poll(2)` until `fd` is readable or `timeout` passes (`None`: no limit), the
/// timeout rounded up to whole milliseconds as `epoll` would; `true` if it may be readable
/// (`false` also after a signal).
pub fn poll_readable(fd: BorrowedFd<'_>, timeout: Option<Duration>) -> io::Result<bool> {
    let timeout = match timeout {
        Some(t) => {
            let ms = i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX);
            PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
        }
        None => PollTimeout::NONE,
    };
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    match poll(&mut fds, timeout) {
        Ok(0) | Err(Errno::EINTR) => Ok(false),
        Ok(_) => Ok(true),
        Err(e) => Err(io::Error::from(e)),
    }
}
