//! Peers measured in the same run as ours (`bench --peer torch,ort,llamacpp`): after each of our
//! measurements, the peer runs the same family, config, shape, thread count and device through
//! `tools/peer_bench.py` (embedded in this crate, run by the Python of `cargo xtask fetch-peers`)
//! or, for llama.cpp on a GGUF file, `tools/llamacpp_bench.mjs` (Node.js with npm's
//! `node-llama-cpp`, also installed by `fetch-peers`), and its rows are stored beside ours under
//! their own [`Measurement::engine`]. Generation points (`--new`) give the peer the same prompt
//! token ids and new-token count. A peer that
//! cannot run (package missing, no device, family not covered) is recorded as `unavailable` with
//! the reason; nothing is estimated.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Deserialize;

use crate::record::{Measurement, Status};
use crate::{stats, BenchError};

/// The peer script, written to a temporary file for each invocation of the interpreter.
const SCRIPT: &str = include_str!("../../../tools/peer_bench.py");

/// Overrides the Python interpreter that runs the peers.
pub const PYTHON_ENV: &str = "IPFS_ACCELERATE_PEER_PYTHON";
/// Overrides the folder of the peers' venv (`venv/`) and ONNX export cache (`onnx/`).
pub const PEERS_DIR_ENV: &str = "IPFS_ACCELERATE_PEERS_DIR";

/// A peer engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerEngine {
    /// PyTorch eager through transformers, its inputs and outputs kept on the device.
    Torch,
    /// PyTorch eager as [`PeerEngine::Torch`], each call from host inputs to host outputs as
    /// ours runs: the inputs copied to the device, every output tensor copied back.
    TorchHost,
    /// ONNX Runtime on an ONNX export of the same model.
    OnnxRuntime,
    /// llama.cpp (npm `node-llama-cpp`'s prebuilt binaries) generating from the same GGUF file.
    LlamaCpp,
}

impl PeerEngine {
    /// The engine name stored in the database and passed to the script.
    pub fn name(self) -> &'static str {
        match self {
            PeerEngine::Torch => "torch",
            PeerEngine::TorchHost => "torch-host",
            PeerEngine::OnnxRuntime => "onnxruntime",
            PeerEngine::LlamaCpp => "llama.cpp",
        }
    }

    /// The precisions measured when the peer is named without any (`torch` → f32, bf16;
    /// `ort` → f32, int8).
    pub fn default_dtypes(self) -> &'static [&'static str] {
        match self {
            PeerEngine::Torch | PeerEngine::TorchHost => &["f32", "bf16"],
            PeerEngine::OnnxRuntime => &["f32", "int8"],
            PeerEngine::LlamaCpp => &["gguf"],
        }
    }

    /// The precisions the peer knows.
    fn known_dtypes(self) -> &'static [&'static str] {
        match self {
            PeerEngine::Torch | PeerEngine::TorchHost => &["f32", "bf16", "f16"],
            PeerEngine::OnnxRuntime => &["f32", "int8"],
            PeerEngine::LlamaCpp => &["gguf"],
        }
    }
}

/// A peer and the precisions to measure it in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    /// The engine.
    pub engine: PeerEngine,
    /// Precisions (`f32`, `bf16`, `f16`, `int8`; `gguf`: the blocks of the GGUF file, its rows
    /// labelled like ours).
    pub dtypes: Vec<String>,
}

/// The peer names `--peer` accepts.
pub const PEER_NAMES: &str =
    "torch (or pytorch), torch-host, ort (or onnxruntime), llamacpp (or llama.cpp)";

impl std::str::FromStr for Peer {
    type Err = BenchError;

    /// `torch`, `ort`, or with precisions: `torch:f32+bf16`, `ort:int8`.
    fn from_str(text: &str) -> Result<Peer, BenchError> {
        let (name, dtypes) = match text.split_once(':') {
            Some((n, d)) => (n, Some(d)),
            None => (text, None),
        };
        let engine = match name.trim().to_ascii_lowercase().as_str() {
            "torch" | "pytorch" => PeerEngine::Torch,
            "torch-host" | "pytorch-host" => PeerEngine::TorchHost,
            "ort" | "onnxruntime" | "onnx-runtime" => PeerEngine::OnnxRuntime,
            "llamacpp" | "llama.cpp" | "llama-cpp" => PeerEngine::LlamaCpp,
            other => {
                return Err(BenchError::Spec(format!(
                    "unknown peer `{other}`: the peers are {PEER_NAMES}"
                )))
            }
        };
        let dtypes: Vec<String> = match dtypes {
            None => engine
                .default_dtypes()
                .iter()
                .map(|d| d.to_string())
                .collect(),
            Some(list) => list
                .split('+')
                .map(|d| match d.trim() {
                    "fp32" => "f32".to_string(),
                    "fp16" => "f16".to_string(),
                    other => other.to_string(),
                })
                .collect(),
        };
        if let Some(bad) = dtypes
            .iter()
            .find(|d| !engine.known_dtypes().contains(&d.as_str()))
        {
            return Err(BenchError::Spec(format!(
                "peer `{}` has no precision `{bad}` (it runs {})",
                engine.name(),
                engine.known_dtypes().join(", ")
            )));
        }
        Ok(Peer { engine, dtypes })
    }
}

/// Parses a `--peer` list (`torch,ort:int8`).
pub fn parse_peers(names: &[String]) -> Result<Vec<Peer>, BenchError> {
    names
        .iter()
        .filter(|n| !n.trim().is_empty())
        .map(|n| n.parse())
        .collect()
}

/// The folder of the peers' venv and export cache: `$IPFS_ACCELERATE_PEERS_DIR`, else `peers/`
/// in the Cargo target folder this binary was built into (`target/peers`, where `cargo xtask
/// fetch-peers` installs them).
pub fn peers_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(PEERS_DIR_ENV) {
        return PathBuf::from(dir);
    }
    // target/<profile>/<binary> (or target/<profile>/deps/<test binary>).
    let exe = std::env::current_exe().ok();
    let target = exe.as_deref().and_then(|exe| {
        exe.ancestors()
            .skip(1)
            .take(3)
            .find(|dir| dir.join("CACHEDIR.TAG").is_file())
            .map(Path::to_path_buf)
    });
    target
        .unwrap_or_else(|| PathBuf::from("target"))
        .join("peers")
}

/// The interpreter that runs the peers: `$IPFS_ACCELERATE_PEER_PYTHON`, the venv of
/// [`peers_dir`], else `python3` from `PATH`.
pub fn python() -> PathBuf {
    if let Some(p) = std::env::var_os(PYTHON_ENV) {
        return PathBuf::from(p);
    }
    let venv = peers_dir().join("venv").join("bin").join("python");
    if venv.is_file() {
        venv
    } else {
        PathBuf::from("python3")
    }
}

/// One grid point for the peers, as ours ran it.
#[derive(Debug, Clone)]
pub struct PeerPoint<'a> {
    /// Our measurement of the point (its run, family, model, backend, shape and round are copied).
    pub ours: &'a Measurement,
    /// The model's config.json.
    pub config_file: &'a Path,
    /// A checkpoint folder (or `.gguf` file) whose real weights the peer loads (`None`: random
    /// weights of the config).
    pub model_dir: Option<&'a Path>,
    /// New tokens per generation for a generation point (`bench --new`); `None`: a forward pass.
    pub new_tokens: Option<usize>,
    /// The vocabulary size our prompt ids were drawn from, for a GGUF file (a peer on the same
    /// file gets the same ids, [`crate::generation::prompt_ids`]).
    pub vocab: Option<usize>,
    /// Threads our backend ran on.
    pub threads: u32,
    /// The peer's device (`cpu`, `cuda`), or why the backend has no peer device.
    pub device: Result<&'static str, String>,
    /// Untimed iterations.
    pub warmup: usize,
    /// Timed iterations.
    pub iters: usize,
    /// The interpreter ([`python`]).
    pub python: PathBuf,
}

/// The peer device of one of our backends: `cpu` for the CPU backends, `cuda` for CUDA.
pub fn peer_device(backend: &str) -> Result<&'static str, String> {
    let base = backend.split('/').next().unwrap_or(backend);
    match base {
        "cpu" | "onnx-cpu" => Ok("cpu"),
        "cuda" | "onnx-cuda" => Ok("cuda"),
        other => Err(format!(
            "no peer device for backend `{other}` (peers run on cpu and cuda)"
        )),
    }
}

/// One line the script prints.
#[derive(Debug, Deserialize)]
struct PeerLine {
    version: Option<String>,
    dtype: String,
    status: String,
    reason: Option<String>,
    #[serde(default)]
    timings_ms: Vec<f64>,
    peak_rss_bytes: Option<u64>,
    /// Generation: time to the first new token of each timed iteration, in ms.
    #[serde(default)]
    ttft_ms: Vec<f64>,
    /// Generation: ms per new token after the first, per timed iteration.
    #[serde(default)]
    decode_ms: Vec<f64>,
    /// Generation: loading the model, in ms.
    load_ms: Option<f64>,
}

/// Runs `peer` on `point`: one measurement per precision of the peer, in order. Failures of the
/// interpreter or the script become `unavailable` / `failed` rows with the reason.
pub fn run_peer(peer: &Peer, point: &PeerPoint<'_>) -> Vec<Measurement> {
    let ours = point.ours;
    let row = |dtype: &str, status: Status, reason: Option<String>| Measurement {
        run_id: ours.run_id.clone(),
        family: ours.family.clone(),
        model: ours.model.clone(),
        backend: ours.backend.clone(),
        dtype: dtype.to_string(),
        batch: ours.batch,
        seq: ours.seq,
        shape_kind: ours.shape_kind.clone(),
        warmup: point.warmup as u32,
        iters_asked: point.iters as u32,
        status,
        reason,
        engine: peer.engine.name().to_string(),
        round: ours.round,
        ..Default::default()
    };
    // A llama.cpp row is labelled with our precision (the GGUF file's block type).
    let label = |dtype: &str| -> String {
        match peer.engine {
            PeerEngine::LlamaCpp => ours.dtype.clone(),
            _ => dtype.to_string(),
        }
    };
    // Generation points are two rows (prefill, decode) per precision.
    let rows_of = |m: Measurement, ttft: Vec<f64>, decode: Vec<f64>| -> Vec<Measurement> {
        match point.new_tokens {
            Some(new) => {
                crate::generation::generation_rows(&m, ours.seq as usize, new, ttft, decode)
                    .to_vec()
            }
            None => vec![m],
        }
    };
    let all = |status: Status, reason: String| -> Vec<Measurement> {
        peer.dtypes
            .iter()
            .flat_map(|d| {
                rows_of(
                    row(&label(d), status, Some(reason.clone())),
                    Vec::new(),
                    Vec::new(),
                )
            })
            .collect()
    };
    let device = match &point.device {
        Ok(d) => *d,
        Err(reason) => return all(Status::Unavailable, reason.clone()),
    };
    if let Some(reason) = unsupported(peer.engine, point) {
        return all(Status::Unavailable, reason);
    }
    let invoked = match peer.engine {
        PeerEngine::LlamaCpp => invoke_llamacpp(point, device),
        _ => invoke(peer, point, device),
    };
    let output = match invoked {
        Ok(o) => o,
        Err(reason) => return all(Status::Unavailable, reason),
    };
    let mut lines: Vec<PeerLine> = Vec::new();
    for line in output.lines().filter(|l| l.trim_start().starts_with('{')) {
        if let Ok(parsed) = serde_json::from_str::<PeerLine>(line) {
            lines.push(parsed);
        }
    }
    peer.dtypes
        .iter()
        .flat_map(|dtype| {
            let Some(line) = lines.iter().find(|l| &l.dtype == dtype) else {
                return rows_of(
                    row(
                        &label(dtype),
                        Status::Failed,
                        Some(format!(
                            "the peer script printed no result for {dtype}; its output ended: {}",
                            tail(&output, 400)
                        )),
                    ),
                    Vec::new(),
                    Vec::new(),
                );
            };
            let status = Status::parse(&line.status).unwrap_or(Status::Failed);
            let mut m = row(&label(dtype), status, line.reason.clone());
            m.engine_version = line.version.clone();
            if point.new_tokens.is_some() {
                m.load_ms = line.load_ms;
                m.host_rss_peak_bytes = line.peak_rss_bytes;
                return rows_of(m, line.ttft_ms.clone(), line.decode_ms.clone());
            }
            m.timings_ms = line.timings_ms.clone();
            m.iters_done = m.timings_ms.len() as u32;
            m.latency = stats::latency_stats(&m.timings_ms);
            m.host_rss_peak_bytes = line.peak_rss_bytes;
            if let Some(lat) = m.latency {
                let secs = lat.mean_ms / 1e3;
                m.items_per_s = Some(f64::from(m.batch) / secs);
                if m.shape_kind == "tokens" {
                    m.tokens_per_s = Some(f64::from(m.batch) * f64::from(m.seq) / secs);
                }
                m.flops = ours.flops;
                m.achieved_flops_per_s = ours.flops.map(|f| f / secs);
            }
            vec![m]
        })
        .collect()
}

/// Why `engine` cannot measure `point` at all, when it cannot.
fn unsupported(engine: PeerEngine, point: &PeerPoint<'_>) -> Option<String> {
    let gguf = point.model_dir.is_some_and(|p| {
        p.extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    });
    match engine {
        PeerEngine::LlamaCpp if !gguf => Some(
            "llama.cpp generates from GGUF files: benchmark a .gguf model to compare with it"
                .into(),
        ),
        PeerEngine::LlamaCpp if point.device != Ok("cpu") => {
            Some("the llama.cpp peer runs node-llama-cpp's CPU binaries (0 GPU layers)".into())
        }
        PeerEngine::Torch | PeerEngine::TorchHost | PeerEngine::OnnxRuntime if gguf => {
            Some(format!(
            "{} runs checkpoint folders, not GGUF files (compare a GGUF file with --peer llamacpp)",
            engine.name()
        ))
        }
        PeerEngine::OnnxRuntime if point.new_tokens.is_some() => Some(
            "the ONNX Runtime peer times forward passes of an export; generation is not exported"
                .into(),
        ),
        _ => None,
    }
}

/// The llama.cpp peer script, written to a temporary file for each invocation of Node.js.
const LLAMACPP_SCRIPT: &str = include_str!("../../../tools/llamacpp_bench.mjs");

/// Overrides the folder whose `node_modules` holds `node-llama-cpp` (default:
/// `<peers dir>/llamacpp`, where `cargo xtask fetch-peers --only llamacpp` installs it).
pub const NODE_LLAMA_CPP_ENV: &str = "NODE_LLAMA_CPP_DIR";

/// The folder holding `node_modules/node-llama-cpp`.
pub fn node_llama_cpp_dir() -> PathBuf {
    std::env::var_os(NODE_LLAMA_CPP_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| peers_dir().join("llamacpp"))
}

/// Runs `tools/llamacpp_bench.mjs` on the point's GGUF file with our prompt ids; its stdout.
fn invoke_llamacpp(point: &PeerPoint<'_>, _device: &str) -> Result<String, String> {
    let dir = node_llama_cpp_dir();
    if !dir.join("node_modules").join("node-llama-cpp").is_dir() {
        return Err(format!(
            "node-llama-cpp is not installed in {}: run `cargo xtask fetch-peers --only llamacpp` \
             (npm install node-llama-cpp) or set {NODE_LLAMA_CPP_ENV}",
            dir.display()
        ));
    }
    let (Some(model), Some(new)) = (point.model_dir, point.new_tokens) else {
        return Err("llama.cpp is measured on generation points of a GGUF file".into());
    };
    if point.ours.batch != 1 {
        return Err("the llama.cpp peer script generates one sequence (batch 1)".into());
    }
    let vocab = point.vocab.ok_or_else(|| {
        format!(
            "{}: no tokenizer.ggml.tokens to size the prompt",
            model.display()
        )
    })?;
    let ids = crate::generation::prompt_ids(point.ours.seq as usize, vocab);
    let ids: Vec<String> = ids.iter().map(u32::to_string).collect();
    let script = script_file("llamacpp_bench", ".mjs", LLAMACPP_SCRIPT)?;
    let out = Command::new("node")
        .arg(script.path())
        .arg(model)
        .args(["--threads", &point.threads.to_string()])
        .args(["--max-new-tokens", &new.to_string()])
        .args(["--prompt-ids", &ids.join(",")])
        .args(["--warmup", &point.warmup.to_string()])
        .args(["--iters", &point.iters.to_string()])
        .env(NODE_LLAMA_CPP_ENV, &dir)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped())
        .output()
        .map_err(|e| format!("cannot run Node.js (`node`) for the llama.cpp peer: {e}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() && !stdout.contains('{') {
        return Err(format!(
            "the llama.cpp script exited with {}: {}",
            out.status,
            tail(&String::from_utf8_lossy(&out.stderr), 400)
        ));
    }
    Ok(stdout)
}

/// The last `n` characters of `text`, on one line.
fn tail(text: &str, n: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    let start = flat
        .char_indices()
        .rev()
        .nth(n.saturating_sub(1))
        .map_or(0, |(i, _)| i);
    flat[start..].to_string()
}

/// A peer script written to a temporary file (removed when dropped).
fn script_file(prefix: &str, suffix: &str, text: &str) -> Result<tempfile::NamedTempFile, String> {
    let cannot = |e: std::io::Error| {
        format!("cannot write the peer script {prefix}{suffix} to a temporary file: {e}")
    };
    let mut file = tempfile::Builder::new()
        .prefix(prefix)
        .suffix(suffix)
        .tempfile()
        .map_err(cannot)?;
    file.write_all(text.as_bytes()).map_err(cannot)?;
    Ok(file)
}

/// Runs the script; its stdout, or why the interpreter could not run it.
fn invoke(peer: &Peer, point: &PeerPoint<'_>, device: &str) -> Result<String, String> {
    let python = &point.python;
    let script = script_file("peer_bench", ".py", SCRIPT)?;
    let ours = point.ours;
    let mut cmd = Command::new(python);
    cmd.arg(script.path())
        .args(["--engine", peer.engine.name(), "--family", &ours.family])
        .arg("--config")
        .arg(point.config_file)
        .args(["--batch", &ours.batch.to_string()])
        .args(["--seq", &ours.seq.to_string()])
        .args(["--dtype", &peer.dtypes.join(",")])
        .args(["--threads", &point.threads.to_string()])
        .args(["--device", device])
        .args(["--warmup", &point.warmup.to_string()])
        .args(["--iters", &point.iters.to_string()])
        .arg("--cache-dir")
        .arg(peers_dir().join("onnx"))
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .stdout(Stdio::piped());
    if let Some(dir) = point.model_dir {
        cmd.arg("--model-dir").arg(dir);
    }
    if let Some(new) = point.new_tokens {
        cmd.args(["--new", &new.to_string()]);
    }
    let out = cmd.output().map_err(|e| {
        format!(
            "cannot run the peers' Python `{}`: {e}; run `cargo xtask fetch-peers` or set {PYTHON_ENV}",
            python.display()
        )
    })?;
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() && !stdout.contains('{') {
        return Err(format!(
            "the peer script exited with {} under `{}`: {}",
            out.status,
            python.display(),
            tail(&String::from_utf8_lossy(&out.stderr), 400)
        ));
    }
    Ok(stdout)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peer_names_and_precisions() {
        let names = ["torch", "ort:int8", "pytorch:fp32+bf16", "torch-host:f16"].map(String::from);
        let peers = parse_peers(&names).unwrap();
        assert_eq!(peers[0].engine, PeerEngine::Torch);
        assert_eq!(peers[0].dtypes, ["f32", "bf16"]);
        assert_eq!(peers[1].engine, PeerEngine::OnnxRuntime);
        assert_eq!(peers[1].dtypes, ["int8"]);
        assert_eq!(peers[2].dtypes, ["f32", "bf16"]);
        assert_eq!(peers[3].engine, PeerEngine::TorchHost);
        assert_eq!(
            (peers[3].engine.name(), &peers[3].dtypes[..]),
            ("torch-host", &["f16".to_string()][..])
        );
        let e = "llamacpx".parse::<Peer>().unwrap_err().to_string();
        assert!(
            e.contains("unknown peer `llamacpx`") && e.contains("torch"),
            "{e}"
        );
        let e = "ort:bf16".parse::<Peer>().unwrap_err().to_string();
        assert!(e.contains("no precision `bf16`"), "{e}");
    }

    #[test]
    fn devices_of_backends() {
        assert_eq!(peer_device("cpu"), Ok("cpu"));
        assert_eq!(peer_device("cuda/cublas"), Ok("cuda"));
        assert!(peer_device("wgpu").unwrap_err().contains("no peer device"));
    }

    #[test]
    fn a_missing_interpreter_is_unavailable_with_the_reason() {
        let ours = Measurement {
            run_id: "r".into(),
            family: "bert".into(),
            model: "minilm-l6".into(),
            backend: "cpu".into(),
            dtype: "f32".into(),
            batch: 1,
            seq: 8,
            shape_kind: "tokens".into(),
            ..Default::default()
        };
        let point = PeerPoint {
            ours: &ours,
            config_file: Path::new("/nonexistent/config.json"),
            model_dir: None,
            new_tokens: None,
            vocab: None,
            threads: 1,
            device: Ok("cpu"),
            warmup: 0,
            iters: 1,
            python: PathBuf::from("/nonexistent/python-for-peer-test"),
        };
        let peer: Peer = "torch".parse().unwrap();
        let rows = run_peer(&peer, &point);
        assert_eq!(rows.len(), 2);
        for r in &rows {
            assert_eq!(r.status, Status::Unavailable);
            assert_eq!(r.engine, "torch");
            assert!(r.latency.is_none() && r.timings_ms.is_empty());
            assert!(
                r.reason.as_deref().unwrap_or("").contains("fetch-peers"),
                "{r:?}"
            );
        }
    }
}
