//! # ipfs-accelerate-conformance
//!
//! Comparing a model's outputs with HF transformers' reference outputs, for every family and
//! backend. A fixture set is a directory of `<family>/<variant>/` folders, each with `config.json`,
//! `model.safetensors`, `reference.safetensors` (inputs and float64 outputs computed by HF) and
//! `meta.json` (which tensors are inputs and outputs, and the tolerance of each output). Nothing
//! here knows any particular fixture's sizes: every shape comes from the files.
//!
//! The facade's `conformance` module adds loading any compiled-in family on any backend;
//! family crates use [`family_fixtures`] and [`verify_runner`] in their own tests.

mod spec_reference;
pub use spec_reference::{assert_spec_computes_fixtures, SpecReference};

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ipfs_accelerate_core::{
    BackendKind, DType, Error, HostTensor, ModelRunner, Precision, Result, TensorMap, TensorSource,
};
use ipfs_accelerate_io::SafeTensorsFile;

/// `meta.json` of a fixture.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Meta {
    /// Names of the input tensors in reference.safetensors.
    pub inputs: Vec<String>,
    /// Names of the output tensors to compare.
    pub outputs: Vec<String>,
    /// Relative-error bar per output (absent for integer outputs, which must match exactly).
    #[serde(default)]
    pub tolerance: BTreeMap<String, f64>,
    /// Free-form note on the architecture.
    #[serde(default)]
    pub note: String,
    /// The decoding rule of generation fixtures ("10 argmax steps with full recompute, ...").
    #[serde(default)]
    pub greedy: Option<String>,
    /// The post-processing call whose outputs are compared ("...(threshold=0.0, target_sizes=[(480,640)])").
    #[serde(default)]
    pub post: Option<String>,
}

/// One `<family>/<variant>/` folder.
#[derive(Debug, Clone)]
pub struct Fixture {
    /// Family folder name.
    pub family: String,
    /// Variant folder name.
    pub variant: String,
    /// The folder.
    pub dir: PathBuf,
}

/// Every fixture under `root`, sorted, for the given families (all when `families` is empty).
pub fn discover(root: &Path, families: &[String]) -> Result<Vec<Fixture>> {
    let read = |p: &Path| -> Result<Vec<PathBuf>> {
        let mut v: Vec<PathBuf> = std::fs::read_dir(p)
            .map_err(|e| Error::io(p, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_dir())
            .collect();
        v.sort();
        Ok(v)
    };
    let mut out = Vec::new();
    for fam_dir in read(root)? {
        let family = file_name(&fam_dir);
        if !families.is_empty() && !families.contains(&family) {
            continue;
        }
        for var_dir in read(&fam_dir)? {
            if var_dir.join("meta.json").is_file() {
                out.push(Fixture {
                    family: family.clone(),
                    variant: file_name(&var_dir),
                    dir: var_dir,
                });
            }
        }
    }
    Ok(out)
}

impl Fixture {
    /// Whether the folder has an ONNX export (`model.onnx`, or `encoder.onnx` + `decoder.onnx`).
    pub fn has_onnx_export(&self) -> bool {
        self.dir.join("model.onnx").is_file()
            || (self.dir.join("encoder.onnx").is_file() && self.dir.join("decoder.onnx").is_file())
    }
}

fn file_name(p: &Path) -> String {
    p.file_name()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// The result of comparing one output.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    /// Family.
    pub family: String,
    /// Variant.
    pub variant: String,
    /// Backend.
    pub backend: String,
    /// Output tensor name.
    pub output: String,
    /// ‖out − ref‖ / ‖ref‖ (for integer outputs: the fraction of elements that differ).
    pub rel_error: f64,
    /// The bar it had to meet.
    pub tolerance: f64,
    /// Whether it passed.
    pub ok: bool,
    /// Why it failed, when the comparison could not be made (shape, missing output, error).
    pub note: String,
}

/// The relative-error bar on `backend` for a fixture tolerance: as given on the CPU (native, ONNX
/// Runtime's, the browser's WebNN CPU context and WebAssembly); GPUs and graph runtimes computing in
/// f32 with TF32-class matmuls get max(2e-3, tolerance).
pub fn tolerance_for(backend: BackendKind, tolerance: f64) -> f64 {
    use ipfs_accelerate_core::{BrowserProvider, WebNnDevice};
    match backend {
        BackendKind::Cpu
        | BackendKind::Onnx(ipfs_accelerate_core::ExecutionProvider::Cpu)
        | BackendKind::Browser(BrowserProvider::WebNn(WebNnDevice::Cpu) | BrowserProvider::Wasm) => {
            tolerance
        }
        _ => tolerance.max(2e-3),
    }
}

/// ‖out − ref‖₂ / ‖ref‖₂ (absolute norm of the difference when the reference is all zeros).
pub fn relative_error(out: &[f64], reference: &[f64]) -> f64 {
    let diff: f64 = out
        .iter()
        .zip(reference)
        .map(|(a, b)| (a - b) * (a - b))
        .sum::<f64>()
        .sqrt();
    let norm: f64 = reference.iter().map(|b| b * b).sum::<f64>().sqrt();
    if !diff.is_finite() || out.iter().any(|v| !v.is_finite()) {
        return f64::INFINITY;
    }
    if norm > 0.0 {
        diff / norm
    } else {
        diff
    }
}

/// The inputs a fixture's model is run on: every tensor of reference.safetensors that is not an
/// output (the inputs meta.json lists plus extras such as `greedy_prompt`), and the decoding and
/// post-processing parameters meta.json states in words, as tensors:
/// - `greedy_steps` (i64 `[1]`) from "N argmax steps" in `greedy`;
/// - `threshold` (f64 `[1]`) and `target_sizes` (i64 `[n, 2]`, height and width) from `post`.
pub fn fixture_inputs(meta: &Meta, reference: &SafeTensorsFile) -> Result<TensorMap> {
    let mut inputs = TensorMap::new();
    for name in &meta.inputs {
        inputs.insert(name.clone(), reference.tensor(name)?);
    }
    for name in reference.names() {
        if !meta.outputs.contains(&name) && !inputs.contains_key(&name) {
            inputs.insert(name.clone(), reference.tensor(&name)?);
        }
    }
    // The number of greedy steps: stated in words in `greedy`, or else (fixtures whose meta.json
    // has no rule) the length of the reference `greedy_tokens` — a decoding parameter, not a result.
    let stated = meta
        .greedy
        .as_deref()
        .and_then(|rule| number_before(rule, "argmax steps"));
    let implied = || {
        meta.outputs
            .iter()
            .any(|o| o == "greedy_tokens")
            .then(|| reference.shape_of("greedy_tokens"))
            .flatten()
            .and_then(|shape| shape.last().copied())
    };
    if let Some(steps) = stated.or_else(implied) {
        inputs.insert(
            "greedy_steps".into(),
            HostTensor::from_i64(vec![1], &[steps as i64])?,
        );
    }
    if let Some(post) = &meta.post {
        if let Some(t) = post
            .split("threshold=")
            .nth(1)
            .and_then(|r| r.split([',', ')']).next())
            .and_then(|v| v.trim().parse::<f64>().ok())
        {
            inputs.insert("threshold".into(), HostTensor::from_f64(vec![1], &[t])?);
        }
        if let Some(list) = post.split("target_sizes=").nth(1) {
            let list = list.split(']').next().unwrap_or("");
            let nums: Vec<i64> = list
                .split(|c: char| !c.is_ascii_digit())
                .filter(|s| !s.is_empty())
                .filter_map(|s| s.parse().ok())
                .collect();
            if !nums.is_empty() && nums.len().is_multiple_of(2) {
                inputs.insert(
                    "target_sizes".into(),
                    HostTensor::from_i64(vec![nums.len() / 2, 2], &nums)?,
                );
            }
        }
    }
    Ok(inputs)
}

/// The integer right before `word` in `text` ("10 argmax steps" → 10).
fn number_before(text: &str, word: &str) -> Option<usize> {
    let head = &text[..text.find(word)?];
    head.split_whitespace().last()?.parse().ok()
}

/// Runs `runner` (the fixture's model loaded on `backend`) on the fixture's inputs and compares
/// every output named in its meta.json.
pub fn verify_runner(
    fixture: &Fixture,
    backend: BackendKind,
    runner: &dyn ModelRunner,
) -> Result<Vec<Check>> {
    verify_runner_in(fixture, backend, Precision::F32, runner)
}

/// The relative-error bar for a model computing in `precision`: [`tolerance_for`], and at least
/// 1e-2 in f16 (11-bit mantissa) and 5e-2 in bf16 (8-bit mantissa).
pub fn precision_tolerance(backend: BackendKind, precision: Precision, tolerance: f64) -> f64 {
    let bar = tolerance_for(backend, tolerance);
    match precision {
        Precision::F32 => bar,
        Precision::F16 => bar.max(1e-2),
        Precision::BF16 => bar.max(5e-2),
    }
}

/// [`verify_runner`] for a model computing in `precision` (bars from [`precision_tolerance`];
/// integer outputs such as greedy tokens must still match exactly).
pub fn verify_runner_in(
    fixture: &Fixture,
    backend: BackendKind,
    precision: Precision,
    runner: &dyn ModelRunner,
) -> Result<Vec<Check>> {
    let meta_path = fixture.dir.join("meta.json");
    let meta_text = std::fs::read_to_string(&meta_path).map_err(|e| Error::io(&meta_path, e))?;
    let meta: Meta =
        serde_json::from_str(&meta_text).map_err(|e| Error::config(&meta_path, e.to_string()))?;
    let reference = SafeTensorsFile::open(fixture.dir.join("reference.safetensors"))?;
    let inputs = fixture_inputs(&meta, &reference)?;
    let outputs = runner.run(&inputs)?;
    let mut checks = Vec::new();
    for name in &meta.outputs {
        let expected = reference.tensor(name)?;
        let tol = precision_tolerance(
            backend,
            precision,
            meta.tolerance.get(name).copied().unwrap_or(1e-4),
        );
        let mut check = Check {
            family: fixture.family.clone(),
            variant: fixture.variant.clone(),
            backend: backend.to_string(),
            output: name.clone(),
            rel_error: f64::INFINITY,
            tolerance: tol,
            ok: false,
            note: String::new(),
        };
        match outputs.get(name) {
            None => check.note = "output not produced".into(),
            Some(got) => compare(got, &expected, &mut check)?,
        }
        checks.push(check);
    }
    if let Some(placement) = runner.placement() {
        for c in checks.iter_mut().filter(|c| c.note.is_empty()) {
            c.note = format!("nodes ran on: {placement}");
        }
    }
    Ok(checks)
}

fn compare(got: &HostTensor, expected: &HostTensor, check: &mut Check) -> Result<()> {
    if got.shape() != expected.shape() {
        check.note = format!("shape {:?}, reference {:?}", got.shape(), expected.shape());
        return Ok(());
    }
    if expected.dtype().is_float() {
        check.rel_error = relative_error(&got.to_f64_vec(), &expected.to_f64_vec());
        check.ok = check.rel_error <= check.tolerance;
    } else {
        let want = expected.to_i64_vec()?;
        let have: Vec<i64> = if got.dtype().is_float() {
            got.to_f64_vec().iter().map(|v| v.round() as i64).collect()
        } else {
            got.to_i64_vec()?
        };
        let wrong = want.iter().zip(&have).filter(|(a, b)| a != b).count();
        check.rel_error = wrong as f64 / want.len().max(1) as f64;
        check.tolerance = 0.0;
        check.ok = wrong == 0;
        if expected.dtype() != DType::I64 && expected.dtype() != got.dtype() {
            check.note = format!("dtype {} vs {}", got.dtype(), expected.dtype());
        }
    }
    Ok(())
}

/// The shared data directory: `$IPFS_ACCELERATE_SHARED`, else `shared/` beside the workspace.
/// `None` (the test prints that it is skipped, by name) when it is absent, unless
/// `IPFS_ACCELERATE_REQUIRE_SHARED=1` (CI), where absence is a failure.
pub fn shared_dir(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("IPFS_ACCELERATE_SHARED")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    if dir.join("fixtures").is_dir() {
        return Some(dir);
    }
    if std::env::var("IPFS_ACCELERATE_REQUIRE_SHARED").as_deref() == Ok("1") {
        panic!(
            "{test}: shared data not found at {} (IPFS_ACCELERATE_REQUIRE_SHARED=1)",
            dir.display()
        );
    }
    eprintln!(
        "skipped {test}: needs the shared data at {} (set IPFS_ACCELERATE_SHARED)",
        dir.display()
    );
    None
}

/// Extra fixture roots (`<root>/<family>/<variant>/`), colon-separated, for checking fixture sets
/// generated elsewhere with HF (other sizes and seeds) in the family crates' tests.
pub const EXTRA_FIXTURES_ENV: &str = "IPFS_ACCELERATE_EXTRA_FIXTURES";

/// Every fixture of `family` in the shared set and in the roots of [`EXTRA_FIXTURES_ENV`]; empty
/// (skipped, by name) when the shared data is absent, see [`shared_dir`].
pub fn family_fixtures(test: &str, family: &str) -> Vec<Fixture> {
    let mut roots: Vec<PathBuf> = shared_dir(test)
        .map(|d| d.join("fixtures"))
        .into_iter()
        .collect();
    if let Some(extra) = std::env::var_os(EXTRA_FIXTURES_ENV) {
        roots.extend(std::env::split_paths(&extra));
    }
    let families = [family.to_string()];
    roots
        .iter()
        .filter_map(|r| discover(r, &families).ok())
        .flatten()
        .collect()
}

/// Panics with every failed check (for tests).
pub fn assert_checks(checks: &[Check]) {
    let failed: Vec<String> = checks
        .iter()
        .filter(|c| !c.ok)
        .map(|c| {
            format!(
                "{}/{} on {} {}: rel error {:e} > tolerance {:e} {}",
                c.family, c.variant, c.backend, c.output, c.rel_error, c.tolerance, c.note
            )
        })
        .collect();
    assert!(failed.is_empty(), "{}", failed.join("\n"));
}

/// Panics unless a task API's `rows` (embeddings per input) equal the [`ModelRunner`] output
/// `output` they come from (relative error below 1e-6).
pub fn assert_rows_match(rows: Vec<Vec<f32>>, output: &HostTensor) {
    let got: Vec<f64> = rows.concat().into_iter().map(f64::from).collect();
    let err = relative_error(&got, &output.to_f64_vec());
    assert!(
        err < 1e-6,
        "task rows vs model output: relative error {err:e}"
    );
}

/// `inputs` without the tensor `name` (for running one tower of a multi-tower model).
pub fn without(inputs: &TensorMap, name: &str) -> TensorMap {
    inputs
        .iter()
        .filter(|(k, _)| *k != name)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

/// Panics unless `probs` has one row per row of the reference `logits` `[rows, labels]` (e.g.
/// HF's `logits_per_image`), each its softmax within 1e-4 and summing to 1 within 1e-5: the check
/// of a zero-shot / classification task API against HF.
pub fn assert_softmax_rows(probs: &[Vec<f32>], logits: &HostTensor) {
    let labels = logits.shape().get(1).copied().unwrap_or(0).max(1);
    let logits = logits.to_f64_vec();
    assert_eq!(probs.len(), logits.len() / labels, "rows of {probs:?}");
    for (row, l) in probs.iter().zip(logits.chunks(labels)) {
        let max = l.iter().cloned().fold(f64::MIN, f64::max);
        let z: f64 = l.iter().map(|v| (v - max).exp()).sum();
        assert_eq!(row.len(), l.len(), "{row:?} vs {l:?}");
        for (p, v) in row.iter().zip(l) {
            let want = (v - max).exp() / z;
            assert!((f64::from(*p) - want).abs() < 1e-4, "{row:?} vs {l:?}");
        }
        assert!((row.iter().sum::<f32>() - 1.0).abs() < 1e-5, "{row:?}");
    }
}

impl Fixture {
    /// The parsed meta.json.
    pub fn meta(&self) -> Result<Meta> {
        let path = self.dir.join("meta.json");
        let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
        serde_json::from_str(&text).map_err(|e| Error::config(&path, e.to_string()))
    }

    /// The reference file.
    pub fn reference(&self) -> Result<SafeTensorsFile> {
        Ok(SafeTensorsFile::open(
            self.dir.join("reference.safetensors"),
        )?)
    }

    /// The inputs the model is run on (see [`fixture_inputs`]).
    pub fn inputs(&self) -> Result<TensorMap> {
        fixture_inputs(&self.meta()?, &self.reference()?)
    }
}
