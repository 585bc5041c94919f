//! CLIP against the HF reference fixtures (`fixtures/clip/*`) on the CPU backend, its task APIs,
//! and bad input / bad checkpoints as typed errors.

use std::path::Path;

use burn_flex::Flex;
use ipfs_accelerate_clip::{
    ClipConfig, ClipFamily, ClipRunner, ClipTasks, ClipTextInputs, TokenIds,
};
use ipfs_accelerate_conformance::{
    assert_checks, assert_rows_match, assert_softmax_rows, family_fixtures, verify_runner, without,
};
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, JsonConfig, ModelRunner, TensorSource,
};

fn runner(dir: &Path) -> ClipRunner<Flex> {
    ClipRunner::load_dir(dir, &Default::default(), BackendKind::Cpu).unwrap()
}

#[test]
fn outputs_match_hf_within_tolerance() {
    for f in family_fixtures("outputs_match_hf_within_tolerance", "clip") {
        let model =
            ClipFamily::load::<Flex>(&f.dir, &Default::default(), BackendKind::Cpu).unwrap();
        let checks = verify_runner(&f, BackendKind::Cpu, model.as_ref()).unwrap();
        println!("{checks:?}");
        assert_checks(&checks);
    }
}

#[test]
fn task_apis_agree_with_the_model_outputs() {
    for f in family_fixtures("task_apis_agree_with_the_model_outputs", "clip") {
        let clip = runner(&f.dir);
        let inputs = f.inputs().unwrap();
        let reference = f.reference().unwrap();
        let text = ClipTextInputs::from_tensors(&inputs).unwrap();
        let pixels = &inputs["pixel_values"];
        let full = clip.run(&inputs).unwrap();
        assert_rows_match(clip.text_embeds(&text).unwrap(), &full["text_embeds"]);
        assert_rows_match(clip.image_embeds(pixels).unwrap(), &full["image_embeds"]);
        // Zero-shot probabilities are the softmax of HF's logits_per_image over the labels.
        let probs = clip.zero_shot(pixels, &text).unwrap();
        assert_softmax_rows(&probs, &reference.tensor("logits_per_image").unwrap());
        // One tower at a time.
        let only_text = without(&inputs, "pixel_values");
        let out = clip.run(&only_text).unwrap();
        assert!(out.contains_key("text_embeds") && !out.contains_key("image_embeds"));
    }
}

#[test]
fn pooling_follows_eos_rules() {
    for f in family_fixtures("pooling_follows_eos_rules", "clip") {
        let clip = runner(&f.dir);
        let eos = clip.config().text_config.eos_token_id.first().unwrap();
        let text = ClipTextInputs::from_rows(&[vec![0, eos, 1, eos], vec![0, 1, 1, 1]]).unwrap();
        let positions = clip.model().text.pool_positions(&text);
        if eos == 2 {
            // Legacy: the largest id, first occurrence.
            let max_at = |r: &[i64]| r.iter().position(|v| v == r.iter().max().unwrap()).unwrap();
            assert_eq!(
                positions,
                vec![max_at(&[0, 2, 1, 2]), max_at(&[0, 1, 1, 1])]
            );
        } else {
            assert_eq!(positions, vec![1, 0]);
        }
    }
}

#[test]
fn bad_inputs_are_typed_errors() {
    for f in family_fixtures("bad_inputs_are_typed_errors", "clip") {
        let clip = runner(&f.dir);
        let cfg = clip.config().text_config.clone();
        let ids = |v: Vec<i64>, shape: Vec<usize>| HostTensor::from_i64(shape, &v).unwrap();
        let run = |pairs: Vec<(&str, HostTensor)>| {
            clip.run(&pairs.into_iter().map(|(k, v)| (k.to_string(), v)).collect())
        };
        let too_long = cfg.max_position_embeddings + 1;
        for case in [
            vec![("input_ids", ids(vec![cfg.vocab_size as i64], vec![1, 1]))],
            vec![("input_ids", ids(vec![-1], vec![1, 1]))],
            vec![("input_ids", ids(vec![], vec![1, 0]))],
            vec![("input_ids", ids(vec![0; too_long], vec![1, too_long]))],
            vec![("input_ids", ids(vec![0, 1], vec![2]))],
            vec![
                ("input_ids", ids(vec![0, 1], vec![1, 2])),
                ("attention_mask", ids(vec![1], vec![1, 1])),
            ],
            vec![(
                "pixel_values",
                HostTensor::from_f32(vec![1, 1, 8, 8], &[0.0; 64]).unwrap(),
            )],
            vec![],
        ] {
            let names: Vec<String> = case
                .iter()
                .map(|(k, v)| format!("{k}{:?}", v.shape()))
                .collect();
            assert!(
                matches!(run(case), Err(Error::InvalidInput(_))),
                "{names:?}"
            );
        }
        assert!(ClipTextInputs::from_rows(&[vec![1, 2], vec![3]]).is_err());
    }
}

#[test]
fn broken_checkpoints_and_configs_are_typed_errors() {
    for f in family_fixtures("broken_checkpoints_and_configs_are_typed_errors", "clip") {
        let config = ClipConfig::from_file(&f.dir.join("config.json")).unwrap();
        // Weights of a checkpoint with a different projection width.
        let mut wrong = config.clone();
        wrong.projection_dim += 1;
        let weights = ipfs_accelerate_io::open_weights(&f.dir).unwrap();
        let e = ClipRunner::<Flex>::load(weights, &wrong, &Default::default(), BackendKind::Cpu);
        assert!(
            matches!(e, Err(Error::ShapeMismatch { .. })),
            "{:?}",
            e.err()
        );
        let mut deeper = config.clone();
        deeper.vision_config.num_hidden_layers += 1;
        let weights = ipfs_accelerate_io::open_weights(&f.dir).unwrap();
        let e = ClipRunner::<Flex>::load(weights, &deeper, &Default::default(), BackendKind::Cpu);
        assert!(
            matches!(e, Err(Error::MissingTensor { .. })),
            "{:?}",
            e.err()
        );
    }
    let origin = Path::new("config.json");
    for bad in [
        r#"{"vision_config": {}}"#,
        r#"{"text_config": {"hidden_size": 10, "num_attention_heads": 3}, "vision_config": {}}"#,
        r#"{"text_config": {"eos_token_id": []}, "vision_config": {}}"#,
        r#"{"text_config": {}, "vision_config": {"patch_size": 0}}"#,
        r#"{"text_config": {}, "vision_config": {"image_size": 8, "patch_size": 16}}"#,
        r#"{"text_config": {}, "vision_config": {}, "projection_dim": 0}"#,
    ] {
        assert!(
            matches!(
                ClipConfig::from_json(bad, origin),
                Err(Error::InvalidConfig { .. })
            ),
            "{bad}"
        );
    }
    assert_eq!(TokenIds::Many(vec![7, 8]).first(), Some(7));
}
