//! Helpers shared by the CLI's integration tests: running the binary, copying fixtures, and
//! writing small word-level tokenizers.
#![allow(dead_code)] // each test binary uses a different subset

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};

pub fn cli() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_ipfs-accelerate"));
    c.env_remove("IPFS_ACCELERATE_BACKENDS")
        .env_remove("IPFS_ACCELERATE_MODEL")
        .env("HF_HUB_OFFLINE", "1");
    c
}

pub fn run(args: &[&str]) -> std::process::Output {
    cli().args(args).output().unwrap()
}

/// Runs the binary with `args`, asserting that it fails cleanly with an error mentioning `needle`.
pub fn run_fails(args: &[&str], needle: &str) {
    let out = run(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(needle) && !err.contains("panicked"),
        "{args:?}: {err}"
    );
}

pub fn run_ok(args: &[&str]) -> String {
    let out = run(args);
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A copy of a fixture checkpoint of `family` in a temporary folder: the variant named `variant`
/// when the fixture set has it, else its first variant whose config.json contains `needs`.
pub fn fixture_copy(shared: &Path, family: &str, variant: &str) -> tempfile::TempDir {
    fixture_copy_with(shared, family, variant, "")
}

pub fn fixture_copy_with(
    shared: &Path,
    family: &str,
    variant: &str,
    needs: &str,
) -> tempfile::TempDir {
    let root = shared.join("fixtures").join(family);
    let mut variants: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.unwrap().path())
        .filter(|d| std::fs::read_to_string(d.join("config.json")).is_ok_and(|c| c.contains(needs)))
        .collect();
    variants.sort();
    let dir = variants
        .iter()
        .find(|d| d.ends_with(variant))
        .or(variants.first())
        .unwrap_or_else(|| panic!("no {family} fixture with `{needs}` in its config"))
        .clone();
    let tmp = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name != "reference.safetensors" && !name.to_string_lossy().ends_with(".onnx") {
            std::fs::copy(entry.path(), tmp.path().join(name)).unwrap();
        }
    }
    tmp
}

/// Writes a word-level `tokenizer.json` over `vocab` words `w<i>` (ids from `first_word`), with
/// `specials` (content, id) and the post-processor template `before $A after`.
pub fn write_tokenizer(
    dir: &Path,
    vocab: usize,
    specials: &[(&str, u32)],
    before: &[&str],
    after: &[&str],
) {
    let mut words = serde_json::Map::new();
    for (content, id) in specials {
        words.insert(content.to_string(), json!(id));
    }
    for id in 0..vocab as u32 {
        if !specials.iter().any(|s| s.1 == id) {
            words.insert(format!("w{id}"), json!(id));
        }
    }
    let piece = |t: &str| json!({ "SpecialToken": { "id": t, "type_id": 0 } });
    let mut single: Vec<Value> = before.iter().map(|t| piece(t)).collect();
    single.push(json!({ "Sequence": { "id": "A", "type_id": 0 } }));
    single.extend(after.iter().map(|t| piece(t)));
    let special_tokens: serde_json::Map<String, Value> = before
        .iter()
        .chain(after)
        .map(|t| {
            let id = specials.iter().find(|s| s.0 == *t).unwrap().1;
            (
                t.to_string(),
                json!({ "id": t, "ids": [id], "tokens": [t] }),
            )
        })
        .collect();
    let added: Vec<Value> = specials
        .iter()
        .map(|(c, id)| {
            json!({ "id": id, "content": c, "single_word": false, "lstrip": false,
            "rstrip": false, "normalized": false, "special": true })
        })
        .collect();
    let tokenizer = json!({
        "version": "1.0", "truncation": null, "padding": null, "added_tokens": added,
        "normalizer": null, "pre_tokenizer": { "type": "Whitespace" },
        "post_processor": { "type": "TemplateProcessing", "single": single, "pair": single,
            "special_tokens": special_tokens },
        "decoder": null,
        "model": { "type": "WordLevel", "vocab": words, "unk_token": specials[0].0 }
    });
    std::fs::write(dir.join("tokenizer.json"), tokenizer.to_string()).unwrap();
}

/// A 1.5 s stereo 16-bit sine sweep at 22.05 kHz (the models want 16 kHz mono).
pub fn sweep_wav(path: &Path) {
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: 22_050,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    let n = 33_075;
    for i in 0..n {
        let t = i as f32 / 22_050.0;
        let v = (2.0 * std::f32::consts::PI * (200.0 + 900.0 * t) * t).sin() * 0.5;
        w.write_sample((v * 32_000.0) as i16).unwrap();
        w.write_sample((v * 16_000.0) as i16).unwrap();
    }
    w.finalize().unwrap();
}

/// The word-level tokenizer of the BERT fixtures' 99 ids: `[PAD]` 0, `[UNK]` 1, `[CLS]` 2,
/// `[SEP]` 3, then `w4 w5 ...`; one text becomes `[CLS] words [SEP]`.
pub fn write_bert_tokenizer(dir: &Path) {
    write_tokenizer(
        dir,
        99,
        &[("[UNK]", 1), ("[PAD]", 0), ("[CLS]", 2), ("[SEP]", 3)],
        &["[CLS]"],
        &["[SEP]"],
    );
}

/// How close a graph backend's output must be to the native `cpu` backend's: ONNX Runtime
/// computes in cpu's order (1e-4); the browser's WebNN in its own (1e-3).
pub fn graph_bar(kind: ipfs_accelerate::BackendKind) -> f32 {
    if matches!(kind, ipfs_accelerate::BackendKind::Onnx(_)) {
        1e-4
    } else {
        1e-3
    }
}
