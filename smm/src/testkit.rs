//! Fixtures for benchmarks and tests: one pulse's worth of packets for a node, and a minimal
//! executor for the async API.

use crate::{MemoryMap, SmmConfig, SmmLimits, SmmNode};
use isotach_proto::Generation;
use isotach_proto::Pulse;
use isotach_proto::packet::{
    EopMarker, IsotachMessage, Kind, SORT_VECTOR_MAX, Sref, SrefOp, Width,
};
use isotach_proto::topology::Topology;
use std::future::Future;
use std::sync::Arc;

/// How the EOP asks the node to order the pulse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SortKind {
    /// A sort vector covering the bucket (at most 32 packets).
    Vector,
    /// A full sort vector for the first 32 arrivals, software for the rest.
    Hybrid,
    /// A repeat EOP: everything sorted in software.
    Software,
}

/// A write of value `i` to slot `i % 1024` of page 0 on host 0, from `source`, in pulse `ts`
/// of generation 1.
pub fn write_message(ts: u64, source: u16, sequum: u64, i: usize) -> IsotachMessage {
    IsotachMessage {
        ts: Pulse::new(ts),
        source,
        dest: 0,
        sequum,
        generation: Generation::new(1),
        sref: Sref::Mem {
            op: SrefOp::Write,
            width: Width::W64,
            addr: (i % 1024) as u64,
            value: i as u64,
            ref_id: 0,
        },
    }
}

/// Host 0 of a 4-host single-switch cluster holding page 0, with `srefs` write messages from
/// hosts 1-3 for pulse 1 already bucketed (arriving interleaved), and the EOP that drains them.
pub fn pulse(srefs: usize, kind: SortKind) -> (SmmNode, Vec<u8>) {
    let topology = Arc::new(Topology::line(4, 1).expect("static topology"));
    let mut map = MemoryMap::default();
    map.insert(0, 0, vec![0]).expect("static map");
    let mut node = SmmNode::new(SmmConfig {
        host: 0,
        topology,
        map: Arc::new(map),
        limits: SmmLimits {
            slots_per_page: 1024,
            bucket_packets_max: srefs.max(1),
            ..SmmLimits::default()
        },
        record: false,
    });
    let mut arrivals = Vec::with_capacity(srefs);
    let mut buf = Vec::with_capacity(64);
    for i in 0..srefs {
        // Round-robin over sources 3, 2, 1 so arrival order differs from sorted order.
        let source = 3 - (i % 3) as u16;
        let sequum = (i / 3) as u64;
        let m = write_message(1, source, sequum, i);
        buf.clear();
        m.encode(&mut buf);
        node.handle_siu(&buf).expect("fixture message");
        arrivals.push((source, sequum));
    }
    let covered = srefs.min(SORT_VECTOR_MAX);
    let mut vector: Vec<u8> = (0..covered as u8).collect();
    vector.sort_by_key(|&i| arrivals[usize::from(i)]);
    let eop = EopMarker {
        ts: Pulse::new(1),
        count: srefs as u32,
        repeat: kind == SortKind::Software,
        token_kind: Kind::Token as u8,
        sort_vector: if kind == SortKind::Software {
            Vec::new()
        } else {
            vector
        },
        ..EopMarker::default()
    };
    let mut out = Vec::new();
    eop.encode(&mut out);
    (node, out)
}

/// Host 0 of a 4-host single-switch cluster where page `p` lives only at host `p` (so every
/// sref on pages 1-3 is remote), with `limits`.
pub fn remote_pages_node(limits: SmmLimits) -> SmmNode {
    let mut map = MemoryMap::default();
    for page in 0..4 {
        map.insert(page, page, vec![page as u16])
            .expect("static map");
    }
    SmmNode::new(SmmConfig {
        host: 0,
        topology: Arc::new(Topology::line(4, 1).expect("static topology")),
        map: Arc::new(map),
        limits,
        record: false,
    })
}

/// A minimal executor: runs one future to completion on this thread (the async API of
/// [`crate::SharedSmm`] needs no particular runtime).
pub fn block_on<F: Future>(f: F) -> F::Output {
    use std::task::{Context, Poll, Wake, Waker};
    struct Unpark(std::thread::Thread);
    impl Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park_timeout(std::time::Duration::from_millis(10));
    }
}
