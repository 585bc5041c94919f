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
    // BERT and ViT on cuda: the cuBLAS encoder when it can take the checkpoint, else burn's
    // CubeCL path.
    #[cfg(feature = "cuda")]
    if backend == BackendKind::Cuda {
        let options = crate::LoadOptions {
            precision,
            ..Default::default()
        };
        match crate::backends::cublas_encoder_for(backend, &options, || {
            crate::backends::encoder_spec_of(family, dir)
        }) {
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
