#![no_main]
// moescope::fuzzing::request under libFuzzer; seeds: fuzz/corpus/request (see replay/ for the built-in ones).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    moescope::fuzzing::request(data);
});
