//! CLIP's text and vision transformers, projections and image-text logits.

use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::{Error, Result, TensorSource};
use ipfs_accelerate_nn::{
    attention::{padding_bias, ProjectionBias},
    convert::int_tensor,
    exact,
    transformer::{PreLnConfig, PreLnEncoder, PreLnNames},
    vision::{ClassPatchEmbedding, PatchEmbedding},
    Activation, Embedding, LayerNorm, Linear, VarBuilder,
};

use crate::{ClipConfig, ClipTextConfig, ClipVisionConfig};

/// Loads a `CLIPEncoder` (`layers` pre-LN layers with CLIP's weight names, every projection
/// biased) stored under `<vb>.encoder.layers` (shared with X-CLIP's text tower and MIT).
pub fn load_encoder<B: Backend>(
    vb: &VarBuilder<B>,
    layers: usize,
    hidden: usize,
    heads: usize,
    intermediate: usize,
    act: Activation,
    eps: f64,
) -> Result<PreLnEncoder<B>> {
    let config = PreLnConfig {
        hidden,
        heads,
        intermediate,
        act,
        eps,
        bias: ProjectionBias::ALL,
    };
    PreLnEncoder::load(&vb.pp("encoder.layers"), layers, &config, &PreLnNames::CLIP)
}

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
/// pooled at the end-of-text token.
pub struct ClipTextTransformer<B: Backend> {
    token: Embedding<B>,
    position: Embedding<B>,
    encoder: PreLnEncoder<B>,
    final_norm: LayerNorm<B>,
    config: ClipTextConfig,
    device: B::Device,
}

impl<B: Backend> ClipTextTransformer<B> {
    /// Loads the tower under `vb` (HF's `text_model`).
    pub fn load(vb: &VarBuilder<B>, c: &ClipTextConfig) -> Result<Self> {
        let h = c.hidden_size;
        Ok(ClipTextTransformer {
            token: Embedding::load(&vb.pp("embeddings.token_embedding"), c.vocab_size, h)?,
            position: Embedding::load(
                &vb.pp("embeddings.position_embedding"),
                c.max_position_embeddings,
                h,
            )?,
            encoder: load_encoder(
                vb,
                c.num_hidden_layers,
                h,
                c.num_attention_heads,
                c.intermediate_size,
                c.hidden_act,
                c.layer_norm_eps,
            )?,
            final_norm: LayerNorm::load(&vb.pp("final_layer_norm"), h, c.layer_norm_eps)?,
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
        self.token.check_ids("input_ids", &inputs.input_ids)?;
        let ids = int_tensor::<B, 2>(inputs.input_ids.clone(), [b, s], &self.device);
        let positions: Vec<i64> = (0..b).flat_map(|_| 0..s as i64).collect();
        let positions = int_tensor::<B, 2>(positions, [b, s], &self.device);
        let x = self.token.forward(ids) + self.position.forward(positions);
        let heads = self.config.num_attention_heads;
        let bias = padding_bias::<B>(&inputs.attention_mask, b, s, heads, s, true, &self.device);
        let x = self
            .final_norm
            .forward(self.encoder.forward(x, Some(&bias)));
        let h = self.config.hidden_size;
        let rows: Vec<i64> = self
            .pool_positions(inputs)
            .iter()
            .enumerate()
            .map(|(r, &p)| (r * s + p) as i64)
            .collect();
        let pooled = x
            .clone()
            .reshape([b * s, h])
            .select(0, int_tensor::<B, 1>(rows, [b], &self.device));
        Ok((x, pooled))
    }
}

/// Loads `CLIPVisionEmbeddings` under `vb` (HF's `vision_model.embeddings`): the class
/// embedding, the bias-free patch embedding and the learned positions (shared with X-CLIP).
pub fn load_vision_embeddings<B: Backend>(
    vb: &VarBuilder<B>,
    c: &ClipVisionConfig,
) -> Result<ClassPatchEmbedding<B>> {
    let h = c.hidden_size;
    let n = c.grid() * c.grid() + 1;
    let patches = PatchEmbedding::load(
        &vb.pp("patch_embedding"),
        c.num_channels,
        h,
        c.patch_size,
        false,
    )?;
    Ok(ClassPatchEmbedding::new(
        vb.tensor("class_embedding", [h])?,
        patches,
        vb.tensor("position_embedding.weight", [n, h])?,
        (c.image_size, c.image_size),
    ))
}

/// Outputs of the vision tower.
#[derive(Debug, Clone)]
pub struct ClipVisionOutput<B: Backend> {
    /// `[batch, 1 + patches, hidden]` (no final norm, as HF).
    pub last_hidden_state: Tensor<B, 3>,
    /// `[batch, hidden]`: `post_layernorm` of the class token.
    pub pooler_output: Tensor<B, 2>,
}

/// `CLIPVisionTransformer`: class embedding + patch embeddings + positions, `pre_layrnorm`,
/// pre-LN encoder, `post_layernorm` on the class token.
pub struct ClipVisionTransformer<B: Backend> {
    embeddings: ClassPatchEmbedding<B>,
    pre_norm: LayerNorm<B>,
    encoder: PreLnEncoder<B>,
    post_norm: LayerNorm<B>,
    config: ClipVisionConfig,
}

impl<B: Backend> ClipVisionTransformer<B> {
    /// Loads the tower under `vb` (HF's `vision_model`).
    pub fn load(vb: &VarBuilder<B>, c: &ClipVisionConfig) -> Result<Self> {
        let h = c.hidden_size;
        Ok(ClipVisionTransformer {
            embeddings: load_vision_embeddings(&vb.pp("embeddings"), c)?,
            pre_norm: LayerNorm::load(&vb.pp("pre_layrnorm"), h, c.layer_norm_eps)?,
            encoder: load_encoder(
                vb,
                c.num_hidden_layers,
                h,
                c.num_attention_heads,
                c.intermediate_size,
                c.hidden_act,
                c.layer_norm_eps,
            )?,
            post_norm: LayerNorm::load(&vb.pp("post_layernorm"), h, c.layer_norm_eps)?,
            config: c.clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ClipVisionConfig {
        &self.config
    }

    /// Number of encoder layers.
    pub fn num_layers(&self) -> usize {
        self.encoder.len()
    }

    /// Embeddings after `pre_layrnorm` (HF's `hidden_states[0]`); images of another size than
    /// the configured one get bicubically interpolated position embeddings.
    pub fn embed(&self, pixel_values: Tensor<B, 4>) -> Result<Tensor<B, 3>> {
        Ok(self
            .pre_norm
            .forward(self.embeddings.forward(pixel_values)?))
    }

    /// HF's `hidden_states[layers]`: the embeddings after the first `layers` encoder layers
    /// (LLaVA reads layer −2, i.e. `num_layers() - 1`).
    pub fn hidden_state(&self, pixel_values: Tensor<B, 4>, layers: usize) -> Result<Tensor<B, 3>> {
        if layers > self.encoder.len() {
            return Err(Error::InvalidInput(format!(
                "hidden state {layers} requested from a {}-layer tower",
                self.encoder.len()
            )));
        }
        let x = self.embed(pixel_values)?;
        Ok(self.encoder.forward_layers(x, None, layers))
    }

    /// Runs the whole tower.
    pub fn forward(&self, pixel_values: Tensor<B, 4>) -> Result<ClipVisionOutput<B>> {
        let x = self.hidden_state(pixel_values, self.encoder.len())?;
        let [b, _, h] = x.dims();
        let cls: Tensor<B, 2> = x.clone().narrow(1, 0, 1).reshape([b, h]);
        Ok(ClipVisionOutput {
            pooler_output: self.post_norm.forward(cls),
            last_hidden_state: x,
        })
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
    text_projection: Linear<B>,
    visual_projection: Linear<B>,
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
        Ok(ClipModel {
            text: ClipTextTransformer::load(&vb.pp("text_model"), &config.text_config)?,
            vision: ClipVisionTransformer::load(&vb.pp("vision_model"), &config.vision_config)?,
            text_projection: Linear::load(
                &vb.pp("text_projection"),
                config.text_config.hidden_size,
                p,
                false,
            )?,
            visual_projection: Linear::load(
                &vb.pp("visual_projection"),
                config.vision_config.hidden_size,
                p,
                false,
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
        Ok(self.text_projection.forward(pooled))
    }

    /// HF's `get_image_features`: projected pooled image `[batch, projection_dim]` (not
    /// normalised).
    pub fn image_features(&self, pixel_values: Tensor<B, 4>) -> Result<Tensor<B, 2>> {
        let out = self.vision.forward(pixel_values)?;
        Ok(self.visual_projection.forward(out.pooler_output))
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
