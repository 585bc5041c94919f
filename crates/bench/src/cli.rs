//! The `bench`, `report` and `compare-backends` commands, shared by `cargo xtask` and the
//! `ipfs-accelerate` CLI (both only parse these arguments and call [`bench()`], [`report()`] or
//! [`compare()`]).

use std::path::PathBuf;

use ipfs_accelerate::BackendKind;

use crate::record::{Measurement, RunInfo, Status};
use crate::store::Store;
use crate::{report as html, run_benchmark, BenchError, BenchSpec};

/// The default database file.
pub const DEFAULT_DB: &str = "bench.duckdb";

/// Arguments of `bench` (the backends come separately: the CLI's global `--backend`, or
/// xtask's own).
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// The family (bert, vit, llama, ...); optional when the model's `model_type` says it.
    #[arg(long)]
    pub family: Option<String>,
    /// A named configuration with random weights (minilm-l6, bert-base, vit-base, clip-vit-b32,
    /// whisper-tiny, whisper-base, wav2vec2-base, detr-resnet50, t5-small, t5-base, llama-135m,
    /// llama-1b, qwen2-0.5b), a checkpoint folder, a config.json file (random weights), a llama.cpp `.gguf`
    /// file (generation), or a hub model id (real weights, downloaded with a progress bar unless
    /// cached).
    #[arg(long, default_value = "minilm-l6")]
    pub config: String,
    /// Batch sizes, comma separated.
    #[arg(long, default_value = "1", value_delimiter = ',')]
    pub batch: Vec<usize>,
    /// Sizes, comma separated: tokens (text), image side in pixels (vit, detr), mel frames
    /// (whisper) or samples (wav2vec2). Default: the family's usual size.
    #[arg(long, value_delimiter = ',')]
    pub seq: Vec<usize>,
    /// Precisions, comma separated: f32, f16, bf16 (compute), int8, int4 (f32 compute, linear
    /// weights kept quantized as `--quantize` does; on cuda as ggml Q8_0 / Q4_0 blocks), or for
    /// generation on random weights a ggml block format (q4_k, q6_k, q8_0, ...: weights stored
    /// as a GGUF file of that type stores them, f32 compute); native backends. With several, each round
    /// measures each in turn. A GPU computes in one precision per process: give f16 / bf16 on a
    /// GPU in a run of their own.
    #[arg(long, default_value = "f32", value_delimiter = ',')]
    pub dtype: Vec<String>,
    /// Kernel fusion on the CubeCL backends (cuda, wgpu), comma separated: `on`, `off` or
    /// `on,off` (both, the unfused points recorded as `<backend>/unfused`). Default: on, or what
    /// `IPFS_ACCELERATE_FUSION` says.
    #[arg(long, value_delimiter = ',', value_parser = ipfs_accelerate::parse_switch)]
    pub fusion: Vec<bool>,
    /// Benchmark generation (llama, qwen2, GGUF files): this many new tokens per iteration after
    /// the prompt, greedy with the KV cache; stores time to first token (`prefill` rows) and
    /// decode tokens/s (`decode` rows). A `.gguf` model generates 128 unless given.
    #[arg(long)]
    pub new: Option<usize>,
    /// Prompt lengths of a generation benchmark in tokens, comma separated (default 128).
    #[arg(long, value_delimiter = ',')]
    pub prompt: Vec<usize>,
    /// Generation of decoder LMs samples at this temperature (seeded by `--seed`) instead of
    /// decoding greedily.
    #[arg(long)]
    pub temperature: Option<f32>,
    /// With `--temperature`: keep only this many most likely tokens.
    #[arg(long, requires = "temperature")]
    pub top_k: Option<usize>,
    /// With `--temperature`: nucleus sampling over this much probability mass.
    #[arg(long, requires = "temperature")]
    pub top_p: Option<f32>,
    /// Generation of decoder LMs with HF's repetition penalty (1.0 = off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// The sampler's seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Print each timed generation's tokens (row 0) on stderr.
    #[arg(long)]
    pub show_tokens: bool,
    /// Timed iterations per point (per round).
    #[arg(long, default_value_t = 10)]
    pub iters: usize,
    /// Rounds per point: ours and each peer alternate this many times (each round its own stored
    /// measurement); the side-by-side table pools the rounds.
    #[arg(long, default_value_t = 1)]
    pub rounds: usize,
    /// Peers to measure right after each of our points, on the same shape, threads and device:
    /// `torch` (PyTorch eager, f32 + bf16, inputs and outputs on its device), `torch-host`
    /// (the same, each call from host inputs to host outputs as ours), `ort` (ONNX Runtime,
    /// f32 + int8), `llamacpp` (llama.cpp on the same GGUF file), or with precisions
    /// `torch:f32`, `ort:f32+int8`.
    /// Installed by `cargo xtask fetch-peers`; a peer that cannot run is stored as unavailable
    /// with the reason.
    #[arg(long, value_delimiter = ',')]
    pub peer: Vec<String>,
    /// Untimed warm-up iterations per point.
    #[arg(long, default_value_t = 2)]
    pub warmup: usize,
    /// The DuckDB file results are added to.
    #[arg(long, default_value = DEFAULT_DB)]
    pub db: PathBuf,
    /// Do not store results (no DuckDB needed); print them only.
    #[arg(long)]
    pub no_db: bool,
    /// Also print the run and its measurements as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Peak GFLOP/s of the device, for "% of peak" (known GPUs are looked up by name).
    #[arg(long)]
    pub peak_gflops: Option<f64>,
}

/// Arguments of `report`.
#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// The DuckDB file to read.
    #[arg(long, default_value = DEFAULT_DB)]
    pub db: PathBuf,
    /// The HTML file to write.
    #[arg(long, default_value = "bench-report.html")]
    pub out: PathBuf,
    /// Also render the page in headless Chromium to this PNG and check it is not blank.
    #[arg(long)]
    pub screenshot: Option<PathBuf>,
}

/// Arguments of `compare-backends`.
#[derive(Debug, Clone, clap::Args)]
pub struct CompareArgs {
    /// The DuckDB file to read.
    #[arg(long, default_value = DEFAULT_DB)]
    pub db: PathBuf,
    /// The family to rank backends for.
    #[arg(long)]
    pub family: String,
    /// Only this model (configuration name or path) of the family.
    #[arg(long)]
    pub model: Option<String>,
}

fn store_err(e: crate::store::StoreError) -> BenchError {
    BenchError::Store(e.to_string())
}

/// One line per measurement, for the terminal.
pub fn summary_line(m: &Measurement) -> String {
    // A peer's rows say whose they are.
    let backend = m.series();
    let shape = match m.new_tokens {
        Some(new) => format!("b{}×{}+{new} {}", m.batch, m.seq, m.shape_kind),
        None => format!("b{}×{} {}", m.batch, m.seq, m.shape_kind),
    };
    match (m.status, m.latency) {
        (Status::Ok | Status::Interrupted, Some(l)) => {
            let rate = match m.tokens_per_s {
                Some(t) => format!("{t:.0} tokens/s"),
                None => format!("{:.2} items/s", m.items_per_s.unwrap_or(0.0)),
            };
            let gflops = m
                .achieved_flops_per_s
                .map(|f| format!(", {:.1} GFLOP/s", f / 1e9))
                .unwrap_or_default();
            // Generation rows: where the memory went and how long the load took.
            let extra = match m.new_tokens {
                Some(_) => format!(
                    "{}{}",
                    m.device_memory_bytes
                        .map(|b| format!(", memory {:.1} MiB", b as f64 / 1048576.0))
                        .unwrap_or_default(),
                    m.load_ms
                        .map(|ms| format!(", load {ms:.0} ms"))
                        .unwrap_or_default()
                ),
                None => String::new(),
            };
            format!(
                "{:<14} {:<5} {shape:<22} mean {:>9.2} ms  p50 {:>9.2}  p99 {:>9.2}  {rate}{gflops}{extra}{}",
                backend,
                m.dtype,
                l.mean_ms,
                l.p50_ms,
                l.p99_ms,
                if m.status == Status::Interrupted { " (interrupted)" } else { "" }
            )
        }
        _ => format!(
            "{:<14} {:<5} {shape:<22} {}: {}",
            backend,
            m.dtype,
            m.status.as_str(),
            m.reason.as_deref().unwrap_or("")
        ),
    }
}

/// Runs `bench`: measures, stores each point as it completes, prints a summary. Returns the run
/// and its measurements.
/// `backends` are names (`cpu`, `cuda`, `onnx-openvino`, ...); empty means `cpu`.
pub fn bench(
    args: &BenchArgs,
    backends: &[String],
    command: String,
) -> Result<(RunInfo, Vec<Measurement>), BenchError> {
    let default = ["cpu".to_string()];
    let names = if backends.is_empty() {
        &default[..]
    } else {
        backends
    };
    let backends = names
        .iter()
        .map(|b| b.parse::<BackendKind>())
        .collect::<Result<Vec<_>, _>>()?;
    let store = if args.no_db {
        None
    } else {
        Some(Store::open(&args.db).map_err(store_err)?)
    };
    let peers = crate::peers::parse_peers(&args.peer)?;
    if args.rounds == 0 {
        return Err(BenchError::Spec("--rounds must be at least 1".into()));
    }

    if !crate::build::this_build_optimized() {
        eprintln!("{}", crate::build::unoptimized_warning());
    }
    let decoding = crate::runner::Decoding {
        sampling: match args.temperature {
            Some(temperature) => ipfs_accelerate::text::Sampling::Sample {
                temperature,
                top_k: args.top_k,
                top_p: args.top_p,
            },
            None => ipfs_accelerate::text::Sampling::Greedy,
        },
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
        show_tokens: args.show_tokens,
    };
    if !peers.is_empty() && !decoding.is_greedy() {
        return Err(BenchError::Spec(
            "peers generate greedily: --temperature and --repetition-penalty run without --peer"
                .into(),
        ));
    }
    crate::install_interrupt_handler()?;
    let spec = BenchSpec {
        model: args.config.clone(),
        family: args.family.clone(),
        backends,
        batches: args.batch.clone(),
        sizes: args.seq.clone(),
        dtypes: args.dtype.clone(),
        fusion: args.fusion.clone(),
        warmup: args.warmup,
        iters: args.iters,
        rounds: args.rounds,
        peers,
        peak_flops: args.peak_gflops.map(|g| g * 1e9),
        new_tokens: args.new,
        prompts: args.prompt.clone(),
        decoding,
        progress: true,
        command,
    };
    let mut saved_run = false;
    let (run, measurements) = run_benchmark(&spec, |run, m| {
        if let Some(store) = &store {
            if !saved_run {
                store.save_run(run).map_err(store_err)?;
                saved_run = true;
            }
            store.save_measurement(m).map_err(store_err)?;
        }
        eprintln!("{}", summary_line(m));
        Ok(())
    })?;
    if store.is_some() {
        eprintln!(
            "{} measurements of run {} stored in {}",
            measurements.len(),
            run.run_id,
            args.db.display()
        );
    }
    if crate::interrupted() {
        eprintln!("interrupted: the points measured before Ctrl-C are kept");
    }
    if !args.peer.is_empty() || args.rounds > 1 {
        let rows = crate::ratios::ratio_rows(&measurements);
        let build = if crate::build::this_build_optimized() {
            String::new()
        } else {
            format!(
                " — UNOPTIMISED build (opt-level {}): ours is not what a release build does",
                crate::build::OPT_LEVEL
            )
        };
        println!(
            "\nours vs peers, run {} ({} threads, {} round(s) of {} iterations){build}",
            run.run_id, run.cores, args.rounds, args.iters
        );
        print!("{}", crate::ratios::table_text(&rows));
    }
    if args.json {
        let json = serde_json::json!({ "run": run, "measurements": measurements });
        println!(
            "{}",
            serde_json::to_string_pretty(&json).unwrap_or_default()
        );
    }
    Ok((run, measurements))
}

/// Runs `report`: reads the database, writes the HTML page, optionally screenshots it.
pub fn report(args: &ReportArgs) -> Result<(), BenchError> {
    let store = Store::open(&args.db).map_err(store_err)?;
    let (runs, measurements) = store.load_all().map_err(store_err)?;
    let page = html::render_html(&runs, &measurements);
    std::fs::write(&args.out, page).map_err(|e| BenchError::io(&args.out, e))?;
    eprintln!(
        "report of {} runs, {} measurements written to {}",
        runs.len(),
        measurements.len(),
        args.out.display()
    );
    if let Some(png) = &args.screenshot {
        let err = |e: crate::chromium::ChromiumError| BenchError::Spec(e.to_string());
        crate::chromium::screenshot(&args.out, png, 1280, 2400).map_err(err)?;
        if crate::chromium::screenshot_is_blank(png).map_err(err)? {
            return Err(BenchError::Spec(format!(
                "the screenshot {} of the report is blank",
                png.display()
            )));
        }
        eprintln!("screenshot (checked non-blank): {}", png.display());
    }
    Ok(())
}

/// Runs `compare-backends`: prints the ranking of backends for one model.
pub fn compare(args: &CompareArgs) -> Result<(), BenchError> {
    let store = Store::open(&args.db).map_err(store_err)?;
    let (_, measurements) = store.load_all().map_err(store_err)?;
    print!(
        "{}",
        html::compare_backends(&measurements, &args.family, args.model.as_deref())
    );
    Ok(())
}
