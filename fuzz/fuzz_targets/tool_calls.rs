#![no_main]
// moescope::fuzzing::tool_calls under libFuzzer; seeds: the replay harness's (replay/src/seeds.rs).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    moescope::fuzzing::tool_calls(data);
});
