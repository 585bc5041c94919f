//! BERT forward on the CPU backend: all-MiniLM-L6-v2 and bert-base shapes, batch 1 and 8, seq 128.
//! Compare with `python3 ../shared/tools/peer_bench_torch.py --model minilm-l6 --batch 8 --seq 128`.

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ipfs_accelerate_backend_cpu::CpuBurn;
use ipfs_accelerate_benches::{bert_inputs, random_bert};
use ipfs_accelerate_core::BackendKind;

fn bert_forward(c: &mut Criterion) {
    let device = Default::default();
    let mut group = c.benchmark_group("bert_forward_cpu");
    group.sample_size(10);
    for model in ["minilm-l6", "bert-base"] {
        let runner = random_bert::<CpuBurn>(model, &device, BackendKind::Cpu);
        for batch in [1usize, 8] {
            let seq = 128;
            let inputs = bert_inputs(batch, seq, 30522);
            group.throughput(Throughput::Elements(batch as u64));
            group.bench_with_input(
                BenchmarkId::new(model, format!("b{batch}xs{seq}")),
                &inputs,
                |b, inputs| {
                    b.iter(|| {
                        let out = runner.encode(inputs).expect("forward");
                        // Reading the result back forces the computation to finish.
                        out.last_hidden_state.into_data()
                    })
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bert_forward);
criterion_main!(benches);
