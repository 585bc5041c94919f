//! `cargo xtask fetch-peers [--only ort] [--python python3]`: install the peers the benchmark
//! runner measures beside ours (`bench --peer torch,ort`) into a venv under the Cargo target
//! folder (`target/peers/venv`, where the runner looks first), from PyPI packages with pip's
//! default index: `torch` + `transformers` (PyTorch eager; PyPI's Linux wheel brings its CUDA
//! libraries, several GB, kept in pip's cache) and `onnxruntime` + `onnx` (+ `onnxscript`) for
//! ONNX Runtime and the export. `--only ort` installs ONNX Runtime alone (tens of MB): it runs
//! ONNX files a checkpoint folder already has (the conformance fixtures do) and reports the
//! export of other models as unavailable. `openai` is the official OpenAI Python client, which the
//! server's tests (`ipfs-accelerate serve`) drive.

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{ensure, Context};

/// Arguments of `fetch-peers`.
#[derive(clap::Args)]
pub struct Args {
    /// Target folder of the venv and the ONNX export cache (default: target/peers, or
    /// $IPFS_ACCELERATE_PEERS_DIR).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The Python that creates the venv.
    #[arg(long, default_value = "python3")]
    python: PathBuf,
    /// Install only these peers, comma separated: `torch`, `ort`, `openai` (default: all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
}

/// PyPI packages of each peer.
const TORCH: &[&str] = &["torch", "transformers"];
const ORT: &[&str] = &["onnxruntime", "onnx", "numpy", "tokenizers"];
/// The official OpenAI client (the server's compatibility test).
const OPENAI: &[&str] = &["openai"];
/// The exporter of the ONNX Runtime peer (needs torch + transformers too).
const EXPORT: &[&str] = &["onnxscript"];

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let dir = match (
        &args.dir,
        std::env::var_os(ipfs_accelerate_bench::peers::PEERS_DIR_ENV),
    ) {
        (Some(d), _) => d.clone(),
        (None, Some(d)) => PathBuf::from(d),
        (None, None) => std::env::var_os("CARGO_TARGET_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                    .join("..")
                    .join("target")
            })
            .join("peers"),
    };
    let only: Vec<String> = args.only.iter().map(|s| s.to_ascii_lowercase()).collect();
    let want = |name: &str| only.is_empty() || only.iter().any(|o| o == name);
    for o in &only {
        ensure!(
            matches!(o.as_str(), "torch" | "ort" | "openai"),
            "unknown peer `{o}` for --only: the peers are torch, ort, openai"
        );
    }
    let mut packages: Vec<&str> = Vec::new();
    if want("torch") {
        packages.extend(TORCH);
    }
    if want("ort") {
        packages.extend(ORT);
        if want("torch") {
            packages.extend(EXPORT);
        }
    }
    if want("openai") {
        packages.extend(OPENAI);
    }
    let venv = dir.join("venv");
    let python = venv.join("bin").join("python");
    if !python.is_file() {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        eprintln!("creating the venv {}", venv.display());
        let status = Command::new(&args.python)
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .with_context(|| format!("running {} -m venv", args.python.display()))?;
        ensure!(
            status.success(),
            "{} -m venv {} failed ({status}); on Debian `apt-get install python3-venv`",
            args.python.display(),
            venv.display()
        );
    }
    eprintln!(
        "pip install {} (PyPI; torch's Linux wheel pulls its CUDA libraries, several GB)",
        packages.join(" ")
    );
    let status = Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "--disable-pip-version-check",
            "--progress-bar",
            "off",
        ])
        .args(&packages)
        .status()
        .with_context(|| format!("running {} -m pip", python.display()))?;
    ensure!(status.success(), "pip install failed ({status})");
    let versions = Command::new(&python)
        .args([
            "-c",
            "import importlib.metadata as m\nfor p in ('torch','transformers','onnxruntime','onnx','openai'):\n    \
             try: print(p, m.version(p))\n    except m.PackageNotFoundError: print(p, 'not installed')",
        ])
        .output()
        .context("listing the installed peers")?;
    eprint!("{}", String::from_utf8_lossy(&versions.stdout));
    eprintln!(
        "peers installed in {} (the benchmark runner finds them there; elsewhere set {})",
        venv.display(),
        ipfs_accelerate_bench::peers::PYTHON_ENV
    );
    Ok(ExitCode::SUCCESS)
}
