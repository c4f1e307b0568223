//! Active Message transport for Isotach: the Mainwaring–Culler AM API (endpoints, bundles,
//! handler and translation tables, tags, short/medium/bulk/get messages, return-to-sender)
//! with exactly-once delivery, per-peer credits and retransmission, over an in-memory
//! simulator, UDP and QUIC.
//!
//! Layering (sans-IO, like `quinn-proto`):
//! - [`frame`]: the wire format; the decoder validates everything and never panics.
//! - [`Core`]: the protocol state machine; time and datagrams in, datagrams, handler runs,
//!   returned messages and timer deadlines out. No sockets, clocks or randomness.
//! - [`Bundle`]: the API; drives one `Core` over one [`Transport`].
//! - [`port`]: reliable per-peer FIFO packet links with a hello handshake, for the daemons;
//!   [`telemetry`]: their latency histograms and rate meters.
//! - [`backend`]: transports: [`backend::mem`] (deterministic, virtual time, fault model),
//!   [`backend::udp`] (tokio + socket2 + batched receive), [`backend::quic`] (quinn, TLS
//!   from a cluster CA).
//!
//! See `docs/am.md` for the semantics and the frame format byte by byte.

pub mod backend;
mod bundle;
mod drive;
pub mod port;
pub mod rng;
pub mod sim;
mod transport;

pub use crate::bundle::Bundle;
pub use crate::transport::Transport;
pub use isotach_am_proto::*;
