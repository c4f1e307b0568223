//! The daemon core of both roles.
//!
//! - [`pump`]: [`Pump`], a TM or SIU [`Role`] plus its sans-IO links
//!   ([`isotach_am_proto::link::Links`]) and the policy between them: held input, stalled
//!   output, link events. Time is passed in; the simulator and the threaded runner drive it.
//! - [`tm`] and [`siu`]: the two roles: the state machines plus their daemons' rules
//!   (rejoin after a broken link, when to start logical time, application attachment), and
//!   each node's plan (addresses, peers) from a cluster config.
//! - [`embedded`] (feature `embedded`): the SIU run on an application's own thread.
//! - [`run`] (feature `runtime`): the runner behind `isotach tm` / `isotach siu` (one thread per daemon), with
//!   its [`telemetry`].

#[cfg(feature = "embedded")]
pub mod embedded;
pub mod pump;
#[cfg(feature = "runtime")]
pub mod run;
pub mod siu;
#[cfg(feature = "runtime")]
pub mod telemetry;
pub mod tm;

pub use pump::{Pump, PumpStats, Refusal, Role, Verdict};

/// Why a daemon could not start or stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// The configuration lacks something the daemon needs.
    #[error("config: {0}")]
    Config(String),
    /// The transport failed.
    #[error("transport: {0}")]
    Am(#[from] isotach_am_proto::AmError),
}

impl From<isotach_proto::config::MissingAddr> for DaemonError {
    fn from(e: isotach_proto::config::MissingAddr) -> Self {
        Self::Config(e.to_string())
    }
}
