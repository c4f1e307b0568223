//! Packet buffers kept for reuse: a node that consumes packets (a received buffer it is done
//! with) and builds packets (an isochron's start, srefs and end; a reply) builds them in the
//! buffers it consumed instead of fresh allocations, so a steady stream of packets allocates
//! nothing per packet.
//!
//! Bounded both ways: at most [`POOL_BUFFERS_MAX`] buffers, each with a capacity in
//! [`POOL_BUFFER_BYTES_MIN`] ..= [`POOL_BUFFER_BYTES_MAX`] (every small packet fits without
//! growing; one large packet does not pin its buffer). A buffer the pool does not keep is handed
//! back, for the caller to pass on (to a link that receives into spare buffers) or drop.

/// Most buffers a pool keeps.
pub const POOL_BUFFERS_MAX: usize = 64;
/// Capacity of a new buffer at least, and of a kept one: room for any small packet (a token,
/// a marker, an isochron's start or end, a sref, a read's reply).
pub const POOL_BUFFER_BYTES_MIN: usize = 128;
/// A buffer with more capacity than this is not kept.
pub const POOL_BUFFER_BYTES_MAX: usize = 2048;

/// Spare packet buffers, empty and ready to encode into.
#[derive(Debug, Default)]
pub struct BufPool {
    bufs: Vec<Vec<u8>>,
}

impl BufPool {
    /// An empty buffer with room for `len` bytes: a kept one when it is large enough, else a
    /// new one of at least [`POOL_BUFFER_BYTES_MIN`].
    pub fn take(&mut self, len: usize) -> Vec<u8> {
        match self.bufs.pop() {
            Some(b) if b.capacity() >= len => {
                debug_assert!(b.is_empty());
                b
            }
            kept => {
                // Too small for this (large) packet: it stays for a small one.
                if let Some(b) = kept {
                    self.bufs.push(b);
                }
                Vec::with_capacity(len.max(POOL_BUFFER_BYTES_MIN))
            }
        }
    }

    /// Keeps `buf` (cleared) for a later packet; hands it back when the pool is full or its
    /// capacity is out of bounds.
    pub fn give(&mut self, mut buf: Vec<u8>) -> Option<Vec<u8>> {
        let capacity = buf.capacity();
        if self.bufs.len() >= POOL_BUFFERS_MAX
            || !(POOL_BUFFER_BYTES_MIN..=POOL_BUFFER_BYTES_MAX).contains(&capacity)
        {
            return Some(buf);
        }
        buf.clear();
        self.bufs.push(buf);
        debug_assert!(self.bufs.len() <= POOL_BUFFERS_MAX);
        None
    }

    /// Buffers the pool would keep before it is full.
    pub fn room(&self) -> usize {
        POOL_BUFFERS_MAX - self.bufs.len()
    }

    /// Tops the pool up to half its limit from `spares` (a link's spare buffers) after its
    /// owner built packets: it builds more than it receives (an isochron's start, srefs and end
    /// against one marker), and the link gets every sent buffer back. Returns a buffer the pool
    /// would not keep (out of bounds), for the caller to hand back.
    pub fn refill(&mut self, mut spares: impl FnMut() -> Option<Vec<u8>>) -> Option<Vec<u8>> {
        while self.room() > POOL_BUFFERS_MAX / 2 {
            if let Some(b) = self.give(spares()?) {
                return Some(b);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_buffer_is_reused_and_comes_back_empty() {
        let mut pool = BufPool::default();
        let mut b = Vec::with_capacity(POOL_BUFFER_BYTES_MIN);
        b.extend_from_slice(b"a packet");
        let at = b.as_ptr();
        assert!(pool.give(b).is_none());
        assert_eq!(pool.room(), POOL_BUFFERS_MAX - 1);
        let again = pool.take(40);
        assert_eq!(again.as_ptr(), at, "the same allocation");
        assert!(again.is_empty());
        assert_eq!(pool.room(), POOL_BUFFERS_MAX);
    }

    #[test]
    fn buffers_out_of_bounds_or_beyond_the_limit_are_handed_back() {
        let mut pool = BufPool::default();
        assert!(pool.give(Vec::with_capacity(16)).is_some(), "too small");
        assert!(
            pool.give(Vec::with_capacity(POOL_BUFFER_BYTES_MAX + 1))
                .is_some(),
            "too large"
        );
        for _ in 0..POOL_BUFFERS_MAX {
            assert!(pool.give(Vec::with_capacity(256)).is_none());
        }
        assert_eq!(pool.room(), 0);
        assert!(pool.give(Vec::with_capacity(256)).is_some(), "full");
        assert_eq!(pool.room(), 0);
    }

    #[test]
    fn a_refill_stops_at_half_and_hands_back_what_it_would_not_keep() {
        let mut pool = BufPool::default();
        let mut spares: Vec<Vec<u8>> = (0..POOL_BUFFERS_MAX)
            .map(|_| Vec::with_capacity(POOL_BUFFER_BYTES_MIN))
            .collect();
        assert!(pool.refill(|| spares.pop()).is_none());
        assert_eq!(pool.room(), POOL_BUFFERS_MAX / 2);
        assert_eq!(
            spares.len(),
            POOL_BUFFERS_MAX / 2,
            "the rest stay the link's"
        );
        // A full-enough pool takes nothing; a dry source ends the refill.
        assert!(pool.refill(|| panic!("not asked")).is_none());
        let mut empty = BufPool::default();
        assert!(empty.refill(|| None).is_none());
        assert_eq!(empty.room(), POOL_BUFFERS_MAX);
        // A spare out of bounds comes back.
        let mut odd = vec![Vec::with_capacity(8)];
        assert!(empty.refill(|| odd.pop()).is_some());
    }

    #[test]
    fn a_large_packet_gets_a_new_buffer_and_leaves_the_kept_one() {
        let mut pool = BufPool::default();
        assert!(
            pool.give(Vec::with_capacity(POOL_BUFFER_BYTES_MIN))
                .is_none()
        );
        let big = pool.take(1000);
        assert!(big.capacity() >= 1000);
        assert_eq!(pool.room(), POOL_BUFFERS_MAX - 1);
        // An empty pool makes new buffers of the minimum size at least.
        let mut empty = BufPool::default();
        assert!(empty.take(1).capacity() >= POOL_BUFFER_BYTES_MIN);
    }
}
