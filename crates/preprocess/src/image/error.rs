//! The error type of image preprocessing.

use std::path::PathBuf;

use crate::limits::LimitExceeded;

/// Errors raised while decoding or preprocessing images.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    /// The image file could not be read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not an image of a supported format (PNG, JPEG).
    #[error("unsupported image format: {0}")]
    UnsupportedFormat(String),
    /// The image is corrupt or truncated.
    #[error("cannot decode image: {0}")]
    Decode(String),
    /// The image has no pixels.
    #[error("empty image: {width}x{height} pixels")]
    Empty {
        /// Width in pixels.
        width: usize,
        /// Height in pixels.
        height: usize,
    },
    /// The header declares dimensions beyond [`Limits`](crate::Limits) (checked before decoding).
    #[error("image of {width}x{height} pixels: {limit}")]
    TooLarge {
        /// Declared width.
        width: u64,
        /// Declared height.
        height: u64,
        /// The bound that was exceeded.
        limit: LimitExceeded,
    },
    /// A size from a config or computed from one is past one of the [`Limits`](crate::Limits).
    #[error(transparent)]
    Limit(#[from] LimitExceeded),
    /// `preprocessor_config.json` is unreadable or holds values that cannot be used.
    #[error("invalid image processor config {origin}: {reason}")]
    Config {
        /// Where the config came from.
        origin: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Arguments that cannot be processed (mismatched buffer, zero-sized target, unbatchable sizes).
    #[error("invalid image input: {0}")]
    InvalidInput(String),
}

impl From<ImageError> for ipfs_accelerate_core::Error {
    fn from(e: ImageError) -> Self {
        match e {
            ImageError::Io { path, source } => ipfs_accelerate_core::Error::Io { path, source },
            ImageError::Config { origin, reason } => ipfs_accelerate_core::Error::InvalidConfig {
                path: PathBuf::from(origin),
                reason,
            },
            other => ipfs_accelerate_core::Error::InvalidInput(other.to_string()),
        }
    }
}

/// Result alias of image preprocessing.
pub type ImageResult<T> = std::result::Result<T, ImageError>;
