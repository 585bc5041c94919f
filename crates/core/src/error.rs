//! The error type of the core crate.

use std::path::PathBuf;

/// Result alias for core operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors raised by the HAL, host tensors and weight sources.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A tensor the model needs is not in the weight file(s).
    #[error("missing tensor `{name}` in {source_name}")]
    MissingTensor {
        /// Full tensor name as stored in the checkpoint.
        name: String,
        /// The file or source that was searched.
        source_name: String,
    },
    /// A tensor exists but its shape is not what the config implies.
    #[error("tensor `{name}` has shape {actual:?}, expected {expected:?}")]
    ShapeMismatch {
        /// Full tensor name.
        name: String,
        /// The shape the config implies.
        expected: Vec<usize>,
        /// The shape found in the file.
        actual: Vec<usize>,
    },
    /// A tensor has a dtype that cannot be used where it is needed.
    #[error("tensor `{name}` has dtype {dtype}, which {context}")]
    UnsupportedDType {
        /// Tensor name.
        name: String,
        /// Its dtype.
        dtype: DTypeName,
        /// What was expected.
        context: String,
    },
    /// A host tensor's byte length does not match its shape and dtype.
    #[error("tensor `{name}`: {len} bytes do not hold shape {shape:?} of {dtype}")]
    BadTensorBytes {
        /// Tensor name.
        name: String,
        /// Byte length found.
        len: usize,
        /// Declared shape.
        shape: Vec<usize>,
        /// Declared dtype.
        dtype: DTypeName,
    },
    /// A config file could not be parsed or holds values the model cannot use.
    #[error("invalid config {path}: {reason}")]
    InvalidConfig {
        /// The config file (or a description of the source).
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The input given to a model is unusable (empty, wrong shape, out of range).
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// A backend cannot be used on this machine.
    #[error("backend {kind} unavailable: {reason}")]
    BackendUnavailable {
        /// The backend.
        kind: String,
        /// Why it is unusable.
        reason: String,
    },
    /// None of the preferred backends can be used.
    #[error("no usable backend among the preferences: {0}")]
    NoBackend(String),
    /// A backend name could not be parsed.
    #[error("unknown backend `{0}` (known: cpu, cuda, rocm, metal, wgpu, webgpu, onnx-<provider>, webnn)")]
    UnknownBackend(String),
    /// An I/O failure with the path involved.
    #[error("{path}: {source}")]
    Io {
        /// The path being read or written.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A backend computation failed.
    #[error("backend computation failed: {0}")]
    Compute(String),
    /// A device could not allocate what a request needs; smaller requests may still run.
    #[error("out of memory on {device}: {what} needs {bytes} bytes ({mib:.1} MiB); try a smaller batch or shorter inputs", mib = *.bytes as f64 / 1048576.0)]
    OutOfMemory {
        /// The device (`cuda:0`).
        device: String,
        /// What was being allocated, with the request's shape.
        what: String,
        /// The allocation's size.
        bytes: u64,
    },
    /// A model output holds NaN or infinite values (typically NaN / infinite weights in the
    /// checkpoint, or an overflow in a reduced precision): reported instead of returning them.
    #[error("the model produced {count} non-finite (NaN or infinite) values of {total} in {output}; check the checkpoint's weights for NaN / inf, or run in a wider precision")]
    NonFinite {
        /// The output (its name, or its shape when the name is not known).
        output: String,
        /// Non-finite values found.
        count: usize,
        /// Values in the output.
        total: usize,
    },
}

/// A dtype name used in error messages.
pub type DTypeName = crate::DType;

impl Error {
    /// Renames the output an [`Error::NonFinite`] names (other errors pass unchanged).
    pub fn for_output(self, name: &str) -> Self {
        match self {
            Error::NonFinite { count, total, .. } => Error::NonFinite {
                output: format!("output `{name}`"),
                count,
                total,
            },
            other => other,
        }
    }

    /// An [`Error::Io`] for `path`.
    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.into(),
            source,
        }
    }

    /// An [`Error::InvalidConfig`] for `path`.
    pub fn config(path: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::InvalidConfig {
            path: path.into(),
            reason: reason.into(),
        }
    }
}
