//! # ipfs-accelerate-backend-cuda
//!
//! NVIDIA GPUs through burn's CUDA backend (CubeCL kernels compiled at run time with NVRTC, kernel
//! fusion and autotuning on; fusion can be turned off, see [`CudaUnfusedBurn`]). Compiled kernels
//! and autotune results persist across processes
//! ([`ipfs_accelerate_cubecl::install_kernel_cache`]). Nothing CUDA is linked at build time: the probe opens the driver
//! library (`libcuda.so.1` / `nvcuda.dll`) with `libloading` and asks it for the devices, so a
//! binary built with the `cuda` feature starts, reports "unavailable: <reason>" and falls back on
//! a machine without an NVIDIA driver instead of aborting (candle's failure mode, #3900).

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::marker::PhantomData;

use ipfs_accelerate_core::{
    Availability, Backend, BackendKind, Capabilities, DeviceInfo, Error, ProbeBackend,
};
use ipfs_accelerate_cubecl::VendorLibrary;

/// The burn backend type the CUDA path runs on (f32 floats, i32 integers; kernels fused).
pub type CudaBurn = burn_cuda::Cuda<f32, i32>;

/// The same backend without kernel fusion: every tensor op launches its own kernel.
pub type CudaUnfusedBurn =
    burn_cubecl::CubeBackend<burn_cubecl::cubecl::cuda::CudaRuntime, f32, i32, u8>;

/// The CUDA backend on device `index`, running models on the burn backend `B` ([`CudaBurn`]:
/// fused, the default; or [`CudaUnfusedBurn`]).
#[derive(Debug, Clone, Copy)]
pub struct CudaBackend<B = CudaBurn> {
    /// Device ordinal.
    pub index: usize,
    burn: PhantomData<fn() -> B>,
}

impl Default for CudaBackend {
    fn default() -> Self {
        CudaBackend::new(0)
    }
}

impl CudaBackend {
    /// The fused backend on device `index`.
    pub fn new(index: usize) -> Self {
        CudaBackend {
            index,
            burn: PhantomData,
        }
    }
}

impl CudaBackend<CudaUnfusedBurn> {
    /// The backend without kernel fusion on device `index`.
    pub fn unfused(index: usize) -> Self {
        CudaBackend {
            index,
            burn: PhantomData,
        }
    }
}

/// The burn backend types [`CudaBackend`] runs on (fused and unfused CubeCL CUDA).
pub trait CudaBurnBackend: burn::tensor::backend::Backend<Device = burn_cuda::CudaDevice> {}
impl CudaBurnBackend for CudaBurn {}
impl CudaBurnBackend for CudaUnfusedBurn {}

#[cfg(target_os = "windows")]
const DRIVER_LIBRARIES: &[&str] = &["nvcuda.dll"];
#[cfg(not(target_os = "windows"))]
const DRIVER_LIBRARIES: &[&str] = &["libcuda.so.1", "libcuda.so"];

type CuResult = c_int;

/// What the driver reports about one device.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaDeviceReport {
    /// Device name.
    pub name: String,
    /// Total memory in bytes.
    pub memory_total: u64,
    /// Compute capability (major, minor).
    pub compute_capability: (i32, i32),
    /// Streaming multiprocessors.
    pub multiprocessors: i32,
    /// Driver version (e.g. 12040 for 12.4).
    pub driver_version: i32,
    /// Devices the driver sees.
    pub device_count: i32,
}

impl CudaDeviceReport {
    /// Whether the device has TF32 tensor cores (compute capability 8.0 and later), which CubeCL's
    /// f32 matmul and convolution kernels then use.
    pub fn has_tf32(&self) -> bool {
        self.compute_capability.0 >= 8
    }
}

/// Asks the driver library about device `index`: `Err` names what is missing (no library, no
/// device, an init error code) and never panics.
pub fn query_device(index: usize) -> Result<CudaDeviceReport, String> {
    let lib = VendorLibrary::open(DRIVER_LIBRARIES, "NVIDIA driver library", "CUDA")?;
    // SAFETY: the symbols are the driver API's documented functions with their C signatures.
    unsafe {
        let cu_init: extern "C" fn(c_uint) -> CuResult = lib.function(b"cuInit\0")?;
        let driver_version: extern "C" fn(*mut c_int) -> CuResult =
            lib.function(b"cuDriverGetVersion\0")?;
        let count: extern "C" fn(*mut c_int) -> CuResult = lib.function(b"cuDeviceGetCount\0")?;
        let get: extern "C" fn(*mut c_int, c_int) -> CuResult = lib.function(b"cuDeviceGet\0")?;
        let get_name: extern "C" fn(*mut c_char, c_int, c_int) -> CuResult =
            lib.function(b"cuDeviceGetName\0")?;
        let total_mem: extern "C" fn(*mut usize, c_int) -> CuResult =
            lib.function(b"cuDeviceTotalMem_v2\0")?;
        let attribute: extern "C" fn(*mut c_int, c_int, c_int) -> CuResult =
            lib.function(b"cuDeviceGetAttribute\0")?;
        let check = |call: &str, code: CuResult| lib.check(call, code);
        check("cuInit", cu_init(0))?;
        let mut version = 0;
        check("cuDriverGetVersion", driver_version(&mut version))?;
        let mut n = 0;
        check("cuDeviceGetCount", count(&mut n))?;
        if n <= 0 {
            return Err("the NVIDIA driver sees no CUDA device".into());
        }
        if index >= n as usize {
            return Err(format!("device {index} requested, the driver sees {n}"));
        }
        let mut dev = 0;
        check("cuDeviceGet", get(&mut dev, index as c_int))?;
        let mut name = [0 as c_char; 256];
        check("cuDeviceGetName", get_name(name.as_mut_ptr(), 256, dev))?;
        let mut bytes = 0usize;
        check("cuDeviceTotalMem", total_mem(&mut bytes, dev))?;
        let attr = |id: c_int| {
            let mut v = 0;
            check("cuDeviceGetAttribute", attribute(&mut v, id, dev)).map(|_| v)
        };
        // CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR / _MINOR / MULTIPROCESSOR_COUNT
        let (major, minor, sms) = (attr(75)?, attr(76)?, attr(16)?);
        Ok(CudaDeviceReport {
            name: CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned(),
            memory_total: bytes as u64,
            compute_capability: (major, minor),
            multiprocessors: sms,
            driver_version: version,
            device_count: n,
        })
    }
}

impl<B> CudaBackend<B> {
    /// The device report as a [`DeviceInfo`].
    pub fn device_info(&self) -> Result<DeviceInfo, String> {
        let r = query_device(self.index)?;
        let (major, minor) = r.compute_capability;
        let cc = major * 10 + minor;
        let mut features = vec![format!("sm_{major}{minor}")];
        if cc >= 70 {
            features.push("tensor-cores".into());
        }
        if r.has_tf32() {
            features.push("tf32".into());
        }
        Ok(DeviceInfo {
            kind: BackendKind::Cuda,
            name: r.name,
            memory_total: Some(r.memory_total),
            compute_units: Some(r.multiprocessors as u32),
            capabilities: Capabilities {
                f16: cc >= 53,
                bf16: cc >= 80,
                int8: cc >= 61,
                features,
            },
            driver: Some(format!(
                "CUDA driver {}.{}, {} device(s)",
                r.driver_version / 1000,
                (r.driver_version % 1000) / 10,
                r.device_count
            )),
        })
    }
}

impl<B: CudaBurnBackend> ProbeBackend for CudaBackend<B> {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn probe(&self) -> Availability {
        match self.device_info() {
            Ok(info) => Availability::Available(info),
            Err(reason) => Availability::Unavailable(reason),
        }
    }

    fn synchronize(&self) -> Result<(), Error> {
        B::sync(&self.device()).map_err(|e| Error::Compute(format!("CUDA synchronize: {e:?}")))
    }

    /// Bytes of live tensors in CubeCL's CUDA memory pool on this device (`bytes_in_use` of the
    /// runtime client's memory usage: padding and pooled-but-free pages are not counted). `None`
    /// when there is no usable device (the client is only created once the probe found one).
    fn memory_in_use(&self) -> Option<u64> {
        use burn_cubecl::cubecl::{cuda::CudaRuntime, Runtime};
        query_device(self.index).ok()?;
        ipfs_accelerate_cubecl::install_kernel_cache();
        let client = CudaRuntime::client(&burn_cuda::CudaDevice::new(self.index));
        client.memory_usage().ok().map(|usage| usage.bytes_in_use)
    }
}

impl<B: CudaBurnBackend> Backend for CudaBackend<B> {
    type Burn = B;

    fn device(&self) -> burn_cuda::CudaDevice {
        ipfs_accelerate_cubecl::install_kernel_cache();
        burn_cuda::CudaDevice::new(self.index)
    }

    /// CubeCL's CUDA matmul and convolution kernels run f32 through the tensor cores as TF32 on
    /// compute capability 8.0 and later (Ampere, Hopper, Blackwell).
    fn rounds_f32_products(&self) -> bool {
        query_device(self.index).is_ok_and(|r| r.has_tf32())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On any machine: the probe answers (available with a name, or unavailable with a reason)
    /// and never panics.
    #[test]
    fn probe_reports_without_panicking() {
        match CudaBackend::default().probe() {
            Availability::Available(info) => assert!(!info.name.is_empty()),
            Availability::Unavailable(reason) => assert!(!reason.is_empty()),
            Availability::NotCompiled => panic!("compiled in"),
        }
    }
}
