//! # ipfs-accelerate-core
//!
//! The hardware abstraction layer of ipfs-accelerate:
//!
//! - [`BackendKind`] names every backend the SDK knows (CPU, CUDA, ROCm, Metal, WebGPU, ONNX Runtime
//!   execution providers, WebNN) and [`Backend`] is the contract a backend crate implements: probe the
//!   hardware, hand out a burn device, synchronise, report memory.
//! - [`Selector`] walks a preference list, probes each backend and returns the first usable one together
//!   with the reason every earlier preference was skipped.
//! - [`HostTensor`] carries inputs, outputs and weights on the host (shape, dtype, shared bytes);
//!   [`TensorSource`] is what weight files implement so that models can pull named tensors.
//! - [`Metrics`] holds the measured timing breakdown of a call.

mod backend;
mod config;
pub mod decoder;
mod decoder_reference;
pub mod encoder;
pub mod encoder_reference;
mod error;
mod metrics;
mod selector;
pub mod shared;
mod tensor;

pub use backend::{
    set_device_precision, Availability, Backend, BackendKind, BrowserProvider, Capabilities,
    DeviceInfo, ExecutionProvider, Precision, ProbeBackend, WebNnDevice,
};
pub use config::{label_count, label_name, softmax, JsonConfig};
pub use decoder::{
    CrossAttentionWeights, DecoderLayerWeights, DecoderNorm, DecoderPositions, DecoderSpec,
    GatedActivation, RelativeBias, RotarySpec,
};
pub use decoder_reference::ReferenceMemory;
pub use encoder::{
    conv_out_frames, roberta_position_ids, token_position_ids, ConvNorm, DenseWeights,
    EncoderActivation, EncoderHead, EncoderInput, EncoderLayerWeights, EncoderProjection,
    EncoderSpec, FrameConv, FrameEmbeddings, FrameMessages, NormPlacement, NormWeights,
    PatchEmbeddings, PooledToken, Pooler, PositionConv, ProjectionLayer, RowEmbeddings,
    TokenEmbeddings, WaveformEmbeddings,
};
pub use encoder_reference::{ReferenceInput, ReferenceOutput};
pub use error::{Error, Result};
pub use metrics::{Metrics, Stopwatch};
pub use selector::{Selection, Selector, SkippedBackend};
pub use shared::{Residency, SharedError, SharedHandle, SharedTensors, TensorView};
pub use tensor::{
    check_finite, DType, Family, HostTensor, ModelRunner, QuantizedBlocks, TensorMap, TensorSource,
    TokenBatch,
};
