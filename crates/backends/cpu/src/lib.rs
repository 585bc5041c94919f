//! # ipfs-accelerate-backend-cpu
//!
//! The CPU backend: burn's `burn-flex` (pure-Rust SIMD kernels — AVX-512 / AVX2 / NEON chosen at run
//! time — `gemm` for matmuls, rayon threads). Chosen over burn-ndarray (+OpenBLAS) and burn-candle by
//! measurement on BERT shapes; see `docs/backends.md`.
//!
//! The probe reads the CPU model, thread count, memory and SIMD features from the OS; it never fails on
//! a machine that can run this binary at all.

use ipfs_accelerate_core::{
    Availability, Backend, BackendKind, Capabilities, DeviceInfo, Error, ProbeBackend,
};

/// The burn backend type the CPU path runs on.
pub type CpuBurn = burn_flex::Flex;

/// The CPU backend.
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuBackend;

impl CpuBackend {
    /// Describes this machine's CPU.
    pub fn device_info() -> DeviceInfo {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |key: &str| {
            cpuinfo
                .lines()
                .find(|l| l.starts_with(key))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_string())
        };
        let name = field("model name")
            .or_else(|| field("Hardware"))
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let flags: Vec<String> = field("flags")
            .or_else(|| field("Features"))
            .unwrap_or_default()
            .split_whitespace()
            .filter(|f| KNOWN_FEATURES.contains(f))
            .map(String::from)
            .collect();
        let has = |f: &str| flags.iter().any(|x| x == f);
        let capabilities = Capabilities {
            f16: has("avx512fp16") || has("fphp") || has("f16c"),
            bf16: has("avx512_bf16") || has("amx_bf16") || has("bf16"),
            int8: has("avx512_vnni") || has("avx_vnni") || has("amx_int8") || has("asimddp"),
            features: flags.clone(),
        };
        DeviceInfo {
            kind: BackendKind::Cpu,
            name,
            memory_total: mem_total(),
            compute_units: std::thread::available_parallelism()
                .ok()
                .map(|n| n.get() as u32),
            capabilities,
            driver: Some("burn-flex 0.21".into()),
        }
    }
}

/// The SIMD / matrix features worth reporting (others are dropped from the device table).
const KNOWN_FEATURES: &[&str] = &[
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "avx512fp16",
    "avx_vnni",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "neon",
    "asimd",
    "asimddp",
    "fphp",
    "bf16",
    "sve",
];

fn mem_total() -> Option<u64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kb: u64 = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Resident set size of this process, in bytes (Linux), the CPU backend's "memory in use".
pub fn process_rss() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

impl ProbeBackend for CpuBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cpu
    }

    fn probe(&self) -> Availability {
        Availability::Available(Self::device_info())
    }

    fn synchronize(&self) -> Result<(), Error> {
        // burn-flex executes eagerly: results are ready when an op returns.
        Ok(())
    }

    fn memory_in_use(&self) -> Option<u64> {
        process_rss()
    }
}

impl Backend for CpuBackend {
    type Burn = CpuBurn;

    fn device(&self) -> burn_flex::FlexDevice {
        burn_flex::FlexDevice
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_reports_this_cpu() {
        match CpuBackend.probe() {
            Availability::Available(info) => {
                assert_eq!(info.kind, BackendKind::Cpu);
                assert!(!info.name.is_empty());
                assert!(info.compute_units.unwrap_or(1) >= 1);
            }
            other => panic!("cpu must be available, got {other:?}"),
        }
    }
}
