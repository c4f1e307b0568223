//! The link layer: the batch decoder and the link core fed datagrams from a raw peer.

use super::*;

/// Fuzzes the batch decoder (`isotach_am_proto::link::batch`): never panics; yields at most
/// `BATCH_PACKETS_MAX` packets and then at most one error, then nothing; the error agrees with
/// the bytes left; re-encoding the packets it accepted gives back exactly the bytes they came
/// from (all of them when there was no error).
pub fn check_link_batch(data: &[u8]) {
    use isotach_am_proto::link::FRAGMENT_MAX;
    use isotach_am_proto::link::batch::{self, BATCH_PACKETS_MAX, BatchError, LEN_PREFIX};
    let mut it = batch::packets(data);
    let (mut accepted, mut error) = (Vec::new(), None);
    for item in it.by_ref() {
        match item {
            Ok(p) => accepted.push(p),
            Err(e) => {
                error = Some(e);
                break;
            }
        }
    }
    assert!(it.next().is_none(), "nothing after an error or the end");
    assert!(accepted.len() <= BATCH_PACKETS_MAX);
    let used: usize = accepted.iter().map(|p| batch::entry_len(p.len())).sum();
    let rest = &data[used..];
    match error {
        None => assert!(
            rest.is_empty() && !accepted.is_empty(),
            "a clean end is the end"
        ),
        Some(BatchError::Empty) => assert!(data.is_empty()),
        Some(BatchError::TooMany) => {
            assert_eq!(accepted.len(), BATCH_PACKETS_MAX);
            assert!(!rest.is_empty());
        }
        Some(BatchError::Truncated) => {
            assert!(!rest.is_empty() && accepted.len() < BATCH_PACKETS_MAX);
            let announced = rest
                .get(..LEN_PREFIX)
                .map(|b| usize::from(u16::from_le_bytes([b[0], b[1]])));
            assert!(announced.is_none_or(|n| LEN_PREFIX + n > rest.len()));
        }
    }
    // Decode → encode: the encoder writes exactly the bytes the decoder read.
    let mut again = Vec::new();
    for p in &accepted {
        if data.len() <= FRAGMENT_MAX {
            assert!(
                batch::push(&mut again, p),
                "a packet of a medium payload fits one"
            );
        } else {
            again.extend_from_slice(&(p.len() as u16).to_le_bytes());
            again.extend_from_slice(p);
        }
    }
    assert_eq!(again, &data[..used], "decode → encode changed the bytes");
}

/// A peer at `Mem(1)` that speaks the link's AM messages with whatever arguments and payloads
/// the fuzzer picks: a bare AM core that answers hellos, acks everything and keeps nothing.
#[derive(Debug)]
struct RawPeer;

impl isotach_am_proto::Dispatch for RawPeer {
    fn handler_kind(
        &self,
        _ep: isotach_am_proto::EpId,
        h: isotach_am_proto::HandlerId,
    ) -> isotach_am_proto::HandlerKind {
        use isotach_am_proto::HandlerKind;
        use isotach_am_proto::link::{H_BATCH, H_CREDIT, H_DATA, H_HELLO, H_HELLO_ACK};
        match h {
            H_HELLO_ACK => HandlerKind::Reply,
            H_DATA | H_HELLO | H_CREDIT | H_BATCH => HandlerKind::Request,
            _ => HandlerKind::Unset,
        }
    }
    fn on_request(&mut self, req: isotach_am_proto::Request<'_>) {
        use isotach_am_proto::link::{H_HELLO, H_HELLO_ACK};
        if req.handler() == H_HELLO {
            let _ = req.reply_short(H_HELLO_ACK, &[7]);
        }
    }
    fn on_reply(&mut self, _rep: isotach_am_proto::Reply<'_>) {}
}

/// Runs a `Links` (node `Mem(0)`, one peer `Mem(1)`, a small queue) against a scripted raw
/// peer. Each operation is one opcode byte and its operands (missing bytes read as 0):
/// batches, data fragments, credit and hellos with fuzz arguments and payloads, raw
/// datagrams, packets sent and received, time passing. Checks: no panic (the link core's
/// debug assertions are on), the window and the queue bound hold, every received packet is
/// within `PACKET_MAX`, the counters agree with what the peer sent. Returns the links'
/// counters (for probes).
pub fn run_links(data: &[u8]) -> isotach_am_proto::link::LinkStats {
    use isotach_am_proto::link::{
        self, BATCH_VERSION, DEFAULT_TAG, FRAGMENT_MAX, H_BATCH, H_CREDIT, H_DATA, H_HELLO,
        LINK_EP, Links, PACKET_MAX,
    };
    use isotach_am_proto::{Core, EndpointName, NodeAddr, SendReq, Time};
    use std::time::Duration;

    /// UDP's datagram over Ethernet, as the daemons run (allocates less per input than 64 KiB).
    const DATAGRAM: usize = 1472;
    let mut input = Input::new(data);
    let (us, them) = (NodeAddr::Mem(0), NodeAddr::Mem(1));
    let mut links = Links::new(Links::am_config(), us, 1, DATAGRAM, &[them], DEFAULT_TAG)
        .expect("one peer at another address");
    let queue_max = 1 + usize::from(input.u8()) * 4;
    links.set_queue_max(queue_max);
    let mut peer = Core::new(Links::am_config(), them, 1, DATAGRAM).expect("peer core");
    let ep = peer.alloc_endpoint().expect("endpoint");
    peer.set_tag(ep, DEFAULT_TAG).expect("tag");
    let idx = peer
        .map_any(
            ep,
            EndpointName {
                node: us,
                ep: LINK_EP,
            },
            DEFAULT_TAG,
        )
        .expect("translation");
    peer.set_fifo(us, true).expect("fifo");
    let mut now = Time(0);
    let (mut batches_v1, mut batches_other, mut received) = (0u64, 0u64, 0u64);
    let mut ops = 0;
    while !input.is_empty() && ops < 256 {
        ops += 1;
        let op = input.u8();
        // Mostly the current stream (0) or the next; sometimes anything.
        let stream = match input.u8() {
            0..=200 => 0,
            201..=250 => 1,
            b => u64::from(b) << 32,
        };
        match op % 8 {
            0 | 1 => {
                let version = if op & 0x80 == 0 {
                    BATCH_VERSION
                } else {
                    u64::from(input.u8())
                };
                let len = usize::from(input.u16()) % (FRAGMENT_MAX + 1);
                let payload = input.take(len);
                let args = [version, stream];
                let sent =
                    peer.send_request(now, SendReq::medium(ep, idx, H_BATCH, payload, &args));
                if sent.is_ok() {
                    *(if version == BATCH_VERSION {
                        &mut batches_v1
                    } else {
                        &mut batches_other
                    }) += 1;
                }
            }
            2 => {
                let more = u64::from(op & 0x80 != 0);
                let len = usize::from(input.u16()) % (FRAGMENT_MAX + 1);
                let payload = input.take(len);
                let args = [more, stream];
                let _ = peer.send_request(now, SendReq::medium(ep, idx, H_DATA, payload, &args));
            }
            3 => {
                let args = [u64::from(input.u8()), stream];
                let _ = peer.send_request(now, SendReq::short(ep, idx, H_CREDIT, &args));
            }
            4 => {
                let args = [DEFAULT_TAG.0, u64::from(input.u8())];
                let _ = peer.send_request(now, SendReq::short(ep, idx, H_HELLO, &args));
            }
            5 => {
                let len = usize::from(input.u16()) % 1500;
                let raw = input.take(len);
                links.handle_datagram(now, them, raw);
            }
            6 => {
                for _ in 0..input.u8() {
                    let len = match input.u8() {
                        0..=239 => usize::from(input.u8()),
                        b => usize::from(b - 239) * 4099,
                    };
                    if links.has_room(0) {
                        links
                            .send(0, vec![op; len.min(PACKET_MAX)])
                            .expect("a peer");
                    }
                }
            }
            _ => {
                for _ in 0..input.u8() {
                    if let Some((p, bytes)) = links.recv() {
                        assert_eq!(p, 0);
                        assert!(bytes.len() <= PACKET_MAX);
                        received += 1;
                    }
                }
                now = now.plus(Duration::from_millis(u64::from(input.u8()) * 50));
                links.handle_timeout(now);
                peer.handle_timeout(now);
            }
        }
        // Both ways until quiet (bounded: a hostile script may keep the link busy).
        for _ in 0..64 {
            let mut moved = 0;
            while let Some((to, bytes)) = peer.poll_transmit() {
                assert_eq!(to, us);
                links.handle_datagram(now, them, bytes);
                moved += 1;
            }
            while let Some((to, bytes)) = links.poll_transmit(now) {
                assert_eq!(to, them);
                peer.handle_datagram(now, us, bytes, &mut RawPeer);
                moved += 1;
            }
            while peer.poll_returned().is_some() {}
            if moved == 0 {
                break;
            }
        }
        assert!(links.in_flight(0) <= links.window(), "window overrun");
        assert!(links.queued() <= queue_max, "queue bound overrun");
        let s = links.stats();
        assert!(s.batches_received <= batches_v1, "{s:?}");
        assert!(s.batch_bad_version <= batches_other, "{s:?}");
        assert!(s.packets_batched <= s.packets_received, "{s:?}");
        assert!(s.batch_truncated <= s.batches_received, "{s:?}");
        assert!(
            s.packets_batched <= s.batches_received * link::BATCH_PACKETS_MAX as u64,
            "{s:?}"
        );
        assert!(received <= s.packets_received);
    }
    links.stats()
}

#[cfg(test)]
mod tests {
    /// The link session reaches what it is for: a batch read, a truncated batch, a batch of
    /// an unknown version, and our own batches out.
    #[test]
    fn run_links_reaches_batches_good_and_bad() {
        let mut script = vec![0u8]; // queue bound 1
        script.extend([7, 0, 0, 0]); // settle: hello both ways
        // A batch of two packets ("ab", "c"), stream 0 (payload length: big-endian u16).
        script.extend([0, 0, 0, 7, 2, 0, b'a', b'b', 1, 0, b'c']);
        // A truncated one: announces 9 bytes, holds 1.
        script.extend([0, 0, 0, 3, 9, 0, b'x']);
        // Version 2 (the version byte follows the stream byte).
        script.extend([0x80, 0, 2, 0, 3, 1, 0, b'y']);
        let s = super::run_links(&script);
        assert_eq!(s.batches_received, 2, "{s:?}");
        assert_eq!(s.packets_batched, 2, "{s:?}");
        assert_eq!((s.batch_truncated, s.batch_bad_version), (1, 1), "{s:?}");
        // Our side: three small packets at once with room for many go as one batch.
        let s = super::run_links(&[255, 7, 0, 0, 0, 6, 0, 3, 0, 1, 0, 1, 0, 1]);
        assert_eq!((s.batches_sent, s.packets_in_batches), (1, 3), "{s:?}");
    }
}
