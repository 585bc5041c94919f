//! `cargo xtask fetch-peers [--only ort] [--python python3]`: install the peers the benchmark
//! runner measures beside ours (`bench --peer torch,ort`) into a venv under the Cargo target
//! folder (`target/peers/venv`, where the runner looks first), from PyPI packages with pip's
//! default index: `torch` + `transformers` (PyTorch eager; PyPI's Linux wheel brings its CUDA
//! libraries, several GB, kept in pip's cache) and `onnxruntime` + `onnx` (+ `onnxscript`) for
//! ONNX Runtime and the export. `--only ort` installs ONNX Runtime alone (tens of MB): it runs
//! ONNX files a checkpoint folder already has (the conformance fixtures do) and reports the
//! export of other models as unavailable. `openai` is the official OpenAI Python client, which the
//! server's tests (`ipfs-accelerate serve`) drive. `llamacpp` installs the npm package
//! `node-llama-cpp` (llama.cpp's prebuilt CPU and CUDA binaries) with npm into
//! `target/peers/llamacpp`, for `bench --peer llamacpp` on GGUF files.

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
    /// Install only these peers, comma separated: `torch`, `ort`, `openai`, `llamacpp` (default:
    /// all).
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
/// The npm package of the llama.cpp peer (major version the script is written for).
const NODE_LLAMA_CPP: &str = "node-llama-cpp@3";

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
            matches!(o.as_str(), "torch" | "ort" | "openai" | "llamacpp"),
            "unknown peer `{o}` for --only: the peers are torch, ort, openai, llamacpp"
        );
    }
    if want("llamacpp") {
        install_node_llama_cpp(&dir.join("llamacpp"))?;
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
    if packages.is_empty() {
        return Ok(ExitCode::SUCCESS);
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

/// `npm install node-llama-cpp` into `dir` with only this platform's prebuilt CPU binaries
/// (`@node-llama-cpp/<os>-<arch>`, tens of MB; the CUDA and Vulkan builds, some 600 MB, are left
/// out: the peer runs llama.cpp on the CPU). The postinstall build step is skipped: the
/// benchmark script never builds from source.
fn install_node_llama_cpp(dir: &std::path::Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let npm = |args: &[&str]| -> anyhow::Result<()> {
        eprintln!("npm {} (npm registry)", args.join(" "));
        let status = Command::new("npm")
            .args(args)
            .args(["--no-audit", "--no-fund", "--ignore-scripts", "--prefix"])
            .arg(dir)
            .status()
            .context("running npm (install Node.js and npm: `apt-get install nodejs npm`)")?;
        ensure!(status.success(), "npm {} failed ({status})", args.join(" "));
        Ok(())
    };
    npm(&["install", "--omit=optional", NODE_LLAMA_CPP])?;
    let manifest = dir.join("node_modules/node-llama-cpp/package.json");
    let text = std::fs::read_to_string(&manifest)
        .with_context(|| format!("reading {}", manifest.display()))?;
    let version = serde_json::from_str::<serde_json::Value>(&text)
        .ok()
        .and_then(|v| v.get("version")?.as_str().map(str::to_string))
        .with_context(|| format!("{} has no version", manifest.display()))?;
    let os = match std::env::consts::OS {
        "macos" => "mac",
        "windows" => "win",
        other => other,
    };
    let arch = match std::env::consts::ARCH {
        "x86_64" => "x64",
        "aarch64" => "arm64",
        other => other,
    };
    // The platform's binaries as a dependency of their own (kept while the other optional
    // builds are omitted).
    let binaries = format!("@node-llama-cpp/{os}-{arch}@{version}");
    let pinned = format!("node-llama-cpp@{version}");
    npm(&["install", "--omit=optional", &pinned, &binaries])?;
    eprintln!(
        "llama.cpp peer (node-llama-cpp {version}) installed in {} (the benchmark runner finds \
         it there; elsewhere set {})",
        dir.display(),
        ipfs_accelerate_bench::peers::NODE_LLAMA_CPP_ENV
    );
    Ok(())
}
