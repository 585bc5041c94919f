//! CLAP behind the uniform [`ModelRunner`] interface, and its tasks: text embeddings, audio
//! embeddings, zero-shot audio classification, features from WAV files.

use std::path::Path;
use std::sync::Arc;

use burn::tensor::{activation::softmax, backend::Backend, Tensor};
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, JsonConfig, ModelRunner, Result, TensorMap,
    TensorSource, TokenBatch,
};
use ipfs_accelerate_nn::convert::{float_from_host, float_map, float_rows};
use ipfs_accelerate_preprocess::audio::{read_wav, ClapFeatureConfig, ClapFeatureExtractor};

use crate::{l2_rows, ClapConfig, ClapModel};

/// The CLAP family: loads a `ClapModel` checkpoint folder as a [`ClapRunner`].
pub struct ClapFamily;

impl Family for ClapFamily {
    const NAME: &'static str = "clap";

    fn load<B: Backend>(
        dir: &Path,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Box<dyn ModelRunner>> {
        Ok(Box::new(ClapRunner::<B>::load_dir(dir, device, kind)?))
    }
}

/// The feature extractor of a checkpoint folder: its `preprocessor_config.json` when present,
/// else HF's defaults with `num_mel_bins` mels and a window no longer than the model's frames;
/// its mel count must match the model's.
pub fn feature_extractor_for(dir: &Path, config: &ClapConfig) -> Result<ClapFeatureExtractor> {
    let path = dir.join("preprocessor_config.json");
    let mels = config.audio_config.num_mel_bins;
    let fe_config = if path.is_file() {
        ClapFeatureConfig::from_file(&path)?
    } else {
        let mut defaults = ClapFeatureConfig {
            feature_size: mels,
            ..ClapFeatureConfig::default()
        };
        // HF's 10 s window gives 1001 frames, which the real HTSAT (1024) takes; a smaller model
        // gets the longest window it can take.
        let frames = config.audio_config.geometry()?.spec_width;
        let hop = defaults.hop_length as f64;
        let window_frames =
            (defaults.max_length_s * f64::from(defaults.sampling_rate) / hop).floor() + 1.0;
        if window_frames > frames as f64 {
            defaults.max_length_s =
                (frames.saturating_sub(1) as f64 * hop) / f64::from(defaults.sampling_rate);
        }
        defaults
    };
    if fe_config.feature_size != mels {
        return Err(Error::config(
            &path,
            format!(
                "feature_size {} differs from the model's num_mel_bins {mels}",
                fe_config.feature_size
            ),
        ));
    }
    Ok(ClapFeatureExtractor::new(fe_config)?)
}

/// A loaded CLAP checkpoint on one backend, with its feature extractor.
pub struct ClapRunner<B: Backend> {
    model: ClapModel<B>,
    extractor: ClapFeatureExtractor,
    device: B::Device,
    kind: BackendKind,
    /// The runner of [`crate::text_encoder_spec`] that encodes text instead of the burn tower,
    /// and what [`ModelRunner::engine`] says of it.
    text_engine: Option<(Box<dyn ModelRunner>, String)>,
}

impl<B: Backend> ClapRunner<B> {
    /// Loads a checkpoint folder (`config.json`, safetensors, optional
    /// `preprocessor_config.json`).
    pub fn load_dir(dir: &Path, device: &B::Device, kind: BackendKind) -> Result<Self> {
        let config = ClapConfig::from_file(&dir.join("config.json"))?;
        let extractor = feature_extractor_for(dir, &config)?;
        let weights = ipfs_accelerate_io::open_weights(dir)?;
        Self::load(weights, &config, extractor, device, kind)
    }

    /// Loads the checkpoint onto `device` with `extractor` for raw audio.
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &ClapConfig,
        extractor: ClapFeatureExtractor,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Self> {
        Ok(ClapRunner {
            model: ClapModel::load(source, config, device)?,
            extractor,
            device: device.clone(),
            kind,
            text_engine: None,
        })
    }

    /// Hands the text tower to `engine`, a runner of [`crate::text_encoder_spec`] (the cuBLAS
    /// encoder on `cuda`): its `text_embeds` are normalised here and joined with the burn audio
    /// tower's. Only `[texts, projection_dim]` embeddings cross between the two.
    pub fn with_text_engine(mut self, engine: Box<dyn ModelRunner>) -> Self {
        let label = format!("{} text tower", engine.engine().unwrap_or("engine"));
        self.text_engine = Some((engine, label));
        self
    }

    /// L2-normalised text embeddings, from the text engine when there is one.
    fn text_embeds_of(&self, text: &TokenBatch) -> Result<Tensor<B, 2>> {
        let Some((engine, _)) = &self.text_engine else {
            return self.model.text_embeds(text);
        };
        let out = engine.run(&text.to_tensors()?)?;
        let embeds = out
            .get("text_embeds")
            .ok_or_else(|| Error::Compute("the text engine returned no `text_embeds`".into()))?;
        Ok(l2_rows(float_from_host::<B, 2>(embeds, &self.device)?))
    }

    /// Replaces the feature extractor (for example one with another window length).
    pub fn with_feature_extractor(mut self, extractor: ClapFeatureExtractor) -> Result<Self> {
        let mels = self.model.config().audio_config.num_mel_bins;
        if extractor.config().feature_size != mels {
            return Err(Error::InvalidInput(format!(
                "the feature extractor makes {} mels, the model takes {mels}",
                extractor.config().feature_size
            )));
        }
        self.extractor = extractor;
        Ok(self)
    }

    /// The model.
    pub fn model(&self) -> &ClapModel<B> {
        &self.model
    }

    fn features(&self, t: &HostTensor) -> Result<Tensor<B, 4>> {
        let x = float_from_host::<B, 4>(t, &self.device)?;
        self.model.audio.check_input(x.dims())?;
        Ok(x)
    }
}

impl<B: Backend> ModelRunner for ClapRunner<B> {
    fn family(&self) -> &str {
        ClapFamily::NAME
    }

    fn backend(&self) -> BackendKind {
        self.kind
    }

    fn engine(&self) -> Option<&str> {
        self.text_engine.as_ref().map(|(_, label)| label.as_str())
    }

    /// `input_ids` (+ `attention_mask`) give `text_embeds`, `input_features` give
    /// `audio_embeds`, both together also `logits_per_audio` and `logits_per_text`.
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        let text = inputs
            .contains_key("input_ids")
            .then(|| TokenBatch::from_tensors(inputs))
            .transpose()?;
        let features = inputs
            .get("input_features")
            .map(|f| self.features(f))
            .transpose()?;
        match (text, features) {
            (Some(text), Some(features)) => {
                let audio = self.model.audio_embeds(features)?;
                let out = self.model.join(self.text_embeds_of(&text)?, audio);
                float_map([
                    ("text_embeds", out.text_embeds),
                    ("audio_embeds", out.audio_embeds),
                    ("logits_per_audio", out.logits_per_audio),
                    ("logits_per_text", out.logits_per_text),
                ])
            }
            (Some(text), None) => float_map([("text_embeds", self.text_embeds_of(&text)?)]),
            (None, Some(features)) => {
                float_map([("audio_embeds", self.model.audio_embeds(features)?)])
            }
            (None, None) => Err(Error::InvalidInput(
                "CLAP needs `input_ids` and / or `input_features`".into(),
            )),
        }
    }
}

/// The object-safe task interface of a loaded CLAP, whatever backend it runs on.
pub trait ClapTasks: ModelRunner {
    /// The configuration.
    fn config(&self) -> &ClapConfig;
    /// The feature extractor raw audio goes through.
    fn feature_extractor(&self) -> &ClapFeatureExtractor;
    /// L2-normalised text embeddings `[texts][projection_dim]` (HF's `text_embeds`).
    fn text_embeds(&self, text: &TokenBatch) -> Result<Vec<Vec<f32>>>;
    /// L2-normalised audio embeddings `[audios][projection_dim]` of `input_features`
    /// `[audios, 1, frames, mels]` (HF's `audio_embeds`).
    fn audio_embeds(&self, input_features: &HostTensor) -> Result<Vec<Vec<f32>>>;
    /// Zero-shot classification: for every audio, the probability of each label (one tokenised
    /// prompt per label), the softmax of `logits_per_audio` over the labels.
    fn zero_shot(&self, input_features: &HostTensor, labels: &TokenBatch) -> Result<Vec<Vec<f32>>>;
    /// `input_features` `[1, 1, frames, mels]` of mono samples at `sampling_rate` Hz, resampled
    /// to the extractor's rate when they differ (a long waveform keeps its first window).
    fn waveform_features(&self, samples: &[f32], sampling_rate: u32) -> Result<HostTensor>;
    /// [`ClapTasks::waveform_features`] of a WAV file (channels mixed down to mono).
    fn wav_features(&self, path: &Path) -> Result<HostTensor> {
        let audio = read_wav(path)?;
        self.waveform_features(&audio.samples, audio.sample_rate)
    }
    /// Zero-shot classification of a WAV file: one probability per label.
    fn classify_wav(&self, path: &Path, labels: &TokenBatch) -> Result<Vec<f32>> {
        let features = self.wav_features(path)?;
        self.zero_shot(&features, labels)?
            .pop()
            .ok_or_else(|| Error::Compute("zero-shot classification returned no row".into()))
    }
}

impl<B: Backend> ClapTasks for ClapRunner<B> {
    fn config(&self) -> &ClapConfig {
        self.model.config()
    }

    fn feature_extractor(&self) -> &ClapFeatureExtractor {
        &self.extractor
    }

    fn text_embeds(&self, text: &TokenBatch) -> Result<Vec<Vec<f32>>> {
        float_rows(self.text_embeds_of(text)?)
    }

    fn audio_embeds(&self, input_features: &HostTensor) -> Result<Vec<Vec<f32>>> {
        float_rows(self.model.audio_embeds(self.features(input_features)?)?)
    }

    fn zero_shot(&self, input_features: &HostTensor, labels: &TokenBatch) -> Result<Vec<Vec<f32>>> {
        let audio = self.model.audio_embeds(self.features(input_features)?)?;
        let out = self.model.join(self.text_embeds_of(labels)?, audio);
        float_rows(softmax(out.logits_per_audio, 1))
    }

    fn waveform_features(&self, samples: &[f32], sampling_rate: u32) -> Result<HostTensor> {
        // Cut to the window before resampling.
        Ok(self
            .extractor
            .input_features_any_rate(&[samples], sampling_rate, true)?
            .0)
    }
}
