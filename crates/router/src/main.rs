//! `sgl-router`: the binary. Parses the command line, runs the chosen tool,
//! and turns every failure into one line on stderr and a non-zero exit.

use std::process::ExitCode;

use clap::Parser;

mod cli;
mod defaults;
mod discovery;
mod fdlimit;
mod logfile;
mod pd;
mod routing;
mod serve;
mod tools;
mod usage;

/// The allocator: see `Cargo.toml` (glibc's malloc cost a fifth of the router's CPU under load).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit status for a command-line usage error (BSD `EX_USAGE`).
const EXIT_USAGE: u8 = 64;
/// Exit status for bad input data (BSD `EX_DATAERR`).
const EXIT_DATA: u8 = 65;

fn main() -> ExitCode {
    let cli = match cli::Cli::try_parse() {
        Ok(cli) => cli,
        Err(err) => {
            let code = if err.use_stderr() { EXIT_USAGE } else { 0 };
            let _ = err.print();
            return ExitCode::from(code);
        }
    };
    let result = match cli.command {
        Some(cli::Command::Hash(args)) => tools::hash(&args),
        Some(cli::Command::Render(args)) => tools::render(&args),
        Some(cli::Command::KvEvents(args)) => tools::kv_events(&args),
        Some(cli::Command::CheckConfig(args)) => routing::check_config(&args.file),
        None => match serve::config(&cli.serve) {
            Ok(config) => serve::serve(config, &cli.serve),
            Err(usage) => {
                eprintln!("sgl-router: {usage}");
                return ExitCode::from(EXIT_USAGE);
            }
        },
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // One line: the error and its causes, never a panic trace.
            eprintln!("sgl-router: {}", format!("{err:#}").replace('\n', " "));
            ExitCode::from(EXIT_DATA)
        }
    }
}
