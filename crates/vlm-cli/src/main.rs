//! `vlm`: the command-line front end of the runtime. Subcommands: `chat`, `check`, `bench`,
//! `detect`, `generate`, `make-sim-package`, `probe`. Results go to stdout; logs go to stderr through
//! `tracing` (filter from `RUST_LOG`, default `warn`).
#![forbid(unsafe_code)]

mod cli;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    match cli::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
