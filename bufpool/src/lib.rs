//! Packet buffers kept for reuse. A node that consumes packets (a received buffer it is done
//! with) and builds or receives packets builds them in the buffers it consumed instead of fresh
//! allocations, so a steady stream of packets allocates nothing per packet. The links keep one
//! pool for the packets they receive (`isotach-am-proto`), and every node that builds packets
//! keeps one for those (`isotach_proto::packet::BufPool`); buffers pass between the two.
//!
//! Bounded both ways: at most `MAX` buffers, each with a capacity in [`BUFFER_BYTES_MIN`] ..=
//! [`BUFFER_BYTES_MAX`] (every small packet fits without growing; one large packet does not pin
//! its buffer). A buffer the pool does not keep is handed back, for the caller to pass on or
//! drop. One pair of bounds for every pool: a buffer one pool keeps, any other keeps too.

/// Capacity of a new buffer at least, and of a kept one: room for any small packet (a token,
/// a marker, an isochron's start or end, a sref, a read's reply).
pub const BUFFER_BYTES_MIN: usize = 128;
/// A buffer with more capacity than this is not kept.
pub const BUFFER_BYTES_MAX: usize = 2048;

/// At most `MAX` spare packet buffers, empty and ready to encode or copy into.
#[derive(Debug, Default)]
pub struct BufPool<const MAX: usize> {
    bufs: Vec<Vec<u8>>,
}

impl<const MAX: usize> BufPool<MAX> {
    /// An empty buffer with room for `len` bytes: a kept one when it is large enough, else a
    /// new one of at least [`BUFFER_BYTES_MIN`].
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
                Vec::with_capacity(len.max(BUFFER_BYTES_MIN))
            }
        }
    }

    /// `bytes` in a buffer of its own ([`BufPool::take`]).
    pub fn copy_of(&mut self, bytes: &[u8]) -> Vec<u8> {
        let mut b = self.take(bytes.len());
        b.extend_from_slice(bytes);
        b
    }

    /// A kept buffer (empty), if there is one: for another pool to stock itself from.
    pub fn take_kept(&mut self) -> Option<Vec<u8>> {
        self.bufs.pop()
    }

    /// Keeps `buf` (cleared) for a later packet; hands it back when the pool is full or its
    /// capacity is out of bounds.
    pub fn give(&mut self, mut buf: Vec<u8>) -> Option<Vec<u8>> {
        let capacity = buf.capacity();
        if self.bufs.len() >= MAX || !(BUFFER_BYTES_MIN..=BUFFER_BYTES_MAX).contains(&capacity) {
            return Some(buf);
        }
        buf.clear();
        self.bufs.push(buf);
        debug_assert!(self.bufs.len() <= MAX);
        None
    }

    /// Buffers the pool would keep before it is full.
    pub fn room(&self) -> usize {
        MAX - self.bufs.len()
    }

    /// Tops the pool up to half its limit from `spares` (another pool's kept buffers) after
    /// its owner built packets: a node builds more than it receives (an isochron's start, srefs
    /// and end against one marker), and its link gets every sent buffer back. Returns a buffer
    /// the pool would not keep (out of bounds), for the caller to hand back.
    pub fn refill(&mut self, mut spares: impl FnMut() -> Option<Vec<u8>>) -> Option<Vec<u8>> {
        while self.room() > MAX / 2 {
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

    const MAX: usize = 64;
    type Pool = BufPool<MAX>;

    #[test]
    fn a_kept_buffer_is_reused_and_comes_back_empty() {
        let mut pool = Pool::default();
        let mut b = Vec::with_capacity(BUFFER_BYTES_MIN);
        b.extend_from_slice(b"a packet");
        let at = b.as_ptr();
        assert!(pool.give(b).is_none());
        assert_eq!(pool.room(), MAX - 1);
        let again = pool.take(40);
        assert_eq!(again.as_ptr(), at, "the same allocation");
        assert!(again.is_empty());
        assert_eq!(pool.room(), MAX);
    }

    #[test]
    fn buffers_out_of_bounds_or_beyond_the_limit_are_handed_back() {
        let mut pool = Pool::default();
        assert!(pool.give(Vec::with_capacity(16)).is_some(), "too small");
        assert!(
            pool.give(Vec::with_capacity(BUFFER_BYTES_MAX + 1))
                .is_some(),
            "too large"
        );
        for _ in 0..MAX {
            assert!(pool.give(Vec::with_capacity(256)).is_none());
        }
        assert_eq!(pool.room(), 0);
        assert!(pool.give(Vec::with_capacity(256)).is_some(), "full");
        assert_eq!(pool.room(), 0);
    }

    #[test]
    fn a_refill_stops_at_half_and_hands_back_what_it_would_not_keep() {
        let mut pool = Pool::default();
        let mut spares: Vec<Vec<u8>> = (0..MAX)
            .map(|_| Vec::with_capacity(BUFFER_BYTES_MIN))
            .collect();
        assert!(pool.refill(|| spares.pop()).is_none());
        assert_eq!(pool.room(), MAX / 2);
        assert_eq!(spares.len(), MAX / 2, "the rest stay the link's");
        // A full-enough pool takes nothing; a dry source ends the refill.
        assert!(pool.refill(|| panic!("not asked")).is_none());
        let mut empty = Pool::default();
        assert!(empty.refill(|| None).is_none());
        assert_eq!(empty.room(), MAX);
        // A spare out of bounds comes back.
        let mut odd = vec![Vec::with_capacity(8)];
        assert!(empty.refill(|| odd.pop()).is_some());
    }

    #[test]
    fn a_copy_is_made_in_a_kept_buffer_and_a_kept_one_can_be_handed_on() {
        let mut pool = Pool::default();
        let b = Vec::with_capacity(BUFFER_BYTES_MIN);
        let at = b.as_ptr();
        assert!(pool.give(b).is_none());
        let copy = pool.copy_of(b"bytes");
        assert_eq!((copy.as_ptr(), &copy[..]), (at, &b"bytes"[..]));
        assert!(pool.give(copy).is_none());
        let kept = pool.take_kept().expect("the kept buffer");
        assert_eq!(kept.as_ptr(), at);
        assert!(kept.is_empty(), "kept buffers are cleared");
        assert!(pool.take_kept().is_none());
    }

    #[test]
    fn a_large_packet_gets_a_new_buffer_and_leaves_the_kept_one() {
        let mut pool = Pool::default();
        assert!(pool.give(Vec::with_capacity(BUFFER_BYTES_MIN)).is_none());
        let big = pool.take(1000);
        assert!(big.capacity() >= 1000);
        assert_eq!(pool.room(), MAX - 1);
        // An empty pool makes new buffers of the minimum size at least.
        let mut empty = Pool::default();
        assert!(empty.take(1).capacity() >= BUFFER_BYTES_MIN);
    }
}
