//! Quantization at load time for every family (`Pipeline::builder(..).quantize(..)`,
//! `LoadOptions::quantization`, `nn::weights::load_scope`): all-MiniLM-L6-v2's sentence
//! embeddings against the float reference and its linear-weight memory (round-to-nearest int8 /
//! int4, and int4 calibrated with GPTQ on the built-in corpus), and tiny fixtures of other
//! families staying close to their float outputs.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use burn_flex::Flex;
use ipfs_accelerate::core::{BackendKind, DType, Family, ModelRunner, TensorSource};
use ipfs_accelerate::gptq::{GptqOptions, Int4Levels, ScaleSearch};
use ipfs_accelerate::weights::{load_scope, LoadSettings, LoadedWeights, WeightStats};
use ipfs_accelerate::{Pipeline, WeightQuantization};
use ipfs_accelerate_conformance::{family_fixtures, relative_error, shared_dir, Fixture};
use ipfs_accelerate_nn::LinearWeight;

const INT8: WeightQuantization = WeightQuantization::Int8 { block_size: 32 };
const INT4: WeightQuantization = WeightQuantization::Int4 { block_size: 32 };

/// The shared all-MiniLM-L6-v2 folder and the reference refs, when present.
fn minilm(test: &str) -> Option<(PathBuf, PathBuf)> {
    let shared = shared_dir(test)?;
    let model = shared.join("models/all-MiniLM-L6-v2");
    let refs = shared.join("refs");
    if model.join("model.safetensors").is_file() && refs.join("minilm_public.safetensors").is_file()
    {
        return Some((model, refs));
    }
    eprintln!(
        "skipped {test}: needs {} and {}/minilm_public.safetensors",
        model.display(),
        refs.display()
    );
    None
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * y).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y.powi(2)).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}

/// The reference sentences and their float sentence embeddings (row-major, `dim` wide).
struct Refs {
    text: String,
    expected: Vec<f64>,
    dim: usize,
}

impl Refs {
    fn load(refs: &Path) -> Self {
        let text = std::fs::read_to_string(refs.join("minilm_public_sentences.txt")).unwrap();
        let reference =
            ipfs_accelerate_io::SafeTensorsFile::open(refs.join("minilm_public.safetensors"))
                .unwrap()
                .tensor("sentence_embeddings")
                .unwrap();
        let refs = Refs {
            expected: reference.to_f64_vec(),
            dim: reference.shape()[1],
            text,
        };
        assert_eq!(reference.shape()[0], refs.sentences().len());
        refs
    }

    fn sentences(&self) -> Vec<&str> {
        self.text.lines().filter(|l| !l.trim().is_empty()).collect()
    }

    /// The cosine of each sentence's normalised embedding by `pipe` with the reference.
    fn cosines(&self, pipe: &Pipeline) -> Vec<f64> {
        let out = pipe.embed(&self.sentences(), true).unwrap().value;
        out.iter()
            .zip(self.expected.chunks(self.dim))
            .map(|(a, b)| cosine(a, b))
            .collect()
    }
}

fn min_mean(c: &[f64]) -> (f64, f64) {
    let min = c.iter().cloned().fold(f64::INFINITY, f64::min);
    (min, c.iter().sum::<f64>() / c.len() as f64)
}

/// MiniLM as a CPU pipeline keeping its linear weights as `q`.
fn minilm_builder(model: &Path, q: WeightQuantization) -> ipfs_accelerate::PipelineBuilder {
    Pipeline::builder(model.to_str().unwrap())
        .offline(true)
        .backends([BackendKind::Cpu])
        .env_override(false)
        .quantize(q)
}

#[test]
fn minilm_quantized_embeddings_stay_close_and_the_linear_weights_shrink() {
    let test = "minilm_quantized_embeddings_stay_close_and_the_linear_weights_shrink";
    let Some((model, refs)) = minilm(test) else {
        return;
    };
    let refs = Refs::load(&refs);
    let mut float_stats = WeightStats::default();
    // Int4 (block 32) does NOT reach issue #10's 0.98 per sentence: symmetric round-to-nearest
    // 4-bit blocks give a minimum of 0.935 (mean 0.958) on these sentences, the same as
    // PyTorch's MiniLM with its weights rounded identically (0.93495); no data-free variant
    // tried (blocks along the out-features, MSE-optimal scales over -8..7, Hadamard rotation)
    // passed 0.97. The bound below is the measured floor, to catch regressions. Calibrated int4
    // (GPTQ) reaches 0.98: `minilm_int4_calibrated_with_gptq_reaches_0_98` below.
    for (q, min_cosine, min_ratio) in [
        (WeightQuantization::None, 0.99999, 1.0),
        // Int8: 1.125 bytes per weight (3.56x smaller), packed for the integer kernel on the CPU.
        (INT8, 0.995, 3.5),
        // `int8`'s default blocks of 128: 1.03 bytes per weight.
        ("int8".parse().unwrap(), 0.995, 3.85),
        (INT4, 0.93, 6.0),
    ] {
        let pipe = minilm_builder(&model, q).build().unwrap();
        let cosines = refs.cosines(&pipe);
        assert!(pipe.calibration().is_none());
        let w = pipe.weights();
        let ratio = w.linear_f32_bytes as f64 / w.linear_bytes as f64;
        eprintln!(
            "{q:?}: cosine min {:.6} (all {cosines:.5?}); linear weights {:.2} MiB ({:.2} MiB as f32, \
             {ratio:.2}x smaller, {} of {} layers quantized); whole model {:.2} MiB ({:.2} MiB as f32, \
             {:.2}x smaller)",
            cosines.iter().cloned().fold(f64::INFINITY, f64::min),
            mib(w.linear_bytes),
            mib(w.linear_f32_bytes),
            w.linear_quantized,
            w.linear_layers,
            mib(w.bytes),
            mib(w.f32_bytes()),
            w.f32_bytes() as f64 / w.bytes as f64,
        );
        for (i, c) in cosines.iter().enumerate() {
            assert!(
                *c >= min_cosine,
                "{q:?}: sentence {i} cosine {c} < {min_cosine}"
            );
        }
        assert!(
            ratio >= min_ratio,
            "{q:?}: linear weights only {ratio:.3}x smaller"
        );
        // Every MiniLM linear layer (in-features 384 or 1536) fits blocks of 32.
        assert_eq!(w.linear_kept_float, 0);
        if q == WeightQuantization::None {
            assert_eq!(w.linear_quantized, 0);
            assert_eq!(w.linear_bytes, w.linear_f32_bytes);
            float_stats = w;
        } else {
            assert_eq!(w.linear_quantized, w.linear_layers);
            // The same tensors; only the linear weights changed size.
            assert_eq!(w.tensors, float_stats.tensors);
            assert_eq!(w.f32_bytes(), float_stats.bytes);
            assert!(w.bytes < float_stats.bytes);
        }
    }
}

/// `--precision bf16` on the CPU (issue #24): linear weights kept as bf16 (half the bytes) and
/// multiplied by the bf16 kernel, everything else f32; every reference sentence within cosine
/// 0.999 of HF's float64 embedding. It loads with the device in f32, so it shares this binary.
#[test]
fn minilm_bf16_on_the_cpu_stays_within_0_999() {
    let test = "minilm_bf16_on_the_cpu_stays_within_0_999";
    let Some((model, refs)) = minilm(test) else {
        return;
    };
    let refs = Refs::load(&refs);
    let pipe = minilm_builder(&model, WeightQuantization::None)
        .precision(ipfs_accelerate::Precision::BF16)
        .build()
        .unwrap();
    let cosines = refs.cosines(&pipe);
    let (min, mean) = min_mean(&cosines);
    let w = pipe.weights();
    let ratio = w.linear_f32_bytes as f64 / w.linear_bytes as f64;
    eprintln!("bf16: cosine min {min:.6} mean {mean:.6}; linear weights {ratio:.2}x smaller");
    assert!(min >= 0.999, "bf16: cosine min {min}");
    assert!(min < 0.999_999_9, "bf16 changed nothing: {min}");
    if ipfs_accelerate_nn::fast::enabled() {
        assert!(ratio > 1.9, "bf16 linear weights only {ratio:.2}x smaller");
    }
}

/// Issue #10's int4 bound, met with calibration: GPTQ (`nn::gptq`, default options: damping
/// 0.1, codes -8..=7, each block's clipping chosen by GPTQ's own loss) on the built-in corpus
/// (`data/calibration_en.txt`, which shares no sentence with the reference sentences), in the
/// same int4 format and memory as round-to-nearest.
#[test]
fn minilm_int4_calibrated_with_gptq_reaches_0_98() {
    let test = "minilm_int4_calibrated_with_gptq_reaches_0_98";
    let Some((model, refs)) = minilm(test) else {
        return;
    };
    let refs = Refs::load(&refs);
    let clock = std::time::Instant::now();
    let rtn = minilm_builder(&model, INT4).build().unwrap();
    let rtn_load = clock.elapsed().as_secs_f64();
    let rtn_w = rtn.weights();
    drop(rtn);
    let clock = std::time::Instant::now();
    let pipe = minilm_builder(&model, INT4)
        .calibrate_default()
        .build()
        .unwrap();
    let load = clock.elapsed().as_secs_f64();
    let cosines = refs.cosines(&pipe);
    let (min, mean) = min_mean(&cosines);
    let w = pipe.weights();
    let report = *pipe.calibration().unwrap();
    let ratio = w.linear_f32_bytes as f64 / w.linear_bytes as f64;
    eprintln!(
        "int4 GPTQ: cosine min {min:.5} mean {mean:.5} (all {cosines:.5?}); linear weights \
         {ratio:.2}x smaller; {} of {} layers calibrated on {} texts in {:.2} s; load {load:.2} s \
         (round-to-nearest {rtn_load:.2} s)",
        w.linear_calibrated,
        w.linear_layers,
        report.texts,
        report.duration.as_secs_f64(),
    );
    for (i, c) in cosines.iter().enumerate() {
        assert!(*c >= 0.98, "sentence {i}: cosine {c} < 0.98");
    }
    assert!(ratio >= 6.0, "linear weights only {ratio:.3}x smaller");
    // The same format and bytes as round-to-nearest; every encoder layer calibrated (6 per BERT
    // layer: query, key, value, attention output, intermediate, output; plus the pooler when the
    // model runs it).
    assert_eq!(w.linear_bytes, rtn_w.linear_bytes);
    assert_eq!(w.bytes, rtn_w.bytes);
    assert_eq!(w.linear_quantized, w.linear_layers);
    assert!(report.layers >= 6 * pipe.config().num_hidden_layers);
    assert!(report.layers <= w.linear_layers);
    assert_eq!(w.linear_calibrated, report.layers);
    assert_eq!(report.texts, 146);
}

/// The GPTQ variants of issue #10's report, on MiniLM with the built-in corpus (slow: one
/// calibrated load each, the sequential one a load and a pass per layer group). Prints the
/// cosines; each must at least beat round-to-nearest's floor.
#[test]
#[ignore = "slow; prints the GPTQ variants' cosines"]
fn minilm_int4_gptq_variants() {
    let test = "minilm_int4_gptq_variants";
    let Some((model, refs)) = minilm(test) else {
        return;
    };
    let refs = Refs::load(&refs);
    let base = GptqOptions::default();
    let plain = GptqOptions {
        damp: 0.01,
        levels: Int4Levels::Symmetric,
        scale_search: ScaleSearch::AbsMax,
        ..base
    };
    let variants = [
        ("paper: damp 0.01, -7..7, absmax", plain),
        (
            "damp 0.1, -7..7, absmax",
            GptqOptions { damp: 0.1, ..plain },
        ),
        (
            "damp 0.1, -8..7, absmax",
            GptqOptions {
                damp: 0.1,
                levels: Int4Levels::Full,
                ..plain
            },
        ),
        (
            "damp 0.1, -8..7, mse clip",
            GptqOptions {
                scale_search: ScaleSearch::Mse,
                ..base
            },
        ),
        ("default: damp 0.1, -8..7, GPTQ-loss clip", base),
        (
            "default + act-order (static groups)",
            GptqOptions {
                act_order: true,
                ..base
            },
        ),
        (
            "default + sequential",
            GptqOptions {
                sequential: true,
                ..base
            },
        ),
    ];
    for (name, options) in variants {
        let pipe = minilm_builder(&model, INT4)
            .calibrate_default()
            .gptq_options(options)
            .build()
            .unwrap();
        let cosines = refs.cosines(&pipe);
        let (min, mean) = min_mean(&cosines);
        let secs = pipe.calibration().unwrap().duration.as_secs_f64();
        eprintln!("{name}: cosine min {min:.5} mean {mean:.5} (calibration {secs:.1} s)");
        assert!(min >= 0.93, "{name}: {min}");
    }
}

#[test]
fn calibration_needs_int4_and_some_text() {
    for (q, texts, expected) in [
        (INT8, vec!["A sentence."], "int4"),
        (WeightQuantization::None, vec!["A sentence."], "int4"),
        (INT4, vec!["", "  "], "non-empty"),
    ] {
        let err = Pipeline::builder("embedded")
            .offline(true)
            .backends([BackendKind::Cpu])
            .env_override(false)
            .quantize(q)
            .calibrate(texts)
            .build()
            .err()
            .expect("refused");
        assert!(err.to_string().contains(expected), "{q:?}: {err}");
    }
}

/// Loads `F` from `dir` inside a load scope keeping the linear weights as `q`.
fn load<F: Family>(dir: &Path, q: WeightQuantization) -> (Box<dyn ModelRunner>, LoadedWeights) {
    let settings = LoadSettings::default().quantize(q);
    let (runner, weights) = load_scope(settings, || {
        F::load::<Flex>(dir, &Default::default(), BackendKind::Cpu)
    });
    (runner.unwrap(), weights)
}

/// The float outputs of `runner` on the fixture's inputs.
fn float_outputs(f: &Fixture, runner: &dyn ModelRunner) -> BTreeMap<String, Vec<f64>> {
    let outputs = runner.run(&f.inputs().unwrap()).unwrap();
    outputs
        .into_iter()
        .filter(|(_, t)| t.dtype().is_float())
        .map(|(name, t)| (name, t.to_f64_vec()))
        .collect()
}

/// A copy of the checkpoint in `dir` whose linear weights are replaced by their dequantized
/// values as `weights` kept them (the other tensors and files unchanged).
fn dequantized_copy(dir: &Path, weights: &LoadedWeights) -> tempfile::TempDir {
    let out = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if path.is_file() && name != "model.safetensors" && !name.ends_with(".onnx") {
            std::fs::copy(&path, out.path().join(&name)).unwrap();
        }
    }
    let file = ipfs_accelerate_io::SafeTensorsFile::open(dir.join("model.safetensors")).unwrap();
    let kept: BTreeMap<String, WeightQuantization> = weights.linear_weights().into_iter().collect();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>, safetensors::Dtype)> = Vec::new();
    for name in file.names() {
        let t = file.tensor(&name).unwrap();
        let shape = t.shape().to_vec();
        match kept.get(&name) {
            Some(&q) if q != WeightQuantization::None => {
                let (o, i) = (shape[0], shape[1]);
                let w = LinearWeight::<Flex>::from_out_in(
                    &t.to_f32_vec(),
                    o,
                    i,
                    q,
                    &Default::default(),
                )
                .unwrap()
                .to_out_in_f32()
                .unwrap();
                let bytes = w.iter().flat_map(|v| v.to_le_bytes()).collect();
                tensors.push((name, shape, bytes, safetensors::Dtype::F32));
            }
            _ => {
                let dtype = match t.dtype() {
                    DType::F32 => safetensors::Dtype::F32,
                    DType::I64 => safetensors::Dtype::I64,
                    other => panic!("fixture tensor {name} is {other}"),
                };
                tensors.push((name, shape, t.bytes().to_vec(), dtype));
            }
        }
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, s, b, d)| {
            (
                n.clone(),
                safetensors::tensor::TensorView::new(*d, s.clone(), b).unwrap(),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, &out.path().join("model.safetensors")).unwrap();
    out
}

/// How close a family's quantized outputs must stay to its float ones: int8 and int4 bounds,
/// and the outputs they apply to (`None`: all).
struct Closeness {
    int8: f64,
    int4: f64,
    outputs: Option<&'static [&'static str]>,
}

/// The usual bounds. Symmetric rounding to `scale = max|block| / 127` (int8) or `/ 7` (int4)
/// leaves each weight within half a step, an RMS error of `step / √12` ≈ 0.2 % (int8) or 4 %
/// (int4) of the block's largest weight — about 0.5 % and 10 % of a typical weight of these
/// random blocks. Errors of independent layers add roughly in quadrature through the 2–5 layers
/// of a fixture, so outputs move by a few percent (int8) and a few tens of percent (int4): bounds
/// 5e-2 and 5e-1, well below an unrelated output (relative error ≈ 1).
const USUAL: Closeness = Closeness {
    int8: 5e-2,
    int4: 5e-1,
    outputs: None,
};

/// Quantized loads of `F`:
/// 1. quantize the layers that fit (the fixtures' 37-wide MLP inputs do not fit blocks of 16 and
///    stay float, counted) and hold fewer bytes;
/// 2. compute what the float model computes on the dequantized weights (relative error ≤ 1e-4
///    on every float output for int4: the kept format and the forward are right, whatever the
///    model's sensitivity; int8 runs W8A8 on the CPU, within the int8 bound);
/// 3. stay `close` to the float outputs (non-zero: quantization changed something).
fn quantized_loads_stay_close<F: Family>(test: &str, close: Closeness) {
    for f in family_fixtures(test, F::NAME) {
        let (float, float_w) = load::<F>(&f.dir, WeightQuantization::None);
        let float_w = float_w.stats();
        let reference = float_outputs(&f, float.as_ref());
        assert!(!reference.is_empty(), "{}: no float outputs", f.variant);
        for (q, bound) in [
            (WeightQuantization::Int8 { block_size: 16 }, close.int8),
            (WeightQuantization::Int4 { block_size: 16 }, close.int4),
        ] {
            let (runner, weights) = load::<F>(&f.dir, q);
            let w = weights.stats();
            let got = float_outputs(&f, runner.as_ref());
            let copy = dequantized_copy(&f.dir, &weights);
            let (dequantized, _) = load::<F>(copy.path(), WeightQuantization::None);
            let same = float_outputs(&f, dequantized.as_ref());
            for (name, expected) in &reference {
                let err = relative_error(&got[name], expected);
                let exact = relative_error(&got[name], &same[name]);
                eprintln!(
                    "{} {} {q:?}: {name} rel err {err:.3e} vs float, {exact:.1e} vs the float \
                     model of the dequantized weights; linear {} of {} quantized ({} kept \
                     float), {} B vs {} B as f32",
                    F::NAME,
                    f.variant,
                    w.linear_quantized,
                    w.linear_layers,
                    w.linear_kept_float,
                    w.linear_bytes,
                    w.linear_f32_bytes
                );
                // Int8 on the CPU runs W8A8 (each activation row rounded to 8 bits in the
                // integer kernel, as ONNX Runtime's dynamic quantization): it differs from the
                // dequantized float model by that rounding, which is of the weight rounding's
                // size, so it gets the same bound, on the outputs that bound covers (T5's
                // logits move by tens of percent under any rounding). Int4 is dequantized: exact.
                let covered = close.outputs.is_none_or(|o| o.contains(&name.as_str()));
                let exact_bound = match q {
                    WeightQuantization::Int8 { .. } if covered => bound,
                    WeightQuantization::Int8 { .. } => f64::INFINITY,
                    _ => 1e-4,
                };
                assert!(
                    exact <= exact_bound,
                    "{} {name}: {exact} vs dequantized",
                    f.variant
                );
                assert!(
                    err > 0.0,
                    "{} {name}: quantization changed nothing",
                    f.variant
                );
                if close.outputs.is_none_or(|o| o.contains(&name.as_str())) {
                    assert!(
                        err.is_finite() && err < bound,
                        "{} {name}: {err}",
                        f.variant
                    );
                }
            }
            assert!(w.linear_quantized > 0, "{}: nothing quantized", f.variant);
            assert!(
                w.linear_kept_float > 0,
                "{}: the 37-wide layers fit?",
                f.variant
            );
            assert_eq!(
                w.linear_quantized + w.linear_kept_float,
                w.linear_layers,
                "{}",
                f.variant
            );
            assert_eq!(w.linear_layers, float_w.linear_layers);
            assert!(w.linear_bytes < float_w.linear_bytes);
        }
    }
}

#[cfg(feature = "vit")]
#[test]
fn vit_quantized_loads_stay_close() {
    quantized_loads_stay_close::<ipfs_accelerate_vit::VitFamily>(
        "vit_quantized_loads_stay_close",
        USUAL,
    );
}

#[cfg(feature = "whisper")]
#[test]
fn whisper_quantized_loads_stay_close() {
    quantized_loads_stay_close::<ipfs_accelerate_whisper::WhisperFamily>(
        "whisper_quantized_loads_stay_close",
        USUAL,
    );
}

/// T5's fixtures are far more sensitive: no attention scaling and random weights give peaky
/// attention, so HF's own float model with its linear weights rounded the same way (blocks of
/// 16, in PyTorch) moves the encoder output by 9.6 % (int8) / 51 % (int4) on `flan` and 2.4 % /
/// 43 % on `t5`, and the logits by 35 % / 103 % and 18 % / 67 %. The closeness bounds cover the
/// encoder output only, with that headroom; the exactness check (2.) covers every output for
/// int4, and the encoder output for int8 (W8A8 on the CPU).
#[cfg(feature = "t5")]
#[test]
fn t5_quantized_loads_stay_close() {
    quantized_loads_stay_close::<ipfs_accelerate_t5::T5Family>(
        "t5_quantized_loads_stay_close",
        Closeness {
            int8: 2e-1,
            int4: 1.0,
            outputs: Some(&["encoder_last_hidden_state"]),
        },
    );
}

#[cfg(feature = "clip")]
#[test]
fn clip_quantized_loads_stay_close() {
    quantized_loads_stay_close::<ipfs_accelerate_clip::ClipFamily>(
        "clip_quantized_loads_stay_close",
        USUAL,
    );
}

#[test]
fn a_bad_block_size_is_a_typed_error() {
    let err = Pipeline::builder("embedded")
        .offline(true)
        .quantize(WeightQuantization::Int8 { block_size: 0 })
        .build()
        .err()
        .expect("block size 0 is refused");
    assert!(err.to_string().contains("block size"), "{err}");
}
