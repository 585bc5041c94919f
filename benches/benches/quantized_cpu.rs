//! BERT forward on the CPU backend with f32, int8 and int4 (block 32) linear weights: bert-base and
//! all-MiniLM-L6-v2 shapes, batch 8 × seq 128, random weights (issue #10's f32 vs Int8 ratio).
//! Quantized weights are dequantized per layer at forward on this backend, so this measures what
//! the memory saving costs in time.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ipfs_accelerate_backend_cpu::CpuBurn;
use ipfs_accelerate_benches::{bench_encode, bert_inputs, random_bert};
use ipfs_accelerate_core::BackendKind;
use ipfs_accelerate_nn::{load_scope, LoadSettings, WeightQuantization};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn quantized_cpu(c: &mut Criterion) {
    let device = Default::default();
    let mut group = c.benchmark_group("bert_quantized_cpu");
    group.sample_size(10);
    let (batch, seq) = (8usize, 128usize);
    let inputs = bert_inputs(batch, seq, 30522);
    group.throughput(Throughput::Elements(batch as u64));
    for model in ["minilm-l6", "bert-base"] {
        for (label, q) in [
            ("f32", WeightQuantization::None),
            ("int8", WeightQuantization::Int8 { block_size: 32 }),
            ("int4", WeightQuantization::Int4 { block_size: 32 }),
        ] {
            let settings = LoadSettings::default().quantize(q);
            let (runner, loaded) = load_scope(settings, || {
                random_bert::<CpuBurn>(model, &device, BackendKind::Cpu)
            });
            eprintln!(
                "{model} {label}: weights {:.1} MiB",
                loaded.stats().bytes as f64 / (1024.0 * 1024.0)
            );
            bench_encode(
                &mut group,
                BenchmarkId::new(model, format!("{label}_b{batch}xs{seq}")),
                &runner,
                &inputs,
            );
        }
    }
    group.finish();
}

criterion_group!(benches, quantized_cpu);
criterion_main!(benches);
