//! Loaded models are `Send + Sync`: one handle serves many threads through `&self`, and every
//! thread gets exactly the single-threaded answer.

use std::sync::Arc;

use ipfs_accelerate::{BackendKind, Pipeline};
use ipfs_accelerate_conformance::shared_dir;

/// Compile-time check: the handle can be shared between threads without a `Mutex`.
fn assert_shareable<T: Send + Sync>() {}

#[test]
fn every_public_handle_is_send_and_sync() {
    assert_shareable::<Pipeline>();
    assert_shareable::<ipfs_accelerate::text::TextGenerator>();
    assert_shareable::<ipfs_accelerate::text2text::Text2Text>();
    assert_shareable::<ipfs_accelerate::speech::Transcriber>();
    assert_shareable::<ipfs_accelerate::vision::ImageClassifier>();
    assert_shareable::<ipfs_accelerate::vision::ZeroShotClassifier>();
    assert_shareable::<ipfs_accelerate::vision::ObjectDetector>();
    assert_shareable::<ipfs_accelerate::multimodal::ImageDescriber>();
    assert_shareable::<ipfs_accelerate::multimodal::VideoClassifier>();
    assert_shareable::<ipfs_accelerate::multimodal::AudioClassifier>();
}

#[test]
fn eight_threads_share_one_pipeline_and_get_identical_embeddings() {
    let test = "eight_threads_share_one_pipeline_and_get_identical_embeddings";
    let Some(shared) = shared_dir(test) else {
        return;
    };
    let dir = shared.join("models/all-MiniLM-L6-v2");
    let text = std::fs::read_to_string(shared.join("refs/minilm_public_sentences.txt")).unwrap();
    let sentences: Vec<String> = text.lines().map(str::to_string).collect();
    let pipe = Arc::new(
        Pipeline::builder(dir.to_str().unwrap())
            .offline(true)
            .backends([BackendKind::Cpu])
            .env_override(false)
            .build()
            .unwrap(),
    );
    let refs: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let alone = pipe.embed(&refs, true).unwrap().value;
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let pipe = Arc::clone(&pipe);
            let sentences = sentences.clone();
            std::thread::spawn(move || {
                // Each thread embeds every sentence, in its own order, three times.
                let mut out = vec![Vec::new(); sentences.len()];
                for round in 0..3 {
                    for k in 0..sentences.len() {
                        let i = (k + t + round) % sentences.len();
                        out[i] = pipe.embed(&[&sentences[i]], true).unwrap().value.remove(0);
                    }
                }
                out
            })
        })
        .collect();
    for handle in threads {
        let got = handle.join().unwrap();
        // Bit-identical to one sentence embedded alone (single-row batches have no padding, so
        // compare against the single-threaded run of the same one-row batches).
        for (i, row) in got.iter().enumerate() {
            let single = pipe.embed(&[&sentences[i]], true).unwrap().value.remove(0);
            assert_eq!(row, &single, "sentence {i}");
            // And close to the padded batch of all sentences (padding changes the summation).
            let dot: f32 = row.iter().zip(&alone[i]).map(|(a, b)| a * b).sum();
            assert!(dot > 0.9999, "sentence {i}: cosine {dot}");
        }
    }
}
