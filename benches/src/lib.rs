//! Shared helpers of the criterion benchmarks: models of real size with random weights.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use ipfs_accelerate_bert::{names::tensor_shapes, preset, BertInputs, BertRunner};
use ipfs_accelerate_core::BackendKind;
use ipfs_accelerate_io::RandomWeights;

/// A BERT of a named preset (`bert-base`, `minilm-l6`) with random weights on `device`.
pub fn random_bert<B: Backend>(name: &str, device: &B::Device, kind: BackendKind) -> BertRunner<B> {
    let config = preset(name).unwrap_or_else(|| panic!("unknown preset {name}"));
    let source = Arc::new(RandomWeights::new(tensor_shapes(&config), 0, 0.02));
    BertRunner::load(source, &config, device, kind).expect("random weights match the preset")
}

/// `batch × seq` token ids spread over the vocabulary, full attention, one segment.
pub fn bert_inputs(batch: usize, seq: usize, vocab: usize) -> BertInputs {
    let n = batch * seq;
    BertInputs {
        batch,
        seq,
        input_ids: (0..n).map(|i| ((i * 7919 + 1000) % vocab) as i64).collect(),
        attention_mask: vec![1; n],
        token_type_ids: vec![0; n],
    }
}

/// Times `runner.encode(inputs)` as `id` in `group`, reading the result back so the work finishes.
pub fn bench_encode<B: Backend>(
    group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
    id: criterion::BenchmarkId,
    runner: &BertRunner<B>,
    inputs: &BertInputs,
) {
    group.bench_with_input(id, inputs, |b, inputs| {
        b.iter(|| {
            let out = runner.encode(inputs).expect("forward");
            // Reading the result back forces the computation to finish.
            out.last_hidden_state.into_data()
        })
    });
}

/// Criterion group `group`: BERT forward at seq 128 for the `minilm-l6` and `bert-base` presets,
/// batch 1 and 8, on backend `B` (the shared body of the `bert_forward` and `cpu_backends` benches).
pub fn bench_bert_forward<B: Backend>(c: &mut criterion::Criterion, group: &str) {
    use criterion::{BenchmarkId, Throughput};
    let device = B::Device::default();
    let mut group = c.benchmark_group(group);
    group.sample_size(10);
    let seq = 128;
    for model in ["minilm-l6", "bert-base"] {
        let runner = random_bert::<B>(model, &device, BackendKind::Cpu);
        for batch in [1usize, 8] {
            let inputs = bert_inputs(batch, seq, 30522);
            group.throughput(Throughput::Elements(batch as u64));
            bench_encode(
                &mut group,
                BenchmarkId::new(model, format!("b{batch}xs{seq}")),
                &runner,
                &inputs,
            );
        }
    }
    group.finish();
}
