//! The `moescope` command line: parse, validate, dispatch; errors are printed in one line.

mod cli;
mod cmd;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let args = cli::Cli::parse_from(llama_flags(std::env::args_os()));
    // before any thread starts: every thread inherits it
    moescope::sysinfo::batch_scheduling();
    // a package truncated while mapped: one line and exit 1, not a bare "Bus error"
    moescope::package::sigbus::install();
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
        Some(cli::Command::Serve(a)) => cmd::serve::run(a),
        Some(cli::Command::Convert(a)) => cmd::convert::run(a),
        Some(cli::Command::Synth(a)) => cmd::synth::run(a),
        Some(cli::Command::Plan(a)) => cmd::plan::run(a),
        Some(cli::Command::Inspect(a)) => cmd::inspect::run(a),
        Some(cli::Command::Bench(a)) => cmd::bench::run(a),
        Some(cli::Command::Sim(a)) => cmd::sim::run(a),
        Some(cli::Command::Perplexity(a)) => cmd::perplexity::run(a),
        Some(cli::Command::ReadBandwidth { threads, mib, serve }) => read_bandwidth(*threads, *mib, *serve),
        Some(cli::Command::ComputePeak { threads, ms }) => cmd::bench::peak::run(threads, *ms),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// The hidden `read-bandwidth` command: one probe at `threads` threads, or with `serve` one per
/// line of standard input (its thread count). Each result is a line "best plain prefetched" in
/// GB/s, which `bench --roofline` reads.
fn read_bandwidth(threads: usize, mib: usize, serve: bool) -> anyhow::Result<()> {
    use std::io::{BufRead, Write};
    let Some(buf) = moescope::sysinfo::ReadBuffer::new(mib << 20) else {
        anyhow::bail!("read-bandwidth: cannot map {mib} MiB");
    };
    let mut out = std::io::stdout().lock();
    let mut one = |t: usize| -> anyhow::Result<()> {
        let p = buf.probe(t, 5);
        writeln!(out, "{:.3} {:.3} {:.3}", p.best(), p.plain, p.prefetched)?;
        out.flush()?;
        Ok(())
    };
    if !serve {
        return one(threads);
    }
    for line in std::io::stdin().lock().lines() {
        let line = line?;
        let t: usize =
            line.trim().parse().map_err(|_| anyhow::anyhow!("read-bandwidth: '{line}' is not a thread count"))?;
        one(t)?;
    }
    Ok(())
}

/// llama.cpp's multi-letter short flags spelled as it spells them (`-ctk q8_0`): clap takes one
/// letter after a single dash, so these become their long names.
fn llama_flags(args: impl Iterator<Item = std::ffi::OsString>) -> impl Iterator<Item = std::ffi::OsString> {
    args.map(|a| match a.to_str() {
        Some("-ctk") => "--cache-type-k".into(),
        Some("-ctv") => "--cache-type-v".into(),
        _ => a,
    })
}
