//! UDP backend (placeholder).
