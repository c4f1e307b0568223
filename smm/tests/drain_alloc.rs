//! The drain path allocates nothing per sref: count heap allocations while a pulse drains.
//!
//! The one place the workspace allows `unsafe`: a global allocator must implement an unsafe
//! trait. It only counts and delegates to the system allocator.
#![allow(unsafe_code)]

use isotach_smm::testkit::{SortKind, pulse};
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`, which upholds the contract.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
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
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    node.handle_siu(&eop).unwrap();
    let after = ALLOCATIONS.load(Ordering::Relaxed);
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
