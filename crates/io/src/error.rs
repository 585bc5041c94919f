//! Errors of the io crate.

use std::path::PathBuf;

/// Errors raised while locating or reading model files.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// A file could not be opened or read.
    #[error("{path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A safetensors file is malformed (truncated, header lying about sizes, bad JSON, ...).
    #[error("malformed safetensors file {path}: {reason}")]
    MalformedSafetensors {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A small JSON settings file (such as `random_init.json`) is unreadable or has invalid values.
    #[error("invalid settings file {path}: {reason}")]
    InvalidConfig {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A GGUF file is malformed (bad magic, unsupported version, truncated, counts or offsets out
    /// of range, unknown tensor type, non-UTF-8 string, ...).
    #[error("malformed GGUF file {path}: {reason}")]
    MalformedGguf {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// Quantized tensor data cannot be dequantized (unsupported type, length not a whole number of
    /// blocks).
    #[error("cannot dequantize {ty} data: {reason}")]
    Dequantize {
        /// The ggml type name.
        ty: String,
        /// What is wrong.
        reason: String,
    },
    /// A GGUF file's tokenizer metadata is missing, inconsistent or of an unsupported kind.
    #[error("cannot build the tokenizer of GGUF file {path}: {reason}")]
    GgufTokenizer {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// A model file is not available locally and cannot be downloaded.
    #[error("model file `{file}` of `{model}` not found: {reason}. Download it elsewhere and point {env_var} (or --model) at a local directory holding it")]
    NotFound {
        /// The model id or path.
        model: String,
        /// The file name.
        file: String,
        /// What was tried.
        reason: String,
        /// The environment variable that names a local copy.
        env_var: &'static str,
    },
    /// A hub download failed.
    #[error("download of `{file}` from `{model}` failed: {reason}")]
    Download {
        /// The model id.
        model: String,
        /// The file.
        file: String,
        /// The error.
        reason: String,
    },
    /// A file name, model id or revision taken from a command line or a model's metadata would
    /// leave the model folder or the cache (an absolute path, `..`, a separator where a plain
    /// name is expected, ...). Nothing was opened.
    #[error("refusing {what} `{value}` of `{model}`: {reason}")]
    UnsafeName {
        /// What the value is (`file name`, `model id`, `revision`, ...).
        what: &'static str,
        /// The value as given.
        value: String,
        /// The model it came from.
        model: String,
        /// Why it is refused.
        reason: String,
    },
    /// An error from the core crate (missing tensor, shape, dtype).
    #[error(transparent)]
    Core(#[from] ipfs_accelerate_core::Error),
}

impl IoError {
    pub(crate) fn read(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        IoError::Read {
            path: path.into(),
            source,
        }
    }
}

impl From<IoError> for ipfs_accelerate_core::Error {
    fn from(e: IoError) -> Self {
        match e {
            IoError::Core(c) => c,
            IoError::Read { path, source } => ipfs_accelerate_core::Error::Io { path, source },
            other => ipfs_accelerate_core::Error::InvalidInput(other.to_string()),
        }
    }
}
