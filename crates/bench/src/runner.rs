//! Runs a family over a grid of backends × dtypes × batch sizes × sizes: loads the model once per
//! backend, warms up, times N iterations (each ends with the outputs back on the host and the
//! backend synchronised, so the clock covers the device's work), and records one
//! [`Measurement`] per grid point — including the points that could not run and why.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use ipfs_accelerate::text::TextGeneration;
use ipfs_accelerate::{Availability, BackendKind, Precision};
use ipfs_accelerate_core::{ModelRunner, ProbeBackend, TensorMap};
use serde_json::Value;

use crate::record::{Measurement, RunInfo, Status};
use crate::{configs, flops, inputs, stats, sysinfo, BenchError};

/// What to benchmark.
#[derive(Debug, Clone)]
pub struct BenchSpec {
    /// A named configuration ([`configs::PRESETS`], random weights), a checkpoint folder
    /// (config.json + safetensors; a conformance fixture folder also brings its inputs), a
    /// config.json file (random weights), or a model id resolved like every loader does (a name
    /// under `$IPFS_ACCELERATE_MODELS`, the HF cache, or a hub download).
    pub model: String,
    /// The family, when the model's `model_type` does not say it (or to check that it does).
    pub family: Option<String>,
    /// Backends to run on, in order; unusable ones are recorded as unavailable.
    pub backends: Vec<BackendKind>,
    /// Batch sizes.
    pub batches: Vec<usize>,
    /// Sizes (tokens, image side, mel frames or samples — see [`inputs::size_axis`]); empty → the
    /// family's default.
    pub sizes: Vec<usize>,
    /// Precisions: `f32`, `f16`, `bf16` (compute) or `int8` / `int4` (f32 compute, quantized
    /// linear weights); one a backend cannot run is recorded as failed with the reason.
    pub dtypes: Vec<String>,
    /// Kernel fusion settings to measure on the CubeCL backends (cuda, wgpu): `[true, false]`
    /// measures both, the unfused points recorded under `<backend>/unfused`. Empty: the process
    /// setting ([`ipfs_accelerate::kernel_fusion`]). Other backends run once.
    pub fusion: Vec<bool>,
    /// Untimed iterations before timing.
    pub warmup: usize,
    /// Timed iterations (per round).
    pub iters: usize,
    /// Rounds per grid point: each round times `iters` iterations and is its own measurement,
    /// so a peer run after each one alternates with ours (`--rounds`; 0 counts as 1).
    pub rounds: usize,
    /// The device's peak FLOP/s, to report achieved FLOP/s as a percentage (overrides the table of
    /// known GPUs in [`known_peak_flops`]).
    pub peak_flops: Option<f64>,
    /// Peers to run right after each of our measurements of the first dtype, on the same shape,
    /// threads and device ([`crate::peers`]).
    pub peers: Vec<crate::peers::Peer>,
    /// New tokens per generation: `Some` benchmarks generation (decoder LMs: time to first token
    /// and decode tokens/s, see [`crate::generation`]) instead of one forward pass. A `.gguf`
    /// model is always benchmarked this way (128 new tokens unless given).
    pub new_tokens: Option<usize>,
    /// Prompt lengths of a generation benchmark in tokens; empty: `sizes`, else
    /// [`crate::generation::DEFAULT_PROMPT`].
    pub prompts: Vec<usize>,
    /// How decoder LMs choose their tokens in generation points (greedy by default).
    pub decoding: Decoding,
    /// Show a progress bar on stderr.
    pub progress: bool,
    /// The command line, stored with the run.
    pub command: String,
}

/// How a decoder LM's generation points choose tokens: greedy (the default) or seeded sampling,
/// with a repetition penalty; the model's stop tokens are never used (a point generates exactly
/// its new tokens).
#[derive(Debug, Clone, PartialEq)]
pub struct Decoding {
    /// Greedy or sampling.
    pub sampling: ipfs_accelerate::text::Sampling,
    /// HF's repetition penalty (1.0 = off).
    pub repetition_penalty: f32,
    /// The sampler's seed.
    pub seed: u64,
    /// Print each timed generation's tokens (row 0) on stderr.
    pub show_tokens: bool,
}

impl Default for Decoding {
    fn default() -> Self {
        Decoding {
            sampling: ipfs_accelerate::text::Sampling::Greedy,
            repetition_penalty: 1.0,
            seed: 0,
            show_tokens: false,
        }
    }
}

impl Decoding {
    /// Whether this is plain greedy decoding.
    pub fn is_greedy(&self) -> bool {
        self.sampling == ipfs_accelerate::text::Sampling::Greedy && self.repetition_penalty == 1.0
    }
}

impl Default for BenchSpec {
    fn default() -> Self {
        BenchSpec {
            model: "minilm-l6".into(),
            family: None,
            backends: vec![BackendKind::Cpu],
            batches: vec![1],
            sizes: Vec::new(),
            dtypes: vec!["f32".into()],
            fusion: Vec::new(),
            warmup: 2,
            iters: 10,
            rounds: 1,
            peers: Vec::new(),
            peak_flops: None,
            new_tokens: None,
            prompts: Vec::new(),
            decoding: Decoding::default(),
            progress: false,
            command: String::new(),
        }
    }
}

/// Set by Ctrl-C or SIGTERM (once [`install_interrupt_handler`] ran): the runner stops after the
/// current iteration and keeps what it measured.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// Installs the Ctrl-C / SIGTERM handler that makes a run stop cleanly (idempotent), so `timeout`
/// or a job scheduler ending a run keeps the points already measured.
pub fn install_interrupt_handler() -> Result<(), BenchError> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::SeqCst))
                .map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| BenchError::Spec(format!("cannot install the Ctrl-C handler: {e}")))
}

/// Whether Ctrl-C was pressed during this process's runs.
pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Peak FP32 FLOP/s of well-known GPUs by name (vendor data sheets, non-tensor-core FP32), used
/// for "% of peak" when the user gives no `--peak-gflops`. CPUs are not listed: their peak depends
/// on clocks and vector units the process cannot read reliably.
pub fn known_peak_flops(device_name: &str) -> Option<f64> {
    let name = device_name.to_ascii_uppercase();
    let table: &[(&str, f64)] = &[
        ("H200", 67.0e12),
        ("H100 PCIE", 51.2e12),
        ("H100", 67.0e12),
        ("A100", 19.5e12),
        ("L40S", 91.6e12),
        ("L4", 30.3e12),
        ("RTX 4090", 82.6e12),
    ];
    table
        .iter()
        .find(|(key, _)| name.contains(key))
        .map(|(_, peak)| *peak)
}

/// The model to run: its family, label, folder and config, and fixture inputs when it has them.
struct ModelPlan {
    family: String,
    label: String,
    dir: PathBuf,
    config: Value,
    fixture_inputs: Option<TensorMap>,
    /// Whether the weights are random (a named configuration or a config.json), not a checkpoint's.
    random_weights: bool,
    /// What was read of `dir` when it is a llama.cpp `.gguf` file (config and weights in one
    /// file); `None` for a checkpoint folder.
    gguf: Option<crate::generation::GgufInfo>,
    /// Keeps the folder of a random-weight configuration alive.
    _temp: Option<tempfile::TempDir>,
}

/// The family that serves a config's `model_type`.
fn family_of(model_type: &str) -> Option<&'static str> {
    Some(match model_type {
        "bert" => "bert",
        "llama" | "mistral" => "llama",
        "qwen2" => "qwen2",
        "t5" => "t5",
        "whisper" => "whisper",
        "wav2vec2" => "wav2vec2",
        "vit" => "vit",
        "clip" => "clip",
        "detr" => "detr",
        "clap" => "clap",
        "llava" => "llava",
        "llava_next" => "llava_next",
        "xclip" => "xclip",
        _ => return None,
    })
}

/// A folder holding `config_json` and a random-initialisation marker (weights stored in the ggml
/// format `ggml_type` when given).
fn random_weight_dir(
    config_json: &str,
    ggml_type: Option<&str>,
) -> Result<(tempfile::TempDir, PathBuf), BenchError> {
    let temp = tempfile::tempdir().map_err(|e| BenchError::io(std::env::temp_dir(), e))?;
    let dir = temp.path().to_path_buf();
    let marker = match ggml_type {
        None => r#"{"seed": 0, "std": 0.02}"#.to_string(),
        Some(ty) => format!(r#"{{"seed": 0, "std": 0.02, "ggml_type": "{ty}"}}"#),
    };
    for (name, text) in [
        ("config.json", config_json),
        (ipfs_accelerate_io::RANDOM_INIT_FILE, marker.as_str()),
    ] {
        std::fs::write(dir.join(name), text).map_err(|e| BenchError::io(dir.join(name), e))?;
    }
    Ok((temp, dir))
}

/// Whether `path` names a `.gguf` file.
fn is_gguf(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
}

/// The plan of a llama.cpp `.gguf` file: its family from `general.architecture`.
fn gguf_plan(spec: &BenchSpec, path: &Path) -> Result<ModelPlan, BenchError> {
    let file = ipfs_accelerate_io::gguf::GgufFile::open(path)
        .map_err(|e| BenchError::Spec(format!("{}: {e}", path.display())))?;
    let arch = file.architecture().unwrap_or("").to_string();
    let inferred = family_of(&arch);
    let family = match (&spec.family, inferred) {
        (Some(f), Some(i)) if f != i => {
            return Err(BenchError::Spec(format!(
                "--family {f} does not match `{}` (architecture `{arch}` is served by `{i}`)",
                spec.model
            )))
        }
        (_, Some(i)) => i.to_string(),
        (_, None) => {
            return Err(BenchError::Spec(format!(
                "`{}` is a GGUF file of architecture `{arch}`; GGUF files of llama and qwen2 \
                 are benchmarked",
                spec.model
            )))
        }
    };
    Ok(ModelPlan {
        family,
        label: spec.model.clone(),
        dir: path.to_path_buf(),
        config: Value::Null,
        fixture_inputs: None,
        random_weights: false,
        gguf: Some(crate::generation::GgufInfo::of(&file)),
        _temp: None,
    })
}

fn plan(spec: &BenchSpec) -> Result<ModelPlan, BenchError> {
    let path = Path::new(&spec.model);
    if path.is_file() && is_gguf(path) {
        return gguf_plan(spec, path);
    }
    let (label, dir, temp, config_text, preset_family) =
        if let Some((family, json)) = configs::preset(&spec.model) {
            let (temp, dir) = random_weight_dir(json, None)?;
            (
                spec.model.clone(),
                dir,
                Some(temp),
                json.to_string(),
                Some(family),
            )
        } else if path.is_dir() {
            let file = path.join("config.json");
            let text = std::fs::read_to_string(&file).map_err(|e| BenchError::io(&file, e))?;
            (spec.model.clone(), path.to_path_buf(), None, text, None)
        } else if path.is_file() {
            let text = std::fs::read_to_string(path).map_err(|e| BenchError::io(path, e))?;
            let (temp, dir) = random_weight_dir(&text, None)?;
            (spec.model.clone(), dir, Some(temp), text, None)
        } else {
            // A hub id (or a name under $IPFS_ACCELERATE_MODELS): resolved as every loader does,
            // downloading config.json and the weights with a progress bar when not cached.
            let unresolved = |e: &dyn std::fmt::Display| {
                BenchError::Spec(format!(
                    "`{}` is not a named configuration ({}), a local checkpoint folder or a \
                     config.json, and resolving it as a model id failed: {e}",
                    spec.model,
                    configs::preset_names().join(", ")
                ))
            };
            let options = ipfs_accelerate_io::ResolveOptions {
                progress: spec.progress,
                ..Default::default()
            };
            let files =
                ipfs_accelerate_io::resolve(&spec.model, options).map_err(|e| unresolved(&e))?;
            let file = files.get("config.json").map_err(|e| unresolved(&e))?;
            files.weight_files().map_err(|e| unresolved(&e))?;
            let text = std::fs::read_to_string(&file).map_err(|e| BenchError::io(&file, e))?;
            let dir = file.parent().map(Path::to_path_buf).unwrap_or_default();
            (spec.model.clone(), dir, None, text, None)
        };
    let config: Value = serde_json::from_str(&config_text)
        .map_err(|e| BenchError::Spec(format!("config of `{label}` is not JSON: {e}")))?;
    let model_type = config
        .get("model_type")
        .and_then(Value::as_str)
        .unwrap_or("");
    let inferred = preset_family.or_else(|| family_of(model_type));
    let family = match (&spec.family, inferred) {
        (Some(f), Some(i)) if f != i => {
            return Err(BenchError::Spec(format!(
            "--family {f} does not match `{label}` (model_type `{model_type}` is served by `{i}`)"
        )))
        }
        (Some(f), _) => f.clone(),
        (None, Some(i)) => i.to_string(),
        (None, None) => {
            return Err(BenchError::Spec(format!(
                "cannot tell the family of `{label}` (model_type `{model_type}`): pass --family"
            )))
        }
    };
    let fixture_inputs =
        if dir.join("reference.safetensors").is_file() && dir.join("meta.json").is_file() {
            let fixture = ipfs_accelerate::conformance::Fixture {
                family: family.clone(),
                variant: String::new(),
                dir: dir.clone(),
            };
            let mut inputs = fixture.inputs()?;
            // One forward pass is timed, not a greedy decode.
            inputs.remove("greedy_steps");
            Some(inputs)
        } else {
            None
        };
    let random_weights = dir.join(ipfs_accelerate_io::RANDOM_INIT_FILE).is_file();
    Ok(ModelPlan {
        family,
        label,
        dir,
        config,
        fixture_inputs,
        random_weights,
        gguf: None,
        _temp: temp,
    })
}

/// The machine and invocation, with the names and drivers of the usable GPU backends named.
pub fn run_info(backends: &[BackendKind], command: &str) -> RunInfo {
    let (started_at, stem) = sysinfo::now_utc();
    let selector = ipfs_accelerate::selector();
    let gpus: Vec<(String, Option<String>)> = backends
        .iter()
        .filter(|k| !matches!(k, BackendKind::Cpu | BackendKind::Onnx(_)))
        .filter_map(|k| match selector.probe(*k) {
            Availability::Available(info) => Some((info.name, info.driver)),
            _ => None,
        })
        .collect();
    let join = |v: Vec<String>| (!v.is_empty()).then(|| v.join(", "));
    // The CPU backend's probe already reads the model name and the usable threads.
    let (cpu_model, cores) = match selector.probe(BackendKind::Cpu) {
        Availability::Available(info) => (info.name, info.compute_units),
        _ => ("unknown (cpu backend not compiled in)".to_string(), None),
    };
    let cores =
        cores.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get() as u32));
    RunInfo {
        run_id: format!("{stem}-{}", std::process::id()),
        started_at,
        git_commit: sysinfo::git_commit(),
        host: sysinfo::host_name(),
        os: sysinfo::os_description(),
        cpu_model,
        cores,
        gpu: join(gpus.iter().map(|g| g.0.clone()).collect()),
        driver: join(gpus.iter().filter_map(|g| g.1.clone()).collect()),
        command: command.to_string(),
        build_profile: Some(crate::build::PROFILE.to_string()),
        opt_level: Some(crate::build::OPT_LEVEL.to_string()),
    }
}

/// One grid point's identity, before it is measured.
struct Point<'a> {
    run: &'a RunInfo,
    plan: &'a ModelPlan,
    /// The backend's name, with `/unfused` when kernel fusion is off.
    backend: &'a str,
    dtype: &'a str,
    batch: usize,
    size: usize,
    shape_kind: &'a str,
    spec: &'a BenchSpec,
    round: u32,
}

impl Point<'_> {
    /// A measurement of this point with nothing measured yet.
    fn empty(&self, status: Status, reason: Option<String>) -> Measurement {
        Measurement {
            run_id: self.run.run_id.clone(),
            family: self.plan.family.clone(),
            model: self.plan.label.clone(),
            backend: self.backend.to_string(),
            dtype: self.dtype.to_string(),
            batch: self.batch as u32,
            seq: self.size as u32,
            shape_kind: self.shape_kind.to_string(),
            warmup: self.spec.warmup as u32,
            iters_asked: self.spec.iters as u32,
            status,
            reason,
            engine: crate::OURS.to_string(),
            engine_version: Some(env!("CARGO_PKG_VERSION").to_string()),
            round: self.round,
            ..Default::default()
        }
    }
}

/// The (batch, size) pairs of a grid and what the size counts.
type Grid = (Vec<(usize, usize)>, &'static str);

/// The (batch, size) pairs of the grid, or the fixture's one shape.
fn grid(spec: &BenchSpec, plan: &ModelPlan) -> Result<Grid, BenchError> {
    if generation_mode(spec, plan) {
        if !crate::generation::GENERATING_FAMILIES.contains(&plan.family.as_str()) {
            return Err(BenchError::Spec(format!(
                "generation benchmarks (--new) cover {}, not `{}`",
                crate::generation::GENERATING_FAMILIES.join(", "),
                plan.family
            )));
        }
        let default = match plan.family.as_str() {
            "whisper" => inputs::size_axis(&plan.family, &plan.config).1,
            _ => crate::generation::DEFAULT_PROMPT,
        };
        // A family whose inputs are not synthesized (llava_next) generates from its fixture's
        // inputs, whose size is fixed.
        let from_fixture = plan.fixture_inputs.is_some()
            && inputs::synthesize(&plan.family, &plan.config, 1, 1).is_err();
        let prompts = match (&spec.prompts, &spec.sizes) {
            _ if from_fixture => vec![grid_of_fixture(plan).0[0].1],
            (p, _) if !p.is_empty() => p.clone(),
            (_, s) if !s.is_empty() => s.clone(),
            _ => vec![default],
        };
        crate::generation::check_grid(&spec.batches, &prompts)?;
        let batches = if spec.batches.is_empty() {
            vec![1]
        } else {
            spec.batches.clone()
        };
        let points = batches
            .iter()
            .flat_map(|&b| prompts.iter().map(move |&p| (b, p)))
            .collect();
        return Ok((points, "prefill"));
    }
    let (kind, default) = inputs::size_axis(&plan.family, &plan.config);
    if plan.fixture_inputs.is_some() {
        return Ok(grid_of_fixture(plan));
    }
    if spec.batches.is_empty() || spec.batches.contains(&0) {
        return Err(BenchError::Spec("batch sizes must be at least 1".into()));
    }
    let sizes = if spec.sizes.is_empty() {
        vec![default]
    } else {
        spec.sizes.clone()
    };
    if sizes.contains(&0) {
        return Err(BenchError::Spec("sizes must be at least 1".into()));
    }
    Ok((
        spec.batches
            .iter()
            .flat_map(|&b| sizes.iter().map(move |&s| (b, s)))
            .collect(),
        kind,
    ))
}

/// A fixture's inputs fix the shape: batch and size come from its first input.
fn grid_of_fixture(plan: &ModelPlan) -> Grid {
    let (kind, _) = inputs::size_axis(&plan.family, &plan.config);
    let shape = plan
        .fixture_inputs
        .as_ref()
        .and_then(|f| f.values().next())
        .map(|t| t.shape().to_vec())
        .unwrap_or_default();
    let batch = shape.first().copied().unwrap_or(1);
    let size = shape.get(1).copied().unwrap_or(1);
    (vec![(batch, size)], kind)
}

/// Whether `spec` on `plan` measures generation rather than a forward pass.
fn generation_mode(spec: &BenchSpec, plan: &ModelPlan) -> bool {
    spec.new_tokens.is_some() || plan.gguf.is_some()
}

/// Runs the benchmark described by `spec`, handing every measurement to `sink` as soon as it is
/// complete (so a database keeps it even if a later point crashes or Ctrl-C stops the run).
/// Returns the run's description and every measurement. Grid points that cannot run are recorded
/// with status `unavailable` or `failed` and the run goes on.
pub fn run_benchmark(
    spec: &BenchSpec,
    mut sink: impl FnMut(&RunInfo, &Measurement) -> Result<(), BenchError>,
) -> Result<(RunInfo, Vec<Measurement>), BenchError> {
    if spec.iters == 0 {
        return Err(BenchError::Spec("--iters must be at least 1".into()));
    }
    if spec.backends.is_empty() {
        return Err(BenchError::Spec("no backend to run on".into()));
    }
    let plan = plan(spec)?;
    let (points, shape_kind) = grid(spec, &plan)?;
    let run = run_info(&spec.backends, &spec.command);
    let dtypes: Vec<String> = if spec.dtypes.is_empty() {
        vec!["f32".into()]
    } else {
        spec.dtypes.clone()
    };
    // `None`: a backend without a fusion setting.
    let fusions = |backend: BackendKind| -> Vec<Option<bool>> {
        let cubecl = matches!(
            backend,
            BackendKind::Cuda
                | BackendKind::Rocm
                | BackendKind::Metal
                | BackendKind::Wgpu
                | BackendKind::WebGpu
        );
        if !cubecl {
            vec![None]
        } else if spec.fusion.is_empty() {
            vec![Some(ipfs_accelerate::kernel_fusion())]
        } else {
            spec.fusion.iter().map(|&f| Some(f)).collect()
        }
    };
    let generation = generation_mode(spec, &plan);
    let new_tokens = spec.new_tokens.unwrap_or(128);
    // A GGUF file computes in f32 on its own blocks: its points are labelled with the file's type.
    let gguf_label = plan.gguf.as_ref().map(|g| g.dtype.clone());
    let variants: usize = spec.backends.iter().map(|&b| fusions(b).len()).sum();
    let total =
        (variants * dtypes.len() * points.len() * spec.rounds.max(1) * (spec.warmup + spec.iters))
            as u64;
    let bar = if spec.progress {
        ProgressBar::new(total)
    } else {
        ProgressBar::hidden()
    };
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:30} {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let selector = ipfs_accelerate::selector();
    let compiled = ipfs_accelerate::compiled_backends();
    let mut out = Vec::new();
    let mut record = |m: Measurement, out: &mut Vec<Measurement>| -> Result<(), BenchError> {
        sink(&run, &m)?;
        out.push(m);
        Ok(())
    };
    'backends: for &backend in &spec.backends {
        let hal = compiled.iter().find(|b| b.kind() == backend);
        let availability = selector.probe(backend);
        let device_name = match &availability {
            Availability::Available(info) => Some(info.name.clone()),
            _ => None,
        };
        let peak = spec
            .peak_flops
            .or_else(|| device_name.as_deref().and_then(known_peak_flops));
        // Load once per backend and dtype (measured), unless the backend cannot run at all.
        let unusable = match &availability {
            Availability::Unavailable(reason) => Some(reason.clone()),
            other => other.reason(backend),
        };
        let unavailable = unusable.is_some();
        let variants: Vec<(&String, Option<bool>)> = dtypes
            .iter()
            .flat_map(|d| fusions(backend).into_iter().map(move |f| (d, f)))
            .collect();
        // Rounds outermost, so every variant (precision, fusion) and every peer is measured once
        // per round, alternating. A model is loaded per variant and round when there are several
        // variants (only one is in memory at a time, so peak memory stays that variant's own), and
        // once when there is one.
        let mut kept: Option<(usize, Loaded, String)> = None;
        for round in 0..spec.rounds.max(1) {
            for (v, &(dtype, fusion)) in variants.iter().enumerate() {
                let dtype_label = match &gguf_label {
                    Some(l) if dtype == "f32" => l.as_str(),
                    _ => dtype.as_str(),
                };
                let label = match fusion {
                    Some(false) => format!("{backend}/unfused"),
                    _ => backend.to_string(),
                };
                if let Some(on) = fusion {
                    ipfs_accelerate::set_kernel_fusion(on);
                }
                if kept.as_ref().is_none_or(|(kv, _, _)| *kv != v) {
                    // The previous variant leaves memory before the next one loads.
                    drop(kept.take());
                    let loaded = match &unusable {
                        Some(reason) => Err(reason.clone()),
                        None => {
                            bar.set_message(format!("loading {} on {label} ({dtype})", plan.label));
                            if generation && crate::generation::is_decoder_lm(&plan.family) {
                                load_decoder(&plan, backend, dtype)
                            } else {
                                load_variant(&plan, backend, dtype)
                            }
                        }
                    };
                    // A runner on another engine than the family's burn model (cuBLAS for BERT
                    // on cuda) is its own series.
                    let label = match &loaded {
                        Ok((model, _)) => match model.runner().engine() {
                            Some(engine) => format!("{label}/{engine}"),
                            None => label,
                        },
                        Err(_) => label,
                    };
                    kept = Some((v, loaded, label));
                }
                let Some((_, loaded, label)) = &kept else {
                    continue;
                };
                for &(batch, size) in &points {
                    let point = Point {
                        run: &run,
                        plan: &plan,
                        backend: label,
                        dtype: dtype_label,
                        batch,
                        size,
                        shape_kind,
                        spec,
                        round: round as u32,
                    };
                    let rows: Vec<Measurement> = match loaded {
                        Err(reason) => {
                            let status = if unavailable {
                                Status::Unavailable
                            } else {
                                Status::Failed
                            };
                            bar.inc((spec.warmup + spec.iters) as u64);
                            let empty = point.empty(status, Some(reason.clone()));
                            if generation {
                                crate::generation::generation_rows(
                                    &empty,
                                    size,
                                    new_tokens,
                                    Vec::new(),
                                    Vec::new(),
                                )
                                .to_vec()
                            } else {
                                vec![empty]
                            }
                        }
                        Ok((model, load_ms)) => {
                            bar.set_message(format!(
                                "{} {label} {dtype_label} b{batch}×{size}",
                                plan.label
                            ));
                            match model {
                                Model::Forward(runner) if !generation => vec![measure(
                                    &point,
                                    runner.as_ref(),
                                    hal.map(|h| h.as_ref()),
                                    *load_ms,
                                    peak,
                                    &bar,
                                )],
                                model => measure_generation(
                                    &point,
                                    model,
                                    hal.map(|h| h.as_ref()),
                                    *load_ms,
                                    new_tokens,
                                    &bar,
                                ),
                            }
                        }
                    };
                    let stop = rows.iter().any(|m| m.status == Status::Interrupted);
                    let ours = rows[0].clone();
                    for m in rows {
                        record(m, &mut out)?;
                    }
                    // The peers run right after ours, on the first variant's points (their own
                    // precisions are theirs), unless Ctrl-C stopped the run.
                    if !stop && v == 0 {
                        for peer in &spec.peers {
                            if interrupted() {
                                break;
                            }
                            bar.set_message(format!("peer {} b{batch}×{size}", peer.engine.name()));
                            let config_file = plan.dir.join("config.json");
                            let rows = crate::peers::run_peer(
                                peer,
                                &crate::peers::PeerPoint {
                                    ours: &ours,
                                    config_file: &config_file,
                                    model_dir: (!plan.random_weights).then_some(plan.dir.as_path()),
                                    new_tokens: generation.then_some(new_tokens),
                                    vocab: plan.gguf.as_ref().and_then(|g| g.vocab),
                                    threads: run.cores,
                                    device: crate::peers::peer_device(label),
                                    warmup: spec.warmup,
                                    iters: spec.iters,
                                    python: crate::peers::python(),
                                },
                            );
                            for row in rows {
                                record(row, &mut out)?;
                            }
                        }
                    }
                    if stop || interrupted() {
                        break 'backends;
                    }
                }
                if variants.len() > 1 {
                    kept = None;
                }
            }
        }
    }
    bar.finish_and_clear();
    Ok((run, out))
}

/// A loaded model: a runner timed one forward pass at a time, or a decoder LM timed by whole
/// generations.
enum Model {
    Forward(Box<dyn ModelRunner>),
    Decoder(Box<dyn TextGeneration>),
}

impl Model {
    /// The model as a runner (its engine, device memory).
    fn runner(&self) -> &dyn ModelRunner {
        match self {
            Model::Forward(r) => r.as_ref(),
            Model::Decoder(d) => d.as_ref(),
        }
    }
}

/// A loaded model and its load time in ms, or why it could not load.
type Loaded = Result<(Model, f64), String>;

/// Times the generations of one point: a decoder LM on its synthesized prompt ids, another
/// family through `ModelRunner::generate_ids` on its inputs at the point's size.
fn measure_generation(
    point: &Point<'_>,
    model: &Model,
    hal: Option<&dyn ProbeBackend>,
    load_ms: f64,
    new_tokens: usize,
    bar: &ProgressBar,
) -> Vec<Measurement> {
    use crate::generation::{generation_rows, GenerationPoint};
    let mut base = point.empty(Status::Ok, None);
    base.load_ms = Some(load_ms);
    let request = GenerationPoint {
        base: base.clone(),
        prompt: point.size,
        new_tokens,
        warmup: point.spec.warmup,
        iters: point.spec.iters,
        bar,
    };
    let failed = |reason: String| {
        let m = Measurement {
            status: Status::Failed,
            reason: Some(reason),
            ..base.clone()
        };
        generation_rows(&m, point.size, new_tokens, Vec::new(), Vec::new()).to_vec()
    };
    // Device memory after the timed generations, as `measure` reads it.
    let device_memory = || match model.runner().engine() {
        Some(_) => model.runner().device_memory_in_use(),
        None => hal.and_then(|h| h.memory_in_use()),
    };
    let mut rows = match model {
        Model::Decoder(decoder) => {
            let (ids, mut config) = match crate::generation::decoder_request(
                decoder.as_ref(),
                point.size,
                new_tokens,
            ) {
                Ok(r) => r,
                Err(reason) => return failed(reason),
            };
            let decoding = &point.spec.decoding;
            config.sampling = decoding.sampling;
            config.repetition_penalty = decoding.repetition_penalty;
            config.seed = decoding.seed;
            if let Err(e) = config.validate() {
                return failed(e.to_string());
            }
            // A batch: the prompt rotated by one id per row (distinct rows, same length), decoded
            // together; the timings follow row 0 (every row gets a token each step).
            let vocab = decoder.config().vocab_size as u32;
            let prompts: Vec<Vec<u32>> = (0..point.batch as u32)
                .map(|r| {
                    ids.iter()
                        .map(|&t| 3 + (t - 3 + r) % (vocab - 3).max(1))
                        .collect()
                })
                .collect();
            let once = |on_token: &mut dyn FnMut(u32) -> std::ops::ControlFlow<()>| {
                let generated = if prompts.len() == 1 {
                    decoder.generate(&ids, &config, on_token)
                } else {
                    let configs = vec![config.clone(); prompts.len()];
                    decoder
                        .generate_each(&prompts, &configs, &mut |row, t| {
                            if row == 0 {
                                on_token(t)
                            } else {
                                std::ops::ControlFlow::Continue(())
                            }
                        })
                        .map(|mut rows| rows.swap_remove(0))
                };
                if decoding.show_tokens {
                    if let Ok(tokens) = &generated {
                        bar.suspend(|| eprintln!("tokens: {tokens:?}"));
                    }
                }
                generated
                    .map(|t| t.len())
                    .map_err(|e| format!("generate failed: {e}"))
            };
            crate::generation::measure_generation(&once, request).to_vec()
        }
        Model::Forward(_) if !point.spec.decoding.is_greedy() => failed(
            "sampling and the repetition penalty apply to decoder LMs (llama, qwen2, GGUF)".into(),
        ),
        Model::Forward(_) if point.batch != 1 => {
            failed("generation of this family runs batch 1 (decoder LMs take --batch)".into())
        }
        Model::Forward(runner) => {
            let plan = point.plan;
            // Generation inputs are made from the config at batch 1 (a fixture's may hold
            // several rows); a family without synthesized inputs uses its fixture's.
            let made = inputs::synthesize(&plan.family, &plan.config, 1, point.size);
            let inputs = match (made, &plan.fixture_inputs) {
                (Err(_), Some(fixture)) => Ok(fixture.clone()),
                (made, _) => made,
            };
            let inputs = match inputs {
                Ok(i) => i,
                Err(e) => return failed(e.to_string()),
            };
            let once = |on_token: &mut dyn FnMut(u32) -> std::ops::ControlFlow<()>| {
                runner
                    .generate_ids(&inputs, new_tokens, on_token)
                    .map(|t| t.len())
                    .map_err(|e| format!("generate failed: {e}"))
            };
            crate::generation::measure_generation(&once, request).to_vec()
        }
    };
    let memory = device_memory();
    for row in &mut rows {
        row.device_memory_bytes = memory;
    }
    rows
}

/// Loads the decoder LM of `plan` (a `.gguf` file or a checkpoint folder) on `backend` for
/// generation points: f32 compute, or `int8` / `int4` linear weights. The process's peak RSS is
/// reset first, so the generation rows' peak covers loading too (as a peer's process does).
fn load_decoder(plan: &ModelPlan, backend: BackendKind, dtype: &str) -> Loaded {
    // Random weights stored in a ggml block format (`q4_k`, ...: what a GGUF file of that type
    // holds), computed in f32.
    if let Some(ggml_type) = ggml_dtype(dtype) {
        if !plan.random_weights {
            return Err(format!(
                "{dtype} names random weights in that ggml format; a checkpoint or GGUF file \
                 runs as stored"
            ));
        }
        let config =
            std::fs::read_to_string(plan.dir.join("config.json")).map_err(|e| e.to_string())?;
        let (_temp, dir) =
            random_weight_dir(&config, Some(ggml_type)).map_err(|e| e.to_string())?;
        sysinfo::reset_peak_rss();
        let start = Instant::now();
        let decoder = ipfs_accelerate::text::load_decoder(&dir, backend, Precision::F32)
            .map_err(|e| format!("load failed: {e}"))?;
        return Ok((Model::Decoder(decoder), start.elapsed().as_secs_f64() * 1e3));
    }
    // The facade refuses the precisions generation does not compute in, with the reason.
    let (precision, quantization) = variant(dtype)?;
    sysinfo::reset_peak_rss();
    let start = Instant::now();
    // On cuda the cuBLAS decoder keeps int8 / int4 as ggml blocks from the load on; elsewhere
    // the loaded model is quantized.
    let mut decoder =
        ipfs_accelerate::text::load_decoder_quantized(&plan.dir, backend, precision, quantization)
            .map_err(|e| format!("load failed: {e}"))?;
    if quantization != ipfs_accelerate::WeightQuantization::None && backend != BackendKind::Cuda {
        decoder
            .quantize(quantization)
            .map_err(|e| format!("quantizing to {dtype} failed: {e}"))?;
    }
    Ok((Model::Decoder(decoder), start.elapsed().as_secs_f64() * 1e3))
}

/// The ggml block format a generation dtype names (`q4_k`, `q8_0`, ...), if it names one random
/// weights can be stored in.
fn ggml_dtype(dtype: &str) -> Option<&'static str> {
    ipfs_accelerate_io::RANDOM_GGML_TYPES
        .iter()
        .map(|t| t.name())
        .find(|name| name.eq_ignore_ascii_case(dtype))
}

/// Loads the model of `plan` on `backend` for the variant `dtype`: a compute precision (`f32`,
/// `f16`, `bf16`) or `int8` / `int4` (f32 compute, linear weights kept quantized as
/// `--quantize` does). Returns the runner and the load time in ms, or why it failed.
fn load_variant(plan: &ModelPlan, backend: BackendKind, dtype: &str) -> Loaded {
    let (precision, quantization) = variant(dtype)?;
    let start = Instant::now();
    let settings = ipfs_accelerate::weights::LoadSettings::default().quantize(quantization);
    let (loaded, _) = ipfs_accelerate::weights::load_scope(settings, || {
        ipfs_accelerate::conformance::load_family_in(&plan.family, &plan.dir, backend, precision)
    });
    loaded
        .map(|r| (Model::Forward(r), start.elapsed().as_secs_f64() * 1e3))
        .map_err(|e| format!("load failed: {e}"))
}

/// The compute precision and weight quantization of a variant name: `int8` / `int4` (f32
/// compute, quantized linear weights) or a precision (`f32`, `f16`, `bf16`).
fn variant(dtype: &str) -> Result<(Precision, ipfs_accelerate::WeightQuantization), String> {
    Ok(match dtype.parse::<ipfs_accelerate::WeightQuantization>() {
        Ok(q) if q != ipfs_accelerate::WeightQuantization::None => (Precision::F32, q),
        _ => (
            dtype.parse::<Precision>().map_err(|e| e.to_string())?,
            ipfs_accelerate::WeightQuantization::None,
        ),
    })
}

/// Warms up and times one grid point.
fn measure(
    point: &Point<'_>,
    runner: &dyn ModelRunner,
    hal: Option<&dyn ProbeBackend>,
    load_ms: f64,
    peak: Option<f64>,
    bar: &ProgressBar,
) -> Measurement {
    let spec = point.spec;
    let plan = point.plan;
    let mut m = point.empty(Status::Ok, None);
    m.load_ms = Some(load_ms);
    let inputs = match &plan.fixture_inputs {
        Some(fixture) => Ok(fixture.clone()),
        None => inputs::synthesize(&plan.family, &plan.config, point.batch, point.size),
    };
    let inputs = match inputs {
        Ok(i) => i,
        Err(e) => {
            m.status = Status::Failed;
            m.reason = Some(e.to_string());
            return m;
        }
    };
    // A runner on its own engine returns host outputs after its stream finished: nothing of the
    // backend's allocator to wait for.
    let own_engine = runner.engine().is_some();
    let sync = || hal.filter(|_| !own_engine).map(|h| h.synchronize());
    let rss_reset = sysinfo::reset_peak_rss();
    let iterate = |timed: bool| -> Result<Option<f64>, String> {
        let start = Instant::now();
        runner
            .run(&inputs)
            .map_err(|e| format!("run failed: {e}"))?;
        if let Some(Err(e)) = sync() {
            return Err(format!("synchronize failed: {e}"));
        }
        let ms = start.elapsed().as_secs_f64() * 1e3;
        bar.inc(1);
        Ok(timed.then_some(ms))
    };
    for _ in 0..spec.warmup {
        if interrupted() {
            break;
        }
        if let Err(reason) = iterate(false) {
            m.status = Status::Failed;
            m.reason = Some(reason);
            return m;
        }
    }
    for _ in 0..spec.iters {
        if interrupted() {
            m.status = Status::Interrupted;
            m.reason = Some("interrupted by Ctrl-C".into());
            break;
        }
        match iterate(true) {
            Ok(Some(ms)) => m.timings_ms.push(ms),
            Ok(None) => {}
            Err(reason) => {
                m.status = Status::Failed;
                m.reason = Some(reason);
                break;
            }
        }
    }
    m.iters_done = m.timings_ms.len() as u32;
    m.latency = stats::latency_stats(&m.timings_ms);
    if rss_reset {
        m.host_rss_peak_bytes = sysinfo::peak_rss_bytes();
    }
    m.device_memory_bytes = match runner.engine() {
        Some(_) => runner.device_memory_in_use(),
        None => hal.and_then(|h| h.memory_in_use()),
    };
    m.flops = flops::forward_flops(&plan.family, &plan.config, &inputs);
    if let Some(lat) = m.latency {
        let secs = lat.mean_ms / 1e3;
        m.items_per_s = Some(point.batch as f64 / secs);
        if point.shape_kind == "tokens" {
            m.tokens_per_s = Some((point.batch * point.size) as f64 / secs);
        }
        m.achieved_flops_per_s = m.flops.map(|f| f / secs);
        m.peak_flops_pct = m
            .achieved_flops_per_s
            .zip(peak)
            .map(|(achieved, peak)| 100.0 * achieved / peak);
    }
    m
}
