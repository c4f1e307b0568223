//! What determines a run: the seed, the cluster, and what goes on beneath the hosts (the
//! network's faults, pauses and crashes of TMs and SIUs, host turns).

use crate::net::{Faults, RangeUs};
use isotach_proto::config::ClusterConfig;

/// Every `every_us` (up to `count` times), one TM or SIU chosen at random crashes: it is gone
/// (datagrams to it are lost) for a while, then a fresh process with a new incarnation takes
/// its place, as `docs/operations.md` ("Peer loss and restarts") describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Restarts {
    /// Time between two crashes.
    pub every_us: u64,
    /// Most crashes in a run.
    pub count: u32,
    /// How long a crashed node stays down.
    pub down_us: RangeUs,
}

/// Every `every_us`, one TM or SIU chosen at random stops for a while: its inputs wait until it
/// resumes and its timers do not fire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pauses {
    /// Time between two pauses.
    pub every_us: u64,
    /// How long a pause lasts.
    pub duration_us: RangeUs,
}

/// Deliberate damage to the SIU→host stream, used only by tests to prove the oracles can fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Tamper {
    /// No damage.
    #[default]
    None,
    /// Hold one host-bound isotach message back until after the EOP marker of its pulse.
    HoldBackMessage,
    /// Swap the first and last entries of one sort vector (of at least 3 entries).
    SwapSortVector,
    /// Every waves host declares one isochron's distance one short of its farthest
    /// destination, as a broken application could: the SIU refuses the message that is too far, an
    /// unexpected error the report must name (the SIU→host stream is left alone).
    ShortDistance,
}

/// What goes on beneath the hosts: the network, pauses and crashes of TMs and SIUs, and
/// whether the SIUs wait for their hosts' turns.
/// Every workload takes the same set and hands it to [`SimConfig`] as it is, so it is one
/// struct rather than three fields repeated in each workload's options.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NetFaults {
    /// The network beneath the links.
    pub faults: Faults,
    /// Pauses of TMs and SIUs (none when `None`).
    pub pauses: Option<Pauses>,
    /// Crashes and restarts of TMs and SIUs (none when `None`).
    pub restarts: Option<Restarts>,
    /// The hosts answer in their *turn* (`docs/design.md`, "Host turns"): an SIU's token
    /// after a significant pulse waits until its host had that pulse's packets and its
    /// answer came back over the host link, as an SIU embedded in the application waits
    /// for the application's next pass.
    pub host_turns: bool,
}

/// Everything that determines a run.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The seed every random choice derives from.
    pub seed: u64,
    /// Topology, timing and limits: the same type the daemons load.
    pub cluster: ClusterConfig,
    /// The network, pauses and crashes.
    pub net: NetFaults,
    /// Test-only damage.
    pub tamper: Tamper,
}

impl SimConfig {
    /// A run of `seed` on `cluster` under `net`, with no test damage.
    pub fn new(seed: u64, cluster: ClusterConfig, net: NetFaults) -> Self {
        Self {
            seed,
            cluster,
            net,
            tamper: Tamper::None,
        }
    }
}
