//! RoBERTa-family encoders (RoBERTa, XLM-RoBERTa) on BERT's modules: tiny random-weight
//! checkpoints with HF transformers' float64 outputs (`tools/make_roberta_fixtures.py`, in
//! `tests/fixtures/bert/`), checked like every shared fixture, then through `Pipeline`.

use std::path::{Path, PathBuf};

use ipfs_accelerate::conformance::verify_fixture;
use ipfs_accelerate::core::EncoderInput;
use ipfs_accelerate::core::{HostTensor, TensorMap};
use ipfs_accelerate::{BackendKind, Pipeline, Task};
use ipfs_accelerate_conformance::{assert_checks, discover, verify_runner, SpecReference};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

#[test]
fn roberta_family_checkpoints_match_hf() {
    let all = discover(&fixtures(), &[]).unwrap();
    let names: Vec<&str> = all.iter().map(|f| f.variant.as_str()).collect();
    assert_eq!(
        names,
        [
            "roberta_base",
            "roberta_sequence_classification",
            "xlm_roberta_token_classification"
        ]
    );
    for fixture in &all {
        let checks = verify_fixture(fixture, BackendKind::Cpu).unwrap();
        assert!(!checks.is_empty(), "{}", fixture.variant);
        assert_checks(&checks);
    }
}

/// BERT's encoder spec describes RoBERTa-family checkpoints too (positions from
/// `pad_token_id + 1`, RoBERTa's classification head as a pooler and classifier): executed by its
/// f64 reference it computes every fixture's outputs. The cuBLAS encoder runs this spec on `cuda`.
#[test]
fn the_encoder_spec_describes_roberta_family_checkpoints() {
    for fixture in discover(&fixtures(), &[]).unwrap() {
        let spec = ipfs_accelerate_bert::encoder_spec(&fixture.dir).unwrap();
        match &spec.input {
            EncoderInput::Tokens(t) => assert_eq!(t.padding_idx, Some(1), "{}", fixture.variant),
            _ => panic!("{}: not a token encoder", fixture.variant),
        }
        let runner = SpecReference::new(spec).unwrap();
        let checks = verify_runner(&fixture, BackendKind::Cpu, &runner).unwrap();
        assert!(!checks.is_empty(), "{}", fixture.variant);
        assert_checks(&checks);
    }
}

/// A word-level tokenizer over the fixture's 99 ids: `<s>` 0, `<pad>` 1, `</s>` 2, `<unk>` 3,
/// `w4`..`w98`; one text becomes `<s> words </s>`.
fn write_roberta_tokenizer(dir: &Path) {
    let specials = [("<s>", 0), ("<pad>", 1), ("</s>", 2), ("<unk>", 3)];
    let mut vocab = serde_json::Map::new();
    for (t, id) in specials {
        vocab.insert(t.into(), id.into());
    }
    for id in 4..99 {
        vocab.insert(format!("w{id}"), id.into());
    }
    let added: Vec<serde_json::Value> = specials
        .iter()
        .map(|(t, id)| {
            serde_json::json!({"id": id, "content": t, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": true})
        })
        .collect();
    let special = |t: &str| serde_json::json!({"SpecialToken": {"id": t, "type_id": 0}});
    let single = [
        special("<s>"),
        serde_json::json!({"Sequence": {"id": "A", "type_id": 0}}),
        special("</s>"),
    ];
    let tokenizer = serde_json::json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
        "post_processor": {"type": "TemplateProcessing", "single": single, "pair": single,
            "special_tokens": {
                "<s>": {"id": "<s>", "ids": [0], "tokens": ["<s>"]},
                "</s>": {"id": "</s>", "ids": [2], "tokens": ["</s>"]}}},
        "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
}

/// `Pipeline` embeds with a RoBERTa checkpoint: the mean over the tokens of the encoder's
/// output (checked against HF above), with RoBERTa's positions in a padded batch.
#[test]
fn pipeline_embeds_with_a_roberta_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let source = fixtures().join("bert/roberta_base");
    for name in ["config.json", "model.safetensors"] {
        std::fs::copy(source.join(name), dir.path().join(name)).unwrap();
    }
    write_roberta_tokenizer(dir.path());
    let pipe = Pipeline::builder(dir.path().to_str().unwrap())
        .task(Task::Embed)
        .backends([BackendKind::Cpu])
        .build()
        .unwrap();
    let texts = ["w5 w6 w7 w8 w9", "w10 w11"];
    let batch = pipe.embed(&texts, false).unwrap().value;
    for (text, ids) in texts
        .iter()
        .zip([vec![0, 5, 6, 7, 8, 9, 2], vec![0, 10, 11, 2]])
    {
        let n = ids.len();
        let mut inputs = TensorMap::new();
        inputs.insert(
            "input_ids".into(),
            HostTensor::from_i64(vec![1, n], &ids).unwrap(),
        );
        let ones = vec![1i64; n];
        inputs.insert(
            "attention_mask".into(),
            HostTensor::from_i64(vec![1, n], &ones).unwrap(),
        );
        inputs.insert(
            "token_type_ids".into(),
            HostTensor::from_i64(vec![1, n], &vec![0; n]).unwrap(),
        );
        let hidden = pipe.runner().run(&inputs).unwrap()["last_hidden_state"].to_f32_vec();
        let width = hidden.len() / n;
        let mean: Vec<f32> = (0..width)
            .map(|j| (0..n).map(|t| hidden[t * width + j]).sum::<f32>() / n as f32)
            .collect();
        let got = &batch[texts.iter().position(|t| t == text).unwrap()];
        let diff = got
            .iter()
            .zip(&mean)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-5, "{text}: {diff}");
    }
}

/// `Pipeline::load` takes the options every task type takes, and gives what the builder gives.
#[test]
fn pipeline_load_takes_load_options() {
    let dir = tempfile::tempdir().unwrap();
    let source = fixtures().join("bert/roberta_base");
    for name in ["config.json", "model.safetensors"] {
        std::fs::copy(source.join(name), dir.path().join(name)).unwrap();
    }
    write_roberta_tokenizer(dir.path());
    let model = dir.path().to_str().unwrap();
    let options = ipfs_accelerate::LoadOptions {
        backends: Some(vec![BackendKind::Cpu]),
        max_length: Some(4),
        batch_size: Some(1),
        revision: Some("v1".into()), // a folder has no revision: ignored
        ..Default::default()
    };
    let loaded = Pipeline::load(model, Task::Embed, &options).unwrap();
    let built = Pipeline::builder(model)
        .task(Task::Embed)
        .backends([BackendKind::Cpu])
        .max_length(4)
        .batch_size(1)
        .build()
        .unwrap();
    let texts = ["w5 w6 w7 w8 w9", "w10"];
    let a = loaded.embed(&texts, true).unwrap();
    assert_eq!(a.value, built.embed(&texts, true).unwrap().value);
    // max_length 4 truncated the first text: it differs from the untruncated embedding.
    let full = Pipeline::load(
        model,
        Task::Embed,
        &ipfs_accelerate::LoadOptions {
            backends: Some(vec![BackendKind::Cpu]),
            ..Default::default()
        },
    )
    .unwrap();
    assert_ne!(full.embed(&texts[..1], true).unwrap().value, a.value[..1]);
}
