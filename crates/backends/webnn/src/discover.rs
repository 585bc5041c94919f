//! Where the browser and onnxruntime-web are: explicit settings, then the folder
//! `cargo xtask fetch-browser` fills, then the system's Chromium.

use std::path::{Path, PathBuf};

pub use ipfs_accelerate_chromium::{
    is_executable, system_chromium, CHROMIUM_ENV, CHROMIUM_FALLBACK, CHROMIUM_NAMES,
};

use crate::BrowserError;

/// Environment variable naming the folder `cargo xtask fetch-browser` fills (default:
/// `~/.cache/ipfs-accelerate/browser`).
pub const BROWSER_DIR_ENV: &str = "IPFS_ACCELERATE_BROWSER_DIR";
/// Environment variable naming a folder with onnxruntime-web's `dist/` files (default:
/// `<browser dir>/onnxruntime-web`).
pub const ORT_WEB_ENV: &str = "IPFS_ACCELERATE_ORT_WEB";
/// The pinned npm package of onnxruntime-web that `fetch-browser` installs.
pub const ORT_WEB_PACKAGE: &str = "onnxruntime-web@1.30.0";
/// The pinned npm package whose (brotli-compressed) Chromium `fetch-browser` installs: a build
/// with WebNN (Debian's `chromium` exposes `navigator.ml` but cannot create a context).
pub const CHROMIUM_PACKAGE: &str = "@sparticuz/chromium@153.0.0";
/// The onnxruntime-web files the page loads: the JSEP bundle (wasm + WebNN), the dedicated
/// WebGPU bundle (its native WebGPU provider), and the WebAssembly binaries they import.
pub const ORT_WEB_FILES: [&str; 6] = [
    "ort.min.mjs",
    "ort-wasm-simd-threaded.jsep.mjs",
    "ort-wasm-simd-threaded.jsep.wasm",
    "ort.webgpu.min.mjs",
    "ort-wasm-simd-threaded.asyncify.mjs",
    "ort-wasm-simd-threaded.asyncify.wasm",
];

/// The folder `cargo xtask fetch-browser` fills: `$IPFS_ACCELERATE_BROWSER_DIR`, else
/// `$XDG_CACHE_HOME/ipfs-accelerate/browser`, else `~/.cache/ipfs-accelerate/browser`.
pub fn browser_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os(BROWSER_DIR_ENV).filter(|d| !d.is_empty()) {
        return Some(PathBuf::from(d));
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("ipfs-accelerate").join("browser"))
}

/// The Chromium `fetch-browser` installed (`<browser dir>/chromium/chromium`), when there is one.
pub fn fetched_chromium() -> Option<PathBuf> {
    let p = browser_dir()?.join("chromium").join("chromium");
    is_executable(&p).then_some(p)
}

/// The browser the backends start: `$IPFS_ACCELERATE_CHROMIUM` (which must then be executable),
/// then [`fetched_chromium`], then [`system_chromium`].
pub fn find_browser() -> Result<PathBuf, BrowserError> {
    if let Some(value) = std::env::var_os(CHROMIUM_ENV).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(value);
        return if is_executable(&path) {
            Ok(path)
        } else {
            Err(BrowserError::NotFound {
                searched: format!(
                    "{CHROMIUM_ENV}={} is not an executable file",
                    path.display()
                ),
            })
        };
    }
    if let Some(p) = fetched_chromium().or_else(system_chromium) {
        return Ok(p);
    }
    let fetched = browser_dir()
        .map(|d| d.join("chromium").join("chromium").display().to_string())
        .unwrap_or_else(|| "<no home folder>".into());
    Err(BrowserError::NotFound {
        searched: format!(
            "${CHROMIUM_ENV} (unset), {fetched}, {} on PATH, {CHROMIUM_FALLBACK}",
            CHROMIUM_NAMES.join(", ")
        ),
    })
}

/// The folder with onnxruntime-web's files: `$IPFS_ACCELERATE_ORT_WEB`, else
/// `<browser dir>/onnxruntime-web`; every file of [`ORT_WEB_FILES`] must be there.
pub fn find_ort_web() -> Result<PathBuf, BrowserError> {
    let dir = std::env::var_os(ORT_WEB_ENV)
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .or_else(|| browser_dir().map(|d| d.join("onnxruntime-web")))
        .ok_or_else(|| BrowserError::OrtWebMissing {
            dir: "<no home folder>".into(),
            missing: ORT_WEB_FILES.join(", "),
        })?;
    check_ort_web(&dir)?;
    Ok(dir)
}

/// Checks that `dir` holds every file of [`ORT_WEB_FILES`].
pub fn check_ort_web(dir: &Path) -> Result<(), BrowserError> {
    let missing: Vec<&str> = ORT_WEB_FILES
        .iter()
        .copied()
        .filter(|f| !dir.join(f).is_file())
        .collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(BrowserError::OrtWebMissing {
            dir: dir.display().to_string(),
            missing: missing.join(", "),
        })
    }
}
