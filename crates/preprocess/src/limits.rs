//! Resource limits on everything a file or a config can make preprocessing allocate or compute.
//!
//! Every size that comes from an image header, a WAV header or a `preprocessor_config.json` is
//! checked against a [`Limits`] before anything is allocated from it; going past one is a
//! [`LimitExceeded`] error (inside [`ImageError::Limit`](crate::image::ImageError::Limit) or
//! [`AudioError::Limit`](crate::audio::AudioError::Limit)) naming the limit, the value seen and
//! how to raise it. See the crate documentation for the table of limits and defaults.
//!
//! The limits in force are [`Limits::current`]: those set with [`Limits::set_current`], else the
//! defaults overridden by the `IPFS_ACCELERATE_MAX_*` / `IPFS_ACCELERATE_MIN_*` environment
//! variables (read once). Constructors named `with_limits` take explicit limits instead.

use std::sync::{OnceLock, RwLock};

/// One of the limits of [`Limits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Limit {
    /// [`Limits::max_image_pixels`].
    ImagePixels,
    /// [`Limits::max_image_side`].
    ImageSide,
    /// [`Limits::max_output_side`].
    OutputSide,
    /// [`Limits::max_output_pixels`].
    OutputPixels,
    /// [`Limits::max_anyres_views`].
    AnyresViews,
    /// [`Limits::min_sample_rate`].
    MinSampleRate,
    /// [`Limits::max_sample_rate`].
    MaxSampleRate,
    /// [`Limits::max_audio_secs`].
    AudioSecs,
    /// [`Limits::max_wav2vec2_secs`].
    Wav2Vec2Secs,
    /// [`Limits::max_n_fft`].
    NFft,
    /// [`Limits::max_mel_bins`].
    MelBins,
    /// [`Limits::max_spectrogram_frames`].
    SpectrogramFrames,
    /// [`Limits::max_video_frames`].
    VideoFrames,
}

impl Limit {
    /// Every limit, in the order of the documentation table.
    pub const ALL: [Limit; 13] = [
        Limit::ImagePixels,
        Limit::ImageSide,
        Limit::OutputSide,
        Limit::OutputPixels,
        Limit::AnyresViews,
        Limit::MinSampleRate,
        Limit::MaxSampleRate,
        Limit::AudioSecs,
        Limit::Wav2Vec2Secs,
        Limit::NFft,
        Limit::MelBins,
        Limit::SpectrogramFrames,
        Limit::VideoFrames,
    ];

    /// The field of [`Limits`] holding it (`max_image_pixels`, ...).
    pub fn field(self) -> &'static str {
        match self {
            Limit::ImagePixels => "max_image_pixels",
            Limit::ImageSide => "max_image_side",
            Limit::OutputSide => "max_output_side",
            Limit::OutputPixels => "max_output_pixels",
            Limit::AnyresViews => "max_anyres_views",
            Limit::MinSampleRate => "min_sample_rate",
            Limit::MaxSampleRate => "max_sample_rate",
            Limit::AudioSecs => "max_audio_secs",
            Limit::Wav2Vec2Secs => "max_wav2vec2_secs",
            Limit::NFft => "max_n_fft",
            Limit::MelBins => "max_mel_bins",
            Limit::SpectrogramFrames => "max_spectrogram_frames",
            Limit::VideoFrames => "max_video_frames",
        }
    }

    /// The environment variable overriding its default (`IPFS_ACCELERATE_` + the field name in
    /// upper case).
    pub fn env_var(self) -> &'static str {
        match self {
            Limit::ImagePixels => "IPFS_ACCELERATE_MAX_IMAGE_PIXELS",
            Limit::ImageSide => "IPFS_ACCELERATE_MAX_IMAGE_SIDE",
            Limit::OutputSide => "IPFS_ACCELERATE_MAX_OUTPUT_SIDE",
            Limit::OutputPixels => "IPFS_ACCELERATE_MAX_OUTPUT_PIXELS",
            Limit::AnyresViews => "IPFS_ACCELERATE_MAX_ANYRES_VIEWS",
            Limit::MinSampleRate => "IPFS_ACCELERATE_MIN_SAMPLE_RATE",
            Limit::MaxSampleRate => "IPFS_ACCELERATE_MAX_SAMPLE_RATE",
            Limit::AudioSecs => "IPFS_ACCELERATE_MAX_AUDIO_SECS",
            Limit::Wav2Vec2Secs => "IPFS_ACCELERATE_MAX_WAV2VEC2_SECS",
            Limit::NFft => "IPFS_ACCELERATE_MAX_N_FFT",
            Limit::MelBins => "IPFS_ACCELERATE_MAX_MEL_BINS",
            Limit::SpectrogramFrames => "IPFS_ACCELERATE_MAX_SPECTROGRAM_FRAMES",
            Limit::VideoFrames => "IPFS_ACCELERATE_MAX_VIDEO_FRAMES",
        }
    }

    /// Whether the limit is a lower bound (values below it are refused).
    pub fn is_minimum(self) -> bool {
        self == Limit::MinSampleRate
    }

    /// The unit its values are counted in.
    fn unit(self) -> &'static str {
        match self {
            Limit::ImagePixels | Limit::OutputPixels => " pixels",
            Limit::ImageSide | Limit::OutputSide => " pixels per side",
            Limit::AnyresViews => " views",
            Limit::MinSampleRate | Limit::MaxSampleRate => " Hz",
            Limit::AudioSecs | Limit::Wav2Vec2Secs => " s",
            Limit::NFft => " samples",
            Limit::MelBins => " mel bins",
            Limit::SpectrogramFrames | Limit::VideoFrames => " frames",
        }
    }
}

/// A size past one of the [`Limits`]: which limit, what was checked, the value seen and the bound.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "{what}: {value}{unit} is {relation} the limit {field} = {bound}{unit} ({verb} it with the \
     environment variable {env} or ipfs_accelerate_preprocess::Limits::{field})",
    unit = limit.unit(),
    relation = if limit.is_minimum() { "below" } else { "over" },
    verb = if limit.is_minimum() { "lower" } else { "raise" },
    field = limit.field(),
    env = limit.env_var(),
)]
pub struct LimitExceeded {
    /// The limit.
    pub limit: Limit,
    /// What was checked (a header field, a config key, a computed size).
    pub what: String,
    /// The value seen.
    pub value: String,
    /// The limit's value.
    pub bound: String,
}

/// Bounds on the resources preprocessing may spend on one input; see the crate documentation
/// for why each default is what it is.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// Pixels (`width × height`) of one decoded image, checked from its header.
    pub max_image_pixels: u64,
    /// Width or height of one decoded image, checked from its header.
    pub max_image_side: u32,
    /// Any side of a processor's output: resize, crop and pad targets from
    /// `preprocessor_config.json` (DETR's shortest / longest edge, LLaVA-NeXT's grid pinpoints
    /// included) and the sizes computed from them.
    pub max_output_side: usize,
    /// Pixels of one processed image (what is normalised into floats).
    pub max_output_pixels: u64,
    /// Views (base view + tiles) LLaVA-NeXT's anyres may cut one image into.
    pub max_anyres_views: usize,
    /// Lowest accepted sampling rate (WAV headers, configs, resampling).
    pub min_sample_rate: u32,
    /// Highest accepted sampling rate (WAV headers, configs, resampling).
    pub max_sample_rate: u32,
    /// Seconds of audio decoded or resampled as one input (checked from the WAV header), and the
    /// longest window a feature extractor config may ask for.
    pub max_audio_secs: f64,
    /// Seconds of audio Wav2Vec2 takes as one input (it has no window: the whole waveform goes
    /// through attention, quadratic in its length).
    pub max_wav2vec2_secs: f64,
    /// FFT size (window length) of a spectrogram.
    pub max_n_fft: usize,
    /// Mel bins of a spectrogram.
    pub max_mel_bins: usize,
    /// Frames of one spectrogram (window samples / hop length).
    pub max_spectrogram_frames: usize,
    /// Frames of one video.
    pub max_video_frames: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_image_pixels: 8192 * 8192,
            max_image_side: 16384,
            max_output_side: 4096,
            max_output_pixels: 4096 * 4096,
            max_anyres_views: 64,
            min_sample_rate: 1_000,
            max_sample_rate: 384_000,
            max_audio_secs: 600.0,
            max_wav2vec2_secs: 60.0,
            max_n_fft: 16_384,
            max_mel_bins: 512,
            max_spectrogram_frames: 65_536,
            max_video_frames: 256,
        }
    }
}

/// An environment variable holding something other than a positive number.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{var}={value:?} is not a positive number (limit {field})")]
pub struct LimitsEnvError {
    /// The variable.
    pub var: &'static str,
    /// The limit it sets.
    pub field: &'static str,
    /// Its value.
    pub value: String,
}

static OVERRIDE: RwLock<Option<Limits>> = RwLock::new(None);
static FROM_ENV: OnceLock<Limits> = OnceLock::new();

impl Limits {
    /// The value of `limit` as a number (seconds for the durations).
    pub fn get(&self, limit: Limit) -> f64 {
        match limit {
            Limit::ImagePixels => self.max_image_pixels as f64,
            Limit::ImageSide => f64::from(self.max_image_side),
            Limit::OutputSide => self.max_output_side as f64,
            Limit::OutputPixels => self.max_output_pixels as f64,
            Limit::AnyresViews => self.max_anyres_views as f64,
            Limit::MinSampleRate => f64::from(self.min_sample_rate),
            Limit::MaxSampleRate => f64::from(self.max_sample_rate),
            Limit::AudioSecs => self.max_audio_secs,
            Limit::Wav2Vec2Secs => self.max_wav2vec2_secs,
            Limit::NFft => self.max_n_fft as f64,
            Limit::MelBins => self.max_mel_bins as f64,
            Limit::SpectrogramFrames => self.max_spectrogram_frames as f64,
            Limit::VideoFrames => self.max_video_frames as f64,
        }
    }

    /// Sets `limit` from a decimal string (integers for the counts, seconds may be fractional).
    fn set_from_str(&mut self, limit: Limit, text: &str) -> Option<()> {
        let text = text.trim().replace('_', "");
        fn int<T: std::str::FromStr + PartialOrd + Default>(t: &str) -> Option<T> {
            t.parse::<T>().ok().filter(|v| *v > T::default())
        }
        let secs = || {
            text.parse::<f64>()
                .ok()
                .filter(|v| v.is_finite() && *v > 0.0)
        };
        match limit {
            Limit::ImagePixels => self.max_image_pixels = int(&text)?,
            Limit::ImageSide => self.max_image_side = int(&text)?,
            Limit::OutputSide => self.max_output_side = int(&text)?,
            Limit::OutputPixels => self.max_output_pixels = int(&text)?,
            Limit::AnyresViews => self.max_anyres_views = int(&text)?,
            Limit::MinSampleRate => self.min_sample_rate = int(&text)?,
            Limit::MaxSampleRate => self.max_sample_rate = int(&text)?,
            Limit::AudioSecs => self.max_audio_secs = secs()?,
            Limit::Wav2Vec2Secs => self.max_wav2vec2_secs = secs()?,
            Limit::NFft => self.max_n_fft = int(&text)?,
            Limit::MelBins => self.max_mel_bins = int(&text)?,
            Limit::SpectrogramFrames => self.max_spectrogram_frames = int(&text)?,
            Limit::VideoFrames => self.max_video_frames = int(&text)?,
        }
        Some(())
    }

    /// The defaults with every limit whose variable `var(name)` returns overridden by it;
    /// a value that is not a positive number is an error naming the variable.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Limits, LimitsEnvError> {
        let mut limits = Limits::default();
        for limit in Limit::ALL {
            if let Some(value) = var(limit.env_var()) {
                limits
                    .set_from_str(limit, &value)
                    .ok_or_else(|| LimitsEnvError {
                        var: limit.env_var(),
                        field: limit.field(),
                        value,
                    })?;
            }
        }
        Ok(limits)
    }

    /// The defaults overridden by the process environment (see [`Limit::env_var`]).
    pub fn from_env() -> Result<Limits, LimitsEnvError> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The limits in force: those of [`Limits::set_current`] when set, else [`Limits::from_env`]
    /// (read once per process; a malformed variable is logged and its default kept).
    pub fn current() -> Limits {
        if let Some(l) = *OVERRIDE.read().unwrap_or_else(|e| e.into_inner()) {
            return l;
        }
        *FROM_ENV.get_or_init(|| {
            Self::from_vars(|name| {
                let value = std::env::var(name).ok()?;
                let mut probe = Limits::default();
                let limit = Limit::ALL.into_iter().find(|l| l.env_var() == name)?;
                if probe.set_from_str(limit, &value).is_none() {
                    tracing::warn!(
                        "{name}={value:?} is not a positive number; keeping the default of {}",
                        limit.field()
                    );
                    return None;
                }
                Some(value)
            })
            .unwrap_or_default()
        })
    }

    /// Makes `limits` the process-wide [`Limits::current`] (`None`: back to the environment and
    /// defaults). Objects built earlier keep the limits they were built with.
    pub fn set_current(limits: Option<Limits>) {
        *OVERRIDE.write().unwrap_or_else(|e| e.into_inner()) = limits;
    }

    /// The error for `value` past `limit` while checking `what`.
    pub(crate) fn exceeded(
        &self,
        limit: Limit,
        what: impl Into<String>,
        value: impl std::fmt::Display,
    ) -> LimitExceeded {
        LimitExceeded {
            limit,
            what: what.into(),
            value: value.to_string(),
            bound: self.get(limit).to_string(),
        }
    }

    /// `Err` when the count `value` is over the (maximum) `limit`.
    pub(crate) fn check(
        &self,
        limit: Limit,
        what: impl FnOnce() -> String,
        value: u128,
    ) -> Result<(), LimitExceeded> {
        if value as f64 > self.get(limit) {
            Err(self.exceeded(limit, what(), value))
        } else {
            Ok(())
        }
    }

    /// `Err` when `secs` is over the duration `limit` (or not a finite number).
    pub(crate) fn check_secs(
        &self,
        limit: Limit,
        what: impl FnOnce() -> String,
        secs: f64,
    ) -> Result<(), LimitExceeded> {
        if !secs.is_finite() || secs > self.get(limit) {
            Err(self.exceeded(limit, what(), secs))
        } else {
            Ok(())
        }
    }

    /// `Err` when `rate` Hz is outside `min_sample_rate..=max_sample_rate`.
    pub(crate) fn check_sample_rate(
        &self,
        what: impl FnOnce() -> String,
        rate: u64,
    ) -> Result<(), LimitExceeded> {
        if rate < u64::from(self.min_sample_rate) {
            Err(self.exceeded(Limit::MinSampleRate, what(), rate))
        } else {
            self.check(Limit::MaxSampleRate, what, u128::from(rate))
        }
    }

    /// Seconds of `samples` at `rate` Hz.
    pub(crate) fn secs(samples: u64, rate: u32) -> f64 {
        samples as f64 / f64::from(rate.max(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_overrides_and_errors() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| {
                pairs
                    .iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            }
        };
        let l = Limits::from_vars(vars(&[
            ("IPFS_ACCELERATE_MAX_IMAGE_PIXELS", "1_000_000"),
            ("IPFS_ACCELERATE_MAX_AUDIO_SECS", "12.5"),
        ]))
        .unwrap();
        assert_eq!(l.max_image_pixels, 1_000_000);
        assert_eq!(l.max_audio_secs, 12.5);
        assert_eq!(l.max_n_fft, Limits::default().max_n_fft);
        for bad in ["0", "-3", "lots", "1e400", ""] {
            let e =
                Limits::from_vars(|n| (n == "IPFS_ACCELERATE_MAX_N_FFT").then(|| bad.to_string()));
            assert!(e.is_err(), "{bad}");
        }
        for limit in Limit::ALL {
            assert_eq!(
                limit.env_var(),
                format!("IPFS_ACCELERATE_{}", limit.field().to_uppercase())
            );
        }
    }

    #[test]
    fn messages_name_the_limit_value_and_remedy() {
        let l = Limits::default();
        let e = l.check_sample_rate(|| "WAV header".into(), 1).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("below") && msg.contains("min_sample_rate = 1000 Hz"));
        assert!(msg.contains("IPFS_ACCELERATE_MIN_SAMPLE_RATE"), "{msg}");
        let e = l
            .check(Limit::ImagePixels, || "header".into(), 100_000_000)
            .unwrap_err();
        assert!(e.to_string().contains("100000000 pixels is over"), "{e}");
    }
}
