//! Wav2Vec2 as a backend-neutral [`EncoderSpec`], for engines that do not run through burn: the
//! raw samples through the convolutional feature encoder (a GroupNorm per channel after the
//! first convolution, or a LayerNorm after each), the feature projection, the weight-normed
//! grouped positional convolution added to the tokens, then post-norm layers after the
//! encoder's `layer_norm` (base) or pre-norm layers before it ("stable layer norm"), and the CTC
//! `lm_head` on every token when the checkpoint has one. The layer names are the table the burn
//! model loads with.

use ipfs_accelerate_core::{
    ConvNorm, DenseWeights, EncoderHead, EncoderInput, EncoderSpec, Error, FrameConv,
    NormPlacement, PositionConv, Result, TensorSource, WaveformEmbeddings,
};
use ipfs_accelerate_nn::attention::ProjectionBias;
use ipfs_accelerate_nn::spec::SpecReader;

use crate::config::{FeatExtractNorm, Wav2Vec2Config};
use crate::model::{CONV_NORM_EPS, LAYER_NAMES};

/// The encoder of a `Wav2Vec2ForCTC` (tensors under `wav2vec2.`, `lm_head` as the head) or bare
/// `Wav2Vec2Model` checkpoint; its outputs are `last_hidden_state` and, with a CTC head, the
/// `logits`. Reads `input_values` `[batch, samples]` without an attention mask.
pub fn encoder_spec(config: &Wav2Vec2Config, source: &dyn TensorSource) -> Result<EncoderSpec> {
    let c = config;
    let h = c.hidden_size;
    let prefixed = source.contains("wav2vec2.feature_projection.projection.weight");
    let root = SpecReader::new(source, if prefixed { "wav2vec2" } else { "" });
    let mut convs = Vec::with_capacity(c.conv_dim.len());
    let mut norms = Vec::with_capacity(c.conv_dim.len());
    let mut channels = 1;
    for (i, ((&out, &kernel), &stride)) in c
        .conv_dim
        .iter()
        .zip(&c.conv_kernel)
        .zip(&c.conv_stride)
        .enumerate()
    {
        let layer = root.pp(&format!("feature_extractor.conv_layers.{i}"));
        let mut conv = layer.matrix("conv.weight", out, channels * kernel)?;
        if c.conv_bias {
            conv.bias = layer.read("conv.bias", &[out])?;
        }
        convs.push(FrameConv {
            conv,
            kernel,
            stride,
            padding: 0,
        });
        norms.push(match (c.feat_extract_norm, i) {
            (FeatExtractNorm::Group, 0) => Some(ConvNorm::Channel(layer.norm("layer_norm", out)?)),
            (FeatExtractNorm::Group, _) => None,
            (FeatExtractNorm::Layer, _) => Some(ConvNorm::Frame(layer.norm("layer_norm", out)?)),
        });
        channels = out;
    }
    if convs.is_empty() {
        return Err(Error::config("config.json", "conv_dim must not be empty"));
    }
    let (kernel, groups) = (c.num_conv_pos_embeddings, c.num_conv_pos_embedding_groups);
    if groups == 0 || !h.is_multiple_of(groups) {
        return Err(Error::config(
            "config.json",
            format!("num_conv_pos_embedding_groups {groups} does not divide hidden_size {h}"),
        ));
    }
    let pos = root.pp("encoder.pos_conv_embed.conv");
    let position = PositionConv {
        conv: DenseWeights::new(
            h,
            h / groups * kernel,
            pos.weight_normed(&[h, h / groups, kernel], 2)?,
            pos.read("bias", &[h])?,
        ),
        kernel,
        groups,
    };
    let activation = c.feat_extract_activation;
    let input = EncoderInput::Waveform(WaveformEmbeddings {
        convs,
        norms,
        conv_eps: CONV_NORM_EPS as f32,
        activation,
        projection_norm: root.norm("feature_projection.layer_norm", channels)?,
        projection: root.dense("feature_projection.projection", h, channels)?,
        position,
    });
    let encoder_norm = root.norm("encoder.layer_norm", h)?;
    let stable = c.do_stable_layer_norm;
    let top = SpecReader::new(source, "");
    let head = if c.has_ctc_head() || top.has("lm_head.weight") {
        Some(EncoderHead::EveryToken(top.dense(
            "lm_head",
            c.vocab_size,
            h,
        )?))
    } else {
        None
    };
    let spec = EncoderSpec {
        family: "wav2vec2".into(),
        hidden: h,
        heads: c.num_attention_heads,
        intermediate: c.intermediate_size,
        eps: c.layer_norm_eps as f32,
        activation: c.hidden_act,
        input,
        // Base: `layer_norm(tokens + positions)` before post-norm layers; stable: pre-norm layers
        // and the same norm after the last.
        embedding_norm: (!stable).then(|| encoder_norm.clone()),
        norm: if stable {
            NormPlacement::Pre
        } else {
            NormPlacement::Post
        },
        // The burn layers read the same names in both placements: `layer_norm` is the norm at
        // the attention (before it or after its residual), `final_layer_norm` the MLP's.
        layers: (0..c.num_hidden_layers)
            .map(|n| {
                root.pp(&format!("encoder.layers.{n}")).pre_ln_layer(
                    &LAYER_NAMES,
                    h,
                    c.intermediate_size,
                    ProjectionBias::ALL,
                )
            })
            .collect::<Result<_>>()?,
        final_norm: stable.then_some(encoder_norm),
        pooler: None,
        head,
        causal: false,
        projection: None,
    };
    spec.validate()?;
    Ok(spec)
}
