//! The UDP socket under a QUIC endpoint: quinn-udp's batched receives (`recvmmsg`, GRO) and
//! sends (GSO, ECN), a blocking wait for the next datagram, and the wire-loss test hook.
//!
//! The socket is non-blocking; a wait is one `poll(2)` (millisecond resolution, rounded up,
//! like the timers quinn's own runtime would give) and the receive that follows it.

use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use quinn_udp::{RecvMeta, UdpSocketState};

use super::Counters;
use super::wire_loss::WireLoss;
use crate::backend::poll_readable;
use crate::backend::udp::UdpStats;
use crate::backend::udp::rx::{RECV_BUF, RECV_SLOTS};
use crate::backend::udp::tx::{GSO_MAX_BYTES, GSO_MAX_SEGMENTS, Outbox};

/// The largest QUIC packet (UDP payload) a node sends: its `initial_mtu` is at most 1452
/// ([`super::QuicConfig`]) and path-MTU discovery stops there.
const SEGMENT_BYTES_MAX: usize = 1500;
/// Socket buffers asked for (the kernel caps them at `rmem_max` / `wmem_max`): a wave's
/// datagrams from every peer fit, so a busy moment loses nothing to a full buffer.
const SOCKET_BUFFER_BYTES: usize = 4 << 20;

pub(super) struct Socket {
    sock: UdpSocket,
    state: UdpSocketState,
    /// Registered with the tokio runtime the transport was bound in, for `wait_async`.
    tokio_sock: Option<tokio::net::UdpSocket>,
    /// [`RECV_SLOTS`] receive slots of [`RECV_BUF`] bytes (the kernel coalesces at most that
    /// into one GRO batch), allocated at bind, as the UDP backend's.
    slots: Box<[u8]>,
    meta: [RecvMeta; RECV_SLOTS],
    loss: Option<Arc<WireLoss>>,
    /// The transport's counters (this counts `send_failed`).
    counters: Arc<Counters>,
    /// Transmits wait here for [`Socket::flush`] (when no transmit needs a source address or
    /// an ECN mark of its own): one `sendmmsg` for a pass's packets to every peer, one GSO
    /// `sendmsg` per batch to one — as the UDP backend sends.
    outbox: Outbox,
    /// The outbox's send tally (its refusals become `send_failed`).
    outbox_stats: UdpStats,
    /// Bound to one address (not `0.0.0.0`): the kernel picks that source for every packet,
    /// so transmits may go through the outbox.
    bound_to_one_ip: bool,
}

impl Socket {
    pub(super) fn bind(
        at: SocketAddr,
        loss: Option<Arc<WireLoss>>,
        counters: Arc<Counters>,
    ) -> io::Result<Self> {
        let sock = UdpSocket::bind(at)?;
        let state = UdpSocketState::new((&sock).into())?;
        // Best effort: a smaller buffer only means loss under bursts, which QUIC recovers.
        let _ = state.set_recv_buffer_size((&sock).into(), SOCKET_BUFFER_BYTES);
        let _ = state.set_send_buffer_size((&sock).into(), SOCKET_BUFFER_BYTES);
        sock.set_nonblocking(true)?;
        let gso_max = state.max_gso_segments().clamp(1, GSO_MAX_SEGMENTS);
        let bound_to_one_ip = !sock.local_addr()?.ip().is_unspecified();
        let tokio_sock = match tokio::runtime::Handle::try_current() {
            Ok(_) => Some(tokio::net::UdpSocket::from_std(sock.try_clone()?)?),
            Err(_) => None,
        };
        Ok(Self {
            sock,
            state,
            tokio_sock,
            slots: vec![0; RECV_SLOTS * RECV_BUF].into_boxed_slice(),
            meta: [RecvMeta::default(); RECV_SLOTS],
            loss,
            counters,
            outbox: Outbox::new(gso_max),
            outbox_stats: UdpStats::default(),
            bound_to_one_ip,
        })
    }

    pub(super) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.sock.local_addr()
    }

    /// Is the socket registered with a tokio runtime (for [`Socket::wait_async`])?
    #[cfg(test)]
    pub(super) fn has_readiness(&self) -> bool {
        self.tokio_sock.is_some()
    }

    /// Largest GSO batch a transmit may carry: what the kernel offers, and no more than one
    /// UDP payload's worth of full-size datagrams (a larger batch fails with `EMSGSIZE`, all
    /// of it lost).
    pub(super) fn max_gso_segments(&self) -> usize {
        self.state
            .max_gso_segments()
            .clamp(1, GSO_MAX_BYTES / SEGMENT_BYTES_MAX)
    }

    /// May the kernel fragment what we send (then path-MTU discovery must stay off)?
    pub(super) fn may_fragment(&self) -> bool {
        self.state.may_fragment()
    }

    /// Sends transmit `t`, whose bytes are `contents` (one packet, or a GSO batch of
    /// `t.segment_size` ones). A full send buffer or an error the kernel reports for this path
    /// loses it (counted), as the network could.
    pub(super) fn send(&mut self, t: &quinn_proto::Transmit, contents: &[u8]) {
        debug_assert_eq!(contents.len(), t.size);
        if self.loss.as_ref().is_some_and(|l| l.lose()) {
            return;
        }
        if self.bound_to_one_ip {
            // ECN marks are left off (quinn then finds the path does not carry them).
            let seg = t.segment_size.unwrap_or(contents.len()).max(1);
            for d in contents.chunks(seg) {
                self.outbox
                    .push(&self.sock, &mut self.outbox_stats, t.destination, d);
            }
            return;
        }
        // At once, with its source address and ECN mark (quinn-udp retries `EINTR` itself).
        let t = quinn_udp::Transmit {
            destination: t.destination,
            ecn: t
                .ecn
                .and_then(|e| quinn_udp::EcnCodepoint::from_bits(e as u8)),
            contents,
            segment_size: t.segment_size,
            src_ip: t.src_ip,
        };
        if self.state.try_send((&self.sock).into(), &t).is_err() {
            Counters::add(&self.counters.send_failed, 1);
        }
    }

    /// Sends what waits in the outbox.
    pub(super) fn flush(&mut self) {
        let before = self.outbox_stats.send_dropped + self.outbox_stats.send_errors;
        self.outbox.send_all(&self.sock, &mut self.outbox_stats);
        let failed = self.outbox_stats.send_dropped + self.outbox_stats.send_errors - before;
        Counters::add(&self.counters.send_failed, failed as usize);
    }

    /// Receives what is queued on the socket, without blocking, into `out`: each UDP datagram
    /// (or GRO batch of them, `meta.stride` bytes each) copied into a buffer of its own, which
    /// quinn takes.
    pub(super) fn recv_all(&mut self, out: &mut Vec<(RecvMeta, BytesMut)>) -> io::Result<()> {
        loop {
            let n = {
                let mut chunks = self.slots.chunks_mut(RECV_BUF);
                let mut bufs: [IoSliceMut<'_>; RECV_SLOTS] = std::array::from_fn(|_| {
                    IoSliceMut::new(chunks.next().expect("RECV_SLOTS slots"))
                });
                match self
                    .state
                    .recv((&self.sock).into(), &mut bufs, &mut self.meta)
                {
                    Ok(n) => n,
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    // A previous send's ICMP error surfaces here: nothing to read for it.
                    Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => continue,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(e) => return Err(e),
                }
            };
            for (i, meta) in self.meta[..n].iter().enumerate() {
                let at = i * RECV_BUF;
                let len = meta.len.min(RECV_BUF);
                out.push((*meta, BytesMut::from(&self.slots[at..at + len])));
            }
            if n < RECV_SLOTS {
                return Ok(());
            }
        }
        Ok(())
    }

    /// Blocks until a datagram is queued or `timeout` passes (`None`: no limit); `true` if one
    /// may be queued.
    pub(super) fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        poll_readable(self.sock.as_fd(), timeout)
    }

    /// Spins until `spin_until` or the end of `limit` from now, whichever is first; `true`
    /// once a datagram may be queued ([`crate::backend::spin::until_readable`]).
    pub(super) fn spin(&self, spin_until: Instant, limit: Option<Duration>) -> io::Result<bool> {
        let until = limit.map_or(spin_until, |l| spin_until.min(Instant::now() + l));
        crate::backend::spin::until_readable(self.sock.as_fd(), until)
    }

    /// The async form of [`Socket::wait`]: tokio readiness when bound inside a runtime, else
    /// sleeping polls of 100 µs.
    pub(super) async fn wait_async(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let Some(t) = &self.tokio_sock else {
            let step = Duration::from_micros(100);
            tokio::time::sleep(timeout.map_or(step, |t| t.min(step))).await;
            return self.wait(Some(Duration::ZERO));
        };
        let ready = async {
            loop {
                t.readable().await?;
                // Readiness may be stale (a blocking wait took the datagrams): ask the socket,
                // and let tokio clear it if nothing is there.
                let probe = || match self.wait(Some(Duration::ZERO)) {
                    Ok(true) => Ok(()),
                    Ok(false) => Err(io::ErrorKind::WouldBlock.into()),
                    Err(e) => Err(e),
                };
                match t.try_io(tokio::io::Interest::READABLE, probe) {
                    Ok(()) => return Ok(true),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                    Err(e) => return Err(e),
                }
            }
        };
        match timeout {
            Some(d) => tokio::time::timeout(d, ready).await.unwrap_or(Ok(false)),
            None => ready.await,
        }
    }
}
