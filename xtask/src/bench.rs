//! `cargo xtask bench | compare | report | compare-backends`: the benchmark runner, the
//! side-by-side comparison with the peers, the HTML report and the backend ranking (the work is
//! in `ipfs-accelerate-bench`, shared with the CLI's `bench`).
//!
//! `bench` and `compare` measure an optimised build: they build the CLI in release
//! (`cargo build --release -p ipfs-accelerate-cli`, with this xtask's GPU features) and run its
//! `bench` with the same arguments, since xtask itself is a dev-profile build (our crates at
//! opt-level 1, several times slower). `--dev` measures in this process instead (quick, for CI),
//! and every stored run records the profile and opt-level it was measured with.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::Context as _;
use ipfs_accelerate_bench::cli::{self, BenchArgs, CompareArgs, ReportArgs};

/// Arguments of `xtask bench` and `xtask compare`: the shared bench arguments plus the backend
/// list.
#[derive(clap::Args)]
pub struct Args {
    /// Backends, comma separated, in order (cpu, cuda, onnx-cpu, onnx-openvino, ...). Unusable ones
    /// are recorded as unavailable with the reason, and the run goes on.
    #[arg(long, default_value = "cpu", value_delimiter = ',')]
    backend: Vec<String>,
    /// Measure in this dev-profile process (opt-level 1: quick to build, numbers several times
    /// slower than a release build's; stored flagged as unoptimised) instead of a release build.
    #[arg(long)]
    dev: bool,
    #[command(flatten)]
    bench: BenchArgs,
}

/// `compare`'s defaults over `bench`'s: these peers (llama.cpp for a `.gguf` model) and this
/// many alternating rounds.
const COMPARE_PEERS: &str = "torch,ort";
const COMPARE_PEERS_GGUF: &str = "llamacpp";
const COMPARE_ROUNDS: &str = "5";

/// `xtask bench`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    measure(args, false)
}

/// `xtask compare`: `bench` with `--peer torch,ort --rounds 5` (`--peer llamacpp` for a
/// `.gguf` model) unless given, printing the side-by-side table.
pub fn compare_peers(args: Args) -> anyhow::Result<ExitCode> {
    measure(args, true)
}

/// The arguments after the subcommand, less `--dev`, plus `compare`'s defaults.
fn forwarded(compare: bool, peers: &str) -> Vec<String> {
    let mut forward: Vec<String> = std::env::args().skip(2).filter(|a| a != "--dev").collect();
    if compare {
        let given = |flag: &str| {
            forward
                .iter()
                .any(|a| a == flag || a.starts_with(&format!("{flag}=")))
        };
        let mut extra = Vec::new();
        if !given("--peer") {
            extra.extend(["--peer".to_string(), peers.to_string()]);
        }
        if !given("--rounds") {
            extra.extend(["--rounds".to_string(), COMPARE_ROUNDS.to_string()]);
        }
        forward.extend(extra);
    }
    forward
}

fn measure(mut args: Args, compare: bool) -> anyhow::Result<ExitCode> {
    let peers = if args.bench.config.to_ascii_lowercase().ends_with(".gguf") {
        COMPARE_PEERS_GGUF
    } else {
        COMPARE_PEERS
    };
    let forward = forwarded(compare, peers);
    if compare {
        if args.bench.peer.is_empty() {
            args.bench.peer = peers.split(',').map(String::from).collect();
        }
        if !forward.iter().any(|a| a.starts_with("--rounds")) {
            args.bench.rounds = COMPARE_ROUNDS.parse()?;
        }
    }
    if args.dev {
        let command = std::iter::once("cargo xtask".to_string())
            .chain(std::env::args().skip(1))
            .collect::<Vec<_>>()
            .join(" ");
        cli::bench(&args.bench, &args.backend, command)?;
        return Ok(ExitCode::SUCCESS);
    }
    let exe = build_release_cli(&args.backend)?;
    // Ctrl-C reaches the child too: it stops after the current iteration and keeps its rows;
    // this process waits for it instead of dying first.
    ipfs_accelerate_bench::install_interrupt_handler()?;
    let status = Command::new(&exe)
        .arg("bench")
        .args(&forward)
        .status()
        .with_context(|| format!("running {}", exe.display()))?;
    Ok(match status.code() {
        Some(0) => ExitCode::SUCCESS,
        Some(code) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        None => ExitCode::from(130),
    })
}

/// The workspace's Cargo target folder.
fn target_dir() -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join("target"),
    }
}

/// Builds the CLI in release with the GPU features this xtask has (and the browser backends when
/// asked for), and returns its path.
fn build_release_cli(backends: &[String]) -> anyhow::Result<PathBuf> {
    let mut features: Vec<&str> = Vec::new();
    for (on, name) in [
        (cfg!(feature = "cuda"), "cuda"),
        (cfg!(feature = "rocm"), "rocm"),
        (cfg!(feature = "wgpu"), "wgpu"),
        (cfg!(feature = "metal"), "metal"),
    ] {
        if on {
            features.push(name);
        }
    }
    if backends
        .iter()
        .any(|b| matches!(b.as_str(), "webnn" | "webgpu-browser" | "wasm"))
    {
        features.push("webnn");
    }
    eprintln!(
        "building the CLI in release to measure an optimised build (`--dev` measures this \
         dev-profile process instead)"
    );
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = Command::new(cargo);
    build.args(["build", "--release", "-p", "ipfs-accelerate-cli"]);
    if !features.is_empty() {
        build.args(["--features", &features.join(",")]);
    }
    let status = build
        .current_dir(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(".."))
        .status()
        .context("running cargo build --release -p ipfs-accelerate-cli")?;
    anyhow::ensure!(
        status.success(),
        "cargo build --release -p ipfs-accelerate-cli failed ({status}); `--dev` measures without it"
    );
    let exe = target_dir()
        .join("release")
        .join(format!("ipfs-accelerate{}", std::env::consts::EXE_SUFFIX));
    anyhow::ensure!(
        exe.is_file(),
        "the release build did not leave {}",
        exe.display()
    );
    Ok(exe)
}

pub fn report(args: ReportArgs) -> anyhow::Result<ExitCode> {
    cli::report(&args)?;
    Ok(ExitCode::SUCCESS)
}

pub fn compare(args: CompareArgs) -> anyhow::Result<ExitCode> {
    cli::compare(&args)?;
    Ok(ExitCode::SUCCESS)
}
