//! The node's wire: every packet between the node and its SIU. Input is decoded here (isotach
//! messages and isochron markers go to their bucket, an EOP marker drains one, non-isotach
//! messages carry replies); output is encoded here (isochrons, barrier/signal markers,
//! replies) and queued for the SIU. No byte offsets: every layout is `isotach_proto`'s.

use super::SmmNode;
use super::drain::Bucketed;
use crate::SmmError;
use isotach_proto::Generation;
use isotach_proto::Pulse;
use isotach_proto::packet::{
    self, BarrierSignalMarker, BufPool, EndOfIsochron, EopMarker, IsochronMarker, IsotachMessage,
    Kind, PlainMessage, PlainView, Sref, StartOfIsochron,
};
use isotach_proto::reply::HostReply;
use isotach_proto::topology::{HostId, Topology};

/// The channel every isochron of this node uses (requirement 27).
const ISOCHRON_CHANNEL: u8 = 0;
/// Sequence sets isochrons alternate between (requirement 27).
const SEQSETS: u64 = 2;
/// Isochron distance when no destination is farther (a distance is at least 1).
const DISTANCE_MIN: u16 = 1;

impl SmmNode {
    /// Handles one packet from the SIU: an isotach message, an isochron marker, an EOP marker
    /// or a non-isotach message (read replies).
    pub fn handle_siu(&mut self, bytes: &[u8]) -> Result<(), SmmError> {
        let r = self.siu_input(bytes);
        if let Err(e) = &r {
            self.count_input_error(e);
        }
        r
    }

    /// Decodes one packet from the SIU and hands it to its concept.
    fn siu_input(&mut self, bytes: &[u8]) -> Result<(), SmmError> {
        let bad = |e: packet::DecodeError| SmmError::BadInput(e.to_string());
        match packet::peek_kind(bytes).map_err(bad)? {
            Kind::IsotachMessage => {
                let m = IsotachMessage::decode(bytes).map_err(bad)?;
                self.bucket(m.ts.get(), Bucketed::Message(m))
            }
            Kind::IsochronMarker => {
                let k = IsochronMarker::decode(bytes).map_err(bad)?;
                if k.source != self.cfg.host {
                    return Err(SmmError::BadInput(format!("marker from host {}", k.source)));
                }
                self.bucket(k.ts.get(), Bucketed::Marker(k))
            }
            Kind::EopMarker => {
                let e = EopMarker::decode(bytes).map_err(bad)?;
                self.end_pulse(&e)
            }
            Kind::Plain => {
                let p = PlainMessage::parse(bytes).map_err(bad)?;
                self.plain(p)
            }
            kind => Err(SmmError::BadInput(format!("{kind:?} from the SIU"))),
        }
    }

    /// A non-isotach message: a reply to a read or to a copy request.
    fn plain(&mut self, p: PlainView<'_>) -> Result<(), SmmError> {
        let r = HostReply::decode(p.payload)
            .map_err(|e| SmmError::BadInput(format!("non-isotach payload: {e}")))?;
        match r {
            HostReply::ReadValue { ref_id, value } => self.resolve_read(ref_id, value),
            HostReply::ReadRefused { ref_id, .. } => self.refuse_read(ref_id, p.source),
            HostReply::CopyRefused { .. } | HostReply::PageImage { .. } => {
                self.join_reply(p.source, &r)
            }
        }
    }

    /// Packets are waiting for the SIU.
    pub fn has_output(&self) -> bool {
        !self.to_siu.is_empty()
    }

    /// Next packet for the SIU.
    pub fn poll_siu(&mut self) -> Option<Vec<u8>> {
        self.to_siu.pop_front()
    }

    /// The buffers this node builds its packets in: its driver gives it each packet it handled
    /// ([`SmmNode::handle_siu`]) and spares of its link's, so that packets cost no allocation
    /// once buffers circulate (`isotach_proto::packet::BufPool`); what the pool does not keep
    /// goes back to the link.
    pub fn buffers(&mut self) -> &mut BufPool {
        &mut self.pool
    }

    /// Queues a barrier/signal marker.
    pub(super) fn push_marker(&mut self, m: BarrierSignalMarker) {
        let mut out = self.pool.take(packet::BSM_LEN);
        m.encode(&mut out);
        self.to_siu.push_back(out);
        self.sent_marker = true;
    }

    /// Sends the remote part: start, one message per sref, end. The isochron distance is the
    /// largest distance to a destination. Sets alternate per isochron and every isochron is
    /// logged, so each is ordered after the previous one: TS never decreases per host.
    pub(super) fn send_isochron(&mut self, iso_id: u32, index: u64, remote: &[(HostId, Sref)]) {
        let me = self.cfg.host;
        let topo: &Topology = &self.cfg.topology;
        let distance = remote
            .iter()
            .map(|(d, _)| topo.distance(me, *d))
            .max()
            .unwrap_or(DISTANCE_MIN);
        let soi = StartOfIsochron {
            iso_id,
            channel: ISOCHRON_CHANNEL,
            seqset: (index % SEQSETS) as u8,
            logged: true,
            host_gap: false,
            gap: 0,
            send_delta: 0,
            distance,
        };
        let mut out = self.pool.take(packet::SOI_LEN);
        soi.encode(&mut out);
        self.to_siu.push_back(out);
        for (dest, sref) in remote {
            let m = IsotachMessage {
                ts: Pulse::new(0),
                source: me,
                dest: *dest,
                sequum: 0,
                // ts, sequum and generation are stamped by the SIU.
                generation: Generation::new(0),
                sref: sref.clone(),
            };
            let mut out = self.pool.take(m.encoded_len());
            m.encode(&mut out);
            self.to_siu.push_back(out);
        }
        let mut out = self.pool.take(packet::EOI_LEN);
        EndOfIsochron { iso_id }.encode(&mut out);
        self.to_siu.push_back(out);
    }

    /// Sends a reply payload to `dest` as a non-isotach message.
    pub(super) fn send_reply(&mut self, dest: HostId, r: &HostReply<'_>) {
        let mut payload = std::mem::take(&mut self.reply_payload);
        payload.clear();
        r.encode(&mut payload);
        let p = PlainView {
            source: self.cfg.host,
            dest,
            payload: &payload,
        };
        let mut out = self.pool.take(packet::PLAIN_LEN_MIN + payload.len());
        p.encode(&mut out);
        self.reply_payload = payload;
        self.to_siu.push_back(out);
    }
}
