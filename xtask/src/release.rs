//! Release checks: every feature of a crate builds on its own (`check-features`, what
//! `cargo hack --each-feature` does, without installing it), and the facade with the workspace
//! crates it depends on packages as crates.io would take them (`package`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// `check-features`.
#[derive(clap::Args)]
pub struct FeatureArgs {
    /// The crate whose features are checked one at a time.
    #[arg(long, short, default_value = "ipfs-accelerate")]
    package: String,
    /// Features to leave out (comma-separated).
    #[arg(long, value_delimiter = ',')]
    skip: Vec<String>,
}

/// `package`.
#[derive(clap::Args)]
pub struct PackageArgs {
    /// The crate to package with the workspace crates it depends on.
    #[arg(long, short, default_value = "ipfs-accelerate")]
    package: String,
    /// Only build the .crate files (skip building them from the unpacked sources).
    #[arg(long)]
    no_verify: bool,
}

/// Verification unpacks the packaged crates from a temporary overlay registry into
/// `$CARGO_HOME/registry/src/-<hash>/<name>-<version>`, and cargo skips the unpacking when that
/// folder exists. The hash depends on the checkout's path, not on the sources, so a second
/// checkout at the same path (CI's clean clone) would build today's crates against yesterday's
/// unpacked dependencies. Removes those folders for the crates about to be packaged; the
/// crates.io cache (`index.crates.io-*`) is never touched.
fn forget_unpacked_overlays(versions: &BTreeMap<String, String>) -> Result<()> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry").join("src")) else {
        return Ok(());
    };
    let Ok(registries) = std::fs::read_dir(&src) else {
        return Ok(());
    };
    for registry in registries.flatten() {
        // Overlay registries have no host name: their folder is `-<hash>`.
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        for (name, version) in versions {
            let unpacked = registry.path().join(format!("{name}-{version}"));
            if unpacked.is_dir() {
                std::fs::remove_dir_all(&unpacked)
                    .with_context(|| format!("removing the stale {}", unpacked.display()))?;
            }
        }
    }
    Ok(())
}

/// Removes what an earlier `xtask package` compiled from the overlay registry (in the target
/// folder's `debug`): cargo takes a registry crate of the same name and version as unchanged, so
/// it would link the previous run's build of, say, `core` into this run's `nn`. Found by the
/// dep-info files that name an overlay registry's unpacked sources.
fn forget_overlay_builds(target: &Path) -> Result<()> {
    let deps = target.join("debug").join("deps");
    let Ok(entries) = std::fs::read_dir(&deps) else {
        return Ok(());
    };
    let mut stale = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|e| e == "d")
            && std::fs::read_to_string(&path).is_ok_and(|t| t.contains("/registry/src/-"))
        {
            if let Some(stem) = path.file_stem().and_then(|s| s.to_str()) {
                stale.push(stem.to_string());
            }
        }
    }
    for stem in stale {
        // `<crate>-<hash>`: its dep-info, rlib / rmeta and fingerprint folder.
        for name in [
            format!("{stem}.d"),
            format!("lib{stem}.rlib"),
            format!("lib{stem}.rmeta"),
        ] {
            let _ = std::fs::remove_file(deps.join(name));
        }
        let fingerprint = target
            .join("debug")
            .join(".fingerprint")
            .join(stem.replace('_', "-"));
        let _ = std::fs::remove_dir_all(fingerprint);
    }
    Ok(())
}

/// `cargo metadata --no-deps` of the workspace, and of the path crates outside it.
fn metadata() -> Result<Value> {
    let out = Command::new(cargo())
        .args(["metadata", "--format-version", "1", "--no-deps"])
        .output()
        .context("running cargo metadata")?;
    if !out.status.success() {
        bail!("cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

fn package<'a>(meta: &'a Value, name: &str) -> Result<&'a Value> {
    meta["packages"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == name))
        .with_context(|| format!("no workspace package `{name}`"))
}

/// Checks `--no-default-features` and then each feature alone.
pub fn check_features(args: FeatureArgs) -> Result<ExitCode> {
    let meta = metadata()?;
    let features: Vec<String> = package(&meta, &args.package)?["features"]
        .as_object()
        .map(|f| f.keys().cloned().collect())
        .unwrap_or_default();
    let mut failed = Vec::new();
    let all = std::iter::once(String::new()).chain(features);
    for feature in all.filter(|f| !args.skip.contains(f)) {
        let clock = Instant::now();
        let status = Command::new(cargo())
            .args(["check", "-q", "-p", &args.package, "--no-default-features"])
            .args(["--features", &feature])
            .status()
            .context("running cargo check")?;
        let name = if feature.is_empty() {
            "(none)"
        } else {
            &feature
        };
        let verdict = if status.success() { "ok" } else { "FAILED" };
        println!(
            "{:<20} {verdict:<6} {:>6.1} s",
            name,
            clock.elapsed().as_secs_f64()
        );
        if !status.success() {
            failed.push(name.to_string());
        }
    }
    if failed.is_empty() {
        println!("every feature of {} builds on its own", args.package);
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("features that do not build alone: {}", failed.join(", "));
        Ok(ExitCode::FAILURE)
    }
}

/// The path dependencies of `name` (normal and build, optional included), transitively: the
/// workspace members and the path crates outside the workspace (name → manifest folder).
fn path_dependencies(meta: &Value, name: &str) -> Result<BTreeMap<String, Option<PathBuf>>> {
    let members: BTreeSet<&str> = meta["packages"]
        .as_array()
        .map(|p| p.iter().filter_map(|p| p["name"].as_str()).collect())
        .unwrap_or_default();
    let mut found: BTreeMap<String, Option<PathBuf>> = BTreeMap::new();
    let mut todo = vec![name.to_string()];
    while let Some(next) = todo.pop() {
        let Ok(pkg) = package(meta, &next) else {
            continue;
        };
        for dep in pkg["dependencies"].as_array().into_iter().flatten() {
            let (Some(dep_name), Some(path)) = (dep["name"].as_str(), dep["path"].as_str()) else {
                continue;
            };
            if dep["kind"].as_str() == Some("dev") || found.contains_key(dep_name) {
                continue;
            }
            let outside = (!members.contains(dep_name)).then(|| PathBuf::from(path));
            found.insert(dep_name.to_string(), outside);
            todo.push(dep_name.to_string());
        }
    }
    Ok(found)
}

/// Packages `--package` with every workspace crate it depends on (cargo resolves them among
/// the packages being made). The GPU backends that are not workspace members (burn-cuda,
/// burn-wgpu and burn-rocm are too heavy for `cargo test --workspace`) are optional
/// dependencies no default build reaches: they are resolved from their folders (a `[patch]`
/// given on the command line), and `check-features` builds each of them.
pub fn package_crates(args: PackageArgs) -> Result<ExitCode> {
    let meta = metadata()?;
    let deps = path_dependencies(&meta, &args.package)?;
    let mut command = Command::new(cargo());
    // Verification builds the unpacked crates in the default dev profile: without debug info it
    // links faster and takes a fraction of the disk.
    command.env("CARGO_PROFILE_DEV_DEBUG", "false").args([
        "package",
        "--allow-dirty",
        "-p",
        &args.package,
    ]);
    if args.no_verify {
        command.arg("--no-verify");
    }
    let mut outside = Vec::new();
    for (name, path) in &deps {
        match path {
            None => {
                command.args(["-p", name]);
            }
            Some(dir) => {
                command.args([
                    "--config",
                    &format!("patch.crates-io.{name}.path='{}'", dir.display()),
                ]);
                outside.push(name.clone());
            }
        }
    }
    println!(
        "packaging {} with {} workspace crates{}",
        args.package,
        deps.len() - outside.len(),
        if outside.is_empty() {
            String::new()
        } else {
            format!(" ({} resolved from their folders)", outside.join(", "))
        }
    );
    let versions: BTreeMap<String, String> = std::iter::once(args.package.clone())
        .chain(deps.keys().cloned())
        .filter_map(|name| {
            let version = package(&meta, &name).ok()?["version"].as_str()?.to_string();
            Some((name, version))
        })
        .collect();
    forget_unpacked_overlays(&versions)?;
    let target = PathBuf::from(
        meta["target_directory"]
            .as_str()
            .context("cargo metadata has no target_directory")?,
    );
    forget_overlay_builds(&target)?;
    let clock = Instant::now();
    let status = command.status().context("running cargo package")?;
    if !status.success() {
        bail!("cargo package failed");
    }
    let dir = target.join("package");
    let mut biggest = (String::new(), 0u64);
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let name = entry.file_name().to_string_lossy().to_string();
        let size = entry.metadata()?.len();
        if name.ends_with(".crate") && size > biggest.1 {
            biggest = (name, size);
        }
    }
    // crates.io refuses uploads over 10 MB.
    const LIMIT: u64 = 10 * 1024 * 1024;
    println!(
        "packaged in {:.0} s; the largest .crate is {} ({:.1} MiB; crates.io takes {} MiB)",
        clock.elapsed().as_secs_f64(),
        biggest.0,
        biggest.1 as f64 / 1048576.0,
        LIMIT / 1048576
    );
    if biggest.1 > LIMIT {
        bail!("{} is over crates.io's 10 MB limit", biggest.0);
    }
    Ok(ExitCode::SUCCESS)
}
