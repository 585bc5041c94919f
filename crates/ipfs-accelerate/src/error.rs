//! The facade's error type: every crate's errors, converted.

/// Result alias of the facade.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in a pipeline.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// HAL, weights, shapes, config, input validation.
    #[error(transparent)]
    Core(#[from] ipfs_accelerate_core::Error),
    /// Locating or reading model files.
    #[error(transparent)]
    Io(#[from] ipfs_accelerate_io::IoError),
    /// Tokenisation and other preprocessing.
    #[error(transparent)]
    Preprocess(#[from] ipfs_accelerate_preprocess::PreprocessError),
    /// The model's family or task is not supported by this build.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// Every usable backend failed to load the model.
    #[error("no backend could load the model: {0}")]
    LoadFailed(String),
}
