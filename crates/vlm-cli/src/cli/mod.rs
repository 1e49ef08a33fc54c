//! Argument structure of the `vlm` binary (clap derive), one module per subcommand.

mod bench;
mod bpu_flags;
mod chat;
mod check;
mod detect;
mod generate;
mod make_sim_package;
mod probe;
mod report;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "vlm",
    version,
    about = "Qwen3.5 VLM runtime: BPU packages or HF weights on the CPU"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Chat with a package or an HF checkpoint: one turn (--prompt) or a REPL on stdin.
    Chat(chat::ChatArgs),
    /// Check a package against the contract: its graphs, their I/O, every violation.
    Check(check::CheckArgs),
    /// Load time, text and image TTFT, decode tok/s (medians over repeats); host overhead.
    Bench(bench::BenchArgs),
    /// Where is it: the objects a query names, in pixels of the image (boxes or points),
    /// optionally drawn onto it.
    Detect(detect::DetectArgs),
    /// Greedy generation from token ids (and images for the image slots of the prompt).
    Generate(generate::GenerateArgs),
    /// Turn an HF Qwen3.5 checkpoint into a package whose graphs run on the BPU simulator.
    MakeSimPackage(make_sim_package::MakeSimPackageArgs),
    /// Step by step, each step on disk before it runs: libraries, symbols, each .hbm, the
    /// graphs' I/O, a whole and a range flush, one decode, prefill and tower call.
    Probe(probe::ProbeArgs),
}

pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Chat(args) => chat::run(&args),
        Command::Check(args) => check::run(&args),
        Command::Bench(args) => bench::run(&args),
        Command::Detect(args) => detect::run(&args),
        Command::Generate(args) => generate::run(&args),
        Command::MakeSimPackage(args) => make_sim_package::run(&args),
        Command::Probe(args) => probe::run(&args),
    }
}
