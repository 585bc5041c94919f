//! `cargo xtask <command>`: project tasks.
//!
//! - `verify --fixtures DIR [--family bert,...] [--backend cpu,...]`: run every fixture of the
//!   implemented families against HF's reference outputs; prints a table, exits non-zero on failure.
//! - `compact-model --from DIR --out DIR`: write the int8-row compact copy of a BERT checkpoint
//!   used as the embedded default model.
//! - `fetch-ort [--openvino]`: unpack ONNX Runtime's shared library from its PyPI wheel into the
//!   folder the ONNX backend searches.

mod compact;
mod fetch_ort;
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
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Verify(a) => verify::run(a),
        Command::CompactModel(a) => compact::run(a),
        Command::FetchOrt(a) => fetch_ort::run(a),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}
