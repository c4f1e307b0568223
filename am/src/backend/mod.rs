//! Transport backends: drivers around the sans-IO core.

pub mod chan;
pub mod mem;
pub mod quic;
pub mod udp;
