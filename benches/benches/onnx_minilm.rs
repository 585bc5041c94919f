//! all-MiniLM-L6-v2, batch 8 × seq 128, in one run: the native CPU backend (burn-flex) against
//! ONNX Runtime's CPU and OpenVINO providers on the same model exported to ONNX.
//!
//! ```text
//! python3 xtask/scripts/export_onnx.py ../shared/models/all-MiniLM-L6-v2 /tmp/minilm-onnx
//! cargo xtask fetch-ort --openvino
//! IPFS_ACCELERATE_MINILM_ONNX=/tmp/minilm-onnx cargo bench -p ipfs-accelerate-benches --bench onnx_minilm
//! ```
//! Without the export or the runtime the ONNX rows are skipped with the reason.

use ipfs_accelerate_core::JsonConfig;
use std::path::PathBuf;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use ipfs_accelerate_backend_cpu::CpuBurn;
use ipfs_accelerate_backend_onnx::{OnnxSession, SessionOptions};
use ipfs_accelerate_benches::bert_inputs;
use ipfs_accelerate_bert::{BertConfig, BertRunner};
use ipfs_accelerate_core::{BackendKind, ExecutionProvider, HostTensor, TensorMap};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn minilm_dir() -> PathBuf {
    std::env::var_os("IPFS_ACCELERATE_MINILM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/models/all-MiniLM-L6-v2")
        })
}

fn onnx_minilm(c: &mut Criterion) {
    let (batch, seq) = (8usize, 128usize);
    let inputs = bert_inputs(batch, seq, 30522);
    let mut group = c.benchmark_group("minilm_b8xs128");
    group.sample_size(10);
    group.throughput(Throughput::Elements(batch as u64));

    let dir = minilm_dir();
    match BertConfig::from_file(&dir.join("config.json")).and_then(|config| {
        let weights = ipfs_accelerate_io::open_weights(&dir)?;
        BertRunner::<CpuBurn>::load(weights, &config, &Default::default(), BackendKind::Cpu)
    }) {
        Ok(runner) => {
            group.bench_function(BenchmarkId::new("native", "cpu"), |b| {
                b.iter(|| {
                    runner
                        .encode(&inputs)
                        .expect("forward")
                        .last_hidden_state
                        .into_data()
                })
            });
        }
        Err(e) => eprintln!("skipped native cpu: {e}"),
    }

    let onnx = std::env::var_os("IPFS_ACCELERATE_MINILM_ONNX")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/tmp/minilm-onnx"));
    let shape = vec![batch, seq];
    let mut map = TensorMap::new();
    for (name, v) in [
        ("input_ids", &inputs.input_ids),
        ("attention_mask", &inputs.attention_mask),
        ("token_type_ids", &inputs.token_type_ids),
    ] {
        map.insert(
            name.into(),
            HostTensor::from_i64(shape.clone(), v).expect("shape"),
        );
    }
    for provider in [ExecutionProvider::Cpu, ExecutionProvider::OpenVino] {
        let kind = BackendKind::Onnx(provider);
        match OnnxSession::load(
            &onnx.join("model.onnx"),
            provider,
            &SessionOptions::default(),
        ) {
            Ok(session) => {
                group.bench_function(BenchmarkId::new("onnx", kind.to_string()), |b| {
                    b.iter(|| session.run(&map).expect("run"))
                });
            }
            Err(e) => eprintln!("skipped {kind}: {e}"),
        }
    }
    group.finish();
}

criterion_group!(benches, onnx_minilm);
criterion_main!(benches);
