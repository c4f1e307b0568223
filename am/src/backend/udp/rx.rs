//! The receive side of the UDP backend: one `recvmmsg` brings up to [`RECV_SLOTS`] datagrams,
//! each of which may be a GRO batch of equal-size datagrams.
//!
//! The buffers are allocated once, at bind time. The system call's headers hold raw pointers
//! into them, so they are built for each call (a few small allocations per system call, none
//! per datagram) rather than kept in a transport that moves between threads.

use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, SocketAddrV4, SocketAddrV6, UdpSocket as StdUdpSocket};
use std::os::fd::AsRawFd;

use nix::sys::socket::{ControlMessageOwned, MsgFlags, MultiHeaders, SockaddrStorage, recvmmsg};

/// Bytes of one receive slot (room for a GRO-coalesced batch).
pub(crate) const RECV_BUF: usize = 64 * 1024;
/// Datagrams (or GRO batches) one receive system call brings at most.
pub(crate) const RECV_SLOTS: usize = 8;

/// What one call received into buffer `buf`: `len` bytes from `addr`, datagrams `stride` apart.
#[derive(Clone, Copy, Debug)]
struct Slot {
    addr: SocketAddr,
    buf: usize,
    len: usize,
    stride: usize,
}

/// The datagrams of the last receive call, handed out one at a time.
pub(super) struct Rx {
    /// [`RECV_SLOTS`] buffers of [`RECV_BUF`] bytes, back to back.
    buf: Vec<u8>,
    /// Boxed: the transport is moved around and held in enums; the slots need not be inline.
    slots: Box<[Slot; RECV_SLOTS]>,
    /// Slots the last call filled.
    filled: usize,
    /// The slot being handed out.
    at: usize,
    /// Offset of the next datagram in slot `at`.
    off: usize,
}

fn std_addr(a: &SockaddrStorage) -> Option<SocketAddr> {
    if let Some(v4) = a.as_sockaddr_in() {
        return Some(SocketAddr::V4(SocketAddrV4::from(*v4)));
    }
    a.as_sockaddr_in6()
        .map(|v6| SocketAddr::V6(SocketAddrV6::from(*v6)))
}

impl Rx {
    pub(super) fn new(local: SocketAddr) -> Self {
        let empty = Slot {
            addr: local,
            buf: 0,
            len: 0,
            stride: 1,
        };
        Self {
            buf: vec![0; RECV_SLOTS * RECV_BUF],
            slots: Box::new([empty; RECV_SLOTS]),
            filled: 0,
            at: 0,
            off: 0,
        }
    }

    /// Whether a received datagram is still to be handed out.
    pub(super) fn pending(&self) -> bool {
        self.at < self.filled
    }

    /// The next received datagram: its sender and bytes.
    pub(super) fn next(&mut self) -> Option<(SocketAddr, &[u8])> {
        if !self.pending() {
            return None;
        }
        let slot = self.slots[self.at];
        debug_assert!(self.off < slot.len && slot.stride >= 1);
        let base = slot.buf * RECV_BUF;
        let start = self.off;
        let end = (start + slot.stride).min(slot.len);
        self.off = end;
        if self.off >= slot.len {
            self.at += 1;
            self.off = 0;
        }
        Some((slot.addr, &self.buf[base + start..base + end]))
    }

    /// One `recvmmsg` (blocking for the first datagram unless `flags` has `MSG_DONTWAIT`, never
    /// for the rest); returns how many slots it filled. Call only when nothing is pending.
    pub(super) fn fill(&mut self, sock: &StdUdpSocket, flags: MsgFlags) -> io::Result<usize> {
        debug_assert!(!self.pending());
        self.filled = 0;
        self.at = 0;
        self.off = 0;
        let mut headers =
            MultiHeaders::<SockaddrStorage>::preallocate(RECV_SLOTS, Some(nix::cmsg_space!(i32)));
        let mut iovs: [[IoSliceMut<'_>; 1]; RECV_SLOTS] = {
            let mut chunks = self.buf.chunks_mut(RECV_BUF);
            std::array::from_fn(|_| [IoSliceMut::new(chunks.next().expect("RECV_SLOTS chunks"))])
        };
        let results = recvmmsg(
            sock.as_raw_fd(),
            &mut headers,
            iovs.iter_mut(),
            flags | MsgFlags::MSG_WAITFORONE,
            None,
        )?;
        let mut filled = 0;
        for (buf, m) in results.enumerate() {
            // A datagram without an IP sender (never on a UDP socket) is skipped.
            let Some(addr) = m.address.as_ref().and_then(std_addr) else {
                continue;
            };
            let len = m.bytes.min(RECV_BUF);
            let mut stride = len;
            if let Ok(cm) = m.cmsgs() {
                for c in cm {
                    if let ControlMessageOwned::UdpGroSegments(s) = c {
                        stride = usize::try_from(s).unwrap_or(len).clamp(1, RECV_BUF);
                    }
                }
            }
            if len == 0 {
                // An empty datagram carries nothing an AM core could take.
                continue;
            }
            self.slots[filled] = Slot {
                addr,
                buf,
                len,
                stride: stride.max(1),
            };
            filled += 1;
        }
        self.filled = filled;
        Ok(filled)
    }
}
