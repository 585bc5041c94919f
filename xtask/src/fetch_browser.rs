//! `cargo xtask fetch-browser [--dir DIR]`: put what the browser backends need where they look for
//! it, from the npm registry (nothing is compiled, no browser download of its own):
//! - onnxruntime-web's bundles and WebAssembly binaries (`<dir>/onnxruntime-web/`);
//! - the Chromium with WebNN of `@sparticuz/chromium` (brotli-compressed inside the package,
//!   inflated with Node's zlib) and its SwiftShader libraries (WebGPU / WebGL on the CPU)
//!   (`<dir>/chromium/`).

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use anyhow::{bail, Context};
use ipfs_accelerate_backend_webnn::discover::{
    browser_dir, BROWSER_DIR_ENV, CHROMIUM_PACKAGE, ORT_WEB_FILES, ORT_WEB_PACKAGE,
};

/// Arguments of `fetch-browser`.
#[derive(clap::Args)]
pub struct Args {
    /// Target folder (default: $IPFS_ACCELERATE_BROWSER_DIR or ~/.cache/ipfs-accelerate/browser).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Only onnxruntime-web (use the system's or $IPFS_ACCELERATE_CHROMIUM's browser).
    #[arg(long)]
    no_chromium: bool,
    /// Download again even when the pinned versions are already installed.
    #[arg(long)]
    force: bool,
}

/// True when the first line of `dir/VERSION` is `version` (an install of the pinned package).
fn installed(dir: &Path, version: &str) -> bool {
    std::fs::read_to_string(dir.join("VERSION"))
        .is_ok_and(|v| v.lines().next().map(str::trim) == Some(version))
}

/// `npm pack`s `package` into `into` and returns the tarball.
fn npm_pack(package: &str, into: &Path) -> anyhow::Result<PathBuf> {
    eprintln!("downloading {package} from the npm registry ...");
    let out = Command::new("npm")
        .args(["pack", "--silent", package, "--pack-destination"])
        .arg(into)
        .output()
        .context("running `npm pack` (Node.js with npm is needed)")?;
    if !out.status.success() {
        bail!(
            "npm pack {package} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let name = String::from_utf8_lossy(&out.stdout)
        .lines()
        .last()
        .unwrap_or_default()
        .trim()
        .to_string();
    let tarball = into.join(&name);
    if name.is_empty() || !tarball.is_file() {
        bail!("npm pack {package} wrote no tarball (said {name:?})");
    }
    Ok(tarball)
}

/// Unpacks `members` of `tarball` into `into`.
fn untar(tarball: &Path, into: &Path, members: &[String]) -> anyhow::Result<()> {
    let status = Command::new("tar")
        .arg("xzf")
        .arg(tarball)
        .arg("-C")
        .arg(into)
        .args(members)
        .status()
        .context("running `tar`")?;
    if !status.success() {
        bail!(
            "unpacking {members:?} from {} failed ({status})",
            tarball.display()
        );
    }
    Ok(())
}

/// Replaces `dest` by the folder `staged` (renamed into place).
fn install(staged: &Path, dest: &Path) -> anyhow::Result<()> {
    if dest.exists() {
        std::fs::remove_dir_all(dest).with_context(|| format!("removing {}", dest.display()))?;
    }
    std::fs::rename(staged, dest).with_context(|| format!("writing {}", dest.display()))
}

fn fetch_ort_web(target: &Path, download: &Path) -> anyhow::Result<()> {
    let tarball = npm_pack(ORT_WEB_PACKAGE, download)?;
    let members: Vec<String> = ORT_WEB_FILES
        .iter()
        .map(|f| format!("package/dist/{f}"))
        .collect();
    untar(&tarball, download, &members)?;
    let staged = target.join(".onnxruntime-web.partial");
    let _ = std::fs::remove_dir_all(&staged);
    std::fs::create_dir_all(&staged)?;
    for f in ORT_WEB_FILES {
        std::fs::copy(download.join("package/dist").join(f), staged.join(f))
            .with_context(|| format!("copying {f}"))?;
    }
    std::fs::write(staged.join("VERSION"), ORT_WEB_PACKAGE)?;
    install(&staged, &target.join("onnxruntime-web"))
}

/// Inflates the brotli files `<bin>/<name>.br` into `<out>/<name>` with Node's zlib.
fn inflate(bin: &Path, out: &Path, names: &[&str]) -> anyhow::Result<()> {
    let script = "const fs = require('fs'), zlib = require('zlib'), path = require('path');\n\
                  const [bin, out, ...names] = process.argv.slice(1);\n\
                  for (const n of names) fs.writeFileSync(path.join(out, n), \
                  zlib.brotliDecompressSync(fs.readFileSync(path.join(bin, n + '.br'))));";
    let status = Command::new("node")
        .arg("-e")
        .arg(script)
        .arg(bin)
        .arg(out)
        .args(names)
        .status()
        .context("running `node` (Node.js is needed to inflate the brotli files)")?;
    if !status.success() {
        bail!(
            "inflating {names:?} from {} failed ({status})",
            bin.display()
        );
    }
    Ok(())
}

fn fetch_chromium(target: &Path, download: &Path) -> anyhow::Result<PathBuf> {
    let tarball = npm_pack(CHROMIUM_PACKAGE, download)?;
    untar(&tarball, download, &["package/bin".to_string()])?;
    let staged = target.join(".chromium.partial");
    let _ = std::fs::remove_dir_all(&staged);
    std::fs::create_dir_all(&staged)?;
    let bin = download.join("package/bin");
    inflate(&bin, &staged, &["chromium", "swiftshader.tar"])?;
    // SwiftShader (libvk_swiftshader.so, libEGL, libGLESv2, ICD file) beside the binary, where
    // Chromium loads it from.
    let status = Command::new("tar")
        .arg("xf")
        .arg(staged.join("swiftshader.tar"))
        .arg("-C")
        .arg(&staged)
        .status()
        .context("running `tar`")?;
    if !status.success() {
        bail!("unpacking swiftshader.tar failed ({status})");
    }
    std::fs::remove_file(staged.join("swiftshader.tar"))?;
    let exe = staged.join("chromium");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755))?;
    }
    let version = Command::new(&exe)
        .arg("--version")
        .output()
        .with_context(|| format!("running {} --version", exe.display()))?;
    if !version.status.success() {
        bail!(
            "{} --version failed ({}): {} (missing system libraries? `apt-get install chromium` \
             brings them)",
            exe.display(),
            version.status,
            String::from_utf8_lossy(&version.stderr).trim()
        );
    }
    std::fs::write(
        staged.join("VERSION"),
        format!(
            "# {CHROMIUM_PACKAGE}\n{}\n",
            String::from_utf8_lossy(&version.stdout).trim()
        ),
    )?;
    let dest = target.join("chromium");
    install(&staged, &dest)?;
    Ok(dest.join("chromium"))
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !cfg!(all(target_os = "linux", target_arch = "x86_64")) && !args.no_chromium {
        bail!(
            "the Chromium of {CHROMIUM_PACKAGE} is linux-x64 only; on {}-{} use \
             `--no-chromium` and set IPFS_ACCELERATE_CHROMIUM to a Chromium with WebNN",
            std::env::consts::OS,
            std::env::consts::ARCH
        );
    }
    let env_dir = std::env::var_os(BROWSER_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    let searched = args.dir.is_none() || args.dir == env_dir || args.dir == browser_dir();
    let target = match args.dir {
        Some(d) => d,
        None => browser_dir().context("no home folder: pass --dir")?,
    };
    std::fs::create_dir_all(&target).with_context(|| format!("creating {}", target.display()))?;
    let download = tempfile::tempdir()?;
    let ort_dir = target.join("onnxruntime-web");
    if args.force || !installed(&ort_dir, ORT_WEB_PACKAGE) {
        fetch_ort_web(&target, download.path())?;
    } else {
        eprintln!("{ORT_WEB_PACKAGE} is already in {}", ort_dir.display());
    }
    println!("{}", ort_dir.display());
    if !args.no_chromium {
        let chromium_dir = target.join("chromium");
        let exe = if args.force || !installed(&chromium_dir, &format!("# {CHROMIUM_PACKAGE}")) {
            fetch_chromium(&target, download.path())?
        } else {
            eprintln!(
                "{CHROMIUM_PACKAGE} is already in {}",
                chromium_dir.display()
            );
            chromium_dir.join("chromium")
        };
        println!("{}", exe.display());
    }
    if !searched {
        eprintln!(
            "set {BROWSER_DIR_ENV}={} for the browser backends to find it",
            target.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
