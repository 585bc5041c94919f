//! Wav2Vec2 behind the uniform [`ModelRunner`] interface, and speech recognition with CTC.

use ipfs_accelerate_core::JsonConfig;
use std::path::Path;
use std::sync::Arc;

use burn::tensor::{backend::Backend, Int, Tensor};
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, ModelRunner, Result, TensorMap, TensorSource,
};
use ipfs_accelerate_nn::convert::{float_to_host, int_to_host};
use ipfs_accelerate_preprocess::audio::{Wav2Vec2FeatureConfig, Wav2Vec2FeatureExtractor};

use crate::{ctc_collapse, CtcVocab, Wav2Vec2, Wav2Vec2Config};

/// The Wav2Vec2 family: loads a checkpoint folder as a [`Wav2Vec2Runner`].
pub struct Wav2Vec2Family;

impl Family for Wav2Vec2Family {
    const NAME: &'static str = "wav2vec2";

    fn load<B: Backend>(
        dir: &Path,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Box<dyn ModelRunner>> {
        Ok(Box::new(Wav2Vec2Runner::<B>::from_dir(dir, device, kind)?))
    }
}

/// Frame-level and decoded CTC output of one waveform.
#[derive(Debug, Clone, PartialEq)]
pub struct CtcTranscription {
    /// Argmax id of every frame.
    pub frame_ids: Vec<i64>,
    /// The label sequence (repeats collapsed, blanks dropped).
    pub ids: Vec<i64>,
    /// The text, when the checkpoint has a `vocab.json`.
    pub text: Option<String>,
}

/// The files of a checkpoint folder besides its weights: `config.json`, the feature extractor's
/// `preprocessor_config.json` (its defaults when absent) and the CTC vocabulary (`vocab.json`
/// with `tokenizer_config.json`), when present.
fn checkpoint_files(
    dir: &Path,
) -> Result<(Wav2Vec2Config, Wav2Vec2FeatureConfig, Option<CtcVocab>)> {
    let config = Wav2Vec2Config::from_file(&dir.join("config.json"))?;
    let pre = dir.join("preprocessor_config.json");
    let features = if pre.is_file() {
        Wav2Vec2FeatureConfig::from_file(&pre)?
    } else {
        Wav2Vec2FeatureConfig::default()
    };
    Ok((config, features, CtcVocab::from_dir(dir)?))
}

/// What turns a waveform into labels and text around the model, whatever executes it (the
/// burn model, the cuBLAS encoder, an ONNX export): the feature extractor and the CTC vocabulary.
struct Recognition {
    features: Wav2Vec2FeatureExtractor,
    vocab: Option<CtcVocab>,
    /// The config's `pad_token_id`: the blank label without a vocabulary.
    pad_token_id: Option<usize>,
}

impl Recognition {
    /// Speech recognition of one waveform: the feature extractor's `input_values` (and
    /// attention mask, when it returns one) handed to `frame_ids`, which gives the argmax label
    /// of every frame (`None`: the checkpoint has no CTC head); then the CTC collapse and the
    /// text. Another `sample_rate` than the extractor's is resampled when `resample`, else an
    /// error.
    fn recognise(
        &self,
        samples: &[f32],
        sample_rate: u32,
        resample: bool,
        frame_ids: impl FnOnce(&[f32], Option<&[i64]>) -> Result<Option<Vec<i64>>>,
    ) -> Result<CtcTranscription> {
        // The duration cap is checked before any resampling.
        let batch = self
            .features
            .extract_any_rate(&[samples], sample_rate, resample)?;
        let mask = self
            .features
            .config()
            .return_attention_mask
            .then_some(batch.attention_mask.as_slice());
        let frame_ids = frame_ids(&batch.values, mask)?.ok_or_else(|| {
            Error::InvalidInput(
                "this checkpoint has no CTC head (lm_head): it cannot transcribe".into(),
            )
        })?;
        let blank = match &self.vocab {
            Some(v) => v.blank(),
            None => self.pad_token_id.unwrap_or(0) as i64,
        };
        Ok(CtcTranscription {
            ids: ctc_collapse(&frame_ids, blank),
            text: self.vocab.as_ref().map(|v| v.decode(&frame_ids)),
            frame_ids,
        })
    }
}

/// The outputs of a forward pass, on the device.
struct Forward<B: Backend> {
    hidden: Tensor<B, 3>,
    logits: Option<Tensor<B, 3>>,
}

/// A loaded Wav2Vec2 checkpoint on one backend, with its feature extractor and CTC vocabulary.
pub struct Wav2Vec2Runner<B: Backend> {
    model: Wav2Vec2<B>,
    recognition: Recognition,
    kind: BackendKind,
}

impl<B: Backend> Wav2Vec2Runner<B> {
    /// Loads `config.json`, the weights, and when present `preprocessor_config.json` and
    /// `vocab.json` / `tokenizer_config.json`.
    pub fn from_dir(dir: &Path, device: &B::Device, kind: BackendKind) -> Result<Self> {
        let (config, features, vocab) = checkpoint_files(dir)?;
        let weights = ipfs_accelerate_io::open_weights(dir)?;
        let mut runner = Self::load(weights, &config, features, device, kind)?;
        runner.recognition.vocab = vocab;
        Ok(runner)
    }

    /// Loads the model from a weight source (no vocabulary).
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &Wav2Vec2Config,
        features: Wav2Vec2FeatureConfig,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Self> {
        Ok(Wav2Vec2Runner {
            model: Wav2Vec2::load(source, config, device)?,
            recognition: Recognition {
                features: Wav2Vec2FeatureExtractor::new(features),
                vocab: None,
                pad_token_id: config.pad_token_id,
            },
            kind,
        })
    }

    /// The model.
    pub fn model(&self) -> &Wav2Vec2<B> {
        &self.model
    }

    /// The feature extractor.
    pub fn feature_extractor(&self) -> &Wav2Vec2FeatureExtractor {
        &self.recognition.features
    }

    /// The CTC vocabulary, when the checkpoint has one.
    pub fn vocab(&self) -> Option<&CtcVocab> {
        self.recognition.vocab.as_ref()
    }

    fn forward(&self, values: &[f32], batch: usize, mask: Option<&[i64]>) -> Result<Forward<B>> {
        let out = self.model.model.forward(values, batch, mask)?;
        let logits = self.model.ctc_logits(out.last_hidden_state.clone());
        Ok(Forward {
            hidden: out.last_hidden_state,
            logits,
        })
    }

    fn argmax(logits: Tensor<B, 3>) -> Tensor<B, 2, Int> {
        let [b, t, _] = logits.dims();
        logits.argmax(2).reshape([b, t])
    }

    /// Recognises speech in mono `samples` at `sample_rate` Hz (resampled to the feature
    /// extractor's rate when `resample`, else a different rate is an error): normalisation, model,
    /// frame argmax, CTC collapse, text from `vocab.json`.
    pub fn transcribe_with(
        &self,
        samples: &[f32],
        sample_rate: u32,
        resample: bool,
    ) -> Result<CtcTranscription> {
        self.recognition
            .recognise(samples, sample_rate, resample, |values, mask| {
                let Some(logits) = self.forward(values, 1, mask)?.logits else {
                    return Ok(None);
                };
                Ok(Some(int_to_host(Self::argmax(logits))?.to_i64_vec()?))
            })
    }

    /// [`Wav2Vec2Runner::transcribe_with`], resampling when needed.
    pub fn transcribe(&self, samples: &[f32], sample_rate: u32) -> Result<CtcTranscription> {
        self.transcribe_with(samples, sample_rate, true)
    }
}

impl<B: Backend> ModelRunner for Wav2Vec2Runner<B> {
    fn family(&self) -> &str {
        Wav2Vec2Family::NAME
    }

    fn backend(&self) -> BackendKind {
        self.kind
    }

    /// Inputs: `input_values` `[batch, samples]`, optional `attention_mask` of the same shape.
    /// Outputs: `last_hidden_state`, and with a CTC head `logits` and `ctc_argmax` (i64).
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        let values = inputs
            .get("input_values")
            .ok_or_else(|| Error::InvalidInput("missing input `input_values`".into()))?;
        let batch = match values.shape() {
            &[b, s] if b > 0 && s > 0 => b,
            other => {
                return Err(Error::InvalidInput(format!(
                    "input_values must be [batch, samples], got {other:?}"
                )))
            }
        };
        let mask = match inputs.get("attention_mask") {
            Some(m) if m.shape() == values.shape() => Some(m.to_i64_vec()?),
            Some(m) => {
                return Err(Error::InvalidInput(format!(
                    "attention_mask has shape {:?}, input_values {:?}",
                    m.shape(),
                    values.shape()
                )))
            }
            None => None,
        };
        let fwd = self.forward(&values.to_f32_vec(), batch, mask.as_deref())?;
        let mut out = TensorMap::new();
        if let Some(logits) = fwd.logits {
            out.insert(
                "ctc_argmax".into(),
                int_to_host(Self::argmax(logits.clone()))?,
            );
            out.insert("logits".into(), float_to_host(logits)?);
        }
        out.insert("last_hidden_state".into(), float_to_host(fwd.hidden)?);
        Ok(out)
    }
}

/// The object-safe task interface of a loaded Wav2Vec2, whatever backend it runs on.
pub trait Wav2Vec2Tasks: ModelRunner {
    /// The configuration.
    fn config(&self) -> &Wav2Vec2Config;
    /// Speech recognition of mono samples at `sample_rate` Hz.
    fn transcribe_with(
        &self,
        samples: &[f32],
        sample_rate: u32,
        resample: bool,
    ) -> Result<CtcTranscription>;
}

impl<B: Backend> Wav2Vec2Tasks for Wav2Vec2Runner<B> {
    fn config(&self) -> &Wav2Vec2Config {
        self.model.config()
    }

    fn transcribe_with(
        &self,
        samples: &[f32],
        sample_rate: u32,
        resample: bool,
    ) -> Result<CtcTranscription> {
        Wav2Vec2Runner::transcribe_with(self, samples, sample_rate, resample)
    }
}

/// Another executor's runner of [`encoder_spec`](crate::encoder_spec) (the cuBLAS encoder) with
/// the CTC head's `ctc_argmax` (i64 `[batch, frames]`, the first of equal logits) added from its
/// `logits`, as [`Wav2Vec2Runner`] gives it.
pub struct CtcArgmax(pub Box<dyn ModelRunner>);

impl ModelRunner for CtcArgmax {
    fn family(&self) -> &str {
        self.0.family()
    }
    fn backend(&self) -> BackendKind {
        self.0.backend()
    }
    fn placement(&self) -> Option<String> {
        self.0.placement()
    }
    fn engine(&self) -> Option<&str> {
        self.0.engine()
    }
    fn device_memory_in_use(&self) -> Option<u64> {
        self.0.device_memory_in_use()
    }
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        let mut out = self.0.run(inputs)?;
        if let Some(logits) = out.get("logits") {
            let shape = logits.shape().to_vec();
            let vocab = shape.last().copied().unwrap_or(0).max(1);
            let ids: Vec<i64> = logits
                .to_f32_vec()
                .chunks(vocab)
                .map(|row| {
                    let best =
                        row.iter().enumerate().fold(
                            0,
                            |best, (i, v)| {
                                if *v > row[best] {
                                    i
                                } else {
                                    best
                                }
                            },
                        );
                    best as i64
                })
                .collect();
            let argmax = ipfs_accelerate_core::HostTensor::from_i64(
                shape[..shape.len() - 1].to_vec(),
                &ids,
            )?;
            out.insert("ctc_argmax".into(), argmax);
        }
        Ok(out)
    }
}

/// A Wav2Vec2 CTC checkpoint executed by another runner of [`encoder_spec`](crate::encoder_spec)
/// (the cuBLAS encoder) or of the checkpoint's ONNX export: the same speech recognition as
/// [`Wav2Vec2Runner`] (feature extractor, frame argmax, CTC collapse, vocabulary), and its
/// outputs with `ctc_argmax` added as [`CtcArgmax`] adds it.
pub struct Wav2Vec2OnRunner {
    runner: CtcArgmax,
    config: Wav2Vec2Config,
    recognition: Recognition,
}

impl Wav2Vec2OnRunner {
    /// `runner` (which executes the checkpoint in `dir`) with the folder's `config.json`, feature
    /// extractor and CTC vocabulary.
    pub fn from_dir(dir: &Path, runner: Box<dyn ModelRunner>) -> Result<Self> {
        let (config, features, vocab) = checkpoint_files(dir)?;
        Ok(Wav2Vec2OnRunner {
            runner: CtcArgmax(runner),
            recognition: Recognition {
                features: Wav2Vec2FeatureExtractor::new(features),
                vocab,
                pad_token_id: config.pad_token_id,
            },
            config,
        })
    }
}

impl ModelRunner for Wav2Vec2OnRunner {
    fn family(&self) -> &str {
        self.runner.family()
    }
    fn backend(&self) -> BackendKind {
        self.runner.backend()
    }
    fn placement(&self) -> Option<String> {
        self.runner.placement()
    }
    fn engine(&self) -> Option<&str> {
        self.runner.engine()
    }
    fn device_memory_in_use(&self) -> Option<u64> {
        self.runner.device_memory_in_use()
    }
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        self.runner.run(inputs)
    }
}

impl Wav2Vec2Tasks for Wav2Vec2OnRunner {
    fn config(&self) -> &Wav2Vec2Config {
        &self.config
    }

    fn transcribe_with(
        &self,
        samples: &[f32],
        sample_rate: u32,
        resample: bool,
    ) -> Result<CtcTranscription> {
        self.recognition
            .recognise(samples, sample_rate, resample, |values, mask| {
                let mut inputs = TensorMap::new();
                let shape = vec![1, values.len()];
                inputs.insert(
                    "input_values".into(),
                    HostTensor::from_f32(shape.clone(), values)?,
                );
                if let Some(mask) = mask {
                    inputs.insert("attention_mask".into(), HostTensor::from_i64(shape, mask)?);
                }
                match self.run(&inputs)?.get("ctc_argmax") {
                    Some(ids) => Ok(Some(ids.to_i64_vec()?)),
                    None => Ok(None),
                }
            })
    }
}
