//! Bad input gives a typed error naming the problem, never a panic or a silent wrong answer.

use std::path::{Path, PathBuf};

use ipfs_accelerate::core::Error as CoreError;
use ipfs_accelerate::{BackendKind, Error, Pipeline, Task, EMBEDDED_SPEC};
use ipfs_accelerate_io::IoError;
use ipfs_accelerate_tests::shared_dir;
use safetensors::tensor::{SafeTensors, TensorView};

/// A copy of the bert/base fixture with a tokenizer, whose weights `edit` may rewrite.
fn model_dir(
    shared: &Path,
    edit: impl FnOnce(Vec<(String, TensorView)>) -> Vec<(String, TensorView)>,
) -> tempfile::TempDir {
    let src = shared.join("fixtures/bert/base");
    let dir = tempfile::tempdir().unwrap();
    std::fs::copy(src.join("config.json"), dir.path().join("config.json")).unwrap();
    std::fs::write(
        dir.path().join("tokenizer.json"),
        ipfs_accelerate::embedded::TOKENIZER,
    )
    .unwrap();
    let bytes = std::fs::read(src.join("model.safetensors")).unwrap();
    let st = SafeTensors::deserialize(&bytes).unwrap();
    let tensors = edit(st.tensors());
    std::fs::write(
        dir.path().join("model.safetensors"),
        safetensors::serialize(tensors, None).unwrap(),
    )
    .unwrap();
    dir
}

fn build(dir: &Path) -> Result<Pipeline, Error> {
    Pipeline::builder(dir.to_str().unwrap())
        .backends([BackendKind::Cpu])
        .offline(true)
        .build()
}

fn weights_path(dir: &Path) -> PathBuf {
    dir.join("model.safetensors")
}

#[test]
fn intact_copy_loads() {
    let Some(shared) = shared_dir("intact_copy_loads") else {
        return;
    };
    let dir = model_dir(&shared, |t| t);
    build(dir.path()).unwrap();
}

#[test]
fn truncated_weights_name_the_file() {
    let Some(shared) = shared_dir("truncated_weights_name_the_file") else {
        return;
    };
    let dir = model_dir(&shared, |t| t);
    let path = weights_path(dir.path());
    let bytes = std::fs::read(&path).unwrap();
    for keep in [0, 5, 100, bytes.len() / 2, bytes.len() - 1] {
        std::fs::write(&path, &bytes[..keep]).unwrap();
        let err = build(dir.path())
            .err()
            .expect("truncated weights must fail");
        assert!(
            matches!(err, Error::Io(IoError::MalformedSafetensors { .. })),
            "{keep}: {err}"
        );
        assert!(err.to_string().contains("model.safetensors"), "{err}");
    }
}

#[test]
fn header_lying_about_sizes() {
    let Some(shared) = shared_dir("header_lying_about_sizes") else {
        return;
    };
    let dir = model_dir(&shared, |t| t);
    let path = weights_path(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    // Grow the first shape's leading dimension in the JSON header without touching the data.
    let header_len = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header = std::str::from_utf8(&bytes[8..8 + header_len])
        .unwrap()
        .to_string();
    let at = header.find("\"shape\":[").unwrap() + "\"shape\":[".len();
    let digit = bytes[8 + at];
    bytes[8 + at] = if digit == b'9' { b'8' } else { digit + 1 };
    std::fs::write(&path, &bytes).unwrap();
    let err = build(dir.path()).err().expect("a lying header must fail");
    assert!(
        matches!(err, Error::Io(IoError::MalformedSafetensors { .. })),
        "{err}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let Some(shared) = shared_dir("missing_tensor_is_named") else {
        return;
    };
    let gone = "encoder.layer.1.attention.self.key.weight";
    let dir = model_dir(&shared, |t| {
        t.into_iter().filter(|(n, _)| n != gone).collect()
    });
    let err = build(dir.path()).err().expect("missing tensor must fail");
    let msg = err.to_string();
    assert!(
        msg.contains(gone) && msg.contains("missing tensor"),
        "{msg}"
    );
}

#[test]
fn wrong_shape_is_named() {
    let Some(shared) = shared_dir("wrong_shape_is_named") else {
        return;
    };
    let target = "encoder.layer.0.intermediate.dense.bias";
    let dir = model_dir(&shared, |t| {
        t.into_iter()
            .map(|(n, v)| {
                if n == target {
                    let shape = vec![v.shape()[0] - 1];
                    let len = shape[0] * 4;
                    let data = &v.data()[..len];
                    (n, TensorView::new(v.dtype(), shape, data).unwrap())
                } else {
                    (n, v)
                }
            })
            .collect()
    });
    let err = build(dir.path()).err().expect("wrong shape must fail");
    let msg = err.to_string();
    assert!(msg.contains(target) && msg.contains("shape"), "{msg}");
}

#[test]
fn invalid_configs_name_the_file() {
    let Some(shared) = shared_dir("invalid_configs_name_the_file") else {
        return;
    };
    let dir = model_dir(&shared, |t| t);
    let cfg = dir.path().join("config.json");
    let good = std::fs::read_to_string(&cfg).unwrap();
    let mut json: serde_json::Value = serde_json::from_str(&good).unwrap();
    json["num_attention_heads"] = 5.into();
    let cases = [
        "{ this is not json".to_string(),
        json.to_string(),
        good.replace("\"hidden_act\": \"gelu\"", "\"hidden_act\": \"warp_drive\""),
        good.replace("\"vocab_size\": 99", "\"vocab_size\": -3"),
    ];
    for text in cases {
        std::fs::write(&cfg, &text).unwrap();
        let err = build(dir.path()).err().expect("invalid config must fail");
        assert!(
            matches!(err, Error::Core(CoreError::InvalidConfig { .. })),
            "{text}: {err}"
        );
        assert!(err.to_string().contains("config.json"), "{err}");
    }
}

#[test]
fn empty_and_over_long_text() {
    let pipe = Pipeline::builder(EMBEDDED_SPEC)
        .task(Task::Embed)
        .backends([BackendKind::Cpu])
        .build()
        .unwrap();
    let err = pipe
        .embed(&["fine", ""], false)
        .expect_err("empty text must fail");
    assert!(
        matches!(err, Error::Preprocess(_)) && err.to_string().contains("#1 is empty"),
        "{err}"
    );
    assert!(pipe.embed(&[], false).is_err(), "an empty batch must fail");

    // Longer than the model's limit: truncated to max_seq_length and reported in the metrics.
    let long = "word ".repeat(2000);
    let out = pipe.embed(&[long.as_str(), "short"], true).unwrap();
    assert_eq!(out.metrics.truncated, 1);
    assert_eq!(out.value.len(), 2);
    assert!(out.value[0].iter().all(|v| v.is_finite()));

    // Raw ids past the position table, or outside the vocabulary, are typed errors.
    let positions = pipe.config().max_position_embeddings;
    let mut inputs = ipfs_accelerate::core::TensorMap::new();
    let ids = vec![101i64; positions + 1];
    inputs.insert(
        "input_ids".into(),
        ipfs_accelerate::core::HostTensor::from_i64(vec![1, positions + 1], &ids).unwrap(),
    );
    let err = pipe.runner().run(&inputs).unwrap_err();
    assert!(
        matches!(err, CoreError::InvalidInput(_)) && err.to_string().contains("longer"),
        "{err}"
    );
    inputs.insert(
        "input_ids".into(),
        ipfs_accelerate::core::HostTensor::from_i64(vec![1, 3], &[101, 999_999, 102]).unwrap(),
    );
    let err = pipe.runner().run(&inputs).unwrap_err();
    assert!(err.to_string().contains("999999"), "{err}");
}

#[test]
fn unavailable_backend_is_reported() {
    let err = Pipeline::builder(EMBEDDED_SPEC)
        .backends([BackendKind::Cuda])
        .build()
        .err()
        .expect("cuda is not compiled into this build");
    assert!(err.to_string().contains("not compiled in"), "{err}");
    let pipe = Pipeline::builder(EMBEDDED_SPEC)
        .backends([BackendKind::Cuda, BackendKind::Cpu])
        .build()
        .unwrap();
    assert_eq!(pipe.backend(), BackendKind::Cpu);
    assert_eq!(pipe.skipped()[0].kind, BackendKind::Cuda);
}
