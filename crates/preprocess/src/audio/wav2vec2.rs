//! HF's `Wav2Vec2FeatureExtractor`: raw waveforms padded to the longest in the batch, each
//! normalised to zero mean and unit variance over its own samples (`do_normalize`), padding set to
//! `padding_value`, plus an attention mask.

use std::path::Path;

use serde_json::Value;

use super::error::{check_finite, read_text, AudioError, AudioResult};
use super::resample::conform_prefix;
use crate::limits::{Limit, Limits};

/// The fields of a Wav2Vec2 `preprocessor_config.json`.
#[derive(Debug, Clone, PartialEq)]
pub struct Wav2Vec2FeatureConfig {
    /// Expected sampling rate in Hz.
    pub sampling_rate: u32,
    /// Value written into padding.
    pub padding_value: f32,
    /// Zero-mean, unit-variance normalisation per waveform.
    pub do_normalize: bool,
    /// Whether the model expects an attention mask (checkpoints trained with padding do).
    pub return_attention_mask: bool,
}

impl Default for Wav2Vec2FeatureConfig {
    /// HF's defaults: 16 kHz, padding 0.0, normalised, no attention mask.
    fn default() -> Self {
        Wav2Vec2FeatureConfig {
            sampling_rate: 16_000,
            padding_value: 0.0,
            do_normalize: true,
            return_attention_mask: false,
        }
    }
}

impl Wav2Vec2FeatureConfig {
    /// Reads `preprocessor_config.json`.
    pub fn from_file(path: &Path) -> AudioResult<Self> {
        Self::from_json(&read_text(path)?, &path.display().to_string())
    }

    /// Parses config JSON; absent fields take HF's defaults.
    pub fn from_json(text: &str, origin: &str) -> AudioResult<Self> {
        let bad = |reason: String| AudioError::Config {
            origin: origin.to_string(),
            reason,
        };
        let v: Value = serde_json::from_str(text).map_err(|e| bad(e.to_string()))?;
        if !v.is_object() {
            return Err(bad(format!("expected a JSON object, got {v}")));
        }
        let d = Wav2Vec2FeatureConfig::default();
        let flag = |key: &str, default: bool| match v.get(key) {
            None | Some(Value::Null) => Ok(default),
            Some(x) => x
                .as_bool()
                .ok_or_else(|| bad(format!("`{key}` must be a boolean, got {x}"))),
        };
        let sampling_rate = match v.get("sampling_rate") {
            None | Some(Value::Null) => d.sampling_rate,
            Some(x) => x
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .filter(|n| *n > 0)
                .ok_or_else(|| {
                    bad(format!(
                        "`sampling_rate` must be a positive integer, got {x}"
                    ))
                })?,
        };
        Limits::current().check_sample_rate(
            || format!("{origin}: `sampling_rate`"),
            sampling_rate.into(),
        )?;
        let padding_value =
            match v.get("padding_value") {
                None | Some(Value::Null) => d.padding_value,
                Some(x) => x.as_f64().filter(|f| f.is_finite()).ok_or_else(|| {
                    bad(format!("`padding_value` must be a finite number, got {x}"))
                })? as f32,
            };
        if let Some(fs) = v.get("feature_size").and_then(Value::as_u64) {
            if fs != 1 {
                return Err(bad(format!(
                    "feature_size {fs}: only raw mono waveforms (1) are supported"
                )));
            }
        }
        Ok(Wav2Vec2FeatureConfig {
            sampling_rate,
            padding_value,
            do_normalize: flag("do_normalize", d.do_normalize)?,
            return_attention_mask: flag("return_attention_mask", d.return_attention_mask)?,
        })
    }
}

/// A padded batch of raw waveforms, row-major `[batch, len]`.
#[derive(Debug, Clone, PartialEq)]
pub struct WaveformBatch {
    /// Rows.
    pub batch: usize,
    /// Padded length.
    pub len: usize,
    /// Samples (`input_values`).
    pub values: Vec<f32>,
    /// 1 for samples, 0 for padding.
    pub attention_mask: Vec<i64>,
}

/// `(x - mean) / sqrt(var + 1e-7)` over `x` (population variance), HF's `zero_mean_unit_var_norm`.
pub fn zero_mean_unit_var(x: &[f32]) -> Vec<f32> {
    if x.is_empty() {
        return Vec::new();
    }
    let n = x.len() as f64;
    let mean = x.iter().map(|&v| f64::from(v)).sum::<f64>() / n;
    let var = x
        .iter()
        .map(|&v| (f64::from(v) - mean).powi(2))
        .sum::<f64>()
        / n;
    let inv = 1.0 / (var + 1e-7).sqrt();
    x.iter()
        .map(|&v| ((f64::from(v) - mean) * inv) as f32)
        .collect()
}

/// The Wav2Vec2 feature extractor.
#[derive(Debug, Clone, PartialEq)]
pub struct Wav2Vec2FeatureExtractor {
    config: Wav2Vec2FeatureConfig,
    limits: Limits,
}

impl Wav2Vec2FeatureExtractor {
    /// An extractor with `config` within [`Limits::current`].
    pub fn new(config: Wav2Vec2FeatureConfig) -> Self {
        Wav2Vec2FeatureExtractor {
            config,
            limits: Limits::current(),
        }
    }

    /// An extractor with `config` within `limits` (its sampling rate checked now).
    pub fn with_limits(config: Wav2Vec2FeatureConfig, limits: Limits) -> AudioResult<Self> {
        limits.check_sample_rate(
            || "wav2vec2 feature extractor: `sampling_rate`".into(),
            config.sampling_rate.into(),
        )?;
        Ok(Wav2Vec2FeatureExtractor { config, limits })
    }

    /// `Err` when a waveform of `len` samples at `rate` Hz is longer than `max_wav2vec2_secs`.
    fn check_duration(&self, index: usize, len: usize, rate: u32) -> AudioResult<()> {
        Ok(self.limits.check_secs(
            Limit::Wav2Vec2Secs,
            || format!("the duration of waveform {index}"),
            Limits::secs(len as u64, rate),
        )?)
    }

    /// [`Wav2Vec2FeatureExtractor::extract`] of waveforms at any `sampling_rate`: each one's
    /// duration is checked against `max_wav2vec2_secs` *before* it is resampled (when
    /// `allow_resample`; else a different rate is [`AudioError::SampleRate`]).
    pub fn extract_any_rate(
        &self,
        waveforms: &[&[f32]],
        sampling_rate: u32,
        allow_resample: bool,
    ) -> AudioResult<WaveformBatch> {
        let target = self.config.sampling_rate;
        for (i, w) in waveforms.iter().enumerate() {
            self.check_duration(i, w.len(), sampling_rate.max(1))?;
        }
        let conformed = waveforms
            .iter()
            .map(|w| {
                conform_prefix(
                    w,
                    sampling_rate,
                    target,
                    allow_resample,
                    usize::MAX,
                    &self.limits,
                )
                .map(|(w, _)| w)
            })
            .collect::<AudioResult<Vec<_>>>()?;
        let refs: Vec<&[f32]> = conformed.iter().map(|w| w.as_ref()).collect();
        self.extract(&refs, target)
    }

    /// The configuration.
    pub fn config(&self) -> &Wav2Vec2FeatureConfig {
        &self.config
    }

    /// Pads `waveforms` (each sampled at `sampling_rate`, which must match the config, and at
    /// most `max_wav2vec2_secs` long) to the longest and normalises each over its own length
    /// when `do_normalize`.
    pub fn extract(&self, waveforms: &[&[f32]], sampling_rate: u32) -> AudioResult<WaveformBatch> {
        if sampling_rate != self.config.sampling_rate {
            return Err(AudioError::SampleRate {
                expected: self.config.sampling_rate,
                got: sampling_rate,
            });
        }
        if waveforms.is_empty() {
            return Err(AudioError::Empty("no waveforms".into()));
        }
        for (i, w) in waveforms.iter().enumerate() {
            self.check_duration(i, w.len(), sampling_rate)?;
        }
        let len = waveforms.iter().map(|w| w.len()).max().unwrap_or(0);
        let total = waveforms.len().checked_mul(len).ok_or_else(|| {
            AudioError::Transform(format!(
                "{} waveforms of {len} samples overflow",
                waveforms.len()
            ))
        })?;
        let mut values = Vec::with_capacity(total);
        let mut attention_mask = Vec::with_capacity(total);
        for (i, w) in waveforms.iter().enumerate() {
            if w.is_empty() {
                return Err(AudioError::Empty(format!("waveform {i} has no samples")));
            }
            check_finite(w)?;
            if self.config.do_normalize {
                values.extend(zero_mean_unit_var(w));
            } else {
                values.extend_from_slice(w);
            }
            values.extend(std::iter::repeat_n(
                self.config.padding_value,
                len - w.len(),
            ));
            attention_mask.extend(std::iter::repeat_n(1, w.len()));
            attention_mask.extend(std::iter::repeat_n(0, len - w.len()));
        }
        Ok(WaveformBatch {
            batch: waveforms.len(),
            len,
            values,
            attention_mask,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_each_row_over_its_own_length() {
        let fe = Wav2Vec2FeatureExtractor::new(Wav2Vec2FeatureConfig::default());
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let b = [5.0f32, 5.0];
        let out = fe.extract(&[&a, &b], 16_000).unwrap();
        assert_eq!((out.batch, out.len), (2, 4));
        assert_eq!(out.attention_mask, vec![1, 1, 1, 1, 1, 1, 0, 0]);
        let row = &out.values[..4];
        let mean: f32 = row.iter().sum::<f32>() / 4.0;
        let var: f32 = row.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / 4.0;
        assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 1e-5);
        // A constant row has zero variance: (x - mean) / sqrt(1e-7) = 0; padding is padding_value.
        assert_eq!(&out.values[4..], &[0.0, 0.0, 0.0, 0.0]);
    }

    #[test]
    fn config_and_bad_input() {
        let c = Wav2Vec2FeatureConfig::from_json(
            r#"{"do_normalize": false, "return_attention_mask": true, "sampling_rate": 8000}"#,
            "t",
        )
        .unwrap();
        assert!(!c.do_normalize && c.return_attention_mask && c.sampling_rate == 8000);
        assert!(Wav2Vec2FeatureConfig::from_json(r#"{"feature_size": 80}"#, "t").is_err());
        assert!(Wav2Vec2FeatureConfig::from_json(r#"{"sampling_rate": 0}"#, "t").is_err());
        let fe = Wav2Vec2FeatureExtractor::new(c);
        assert!(matches!(
            fe.extract(&[&[0.0]], 16_000),
            Err(AudioError::SampleRate { .. })
        ));
        assert!(matches!(fe.extract(&[], 8_000), Err(AudioError::Empty(_))));
        assert!(matches!(
            fe.extract(&[&[]], 8_000),
            Err(AudioError::Empty(_))
        ));
        assert!(matches!(
            fe.extract(&[&[f32::NAN]], 8_000),
            Err(AudioError::NonFinite { .. })
        ));
        let raw = fe.extract(&[&[0.5, 0.25], &[1.0]], 8_000).unwrap();
        assert_eq!(raw.values, vec![0.5, 0.25, 1.0, 0.0]);
    }
}
