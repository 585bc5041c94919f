//! Wav2Vec2: convolutional feature encoder, feature projection, weight-normed positional
//! convolution, transformer encoder (post-LN or "stable" pre-LN) and the CTC head.

use ipfs_accelerate_nn::ActivationForward;
use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor, TensorData};
use ipfs_accelerate_core::{Error, Result, TensorSource};
use ipfs_accelerate_nn::{
    attention::{
        padding_bias, AttentionConfig, MultiHeadAttention, ProjectionBias, ProjectionNames,
    },
    conv::{load_weight_normed, Conv1d, ConvParams, GroupNorm},
    transformer::{Mlp, PreLnConfig, PreLnLayer, PreLnNames},
    Activation, LayerNorm, Linear, VarBuilder,
};

use crate::config::{FeatExtractNorm, Wav2Vec2Config};

/// PyTorch's default `eps` of `nn.GroupNorm` / `nn.LayerNorm`, used by the feature encoder.
pub(crate) const CONV_NORM_EPS: f64 = 1e-5;

enum ConvNorm<B: Backend> {
    None,
    Group(GroupNorm<B>),
    /// Layer norm over channels (applied on `[batch, time, channels]`).
    Layer(LayerNorm<B>),
}

struct ConvLayer<B: Backend> {
    conv: Conv1d<B>,
    norm: ConvNorm<B>,
}

/// `Wav2Vec2FeatureEncoder`: raw samples `[batch, samples]` → features `[batch, channels, frames]`.
pub struct FeatureEncoder<B: Backend> {
    layers: Vec<ConvLayer<B>>,
    act: Activation,
}

impl<B: Backend> FeatureEncoder<B> {
    /// Loads `conv_layers.{i}` under `vb`.
    pub fn load(vb: &VarBuilder<B>, c: &Wav2Vec2Config) -> Result<Self> {
        let mut layers = Vec::with_capacity(c.conv_dim.len());
        let mut in_ch = 1;
        for (i, ((&out_ch, &k), &s)) in c
            .conv_dim
            .iter()
            .zip(&c.conv_kernel)
            .zip(&c.conv_stride)
            .enumerate()
        {
            let lv = vb.pp(format!("conv_layers.{i}"));
            let params = ConvParams::<1>::default()
                .with_stride(s)
                .with_bias(c.conv_bias);
            let conv = Conv1d::load(&lv.pp("conv"), in_ch, out_ch, [k], params)?;
            let norm = match (c.feat_extract_norm, i) {
                (FeatExtractNorm::Group, 0) => ConvNorm::Group(GroupNorm::load(
                    &lv.pp("layer_norm"),
                    out_ch,
                    out_ch,
                    CONV_NORM_EPS,
                )?),
                (FeatExtractNorm::Group, _) => ConvNorm::None,
                (FeatExtractNorm::Layer, _) => ConvNorm::Layer(LayerNorm::load(
                    &lv.pp("layer_norm"),
                    out_ch,
                    CONV_NORM_EPS,
                )?),
            };
            layers.push(ConvLayer { conv, norm });
            in_ch = out_ch;
        }
        Ok(FeatureEncoder {
            layers,
            act: c.feat_extract_activation,
        })
    }

    /// Runs the convolutions; the caller checks the input is at least one receptive field long.
    pub fn forward(&self, samples: Tensor<B, 2>) -> Tensor<B, 3> {
        let mut x: Tensor<B, 3> = samples.unsqueeze_dim(1);
        for layer in &self.layers {
            x = layer.conv.forward(x);
            x = match &layer.norm {
                ConvNorm::None => x,
                ConvNorm::Group(g) => g.forward(x),
                ConvNorm::Layer(l) => l.forward(x.swap_dims(1, 2)).swap_dims(1, 2),
            };
            x = self.act.forward(x);
        }
        x
    }
}

/// `Wav2Vec2PositionalConvEmbedding`: grouped convolution over time with "same" padding (the last
/// frame dropped for even kernels), weight-normed over the kernel dimension, then the activation.
struct PositionalConv<B: Backend> {
    conv: Conv1d<B>,
    remove_last: bool,
    act: Activation,
}

impl<B: Backend> PositionalConv<B> {
    fn load(vb: &VarBuilder<B>, c: &Wav2Vec2Config) -> Result<Self> {
        let (h, k, g) = (
            c.hidden_size,
            c.num_conv_pos_embeddings,
            c.num_conv_pos_embedding_groups,
        );
        let cv = vb.pp("conv");
        let weight = load_weight_normed(&cv, [h, h / g, k], 2)?;
        let bias = cv.tensor("bias", [h])?;
        let params = ConvParams::<1>::default()
            .with_padding(k / 2)
            .with_groups(g);
        Ok(PositionalConv {
            conv: Conv1d::from_tensors(weight, Some(bias), params)?,
            remove_last: k.is_multiple_of(2),
            act: c.feat_extract_activation,
        })
    }

    /// `[batch, time, hidden]` → position embeddings of the same shape.
    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let [_, t, _] = x.dims();
        let mut y = self.conv.forward(x.swap_dims(1, 2));
        if self.remove_last {
            y = y.narrow(2, 0, t);
        }
        self.act.forward(y).swap_dims(1, 2)
    }
}

/// The weight names of a transformer layer (`Wav2Vec2EncoderLayer[StableLayerNorm]`).
pub(crate) const LAYER_NAMES: PreLnNames<'static> = PreLnNames {
    norm1: "layer_norm",
    attention: ProjectionNames {
        q: "attention.q_proj",
        k: "attention.k_proj",
        v: "attention.v_proj",
        o: "attention.out_proj",
    },
    norm2: "final_layer_norm",
    fc1: "feed_forward.intermediate_dense",
    fc2: "feed_forward.output_dense",
};

enum EncoderLayer<B: Backend> {
    /// `Wav2Vec2EncoderLayer`: `ln(x + attn(x))`, then `final_ln(h + ff(h))`.
    PostLn {
        attention: MultiHeadAttention<B>,
        layer_norm: LayerNorm<B>,
        feed_forward: Mlp<B>,
        final_layer_norm: LayerNorm<B>,
    },
    /// `Wav2Vec2EncoderLayerStableLayerNorm`: the shared pre-LN layer.
    Stable(PreLnLayer<B>),
}

impl<B: Backend> EncoderLayer<B> {
    fn load(vb: &VarBuilder<B>, c: &Wav2Vec2Config) -> Result<Self> {
        let (h, eps) = (c.hidden_size, c.layer_norm_eps);
        if c.do_stable_layer_norm {
            let config = PreLnConfig {
                hidden: h,
                heads: c.num_attention_heads,
                intermediate: c.intermediate_size,
                act: c.hidden_act,
                eps,
                bias: ProjectionBias::ALL,
            };
            return Ok(EncoderLayer::Stable(PreLnLayer::load(
                vb,
                &config,
                &LAYER_NAMES,
            )?));
        }
        Ok(EncoderLayer::PostLn {
            attention: MultiHeadAttention::load(
                vb,
                AttentionConfig::new(h, c.num_attention_heads, ProjectionBias::ALL),
                LAYER_NAMES.attention,
            )?,
            layer_norm: LayerNorm::load(&vb.pp(LAYER_NAMES.norm1), h, eps)?,
            feed_forward: Mlp::load(
                vb,
                (LAYER_NAMES.fc1, LAYER_NAMES.fc2),
                h,
                c.intermediate_size,
                c.hidden_act,
            )?,
            final_layer_norm: LayerNorm::load(&vb.pp(LAYER_NAMES.norm2), h, eps)?,
        })
    }

    fn forward(&self, x: Tensor<B, 3>, bias: Option<&Tensor<B, 4>>) -> Tensor<B, 3> {
        match self {
            EncoderLayer::Stable(layer) => layer.forward(x, bias),
            EncoderLayer::PostLn {
                attention,
                layer_norm,
                feed_forward,
                final_layer_norm,
            } => {
                let h = layer_norm.forward(x.clone() + attention.forward(x, bias));
                final_layer_norm.forward(h.clone() + feed_forward.forward(h))
            }
        }
    }
}

/// Outputs of [`Wav2Vec2Model::forward`].
#[derive(Debug, Clone)]
pub struct Wav2Vec2Output<B: Backend> {
    /// `[batch, frames, hidden]`.
    pub last_hidden_state: Tensor<B, 3>,
    /// Per row, the number of frames that hold audio (all frames without an attention mask).
    pub frame_lengths: Vec<usize>,
}

/// `Wav2Vec2Model`: feature encoder, projection and transformer encoder.
pub struct Wav2Vec2Model<B: Backend> {
    feature_encoder: FeatureEncoder<B>,
    projection_norm: LayerNorm<B>,
    projection: Linear<B>,
    pos_conv: PositionalConv<B>,
    encoder_norm: LayerNorm<B>,
    layers: Vec<EncoderLayer<B>>,
    config: Wav2Vec2Config,
    device: B::Device,
}

impl<B: Backend> Wav2Vec2Model<B> {
    /// Loads the model from `vb` (rooted where `feature_extractor.` and `encoder.` live).
    pub fn load(vb: &VarBuilder<B>, c: &Wav2Vec2Config) -> Result<Self> {
        let last = *c
            .conv_dim
            .last()
            .ok_or_else(|| Error::config("config.json", "conv_dim must not be empty"))?;
        Ok(Wav2Vec2Model {
            feature_encoder: FeatureEncoder::load(&vb.pp("feature_extractor"), c)?,
            projection_norm: LayerNorm::load(
                &vb.pp("feature_projection.layer_norm"),
                last,
                c.layer_norm_eps,
            )?,
            projection: Linear::load(
                &vb.pp("feature_projection.projection"),
                last,
                c.hidden_size,
                true,
            )?,
            pos_conv: PositionalConv::load(&vb.pp("encoder.pos_conv_embed"), c)?,
            encoder_norm: LayerNorm::load(
                &vb.pp("encoder.layer_norm"),
                c.hidden_size,
                c.layer_norm_eps,
            )?,
            layers: (0..c.num_hidden_layers)
                .map(|i| EncoderLayer::load(&vb.pp(format!("encoder.layers.{i}")), c))
                .collect::<Result<_>>()?,
            config: c.clone(),
            device: vb.device().clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &Wav2Vec2Config {
        &self.config
    }

    /// Runs the model on `input_values` (row-major `[batch, samples]`). `attention_mask` (same
    /// layout, 1 = sample, 0 = padding) is reduced to frames as HF does: padded frames are zeroed
    /// before the positional convolution and masked as attention keys.
    pub fn forward(
        &self,
        input_values: &[f32],
        batch: usize,
        attention_mask: Option<&[i64]>,
    ) -> Result<Wav2Vec2Output<B>> {
        if batch == 0 || input_values.is_empty() || !input_values.len().is_multiple_of(batch) {
            return Err(Error::InvalidInput(format!(
                "input_values: {} samples do not form {batch} non-empty rows",
                input_values.len()
            )));
        }
        let samples = input_values.len() / batch;
        if let Some(i) = input_values.iter().position(|v| !v.is_finite()) {
            return Err(Error::InvalidInput(format!(
                "input_values[{i}] is not finite ({})",
                input_values[i]
            )));
        }
        let frames = self.config.output_frames(samples).ok_or_else(|| {
            Error::InvalidInput(format!(
                "{samples} samples are shorter than the feature encoder's receptive field"
            ))
        })?;
        let frame_lengths = match attention_mask {
            None => vec![frames; batch],
            Some(m) if m.len() != input_values.len() => {
                return Err(Error::InvalidInput(format!(
                    "attention_mask has {} values, input_values {}",
                    m.len(),
                    input_values.len()
                )))
            }
            Some(m) => m
                .chunks(samples)
                .enumerate()
                .map(|(row, r)| {
                    let len = r.iter().filter(|&&v| v != 0).count();
                    self.config.output_frames(len).ok_or_else(|| {
                        Error::InvalidInput(format!(
                            "row {row} has {len} unmasked samples, fewer than one frame's receptive field"
                        ))
                    })
                })
                .collect::<Result<Vec<_>>>()?,
        };
        let x = Tensor::<B, 2>::from_data(
            TensorData::new(input_values.to_vec(), [batch, samples]),
            &self.device,
        );
        let features = self.feature_encoder.forward(x).swap_dims(1, 2);
        let mut x = self
            .projection
            .forward(self.projection_norm.forward(features));
        let padded = frame_lengths.iter().any(|&l| l < frames);
        let bias = if padded {
            let mask: Vec<i64> = frame_lengths
                .iter()
                .flat_map(|&l| (0..frames).map(move |t| i64::from(t < l)))
                .collect();
            let keep = Tensor::<B, 2>::from_data(
                TensorData::new(
                    mask.iter().map(|&m| m as f32).collect::<Vec<_>>(),
                    [batch, frames],
                ),
                &self.device,
            );
            x = x * keep.unsqueeze_dim::<3>(2);
            let heads = self.config.num_attention_heads;
            Some(padding_bias::<B>(
                &mask,
                batch,
                frames,
                heads,
                frames,
                false,
                &self.device,
            ))
        } else {
            None
        };
        x = x.clone() + self.pos_conv.forward(x);
        if !self.config.do_stable_layer_norm {
            x = self.encoder_norm.forward(x);
        }
        for layer in &self.layers {
            x = layer.forward(x, bias.as_ref());
        }
        if self.config.do_stable_layer_norm {
            x = self.encoder_norm.forward(x);
        }
        Ok(Wav2Vec2Output {
            last_hidden_state: x,
            frame_lengths,
        })
    }
}

/// A Wav2Vec2 checkpoint: the bare model, or `Wav2Vec2ForCTC` with its `lm_head`.
pub struct Wav2Vec2<B: Backend> {
    /// The model.
    pub model: Wav2Vec2Model<B>,
    lm_head: Option<Linear<B>>,
}

impl<B: Backend> Wav2Vec2<B> {
    /// Loads from a weight source: tensors under `wav2vec2.` with `lm_head` (CTC) or unprefixed
    /// (bare `Wav2Vec2Model`).
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &Wav2Vec2Config,
        device: &B::Device,
    ) -> Result<Self> {
        let root = VarBuilder::<B>::new(source.clone(), device);
        let prefixed = source.contains("wav2vec2.feature_projection.projection.weight");
        let base = if prefixed {
            root.pp("wav2vec2")
        } else {
            root.clone()
        };
        let model = Wav2Vec2Model::load(&base, config)?;
        let lm_head = if config.has_ctc_head() || root.contains("lm_head.weight") {
            Some(Linear::load(
                &root.pp("lm_head"),
                config.hidden_size,
                config.vocab_size,
                true,
            )?)
        } else {
            None
        };
        Ok(Wav2Vec2 { model, lm_head })
    }

    /// The configuration.
    pub fn config(&self) -> &Wav2Vec2Config {
        self.model.config()
    }

    /// CTC logits `[batch, frames, vocab]`, when the checkpoint has a CTC head.
    pub fn ctc_logits(&self, hidden: Tensor<B, 3>) -> Option<Tensor<B, 3>> {
        self.lm_head.as_ref().map(|h| h.forward(hidden))
    }
}
