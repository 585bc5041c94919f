//! Wav2Vec2 described once ([`describe`]), for the engines that do not run through burn
//! ([`encoder_spec`]: host values) and for the burn model ([`crate::Wav2Vec2Model`]): the raw
//! samples through the convolutional feature encoder (a GroupNorm per channel after the first
//! convolution, or a LayerNorm after each), the feature projection, the weight-normed grouped
//! positional convolution added to the tokens, then post-norm layers after the encoder's
//! `layer_norm` (base) or pre-norm layers before it ("stable layer norm"), and the CTC `lm_head`
//! on every token when the checkpoint has one.

use ipfs_accelerate_core::{
    ConvNorm, EncoderHead, EncoderInput, EncoderSpec, Error, FrameConv, NormPlacement,
    PositionConv, Result, TensorSource, WaveformEmbeddings,
};
use ipfs_accelerate_nn::attention::ProjectionBias;
use ipfs_accelerate_nn::spec::{pre_norm_layer, SpecReader, WeightReader};

use crate::config::{FeatExtractNorm, Wav2Vec2Config};
use crate::model::{CONV_NORM_EPS, LAYER_NAMES};

/// The encoder of a `Wav2Vec2ForCTC` (tensors under `wav2vec2.`, `lm_head` as the head) or bare
/// `Wav2Vec2Model` checkpoint as host values; its outputs are `last_hidden_state` and, with a
/// CTC head, the `logits`. Reads `input_values` `[batch, samples]` without an attention mask.
pub fn encoder_spec(config: &Wav2Vec2Config, source: &dyn TensorSource) -> Result<EncoderSpec> {
    let top = SpecReader::new(source, "");
    let model = SpecReader::new(source, model_prefix(source));
    let spec = describe(&model, config, ctc_head(&top, config)?)?;
    spec.validate()?;
    Ok(spec)
}

/// Where the model's tensors live: under `wav2vec2` in a `Wav2Vec2ForCTC` checkpoint, at the
/// root of a bare `Wav2Vec2Model`.
pub(crate) fn model_prefix(source: &dyn TensorSource) -> &'static str {
    if source.contains("wav2vec2.feature_projection.projection.weight") {
        "wav2vec2"
    } else {
        ""
    }
}

/// The CTC head `lm_head` read by `top` (the checkpoint's root), when the config or the
/// checkpoint has one.
pub fn ctc_head<R: WeightReader>(
    top: &R,
    config: &Wav2Vec2Config,
) -> Result<Option<EncoderHead<R::Dense>>> {
    if !(config.has_ctc_head() || top.holds("lm_head.weight")) {
        return Ok(None);
    }
    let head = top.linear("lm_head", config.vocab_size, config.hidden_size, true)?;
    Ok(Some(EncoderHead::EveryToken(head)))
}

/// Wav2Vec2, the one description of it, read by `model` (where `feature_extractor.` and
/// `encoder.` live) as host values or burn modules, with `head` on every token.
pub fn describe<R: WeightReader>(
    model: &R,
    config: &Wav2Vec2Config,
    head: Option<EncoderHead<R::Dense>>,
) -> Result<EncoderSpec<R::Dense, R::Norm, R::Table>> {
    let c = config;
    let (h, eps) = (c.hidden_size, c.layer_norm_eps);
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
        let layer = model.under(&format!("feature_extractor.conv_layers.{i}"));
        convs.push(FrameConv {
            conv: layer.flattened("conv", out, &[channels, kernel], c.conv_bias)?,
            kernel,
            stride,
            padding: 0,
        });
        let norm = || layer.layer_norm("layer_norm", out, CONV_NORM_EPS);
        norms.push(match (c.feat_extract_norm, i) {
            (FeatExtractNorm::Group, 0) => Some(ConvNorm::Channel(norm()?)),
            (FeatExtractNorm::Group, _) => None,
            (FeatExtractNorm::Layer, _) => Some(ConvNorm::Frame(norm()?)),
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
    let position = PositionConv {
        conv: model.under("encoder.pos_conv_embed").weight_normed_conv(
            "conv",
            h,
            [h / groups, kernel],
            2,
            true,
        )?,
        kernel,
        groups,
    };
    let input = EncoderInput::Waveform(WaveformEmbeddings {
        convs,
        norms,
        conv_eps: CONV_NORM_EPS as f32,
        activation: c.feat_extract_activation,
        projection_norm: model.layer_norm("feature_projection.layer_norm", channels, eps)?,
        projection: model.linear("feature_projection.projection", h, channels, true)?,
        position,
    });
    let stable = c.do_stable_layer_norm;
    // Base: `layer_norm(tokens + positions)` before post-norm layers; stable: pre-norm layers
    // and the same norm after the last.
    let encoder_norm = Some(model.layer_norm("encoder.layer_norm", h, eps)?);
    let (embedding_norm, final_norm) = if stable {
        (None, encoder_norm)
    } else {
        (encoder_norm, None)
    };
    Ok(EncoderSpec {
        family: "wav2vec2".into(),
        hidden: h,
        heads: c.num_attention_heads,
        intermediate: c.intermediate_size,
        eps: eps as f32,
        activation: c.hidden_act,
        input,
        embedding_norm,
        norm: if stable {
            NormPlacement::Pre
        } else {
            NormPlacement::Post
        },
        // The same names in both placements: `layer_norm` is the norm at the attention (before
        // it or after its residual), `final_layer_norm` the MLP's.
        layers: (0..c.num_hidden_layers)
            .map(|n| {
                pre_norm_layer(
                    &model.under(&format!("encoder.layers.{n}")),
                    &LAYER_NAMES,
                    (h, c.intermediate_size),
                    ProjectionBias::ALL,
                    eps,
                )
            })
            .collect::<Result<_>>()?,
        final_norm,
        pooler: None,
        head,
        causal: false,
        projection: None,
    })
}
