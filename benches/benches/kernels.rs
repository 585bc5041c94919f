//! Criterion benches of the kernels the model families spend their time in, on the CPU backend
//! (`burn_flex::Flex`, f32), at the shapes of real models, through the same `ipfs-accelerate-nn`
//! blocks the families call (weights from `RandomInit`, loaded by a `VarBuilder` as a checkpoint
//! would be). Every iteration reads its result back with `into_data`, so a lazy or asynchronous
//! backend would have to finish the work inside the timing.
//!
//! - `matmul/bert_base_t1024/*`: `nn::Linear::forward` (weight `[in, out]` + bias) on 8×128 =
//!   1024 tokens of BERT-base: `768x768` (query / key / value / attention output), `768x3072`
//!   (intermediate), `3072x768` (output). Throughput: elements = FLOPs (2·m·k·n), so elem/s is
//!   FLOP/s.
//! - `matmul/smollm2_decode_t1/*`: the same layer without bias on one token of SmolLM2-135M
//!   (gemv): `576x1536` (gate / up), `1536x576` (down), `576x49152` (the tied `lm_head`).
//!   Throughput: bytes = weight bytes, since a gemv is bound by streaming the weight.
//! - `matmul/smollm2_prefill_t128/*`: the same on a 128-token prompt: `576x576` (q / o),
//!   `576x1536` (gate / up), `1536x576` (down). Throughput: FLOPs.
//! - `attention/bert_base_b8_h12_s128_d64/{no_mask,padding_mask}`: BERT's attention core as
//!   `BertModel` runs it: `split_heads` of `[8, 128, 768]` q / k / v, `nn::attention::sdpa`
//!   (two batched matmuls and a softmax), `merge_heads`; without a mask (equal-length batch, as
//!   BERT skips the bias) and with a `padding_bias` (half the rows padded after 96 tokens).
//!   Throughput: FLOPs of the two matmuls (4·b·h·s·s·d).
//! - `attention/smollm2_gqa_decode_kv256/{bias_per_head,bias_shared}`: one decode step of
//!   SmolLM2's grouped-query attention, `MultiHeadAttention::attend_heads` (9 query heads over 3
//!   key / value heads of width 64, 256 cached positions, causal `padding_bias`).
//!   `bias_per_head` passes a bias of 9 heads as the LLaMA family builds it (which takes the
//!   `repeat_kv` path); `bias_shared` a bias of 1 head (the grouped path without copying k / v).
//!   Throughput: FLOPs.
//! - `norm/layer_norm_1024x768`: `nn::LayerNorm` (BERT-base, eps 1e-12) on 1024 tokens.
//! - `norm/rms_norm_128x576`: `nn::RmsNorm` (SmolLM2, eps 1e-5) on 128 tokens.
//! - `elementwise/softmax_96x128x128`: `burn::tensor::activation::softmax` over the last axis of
//!   BERT-base attention scores (8 × 12 heads, 128 × 128), as `sdpa` calls it.
//! - `elementwise/gelu_1024x3072`: `nn::Activation::Gelu` (erf GELU) on BERT-base's
//!   intermediate activations. Norm and element-wise throughput: elements of the input.
//! - `gated_mlp_smollm2/t{1,128}`: `nn::GatedMlp` (576 → 1536 → 576, SiLU, no bias) on 1 token
//!   (decode) and 128 tokens (prefill). Throughput: elements = tokens.
//!
//! The `nn` blocks take the fused kernels of `crates/kernels` on this backend (see
//! `ipfs_accelerate_nn::fast`); `IPFS_ACCELERATE_CPU_KERNELS=0` runs the same benches on burn's
//! generic ops instead, for an A/B comparison in one build. `elementwise/softmax_*` calls burn's
//! softmax directly and is the same either way.
//!
//! Each bench takes 10 samples over ~2 s after 0.5 s of warm-up, so the whole file runs in about
//! a minute on 2 cores (64 s measured):
//!
//! `cargo bench -p ipfs-accelerate-benches --bench kernels [-- FILTER]` (e.g. `-- matmul/`,
//! or `-- --quick` for a faster, rougher pass).

use std::sync::Arc;
use std::time::Duration;

use burn::tensor::{activation::softmax, Distribution, Tensor};
use burn_flex::Flex;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ipfs_accelerate_io::RandomInit;
use ipfs_accelerate_nn::attention::{
    merge_heads, padding_bias, sdpa, split_heads, AttentionConfig, MultiHeadAttention,
    ProjectionBias, ProjectionNames,
};
use ipfs_accelerate_nn::mlp::GatedMlp;
use ipfs_accelerate_nn::{Activation, ActivationForward, LayerNorm, Linear, RmsNorm, VarBuilder};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

type B = Flex;

/// BERT-base: hidden width, intermediate width, heads, tokens of a batch of 8 × 128.
const BERT_HIDDEN: usize = 768;
const BERT_FFN: usize = 3072;
const BERT_HEADS: usize = 12;
const BERT_BATCH: usize = 8;
const BERT_SEQ: usize = 128;
const BERT_TOKENS: usize = BERT_BATCH * BERT_SEQ;

/// SmolLM2-135M: hidden width, intermediate width, vocabulary, query / key-value heads.
const SMOL_HIDDEN: usize = 576;
const SMOL_FFN: usize = 1536;
const SMOL_VOCAB: usize = 49152;
const SMOL_HEADS: usize = 9;
const SMOL_KV_HEADS: usize = 3;
const SMOL_PROMPT: usize = 128;
const SMOL_CACHED: usize = 256;

/// A weight builder over random weights of any requested shape (std 0.02, as HF initialises).
fn weights() -> VarBuilder<B> {
    VarBuilder::new(Arc::new(RandomInit::new(0, 0.02)), &Default::default())
}

/// A standard-normal activation tensor of `shape`.
fn activations<const D: usize>(shape: [usize; D]) -> Tensor<B, D> {
    Tensor::random(shape, Distribution::Normal(0.0, 1.0), &Default::default())
}

fn matmul(c: &mut Criterion) {
    let mut group = c.benchmark_group("matmul");
    // (case, tokens, in, out, bias, throughput in weight bytes rather than FLOPs)
    let cases = [
        (
            "bert_base_t1024",
            BERT_TOKENS,
            BERT_HIDDEN,
            BERT_HIDDEN,
            true,
            false,
        ),
        (
            "bert_base_t1024",
            BERT_TOKENS,
            BERT_HIDDEN,
            BERT_FFN,
            true,
            false,
        ),
        (
            "bert_base_t1024",
            BERT_TOKENS,
            BERT_FFN,
            BERT_HIDDEN,
            true,
            false,
        ),
        ("smollm2_decode_t1", 1, SMOL_HIDDEN, SMOL_FFN, false, true),
        ("smollm2_decode_t1", 1, SMOL_FFN, SMOL_HIDDEN, false, true),
        ("smollm2_decode_t1", 1, SMOL_HIDDEN, SMOL_VOCAB, false, true),
        (
            "smollm2_prefill_t128",
            SMOL_PROMPT,
            SMOL_HIDDEN,
            SMOL_HIDDEN,
            false,
            false,
        ),
        (
            "smollm2_prefill_t128",
            SMOL_PROMPT,
            SMOL_HIDDEN,
            SMOL_FFN,
            false,
            false,
        ),
        (
            "smollm2_prefill_t128",
            SMOL_PROMPT,
            SMOL_FFN,
            SMOL_HIDDEN,
            false,
            false,
        ),
    ];
    let vb = weights();
    for (case, tokens, in_dim, out_dim, bias, by_bytes) in cases {
        let name = format!("{in_dim}x{out_dim}");
        let layer = Linear::load(&vb.pp(&name), in_dim, out_dim, bias).expect("random weights");
        let x = activations([tokens, in_dim]);
        group.throughput(if by_bytes {
            Throughput::Bytes((in_dim * out_dim * 4) as u64)
        } else {
            Throughput::Elements((2 * tokens * in_dim * out_dim) as u64)
        });
        group.bench_function(BenchmarkId::new(case, name), |b| {
            b.iter(|| layer.forward(x.clone()).into_data())
        });
    }
    group.finish();
}

fn attention(c: &mut Criterion) {
    let mut group = c.benchmark_group("attention");

    // BERT-base: q / k / v as the projections leave them, split into heads inside the timing
    // (strided views, as `BertModel` does).
    let (b, s, h) = (BERT_BATCH, BERT_SEQ, BERT_HEADS);
    let d = BERT_HIDDEN / h;
    let [q, k, v] = [0; 3].map(|_| activations([b, s, BERT_HIDDEN]));
    // Odd rows padded after 96 tokens.
    let mask: Vec<i64> = (0..b * s)
        .map(|i| i64::from((i / s) % 2 == 0 || i % s < 96))
        .collect();
    let bias = padding_bias::<B>(&mask, b, s, h, s, false, &Default::default());
    group.throughput(Throughput::Elements((4 * b * h * s * s * d) as u64));
    let case = format!("bert_base_b{b}_h{h}_s{s}_d{d}");
    for (variant, bias) in [("no_mask", None), ("padding_mask", Some(&bias))] {
        group.bench_function(BenchmarkId::new(&case, variant), |bench| {
            bench.iter(|| {
                let heads = |x: &Tensor<B, 3>| split_heads(x.clone(), h);
                merge_heads(sdpa(heads(&q), heads(&k), heads(&v), bias, None)).into_data()
            })
        });
    }

    // SmolLM2 decode step: one query position over the cached keys / values.
    let d = SMOL_HIDDEN / SMOL_HEADS;
    let config = AttentionConfig {
        heads: SMOL_HEADS,
        kv_heads: SMOL_KV_HEADS,
        head_dim: d,
        ..AttentionConfig::new(SMOL_HIDDEN, SMOL_HEADS, ProjectionBias::NONE)
    };
    let attn =
        MultiHeadAttention::<B>::load(&weights().pp("attn"), config, ProjectionNames::O_PROJ)
            .expect("random weights");
    let q = activations([1, SMOL_HEADS, 1, d]);
    let k = activations([1, SMOL_KV_HEADS, SMOL_CACHED, d]);
    let v = activations([1, SMOL_KV_HEADS, SMOL_CACHED, d]);
    let mask = vec![1i64; SMOL_CACHED];
    let dev = Default::default();
    let per_head = padding_bias::<B>(&mask, 1, SMOL_CACHED, SMOL_HEADS, 1, true, &dev);
    let shared = padding_bias::<B>(&mask, 1, SMOL_CACHED, 1, 1, true, &dev);
    group.throughput(Throughput::Elements(
        (4 * SMOL_HEADS * SMOL_CACHED * d) as u64,
    ));
    let case = format!("smollm2_gqa_decode_kv{SMOL_CACHED}");
    for (variant, bias) in [("bias_per_head", &per_head), ("bias_shared", &shared)] {
        group.bench_function(BenchmarkId::new(&case, variant), |bench| {
            bench.iter(|| {
                attn.attend_heads(q.clone(), k.clone(), v.clone(), Some(bias))
                    .into_data()
            })
        });
    }
    group.finish();
}

fn norm(c: &mut Criterion) {
    let mut group = c.benchmark_group("norm");
    let layer_norm =
        LayerNorm::<B>::load(&weights().pp("ln"), BERT_HIDDEN, 1e-12).expect("random weights");
    let x = activations([BERT_TOKENS, BERT_HIDDEN]);
    group.throughput(Throughput::Elements((BERT_TOKENS * BERT_HIDDEN) as u64));
    group.bench_function(format!("layer_norm_{BERT_TOKENS}x{BERT_HIDDEN}"), |bench| {
        bench.iter(|| layer_norm.forward(x.clone()).into_data())
    });

    let rms_norm =
        RmsNorm::<B>::load(&weights().pp("rms"), SMOL_HIDDEN, 1e-5).expect("random weights");
    let x = activations([SMOL_PROMPT, SMOL_HIDDEN]);
    group.throughput(Throughput::Elements((SMOL_PROMPT * SMOL_HIDDEN) as u64));
    group.bench_function(format!("rms_norm_{SMOL_PROMPT}x{SMOL_HIDDEN}"), |bench| {
        bench.iter(|| rms_norm.forward(x.clone()).into_data())
    });
    group.finish();
}

fn elementwise(c: &mut Criterion) {
    let mut group = c.benchmark_group("elementwise");
    let rows = BERT_BATCH * BERT_HEADS;
    let scores = activations([rows, BERT_SEQ, BERT_SEQ]);
    group.throughput(Throughput::Elements((rows * BERT_SEQ * BERT_SEQ) as u64));
    group.bench_function(format!("softmax_{rows}x{BERT_SEQ}x{BERT_SEQ}"), |bench| {
        bench.iter(|| softmax(scores.clone(), 2).into_data())
    });

    let x = activations([BERT_TOKENS, BERT_FFN]);
    group.throughput(Throughput::Elements((BERT_TOKENS * BERT_FFN) as u64));
    group.bench_function(format!("gelu_{BERT_TOKENS}x{BERT_FFN}"), |bench| {
        bench.iter(|| Activation::Gelu.forward(x.clone()).into_data())
    });
    group.finish();
}

fn gated_mlp(c: &mut Criterion) {
    let mut group = c.benchmark_group("gated_mlp_smollm2");
    let mlp = GatedMlp::<B>::load(
        &weights().pp("mlp"),
        SMOL_HIDDEN,
        SMOL_FFN,
        false,
        Activation::Silu,
    )
    .expect("random weights");
    for tokens in [1, SMOL_PROMPT] {
        let x = activations([1, tokens, SMOL_HIDDEN]);
        group.throughput(Throughput::Elements(tokens as u64));
        group.bench_function(format!("t{tokens}"), |bench| {
            bench.iter(|| mlp.forward(x.clone()).into_data())
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    targets = matmul, attention, norm, elementwise, gated_mlp
}
criterion_main!(benches);
