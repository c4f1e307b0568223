//! The send side of the UDP backend (and of the QUIC backend's socket): datagrams wait in an
//! outbox until the bundle flushes, then leave in as few system calls as the kernel allows.
//!
//! Consecutive equal-size datagrams to one destination form one message, sent with a
//! `UDP_SEGMENT` control message (GSO: the kernel cuts it into datagrams); a run of single
//! datagrams (to different destinations) leaves in one `sendmmsg`. The segment size rides on
//! each call, never on the socket, so alternating batches and singles costs no `setsockopt`.

use std::io::IoSlice;
use std::net::{SocketAddr, UdpSocket as StdUdpSocket};
use std::os::fd::AsRawFd;

use nix::errno::Errno;
use nix::sys::socket::{
    ControlMessage, MsgFlags, MultiHeaders, SockaddrStorage, sendmmsg, sendmsg, sendto,
};

use super::UdpStats;

/// Most bytes one GSO send carries (the largest UDP payload over IPv4).
pub(crate) const GSO_MAX_BYTES: usize = 65_507;
/// Most segments one GSO send carries (the kernel's `UDP_MAX_SEGMENTS`).
pub(crate) const GSO_MAX_SEGMENTS: usize = 64;
/// Most messages (single datagrams or GSO batches) the outbox holds before it sends.
pub(super) const OUTBOX_MSGS_MAX: usize = 64;
/// Bytes the outbox holds before it sends (its buffer never grows past this plus one GSO
/// batch, which may start just under it).
pub(super) const OUTBOX_BYTES_MAX: usize = 256 * 1024;

/// One message of the outbox: `n` datagrams of `seg` bytes (the last may be shorter) to `addr`,
/// at `start..end` of the buffer.
#[derive(Clone, Copy, Debug)]
struct OutMsg {
    addr: SocketAddr,
    start: usize,
    end: usize,
    seg: usize,
    n: usize,
    /// A shorter datagram ended the batch: nothing more may join it.
    closed: bool,
}

/// Datagrams waiting for the next flush.
pub(crate) struct Outbox {
    buf: Vec<u8>,
    msgs: Vec<OutMsg>,
    /// Segments one message may carry: 1 without GSO.
    gso_max: usize,
}

impl Outbox {
    pub(crate) fn new(gso_max: usize) -> Self {
        debug_assert!((1..=GSO_MAX_SEGMENTS).contains(&gso_max));
        Self {
            buf: Vec::with_capacity(OUTBOX_BYTES_MAX + GSO_MAX_BYTES),
            msgs: Vec::with_capacity(OUTBOX_MSGS_MAX),
            gso_max,
        }
    }

    /// Whether sends cut batches with GSO.
    pub(super) fn gso(&self) -> bool {
        self.gso_max > 1
    }

    /// Whether `d` for `to` can join the last message as one more segment.
    fn joins_last(&self, to: SocketAddr, d: &[u8]) -> bool {
        self.msgs.last().is_some_and(|m| {
            m.addr == to
                && !m.closed
                && d.len() <= m.seg
                && m.n < self.gso_max
                && m.end - m.start + d.len() <= GSO_MAX_BYTES
        })
    }

    /// Queues one datagram; sends what is queued first when the outbox is full.
    pub(crate) fn push(
        &mut self,
        sock: &StdUdpSocket,
        stats: &mut UdpStats,
        to: SocketAddr,
        d: &[u8],
    ) {
        if self.joins_last(to, d) {
            let m = self.msgs.last_mut().expect("joins_last saw it");
            m.closed = d.len() < m.seg;
            m.n += 1;
            m.end += d.len();
            self.buf.extend_from_slice(d);
            return;
        }
        if self.msgs.len() >= OUTBOX_MSGS_MAX || self.buf.len() >= OUTBOX_BYTES_MAX {
            self.send_all(sock, stats);
        }
        let start = self.buf.len();
        self.buf.extend_from_slice(d);
        self.msgs.push(OutMsg {
            addr: to,
            start,
            end: self.buf.len(),
            seg: d.len(),
            n: 1,
            closed: false,
        });
        debug_assert!(self.msgs.len() <= OUTBOX_MSGS_MAX);
    }

    /// Sends everything queued, in order: runs of single datagrams in one `sendmmsg`, each
    /// batch in one GSO `sendmsg`. What the kernel does not take (`EAGAIN`) is dropped and
    /// counted, as for any send: the AM core retransmits.
    pub(crate) fn send_all(&mut self, sock: &StdUdpSocket, stats: &mut UdpStats) {
        let mut i = 0;
        while i < self.msgs.len() {
            if self.msgs[i].n > 1 {
                self.send_batch(sock, stats, i);
                i += 1;
                continue;
            }
            let run = self.msgs[i..].iter().take_while(|m| m.n == 1).count();
            self.send_singles(sock, stats, i, run);
            i += run;
        }
        self.msgs.clear();
        self.buf.clear();
    }

    /// Message `i`, a batch of equal-size datagrams to one destination: one GSO `sendmsg`,
    /// or a datagram per call once GSO failed on this path (batches already queued then).
    fn send_batch(&mut self, sock: &StdUdpSocket, stats: &mut UdpStats, i: usize) {
        let m = self.msgs[i];
        debug_assert!(m.n > 1);
        let to = SockaddrStorage::from(m.addr);
        if !self.gso() {
            self.send_split(sock, stats, m, &to);
            return;
        }
        let bytes = &self.buf[m.start..m.end];
        // `seg` ≤ the largest datagram (checked at bind), so it fits a u16.
        let seg = u16::try_from(m.seg).unwrap_or(u16::MAX);
        let cmsgs = [ControlMessage::UdpGsoSegments(&seg)];
        stats.send_calls += 1;
        let r = sendmsg(
            sock.as_raw_fd(),
            &[IoSlice::new(bytes)],
            &cmsgs,
            MsgFlags::MSG_DONTWAIT,
            Some(&to),
        );
        match r {
            Ok(_) => stats.sent += m.n as u64,
            Err(Errno::EAGAIN) => stats.send_dropped += m.n as u64,
            Err(Errno::EIO | Errno::EINVAL) => {
                // No GSO on this path (e.g. no checksum offload): one datagram per call from
                // now on.
                self.gso_max = 1;
                self.send_split(sock, stats, m, &to);
            }
            Err(_) => stats.send_errors += m.n as u64,
        }
    }

    /// Batch `m` a datagram per `sendto` (no GSO on this path).
    fn send_split(
        &self,
        sock: &StdUdpSocket,
        stats: &mut UdpStats,
        m: OutMsg,
        to: &SockaddrStorage,
    ) {
        // `seg` is 0 for a batch of empty datagrams; `chunks` needs at least 1.
        for c in self.buf[m.start..m.end].chunks(m.seg.max(1)) {
            stats.send_calls += 1;
            match sendto(sock.as_raw_fd(), c, to, MsgFlags::MSG_DONTWAIT) {
                Ok(_) => stats.sent += 1,
                Err(Errno::EAGAIN) => stats.send_dropped += 1,
                Err(_) => stats.send_errors += 1,
            }
        }
    }

    /// Messages `first..first + n`, single datagrams: one `sendto` for one, one `sendmmsg`
    /// for more (a pass that answers every peer, a token manager's wave, wakes them all inside
    /// one system call rather than being preempted by each wake-up in turn).
    fn send_singles(&self, sock: &StdUdpSocket, stats: &mut UdpStats, first: usize, n: usize) {
        let msgs = &self.msgs[first..first + n];
        stats.send_calls += 1;
        let r = if let [m] = msgs {
            sendto(
                sock.as_raw_fd(),
                &self.buf[m.start..m.end],
                &SockaddrStorage::from(m.addr),
                MsgFlags::MSG_DONTWAIT,
            )
            .map(|_| 1)
        } else {
            let iovs: Vec<[IoSlice<'_>; 1]> = msgs
                .iter()
                .map(|m| [IoSlice::new(&self.buf[m.start..m.end])])
                .collect();
            let addrs: Vec<Option<SockaddrStorage>> = msgs
                .iter()
                .map(|m| Some(SockaddrStorage::from(m.addr)))
                .collect();
            let no_cmsgs: [ControlMessage<'_>; 0] = [];
            // Per call, not per datagram (the headers hold raw pointers, so they cannot live
            // in a transport that moves between threads).
            let mut headers = MultiHeaders::<SockaddrStorage>::preallocate(n, None);
            sendmmsg(
                sock.as_raw_fd(),
                &mut headers,
                &iovs,
                &addrs,
                no_cmsgs,
                MsgFlags::MSG_DONTWAIT,
            )
            .map(Iterator::count)
        };
        match r {
            Ok(sent) => {
                stats.sent += sent as u64;
                stats.send_dropped += (n - sent) as u64;
            }
            Err(Errno::EAGAIN) => stats.send_dropped += n as u64,
            Err(_) => stats.send_errors += n as u64,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// GSO failing on the path (`gso_max` drops to 1) with batches already queued: each is
    /// sent a datagram per call, whole and in order.
    #[test]
    fn batches_queued_before_gso_fails_go_a_datagram_per_call() {
        let tx_sock = StdUdpSocket::bind("127.0.0.1:0").expect("bind");
        let rx_sock = StdUdpSocket::bind("127.0.0.1:0").expect("bind");
        rx_sock
            .set_read_timeout(Some(Duration::from_secs(2)))
            .expect("timeout");
        let to = rx_sock.local_addr().expect("addr");
        let mut out = Outbox::new(GSO_MAX_SEGMENTS);
        let mut stats = UdpStats::default();
        let sent: Vec<Vec<u8>> = (0..3u8).map(|i| vec![i; 100]).collect();
        for d in &sent {
            out.push(&tx_sock, &mut stats, to, d);
        }
        assert_eq!(out.msgs.len(), 1, "one batch of three");
        out.gso_max = 1;
        out.send_all(&tx_sock, &mut stats);
        assert_eq!((stats.sent, stats.send_calls), (3, 3), "{stats:?}");
        for d in &sent {
            let mut buf = [0u8; 200];
            let n = rx_sock.recv(&mut buf).expect("a datagram");
            assert_eq!(&buf[..n], d.as_slice());
        }
    }
}
