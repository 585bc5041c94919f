//! BERT forward on the CPU backend: all-MiniLM-L6-v2 and bert-base shapes, batch 1 and 8, seq 128.
//! Compare with `python3 ../shared/tools/peer_bench_torch.py --model minilm-l6 --batch 8 --seq 128`.

use criterion::{criterion_group, criterion_main, Criterion};
use ipfs_accelerate_backend_cpu::CpuBurn;
use ipfs_accelerate_benches::bench_bert_forward;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn bert_forward(c: &mut Criterion) {
    bench_bert_forward::<CpuBurn>(c, "bert_forward_cpu");
}

criterion_group!(benches, bert_forward);
criterion_main!(benches);
