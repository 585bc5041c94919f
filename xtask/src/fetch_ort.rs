//! `cargo xtask fetch-ort [--openvino]`: put an ONNX Runtime shared library where the ONNX backend
//! looks for it, taken from the PyPI wheel (a registry package; nothing is built or downloaded at
//! build time).

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{bail, Context};

/// Wheel of the plain runtime (CPU provider).
const CPU_WHEEL: &str = "onnxruntime==1.31.1";
/// Wheel of the OpenVINO build (OpenVINO + CPU providers, OpenVINO runtime and plugins inside).
const OPENVINO_WHEEL: &str = "onnxruntime-openvino==1.24.1";

/// Arguments of `fetch-ort`.
#[derive(clap::Args)]
pub struct Args {
    /// Fetch the OpenVINO build (onnxruntime-openvino) instead of the plain CPU one.
    #[arg(long)]
    openvino: bool,
    /// Target folder (default: $IPFS_ACCELERATE_ORT_DIR or ~/.cache/ipfs-accelerate/onnxruntime);
    /// the library goes to its `cpu/` or `openvino/` subfolder.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The pip requirement to fetch instead of the pinned wheel (e.g. `onnxruntime==1.24.1`).
    #[arg(long)]
    wheel: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let root = match args.dir {
        Some(d) => d,
        None => std::env::var_os(ipfs_accelerate_backend_onnx::ORT_DIR_ENV)
            .map(PathBuf::from)
            .or_else(ipfs_accelerate_backend_onnx::default_dir)
            .context("no home folder: pass --dir")?,
    };
    let (sub, wheel) = if args.openvino {
        ("openvino", OPENVINO_WHEEL)
    } else {
        ("cpu", CPU_WHEEL)
    };
    let wheel = args.wheel.unwrap_or_else(|| wheel.to_string());
    let target = root.join(sub);
    std::fs::create_dir_all(&target).with_context(|| format!("creating {}", target.display()))?;
    let download = tempfile::tempdir()?;
    eprintln!("downloading {wheel} from PyPI ...");
    let status = Command::new("python3")
        .args([
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--only-binary=:all:",
            "-q",
            "-d",
        ])
        .arg(download.path())
        .arg(&wheel)
        .status()
        .context("running `python3 -m pip download` (python3 with pip is needed)")?;
    if !status.success() {
        bail!("pip download {wheel} failed ({status})");
    }
    // Unpack the shared libraries of onnxruntime/capi/ (the runtime, its providers, OpenVINO).
    let script = r#"
import sys, zipfile, glob, os
whl = glob.glob(os.path.join(sys.argv[1], "*.whl"))[0]
out = sys.argv[2]
n = 0
with zipfile.ZipFile(whl) as z:
    for m in z.namelist():
        base = os.path.basename(m)
        if "/capi/" in m and base.startswith("lib") and ".so" in base:
            with z.open(m) as src, open(os.path.join(out, base), "wb") as dst:
                dst.write(src.read())
            n += 1
print(n)
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(script)
        .arg(download.path())
        .arg(&target)
        .output()
        .context("unpacking the wheel with python3")?;
    if !out.status.success() {
        bail!(
            "unpacking the wheel failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let lib = std::fs::read_dir(&target)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("libonnxruntime.so."))
        })
        .max()
        .context("the wheel held no libonnxruntime.so.<version>")?;
    println!("{}", lib.display());
    eprintln!(
        "ONNX Runtime is in {} (found automatically; or set ORT_DYLIB_PATH={})",
        target.display(),
        lib.display()
    );
    Ok(ExitCode::SUCCESS)
}
