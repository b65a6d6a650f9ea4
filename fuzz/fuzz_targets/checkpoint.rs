#![no_main]
// moescope::fuzzing::checkpoint under libFuzzer; seeds: fuzz/corpus/checkpoint (see replay/ for the built-in ones).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    moescope::fuzzing::checkpoint(data);
});
