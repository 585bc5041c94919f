//! Which burn CPU backend to ship: BERT forward (all-MiniLM-L6-v2 and bert-base shapes, seq 128) on
//! burn-flex, burn-ndarray with OpenBLAS, and burn-candle, in one run.
//!
//! `cargo bench -p ipfs-accelerate-benches --features compare-cpu --bench cpu_backends`

use criterion::{criterion_group, criterion_main, Criterion};
use ipfs_accelerate_benches::bench_bert_forward;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[allow(deprecated)] // burn-candle is deprecated in burn 0.21; measured for the record
fn backends(c: &mut Criterion) {
    bench_bert_forward::<burn_flex::Flex>(c, "cpu_backend_flex");
    bench_bert_forward::<burn_ndarray::NdArray>(c, "cpu_backend_ndarray_openblas");
    bench_bert_forward::<burn_candle::Candle>(c, "cpu_backend_candle");
}

criterion_group!(benches, backends);
criterion_main!(benches);
