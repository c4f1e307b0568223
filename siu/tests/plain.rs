//! Non-isotach traffic from the host leaves in the host's own buffer: the SIU checks it in
//! place (`PlainMessage::parse`) and moves the buffer the driver handed over to the network
//! queue — no copy, no allocation per packet.

mod common;

use isotach_proto::packet::PlainMessage;
use isotach_siu::{Mode, Route};

#[test]
fn a_plain_message_from_the_host_leaves_in_the_buffer_it_came_in() {
    let mut s = common::siu(Mode::Siu, 0, false);
    let mut buf = Vec::new();
    PlainMessage {
        source: 0,
        dest: 1,
        payload: b"a read's answer".to_vec(),
    }
    .encode(&mut buf);
    let sent = buf.clone();
    let at = buf.as_ptr();
    s.handle_host_owned(0, &mut buf).unwrap();
    assert!(buf.is_empty(), "the SIU took the driver's buffer");
    let t = s.poll_net().expect("queued for the network");
    assert_eq!(t.route, Route::Host(1));
    assert_eq!(t.bytes, sent);
    assert_eq!(t.bytes.as_ptr(), at, "the same allocation, not a copy");
    // Borrowed input (a driver that keeps its buffer) is copied, as before.
    s.handle_host(1, &sent).unwrap();
    assert_eq!(s.poll_net().expect("queued").bytes, sent);
}
