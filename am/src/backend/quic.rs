//! QUIC backend (placeholder).
