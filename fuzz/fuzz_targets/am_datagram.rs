//! The AM datagram decoder on arbitrary bytes: one frame or several back to back. See
//! `isotach_proto_fuzz::check_am_datagram`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    isotach_proto_fuzz::check_am_datagram(data);
});
