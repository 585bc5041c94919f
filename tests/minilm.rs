//! all-MiniLM-L6-v2: the real checkpoint and the embedded compact copy against sentence-transformers'
//! reference embeddings (HF transformers 5.23, float64).

use ipfs_accelerate::core::TensorSource;
use ipfs_accelerate::{BackendKind, Pipeline, Task, EMBEDDED_SPEC};
use ipfs_accelerate_io::SafeTensorsFile;
use ipfs_accelerate_tests::{cosine, shared_dir};

fn sentences(shared: &std::path::Path) -> Vec<String> {
    std::fs::read_to_string(shared.join("refs/minilm_public_sentences.txt"))
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect()
}

fn check_embeddings(pipe: &Pipeline, shared: &std::path::Path, min_cosine: f64) -> f64 {
    let refs = SafeTensorsFile::open(shared.join("refs/minilm_public.safetensors")).unwrap();
    let texts = sentences(shared);
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let want = refs.tensor("sentence_embeddings").unwrap();
    let dim = want.shape()[1];
    let want = want.to_f64_vec();
    let got = pipe.embed(&texts, true).unwrap();
    assert_eq!(got.value.len(), texts.len());
    let mut worst = 1.0f64;
    for (i, v) in got.value.iter().enumerate() {
        let c = cosine(v, &want[i * dim..(i + 1) * dim]);
        assert!(c >= min_cosine, "sentence {i}: cosine {c} < {min_cosine}");
        worst = worst.min(c);
    }
    worst
}

#[test]
fn real_checkpoint_matches_sentence_transformers() {
    let Some(shared) = shared_dir("real_checkpoint_matches_sentence_transformers") else {
        return;
    };
    let model = shared.join("models/all-MiniLM-L6-v2");
    let pipe = Pipeline::builder(model.to_str().unwrap())
        .task(Task::Embed)
        .backends([BackendKind::Cpu])
        .offline(true)
        .build()
        .unwrap();

    // Token ids, mask and segments equal the HF tokenizer's.
    let refs = SafeTensorsFile::open(shared.join("refs/minilm_public.safetensors")).unwrap();
    let texts = sentences(&shared);
    let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
    let enc = pipe.tokenizer().encode_batch(&texts).unwrap();
    let ids = refs.tensor("input_ids").unwrap();
    assert_eq!(vec![enc.batch, enc.seq], ids.shape());
    assert_eq!(enc.input_ids, ids.to_i64_vec().unwrap());
    assert_eq!(
        enc.attention_mask,
        refs.tensor("attention_mask").unwrap().to_i64_vec().unwrap()
    );
    assert_eq!(
        enc.token_type_ids,
        refs.tensor("token_type_ids").unwrap().to_i64_vec().unwrap()
    );

    let worst = check_embeddings(&pipe, &shared, 0.99999);
    eprintln!("real all-MiniLM-L6-v2: worst cosine {worst:.9}");

    // The raw encoder output too, through the uniform runner interface.
    let mut inputs = ipfs_accelerate::core::TensorMap::new();
    for name in ["input_ids", "attention_mask", "token_type_ids"] {
        inputs.insert(name.into(), refs.tensor(name).unwrap());
    }
    let out = pipe.runner().run(&inputs).unwrap();
    let got = out["last_hidden_state"].to_f64_vec();
    let want = refs.tensor("last_hidden_state").unwrap().to_f64_vec();
    let rel = ipfs_accelerate::conformance::relative_error(&got, &want);
    assert!(rel < 1e-4, "last_hidden_state relative error {rel}");
}

#[test]
fn embedded_compact_copy_is_close() {
    let Some(shared) = shared_dir("embedded_compact_copy_is_close") else {
        return;
    };
    let pipe = Pipeline::builder(EMBEDDED_SPEC)
        .backends([BackendKind::Cpu])
        .build()
        .unwrap();
    assert_eq!(pipe.task(), Task::Embed);
    let worst = check_embeddings(&pipe, &shared, 0.999);
    eprintln!("embedded int8 all-MiniLM-L6-v2: worst cosine {worst:.6}");
}

#[test]
fn embedded_model_needs_no_files() {
    // Works on a machine with nothing but the binary: no shared data, no network.
    let pipe = Pipeline::builder(EMBEDDED_SPEC)
        .backends([BackendKind::Cpu])
        .offline(true)
        .build()
        .unwrap();
    let out = pipe
        .embed(
            &[
                "A man is playing a guitar.",
                "Someone plays music.",
                "The stock market fell.",
            ],
            true,
        )
        .unwrap();
    let v = &out.value;
    assert_eq!(v[0].len(), 384);
    let dot = |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>();
    assert!((dot(&v[0], &v[0]) - 1.0).abs() < 1e-4, "normalised");
    assert!(
        dot(&v[0], &v[1]) > dot(&v[0], &v[2]),
        "related sentences are closer"
    );
    assert_eq!(out.metrics.backend, "cpu");
    assert!(out.metrics.total >= out.metrics.inference);
}
