//! A host without an application: the SIU answers reads and copy requests for it.

use isotach_proto::Generation;
use isotach_proto::Pulse;
use isotach_proto::config::{Limits, Timing};
use isotach_proto::packet::{IsotachMessage, PlainMessage, Sref, SrefOp, Width};
use isotach_proto::reply::HostReply;
use isotach_proto::topology::Topology;
use isotach_siu::{Mode, Route, Siu, SiuConfig};
use std::sync::Arc;

fn siu() -> Siu {
    Siu::new(SiuConfig {
        host: 1,
        mode: Mode::Siu,
        topology: Arc::new(Topology::line(3, 1).unwrap()),
        timing: Timing::default(),
        limits: Limits::default(),
        initiates_reset: false,
        host_turns: false,
    })
}

fn message(op: SrefOp, ref_id: u32) -> Vec<u8> {
    let m = IsotachMessage {
        ts: Pulse::new(9),
        source: 2,
        dest: 1,
        sequum: 4,
        generation: Generation::new(1),
        sref: Sref::Mem {
            op,
            width: Width::W64,
            addr: 5 << 32 | 3,
            value: 0,
            ref_id,
        },
    };
    let mut b = Vec::new();
    m.encode(&mut b);
    b
}

fn answer(s: &mut Siu) -> Option<(Route, Vec<u8>)> {
    let t = s.poll_net()?;
    let p = PlainMessage::decode(&t.bytes).unwrap();
    assert_eq!((p.source, p.dest), (1, 2));
    Some((t.route, p.payload))
}

#[test]
fn reads_and_copy_requests_are_refused_as_absent_and_everything_is_counted() {
    let mut s = siu();
    s.host_absent(&message(SrefOp::Read, 77)).unwrap();
    let (route, payload) = answer(&mut s).unwrap();
    assert_eq!(route, Route::Host(2));
    assert_eq!(
        HostReply::decode(&payload),
        Ok(HostReply::ReadRefused {
            ref_id: 77,
            absent: true
        })
    );
    s.host_absent(&message(SrefOp::Copy, 3)).unwrap();
    let (_, payload) = answer(&mut s).unwrap();
    assert_eq!(
        HostReply::decode(&payload),
        Ok(HostReply::CopyRefused {
            page: 5,
            join_id: 3,
            absent: true
        })
    );
    // A write needs no answer; junk is only counted.
    s.host_absent(&message(SrefOp::Write, 0)).unwrap();
    s.host_absent(b"junk").unwrap();
    assert!(answer(&mut s).is_none());
    assert_eq!(s.stats().absent_dropped, 4);
    assert_eq!(s.stats().absent_replies, 2);
}
