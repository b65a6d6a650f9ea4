//! moescope: run Mixture-of-Experts language models bigger than RAM, and watch how.
//!
//! The library holds the engine; the `moescope` binary (src/main.rs, src/cmd/) is a thin
//! command-line layer over it. ARCHITECTURE.md at the top of the repository is the code map.

pub mod aligned_buf;
pub mod bounded_read;
pub mod cache_dir;
pub mod contained;
pub mod convert;
pub mod demo;
pub mod derived_fixture;
pub mod derived_gguf;
pub mod engine;
pub mod exec;
pub mod experts;
pub mod forecast;
pub mod fuzzing;
pub mod model;
pub mod model_config;
pub mod npy;
pub mod out_file;
pub mod package;
pub mod packed;
pub mod rng;
pub mod serve;
pub mod synth;
pub mod sysinfo;
pub mod trace;
pub mod tui;
