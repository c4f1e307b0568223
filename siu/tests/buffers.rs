//! Every packet an SIU builds or forwards leaves in a buffer of at least
//! `PACKET_BUF_BYTES_MIN`: the links keep a sent packet's buffer for the next packet that
//! arrives only when it is that large, so buffers go round instead of being allocated and
//! freed per packet (issue 12: no allocation per packet on the hot path).

mod common;

use common::{isochron, restart_token, tm_token};
use isotach_proto::packet::{Kind, PACKET_BUF_BYTES_MIN, peek_kind};
use isotach_siu::{Mode, Siu};

/// Kinds and capacities of everything the SIU queued for the network and the host.
fn drained(s: &mut Siu) -> Vec<(Kind, usize)> {
    let mut bufs: Vec<Vec<u8>> = std::iter::from_fn(|| s.poll_net())
        .map(|t| t.bytes)
        .collect();
    bufs.extend(std::iter::from_fn(|| s.poll_host()));
    bufs.into_iter()
        .map(|b| (peek_kind(&b).expect("a packet"), b.capacity()))
        .collect()
}

#[test]
fn tokens_messages_markers_and_eops_leave_in_buffers_the_links_keep() {
    let mut s: Siu = common::siu(Mode::Siu, 0, false);
    let mut out = Vec::new();
    s.handle_net(0, &restart_token(1)).unwrap();
    s.handle_net(1, &tm_token(1)).unwrap();
    out.extend(drained(&mut s));
    // An isochron handed over borrowed (a copy is made) and run to the end of its pulse.
    isochron(&mut s, 2, 7);
    out.extend(drained(&mut s));
    for (now, wave) in (3..).zip(2..=4) {
        s.handle_net(now, &tm_token(wave)).unwrap();
        out.extend(drained(&mut s));
    }
    for kind in [
        Kind::Token,
        Kind::IsotachMessage,
        Kind::IsochronMarker,
        Kind::EopMarker,
    ] {
        assert!(
            out.iter().any(|&(k, _)| k == kind),
            "no {kind:?} in {out:?}"
        );
    }
    let small: Vec<_> = out
        .iter()
        .filter(|&&(_, cap)| cap < PACKET_BUF_BYTES_MIN)
        .collect();
    assert!(small.is_empty(), "freed after sending, not kept: {small:?}");
}
