//! `IsochronMarker::decode` on arbitrary bytes (and on the same bytes with a repaired CRC): never
//! panics, every error is consistent with the input, and whatever decodes re-encodes to exactly
//! the input bytes. See `isotach_proto_fuzz::check_decoder`.
#![no_main]

use isotach_proto::packet::IsochronMarker;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    isotach_proto_fuzz::check_decoder::<IsochronMarker>(data);
});
