//! The Active Message protocol of Isotach, sans-IO (the `quinn-proto` of `isotach-am`): no
//! sockets, clocks, runtime or TLS in this crate or its dependencies.
//!
//! - [`frame`]: the wire format; the decoder validates everything and never panics.
//! - [`Core`]: the AM state machine of one node: time and datagrams in; datagrams, handler
//!   runs, returned messages and timer deadlines out.
//! - [`link`]: the daemons' packet links on top of a [`Core`]: hello, fragmentation,
//!   credit window, back-pressure, peer loss and rejoin, as a state machine.
//!
//! `isotach-am` drives these over memory, UDP and QUIC. See `docs/am.md` for the AM semantics
//! and frame format and `docs/wire.md`, "Link layer", for the links.

mod core;
mod error;
pub mod frame;
pub mod link;
mod msg;
mod types;

pub use crate::core::{Config, Core, Dispatch, SendReq, Stats};
pub use crate::error::AmError;
pub use crate::msg::{Reply, Request, Returned};
pub use crate::types::*;
