//! `Packet::decode` on arbitrary bytes (and with a repaired CRC): never panics, agrees with the
//! kind's own decoder, and whatever decodes re-encodes to exactly the input bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    isotach_proto_fuzz::check_packet(data);
});
