//! Which burn CPU backend to ship: BERT forward (all-MiniLM-L6-v2 and bert-base shapes, seq 128) on
//! burn-flex, burn-ndarray with OpenBLAS, and burn-candle, in one run.
//!
//! `cargo bench -p ipfs-accelerate-benches --features compare-cpu --bench cpu_backends`

use burn::tensor::backend::Backend;
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ipfs_accelerate_benches::{bert_inputs, random_bert};
use ipfs_accelerate_core::BackendKind;

fn run<B: Backend>(c: &mut Criterion, backend: &str) {
    let device = B::Device::default();
    let mut group = c.benchmark_group(format!("cpu_backend_{backend}"));
    group.sample_size(10);
    for (model, batches) in [("minilm-l6", &[1usize, 8][..]), ("bert-base", &[1, 8][..])] {
        let runner = random_bert::<B>(model, &device, BackendKind::Cpu);
        for &batch in batches {
            let inputs = bert_inputs(batch, 128, 30522);
            group.throughput(Throughput::Elements(batch as u64));
            group.bench_with_input(
                BenchmarkId::new(model, format!("b{batch}xs128")),
                &inputs,
                |b, inputs| {
                    b.iter(|| {
                        runner
                            .encode(inputs)
                            .expect("forward")
                            .last_hidden_state
                            .into_data()
                    })
                },
            );
        }
    }
    group.finish();
}

fn backends(c: &mut Criterion) {
    run::<burn_flex::Flex>(c, "flex");
    run::<burn_ndarray::NdArray>(c, "ndarray_openblas");
    run::<burn_candle::Candle>(c, "candle");
}

criterion_group!(benches, backends);
criterion_main!(benches);
