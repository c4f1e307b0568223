//! The receiver: collects and decodes what the SIU hands its host.

use isotach_proto::Pulse;
use isotach_proto::packet::{
    DecodeError, EopMarker, IsochronMarker, IsotachMessage, Packet, PlainMessage,
};

/// Plays the host's receive side: the seed report's "receiver".
#[derive(Debug, Default)]
pub struct Receiver {
    packets: Vec<Packet>,
    raw: Vec<Vec<u8>>,
    undecodable: Vec<(Vec<u8>, DecodeError)>,
}

impl Receiver {
    /// An empty receiver.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes one host-bound packet; undecodable bytes are kept aside.
    pub fn push(&mut self, bytes: &[u8]) {
        match Packet::decode(bytes) {
            Ok(p) => {
                self.packets.push(p);
                self.raw.push(bytes.to_vec());
            }
            Err(e) => self.undecodable.push((bytes.to_vec(), e)),
        }
    }

    /// Every decoded packet, in arrival order.
    pub fn packets(&self) -> &[Packet] {
        &self.packets
    }

    /// The exact bytes of packet `i`.
    pub fn raw(&self, i: usize) -> &[u8] {
        &self.raw[i]
    }

    /// Bytes that did not decode, with the reason.
    pub fn undecodable(&self) -> &[(Vec<u8>, DecodeError)] {
        &self.undecodable
    }

    /// Packets received so far.
    pub fn len(&self) -> usize {
        self.packets.len()
    }

    /// Nothing received.
    pub fn is_empty(&self) -> bool {
        self.packets.is_empty()
    }

    /// Forgets everything received.
    pub fn clear(&mut self) {
        self.packets.clear();
        self.raw.clear();
        self.undecodable.clear();
    }

    /// EOP markers, in order.
    pub fn eops(&self) -> Vec<&EopMarker> {
        self.packets
            .iter()
            .filter_map(|p| match p {
                Packet::EopMarker(e) => Some(e),
                _ => None,
            })
            .collect()
    }

    /// Isochron markers, in order.
    pub fn markers(&self) -> Vec<&IsochronMarker> {
        self.packets
            .iter()
            .filter_map(|p| match p {
                Packet::IsochronMarker(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    /// Isotach messages, in order.
    pub fn messages(&self) -> Vec<&IsotachMessage> {
        self.packets
            .iter()
            .filter_map(|p| match p {
                Packet::IsotachMessage(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    /// Non-isotach messages, in order.
    pub fn plains(&self) -> Vec<&PlainMessage> {
        self.packets
            .iter()
            .filter_map(|p| match p {
                Packet::Plain(m) => Some(m),
                _ => None,
            })
            .collect()
    }

    /// The (non-repeat) EOP marker for pulse `ts`, if one arrived.
    pub fn eop_for(&self, ts: u64) -> Option<&EopMarker> {
        self.eops()
            .into_iter()
            .find(|e| e.ts == Pulse::new(ts) && !e.repeat)
    }

    /// Position in [`Receiver::packets`] of the (non-repeat) EOP marker for pulse `ts`.
    pub fn eop_position(&self, ts: u64) -> Option<usize> {
        self.packets
            .iter()
            .position(|p| matches!(p, Packet::EopMarker(e) if e.ts == Pulse::new(ts) && !e.repeat))
    }

    /// `(position, ts, source, sequum)` of every isotach message and isochron marker, in arrival
    /// order: the packets an EOP marker counts and sorts.
    pub fn isotach_packets(&self) -> Vec<(usize, u64, u16, u64)> {
        self.packets
            .iter()
            .enumerate()
            .filter_map(|(i, p)| match p {
                Packet::IsotachMessage(m) => Some((i, m.ts.get(), m.source, m.sequum)),
                Packet::IsochronMarker(m) => Some((i, m.ts.get(), m.source, m.sequum)),
                _ => None,
            })
            .collect()
    }

    /// `(source, sequum)` of the isotach packets with TS `ts`, in arrival order.
    pub fn pulse_packets(&self, ts: u64) -> Vec<(u16, u64)> {
        self.isotach_packets()
            .into_iter()
            .filter(|p| p.1 == ts)
            .map(|p| (p.2, p.3))
            .collect()
    }
}
