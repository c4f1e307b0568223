//! The link layer's batch decoder on arbitrary payloads, and a link core (`Links`) fed a
//! scripted session of arbitrary data, batch, credit and hello messages, raw datagrams, sends
//! and receives. See `isotach_proto_fuzz::check_link_batch` and `run_links`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    isotach_proto_fuzz::check_link_batch(data);
    isotach_proto_fuzz::run_links(data);
});
