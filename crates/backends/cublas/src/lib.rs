//! # ipfs-accelerate-backend-cublas
//!
//! A transformer engine for NVIDIA GPUs that runs every matrix product through cuBLAS (tensor
//! cores in f16, exact f32 SGEMM in f32) and the rest through a handful of NVRTC-compiled kernels.
//!
//! - [`EncoderRunner`] runs a backend-neutral [`EncoderSpec`] (BERT-style post-norm and ViT-style
//!   pre-norm encoders with their heads; `ipfs_accelerate_bert::encoder_spec` builds one):
//!   embeddings + layer norm, bias + activation, head split / merge, masked softmax, and bias +
//!   residual + layer norm in one pass.
//! - [`DecoderEngine`] runs a [`DecoderSpec`](ipfs_accelerate_core::DecoderSpec) (LLaMA, Qwen2;
//!   `ipfs_accelerate_llama::decoder_spec`) with a device-resident KV cache: fused RoPE + cache
//!   write, causal grouped-query attention over the cache, RMSNorm fused with the residual add,
//!   a GEMV kernel for the decoding step's few rows, and each one-token step replayed as a CUDA
//!   graph.
//!
//! burn's CubeCL kernels stay the path for the other families and for what the specs do not
//! cover (bf16, quantized weights).
//!
//! Why a second engine: burn 0.21's CubeCL CUDA matmul reaches about 46 TFLOP/s on an H100 in f16
//! (cuBLAS several times that) and CubeCL does not expose its CUDA stream, so cuBLAS cannot be
//! called in order with burn's kernels.
//!
//! libcuda, NVRTC and cuBLAS are dlopened on first use; [`probe`] checks all three (without
//! panicking) before anything touches the driver, so a binary built with `cuda` starts anywhere.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use ipfs_accelerate_backend_cublas::{probe, EncoderRunner};
//! use ipfs_accelerate_core::{HostTensor, ModelRunner, Precision, TensorMap};
//!
//! probe()?; // "cuBLAS (libcublas) cannot be loaded ..." on a machine without it
//! let spec = ipfs_accelerate_bert::encoder_spec(std::path::Path::new("models/bert-base"))?;
//! let runner = EncoderRunner::load(&spec, Precision::F16)?;
//! let mut inputs = TensorMap::new();
//! inputs.insert("input_ids".into(), HostTensor::from_i64(vec![1, 4], &[101, 7592, 2088, 102])?);
//! let outputs = runner.run(&inputs)?; // last_hidden_state [1, 4, 768] in f16, pooler_output
//! # Ok(()) }
//! ```

mod compile;
mod decoder;
#[cfg(test)]
mod emulated_kernels_tests;
mod engine;
#[cfg(test)]
mod ggml_blocks_tests;
mod runner;

pub use compile::{COMPILE_THREADS_ENV, KERNEL_CACHE_ENV};
pub use decoder::{
    check_decoder_spec, BlockFormat, Columns, DecodeSession, DecoderEngine, EncoderStates,
    LogitsOf, Replaced, TopRequest, TopTokens, BLOCK_FORMATS, MAX_TOP_VOCAB, TOP_TOKENS,
};
pub use engine::{
    profile_requested, Elem, Encoder, EncoderOutput, Floats, Input, Tokens, PROFILE_ENV,
};
pub use runner::EncoderRunner;

use ipfs_accelerate_core::EncoderSpec;

/// What can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// A library the engine needs cannot be loaded.
    #[error("{0}")]
    Unavailable(String),
    /// The CUDA driver reported an error.
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
    /// cuBLAS reported an error.
    #[error("cuBLAS: {0:?}")]
    Blas(#[from] cudarc::cublas::result::CublasError),
    /// NVRTC could not compile the kernels.
    #[error("NVRTC could not compile the encoder kernels: {0}")]
    Compile(String),
    /// The spec is inconsistent.
    #[error("invalid encoder spec: {0}")]
    Spec(String),
    /// A request's inputs are not what the model takes (a token outside the vocabulary, more
    /// columns than the cache holds).
    #[error("{0}")]
    Input(String),
    /// The computation produced values it cannot go on from (NaN logits).
    #[error("{0}")]
    Numeric(String),
    /// The precision is not one the engine runs.
    #[error("the cuBLAS engine runs f32 and f16, not {0}")]
    Precision(String),
    /// The device could not allocate a buffer of a request.
    #[error("out of device memory: {what} needs {bytes} bytes")]
    OutOfMemory {
        /// What was being allocated, with the request's shape.
        what: String,
        /// The allocation's size.
        bytes: u64,
    },
}

impl From<EngineError> for ipfs_accelerate_core::Error {
    fn from(e: EngineError) -> Self {
        match e {
            EngineError::Unavailable(reason) => ipfs_accelerate_core::Error::BackendUnavailable {
                kind: "cuda (cuBLAS encoder)".into(),
                reason,
            },
            EngineError::OutOfMemory { what, bytes } => ipfs_accelerate_core::Error::OutOfMemory {
                device: "cuda:0".into(),
                what,
                bytes,
            },
            EngineError::Input(reason) => ipfs_accelerate_core::Error::InvalidInput(reason),
            other => ipfs_accelerate_core::Error::Compute(other.to_string()),
        }
    }
}

/// The shared libraries the engine loads, as cudarc names them, with what they are.
const LIBRARIES: &[(&str, &str)] = &[
    ("cuda", "the NVIDIA driver library"),
    ("nvrtc", "NVRTC (the CUDA run-time compiler)"),
    ("cublas", "cuBLAS"),
];

/// Checks that libcuda, NVRTC and cuBLAS can be loaded, under the names cudarc will look for, and
/// that a device exists; never panics. The error says which library is missing and where it was
/// looked for.
pub fn probe() -> Result<(), EngineError> {
    for (lib, what) in LIBRARIES {
        let names = cudarc::get_lib_name_candidates(lib);
        // SAFETY: loading a vendor library runs its initialisers, which is what cudarc does next.
        let found = names
            .iter()
            .any(|name| unsafe { libloading::Library::new(name) }.is_ok());
        if !found {
            return Err(EngineError::Unavailable(format!(
                "{what} (lib{lib}) cannot be loaded: none of {} is on the library path \
                 (LD_LIBRARY_PATH; the CUDA toolkit's lib64, or the nvidia-*-cu12 / cu13 wheels' \
                 lib folders)",
                names
                    .iter()
                    .filter(|n| n.contains(".so"))
                    .take(3)
                    .cloned()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    let count = cudarc::driver::result::init()
        .and_then(|_| cudarc::driver::result::device::get_count())
        .map_err(|e| EngineError::Unavailable(format!("the CUDA driver has no device: {e}")))?;
    if count < 1 {
        return Err(EngineError::Unavailable("no CUDA device".into()));
    }
    Ok(())
}

/// The engine's answer to a description of embedded rows (X-CLIP's MIT): burn runs those.
pub(crate) fn rows_refused() -> EngineError {
    EngineError::Spec("the engine does not run embedded rows (`inputs_embeds`) yet".into())
}

/// Checks a spec before loading (the engine's own limits on top of [`EncoderSpec::validate`]).
pub fn check_spec(spec: &EncoderSpec) -> Result<(), EngineError> {
    spec.validate()
        .map_err(|e| EngineError::Spec(e.to_string()))?;
    // The row kernels keep one row of f32 in shared memory (48 KiB without opting in); they also
    // norm the raw-audio front end's convolution outputs.
    let too_wide = |width: usize| (width + 32) * 4 > 48 * 1024;
    if let ipfs_accelerate_core::EncoderInput::Rows(_) = &spec.input {
        return Err(rows_refused());
    }
    if let ipfs_accelerate_core::EncoderInput::Waveform(w) = &spec.input {
        if let Some(c) = w.convs.iter().find(|c| too_wide(c.conv.out_features)) {
            return Err(EngineError::Spec(format!(
                "a convolution of {} channels exceeds the row kernels' shared memory",
                c.conv.out_features
            )));
        }
    }
    if too_wide(spec.hidden) {
        return Err(EngineError::Spec(format!(
            "hidden size {} exceeds the row kernels' shared memory",
            spec.hidden
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A description of embedded rows (X-CLIP's MIT) is refused before anything is loaded, with
    /// an error naming them: burn runs those.
    #[test]
    fn embedded_rows_are_refused_by_name() {
        use ipfs_accelerate_core::{
            DenseWeights, EncoderActivation, EncoderInput, EncoderLayerWeights, NormPlacement,
            NormWeights, RowEmbeddings,
        };
        let h = 4;
        let dense = |o: usize, i: usize| DenseWeights::new(o, i, vec![0.0; o * i], vec![0.0; o]);
        let norm = || NormWeights {
            gamma: vec![1.0; h],
            beta: vec![0.0; h],
        };
        let spec = EncoderSpec {
            family: "xclip".into(),
            hidden: h,
            heads: 2,
            intermediate: 8,
            eps: 1e-5,
            activation: EncoderActivation::QuickGelu,
            input: EncoderInput::Rows(RowEmbeddings {
                tokens: 3,
                position: vec![0.0; 3 * h],
            }),
            embedding_norm: None,
            norm: NormPlacement::Pre,
            layers: vec![EncoderLayerWeights {
                query: dense(h, h),
                key: dense(h, h),
                value: dense(h, h),
                attention_output: dense(h, h),
                attention_norm: norm(),
                intermediate: dense(8, h),
                output: dense(h, 8),
                output_norm: norm(),
                messages: None,
            }],
            final_norm: None,
            pooler: None,
            head: None,
            causal: false,
            projection: None,
        };
        spec.validate().unwrap();
        match check_spec(&spec) {
            Err(EngineError::Spec(why)) => assert!(why.contains("embedded rows"), "{why}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn probe_names_the_missing_driver_without_panicking() {
        // SAFETY: loading the driver library runs its initialisers only.
        let driver = cudarc::get_lib_name_candidates("cuda")
            .iter()
            .any(|n| unsafe { libloading::Library::new(n) }.is_ok());
        match (driver, probe()) {
            (false, Err(EngineError::Unavailable(reason))) => {
                assert!(reason.contains("NVIDIA driver library"), "{reason}")
            }
            (false, other) => panic!("no driver here, yet the probe said {other:?}"),
            // A machine with the driver: the probe's answer depends on NVRTC, cuBLAS and devices.
            (true, _) => {}
        }
    }
}
