//! `cargo xtask bench | report | compare-backends`: the benchmark runner, its HTML report and the
//! backend ranking (the work is in `ipfs-accelerate-bench`, shared with the CLI's `bench`).

use std::process::ExitCode;

use ipfs_accelerate_bench::cli::{self, BenchArgs, CompareArgs, ReportArgs};

/// Arguments of `xtask bench`: the shared bench arguments plus the backend list.
#[derive(clap::Args)]
pub struct Args {
    /// Backends, comma separated, in order (cpu, cuda, onnx-cpu, onnx-openvino, ...). Unusable ones
    /// are recorded as unavailable with the reason, and the run goes on.
    #[arg(long, default_value = "cpu", value_delimiter = ',')]
    backend: Vec<String>,
    #[command(flatten)]
    bench: BenchArgs,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let command = std::iter::once("cargo xtask".to_string())
        .chain(std::env::args().skip(1))
        .collect::<Vec<_>>()
        .join(" ");
    cli::bench(&args.bench, &args.backend, command)?;
    Ok(ExitCode::SUCCESS)
}

pub fn report(args: ReportArgs) -> anyhow::Result<ExitCode> {
    cli::report(&args)?;
    Ok(ExitCode::SUCCESS)
}

pub fn compare(args: CompareArgs) -> anyhow::Result<ExitCode> {
    cli::compare(&args)?;
    Ok(ExitCode::SUCCESS)
}
