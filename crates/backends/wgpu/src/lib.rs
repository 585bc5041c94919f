//! # ipfs-accelerate-backend-wgpu
//!
//! GPUs (and software Vulkan drivers) through burn's wgpu backend: CubeCL kernels compiled at run
//! time, with kernel fusion (unless turned off: [`WgpuUnfusedBurn`]) and autotuning on; compiled
//! kernels and autotune results persist across processes
//! ([`ipfs_accelerate_cubecl::install_kernel_cache`]). On Vulkan adapters (Linux, Windows, Android) the
//! kernels are SPIR-V (burn-wgpu's `vulkan` feature); on every other wgpu API (Metal, DX12, GL, the
//! browser's WebGPU in a wasm build) they are WGSL, the portable WebGPU path. burn picks the
//! graphics API per OS (`AutoGraphicsApi`: Metal on macOS, the browser's WebGPU on wasm, Vulkan
//! elsewhere), and the probe looks at exactly that API, so what it reports is what runs.
//!
//! The probe enumerates the adapters with the same `wgpu` crate burn-wgpu uses and never panics:
//! no Vulkan loader, no driver (ICD) or no device gives `unavailable: no WebGPU adapter: <why>`.
//! Discrete GPUs are preferred, then integrated, then virtual, then CPU adapters (lavapipe /
//! SwiftShader: real software drivers, reported as such, e.g.
//! `llvmpipe (LLVM 15.0.6, 256 bits) [Vulkan, cpu]`).
//!
//! Both [`BackendKind::Wgpu`] and [`BackendKind::WebGpu`] map to this backend: native builds run
//! both on the same adapter with the same kernels (there is one wgpu runtime per device in a
//! process), `webgpu` naming the WebGPU API that the wasm build of the same code uses in a browser.
//!
//! ```no_run
//! use ipfs_accelerate_backend_wgpu::WgpuBackend;
//! use ipfs_accelerate_core::{Availability, ProbeBackend};
//!
//! let backend = WgpuBackend::default();
//! match backend.probe() {
//!     Availability::Available(info) => println!("running on {}", info.name),
//!     other => println!("{:?}", other.reason(backend.kind())),
//! }
//! ```

use std::future::Future;
use std::marker::PhantomData;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};

use burn_wgpu::graphics::{AutoGraphicsApi, GraphicsApi};
use cubecl::Runtime;
use ipfs_accelerate_core::{
    Availability, Backend, BackendKind, Capabilities, DeviceInfo, Error, ProbeBackend,
};

pub use burn_wgpu::WgpuDevice;

/// The burn backend type the wgpu path runs on (f32 floats, i32 integers, u32 booleans; fused).
pub type WgpuBurn = burn_wgpu::Wgpu<f32, i32>;

/// The same backend without kernel fusion: every tensor op launches its own kernel.
pub type WgpuUnfusedBurn = burn_wgpu::CubeBackend<burn_wgpu::WgpuRuntime, f32, i32, u32>;

/// The burn backend types [`WgpuBackend`] runs on (fused and unfused CubeCL wgpu).
pub trait WgpuBurnBackend: burn::tensor::backend::Backend<Device = WgpuDevice> {}
impl WgpuBurnBackend for WgpuBurn {}
impl WgpuBurnBackend for WgpuUnfusedBurn {}

/// The limits of an adapter that bound what the kernels may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AdapterLimits {
    /// Largest buffer in bytes.
    pub max_buffer_size: u64,
    /// Largest storage-buffer binding in bytes.
    pub max_storage_buffer_binding_size: u64,
    /// Storage buffers one compute shader may bind.
    pub max_storage_buffers_per_shader_stage: u32,
    /// Workgroup (shared) memory in bytes.
    pub max_compute_workgroup_storage_size: u32,
    /// Invocations in one workgroup.
    pub max_compute_invocations_per_workgroup: u32,
}

/// What wgpu reports about one adapter, and the burn device that runs on it.
#[derive(Debug, Clone, PartialEq)]
pub struct AdapterReport {
    /// Adapter name as the driver gives it.
    pub name: String,
    /// PCI vendor id (or a Khronos vendor id such as 0x10005 for Mesa).
    pub vendor: u32,
    /// PCI device id.
    pub device_id: u32,
    /// Discrete, integrated, virtual, CPU or other.
    pub device_type: wgpu::DeviceType,
    /// The graphics API (Vulkan, Metal, DX12, GL, browser WebGPU).
    pub api: wgpu::Backend,
    /// Driver name.
    pub driver: String,
    /// Driver version / details.
    pub driver_info: String,
    /// `Features::SHADER_F16`: half precision in shaders.
    pub shader_f16: bool,
    /// `Features::SUBGROUP`: subgroup (warp) operations.
    pub subgroups: bool,
    /// Limits that matter to compute kernels.
    pub limits: AdapterLimits,
    /// The burn device that selects this adapter.
    pub device: WgpuDevice,
}

impl AdapterReport {
    /// `name [API, type]`, e.g. `llvmpipe (LLVM 15.0.6, 256 bits) [Vulkan, cpu]`.
    pub fn display_name(&self) -> String {
        format!(
            "{} [{}, {}]",
            self.name,
            api_name(self.api),
            device_type_name(self.device_type)
        )
    }

    /// Whether the adapter is a software driver running on the CPU.
    pub fn is_cpu(&self) -> bool {
        self.device_type == wgpu::DeviceType::Cpu
    }

    /// The kernel language burn uses on this adapter.
    pub fn shader_language(&self) -> &'static str {
        if self.api == wgpu::Backend::Vulkan {
            "spirv"
        } else if self.api == wgpu::Backend::Metal && cfg!(feature = "metal") {
            "msl"
        } else {
            "wgsl"
        }
    }

    /// The report as a [`DeviceInfo`] of backend `kind`.
    pub fn device_info(&self, kind: BackendKind) -> DeviceInfo {
        let l = &self.limits;
        let mut features = vec![
            api_name(self.api).to_ascii_lowercase(),
            self.shader_language().to_string(),
        ];
        if self.shader_f16 {
            features.push("shader-f16".into());
        }
        if self.subgroups {
            features.push("subgroups".into());
        }
        features.push(format!("max_buffer_size={}", l.max_buffer_size));
        features.push(format!(
            "max_storage_buffer_binding_size={}",
            l.max_storage_buffer_binding_size
        ));
        features.push(format!(
            "max_storage_buffers_per_shader_stage={}",
            l.max_storage_buffers_per_shader_stage
        ));
        features.push(format!(
            "max_compute_workgroup_storage_size={}",
            l.max_compute_workgroup_storage_size
        ));
        features.push(format!(
            "max_compute_invocations_per_workgroup={}",
            l.max_compute_invocations_per_workgroup
        ));
        let driver = [self.driver.as_str(), self.driver_info.as_str()]
            .iter()
            .filter(|s| !s.is_empty())
            .copied()
            .collect::<Vec<_>>()
            .join(" ");
        DeviceInfo {
            kind,
            name: self.display_name(),
            // wgpu does not report the device memory size.
            memory_total: None,
            compute_units: None,
            capabilities: Capabilities {
                f16: self.shader_f16,
                // burn-wgpu has no bf16 arithmetic, nor int8 dot products.
                bf16: false,
                int8: false,
                features,
            },
            driver: Some(format!(
                "{}{}vendor {} (0x{:04x}), wgpu 29",
                driver,
                if driver.is_empty() { "" } else { ", " },
                vendor_name(self.vendor),
                self.vendor
            )),
        }
    }
}

/// The graphics API burn's wgpu runtime uses on this platform (`AutoGraphicsApi`).
pub fn graphics_api() -> wgpu::Backend {
    AutoGraphicsApi::backend()
}

/// Enumerates the adapters of the APIs in `backends`, in wgpu's order, each with the burn device
/// that selects it. Never panics: a panic inside wgpu or the driver becomes `Err`.
pub fn enumerate_adapters(backends: wgpu::Backends) -> Result<Vec<AdapterReport>, String> {
    std::panic::catch_unwind(|| {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
            backends,
            ..wgpu::InstanceDescriptor::new_without_display_handle()
        });
        let adapters = block_on(instance.enumerate_adapters(backends));
        let mut seen = [0usize; 3]; // discrete, integrated, virtual: burn indexes within a type
        adapters
            .iter()
            .map(|adapter| {
                let info = adapter.get_info();
                let limits = adapter.limits();
                let features = adapter.features();
                let mut nth = |slot: usize| {
                    seen[slot] += 1;
                    seen[slot] - 1
                };
                let device = match info.device_type {
                    wgpu::DeviceType::DiscreteGpu => WgpuDevice::DiscreteGpu(nth(0)),
                    wgpu::DeviceType::IntegratedGpu => WgpuDevice::IntegratedGpu(nth(1)),
                    wgpu::DeviceType::VirtualGpu => WgpuDevice::VirtualGpu(nth(2)),
                    // burn selects the first CPU adapter; others go through its default choice
                    wgpu::DeviceType::Cpu => WgpuDevice::Cpu,
                    wgpu::DeviceType::Other => WgpuDevice::DefaultDevice,
                };
                AdapterReport {
                    name: info.name,
                    vendor: info.vendor,
                    device_id: info.device,
                    device_type: info.device_type,
                    api: info.backend,
                    driver: info.driver,
                    driver_info: info.driver_info,
                    shader_f16: features.contains(wgpu::Features::SHADER_F16),
                    subgroups: features.contains(wgpu::Features::SUBGROUP),
                    limits: AdapterLimits {
                        max_buffer_size: limits.max_buffer_size,
                        max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
                        max_storage_buffers_per_shader_stage: limits
                            .max_storage_buffers_per_shader_stage,
                        max_compute_workgroup_storage_size: limits
                            .max_compute_workgroup_storage_size,
                        max_compute_invocations_per_workgroup: limits
                            .max_compute_invocations_per_workgroup,
                    },
                    device,
                }
            })
            .collect()
    })
    .map_err(|panic| {
        let msg = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "unknown panic".into());
        format!("wgpu panicked while enumerating adapters: {msg}")
    })
}

/// Preference rank of a device type: discrete GPU, integrated, virtual, other, CPU.
fn rank(device_type: wgpu::DeviceType) -> u8 {
    match device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    }
}

/// Picks the adapter burn will run on from `adapters`: the first of the best device type.
pub fn choose_adapter(adapters: &[AdapterReport]) -> Option<&AdapterReport> {
    // `min_by_key` keeps the first of equal keys: wgpu's order within a type, as burn indexes it.
    adapters.iter().min_by_key(|a| rank(a.device_type))
}

/// The adapter this process runs on, probed once: `Err` says why there is none.
pub fn chosen_adapter() -> Result<&'static AdapterReport, String> {
    static CHOSEN: OnceLock<Result<AdapterReport, String>> = OnceLock::new();
    CHOSEN
        .get_or_init(|| {
            let api = graphics_api();
            let adapters = enumerate_adapters(api.into())?;
            choose_adapter(&adapters)
                .cloned()
                .ok_or_else(|| no_adapter_reason(api))
        })
        .as_ref()
        .map_err(|e| format!("no WebGPU adapter: {e}"))
}

/// Why wgpu found no adapter of `api`, as precisely as can be told from outside.
fn no_adapter_reason(api: wgpu::Backend) -> String {
    if api == wgpu::Backend::Vulkan {
        #[cfg(target_os = "windows")]
        const LOADERS: &[&str] = &["vulkan-1.dll"];
        #[cfg(not(target_os = "windows"))]
        const LOADERS: &[&str] = &["libvulkan.so.1", "libvulkan.so"];
        // SAFETY: the Vulkan loader is a plain shared library whose initialisers only read the
        // environment; wgpu itself loads it the same way.
        let loader = LOADERS
            .iter()
            .any(|name| unsafe { libloading::Library::new(name) }.is_ok());
        if !loader {
            return format!(
                "the Vulkan loader ({}) is not installed (Debian: libvulkan1, plus a driver such \
                 as mesa-vulkan-drivers)",
                LOADERS.join(" / ")
            );
        }
        return "the Vulkan loader found no device: no Vulkan driver (ICD) is installed or usable \
                (GPU driver, or Mesa's lavapipe: mesa-vulkan-drivers)"
            .into();
    }
    format!("wgpu found no {} adapter", api_name(api))
}

/// Drives a future that wgpu completes without an event loop (native adapter enumeration).
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let mut cx = Context::from_waker(Waker::noop());
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        std::thread::yield_now();
    }
}

/// The graphics API's display name.
pub fn api_name(api: wgpu::Backend) -> &'static str {
    match api {
        wgpu::Backend::Vulkan => "Vulkan",
        wgpu::Backend::Metal => "Metal",
        wgpu::Backend::Dx12 => "DX12",
        wgpu::Backend::Gl => "GL",
        wgpu::Backend::BrowserWebGpu => "WebGPU",
        wgpu::Backend::Noop => "noop",
    }
}

/// The device type's short name.
fn device_type_name(device_type: wgpu::DeviceType) -> &'static str {
    match device_type {
        wgpu::DeviceType::DiscreteGpu => "discrete GPU",
        wgpu::DeviceType::IntegratedGpu => "integrated GPU",
        wgpu::DeviceType::VirtualGpu => "virtual GPU",
        wgpu::DeviceType::Cpu => "cpu",
        wgpu::DeviceType::Other => "other",
    }
}

/// Well-known vendor ids (PCI, and Khronos ids for drivers without one).
fn vendor_name(vendor: u32) -> &'static str {
    match vendor {
        0x10de => "NVIDIA",
        0x1002 | 0x1022 => "AMD",
        0x8086 => "Intel",
        0x106b => "Apple",
        0x13b5 => "ARM",
        0x5143 => "Qualcomm",
        0x1010 => "Imagination",
        0x1414 => "Microsoft",
        0x1ae0 => "Google",
        0x10005 => "Mesa",
        _ => "unknown",
    }
}

/// The wgpu backend, as [`BackendKind::Wgpu`] or [`BackendKind::WebGpu`], on the adapter the probe
/// chooses, running models on the burn backend `B` ([`WgpuBurn`]: fused, the default; or
/// [`WgpuUnfusedBurn`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WgpuBackend<B = WgpuBurn> {
    kind: BackendKind,
    burn: PhantomData<fn() -> B>,
}

impl Default for WgpuBackend {
    fn default() -> Self {
        WgpuBackend::new(BackendKind::Wgpu)
    }
}

/// `kind` as a wgpu kind: [`BackendKind::WebGpu`] and [`BackendKind::Metal`] stay, anything else
/// is `Wgpu`.
fn wgpu_kind(kind: BackendKind) -> BackendKind {
    match kind {
        BackendKind::WebGpu | BackendKind::Metal => kind,
        _ => BackendKind::Wgpu,
    }
}

impl WgpuBackend {
    /// The fused backend under `kind`: [`BackendKind::Wgpu`] or [`BackendKind::WebGpu`] (any
    /// other kind is taken as `Wgpu`).
    pub fn new(kind: BackendKind) -> Self {
        WgpuBackend {
            kind: wgpu_kind(kind),
            burn: PhantomData,
        }
    }
}

impl WgpuBackend<WgpuUnfusedBurn> {
    /// The backend without kernel fusion under `kind` (as [`WgpuBackend::new`]).
    pub fn unfused(kind: BackendKind) -> Self {
        WgpuBackend {
            kind: wgpu_kind(kind),
            burn: PhantomData,
        }
    }
}

impl<B> WgpuBackend<B> {
    /// The adapter it runs on, or why there is none.
    /// As [`BackendKind::Metal`], only a Metal adapter qualifies (Apple platforms; the kernels are
    /// MSL when the crate's `metal` feature is on, WGSL otherwise).
    pub fn adapter(&self) -> Result<&'static AdapterReport, String> {
        let adapter = chosen_adapter()?;
        if self.kind == BackendKind::Metal && adapter.api != wgpu::Backend::Metal {
            return Err(format!(
                "no Metal adapter: Metal runs on Apple platforms (macOS, iOS) and this is {}; \
                 the adapter here is {}",
                std::env::consts::OS,
                adapter.display_name()
            ));
        }
        Ok(adapter)
    }

    fn unavailable(&self, reason: String) -> Error {
        Error::BackendUnavailable {
            kind: self.kind.to_string(),
            reason,
        }
    }
}

impl<B: WgpuBurnBackend> ProbeBackend for WgpuBackend<B> {
    fn kind(&self) -> BackendKind {
        self.kind
    }

    fn probe(&self) -> Availability {
        match self.adapter() {
            Ok(adapter) => Availability::Available(adapter.device_info(self.kind)),
            Err(reason) => Availability::Unavailable(reason),
        }
    }

    fn synchronize(&self) -> Result<(), Error> {
        // Without an adapter burn would panic creating the device: say why instead.
        self.adapter().map_err(|e| self.unavailable(e))?;
        B::sync(&self.device()).map_err(|e| Error::Compute(format!("wgpu synchronize: {e:?}")))
    }

    /// Bytes the CubeCL memory pools have reserved on the device (allocated pages, in use or free
    /// for reuse) for this thread's stream.
    fn memory_in_use(&self) -> Option<u64> {
        self.adapter().ok()?;
        ipfs_accelerate_cubecl::install_kernel_cache();
        burn_wgpu::WgpuRuntime::client(&self.device())
            .memory_usage()
            .ok()
            .map(|usage| usage.bytes_reserved)
    }
}

impl<B: WgpuBurnBackend> Backend for WgpuBackend<B> {
    type Burn = B;

    fn device(&self) -> WgpuDevice {
        ipfs_accelerate_cubecl::install_kernel_cache();
        self.adapter()
            .map(|a| a.device.clone())
            .unwrap_or(WgpuDevice::DefaultDevice)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(device_type: wgpu::DeviceType, name: &str) -> AdapterReport {
        AdapterReport {
            name: name.into(),
            vendor: 0x10005,
            device_id: 0,
            device_type,
            api: wgpu::Backend::Vulkan,
            driver: "llvmpipe".into(),
            driver_info: "Mesa".into(),
            shader_f16: true,
            subgroups: false,
            limits: AdapterLimits {
                max_buffer_size: 1 << 30,
                max_storage_buffer_binding_size: 1 << 27,
                max_storage_buffers_per_shader_stage: 8,
                max_compute_workgroup_storage_size: 16384,
                max_compute_invocations_per_workgroup: 256,
            },
            device: WgpuDevice::Cpu,
        }
    }

    #[test]
    fn prefers_discrete_then_integrated_then_cpu() {
        let cpu = report(wgpu::DeviceType::Cpu, "llvmpipe");
        let igpu = report(wgpu::DeviceType::IntegratedGpu, "igpu");
        let dgpu = report(wgpu::DeviceType::DiscreteGpu, "dgpu");
        let dgpu2 = report(wgpu::DeviceType::DiscreteGpu, "dgpu2");
        let all = [cpu.clone(), igpu.clone(), dgpu.clone(), dgpu2];
        assert_eq!(choose_adapter(&all).map(|a| a.name.as_str()), Some("dgpu"));
        let no_discrete = [cpu.clone(), igpu];
        assert_eq!(
            choose_adapter(&no_discrete).map(|a| a.name.as_str()),
            Some("igpu")
        );
        assert_eq!(
            choose_adapter(std::slice::from_ref(&cpu)).map(|a| a.name.as_str()),
            Some("llvmpipe")
        );
        assert!(choose_adapter(&[]).is_none());
    }

    #[test]
    fn cpu_adapters_are_named_as_software() {
        let info = report(wgpu::DeviceType::Cpu, "llvmpipe (LLVM 15.0.6, 256 bits)")
            .device_info(BackendKind::Wgpu);
        assert_eq!(info.name, "llvmpipe (LLVM 15.0.6, 256 bits) [Vulkan, cpu]");
        assert!(info.capabilities.f16);
        assert!(info.capabilities.features.iter().any(|f| f == "spirv"));
        assert_eq!(
            info.driver.as_deref(),
            Some("llvmpipe Mesa, vendor Mesa (0x10005), wgpu 29")
        );
    }

    #[test]
    fn kinds_map_to_wgpu_or_webgpu() {
        assert_eq!(WgpuBackend::default().kind(), BackendKind::Wgpu);
        assert_eq!(
            WgpuBackend::new(BackendKind::WebGpu).kind(),
            BackendKind::WebGpu
        );
        assert_eq!(WgpuBackend::new(BackendKind::Cpu).kind(), BackendKind::Wgpu);
        assert_eq!(
            WgpuBackend::new(BackendKind::Metal).kind(),
            BackendKind::Metal
        );
    }

    /// Off Apple platforms the Metal kind is unavailable with the reason, never a panic.
    #[cfg(not(target_vendor = "apple"))]
    #[test]
    fn metal_is_unavailable_off_apple() {
        match WgpuBackend::new(BackendKind::Metal).probe() {
            Availability::Unavailable(reason) => assert!(
                reason.contains("Metal") || reason.contains("adapter"),
                "{reason}"
            ),
            other => panic!("Metal on a non-Apple machine: {other:?}"),
        }
    }
}
