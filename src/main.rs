//! The `moescope` command line: parse, validate, dispatch; errors are printed in one line.

mod cli;
mod cmd;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    let res = match &args.command {
        // no command: `run` with its defaults (the chat REPL on the built-in demo)
        None => match cli::Cli::parse_from(["moescope", "run"]).command {
            Some(cli::Command::Run(a)) => cmd::run::run(&a),
            _ => unreachable!("`moescope run` parses as the run command"),
        },
        Some(cli::Command::Run(a)) => cmd::run::run(a),
        Some(cli::Command::Convert(a)) => cmd::convert::run(a),
        Some(cli::Command::Inspect(a)) => cmd::inspect::run(a),
        Some(cli::Command::Bench(a)) => cmd::bench::run(a),
        Some(cli::Command::Sim(a)) => cmd::sim::run(a),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
