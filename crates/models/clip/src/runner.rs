//! CLIP behind the uniform [`ModelRunner`] interface, and its tasks: text embeddings, image
//! embeddings, zero-shot classification.

use ipfs_accelerate_core::JsonConfig;
use std::sync::Arc;

use burn::tensor::{activation::softmax, backend::Backend, Tensor};
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, ModelRunner, Result, TensorMap, TensorSource,
};
use ipfs_accelerate_nn::{
    convert::{float_map, float_rows},
    vision::pixel_values,
};

use crate::model::l2_normalize;
use crate::{ClipConfig, ClipModel, ClipTextInputs};

impl ClipTextInputs {
    /// Builds inputs from named host tensors: `input_ids` `[batch, seq]` required,
    /// `attention_mask` (same shape) defaulting to ones.
    pub fn from_tensors(inputs: &TensorMap) -> Result<Self> {
        let t = ipfs_accelerate_core::TokenBatch::from_tensors(inputs)?;
        Ok(ClipTextInputs {
            batch: t.batch,
            seq: t.seq,
            input_ids: t.input_ids,
            attention_mask: t.attention_mask,
        })
    }
}

/// The CLIP family: loads a `CLIPModel` checkpoint folder as a [`ClipRunner`].
pub struct ClipFamily;

impl Family for ClipFamily {
    const NAME: &'static str = "clip";

    fn load<B: Backend>(
        dir: &std::path::Path,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Box<dyn ModelRunner>> {
        Ok(Box::new(ClipRunner::<B>::load_dir(dir, device, kind)?))
    }
}

/// A loaded CLIP checkpoint on one backend.
pub struct ClipRunner<B: Backend> {
    model: ClipModel<B>,
    device: B::Device,
    kind: BackendKind,
}

impl<B: Backend> ClipRunner<B> {
    /// Loads a checkpoint folder (`config.json` + safetensors).
    pub fn load_dir(dir: &std::path::Path, device: &B::Device, kind: BackendKind) -> Result<Self> {
        let config = ClipConfig::from_file(&dir.join("config.json"))?;
        let weights = ipfs_accelerate_io::open_weights(dir)?;
        Self::load(weights, &config, device, kind)
    }

    /// Loads the checkpoint onto `device`.
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &ClipConfig,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Self> {
        Ok(ClipRunner {
            model: ClipModel::load(source, config, device)?,
            device: device.clone(),
            kind,
        })
    }

    /// The model.
    pub fn model(&self) -> &ClipModel<B> {
        &self.model
    }

    fn pixels(&self, t: &HostTensor) -> Result<Tensor<B, 4>> {
        pixel_values::<B>(
            t,
            self.model.config().vision_config.num_channels,
            &self.device,
        )
    }
}

impl<B: Backend> ModelRunner for ClipRunner<B> {
    fn family(&self) -> &str {
        ClipFamily::NAME
    }

    fn backend(&self) -> BackendKind {
        self.kind
    }

    /// `input_ids` (+ `attention_mask`) give `text_embeds`, `pixel_values` give `image_embeds`,
    /// both together also `logits_per_image` and `logits_per_text`.
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        let text = inputs
            .contains_key("input_ids")
            .then(|| ClipTextInputs::from_tensors(inputs))
            .transpose()?;
        let pixels = inputs
            .get("pixel_values")
            .map(|p| self.pixels(p))
            .transpose()?;
        match (text, pixels) {
            (Some(text), Some(pixels)) => {
                let out = self.model.forward(&text, pixels)?;
                float_map([
                    ("text_embeds", out.text_embeds),
                    ("image_embeds", out.image_embeds),
                    ("logits_per_image", out.logits_per_image),
                    ("logits_per_text", out.logits_per_text),
                ])
            }
            (Some(text), None) => {
                let e = l2_normalize(self.model.text_features(&text)?);
                float_map([("text_embeds", e)])
            }
            (None, Some(pixels)) => {
                let e = l2_normalize(self.model.image_features(pixels)?);
                float_map([("image_embeds", e)])
            }
            (None, None) => Err(Error::InvalidInput(
                "CLIP needs `input_ids` and / or `pixel_values`".into(),
            )),
        }
    }
}

/// The object-safe task interface of a loaded CLIP, whatever backend it runs on.
pub trait ClipTasks: ModelRunner {
    /// The configuration.
    fn config(&self) -> &ClipConfig;
    /// L2-normalised text embeddings `[texts][projection_dim]` (HF's `CLIPModel` `text_embeds`).
    fn text_embeds(&self, text: &ClipTextInputs) -> Result<Vec<Vec<f32>>>;
    /// L2-normalised image embeddings `[images][projection_dim]` of `pixel_values`
    /// `[images, 3, H, W]` (HF's `image_embeds`).
    fn image_embeds(&self, pixel_values: &HostTensor) -> Result<Vec<Vec<f32>>>;
    /// Zero-shot classification: for every image, the probability of each label (one tokenised
    /// prompt per label), the softmax of `logits_per_image` over the labels.
    fn zero_shot(
        &self,
        pixel_values: &HostTensor,
        labels: &ClipTextInputs,
    ) -> Result<Vec<Vec<f32>>>;
}

impl<B: Backend> ClipTasks for ClipRunner<B> {
    fn config(&self) -> &ClipConfig {
        self.model.config()
    }

    fn text_embeds(&self, text: &ClipTextInputs) -> Result<Vec<Vec<f32>>> {
        float_rows(l2_normalize(self.model.text_features(text)?))
    }

    fn image_embeds(&self, pixels: &HostTensor) -> Result<Vec<Vec<f32>>> {
        float_rows(l2_normalize(
            self.model.image_features(self.pixels(pixels)?)?,
        ))
    }

    fn zero_shot(&self, pixels: &HostTensor, labels: &ClipTextInputs) -> Result<Vec<Vec<f32>>> {
        let out = self.model.forward(labels, self.pixels(pixels)?)?;
        float_rows(softmax(out.logits_per_image, 1))
    }
}
