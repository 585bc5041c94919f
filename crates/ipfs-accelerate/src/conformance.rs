//! Conformance against HF transformers reference fixtures.
//!
//! A fixture set is a directory of `<family>/<variant>/` folders, each with `config.json`,
//! `model.safetensors`, `reference.safetensors` (inputs and float64 outputs computed by HF) and
//! `meta.json` (which tensors are inputs and outputs, and the tolerance of each output).
//! Nothing here knows any particular fixture's sizes: every shape comes from the files.

use std::path::{Path, PathBuf};

use ipfs_accelerate_core::{BackendKind, Family, ModelRunner, Precision};

pub use ipfs_accelerate_conformance::*;

use crate::backends::{with_backend, WithBackend};
use crate::{Error, Result};

/// The families compiled into this build: `feature => family type` (one line per family).
macro_rules! for_each_family {
    ($apply:ident $(, $arg:expr)*) => {
        $apply!(
            [$($arg),*]
            "bert" => ipfs_accelerate_bert::BertFamily,
            "llama" => ipfs_accelerate_llama::LlamaFamily,
            "qwen2" => ipfs_accelerate_llama::Qwen2Family,
            "detr" => ipfs_accelerate_detr::DetrFamily,
            "t5" => ipfs_accelerate_t5::T5Family,
            "whisper" => ipfs_accelerate_whisper::WhisperFamily,
            "wav2vec2" => ipfs_accelerate_wav2vec2::Wav2Vec2Family,
            "vit" => ipfs_accelerate_vit::VitFamily,
            "clip" => ipfs_accelerate_clip::ClipFamily,
            "clap" => ipfs_accelerate_clap::ClapFamily,
            "llava" => ipfs_accelerate_llava::LlavaFamily,
            "llava_next" => ipfs_accelerate_llava::LlavaNextFamily,
            "xclip" => ipfs_accelerate_xclip::XclipFamily,
        )
    };
}

/// Families this build can verify.
pub fn implemented_families() -> Vec<&'static str> {
    macro_rules! names {
        ([] $($feature:literal => $fam:ty,)*) => {
            vec![$(
                #[cfg(feature = $feature)]
                <$fam as Family>::NAME,
            )*]
        };
    }
    for_each_family!(names)
}

/// Loads the model of a fixture folder on `backend`.
pub fn load_runner(fixture: &Fixture, backend: BackendKind) -> Result<Box<dyn ModelRunner>> {
    load_family(&fixture.family, &fixture.dir, backend)
}

/// Loads the checkpoint folder `dir` (config.json + safetensors) of `family` on `backend`.
pub fn load_family(family: &str, dir: &Path, backend: BackendKind) -> Result<Box<dyn ModelRunner>> {
    load_family_in(family, dir, backend, Precision::F32)
}

/// [`load_family`] computing in `precision` (native burn backends only: the ONNX and browser
/// backends run the f32 exports).
pub fn load_family_in(
    family: &str,
    dir: &Path,
    backend: BackendKind,
    precision: Precision,
) -> Result<Box<dyn ModelRunner>> {
    if precision != Precision::F32
        && matches!(backend, BackendKind::Onnx(_) | BackendKind::Browser(_))
    {
        return Err(Error::Unsupported(format!(
            "{backend} runs the f32 ONNX export; precision {precision} applies to the native \
             backends (cpu, cuda, wgpu)"
        )));
    }
    #[cfg(feature = "webnn")]
    if let BackendKind::Browser(provider) = backend {
        let browser = ipfs_accelerate_backend_webnn::Browser::launch(&Default::default())
            .map_err(ipfs_accelerate_core::Error::from)?;
        // Conformance asks for the whole graph on WebNN; WebGPU leaves shape arithmetic to the
        // CPU (reported in the placement).
        let options = ipfs_accelerate_backend_webnn::GraphOptions {
            require_full_placement: matches!(
                provider,
                ipfs_accelerate_core::BrowserProvider::WebNn(_)
            ),
        };
        return Ok(Box::new(crate::onnx::OnnxRunner::load_browser(
            family,
            dir,
            provider,
            std::sync::Arc::new(browser),
            options,
        )?));
    }
    #[cfg(feature = "onnx")]
    if let BackendKind::Onnx(provider) = backend {
        let options = ipfs_accelerate_backend_onnx::SessionOptions {
            profile: true,
            ..Default::default()
        };
        return Ok(Box::new(crate::onnx::OnnxRunner::load(
            family, dir, provider, &options,
        )?));
    }
    // LLaMA and Qwen2 on cuda: the cuBLAS decoder when it can take the checkpoint, else burn's
    // CubeCL path.
    #[cfg(all(feature = "cuda", any(feature = "llama", feature = "qwen2")))]
    if backend == BackendKind::Cuda && matches!(family, "llama" | "qwen2") {
        let loaded = ipfs_accelerate_llama::decoder_spec(dir)
            .map_err(|e| e.to_string())
            .and_then(|(spec, config)| {
                crate::cuda_decoder::CudaDecoder::load(&spec, &config, None, precision)
            });
        match loaded {
            Ok(runner) => return Ok(Box::new(runner)),
            Err(reason) => tracing::info!(
                "{family} on cuda: the cuBLAS decoder cannot run {} ({reason}); using CubeCL",
                dir.display()
            ),
        }
    }
    // Families whose loaders try the cuBLAS engines first on cuda, the reason logged when they
    // cannot take the checkpoint: T5 (both stacks), Whisper (the encoder, then the decoder), CLAP
    // (the text tower), X-CLIP (both towers); LLaVA and the encoders below read the options too.
    #[allow(unused_variables)]
    let options = crate::LoadOptions {
        precision,
        ..Default::default()
    };
    macro_rules! engines_first {
        ($($feature:literal => $module:ident::$loader:ident,)*) => {$(
            #[cfg(feature = $feature)]
            if family == $feature {
                let work = crate::$module::$loader {
                    dir: dir.to_path_buf(),
                    options,
                };
                return with_backend(backend, precision, work).map(|w| w as Box<dyn ModelRunner>);
            }
        )*};
    }
    engines_first! {
        "t5" => text2text::LoadT5,
        "whisper" => speech::LoadWhisper,
        "clap" => multimodal::LoadClap,
        "xclip" => multimodal::LoadXclip,
    }
    // LLaVA / LLaVA-NeXT: on cuda the tower and the language model on the cuBLAS engines when
    // they can take the checkpoint.
    #[cfg(feature = "llava")]
    if let Some(variant) = match family {
        "llava" => Some(ipfs_accelerate_llava::LlavaVariant::Llava),
        "llava_next" => Some(ipfs_accelerate_llava::LlavaVariant::LlavaNext),
        _ => None,
    } {
        let work = crate::multimodal::LoadLlava {
            dir: dir.to_path_buf(),
            variant,
            options,
        };
        return with_backend(backend, precision, work).map(|w| w as Box<dyn ModelRunner>);
    }
    // BERT, ViT and CLIP (both towers) on cuda: the cuBLAS encoder when it can take the
    // checkpoint, else burn's CubeCL path.
    #[cfg(feature = "cuda")]
    if backend == BackendKind::Cuda {
        let engine = match family {
            #[cfg(feature = "clip")]
            "clip" => crate::backends::cublas_clip(backend, dir, &options)
                .map(|r| Box::new(r) as Box<dyn ModelRunner>),
            _ => crate::backends::cublas_encoder_for(backend, &options, || {
                crate::backends::encoder_spec_of(family, dir)
            }),
        };
        // The CTC head's argmax, which Wav2Vec2's burn runner also gives.
        #[cfg(feature = "wav2vec2")]
        let engine = engine.map(|runner| match family {
            "wav2vec2" => {
                Box::new(ipfs_accelerate_wav2vec2::CtcArgmax(runner)) as Box<dyn ModelRunner>
            }
            _ => runner,
        });
        match engine {
            Ok(runner) => return Ok(runner),
            Err(reason) => tracing::info!(
                "{family} on cuda: the cuBLAS encoder cannot run {} ({reason}); using CubeCL",
                dir.display()
            ),
        }
    }
    macro_rules! dispatch {
        ([$family:expr, $dir:expr, $backend:expr] $($feature:literal => $fam:ty,)*) => {
            match $family {
                $(
                    #[cfg(feature = $feature)]
                    <$fam as Family>::NAME => {
                        with_backend($backend, precision, LoadFamily::<$fam>::new($dir))
                    }
                )*
                other => Err(Error::Unsupported(format!(
                    "family `{other}` is not implemented in this build"
                ))),
            }
        };
    }
    for_each_family!(dispatch, family, dir, backend)
}

/// Loading one family's checkpoint, as work for [`with_backend`].
struct LoadFamily<F> {
    dir: PathBuf,
    family: std::marker::PhantomData<F>,
}

impl<F> LoadFamily<F> {
    #[allow(dead_code)] // unused only in builds without any family
    fn new(dir: &Path) -> Self {
        LoadFamily {
            dir: dir.to_path_buf(),
            family: std::marker::PhantomData,
        }
    }
}

impl<F: Family> WithBackend for LoadFamily<F> {
    type Output = Box<dyn ModelRunner>;

    fn run<H: ipfs_accelerate_core::Backend>(self, hal: &H) -> Result<Self::Output> {
        Ok(F::load::<H::Burn>(&self.dir, &hal.device(), hal.kind())?)
    }
}

/// Runs one fixture on `backend` and compares every output named in its meta.json.
pub fn verify_fixture(fixture: &Fixture, backend: BackendKind) -> Result<Vec<Check>> {
    verify_fixture_in(fixture, backend, Precision::F32)
}

/// [`verify_fixture`] computing in `precision`, against its looser bars
/// ([`ipfs_accelerate_conformance::precision_tolerance`]).
pub fn verify_fixture_in(
    fixture: &Fixture,
    backend: BackendKind,
    precision: Precision,
) -> Result<Vec<Check>> {
    let runner = load_family_in(&fixture.family, &fixture.dir, backend, precision)?;
    let mut checks = verify_runner_in(fixture, backend, precision, runner.as_ref())?;
    if let Some(engine) = runner.engine() {
        for c in &mut checks {
            c.backend = format!("{}/{engine}", c.backend);
        }
    }
    Ok(checks)
}

/// The cuBLAS decoder on weights kept in each ggml block format it reads, against the same
/// engine on the dequantized values (which the fixtures verify against HF): a random Qwen2-shaped
/// model whose sizes are whole numbers of 256-weight super-blocks, its dense layers quantized to
/// the format, then a 20-token prompt (the cuBLAS products on dequantized slices) and 6 cached
/// steps (the GEMV dequantizing in registers, replayed as a CUDA graph) compared as one logits
/// check per format (bar 1e-4 in f32; f16 as the fixtures' f16 bars). Without the `cuda`
/// feature, or without a device, one failed check says why.
pub fn verify_block_formats(precision: Precision) -> Vec<Check> {
    let check = |variant: &str, rel_error: f64, tolerance: f64, note: String| Check {
        family: "qwen2".into(),
        variant: variant.into(),
        backend: "cuda".into(),
        output: "logits".into(),
        rel_error,
        tolerance,
        ok: rel_error <= tolerance,
        note,
    };
    #[cfg(all(feature = "cuda", any(feature = "llama", feature = "qwen2")))]
    {
        let tolerance = precision_tolerance(BackendKind::Cuda, precision, 1e-4);
        match block_format_errors(precision) {
            Ok(errors) => errors
                .into_iter()
                .map(|(name, err)| check(&format!("blocks-{name}"), err, tolerance, String::new()))
                .collect(),
            Err(e) => vec![check("blocks", f64::INFINITY, tolerance, e.to_string())],
        }
    }
    #[cfg(not(all(feature = "cuda", any(feature = "llama", feature = "qwen2"))))]
    vec![check(
        "blocks",
        f64::INFINITY,
        0.0,
        format!("this build has no cuBLAS decoder (features cuda + llama); {precision} not run"),
    )]
}

/// `(format, relative error)` of every block format (see [`verify_block_formats`]).
#[cfg(all(feature = "cuda", any(feature = "llama", feature = "qwen2")))]
fn block_format_errors(precision: Precision) -> Result<Vec<(&'static str, f64)>> {
    use ipfs_accelerate_backend_cublas::{
        Columns, DecoderEngine, EngineError, LogitsOf, BLOCK_FORMATS,
    };
    use ipfs_accelerate_nn::spec::{dense_values, map_decoder_layers, quantize_dense, BlockType};
    const CONFIG: &str = r#"{"model_type":"qwen2","vocab_size":1000,"hidden_size":256,
        "intermediate_size":768,"num_hidden_layers":2,"num_attention_heads":4,
        "num_key_value_heads":2,"tie_word_embeddings":true,"max_position_embeddings":128,
        "rope_theta":10000.0,"rms_norm_eps":1e-6,"hidden_act":"silu"}"#;
    let config = ipfs_accelerate_llama::LlamaConfig::from_json(
        CONFIG,
        Path::new("block-format check"),
        ipfs_accelerate_llama::Architecture::Qwen2,
    )?;
    let base = ipfs_accelerate_llama::decoder_spec_from(
        &config,
        &ipfs_accelerate_io::RandomInit::new(7, 0.05),
    )?;
    let engine_err = |e: EngineError| Error::from(ipfs_accelerate_core::Error::from(e));
    let (prompt, steps) = (20usize, 6usize);
    let ids: Vec<i32> = (0..prompt).map(|i| (3 + i * 37 % 990) as i32).collect();
    let run = |engine: &DecoderEngine| -> Result<Vec<f32>> {
        let mut session = engine.session(1, prompt + steps).map_err(engine_err)?;
        let positions: Vec<i32> = (0..prompt as i32).collect();
        let mask = vec![1; prompt];
        let columns = Columns {
            ids: &ids,
            positions: &positions,
            mask: &mask,
            replaced: None,
        };
        let mut logits = session
            .forward(&columns, prompt, LogitsOf::Every)
            .map_err(engine_err)?;
        for s in 0..steps {
            let id = [(5 + s * 101 % 990) as i32];
            let at = [(prompt + s) as i32];
            let step = Columns {
                ids: &id,
                positions: &at,
                mask: &[1],
                replaced: None,
            };
            logits.extend(
                session
                    .forward(&step, 1, LogitsOf::Last)
                    .map_err(engine_err)?,
            );
        }
        Ok(logits)
    };
    let mut errors = Vec::new();
    for format in BLOCK_FORMATS {
        let ty = BlockType::from_id(format.id)
            .ok_or_else(|| Error::Unsupported(format!("ggml type {}", format.id)))?;
        let mut blocks = base.clone();
        map_decoder_layers(&mut blocks, |d| quantize_dense(d, ty))?;
        let mut dense = blocks.clone();
        map_decoder_layers(&mut dense, dense_values)?;
        let got = run(&DecoderEngine::load(&blocks, precision).map_err(engine_err)?)?;
        let want = run(&DecoderEngine::load(&dense, precision).map_err(engine_err)?)?;
        let (g, w): (Vec<f64>, Vec<f64>) = got
            .iter()
            .zip(&want)
            .map(|(&a, &b)| (f64::from(a), f64::from(b)))
            .unzip();
        errors.push((format.name, relative_error(&g, &w)));
    }
    Ok(errors)
}
