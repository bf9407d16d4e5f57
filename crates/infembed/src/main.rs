//! The `infembed` command line (one module per command under `cli/`).

use std::process::ExitCode;

use clap::Parser;

mod cli;

fn main() -> ExitCode {
    cli::logger::install();
    match cli::run(cli::Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", cli::one_line(&e));
            ExitCode::FAILURE
        }
    }
}
