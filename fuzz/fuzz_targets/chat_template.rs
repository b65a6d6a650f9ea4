#![no_main]
// moescope::fuzzing::chat_template under libFuzzer; seeds: fuzz/corpus/chat_template (see replay/ for the built-in ones).
libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    moescope::fuzzing::chat_template(data);
});
