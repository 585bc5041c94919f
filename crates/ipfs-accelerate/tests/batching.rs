//! `Pipeline::embed` runs an input in chunks of at most the batch size, sorted by tokens and split
//! where padding would cost more than another forward, and returns each text's vector in the
//! input's order, equal to embedding that text alone.

use ipfs_accelerate::{Pipeline, Task};

#[test]
fn chunked_embeddings_equal_one_at_a_time_in_input_order() {
    let texts: Vec<String> = (0..21)
        .map(|i| "word ".repeat(1 + (i * 7) % 13) + &format!("number {i}"))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    // Chunks capped by the batch size (4), and one batch split by length alone (32).
    for batch in [4, 32] {
        check_against_alone(&refs, batch);
    }
}

fn check_against_alone(refs: &[&str], batch: usize) {
    let pipe = Pipeline::builder(ipfs_accelerate::EMBEDDED_SPEC)
        .task(Task::Embed)
        .batch_size(batch)
        .build()
        .unwrap();
    let all = pipe.embed(refs, true).unwrap();
    assert_eq!(all.value.len(), refs.len());
    assert_eq!(all.metrics.items, refs.len());
    for (text, vector) in refs.iter().zip(&all.value) {
        let alone = pipe.embed(&[text], true).unwrap().value.remove(0);
        let diff = alone
            .iter()
            .zip(vector)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-4, "batch {batch}, {text:?}: {diff}");
    }
    assert!(pipe.embed(&[], true).is_err(), "an empty input is an error");
}
