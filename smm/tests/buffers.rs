//! Packet buffers circulate between the node and its link: the driver gives the node each
//! packet it handled and tops the node up from the link's spares after it sent, and the node
//! builds its packets in them.

use isotach_proto::packet::{BUFFER_BYTES_MIN, POOL_BUFFERS_MAX, Width};
use isotach_smm::testkit::{remote_pages_node, write_message};
use isotach_smm::{Addr, LinkError, SiuLink, Smm, SmmLimits};
use std::collections::{HashSet, VecDeque};
use std::time::Duration;

/// A link that hands out queued packets and spare buffers, and counts what comes back.
#[derive(Default)]
struct SpareLink {
    inbox: VecDeque<Vec<u8>>,
    sent: Vec<Vec<u8>>,
    spares: Vec<Vec<u8>>,
    recycled: usize,
}

impl SiuLink for SpareLink {
    fn send(&mut self, packet: Vec<u8>) -> Result<(), LinkError> {
        self.sent.push(packet);
        Ok(())
    }
    fn recv(&mut self, _timeout: Duration) -> Result<Option<Vec<u8>>, LinkError> {
        Ok(self.inbox.pop_front())
    }
    fn recycle(&mut self, _buf: Vec<u8>) {
        self.recycled += 1;
    }
    fn take_spare(&mut self) -> Option<Vec<u8>> {
        self.spares.pop()
    }
}

/// Host 0 of four holding page 0; pages 1-3 only at hosts 1-3.
fn smm(link: SpareLink) -> Smm<SpareLink> {
    Smm::new(remote_pages_node(SmmLimits::default()), link)
}

#[test]
fn the_node_keeps_what_it_handled_up_to_its_limit_and_the_link_gets_the_rest() {
    let mut link = SpareLink::default();
    let packets = POOL_BUFFERS_MAX + 36;
    for i in 0..packets {
        // Writes to page 0 from host 1, in pulse 1: bucketed, the buffer handled.
        let mut b = Vec::with_capacity(BUFFER_BYTES_MIN);
        write_message(1, 1, i as u64, i % 16).encode(&mut b);
        link.inbox.push_back(b);
    }
    let mut smm = smm(link);
    assert_eq!(smm.poll().unwrap(), packets);
    assert_eq!(
        smm.node().buffers().room(),
        0,
        "the node kept {POOL_BUFFERS_MAX}"
    );
    assert_eq!(smm.link().recycled, packets - POOL_BUFFERS_MAX);
}

#[test]
fn after_sending_the_node_is_stocked_from_the_link_and_builds_in_those_buffers() {
    let mut link = SpareLink::default();
    let spares = 2 * POOL_BUFFERS_MAX;
    link.spares = (0..spares)
        .map(|_| Vec::with_capacity(BUFFER_BYTES_MIN))
        .collect();
    let from_link: HashSet<*const u8> = link.spares.iter().map(|b| b.as_ptr()).collect();
    let mut smm = smm(link);
    let issue = |smm: &mut Smm<SpareLink>| {
        let mut iso = smm.node().isochron();
        iso.add(Addr::new(1, 0), Width::W64, 5).unwrap();
        iso.add(Addr::new(2, 0), Width::W64, 1).unwrap();
        iso.end().unwrap();
        smm.poll().unwrap();
    };
    // The first isochron's four packets are new; sending them stocks the node to half its
    // limit from the link's spares.
    issue(&mut smm);
    assert_eq!(smm.link().sent.len(), 4);
    assert_eq!(smm.node().buffers().room(), POOL_BUFFERS_MAX / 2);
    assert_eq!(smm.link().spares.len(), spares - POOL_BUFFERS_MAX / 2);
    // The next one's are built in the link's buffers.
    issue(&mut smm);
    let sent = &smm.link().sent;
    assert_eq!(sent.len(), 8);
    assert!(
        sent[4..].iter().all(|p| from_link.contains(&p.as_ptr())),
        "the second isochron's packets are in buffers the link gave"
    );
    assert!(sent[..4].iter().all(|p| !from_link.contains(&p.as_ptr())));
}
