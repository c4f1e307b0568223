//! Spare packet buffers: a packet taken from a batch goes to the inbox in a buffer a driver
//! handed back ([`crate::link::Links::recycle`]) instead of a fresh allocation, so a steady
//! stream of batched packets allocates nothing per packet.

/// Most spare buffers kept.
pub(super) const SPARE_PACKETS_MAX: usize = 256;
/// A buffer larger than this is freed rather than kept (one large packet must not pin its
/// buffer for the life of the links).
pub(super) const SPARE_PACKET_BYTES_MAX: usize = 2048;

/// Buffers handed back, ready for the next packets.
#[derive(Debug, Default)]
pub(super) struct Spare {
    bufs: Vec<Vec<u8>>,
}

impl Spare {
    /// `bytes` in a buffer of its own: a spare one if there is one.
    pub(super) fn copy_of(&mut self, bytes: &[u8]) -> Vec<u8> {
        match self.bufs.pop() {
            Some(mut b) => {
                debug_assert!(b.is_empty());
                b.extend_from_slice(bytes);
                b
            }
            None => bytes.to_vec(),
        }
    }

    /// Keeps `buf` for a later packet, unless enough are kept or it is large.
    pub(super) fn give(&mut self, mut buf: Vec<u8>) {
        if self.bufs.len() >= SPARE_PACKETS_MAX || buf.capacity() > SPARE_PACKET_BYTES_MAX {
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
