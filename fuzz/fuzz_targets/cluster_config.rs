//! `ClusterConfig::parse` on arbitrary UTF-8: never panics, errors carry a 1-based line and
//! column, and an accepted config rendered back to canonical TOML parses to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        isotach_proto_fuzz::check_cluster_config(text);
    }
});
