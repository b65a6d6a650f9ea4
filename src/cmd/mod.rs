//! One module per subcommand.

pub mod bench;
pub mod bench_report;
pub mod convert;
pub mod inspect;
pub mod interrupt;
pub mod model_arg;
pub mod repl;
pub mod run;
pub mod trace_out;
