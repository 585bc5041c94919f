//! CLIP's two towers described once ([`describe_text`], [`describe_vision`] and their
//! projections), read as backend-neutral [`EncoderSpec`]s for engines that do not run through
//! burn (the cuBLAS encoder of the `cuda` feature) or as burn modules for
//! [`crate::ClipModel`]: the text tower (token + position embeddings,
//! causal pre-norm layers, final norm, the end-of-text token projected) and the vision tower
//! (bias-free patch embedding, class token, `pre_layrnorm`, pre-norm layers, `post_layernorm` on
//! the class token, projected). The names come from the tables the burn model loads with
//! (`PreLnNames::CLIP`); [`TowerRunner`](crate::TowerRunner) combines two towers into
//! `CLIPModel`'s outputs.

use std::sync::Arc;

use ipfs_accelerate_core::{
    EncoderHead, EncoderInput, EncoderProjection, EncoderSpec, NormPlacement, PatchEmbeddings,
    PooledToken, Result, TensorSource, TokenEmbeddings,
};
use ipfs_accelerate_nn::{
    attention::ProjectionBias,
    spec::{pre_norm_layer, SpecReader, WeightReader},
    transformer::PreLnNames,
};

use crate::{ClipConfig, ClipTextConfig, ClipVisionConfig};

impl ClipTextConfig {
    /// The token each text row is pooled at: the first `eos_token_id`, or with the legacy
    /// `eos_token_id == 2` the largest id.
    pub fn pooled_token(&self) -> PooledToken {
        match self.eos_token_id.first().unwrap_or(2) {
            2 => PooledToken::LargestId,
            eos => PooledToken::FirstOf(eos),
        }
    }
}

/// A `CLIPEncoder` as both towers (and X-CLIP's MIT) fill it: its sizes, its pre-norm CLIP
/// layers under `tower` (`<tower>.encoder.layers.N`, the first `layers` of them, every
/// projection biased) and `input`; no norms, pooler, head or projection yet.
#[allow(clippy::too_many_arguments)]
pub fn describe_encoder<R: WeightReader>(
    tower: &R,
    hidden: usize,
    heads: usize,
    intermediate: usize,
    layers: usize,
    eps: f64,
    act: ipfs_accelerate_nn::Activation,
    input: EncoderInput<R::Dense, R::Norm, R::Table>,
) -> Result<EncoderSpec<R::Dense, R::Norm, R::Table>> {
    Ok(EncoderSpec {
        family: "clip".into(),
        hidden,
        heads,
        intermediate,
        eps: eps as f32,
        activation: act,
        input,
        embedding_norm: None,
        norm: NormPlacement::Pre,
        layers: (0..layers)
            .map(|n| {
                pre_norm_layer(
                    &tower.under(&format!("encoder.layers.{n}")),
                    &PreLnNames::CLIP,
                    (hidden, intermediate),
                    ProjectionBias::ALL,
                    eps,
                )
            })
            .collect::<Result<_>>()?,
        final_norm: None,
        pooler: None,
        head: None,
        causal: false,
        projection: None,
    })
}

/// The text tower of a `CLIPModel` checkpoint (`text_model.*`, `text_projection`), its output
/// `text_embeds` before normalisation.
pub fn text_encoder_spec(config: &ClipConfig, source: &dyn TensorSource) -> Result<EncoderSpec> {
    text_tower_spec(&config.text_config, config.projection_dim, source)
}

/// A CLIP text tower of configuration `c` (`text_model.*`, `text_projection` to
/// `projection_dim`; X-CLIP's too), its output `text_embeds` before normalisation.
pub fn text_tower_spec(
    c: &ClipTextConfig,
    projection_dim: usize,
    source: &dyn TensorSource,
) -> Result<EncoderSpec> {
    let root = SpecReader::new(source, "");
    let spec = EncoderSpec {
        projection: Some(describe_text_projection(&root, c, projection_dim)?),
        ..describe_text(&SpecReader::new(source, "text_model"), c)?
    };
    spec.validate()?;
    Ok(spec)
}

/// CLIP's text tower, the one description of it: token and position embeddings, causal
/// pre-norm layers and the final norm, read by `text` (HF's `text_model`) as host values for
/// the engines or as burn modules for [`crate::ClipTextTransformer`]. Its projection comes from
/// [`describe_text_projection`].
pub fn describe_text<R: WeightReader>(
    text: &R,
    c: &ClipTextConfig,
) -> Result<EncoderSpec<R::Dense, R::Norm, R::Table>> {
    let h = c.hidden_size;
    let emb = text.under("embeddings");
    let input = EncoderInput::Tokens(TokenEmbeddings {
        vocab: c.vocab_size,
        max_positions: c.max_position_embeddings,
        type_vocab: 0,
        word: emb.table("token_embedding.weight", &[c.vocab_size, h])?,
        position: emb.table("position_embedding.weight", &[c.max_position_embeddings, h])?,
        token_type: None,
        padding_idx: None,
    });
    Ok(EncoderSpec {
        final_norm: Some(text.layer_norm("final_layer_norm", h, c.layer_norm_eps)?),
        causal: true,
        ..describe_encoder(
            text,
            c.hidden_size,
            c.num_attention_heads,
            c.intermediate_size,
            c.num_hidden_layers,
            c.layer_norm_eps,
            c.hidden_act,
            input,
        )?
    })
}

/// `text_projection` (under `root`, bias-free, to `projection_dim`) of each row's pooled token
/// ([`ClipTextConfig::pooled_token`]), the output `text_embeds`.
pub fn describe_text_projection<R: WeightReader>(
    root: &R,
    c: &ClipTextConfig,
    projection_dim: usize,
) -> Result<EncoderProjection<R::Dense, R::Norm>> {
    Ok(EncoderProjection {
        output: "text_embeds".into(),
        token: c.pooled_token(),
        norm: None,
        hidden: None,
        dense: root.linear("text_projection", projection_dim, c.hidden_size, false)?,
    })
}

/// The vision tower of a `CLIPModel` checkpoint (`vision_model.*`, `visual_projection`), its
/// output `image_embeds` before normalisation. Images must be of the configured size (the burn
/// model interpolates the positions for others).
pub fn vision_encoder_spec(config: &ClipConfig, source: &dyn TensorSource) -> Result<EncoderSpec> {
    let c = &config.vision_config;
    vision_tower_spec(
        c,
        config.projection_dim,
        source,
        "pre_layrnorm",
        "image_embeds",
    )
}

/// A CLIP vision tower of configuration `c` (`vision_model.*`, its norm after the embeddings
/// named `pre_norm`; `post_layernorm` and `visual_projection` to `projection_dim` of each class
/// token, under the output name `output`). X-CLIP's vision tower is this with cross-frame
/// messages.
pub fn vision_tower_spec(
    c: &ClipVisionConfig,
    projection_dim: usize,
    source: &dyn TensorSource,
    pre_norm: &str,
    output: &str,
) -> Result<EncoderSpec> {
    let root = SpecReader::new(source, "");
    let vision = SpecReader::new(source, "vision_model");
    let spec = EncoderSpec {
        projection: Some(describe_vision_projection(
            &vision,
            &root,
            c,
            projection_dim,
            output,
        )?),
        ..describe_vision(&vision, c, pre_norm, c.num_hidden_layers)?
    };
    spec.validate()?;
    Ok(spec)
}

/// `post_layernorm` (under `vision`) and `visual_projection` (under `root`, bias-free, to
/// `projection_dim`) of each image's class token, under the output name `output`.
pub fn describe_vision_projection<R: WeightReader>(
    vision: &R,
    root: &R,
    c: &ClipVisionConfig,
    projection_dim: usize,
    output: &str,
) -> Result<EncoderProjection<R::Dense, R::Norm>> {
    let h = c.hidden_size;
    Ok(EncoderProjection {
        output: output.into(),
        token: PooledToken::First,
        norm: Some(vision.layer_norm("post_layernorm", h, c.layer_norm_eps)?),
        hidden: None,
        dense: root.linear("visual_projection", projection_dim, h, false)?,
    })
}

/// A CLIP vision tower under `prefix` (LLaVA's `vision_tower.vision_model`) read at its hidden
/// state `layers` (HF's `hidden_states[layers]`: the first `layers` layers after `pre_layrnorm`,
/// no final norm), with `head` over every token (LLaVA's projector) when given.
pub fn vision_hidden_state_spec(
    c: &ClipVisionConfig,
    source: &dyn TensorSource,
    prefix: &str,
    layers: usize,
    head: Option<EncoderHead>,
) -> Result<EncoderSpec> {
    let spec = EncoderSpec {
        head,
        ..describe_vision(&SpecReader::new(source, prefix), c, "pre_layrnorm", layers)?
    };
    spec.validate()?;
    Ok(spec)
}

/// CLIP's vision tower, the one description of it: the bias-free patch embedding, class token
/// and learned positions, the norm after them (named `pre_norm`: `pre_layrnorm` in CLIP,
/// `pre_layernorm` in X-CLIP) and the first `layers` pre-norm layers, read by `vision` (HF's
/// `vision_model`) as host values for the engines or as burn modules for
/// [`crate::ClipVisionTransformer`]. Its projection comes from [`describe_vision_projection`].
pub fn describe_vision<R: WeightReader>(
    vision: &R,
    c: &ClipVisionConfig,
    pre_norm: &str,
    layers: usize,
) -> Result<EncoderSpec<R::Dense, R::Norm, R::Table>> {
    if layers > c.num_hidden_layers {
        return Err(ipfs_accelerate_core::Error::InvalidInput(format!(
            "hidden state {layers} of a vision tower of {} layers",
            c.num_hidden_layers
        )));
    }
    let (h, p, ch) = (c.hidden_size, c.patch_size, c.num_channels);
    let emb = vision.under("embeddings");
    let input = EncoderInput::Patches(PatchEmbeddings {
        channels: ch,
        patch: p,
        image: (c.image_size, c.image_size),
        projection: emb.flattened("patch_embedding", h, &[ch, p, p], false)?,
        class: emb.table("class_embedding", &[h])?,
        position: emb.table("position_embedding.weight", &[c.grid() * c.grid() + 1, h])?,
    });
    Ok(EncoderSpec {
        embedding_norm: Some(vision.layer_norm(pre_norm, h, c.layer_norm_eps)?),
        ..describe_encoder(
            vision,
            h,
            c.num_attention_heads,
            c.intermediate_size,
            layers,
            c.layer_norm_eps,
            c.hidden_act,
            input,
        )?
    })
}

/// Both towers' specs and the checkpoint's `logit_scale`.
pub fn encoder_specs(
    config: &ClipConfig,
    source: Arc<dyn TensorSource>,
) -> Result<(EncoderSpec, EncoderSpec, f32)> {
    Ok((
        text_encoder_spec(config, source.as_ref())?,
        vision_encoder_spec(config, source.as_ref())?,
        crate::load_logit_scale(source.as_ref())?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipfs_accelerate_conformance::{
        assert_checks, family_fixtures, verify_runner, SpecReference,
    };
    use ipfs_accelerate_core::{BackendKind, JsonConfig};

    /// The towers' specs, executed by their f64 reference and combined by [`TowerRunner`],
    /// compute the fixtures' `text_embeds`, `image_embeds` and `logits_per_image`.
    #[test]
    fn the_tower_specs_compute_hf_outputs() {
        for fixture in family_fixtures("the_tower_specs_compute_hf_outputs", "clip") {
            let config = ClipConfig::from_file(&fixture.dir.join("config.json")).unwrap();
            let source = ipfs_accelerate_io::open_weights(&fixture.dir).unwrap();
            let (text, vision, scale) = encoder_specs(&config, source).unwrap();
            assert!(text.causal && !vision.causal);
            let runner = crate::TowerRunner::new(
                Box::new(SpecReference::new(text).unwrap()),
                Box::new(SpecReference::new(vision).unwrap()),
                config,
                scale,
            );
            let checks = verify_runner(&fixture, BackendKind::Cpu, &runner).unwrap();
            assert_eq!(checks.len(), 3, "{}", fixture.variant);
            assert_checks(&checks);
        }
    }

    #[test]
    fn pooled_tokens_follow_hf_argmax() {
        let ids = [5, 98, 98, 0, /* row 2 */ 7, 9, 3, 9];
        assert_eq!(PooledToken::FirstOf(98).positions(&ids, 4), vec![1, 0]);
        assert_eq!(PooledToken::LargestId.positions(&ids, 4), vec![1, 1]);
        assert_eq!(PooledToken::First.positions(&ids, 4), vec![0, 0]);
    }
}
