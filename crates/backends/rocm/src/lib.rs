//! # ipfs-accelerate-backend-rocm
//!
//! AMD GPUs through burn's ROCm backend (CubeCL kernels compiled at run time with HIPRTC, kernel
//! fusion and autotuning on; compiled kernels and autotune results persist across processes, see
//! [`ipfs_accelerate_cubecl::install_kernel_cache`]). Nothing HIP is linked at build time: the
//! probe opens the HIP runtime library (`libamdhip64.so`) with `libloading` and asks it for the
//! devices, so a binary built with the `rocm` feature starts, reports "unavailable: <reason>" and
//! falls back on a machine without ROCm.

use std::ffi::{c_char, c_int, c_uint, CStr};
use std::marker::PhantomData;

use ipfs_accelerate_core::{
    Availability, Backend, BackendKind, Capabilities, DeviceInfo, Error, ProbeBackend,
};
use ipfs_accelerate_cubecl::VendorLibrary;

/// The burn backend type the ROCm path runs on (f32 floats, i32 integers; kernels fused).
pub type RocmBurn = burn_rocm::Rocm<f32, i32>;

/// The same backend without kernel fusion.
pub type RocmUnfusedBurn =
    burn_cubecl::CubeBackend<burn_cubecl::cubecl::hip::HipRuntime, f32, i32, u8>;

/// The burn backend types [`RocmBackend`] runs on (fused and unfused CubeCL HIP).
pub trait RocmBurnBackend: burn::tensor::backend::Backend<Device = burn_rocm::RocmDevice> {}
impl RocmBurnBackend for RocmBurn {}
impl RocmBurnBackend for RocmUnfusedBurn {}

/// The ROCm backend on device `index`, running models on the burn backend `B` ([`RocmBurn`]:
/// fused, the default; or [`RocmUnfusedBurn`]).
#[derive(Debug, Clone, Copy)]
pub struct RocmBackend<B = RocmBurn> {
    /// Device ordinal.
    pub index: usize,
    burn: PhantomData<fn() -> B>,
}

impl Default for RocmBackend {
    fn default() -> Self {
        RocmBackend::new(0)
    }
}

impl RocmBackend {
    /// The fused backend on device `index`.
    pub fn new(index: usize) -> Self {
        RocmBackend {
            index,
            burn: PhantomData,
        }
    }
}

impl RocmBackend<RocmUnfusedBurn> {
    /// The backend without kernel fusion on device `index`.
    pub fn unfused(index: usize) -> Self {
        RocmBackend {
            index,
            burn: PhantomData,
        }
    }
}

#[cfg(target_os = "windows")]
const HIP_LIBRARIES: &[&str] = &["amdhip64_6.dll", "amdhip64.dll"];
#[cfg(not(target_os = "windows"))]
const HIP_LIBRARIES: &[&str] = &["libamdhip64.so", "libamdhip64.so.6", "libamdhip64.so.7"];

/// What the HIP runtime reports about one device.
#[derive(Debug, Clone, PartialEq)]
pub struct RocmDeviceReport {
    /// Device name (e.g. `AMD Instinct MI300X`).
    pub name: String,
    /// Total memory in bytes.
    pub memory_total: u64,
    /// HIP runtime version (e.g. 60342134).
    pub runtime_version: i32,
    /// Devices the runtime sees.
    pub device_count: i32,
}

/// Asks the HIP runtime library about device `index`: `Err` names what is missing (no library,
/// no device, an error code) and never panics.
pub fn query_device(index: usize) -> Result<RocmDeviceReport, String> {
    let lib = VendorLibrary::open(HIP_LIBRARIES, "ROCm HIP runtime", "HIP")?;
    // SAFETY: the symbols are the HIP runtime's documented functions with their C signatures.
    unsafe {
        let hip_init: extern "C" fn(c_uint) -> c_int = lib.function(b"hipInit\0")?;
        let runtime_version: extern "C" fn(*mut c_int) -> c_int =
            lib.function(b"hipRuntimeGetVersion\0")?;
        let count: extern "C" fn(*mut c_int) -> c_int = lib.function(b"hipGetDeviceCount\0")?;
        let get: extern "C" fn(*mut c_int, c_int) -> c_int = lib.function(b"hipDeviceGet\0")?;
        let get_name: extern "C" fn(*mut c_char, c_int, c_int) -> c_int =
            lib.function(b"hipDeviceGetName\0")?;
        let total_mem: extern "C" fn(*mut usize, c_int) -> c_int =
            lib.function(b"hipDeviceTotalMem\0")?;
        let check = |call: &str, code: c_int| lib.check(call, code);
        check("hipInit", hip_init(0))?;
        let mut version = 0;
        check("hipRuntimeGetVersion", runtime_version(&mut version))?;
        let mut n = 0;
        check("hipGetDeviceCount", count(&mut n))?;
        if n <= 0 {
            return Err("the HIP runtime sees no AMD GPU".into());
        }
        if index >= n as usize {
            return Err(format!(
                "device {index} requested, the HIP runtime sees {n}"
            ));
        }
        let mut dev = 0;
        check("hipDeviceGet", get(&mut dev, index as c_int))?;
        let mut name = [0 as c_char; 256];
        check("hipDeviceGetName", get_name(name.as_mut_ptr(), 256, dev))?;
        let mut bytes = 0usize;
        check("hipDeviceTotalMem", total_mem(&mut bytes, dev))?;
        Ok(RocmDeviceReport {
            name: CStr::from_ptr(name.as_ptr()).to_string_lossy().into_owned(),
            memory_total: bytes as u64,
            runtime_version: version,
            device_count: n,
        })
    }
}

impl<B: RocmBurnBackend> ProbeBackend for RocmBackend<B> {
    fn kind(&self) -> BackendKind {
        BackendKind::Rocm
    }

    fn probe(&self) -> Availability {
        match query_device(self.index) {
            Ok(r) => Availability::Available(DeviceInfo {
                kind: BackendKind::Rocm,
                name: r.name,
                memory_total: Some(r.memory_total),
                compute_units: None,
                capabilities: Capabilities {
                    f16: true,
                    bf16: true,
                    int8: true,
                    features: vec!["hip".into()],
                },
                driver: Some(format!(
                    "HIP runtime {}, {} device(s)",
                    r.runtime_version, r.device_count
                )),
            }),
            Err(reason) => Availability::Unavailable(reason),
        }
    }

    fn synchronize(&self) -> Result<(), Error> {
        query_device(self.index).map_err(|reason| Error::BackendUnavailable {
            kind: "rocm".into(),
            reason,
        })?;
        B::sync(&self.device()).map_err(|e| Error::Compute(format!("ROCm synchronize: {e:?}")))
    }

    /// Bytes of live tensors in CubeCL's HIP memory pool on this device.
    fn memory_in_use(&self) -> Option<u64> {
        use burn_cubecl::cubecl::{hip::HipRuntime, Runtime};
        query_device(self.index).ok()?;
        ipfs_accelerate_cubecl::install_kernel_cache();
        let client = HipRuntime::client(&burn_rocm::RocmDevice::new(self.index));
        client.memory_usage().ok().map(|usage| usage.bytes_in_use)
    }
}

impl<B: RocmBurnBackend> Backend for RocmBackend<B> {
    type Burn = B;

    fn device(&self) -> burn_rocm::RocmDevice {
        ipfs_accelerate_cubecl::install_kernel_cache();
        burn_rocm::RocmDevice::new(self.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On any machine: the probe answers (available with a name, or unavailable with a reason)
    /// and never panics; without ROCm the reason names the missing runtime.
    #[test]
    fn probe_reports_without_panicking() {
        match RocmBackend::default().probe() {
            Availability::Available(info) => assert!(!info.name.is_empty()),
            Availability::Unavailable(reason) => assert!(!reason.is_empty(), "empty reason"),
            Availability::NotCompiled => panic!("compiled in"),
        }
    }
}
