//! DETR against HF transformers' reference outputs: every `detr/<variant>/` fixture of the shared
//! set (`$IPFS_ACCELERATE_SHARED`, else `../shared` beside the workspace), plus the variant folders
//! under `$IPFS_ACCELERATE_DETR_FIXTURES` when set (fixtures generated elsewhere with HF).

use std::path::{Path, PathBuf};

use burn_flex::Flex;
use ipfs_accelerate_core::{BackendKind, Family, HostTensor, ModelRunner, TensorMap, TensorSource};
use ipfs_accelerate_detr::{DetrFamily, DetrRunner, DetrTasks};
use ipfs_accelerate_io::SafeTensorsFile;

fn shared_dir(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("IPFS_ACCELERATE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../../shared"));
    if dir.join("fixtures").is_dir() {
        return Some(dir);
    }
    if std::env::var("IPFS_ACCELERATE_REQUIRE_SHARED").as_deref() == Ok("1") {
        panic!("{test}: shared data not found at {}", dir.display());
    }
    eprintln!(
        "skipped {test}: needs the shared fixtures at {} (set IPFS_ACCELERATE_SHARED)",
        dir.display()
    );
    None
}

fn variant_dirs(root: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(root)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.retain(|p| p.join("meta.json").is_file());
    v.sort();
    v
}

/// `threshold=` and `target_sizes=[(h,w),...]` of meta.json's `post` sentence.
fn post_params(post: &str) -> (Option<f64>, Vec<i64>) {
    let threshold = post.find("threshold=").and_then(|i| {
        let rest = &post[i + "threshold=".len()..];
        let end = rest.find([',', ')']).unwrap_or(rest.len());
        rest[..end].trim().parse().ok()
    });
    let sizes = post
        .find("target_sizes=")
        .map(|i| {
            let rest = &post[i..];
            let list = &rest[..rest.find(']').unwrap_or(rest.len())];
            list.split(|c: char| !c.is_ascii_digit())
                .filter_map(|s| s.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    (threshold, sizes)
}

fn rel_error(got: &[f64], want: &[f64]) -> f64 {
    let diff: f64 = got.iter().zip(want).map(|(a, b)| (a - b).powi(2)).sum();
    let norm: f64 = want.iter().map(|b| b * b).sum();
    if norm > 0.0 {
        (diff / norm).sqrt()
    } else {
        diff.sqrt()
    }
}

fn check_fixture(dir: &Path) {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    let reference = SafeTensorsFile::open(dir.join("reference.safetensors")).unwrap();
    let mut inputs = TensorMap::new();
    for name in ["pixel_values", "pixel_mask"] {
        if reference.contains(name) {
            inputs.insert(name.into(), reference.tensor(name).unwrap());
        }
    }
    let (threshold, sizes) = post_params(meta["post"].as_str().unwrap_or(""));
    if let Some(t) = threshold {
        inputs.insert(
            "threshold".into(),
            HostTensor::from_f64(vec![1], &[t]).unwrap(),
        );
    }
    if !sizes.is_empty() {
        inputs.insert(
            "target_sizes".into(),
            HostTensor::from_i64(vec![sizes.len() / 2, 2], &sizes).unwrap(),
        );
    }
    let runner = DetrFamily::load::<Flex>(dir, &Default::default(), BackendKind::Cpu).unwrap();
    let outputs = runner.run(&inputs).unwrap();
    for name in meta["outputs"].as_array().unwrap() {
        let name = name.as_str().unwrap();
        let want = reference.tensor(name).unwrap();
        let got = outputs
            .get(name)
            .unwrap_or_else(|| panic!("{name} missing"));
        assert_eq!(got.shape(), want.shape(), "{}: {name} shape", dir.display());
        if want.dtype().is_float() {
            let tol = meta["tolerance"][name].as_f64().unwrap_or(1e-4);
            let err = rel_error(&got.to_f64_vec(), &want.to_f64_vec());
            eprintln!(
                "{} {name}: rel error {err:.3e} (tolerance {tol:.1e})",
                dir.display()
            );
            assert!(
                err <= tol,
                "{}: {name} rel error {err:e} > {tol:e}",
                dir.display()
            );
        } else {
            assert_eq!(
                got.to_i64_vec().unwrap(),
                want.to_i64_vec().unwrap(),
                "{}: {name}",
                dir.display()
            );
        }
    }
}

#[test]
fn detr_fixtures_match_hf_on_cpu() {
    let mut dirs = Vec::new();
    if let Some(shared) = shared_dir("detr_fixtures_match_hf_on_cpu") {
        dirs.extend(variant_dirs(&shared.join("fixtures/detr")));
    }
    if let Some(extra) = std::env::var_os("IPFS_ACCELERATE_DETR_FIXTURES") {
        dirs.extend(variant_dirs(Path::new(&extra)));
    }
    for dir in &dirs {
        check_fixture(dir);
    }
}

#[test]
fn detect_api_and_bad_input() {
    let Some(shared) = shared_dir("detect_api_and_bad_input") else {
        return;
    };
    let Some(dir) = variant_dirs(&shared.join("fixtures/detr"))
        .into_iter()
        .next()
    else {
        return;
    };
    let config = ipfs_accelerate_detr::DetrConfig::from_file(&dir.join("config.json")).unwrap();
    let weights = ipfs_accelerate_io::open_weights(&dir).unwrap();
    let runner =
        DetrRunner::<Flex>::load(weights, &config, &Default::default(), BackendKind::Cpu).unwrap();
    let reference = SafeTensorsFile::open(dir.join("reference.safetensors")).unwrap();
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
    let Some(shared) = shared_dir("weights_that_do_not_fit_the_config_are_typed_errors") else {
        return;
    };
    let Some(dir) = variant_dirs(&shared.join("fixtures/detr"))
        .into_iter()
        .next()
    else {
        return;
    };
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let load = |json: &serde_json::Value| {
        let config = ipfs_accelerate_detr::DetrConfig::from_json(
            &json.to_string(),
            Path::new("config.json"),
        )
        .unwrap();
        let weights = ipfs_accelerate_io::open_weights(&dir).unwrap();
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
