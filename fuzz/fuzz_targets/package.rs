#![no_main]
// moescope::fuzzing::package under libFuzzer; seeds: fuzz/corpus/package (see replay/ for the built-in ones).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    moescope::fuzzing::package(data);
});
