//! `HostReply::decode` and `ImageEntry::decode_all` (read replies, refusals and page images
//! between SMM nodes) on arbitrary bytes. See `isotach_proto_fuzz::check_host_reply`.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    isotach_proto_fuzz::check_host_reply(data);
});
