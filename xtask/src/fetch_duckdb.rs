//! `cargo xtask fetch-duckdb [--dir DIR]`: put DuckDB's shared library where the benchmark store
//! looks for it, taken from the npm package of DuckDB's Node bindings (a registry tarball; nothing
//! is compiled).

use std::path::PathBuf;
use std::process::{Command, ExitCode};

use anyhow::{bail, Context};
use ipfs_accelerate_benchdb::{
    default_dir, Library, DUCKDB_DIR_ENV, DUCKDB_ENV, LIBRARY_FILE, NPM_PACKAGE,
};

/// Arguments of `fetch-duckdb`.
#[derive(clap::Args)]
pub struct Args {
    /// Target folder (default: $IPFS_ACCELERATE_DUCKDB_DIR or ~/.cache/ipfs-accelerate/duckdb).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// The npm package spec to fetch instead of the pinned one (same layout:
    /// `package/libduckdb.so`).
    #[arg(long)]
    package: Option<String>,
}

pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if !cfg!(all(
        target_os = "linux",
        target_arch = "x86_64",
        target_env = "gnu"
    )) {
        bail!(
            "fetch-duckdb supports linux-x64 (glibc) only, this is {}-{}: get DuckDB's shared \
             library for this platform yourself (the npm package \
             @duckdb/node-bindings-<platform>-<arch>, e.g. @duckdb/node-bindings-darwin-arm64 or \
             -win32-x64, ships it as package/libduckdb.dylib / duckdb.dll; DuckDB's GitHub \
             releases have libduckdb-<platform>.zip) and set IPFS_ACCELERATE_DUCKDB to the file",
            std::env::consts::OS,
            std::env::consts::ARCH
        );
    }
    let env_dir = std::env::var_os(DUCKDB_DIR_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from);
    // Whether `Library::find` searches the target without further settings.
    let searched = args.dir.is_none() || args.dir == env_dir || args.dir == default_dir();
    let target = match args.dir {
        Some(d) => d,
        None => env_dir
            .or_else(default_dir)
            .context("no home folder: pass --dir")?,
    };
    let package = args.package.unwrap_or_else(|| NPM_PACKAGE.to_string());
    std::fs::create_dir_all(&target).with_context(|| format!("creating {}", target.display()))?;
    let download = tempfile::tempdir()?;
    eprintln!("downloading {package} from the npm registry ...");
    let out = Command::new("npm")
        .args(["pack", "--silent", &package, "--pack-destination"])
        .arg(download.path())
        .output()
        .context("running `npm pack` (Node.js with npm is needed)")?;
    if !out.status.success() {
        bail!(
            "npm pack {package} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let tarball = std::fs::read_dir(download.path())?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .find(|p| p.extension().is_some_and(|e| e == "tgz"))
        .with_context(|| format!("npm pack {package} wrote no .tgz"))?;
    let status = Command::new("tar")
        .arg("xzf")
        .arg(&tarball)
        .arg("-C")
        .arg(download.path())
        .arg(format!("package/{LIBRARY_FILE}"))
        .status()
        .context("running `tar`")?;
    if !status.success() {
        bail!(
            "unpacking package/{LIBRARY_FILE} from {} failed ({status})",
            tarball.display()
        );
    }
    let unpacked = download.path().join("package").join(LIBRARY_FILE);
    // Check the library before installing it.
    let lib = Library::load(&unpacked)
        .with_context(|| format!("{package} does not hold a usable {LIBRARY_FILE}"))?;
    let version = lib.version();
    drop(lib);
    // Copy beside the target, then rename over it: a process using the old copy keeps its mapping.
    let dest = target.join(LIBRARY_FILE);
    let partial = target.join(format!(".{LIBRARY_FILE}.partial"));
    std::fs::copy(&unpacked, &partial)
        .with_context(|| format!("copying to {}", partial.display()))?;
    std::fs::rename(&partial, &dest).with_context(|| format!("writing {}", dest.display()))?;
    println!("{}", dest.display());
    if searched {
        eprintln!(
            "DuckDB {version} is in {} (found there automatically)",
            target.display()
        );
    } else {
        eprintln!(
            "DuckDB {version} is in {}; set {DUCKDB_DIR_ENV}={} (or {DUCKDB_ENV}={}) for it to be found",
            target.display(),
            target.display(),
            dest.display()
        );
    }
    Ok(ExitCode::SUCCESS)
}
