//! The `moescope` command line: parse, validate, dispatch; errors are printed in one line.

mod cli;
mod cmd;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    // before any thread starts: every thread inherits it
    moescope::sysinfo::batch_scheduling();
    match moescope_kernels::prefetch::setting_from_env() {
        Ok(d) => moescope_kernels::prefetch::set_distance(d),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    }
    let res = match &args.command {
        // no command: `chat` with its defaults (the workbench on the built-in demo)
        None => match cli::Cli::parse_from(["moescope", "chat"]).command {
            Some(cli::Command::Chat(a)) => cmd::chat::run(&a),
            _ => unreachable!("`moescope chat` parses as the chat command"),
        },
        Some(cli::Command::Run(a)) => cmd::run::run(a),
        Some(cli::Command::Chat(a)) => cmd::chat::run(a),
        Some(cli::Command::Convert(a)) => cmd::convert::run(a),
        Some(cli::Command::Inspect(a)) => cmd::inspect::run(a),
        Some(cli::Command::Bench(a)) => cmd::bench::run(a),
        Some(cli::Command::Sim(a)) => cmd::sim::run(a),
        Some(cli::Command::Perplexity(a)) => cmd::perplexity::run(a),
        Some(cli::Command::ReadBandwidth { threads, mib }) => {
            // the best of the two ways, then each (`bench --roofline` reads the line)
            let p = moescope::sysinfo::read_bandwidth(*threads, mib << 20, 5);
            println!("{:.3} {:.3} {:.3}", p.best(), p.plain, p.prefetched);
            Ok(())
        }
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
