//! The SIU builds its tokens and markers in packet buffers its driver handed in (a received
//! packet's, a spare of its links'), so that they cost no allocation once buffers circulate.

mod common;

use isotach_proto::packet::{BUFFER_BYTES_MIN, POOL_BUFFERS_MAX, Packet};
use isotach_siu::{Mode, Route};

/// Hands `s` `n` buffers; their addresses.
fn hand_in(s: &mut isotach_siu::Siu, n: usize) -> Vec<*const u8> {
    (0..n)
        .map(|_| {
            let b = Vec::with_capacity(BUFFER_BYTES_MIN);
            let at = b.as_ptr();
            assert!(s.buffers().give(b).is_none());
            at
        })
        .collect()
}

#[test]
fn a_token_and_an_isochron_marker_are_built_in_the_buffers_handed_in() {
    let mut s = common::siu(Mode::Siu, 0, false);
    let at = hand_in(&mut s, 1);
    assert_eq!(s.buffers().room(), POOL_BUFFERS_MAX - 1);
    // The TM's reset starts logical time: the SIU answers with a token.
    s.handle_net(0, &common::restart_token(1)).unwrap();
    let token = s.poll_net().expect("the SIU's answer");
    assert_eq!(token.route, Route::Tm);
    assert!(matches!(Packet::decode(&token.bytes), Ok(Packet::Token(_))));
    assert_eq!(
        token.bytes.as_ptr(),
        at[0],
        "the token in the buffer handed in"
    );
    // An isochron's marker for the host, likewise.
    let at = hand_in(&mut s, 1);
    common::isochron(&mut s, 1, 7);
    let marker = std::iter::from_fn(|| s.poll_host())
        .find(|b| matches!(Packet::decode(b), Ok(Packet::IsochronMarker(_))))
        .expect("the isochron's marker");
    assert_eq!(marker.as_ptr(), at[0], "the marker in the buffer handed in");
    assert_eq!(s.buffers().room(), POOL_BUFFERS_MAX);
    // A buffer out of bounds is handed back.
    assert!(s.buffers().give(Vec::new()).is_some());
}
