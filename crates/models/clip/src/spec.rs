//! CLIP's two towers as backend-neutral [`EncoderSpec`]s, for engines that do not run through
//! burn (the cuBLAS encoder of the `cuda` feature): the text tower (token + position embeddings,
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
    spec::{encoder_activation, SpecReader},
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

/// A tower's trunk as both towers fill it: its sizes, its pre-norm CLIP layers under `reader`
/// (`<tower>.encoder.layers.N`) and `input`; no norms, pooler, head or projection yet.
#[allow(clippy::too_many_arguments)]
fn trunk(
    reader: &SpecReader<'_>,
    hidden: usize,
    heads: usize,
    intermediate: usize,
    layers: usize,
    eps: f64,
    act: ipfs_accelerate_nn::Activation,
    input: EncoderInput,
) -> Result<EncoderSpec> {
    Ok(EncoderSpec {
        family: "clip".into(),
        hidden,
        heads,
        intermediate,
        eps: eps as f32,
        activation: encoder_activation(act),
        input,
        embedding_norm: None,
        norm: NormPlacement::Pre,
        layers: (0..layers)
            .map(|n| {
                reader.pp(&format!("encoder.layers.{n}")).pre_ln_layer(
                    &PreLnNames::CLIP,
                    hidden,
                    intermediate,
                    ProjectionBias::ALL,
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
    let h = c.hidden_size;
    let root = SpecReader::new(source, "");
    let text = SpecReader::new(source, "text_model");
    let emb = text.pp("embeddings");
    let input = EncoderInput::Tokens(TokenEmbeddings {
        vocab: c.vocab_size,
        max_positions: c.max_position_embeddings,
        type_vocab: 0,
        word: emb.read("token_embedding.weight", &[c.vocab_size, h])?,
        position: emb.read("position_embedding.weight", &[c.max_position_embeddings, h])?,
        token_type: Vec::new(),
        padding_idx: None,
    });
    let spec = EncoderSpec {
        final_norm: Some(text.norm("final_layer_norm", h)?),
        causal: true,
        projection: Some(EncoderProjection {
            output: "text_embeds".into(),
            token: c.pooled_token(),
            norm: None,
            hidden: None,
            dense: root.dense_with("text_projection", projection_dim, h, false)?,
        }),
        ..trunk(
            &text,
            c.hidden_size,
            c.num_attention_heads,
            c.intermediate_size,
            c.num_hidden_layers,
            c.layer_norm_eps,
            c.hidden_act,
            input,
        )?
    };
    spec.validate()?;
    Ok(spec)
}

/// The vision tower's patch embeddings under `vision` (`<tower>.embeddings`): bias-free patch
/// projection, class token, learned positions.
fn patch_input(c: &ClipVisionConfig, vision: &SpecReader<'_>) -> Result<EncoderInput> {
    let (h, p, ch) = (c.hidden_size, c.patch_size, c.num_channels);
    let emb = vision.pp("embeddings");
    let tokens = c.grid() * c.grid() + 1;
    Ok(EncoderInput::Patches(PatchEmbeddings {
        channels: ch,
        patch: p,
        image: (c.image_size, c.image_size),
        projection: ipfs_accelerate_core::DenseWeights::new(
            h,
            ch * p * p,
            emb.read("patch_embedding.weight", &[h, ch, p, p])?,
            vec![0.0; h],
        ),
        class: emb.read("class_embedding", &[h])?,
        position: emb.read("position_embedding.weight", &[tokens, h])?,
    }))
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
    let h = c.hidden_size;
    let root = SpecReader::new(source, "");
    let vision = SpecReader::new(source, "vision_model");
    let spec = EncoderSpec {
        projection: Some(EncoderProjection {
            output: output.into(),
            token: PooledToken::First,
            norm: Some(vision.norm("post_layernorm", h)?),
            hidden: None,
            dense: root.dense_with("visual_projection", projection_dim, h, false)?,
        }),
        ..vision_trunk_spec(
            c,
            source,
            "vision_model",
            pre_norm,
            c.num_hidden_layers,
            None,
        )?
    };
    spec.validate()?;
    Ok(spec)
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
    vision_trunk_spec(c, source, prefix, "pre_layrnorm", layers, head)
}

/// [`vision_hidden_state_spec`] with the norm after the embeddings named `pre_norm`
/// (`pre_layrnorm` in CLIP, `pre_layernorm` in X-CLIP's vision tower).
fn vision_trunk_spec(
    c: &ClipVisionConfig,
    source: &dyn TensorSource,
    prefix: &str,
    pre_norm: &str,
    layers: usize,
    head: Option<EncoderHead>,
) -> Result<EncoderSpec> {
    if layers > c.num_hidden_layers {
        return Err(ipfs_accelerate_core::Error::InvalidInput(format!(
            "hidden state {layers} of a vision tower of {} layers",
            c.num_hidden_layers
        )));
    }
    let vision = SpecReader::new(source, prefix);
    let spec = EncoderSpec {
        embedding_norm: Some(vision.norm(pre_norm, c.hidden_size)?),
        head,
        ..trunk(
            &vision,
            c.hidden_size,
            c.num_attention_heads,
            c.intermediate_size,
            layers,
            c.layer_norm_eps,
            c.hidden_act,
            patch_input(c, &vision)?,
        )?
    };
    spec.validate()?;
    Ok(spec)
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
