//! Checkpoints whose feed-forward activation or pooler only the shared trunk description names
//! (`tools/make_bert_fixture.py` with `HIDDEN_ACT`, `tools/make_vit_fixture.py` with
//! `POOLER_ACT` / `POOLER_SIZE`, in `tests/described/`): the description run by the burn trunk
//! on the CPU, and executed by its f64 reference, against HF transformers' float64 outputs. The
//! cuBLAS encoder runs the same description on `cuda`.
#![cfg(feature = "bert")]

use std::path::{Path, PathBuf};

use ipfs_accelerate::conformance::verify_fixture;
use ipfs_accelerate::BackendKind;
use ipfs_accelerate_conformance::{assert_checks, discover, verify_runner, SpecReference};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/described")
}

#[test]
fn activations_and_poolers_the_description_names_match_hf() {
    let mut checked = Vec::new();
    for fixture in discover(&fixtures(), &[]).unwrap() {
        let spec = match fixture.family.as_str() {
            "bert" => ipfs_accelerate_bert::encoder_spec(&fixture.dir),
            #[cfg(feature = "vit")]
            "vit" => ipfs_accelerate_vit::encoder_spec(&fixture.dir),
            _ => continue,
        };
        let checks = verify_fixture(&fixture, BackendKind::Cpu).unwrap();
        assert!(!checks.is_empty(), "{}", fixture.variant);
        assert_checks(&checks);
        let reference = SpecReference::new(spec.unwrap()).unwrap();
        let checks = verify_runner(&fixture, BackendKind::Cpu, &reference).unwrap();
        assert!(!checks.is_empty(), "{}", fixture.variant);
        assert_checks(&checks);
        checked.push(fixture.variant);
    }
    let mut want = vec!["act_mish", "act_silu"];
    if cfg!(feature = "vit") {
        want.push("pooler_relu_24");
    }
    assert_eq!(checked, want);
}
