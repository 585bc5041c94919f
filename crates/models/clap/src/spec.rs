//! CLAP's text tower as a backend-neutral [`EncoderSpec`], for engines that do not run through
//! burn (the cuBLAS encoder of the `cuda` feature): BERT's description
//! ([`ipfs_accelerate_bert::encoder_spec_under`]) with RoBERTa's position numbering, the pooler,
//! and `text_projection` (`linear2(act(linear1(pooled)))`) as the spec's projection.

use std::sync::Arc;

use ipfs_accelerate_core::{
    EncoderProjection, EncoderSpec, PooledToken, ProjectionLayer, Result, TensorSource,
};
use ipfs_accelerate_nn::spec::SpecReader;

use crate::ClapConfig;

/// The text tower of a `ClapModel` checkpoint (`text_model.*`, `text_projection.*`): its
/// projection output is `text_embeds` before normalisation.
pub fn text_encoder_spec(
    config: &ClapConfig,
    source: Arc<dyn TensorSource>,
) -> Result<EncoderSpec> {
    let t = &config.text_config;
    let mut bert = t.bert_config();
    // RoBERTa's numbering, from the tower's padding id.
    bert.model_type = Some("roberta".into());
    bert.pad_token_id = Some(t.pad_id());
    let mut spec = ipfs_accelerate_bert::encoder_spec_under(&bert, source.clone(), "text_model")?;
    let projection = SpecReader::new(source.as_ref(), "text_projection");
    let (h, p) = (t.hidden_size, config.projection_dim);
    spec.family = "clap".into();
    spec.projection = Some(EncoderProjection {
        output: "text_embeds".into(),
        token: PooledToken::Pooler,
        norm: None,
        hidden: Some(ProjectionLayer {
            dense: projection.dense("linear1", p, h)?,
            activation: config.projection_hidden_act,
        }),
        dense: projection.dense("linear2", p, p)?,
    });
    spec.validate()?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use burn_flex::Flex;
    use ipfs_accelerate_conformance::{
        assert_checks, family_fixtures, verify_runner, SpecReference,
    };
    use ipfs_accelerate_core::{
        BackendKind, JsonConfig, ModelRunner, ReferenceInput, TensorSource,
    };

    use super::*;

    /// The spec, executed by its f64 reference, gives every fixture's `text_embeds` once
    /// normalised (the description is checked without the GPU engine that runs it).
    #[test]
    fn the_text_spec_computes_hf_text_embeds() {
        for fixture in family_fixtures("the_text_spec_computes_hf_text_embeds", "clap") {
            let config = ClapConfig::from_file(&fixture.dir.join("config.json")).unwrap();
            let weights = ipfs_accelerate_io::open_weights(&fixture.dir).unwrap();
            let spec = text_encoder_spec(&config, weights).unwrap();
            let inputs = fixture.inputs().unwrap();
            let t = ipfs_accelerate_core::TokenBatch::from_tensors(&inputs).unwrap();
            let types = vec![0; t.input_ids.len()];
            let out = spec
                .reference_forward(&ReferenceInput::Tokens {
                    batch: t.batch,
                    seq: t.seq,
                    ids: &t.input_ids,
                    types: &types,
                    mask: &t.attention_mask,
                })
                .unwrap();
            let embeds = out.projection.unwrap();
            let p = config.projection_dim;
            let got: Vec<f64> = embeds
                .chunks(p)
                .flat_map(|row| {
                    let norm = row.iter().map(|v| v * v).sum::<f64>().sqrt();
                    row.iter().map(move |v| v / norm)
                })
                .collect();
            let want = fixture
                .reference()
                .unwrap()
                .tensor("text_embeds")
                .unwrap()
                .to_f64_vec();
            let err = ipfs_accelerate_conformance::relative_error(&got, &want);
            // HF's float64 run agrees to about 1e-8 (far inside the fixture's 1e-4); a
            // mis-described block (positions, pooler, projection) is off by far more.
            assert!(
                err < 1e-6,
                "{}: text_embeds off by {err:e}",
                fixture.variant
            );
        }
    }

    /// A runner of the spec (here its f64 reference; the cuBLAS encoder on `cuda`) encodes the
    /// text in place of the burn tower: every fixture output, the logits included, still
    /// matches HF.
    #[test]
    fn a_text_engine_replaces_the_burn_text_tower() {
        for fixture in family_fixtures("a_text_engine_replaces_the_burn_text_tower", "clap") {
            let config = ClapConfig::from_file(&fixture.dir.join("config.json")).unwrap();
            let weights = ipfs_accelerate_io::open_weights(&fixture.dir).unwrap();
            let engine = SpecReference::new(text_encoder_spec(&config, weights).unwrap()).unwrap();
            let runner = crate::ClapRunner::<Flex>::load_dir(
                &fixture.dir,
                &Default::default(),
                BackendKind::Cpu,
            )
            .unwrap()
            .with_text_engine(Box::new(engine));
            assert!(runner.engine().unwrap().ends_with("text tower"));
            let checks = verify_runner(&fixture, BackendKind::Cpu, &runner).unwrap();
            assert_eq!(checks.len(), 3, "{}", fixture.variant);
            assert_checks(&checks);
        }
    }
}
