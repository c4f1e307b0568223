//! An SIU fed an arbitrary sequence of host, network and timer inputs split from the fuzz
//! input: it never panics and everything it emits decodes. See `isotach_proto_fuzz::run_siu`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    isotach_proto_fuzz::run_siu(data);
});
