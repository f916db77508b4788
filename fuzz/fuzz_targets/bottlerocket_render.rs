#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| snapdrain::fuzzing::bottlerocket_render(data));
