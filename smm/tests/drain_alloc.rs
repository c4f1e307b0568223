//! The drain path allocates nothing per sref: count heap allocations while a pulse drains.
//!
//! The one place the workspace allows `unsafe`: a global allocator must implement an unsafe
//! trait. It only counts and delegates to the system allocator.
#![allow(unsafe_code)]

use isotach_smm::testkit::{SortKind, pulse, write_message};
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

struct Counting;

thread_local! {
    /// Allocations made by this thread. Per thread, not per process: the test harness's own
    /// threads allocate at any moment (reporting the other test's result, say), and a
    /// process-wide count saw them (a CI run failed on 2 such allocations).
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
}

/// This thread's allocations so far.
fn allocations() -> usize {
    ALLOCATIONS.with(Cell::get)
}

// SAFETY: every call is forwarded unchanged to `System`, which upholds the contract; the
// counter is a const-initialised thread local, which allocates nothing.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // `try_with`: a thread being torn down has no counter left, and is not counted.
        let _ = ALLOCATIONS.try_with(|n| n.set(n.get() + 1));
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_during_drain(srefs: usize, kind: SortKind) -> usize {
    let (mut node, eop) = pulse(srefs, kind);
    let before = allocations();
    node.handle_siu(&eop).unwrap();
    let after = allocations();
    let s = node.stats();
    assert_eq!(s.srefs_executed, srefs as u64);
    after - before
}

#[test]
fn draining_does_not_allocate_per_sref() {
    for kind in [SortKind::Hybrid, SortKind::Software] {
        let small = allocations_during_drain(1_000, kind);
        let large = allocations_during_drain(20_000, kind);
        // A handful of allocations (EOP decode, the order buffer growing to the bucket size),
        // not one per sref: twenty times the srefs may cost at most a few more.
        assert!(
            large <= small + 8,
            "{kind:?}: {small} allocations for 1k, {large} for 20k"
        );
        assert!(large < 64, "{kind:?}: {large} allocations for 20k srefs");
    }
}

/// Allocations while `srefs` messages of pulse 2 go into their bucket, after pulse 1 drained.
fn allocations_bucketing_the_next_pulse(srefs: usize) -> usize {
    let (mut node, eop) = pulse(srefs, SortKind::Hybrid);
    node.handle_siu(&eop).unwrap();
    let encoded: Vec<Vec<u8>> = (0..srefs)
        .map(|i| {
            let mut b = Vec::new();
            write_message(2, 1, 1_000_000 + i as u64, i).encode(&mut b);
            b
        })
        .collect();
    let before = allocations();
    for b in &encoded {
        node.handle_siu(b).unwrap();
    }
    allocations() - before
}

#[test]
fn the_next_pulse_reuses_the_drained_bucket() {
    // The drained bucket already has room for as many packets: no allocation at all.
    assert_eq!(allocations_bucketing_the_next_pulse(1_000), 0);
}

/// Host 0 of four holding page 0, room for `srefs` packets in a bucket.
fn node_for(srefs: usize) -> isotach_smm::SmmNode {
    use isotach_smm::{MemoryMap, SmmConfig, SmmLimits, SmmNode};
    let mut map = MemoryMap::default();
    map.insert(0, 0, vec![0]).unwrap();
    SmmNode::new(SmmConfig {
        host: 0,
        topology: std::sync::Arc::new(isotach_proto::topology::Topology::line(4, 1).unwrap()),
        map: std::sync::Arc::new(map),
        limits: SmmLimits {
            slots_per_page: 1024,
            bucket_packets_max: srefs,
            ..SmmLimits::default()
        },
        record: false,
    })
}

/// Allocations while pulse 1 drains `srefs` reads from hosts 1-3 (each answers its issuer)
/// into a node holding `stocked` spare packet buffers, less those of the same pulse of writes
/// (no answer); and the replies sent.
fn allocations_answering(srefs: usize, stocked: usize) -> (usize, usize) {
    use isotach_proto::Pulse;
    use isotach_proto::packet::{BUFFER_BYTES_MIN, EopMarker, Kind, Sref, SrefOp};
    let count = |op: SrefOp| {
        let mut node = node_for(srefs);
        for _ in 0..stocked {
            let b = Vec::with_capacity(BUFFER_BYTES_MIN);
            assert!(node.buffers().give(b).is_none());
        }
        for i in 0..srefs {
            let mut m = write_message(1, 1 + (i % 3) as u16, i as u64, i);
            if let Sref::Mem { op: o, ref_id, .. } = &mut m.sref {
                *o = op;
                *ref_id = i as u32;
            }
            let mut b = Vec::new();
            m.encode(&mut b);
            node.handle_siu(&b).unwrap();
        }
        let mut eop = Vec::new();
        EopMarker {
            ts: Pulse::new(1),
            count: srefs as u32,
            repeat: true,
            token_kind: Kind::Token as u8,
            ..EopMarker::default()
        }
        .encode(&mut eop);
        let before = allocations();
        node.handle_siu(&eop).unwrap();
        let n = allocations() - before;
        (n, std::iter::from_fn(|| node.poll_siu()).count())
    };
    let (writes, none) = count(SrefOp::Write);
    assert_eq!(none, 0, "writes are not answered");
    let (reads, replies) = count(SrefOp::Read);
    assert_eq!(replies, srefs, "every read answered");
    (reads.saturating_sub(writes), replies)
}

#[test]
fn a_reply_costs_one_allocation_its_packet() {
    let (extra, replies) = allocations_answering(1_000, 0);
    // The packet itself, and a few for the queue of packets for the SIU growing; the reply's
    // payload is encoded in a buffer the node keeps.
    assert!(
        extra <= replies + 16,
        "{extra} allocations more than the same writes for {replies} replies"
    );
}

#[test]
fn a_reply_built_in_a_buffer_the_node_holds_costs_no_allocation() {
    use isotach_proto::packet::POOL_BUFFERS_MAX;
    let (extra, replies) = allocations_answering(POOL_BUFFERS_MAX, POOL_BUFFERS_MAX);
    // At most the queue of packets for the SIU growing: nothing per reply.
    assert!(
        extra <= 8,
        "{extra} allocations more than the same writes for {replies} replies"
    );
}

/// A node of host 0 of four whose pages 1-3 live only at hosts 1-3: every `add` on them is a
/// remote sref. Allocations while it issues `isochrons` isochrons of two remote `add`s, its
/// packets taken by the driver and, with `give_back`, each handed back once the link sent it
/// (as the driver stocks the node from the link's spares).
fn allocations_issuing(isochrons: usize, give_back: bool) -> usize {
    use isotach_proto::packet::Width;
    use isotach_smm::{Addr, SmmLimits, testkit::remote_pages_node};
    let mut node = remote_pages_node(SmmLimits {
        hit_buffer_max: isochrons + 1,
        ..SmmLimits::default()
    });
    let mut sent: Vec<Vec<u8>> = Vec::with_capacity(8);
    let before = allocations();
    for i in 0..isochrons {
        let mut iso = node.isochron();
        iso.add(Addr::new(1, 0), Width::W64, i as u64).unwrap();
        iso.add(Addr::new(2, 0), Width::W64, 1).unwrap();
        iso.end().unwrap();
        sent.extend(std::iter::from_fn(|| node.poll_siu()));
        assert_eq!(sent.len(), 4, "start, two srefs, end");
        for p in sent.drain(..) {
            if give_back {
                assert!(node.buffers().give(p).is_none());
            }
        }
    }
    allocations() - before
}

#[test]
fn issuing_allocates_nothing_per_isochron_once_lists_and_buffers_circulate() {
    // Four times the isochrons cost at most a few more allocations (the hit buffer and the
    // read table growing), not one per isochron: the operation lists are reused and the
    // packets built in buffers given back.
    let few = allocations_issuing(64, true);
    let many = allocations_issuing(256, true);
    assert!(
        many <= few + 16,
        "{few} allocations for 64 isochrons, {many} for 256"
    );
}

#[test]
fn an_isochron_built_in_buffers_the_node_holds_allocates_no_packet() {
    let n = 64;
    let dropped = allocations_issuing(n, false);
    let circulated = allocations_issuing(n, true);
    // Four packets per isochron: each a new buffer when the sent ones are dropped; only the
    // first isochron's when they come back (the buffers of one are the next one's), give or
    // take the pool's own list growing once.
    assert!(
        dropped + 2 >= circulated + 4 * (n - 1),
        "{dropped} allocations dropping the sent packets, {circulated} giving them back"
    );
}
