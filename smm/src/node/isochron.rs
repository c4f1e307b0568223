//! What an application may put in an isochron: every operation is checked as it is added
//! (address mapped, value fits its width, payload fits, table limits), so [`Isochron::end`]
//! only has to issue it. Dropping an isochron without `end` abandons it and frees its reads.

use super::SmmNode;
use crate::map::Addr;
use crate::{ReadHandle, SmmError, Table};
use isotach_proto::packet::{MSG_PAYLOAD_MAX, RmwOp, RmwSref, Width};
use isotach_proto::topology::HostId;

/// An operation as the application asked for it.
#[derive(Debug, Clone)]
pub(super) enum Planned {
    Read(Addr, Width, u32),
    Write(Addr, Width, u64),
    Sched(Addr),
    Assign(Addr, Width, u64),
    Message(HostId, u16, Vec<u8>),
    /// A read-modify-write; its `ref_id` is the read id, its `answer` is decided per copy at
    /// issue.
    Rmw(RmwSref),
}

/// An isochron being built. Operations are checked as they are added; [`Isochron::end`]
/// issues it. Dropping it without `end` abandons it.
#[derive(Debug)]
pub struct Isochron<'a> {
    node: &'a mut SmmNode,
    ops: Vec<Planned>,
    ended: bool,
}

impl SmmNode {
    /// Starts an isochron.
    pub fn isochron(&mut self) -> Isochron<'_> {
        // The last isochron's list, empty: no allocation once it has grown.
        let ops = std::mem::take(&mut self.spare_ops);
        debug_assert!(ops.is_empty());
        Isochron {
            node: self,
            ops,
            ended: false,
        }
    }

    /// `addr` is a mapped variable.
    fn check_addr(&self, addr: Addr) -> Result<(), SmmError> {
        if addr.slot() >= self.cfg.limits.slots_per_page || !self.map.is_mapped(addr.page()) {
            return Err(SmmError::Unmapped(addr));
        }
        Ok(())
    }
}

impl Isochron<'_> {
    fn push(&mut self, op: Planned) -> Result<(), SmmError> {
        if self.ops.len() >= self.node.cfg.limits.isochron_ops_max {
            return Err(SmmError::Limit(Table::IsochronOps));
        }
        self.ops.push(op);
        Ok(())
    }

    fn check_value(width: Width, value: u64) -> Result<(), SmmError> {
        if value > width.max_value() {
            return Err(SmmError::ValueTooWide {
                value,
                bits: u8::BITS * width as u32,
            });
        }
        Ok(())
    }

    /// Reads `addr` from the nearest copy; the handle resolves when the isochron executes.
    pub fn read(&mut self, addr: Addr, width: Width) -> Result<ReadHandle, SmmError> {
        self.node.check_addr(addr)?;
        if self.ops.len() >= self.node.cfg.limits.isochron_ops_max {
            return Err(SmmError::Limit(Table::IsochronOps));
        }
        let id = self.node.new_read()?;
        self.ops.push(Planned::Read(addr, width, id));
        Ok(ReadHandle(id))
    }

    /// Writes `value` to every copy of `addr`.
    pub fn write(&mut self, addr: Addr, width: Width, value: u64) -> Result<(), SmmError> {
        self.node.check_addr(addr)?;
        Self::check_value(width, value)?;
        self.push(Planned::Write(addr, width, value))
    }

    /// Makes `addr` unsubstantiated at this isochron's place in the order, until this host's
    /// `assign`.
    pub fn sched(&mut self, addr: Addr) -> Result<(), SmmError> {
        self.node.check_addr(addr)?;
        self.push(Planned::Sched(addr))
    }

    /// Substantiates this host's oldest unassigned sched of `addr` with `value`.
    pub fn assign(&mut self, addr: Addr, width: Width, value: u64) -> Result<(), SmmError> {
        self.node.check_addr(addr)?;
        Self::check_value(width, value)?;
        self.push(Planned::Assign(addr, width, value))
    }

    /// Adds `delta` to `addr` (wrapping at `width`) at every copy, at this isochron's place;
    /// the handle resolves to the value it found.
    pub fn add(&mut self, addr: Addr, width: Width, delta: u64) -> Result<ReadHandle, SmmError> {
        self.rmw(addr, RmwOp::Add, width, delta, 0)
    }

    /// Sets `addr` to `new` if it holds `expected`, at every copy, at this isochron's place;
    /// the handle resolves to the value it found (equal to `expected` when it swapped).
    pub fn compare_and_swap(
        &mut self,
        addr: Addr,
        width: Width,
        expected: u64,
        new: u64,
    ) -> Result<ReadHandle, SmmError> {
        self.rmw(addr, RmwOp::CompareAndSwap, width, expected, new)
    }

    /// Replaces `addr`'s value by registered function `func` of (value, `arg`) at every copy,
    /// at this isochron's place ([`SmmNode::register_rmw`]); the handle resolves to the value
    /// it found.
    pub fn apply(
        &mut self,
        addr: Addr,
        width: Width,
        func: u16,
        arg: u64,
    ) -> Result<ReadHandle, SmmError> {
        if !self.node.memory.functions().knows(func) {
            return Err(SmmError::UnknownRmwFunction(func));
        }
        self.rmw(addr, RmwOp::Apply(func), width, arg, 0)
    }

    fn rmw(
        &mut self,
        addr: Addr,
        op: RmwOp,
        width: Width,
        arg: u64,
        arg2: u64,
    ) -> Result<ReadHandle, SmmError> {
        self.node.check_addr(addr)?;
        Self::check_value(width, arg)?;
        Self::check_value(width, arg2)?;
        if self.ops.len() >= self.node.cfg.limits.isochron_ops_max {
            return Err(SmmError::Limit(Table::IsochronOps));
        }
        let id = self.node.new_read()?;
        self.ops.push(Planned::Rmw(RmwSref {
            op,
            width,
            addr: addr.raw(),
            arg,
            arg2,
            ref_id: id,
            answer: false,
        }));
        Ok(ReadHandle(id))
    }

    /// Runs handler `handler` on host `node` with `payload`, at this isochron's place.
    pub fn message(&mut self, node: HostId, handler: u16, payload: &[u8]) -> Result<(), SmmError> {
        if usize::from(node) >= self.node.cfg.topology.host_count() {
            return Err(SmmError::NoSuchHost(node));
        }
        if payload.len() > MSG_PAYLOAD_MAX {
            return Err(SmmError::MessageTooLong {
                len: payload.len(),
                max: MSG_PAYLOAD_MAX,
            });
        }
        self.push(Planned::Message(node, handler, payload.to_vec()))
    }

    /// Issues the isochron. On error nothing was issued and its reads are released.
    pub fn end(mut self) -> Result<(), SmmError> {
        if self.ops.is_empty() {
            return Err(SmmError::EmptyIsochron);
        }
        let r = self.node.issue(&self.ops);
        if r.is_err() {
            self.release_reads();
        }
        self.ended = true;
        r
    }

    /// Releases the isochron's reads (it was not issued).
    fn release_reads(&mut self) {
        let reads: Vec<u32> = read_ids(&self.ops).collect();
        self.release(&reads);
    }

    fn release(&mut self, reads: &[u32]) {
        for id in reads {
            self.node.reads.remove(id);
        }
        self.node.stats.reads_outstanding = self.node.reads.len() as u64;
    }
}

fn read_ids(ops: &[Planned]) -> impl Iterator<Item = u32> + '_ {
    ops.iter().filter_map(|op| match op {
        Planned::Read(_, _, id) | Planned::Rmw(RmwSref { ref_id: id, .. }) => Some(*id),
        _ => None,
    })
}

impl Drop for Isochron<'_> {
    fn drop(&mut self) {
        if !self.ended {
            self.release_reads();
        }
        // The list goes back to the node for the next isochron.
        let mut ops = std::mem::take(&mut self.ops);
        ops.clear();
        self.node.spare_ops = ops;
    }
}
