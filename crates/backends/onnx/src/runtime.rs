//! Finding and loading the ONNX Runtime shared library, once per process.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use crate::OnnxError;

/// Folder holding ONNX Runtime copies (`cpu/`, `openvino/`), as `cargo xtask fetch-ort` lays out.
pub const ORT_DIR_ENV: &str = "IPFS_ACCELERATE_ORT_DIR";

/// The default runtime folder: `$XDG_CACHE_HOME/ipfs-accelerate/onnxruntime`, else
/// `~/.cache/ipfs-accelerate/onnxruntime`.
pub fn default_dir() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("ipfs-accelerate").join("onnxruntime"))
}

/// The ONNX Runtime library this process will load: `ORT_DYLIB_PATH`, else the newest
/// `libonnxruntime.so.*` under `$IPFS_ACCELERATE_ORT_DIR` or [`default_dir`] (its `openvino/`
/// subfolder first, then `cpu/`, then the folder itself).
pub fn library_path() -> Result<PathBuf, OnnxError> {
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(OnnxError::LibraryNotFound {
                searched: format!("ORT_DYLIB_PATH={} does not exist", p.display()),
            })
        };
    }
    let mut searched = Vec::new();
    let roots: Vec<PathBuf> = std::env::var_os(ORT_DIR_ENV)
        .map(PathBuf::from)
        .into_iter()
        .chain(default_dir())
        .collect();
    for root in roots {
        for dir in [root.join("openvino"), root.join("cpu"), root.clone()] {
            searched.push(dir.display().to_string());
            if let Some(lib) = find_library(&dir) {
                return Ok(lib);
            }
        }
    }
    Err(OnnxError::LibraryNotFound {
        searched: format!(
            "ORT_DYLIB_PATH unset; no libonnxruntime in {}",
            searched.join(", ")
        ),
    })
}

/// The versioned `libonnxruntime` file in `dir` (the highest version when there are several).
fn find_library(dir: &Path) -> Option<PathBuf> {
    let prefix = format!(
        "{}onnxruntime{}",
        std::env::consts::DLL_PREFIX,
        std::env::consts::DLL_SUFFIX
    );
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.is_file()
                && p.file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.starts_with(&prefix))
        })
        .collect();
    found.sort();
    found.pop()
}

/// The loaded ONNX Runtime: its library, version, providers and the process's environment.
pub struct OnnxRuntime {
    library: PathBuf,
    version: String,
    providers: Vec<String>,
    environment: ort::environment::Environment,
}

impl std::fmt::Debug for OnnxRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxRuntime")
            .field("library", &self.library)
            .field("version", &self.version)
            .field("providers", &self.providers)
            .finish()
    }
}

impl OnnxRuntime {
    /// The library file.
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// ONNX Runtime's version string.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// The execution providers this runtime build has (ONNX Runtime's names).
    pub fn providers(&self) -> &[String] {
        &self.providers
    }

    /// The process-wide environment sessions are created in.
    pub fn environment(&self) -> &ort::environment::Environment {
        &self.environment
    }
}

static RUNTIME: OnceLock<Result<OnnxRuntime, String>> = OnceLock::new();

/// Loads ONNX Runtime (once per process) and reports what it offers. A failure is remembered: no
/// later call touches the library again.
pub fn runtime() -> Result<&'static OnnxRuntime, OnnxError> {
    RUNTIME
        .get_or_init(|| load().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|reason| match load_error_kind(reason) {
            Some(searched) => OnnxError::LibraryNotFound { searched },
            None => OnnxError::BadLibrary {
                path: library_path()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
                reason: reason.clone(),
            },
        })
}

const NOT_FOUND_TAG: &str = "not-found: ";

fn load_error_kind(reason: &str) -> Option<String> {
    reason.strip_prefix(NOT_FOUND_TAG).map(str::to_string)
}

fn load() -> Result<OnnxRuntime, String> {
    let library = library_path().map_err(|e| match e {
        OnnxError::LibraryNotFound { searched } => format!("{NOT_FOUND_TAG}{searched}"),
        other => other.to_string(),
    })?;
    // Everything after a successful init_from may use the ort API; nothing before it does.
    let builder = ort::init_from(&library).map_err(|e| e.to_string())?;
    let environment = builder
        .with_name("ipfs-accelerate")
        .build()
        .map_err(|e| e.to_string())?;
    let version = ort_version();
    let providers = available_providers().map_err(|e| e.to_string())?;
    Ok(OnnxRuntime {
        library,
        version,
        providers,
        environment,
    })
}

fn ort_version() -> String {
    // SAFETY: the runtime is loaded; GetVersionString returns a static NUL-terminated string.
    unsafe {
        let base = (ort::api().GetBuildInfoString)();
        let build = std::ffi::CStr::from_ptr(base)
            .to_string_lossy()
            .into_owned();
        // "ORT Build Info: git-branch=rel-1.24.1, ..." → "1.24.1"
        build
            .split("git-branch=rel-")
            .nth(1)
            .and_then(|r| r.split(',').next())
            .map(str::to_string)
            .unwrap_or(build)
    }
}

fn available_providers() -> ort::Result<Vec<String>> {
    let mut list: *mut *mut std::ffi::c_char = std::ptr::null_mut();
    let mut count: std::ffi::c_int = 0;
    // SAFETY: the runtime is loaded; the list is released with the matching call below.
    unsafe {
        let status = (ort::api().GetAvailableProviders)(&mut list, &mut count);
        if !status.0.is_null() {
            (ort::api().ReleaseStatus)(status.0);
            return Ok(Vec::new());
        }
        let mut out = Vec::with_capacity(count.max(0) as usize);
        for i in 0..count.max(0) as usize {
            let p = *list.add(i);
            if !p.is_null() {
                out.push(std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned());
            }
        }
        let _ = (ort::api().ReleaseAvailableProviders)(list, count);
        Ok(out)
    }
}
