//! The ONNX Runtime backends (`onnx-cpu`, `onnx-openvino`) through the library's `Pipeline` and
//! the CLI: BERT embeddings and sequence classification run the checkpoint's ONNX export with the
//! same tokenizer, pooling and head post-processing as the native `cpu` backend, and agree with
//! it. A checkpoint without an export skips the backend with the reason and falls back.

mod common;

use common::{fixture_copy, run_ok, write_bert_tokenizer};
use ipfs_accelerate::{Availability, BackendKind, ExecutionProvider, Pipeline, Task};
use ipfs_accelerate_conformance::shared_dir;

/// Whether ONNX Runtime with `provider` can run here; absent, the test says so and passes,
/// unless `IPFS_ACCELERATE_REQUIRE_ONNX=1` (CI installs it).
fn available(test: &str, provider: ExecutionProvider) -> bool {
    match ipfs_accelerate::selector().probe(BackendKind::Onnx(provider)) {
        Availability::Available(_) => true,
        other => {
            let required = std::env::var("IPFS_ACCELERATE_REQUIRE_ONNX").as_deref() == Ok("1");
            assert!(
                !required,
                "{test}: ONNX Runtime {provider:?} unavailable: {other:?}"
            );
            eprintln!("skipped {test}: ONNX Runtime {provider:?} unavailable: {other:?}");
            false
        }
    }
}

/// The browser's WebNN backend when it can run here (`cargo xtask fetch-browser`, and the
/// facade built with feature `webnn`); CI's test step runs before the browser is fetched, so
/// its absence is a skip, not a failure.
fn webnn(test: &str) -> Option<BackendKind> {
    let kind: BackendKind = "webnn".parse().ok()?;
    match ipfs_accelerate::selector().probe(kind) {
        Availability::Available(_) => Some(kind),
        other => {
            eprintln!("skipped the WebNN part of {test}: {other:?}");
            None
        }
    }
}

/// The graph backends that can run here: ONNX Runtime's CPU and OpenVINO providers, then the
/// browser's WebNN.
fn graph_backends(test: &str) -> Vec<BackendKind> {
    let mut kinds: Vec<BackendKind> = [ExecutionProvider::Cpu, ExecutionProvider::OpenVino]
        .into_iter()
        .filter(|p| available(test, *p))
        .map(BackendKind::Onnx)
        .collect();
    kinds.extend(webnn(test));
    kinds
}

/// A fixture copy with a 99-word tokenizer (`w4 w5 ...` are words).
fn bert(shared: &std::path::Path, variant: &str) -> tempfile::TempDir {
    let dir = fixture_copy(shared, "bert", variant);
    let export = shared
        .join("fixtures/bert")
        .join(variant)
        .join("model.onnx");
    std::fs::copy(&export, dir.path().join("model.onnx")).unwrap();
    write_bert_tokenizer(dir.path());
    dir
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}

#[test]
fn bert_embeddings_and_classification_on_onnx_runtime_match_cpu() {
    let test = "bert_embeddings_and_classification_on_onnx_runtime_match_cpu";
    let Some(shared) = shared_dir(test) else {
        return;
    };
    let texts = ["w4 w5 w6", "w7 w8 w9 w10 w11 w12"];
    let base = bert(&shared, "base");
    let classifier = bert(&shared, "sequence_classification");
    let tagger = bert(&shared, "token_classification");
    let load = |dir: &tempfile::TempDir, task: Task, kind: BackendKind| {
        Pipeline::builder(dir.path().to_str().unwrap())
            .task(task)
            .backends([kind])
            .env_override(false)
            .build()
            .unwrap()
    };
    let native = load(&base, Task::Embed, BackendKind::Cpu)
        .embed(&texts, true)
        .unwrap()
        .value;
    let native_labels = load(&classifier, Task::Classify, BackendKind::Cpu)
        .classify(&texts)
        .unwrap()
        .value;
    let native_tags = load(&tagger, Task::TokenClassify, BackendKind::Cpu)
        .classify_tokens(&texts)
        .unwrap()
        .value;
    // ONNX Runtime's providers, then WebNN in headless Chromium, through the same Pipeline.
    for kind in graph_backends(test) {
        let bar = common::graph_bar(kind);
        let pipe = load(&base, Task::Embed, kind);
        assert_eq!(pipe.backend(), kind);
        let out = pipe.embed(&texts, true).unwrap();
        for (a, b) in out.value.iter().zip(&native) {
            assert!(max_diff(a, b) < bar, "{kind}: {}", max_diff(a, b));
        }
        let labels = load(&classifier, Task::Classify, kind)
            .classify(&texts)
            .unwrap()
            .value;
        for (row, native_row) in labels.iter().zip(&native_labels) {
            assert_eq!(row[0].label, native_row[0].label, "{kind}");
            assert!((row[0].score - native_row[0].score).abs() < bar, "{kind}");
        }
        let tags = load(&tagger, Task::TokenClassify, kind)
            .classify_tokens(&texts)
            .unwrap()
            .value;
        for (row, native_row) in tags.iter().zip(&native_tags) {
            assert_eq!(row.len(), native_row.len(), "{kind}");
            for (a, b) in row.iter().zip(native_row) {
                assert_eq!(
                    (&a.token, &a.label, a.start, a.end),
                    (&b.token, &b.label, b.start, b.end)
                );
                assert!((a.score - b.score).abs() < bar, "{kind}");
            }
        }
        // The CLI takes the same backend.
        let name = kind.to_string();
        let cli: Vec<Vec<f32>> = serde_json::from_str(&run_ok(&[
            "--backend",
            &name,
            "embed",
            "--normalize",
            "--model",
            base.path().to_str().unwrap(),
            texts[0],
        ]))
        .unwrap();
        assert!(max_diff(&cli[0], &native[0]) < bar, "CLI on {kind}");
        let cli: serde_json::Value = serde_json::from_str(&run_ok(&[
            "--backend",
            &name,
            "classify",
            "--model",
            classifier.path().to_str().unwrap(),
            texts[0],
        ]))
        .unwrap();
        assert_eq!(
            cli[0][0]["label"], native_labels[0][0].label,
            "CLI classify on {kind}: {cli}"
        );
    }
    // The embedded model has no ONNX export: onnx-cpu is skipped with the reason, cpu loads.
    let pipe = Pipeline::builder(ipfs_accelerate::EMBEDDED_SPEC)
        .task(Task::Embed)
        .backends([BackendKind::Onnx(ExecutionProvider::Cpu), BackendKind::Cpu])
        .env_override(false)
        .build()
        .unwrap();
    assert_eq!(pipe.backend(), BackendKind::Cpu);
    let skipped = &pipe.skipped()[0];
    assert_eq!(skipped.kind, BackendKind::Onnx(ExecutionProvider::Cpu));
    assert!(
        skipped.reason.contains("ONNX export") || skipped.reason.contains("unavailable"),
        "{}",
        skipped.reason
    );
}

/// ViT image classification on the checkpoint's ONNX export through `ImageClassifier` and the
/// CLI's `classify-image` agrees with the native `cpu` backend.
#[test]
fn vit_image_classification_on_onnx_runtime_matches_cpu() {
    let test = "vit_image_classification_on_onnx_runtime_matches_cpu";
    let Some(shared) = shared_dir(test) else {
        return;
    };
    let vit = common::fixture_copy_with(
        &shared,
        "vit",
        "image_classification",
        "ForImageClassification",
    );
    std::fs::copy(
        shared.join("fixtures/vit/image_classification/model.onnx"),
        vit.path().join("model.onnx"),
    )
    .unwrap();
    let image = shared.join("fixtures/image_processors/image.png");
    let model = vit.path().to_str().unwrap();
    let load = |kind: BackendKind| {
        ipfs_accelerate::vision::ImageClassifier::load(
            model,
            &ipfs_accelerate::LoadOptions {
                backends: Some(vec![kind]),
                ..Default::default()
            },
        )
        .unwrap()
    };
    let native = load(BackendKind::Cpu)
        .classify_files(&[&image], 3)
        .unwrap()
        .value;
    for kind in graph_backends(test) {
        let bar = common::graph_bar(kind);
        let classifier = load(kind);
        assert_eq!(classifier.selection().device.kind, kind);
        let graph = classifier.classify_files(&[&image], 3).unwrap().value;
        for (a, b) in graph[0].iter().zip(&native[0]) {
            assert_eq!(
                (a.label.as_str(), a.index),
                (b.label.as_str(), b.index),
                "{kind}"
            );
            assert!(
                (a.score - b.score).abs() < bar,
                "{kind}: {} vs {}",
                a.score,
                b.score
            );
        }
        let name = kind.to_string();
        let out = run_ok(&[
            "--backend",
            &name,
            "classify-image",
            "--model",
            model,
            image.to_str().unwrap(),
        ]);
        assert!(out.contains(&native[0][0].label), "CLI on {kind}: {out}");
    }
}

/// The CLI's `transcribe --format json` of `wav` on `kind` with the `extra` flags: its `result`,
/// after checking that it ran on `kind`.
fn cli_transcript(
    kind: BackendKind,
    model: &str,
    wav: &std::path::Path,
    extra: &[&str],
) -> serde_json::Value {
    let name = kind.to_string();
    let mut args = vec!["--backend", &name, "transcribe", "--model", model];
    args.extend_from_slice(extra);
    args.extend(["--format", "json", wav.to_str().unwrap()]);
    let out = run_ok(&args);
    let printed: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(printed["backend"], name.as_str(), "{out}");
    printed["result"].clone()
}

/// Whisper speech recognition on the checkpoint's `encoder.onnx` + `decoder.onnx` through
/// `Transcriber` and the CLI's `transcribe` gives the native `cpu` backend's tokens (prompt,
/// suppression and end of text are the same steps on both), on ONNX Runtime and WebNN.
#[test]
fn whisper_transcription_on_onnx_runtime_matches_cpu() {
    let test = "whisper_transcription_on_onnx_runtime_matches_cpu";
    let Some(shared) = shared_dir(test) else {
        return;
    };
    let whisper = common::fixture_copy(&shared, "whisper", "base");
    for name in ["encoder.onnx", "decoder.onnx"] {
        std::fs::copy(
            shared.join("fixtures/whisper/base").join(name),
            whisper.path().join(name),
        )
        .unwrap();
    }
    let wav = whisper.path().join("sweep.wav");
    common::sweep_wav(&wav);
    let model = whisper.path().to_str().unwrap();
    let load = |kind: BackendKind| {
        let mut asr = ipfs_accelerate::speech::Transcriber::load(
            model,
            &ipfs_accelerate::LoadOptions {
                backends: Some(vec![kind]),
                ..Default::default()
            },
        )
        .unwrap();
        asr.max_new_tokens = Some(6);
        assert_eq!(asr.selection().device.kind, kind);
        asr
    };
    let native = load(BackendKind::Cpu).transcribe_file(&wav).unwrap().value;
    assert!(!native.tokens.is_empty());
    for kind in graph_backends(test) {
        let graph = load(kind).transcribe_file(&wav).unwrap().value;
        assert_eq!(graph.tokens, native.tokens, "{kind}");
        assert_eq!(graph.text, native.text, "{kind}");
        let printed = cli_transcript(kind, model, &wav, &["--max-new-tokens", "6"]);
        let tokens: Vec<i64> = serde_json::from_value(printed["tokens"].clone()).unwrap();
        assert_eq!(tokens, native.tokens, "CLI on {kind}");
    }
    // Without an export the ONNX backend is skipped with the reason, and cpu runs it.
    std::fs::remove_file(whisper.path().join("encoder.onnx")).unwrap();
    std::fs::remove_file(whisper.path().join("decoder.onnx")).unwrap();
    if available(test, ExecutionProvider::Cpu) {
        let asr = ipfs_accelerate::speech::Transcriber::load(
            model,
            &ipfs_accelerate::LoadOptions {
                backends: Some(vec![
                    BackendKind::Onnx(ExecutionProvider::Cpu),
                    BackendKind::Cpu,
                ]),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(asr.selection().device.kind, BackendKind::Cpu);
        let reason = format!("{:?}", asr.selection().skipped);
        assert!(reason.contains("no ONNX export"), "{reason}");
    }
}

/// Wav2Vec2 CTC recognition on the checkpoint's `model.onnx` through `Transcriber` and the CLI's
/// `transcribe` gives the native `cpu` backend's labels and text: the export runs the model, the
/// feature extractor, frame argmax, CTC collapse and vocabulary are the native path's.
#[test]
fn wav2vec2_transcription_on_onnx_runtime_matches_cpu() {
    let test = "wav2vec2_transcription_on_onnx_runtime_matches_cpu";
    let Some(shared) = shared_dir(test) else {
        return;
    };
    let w2v = fixture_copy(&shared, "wav2vec2", "ctc");
    std::fs::copy(
        shared.join("fixtures/wav2vec2/ctc/model.onnx"),
        w2v.path().join("model.onnx"),
    )
    .unwrap();
    // A vocabulary of letters, so the text is compared too.
    let config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(w2v.path().join("config.json")).unwrap())
            .unwrap();
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..config["vocab_size"].as_u64().unwrap())
            .map(|i| match i {
                0 => ("<pad>".to_string(), i.into()),
                1 => ("|".to_string(), i.into()),
                _ => (
                    char::from(b'a' + (i as u8 - 2) % 26).to_string()
                        + &"'".repeat((i as usize - 2) / 26),
                    i.into(),
                ),
            })
            .collect();
    std::fs::write(
        w2v.path().join("vocab.json"),
        serde_json::to_string(&vocab).unwrap(),
    )
    .unwrap();
    let wav = w2v.path().join("sweep.wav");
    common::sweep_wav(&wav);
    let model = w2v.path().to_str().unwrap();
    let load = |kind: BackendKind| {
        let asr = ipfs_accelerate::speech::Transcriber::load(
            model,
            &ipfs_accelerate::LoadOptions {
                backends: Some(vec![kind]),
                ..Default::default()
            },
        )
        .unwrap();
        assert_eq!(asr.selection().device.kind, kind);
        assert_eq!(asr.family(), "wav2vec2");
        asr
    };
    let native = load(BackendKind::Cpu).transcribe_file(&wav).unwrap().value;
    assert!(!native.tokens.is_empty());
    assert!(!native.text.is_empty());
    let onnx: Vec<BackendKind> = [ExecutionProvider::Cpu, ExecutionProvider::OpenVino]
        .into_iter()
        .filter(|p| available(test, *p))
        .map(BackendKind::Onnx)
        .collect();
    for kind in onnx {
        let graph = load(kind).transcribe_file(&wav).unwrap().value;
        assert_eq!(graph.tokens, native.tokens, "{kind}");
        assert_eq!(graph.text, native.text, "{kind}");
        let printed = cli_transcript(kind, model, &wav, &[]);
        assert_eq!(printed["text"], native.text.as_str(), "CLI on {kind}");
    }
}
