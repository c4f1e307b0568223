//! The UDP socket under a QUIC endpoint: quinn-udp's batched receives (`recvmmsg`, GRO) and
//! sends (GSO, ECN), a blocking wait for the next datagram, and the wire-loss test hook.
//!
//! The socket is non-blocking; a wait is one `poll(2)` (millisecond resolution, rounded up,
//! like the timers quinn's own runtime would give) and the receive that follows it.

use std::io::{self, IoSliceMut};
use std::net::{SocketAddr, UdpSocket};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use quinn_udp::{RecvMeta, UdpSocketState};

use super::Counters;
use super::wire_loss::WireLoss;
use crate::backend::udp::UdpStats;
use crate::backend::udp::tx::{GSO_MAX_SEGMENTS, Outbox};

/// Receive slots of one `recvmmsg` (each may hold a GRO batch of up to 64 datagrams).
const RECV_SLOTS: usize = 8;
/// The largest QUIC packet (UDP payload) sent or received: a node's `initial_mtu` is at most
/// 1452 ([`super::QuicConfig`]) and path-MTU discovery stops there. A receive slot holds a GRO
/// batch of these (smaller, it would truncate the batch and lose its tail).
const SEGMENT_BYTES_MAX: usize = 1500;
/// Most bytes one GSO batch may carry: the largest UDP payload over IPv4.
const GSO_BYTES_MAX: usize = 65_507;
/// Socket buffers asked for (the kernel caps them at `rmem_max` / `wmem_max`): a wave's
/// datagrams from every peer fit, so a busy moment loses nothing to a full buffer.
const SOCKET_BUFFER_BYTES: usize = 4 << 20;

pub(super) struct Socket {
    sock: UdpSocket,
    state: UdpSocketState,
    /// Registered with the tokio runtime the transport was bound in, for `wait_async`.
    tokio_sock: Option<tokio::net::UdpSocket>,
    /// [`RECV_SLOTS`] receive slots of `slot_bytes` (a GRO batch), allocated at bind.
    slots: Box<[u8]>,
    slot_bytes: usize,
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
        let slot_bytes = state.gro_segments().max(1) * SEGMENT_BYTES_MAX;
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
            slots: vec![0; RECV_SLOTS * slot_bytes].into_boxed_slice(),
            slot_bytes,
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
            .clamp(1, GSO_BYTES_MAX / SEGMENT_BYTES_MAX)
    }

    /// May the kernel fragment what we send (then path-MTU discovery must stay off)?
    pub(super) fn may_fragment(&self) -> bool {
        self.state.may_fragment()
    }

    /// Sends `contents` (one datagram, or a GSO batch of `segment_size` ones) to `to`. A full
    /// send buffer or an error the kernel reports for this path loses it (counted), as the
    /// network could.
    pub(super) fn send(
        &mut self,
        to: SocketAddr,
        ecn: Option<quinn_proto::EcnCodepoint>,
        segment_size: Option<usize>,
        src_ip: Option<std::net::IpAddr>,
        contents: &[u8],
    ) {
        if self.loss.as_ref().is_some_and(|l| l.lose()) {
            return;
        }
        if self.bound_to_one_ip {
            // ECN marks are left off (quinn then finds the path does not carry them).
            let seg = segment_size.unwrap_or(contents.len()).max(1);
            for d in contents.chunks(seg) {
                self.outbox.push(&self.sock, &mut self.outbox_stats, to, d);
            }
            return;
        }
        self.send_now(to, ecn, segment_size, src_ip, contents);
    }

    /// Sends one transmit at once, with its source address and ECN mark.
    fn send_now(
        &mut self,
        to: SocketAddr,
        ecn: Option<quinn_proto::EcnCodepoint>,
        segment_size: Option<usize>,
        src_ip: Option<std::net::IpAddr>,
        contents: &[u8],
    ) {
        let t = quinn_udp::Transmit {
            destination: to,
            ecn: ecn.and_then(|e| quinn_udp::EcnCodepoint::from_bits(e as u8)),
            contents,
            segment_size,
            src_ip,
        };
        loop {
            match self.state.try_send((&self.sock).into(), &t) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(_) => {
                    Counters::add(&self.counters.send_failed, 1);
                    return;
                }
                Ok(()) => return,
            }
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
    /// quinn takes. Returns how many were added.
    pub(super) fn recv_all(&mut self, out: &mut Vec<(RecvMeta, BytesMut)>) -> io::Result<usize> {
        let before = out.len();
        loop {
            let n = {
                let mut chunks = self.slots.chunks_mut(self.slot_bytes);
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
                let at = i * self.slot_bytes;
                let len = meta.len.min(self.slot_bytes);
                out.push((*meta, BytesMut::from(&self.slots[at..at + len])));
            }
            if n < RECV_SLOTS {
                break;
            }
        }
        Ok(out.len() - before)
    }

    /// Blocks until a datagram is queued or `timeout` passes (`None`: no limit); `true` if one
    /// may be queued.
    pub(super) fn wait(&self, timeout: Option<Duration>) -> io::Result<bool> {
        let ms = timeout.map_or(-1, |t| {
            i32::try_from(t.as_micros().div_ceil(1000)).unwrap_or(i32::MAX)
        });
        let timeout = PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(self.sock.as_fd(), PollFlags::POLLIN)];
        match poll(&mut fds, timeout) {
            Ok(0) | Err(Errno::EINTR) => Ok(false),
            Ok(_) => Ok(true),
            Err(e) => Err(io::Error::from(e)),
        }
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
