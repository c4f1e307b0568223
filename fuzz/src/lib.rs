//! Checks shared by the fuzz targets in `fuzz_targets/`.
//!
//! * [`check_decoder`] / [`check_packet`] (`decoders`): a decoder never panics, its errors agree with the
//!   input, and whatever it accepts re-encodes to exactly the input bytes. Each input is tried
//!   twice: as given (so the CRC check itself is fuzzed) and with its last four bytes replaced
//!   by the correct CRC (so the fuzzer reaches the field checks behind the CRC).
//! * [`check_cluster_config`] (`config`): `ClusterConfig::parse` never panics; an accepted config,
//!   rendered back to canonical TOML, parses to the same value.
//! * [`run_siu`] / [`run_tm`] (`siu`, `tm`; what they share in `machines`): the sans-IO state
//!   machines fed an arbitrary interleaving of raw bytes, well-formed packets built from fuzz
//!   bytes, timer ticks and output drains; they never panic and every packet they emit
//!   decodes.
//! * [`check_link_batch`] / [`run_links`] (`links`): the link layer's batch decoder, and the
//!   link core fed datagrams from a raw peer.
//! * [`check_am_datagram`] (`am_datagram`): the AM datagram decoder (one frame or several back
//!   to back).
//!
//! The scripts the harnesses read are walked with an [`Input`] cursor. Each module imports
//! what it needs through `use super::*` from the list below.
//!
//! A failing input is replayed with `cargo fuzz run <target> <file>`; inputs that found bugs
//! are kept in `fuzz/regressions/`.

use isotach_proto::config::{
    CHANNELS_MIN, ClusterConfig, EPOCH_PULSES_MIN, ISOCHRON_MESSAGES_MAX_MIN,
    ISOCHRON_OPEN_US_MAX_MIN, Limits, PULSES_AHEAD_MAX_MIN, QUEUE_PACKETS_MAX_MIN,
    TOKEN_TIMEOUT_US_MIN, Timing, TransportKind, check_bounds,
};
use isotach_proto::packet::{
    self, BarrierSignalMarker, DecodeError, EndOfIsochron, EopMarker, IsochronMarker,
    IsotachMessage, Kind, Packet, PlainMessage, RmwOp, RmwSref, Sref, SrefOp, StartOfIsochron,
    Token, Width,
};
use isotach_proto::topology::{Hop, SwitchId, Topology};
use isotach_proto::{Generation, Pulse, WaveSeq};
use isotach_siu::{Mode, Route, Side, Siu, SiuConfig};
use isotach_tm::{TmConfig, TokenManager};
use std::sync::Arc;

mod am_datagram;
mod config;
mod decoders;
mod input;
mod links;
mod machines;
mod siu;
mod tm;
pub use am_datagram::{check_am_datagram, with_frame_crcs};
pub use config::*;
pub use decoders::*;
pub use input::*;
pub use links::*;
use machines::*;
pub use siu::*;
pub use tm::*;
