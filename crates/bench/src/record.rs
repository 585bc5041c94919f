//! What a benchmark run records: one [`RunInfo`] per invocation, one [`Measurement`] per
//! (family, model, backend, dtype, batch, seq) point of its grid, with the raw per-iteration
//! timings. Every number is measured; what could not be measured is `None` (stored as NULL).

use serde::{Deserialize, Serialize};

/// The machine and invocation a run happened on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunInfo {
    /// Unique id of the run (time-based, e.g. `20261122T104733Z-1234`).
    pub run_id: String,
    /// Start time, RFC 3339 in UTC (`2026-11-22T10:47:33Z`).
    pub started_at: String,
    /// `git rev-parse HEAD` of the working tree when it could be read.
    pub git_commit: Option<String>,
    /// Host name.
    pub host: String,
    /// Operating system (`linux 6.1 x86_64`).
    pub os: String,
    /// CPU model name (from /proc/cpuinfo on Linux).
    pub cpu_model: String,
    /// Logical cores available to the process.
    pub cores: u32,
    /// GPU names of the usable GPU backends, comma separated, when any.
    pub gpu: Option<String>,
    /// GPU driver version when a GPU backend reports one.
    pub driver: Option<String>,
    /// The command line of the run.
    pub command: String,
    /// Cargo profile the benchmark code was built in (`release`, `debug`), captured at compile
    /// time ([`crate::build::PROFILE`]); `None` for runs stored before it was recorded.
    #[serde(default)]
    pub build_profile: Option<String>,
    /// Optimisation level of that build (`0`–`3`, `s`, `z`); `None` when unknown (older runs).
    #[serde(default)]
    pub opt_level: Option<String>,
}

impl RunInfo {
    /// Whether the run measured an optimised build (opt-level 2, 3, `s` or `z`); `None` when the
    /// run did not record its opt-level.
    pub fn optimized(&self) -> Option<bool> {
        self.opt_level.as_deref().map(crate::build::is_optimized)
    }
}

/// The engine name of ipfs-accelerate's own measurements ([`Measurement::engine`]).
pub const OURS: &str = "ipfs-accelerate";

/// How a grid point ended.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Status {
    /// All asked iterations were timed.
    #[default]
    Ok,
    /// The backend is not usable on this machine (not compiled in, no driver, no device).
    Unavailable,
    /// Loading or running failed (the reason says why).
    Failed,
    /// Ctrl-C stopped the run: the iterations timed before it are kept.
    Interrupted,
}

impl Status {
    /// The name stored in the database (`ok`, `unavailable`, `failed`, `interrupted`).
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Unavailable => "unavailable",
            Status::Failed => "failed",
            Status::Interrupted => "interrupted",
        }
    }

    /// Parses [`Status::as_str`]'s names.
    pub fn parse(text: &str) -> Option<Status> {
        match text {
            "ok" => Some(Status::Ok),
            "unavailable" => Some(Status::Unavailable),
            "failed" => Some(Status::Failed),
            "interrupted" => Some(Status::Interrupted),
            _ => None,
        }
    }
}

/// Latency statistics over the timed iterations, in milliseconds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LatencyStats {
    /// Arithmetic mean.
    pub mean_ms: f64,
    /// Median (nearest-rank percentile, as every percentile here).
    pub p50_ms: f64,
    /// 90th percentile.
    pub p90_ms: f64,
    /// 99th percentile.
    pub p99_ms: f64,
    /// Fastest iteration.
    pub min_ms: f64,
    /// Slowest iteration.
    pub max_ms: f64,
    /// Sample standard deviation (0 for one iteration).
    pub stddev_ms: f64,
}

/// One grid point of a run: a family at one shape on one backend. `Default` gives empty names
/// and no results, to fill in with struct-update syntax.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measurement {
    /// The run this belongs to ([`RunInfo::run_id`]).
    pub run_id: String,
    /// Family name (`bert`, `vit`, ...).
    pub family: String,
    /// The model: a named configuration (`minilm-l6`, random weights) or a checkpoint path.
    pub model: String,
    /// Backend name as the CLI spells it (`cpu`, `cuda`, `onnx-cpu`, ...).
    pub backend: String,
    /// Compute precision (`f32`, `f16`, `bf16`).
    pub dtype: String,
    /// Batch size.
    pub batch: u32,
    /// Sequence length, image side in pixels, or audio length in samples, depending on the family
    /// (see [`Measurement::shape_kind`]).
    pub seq: u32,
    /// What `seq` counts: `tokens`, `pixels` (image side) or `samples` / `frames` (audio).
    pub shape_kind: String,
    /// Untimed warm-up iterations.
    pub warmup: u32,
    /// Timed iterations asked for.
    pub iters_asked: u32,
    /// Timed iterations done (fewer than asked only when interrupted or failed midway).
    pub iters_done: u32,
    /// How the point ended.
    pub status: Status,
    /// Why it is unavailable, failed or interrupted.
    pub reason: Option<String>,
    /// Loading the model on the backend (weights + first placement), in ms.
    pub load_ms: Option<f64>,
    /// Latency statistics of the timed iterations.
    pub latency: Option<LatencyStats>,
    /// Items (batch rows) per second at the mean latency.
    pub items_per_s: Option<f64>,
    /// Tokens per second at the mean latency, for token inputs.
    pub tokens_per_s: Option<f64>,
    /// Peak resident set size of the process while this point ran, in bytes.
    pub host_rss_peak_bytes: Option<u64>,
    /// Device memory in use after the timed iterations, from the backend's allocator.
    pub device_memory_bytes: Option<u64>,
    /// Analytic floating-point operations of one iteration (multiply-add = 2).
    pub flops: Option<f64>,
    /// `flops / mean latency`.
    pub achieved_flops_per_s: Option<f64>,
    /// Achieved FLOP/s as a percentage of the device's peak, when the peak is known.
    pub peak_flops_pct: Option<f64>,
    /// The raw timing of every timed iteration, in ms, in order.
    pub timings_ms: Vec<f64>,
    /// What ran the point: [`OURS`] (`ipfs-accelerate`), or a peer measured in the same run
    /// (`torch`, `onnxruntime`). Rows stored before engines were recorded read as [`OURS`].
    #[serde(default)]
    pub engine: String,
    /// The engine's version (ours: the crate version; a peer: its package version), when known.
    #[serde(default)]
    pub engine_version: Option<String>,
    /// Round of an alternating comparison (`--rounds N`: 0..N); 0 for a single round.
    #[serde(default)]
    pub round: u32,
    /// New tokens generated per iteration, for generation points (`shape_kind` `prefill` or
    /// `decode`, `seq` the prompt's tokens); `None` for a forward pass.
    #[serde(default)]
    pub new_tokens: Option<u32>,
    /// Median time to the first new token (prefill) over the timed iterations, in ms.
    #[serde(default)]
    pub ttft_ms: Option<f64>,
    /// Median decode rate over the timed iterations: new tokens after the first per second.
    #[serde(default)]
    pub decode_tokens_per_s: Option<f64>,
}

impl Measurement {
    /// Whether this is ipfs-accelerate's own measurement (not a peer's).
    pub fn is_ours(&self) -> bool {
        self.engine.is_empty() || self.engine == OURS
    }

    /// The series the point belongs to in tables and plots: its backend, and for a peer the
    /// engine too (`cpu · torch`).
    pub fn series(&self) -> String {
        if self.is_ours() {
            self.backend.clone()
        } else {
            format!("{} · {}", self.backend, self.engine)
        }
    }
}
