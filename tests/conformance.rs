//! Conformance: every BERT fixture in the shared set against HF transformers' reference outputs.

use ipfs_accelerate::conformance::{discover, verify_fixture};
use ipfs_accelerate::BackendKind;
use ipfs_accelerate_tests::shared_dir;

#[test]
fn bert_fixtures_match_hf_on_cpu() {
    let Some(shared) = shared_dir("bert_fixtures_match_hf_on_cpu") else {
        return;
    };
    let fixtures = discover(&shared.join("fixtures"), &["bert".to_string()]).unwrap();
    assert!(
        fixtures.len() >= 4,
        "expected the four bert variants, found {}",
        fixtures.len()
    );
    for fixture in &fixtures {
        let checks = verify_fixture(fixture, BackendKind::Cpu).unwrap();
        assert!(!checks.is_empty());
        for c in checks {
            assert!(
                c.ok,
                "{}/{} {}: rel error {:e} > tolerance {:e} {}",
                c.family, c.variant, c.output, c.rel_error, c.tolerance, c.note
            );
        }
    }
}
