#![no_main]
// moescope::fuzzing::gguf under libFuzzer; seeds: fuzz/corpus/gguf (see replay/ for the built-in ones).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    moescope::fuzzing::gguf(data);
});
