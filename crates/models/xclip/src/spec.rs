//! X-CLIP's towers as backend-neutral [`EncoderSpec`]s, for engines that do not run through
//! burn (the cuBLAS encoder of the `cuda` feature): CLIP's text tower, and CLIP's vision tower
//! ([`ipfs_accelerate_clip::vision_tower_spec`]) whose layers exchange cross-frame messages
//! ([`FrameMessages`]), and each frame's class token through `post_layernorm` and
//! `visual_projection` as the projection `frame_embeds`. The MIT and the prompt generator read
//! those outputs on burn ([`crate::XclipModel::video_features_of`]).

use ipfs_accelerate_core::{DenseWeights, EncoderSpec, FrameMessages, Result, TensorSource};
use ipfs_accelerate_nn::spec::SpecReader;

use crate::XclipConfig;

/// The text tower of an `XCLIPModel` checkpoint (`text_model.*`, `text_projection`): CLIP's,
/// pooled at the largest token id; its output `text_embeds` is HF's `get_text_features`
/// (projected, before the video-specific prompt).
pub fn text_encoder_spec(config: &XclipConfig, source: &dyn TensorSource) -> Result<EncoderSpec> {
    let spec = ipfs_accelerate_clip::text_tower_spec(
        &config.clip_text_config(),
        config.projection_dim,
        source,
    )?;
    Ok(EncoderSpec {
        family: "xclip".into(),
        ..spec
    })
}

/// The vision tower of an `XCLIPModel` checkpoint (`vision_model.*`, `visual_projection`):
/// outputs `last_hidden_state` `[videos · frames, 1 + patches, hidden]` and `frame_embeds`
/// `[videos · frames, projection_dim]`. Inputs are frames, `num_frames` consecutive ones a video,
/// of the configured image size.
pub fn vision_encoder_spec(config: &XclipConfig, source: &dyn TensorSource) -> Result<EncoderSpec> {
    let v = &config.vision_config;
    let h = v.base.hidden_size;
    let vision = SpecReader::new(source, "vision_model");
    let mut spec = EncoderSpec {
        family: "xclip".into(),
        ..ipfs_accelerate_clip::vision_tower_spec(
            &v.base,
            config.projection_dim,
            source,
            "pre_layernorm",
            "frame_embeds",
        )?
    };
    for (n, layer) in spec.layers.iter_mut().enumerate() {
        let l = vision.pp(&format!("encoder.layers.{n}"));
        let attn = l.pp("message_attn");
        let square = |name: &str| -> Result<DenseWeights> { attn.dense(name, h, h) };
        layer.messages = Some(FrameMessages {
            frames: v.num_frames,
            fc: l.dense("message_fc", h, h)?,
            norm: l.norm("message_ln", h)?,
            query: square("q_proj")?,
            key: square("k_proj")?,
            value: square("v_proj")?,
            output: square("out_proj")?,
        });
    }
    spec.validate()?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use burn_flex::Flex;
    use ipfs_accelerate_conformance::{
        assert_checks, family_fixtures, verify_runner, SpecReference,
    };
    use ipfs_accelerate_core::{BackendKind, JsonConfig, ModelRunner};

    use super::*;

    /// The vision spec, executed by its f64 reference in place of the burn tower, gives every
    /// fixture output (text and video embeddings, logits) through the burn MIT and prompt
    /// generator: the cross-frame messages are described as HF computes them. Then the text
    /// tower's spec in place of the burn text tower too.
    #[test]
    fn engines_replace_the_burn_towers() {
        for fixture in family_fixtures("engines_replace_the_burn_towers", "xclip") {
            let config = XclipConfig::from_file(&fixture.dir.join("config.json")).unwrap();
            let weights = ipfs_accelerate_io::open_weights(&fixture.dir).unwrap();
            let spec = vision_encoder_spec(&config, weights.as_ref()).unwrap();
            assert_eq!(
                spec.frames_per_input(),
                Some(config.vision_config.num_frames)
            );
            let runner = crate::XclipRunner::<Flex>::load_dir(
                &fixture.dir,
                &Default::default(),
                BackendKind::Cpu,
            )
            .unwrap()
            .with_vision_engine(Box::new(SpecReference::new(spec).unwrap()));
            assert_eq!(runner.engine(), Some("spec-reference vision tower"));
            let checks = verify_runner(&fixture, BackendKind::Cpu, &runner).unwrap();
            assert_eq!(checks.len(), 3, "{}", fixture.variant);
            assert_checks(&checks);
            // Both towers on the engine: the text tower's spec too.
            let text = text_encoder_spec(&config, weights.as_ref()).unwrap();
            let runner = runner.with_text_engine(Box::new(SpecReference::new(text).unwrap()));
            assert_eq!(
                runner.engine(),
                Some("spec-reference vision tower, spec-reference text tower")
            );
            let checks = verify_runner(&fixture, BackendKind::Cpu, &runner).unwrap();
            assert_eq!(checks.len(), 3, "{}", fixture.variant);
            assert_checks(&checks);
        }
    }

    /// Messages in only some layers, or in a post-norm trunk, are refused.
    #[test]
    fn messages_must_be_in_every_layer_of_a_pre_norm_trunk() {
        for fixture in family_fixtures("messages_must_be_in_every_layer", "xclip") {
            let config = XclipConfig::from_file(&fixture.dir.join("config.json")).unwrap();
            let weights = ipfs_accelerate_io::open_weights(&fixture.dir).unwrap();
            let spec = vision_encoder_spec(&config, weights.as_ref()).unwrap();
            let mut partial = spec.clone();
            partial.layers[0].messages = None;
            assert!(partial.validate().is_err());
            let mut post = spec;
            post.norm = ipfs_accelerate_core::NormPlacement::Post;
            assert!(post.validate().is_err());
        }
    }
}
