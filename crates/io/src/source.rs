//! Resolving a model name to local files: a directory, the HF cache, or a hub download.

use std::path::{Path, PathBuf};

use crate::IoError;

/// The environment variable that points at a directory of local model copies
/// (`$IPFS_ACCELERATE_MODELS/<org>/<name>/config.json`).
pub const MODELS_ENV: &str = "IPFS_ACCELERATE_MODELS";

/// The longest file name, model id segment and revision accepted (HF's own limits are lower).
const MAX_NAME_LEN: usize = 1024;

/// Checks a file name that comes from a caller or from a model's metadata (the shards of
/// `model.safetensors.index.json`, processor files, ...): a relative path of plain components
/// separated by `/` (`model.safetensors`, `onnx/model.onnx`, `1_Pooling/config.json`). Absolute
/// paths, `..` and `.` components, empty components, backslashes, drive prefixes and control
/// characters are refused, so a joined name never leaves the model folder or the cache snapshot.
pub fn check_file_name(model: &str, name: &str) -> Result<(), IoError> {
    let refuse = |reason: &str| {
        Err(IoError::UnsafeName {
            what: "file name",
            value: name.chars().take(200).collect(),
            model: model.to_string(),
            reason: reason.to_string(),
        })
    };
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return refuse("a file name must have 1 to 1024 bytes");
    }
    if name
        .chars()
        .any(|c| c.is_control() || c == '\\' || c == ':')
    {
        return refuse("control characters, `\\` and `:` are not allowed in a file name");
    }
    if name.starts_with('/') || Path::new(name).is_absolute() {
        return refuse("absolute paths are not allowed; name a file inside the model folder");
    }
    if name
        .split('/')
        .any(|c| c.is_empty() || c == "." || c == "..")
    {
        return refuse("empty, `.` and `..` path components are not allowed");
    }
    Ok(())
}

/// Checks a hub repository id: `name` or `org/name`, each part 1 to 96 characters of ASCII
/// letters, digits, `-`, `_` and `.`, not starting with `-` or `.`, without `--` or `..` (the
/// hub's own rules; the HF cache folder name joins the parts with `--`).
pub fn check_model_id(id: &str) -> Result<(), IoError> {
    let refuse = |reason: &str| {
        Err(IoError::UnsafeName {
            what: "model id",
            value: id.chars().take(200).collect(),
            model: id.chars().take(200).collect(),
            reason: reason.to_string(),
        })
    };
    let parts: Vec<&str> = id.split('/').collect();
    if parts.len() > 2 {
        return refuse(
            "a hub id is `name` or `org/name`; a local folder must exist (or start with ./ or /)",
        );
    }
    for part in parts {
        if part.is_empty() || part.len() > 96 {
            return refuse("each part of a hub id has 1 to 96 characters");
        }
        if !part
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return refuse("a hub id has only ASCII letters, digits, `-`, `_`, `.` and one `/`");
        }
        if part.starts_with(['-', '.']) || part.contains("--") || part.contains("..") {
            return refuse("a hub id part may not start with `-` or `.` nor contain `--` or `..`");
        }
    }
    Ok(())
}

/// Checks a revision (branch, tag, `refs/pr/N` or commit hash) before it names a folder of the HF
/// cache or reaches the hub client: 1 to 256 characters of ASCII letters, digits, `-`, `_`, `.`,
/// `/`, with no empty, `.`-leading or `..` components.
pub fn check_revision(model: &str, revision: &str) -> Result<(), IoError> {
    let refuse = |reason: &str| {
        Err(IoError::UnsafeName {
            what: "revision",
            value: revision.chars().take(200).collect(),
            model: model.to_string(),
            reason: reason.to_string(),
        })
    };
    if revision.is_empty() || revision.len() > 256 {
        return refuse("a revision has 1 to 256 characters");
    }
    if !revision
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
    {
        return refuse("a revision has only ASCII letters, digits, `-`, `_`, `.` and `/`");
    }
    if revision
        .split('/')
        .any(|c| c.is_empty() || c.starts_with('.'))
    {
        return refuse("a revision may not have empty components or components starting with `.`");
    }
    Ok(())
}

/// Where a model comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelSource {
    /// A local directory holding config.json and the weights.
    Dir(PathBuf),
    /// A hub repository id (`sentence-transformers/all-MiniLM-L6-v2`) at a revision.
    Hub {
        /// Repository id.
        id: String,
        /// Branch, tag or commit (`main` by default).
        revision: String,
    },
}

impl ModelSource {
    /// Interprets `spec`: an existing path, or anything written as a path (`/…`, `./…`, `../…`,
    /// `~/…`), is a directory; anything else a hub id (`org/name` or `org/name@revision`).
    pub fn parse(spec: &str) -> ModelSource {
        let path = Path::new(spec);
        let looks_like_path = ["/", "./", "../", "~/", "\\"]
            .iter()
            .any(|p| spec.starts_with(p))
            || spec == "."
            || spec == "..";
        if path.exists() || looks_like_path {
            return ModelSource::Dir(path.to_path_buf());
        }
        match spec.split_once('@') {
            Some((id, rev)) => ModelSource::Hub {
                id: id.to_string(),
                revision: rev.to_string(),
            },
            None => ModelSource::Hub {
                id: spec.to_string(),
                revision: "main".to_string(),
            },
        }
    }
}

/// How to resolve hub models.
#[derive(Debug, Clone)]
pub struct ResolveOptions {
    /// Never touch the network (also set by `HF_HUB_OFFLINE=1`).
    pub offline: bool,
    /// Show download progress bars.
    pub progress: bool,
    /// Override of the HF cache directory (default: `HF_HUB_CACHE`, `HUGGINGFACE_HUB_CACHE`,
    /// `$HF_HOME/hub`, `~/.cache/huggingface/hub`).
    pub cache_dir: Option<PathBuf>,
}

impl Default for ResolveOptions {
    fn default() -> Self {
        let offline = std::env::var("HF_HUB_OFFLINE")
            .map(|v| v == "1" || v.eq_ignore_ascii_case("true"))
            .unwrap_or(false);
        ResolveOptions {
            offline,
            progress: true,
            cache_dir: None,
        }
    }
}

/// A resolved model: a way to get each of its files as a local path.
#[derive(Debug, Clone)]
pub struct ModelFiles {
    source: ModelSource,
    local_dir: Option<PathBuf>,
    options: ResolveOptions,
}

impl ModelFiles {
    /// The files of a local checkpoint folder (no cache, no network).
    pub fn local(dir: &Path) -> Result<Self, IoError> {
        if !dir.is_dir() {
            return Err(IoError::NotFound {
                model: dir.display().to_string(),
                file: "config.json".into(),
                reason: "no such directory".into(),
                env_var: MODELS_ENV,
            });
        }
        Ok(ModelFiles {
            source: ModelSource::Dir(dir.to_path_buf()),
            local_dir: Some(dir.to_path_buf()),
            options: ResolveOptions {
                offline: true,
                progress: false,
                cache_dir: None,
            },
        })
    }

    /// The source this was resolved from.
    pub fn source(&self) -> &ModelSource {
        &self.source
    }

    /// A readable name for messages.
    pub fn display_name(&self) -> String {
        match &self.source {
            ModelSource::Dir(d) => d.display().to_string(),
            ModelSource::Hub { id, .. } => id.clone(),
        }
    }

    /// The local path of `file` (downloading it if needed and allowed).
    ///
    /// `file` must be a relative name inside the model ([`check_file_name`]); in the HF cache the
    /// resolved file must also stay inside the repository's cache folder.
    pub fn get(&self, file: &str) -> Result<PathBuf, IoError> {
        check_file_name(&self.display_name(), file)?;
        if let Some(dir) = &self.local_dir {
            let p = dir.join(file);
            return if p.is_file() {
                Ok(p)
            } else {
                Err(IoError::NotFound {
                    model: self.display_name(),
                    file: file.to_string(),
                    reason: format!("no such file in {}", dir.display()),
                    env_var: MODELS_ENV,
                })
            };
        }
        let ModelSource::Hub { id, revision } = &self.source else {
            unreachable!("directory sources always have a local_dir")
        };
        let cache = hf_cache_dir(&self.options);
        if let Some(p) = cached_file(&cache, id, revision, file)? {
            return Ok(p);
        }
        if self.options.offline {
            return Err(IoError::NotFound {
                model: id.clone(),
                file: file.to_string(),
                reason: format!(
                    "offline (HF_HUB_OFFLINE) and not in the HF cache at {}",
                    cache.display()
                ),
                env_var: MODELS_ENV,
            });
        }
        download(id, revision, file, &cache, self.options.progress)
    }

    /// `file` if it exists, `None` if the model simply does not have it; other errors propagate.
    pub fn get_optional(&self, file: &str) -> Result<Option<PathBuf>, IoError> {
        match self.get(file) {
            Ok(p) => Ok(Some(p)),
            Err(IoError::NotFound { .. }) if self.local_dir.is_some() => Ok(None),
            Err(IoError::Download { reason, .. }) if reason.contains("404") => Ok(None),
            Err(IoError::NotFound { .. }) if self.options.offline => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The safetensors weight files: `model.safetensors`, or the shards listed in
    /// `model.safetensors.index.json`.
    pub fn weight_files(&self) -> Result<Vec<PathBuf>, IoError> {
        if let Some(single) = self.get_optional("model.safetensors")? {
            return Ok(vec![single]);
        }
        let index_path = self.get("model.safetensors.index.json")?;
        let text =
            std::fs::read_to_string(&index_path).map_err(|e| IoError::read(&index_path, e))?;
        let index: serde_json::Value =
            serde_json::from_str(&text).map_err(|e| IoError::MalformedSafetensors {
                path: index_path.clone(),
                reason: e.to_string(),
            })?;
        let map = index
            .get("weight_map")
            .and_then(|m| m.as_object())
            .ok_or_else(|| IoError::MalformedSafetensors {
                path: index_path.clone(),
                reason: "no `weight_map` object".into(),
            })?;
        let mut shards: Vec<String> = map
            .values()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect();
        shards.sort();
        shards.dedup();
        shards.iter().map(|s| self.get(s)).collect()
    }
}

/// Resolves `spec` (a directory, `$IPFS_ACCELERATE_MODELS/<spec>`, or a hub id).
pub fn resolve(spec: &str, options: ResolveOptions) -> Result<ModelFiles, IoError> {
    let mut source = ModelSource::parse(spec);
    if let ModelSource::Hub { id, revision } = &source {
        check_model_id(id)?;
        check_revision(id, revision)?;
        if let Some(dir) = std::env::var_os(MODELS_ENV).map(|d| PathBuf::from(d).join(id)) {
            if dir.is_dir() {
                source = ModelSource::Dir(dir);
            }
        }
    }
    let local_dir = match &source {
        ModelSource::Dir(d) if d.is_dir() => Some(d.clone()),
        ModelSource::Dir(d) => {
            return Err(IoError::NotFound {
                model: d.display().to_string(),
                file: "config.json".into(),
                reason: "no such directory".into(),
                env_var: MODELS_ENV,
            })
        }
        ModelSource::Hub { .. } => None,
    };
    Ok(ModelFiles {
        source,
        local_dir,
        options,
    })
}

fn hf_cache_dir(options: &ResolveOptions) -> PathBuf {
    if let Some(d) = &options.cache_dir {
        return d.clone();
    }
    for var in ["HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"] {
        if let Some(v) = std::env::var_os(var) {
            return PathBuf::from(v);
        }
    }
    if let Some(home) = std::env::var_os("HF_HOME") {
        return PathBuf::from(home).join("hub");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_default();
    home.join(".cache").join("huggingface").join("hub")
}

/// Looks a file up in the HF cache layout:
/// `<cache>/models--org--name/{refs/<revision>, snapshots/<commit>/<file>}`. The commit a ref
/// file names is checked like a revision, and the file (a symbolic link into `blobs/` as the hub
/// client writes it) must resolve inside the repository's cache folder.
fn cached_file(
    cache: &Path,
    id: &str,
    revision: &str,
    file: &str,
) -> Result<Option<PathBuf>, IoError> {
    let repo = cache.join(format!("models--{}", id.replace('/', "--")));
    let commit = std::fs::read_to_string(repo.join("refs").join(revision))
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| revision.to_string());
    check_revision(id, &commit)?;
    let p = repo.join("snapshots").join(&commit).join(file);
    if !p.is_file() {
        return Ok(None);
    }
    let inside = match (p.canonicalize(), repo.canonicalize()) {
        (Ok(target), Ok(root)) => target.starts_with(root),
        _ => false,
    };
    if !inside {
        return Err(IoError::UnsafeName {
            what: "cached file",
            value: p.display().to_string(),
            model: id.to_string(),
            reason: format!("it resolves outside the cache folder {}", repo.display()),
        });
    }
    Ok(Some(p))
}

#[cfg(feature = "hub")]
fn download(
    id: &str,
    revision: &str,
    file: &str,
    cache: &Path,
    progress: bool,
) -> Result<PathBuf, IoError> {
    use hf_hub::api::sync::ApiBuilder;
    use hf_hub::{Repo, RepoType};
    let err = |reason: String| IoError::Download {
        model: id.to_string(),
        file: file.to_string(),
        reason,
    };
    let api = ApiBuilder::new()
        .with_cache_dir(cache.to_path_buf())
        .with_progress(progress)
        .build()
        .map_err(|e| err(e.to_string()))?;
    let repo = api.repo(Repo::with_revision(
        id.to_string(),
        RepoType::Model,
        revision.to_string(),
    ));
    tracing::info!(model = id, file, "downloading from the hub");
    repo.get(file).map_err(|e| {
        err(format!(
            "{e} (offline? set HF_HUB_OFFLINE=1 and point {MODELS_ENV} or --model at a local copy)"
        ))
    })
}

#[cfg(not(feature = "hub"))]
fn download(
    id: &str,
    _revision: &str,
    file: &str,
    cache: &Path,
    _progress: bool,
) -> Result<PathBuf, IoError> {
    Err(IoError::NotFound {
        model: id.to_string(),
        file: file.to_string(),
        reason: format!(
            "not in the HF cache at {} and this build has no hub support (feature `hub`)",
            cache.display()
        ),
        env_var: MODELS_ENV,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_dir_and_cache_layout() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("config.json"), "{}").unwrap();
        let files = resolve(tmp.path().to_str().unwrap(), ResolveOptions::default()).unwrap();
        assert!(files.get("config.json").unwrap().ends_with("config.json"));
        let err = files.get("model.safetensors").unwrap_err().to_string();
        assert!(
            err.contains("model.safetensors") && err.contains(MODELS_ENV),
            "{err}"
        );

        // HF cache layout, offline.
        let cache = tempfile::tempdir().unwrap();
        let repo = cache.path().join("models--org--tiny");
        std::fs::create_dir_all(repo.join("refs")).unwrap();
        std::fs::create_dir_all(repo.join("snapshots/abc123")).unwrap();
        std::fs::write(repo.join("refs/main"), "abc123\n").unwrap();
        std::fs::write(repo.join("snapshots/abc123/config.json"), "{}").unwrap();
        let options = ResolveOptions {
            offline: true,
            progress: false,
            cache_dir: Some(cache.path().to_path_buf()),
        };
        let files = resolve("org/tiny", options).unwrap();
        assert!(files.get("config.json").unwrap().is_file());
        let err = files.get("model.safetensors").unwrap_err().to_string();
        assert!(
            err.contains("offline") && err.contains("model.safetensors"),
            "{err}"
        );
        assert_eq!(files.get_optional("tokenizer.json").unwrap(), None);
    }
}
