//! `ClapModel`: both towers, their projections into the shared space and the two logit scales.

use ipfs_accelerate_nn::ActivationForward;
use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::{Error, Result, TensorSource, TokenBatch};
use ipfs_accelerate_nn::{exact, Activation, Linear, VarBuilder};

use crate::{ClapConfig, ClapTextModel, HtsatEncoder};

/// `ClapProjectionLayer`: `linear2(act(linear1(x)))`.
pub struct ClapProjection<B: Backend> {
    linear1: Linear<B>,
    linear2: Linear<B>,
    act: Activation,
}

impl<B: Backend> ClapProjection<B> {
    /// Loads `linear1` (`hidden` → `projection`) and `linear2` under `vb`.
    pub fn load(
        vb: &VarBuilder<B>,
        hidden: usize,
        projection: usize,
        act: Activation,
    ) -> Result<Self> {
        Ok(ClapProjection {
            linear1: Linear::load(&vb.pp("linear1"), hidden, projection, true)?,
            linear2: Linear::load(&vb.pp("linear2"), projection, projection, true)?,
            act,
        })
    }

    /// Projects `[batch, hidden]` to `[batch, projection]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        self.linear2
            .forward(self.act.forward(self.linear1.forward(x)))
    }
}

/// Each row divided by its L2 norm (HF's `x / x.norm(p=2, dim=-1, keepdim=True)`, no epsilon).
pub fn l2_rows<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    x.clone() / x.powi_scalar(2).sum_dim(1).sqrt()
}

/// The outputs of [`ClapModel::forward`].
#[derive(Debug, Clone)]
pub struct ClapOutput<B: Backend> {
    /// `[texts, projection_dim]`, L2-normalised.
    pub text_embeds: Tensor<B, 2>,
    /// `[audios, projection_dim]`, L2-normalised.
    pub audio_embeds: Tensor<B, 2>,
    /// `[audios, texts]`: `exp(logit_scale_a) · audio · text`.
    pub logits_per_audio: Tensor<B, 2>,
    /// `[texts, audios]`: `exp(logit_scale_t) · text · audio`.
    pub logits_per_text: Tensor<B, 2>,
}

/// `ClapModel` (no fusion).
pub struct ClapModel<B: Backend> {
    /// The text tower.
    pub text: ClapTextModel<B>,
    /// The audio tower.
    pub audio: HtsatEncoder<B>,
    text_projection: ClapProjection<B>,
    audio_projection: ClapProjection<B>,
    logit_scale_a: f32,
    logit_scale_t: f32,
    config: ClapConfig,
}

/// A finite one-element tensor of the checkpoint, read on the host.
fn scalar(source: &dyn TensorSource, name: &str) -> Result<f32> {
    let t = source.tensor(name)?;
    let values = t.to_f32_vec();
    match values.first() {
        Some(v) if values.len() == 1 && v.is_finite() => Ok(*v),
        _ => Err(Error::InvalidInput(format!(
            "`{name}` must hold one finite value, got shape {:?}",
            t.shape()
        ))),
    }
}

impl<B: Backend> ClapModel<B> {
    /// Loads a `ClapModel` checkpoint (HF's tensor names).
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &ClapConfig,
        device: &B::Device,
    ) -> Result<Self> {
        let logit_scale_a = scalar(source.as_ref(), "logit_scale_a")?;
        let logit_scale_t = scalar(source.as_ref(), "logit_scale_t")?;
        let vb = VarBuilder::<B>::new(source, device);
        let (p, act) = (config.projection_dim, config.projection_hidden_act);
        Ok(ClapModel {
            text: ClapTextModel::load(&vb.pp("text_model"), &config.text_config)?,
            audio: HtsatEncoder::load(&vb.pp("audio_model.audio_encoder"), &config.audio_config)?,
            text_projection: ClapProjection::load(
                &vb.pp("text_projection"),
                config.text_config.hidden_size,
                p,
                act,
            )?,
            audio_projection: ClapProjection::load(
                &vb.pp("audio_projection"),
                config.audio_config.hidden_size,
                p,
                act,
            )?,
            logit_scale_a,
            logit_scale_t,
            config: config.clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ClapConfig {
        &self.config
    }

    /// `(exp(logit_scale_a), exp(logit_scale_t))`.
    pub fn logit_scales(&self) -> (f32, f32) {
        (self.logit_scale_a.exp(), self.logit_scale_t.exp())
    }

    /// L2-normalised text embeddings `[batch, projection_dim]`.
    pub fn text_embeds(&self, text: &TokenBatch) -> Result<Tensor<B, 2>> {
        Ok(l2_rows(
            self.text_projection.forward(self.text.forward(text)?),
        ))
    }

    /// L2-normalised audio embeddings `[batch, projection_dim]` of `input_features`
    /// `[batch, 1, frames, mels]`.
    pub fn audio_embeds(&self, input_features: Tensor<B, 4>) -> Result<Tensor<B, 2>> {
        Ok(l2_rows(
            self.audio_projection
                .forward(self.audio.forward(input_features)?),
        ))
    }

    /// Both towers and the audio-text logits, as HF's `ClapModel.forward`.
    pub fn forward(
        &self,
        text: &TokenBatch,
        input_features: Tensor<B, 4>,
    ) -> Result<ClapOutput<B>> {
        let audio_embeds = self.audio_embeds(input_features)?;
        let text_embeds = self.text_embeds(text)?;
        Ok(self.join(text_embeds, audio_embeds))
    }

    /// Both towers' normalised embeddings joined into [`ClapOutput`]'s logits.
    pub fn join(&self, text_embeds: Tensor<B, 2>, audio_embeds: Tensor<B, 2>) -> ClapOutput<B> {
        let (scale_a, scale_t) = self.logit_scales();
        let logits_per_text = exact::matmul(text_embeds.clone(), audio_embeds.clone().transpose())
            .mul_scalar(scale_t);
        let logits_per_audio = exact::matmul(audio_embeds.clone(), text_embeds.clone().transpose())
            .mul_scalar(scale_a);
        ClapOutput {
            text_embeds,
            audio_embeds,
            logits_per_audio,
            logits_per_text,
        }
    }
}
