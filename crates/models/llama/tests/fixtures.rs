//! HF reference fixtures (`<root>/{llama,qwen2}/<variant>/`): logits within the fixture's
//! tolerance and greedy tokens equal. Roots: the shared fixtures (`$IPFS_ACCELERATE_SHARED/fixtures`,
//! else `../shared/fixtures` beside the workspace) and any extra roots in
//! `$IPFS_ACCELERATE_LLAMA_FIXTURES` (colon-separated), e.g. a set generated with other sizes.

use std::path::{Path, PathBuf};

use burn_flex::Flex;
use ipfs_accelerate_core::{BackendKind, DType, Family, HostTensor, TensorMap, TensorSource};
use ipfs_accelerate_io::SafeTensorsFile;
use ipfs_accelerate_llama::{LlamaFamily, Qwen2Family};

fn shared_fixtures() -> Option<PathBuf> {
    let root = match std::env::var_os("IPFS_ACCELERATE_SHARED") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../../shared"),
    };
    let fixtures = root.join("fixtures");
    if fixtures.is_dir() {
        Some(fixtures)
    } else if std::env::var("IPFS_ACCELERATE_REQUIRE_SHARED").as_deref() == Ok("1") {
        panic!("fixtures: {} is missing", fixtures.display());
    } else {
        eprintln!(
            "skipped llama fixtures: no shared fixtures at {} (set IPFS_ACCELERATE_SHARED)",
            fixtures.display()
        );
        None
    }
}

/// "prompt = greedy_prompt, 10 argmax steps ..." → 10.
fn greedy_steps(rule: &str) -> Option<i64> {
    let before = rule.split("argmax steps").next()?;
    before.split_whitespace().last()?.parse().ok()
}

fn rel_error(got: &[f64], want: &[f64]) -> f64 {
    let diff: f64 = got.iter().zip(want).map(|(a, b)| (a - b).powi(2)).sum();
    let norm: f64 = want.iter().map(|b| b * b).sum();
    (diff / norm).sqrt()
}

/// Runs one fixture folder; returns a line per output.
fn check(family: &str, dir: &Path) -> Vec<String> {
    let meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("meta.json")).unwrap()).unwrap();
    let outputs: Vec<String> = meta["outputs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let reference = SafeTensorsFile::open(dir.join("reference.safetensors")).unwrap();
    let mut inputs = TensorMap::new();
    for name in reference.names() {
        if !outputs.contains(&name) {
            inputs.insert(name.clone(), reference.raw(&name).unwrap());
        }
    }
    if let Some(steps) = meta["greedy"].as_str().and_then(greedy_steps) {
        inputs.insert(
            "greedy_steps".into(),
            HostTensor::from_i64(vec![1], &[steps]).unwrap(),
        );
    }
    let device = Default::default();
    let runner = match family {
        "llama" => LlamaFamily::load::<Flex>(dir, &device, BackendKind::Cpu),
        _ => Qwen2Family::load::<Flex>(dir, &device, BackendKind::Cpu),
    }
    .unwrap();
    let got = runner.run(&inputs).unwrap();
    let mut lines = Vec::new();
    for name in &outputs {
        let want = reference.raw(name).unwrap();
        let out = got
            .get(name)
            .unwrap_or_else(|| panic!("{}: no output {name}", dir.display()));
        assert_eq!(out.shape(), want.shape(), "{}: {name}", dir.display());
        if want.dtype() == DType::I64 {
            assert_eq!(out.dtype(), DType::I64);
            assert_eq!(
                out.to_i64_vec().unwrap(),
                want.to_i64_vec().unwrap(),
                "{}: {name}",
                dir.display()
            );
            lines.push(format!("{}: {name} exact", dir.display()));
        } else {
            let tol = meta["tolerance"][name].as_f64().unwrap();
            let err = rel_error(&out.to_f64_vec(), &want.to_f64_vec());
            assert!(
                err <= tol,
                "{}: {name} rel error {err:e} > {tol:e}",
                dir.display()
            );
            lines.push(format!(
                "{}: {name} rel error {err:.3e} (tol {tol:.1e})",
                dir.display()
            ));
        }
    }
    lines
}

#[test]
fn reference_fixtures() {
    let mut roots: Vec<PathBuf> = shared_fixtures().into_iter().collect();
    if let Some(extra) = std::env::var_os("IPFS_ACCELERATE_LLAMA_FIXTURES") {
        roots.extend(std::env::split_paths(&extra));
    }
    let mut checked = 0;
    for root in roots {
        for family in ["llama", "qwen2"] {
            let Ok(entries) = std::fs::read_dir(root.join(family)) else {
                continue;
            };
            let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
            dirs.sort();
            for dir in dirs.iter().filter(|d| d.join("meta.json").is_file()) {
                for line in check(family, dir) {
                    eprintln!("{line}");
                }
                checked += 1;
            }
        }
    }
    eprintln!("{checked} llama / qwen2 fixtures checked");
}
