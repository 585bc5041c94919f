//! DETR against HF transformers' reference outputs: every `detr/<variant>/` fixture of the shared
//! set (`$IPFS_ACCELERATE_SHARED`, else `../shared` beside the workspace), plus those under the
//! fixture roots in `$IPFS_ACCELERATE_EXTRA_FIXTURES` (colon-separated roots holding
//! `detr/<variant>/`, e.g. a set generated elsewhere with HF).

use std::path::Path;

use burn_flex::Flex;
use ipfs_accelerate_conformance::{assert_checks, family_fixtures, verify_runner, Fixture};
use ipfs_accelerate_core::{BackendKind, Family, HostTensor, ModelRunner, TensorMap, TensorSource};
use ipfs_accelerate_detr::{DetrFamily, DetrRunner, DetrTasks};

/// The first DETR fixture, or `None` (skipped, by name) when there is none.
fn first_fixture(test: &str) -> Option<Fixture> {
    family_fixtures(test, "detr").into_iter().next()
}

#[test]
fn detr_fixtures_match_hf_on_cpu() {
    for f in &family_fixtures("detr_fixtures_match_hf_on_cpu", "detr") {
        let runner =
            DetrFamily::load::<Flex>(&f.dir, &Default::default(), BackendKind::Cpu).unwrap();
        let checks = verify_runner(f, BackendKind::Cpu, runner.as_ref()).unwrap();
        eprintln!("{checks:?}");
        assert_checks(&checks);
    }
}

#[test]
fn detect_api_and_bad_input() {
    let Some(f) = first_fixture("detect_api_and_bad_input") else {
        return;
    };
    let dir = &f.dir;
    let config = ipfs_accelerate_detr::DetrConfig::from_file(&dir.join("config.json")).unwrap();
    let weights = ipfs_accelerate_io::open_weights(dir).unwrap();
    let runner =
        DetrRunner::<Flex>::load(weights, &config, &Default::default(), BackendKind::Cpu).unwrap();
    let reference = f.reference().unwrap();
    let pv = reference.tensor("pixel_values").unwrap();
    let mask = reference.tensor("pixel_mask").unwrap();
    let batch = pv.shape()[0];
    let sizes = vec![[480, 640]; batch];

    // Threshold 0 keeps every query; labels come from id2label; boxes are in pixels.
    let all = runner.detect(&pv, Some(&mask), 0.0, Some(&sizes)).unwrap();
    assert_eq!(all.len(), batch);
    for image in &all {
        assert_eq!(image.len(), config.num_queries);
        for d in image {
            assert!(d.label_id < config.num_labels());
            assert_eq!(d.label, config.label(d.label_id));
            assert!(d.score > 0.0 && d.score <= 1.0);
        }
    }
    // A threshold of 1 keeps nothing.
    let none = runner.detect(&pv, Some(&mask), 1.0, None).unwrap();
    assert!(none.iter().all(Vec::is_empty));

    // Bad input is a typed error, never a panic.
    let [b, c, h, w] = [pv.shape()[0], pv.shape()[1], pv.shape()[2], pv.shape()[3]];
    let wrong_channels =
        HostTensor::from_f32(vec![b, c + 1, h, w], &vec![0.0; b * (c + 1) * h * w]).unwrap();
    assert!(runner.detect(&wrong_channels, None, 0.5, None).is_err());
    let empty = HostTensor::from_f32(vec![b, c, 0, w], &[]).unwrap();
    assert!(runner.detect(&empty, None, 0.5, None).is_err());
    let rank3 = pv.reshape(vec![b * c, h, w]).unwrap();
    assert!(runner.detect(&rank3, None, 0.5, None).is_err());
    let bad_mask = HostTensor::from_i64(vec![b, h, w + 1], &vec![1; b * h * (w + 1)]).unwrap();
    assert!(runner.detect(&pv, Some(&bad_mask), 0.5, None).is_err());
    assert!(runner
        .detect(&pv, Some(&mask), 0.5, Some(&vec![[1, 1]; batch + 1]))
        .is_err());
    assert!(runner.detect(&pv, Some(&mask), f64::NAN, None).is_err());
    let mut inputs = TensorMap::new();
    assert!(runner.run(&inputs).is_err(), "missing pixel_values");
    inputs.insert("pixel_values".into(), pv.clone());
    inputs.insert(
        "target_sizes".into(),
        HostTensor::from_i64(vec![batch, 2], &vec![-1; batch * 2]).unwrap(),
    );
    assert!(runner.run(&inputs).is_err(), "negative target size");
    // Without a mask, every pixel is real: same as an all-ones mask.
    inputs.remove("target_sizes");
    let out = runner.run(&inputs).unwrap();
    assert_eq!(out["post_counts"].to_i64_vec().unwrap().len(), batch);
}

#[test]
fn bad_configs_are_typed_errors() {
    let origin = Path::new("config.json");
    let parse = |json: &str| ipfs_accelerate_detr::DetrConfig::from_json(json, origin);
    let resnet = r#""backbone_config": {"model_type": "resnet", "hidden_sizes": [8, 16], "depths": [1, 1], "embedding_size": 8}"#;
    assert!(parse(&format!(
        r#"{{{resnet}, "d_model": 16, "encoder_attention_heads": 2, "decoder_attention_heads": 2}}"#
    ))
    .is_ok());
    // A timm backbone (no backbone_config, or timm_backbone) is not supported.
    assert!(parse(r#"{"use_timm_backbone": true, "backbone": "resnet50"}"#).is_err());
    assert!(parse(r#"{"backbone_config": {"model_type": "timm_backbone"}}"#).is_err());
    // Heads that do not divide d_model, odd widths for sine embeddings, unknown embeddings.
    assert!(parse(&format!(
        r#"{{{resnet}, "d_model": 16, "encoder_attention_heads": 3}}"#
    ))
    .is_err());
    assert!(parse(&format!(
        r#"{{{resnet}, "d_model": 18, "encoder_attention_heads": 2, "decoder_attention_heads": 2}}"#
    ))
    .is_err());
    assert!(parse(&format!(
        r#"{{{resnet}, "position_embedding_type": "rope"}}"#
    ))
    .is_err());
    // Backbone problems: unknown layer type, mismatched stages, an out feature that does not exist.
    assert!(
        parse(r#"{"backbone_config": {"model_type": "resnet", "layer_type": "wide"}}"#).is_err()
    );
    assert!(parse(
        r#"{"backbone_config": {"model_type": "resnet", "hidden_sizes": [8], "depths": [1, 1]}}"#
    )
    .is_err());
    assert!(
        parse(r#"{"backbone_config": {"model_type": "resnet", "out_features": ["stage9"]}}"#)
            .is_err()
    );
    assert!(parse(
        r#"{"backbone_config": {"model_type": "resnet", "hidden_sizes": [2, 8], "depths": [1, 1]}}"#
    )
    .is_err());
    assert!(parse("not json").is_err());
}

#[test]
fn weights_that_do_not_fit_the_config_are_typed_errors() {
    let Some(f) = first_fixture("weights_that_do_not_fit_the_config_are_typed_errors") else {
        return;
    };
    let dir = &f.dir;
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let load = |json: &serde_json::Value| {
        let config = ipfs_accelerate_detr::DetrConfig::from_json(
            &json.to_string(),
            Path::new("config.json"),
        )
        .unwrap();
        let weights = ipfs_accelerate_io::open_weights(dir).unwrap();
        DetrRunner::<Flex>::load(weights, &config, &Default::default(), BackendKind::Cpu).err()
    };
    assert!(load(&json).is_none(), "the fixture's own config loads");
    // One encoder layer more than the checkpoint holds: a missing tensor.
    let layers = json["encoder_layers"].as_u64().unwrap();
    json["encoder_layers"] = (layers + 1).into();
    let err = load(&json).expect("missing layer");
    assert!(
        matches!(err, ipfs_accelerate_core::Error::MissingTensor { .. }),
        "{err}"
    );
    json["encoder_layers"] = layers.into();
    // A query count that does not match the stored table: a shape mismatch.
    let queries = json["num_queries"].as_u64().unwrap();
    json["num_queries"] = (queries + 1).into();
    let err = load(&json).expect("wrong query count");
    assert!(
        matches!(err, ipfs_accelerate_core::Error::ShapeMismatch { .. }),
        "{err}"
    );
}
