//! Finding and loading `libduckdb` at run time.

use std::ffi::CStr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::ffi::Api;
use crate::DbError;

/// A file path to the DuckDB library, searched first.
pub const DUCKDB_ENV: &str = "IPFS_ACCELERATE_DUCKDB";
/// A folder holding `libduckdb.so` (where `cargo xtask fetch-duckdb --dir` puts it), searched second.
pub const DUCKDB_DIR_ENV: &str = "IPFS_ACCELERATE_DUCKDB_DIR";
/// Set to `1` to make tests fail, instead of skipping, when the library is absent (CI sets it).
pub const REQUIRE_ENV: &str = "IPFS_ACCELERATE_REQUIRE_DUCKDB";
/// The library's file name in a folder and for the system loader.
pub const LIBRARY_FILE: &str = "libduckdb.so";
/// The npm package (and version) whose tarball holds `package/libduckdb.so` for linux-x64.
pub const NPM_PACKAGE: &str = "@duckdb/node-bindings-linux-x64@1.5.6-r.1";

/// The default library folder: `$XDG_CACHE_HOME/ipfs-accelerate/duckdb`, else
/// `~/.cache/ipfs-accelerate/duckdb`; `None` without a home folder.
pub fn default_dir() -> Option<PathBuf> {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(cache.join("ipfs-accelerate").join("duckdb"))
}

/// A loaded DuckDB library. Cloning is cheap (the library stays loaded while any clone, or any
/// database opened with it, lives).
#[derive(Clone)]
pub struct Library {
    pub(crate) api: Arc<Api>,
    path: String,
}

impl std::fmt::Debug for Library {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Library")
            .field("path", &self.path)
            .field("version", &self.version())
            .finish()
    }
}

impl Library {
    /// Loads the DuckDB library file at `path`. A path that is not a file gives
    /// [`DbError::LibraryNotFound`]; a file that is not a usable DuckDB gives [`DbError::LibraryLoad`].
    pub fn load(path: impl AsRef<Path>) -> Result<Library, DbError> {
        let path = path.as_ref();
        if !path.is_file() {
            return Err(DbError::LibraryNotFound {
                searched: vec![path.display().to_string()],
            });
        }
        Self::load_name(path.as_os_str(), path.display().to_string())
    }

    /// Finds and loads the library: `$IPFS_ACCELERATE_DUCKDB` (a file), then
    /// `$IPFS_ACCELERATE_DUCKDB_DIR/libduckdb.so`, then `libduckdb.so` in [`default_dir`], then
    /// the system loader's search (`libduckdb.so` on `LD_LIBRARY_PATH` and the system folders).
    /// The first file that exists is loaded (an error loading it is returned, not skipped).
    pub fn find() -> Result<Library, DbError> {
        let mut searched = Vec::new();
        let mut candidates: Vec<(String, PathBuf)> = Vec::new();
        if let Some(p) = std::env::var_os(DUCKDB_ENV).filter(|p| !p.is_empty()) {
            candidates.push((format!("${DUCKDB_ENV}"), PathBuf::from(p)));
        }
        if let Some(d) = std::env::var_os(DUCKDB_DIR_ENV).filter(|p| !p.is_empty()) {
            candidates.push((
                format!("${DUCKDB_DIR_ENV}"),
                PathBuf::from(d).join(LIBRARY_FILE),
            ));
        }
        if let Some(d) = default_dir() {
            candidates.push(("default folder".into(), d.join(LIBRARY_FILE)));
        }
        for (what, path) in candidates {
            if path.is_file() {
                return Self::load(&path);
            }
            searched.push(format!("{} ({what})", path.display()));
        }
        match Self::load_name(LIBRARY_FILE.as_ref(), LIBRARY_FILE.to_string()) {
            Ok(lib) => Ok(lib),
            Err(DbError::LibraryLoad { message, .. }) => {
                searched.push(format!("{LIBRARY_FILE} (system loader: {message})"));
                Err(DbError::LibraryNotFound { searched })
            }
            Err(e) => Err(e),
        }
    }

    /// `dlopen`s `name` (a path or a bare name for the system loader) and resolves the C API.
    fn load_name(name: &std::ffi::OsStr, shown: String) -> Result<Library, DbError> {
        // SAFETY: loading runs the library's initialisers; `name` is a DuckDB library chosen by
        // the user (or found in the folders documented above), whose initialisers are sound.
        let lib = unsafe { libloading::Library::new(name) }.map_err(|e| DbError::LibraryLoad {
            path: shown.clone(),
            message: e.to_string(),
        })?;
        let api = Api::resolve(lib).map_err(|message| DbError::LibraryLoad {
            path: shown.clone(),
            message: format!("{message} (not a DuckDB >= 1.0 library?)"),
        })?;
        Ok(Library {
            api: Arc::new(api),
            path: shown,
        })
    }

    /// The path (or system-loader name) the library was loaded from.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// DuckDB's version string (`v1.5.6`).
    pub fn version(&self) -> String {
        // SAFETY: duckdb_library_version takes no arguments and returns a static NUL-terminated
        // string (or, defensively, null, which is checked).
        let p = unsafe { (self.api.library_version)() };
        if p.is_null() {
            return String::new();
        }
        // SAFETY: `p` is non-null and points to a static C string owned by the library.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// Whether `$IPFS_ACCELERATE_REQUIRE_DUCKDB` is `1`.
pub fn library_required() -> bool {
    std::env::var(REQUIRE_ENV).as_deref() == Ok("1")
}

/// For tests and tools that need DuckDB: [`Library::find`]'s library; when it cannot be loaded,
/// `Ok(None)` after printing why `test` is skipped, or the error when
/// `$IPFS_ACCELERATE_REQUIRE_DUCKDB=1` ([`library_required`]).
pub fn find_for_test(test: &str) -> Result<Option<Library>, DbError> {
    match Library::find() {
        Ok(lib) => Ok(Some(lib)),
        Err(e) if library_required() => Err(e),
        Err(e) => {
            eprintln!("skipping {test}: {e} (set {REQUIRE_ENV}=1 to make this a failure)");
            Ok(None)
        }
    }
}
