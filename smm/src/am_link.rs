//! [`AmSiuLink`] (feature `daemon`): the [`SiuLink`] to a real SIU daemon, over a local AM
//! endpoint (a [`PacketPort`] whose only peer is the SIU: reliable and FIFO both ways), over
//! UDP ([`AmSiuLink::connect_udp`]), QUIC with mutual TLS ([`AmSiuLink::connect_quic`]) or any
//! other transport ([`AmSiuLink::connect`]).
//!
//! The SMM library's API is unchanged: wrap the link in [`crate::Smm`] for blocking waits.

use crate::driver::{LinkError, SiuLink};
use isotach_am::backend::quic::{QuicConfig, QuicIdentity, QuicTransport};
use isotach_am::backend::udp::{UdpConfig, UdpTransport};
use isotach_am::port::{LinkEvent, PacketPort};
use isotach_am::{NodeAddr, Status, Tag, Transport};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The SIU's peer id in the port.
const SIU: usize = 0;
/// After the SIU refused a hello for its tag, wait this long before the next one (the port
/// would otherwise say hello again at once, once per round trip).
const TAG_BACKOFF: Duration = Duration::from_millis(200);

/// A link to the host's SIU daemon over Active Messages.
#[derive(Debug)]
pub struct AmSiuLink<T: Transport> {
    port: PacketPort<T>,
    /// Why the link to the SIU broke, once it did (the port said so).
    broken: Option<String>,
}

fn link_err(e: impl std::fmt::Display) -> LinkError {
    LinkError(e.to_string())
}

impl AmSiuLink<UdpTransport> {
    /// Binds `bind` (the host's `app` address) and connects to the SIU at `siu` over AM on
    /// UDP with tag `tag`, waiting at most `timeout` for it to answer. Waits spin up to
    /// `spin` before they sleep while traffic flows (`[transport] spin-us`).
    pub fn connect_udp(
        bind: SocketAddr,
        siu: SocketAddr,
        tag: Tag,
        timeout: Duration,
        spin: Duration,
    ) -> Result<Self, LinkError> {
        let cfg = UdpConfig::new(bind).with_spin(spin);
        let t =
            UdpTransport::with_config(cfg).map_err(|e| LinkError(format!("bind {bind}: {e}")))?;
        let port = PacketPort::new(t, &[NodeAddr::Ip(siu)], tag).map_err(link_err)?;
        Self::connect(port, timeout)
    }
}

impl AmSiuLink<QuicTransport> {
    /// Binds `bind` (the host's `app` address) and connects to the SIU at `siu` over AM on
    /// QUIC, presenting `identity` (a certificate the cluster CA signed; the SIU's must be
    /// signed by the same CA), with tag `tag`, waiting at most `timeout` for it to answer;
    /// waits spin as in [`AmSiuLink::connect_udp`].
    pub fn connect_quic(
        bind: SocketAddr,
        siu: SocketAddr,
        identity: QuicIdentity,
        tag: Tag,
        timeout: Duration,
        spin: Duration,
    ) -> Result<Self, LinkError> {
        let cfg = QuicConfig::new(bind, identity).with_spin(spin);
        let t = QuicTransport::bind(cfg).map_err(|e| LinkError(format!("bind {bind}: {e}")))?;
        let port = PacketPort::new(t, &[NodeAddr::Ip(siu)], tag).map_err(link_err)?;
        Self::connect(port, timeout)
    }
}

impl<T: Transport> AmSiuLink<T> {
    /// Waits (at most `timeout`) until the SIU, the port's peer 0, answered the hello. The
    /// error says when the SIU answered but refused the hello (another `[transport] tag`).
    pub fn connect(mut port: PacketPort<T>, timeout: Duration) -> Result<Self, LinkError> {
        let deadline = Instant::now() + timeout;
        let siu = port.links().peer_addrs().next();
        let (mut bad_tag, mut last_status) = (0u64, None);
        loop {
            port.poll().map_err(link_err)?;
            if port.is_up(SIU) {
                return Ok(Self { port, broken: None });
            }
            let mut refused_now = false;
            while let Some(ev) = port.take_event() {
                if let LinkEvent::HelloReturned { status, .. } = ev {
                    last_status = Some(status);
                    if status == Status::BadTag {
                        bad_tag += 1;
                        refused_now = true;
                    }
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(connect_error(
                    siu,
                    timeout,
                    port.links().tag(),
                    bad_tag,
                    last_status,
                ));
            }
            if refused_now {
                // Not polling meanwhile: no new hello leaves before the back-off ends.
                std::thread::sleep(left.min(TAG_BACKOFF));
                continue;
            }
            port.wait(left.min(Duration::from_millis(10)))
                .map_err(link_err)?;
        }
    }

    /// The port (statistics).
    pub fn port(&self) -> &PacketPort<T> {
        &self.port
    }

    /// Runs the port and notes a broken link to the SIU (it restarted, or the AM layer gave
    /// up on it): the SIU's logical time does not go on across it.
    fn poll(&mut self) -> Result<(), LinkError> {
        self.port.poll().map_err(link_err)?;
        while let Some(ev) = self.port.take_event() {
            if let LinkEvent::PeerLost {
                peer: SIU, reason, ..
            } = ev
            {
                self.broken.get_or_insert_with(|| format!("{reason:?}"));
            }
        }
        Ok(())
    }
}

/// Why [`AmSiuLink::connect`] gave up.
fn connect_error(
    siu: Option<NodeAddr>,
    timeout: Duration,
    tag: Tag,
    bad_tag: u64,
    last_status: Option<Status>,
) -> LinkError {
    let at = siu.map_or_else(String::new, |a| format!(" at {a}"));
    let why = if bad_tag > 0 {
        format!(
            ": it refused our hello {bad_tag} times for its tag (BadTag): the SIU's [transport] \
             tag differs from ours ({:#x})",
            tag.0
        )
    } else {
        match last_status {
            Some(s) => format!(" (our hellos came back: {s:?})"),
            None => String::new(),
        }
    };
    LinkError(format!(
        "no answer from the SIU{at} within {timeout:?}{why}"
    ))
}

impl<T: Transport> SiuLink for AmSiuLink<T> {
    /// Queues the packet; it leaves with the next [`SiuLink::flush`] or receive, batched
    /// with the rest of its burst (at once when the queue towards the SIU is full).
    fn send(&mut self, packet: Vec<u8>) -> Result<(), LinkError> {
        if !self.port.has_room(SIU) {
            self.poll()?;
        }
        self.port.send(SIU, &packet).map_err(link_err)
    }

    fn flush(&mut self) -> Result<(), LinkError> {
        self.poll()
    }

    fn try_recv(&mut self) -> Option<Vec<u8>> {
        self.port.recv().map(|(_, p)| p)
    }

    fn recycle(&mut self, buf: Vec<u8>) {
        self.port.links_mut().recycle(buf);
    }

    fn take_spare(&mut self) -> Option<Vec<u8>> {
        self.port.links_mut().take_spare()
    }

    fn recv(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, LinkError> {
        if let Some((_, p)) = self.port.recv() {
            return Ok(Some(p));
        }
        self.poll()?;
        if let Some((_, p)) = self.port.recv() {
            return Ok(Some(p));
        }
        if timeout.is_zero() {
            return Ok(None);
        }
        self.port.wait(timeout).map_err(link_err)?;
        self.poll()?;
        Ok(self.port.recv().map(|(_, p)| p))
    }

    fn broken(&mut self) -> Option<String> {
        self.broken.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use isotach_am::backend::chan::{ChanNet, ChanTransport};
    use isotach_am::port::DEFAULT_TAG;

    /// An SIU stand-in on `net` with tag `tag` that answers hellos until `stop`.
    fn siu(
        net: &ChanNet,
        app: NodeAddr,
        tag: Tag,
    ) -> (
        NodeAddr,
        std::sync::Arc<std::sync::atomic::AtomicBool>,
        std::thread::JoinHandle<()>,
    ) {
        let t = net.node();
        let addr = t.local_addr();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let th = std::thread::spawn(move || {
            let mut port = PacketPort::new(t, &[app], tag).unwrap();
            while !s.load(std::sync::atomic::Ordering::SeqCst) {
                port.poll().unwrap();
                port.wait(Duration::from_millis(5)).unwrap();
            }
        });
        (addr, stop, th)
    }

    fn app(net: &ChanNet) -> ChanTransport {
        net.node()
    }

    #[test]
    fn a_config_without_spin_us_spins_as_long_as_a_transport_bound_without_one() {
        // Two crates, one default: the cluster config (`[transport] spin-us`) and the
        // backends (`UdpConfig::new`, `QuicConfig::new`) must agree.
        assert_eq!(
            isotach_am::backend::spin::SPIN_DEFAULT,
            Duration::from_micros(isotach_proto::config::SPIN_US_DEFAULT)
        );
        assert_eq!(
            isotach_am::backend::spin::SPIN_MAX,
            Duration::from_micros(isotach_proto::config::SPIN_US_MAX)
        );
    }

    #[test]
    fn connects_when_the_tags_match() {
        let net = ChanNet::new();
        let t = app(&net);
        let (addr, stop, th) = siu(&net, t.local_addr(), DEFAULT_TAG);
        let port = PacketPort::new(t, &[addr], DEFAULT_TAG).unwrap();
        let link = AmSiuLink::connect(port, Duration::from_secs(60)).unwrap();
        assert!(link.port().is_up(SIU));
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        th.join().unwrap();
    }

    #[test]
    fn another_tag_is_refused_with_a_clear_error() {
        let net = ChanNet::new();
        let t = app(&net);
        let (addr, stop, th) = siu(&net, t.local_addr(), DEFAULT_TAG);
        let port = PacketPort::new(t, &[addr], Tag(0xF0E1)).unwrap();
        let e = AmSiuLink::connect(port, Duration::from_millis(800)).unwrap_err();
        stop.store(true, std::sync::atomic::Ordering::SeqCst);
        th.join().unwrap();
        let msg = e.to_string();
        assert!(msg.contains("BadTag") && msg.contains("0xf0e1"), "{msg}");
        assert!(msg.contains(&addr.to_string()), "{msg}");
    }
}
