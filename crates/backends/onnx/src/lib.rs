//! # ipfs-accelerate-backend-onnx
//!
//! The graph backend: ONNX exports of the families run on ONNX Runtime through the `ort` crate, with
//! one of its execution providers (CPU, OpenVINO, CUDA, TensorRT, ROCm / MIGraphX, CoreML, DirectML,
//! WebGPU) — `BackendKind::Onnx(provider)`.
//!
//! ONNX Runtime is loaded at run time (`ort`'s `load-dynamic`), never linked or downloaded at build
//! time. The library is looked up in this order (see [`library_path`]):
//! 1. `ORT_DYLIB_PATH` — the exact file (e.g. `.../libonnxruntime.so.1.31.1`);
//! 2. `IPFS_ACCELERATE_ORT_DIR`, then `~/.cache/ipfs-accelerate/onnxruntime` (`$XDG_CACHE_HOME`
//!    honoured) — the folder `cargo xtask fetch-ort [--openvino]` fills from the PyPI wheels
//!    (`openvino/` is preferred over `cpu/` because the OpenVINO build of the runtime also has the
//!    CPU provider).
//!
//! One runtime is loaded per process (ONNX Runtime's API is process-global), so every ONNX kind in a
//! process shares it. Providers register with `error_on_failure`, so a provider that cannot be set
//! up is an error, never a silent run on the CPU; with [`SessionOptions::allow_cpu_fallback`]
//! turned off, so is a graph with any node the provider does not take.

mod openvino;
mod runtime;
mod session;

pub use openvino::{openvino_report, OpenVinoReport};
pub use runtime::{default_dir, library_path, runtime, OnnxRuntime, ORT_DIR_ENV};
pub use session::{GraphOptimization, OnnxSession, SessionOptions};

use ipfs_accelerate_core::{
    Availability, BackendKind, Capabilities, DeviceInfo, Error, ExecutionProvider, ProbeBackend,
};

/// Errors of the ONNX backend.
#[derive(Debug, thiserror::Error)]
pub enum OnnxError {
    /// No ONNX Runtime library was found.
    #[error("ONNX Runtime library not found ({searched}); run `cargo xtask fetch-ort` (add `--openvino` for the OpenVINO provider) or set ORT_DYLIB_PATH to libonnxruntime.so.<version> from the PyPI `onnxruntime` / `onnxruntime-openvino` wheel")]
    LibraryNotFound {
        /// What was searched.
        searched: String,
    },
    /// The library exists but cannot be used (not ONNX Runtime, too old, wrong architecture).
    #[error("cannot load ONNX Runtime from {path}: {reason}. This build needs ONNX Runtime >= 1.24 (PyPI `onnxruntime` >= 1.24 or `onnxruntime-openvino` 1.24.x)")]
    BadLibrary {
        /// The library file.
        path: String,
        /// What went wrong.
        reason: String,
    },
    /// The execution provider is not part of the loaded runtime.
    #[error("execution provider {provider} is not in the loaded ONNX Runtime ({library}; it has: {available}){hint}")]
    ProviderMissing {
        /// The provider.
        provider: String,
        /// The runtime library.
        library: String,
        /// Providers the runtime has.
        available: String,
        /// What to install.
        hint: String,
    },
    /// Creating or running a session failed.
    #[error("ONNX Runtime {context}: {reason}")]
    Runtime {
        /// What was being done (with the model path).
        context: String,
        /// ONNX Runtime's message.
        reason: String,
    },
    /// The inputs do not fit the graph.
    #[error("{0}")]
    Input(String),
}

impl From<OnnxError> for Error {
    fn from(e: OnnxError) -> Self {
        match e {
            OnnxError::Input(m) => Error::InvalidInput(m),
            OnnxError::LibraryNotFound { .. }
            | OnnxError::BadLibrary { .. }
            | OnnxError::ProviderMissing { .. } => Error::BackendUnavailable {
                kind: "onnx".into(),
                reason: e.to_string(),
            },
            other => Error::Compute(other.to_string()),
        }
    }
}

/// ONNX Runtime's name of an execution provider.
pub fn provider_name(provider: ExecutionProvider) -> &'static str {
    match provider {
        ExecutionProvider::Cpu => "CPUExecutionProvider",
        ExecutionProvider::OpenVino => "OpenVINOExecutionProvider",
        ExecutionProvider::Cuda => "CUDAExecutionProvider",
        ExecutionProvider::TensorRt => "TensorrtExecutionProvider",
        ExecutionProvider::Rocm => "MIGraphXExecutionProvider",
        ExecutionProvider::CoreMl => "CoreMLExecutionProvider",
        ExecutionProvider::DirectMl => "DmlExecutionProvider",
        ExecutionProvider::WebGpu => "WebGpuExecutionProvider",
    }
}

/// What to install for a provider that the loaded runtime lacks.
fn provider_hint(provider: ExecutionProvider) -> &'static str {
    match provider {
        ExecutionProvider::OpenVino => {
            "; run `cargo xtask fetch-ort --openvino` (PyPI onnxruntime-openvino)"
        }
        ExecutionProvider::Cuda | ExecutionProvider::TensorRt => {
            "; use the onnxruntime-gpu wheel's library"
        }
        ExecutionProvider::Rocm => "; use an onnxruntime-migraphx / ROCm build",
        ExecutionProvider::CoreMl => "; CoreML exists only in macOS builds",
        ExecutionProvider::DirectMl => "; use the onnxruntime-directml wheel on Windows",
        _ => "",
    }
}

/// One ONNX Runtime execution provider as a probe-able backend.
#[derive(Debug, Clone, Copy)]
pub struct OnnxBackend {
    provider: ExecutionProvider,
}

impl OnnxBackend {
    /// The backend for `provider`.
    pub fn new(provider: ExecutionProvider) -> Self {
        OnnxBackend { provider }
    }

    /// Every provider kind this crate knows.
    pub fn all() -> Vec<OnnxBackend> {
        [
            ExecutionProvider::Cpu,
            ExecutionProvider::OpenVino,
            ExecutionProvider::Cuda,
            ExecutionProvider::TensorRt,
            ExecutionProvider::Rocm,
            ExecutionProvider::CoreMl,
            ExecutionProvider::DirectMl,
            ExecutionProvider::WebGpu,
        ]
        .into_iter()
        .map(OnnxBackend::new)
        .collect()
    }

    /// The provider.
    pub fn provider(&self) -> ExecutionProvider {
        self.provider
    }

    /// Loads the runtime and checks the provider is part of it.
    pub fn check(&self) -> Result<&'static OnnxRuntime, OnnxError> {
        let rt = runtime()?;
        let name = provider_name(self.provider);
        if !rt.providers().iter().any(|p| p == name) {
            return Err(OnnxError::ProviderMissing {
                provider: name.into(),
                library: rt.library().display().to_string(),
                available: rt.providers().join(", "),
                hint: provider_hint(self.provider).into(),
            });
        }
        Ok(rt)
    }
}

impl ProbeBackend for OnnxBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Onnx(self.provider)
    }

    fn probe(&self) -> Availability {
        let rt = match self.check() {
            Ok(rt) => rt,
            Err(e) => return Availability::Unavailable(e.to_string()),
        };
        let mut name = format!(
            "ONNX Runtime {} ({})",
            rt.version(),
            provider_name(self.provider)
        );
        let mut features = vec![format!("library={}", rt.library().display())];
        if self.provider == ExecutionProvider::OpenVino {
            match openvino_report(rt.library()) {
                Ok(report) => {
                    name = format!("{name}: OpenVINO {}", report.version);
                    features.extend(
                        report
                            .devices
                            .iter()
                            .map(|(dev, full)| format!("openvino:{dev}={full}")),
                    );
                }
                Err(reason) => {
                    return Availability::Unavailable(format!(
                        "OpenVINO provider present but OpenVINO reports no devices: {reason}"
                    ))
                }
            }
        }
        Availability::Available(DeviceInfo {
            kind: self.kind(),
            name,
            memory_total: None,
            compute_units: std::thread::available_parallelism()
                .ok()
                .map(|n| n.get() as u32),
            capabilities: Capabilities {
                f16: false,
                bf16: false,
                int8: true,
                features,
            },
            driver: Some(format!("onnxruntime {}", rt.version())),
        })
    }

    fn synchronize(&self) -> Result<(), Error> {
        // Session::run returns when the outputs are on the host.
        Ok(())
    }

    fn memory_in_use(&self) -> Option<u64> {
        let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
        let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
        Some(pages * 4096)
    }
}
