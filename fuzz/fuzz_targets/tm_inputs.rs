//! A token manager fed an arbitrary sequence of link and timer inputs split from the fuzz
//! input: it never panics and everything it emits decodes. See `isotach_proto_fuzz::run_tm`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    isotach_proto_fuzz::run_tm(data);
});
