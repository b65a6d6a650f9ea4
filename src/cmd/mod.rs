//! One module per subcommand.

pub mod bench;
pub mod bench_probes;
pub mod bench_report;
pub mod chat;
pub mod convert;
pub mod experts_report;
pub mod inspect;
pub mod interrupt;
pub mod model_arg;
pub mod perplexity;
pub mod plan;
pub mod repl;
pub mod run;
pub mod serve;
pub mod sim;
pub mod synth;
pub mod trace_out;
