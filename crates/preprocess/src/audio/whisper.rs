//! HF's `WhisperFeatureExtractor` (the numpy path): pad or trim to a fixed number of samples,
//! centred STFT with a periodic Hann window, power spectrum, Slaney mel filter bank, `log10`
//! clamped to 8 below the maximum, then `(x + 4) / 4`.

use std::path::Path;

use serde_json::Value;

use super::error::{
    check_finite, config_error, read_text, require_positive, AudioError, AudioResult,
};
use super::resample::conform_prefix;
use super::spectrogram::{MelFilterBank, MelSpectrogram};
use super::LogMel;
use crate::limits::{Limit, Limits};

/// The upper edge of Whisper's mel filters, fixed by HF whatever the sampling rate.
const WHISPER_MAX_FREQUENCY: f64 = 8000.0;

/// The fields of `preprocessor_config.json` a Whisper feature extractor uses.
#[derive(Debug, Clone, PartialEq)]
pub struct WhisperFeatureConfig {
    /// Mel bins (`feature_size`).
    pub feature_size: usize,
    /// Expected sampling rate in Hz.
    pub sampling_rate: u32,
    /// STFT hop in samples.
    pub hop_length: usize,
    /// FFT size and window length in samples.
    pub n_fft: usize,
    /// Samples every input is padded or trimmed to (`chunk_length * sampling_rate` in HF).
    pub n_samples: usize,
    /// Value used to pad short inputs.
    pub padding_value: f32,
}

impl Default for WhisperFeatureConfig {
    /// HF's defaults: 80 mel bins, 16 kHz, hop 160, n_fft 400, 30 s chunks.
    fn default() -> Self {
        WhisperFeatureConfig {
            feature_size: 80,
            sampling_rate: 16_000,
            hop_length: 160,
            n_fft: 400,
            n_samples: 30 * 16_000,
            padding_value: 0.0,
        }
    }
}

impl WhisperFeatureConfig {
    /// Reads and validates `preprocessor_config.json`.
    pub fn from_file(path: &Path) -> AudioResult<Self> {
        Self::from_json(&read_text(path)?, &path.display().to_string())
    }

    /// Parses config JSON (`origin` names it in errors). Absent fields take HF's defaults;
    /// `n_samples` is `chunk_length * sampling_rate` as HF recomputes it.
    pub fn from_json(text: &str, origin: &str) -> AudioResult<Self> {
        let bad = |reason: String| AudioError::Config {
            origin: origin.to_string(),
            reason,
        };
        let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if !v.is_object() {
            return Err(bad(format!("expected a JSON object, got {v}")));
        }
        let d = WhisperFeatureConfig::default();
        let uint = |key: &str, default: usize| -> AudioResult<usize> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(x) => x
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| bad(format!("`{key}` must be a non-negative integer, got {x}"))),
            }
        };
        let float = |key: &str, default: f64| -> AudioResult<f64> {
            match v.get(key) {
                None | Some(Value::Null) => Ok(default),
                Some(x) => x
                    .as_f64()
                    .ok_or_else(|| bad(format!("`{key}` must be a number, got {x}"))),
            }
        };
        let sampling_rate = u32::try_from(uint("sampling_rate", d.sampling_rate as usize)?)
            .map_err(|_| bad("`sampling_rate` is too large".into()))?;
        let chunk_length = float("chunk_length", 30.0)?;
        if float("dither", 0.0)? != 0.0 {
            return Err(bad(
                "`dither` adds random noise; only dither 0.0 (deterministic features) is supported"
                    .into(),
            ));
        }
        let n_samples = chunk_length * f64::from(sampling_rate);
        if !(n_samples.is_finite() && n_samples >= 1.0 && n_samples.fract() == 0.0) {
            return Err(bad(format!(
                "chunk_length {chunk_length} s at {sampling_rate} Hz is not a whole positive number of samples"
            )));
        }
        let cfg = WhisperFeatureConfig {
            feature_size: uint("feature_size", d.feature_size)?,
            sampling_rate,
            hop_length: uint("hop_length", d.hop_length)?,
            n_fft: uint("n_fft", d.n_fft)?,
            n_samples: n_samples as usize,
            padding_value: float("padding_value", 0.0)? as f32,
        };
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// The configuration a Whisper checkpoint without `preprocessor_config.json` implies: HF's
    /// STFT defaults, `num_mel_bins` filters, and as many samples as give the encoder its
    /// `frames` input frames (`frames * hop_length`).
    pub fn for_model(num_mel_bins: usize, frames: usize) -> AudioResult<Self> {
        let d = WhisperFeatureConfig::default();
        let n_samples = frames
            .checked_mul(d.hop_length)
            .ok_or_else(|| AudioError::Config {
                origin: "model config".into(),
                reason: format!("{frames} frames overflow"),
            })?;
        let cfg = WhisperFeatureConfig {
            feature_size: num_mel_bins,
            n_samples,
            ..d
        };
        cfg.validate("model config")?;
        Ok(cfg)
    }

    /// Checks every size is usable and within [`Limits::current`].
    pub fn validate(&self, origin: &str) -> AudioResult<()> {
        self.validate_with(origin, &Limits::current())
    }

    /// Checks every size is usable and within `limits`: the sampling rate in range, `n_fft`
    /// within `max_n_fft`, `feature_size` within `max_mel_bins`, the window within
    /// `max_audio_secs` and its frames within `max_spectrogram_frames`.
    pub fn validate_with(&self, origin: &str, limits: &Limits) -> AudioResult<()> {
        let bad = |reason: String| config_error(origin, reason);
        require_positive(
            origin,
            &[
                ("feature_size", self.feature_size),
                ("hop_length", self.hop_length),
                ("n_fft", self.n_fft),
                ("n_samples", self.n_samples),
                ("sampling_rate", self.sampling_rate as usize),
            ],
        )?;
        if self.n_fft < 2 {
            return bad(format!("n_fft {} must be at least 2", self.n_fft));
        }
        let what = |key: &str| format!("{origin}: `{key}`");
        limits.check_sample_rate(|| what("sampling_rate"), self.sampling_rate.into())?;
        limits.check(Limit::NFft, || what("n_fft"), self.n_fft as u128)?;
        limits.check(
            Limit::MelBins,
            || what("feature_size"),
            self.feature_size as u128,
        )?;
        limits.check_secs(
            Limit::AudioSecs,
            || what("chunk_length"),
            Limits::secs(self.n_samples as u64, self.sampling_rate),
        )?;
        limits.check(
            Limit::SpectrogramFrames,
            || format!("{origin}: frames of the window (n_samples / hop_length)"),
            (self.n_samples / self.hop_length) as u128,
        )?;
        if self.n_samples < self.hop_length {
            return bad(format!(
                "{} samples give no frame with hop {}",
                self.n_samples, self.hop_length
            ));
        }
        if !self.padding_value.is_finite() {
            return bad("`padding_value` must be finite".into());
        }
        Ok(())
    }

    /// Frames of every output (`n_samples / hop_length`, HF's `nb_max_frames`).
    pub fn num_frames(&self) -> usize {
        self.n_samples / self.hop_length
    }
}

/// The Whisper feature extractor: waveform at [`WhisperFeatureConfig::sampling_rate`] →
/// log-mel spectrogram `[feature_size, num_frames]`.
#[derive(Debug)]
pub struct WhisperFeatureExtractor {
    config: WhisperFeatureConfig,
    spectrogram: MelSpectrogram,
    limits: Limits,
}

impl WhisperFeatureExtractor {
    /// Builds the window, FFT plan and mel filters for `config` within [`Limits::current`].
    pub fn new(config: WhisperFeatureConfig) -> AudioResult<Self> {
        Self::with_limits(config, Limits::current())
    }

    /// Builds the window, FFT plan and mel filters for `config` within `limits` (checked first).
    pub fn with_limits(config: WhisperFeatureConfig, limits: Limits) -> AudioResult<Self> {
        config.validate_with("whisper feature extractor", &limits)?;
        let spectrogram = MelSpectrogram::slaney_with(
            config.n_fft,
            config.hop_length,
            config.feature_size,
            (0.0, WHISPER_MAX_FREQUENCY),
            config.sampling_rate,
            &limits,
        )?;
        Ok(WhisperFeatureExtractor {
            config,
            spectrogram,
            limits,
        })
    }

    /// The log-mel features of mono `samples` at any `sampling_rate`: the waveform is cut to the
    /// window (`n_samples` at the config's rate) *before* it is resampled (when
    /// `allow_resample`; else a different rate is [`AudioError::SampleRate`]), so an input of
    /// any length costs one window. Equals resampling the whole input, then
    /// [`WhisperFeatureExtractor::extract`].
    pub fn extract_any_rate(
        &self,
        samples: &[f32],
        sampling_rate: u32,
        allow_resample: bool,
    ) -> AudioResult<LogMel> {
        let target = self.config.sampling_rate;
        let n = self.config.n_samples;
        let (window, full_len) = conform_prefix(
            samples,
            sampling_rate,
            target,
            allow_resample,
            n,
            &self.limits,
        )?;
        let mut out = self.extract(&window, target)?;
        out.truncated |= full_len > n as u128;
        Ok(out)
    }

    /// From `preprocessor_config.json`.
    pub fn from_file(path: &Path) -> AudioResult<Self> {
        Self::new(WhisperFeatureConfig::from_file(path)?)
    }

    /// The configuration.
    pub fn config(&self) -> &WhisperFeatureConfig {
        &self.config
    }

    /// The mel filter bank.
    pub fn filters(&self) -> &MelFilterBank {
        self.spectrogram.filters()
    }

    /// The log-mel features of one mono waveform sampled at `sampling_rate` (which must equal the
    /// config's; see [`super::conform_rate`]). Longer inputs are trimmed to `n_samples`
    /// ([`LogMel::truncated`] says so), shorter ones padded with `padding_value`.
    pub fn extract(&self, samples: &[f32], sampling_rate: u32) -> AudioResult<LogMel> {
        if sampling_rate != self.config.sampling_rate {
            return Err(AudioError::SampleRate {
                expected: self.config.sampling_rate,
                got: sampling_rate,
            });
        }
        if samples.is_empty() {
            return Err(AudioError::Empty("the waveform has no samples".into()));
        }
        check_finite(samples)?;
        let n = self.config.n_samples;
        let truncated = samples.len() > n;
        let mut signal: Vec<f64> = samples.iter().take(n).map(|&v| f64::from(v)).collect();
        signal.resize(n, f64::from(self.config.padding_value));

        let mels = self.spectrogram.num_mels();
        // HF computes `1 + n / hop` frames and drops the last one.
        let frames = self.spectrogram.stft().num_frames_centered(n) - 1;
        let mut log_spec = vec![0f64; mels * frames];
        self.spectrogram.centered_mels(&signal, frames, |t, mel| {
            for (m, v) in mel.iter().enumerate() {
                log_spec[m * frames + t] = v.max(1e-10).log10();
            }
        })?;
        let max = log_spec.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let floor = max - 8.0;
        let data = log_spec
            .into_iter()
            .map(|v| ((v.max(floor) + 4.0) / 4.0) as f32)
            .collect();
        Ok(LogMel {
            mels,
            frames,
            data,
            truncated,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_defaults_and_errors() {
        let c = WhisperFeatureConfig::from_json("{}", "t").unwrap();
        assert_eq!(c, WhisperFeatureConfig::default());
        assert_eq!(c.num_frames(), 3000);
        let c = WhisperFeatureConfig::from_json(
            r#"{"feature_size": 128, "chunk_length": 10, "n_samples": 480000}"#,
            "t",
        )
        .unwrap();
        assert_eq!((c.feature_size, c.n_samples), (128, 160_000));
        for bad in [
            r#"{"feature_size": 0}"#,
            r#"{"hop_length": -1}"#,
            r#"{"chunk_length": 0}"#,
            r#"{"dither": 0.1}"#,
            r#"{"n_fft": "x"}"#,
            "not json",
        ] {
            assert!(
                matches!(
                    WhisperFeatureConfig::from_json(bad, "t"),
                    Err(AudioError::Config { .. })
                ),
                "{bad}"
            );
        }
        let m = WhisperFeatureConfig::for_model(16, 60).unwrap();
        assert_eq!((m.n_samples, m.num_frames()), (9600, 60));
    }

    #[test]
    fn bad_waveforms_are_errors() {
        let fe =
            WhisperFeatureExtractor::new(WhisperFeatureConfig::for_model(8, 20).unwrap()).unwrap();
        assert!(matches!(fe.extract(&[], 16000), Err(AudioError::Empty(_))));
        assert!(matches!(
            fe.extract(&[0.1, f32::NAN], 16000),
            Err(AudioError::NonFinite { index: 1, .. })
        ));
        assert!(matches!(
            fe.extract(&[0.1, f32::INFINITY], 16000),
            Err(AudioError::NonFinite { index: 1, .. })
        ));
        assert!(matches!(
            fe.extract(&[0.1; 100], 8000),
            Err(AudioError::SampleRate {
                expected: 16000,
                got: 8000
            })
        ));
        let long = vec![0.1f32; 10_000];
        let out = fe.extract(&long, 16000).unwrap();
        assert!(out.truncated);
        assert_eq!((out.mels, out.frames, out.data.len()), (8, 20, 160));
        let short = fe.extract(&long[..100], 16000).unwrap();
        assert!(!short.truncated);
    }

    #[test]
    fn silence_is_the_floor_value() {
        let fe =
            WhisperFeatureExtractor::new(WhisperFeatureConfig::for_model(8, 20).unwrap()).unwrap();
        let out = fe.extract(&[0.0; 50], 16000).unwrap();
        // log10(1e-10) = -10 everywhere; (−10 + 4) / 4 = −1.5.
        assert!(out.data.iter().all(|v| (v + 1.5).abs() < 1e-6));
    }
}
