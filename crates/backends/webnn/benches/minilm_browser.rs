//! all-MiniLM-L6-v2, batch 1 × seq 128, in one run: WebNN (CPU context) and WebAssembly in
//! headless Chromium (onnxruntime-web) against the native CPU backend (burn-flex). The browser
//! rows are end to end (inputs over the DevTools protocol, `session.run`, outputs back); the
//! time inside the page is printed after them.
//!
//! ```text
//! python3 xtask/scripts/export_onnx.py ../shared/models/all-MiniLM-L6-v2 /tmp/minilm-onnx
//! cargo xtask fetch-browser
//! cargo bench -p ipfs-accelerate-backend-webnn --bench minilm_browser
//! ```
//! (`IPFS_ACCELERATE_MINILM_DIR` / `IPFS_ACCELERATE_MINILM_ONNX` name other folders.) Without the
//! export or the browser the browser rows are skipped with the reason.

use std::path::PathBuf;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use ipfs_accelerate_backend_cpu::CpuBurn;
use ipfs_accelerate_backend_webnn::{Browser, BrowserGraph, BrowserOptions, GraphOptions};
use ipfs_accelerate_bert::{BertConfig, BertRunner};
use ipfs_accelerate_core::{
    BackendKind, BrowserProvider, HostTensor, JsonConfig, ModelRunner, TensorMap, WebNnDevice,
};

fn folder(env: &str, default: PathBuf) -> PathBuf {
    std::env::var_os(env).map(PathBuf::from).unwrap_or(default)
}

fn minilm_browser(c: &mut Criterion) {
    let (batch, seq) = (1usize, 128usize);
    let ids: Vec<i64> = (0..batch * seq)
        .map(|i| {
            if i == 0 {
                101
            } else {
                (i as i64 * 104_729 + 2000) % 28_000 + 1000
            }
        })
        .collect();
    let mut inputs = TensorMap::new();
    for (name, values) in [
        ("input_ids", ids.clone()),
        ("attention_mask", vec![1; batch * seq]),
        ("token_type_ids", vec![0; batch * seq]),
    ] {
        inputs.insert(
            name.into(),
            HostTensor::from_i64(vec![batch, seq], &values).unwrap(),
        );
    }
    let mut group = c.benchmark_group("minilm_b1xs128");
    group.sample_size(20);

    let dir = folder(
        "IPFS_ACCELERATE_MINILM_DIR",
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../../../shared/models/all-MiniLM-L6-v2"),
    );
    let native = BertConfig::from_file(&dir.join("config.json")).and_then(|config| {
        let weights = ipfs_accelerate_io::open_weights(&dir)?;
        BertRunner::<CpuBurn>::load(weights, &config, &Default::default(), BackendKind::Cpu)
    });
    match native {
        Ok(runner) => {
            group.bench_function(BenchmarkId::new("native", "cpu"), |b| {
                b.iter(|| runner.run(&inputs).unwrap())
            });
        }
        Err(e) => eprintln!("skipped native cpu: {e}"),
    }

    let onnx = folder(
        "IPFS_ACCELERATE_MINILM_ONNX",
        PathBuf::from("/tmp/minilm-onnx"),
    );
    let browser = match Browser::launch(&BrowserOptions::default()) {
        Ok(b) => Arc::new(b),
        Err(e) => {
            eprintln!("skipped the browser rows: {e}");
            return group.finish();
        }
    };
    let mut in_page = Vec::new();
    for provider in [
        BrowserProvider::WebNn(WebNnDevice::Cpu),
        BrowserProvider::Wasm,
    ] {
        let options = GraphOptions {
            require_full_placement: true,
        };
        match BrowserGraph::load(
            Arc::clone(&browser),
            &onnx.join("model.onnx"),
            provider,
            options,
        ) {
            Ok(graph) => {
                let mut page_ms = Vec::new();
                group.bench_function(BenchmarkId::new("browser", provider.name()), |b| {
                    b.iter(|| {
                        let out = graph.run(&inputs).unwrap();
                        page_ms.extend(graph.last_run_ms());
                        out
                    })
                });
                page_ms.sort_by(f64::total_cmp);
                let median = page_ms.get(page_ms.len() / 2).copied().unwrap_or(f64::NAN);
                in_page.push(format!(
                    "{}: median session.run {median:.2} ms in the page, placement {:?}",
                    provider.name(),
                    graph.placement()
                ));
            }
            Err(e) => eprintln!("skipped {}: {e}", provider.name()),
        }
    }
    group.finish();
    println!("{} ({})", browser.version(), browser.executable().display());
    for line in in_page {
        println!("{line}");
    }
}

criterion_group!(benches, minilm_browser);
criterion_main!(benches);
