//! Conformance: every fixture of every family compiled into this build against HF transformers'
//! reference outputs, on the CPU backend and (when ONNX Runtime is installed) on ONNX Runtime's
//! CPU and OpenVINO providers.

use ipfs_accelerate::conformance::{discover, implemented_families, verify_fixture, Fixture};
use ipfs_accelerate::{BackendKind, ExecutionProvider};
use ipfs_accelerate_tests::shared_dir;

fn fixtures(test: &str) -> Option<Vec<Fixture>> {
    let shared = shared_dir(test)?;
    let families: Vec<String> = implemented_families()
        .into_iter()
        .map(String::from)
        .collect();
    let found = discover(&shared.join("fixtures"), &families).unwrap();
    assert!(
        found.iter().any(|f| f.family == "bert"),
        "no bert fixtures under {}",
        shared.display()
    );
    Some(found)
}

fn check_all(fixtures: &[Fixture], backend: BackendKind, only_with_onnx: bool) {
    let mut ran = 0;
    for fixture in fixtures {
        if only_with_onnx && !fixture.has_onnx_export() {
            continue;
        }
        let checks = verify_fixture(fixture, backend)
            .unwrap_or_else(|e| panic!("{}/{} on {backend}: {e}", fixture.family, fixture.variant));
        assert!(!checks.is_empty());
        for c in checks {
            assert!(
                c.ok,
                "{}/{} on {backend} {}: rel error {:e} > tolerance {:e} {}",
                c.family, c.variant, c.output, c.rel_error, c.tolerance, c.note
            );
        }
        ran += 1;
    }
    assert!(ran > 0, "no fixture ran on {backend}");
}

#[test]
fn every_fixture_matches_hf_on_cpu() {
    let Some(found) = fixtures("every_fixture_matches_hf_on_cpu") else {
        return;
    };
    check_all(&found, BackendKind::Cpu, false);
}

/// Whether ONNX Runtime is installed; when it is not, the ONNX tests say so and pass, unless
/// `IPFS_ACCELERATE_REQUIRE_ONNX=1` (CI, which installs it with `cargo xtask fetch-ort`).
fn onnx_available(test: &str, provider: ExecutionProvider) -> bool {
    use ipfs_accelerate::core::ProbeBackend;
    match ipfs_accelerate_backend_onnx::OnnxBackend::new(provider).probe() {
        ipfs_accelerate::Availability::Available(_) => true,
        other => {
            if std::env::var("IPFS_ACCELERATE_REQUIRE_ONNX").as_deref() == Ok("1") {
                panic!("{test}: ONNX Runtime {provider:?} unavailable: {other:?}");
            }
            eprintln!("skipped {test}: ONNX Runtime {provider:?} unavailable: {other:?}");
            false
        }
    }
}

#[test]
fn onnx_exports_match_hf_on_onnx_runtime_cpu_and_openvino() {
    let test = "onnx_exports_match_hf_on_onnx_runtime_cpu_and_openvino";
    let Some(found) = fixtures(test) else {
        return;
    };
    for provider in [ExecutionProvider::Cpu, ExecutionProvider::OpenVino] {
        if onnx_available(test, provider) {
            check_all(&found, BackendKind::Onnx(provider), true);
        }
    }
}
