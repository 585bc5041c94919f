//! Computing in f16 (`LoadOptions::precision`, `PipelineBuilder::precision`): BERT and ViT
//! fixtures on the CPU backend (burn-flex computes in f16) against HF's float64 outputs within
//! the f16 bar, and the device's precision being fixed for the process. Its own test binary:
//! burn fixes a device's float type per process, so nothing here may run in f32 on the CPU.

use ipfs_accelerate::conformance::{load_family_in, verify_fixture_in};
use ipfs_accelerate::{BackendKind, Precision};
use ipfs_accelerate_conformance::{family_fixtures, precision_tolerance};

#[test]
fn f16_on_the_cpu_matches_hf_within_the_f16_bar_and_fixes_the_device() {
    let test = "f16_on_the_cpu_matches_hf_within_the_f16_bar_and_fixes_the_device";
    let mut fixtures = family_fixtures(test, "bert");
    fixtures.extend(family_fixtures(test, "vit"));
    if fixtures.is_empty() {
        return;
    }
    let mut checked = 0;
    for fixture in &fixtures {
        let checks = verify_fixture_in(fixture, BackendKind::Cpu, Precision::F16).unwrap();
        for c in &checks {
            eprintln!(
                "{}/{} f16 {}: {:.3e} (bar {:.1e})",
                c.family, c.variant, c.output, c.rel_error, c.tolerance
            );
            assert!(c.ok, "{}/{} {}: {c:?}", c.family, c.variant, c.output);
            // f16 really ran: a float output differs from the f32 result by more than f32
            // rounding (the fixtures' own f32 bar), and stays under the f16 bar.
            if c.tolerance > 0.0 {
                assert!(
                    c.rel_error > 1e-6,
                    "{}/{} {}: error {:e} looks like f32, not f16",
                    c.family,
                    c.variant,
                    c.output,
                    c.rel_error
                );
            }
            checked += 1;
        }
    }
    assert!(checked > 0);
    assert_eq!(
        precision_tolerance(BackendKind::Cpu, Precision::F16, 1e-4),
        1e-2
    );

    // The CPU device now computes in f16 for this process: f32 or bf16 is a typed error naming
    // both, and nothing is loaded.
    for other in [Precision::F32, Precision::BF16] {
        let err = load_family_in("bert", &fixtures[0].dir, BackendKind::Cpu, other)
            .err()
            .expect("refused");
        let text = err.to_string();
        assert!(
            text.contains("already computes in f16") && text.contains(other.name()),
            "{text}"
        );
    }
    // Precision applies to the native backends only.
    let err = load_family_in(
        "bert",
        &fixtures[0].dir,
        "onnx-cpu".parse().unwrap(),
        Precision::F16,
    )
    .err()
    .expect("refused");
    assert!(err.to_string().contains("f32 ONNX export"), "{err}");
}

#[test]
fn precision_names_parse() {
    for (text, p) in [
        ("f32", Precision::F32),
        ("FP16", Precision::F16),
        ("half", Precision::F16),
        ("bfloat16", Precision::BF16),
    ] {
        assert_eq!(text.parse::<Precision>().unwrap(), p);
    }
    let err = "f8".parse::<Precision>().unwrap_err();
    assert!(err.to_string().contains("known: f32, f16, bf16"), "{err}");
}
