//! Spare packet buffers: a packet taken from a batch, or sent alone in one fragment, goes to
//! the inbox in a buffer a driver handed back ([`crate::link::Links::recycle`]) instead of a
//! fresh allocation, so a steady stream of packets allocates nothing per packet.

/// Most spare buffers kept.
pub(super) const SPARE_PACKETS_MAX: usize = 256;
/// Capacity of a new packet buffer at least, and of a buffer kept: room for any small packet
/// (a token, a marker, an isochron's sref), so a reused buffer never grows.
pub const SPARE_PACKET_BYTES_MIN: usize = 128;
/// A buffer larger than this is freed rather than kept (one large packet must not pin its
/// buffer for the life of the links).
pub const SPARE_PACKET_BYTES_MAX: usize = 2048;

/// Buffers handed back, ready for the next packets.
#[derive(Debug, Default)]
pub(super) struct Spare {
    bufs: Vec<Vec<u8>>,
}

impl Spare {
    /// `bytes` in a buffer of its own: a spare one if there is one.
    pub(super) fn copy_of(&mut self, bytes: &[u8]) -> Vec<u8> {
        match self.bufs.pop() {
            Some(mut b) if b.capacity() >= bytes.len() => {
                debug_assert!(b.is_empty());
                b.extend_from_slice(bytes);
                b
            }
            spare => {
                // A spare too small for this packet (a large one) goes back for a small one.
                if let Some(b) = spare {
                    self.bufs.push(b);
                }
                let mut b = Vec::with_capacity(bytes.len().max(SPARE_PACKET_BYTES_MIN));
                b.extend_from_slice(bytes);
                b
            }
        }
    }

    /// A kept buffer (empty), if there is one: for a caller that builds packets.
    pub(super) fn take(&mut self) -> Option<Vec<u8>> {
        self.bufs.pop()
    }

    /// Keeps `buf` for a later packet, unless enough are kept or it is too small or large.
    pub(super) fn give(&mut self, mut buf: Vec<u8>) {
        let capacity = buf.capacity();
        if self.bufs.len() >= SPARE_PACKETS_MAX
            || !(SPARE_PACKET_BYTES_MIN..=SPARE_PACKET_BYTES_MAX).contains(&capacity)
        {
            return;
        }
        buf.clear();
        self.bufs.push(buf);
        debug_assert!(self.bufs.len() <= SPARE_PACKETS_MAX);
    }

    /// Buffers kept.
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.bufs.len()
    }
}
