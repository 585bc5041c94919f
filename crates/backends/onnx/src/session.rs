//! One ONNX graph on one execution provider, run on named host tensors.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use ipfs_accelerate_core::{ExecutionProvider, HostTensor, TensorMap};
use ort::ep::ExecutionProviderDispatch;
use ort::session::builder::GraphOptimizationLevel;
use ort::session::Session;
use ort::value::{DynValue, Tensor, TensorElementType, ValueType};

use crate::{provider_name, OnnxBackend, OnnxError};

/// ONNX Runtime's graph optimisation level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GraphOptimization {
    /// No rewrites.
    Disable,
    /// Constant folding, redundant-node elimination.
    Basic,
    /// Plus node fusions.
    Extended,
    /// Everything, including layout changes (the default).
    #[default]
    All,
}

/// Options that matter when creating a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionOptions {
    /// Graph optimisation level.
    pub optimization: GraphOptimization,
    /// Threads inside one operator (`None`: ONNX Runtime's default, one per core).
    pub intra_threads: Option<usize>,
    /// OpenVINO device: `CPU`, `GPU`, `GPU.0`, `NPU`, `AUTO:GPU,CPU`, ...
    pub openvino_device: String,
    /// OpenVINO inference precision (`FP32`, `FP16`, `ACCURACY`); `None` keeps OpenVINO's default.
    pub openvino_precision: Option<String>,
    /// Where OpenVINO caches compiled blobs (`None`: no cache).
    pub openvino_cache_dir: Option<PathBuf>,
    /// Let ONNX Runtime run the nodes a provider does not take (typically shape arithmetic) on
    /// its CPU provider. On (the default) because OpenVINO leaves such nodes to the CPU even in
    /// graphs it runs; off, any such node makes loading fail. [`OnnxSession::node_placement`]
    /// reports where the nodes actually ran.
    pub allow_cpu_fallback: bool,
    /// Profile the session so [`OnnxSession::node_placement`] can report which provider ran
    /// each node (ONNX Runtime's profiler; off by default).
    pub profile: bool,
}

impl Default for SessionOptions {
    fn default() -> Self {
        SessionOptions {
            optimization: GraphOptimization::All,
            intra_threads: None,
            openvino_device: "CPU".into(),
            openvino_precision: Some("FP32".into()),
            openvino_cache_dir: None,
            allow_cpu_fallback: true,
            profile: false,
        }
    }
}

/// A loaded ONNX graph.
pub struct OnnxSession {
    session: Mutex<Session>,
    profile_dir: Option<tempfile::TempDir>,
    path: PathBuf,
    provider: ExecutionProvider,
    inputs: Vec<(String, Option<TensorElementType>)>,
    outputs: Vec<String>,
}

impl std::fmt::Debug for OnnxSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OnnxSession")
            .field("path", &self.path)
            .field("provider", &self.provider)
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .finish()
    }
}

fn runtime_err(context: impl Into<String>) -> impl FnOnce(ort::Error) -> OnnxError {
    let context = context.into();
    move |e| OnnxError::Runtime {
        context,
        reason: e.to_string(),
    }
}

fn builder_err<R>(context: &str) -> impl FnOnce(ort::Error<R>) -> OnnxError + '_ {
    move |e| OnnxError::Runtime {
        context: context.to_string(),
        reason: e.to_string(),
    }
}

fn dispatch(provider: ExecutionProvider, options: &SessionOptions) -> ExecutionProviderDispatch {
    use ort::ep;
    let d = match provider {
        ExecutionProvider::Cpu => ep::CPU::default().build(),
        ExecutionProvider::OpenVino => {
            let mut ov = ep::OpenVINO::default().with_device_type(&options.openvino_device);
            if let Some(p) = &options.openvino_precision {
                ov = ov.with_precision(p);
            }
            if let Some(dir) = &options.openvino_cache_dir {
                ov = ov.with_cache_dir(dir.display());
            }
            ov.build()
        }
        ExecutionProvider::Cuda => ep::CUDA::default().build(),
        ExecutionProvider::TensorRt => ep::TensorRT::default().build(),
        ExecutionProvider::Rocm => ep::MIGraphX::default().build(),
        ExecutionProvider::CoreMl => ep::CoreML::default().build(),
        ExecutionProvider::DirectMl => ep::DirectML::default().build(),
        ExecutionProvider::WebGpu => ep::WebGPU::default().build(),
    };
    d.error_on_failure()
}

impl OnnxSession {
    /// Loads the graph at `path` on `provider`.
    pub fn load(
        path: &Path,
        provider: ExecutionProvider,
        options: &SessionOptions,
    ) -> Result<Self, OnnxError> {
        let rt = OnnxBackend::new(provider).check()?;
        if !path.is_file() {
            return Err(OnnxError::Input(format!(
                "ONNX model {} does not exist",
                path.display()
            )));
        }
        let context = format!("loading {} on {}", path.display(), provider_name(provider));
        let level = match options.optimization {
            GraphOptimization::Disable => GraphOptimizationLevel::Disable,
            GraphOptimization::Basic => GraphOptimizationLevel::Level1,
            GraphOptimization::Extended => GraphOptimizationLevel::Level2,
            GraphOptimization::All => GraphOptimizationLevel::All,
        };
        let mut builder = Session::builder(rt.environment())
            .map_err(runtime_err(&context))?
            .with_optimization_level(level)
            .map_err(builder_err(&context))?;
        if let Some(n) = options.intra_threads {
            builder = builder
                .with_intra_threads(n)
                .map_err(builder_err(&context))?;
        }
        if provider != ExecutionProvider::Cpu && !options.allow_cpu_fallback {
            builder = builder
                .with_config_entry("session.disable_cpu_ep_fallback", "1")
                .map_err(builder_err(&context))?;
        }
        let profile_dir = if options.profile {
            let dir = tempfile::tempdir().map_err(|e| OnnxError::Runtime {
                context: context.clone(),
                reason: format!("creating a profiling folder: {e}"),
            })?;
            builder = builder
                .with_profiling(dir.path().join("profile"))
                .map_err(builder_err(&context))?;
            Some(dir)
        } else {
            None
        };
        let mut builder = builder
            .with_execution_providers([dispatch(provider, options)])
            .map_err(builder_err(&context))?;
        let session = builder
            .commit_from_file(path)
            .map_err(runtime_err(&context))?;
        let inputs = session
            .inputs()
            .iter()
            .map(|o| (o.name().to_string(), o.dtype().tensor_type()))
            .collect();
        let outputs = session
            .outputs()
            .iter()
            .map(|o| o.name().to_string())
            .collect();
        Ok(OnnxSession {
            session: Mutex::new(session),
            profile_dir,
            path: path.to_path_buf(),
            provider,
            inputs,
            outputs,
        })
    }

    /// The graph file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The execution provider the session was created with (registered with `error_on_failure`).
    pub fn provider(&self) -> ExecutionProvider {
        self.provider
    }

    /// The graph's input names.
    pub fn input_names(&self) -> Vec<&str> {
        self.inputs.iter().map(|(n, _)| n.as_str()).collect()
    }

    /// The graph's output names.
    pub fn output_names(&self) -> Vec<&str> {
        self.outputs.iter().map(String::as_str).collect()
    }

    /// Where the nodes of the runs so far executed: provider name → number of distinct nodes (an
    /// OpenVINO subgraph counts as one node), from ONNX Runtime's profiler. Needs
    /// [`SessionOptions::profile`] and at least one run; ends profiling.
    pub fn node_placement(&self) -> Result<BTreeMap<String, usize>, OnnxError> {
        if self.profile_dir.is_none() {
            return Err(OnnxError::Input(
                "node placement needs a session created with SessionOptions::profile".into(),
            ));
        }
        let context = format!("profiling {}", self.path.display());
        let file = self
            .session
            .lock()
            .map_err(|_| OnnxError::Input("session poisoned by an earlier panic".into()))?
            .end_profiling()
            .map_err(runtime_err(&context))?;
        let text = std::fs::read_to_string(&file).map_err(|e| OnnxError::Runtime {
            context: context.clone(),
            reason: format!("{file}: {e}"),
        })?;
        let _ = std::fs::remove_file(&file);
        let events: Vec<serde_json::Value> =
            serde_json::from_str(&text).map_err(|e| OnnxError::Runtime {
                context,
                reason: format!("{file}: {e}"),
            })?;
        let mut nodes: BTreeMap<String, std::collections::BTreeSet<String>> = BTreeMap::new();
        for e in &events {
            let (Some(name), Some(provider)) = (
                e.get("name").and_then(|n| n.as_str()),
                e.pointer("/args/provider").and_then(|p| p.as_str()),
            ) else {
                continue;
            };
            if e.get("cat").and_then(|c| c.as_str()) == Some("Node") {
                let node = name.trim_end_matches("_kernel_time").to_string();
                nodes.entry(provider.to_string()).or_default().insert(node);
            }
        }
        Ok(nodes.into_iter().map(|(p, n)| (p, n.len())).collect())
    }

    /// Runs the graph: each graph input is taken from `inputs` by name (converted to the graph's
    /// element type); every graph output comes back by name.
    pub fn run(&self, inputs: &TensorMap) -> Result<TensorMap, OnnxError> {
        let mut values: Vec<(String, DynValue)> = Vec::with_capacity(self.inputs.len());
        for (name, ty) in &self.inputs {
            let host = inputs.get(name).ok_or_else(|| {
                OnnxError::Input(format!(
                    "{} needs input `{name}` (given: {})",
                    self.path.display(),
                    inputs.keys().cloned().collect::<Vec<_>>().join(", ")
                ))
            })?;
            values.push((name.clone(), to_value(name, host, *ty)?));
        }
        let context = format!("running {}", self.path.display());
        let mut session = self
            .session
            .lock()
            .map_err(|_| OnnxError::Input("session poisoned by an earlier panic".into()))?;
        let outputs = session.run(values).map_err(runtime_err(&context))?;
        let mut out = TensorMap::new();
        for (name, value) in outputs.iter() {
            out.insert(name.to_string(), from_value(name, &value)?);
        }
        Ok(out)
    }
}

fn to_value(
    name: &str,
    host: &HostTensor,
    ty: Option<TensorElementType>,
) -> Result<DynValue, OnnxError> {
    let shape: Vec<i64> = host.shape().iter().map(|&d| d as i64).collect();
    let bad = |e: ipfs_accelerate_core::Error| OnnxError::Input(format!("input `{name}`: {e}"));
    let made = match ty {
        Some(TensorElementType::Int64) => {
            Tensor::from_array((shape, host.to_i64_vec().map_err(bad)?)).map(|t| t.into_dyn())
        }
        Some(TensorElementType::Int32) => {
            let v: Vec<i32> = host
                .to_i64_vec()
                .map_err(bad)?
                .into_iter()
                .map(|x| x as i32)
                .collect();
            Tensor::from_array((shape, v)).map(|t| t.into_dyn())
        }
        Some(TensorElementType::Bool) => {
            let v: Vec<bool> = host
                .to_i64_vec()
                .map_err(bad)?
                .into_iter()
                .map(|x| x != 0)
                .collect();
            Tensor::from_array((shape, v)).map(|t| t.into_dyn())
        }
        Some(TensorElementType::Float64) => {
            Tensor::from_array((shape, host.to_f64_vec())).map(|t| t.into_dyn())
        }
        Some(TensorElementType::Float32) | None => {
            if !host.dtype().is_float() {
                Tensor::from_array((
                    shape,
                    host.to_f64_vec()
                        .iter()
                        .map(|&x| x as f32)
                        .collect::<Vec<f32>>(),
                ))
                .map(|t| t.into_dyn())
            } else {
                Tensor::from_array((shape, host.to_f32_vec())).map(|t| t.into_dyn())
            }
        }
        Some(other) => {
            return Err(OnnxError::Input(format!(
                "input `{name}` has element type {other:?}, which is not supported"
            )))
        }
    };
    made.map_err(runtime_err(format!("creating input `{name}`")))
}

fn from_value(name: &str, value: &ort::value::DynValueRef<'_>) -> Result<HostTensor, OnnxError> {
    let context = format!("reading output `{name}`");
    let ty = match value.dtype() {
        ValueType::Tensor { ty, .. } => *ty,
        other => {
            return Err(OnnxError::Input(format!(
                "output `{name}` is {other:?}, not a tensor"
            )))
        }
    };
    let wrap = |r: ipfs_accelerate_core::Result<HostTensor>| {
        r.map_err(|e| OnnxError::Input(format!("output `{name}`: {e}")))
    };
    let dims = |s: &ort::value::Shape| s.iter().map(|&d| d.max(0) as usize).collect::<Vec<_>>();
    match ty {
        TensorElementType::Float32 => {
            let (s, v) = value
                .try_extract_tensor::<f32>()
                .map_err(runtime_err(&context))?;
            wrap(HostTensor::from_f32(dims(s), v))
        }
        TensorElementType::Float64 => {
            let (s, v) = value
                .try_extract_tensor::<f64>()
                .map_err(runtime_err(&context))?;
            wrap(HostTensor::from_f64(dims(s), v))
        }
        TensorElementType::Int64 => {
            let (s, v) = value
                .try_extract_tensor::<i64>()
                .map_err(runtime_err(&context))?;
            wrap(HostTensor::from_i64(dims(s), v))
        }
        TensorElementType::Int32 => {
            let (s, v) = value
                .try_extract_tensor::<i32>()
                .map_err(runtime_err(&context))?;
            let v: Vec<i64> = v.iter().map(|&x| i64::from(x)).collect();
            wrap(HostTensor::from_i64(dims(s), &v))
        }
        TensorElementType::Bool => {
            let (s, v) = value
                .try_extract_tensor::<bool>()
                .map_err(runtime_err(&context))?;
            let v: Vec<i64> = v.iter().map(|&x| i64::from(x)).collect();
            wrap(HostTensor::from_i64(dims(s), &v))
        }
        other => Err(OnnxError::Input(format!(
            "output `{name}` has element type {other:?}, which is not supported"
        ))),
    }
}
