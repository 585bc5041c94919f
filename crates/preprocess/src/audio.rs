//! Audio preprocessing as HF's feature extractors do it.
//!
//! - [`decode_wav`] / [`read_wav`]: WAV files (8/16/24/32-bit PCM, 32-bit float, any channel
//!   count mixed down to mono) through `hound`.
//! - [`resample`] / [`conform_rate`]: sampling-rate conversion through `rubato`.
//! - [`WhisperFeatureExtractor`]: the log-mel spectrogram of `WhisperFeatureExtractor`
//!   (STFT with `realfft`, Slaney mel filters, log10 clamped 8 below the peak, `(x + 4) / 4`).
//! - [`ClapFeatureExtractor`]: the dB mel spectrogram of `ClapFeatureExtractor` without fusion
//!   (repeat-padding, Slaney mel filters, `power_to_db`), `[frames, mels]`.
//! - [`Wav2Vec2FeatureExtractor`]: padding and zero-mean / unit-variance normalisation of raw
//!   waveforms.
//!
//! Bad audio (not a WAV, empty, NaN samples, the wrong sampling rate, past the crate's
//! [`Limits`](crate::Limits)) is an [`AudioError`], which converts into
//! [`ipfs_accelerate_core::Error`]. Extractors with a window (Whisper, CLAP) cut long inputs to it
//! before resampling (`extract_any_rate`).

mod clap;
mod error;
mod resample;
pub mod spectrogram;
mod wav;
mod wav2vec2;
mod whisper;

pub use clap::{
    ClapFeatureConfig, ClapFeatureExtractor, ClapFeatures, ClapPadding, ClapTruncation,
};
pub use error::{AudioError, AudioResult};
pub use resample::{conform_rate, resample, resample_prefix};
pub use wav::{
    decode_wav, decode_wav_prefix, decode_wav_with_limits, read_wav, read_wav_prefix, Audio,
};
pub use wav2vec2::{
    zero_mean_unit_var, Wav2Vec2FeatureConfig, Wav2Vec2FeatureExtractor, WaveformBatch,
};
pub use whisper::{WhisperFeatureConfig, WhisperFeatureExtractor};

/// A log-mel spectrogram, row-major `[mels, frames]`.
#[derive(Debug, Clone, PartialEq)]
pub struct LogMel {
    /// Mel bins (rows).
    pub mels: usize,
    /// Frames (columns).
    pub frames: usize,
    /// Values.
    pub data: Vec<f32>,
    /// Whether the waveform was longer than the extractor's window and was cut.
    pub truncated: bool,
}
