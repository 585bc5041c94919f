//! The acceptance run of the benchmark runner: all-MiniLM-L6-v2's configuration (random weights)
//! on the CPU over batch 1, 8 × sequence 32, 128, plus a backend this build does not have, written
//! to DuckDB and read back. Every number checked here was measured by this run.

use ipfs_accelerate::BackendKind;
use ipfs_accelerate_bench::store::Store;
use ipfs_accelerate_bench::{run_benchmark, BenchSpec, Status};
use ipfs_accelerate_benchdb::find_for_test;

#[test]
fn minilm_grid_on_cpu_is_measured_stored_and_read_back() {
    let Some(lib) = find_for_test("minilm_grid_on_cpu_is_measured_stored_and_read_back")
        .expect("DuckDB library required (IPFS_ACCELERATE_REQUIRE_DUCKDB=1)")
    else {
        return;
    };
    // A backend that is never compiled into the test build: recorded, not imitated.
    let absent = BackendKind::Metal;
    let iters = 3;
    let spec = BenchSpec {
        model: "minilm-l6".into(),
        backends: vec![BackendKind::Cpu, absent],
        batches: vec![1, 8],
        sizes: vec![32, 128],
        warmup: 1,
        iters,
        ..Default::default()
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bench.duckdb");
    let store = Store::open_with(&lib, &path).unwrap();
    let mut saved_run = false;
    let (run, measured) = run_benchmark(&spec, |run, m| {
        if !saved_run {
            store.save_run(run).unwrap();
            saved_run = true;
        }
        store.save_measurement(m).unwrap();
        Ok(())
    })
    .unwrap();
    drop(store);

    let store = Store::open_with(&lib, &path).unwrap();
    let (runs, stored) = store.load_all().unwrap();
    assert_eq!(runs, vec![run.clone()]);
    assert_eq!(
        stored.len(),
        8,
        "2 backends × 2 batches × 2 sequence lengths"
    );
    assert_eq!(stored, measured, "the database holds what was measured");

    let cpu: Vec<_> = stored.iter().filter(|m| m.backend == "cpu").collect();
    assert_eq!(cpu.len(), 4);
    for m in &cpu {
        assert_eq!(m.status, Status::Ok, "{:?}", m.reason);
        assert_eq!((m.family.as_str(), m.model.as_str()), ("bert", "minilm-l6"));
        assert_eq!(m.iters_done, iters as u32);
        assert_eq!(m.timings_ms.len(), iters);
        assert!(m.timings_ms.iter().all(|&t| t > 0.0 && t.is_finite()));
        let l = m.latency.expect("latency of a measured point");
        assert!(l.min_ms > 0.0 && l.min_ms <= l.p50_ms && l.p50_ms <= l.p90_ms);
        assert!(l.p90_ms <= l.p99_ms && l.p99_ms <= l.max_ms);
        let mean = m.timings_ms.iter().sum::<f64>() / iters as f64;
        assert!((l.mean_ms - mean).abs() < 1e-9 * mean.max(1.0));
        assert!(m.load_ms.unwrap() > 0.0);
        let tokens = (m.batch * m.seq) as f64;
        assert!((m.tokens_per_s.unwrap() - tokens / (l.mean_ms / 1e3)).abs() < 1e-6 * tokens);
        assert!(m.flops.unwrap() > 0.0 && m.achieved_flops_per_s.unwrap() > 0.0);
        assert!(m.host_rss_peak_bytes.unwrap() > 0);
    }
    // The longer sequence costs more FLOPs at the same batch.
    let flops = |b: u32, s: u32| {
        cpu.iter()
            .find(|m| m.batch == b && m.seq == s)
            .and_then(|m| m.flops)
            .unwrap()
    };
    assert!(flops(8, 128) > flops(8, 32) && flops(8, 32) > flops(1, 32));

    let missing: Vec<_> = stored.iter().filter(|m| m.backend == "metal").collect();
    assert_eq!(missing.len(), 4);
    for m in missing {
        assert_eq!(m.status, Status::Unavailable);
        assert!(
            m.reason.as_deref().unwrap().contains("metal"),
            "{:?}",
            m.reason
        );
        assert!(m.latency.is_none() && m.timings_ms.is_empty() && m.flops.is_none());
    }
}

#[test]
fn bad_specs_are_errors_not_panics() {
    let base = BenchSpec::default();
    for spec in [
        BenchSpec {
            iters: 0,
            ..base.clone()
        },
        BenchSpec {
            batches: vec![0],
            ..base.clone()
        },
        BenchSpec {
            model: "no-such-model".into(),
            ..base.clone()
        },
        BenchSpec {
            backends: Vec::new(),
            ..base.clone()
        },
        BenchSpec {
            family: Some("vit".into()),
            ..base.clone()
        },
    ] {
        assert!(run_benchmark(&spec, |_, _| Ok(())).is_err(), "{spec:?}");
    }
}

/// Generation points of the llama fixture (random weights of a tiny config) and of the SmolLM2
/// GGUF file: two rows each (prefill, decode), TTFT and decode tokens/s measured, the GGUF's
/// rows labelled with its block type; stored and read back with the new columns.
#[test]
fn generation_points_store_ttft_and_decode_rate() {
    let Some(shared) = ipfs_accelerate_conformance::shared_dir("generation_points_store_ttft")
    else {
        return;
    };
    let gguf = shared.join("models/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf");
    let mut models = vec![shared.join("fixtures/llama/causal_lm")];
    if gguf.is_file() {
        models.push(gguf);
    }
    for model in models {
        let spec = BenchSpec {
            model: model.display().to_string(),
            new_tokens: Some(4),
            prompts: vec![8],
            warmup: 0,
            iters: 2,
            ..Default::default()
        };
        let (_, rows) = run_benchmark(&spec, |_, _| Ok(())).unwrap();
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(rows[0].shape_kind, "prefill");
        assert_eq!(rows[1].shape_kind, "decode");
        for m in &rows {
            assert_eq!(m.status, Status::Ok, "{}: {:?}", model.display(), m.reason);
            assert_eq!((m.seq, m.new_tokens, m.iters_done), (8, Some(4), 2));
            assert!(m.ttft_ms.is_some_and(|t| t > 0.0));
            assert!(m.decode_tokens_per_s.is_some_and(|r| r > 0.0));
            assert!(m.host_rss_peak_bytes.is_some_and(|b| b > 0));
        }
        if model.extension().is_some_and(|e| e == "gguf") {
            assert_eq!(rows[0].dtype, "Q4_1");
            assert_eq!(rows[0].family, "llama");
        }
    }
    // A too-long prompt and a forward-only family are refused or recorded failed.
    let llama = shared
        .join("fixtures/llama/causal_lm")
        .display()
        .to_string();
    // bf16 linear weights on the cpu: measured like f32.
    let spec = BenchSpec {
        model: llama.clone(),
        new_tokens: Some(3),
        prompts: vec![4],
        dtypes: vec!["bf16".into()],
        warmup: 0,
        iters: 1,
        ..Default::default()
    };
    let (_, rows) = run_benchmark(&spec, |_, _| Ok(())).unwrap();
    assert!(
        rows.iter()
            .all(|m| m.status == Status::Ok && m.dtype == "bf16"),
        "{rows:?}"
    );
    // A batch of 2 decodes both rows together (rates summed over the rows); a ggml dtype names
    // random weights, so on a checkpoint it is a failed row with the reason.
    let spec = BenchSpec {
        model: llama.clone(),
        new_tokens: Some(4),
        prompts: vec![4],
        batches: vec![2],
        dtypes: vec!["f32".into(), "q4_k".into()],
        warmup: 0,
        iters: 1,
        ..Default::default()
    };
    let (_, rows) = run_benchmark(&spec, |_, _| Ok(())).unwrap();
    let (f32_rows, q4k_rows): (Vec<_>, Vec<_>) = rows.iter().partition(|m| m.dtype == "f32");
    assert!(
        f32_rows
            .iter()
            .all(|m| m.status == Status::Ok && m.batch == 2 && m.decode_tokens_per_s.is_some()),
        "{f32_rows:?}"
    );
    assert!(
        q4k_rows.iter().all(|m| m.status == Status::Failed
            && m.reason.as_deref().unwrap_or("").contains("random weights")),
        "{q4k_rows:?}"
    );
    let spec = BenchSpec {
        model: llama,
        new_tokens: Some(4),
        prompts: vec![1_000_000],
        iters: 1,
        ..Default::default()
    };
    let (_, rows) = run_benchmark(&spec, |_, _| Ok(())).unwrap();
    assert!(rows
        .iter()
        .all(|m| m.status == Status::Failed
            && m.reason.as_deref().unwrap_or("").contains("positions")));
    let spec = BenchSpec {
        model: "minilm-l6".into(),
        new_tokens: Some(4),
        ..Default::default()
    };
    let e = run_benchmark(&spec, |_, _| Ok(())).unwrap_err().to_string();
    assert!(e.contains("not `bert`"), "{e}");
}

/// The encoder-decoders and LLaVA generate through `ModelRunner::generate_ids` on inputs made
/// from their configs: T5 (encoder tokens), Whisper (log-mel frames: the config's 30 s),
/// LLaVA and LLaVA-NeXT (text around one image).
#[test]
fn encoder_decoders_and_llava_generation_is_timed() {
    let Some(shared) = ipfs_accelerate_conformance::shared_dir("encoder_decoders_generation")
    else {
        return;
    };
    for (fixture, prompts) in [
        ("t5/t5", vec![12]),
        ("whisper/base", vec![]),
        ("llava/base", vec![6]),
        ("llava_next/base", vec![6]),
    ] {
        let spec = BenchSpec {
            model: shared.join("fixtures").join(fixture).display().to_string(),
            new_tokens: Some(3),
            prompts,
            warmup: 0,
            iters: 1,
            ..Default::default()
        };
        let (_, rows) = run_benchmark(&spec, |_, _| Ok(())).unwrap();
        assert_eq!(rows.len(), 2, "{fixture}: {rows:?}");
        for m in &rows {
            assert_eq!(m.status, Status::Ok, "{fixture}: {:?}", m.reason);
            assert_eq!(m.new_tokens, Some(3));
            assert!(m.ttft_ms.is_some() && m.decode_tokens_per_s.is_some());
        }
    }
}
