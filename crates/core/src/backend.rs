//! Backend kinds, device descriptions and the backend contract.

use std::fmt;
use std::str::FromStr;

use crate::Error;

/// ONNX Runtime execution providers (the graph backends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExecutionProvider {
    /// ONNX Runtime's own CPU provider.
    Cpu,
    /// Intel OpenVINO (CPU / GPU / NPU).
    OpenVino,
    /// NVIDIA CUDA.
    Cuda,
    /// NVIDIA TensorRT.
    TensorRt,
    /// AMD ROCm / MIGraphX.
    Rocm,
    /// Apple Core ML.
    CoreMl,
    /// Microsoft DirectML.
    DirectMl,
    /// WebGPU through ONNX Runtime.
    WebGpu,
}

impl ExecutionProvider {
    /// Every provider.
    pub const ALL: [ExecutionProvider; 8] = [
        ExecutionProvider::Cpu,
        ExecutionProvider::OpenVino,
        ExecutionProvider::Cuda,
        ExecutionProvider::TensorRt,
        ExecutionProvider::Rocm,
        ExecutionProvider::CoreMl,
        ExecutionProvider::DirectMl,
        ExecutionProvider::WebGpu,
    ];

    /// The lower-case name used on the command line (`onnx-<name>`).
    pub fn name(self) -> &'static str {
        match self {
            ExecutionProvider::Cpu => "cpu",
            ExecutionProvider::OpenVino => "openvino",
            ExecutionProvider::Cuda => "cuda",
            ExecutionProvider::TensorRt => "tensorrt",
            ExecutionProvider::Rocm => "rocm",
            ExecutionProvider::CoreMl => "coreml",
            ExecutionProvider::DirectMl => "directml",
            ExecutionProvider::WebGpu => "webgpu",
        }
    }
}

/// The WebNN device type a browser context is created for (`MLContextOptions.deviceType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WebNnDevice {
    /// The browser's CPU implementation.
    Cpu,
    /// The GPU.
    Gpu,
    /// A neural processing unit.
    Npu,
}

impl WebNnDevice {
    /// Every device type.
    pub const ALL: [WebNnDevice; 3] = [WebNnDevice::Cpu, WebNnDevice::Gpu, WebNnDevice::Npu];

    /// The WebNN name (`cpu`, `gpu`, `npu`).
    pub fn name(self) -> &'static str {
        match self {
            WebNnDevice::Cpu => "cpu",
            WebNnDevice::Gpu => "gpu",
            WebNnDevice::Npu => "npu",
        }
    }
}

/// The onnxruntime-web execution providers a headless browser runs (`BackendKind::Browser`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BrowserProvider {
    /// The browser's WebNN API on a device type (`webnn`, `webnn-gpu`, `webnn-npu`).
    WebNn(WebNnDevice),
    /// The browser's WebGPU (`webgpu-browser`).
    WebGpu,
    /// WebAssembly on the CPU (`wasm`).
    Wasm,
}

impl BrowserProvider {
    /// Every provider.
    pub const ALL: [BrowserProvider; 5] = [
        BrowserProvider::WebNn(WebNnDevice::Cpu),
        BrowserProvider::WebNn(WebNnDevice::Gpu),
        BrowserProvider::WebNn(WebNnDevice::Npu),
        BrowserProvider::WebGpu,
        BrowserProvider::Wasm,
    ];

    /// The name used on the command line.
    pub fn name(self) -> &'static str {
        match self {
            BrowserProvider::WebNn(WebNnDevice::Cpu) => "webnn",
            BrowserProvider::WebNn(WebNnDevice::Gpu) => "webnn-gpu",
            BrowserProvider::WebNn(WebNnDevice::Npu) => "webnn-npu",
            BrowserProvider::WebGpu => "webgpu-browser",
            BrowserProvider::Wasm => "wasm",
        }
    }
}

/// Every backend ipfs-accelerate knows about, compiled in or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum BackendKind {
    /// burn on the CPU (SIMD + threads).
    Cpu,
    /// burn's CUDA backend (NVIDIA).
    Cuda,
    /// burn's ROCm backend (AMD).
    Rocm,
    /// burn's Metal backend (Apple).
    Metal,
    /// burn's wgpu backend on the native graphics API (Vulkan / Metal / DX12).
    Wgpu,
    /// burn's wgpu backend restricted to the WebGPU feature set (the browser-compatible path).
    WebGpu,
    /// ONNX Runtime with an execution provider.
    Onnx(ExecutionProvider),
    /// onnxruntime-web in a headless browser, on one of its execution providers.
    Browser(BrowserProvider),
}

impl BackendKind {
    /// Every backend, in the default preference order (fastest first).
    pub fn all() -> Vec<BackendKind> {
        let mut v = vec![
            BackendKind::Cuda,
            BackendKind::Rocm,
            BackendKind::Metal,
            BackendKind::Wgpu,
            BackendKind::WebGpu,
        ];
        v.extend(ExecutionProvider::ALL.iter().map(|&p| BackendKind::Onnx(p)));
        v.extend(
            BrowserProvider::ALL
                .iter()
                .map(|&p| BackendKind::Browser(p)),
        );
        v.push(BackendKind::Cpu);
        v
    }

    /// The cargo feature that compiles this backend in.
    pub fn feature(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
            BackendKind::Rocm => "rocm",
            BackendKind::Metal => "metal",
            BackendKind::Wgpu => "wgpu",
            BackendKind::WebGpu => "webgpu",
            BackendKind::Onnx(ExecutionProvider::OpenVino) => "openvino",
            BackendKind::Onnx(_) => "onnx",
            BackendKind::Browser(_) => "webnn",
        }
    }

    /// Parses a comma-separated preference list such as `cuda,wgpu,cpu`.
    pub fn parse_list(list: &str) -> Result<Vec<BackendKind>, Error> {
        list.split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(BackendKind::from_str)
            .collect()
    }
}

impl fmt::Display for BackendKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BackendKind::Cpu => f.write_str("cpu"),
            BackendKind::Cuda => f.write_str("cuda"),
            BackendKind::Rocm => f.write_str("rocm"),
            BackendKind::Metal => f.write_str("metal"),
            BackendKind::Wgpu => f.write_str("wgpu"),
            BackendKind::WebGpu => f.write_str("webgpu"),
            BackendKind::Onnx(p) => write!(f, "onnx-{}", p.name()),
            BackendKind::Browser(p) => f.write_str(p.name()),
        }
    }
}

impl FromStr for BackendKind {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let lower = s.trim().to_ascii_lowercase();
        let kind = match lower.as_str() {
            "cpu" => BackendKind::Cpu,
            "cuda" => BackendKind::Cuda,
            "rocm" | "hip" => BackendKind::Rocm,
            "metal" | "mps" => BackendKind::Metal,
            "wgpu" | "vulkan" => BackendKind::Wgpu,
            "webgpu" => BackendKind::WebGpu,
            "webnn-cpu" => BackendKind::Browser(BrowserProvider::WebNn(WebNnDevice::Cpu)),
            "onnx" => BackendKind::Onnx(ExecutionProvider::Cpu),
            "openvino" => BackendKind::Onnx(ExecutionProvider::OpenVino),
            other => {
                let provider = other
                    .strip_prefix("onnx-")
                    .and_then(|p| ExecutionProvider::ALL.into_iter().find(|e| e.name() == p));
                let browser = BrowserProvider::ALL.into_iter().find(|p| p.name() == other);
                match (provider, browser) {
                    (Some(p), _) => BackendKind::Onnx(p),
                    (None, Some(b)) => BackendKind::Browser(b),
                    (None, None) => return Err(Error::UnknownBackend(s.to_string())),
                }
            }
        };
        Ok(kind)
    }
}

/// What a device can compute efficiently.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct Capabilities {
    /// Native half precision arithmetic.
    pub f16: bool,
    /// Native bfloat16 arithmetic.
    pub bf16: bool,
    /// Fast int8 dot products (VNNI, DP4A, ...).
    pub int8: bool,
    /// Free-form feature flags (`avx512f`, `amx_tile`, `sm_90`, ...).
    pub features: Vec<String>,
}

/// A probed device.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// The backend that found it.
    pub kind: BackendKind,
    /// Human-readable device name (CPU model, GPU name).
    pub name: String,
    /// Total memory in bytes, when known.
    pub memory_total: Option<u64>,
    /// Parallel compute units (CPU threads, GPU SMs / CUs), when known.
    pub compute_units: Option<u32>,
    /// What it supports.
    pub capabilities: Capabilities,
    /// Driver or runtime version, when known.
    pub driver: Option<String>,
}

/// The outcome of probing a backend.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub enum Availability {
    /// Usable: the device it will run on.
    Available(DeviceInfo),
    /// Compiled in, but this machine cannot run it.
    Unavailable(String),
    /// Not part of this build.
    NotCompiled,
}

impl Availability {
    /// The reason a backend cannot be used, or `None` if it can.
    pub fn reason(&self, kind: BackendKind) -> Option<String> {
        match self {
            Availability::Available(_) => None,
            Availability::Unavailable(r) => Some(format!("unavailable: {r}")),
            Availability::NotCompiled => Some(format!(
                "not compiled in (enable feature `{}`)",
                kind.feature()
            )),
        }
    }
}

/// The object-safe part of a backend: what selection, `devices` and metrics need.
pub trait ProbeBackend: Send + Sync {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;
    /// Looks for usable hardware. Must not panic or abort when drivers are missing.
    fn probe(&self) -> Availability;
    /// Waits until all queued work on the device has finished, so clocks read after it are honest.
    fn synchronize(&self) -> Result<(), Error>;
    /// Bytes of memory in use by this backend (device allocator, or process RSS on the CPU).
    fn memory_in_use(&self) -> Option<u64>;
}

/// The contract a backend crate implements: probing plus the burn device the models run on.
pub trait Backend: ProbeBackend + Clone + 'static {
    /// The burn backend type models are instantiated with.
    type Burn: burn::tensor::backend::Backend;
    /// The burn device to place tensors on.
    fn device(&self) -> burn::tensor::Device<Self::Burn>;
    /// Makes `precision` the float type of every tensor created on this backend's device from
    /// now on ([`set_device_precision`]): once per device and process.
    fn set_precision(&self, precision: Precision) -> Result<(), Error> {
        set_device_precision::<Self::Burn>(&self.device(), self.kind(), precision)
    }
    /// Whether this device's f32 matrix kernels round their inputs to a shorter mantissa (TF32
    /// tensor cores). The models then split their f32 products into exact parts
    /// (`ipfs_accelerate_nn::exact`) to compute what HF transformers computes in f32.
    fn rounds_f32_products(&self) -> bool {
        false
    }
}

/// The float type a model computes in. `F32` is the default everywhere; `F16` / `BF16` halve the
/// weight and activation memory where the device computes in them (CUDA, and wgpu adapters with
/// `SHADER_F16` for f16; burn-flex on the CPU computes both, without the CPU kernels' speed).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Precision {
    /// 32-bit floats.
    #[default]
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
}

impl Precision {
    /// The lower-case name (`f32`, `f16`, `bf16`).
    pub fn name(self) -> &'static str {
        match self {
            Precision::F32 => "f32",
            Precision::F16 => "f16",
            Precision::BF16 => "bf16",
        }
    }

    /// burn's float dtype of this precision.
    pub fn float_dtype(self) -> burn::tensor::FloatDType {
        match self {
            Precision::F32 => burn::tensor::FloatDType::F32,
            Precision::F16 => burn::tensor::FloatDType::F16,
            Precision::BF16 => burn::tensor::FloatDType::BF16,
        }
    }
}

impl fmt::Display for Precision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Precision {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "f32" | "fp32" | "float32" | "float" => Ok(Precision::F32),
            "f16" | "fp16" | "float16" | "half" => Ok(Precision::F16),
            "bf16" | "bfloat16" => Ok(Precision::BF16),
            other => Err(Error::InvalidInput(format!(
                "unknown precision `{other}` (known: f32, f16, bf16)"
            ))),
        }
    }
}

/// Makes `precision` the default float type of `device` (burn's per-device dtype policy): every
/// float tensor a model creates there (weights, masks, activations) is then of that type. burn
/// fixes a device's policy at its first tensor, so this is once per device and process: asking
/// for another precision afterwards is an error naming both, as is a precision the device does
/// not compute in. `F32` on a fresh device changes nothing (it is burn's default).
pub fn set_device_precision<B: burn::tensor::backend::Backend>(
    device: &B::Device,
    kind: BackendKind,
    precision: Precision,
) -> Result<(), Error> {
    use burn::tensor::{DType, Element};
    let wanted = precision.float_dtype();
    let unsupported = |reason: String| Error::BackendUnavailable {
        kind: kind.to_string(),
        reason,
    };
    if precision != Precision::F32 {
        if !B::supports_dtype(device, DType::from(wanted)) {
            return Err(unsupported(format!(
                "the device does not compute in {precision} (use f32)"
            )));
        }
        let int = <B::IntElem as Element>::dtype();
        if burn::tensor::set_default_dtypes::<B>(device, wanted, int).is_ok() {
            return Ok(());
        }
    }
    let current = burn::tensor::get_device_settings::<B>(device).float_dtype;
    if current == wanted {
        return Ok(());
    }
    Err(unsupported(format!(
        "the device already computes in {} in this process (its precision is fixed by its first \
         tensor); {precision} needs a new process",
        DType::from(current).name()
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_display_round_trip() {
        for kind in BackendKind::all() {
            let text = kind.to_string();
            assert_eq!(text.parse::<BackendKind>().unwrap(), kind, "{text}");
        }
        assert_eq!(
            BackendKind::parse_list("cuda, wgpu ,cpu").unwrap(),
            vec![BackendKind::Cuda, BackendKind::Wgpu, BackendKind::Cpu]
        );
        assert_eq!(
            "webgpu-browser".parse::<BackendKind>().unwrap(),
            BackendKind::Browser(BrowserProvider::WebGpu)
        );
        assert_eq!(
            "webnn-cpu".parse::<BackendKind>().unwrap(),
            BackendKind::Browser(BrowserProvider::WebNn(WebNnDevice::Cpu))
        );
        assert!(matches!(
            "tpu".parse::<BackendKind>(),
            Err(Error::UnknownBackend(_))
        ));
    }
}
