//! Weight sharing across pipelines (`PipelineBuilder::share_weights`): two pipelines on the same
//! all-MiniLM-L6-v2 files hold each tensor once, measured by the process-wide weight registry's
//! accounting (`weights::process_weight_bytes`), and free it when both are dropped. One test in
//! this file, so no other load of the test binary moves the process-wide count meanwhile.

use std::path::Path;

use ipfs_accelerate::weights::process_weight_bytes;
use ipfs_accelerate::{BackendKind, Pipeline, WeightQuantization};
use ipfs_accelerate_conformance::shared_dir;

fn pipeline(dir: &Path, share: bool, q: WeightQuantization) -> Pipeline {
    Pipeline::builder(dir.to_str().unwrap())
        .offline(true)
        .backends([BackendKind::Cpu])
        .env_override(false)
        .share_weights(share)
        .quantize(q)
        .build()
        .unwrap()
}

#[test]
fn two_pipelines_on_the_same_files_hold_the_weights_once_when_sharing() {
    let test = "two_pipelines_on_the_same_files_hold_the_weights_once_when_sharing";
    let Some(shared) = shared_dir(test) else {
        return;
    };
    let dir = shared.join("models/all-MiniLM-L6-v2");
    if !dir.join("model.safetensors").is_file() {
        eprintln!("skipped {test}: needs {}", dir.display());
        return;
    }
    let texts = ["Weights are loaded once.", "Both pipelines read them."];
    let base = process_weight_bytes();
    let float = WeightQuantization::None;

    // Sharing on: the second pipeline finds every tensor and adds no bytes.
    let a = pipeline(&dir, true, float);
    let one = process_weight_bytes() - base;
    assert_eq!(
        one,
        a.weights().bytes,
        "the registry holds exactly what the model does"
    );
    assert!(
        one > 80 << 20,
        "MiniLM's f32 weights are ~87 MiB, got {one}"
    );
    let b = pipeline(&dir, true, float);
    let w = b.weights();
    assert_eq!(
        w.shared_tensors, w.tensors,
        "every tensor of the second load is shared"
    );
    assert_eq!(process_weight_bytes() - base, one, "1x with sharing");
    assert_eq!(
        a.embed(&texts, true).unwrap().value,
        b.embed(&texts, true).unwrap().value
    );
    // Still held by `b` after `a` is dropped; freed with `b`.
    drop(a);
    assert_eq!(process_weight_bytes() - base, one);
    drop(b);
    assert_eq!(process_weight_bytes(), base, "freed when both are dropped");

    // Sharing off: two copies.
    let c = pipeline(&dir, false, float);
    let d = pipeline(&dir, false, float);
    assert_eq!(d.weights().shared_tensors, 0);
    assert_eq!(process_weight_bytes() - base, 2 * one, "2x without sharing");
    drop((c, d));
    assert_eq!(process_weight_bytes(), base);

    // A float and an int8 pipeline share what they keep alike (embeddings, norms, biases) and
    // hold their own linear weights.
    let e = pipeline(&dir, true, float);
    let f = pipeline(&dir, true, WeightQuantization::Int8 { block_size: 32 });
    let fw = f.weights();
    assert_eq!(fw.shared_tensors, fw.tensors - fw.linear_layers);
    assert_eq!(process_weight_bytes() - base, one + fw.linear_bytes);
    eprintln!(
        "one MiniLM: {one} B; two shared: {one} B; two unshared: {} B; float + int8 shared: {} B",
        2 * one,
        one + fw.linear_bytes
    );
    drop((e, f));
    assert_eq!(process_weight_bytes(), base);
}
