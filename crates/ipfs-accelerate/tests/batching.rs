//! `Pipeline::embed` runs a large input in chunks of the batch size, longest texts first, and
//! returns each text's vector in the input's order, equal to embedding that text alone.

use ipfs_accelerate::{Pipeline, Task};

#[test]
fn chunked_embeddings_equal_one_at_a_time_in_input_order() {
    let texts: Vec<String> = (0..21)
        .map(|i| "word ".repeat(1 + (i * 7) % 13) + &format!("number {i}"))
        .collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let pipe = Pipeline::builder(ipfs_accelerate::EMBEDDED_SPEC)
        .task(Task::Embed)
        .batch_size(4)
        .build()
        .unwrap();
    let all = pipe.embed(&refs, true).unwrap();
    assert_eq!(all.value.len(), texts.len());
    assert_eq!(all.metrics.items, texts.len());
    for (text, vector) in refs.iter().zip(&all.value) {
        let alone = pipe.embed(&[text], true).unwrap().value.remove(0);
        let diff = alone
            .iter()
            .zip(vector)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(diff < 1e-4, "{text:?}: {diff}");
    }
    assert!(pipe.embed(&[], true).is_err(), "an empty input is an error");
}
