//! HF's `ClapFeatureExtractor` for the checkpoints without feature fusion (`truncation =
//! "rand_trunc"`, e.g. `laion/clap-htsat-unfused`): repeat / pad the waveform to
//! `max_length_s · sampling_rate` samples (or crop a longer one), centred STFT with a periodic Hann
//! window, power spectrum, Slaney mel filters between `frequency_min` and `frequency_max`, then
//! `10 · log10(max(mel, 1e-10))` dB. Features are `[frames, mels]`, the layout of CLAP's
//! `input_features` `[batch, 1, frames, mels]`.
//!
//! HF crops a waveform longer than the window at a random offset (`np.random.randint`); here the
//! crop is deterministic: [`ClapFeatureExtractor::extract`] keeps the first samples, and
//! [`ClapFeatureExtractor::extract_cropped`] takes the offset from the caller.

use std::path::Path;

use ipfs_accelerate_core::HostTensor;

use super::error::{
    check_finite, config_error, read_text, require_positive, AudioError, AudioResult,
};
use super::resample::conform_prefix;
use super::spectrogram::MelSpectrogram;
use crate::limits::{Limit, Limits};

/// How a waveform longer than the window is cut (`truncation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ClapTruncation {
    /// One crop of the window's length, features from the Slaney filter bank (the checkpoints
    /// without fusion).
    RandTrunc,
    /// HF's `fusion`: four stacked mels (HTK filters) for the fused HTSAT. Not supported: a
    /// config naming it is rejected.
    Fusion,
}

/// How a waveform shorter than the window is filled (`padding`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ClapPadding {
    /// Repeat the whole waveform as often as it fits, then pad with zeros.
    Repeatpad,
    /// Repeat the waveform and cut it at the window's length.
    Repeat,
    /// Pad with zeros.
    Pad,
}

/// The fields of `preprocessor_config.json` the CLAP feature extractor uses (HF's defaults when
/// absent, except `truncation`, which defaults to `rand_trunc`: the only mode a checkpoint
/// without fusion accepts). `top_db` and `padding_value` are not used by HF's CLAP extractor
/// either (padding is always with zeros).
#[derive(Debug, Clone, PartialEq, serde::Deserialize)]
#[serde(default)]
pub struct ClapFeatureConfig {
    /// Mel bins (`feature_size`).
    pub feature_size: usize,
    /// Expected sampling rate in Hz.
    pub sampling_rate: u32,
    /// STFT hop in samples.
    pub hop_length: usize,
    /// Window length in seconds (`max_length_s · sampling_rate` samples).
    pub max_length_s: f64,
    /// FFT size and Hann window length in samples.
    pub fft_window_size: usize,
    /// Lowest mel filter edge in Hz.
    pub frequency_min: f64,
    /// Highest mel filter edge in Hz.
    pub frequency_max: f64,
    /// What happens to long waveforms.
    pub truncation: ClapTruncation,
    /// What happens to short waveforms.
    pub padding: ClapPadding,
}

impl Default for ClapFeatureConfig {
    /// HF's defaults (64 mels, 48 kHz, hop 480, 10 s, FFT 1024, 0–14 kHz, `repeatpad`) with
    /// `rand_trunc` truncation.
    fn default() -> Self {
        ClapFeatureConfig {
            feature_size: 64,
            sampling_rate: 48_000,
            hop_length: 480,
            max_length_s: 10.0,
            fft_window_size: 1024,
            frequency_min: 0.0,
            frequency_max: 14_000.0,
            truncation: ClapTruncation::RandTrunc,
            padding: ClapPadding::Repeatpad,
        }
    }
}

impl ClapFeatureConfig {
    /// Reads and validates `preprocessor_config.json`.
    pub fn from_file(path: &Path) -> AudioResult<Self> {
        Self::from_json(&read_text(path)?, &path.display().to_string())
    }

    /// Parses and validates config JSON (`origin` names it in errors).
    pub fn from_json(text: &str, origin: &str) -> AudioResult<Self> {
        let bad = |reason: String| AudioError::Config {
            origin: origin.to_string(),
            reason,
        };
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if !v.is_object() {
            return Err(bad(format!("expected a JSON object, got {v}")));
        }
        let cfg: ClapFeatureConfig = serde_json::from_value(v).map_err(|e| bad(e.to_string()))?;
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// Checks every size is usable, within [`Limits::current`], and the truncation mode is
    /// supported.
    pub fn validate(&self, origin: &str) -> AudioResult<()> {
        self.validate_with(origin, &Limits::current())
    }

    /// Checks every size is usable and within `limits` (the sampling rate in range,
    /// `fft_window_size` within `max_n_fft`, `feature_size` within `max_mel_bins`,
    /// `max_length_s` within `max_audio_secs`, the frames within `max_spectrogram_frames`) and
    /// the truncation mode is supported.
    pub fn validate_with(&self, origin: &str, limits: &Limits) -> AudioResult<()> {
        let bad = |reason: String| config_error(origin, reason);
        require_positive(
            origin,
            &[
                ("feature_size", self.feature_size),
                ("hop_length", self.hop_length),
                ("sampling_rate", self.sampling_rate as usize),
            ],
        )?;
        if self.fft_window_size < 2 {
            return bad(format!(
                "`fft_window_size` {} must be at least 2",
                self.fft_window_size
            ));
        }
        let samples = self.max_length_s * f64::from(self.sampling_rate);
        // Whole up to float rounding (2.55 s · 48 kHz is 122399.99999999999).
        if !(samples.is_finite() && samples >= 1.0 && (samples - samples.round()).abs() < 1e-6) {
            return bad(format!(
                "max_length_s {} at {} Hz is not a whole positive number of samples",
                self.max_length_s, self.sampling_rate
            ));
        }
        let what = |key: &str| format!("{origin}: `{key}`");
        limits.check_sample_rate(|| what("sampling_rate"), self.sampling_rate.into())?;
        limits.check(
            Limit::NFft,
            || what("fft_window_size"),
            self.fft_window_size as u128,
        )?;
        limits.check(
            Limit::MelBins,
            || what("feature_size"),
            self.feature_size as u128,
        )?;
        limits.check_secs(Limit::AudioSecs, || what("max_length_s"), self.max_length_s)?;
        limits.check(
            Limit::SpectrogramFrames,
            || {
                format!(
                    "{origin}: frames of the window (max_length_s · sampling_rate / hop_length)"
                )
            },
            self.num_frames() as u128,
        )?;
        if !(self.frequency_min.is_finite()
            && self.frequency_max.is_finite()
            && 0.0 <= self.frequency_min
            && self.frequency_min <= self.frequency_max)
        {
            return bad(format!(
                "frequency range {}..{} Hz is invalid",
                self.frequency_min, self.frequency_max
            ));
        }
        if self.truncation == ClapTruncation::Fusion {
            return bad(
                "truncation `fusion` builds the 4-channel input of fused CLAP checkpoints, which \
                 is not supported (use `rand_trunc`)"
                    .into(),
            );
        }
        Ok(())
    }

    /// Samples in the window (HF's `nb_max_samples`).
    pub fn max_samples(&self) -> usize {
        (self.max_length_s * f64::from(self.sampling_rate)).round() as usize
    }

    /// Frames of every output: `1 + max_samples / hop_length` (centred STFT).
    pub fn num_frames(&self) -> usize {
        1 + self.max_samples() / self.hop_length.max(1)
    }
}

/// The features of one waveform: dB mel spectrogram, row-major `[frames, mels]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ClapFeatures {
    /// Frames (rows).
    pub frames: usize,
    /// Mel bins (columns).
    pub mels: usize,
    /// Values in dB.
    pub data: Vec<f32>,
    /// Whether the waveform was longer than the window and was cropped (HF's `is_longer`).
    pub is_longer: bool,
}

/// The CLAP feature extractor (non-fusion path): waveform at
/// [`ClapFeatureConfig::sampling_rate`] → dB mel spectrogram `[frames, feature_size]`.
#[derive(Debug)]
pub struct ClapFeatureExtractor {
    config: ClapFeatureConfig,
    spectrogram: MelSpectrogram,
    limits: Limits,
}

impl ClapFeatureExtractor {
    /// Builds the window, FFT plan and Slaney mel filters for `config` within
    /// [`Limits::current`].
    pub fn new(config: ClapFeatureConfig) -> AudioResult<Self> {
        Self::with_limits(config, Limits::current())
    }

    /// Builds the window, FFT plan and Slaney mel filters for `config` within `limits` (checked
    /// first).
    pub fn with_limits(config: ClapFeatureConfig, limits: Limits) -> AudioResult<Self> {
        config.validate_with("clap feature extractor", &limits)?;
        let spectrogram = MelSpectrogram::slaney_with(
            config.fft_window_size,
            config.hop_length,
            config.feature_size,
            (config.frequency_min, config.frequency_max),
            config.sampling_rate,
            &limits,
        )?;
        Ok(ClapFeatureExtractor {
            config,
            spectrogram,
            limits,
        })
    }

    /// [`ClapFeatureExtractor::extract`] of mono `samples` at any `sampling_rate`: the waveform
    /// is cut to the window (its first `max_samples` at the config's rate) *before* it is
    /// resampled (when `allow_resample`; else a different rate is [`AudioError::SampleRate`]),
    /// so an input of any length costs one window. Equals resampling the whole input, then
    /// [`ClapFeatureExtractor::extract`].
    pub fn extract_any_rate(
        &self,
        samples: &[f32],
        sampling_rate: u32,
        allow_resample: bool,
    ) -> AudioResult<ClapFeatures> {
        let target = self.config.sampling_rate;
        let n = self.config.max_samples();
        let (window, full_len) = conform_prefix(
            samples,
            sampling_rate,
            target,
            allow_resample,
            n,
            &self.limits,
        )?;
        let mut out = self.extract(&window, target)?;
        out.is_longer |= full_len > n as u128;
        Ok(out)
    }

    /// [`ClapFeatureExtractor::input_features`] of waveforms at any `sampling_rate`, each cut
    /// before resampling as [`ClapFeatureExtractor::extract_any_rate`] does.
    pub fn input_features_any_rate(
        &self,
        waveforms: &[&[f32]],
        sampling_rate: u32,
        allow_resample: bool,
    ) -> AudioResult<(HostTensor, Vec<bool>)> {
        let features = waveforms
            .iter()
            .map(|w| self.extract_any_rate(w, sampling_rate, allow_resample))
            .collect::<AudioResult<Vec<_>>>()?;
        self.stack(features)
    }

    /// From `preprocessor_config.json`.
    pub fn from_file(path: &Path) -> AudioResult<Self> {
        Self::new(ClapFeatureConfig::from_file(path)?)
    }

    /// The configuration.
    pub fn config(&self) -> &ClapFeatureConfig {
        &self.config
    }

    /// The features of one mono waveform sampled at `sampling_rate` (which must equal the
    /// config's; see [`super::conform_rate`]). A longer waveform keeps its first
    /// `max_samples` samples (HF crops at a random offset).
    pub fn extract(&self, samples: &[f32], sampling_rate: u32) -> AudioResult<ClapFeatures> {
        self.extract_cropped(samples, sampling_rate, 0)
    }

    /// [`ClapFeatureExtractor::extract`] with the crop of a long waveform starting at `offset`
    /// (at most `len - max_samples`; ignored for waveforms that fit the window).
    pub fn extract_cropped(
        &self,
        samples: &[f32],
        sampling_rate: u32,
        offset: usize,
    ) -> AudioResult<ClapFeatures> {
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
        let n = self.config.max_samples();
        let is_longer = samples.len() > n;
        let signal: Vec<f64> = if is_longer {
            let overflow = samples.len() - n;
            if offset > overflow {
                return Err(AudioError::Config {
                    origin: "clap feature extractor".into(),
                    reason: format!(
                        "crop offset {offset} is past the last possible start {overflow}"
                    ),
                });
            }
            samples[offset..offset + n]
                .iter()
                .map(|&v| f64::from(v))
                .collect()
        } else {
            self.fill(samples, n)
        };

        let mels = self.spectrogram.num_mels();
        let frames = self.config.num_frames();
        let mut data = vec![0f32; frames * mels];
        self.spectrogram.centered_mels(&signal, frames, |t, mel| {
            for (dst, v) in data[t * mels..(t + 1) * mels].iter_mut().zip(mel) {
                // HF: np.maximum(mel_floor, ·), then power_to_db with reference 1 and
                // min_value 1e-10, no top_db.
                *dst = (10.0 * v.max(1e-10).log10()) as f32;
            }
        })?;
        Ok(ClapFeatures {
            frames,
            mels,
            data,
            is_longer,
        })
    }

    /// HF's padding of a waveform of at most `n` samples to exactly `n`.
    fn fill(&self, samples: &[f32], n: usize) -> Vec<f64> {
        let wave = samples.iter().map(|&v| f64::from(v));
        let repeats = n / samples.len();
        let mut signal: Vec<f64> = match self.config.padding {
            // np.tile(x, n_repeat + 1)[:n]
            ClapPadding::Repeat => wave.cycle().take(n).collect(),
            // np.tile(x, n_repeat), then zeros
            ClapPadding::Repeatpad => wave.cycle().take(repeats * samples.len()).collect(),
            ClapPadding::Pad => wave.collect(),
        };
        signal.resize(n, 0.0);
        signal
    }

    /// `input_features` `[batch, 1, frames, mels]` (f32) of several waveforms at `sampling_rate`,
    /// each as [`ClapFeatureExtractor::extract`]; also returns each waveform's `is_longer`.
    pub fn input_features(
        &self,
        waveforms: &[&[f32]],
        sampling_rate: u32,
    ) -> AudioResult<(HostTensor, Vec<bool>)> {
        let features = waveforms
            .iter()
            .map(|w| self.extract(w, sampling_rate))
            .collect::<AudioResult<Vec<_>>>()?;
        self.stack(features)
    }

    /// `input_features` `[batch, 1, frames, mels]` and `is_longer` of extracted features.
    fn stack(&self, features: Vec<ClapFeatures>) -> AudioResult<(HostTensor, Vec<bool>)> {
        if features.is_empty() {
            return Err(AudioError::Empty("no waveforms".into()));
        }
        let mut data = Vec::new();
        let mut longer = Vec::with_capacity(features.len());
        for f in &features {
            data.extend_from_slice(&f.data);
            longer.push(f.is_longer);
        }
        let shape = vec![
            features.len(),
            1,
            self.config.num_frames(),
            self.spectrogram.num_mels(),
        ];
        let tensor =
            HostTensor::from_f32(shape, &data).map_err(|e| AudioError::Transform(e.to_string()))?;
        Ok((tensor, longer))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> ClapFeatureConfig {
        ClapFeatureConfig {
            feature_size: 8,
            sampling_rate: 16_000,
            hop_length: 40,
            max_length_s: 0.01,
            fft_window_size: 64,
            frequency_max: 8000.0,
            ..ClapFeatureConfig::default()
        }
    }

    #[test]
    fn config_defaults_and_errors() {
        let c = ClapFeatureConfig::from_json("{}", "t").unwrap();
        assert_eq!(c, ClapFeatureConfig::default());
        assert_eq!((c.max_samples(), c.num_frames()), (480_000, 1001));
        let c = ClapFeatureConfig::from_json(
            r#"{"feature_size": 64, "frequency_min": 50, "top_db": null, "nb_max_samples": 1,
                "truncation": "rand_trunc", "padding": "repeat", "max_length_s": 5}"#,
            "t",
        )
        .unwrap();
        assert_eq!(
            (c.frequency_min, c.padding, c.max_samples()),
            (50.0, ClapPadding::Repeat, 240_000)
        );
        for bad in [
            r#"{"feature_size": 0}"#,
            r#"{"hop_length": 0}"#,
            r#"{"fft_window_size": 1}"#,
            r#"{"max_length_s": 0}"#,
            r#"{"max_length_s": 0.00001}"#,
            r#"{"frequency_min": 9000, "frequency_max": 8000}"#,
            r#"{"truncation": "fusion"}"#,
            r#"{"truncation": "other"}"#,
            r#"{"padding": "longest"}"#,
            r#"{"sampling_rate": -1}"#,
            "not json",
        ] {
            assert!(
                matches!(
                    ClapFeatureConfig::from_json(bad, "t"),
                    Err(AudioError::Config { .. })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn padding_modes_follow_hf() {
        let x = [1.0f32, 2.0, 3.0];
        let mut fe = ClapFeatureExtractor::new(small()).unwrap();
        let n = 8;
        fe.config.padding = ClapPadding::Repeatpad;
        assert_eq!(fe.fill(&x, n), vec![1., 2., 3., 1., 2., 3., 0., 0.]);
        fe.config.padding = ClapPadding::Repeat;
        assert_eq!(fe.fill(&x, n), vec![1., 2., 3., 1., 2., 3., 1., 2.]);
        fe.config.padding = ClapPadding::Pad;
        assert_eq!(fe.fill(&x, n), vec![1., 2., 3., 0., 0., 0., 0., 0.]);
    }

    #[test]
    fn bad_waveforms_are_errors_and_long_ones_are_cropped() {
        let fe = ClapFeatureExtractor::new(small()).unwrap();
        assert!(matches!(fe.extract(&[], 16000), Err(AudioError::Empty(_))));
        assert!(matches!(
            fe.extract(&[0.1, f32::NAN], 16000),
            Err(AudioError::NonFinite { index: 1, .. })
        ));
        assert!(matches!(
            fe.extract(&[0.1; 10], 8000),
            Err(AudioError::SampleRate { .. })
        ));
        assert!(fe.input_features(&[], 16000).is_err());
        let long: Vec<f32> = (0..400).map(|i| (i as f32 * 0.37).sin()).collect();
        let out = fe.extract(&long, 16000).unwrap();
        assert!(out.is_longer);
        assert_eq!((out.frames, out.mels, out.data.len()), (5, 8, 40));
        // The crop at offset k equals the features of the samples from k on.
        let at = fe.extract_cropped(&long, 16000, 100).unwrap();
        let same = fe.extract(&long[100..260], 16000).unwrap();
        assert_eq!(at.data, same.data);
        assert!(fe.extract_cropped(&long, 16000, 241).is_err());
        // Silence sits at the -100 dB floor.
        let quiet = fe.extract(&[0.0; 20], 16000).unwrap();
        assert!(!quiet.is_longer);
        assert!(quiet.data.iter().all(|v| (v + 100.0).abs() < 1e-4));
        let (t, longer) = fe.input_features(&[&long, &[0.5; 30]], 16000).unwrap();
        assert_eq!(
            (t.shape(), longer),
            (&[2usize, 1, 5, 8][..], vec![true, false])
        );
    }
}
