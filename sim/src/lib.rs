//! The deterministic simulator: one thread, a virtual clock (microseconds), a seeded RNG and
//! an event queue ordered by (time, insertion sequence), driving the token-manager and SIU
//! state machines over a simulated network, with scripted hosts.
//!
//! * [`Sim`] is the driver. Its topology, timing and limits come from the same
//!   [`ClusterConfig`](isotach_proto::config::ClusterConfig) the daemons load.
//! * [`net`] models the datagram network beneath the reliable FIFO links: loss, duplication
//!   and reordering show up as retransmission and head-of-line delays; token corruption and
//!   pauses of TMs and SIUs come on top.
//! * [`Host`] is the pluggable host behaviour; [`Observer`] the god's-eye hook for oracles.
//! * [`PulseOracle`] checks the EOP rule and every sort vector; [`waves`] is the random
//!   isochron workload behind `isotach sim waves`.
//!
//! A run is fully determined by its seed and configuration; [`Sim::trace_hash`] (FNV-1a 64
//! over every delivery: time, node, bytes) proves it.
#![warn(missing_docs)]

mod eras;
pub mod hash;
pub mod host;
pub mod latency;
pub mod linknet;
pub mod net;
pub mod oracle;
pub mod philo;
pub mod rng;
pub mod sc;
mod sim;
mod smm_host;
pub mod unexpected;
pub mod waves;

pub use host::{Host, HostCtx, Observer};
pub use net::{Faults, NetStats, RangeUs};
pub use oracle::{OracleStats, PulseOracle};
pub use rng::SimRng;
pub use sim::{
    NetFaults, NodeId, Pauses, Restarts, RunEnd, Sim, SimConfig, SimError, SimStats, Tamper,
};
pub use unexpected::Unexpected;
