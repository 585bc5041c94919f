//! The load test: `CLIENTS` concurrent clients (64) × `REQUESTS` requests (20) of one sentence each
//! against MiniLM embeddings over loopback, with batching off and on. No request may be lost or
//! fail, and every answer must equal that sentence's single-request answer (the library embedding
//! it alone; ≤ 1e-5 apart, the padding of a batch changes only rounding). It prints throughput and
//! latency percentiles, and ONNX Runtime f32 embedding the same sentences in-process in batches of
//! 64 when the peer is installed (`cargo xtask fetch-peers`); timings are reported, never asserted.
//!
//! Sizes: `IPFS_ACCELERATE_LOAD_CLIENTS`, `IPFS_ACCELERATE_LOAD_REQUESTS`. For numbers worth
//! quoting, run it in release: `cargo test --release -p ipfs-accelerate-serve --test load -- --nocapture`.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{max_abs_diff, options, Running};
use ipfs_accelerate::{BackendKind, Pipeline, Task};
use ipfs_accelerate_bench::peers;
use ipfs_accelerate_conformance::shared_dir;
use serde_json::{json, Value};

fn env_usize(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// What one load run measured.
struct Run {
    answers: Vec<Vec<f32>>,
    latencies: Vec<Duration>,
    wall: Duration,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Every client sends its sentences one after another; all clients at once.
async fn load(base: &str, model: &str, sentences: Arc<Vec<String>>, clients: usize) -> Run {
    let per_client = sentences.len() / clients;
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(clients)
        .build()
        .unwrap();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for c in 0..clients {
        let (http, url, model, sentences) = (
            http.clone(),
            format!("{base}/v1/embeddings"),
            model.to_string(),
            sentences.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::new();
            for i in c * per_client..(c + 1) * per_client {
                let t = Instant::now();
                let r = http
                    .post(&url)
                    .json(&json!({ "model": model, "input": sentences[i] }))
                    .send()
                    .await
                    .unwrap_or_else(|e| panic!("request {i} lost: {e}"));
                assert_eq!(r.status().as_u16(), 200, "request {i} failed");
                let v: Value = r.json().await.unwrap();
                let vector: Vec<f32> = v["data"][0]["embedding"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_f64().unwrap() as f32)
                    .collect();
                out.push((i, vector, t.elapsed()));
            }
            out
        }));
    }
    let mut answers = vec![Vec::new(); sentences.len()];
    let mut latencies = Vec::new();
    for t in tasks {
        for (i, v, took) in t.await.unwrap() {
            answers[i] = v;
            latencies.push(took);
        }
    }
    let wall = started.elapsed();
    latencies.sort();
    Run {
        answers,
        latencies,
        wall,
    }
}

/// ONNX Runtime f32 embedding `sentences` in batches of 64 in-process (tools/peer_bench.py), when
/// the peer's Python environment is installed (`peers::python`): the median, fastest and slowest
/// seconds per pass over all sentences.
fn ort_peer(model_dir: &std::path::Path, sentences: &[String]) -> Result<(f64, f64, f64), String> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = peers::python();
    let file = tempfile::NamedTempFile::new().map_err(|e| e.to_string())?;
    std::fs::write(file.path(), sentences.join("\n")).map_err(|e| e.to_string())?;
    let out = std::process::Command::new(&python)
        .arg(root.join("tools/peer_bench.py"))
        .args([
            "--engine",
            "onnxruntime",
            "--family",
            "bert",
            "--batch",
            "64",
        ])
        .args([
            "--seq",
            "256",
            "--threads",
            "2",
            "--warmup",
            "1",
            "--iters",
            "5",
        ])
        .arg("--config")
        .arg(model_dir.join("config.json"))
        .arg("--model-dir")
        .arg(model_dir)
        .arg("--sentences")
        .arg(file.path())
        .arg("--cache-dir")
        .arg(peers::peers_dir().join("onnx"))
        .output()
        .map_err(|e| e.to_string())?;
    let line = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(line.lines().last().unwrap_or_default())
        .map_err(|e| format!("{e}: {line} {}", String::from_utf8_lossy(&out.stderr)))?;
    if v["status"] != "ok" {
        return Err(v["reason"].to_string());
    }
    let mut t: Vec<f64> = v["timings_ms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap() / 1e3)
        .collect();
    t.sort_by(f64::total_cmp);
    Ok((t[t.len() / 2], t[0], t[t.len() - 1]))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_lose_nothing_and_get_their_single_request_answers() {
    let clients = env_usize("IPFS_ACCELERATE_LOAD_CLIENTS", 64);
    let requests = env_usize("IPFS_ACCELERATE_LOAD_REQUESTS", 20);
    let minilm = shared_dir("load").map(|s| s.join("models/all-MiniLM-L6-v2"));
    let source = minilm
        .as_ref()
        .map(|d| d.to_string_lossy().into_owned())
        .unwrap_or_else(|| ipfs_accelerate::EMBEDDED_SPEC.to_string());
    let base = common::sentences("load");
    let sentences: Arc<Vec<String>> = Arc::new(
        (0..clients * requests)
            .map(|i| format!("{} (request {i})", base[i % base.len()]))
            .collect(),
    );

    // The single-request answers, and the library's time per sentence alone.
    let pipe = Pipeline::builder(&source)
        .task(Task::Embed)
        .backends([BackendKind::Cpu])
        .env_override(false)
        .offline(true)
        .build()
        .unwrap();
    let mut expected = Vec::with_capacity(sentences.len());
    for s in sentences.iter() {
        expected.push(pipe.embed(&[s.as_str()], true).unwrap().value.remove(0));
    }
    // The library in-process in batches of 64, as the ONNX Runtime peer runs: what the server's
    // batched forwards could reach without HTTP, JSON and the clients sharing the cores.
    let texts: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let mut passes: Vec<f64> = (0..3)
        .map(|_| {
            let start = Instant::now();
            for chunk in texts.chunks(64) {
                pipe.embed(chunk, true).unwrap();
            }
            start.elapsed().as_secs_f64()
        })
        .collect();
    passes.sort_by(f64::total_cmp);
    drop(pipe);

    let mut rows = Vec::new();
    let mut single = Duration::ZERO;
    let mut max_wait = Duration::ZERO;
    for batching in [false, true] {
        let mut opts = options(&[&format!("m={source}")]);
        opts.batching.enabled = batching;
        opts.batching.max_wait =
            Duration::from_millis(env_usize("IPFS_ACCELERATE_LOAD_MAX_WAIT_MS", 5) as u64);
        max_wait = opts.batching.max_wait;
        let server = Running::start(opts).await;
        if batching {
            // One client alone: the latency a request sees without load (with the batching wait).
            let alone = load(&server.base, "m", Arc::new(sentences[..20].to_vec()), 1).await;
            single = percentile(&alone.latencies, 0.5);
        }
        // The batch-size histogram before the load (the lone client's batches are not its).
        let http = reqwest::Client::new();
        let before = common::get_text(&http, &server.url("/metrics")).await;
        let run = load(&server.base, "m", sentences.clone(), clients).await;
        let worst = max_abs_diff(&run.answers, &expected);
        assert!(
            worst <= 1e-5,
            "batching {batching}: an answer differs from its single-request answer by {worst}"
        );
        assert_eq!(run.latencies.len(), clients * requests);
        let after = common::get_text(&http, &server.url("/metrics")).await;
        let read = |metrics: &str, name: &str| -> f64 {
            metrics
                .lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit(' ').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(0.0)
        };
        let grew = |name: &str| read(&after, name) - read(&before, name);
        let mean_batch =
            grew("ipfs_accelerate_batch_size_sum") / grew("ipfs_accelerate_batch_size_count");
        rows.push((batching, run, mean_batch));
        server.shutdown().await;
    }

    let throughput = |r: &Run| r.latencies.len() as f64 / r.wall.as_secs_f64();
    println!(
        "\nload: {clients} clients x {requests} requests of 1 sentence, model {source}, 2 tokio workers"
    );
    println!("| batching | requests/s | p50 ms | p99 ms | wall s | mean texts per forward |");
    println!("|---|---|---|---|---|---|");
    for (batching, r, mean_batch) in &rows {
        let label = if *batching {
            format!("on (max 64, wait {} ms)", max_wait.as_millis())
        } else {
            "off".to_string()
        };
        println!(
            "| {label} | {:.1} | {:.1} | {:.1} | {:.2} | {mean_batch:.1} |",
            throughput(r),
            ms(percentile(&r.latencies, 0.5)),
            ms(percentile(&r.latencies, 0.99)),
            r.wall.as_secs_f64()
        );
    }
    let (off, on) = (&rows[0].1, &rows[1].1);
    println!(
        "batching on / off throughput: {:.2}x; p99 {:.1} ms; a request alone {:.1} ms, so 2 x alone + max wait {:.0} ms = {:.1} ms",
        throughput(on) / throughput(off),
        ms(percentile(&on.latencies, 0.99)),
        ms(single),
        ms(max_wait),
        2.0 * ms(single) + ms(max_wait)
    );
    println!(
        "the library in-process, batches of 64: {:.1} sentences/s (median pass {:.3} s, range {:.3}-{:.3})",
        sentences.len() as f64 / passes[1],
        passes[1],
        passes[0],
        passes[2]
    );
    match minilm.as_deref().map(|d| ort_peer(d, &sentences)) {
        Some(Ok((median, lo, hi))) => println!(
            "ONNX Runtime f32 in-process, batches of 64, 2 threads: {:.1} sentences/s (median pass {median:.3} s, \
             range {lo:.3}-{hi:.3}); served with batching / ORT = {:.2}x",
            sentences.len() as f64 / median,
            throughput(on) / (sentences.len() as f64 / median)
        ),
        Some(Err(reason)) => println!("ONNX Runtime peer unavailable: {reason}"),
        None => println!("ONNX Runtime peer skipped: ../shared is missing"),
    }
}

/// Generation under load: `IPFS_ACCELERATE_GEN_CLIENTS` (8) concurrent clients ×
/// `IPFS_ACCELERATE_GEN_REQUESTS` (4) greedy completions of 8 to `IPFS_ACCELERATE_GEN_TOKENS`
/// (64) tokens on SmolLM2 (the shared GGUF), prompts of different lengths, served with batching
/// off, with static batches and with continuous batching. Nothing may be lost, and every
/// completion must equal the library's text for its prompt alone: on the cpu a row decodes in a
/// batch bit for bit as alone (`ipfs-accelerate-llama`'s `left_padded_rows_decode_bit_for_bit_as_alone`
/// and `rows_join_and_leave_a_running_batch`), as long as a batch's prefill stays under the
/// ggml kernels' panel threshold (256 rows). It prints generated tokens per second and latency
/// percentiles of each mode (reported, never asserted).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_generations_lose_nothing_and_match_alone() {
    let Some(gguf) = shared_dir("generation_load").map(|s| {
        s.join("models/SmolLM2-135M-Instruct-GGUF/SmolLM2-135M-Instruct.Q4_1.gguf")
            .to_string_lossy()
            .into_owned()
    }) else {
        return;
    };
    let clients = env_usize("IPFS_ACCELERATE_GEN_CLIENTS", 8);
    let requests = env_usize("IPFS_ACCELERATE_GEN_REQUESTS", 4);
    let tokens = env_usize("IPFS_ACCELERATE_GEN_TOKENS", 64).max(8);
    // Each request's budget: a client's requests cycle through these.
    let budgets = [8, tokens, tokens / 4, tokens / 2];
    let ask = move |c: usize, r: usize| ((c * requests + r) % 8, budgets[(c + r) % 4].max(1));
    let prompts = [
        "The capital of France is",
        "Water boils at",
        "Once upon a time, in a small village at the edge of a great forest, there lived",
        "My favourite colour is",
        "Here is a short list of fruits:",
        "The quick brown fox",
        "In 1969, the first people to walk on the Moon were",
        "Rust is a programming language that",
    ];
    let generator = ipfs_accelerate::text::TextGenerator::load(
        &gguf,
        &ipfs_accelerate::LoadOptions {
            backends: Some(vec![BackendKind::Cpu]),
            offline: true,
            ..Default::default()
        },
    )
    .unwrap();
    let mut alone = std::collections::HashMap::new();
    for c in 0..clients {
        for r in 0..requests {
            let (i, n) = ask(c, r);
            alone.entry((i, n)).or_insert_with(|| {
                let options = ipfs_accelerate::text::GenerateOptions {
                    max_new_tokens: n,
                    ..Default::default()
                };
                generator
                    .generate(prompts[i], &options, |_| {})
                    .unwrap()
                    .value
                    .text
            });
        }
    }
    drop(generator);

    let mut rows = Vec::new();
    for (label, enabled, continuous) in [
        ("off", false, false),
        ("static batches", true, false),
        ("continuous", true, true),
    ] {
        let mut opts = common::options(&[&format!("smol={gguf}")]);
        opts.batching.enabled = enabled;
        opts.batching.continuous = continuous;
        let server = Running::start(opts).await;
        let http = reqwest::Client::new();
        let started = Instant::now();
        let mut tasks = Vec::new();
        for c in 0..clients {
            let (http, url) = (http.clone(), server.url("/v1/completions"));
            tasks.push(tokio::spawn(async move {
                let mut out = Vec::new();
                for r in 0..requests {
                    let (i, n) = ask(c, r);
                    let t = Instant::now();
                    let resp = http
                        .post(&url)
                        .json(&json!({ "model": "smol", "prompt": prompts[i],
                                       "max_tokens": n, "temperature": 0 }))
                        .send()
                        .await
                        .unwrap_or_else(|e| panic!("request {c}/{r} lost: {e}"));
                    assert_eq!(resp.status().as_u16(), 200, "request {c}/{r} failed");
                    let v: Value = resp.json().await.unwrap();
                    let text = v["choices"][0]["text"].as_str().unwrap().to_string();
                    let got = v["usage"]["completion_tokens"].as_u64().unwrap() as usize;
                    out.push((i, n, text, got, t.elapsed()));
                }
                out
            }));
        }
        let mut latencies = Vec::new();
        let (mut generated, mut same) = (0, 0);
        for t in tasks {
            for (i, n, text, got, took) in t.await.unwrap() {
                assert!(
                    got > 0 && got <= n,
                    "{label}: {got} tokens for a budget of {n}"
                );
                same += usize::from(text == alone[&(i, n)]);
                generated += got;
                latencies.push(took);
            }
        }
        let wall = started.elapsed();
        latencies.sort();
        let total = clients * requests;
        assert_eq!(latencies.len(), total);
        assert_eq!(
            same, total,
            "{label}: only {same} of {total} completions equal their text alone"
        );
        rows.push((
            label,
            generated as f64 / wall.as_secs_f64(),
            latencies,
            wall,
            same,
        ));
        server.shutdown().await;
    }
    println!(
        "\ngeneration load: {clients} clients x {requests} greedy completions of {budgets:?} tokens, \
         SmolLM2-135M Q4_1 on cpu, 2 tokio workers"
    );
    println!("| batching | generated tokens/s | p50 ms | p99 ms | wall s | equal to alone |");
    println!("|---|---|---|---|---|---|");
    for (label, rate, latencies, wall, same) in &rows {
        println!(
            "| {label} | {rate:.1} | {:.0} | {:.0} | {:.2} | {same}/{} |",
            ms(percentile(latencies, 0.5)),
            ms(percentile(latencies, 0.99)),
            wall.as_secs_f64(),
            latencies.len()
        );
    }
}
