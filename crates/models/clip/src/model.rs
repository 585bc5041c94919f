//! CLIP's text and vision transformers, projections and image-text logits.

use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::{EncoderProjection, Error, Result, TensorSource};
use ipfs_accelerate_nn::{
    convert::int_tensor,
    exact,
    trunk::{first_token, gather_tokens, project, Trunk},
    LayerNorm, Linear, VarBuilder,
};

use crate::{ClipConfig, ClipTextConfig, ClipVisionConfig};

/// Tokenised text for the text tower: row-major `[batch, seq]` ids and attention mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClipTextInputs {
    /// Rows.
    pub batch: usize,
    /// Columns (padded length).
    pub seq: usize,
    /// Token ids.
    pub input_ids: Vec<i64>,
    /// 1 for tokens, 0 for padding.
    pub attention_mask: Vec<i64>,
}

impl ClipTextInputs {
    /// Rows of equal length, no padding.
    pub fn from_rows(rows: &[Vec<i64>]) -> Result<Self> {
        let seq = rows.first().map(Vec::len).unwrap_or(0);
        if rows.iter().any(|r| r.len() != seq) {
            return Err(Error::InvalidInput(
                "token rows of different lengths: pad them and pass an attention mask".into(),
            ));
        }
        Ok(ClipTextInputs {
            batch: rows.len(),
            seq,
            input_ids: rows.concat(),
            attention_mask: vec![1; rows.len() * seq],
        })
    }

    fn check(&self) -> Result<()> {
        let n = self.batch * self.seq;
        if n == 0 {
            return Err(Error::InvalidInput("empty text input: no tokens".into()));
        }
        if self.input_ids.len() != n || self.attention_mask.len() != n {
            return Err(Error::InvalidInput(format!(
                "input_ids ({}) / attention_mask ({}) do not hold [{}, {}] values",
                self.input_ids.len(),
                self.attention_mask.len(),
                self.batch,
                self.seq
            )));
        }
        Ok(())
    }
}

/// `CLIPTextTransformer`: token + position embeddings, causal pre-LN encoder, final layer norm,
/// pooled at the end-of-text token: CLIP's text description ([`crate::describe_text`]) run by
/// the shared burn trunk executor.
pub struct ClipTextTransformer<B: Backend> {
    trunk: Trunk<B>,
    config: ClipTextConfig,
    device: B::Device,
}

impl<B: Backend> ClipTextTransformer<B> {
    /// Loads the tower under `vb` (HF's `text_model`).
    pub fn load(vb: &VarBuilder<B>, c: &ClipTextConfig) -> Result<Self> {
        Ok(ClipTextTransformer {
            trunk: Trunk::new(crate::describe_text(vb, c)?, vb.device())?,
            config: c.clone(),
            device: vb.device().clone(),
        })
    }

    /// The position each row is pooled at ([`ClipTextConfig::pooled_token`]): the first
    /// `eos_token_id`, or with the legacy `eos_token_id == 2` the largest id (both as HF's
    /// `argmax`, first maximum wins).
    pub fn pool_positions(&self, inputs: &ClipTextInputs) -> Vec<usize> {
        self.config
            .pooled_token()
            .positions(&inputs.input_ids, inputs.seq)
    }

    /// Runs the tower: `(last_hidden_state [batch, seq, hidden], pooled [batch, hidden])`.
    pub fn forward(&self, inputs: &ClipTextInputs) -> Result<(Tensor<B, 3>, Tensor<B, 2>)> {
        inputs.check()?;
        let (b, s) = (inputs.batch, inputs.seq);
        if s > self.config.max_position_embeddings {
            return Err(Error::InvalidInput(format!(
                "sequence of {s} tokens is longer than the model's {} positions",
                self.config.max_position_embeddings
            )));
        }
        if let Some(table) = self.trunk.word_table() {
            table.check_ids("input_ids", &inputs.input_ids)?;
        }
        let ids = int_tensor::<B, 2>(inputs.input_ids.clone(), [b, s], &self.device);
        let positions: Vec<i64> = (0..b).flat_map(|_| 0..s as i64).collect();
        let positions = int_tensor::<B, 2>(positions, [b, s], &self.device);
        let out = self
            .trunk
            .forward_tokens(ids, &inputs.attention_mask, None, positions)?;
        let pooled = gather_tokens(&out.last_hidden_state, &self.pool_positions(inputs))?;
        Ok((out.last_hidden_state, pooled))
    }
}

/// `CLIPVisionTransformer` up to its last layer: class embedding + patch embeddings +
/// positions, `pre_layrnorm`, pre-LN encoder: CLIP's vision description
/// ([`crate::describe_vision`]) run by the shared burn trunk executor. `post_layernorm` of the
/// class token belongs to the projection ([`crate::describe_vision_projection`]).
pub struct ClipVisionTransformer<B: Backend> {
    trunk: Trunk<B>,
    config: ClipVisionConfig,
}

impl<B: Backend> ClipVisionTransformer<B> {
    /// Loads the tower under `vb` (HF's `vision_model`).
    pub fn load(vb: &VarBuilder<B>, c: &ClipVisionConfig) -> Result<Self> {
        let spec = crate::describe_vision(vb, c, "pre_layrnorm", c.num_hidden_layers)?;
        Ok(ClipVisionTransformer {
            trunk: Trunk::new(spec, vb.device())?,
            config: c.clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ClipVisionConfig {
        &self.config
    }

    /// Number of encoder layers.
    pub fn num_layers(&self) -> usize {
        self.trunk.spec().layers.len()
    }

    /// HF's `hidden_states[layers]`: the embeddings after `pre_layrnorm` and the first `layers`
    /// encoder layers (LLaVA reads layer −2, i.e. `num_layers() - 1`); images of another size
    /// than the configured one get bicubically interpolated position embeddings.
    pub fn hidden_state(&self, pixel_values: Tensor<B, 4>, layers: usize) -> Result<Tensor<B, 3>> {
        self.trunk.patches_hidden_state(pixel_values, layers)
    }

    /// Runs the whole tower: `last_hidden_state` `[batch, 1 + patches, hidden]` (no final
    /// norm, as HF).
    pub fn forward(&self, pixel_values: Tensor<B, 4>) -> Result<Tensor<B, 3>> {
        self.hidden_state(pixel_values, self.num_layers())
    }
}

/// Outputs of [`ClipModel::forward`], as HF's `CLIPOutput`.
#[derive(Debug, Clone)]
pub struct ClipOutput<B: Backend> {
    /// `[texts, projection_dim]`, L2-normalised.
    pub text_embeds: Tensor<B, 2>,
    /// `[images, projection_dim]`, L2-normalised.
    pub image_embeds: Tensor<B, 2>,
    /// `[images, texts]`: `exp(logit_scale) · image · text`.
    pub logits_per_image: Tensor<B, 2>,
    /// `[texts, images]`, the transpose.
    pub logits_per_text: Tensor<B, 2>,
}

/// `CLIPModel`: both towers, their projections into the shared space and the logit scale.
pub struct ClipModel<B: Backend> {
    /// The text tower.
    pub text: ClipTextTransformer<B>,
    /// The vision tower.
    pub vision: ClipVisionTransformer<B>,
    text_projection: EncoderProjection<Linear<B>, LayerNorm<B>>,
    visual_projection: EncoderProjection<Linear<B>, LayerNorm<B>>,
    logit_scale: f32,
    config: ClipConfig,
}

/// Reads the checkpoint's scalar `logit_scale` (a one-element tensor with a finite value; shared
/// with X-CLIP).
pub fn load_logit_scale(source: &dyn TensorSource) -> Result<f32> {
    let scale = source.tensor("logit_scale")?;
    match scale.to_f32_vec().as_slice() {
        [v] if v.is_finite() => Ok(*v),
        _ => Err(Error::ShapeMismatch {
            name: "logit_scale".into(),
            expected: vec![],
            actual: scale.shape().to_vec(),
        }),
    }
}

/// `x / ‖x‖₂` per row (HF's `_get_vector_norm`, no epsilon).
pub fn l2_normalize<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    let norm = x.clone().powi_scalar(2).sum_dim(1).sqrt();
    x / norm
}

impl<B: Backend> ClipModel<B> {
    /// Loads a `CLIPModel` checkpoint.
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &ClipConfig,
        device: &B::Device,
    ) -> Result<Self> {
        let logit_scale = load_logit_scale(source.as_ref())?;
        let vb = VarBuilder::<B>::new(source, device);
        let p = config.projection_dim;
        let (text, vision) = (vb.pp("text_model"), vb.pp("vision_model"));
        let vc = &config.vision_config;
        Ok(ClipModel {
            text: ClipTextTransformer::load(&text, &config.text_config)?,
            vision: ClipVisionTransformer::load(&vision, vc)?,
            text_projection: crate::describe_text_projection(&vb, &config.text_config, p)?,
            visual_projection: crate::describe_vision_projection(
                &vision,
                &vb,
                vc,
                p,
                "image_embeds",
            )?,
            logit_scale,
            config: config.clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ClipConfig {
        &self.config
    }

    /// `exp(logit_scale)`, the temperature of the logits.
    pub fn logit_temperature(&self) -> f32 {
        self.logit_scale.exp()
    }

    /// HF's `get_text_features`: projected pooled text `[batch, projection_dim]` (not
    /// normalised).
    pub fn text_features(&self, inputs: &ClipTextInputs) -> Result<Tensor<B, 2>> {
        let (_, pooled) = self.text.forward(inputs)?;
        Ok(project(&self.text_projection, pooled))
    }

    /// HF's `get_image_features`: projected pooled image `[batch, projection_dim]` (not
    /// normalised).
    pub fn image_features(&self, pixel_values: Tensor<B, 4>) -> Result<Tensor<B, 2>> {
        let x = self.vision.forward(pixel_values)?;
        Ok(project(&self.visual_projection, first_token(&x)))
    }

    /// Both towers, normalised embeddings and the image-text logits.
    pub fn forward(
        &self,
        inputs: &ClipTextInputs,
        pixel_values: Tensor<B, 4>,
    ) -> Result<ClipOutput<B>> {
        let text_embeds = l2_normalize(self.text_features(inputs)?);
        let image_embeds = l2_normalize(self.image_features(pixel_values)?);
        let logits_per_text = exact::matmul(text_embeds.clone(), image_embeds.clone().transpose())
            .mul_scalar(self.logit_temperature());
        Ok(ClipOutput {
            logits_per_image: logits_per_text.clone().transpose(),
            logits_per_text,
            text_embeds,
            image_embeds,
        })
    }
}
