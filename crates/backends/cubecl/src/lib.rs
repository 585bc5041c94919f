//! # ipfs-accelerate-cubecl
//!
//! What the CubeCL backends (cuda, rocm, wgpu) share.
//!
//! - The persistent kernel cache. CubeCL compiles every kernel at run time (NVRTC to PTX on CUDA,
//!   SPIR-V on Vulkan) and autotunes the matmuls, reductions and convolutions on first use:
//!   seconds to minutes for a model's first call. [`install_kernel_cache`] keeps the compiled
//!   kernels and the autotune results on disk, in [`kernel_cache_dir`], so a later process starts
//!   warm.
//! - [`VendorLibrary`]: the driver / runtime library a probe opens at run time.

use std::path::PathBuf;
use std::sync::Arc;

use cubecl::config::cache::CacheConfig;
use cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};

/// Environment variable naming the kernel cache directory.
pub const KERNEL_CACHE_ENV: &str = "IPFS_ACCELERATE_KERNEL_CACHE";

/// Where compiled kernels and autotune results are kept: `$IPFS_ACCELERATE_KERNEL_CACHE` when
/// set, else `ipfs-accelerate/kernels` in the user's cache directory (`~/.cache` on Linux,
/// `~/Library/Caches` on macOS, `%LOCALAPPDATA%` on Windows), else `None` (no home directory:
/// the cache stays off).
pub fn kernel_cache_dir() -> Option<PathBuf> {
    match std::env::var_os(KERNEL_CACHE_ENV) {
        Some(dir) if !dir.is_empty() => Some(PathBuf::from(dir)),
        _ => dirs::cache_dir().map(|d| d.join("ipfs-accelerate").join("kernels")),
    }
}

/// What [`install_kernel_cache`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelCache {
    /// Compiled kernels and autotune results are kept in this directory.
    Dir(PathBuf),
    /// CubeCL's configuration was already fixed (a `cubecl.toml` / `burn.toml` the process found,
    /// or an earlier call): left as it is.
    AlreadyConfigured,
    /// No cache directory could be named.
    Off,
}

/// Points CubeCL's compilation cache and autotune cache at [`kernel_cache_dir`], before the first
/// CubeCL client is created. Only the cache locations change: a `cubecl.toml` (or `[cubecl]` of
/// a `burn.toml`) in the working directory or above is still read for everything else, and a
/// cache location it sets wins. Idempotent; call it before any CubeCL device is used.
pub fn install_kernel_cache() -> KernelCache {
    let Some(dir) = kernel_cache_dir() else {
        return KernelCache::Off;
    };
    let mut slot = CubeClRuntimeConfig::storage().lock();
    if slot.is_some() {
        return KernelCache::AlreadyConfigured;
    }
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    config
        .compilation
        .cache
        .get_or_insert(CacheConfig::File(dir.clone()));
    // `Target` (CubeCL's default) writes into the nearest cargo `target/`, or the user cache
    // directory outside a cargo project: replace only that default.
    if matches!(config.autotune.cache, CacheConfig::Target) {
        config.autotune.cache = CacheConfig::File(dir.clone());
    }
    *slot = Some(Arc::new(config));
    KernelCache::Dir(dir)
}

/// A GPU vendor's driver or runtime library (`libcuda`, `libamdhip64`), opened at run time so a
/// binary starts, and reports why, on machines without it.
pub struct VendorLibrary {
    lib: libloading::Library,
    api: &'static str,
}

impl VendorLibrary {
    /// Opens the first of `names` that loads; `Err` says "the `what` (names) is not installed".
    pub fn open(names: &[&str], what: &str, api: &'static str) -> Result<Self, String> {
        // SAFETY: loading a vendor library runs its initialisers, which is what every program
        // using that API does.
        names
            .iter()
            .find_map(|name| unsafe { libloading::Library::new(name) }.ok())
            .map(|lib| VendorLibrary { lib, api })
            .ok_or_else(|| format!("the {what} ({}) is not installed", names.join(" / ")))
    }

    /// The function `name` (NUL-terminated) as the C signature `F`.
    ///
    /// # Safety
    /// `F` must be the function's real C signature.
    pub unsafe fn function<F: Copy>(&self, name: &[u8]) -> Result<F, String> {
        self.lib.get::<F>(name).map(|f| *f).map_err(|e| {
            let name = String::from_utf8_lossy(name.strip_suffix(b"\0").unwrap_or(name));
            format!("{} symbol {name}: {e}", self.api)
        })
    }

    /// `Ok` for the API's success code 0, else "`call` failed with <API> error <code>".
    pub fn check(&self, call: &str, code: std::ffi::c_int) -> Result<(), String> {
        if code == 0 {
            Ok(())
        } else {
            Err(format!("{call} failed with {} error {code}", self.api))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cache goes where the environment says, CubeCL's config then names it, and a second
    /// call leaves the installed configuration alone.
    #[test]
    fn cache_dir_is_installed_once() {
        let dir = tempfile::tempdir().unwrap();
        std::env::set_var(KERNEL_CACHE_ENV, dir.path());
        assert_eq!(kernel_cache_dir().as_deref(), Some(dir.path()));
        assert_eq!(install_kernel_cache(), KernelCache::Dir(dir.path().into()));
        let config = CubeClRuntimeConfig::get();
        assert_eq!(
            config.compilation.cache.as_ref().map(|c| c.root()),
            Some(dir.path().to_path_buf())
        );
        assert_eq!(config.autotune.cache.root(), dir.path());
        assert_eq!(install_kernel_cache(), KernelCache::AlreadyConfigured);
    }
}
