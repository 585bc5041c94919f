//! X-CLIP's towers as backend-neutral [`EncoderSpec`]s, for engines that do not run through
//! burn (the cuBLAS encoder of the `cuda` feature): CLIP's text tower, and the vision tower
//! ([`describe_vision`], which the burn tower runs too): CLIP's, whose layers exchange
//! cross-frame messages ([`FrameMessages`]), and each frame's class token through
//! `post_layernorm` and `visual_projection` as the projection `frame_embeds`. The MIT and the
//! prompt generator read those outputs on burn ([`crate::XclipModel::video_features_of`]).

use ipfs_accelerate_core::{
    EncoderInput, EncoderSpec, FrameMessages, Result, RowEmbeddings, TensorSource,
};
use ipfs_accelerate_nn::spec::{SpecReader, WeightReader};

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

/// The vision tower of an `XCLIPModel` checkpoint (`vision_model.*`, `visual_projection`) as
/// host values: outputs `last_hidden_state` `[videos · frames, 1 + patches, hidden]` and
/// `frame_embeds` `[videos · frames, projection_dim]`. Inputs are frames, `num_frames`
/// consecutive ones a video, of the configured image size.
pub fn vision_encoder_spec(config: &XclipConfig, source: &dyn TensorSource) -> Result<EncoderSpec> {
    let spec = describe_vision(&SpecReader::new(source, ""), config)?;
    spec.validate()?;
    Ok(spec)
}

/// X-CLIP's vision tower, the one description of it, read by `root` (the checkpoint's root) as
/// host values or as burn modules for [`crate::XclipVisionTransformer`]: CLIP's vision tower
/// ([`ipfs_accelerate_clip::describe_vision`], `pre_layernorm` after the embeddings) whose
/// layers exchange cross-frame messages ([`FrameMessages`]: `message_fc`, `message_ln`,
/// `message_attn`), and each frame's class token through `post_layernorm` and
/// `visual_projection` as the projection `frame_embeds`.
pub fn describe_vision<R: WeightReader>(
    root: &R,
    config: &XclipConfig,
) -> Result<EncoderSpec<R::Dense, R::Norm, R::Table>> {
    let v = &config.vision_config;
    let c = &v.base;
    let h = c.hidden_size;
    let vision = root.under("vision_model");
    let projection = ipfs_accelerate_clip::describe_vision_projection(
        &vision,
        root,
        c,
        config.projection_dim,
        "frame_embeds",
    )?;
    let mut spec = EncoderSpec {
        family: "xclip".into(),
        projection: Some(projection),
        ..ipfs_accelerate_clip::describe_vision(&vision, c, "pre_layernorm", c.num_hidden_layers)?
    };
    for (n, layer) in spec.layers.iter_mut().enumerate() {
        let l = vision.under(&format!("encoder.layers.{n}"));
        let attn = l.under("message_attn");
        let square = |name: &str| attn.linear(name, h, h, true);
        layer.messages = Some(FrameMessages {
            frames: v.num_frames,
            fc: l.linear("message_fc", h, h, true)?,
            norm: l.layer_norm("message_ln", h, c.layer_norm_eps)?,
            query: square("q_proj")?,
            key: square("k_proj")?,
            value: square("v_proj")?,
            output: square("out_proj")?,
        });
    }
    Ok(spec)
}

/// X-CLIP's multi-frame integration transformer (`mit`), the one description of it, read by
/// `root` (the checkpoint's root): each video's frame embeddings `[frames, mit_hidden_size]`
/// (`inputs_embeds`) plus `position_embedding`, through `mit_num_hidden_layers` CLIP encoder
/// layers. The residual around it and the mean over frames are the family's
/// ([`crate::XclipModel::video_features_of`]).
pub fn describe_mit<R: WeightReader>(
    root: &R,
    config: &XclipConfig,
) -> Result<EncoderSpec<R::Dense, R::Norm, R::Table>> {
    let v = &config.vision_config;
    let (h, frames) = (v.mit_hidden_size, v.num_frames);
    let mit = root.under("mit");
    let input = EncoderInput::Rows(RowEmbeddings {
        tokens: frames,
        position: mit.table("position_embedding", &[1, frames, h])?,
    });
    Ok(EncoderSpec {
        family: "xclip".into(),
        ..ipfs_accelerate_clip::describe_encoder(
            &mit,
            h,
            v.mit_num_attention_heads,
            v.mit_intermediate_size,
            v.mit_num_hidden_layers,
            v.base.layer_norm_eps,
            v.base.hidden_act,
            input,
        )?
    })
}

/// [`describe_mit`] as host values.
pub fn mit_spec(config: &XclipConfig, source: &dyn TensorSource) -> Result<EncoderSpec> {
    let spec = describe_mit(&SpecReader::new(source, ""), config)?;
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

    /// The MIT's description read as host values and run by its f64 reference gives what the
    /// burn trunk gives from the same description read as burn modules (which the fixtures'
    /// `video_embeds` check against HF); rows of another count, and an engine, are refused.
    #[test]
    fn the_mit_description_runs_the_same_on_both_readers() {
        use burn::tensor::{Tensor, TensorData};
        use ipfs_accelerate_conformance::relative_error;
        use ipfs_accelerate_core::ReferenceInput;
        use ipfs_accelerate_nn::{trunk::Trunk, VarBuilder};
        for fixture in family_fixtures("the_mit_description_runs_the_same", "xclip") {
            let config = XclipConfig::from_file(&fixture.dir.join("config.json")).unwrap();
            let weights = ipfs_accelerate_io::open_weights(&fixture.dir).unwrap();
            let v = &config.vision_config;
            let (videos, frames, h) = (2, v.num_frames, v.mit_hidden_size);
            let rows: Vec<f32> = (0..videos * frames * h)
                .map(|i| (i as f32 * 0.61).sin())
                .collect();
            let spec = mit_spec(&config, weights.as_ref()).unwrap();
            let want = spec
                .reference_forward(&ReferenceInput::Rows {
                    batch: videos,
                    values: &rows,
                })
                .unwrap()
                .last_hidden_state;
            let device = Default::default();
            let vb = VarBuilder::<Flex>::new(weights.clone(), &device);
            let trunk = Trunk::new(describe_mit(&vb, &config).unwrap(), &device).unwrap();
            let x = Tensor::<Flex, 3>::from_data(
                TensorData::new(rows.clone(), [videos, frames, h]),
                &device,
            );
            let got: Vec<f64> = trunk
                .forward_rows(x)
                .unwrap()
                .last_hidden_state
                .into_data()
                .to_vec::<f32>()
                .unwrap()
                .into_iter()
                .map(f64::from)
                .collect();
            let error = relative_error(&got, &want);
            assert!(error < 1e-5, "{}: {error}", fixture.variant);
            let short = Tensor::<Flex, 3>::zeros([1, frames + 1, h], &device);
            assert!(trunk.forward_rows(short).is_err());
            let few = &rows[..(frames - 1) * h];
            let reference = spec.reference_forward(&ReferenceInput::Rows {
                batch: 1,
                values: few,
            });
            assert!(reference.is_err());
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
