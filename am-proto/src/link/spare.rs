//! Spare packet buffers: a packet taken from a batch, or sent alone in one fragment, goes to
//! the inbox in a buffer a driver handed back ([`crate::link::Links::recycle`]) instead of a
//! fresh allocation, so a steady stream of packets allocates nothing per packet. A buffer the
//! spares do not keep (full, or out of `isotach_bufpool`'s bounds) is freed.

/// Most spare buffers kept.
pub(super) const SPARE_PACKETS_MAX: usize = 256;

/// Buffers handed back, ready for the next packets.
pub(super) type Spare = isotach_bufpool::BufPool<SPARE_PACKETS_MAX>;
