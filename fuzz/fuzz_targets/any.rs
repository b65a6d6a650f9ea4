#![no_main]
// Every target of moescope::fuzzing in one binary, chosen by MOESCOPE_FUZZ_TARGET (gguf, package,
// checkpoint, chat_template, request): one ~15 MB build to carry to a many-core machine instead
// of five (tests/reference/fuzz_device.sh runs them side by side there).
use std::sync::OnceLock;

static TARGET: OnceLock<moescope::fuzzing::Target> = OnceLock::new();

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    let run = TARGET.get_or_init(|| {
        let name = std::env::var("MOESCOPE_FUZZ_TARGET").unwrap_or_default();
        moescope::fuzzing::target(&name).unwrap_or_else(|| panic!("MOESCOPE_FUZZ_TARGET: no target '{name}'"))
    });
    run(data);
});
