//! The error type of audio preprocessing.

use std::path::PathBuf;

use crate::limits::LimitExceeded;

/// Errors raised while decoding, resampling or featurising audio.
#[derive(Debug, thiserror::Error)]
pub enum AudioError {
    /// Reading an audio or config file failed.
    #[error("{path}: {source}")]
    Io {
        /// The path that could not be read.
        path: PathBuf,
        /// What the operating system reported.
        #[source]
        source: std::io::Error,
    },
    /// The bytes are not a readable WAV file (not RIFF/WAVE, corrupt or truncated).
    #[error("cannot decode WAV audio: {0}")]
    Decode(String),
    /// A WAV encoding this crate does not read (for example 64-bit float or 12-bit PCM).
    #[error("unsupported WAV encoding: {0}")]
    Unsupported(String),
    /// There are no samples.
    #[error("empty audio: {0}")]
    Empty(String),
    /// A sample is NaN or infinite.
    #[error("audio sample {index} is not finite ({value})")]
    NonFinite {
        /// Position of the first bad sample.
        index: usize,
        /// Its value.
        value: f32,
    },
    /// The audio's sampling rate differs from the one the feature extractor expects and
    /// resampling was not requested.
    #[error(
        "audio is sampled at {got} Hz but the feature extractor expects {expected} Hz \
         (resample it first)"
    )]
    SampleRate {
        /// The rate the extractor was built for.
        expected: u32,
        /// The rate of the audio.
        got: u32,
    },
    /// Resampling failed.
    #[error("resampling failed: {0}")]
    Resample(String),
    /// A signal transform (FFT) failed.
    #[error("signal transform failed: {0}")]
    Transform(String),
    /// A size from a header or config, or a duration, is past one of the
    /// [`Limits`](crate::Limits).
    #[error(transparent)]
    Limit(#[from] LimitExceeded),
    /// `preprocessor_config.json` is unreadable or holds values that cannot be used.
    #[error("invalid audio feature extractor config {origin}: {reason}")]
    Config {
        /// Where the config came from.
        origin: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Result alias for audio preprocessing.
pub type AudioResult<T> = Result<T, AudioError>;

impl From<AudioError> for ipfs_accelerate_core::Error {
    fn from(e: AudioError) -> Self {
        match e {
            AudioError::Io { path, source } => ipfs_accelerate_core::Error::Io { path, source },
            AudioError::Config { origin, reason } => ipfs_accelerate_core::Error::InvalidConfig {
                path: PathBuf::from(origin),
                reason,
            },
            other => ipfs_accelerate_core::Error::InvalidInput(other.to_string()),
        }
    }
}

/// The text of a config file, a read failure being [`AudioError::Io`].
pub(crate) fn read_text(path: &std::path::Path) -> AudioResult<String> {
    std::fs::read_to_string(path).map_err(|source| AudioError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// An [`AudioError::Config`] of the config from `origin`.
pub(crate) fn config_error<T>(origin: &str, reason: String) -> AudioResult<T> {
    Err(AudioError::Config {
        origin: origin.to_string(),
        reason,
    })
}

/// [`AudioError::Config`] naming the first of `sizes` (name, value) that is zero.
pub(crate) fn require_positive(origin: &str, sizes: &[(&str, usize)]) -> AudioResult<()> {
    match sizes.iter().find(|(_, v)| *v == 0) {
        Some((name, _)) => config_error(origin, format!("`{name}` must be positive")),
        None => Ok(()),
    }
}

/// The first non-finite sample, as an error.
pub(crate) fn check_finite(samples: &[f32]) -> AudioResult<()> {
    match samples.iter().position(|v| !v.is_finite()) {
        Some(index) => Err(AudioError::NonFinite {
            index,
            value: samples[index],
        }),
        None => Ok(()),
    }
}
