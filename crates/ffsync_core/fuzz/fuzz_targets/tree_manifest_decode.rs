#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    ffsync_core::fuzzing::tree_manifest_decode(data);
});
