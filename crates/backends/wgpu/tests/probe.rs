//! The wgpu backend on this machine: the probe never panics, a found adapter computes a matmul
//! equal to the CPU's, and a machine without a Vulkan driver is reported unavailable.
//!
//! `IPFS_ACCELERATE_REQUIRE_WGPU=1` (CI with Mesa's lavapipe installed) turns "no adapter" from a
//! skip into a failure.

use burn::tensor::{Tensor, TensorData};
use ipfs_accelerate_backend_wgpu::{WgpuBackend, WgpuBurn};
use ipfs_accelerate_core::{Availability, Backend, BackendKind, ProbeBackend};

const REQUIRE_ENV: &str = "IPFS_ACCELERATE_REQUIRE_WGPU";
const CHILD_ENV: &str = "IPFS_ACCELERATE_WGPU_NO_DRIVER_CHILD";

fn required() -> bool {
    std::env::var(REQUIRE_ENV).is_ok_and(|v| v == "1")
}

/// Deterministic values in [-1, 1).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut state = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn batched_matmul<B: burn::tensor::backend::Backend>(
    device: &B::Device,
    a: &[f32],
    b: &[f32],
    [batch, m, k, n]: [usize; 4],
) -> Vec<f32> {
    let a = Tensor::<B, 3>::from_data(TensorData::new(a.to_vec(), [batch, m, k]), device);
    let b = Tensor::<B, 3>::from_data(TensorData::new(b.to_vec(), [batch, k, n]), device);
    a.matmul(b).into_data().to_vec::<f32>().expect("f32 output")
}

#[test]
fn probe_answers_without_panicking() {
    for kind in [BackendKind::Wgpu, BackendKind::WebGpu] {
        let backend = WgpuBackend::new(kind);
        assert_eq!(backend.kind(), kind);
        match backend.probe() {
            Availability::Available(info) => {
                assert_eq!(info.kind, kind);
                assert!(info.name.contains(" ["), "{}", info.name);
                println!("{kind}: {} ({:?})", info.name, info.driver);
                println!("  features: {:?}", info.capabilities.features);
            }
            Availability::Unavailable(reason) => {
                assert!(reason.starts_with("no WebGPU adapter: "), "{reason}");
                assert!(!required(), "{REQUIRE_ENV}=1 but {reason}");
                println!("{kind}: unavailable: {reason}");
            }
            Availability::NotCompiled => panic!("compiled in"),
        }
    }
}

#[test]
fn matmul_on_the_adapter_equals_the_cpu() {
    let backend = WgpuBackend::default();
    let info = match backend.probe() {
        Availability::Available(info) => info,
        other => {
            let reason = other.reason(backend.kind()).unwrap_or_default();
            assert!(
                !required(),
                "{REQUIRE_ENV}=1 but the wgpu backend is {reason}"
            );
            println!("skipped: the wgpu backend is {reason}");
            return;
        }
    };
    let dims @ [batch, m, k, n] = [2, 33, 70, 17];
    let a = values(batch * m * k, 1);
    let b = values(batch * k * n, 2);
    let device = backend.device();
    let gpu = batched_matmul::<WgpuBurn>(&device, &a, &b, dims);
    backend.synchronize().expect("synchronize");
    let cpu = batched_matmul::<burn_flex::Flex>(&Default::default(), &a, &b, dims);
    assert_eq!(gpu.len(), cpu.len());
    let diff: f64 = gpu
        .iter()
        .zip(&cpu)
        .map(|(g, c)| (f64::from(*g) - f64::from(*c)).powi(2))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = cpu
        .iter()
        .map(|c| f64::from(*c).powi(2))
        .sum::<f64>()
        .sqrt();
    let rel = diff / norm;
    println!("matmul {dims:?} on {}: relative error {rel:.2e}", info.name);
    assert!(rel < 1e-5, "relative error {rel:e} on {}", info.name);
    let reserved = backend
        .memory_in_use()
        .expect("memory usage of a live device");
    assert!(
        reserved > 0,
        "the matmul's buffers are reserved on the device"
    );
}

/// With the Vulkan loader pointed at a driver list that does not exist, wgpu finds no adapter:
/// the probe says so, and nothing panics. Runs in a child process (the probe is cached per
/// process, and the loader reads its environment once).
#[test]
fn no_vulkan_driver_is_unavailable() {
    if std::env::var_os(CHILD_ENV).is_some() {
        let backend = WgpuBackend::default();
        match backend.probe() {
            Availability::Unavailable(reason) => {
                assert!(reason.starts_with("no WebGPU adapter: "), "{reason}");
                println!("CHILD-REASON: {reason}");
            }
            other => panic!("expected unavailable without a Vulkan driver, got {other:?}"),
        }
        assert!(backend.synchronize().is_err());
        assert_eq!(backend.memory_in_use(), None);
        return;
    }
    if ipfs_accelerate_backend_wgpu::graphics_api() != wgpu::Backend::Vulkan {
        println!("skipped: burn's graphics API here is not Vulkan");
        return;
    }
    let exe = std::env::current_exe().expect("test binary path");
    let out = std::process::Command::new(exe)
        .args(["no_vulkan_driver_is_unavailable", "--exact", "--nocapture"])
        .env(CHILD_ENV, "1")
        // the Vulkan loader's driver lists (old and new names): nothing to load
        .env("VK_ICD_FILENAMES", "/nonexistent/icd.json")
        .env("VK_DRIVER_FILES", "/nonexistent/icd.json")
        .output()
        .expect("run the child test");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "child failed:\n{stdout}\n{stderr}");
    let reason = stdout
        .lines()
        .find_map(|l| l.strip_prefix("CHILD-REASON: "))
        .unwrap_or_else(|| panic!("the child test did not run:\n{stdout}\n{stderr}"));
    assert!(reason.contains("no Vulkan driver"), "{reason}");
    println!("without a driver: unavailable: {reason}");
}
