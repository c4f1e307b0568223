//! [`AmSiuLink`] (feature `daemon`): the [`SiuLink`] to a real SIU daemon, over a local AM
//! endpoint (a [`PacketPort`] whose only peer is the SIU: reliable and FIFO both ways).
//!
//! The SMM library's API is unchanged: wrap the link in [`crate::Smm`] for blocking waits.

use crate::driver::{LinkError, SiuLink};
use isotach_am::backend::udp::UdpTransport;
use isotach_am::port::{DEFAULT_TAG, PacketPort};
use isotach_am::{NodeAddr, Transport};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The SIU's peer id in the port.
const SIU: usize = 0;

/// A link to the host's SIU daemon over Active Messages.
#[derive(Debug)]
pub struct AmSiuLink<T: Transport> {
    port: PacketPort<T>,
}

fn link_err(e: impl std::fmt::Display) -> LinkError {
    LinkError(e.to_string())
}

impl AmSiuLink<UdpTransport> {
    /// Binds `bind` (the host's `app` address) and connects to the SIU at `siu`, waiting at
    /// most `timeout` for it to answer.
    pub fn connect_udp(
        bind: SocketAddr,
        siu: SocketAddr,
        timeout: Duration,
    ) -> Result<Self, LinkError> {
        let t = UdpTransport::bind(bind).map_err(|e| LinkError(format!("bind {bind}: {e}")))?;
        let port = PacketPort::new(t, &[NodeAddr::Ip(siu)], DEFAULT_TAG).map_err(link_err)?;
        Self::connect(port, timeout)
    }
}

impl<T: Transport> AmSiuLink<T> {
    /// Waits (at most `timeout`) until the SIU, the port's peer 0, answered the hello.
    pub fn connect(mut port: PacketPort<T>, timeout: Duration) -> Result<Self, LinkError> {
        let deadline = Instant::now() + timeout;
        loop {
            port.poll().map_err(link_err)?;
            if port.is_up(SIU) {
                return Ok(Self { port });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LinkError(format!(
                    "no answer from the SIU within {timeout:?}"
                )));
            }
            port.wait(left.min(Duration::from_millis(10)))
                .map_err(link_err)?;
        }
    }

    /// The port (statistics).
    pub fn port(&self) -> &PacketPort<T> {
        &self.port
    }
}

impl<T: Transport> SiuLink for AmSiuLink<T> {
    fn send(&mut self, packet: Vec<u8>) -> Result<(), LinkError> {
        self.port.send(SIU, &packet).map_err(link_err)?;
        self.port.poll().map_err(link_err)?;
        Ok(())
    }

    fn recv(&mut self, timeout: Duration) -> Result<Option<Vec<u8>>, LinkError> {
        if let Some((_, p)) = self.port.recv() {
            return Ok(Some(p));
        }
        self.port.poll().map_err(link_err)?;
        if let Some((_, p)) = self.port.recv() {
            return Ok(Some(p));
        }
        if timeout.is_zero() {
            return Ok(None);
        }
        self.port.wait(timeout).map_err(link_err)?;
        self.port.poll().map_err(link_err)?;
        Ok(self.port.recv().map(|(_, p)| p))
    }
}
