//! X-CLIP behind the uniform [`ModelRunner`] interface, and its tasks: video embeddings and
//! video classification against label prompts.

use std::sync::Arc;

use burn::tensor::{activation::softmax, backend::Backend, Tensor};
use ipfs_accelerate_clip::{l2_normalize, ClipTextInputs};
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, JsonConfig, ModelRunner, Result, TensorMap,
    TensorSource, TokenBatch,
};
use ipfs_accelerate_nn::{
    convert::{float_from_host, float_map, float_rows, float_to_host},
    vision::pixel_values,
};

use crate::{XclipConfig, XclipModel, XclipVideoFeatures};

/// The X-CLIP family: loads an `XCLIPModel` checkpoint folder as an [`XclipRunner`].
pub struct XclipFamily;

impl Family for XclipFamily {
    const NAME: &'static str = "xclip";

    fn load<B: Backend>(
        dir: &std::path::Path,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Box<dyn ModelRunner>> {
        Ok(Box::new(XclipRunner::<B>::load_dir(dir, device, kind)?))
    }
}

/// A loaded X-CLIP checkpoint on one backend.
pub struct XclipRunner<B: Backend> {
    model: XclipModel<B>,
    device: B::Device,
    kind: BackendKind,
    /// The runner of [`crate::vision_encoder_spec`] that runs the vision tower instead of burn.
    vision_engine: Option<Box<dyn ModelRunner>>,
    /// The runner of [`crate::text_encoder_spec`] that runs the text tower instead of burn.
    text_engine: Option<Box<dyn ModelRunner>>,
    /// What [`ModelRunner::engine`] says of the engines.
    label: Option<String>,
}

impl<B: Backend> XclipRunner<B> {
    /// Loads a checkpoint folder: `config.json` and the safetensors weights beside it.
    pub fn load_dir(dir: &std::path::Path, device: &B::Device, kind: BackendKind) -> Result<Self> {
        let config = XclipConfig::from_file(&dir.join("config.json"))?;
        let weights = ipfs_accelerate_io::open_weights(dir)?;
        Self::load(weights, &config, device, kind)
    }

    /// Loads the weights of `source` onto `device`.
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &XclipConfig,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Self> {
        Ok(XclipRunner {
            model: XclipModel::load(source, config, device)?,
            device: device.clone(),
            kind,
            vision_engine: None,
            text_engine: None,
            label: None,
        })
    }

    /// Hands the text tower to `engine`, a runner of [`crate::text_encoder_spec`] (the cuBLAS
    /// encoder on `cuda`): its `text_embeds` (projected, not normalised) go on to the burn
    /// prompt generator.
    pub fn with_text_engine(mut self, engine: Box<dyn ModelRunner>) -> Self {
        self.text_engine = Some(engine);
        self.relabel();
        self
    }

    /// What [`ModelRunner::engine`] says: each engine and the tower it runs.
    fn relabel(&mut self) {
        let towers = [(&self.vision_engine, "vision"), (&self.text_engine, "text")];
        let parts: Vec<String> = towers
            .iter()
            .filter_map(|(engine, tower)| {
                let name = engine.as_ref()?.engine().unwrap_or("engine");
                Some(format!("{name} {tower} tower"))
            })
            .collect();
        self.label = (!parts.is_empty()).then(|| parts.join(", "));
    }

    /// Projected text features `[texts, projection_dim]`, from the text engine when there is
    /// one.
    fn text_of(&self, text: &ClipTextInputs) -> Result<Tensor<B, 2>> {
        let Some(engine) = &self.text_engine else {
            return self.model.text_features(text);
        };
        let tokens = TokenBatch {
            batch: text.batch,
            seq: text.seq,
            input_ids: text.input_ids.clone(),
            attention_mask: text.attention_mask.clone(),
        };
        let out = engine.run(&tokens.to_tensors()?)?;
        let embeds = out
            .get("text_embeds")
            .ok_or_else(|| Error::Compute("the text engine returned no `text_embeds`".into()))?;
        float_from_host::<B, 2>(embeds, &self.device)
    }

    /// Hands the vision tower to `engine`, a runner of [`crate::vision_encoder_spec`] (the
    /// cuBLAS encoder on `cuda`): its `last_hidden_state` and `frame_embeds` go on to the burn
    /// MIT and prompt generator (one copy of the tower's outputs, no round trip per layer).
    pub fn with_vision_engine(mut self, engine: Box<dyn ModelRunner>) -> Self {
        self.vision_engine = Some(engine);
        self.relabel();
        self
    }

    /// The video features of host `pixel_values` (see [`XclipRunner::video_pixels`]), from the
    /// vision engine when there is one.
    fn video_of(&self, pixels: &HostTensor) -> Result<XclipVideoFeatures<B>> {
        let Some(engine) = &self.vision_engine else {
            return self.model.video_features(self.video_pixels(pixels)?);
        };
        let (b, [f, c, h, w]) = video_shape(pixels)?;
        let frames = self.model.vision.frames();
        if f != frames {
            return Err(Error::InvalidInput(format!(
                "videos of {f} frames given, the model takes exactly {frames} (num_frames)"
            )));
        }
        let inputs = TensorMap::from([(
            "pixel_values".to_string(),
            pixels.reshape(vec![b * f, c, h, w])?,
        )]);
        let out = engine.run(&inputs)?;
        let get = |name: &str| {
            out.get(name)
                .ok_or_else(|| Error::Compute(format!("the vision engine returned no `{name}`")))
        };
        let states = float_from_host::<B, 3>(get("last_hidden_state")?, &self.device)?;
        let frame_embeds = float_from_host::<B, 2>(get("frame_embeds")?, &self.device)?;
        self.model.video_features_of(states, frame_embeds, b)
    }

    /// The model.
    pub fn model(&self) -> &XclipModel<B> {
        &self.model
    }

    /// `pixel_values` `[videos, frames, channels, height, width]`, or `[frames, channels, height,
    /// width]` for one video, checked (floats, finite, channel count, nothing empty) and moved to
    /// the device. The frame count is checked by the model.
    pub fn video_pixels(&self, t: &HostTensor) -> Result<Tensor<B, 5>> {
        let (b, [f, c, h, w]) = video_shape(t)?;
        let channels = self.model.config().vision_config.base.num_channels;
        let frames = pixel_values::<B>(&t.reshape(vec![b * f, c, h, w])?, channels, &self.device)?;
        Ok(frames.reshape([b, f, c, h, w]))
    }
}

/// `(videos, [frames, channels, height, width])` of `pixel_values` `[videos, frames, channels,
/// height, width]`, or `[frames, channels, height, width]` for one video.
fn video_shape(t: &HostTensor) -> Result<(usize, [usize; 4])> {
    match *t.shape() {
        [f, c, h, w] => Ok((1, [f, c, h, w])),
        [b, f, c, h, w] => Ok((b, [f, c, h, w])),
        _ => Err(Error::InvalidInput(format!(
            "pixel_values must be [videos, frames, channels, height, width] or [frames, \
             channels, height, width], got {:?}",
            t.shape()
        ))),
    }
}

impl<B: Backend> ModelRunner for XclipRunner<B> {
    fn family(&self) -> &str {
        XclipFamily::NAME
    }

    fn backend(&self) -> BackendKind {
        self.kind
    }

    fn engine(&self) -> Option<&str> {
        self.label.as_deref()
    }

    /// `pixel_values` `[videos, frames, 3, H, W]` give `video_embeds`; with `input_ids` (+
    /// `attention_mask`) also the video-specific `text_embeds` `[videos, texts, dim]`,
    /// `logits_per_video` and `logits_per_text`.
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        let pixels = inputs.get("pixel_values").ok_or_else(|| {
            Error::InvalidInput(
                "X-CLIP needs `pixel_values` (its text embeddings depend on the video)".into(),
            )
        })?;
        let video = self.video_of(pixels)?;
        if !inputs.contains_key("input_ids") {
            return float_map([("video_embeds", l2_normalize(video.video_embeds))]);
        }
        let text = ClipTextInputs::from_tensors(inputs)?;
        let out = self.model.forward_with(self.text_of(&text)?, video)?;
        let mut map = float_map([
            ("video_embeds", out.video_embeds),
            ("logits_per_video", out.logits_per_video),
            ("logits_per_text", out.logits_per_text),
        ])?;
        map.insert("text_embeds".into(), float_to_host(out.text_embeds)?);
        Ok(map)
    }
}

/// The object-safe task interface of a loaded X-CLIP, whatever backend it runs on.
pub trait XclipTasks: ModelRunner {
    /// The configuration.
    fn config(&self) -> &XclipConfig;
    /// L2-normalised video embeddings `[videos][projection_dim]` of `pixel_values` `[videos,
    /// frames, 3, H, W]` or `[frames, 3, H, W]` (HF's `video_embeds`).
    fn video_embeds(&self, pixel_values: &HostTensor) -> Result<Vec<Vec<f32>>>;
    /// Video classification: for every video, the probability of each label (one tokenised
    /// prompt per label), the softmax of `logits_per_video` over the labels.
    fn classify_video(
        &self,
        pixel_values: &HostTensor,
        labels: &ClipTextInputs,
    ) -> Result<Vec<Vec<f32>>>;
}

impl<B: Backend> XclipTasks for XclipRunner<B> {
    fn config(&self) -> &XclipConfig {
        self.model.config()
    }

    fn video_embeds(&self, pixels: &HostTensor) -> Result<Vec<Vec<f32>>> {
        let video = self.video_of(pixels)?;
        float_rows(l2_normalize(video.video_embeds))
    }

    fn classify_video(
        &self,
        pixels: &HostTensor,
        labels: &ClipTextInputs,
    ) -> Result<Vec<Vec<f32>>> {
        if labels.batch == 0 {
            return Err(Error::InvalidInput("no labels to classify against".into()));
        }
        let out = self
            .model
            .forward_with(self.text_of(labels)?, self.video_of(pixels)?)?;
        float_rows(softmax(out.logits_per_video, 1))
    }
}
