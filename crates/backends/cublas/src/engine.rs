//! The encoder on one CUDA stream: cuBLAS for every product, the NVRTC kernels of `kernels.cu`
//! for embeddings (tokens, or image patches projected by one GEMM), bias + activation, head split
//! / merge, masked softmax and add + layer norm, in post-norm (BERT) or pre-norm (ViT) layers.

use std::sync::{Arc, Mutex};

use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig, StridedBatchedConfig};
use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaSlice, CudaStream, DeviceRepr, LaunchConfig,
    PinnedHostSlice, PushKernelArg, ValidAsZeroBits,
};
use ipfs_accelerate_core::{
    conv_out_frames, ConvNorm, DType, DenseWeights, EncoderActivation, EncoderHead, EncoderInput,
    EncoderSpec, HostTensor, NormPlacement, NormWeights,
};

use crate::compile::{start_compile, KernelModule, KernelSet};
use crate::EngineError;

/// The storage type of the activations and weights (arithmetic is f32 in the kernels; cuBLAS
/// accumulates in f32).
pub trait Elem:
    DeviceRepr + ValidAsZeroBits + bytemuck::Pod + Unpin + Send + Sync + 'static
{
    /// The host dtype of outputs in this type.
    const DTYPE: DType;
    /// The kernel-source prefix defining `T`, `ld` and `st` for this type.
    const PREFIX: &'static str;
    /// Converts from f32 (round to nearest).
    fn from_f32(v: f32) -> Self;
    /// Converts a slice from f32 (SIMD where the type has it).
    fn from_f32_slice(src: &[f32]) -> Vec<Self>;
    /// Converts `src` into `dst` (of the same length).
    fn convert_into(src: &[f32], dst: &mut [Self]);
    /// Converts a slice to f32.
    fn to_f32_vec(src: &[Self]) -> Vec<f32>;
}

impl Elem for f32 {
    const DTYPE: DType = DType::F32;
    const PREFIX: &'static str = "typedef float T;\n\
        __device__ __forceinline__ float ld(T x) { return x; }\n\
        __device__ __forceinline__ T st(float x) { return x; }\n";
    fn from_f32(v: f32) -> Self {
        v
    }
    fn from_f32_slice(src: &[f32]) -> Vec<Self> {
        src.to_vec()
    }
    fn convert_into(src: &[f32], dst: &mut [Self]) {
        dst.copy_from_slice(src);
    }
    fn to_f32_vec(src: &[Self]) -> Vec<f32> {
        src.to_vec()
    }
}

impl Elem for half::f16 {
    const DTYPE: DType = DType::F16;
    const PREFIX: &'static str = "typedef unsigned short T;\n\
        __device__ __forceinline__ float ld(T h) { float f; asm(\"cvt.f32.f16 %0, %1;\" : \"=f\"(f) : \"h\"(h)); return f; }\n\
        __device__ __forceinline__ T st(float f) { T h; asm(\"cvt.rn.f16.f32 %0, %1;\" : \"=h\"(h) : \"f\"(f)); return h; }\n";
    fn from_f32(v: f32) -> Self {
        half::f16::from_f32(v)
    }
    fn from_f32_slice(src: &[f32]) -> Vec<Self> {
        use half::slice::HalfFloatSliceExt;
        let mut out = vec![half::f16::ZERO; src.len()];
        out.convert_from_f32_slice(src);
        out
    }
    fn convert_into(src: &[f32], dst: &mut [Self]) {
        use half::slice::HalfFloatSliceExt;
        dst.convert_from_f32_slice(src);
    }
    fn to_f32_vec(src: &[Self]) -> Vec<f32> {
        use half::slice::HalfFloatSliceExt;
        src.to_f32_vec()
    }
}

/// Threads of the row kernels (layer norm, softmax) and of the element-wise kernels.
const ROW_THREADS: u32 = 256;
/// 16-byte packs of keys one softmax thread holds in registers (`SOFTMAX_PACKS` in kernels.cu).
const SOFTMAX_PACKS: usize = 2;
/// Rows of frames a `channel_norm_act` block reads at once (its block is 32 channels wide).
const CHANNEL_NORM_ROWS: u32 = 16;
/// The longest key row the softmax kernel takes: 1024 threads × [`SOFTMAX_PACKS`] packs of 4 f32
/// (f16 packs hold 8).
pub const MAX_KEYS: usize = 1024 * SOFTMAX_PACKS * 4;

/// Threads per softmax row of `keys` values in packs of `vec`: a multiple of 32, at most 1024.
fn softmax_threads(keys: usize, vec: usize) -> u32 {
    (keys.div_ceil(SOFTMAX_PACKS * vec).div_ceil(32) * 32).clamp(32, 1024) as u32
}

/// The activation codes of `bias_act` in `kernels.cu`.
#[derive(Clone, Copy)]
pub(crate) enum Act {
    Gelu = 0,
    GeluTanh = 1,
    Relu = 2,
    Tanh = 3,
    /// The bias alone.
    None = 4,
    Silu = 5,
    QuickGelu = 6,
    Relu6 = 7,
    Sigmoid = 8,
    Mish = 9,
}

impl From<EncoderActivation> for Act {
    fn from(a: EncoderActivation) -> Act {
        match a {
            EncoderActivation::Gelu => Act::Gelu,
            EncoderActivation::GeluTanh => Act::GeluTanh,
            EncoderActivation::Relu => Act::Relu,
            EncoderActivation::QuickGelu => Act::QuickGelu,
            EncoderActivation::Relu6 => Act::Relu6,
            EncoderActivation::Silu => Act::Silu,
            EncoderActivation::Sigmoid => Act::Sigmoid,
            EncoderActivation::Tanh => Act::Tanh,
            EncoderActivation::Mish => Act::Mish,
            EncoderActivation::Identity => Act::None,
        }
    }
}

struct Kernels {
    embeddings: CudaFunction,
    bias_residual_norm: CudaFunction,
    bias_act: CudaFunction,
    split_heads: CudaFunction,
    merge_heads: CudaFunction,
    masked_softmax: CudaFunction,
    split_heads_vec: CudaFunction,
    merge_heads_vec: CudaFunction,
    bias_act_vec: CudaFunction,
    bias_residual_norm_vec: CudaFunction,
    masked_softmax_warp: CudaFunction,
    add_norm_sum: CudaFunction,
    add_norm_sum_vec: CudaFunction,
    layer_norm: CudaFunction,
    layer_norm_vec: CudaFunction,
    bias_residual_norm_warp: CudaFunction,
    add_norm_sum_warp: CudaFunction,
    layer_norm_warp: CudaFunction,
    patch_embeddings: CudaFunction,
    gather_rows: CudaFunction,
    scatter_rows: CudaFunction,
    patch_rows: CudaFunction,
    frame_rows: CudaFunction,
    frame_embeddings: CudaFunction,
    channel_norm_act: CudaFunction,
    flash_attention_32: CudaFunction,
    flash_attention_64: CudaFunction,
}

/// A context on device `ordinal` with one stream (cudarc's cross-stream events off: every buffer
/// of an engine is used on this stream alone), freed memory kept in the pool, and cuBLAS on it.
pub(crate) fn open_stream(ordinal: usize) -> Result<(Arc<CudaStream>, CudaBlas), EngineError> {
    let ctx = CudaContext::new(ordinal)?;
    // SAFETY: every buffer of the engine is used on the one stream created below.
    unsafe { ctx.disable_event_tracking() };
    keep_freed_memory_pooled(&ctx);
    let stream = ctx.new_stream()?;
    let blas = CudaBlas::new(stream.clone())?;
    Ok((stream, blas))
}

/// The entry points the encoder engine loads (checked against the compiled module by the tests).
pub(crate) const ENCODER_KERNEL_NAMES: [&str; 27] = [
    "embeddings",
    "bias_residual_norm",
    "bias_act",
    "split_heads",
    "merge_heads",
    "masked_softmax",
    "split_heads_vec",
    "merge_heads_vec",
    "bias_act_vec",
    "bias_residual_norm_vec",
    "masked_softmax_warp",
    "add_norm_sum",
    "add_norm_sum_vec",
    "layer_norm",
    "layer_norm_vec",
    "bias_residual_norm_warp",
    "add_norm_sum_warp",
    "layer_norm_warp",
    "patch_embeddings",
    "patch_rows",
    "frame_rows",
    "frame_embeddings",
    "channel_norm_act",
    "gather_rows",
    "scatter_rows",
    "flash_attention_32",
    "flash_attention_64",
];

impl Kernels {
    /// The encoder's entry points in `module`.
    fn from_module(module: &KernelModule) -> Result<Kernels, EngineError> {
        let f = |name: &str| {
            debug_assert!(ENCODER_KERNEL_NAMES.contains(&name), "{name}");
            module.load_function(name)
        };
        Ok(Kernels {
            embeddings: f("embeddings")?,
            bias_residual_norm: f("bias_residual_norm")?,
            bias_act: f("bias_act")?,
            split_heads: f("split_heads")?,
            merge_heads: f("merge_heads")?,
            masked_softmax: f("masked_softmax")?,
            split_heads_vec: f("split_heads_vec")?,
            merge_heads_vec: f("merge_heads_vec")?,
            bias_act_vec: f("bias_act_vec")?,
            bias_residual_norm_vec: f("bias_residual_norm_vec")?,
            masked_softmax_warp: f("masked_softmax_warp")?,
            add_norm_sum: f("add_norm_sum")?,
            add_norm_sum_vec: f("add_norm_sum_vec")?,
            layer_norm: f("layer_norm")?,
            layer_norm_vec: f("layer_norm_vec")?,
            bias_residual_norm_warp: f("bias_residual_norm_warp")?,
            add_norm_sum_warp: f("add_norm_sum_warp")?,
            layer_norm_warp: f("layer_norm_warp")?,
            patch_embeddings: f("patch_embeddings")?,
            patch_rows: f("patch_rows")?,
            frame_rows: f("frame_rows")?,
            frame_embeddings: f("frame_embeddings")?,
            channel_norm_act: f("channel_norm_act")?,
            gather_rows: f("gather_rows")?,
            scatter_rows: f("scatter_rows")?,
            flash_attention_32: f("flash_attention_32")?,
            flash_attention_64: f("flash_attention_64")?,
        })
    }
}

struct Dense<T> {
    weight: CudaSlice<T>,
    bias: CudaSlice<T>,
    out_features: usize,
    in_features: usize,
}

struct Norm<T> {
    gamma: CudaSlice<T>,
    beta: CudaSlice<T>,
}

struct Layer<T> {
    /// Query, key and value stacked: `[3 * hidden, hidden]`.
    qkv: Dense<T>,
    attention_output: Dense<T>,
    attention_norm: Norm<T>,
    intermediate: Dense<T>,
    output: Dense<T>,
    output_norm: Norm<T>,
    messages: Option<Messages<T>>,
}

/// A layer's cross-frame messages ([`ipfs_accelerate_core::FrameMessages`]) on the device.
struct Messages<T> {
    frames: usize,
    fc: Dense<T>,
    norm: Norm<T>,
    /// `message_attn`'s query, key and value stacked: `[3 * hidden, hidden]`.
    qkv: Dense<T>,
    output: Dense<T>,
}

/// The encoder's outputs on the host, in the storage type (f32, or f16 when computing in f16, as
/// HF's outputs are in the model's dtype).
pub struct EncoderOutput {
    /// `[batch, seq, hidden]`.
    pub last_hidden_state: HostTensor,
    /// `[batch, hidden]`, when the checkpoint has a pooler.
    pub pooler_output: Option<HostTensor>,
    /// The task head's output, when the checkpoint has one: `[batch, labels]` for a head over the
    /// first token or the pooled output, `[batch, seq, labels]` over every token (a span head's
    /// two labels are its start and end logits).
    pub logits: Option<HostTensor>,
    /// The projection's output `[batch, out]`, when the spec has one.
    pub projection: Option<HostTensor>,
}

/// A projection of one token per row ([`ipfs_accelerate_core::EncoderProjection`]) on the device.
struct DeviceProjection<T> {
    /// Whether it reads the pooler's output instead of a token.
    pooled: bool,
    norm: Option<Norm<T>>,
    /// A dense layer and activation before `dense`.
    hidden: Option<(Dense<T>, Act)>,
    dense: Dense<T>,
}

/// What a task head reads, on the device.
enum DeviceHead<T> {
    FirstToken(Dense<T>),
    Pooled(Dense<T>),
    EveryToken(Dense<T>),
    /// `down(act(up(h)))` on every token.
    EveryTokenMlp {
        up: Dense<T>,
        act: Act,
        down: Dense<T>,
    },
}

/// `src` copied into a new vector, in chunks on rayon's threads (a large output leaves the pinned
/// staging buffer several times faster than one `memcpy`).
fn parallel_copy<T: Copy + Send + Sync>(src: &[T]) -> Vec<T> {
    const CHUNK: usize = 1 << 18;
    if src.len() <= CHUNK {
        return src.to_vec();
    }
    let mut out = Vec::with_capacity(src.len());
    par_copy_into(&mut out.spare_capacity_mut()[..src.len()], src, CHUNK);
    // SAFETY: the copy above initialised all `src.len()` elements.
    unsafe { out.set_len(src.len()) };
    out
}

/// `src` copied into `dst` (of the same length) in chunks of `chunk` values on rayon's threads;
/// every value of `dst` is initialised after it.
fn par_copy_into<T: Copy + Send + Sync>(
    dst: &mut [std::mem::MaybeUninit<T>],
    src: &[T],
    chunk: usize,
) {
    use rayon::prelude::*;
    assert_eq!(
        dst.len(),
        src.len(),
        "a copy between slices of other lengths"
    );
    dst.par_chunks_mut(chunk)
        .zip(src.par_chunks(chunk))
        .for_each(|(d, s)| {
            // SAFETY: `d` and `s` are disjoint and of equal length; `T: Copy`.
            unsafe {
                std::ptr::copy_nonoverlapping(s.as_ptr(), d.as_mut_ptr().cast::<T>(), s.len())
            }
        });
}

/// Token inputs, checked by the caller: `[batch, seq]` row-major each.
pub struct Tokens<'a> {
    /// Rows.
    pub batch: usize,
    /// Columns.
    pub seq: usize,
    /// Token ids (below the vocabulary size).
    pub ids: &'a [i32],
    /// Segment ids (below the type vocabulary size).
    pub types: &'a [i32],
    /// Position ids (rows of the position table: `0..seq`, or RoBERTa's numbering).
    pub positions: &'a [i32],
    /// 1 for a visible key, 0 for padding.
    pub mask: &'a [i32],
    /// `[batch]`: the position each row's projection reads (the spec's
    /// [`ipfs_accelerate_core::PooledToken`]); empty when the spec has no projection.
    pub pooled: &'a [i32],
}

/// Float inputs of the shape the spec's embeddings read, checked by the caller: images
/// `[batch, channels, height, width]` of the trained size, or feature frames
/// `[batch, channels, frames]` of the trained length, row-major.
pub struct Floats<'a> {
    /// Inputs.
    pub batch: usize,
    /// The values.
    pub values: &'a [f32],
}

/// What one forward reads.
pub enum Input<'a> {
    /// Token ids (an encoder of [`EncoderInput::Tokens`]).
    Tokens(Tokens<'a>),
    /// Images (an encoder of [`EncoderInput::Patches`]).
    Pixels(Floats<'a>),
    /// Feature frames (an encoder of [`EncoderInput::Frames`]).
    Frames(Floats<'a>),
    /// Audio samples `[batch, samples]` (an encoder of [`EncoderInput::Waveform`]).
    Samples(Floats<'a>),
}

impl Input<'_> {
    /// What it holds, for messages.
    fn what(&self) -> &'static str {
        match self {
            Input::Tokens(_) => "tokens",
            Input::Pixels(_) => "images",
            Input::Frames(_) => "feature frames",
            Input::Samples(_) => "audio samples",
        }
    }
}

/// A 1-D convolution of a frame front end on the device: its weight as im2col rows
/// (`[out, in · kernel]`), its geometry, and the frames it reads and writes (fixed by the spec's
/// input length).
struct DeviceConv<T> {
    dense: Dense<T>,
    kernel: usize,
    stride: usize,
    padding: usize,
    in_frames: usize,
    out_frames: usize,
}

/// A convolution of a raw-audio front end: its weight as im2col rows, its geometry (no padding)
/// and the norm of its output.
struct WaveConv<T> {
    dense: Dense<T>,
    kernel: usize,
    stride: usize,
    norm: Option<(ConvNormKind, Norm<T>)>,
}

/// Over what a [`WaveConv`]'s norm runs.
#[derive(Clone, Copy, PartialEq, Eq)]
enum ConvNormKind {
    /// Each channel over the frames (`channel_norm_act`).
    Channel,
    /// Each frame over the channels (the row LayerNorm).
    Frame,
}

/// Wav2Vec2's front end on the device ([`ipfs_accelerate_core::WaveformEmbeddings`]).
struct DeviceWaveform<T> {
    convs: Vec<WaveConv<T>>,
    conv_eps: f32,
    activation: Act,
    projection_norm: Norm<T>,
    projection: Dense<T>,
    /// `[hidden, hidden / groups · kernel]` and its bias.
    position: Dense<T>,
    position_kernel: usize,
    position_groups: usize,
    /// The norm after the positions are added (base checkpoints), when the spec has one.
    norm: Option<Norm<T>>,
    /// Zeros as wide as the widest convolution: the bias of an activation alone.
    zeros: CudaSlice<T>,
}

impl<T> DeviceWaveform<T> {
    /// Tokens for `samples` samples per input (0 when too short for the convolutions).
    fn tokens(&self, samples: usize) -> usize {
        self.convs
            .iter()
            .fold(samples, |n, c| conv_out_frames(n, c.kernel, c.stride, 0))
    }
}

/// The embeddings on the device.
enum DeviceInput<T> {
    Tokens {
        word: CudaSlice<T>,
        position: CudaSlice<T>,
        /// One zero row when the spec has no token types.
        token_type: CudaSlice<T>,
        /// BERT's embedding norm, fused into the embeddings kernel.
        norm: Option<Norm<T>>,
    },
    Patches {
        projection: Dense<T>,
        class: CudaSlice<T>,
        position: CudaSlice<T>,
        channels: usize,
        patch: usize,
        image: (usize, usize),
        /// Tokens per image: the class token and the patches.
        tokens: usize,
        /// The norm after the embeddings, when the spec has one.
        norm: Option<Norm<T>>,
    },
    Frames {
        convs: Vec<DeviceConv<T>>,
        activation: Act,
        position: CudaSlice<T>,
        channels: usize,
        /// Tokens per input: the last convolution's output frames.
        tokens: usize,
    },
    Waveform(Box<DeviceWaveform<T>>),
}

impl<T> DeviceInput<T> {
    /// What it reads, for messages.
    fn what(&self) -> &'static str {
        match self {
            DeviceInput::Tokens { .. } => "tokens",
            DeviceInput::Patches { .. } => "images",
            DeviceInput::Frames { .. } => "feature frames",
            DeviceInput::Waveform(_) => "audio samples",
        }
    }
}

/// An [`EncoderSpec`] resident on the GPU in `T`.
pub struct Encoder<T: Elem> {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    kernels: Kernels,
    hidden: usize,
    heads: usize,
    intermediate: usize,
    eps: f32,
    activation: Act,
    input: DeviceInput<T>,
    placement: NormPlacement,
    layers: Vec<Layer<T>>,
    final_norm: Option<Norm<T>>,
    /// The pooler and its activation.
    pooler: Option<(Dense<T>, Act)>,
    head: Option<DeviceHead<T>>,
    /// Causal attention on top of the padding mask.
    causal: bool,
    projection: Option<DeviceProjection<T>>,
    /// Page-locked host memory the outputs are copied through (grown to the largest output).
    staging: Mutex<Option<PinnedHostSlice<T>>>,
    /// Page-locked host memory image inputs go up through, in `T` (grown to the largest input).
    input_staging: Mutex<Option<PinnedHostSlice<T>>>,
    /// Per-stage device times on stderr after every call ([`PROFILE_ENV`]).
    profile: bool,
    /// Whether attention may run fused on tensor cores (f16 storage, compute capability 8.0
    /// or later, not switched off by [`FUSED_ATTENTION_ENV`]); a call also needs a head size
    /// the kernel takes and a key for every query ([`fused_attention_takes`]).
    fused_attention: bool,
    /// Rows of up to 1024 halves (512 floats) are normalised a warp each (not switched off by
    /// [`WARP_NORM_ENV`]).
    warp_norm: bool,
    /// Inputs and outputs move in pieces that overlap the host's and the device's copies (not
    /// switched off by [`PIPELINED_TRANSFERS_ENV`]).
    pipelined_transfers: bool,
}

/// Set to `1` to print the device time of each stage of every call to stderr.
pub const PROFILE_ENV: &str = "IPFS_ACCELERATE_CUBLAS_PROFILE";

/// Whether [`PROFILE_ENV`] asks for per-stage times.
pub fn profile_requested() -> bool {
    std::env::var(PROFILE_ENV).is_ok_and(|v| v == "1")
}

/// Transfers between the host and the device go in pieces of at least this many bytes, at most
/// [`TRANSFER_PIECES`] of them, so that the host's part of one piece (converting inputs into the
/// page-locked buffer, copying outputs out of it) overlaps the device's copy of the next. Each
/// piece costs the host one fork-join of its threads: on the H200 pieces of 1 MiB made ViT-base
/// b32 (two 9.6 MB transfers) slower; at 4 MiB every encoder shape measured was as fast or faster
/// than one piece (docs/benchmarks.md, session 30).
const TRANSFER_PIECE_BYTES: usize = 4 << 20;
/// The most pieces one transfer is cut into.
const TRANSFER_PIECES: usize = 8;

/// Set to `0` (or `off`) to move every call's inputs and outputs in one piece each: the host's
/// conversion or copy then waits for the whole device copy (before session 30).
pub const PIPELINED_TRANSFERS_ENV: &str = "IPFS_ACCELERATE_CUDA_PIPELINED_TRANSFERS";

/// The ranges a transfer of `n` values of `T` moves in, in order ([`TRANSFER_PIECE_BYTES`]);
/// one range when `pipelined` is false or the transfer is small.
fn transfer_pieces<T>(n: usize, pipelined: bool) -> Vec<std::ops::Range<usize>> {
    let min = TRANSFER_PIECE_BYTES / std::mem::size_of::<T>().max(1);
    let pieces = if pipelined {
        (n / min.max(1)).clamp(1, TRANSFER_PIECES)
    } else {
        1
    };
    let len = n.div_ceil(pieces).max(1);
    (0..n).step_by(len).map(|a| a..(a + len).min(n)).collect()
}

/// Set to `0` (or `off`) to run attention unfused (split into heads, score GEMM, softmax,
/// context GEMM, merge) where the fused kernel would run.
pub const FUSED_ATTENTION_ENV: &str = "IPFS_ACCELERATE_CUDA_FUSED_ATTENTION";

/// Whether the fused attention kernel computes attention for these inputs: a head size it is
/// built for (32 or 64) and, in every input, a visible key for every query (the first key with a
/// causal mask, any key without). A query that sees no key attends to every key it may see in
/// HF's additive mask; the unfused softmax does that, the fused kernel does not.
fn fused_attention_takes(head_size: usize, mask: &[i32], seq: usize, causal: bool) -> bool {
    matches!(head_size, 32 | 64)
        && seq > 0
        && mask.chunks(seq).all(|row| {
            if causal {
                row[0] != 0
            } else {
                row.iter().any(|&m| m != 0)
            }
        })
}

/// Lets the device's default memory pool keep what is freed instead of returning it to the
/// driver at every synchronisation, so the per-call activation buffers (allocated and freed in
/// stream order) come from the pool. Best effort: a device without pools allocates synchronously.
fn keep_freed_memory_pooled(ctx: &CudaContext) {
    use cudarc::driver::sys;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut threshold = u64::MAX;
    // SAFETY: `pool` is written by the driver before use; the attribute takes a u64.
    unsafe {
        if sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) == sys::CUresult::CUDA_SUCCESS
        {
            let _ = sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            );
        }
    }
}

/// The first `n` values of the page-locked buffer in `slot`, grown (reallocated) when it holds
/// fewer. Its contents are unspecified.
///
/// # Safety
/// The caller writes the values before it reads them.
unsafe fn pinned<'a, T: DeviceRepr + ValidAsZeroBits>(
    stream: &Arc<CudaStream>,
    slot: &'a mut Option<PinnedHostSlice<T>>,
    n: usize,
) -> Result<&'a mut [T], EngineError> {
    if slot.as_ref().is_none_or(|p| p.len() < n) {
        *slot = Some(stream.context().alloc_pinned::<T>(n)?);
    }
    let Some(pinned) = slot.as_mut() else {
        unreachable!("allocated above")
    };
    Ok(&mut pinned.as_mut_slice()?[..n])
}

/// `n` values of `T` on the device, in stream order, uninitialised. A buffer the device cannot
/// hold is [`EngineError::OutOfMemory`] naming its size and `what` it is for.
///
/// # Safety
/// The caller writes the values before it reads them.
pub(crate) unsafe fn device_buffer<T: DeviceRepr>(
    stream: &Arc<CudaStream>,
    n: usize,
    what: impl FnOnce() -> String,
) -> Result<CudaSlice<T>, EngineError> {
    stream.alloc::<T>(n).map_err(|e| {
        if e.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
            EngineError::OutOfMemory {
                what: what(),
                bytes: (n * std::mem::size_of::<T>()) as u64,
            }
        } else {
            EngineError::Driver(e)
        }
    })
}

/// Which byte count of the device's default memory pool [`pool_bytes`] reads.
#[derive(Clone, Copy)]
pub(crate) enum PoolBytes {
    /// Allocated now.
    Current,
    /// The most allocated at once since the pool was created.
    Peak,
}

/// Bytes allocated from the default memory pool of `stream`'s device, where every buffer of the
/// engines lives; `None` when the driver cannot say.
pub(crate) fn pool_bytes(stream: &Arc<CudaStream>, which: PoolBytes) -> Option<u64> {
    use cudarc::driver::sys;
    let attribute = match which {
        PoolBytes::Current => sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
        PoolBytes::Peak => sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_HIGH,
    };
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut used = 0u64;
    // SAFETY: `pool` is written by the driver before use; the attribute is a u64.
    unsafe {
        if sys::cuDeviceGetDefaultMemPool(&mut pool, stream.context().cu_device())
            != sys::CUresult::CUDA_SUCCESS
        {
            return None;
        }
        if sys::cuMemPoolGetAttribute(pool, attribute, (&mut used as *mut u64).cast())
            != sys::CUresult::CUDA_SUCCESS
        {
            return None;
        }
    }
    Some(used)
}

/// A launch over `rows × cols` values: one block row per matrix row, blocks of [`ROW_THREADS`]
/// along the columns.
pub(crate) fn rows_by_columns(rows: usize, cols: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, cols.div_ceil(ROW_THREADS as usize) as u32, 1),
        block_dim: (ROW_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A launch over `rows × cols` values like [`rows_by_columns`], with each row's blocks as even as
/// whole warps allow (384 columns: two blocks of 192 threads, not 256 and a half-idle 256).
pub(crate) fn row_blocks(rows: usize, cols: usize) -> LaunchConfig {
    let blocks = cols.div_ceil(ROW_THREADS as usize).max(1);
    let threads = cols.div_ceil(blocks).div_ceil(32).max(1) * 32;
    LaunchConfig {
        grid_dim: (rows as u32, blocks as u32, 1),
        block_dim: (threads as u32, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Launches a norm kernel of `op` whose leading arguments are in `args`: the norm's gamma and
/// beta, epsilon, the row length and `out` follow, then the row count for the `_warp` kernels.
///
/// # Safety
/// The leading arguments and these match the kernel's signature in kernels.cu, and every buffer
/// holds `op.rows` rows of `op.hidden` values.
unsafe fn norm_launch<'a, T: DeviceRepr>(
    mut args: cudarc::driver::LaunchArgs<'a>,
    op: &'a AddNorm<'_>,
    norm: &'a Norm<T>,
    out: &'a mut CudaSlice<T>,
) -> Result<(), EngineError> {
    args.arg(&norm.gamma)
        .arg(&norm.beta)
        .arg(&op.eps)
        .arg(&op.hidden)
        .arg(out);
    if op.warp {
        args.arg(&op.rows);
    }
    args.launch(op.cfg())?;
    Ok(())
}

/// Rows of one block of the warp-per-row norms (a warp each).
const WARP_NORM_ROWS: u32 = 4;
/// Packs a lane of the warp-per-row norms holds (`WARP_NORM_PACKS` in kernels.cu).
const WARP_NORM_PACKS: usize = 4;

/// Set to `0` (or `off`) to run every add + norm with a block per row, as before session 30,
/// where rows of up to 1024 halves (512 floats) take a warp per row.
pub const WARP_NORM_ENV: &str = "IPFS_ACCELERATE_CUDA_WARP_NORM";

/// The add + norm launch of one forward: the kernels (scalar, vectorised, or a warp per row),
/// the rows, epsilon and the row length.
#[derive(Clone, Copy)]
struct AddNorm<'a> {
    kernel: &'a CudaFunction,
    /// The pre-norm kernel that also adds into the residual stream (`add_norm_sum`).
    sum_kernel: &'a CudaFunction,
    /// The plain layer norm (`layer_norm`).
    norm_kernel: &'a CudaFunction,
    /// The `_warp` kernels: a warp per row, and the row count as their last argument.
    warp: bool,
    /// Threads of a block (of a row's block, or of [`WARP_NORM_ROWS`] warps).
    threads: u32,
    rows: i32,
    eps: f32,
    hidden: i32,
}

impl AddNorm<'_> {
    /// The same launch over `rows` rows.
    fn with_rows(self, rows: usize) -> Self {
        AddNorm {
            rows: rows as i32,
            ..self
        }
    }

    fn cfg(&self) -> LaunchConfig {
        let rows = self.rows as u32;
        if self.warp {
            LaunchConfig {
                grid_dim: (rows.div_ceil(WARP_NORM_ROWS), 1, 1),
                block_dim: (self.threads, 1, 1),
                shared_mem_bytes: 0,
            }
        } else {
            LaunchConfig {
                grid_dim: (rows, 1, 1),
                block_dim: (self.threads, 1, 1),
                shared_mem_bytes: ((self.hidden + 32) * 4) as u32,
            }
        }
    }
}

/// The residual of an add + norm: read, or updated in place with the sum (pre-norm).
enum Residual<'a, T> {
    Read(&'a CudaSlice<T>),
    Update(&'a mut CudaSlice<T>),
}

/// Values of `T` in one 16-byte access of the `_vec` kernels (`VEC` in kernels.cu).
pub(crate) fn vec_width<T>() -> usize {
    16 / std::mem::size_of::<T>()
}

/// Queries per block of the fused attention kernel (`FLASH_ROWS` in kernels.cu; two threads
/// each).
pub(crate) const FLASH_ROWS: usize = 64;

/// The shape of one layer's attention.
#[derive(Clone, Copy)]
struct AttentionDims {
    batch: usize,
    seq: usize,
    heads: usize,
    head_size: usize,
}

impl AttentionDims {
    /// The unfused path's key rows per head: `seq` padded to a multiple of 8 (kept zero), so
    /// the attention products read aligned rows, which cuBLAS's tensor-core kernels need (ViT's
    /// 197 tokens or Whisper's 1500 otherwise fall to slow ones). Score rows are as long.
    fn keys(&self) -> usize {
        self.seq.next_multiple_of(8)
    }
}

/// The message row of each of `batch` inputs of `seq` rows (their indices on the device).
#[derive(Clone, Copy)]
struct Rows<'a> {
    rows: &'a CudaSlice<i32>,
    batch: usize,
    seq: usize,
}

/// One layer's attention buffers when it runs unfused: q, k and v split into heads (`[batch,
/// heads, keys, head size]`, keys padded to a multiple of 8), the score rows and the context
/// per head.
struct HeadBuffers<T> {
    q: CudaSlice<T>,
    k: CudaSlice<T>,
    v: CudaSlice<T>,
    scores: CudaSlice<T>,
    ctx: CudaSlice<T>,
}

impl<T: DeviceRepr + ValidAsZeroBits> HeadBuffers<T> {
    /// The buffers of one call's unfused attention over `dims`, from `alloc`. The query GEMM
    /// operand reads only the `seq` real rows, so only the keys and values padded past them are
    /// cleared.
    fn new(
        stream: &Arc<CudaStream>,
        dims: AttentionDims,
        alloc: &dyn Fn(usize) -> Result<CudaSlice<T>, EngineError>,
    ) -> Result<Self, EngineError> {
        let AttentionDims {
            batch,
            seq,
            heads,
            head_size,
        } = dims;
        let keys = dims.keys();
        let head_values = batch * heads * keys * head_size;
        let (q, mut k, mut v) = (
            alloc(head_values)?,
            alloc(head_values)?,
            alloc(head_values)?,
        );
        if keys != seq {
            for buffer in [&mut k, &mut v] {
                stream.memset_zeros(buffer)?;
            }
        }
        Ok(HeadBuffers {
            q,
            k,
            v,
            scores: alloc(batch * heads * seq * keys)?,
            ctx: alloc(batch * seq * heads * head_size)?,
        })
    }
}

/// Keys per row the warp-per-row softmax takes (32 lanes × `WARP_PACKS` packs in kernels.cu).
const WARP_SOFTMAX_KEYS: usize = 256;
/// Rows (warps) per block of the warp-per-row softmax.
const WARP_SOFTMAX_ROWS: u32 = 4;

/// Device time per stage, from events recorded after each stage ([`PROFILE_ENV`]).
pub(crate) struct Profile<'a> {
    stream: Option<&'a Arc<CudaStream>>,
    marks: Vec<(&'static str, CudaEvent)>,
}

impl<'a> Profile<'a> {
    pub(crate) fn new(stream: Option<&'a Arc<CudaStream>>) -> Result<Self, EngineError> {
        let mut p = Profile {
            stream,
            marks: Vec::new(),
        };
        p.mark("start")?;
        Ok(p)
    }

    pub(crate) fn mark(&mut self, stage: &'static str) -> Result<(), EngineError> {
        if let Some(s) = self.stream {
            let flags = cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT;
            self.marks.push((stage, s.record_event(Some(flags))?));
        }
        Ok(())
    }

    /// Prints the summed time of each stage, in first-seen order.
    pub(crate) fn report(self, what: &str, batch: usize, seq: usize) -> Result<(), EngineError> {
        let mut totals: Vec<(&str, f32)> = Vec::new();
        for pair in self.marks.windows(2) {
            let ms = pair[0].1.elapsed_ms(&pair[1].1)?;
            match totals.iter_mut().find(|(n, _)| *n == pair[1].0) {
                Some((_, t)) => *t += ms,
                None => totals.push((pair[1].0, ms)),
            }
        }
        if !totals.is_empty() {
            let sum: f32 = totals.iter().map(|(_, t)| t).sum();
            let parts: Vec<String> = totals.iter().map(|(n, t)| format!("{n} {t:.3}")).collect();
            eprintln!(
                "cublas {what} b{batch}×{seq}: {sum:.3} ms on the device = {}",
                parts.join(", ")
            );
        }
        Ok(())
    }
}

impl<T: Elem> Encoder<T>
where
    CudaBlas: Gemm<T>,
{
    /// Checks `spec` ([`crate::check_spec`]), compiles the kernels and uploads it to device
    /// `ordinal`.
    pub fn load(spec: &EncoderSpec, ordinal: usize) -> Result<Self, EngineError> {
        crate::check_spec(spec)?;
        // NVRTC works on its own threads while the context opens and the weights go up.
        let compiling = start_compile::<T>(ordinal, KernelSet::ENCODER)?;
        let (stream, blas) = open_stream(ordinal)?;
        let up = |v: &[f32]| -> Result<CudaSlice<T>, EngineError> {
            Ok(stream.clone_htod(&T::from_f32_slice(v))?)
        };
        let dense = |d: &DenseWeights| -> Result<Dense<T>, EngineError> {
            if d.blocks.is_some() {
                return Err(EngineError::Spec(
                    "the encoder takes float weights, not ggml blocks".into(),
                ));
            }
            Ok(Dense {
                weight: up(&d.weight)?,
                bias: up(&d.bias)?,
                out_features: d.out_features,
                in_features: d.in_features,
            })
        };
        let norm = |n: &NormWeights| -> Result<Norm<T>, EngineError> {
            Ok(Norm {
                gamma: up(&n.gamma)?,
                beta: up(&n.beta)?,
            })
        };
        let mut layers = Vec::with_capacity(spec.layers.len());
        // Query, key and value stacked into one `[3 * hidden, hidden]` product.
        let qkv_of = |q: &DenseWeights, k: &DenseWeights, v: &DenseWeights| {
            let stacked = |parts: [&Vec<f32>; 3]| {
                parts
                    .iter()
                    .flat_map(|p| p.iter().copied())
                    .collect::<Vec<f32>>()
            };
            dense(&DenseWeights::new(
                3 * spec.hidden,
                spec.hidden,
                stacked([&q.weight, &k.weight, &v.weight]),
                stacked([&q.bias, &k.bias, &v.bias]),
            ))
        };
        for l in &spec.layers {
            let messages = match &l.messages {
                None => None,
                Some(m) => Some(Messages {
                    frames: m.frames,
                    fc: dense(&m.fc)?,
                    norm: norm(&m.norm)?,
                    qkv: qkv_of(&m.query, &m.key, &m.value)?,
                    output: dense(&m.output)?,
                }),
            };
            layers.push(Layer {
                qkv: qkv_of(&l.query, &l.key, &l.value)?,
                messages,
                attention_output: dense(&l.attention_output)?,
                attention_norm: norm(&l.attention_norm)?,
                intermediate: dense(&l.intermediate)?,
                output: dense(&l.output)?,
                output_norm: norm(&l.output_norm)?,
            });
        }
        let input = match &spec.input {
            EncoderInput::Tokens(t) => DeviceInput::Tokens {
                word: up(&t.word)?,
                position: up(&t.position)?,
                token_type: match &t.token_type {
                    Some(types) => up(types)?,
                    None => up(&vec![0.0; spec.hidden])?,
                },
                norm: spec.embedding_norm.as_ref().map(norm).transpose()?,
            },
            EncoderInput::Patches(p) => DeviceInput::Patches {
                projection: dense(&p.projection)?,
                class: up(&p.class)?,
                position: up(&p.position)?,
                channels: p.channels,
                patch: p.patch,
                image: p.image,
                tokens: p.tokens(),
                norm: spec.embedding_norm.as_ref().map(norm).transpose()?,
            },
            EncoderInput::Frames(f) => DeviceInput::Frames {
                convs: f
                    .convs
                    .iter()
                    .scan(f.frames, |frames, c| {
                        let in_frames = *frames;
                        *frames = c.out_frames(in_frames);
                        Some(dense(&c.conv).map(|dense| DeviceConv {
                            dense,
                            kernel: c.kernel,
                            stride: c.stride,
                            padding: c.padding,
                            in_frames,
                            out_frames: *frames,
                        }))
                    })
                    .collect::<Result<_, EngineError>>()?,
                activation: f.activation.into(),
                position: up(&f.position)?,
                channels: f.channels,
                tokens: f.tokens(),
            },
            EncoderInput::Waveform(w) => {
                let mut convs = Vec::with_capacity(w.convs.len());
                for (c, n) in w.convs.iter().zip(&w.norms) {
                    convs.push(WaveConv {
                        dense: dense(&c.conv)?,
                        kernel: c.kernel,
                        stride: c.stride,
                        norm: match n {
                            None => None,
                            Some(ConvNorm::Channel(n)) => Some((ConvNormKind::Channel, norm(n)?)),
                            Some(ConvNorm::Frame(n)) => Some((ConvNormKind::Frame, norm(n)?)),
                        },
                    });
                }
                let widest = w.convs.iter().map(|c| c.conv.out_features).max();
                DeviceInput::Waveform(Box::new(DeviceWaveform {
                    convs,
                    conv_eps: w.conv_eps,
                    activation: w.activation.into(),
                    projection_norm: norm(&w.projection_norm)?,
                    projection: dense(&w.projection)?,
                    position: dense(&w.position.conv)?,
                    position_kernel: w.position.kernel,
                    position_groups: w.position.groups,
                    norm: spec.embedding_norm.as_ref().map(norm).transpose()?,
                    zeros: stream.alloc_zeros(widest.unwrap_or(0).max(spec.hidden))?,
                }))
            }
            EncoderInput::Rows(_) => return Err(crate::rows_refused()),
        };
        let kernels = Kernels::from_module(&compiling.load(stream.context())?)?;
        let fused_attention = T::DTYPE == DType::F16
            && stream.context().compute_capability()?.0 >= 8
            && !crate::decoder::switched_off(FUSED_ATTENTION_ENV);
        let encoder = Encoder {
            blas,
            kernels,
            hidden: spec.hidden,
            heads: spec.heads,
            intermediate: spec.intermediate,
            eps: spec.eps,
            activation: spec.activation.into(),
            input,
            placement: spec.norm,
            layers,
            final_norm: spec.final_norm.as_ref().map(norm).transpose()?,
            pooler: spec
                .pooler
                .as_ref()
                .map(|p| Ok::<_, EngineError>((dense(&p.dense)?, p.activation.into())))
                .transpose()?,
            head: match &spec.head {
                None => None,
                Some(EncoderHead::FirstToken(d)) => Some(DeviceHead::FirstToken(dense(d)?)),
                Some(EncoderHead::Pooled(d)) => Some(DeviceHead::Pooled(dense(d)?)),
                Some(EncoderHead::EveryToken(d) | EncoderHead::Span(d)) => {
                    Some(DeviceHead::EveryToken(dense(d)?))
                }
                Some(EncoderHead::EveryTokenMlp {
                    up,
                    activation,
                    down,
                }) => Some(DeviceHead::EveryTokenMlp {
                    up: dense(up)?,
                    act: (*activation).into(),
                    down: dense(down)?,
                }),
            },
            causal: spec.causal,
            projection: match &spec.projection {
                None => None,
                Some(p) => Some(DeviceProjection {
                    pooled: p.token == ipfs_accelerate_core::PooledToken::Pooler,
                    norm: p.norm.as_ref().map(norm).transpose()?,
                    hidden: p
                        .hidden
                        .as_ref()
                        .map(|l| Ok::<_, EngineError>((dense(&l.dense)?, l.activation.into())))
                        .transpose()?,
                    dense: dense(&p.dense)?,
                }),
            },
            stream,
            staging: Mutex::new(None),
            input_staging: Mutex::new(None),
            profile: profile_requested(),
            fused_attention,
            warp_norm: !crate::decoder::switched_off(WARP_NORM_ENV),
            pipelined_transfers: !crate::decoder::switched_off(PIPELINED_TRANSFERS_ENV),
        };
        encoder.stream.synchronize()?;
        Ok(encoder)
    }

    /// Whether the checkpoint has a pooler.
    pub fn has_pooler(&self) -> bool {
        self.pooler.is_some()
    }

    /// Waits for the stream.
    pub fn synchronize(&self) -> Result<(), EngineError> {
        Ok(self.stream.synchronize()?)
    }

    /// Bytes allocated from the device's default memory pool, where every buffer of the engine
    /// lives (weights and, during a call, activations); `None` when the driver cannot say.
    pub fn memory_in_use(&self) -> Option<u64> {
        pool_bytes(&self.stream, PoolBytes::Current)
    }

    /// The add + norm launches over `rows` rows of `width` values: the 16-byte-pack kernels when
    /// `width` is a multiple of the pack.
    fn add_norm_for(&self, rows: usize, width: usize, eps: f32) -> AddNorm<'_> {
        let vec = vec_width::<T>();
        let k = &self.kernels;
        let op = |kernel, sum_kernel, norm_kernel, warp, threads| AddNorm {
            kernel,
            sum_kernel,
            norm_kernel,
            warp,
            threads,
            rows: rows as i32,
            eps,
            hidden: width as i32,
        };
        if !width.is_multiple_of(vec) {
            return op(
                &k.bias_residual_norm,
                &k.add_norm_sum,
                &k.layer_norm,
                false,
                ROW_THREADS,
            );
        }
        if self.warp_norm && width / vec <= 32 * WARP_NORM_PACKS {
            return op(
                &k.bias_residual_norm_warp,
                &k.add_norm_sum_warp,
                &k.layer_norm_warp,
                true,
                32 * WARP_NORM_ROWS,
            );
        }
        let threads = (width / vec).div_ceil(32).clamp(1, 32) as u32 * 32;
        op(
            &k.bias_residual_norm_vec,
            &k.add_norm_sum_vec,
            &k.layer_norm_vec,
            false,
            threads,
        )
    }

    /// `y[rows, out] = x[rows, in] · Wᵀ` (no bias), reading row `r` of `x` at `r * x_stride`.
    fn linear(
        &self,
        x: &CudaSlice<T>,
        x_stride: usize,
        rows: usize,
        d: &Dense<T>,
        y: &mut CudaSlice<T>,
    ) -> Result<(), EngineError> {
        let cfg = GemmConfig {
            transa: CUBLAS_OP_T,
            transb: CUBLAS_OP_N,
            m: d.out_features as i32,
            n: rows as i32,
            k: d.in_features as i32,
            alpha: T::from_f32(1.0),
            lda: d.in_features as i32,
            ldb: x_stride as i32,
            beta: T::from_f32(0.0),
            ldc: d.out_features as i32,
        };
        // SAFETY: the sizes above match the buffers' allocations (checked by the spec and by
        // `forward`'s allocation sizes).
        unsafe { self.blas.gemm(cfg, &d.weight, x, y) }?;
        Ok(())
    }

    /// Runs the encoder on `input` (tokens or images, as the spec's embeddings read).
    pub fn forward(&self, input: &Input<'_>) -> Result<EncoderOutput, EngineError> {
        let (batch, seq) = match (input, &self.input) {
            (Input::Tokens(t), DeviceInput::Tokens { .. }) => (t.batch, t.seq),
            (Input::Pixels(p), DeviceInput::Patches { tokens, .. }) => {
                // Cross-frame messages: whole videos, and one more row per frame (its message).
                if let Some(frames) = self.frames() {
                    if p.batch == 0 || !p.batch.is_multiple_of(frames) {
                        return Err(EngineError::Input(format!(
                            "{} frames are not a whole number of {frames}-frame videos",
                            p.batch
                        )));
                    }
                }
                (p.batch, *tokens + self.message_rows())
            }
            (Input::Frames(p), DeviceInput::Frames { tokens, .. }) => (p.batch, *tokens),
            (Input::Samples(p), DeviceInput::Waveform(w)) => {
                let samples = p.values.len() / p.batch.max(1);
                let tokens = w.tokens(samples);
                if p.batch == 0 || tokens == 0 || p.values.len() != p.batch * samples {
                    return Err(EngineError::Input(format!(
                        "{} samples do not make {} inputs long enough for one token",
                        p.values.len(),
                        p.batch
                    )));
                }
                (p.batch, tokens)
            }
            _ => {
                return Err(EngineError::Spec(format!(
                    "this encoder reads {}, not {}",
                    self.input.what(),
                    input.what()
                )))
            }
        };
        let (h, heads, inter) = (self.hidden, self.heads, self.intermediate);
        let dh = h / heads;
        let m = batch * seq;
        let s = &self.stream;
        s.context().bind_to_thread()?;
        let mut profile = Profile::new(self.profile.then_some(s))?;
        // SAFETY (allocations): every buffer is written in full before it is read. The buffers
        // of this call are freed as an error returns, so later (smaller) calls still run.
        let alloc = |n: usize| -> Result<CudaSlice<T>, EngineError> {
            unsafe {
                device_buffer(&self.stream, n, || {
                    format!("a buffer of {n} values for {batch} input(s) of {seq} tokens")
                })
            }
        };
        let mut x = alloc(m * h)?;
        let norm_cfg = LaunchConfig {
            grid_dim: (m as u32, 1, 1),
            block_dim: (ROW_THREADS, 1, 1),
            shared_mem_bytes: ((h + 32) * 4) as u32,
        };
        let (seq_i, h_i) = (seq as i32, h as i32);
        let eps = self.eps;
        let add_norm = self.add_norm_for(m, h, eps);
        let mask = match (input, &self.input) {
            (
                Input::Tokens(tokens),
                DeviceInput::Tokens {
                    word,
                    position,
                    token_type,
                    norm,
                },
            ) => {
                let ids = s.clone_htod(tokens.ids)?;
                let types = s.clone_htod(tokens.types)?;
                let positions = s.clone_htod(tokens.positions)?;
                let mask = s.clone_htod(tokens.mask)?;
                profile.mark("upload")?;
                // Without a norm the kernel reads neither table: any buffer stands in.
                let (gamma, beta) = norm.as_ref().map_or((word, word), |n| (&n.gamma, &n.beta));
                let normalize = norm.is_some() as i32;
                // SAFETY: `embeddings` as declared in kernels.cu; ids, types and positions index
                // inside the tables (checked by the runner).
                unsafe {
                    self.launch(&self.kernels.embeddings)
                        .arg(&ids)
                        .arg(&types)
                        .arg(&positions)
                        .arg(word)
                        .arg(position)
                        .arg(token_type)
                        .arg(gamma)
                        .arg(beta)
                        .arg(&eps)
                        .arg(&h_i)
                        .arg(&normalize)
                        .arg(&mut x)
                        .launch(norm_cfg)?;
                }
                mask
            }
            (
                Input::Pixels(pixels),
                DeviceInput::Patches {
                    projection,
                    class,
                    position,
                    channels,
                    patch,
                    image,
                    norm,
                    ..
                },
            ) => {
                // The pixels go up in `T` through page-locked memory; the device gathers the
                // patch rows, each in the projection's (channel, y, x) order, so the strided
                // convolution is one GEMM.
                let px = self.upload_converted(pixels.values)?;
                let mask = s.clone_htod(&vec![1i32; m])?;
                profile.mark("upload")?;
                let tokens = seq - self.message_rows();
                let rows = batch * (tokens - 1);
                let mut patches = alloc(rows * projection.in_features)?;
                let (c_i, ph_i, pw_i, p_i) = (
                    *channels as i32,
                    image.0 as i32,
                    image.1 as i32,
                    *patch as i32,
                );
                // SAFETY: `patch_rows(px, channels, height, width, patch, out)` over `rows`
                // rows of `channels · patch²` values; `px` holds `batch` images of that size
                // (checked by the runner).
                unsafe {
                    self.launch(&self.kernels.patch_rows)
                        .arg(&px)
                        .arg(&c_i)
                        .arg(&ph_i)
                        .arg(&pw_i)
                        .arg(&p_i)
                        .arg(&mut patches)
                        .launch(rows_by_columns(rows, projection.in_features))?;
                }
                let mut pe = alloc(rows * h)?;
                self.linear(&patches, projection.in_features, rows, projection, &mut pe)?;
                // SAFETY: `patch_embeddings(pe, bias, cls, pos, tokens, stride, hidden, out)`
                // over `batch · seq` rows of `hidden` (`seq` apart, zeros past `tokens`); `pe`
                // holds `batch · (tokens - 1)` of them.
                let tokens_i = tokens as i32;
                unsafe {
                    self.launch(&self.kernels.patch_embeddings)
                        .arg(&pe)
                        .arg(&projection.bias)
                        .arg(class)
                        .arg(position)
                        .arg(&tokens_i)
                        .arg(&seq_i)
                        .arg(&h_i)
                        .arg(&mut x)
                        .launch(rows_by_columns(m, h))?;
                }
                if let Some(n) = norm {
                    let y = x.clone();
                    self.layer_norm(&add_norm, &y, n, &mut x)?;
                }
                mask
            }
            (
                Input::Frames(features),
                DeviceInput::Frames {
                    convs,
                    activation,
                    position,
                    channels,
                    ..
                },
            ) => {
                let mask = s.clone_htod(&vec![1i32; m])?;
                let px = self.upload_converted(features.values)?;
                profile.mark("upload")?;
                self.frame_convolutions(
                    px,
                    (batch, *channels),
                    convs,
                    *activation,
                    position,
                    &mut x,
                )?;
                mask
            }
            (Input::Samples(audio), DeviceInput::Waveform(wave)) => {
                let mask = s.clone_htod(&vec![1i32; m])?;
                let px = self.upload_converted(audio.values)?;
                profile.mark("upload")?;
                self.waveform_embeddings(px, batch, wave, &mut x)?;
                if let Some(n) = &wave.norm {
                    let y = x.clone();
                    self.layer_norm(&add_norm, &y, n, &mut x)?;
                }
                mask
            }
            _ => unreachable!("matched above"),
        };
        let mut qkv = alloc(m * 3 * h)?;
        let fused = self.fused_attention
            && match input {
                Input::Tokens(t) => fused_attention_takes(dh, t.mask, seq, self.causal),
                _ => fused_attention_takes(dh, &[], seq, self.causal),
            };
        let dims = AttentionDims {
            batch,
            seq,
            heads,
            head_size: dh,
        };
        let mut unfused = if fused {
            None
        } else {
            Some(HeadBuffers::new(s, dims, &alloc)?)
        };
        let mut merged = alloc(m * h)?;
        let mut y = alloc(m * h)?;
        let mut h1 = alloc(m * h)?;
        let mut ff = alloc(m * inter)?;
        profile.mark("embeddings")?;
        let pre = self.placement == NormPlacement::Pre;
        // Pre-norm: `h1` holds the norm of the residual stream `x` that the next block reads.
        // Without a final norm, the last residual add writes the projection's norm of every
        // token (CLIP's `post_layernorm`, which the projection reads from `h1`). Without either
        // (a tower read at an inner layer, as LLaVA reads CLIP's) the outputs are the stream `x`
        // and the last norm into `h1` (the first layer's, any would do) is not read.
        let projection_norm = self.projection.as_ref().and_then(|p| p.norm.as_ref());
        let next_norm = |l: usize| {
            self.layers
                .get(l)
                .map(|layer| &layer.attention_norm)
                .or(self.final_norm.as_ref())
                .or(projection_norm)
                .or(self.layers.first().map(|layer| &layer.attention_norm))
        };
        if pre {
            if let Some(n) = next_norm(0) {
                self.layer_norm(&add_norm, &x, n, &mut h1)?;
            }
        }
        // Each frame's message row: the last of its `seq`.
        let message_rows = match self.message_rows() {
            0 => None,
            _ => Some(
                s.clone_htod(
                    &(0..batch)
                        .map(|b| (b * seq + seq - 1) as i32)
                        .collect::<Vec<_>>(),
                )?,
            ),
        };
        for (l, layer) in self.layers.iter().enumerate() {
            if let (Some(msg), Some(rows)) = (&layer.messages, &message_rows) {
                let ends = Rows { rows, batch, seq };
                let residual = (&mut x, &mut h1);
                self.frame_messages(msg, layer, ends, residual, &mask, &add_norm, &alloc)?;
                profile.mark("cross-frame messages")?;
            }
            self.linear(if pre { &h1 } else { &x }, h, m, &layer.qkv, &mut qkv)?;
            profile.mark("qkv gemm")?;
            match unfused.as_mut() {
                Some(u) => {
                    let bias = &layer.qkv.bias;
                    self.unfused_attention(dims, &qkv, bias, &mask, u, &mut merged, &mut profile)?;
                    profile.mark("merge heads")?;
                }
                None => {
                    self.fused_attention(dims, &qkv, &layer.qkv.bias, &mask, &mut merged)?;
                    profile.mark("fused attention")?;
                }
            }
            self.linear(&merged, h, m, &layer.attention_output, &mut y)?;
            profile.mark("attention output gemm")?;
            if pre {
                // x += y + bias; h1 = norm before the feed-forward block (x).
                let n = &layer.output_norm;
                self.add_norm_sum(&add_norm, &y, &layer.attention_output, &mut x, n, &mut h1)?;
            } else {
                let n = &layer.attention_norm;
                self.add_norm(&add_norm, &y, &layer.attention_output, &x, n, &mut h1)?;
            }
            profile.mark("add + norm")?;
            self.linear(&h1, h, m, &layer.intermediate, &mut ff)?;
            profile.mark("ffn up gemm")?;
            self.bias_act(&mut ff, &layer.intermediate.bias, m, inter, self.activation)?;
            profile.mark("bias + activation")?;
            self.linear(&ff, inter, m, &layer.output, &mut y)?;
            profile.mark("ffn down gemm")?;
            if pre {
                // x += y + bias; h1 = the next layer's first norm, or the final norm (x).
                let n = next_norm(l + 1)
                    .ok_or_else(|| EngineError::Spec("a pre-norm encoder without layers".into()))?;
                self.add_norm_sum(&add_norm, &y, &layer.output, &mut x, n, &mut h1)?;
            } else {
                let n = &layer.output_norm;
                self.add_norm(&add_norm, &y, &layer.output, &h1, n, &mut x)?;
            }
            profile.mark("add + norm")?;
        }
        // The final hidden states: pre-norm, the final norm of the stream (in h1).
        let out = if pre && self.final_norm.is_some() {
            &h1
        } else {
            &x
        };
        // `dense` over `rows` rows of `x` (stride `stride`), its bias and `act`, on the device.
        let dense_rows = |x: &CudaSlice<T>,
                          stride: usize,
                          rows: usize,
                          dense: &Dense<T>,
                          act: Act|
         -> Result<CudaSlice<T>, EngineError> {
            let n = dense.out_features;
            let mut y = alloc(rows * n)?;
            self.linear(x, stride, rows, dense, &mut y)?;
            self.bias_act(&mut y, &dense.bias, rows, n, act)?;
            Ok(y)
        };
        // The pooler reads the first token of each row: row b of `out` at stride seq * hidden.
        let pooled = self
            .pooler
            .as_ref()
            .map(|(p, act)| dense_rows(out, seq * h, batch, p, *act))
            .transpose()?;
        // The pooled output's width (the hidden size, or a ViT pooler's own).
        let pw = self.pooler.as_ref().map_or(h, |(p, _)| p.out_features);
        let pooler_output = pooled
            .as_ref()
            .map(|p| self.to_host(p, vec![batch, pw]))
            .transpose()?;
        let logits = match &self.head {
            None => None,
            Some(DeviceHead::FirstToken(d)) => {
                let y = dense_rows(out, seq * h, batch, d, Act::None)?;
                Some(self.to_host(&y, vec![batch, d.out_features])?)
            }
            Some(DeviceHead::Pooled(d)) => {
                let p = pooled.as_ref().ok_or_else(|| {
                    EngineError::Spec("a head over the pooled output needs a pooler".into())
                })?;
                let y = dense_rows(p, pw, batch, d, Act::None)?;
                Some(self.to_host(&y, vec![batch, d.out_features])?)
            }
            Some(DeviceHead::EveryToken(d)) => {
                let y = dense_rows(out, h, batch * seq, d, Act::None)?;
                Some(self.to_host(&y, vec![batch, seq, d.out_features])?)
            }
            Some(DeviceHead::EveryTokenMlp { up, act, down }) => {
                let inner = dense_rows(out, h, batch * seq, up, *act)?;
                let y = dense_rows(&inner, up.out_features, batch * seq, down, Act::None)?;
                Some(self.to_host(&y, vec![batch, seq, down.out_features])?)
            }
        };
        let projection = match &self.projection {
            None => None,
            Some(p) if p.pooled => {
                let pooled = pooled.as_ref().ok_or_else(|| {
                    EngineError::Spec("a projection of the pooled output needs a pooler".into())
                })?;
                let y = self.project(p, pooled, batch, pw, &dense_rows)?;
                Some(self.to_host(&y, vec![batch, p.dense.out_features])?)
            }
            Some(p) => {
                let rows: Vec<i32> = match input {
                    Input::Tokens(t) => (0..batch)
                        .map(|b| (b * seq) as i32 + t.pooled.get(b).copied().unwrap_or(0))
                        .collect(),
                    Input::Pixels(_) | Input::Frames(_) | Input::Samples(_) => {
                        (0..batch).map(|b| (b * seq) as i32).collect()
                    }
                };
                let rows = s.clone_htod(&rows)?;
                // Pre-norm without a final norm: `h1` already holds the projection's norm.
                let normed_in_h1 = pre && self.final_norm.is_none() && p.norm.is_some();
                let mut tokens = alloc(batch * h)?;
                // SAFETY: `gather_rows(rows, src, hidden, out)` (decoder.cu) over `batch` rows
                // of `hidden`; every index is below `batch · seq` (checked by the runner).
                unsafe {
                    self.launch(&self.kernels.gather_rows)
                        .arg(&rows)
                        .arg(if normed_in_h1 { &h1 } else { out })
                        .arg(&h_i)
                        .arg(&mut tokens)
                        .launch(rows_by_columns(batch, h))?;
                }
                if let (Some(n), false) = (&p.norm, normed_in_h1) {
                    let op = add_norm.with_rows(batch);
                    let pooled_tokens = tokens.clone();
                    self.layer_norm(&op, &pooled_tokens, n, &mut tokens)?;
                }
                let y = self.project(p, &tokens, batch, h, &dense_rows)?;
                Some(self.to_host(&y, vec![batch, p.dense.out_features])?)
            }
        };
        profile.mark("heads")?;
        let last_hidden_state = match self.message_rows() {
            0 => self.to_host(out, vec![batch, seq, h])?,
            // The message rows are dropped: `seq - 1` tokens per frame, as HF's outputs.
            extra => {
                let tokens = seq - extra;
                let keep: Vec<i32> = (0..batch * seq)
                    .filter(|r| r % seq < tokens)
                    .map(|r| r as i32)
                    .collect();
                let keep = s.clone_htod(&keep)?;
                let mut states = alloc(batch * tokens * h)?;
                // SAFETY: `gather_rows(rows, src, hidden, out)` over `batch · tokens` rows of
                // `hidden`, every index below `batch · seq`.
                unsafe {
                    self.launch(&self.kernels.gather_rows)
                        .arg(&keep)
                        .arg(out)
                        .arg(&h_i)
                        .arg(&mut states)
                        .launch(rows_by_columns(batch * tokens, h))?;
                }
                self.to_host(&states, vec![batch, tokens, h])?
            }
        };
        profile.mark("download")?;
        profile.report("encoder", batch, seq)?;
        Ok(EncoderOutput {
            last_hidden_state,
            pooler_output,
            logits,
            projection,
        })
    }

    /// Frames per video when the layers exchange cross-frame messages.
    fn frames(&self) -> Option<usize> {
        self.layers
            .first()
            .and_then(|l| l.messages.as_ref())
            .map(|m| m.frames)
    }

    /// Rows per input beyond its tokens: one message row with cross-frame messages.
    fn message_rows(&self) -> usize {
        usize::from(self.frames().is_some())
    }

    /// One layer's cross-frame messages ([`ipfs_accelerate_core::FrameMessages`]): from the first
    /// row of every frame in `x`, `m = fc(x[0])`, `m += attention over the video's messages of
    /// norm(m)`; then `m` is written to each frame's message row of `x` and the layer's
    /// attention norm of it to the same row of `h1` (the rest of `h1` holds that norm already).
    #[allow(clippy::too_many_arguments)]
    fn frame_messages(
        &self,
        msg: &Messages<T>,
        layer: &Layer<T>,
        ends: Rows<'_>,
        (x, h1): (&mut CudaSlice<T>, &mut CudaSlice<T>),
        ones: &CudaSlice<i32>,
        add_norm: &AddNorm<'_>,
        alloc: &dyn Fn(usize) -> Result<CudaSlice<T>, EngineError>,
    ) -> Result<(), EngineError> {
        let (h, batch) = (self.hidden, ends.batch);
        let op = add_norm.with_rows(batch);
        let mut m = alloc(batch * h)?;
        self.linear(x, ends.seq * h, batch, &msg.fc, &mut m)?;
        self.bias_act(&mut m, &msg.fc.bias, batch, h, Act::None)?;
        let mut normed = alloc(batch * h)?;
        self.layer_norm(&op, &m, &msg.norm, &mut normed)?;
        let mut qkv = alloc(batch * 3 * h)?;
        self.linear(&normed, h, batch, &msg.qkv, &mut qkv)?;
        let dims = AttentionDims {
            batch: batch / msg.frames,
            seq: msg.frames,
            heads: self.heads,
            head_size: h / self.heads,
        };
        let mut ctx = alloc(batch * h)?;
        if self.fused_attention && fused_attention_takes(dims.head_size, &[], dims.seq, false) {
            self.fused_attention(dims, &qkv, &msg.qkv.bias, ones, &mut ctx)?;
        } else {
            let mut u = HeadBuffers::new(&self.stream, dims, alloc)?;
            let mut quiet = Profile::new(None)?;
            self.unfused_attention(
                dims,
                &qkv,
                &msg.qkv.bias,
                ones,
                &mut u,
                &mut ctx,
                &mut quiet,
            )?;
        }
        let mut y = alloc(batch * h)?;
        self.linear(&ctx, h, batch, &msg.output, &mut y)?;
        // m += y + bias; normed = the layer's first norm of m.
        self.add_norm_sum(
            &op,
            &y,
            &msg.output,
            &mut m,
            &layer.attention_norm,
            &mut normed,
        )?;
        for (src, dst) in [(&m, x), (&normed, h1)] {
            // SAFETY: `scatter_rows(rows, src, hidden, out)`: `batch` rows of `hidden` to the
            // message rows of `out`, each below `batch · seq`.
            unsafe {
                self.launch(&self.kernels.scatter_rows)
                    .arg(ends.rows)
                    .arg(src)
                    .arg(&(h as i32))
                    .arg(dst)
                    .launch(rows_by_columns(batch, h))?;
            }
        }
        Ok(())
    }

    /// A projection's layers over its `rows` inputs of `width` (the gathered token, or the
    /// pooled output): its hidden layer and activation, then its dense layer, through
    /// `dense_rows(x, stride, rows, dense, act)`.
    fn project(
        &self,
        p: &DeviceProjection<T>,
        x: &CudaSlice<T>,
        rows: usize,
        width: usize,
        dense_rows: &impl Fn(
            &CudaSlice<T>,
            usize,
            usize,
            &Dense<T>,
            Act,
        ) -> Result<CudaSlice<T>, EngineError>,
    ) -> Result<CudaSlice<T>, EngineError> {
        match &p.hidden {
            Some((layer, act)) => {
                let inner = dense_rows(x, width, rows, layer, *act)?;
                dense_rows(&inner, layer.out_features, rows, &p.dense, Act::None)
            }
            None => dense_rows(x, width, rows, &p.dense, Act::None),
        }
    }

    /// Attention of one layer, unfused: `qkv` (the fused projection, without its bias) split
    /// into heads with the bias, the score GEMM, the masked softmax, the context GEMM and the
    /// merge into `merged` (`[batch * seq, hidden]`).
    #[allow(clippy::too_many_arguments)]
    fn unfused_attention(
        &self,
        dims: AttentionDims,
        qkv: &CudaSlice<T>,
        bias: &CudaSlice<T>,
        mask: &CudaSlice<i32>,
        u: &mut HeadBuffers<T>,
        merged: &mut CudaSlice<T>,
        profile: &mut Profile<'_>,
    ) -> Result<(), EngineError> {
        let AttentionDims {
            batch,
            seq,
            heads,
            head_size: dh,
        } = dims;
        let keys = dims.keys();
        let (h, m, vec) = (heads * dh, batch * seq, vec_width::<T>());
        let (seq_i, keys_i, heads_i, dh_i) = (seq as i32, keys as i32, heads as i32, dh as i32);
        let k = &self.kernels;
        let (split, merge, split_cols, merge_cols) = if dh.is_multiple_of(vec) {
            (&k.split_heads_vec, &k.merge_heads_vec, 3 * h / vec, h / vec)
        } else {
            (&k.split_heads, &k.merge_heads, 3 * h, h)
        };
        // SAFETY: `split_heads(qkv, bias, seq, head_rows, heads, head_dim, q, k, v)` over `m`
        // rows; the head buffers hold `batch · heads · keys · dh` values.
        unsafe {
            self.launch(split)
                .arg(qkv)
                .arg(bias)
                .arg(&seq_i)
                .arg(&keys_i)
                .arg(&heads_i)
                .arg(&dh_i)
                .arg(&mut u.q)
                .arg(&mut u.k)
                .arg(&mut u.v)
                .launch(rows_by_columns(m, split_cols))?;
        }
        profile.mark("split heads")?;
        let per_head = (keys * dh) as i64;
        // scores[b, h] = scale · q kᵀ, `[seq_q, keys]` row-major per head (the padding keys'
        // scores are 0, and the softmax writes 0 for them).
        let scores_cfg = StridedBatchedConfig {
            gemm: GemmConfig {
                transa: CUBLAS_OP_T,
                transb: CUBLAS_OP_N,
                m: keys_i,
                n: seq_i,
                k: dh_i,
                alpha: T::from_f32(1.0 / (dh as f32).sqrt()),
                lda: dh_i,
                ldb: dh_i,
                beta: T::from_f32(0.0),
                ldc: keys_i,
            },
            batch_size: (batch * heads) as i32,
            stride_a: per_head,
            stride_b: per_head,
            stride_c: (seq * keys) as i64,
        };
        // SAFETY: the strided batches stay inside the head buffers and the score rows.
        unsafe {
            self.blas
                .gemm_strided_batched(scores_cfg, &u.k, &u.q, &mut u.scores)
        }?;
        profile.mark("scores gemm")?;
        let score_rows = batch * heads * seq;
        let causal_i = self.causal as i32;
        let (softmax, cfg) = if keys <= WARP_SOFTMAX_KEYS {
            let cfg = LaunchConfig {
                grid_dim: (score_rows.div_ceil(WARP_SOFTMAX_ROWS as usize) as u32, 1, 1),
                block_dim: (32, WARP_SOFTMAX_ROWS, 1),
                shared_mem_bytes: 0,
            };
            (&k.masked_softmax_warp, cfg)
        } else {
            let cfg = LaunchConfig {
                grid_dim: (score_rows as u32, 1, 1),
                block_dim: (softmax_threads(keys, vec), 1, 1),
                shared_mem_bytes: 0,
            };
            (&k.masked_softmax, cfg)
        };
        let rows = score_rows as i64;
        // SAFETY: `masked_softmax[_warp](scores, mask, heads, q_len, k_len, k_stride, [rows,]
        // causal)` over `score_rows` rows of `keys` values; `mask` holds `batch · seq` values.
        unsafe {
            let mut args = self.launch(softmax);
            args.arg(&mut u.scores)
                .arg(mask)
                .arg(&heads_i)
                .arg(&seq_i)
                .arg(&seq_i)
                .arg(&keys_i);
            if keys <= WARP_SOFTMAX_KEYS {
                args.arg(&rows);
            }
            args.arg(&causal_i);
            args.launch(cfg)?;
        }
        profile.mark("softmax")?;
        // ctx[b, h] = p v, `[seq_q, dh]` row-major per head.
        let ctx_cfg = StridedBatchedConfig {
            gemm: GemmConfig {
                transa: CUBLAS_OP_N,
                transb: CUBLAS_OP_N,
                m: dh_i,
                n: seq_i,
                k: keys_i,
                alpha: T::from_f32(1.0),
                lda: dh_i,
                ldb: keys_i,
                beta: T::from_f32(0.0),
                ldc: dh_i,
            },
            batch_size: (batch * heads) as i32,
            stride_a: per_head,
            stride_b: (seq * keys) as i64,
            stride_c: (seq * dh) as i64,
        };
        // SAFETY: as the score GEMM.
        unsafe {
            self.blas
                .gemm_strided_batched(ctx_cfg, &u.v, &u.scores, &mut u.ctx)
        }?;
        profile.mark("context gemm")?;
        // SAFETY: `merge_heads(ctx, seq, heads, head_dim, out)` over `m` rows of `h`.
        unsafe {
            self.launch(merge)
                .arg(&u.ctx)
                .arg(&seq_i)
                .arg(&heads_i)
                .arg(&dh_i)
                .arg(merged)
                .launch(rows_by_columns(m, merge_cols))?;
        }
        Ok(())
    }

    /// Attention of one layer in the fused kernel (`flash_attention_<head size>`, kernels.cu):
    /// from `qkv` (the fused projection, without its bias) to `merged`.
    fn fused_attention(
        &self,
        dims: AttentionDims,
        qkv: &CudaSlice<T>,
        bias: &CudaSlice<T>,
        mask: &CudaSlice<i32>,
        merged: &mut CudaSlice<T>,
    ) -> Result<(), EngineError> {
        let AttentionDims {
            batch,
            seq,
            heads,
            head_size,
        } = dims;
        let kernel = if head_size == 32 {
            &self.kernels.flash_attention_32
        } else {
            &self.kernels.flash_attention_64
        };
        let cfg = LaunchConfig {
            grid_dim: (seq.div_ceil(FLASH_ROWS) as u32, (batch * heads) as u32, 1),
            block_dim: (2 * FLASH_ROWS as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let scale_log2 = std::f32::consts::LOG2_E / (head_size as f32).sqrt();
        // SAFETY: `flash_attention_<d>(qkv, bias, mask, seq, heads, scale_log2, causal, out)`
        // over (query tiles, batch · heads) blocks of 128 threads; `qkv` holds `batch · seq`
        // rows of `3 · hidden`, `merged` as many rows of `hidden`, `mask` `batch · seq` values.
        unsafe {
            self.launch(kernel)
                .arg(qkv)
                .arg(bias)
                .arg(mask)
                .arg(&(seq as i32))
                .arg(&(heads as i32))
                .arg(&scale_log2)
                .arg(&(self.causal as i32))
                .arg(merged)
                .launch(cfg)?;
        }
        Ok(())
    }

    fn launch<'a>(&'a self, f: &'a CudaFunction) -> cudarc::driver::LaunchArgs<'a> {
        self.stream.launch_builder(f)
    }

    /// `out = layer_norm(y + dense.bias + residual)`, row by row.
    fn add_norm(
        &self,
        op: &AddNorm<'_>,
        y: &CudaSlice<T>,
        dense: &Dense<T>,
        residual: &CudaSlice<T>,
        norm: &Norm<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<(), EngineError> {
        self.add_norm_launch(op.kernel, op, y, dense, Residual::Read(residual), norm, out)
    }

    /// Pre-norm: `stream += y + dense.bias`, then `out = layer_norm(stream)`, row by row.
    fn add_norm_sum(
        &self,
        op: &AddNorm<'_>,
        y: &CudaSlice<T>,
        dense: &Dense<T>,
        stream: &mut CudaSlice<T>,
        norm: &Norm<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<(), EngineError> {
        self.add_norm_launch(
            op.sum_kernel,
            op,
            y,
            dense,
            Residual::Update(stream),
            norm,
            out,
        )
    }

    /// One launch of `bias_residual_norm` or `add_norm_sum` (both `(y, bias, residual, gamma,
    /// beta, eps, hidden, out)`, the second updating the residual in place).
    #[allow(clippy::too_many_arguments)]
    fn add_norm_launch(
        &self,
        kernel: &CudaFunction,
        op: &AddNorm<'_>,
        y: &CudaSlice<T>,
        dense: &Dense<T>,
        residual: Residual<'_, T>,
        norm: &Norm<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<(), EngineError> {
        let mut args = self.launch(kernel);
        args.arg(y).arg(&dense.bias);
        match residual {
            Residual::Read(r) => args.arg(r),
            Residual::Update(r) => args.arg(r),
        };
        // SAFETY: the argument list matches the kernels' signatures in kernels.cu; they run over
        // `op.rows` rows, each `hidden` long in every buffer.
        unsafe { norm_launch(args, op, norm, out) }
    }

    /// `out = layer_norm(x)`, row by row (the kernel and grid of `op`).
    fn layer_norm(
        &self,
        op: &AddNorm<'_>,
        x: &CudaSlice<T>,
        norm: &Norm<T>,
        out: &mut CudaSlice<T>,
    ) -> Result<(), EngineError> {
        let mut args = self.launch(op.norm_kernel);
        args.arg(x);
        // SAFETY: `layer_norm[_vec|_warp](x, gamma, beta, eps, hidden, out[, rows])` over
        // `op.rows` rows, each `hidden` long.
        unsafe { norm_launch(args, op, norm, out) }
    }

    /// The frame front end: each convolution as im2col rows and one GEMM, its bias and the
    /// activation, then the position embeddings, into `x` `[batch · tokens, hidden]`. `features`
    /// holds `batch` inputs of `[channels, frames]` (the first convolution's input frames).
    fn frame_convolutions(
        &self,
        features: CudaSlice<T>,
        (batch, channels): (usize, usize),
        convs: &[DeviceConv<T>],
        activation: Act,
        position: &CudaSlice<T>,
        x: &mut CudaSlice<T>,
    ) -> Result<(), EngineError> {
        let alloc = |n: usize| -> Result<CudaSlice<T>, EngineError> {
            // SAFETY: every buffer is written in full before it is read.
            unsafe {
                device_buffer(&self.stream, n, || {
                    format!("a buffer of {n} values for the front end of {batch} input(s)")
                })
            }
        };
        // The input is channel-major, every convolution's output frame-major.
        let (mut src, mut channels) = (features, channels);
        let mut steps = (convs.first().map_or(0, |c| c.in_frames), 1);
        for (i, conv) in convs.iter().enumerate() {
            let (frames, out_frames) = (conv.in_frames, conv.out_frames);
            let rows = batch * out_frames;
            let cols = conv.dense.in_features;
            let geometry = (conv.kernel, conv.stride, conv.padding);
            let windows =
                self.frame_rows(&src, batch, (channels, frames), steps, geometry, out_frames)?;
            let out_i = out_frames as i32;
            let out = conv.dense.out_features;
            let mut y = alloc(rows * out)?;
            self.linear(&windows, cols, rows, &conv.dense, &mut y)?;
            if i + 1 < convs.len() {
                self.bias_act(&mut y, &conv.dense.bias, rows, out, activation)?;
            } else {
                let (seq_i, out_features_i, act_i) = (out_i, out as i32, activation as i32);
                // SAFETY: `frame_embeddings(conv, bias, pos, seq, hidden, act, out)` over
                // `batch · seq` rows of `hidden` (= out, checked by the spec); `pos` holds `seq`
                // rows.
                unsafe {
                    self.launch(&self.kernels.frame_embeddings)
                        .arg(&y)
                        .arg(&conv.dense.bias)
                        .arg(position)
                        .arg(&seq_i)
                        .arg(&out_features_i)
                        .arg(&act_i)
                        .arg(&mut *x)
                        .launch(rows_by_columns(rows, out))?;
                }
            }
            (src, channels, steps) = (y, out, (1, out));
        }
        Ok(())
    }

    /// The im2col rows of a 1-D convolution over `batch` inputs of `channels × frames`: channel
    /// c at frame t of input b sits at `b · channels · frames + c · steps.0 + t · steps.1`; row
    /// `b · out_frames + t` holds output frame t's window in the weight's (channel, tap) order,
    /// zero outside the frames. `geometry` is (kernel, stride, padding).
    fn frame_rows(
        &self,
        src: &CudaSlice<T>,
        batch: usize,
        (channels, frames): (usize, usize),
        (channel_step, frame_step): (usize, usize),
        (kernel, stride, padding): (usize, usize, usize),
        out_frames: usize,
    ) -> Result<CudaSlice<T>, EngineError> {
        let (rows, cols) = (batch * out_frames, channels * kernel);
        // SAFETY: written in full below.
        let mut windows = unsafe {
            device_buffer(&self.stream, rows * cols, || {
                format!("{rows} convolution windows of {cols} values")
            })
        }?;
        let ints = [
            channel_step,
            frame_step,
            channels,
            frames,
            kernel,
            stride,
            padding,
            out_frames,
        ];
        let [channel_i, frame_i, channels_i, frames_i, kernel_i, stride_i, padding_i, out_i] =
            ints.map(|v| v as i32);
        let per_input = (channels * frames) as i64;
        // SAFETY: `frame_rows` as declared in kernels.cu over `rows × cols` values; every read
        // is inside `src`'s `batch` inputs of `channels × frames`.
        unsafe {
            self.launch(&self.kernels.frame_rows)
                .arg(src)
                .arg(&per_input)
                .arg(&channel_i)
                .arg(&frame_i)
                .arg(&channels_i)
                .arg(&frames_i)
                .arg(&kernel_i)
                .arg(&stride_i)
                .arg(&padding_i)
                .arg(&out_i)
                .arg(&mut windows)
                .launch(rows_by_columns(rows, cols))?;
        }
        Ok(windows)
    }

    /// Wav2Vec2's front end into `x` `[batch · tokens, hidden]`: each convolution as im2col rows
    /// and one GEMM, its bias, its norm (per channel over the frames, or per frame) and the
    /// activation; the projection's LayerNorm, the projection and its bias; then the grouped
    /// position convolution (im2col rows over the tokens, one strided-batched GEMM for all
    /// groups) through the activation, added to the projected tokens. `samples` holds `batch`
    /// inputs of equal length.
    fn waveform_embeddings(
        &self,
        samples: CudaSlice<T>,
        batch: usize,
        w: &DeviceWaveform<T>,
        x: &mut CudaSlice<T>,
    ) -> Result<(), EngineError> {
        let alloc = |n: usize| -> Result<CudaSlice<T>, EngineError> {
            // SAFETY: every buffer is written in full before it is read.
            unsafe {
                device_buffer(&self.stream, n, || {
                    format!("a buffer of {n} values for the audio front end of {batch} input(s)")
                })
            }
        };
        let (mut frames, mut channels) = (samples.len() / batch.max(1), 1);
        // One channel first (any channel step), frame-major convolution outputs after.
        let mut steps = (frames, 1);
        let mut src = samples;
        for conv in &w.convs {
            let out_frames = conv_out_frames(frames, conv.kernel, conv.stride, 0);
            let rows = batch * out_frames;
            let out = conv.dense.out_features;
            let geometry = (conv.kernel, conv.stride, 0);
            let windows =
                self.frame_rows(&src, batch, (channels, frames), steps, geometry, out_frames)?;
            let mut y = alloc(rows * out)?;
            self.linear(&windows, conv.dense.in_features, rows, &conv.dense, &mut y)?;
            drop(windows);
            match &conv.norm {
                None => self.bias_act(&mut y, &conv.dense.bias, rows, out, w.activation)?,
                Some((ConvNormKind::Frame, n)) => {
                    self.bias_act(&mut y, &conv.dense.bias, rows, out, Act::None)?;
                    let op = self.add_norm_for(rows, out, w.conv_eps);
                    let z = y.clone();
                    self.layer_norm(&op, &z, n, &mut y)?;
                    self.bias_act(&mut y, &w.zeros, rows, out, w.activation)?;
                }
                Some((ConvNormKind::Channel, n)) => {
                    let (frames_i, out_i, act_i) =
                        (out_frames as i32, out as i32, w.activation as i32);
                    let cfg = LaunchConfig {
                        grid_dim: (batch as u32, out.div_ceil(32) as u32, 1),
                        block_dim: (32, CHANNEL_NORM_ROWS, 1),
                        shared_mem_bytes: 0,
                    };
                    // SAFETY: `channel_norm_act(y, bias, gamma, beta, frames, channels, eps,
                    // act)` as declared in kernels.cu over `batch` inputs of `frames × channels`
                    // values; bias, gamma and beta hold `channels`.
                    unsafe {
                        self.launch(&self.kernels.channel_norm_act)
                            .arg(&mut y)
                            .arg(&conv.dense.bias)
                            .arg(&n.gamma)
                            .arg(&n.beta)
                            .arg(&frames_i)
                            .arg(&out_i)
                            .arg(&w.conv_eps)
                            .arg(&act_i)
                            .launch(cfg)?;
                    }
                }
            }
            (src, channels, frames, steps) = (y, out, out_frames, (1, out));
        }
        let (h, rows) = (w.projection.out_features, batch * frames);
        let mut normed = alloc(rows * channels)?;
        let op = self.add_norm_for(rows, channels, self.eps);
        self.layer_norm(&op, &src, &w.projection_norm, &mut normed)?;
        drop(src);
        let mut tokens = alloc(rows * h)?;
        self.linear(&normed, channels, rows, &w.projection, &mut tokens)?;
        drop(normed);
        self.bias_act(&mut tokens, &w.projection.bias, rows, h, Act::None)?;
        // The position convolution: `kernel / 2` zero tokens each side, `frames` outputs (an even
        // kernel's last output is dropped by not computing it).
        let (k, groups) = (w.position_kernel, w.position_groups);
        let per_group = h / groups;
        let frame_major =
            self.frame_rows(&tokens, batch, (h, frames), (1, h), (k, 1, k / 2), frames)?;
        let mut positions = alloc(rows * h)?;
        let inner = (per_group * k) as i32;
        let cfg = StridedBatchedConfig {
            gemm: GemmConfig {
                transa: CUBLAS_OP_T,
                transb: CUBLAS_OP_N,
                m: per_group as i32,
                n: rows as i32,
                k: inner,
                alpha: T::from_f32(1.0),
                lda: inner,
                ldb: (h * k) as i32,
                beta: T::from_f32(0.0),
                ldc: h as i32,
            },
            batch_size: groups as i32,
            stride_a: (per_group * per_group * k) as i64,
            stride_b: (per_group * k) as i64,
            stride_c: per_group as i64,
        };
        // SAFETY: group g reads rows g·per_group.. of the `[h, per_group · k]` weight, columns
        // g·per_group·k.. of each `h · k`-wide im2col row, and writes columns g·per_group.. of
        // each `h`-wide output row: all inside the buffers for `rows` rows.
        unsafe {
            self.blas
                .gemm_strided_batched(cfg, &w.position.weight, &frame_major, &mut positions)
        }?;
        drop(frame_major);
        let (rows_i, h_i, act_i) = (rows as i32, h as i32, w.activation as i32);
        // SAFETY: `frame_embeddings(conv, bias, pos, seq, hidden, act, out)` over `rows` rows of
        // `hidden`: with `seq` = rows, `pos` is the projected tokens row for row, so
        // x = tokens + act(positions + bias).
        unsafe {
            self.launch(&self.kernels.frame_embeddings)
                .arg(&positions)
                .arg(&w.position.bias)
                .arg(&tokens)
                .arg(&rows_i)
                .arg(&h_i)
                .arg(&act_i)
                .arg(x)
                .launch(rows_by_columns(rows, h))?;
        }
        Ok(())
    }

    /// `y[r, c] = act(y[r, c] + bias[c])` over `rows × cols`.
    fn bias_act(
        &self,
        y: &mut CudaSlice<T>,
        bias: &CudaSlice<T>,
        rows: usize,
        cols: usize,
        act: Act,
    ) -> Result<(), EngineError> {
        let (cols_i, act_i) = (cols as i32, act as i32);
        let vec = vec_width::<T>();
        let (kernel, launch_cols) = if cols.is_multiple_of(vec) {
            (&self.kernels.bias_act_vec, cols / vec)
        } else {
            (&self.kernels.bias_act, cols)
        };
        // SAFETY: `bias_act(T*, const T*, int, int)` over `rows × cols` values of `y` (the `_vec`
        // kernel one 16-byte pack per thread).
        unsafe {
            self.launch(kernel)
                .arg(y)
                .arg(bias)
                .arg(&cols_i)
                .arg(&act_i)
                .launch(row_blocks(rows, launch_cols))?;
        }
        Ok(())
    }

    /// `values` converted to `T` (on rayon's threads) into the page-locked input buffer and
    /// copied to a new device buffer: several times faster than a copy from pageable memory.
    /// The copy is queued on the stream; the buffer is rewritten only by a later call, after this
    /// one's outputs were read back (which waits for the stream).
    ///
    /// A large input goes in pieces ([`transfer_pieces`]): each piece's copy is queued as soon as
    /// it is converted, so the device copies one piece while the host converts the next.
    fn upload_converted(&self, values: &[f32]) -> Result<CudaSlice<T>, EngineError> {
        use rayon::prelude::*;
        const CHUNK: usize = 1 << 16;
        let n = values.len();
        let mut staging = self
            .input_staging
            .lock()
            .map_err(|_| EngineError::Spec("the input buffer's lock is poisoned".into()))?;
        // SAFETY: written in full below before it is copied.
        let host = unsafe { pinned(&self.stream, &mut staging, n) }?;
        // SAFETY (allocation): written in full by the copies.
        let mut device =
            unsafe { device_buffer(&self.stream, n, || format!("the {n} input values")) }?;
        for piece in transfer_pieces::<T>(n, self.pipelined_transfers) {
            let dst = &mut host[piece.clone()];
            dst.par_chunks_mut(CHUNK)
                .zip(values[piece.clone()].par_chunks(CHUNK))
                .for_each(|(d, s)| T::convert_into(s, d));
            // Queued, not waited for: `dst` is not written again in this call.
            self.stream
                .memcpy_htod(&*dst, &mut device.slice_mut(piece))?;
        }
        Ok(device)
    }

    /// Copies `x` (`shape`, in `T`) to a host tensor of `T`'s dtype through the page-locked
    /// staging buffer.
    fn to_host(&self, x: &CudaSlice<T>, shape: Vec<usize>) -> Result<HostTensor, EngineError> {
        let values = read_back_pieces(&self.stream, &self.staging, x, self.pipelined_transfers)?;
        HostTensor::from_vec(shape, T::DTYPE, values).map_err(|e| EngineError::Spec(e.to_string()))
    }
}

/// Copies `x` into the page-locked buffer in `staging` (grown as needed), waits for the stream,
/// and hands the copy to `take` (which makes the caller's own vector of it).
pub(crate) fn read_back<T: DeviceRepr + ValidAsZeroBits, R>(
    stream: &Arc<CudaStream>,
    staging: &Mutex<Option<PinnedHostSlice<T>>>,
    x: &CudaSlice<T>,
    take: impl FnOnce(&[T]) -> R,
) -> Result<R, EngineError> {
    let mut staging = staging
        .lock()
        .map_err(|_| EngineError::Spec("the staging buffer's lock is poisoned".into()))?;
    // Exactly `x.len()` values: cudarc copies as many bytes as the destination slice holds.
    // SAFETY: written by the copy below before it is read.
    let dst = unsafe { pinned(stream, &mut staging, x.len()) }?;
    stream.memcpy_dtoh(x, dst)?;
    stream.synchronize()?;
    Ok(take(dst))
}

/// `x` copied to a new host vector through the page-locked buffer in `staging`, in pieces
/// ([`transfer_pieces`]): every piece's device copy is queued at once, and the host copies each
/// piece out as soon as it has arrived, while the device copies the next.
pub(crate) fn read_back_pieces<T: DeviceRepr + ValidAsZeroBits + Copy + Send + Sync>(
    stream: &Arc<CudaStream>,
    staging: &Mutex<Option<PinnedHostSlice<T>>>,
    x: &CudaSlice<T>,
    pipelined: bool,
) -> Result<Vec<T>, EngineError> {
    const CHUNK: usize = 1 << 16;
    let pieces = transfer_pieces::<T>(x.len(), pipelined);
    if pieces.len() <= 1 {
        return read_back(stream, staging, x, parallel_copy);
    }
    let mut staging = staging
        .lock()
        .map_err(|_| EngineError::Spec("the staging buffer's lock is poisoned".into()))?;
    // SAFETY: every piece is written by its copy, which its event orders before the host reads.
    let dst = unsafe { pinned(stream, &mut staging, x.len()) }?;
    let mut arrived = Vec::with_capacity(pieces.len());
    for piece in &pieces {
        stream.memcpy_dtoh(&x.slice(piece.clone()), &mut dst[piece.clone()])?;
        arrived.push(stream.record_event(None)?);
    }
    let mut out = Vec::with_capacity(x.len());
    for (piece, event) in pieces.iter().zip(&arrived) {
        event.synchronize()?;
        par_copy_into(
            &mut out.spare_capacity_mut()[piece.clone()],
            &dst[piece.clone()],
            CHUNK,
        );
    }
    // SAFETY: the pieces cover `0..x.len()`, each initialised above.
    unsafe { out.set_len(x.len()) };
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn row_blocks_cover_every_column_with_whole_warps() {
        for cols in [1, 31, 96, 192, 256, 257, 384, 1000, 4096] {
            let cfg = row_blocks(3, cols);
            let (blocks, threads) = (cfg.grid_dim.1 as usize, cfg.block_dim.0 as usize);
            assert_eq!(cfg.grid_dim.0, 3);
            assert!(threads.is_multiple_of(32) && threads <= ROW_THREADS as usize);
            assert!(blocks * threads >= cols, "{cols} columns");
            assert!(
                (blocks - 1) * threads < cols,
                "{cols} columns: an idle block"
            );
        }
        assert_eq!(row_blocks(1, 384).block_dim.0, 192);
    }

    #[test]
    fn transfer_pieces_cover_the_values_in_order() {
        // Values of f16: a piece holds at least 2 Mi of them.
        let mi = 1 << 20;
        for (n, pipelined, count) in [
            (0, true, 0),
            (5, true, 1),
            (2 * mi, true, 1),
            (12 * mi + 7, true, 6),
            (64 * mi, true, TRANSFER_PIECES),
            (64 * mi, false, 1),
        ] {
            let pieces = transfer_pieces::<half::f16>(n, pipelined);
            assert_eq!(pieces.len(), count, "{n} values");
            let mut next = 0;
            for p in &pieces {
                assert_eq!(p.start, next);
                assert!(p.end > p.start);
                next = p.end;
            }
            assert_eq!(next, n);
        }
    }

    #[test]
    fn parallel_copy_keeps_every_value_in_order() {
        for n in [0, 5, (1 << 18) + 3, 3 << 18] {
            let src: Vec<u32> = (0..n as u32).collect();
            assert_eq!(parallel_copy(&src), src);
        }
    }

    /// The fused kernel takes heads of 32 and 64 only, and only inputs whose every query sees a
    /// key: the first key with a causal mask, any key without.
    #[test]
    fn fused_attention_takes_only_inputs_where_every_query_sees_a_key() {
        let padded = [1, 1, 1, 0, 1, 0, 0, 0];
        assert!(fused_attention_takes(64, &padded, 4, false));
        assert!(fused_attention_takes(32, &padded, 4, true));
        assert!(
            fused_attention_takes(64, &[], 4, true),
            "no mask: every key"
        );
        for size in [8, 16, 48, 80, 128] {
            assert!(!fused_attention_takes(size, &padded, 4, false), "{size}");
        }
        // Input 1 sees nothing: HF attends to every key there, which the kernel does not.
        assert!(!fused_attention_takes(64, &[1, 1, 0, 0, 0, 0], 3, false));
        // Left padding: with a causal mask, query 0 sees no key.
        let left = [0, 1, 1, 1];
        assert!(fused_attention_takes(64, &left, 4, false));
        assert!(!fused_attention_takes(64, &left, 4, true));
        assert!(!fused_attention_takes(64, &[], 0, false), "no tokens");
    }

    #[test]
    fn softmax_threads_cover_the_row_within_a_block() {
        for vec in [4, 8] {
            for keys in [8, 128, 256, 264, 4000, MAX_KEYS] {
                let t = softmax_threads(keys, vec) as usize;
                assert!(
                    t.is_multiple_of(32) && (32..=1024).contains(&t),
                    "{keys}: {t}"
                );
                assert!(t * SOFTMAX_PACKS * vec >= keys, "{keys}: {t}");
            }
        }
    }

    #[test]
    fn half_weights_round_to_nearest() {
        let h = <half::f16 as Elem>::from_f32_slice(&[1.0, 0.1, -65504.0, 1e-8]);
        let back: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
        assert_eq!(back[0], 1.0);
        assert!((back[1] - 0.1).abs() < 1e-4);
        assert_eq!(back[2], -65504.0);
        assert_eq!(<f32 as Elem>::from_f32_slice(&[0.1]), vec![0.1]);
        assert_eq!(vec_width::<half::f16>(), 8);
        assert_eq!(vec_width::<f32>(), 4);
    }
}
