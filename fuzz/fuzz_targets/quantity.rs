#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| snapdrain::fuzzing::quantity(data));
