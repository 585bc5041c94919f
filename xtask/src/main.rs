//! `cargo xtask <command>`: project tasks.
//!
//! - `verify --fixtures DIR [--family bert,...] [--backend cpu,...]`: run every fixture of the
//!   implemented families against HF's reference outputs; prints a table, exits non-zero on failure.
//! - `compact-model --from DIR --out DIR`: write the int8-row compact copy of a BERT checkpoint
//!   used as the embedded default model.
//! - `fetch-ort [--openvino]`: unpack ONNX Runtime's shared library from its PyPI wheel into the
//!   folder the ONNX backend searches.
//! - `fetch-duckdb [--dir DIR]`: unpack DuckDB's libduckdb.so from its npm package into the
//!   folder the benchmark store searches.
//! - `bench --config NAME|PATH --backend cpu,... --batch 1,8 --seq 32,128 --iters N --db FILE
//!   [--peer torch,ort] [--dev]`: measure a family over a grid into DuckDB, in a release build of
//!   the CLI (`--dev`: in this process); `compare --config NAME --peer torch,ort --rounds 5`: the
//!   same, alternating ours and the peers, with a side-by-side table; `report --db FILE --out
//!   FILE.html` renders the results; `compare-backends --db FILE --family F` ranks the backends.
//! - `fetch-peers [--only torch,ort]`: install the peers (PyPI) into target/peers/venv.
//! - `check-features [-p CRATE]`: `cargo check` the crate with no features, then each feature
//!   alone; `package [-p CRATE]`: `cargo package` it with the workspace crates it depends on.

mod bench;
mod compact;
mod fetch_browser;
mod fetch_duckdb;
mod fetch_ort;
mod fetch_peers;
mod release;
mod verify;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "ipfs-accelerate project tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Conformance: compare every fixture's outputs with HF transformers' reference outputs.
    Verify(verify::Args),
    /// Write a compact (int8 blocks + f16 scales) copy of a checkpoint for embedding.
    CompactModel(compact::Args),
    /// Put ONNX Runtime (from the PyPI wheel) where the ONNX backend finds it.
    FetchOrt(fetch_ort::Args),
    /// Put DuckDB's libduckdb.so (from the npm package) where the benchmark store finds it.
    FetchDuckdb(fetch_duckdb::Args),
    /// Put onnxruntime-web and a Chromium with WebNN (npm packages) where the browser backends find them.
    FetchBrowser(fetch_browser::Args),
    /// Put the benchmark peers (PyTorch, ONNX Runtime; PyPI packages) into a venv under target/.
    FetchPeers(fetch_peers::Args),
    /// Benchmark a family over backends × batch sizes × sizes into a DuckDB file (release build;
    /// `--dev` to measure this dev-profile process).
    Bench(bench::Args),
    /// Ours vs peers in the same run: `bench` with `--peer torch,ort --rounds 5` by default,
    /// alternating ours and each peer, printing a side-by-side table with ratios.
    Compare(bench::Args),
    /// Render the results of a DuckDB file as an HTML page with SVG plots.
    Report(ipfs_accelerate_bench::cli::ReportArgs),
    /// Rank the backends measured for one family (and model) by latency.
    CompareBackends(ipfs_accelerate_bench::cli::CompareArgs),
    /// `cargo check` a crate (the facade by default) with no features, then with each alone.
    CheckFeatures(release::FeatureArgs),
    /// `cargo package` a crate (the facade by default) with the workspace crates it depends on.
    Package(release::PackageArgs),
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Verify(a) => verify::run(a),
        Command::CompactModel(a) => compact::run(a),
        Command::FetchOrt(a) => fetch_ort::run(a),
        Command::FetchDuckdb(a) => fetch_duckdb::run(a),
        Command::FetchBrowser(a) => fetch_browser::run(a),
        Command::FetchPeers(a) => fetch_peers::run(a),
        Command::Bench(a) => bench::run(a),
        Command::Compare(a) => bench::compare_peers(a),
        Command::Report(a) => bench::report(a),
        Command::CompareBackends(a) => bench::compare(a),
        Command::CheckFeatures(a) => release::check_features(a),
        Command::Package(a) => release::package_crates(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
