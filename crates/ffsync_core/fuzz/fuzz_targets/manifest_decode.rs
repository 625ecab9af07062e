#![no_main]
// Any bytes: decode must not panic; a success must round-trip exactly.
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ffsync_core::fuzzing::manifest_decode(data);
});
