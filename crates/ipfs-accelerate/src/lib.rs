//! # ipfs-accelerate
//!
//! Run HuggingFace model families on whatever hardware a machine has. A [`Pipeline`] resolves a
//! model (local directory, HF cache, hub download, or the embedded default), probes the backends
//! you allow in order of preference, loads the weights on the first usable one (falling back with
//! the reason recorded), and measures every call.
//!
//! ```no_run
//! use ipfs_accelerate::{BackendKind, Pipeline, Task};
//!
//! # fn main() -> ipfs_accelerate::Result<()> {
//! let pipe = Pipeline::builder(ipfs_accelerate::EMBEDDED_SPEC)
//!     .task(Task::Embed)
//!     .backends([BackendKind::Cuda, BackendKind::Cpu])
//!     .build()?;
//! let out = pipe.embed(&["Hello, world!", "Bonjour le monde"], true)?;
//! println!("{} vectors of {} on {}", out.value.len(), out.value[0].len(), out.metrics.backend);
//! for skipped in pipe.skipped() {
//!     println!("skipped {}: {}", skipped.kind, skipped.reason);
//! }
//! # Ok(())
//! # }
//! ```
//!
//! Features pick what is compiled in: backends (`cpu`, `onnx` — ONNX Runtime with the OpenVINO
//! provider —, `webnn`, `cuda`, `rocm`, `metal`, `wgpu`), the 13 families (`bert`, `llama`,
//! `qwen2`, `t5`, `whisper`, `wav2vec2`, `vit`, `clip`, `detr`, `clap`, `xclip`, `llava`,
//! `llava_next`, or `all-families`), `hub` (downloads) and `embedded-default` (the built-in
//! MiniLM). The default is lean: `cpu`, `onnx`, `bert`, `hub`, `embedded-default`; `full` is
//! every family and every backend that builds without a GPU SDK. On docs.rs each item says which
//! feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
// A build with some families leaves helpers of the others unused; the workspace's build (linted
// with -D warnings) has them all.
#![cfg_attr(
    not(all(feature = "default", feature = "all-families")),
    allow(dead_code, unused_imports, unused_variables, unused_macros)
)]

mod assets;
mod backends;
pub mod conformance;
#[cfg(all(
    feature = "cuda",
    any(feature = "llama", feature = "qwen2", feature = "llava")
))]
mod cuda_decoder;
#[cfg(all(feature = "cuda", feature = "llava"))]
mod cuda_llava;
#[cfg(all(feature = "cuda", feature = "t5"))]
mod cuda_t5;
#[cfg(all(
    feature = "cuda",
    any(
        feature = "llama",
        feature = "qwen2",
        feature = "whisper",
        feature = "t5",
        feature = "llava"
    )
))]
mod cuda_tokens;
#[cfg(all(feature = "cuda", feature = "whisper"))]
mod cuda_whisper;
mod error;
mod loaded;
#[cfg(any(feature = "llava", feature = "xclip", feature = "clap"))]
pub mod multimodal;
#[cfg(feature = "onnx")]
pub mod onnx;
#[cfg(feature = "bert")]
mod pipeline;
#[cfg(any(feature = "whisper", feature = "wav2vec2"))]
pub mod speech;
#[cfg(feature = "llama")]
pub mod text;
#[cfg(feature = "t5")]
pub mod text2text;
#[cfg(any(feature = "vit", feature = "clip", feature = "detr"))]
pub mod vision;

#[cfg(embedded_assets)]
pub use assets::embedded;
pub use assets::{EMBEDDED_HUB_ID, EMBEDDED_SPEC};
pub use backends::{
    compiled_backends, compiled_preferences, cublas_encoder, default_preferences, devices,
    kernel_fusion, parse_switch, selector, set_kernel_fusion, CUBLAS_ENV, FUSION_ENV, TF32_ENV,
};
pub use error::{Error, Result};
pub use loaded::{checkpoint_model_type, Label, LoadOptions, Output};
#[cfg(feature = "bert")]
pub use pipeline::{
    calibration_lines, Answer, CalibrationReport, Pipeline, PipelineBuilder, Pooling, Task,
    TokenLabel, DEFAULT_CALIBRATION_TEXT,
};

pub use ipfs_accelerate_core as core;
pub use ipfs_accelerate_core::{
    Availability, BackendKind, DeviceInfo, ExecutionProvider, Metrics, Precision,
};
pub use ipfs_accelerate_nn::{gptq, weights, WeightQuantization};

/// Mono PCM at a sample rate: what the audio tasks take ([`speech::Transcriber`],
/// [`multimodal::AudioClassifier`]).
#[cfg(any(feature = "whisper", feature = "wav2vec2", feature = "clap"))]
pub use ipfs_accelerate_preprocess::audio::Audio;

/// Decodes a WAV file (8/16/24/32-bit PCM or float, any channel count and rate) as mono
/// [`Audio`] at its own rate; the tasks resample it.
#[cfg(any(feature = "whisper", feature = "wav2vec2", feature = "clap"))]
pub fn load_audio(path: impl AsRef<std::path::Path>) -> Result<Audio> {
    let path = path.as_ref();
    Ok(ipfs_accelerate_preprocess::audio::read_wav(path)
        .map_err(ipfs_accelerate_core::Error::from)?)
}

/// The environment variable that overrides the backend preference list (`cuda,wgpu,cpu`).
pub const BACKENDS_ENV: &str = "IPFS_ACCELERATE_BACKENDS";

/// Commonly used items.
pub mod prelude {
    pub use crate::BackendKind;
    #[cfg(feature = "bert")]
    pub use crate::{Pipeline, Task};
}

/// The README's Rust examples, compiled as doctests (`cargo test --doc`) so they stay in step
/// with the API.
#[cfg(all(doctest, feature = "default", feature = "all-families"))]
#[doc = include_str!("../../../README.md")]
pub struct ReadmeDoctests;
