#![no_main]
// moescope::fuzzing::routing_trace under libFuzzer; seeds: fuzz/corpus/routing_trace (see replay/ for the built-in ones).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    moescope::fuzzing::routing_trace(data);
});
