//! A decoder LM ([`DecoderSpec`]: LLaMA, Qwen2, Whisper's decoder) on one CUDA stream: cuBLAS for
//! every product (q / k / v fused into one GEMM, gate and up into another) and the kernels of
//! `decoder.cu` for the rest: embedding rows (plus learned positions), RMSNorm or LayerNorm fused
//! with the residual add, RoPE fused with the split into the query and the device-resident KV
//! cache, causal attention over the cache (online softmax, grouped-query heads read in place,
//! sliding windows), cross-attention over an encoder's keys and values (computed once per
//! session), and the MLP's activation. A [`State`] holds one batch's caches; a call runs any
//! number of new columns (the prompt, then one token per step) and returns the logits of the last
//! or of every column.

use std::any::Any;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};

use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, DeviceSlice,
    LaunchArgs, LaunchConfig, PinnedHostSlice, PushKernelArg, SyncOnDrop,
};
use ipfs_accelerate_core::{
    DType, DecoderNorm, DecoderPositions, DecoderSpec, DenseWeights, GatedActivation, HostTensor,
    NormWeights, Precision,
};

use crate::compile::{start_compile, KernelModule, KernelSet};
use crate::engine::{device_buffer, open_stream, read_back, rows_by_columns, Elem};
use crate::{probe, EngineError};

/// `activate`'s code in kernels.cu for a gated activation.
fn act_code(a: GatedActivation) -> i32 {
    match a {
        GatedActivation::Gelu => 0,
        GatedActivation::GeluTanh => 1,
        GatedActivation::Silu => 5,
        GatedActivation::Relu => 2,
    }
}

/// Threads of an attention block: a multiple of 32, at least the head size.
pub(crate) fn attention_threads(head_dim: usize) -> u32 {
    (head_dim.div_ceil(32) * 32).max(128) as u32
}

/// The largest head the kernels take (one attention block of 1024 threads covers it).
const MAX_HEAD_DIM: usize = 1024;

/// Blocks a cross-attention launch aims for (about two per SM of an H100): a decoding step's
/// `rows × heads` blocks split their keys until there are this many.
const CROSS_FILL_BLOCKS: usize = 264;

/// How a cross-attention of `rows` query rows × `heads` over `keys` keys splits its keys:
/// `(splits, keys per split)`, no split shorter than a block's chunk of `threads` keys
/// (flash-decoding; `cross_combine` joins the splits when there are several).
pub(crate) fn cross_splits(
    rows: usize,
    heads: usize,
    keys: usize,
    threads: usize,
) -> (usize, usize) {
    let most = keys.div_ceil(threads.max(1)).max(1);
    let want = CROSS_FILL_BLOCKS.div_ceil((rows * heads).max(1));
    let splits = want.clamp(1, most);
    let per = keys.div_ceil(splits);
    (keys.div_ceil(per), per)
}

struct Kernels {
    gather_rows: CudaFunction,
    append_mask: CudaFunction,
    residual_norm: CudaFunction,
    add_positions: CudaFunction,
    mlp_act: CudaFunction,
    argmax_rows: CudaFunction,
    /// Sampling on the device: a row's most likely tokens per chunk, then per row.
    sample_chunks: CudaFunction,
    sample_merge: CudaFunction,
    rope_split: CudaFunction,
    cached_attention: CudaFunction,
    /// `cached_attention` reading single values (heads that are not a whole number of packs).
    cached_attention_scalar: CudaFunction,
    /// Cross-attention over an encoder's keys and values, in packs and in single values, and the
    /// join of its splits.
    cross_attention: CudaFunction,
    cross_attention_scalar: CudaFunction,
    cross_combine: CudaFunction,
    /// Self-attention with a relative position bias (T5), causal or not, in packs and in single
    /// values.
    relative_attention: CudaFunction,
    relative_attention_scalar: CudaFunction,
    /// A prefill's causal self-attention on tensor cores, heads of 32 and of 64 (f16).
    cached_flash_attention: (CudaFunction, CudaFunction),
    /// The products and row reads of dense weights.
    dense: WeightKernels,
    /// `gemv_wide_dense` / `gemv1_wide_dense`: the dense products with a LayerNorm prologue and
    /// an activation epilogue, which the others leave out for their registers.
    wide_dense: (CudaFunction, CudaFunction),
    /// Those of each ggml block format ([`BLOCK_FORMATS`], same order) the model stores; the
    /// others are not compiled.
    blocks: Vec<Option<WeightKernels>>,
}

/// The kernels of one weight storage (`WEIGHT_KERNELS` in decoder.cu).
struct WeightKernels {
    /// `gemv_<name>`: few-row products with the fused norm / bias / residual.
    gemv: CudaFunction,
    /// `gemv1_<name>`: the same for one row (fewer registers, several loads in flight per lane).
    gemv1: CudaFunction,
    /// `dequant_<name>`: rows dequantized to `T`.
    dequant: CudaFunction,
}

impl Kernels {
    /// The decoder's entry points in `module`, with the products of `formats` (the others' left
    /// out).
    fn from_module(module: &KernelModule, formats: &[BlockFormat]) -> Result<Kernels, EngineError> {
        let f = |name: &str| module.load_function(name);
        let weight_kernels = |name: &str| -> Result<WeightKernels, EngineError> {
            Ok(WeightKernels {
                gemv: f(&format!("gemv_{name}"))?,
                gemv1: f(&format!("gemv1_{name}"))?,
                dequant: f(&format!("dequant_{name}"))?,
            })
        };
        let dense = weight_kernels("dense")?;
        let blocks: Vec<Option<WeightKernels>> = BLOCK_FORMATS
            .iter()
            .map(|b| {
                formats
                    .contains(b)
                    .then(|| weight_kernels(b.name))
                    .transpose()
            })
            .collect::<Result<_, _>>()?;
        let named = |name: &str| {
            debug_assert!(DECODER_KERNEL_NAMES.contains(&name), "{name}");
            f(name)
        };
        Ok(Kernels {
            gather_rows: named("gather_rows")?,
            append_mask: named("append_mask")?,
            residual_norm: named("residual_norm")?,
            add_positions: named("add_positions")?,
            mlp_act: named("mlp_act")?,
            argmax_rows: named("argmax_rows")?,
            sample_chunks: named("sample_chunks")?,
            sample_merge: named("sample_merge")?,
            rope_split: named("rope_split")?,
            cached_attention: named("cached_attention")?,
            cached_attention_scalar: named("cached_attention_scalar")?,
            cross_attention: named("cross_attention")?,
            cross_attention_scalar: named("cross_attention_scalar")?,
            cross_combine: named("cross_combine")?,
            relative_attention: named("relative_attention")?,
            relative_attention_scalar: named("relative_attention_scalar")?,
            cached_flash_attention: (
                named("cached_flash_attention_32")?,
                named("cached_flash_attention_64")?,
            ),
            wide_dense: (named("gemv_wide_dense")?, named("gemv1_wide_dense")?),
            dense,
            blocks,
        })
    }

    /// The kernels of a weight stored as `storage`.
    fn of<T>(&self, storage: &Storage<T>) -> Result<&WeightKernels, EngineError> {
        match storage {
            Storage::Dense(_) => Ok(&self.dense),
            Storage::Blocks { format, .. } => self.blocks[format.index].as_ref().ok_or_else(|| {
                EngineError::Spec(format!("the {} kernels were not compiled", format.name))
            }),
        }
    }
}

/// A ggml block format the engine computes on: the weights stay in it in device memory and the
/// kernels dequantize them in registers (`ggml_blocks.cuh`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockFormat {
    /// ggml's id (`enum ggml_type`, as GGUF files write it).
    pub id: u32,
    /// ggml's name.
    pub name: &'static str,
    /// Weights per block.
    pub block: usize,
    /// Bytes per block.
    pub bytes: usize,
    /// Position in [`BLOCK_FORMATS`].
    pub(crate) index: usize,
}

/// Every block format the decoder reads (ids, sizes and layouts as ggml's).
pub const BLOCK_FORMATS: [BlockFormat; 8] = [
    block_format(8, "q8_0", 32, 34, 0),
    block_format(2, "q4_0", 32, 18, 1),
    block_format(3, "q4_1", 32, 20, 2),
    block_format(6, "q5_0", 32, 22, 3),
    block_format(7, "q5_1", 32, 24, 4),
    block_format(12, "q4_k", 256, 144, 5),
    block_format(13, "q5_k", 256, 176, 6),
    block_format(14, "q6_k", 256, 210, 7),
];

const fn block_format(
    id: u32,
    name: &'static str,
    block: usize,
    bytes: usize,
    index: usize,
) -> BlockFormat {
    BlockFormat {
        id,
        name,
        block,
        bytes,
        index,
    }
}

impl BlockFormat {
    /// The format of ggml id `id`, if the decoder reads it.
    pub fn of(id: u32) -> Option<BlockFormat> {
        BLOCK_FORMATS.iter().copied().find(|f| f.id == id)
    }

    /// Bytes of a row of `k` weights (`None` unless `k` is a whole number of blocks).
    pub fn row_bytes(self, k: usize) -> Option<usize> {
        (k > 0 && k.is_multiple_of(self.block)).then(|| k / self.block * self.bytes)
    }
}

/// The tensor dtype of ggml's 16-bit float types (F16, BF16), which the decoder takes as they are
/// stored and converts to its precision at upload (no f32 copy of a half-precision checkpoint on
/// the host); `None` for other ids.
fn half_dtype(id: u32) -> Option<DType> {
    match id {
        1 => Some(DType::F16),
        30 => Some(DType::BF16),
        _ => None,
    }
}

/// Weights of a unit of `dequant_*` / `gemv_*` in a block format (`Unit<F>::N` in decoder.cu).
const BLOCK_UNIT: usize = 8;

/// Values of `T` the prompt's products dequantize a block weight into at a time (then multiply
/// with cuBLAS), at most.
const SCRATCH_VALUES: usize = 4 << 20;

/// Rows up to which a product can run on `gemv_*` instead of cuBLAS (`GEMV_ROWS` in decoder.cu):
/// the default for a model that stores block weights (cuBLAS would need them dequantized first).
const GEMV_ROWS: usize = 8;
/// The default for a model of dense weights: past it cuBLAS's tensor-core GEMM is faster (the
/// GEMV normalises and multiplies every row of x once per output feature). Llama-3.2-1B f16 on
/// an H100, decode ms per step with the GEMV / cuBLAS: 2 rows 3.15 / 2.02, 4 rows 4.82 / 2.76,
/// 8 rows 8.39 / 3.50.
const DENSE_GEMV_ROWS: usize = 1;
/// Warps per block of `gemv_*` (one output feature each).
const GEMV_WARPS: u32 = 8;
/// Warps a GEMV launch aims for (about 32 per SM of an H100): below it, outputs get several
/// warps each.
const GEMV_FILL_WARPS: usize = 4096;

/// Warps per output feature of a GEMV over `out` outputs of `units` units each (`split` in
/// decoder.cu): doubled, up to [`GEMV_WARPS`], while the launch has fewer than
/// [`GEMV_FILL_WARPS`] warps and every lane of the split still gets a unit. A decoding step's
/// products of few outputs or long rows (Qwen2.5-0.5B's 896 outputs of 4864 values) are
/// otherwise bound by the latency of a few warps per SM.
pub(crate) fn gemv_split(out: usize, units: usize) -> u32 {
    let mut split = 1;
    while split < GEMV_WARPS
        && out * (split as usize) < GEMV_FILL_WARPS
        && units > 32 * split as usize
    {
        split *= 2;
    }
    split
}

/// What `gemv_*` does around its product.
#[derive(Clone, Copy)]
struct Epilogue<'a, T> {
    /// Normalise the input rows with this norm first.
    norm: Option<&'a Norm<T>>,
    /// Add this bias to the product.
    bias: Option<&'a CudaSlice<T>>,
    /// Add the product into the output (the residual stream) instead of overwriting it.
    in_place: bool,
    /// The weight is a gated MLP's gate then up projection: write `act(gate) * up` with this
    /// activation (`act_code`) instead of both products.
    gated: Option<i32>,
    /// Apply this activation (`act_code`) to the product (plus bias).
    act: Option<i32>,
}

impl<T> Default for Epilogue<'_, T> {
    fn default() -> Self {
        Epilogue {
            norm: None,
            bias: None,
            in_place: false,
            gated: None,
            act: None,
        }
    }
}

impl<'a, T> Epilogue<'a, T> {
    /// The product of the input's norm, plus `bias`.
    fn norm(norm: &'a Norm<T>, bias: Option<&'a CudaSlice<T>>) -> Self {
        Epilogue {
            norm: Some(norm),
            bias,
            ..Epilogue::default()
        }
    }

    /// The MLP's middle of the input's norm: `act(gate + bias) * (up + bias)` when `gated` (the
    /// weight holding the gate's rows then the up projection's), else `act(up + bias)`.
    fn mlp_norm(norm: &'a Norm<T>, bias: Option<&'a CudaSlice<T>>, act: i32, gated: bool) -> Self {
        Epilogue {
            norm: Some(norm),
            bias,
            gated: gated.then_some(act),
            act: (!gated).then_some(act),
            ..Epilogue::default()
        }
    }

    /// The product plus `bias`, added into the output (the residual stream).
    fn add_into(bias: Option<&'a CudaSlice<T>>) -> Self {
        Epilogue {
            bias,
            in_place: true,
            ..Epilogue::default()
        }
    }
}

/// The entry points the decoder loads besides the weight kernels (checked against the compiled
/// module by the tests).
pub(crate) const DECODER_KERNEL_NAMES: [&str; 20] = [
    "gather_rows",
    "append_mask",
    "residual_norm",
    "add_positions",
    "mlp_act",
    "argmax_rows",
    "sample_chunks",
    "sample_merge",
    "rope_split",
    "cached_attention",
    "cached_attention_scalar",
    "cross_attention",
    "cross_attention_scalar",
    "cross_combine",
    "relative_attention",
    "relative_attention_scalar",
    "cached_flash_attention_32",
    "cached_flash_attention_64",
    "gemv_wide_dense",
    "gemv1_wide_dense",
];

/// The null pointer a kernel reads as "no such input".
static NULL: u64 = 0;

/// Pushes the device pointer of `value`, or a null pointer for an input the kernel skips when it
/// is null (a bias, a norm's scale, a residual).
fn arg_or_null<'a, T>(args: &mut LaunchArgs<'a>, value: Option<&'a CudaSlice<T>>) {
    match value {
        Some(v) => args.arg(v),
        None => args.arg(&NULL),
    };
}

/// Threads of `argmax_rows` (`ARGMAX_THREADS` in decoder.cu).
const ARGMAX_THREADS: u32 = 256;

/// Threads, columns per block and tokens kept per row of `sample_chunks` / `sample_merge`
/// (`SAMPLE_THREADS`, `SAMPLE_CHUNK`, `SAMPLE_TOP` in decoder.cu).
const SAMPLE_THREADS: u32 = 512;
const SAMPLE_CHUNK: usize = 4096;
/// How many of a row's most likely tokens [`DecodeSession::forward_top`] returns.
pub const TOP_TOKENS: usize = 64;

/// The largest vocabulary [`DecodeSession::forward_top`] takes: its merge sorts every chunk's
/// [`TOP_TOKENS`] in one block's shared memory.
pub const MAX_TOP_VOCAB: usize = SAMPLE_CHUNK / TOP_TOKENS * SAMPLE_CHUNK;

/// What the device prepares for choosing one row's next token ([`DecodeSession::forward_top`]).
#[derive(Debug, Clone, Copy)]
pub struct TopRequest<'a> {
    /// The repetition penalty (1.0 = none): each of `penalized` is divided by it when positive
    /// and multiplied when negative, in f32.
    pub penalty: f32,
    /// The distinct tokens the penalty applies to.
    pub penalized: &'a [u32],
    /// The temperature `t` of a row whose total the host needs: the sum over the row of
    /// `exp(f64(v / t − max / t))` (each quotient and difference in f32).
    pub total_at: Option<f32>,
}

/// One row's most likely tokens after its penalty.
#[derive(Debug, Clone, PartialEq)]
pub struct TopTokens {
    /// Up to [`TOP_TOKENS`] `(token, penalised logit)`, the largest first (`total_cmp`), ties
    /// by the lower token.
    pub top: Vec<(u32, f32)>,
    /// The row's total, when [`TopRequest::total_at`] asked for it.
    pub total: Option<f64>,
}

/// The inverse of decoder.cu's `sample_key`: the token and value a key holds.
pub(crate) fn top_entry(key: u64) -> (u32, f32) {
    let u = !((key >> 32) as u32);
    let bits = if u & 0x8000_0000 != 0 {
        u & 0x7fff_ffff
    } else {
        !u
    };
    (key as u32, f32::from_bits(bits))
}

/// Set to `0` / `off` to run every product of the decoder on cuBLAS, or to a number of rows
/// (1 to 8) up to which products run on the engine's own GEMV kernel (default: 8 for a model that
/// stores block weights, 1 for one of dense weights).
pub const GEMV_ENV: &str = "IPFS_ACCELERATE_CUDA_GEMV";

/// The rows up to which products run on `gemv_*` ([`GEMV_ENV`], else the default of a model
/// that stores block weights or not).
fn gemv_rows(blocks: bool) -> usize {
    let set = std::env::var(GEMV_ENV).ok();
    match set.as_deref().map(str::trim) {
        Some(v) if is_off(v) => {
            tracing::debug!("{GEMV_ENV}={v}: every product on cuBLAS");
            0
        }
        Some(v) => match v.parse::<usize>() {
            Ok(n @ 1..=GEMV_ROWS) => n,
            _ => {
                tracing::warn!("{GEMV_ENV}={v} is not 0 / off or 1 to {GEMV_ROWS}: ignored");
                gemv_rows_default(blocks)
            }
        },
        None => gemv_rows_default(blocks),
    }
}

fn gemv_rows_default(blocks: bool) -> usize {
    if blocks {
        GEMV_ROWS
    } else {
        DENSE_GEMV_ROWS
    }
}

/// Whether the switch variable `name` is set to off.
pub(crate) fn switched_off(name: &str) -> bool {
    std::env::var(name).is_ok_and(|v| is_off(&v))
}

/// Whether a switch's value says off (`0`, `off`, `false`, any case).
fn is_off(value: &str) -> bool {
    matches!(value.to_ascii_lowercase().as_str(), "0" | "off" | "false")
}

/// Set to `0` / `off` to launch the decoding step's GEMVs as ordinary kernels instead of
/// overlapped with the kernel before them (programmatic dependent launch, compute capability 9.0
/// and later).
pub const OVERLAP_ENV: &str = "IPFS_ACCELERATE_CUDA_OVERLAP";

/// Kernel arguments for `cuLaunchKernelEx`, each value in its own 8-byte slot (the driver reads a
/// parameter's own size from the start of its slot, so a value of up to 8 bytes fits).
#[derive(Default)]
struct RawArgs(Vec<u64>);

impl RawArgs {
    fn arg<V: bytemuck::NoUninit>(&mut self, value: V) -> &mut Self {
        let bytes = bytemuck::bytes_of(&value);
        assert!(
            bytes.len() <= 8,
            "a kernel argument of {} bytes",
            bytes.len()
        );
        let mut slot = [0u8; 8];
        slot[..bytes.len()].copy_from_slice(bytes);
        self.0.push(u64::from_ne_bytes(slot));
        self
    }
}

/// Launches `func` on `stream` with `args`; with `overlap`, allowed to start while the kernel
/// before it on the stream finishes (programmatic dependent launch: the kernel waits with
/// `griddepcontrol.wait` before it touches that kernel's outputs, `wait_for_previous` in
/// decoder.cu). Graph capture keeps the overlap as a programmatic edge.
///
/// # Safety
/// `args` must match the kernel's parameters in number, order and size, and every buffer they
/// point to must hold what the grid reads and writes.
unsafe fn launch_raw(
    stream: &CudaStream,
    func: &CudaFunction,
    cfg: LaunchConfig,
    args: &mut RawArgs,
    overlap: bool,
) -> Result<(), EngineError> {
    use cudarc::driver::sys;
    // SAFETY: a zeroed attribute is valid; its id and value are set below.
    let mut attr: sys::CUlaunchAttribute = unsafe { std::mem::zeroed() };
    attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
    attr.value.programmaticStreamSerializationAllowed = 1;
    let config = sys::CUlaunchConfig {
        gridDimX: cfg.grid_dim.0,
        gridDimY: cfg.grid_dim.1,
        gridDimZ: cfg.grid_dim.2,
        blockDimX: cfg.block_dim.0,
        blockDimY: cfg.block_dim.1,
        blockDimZ: cfg.block_dim.2,
        sharedMemBytes: cfg.shared_mem_bytes,
        hStream: stream.cu_stream(),
        attrs: &mut attr,
        numAttrs: u32::from(overlap),
    };
    let mut params: Vec<*mut std::ffi::c_void> = args
        .0
        .iter_mut()
        .map(|slot| slot as *mut u64 as *mut std::ffi::c_void)
        .collect();
    // SAFETY: the caller's contract; `params` points into `args`, alive for the call (the driver
    // copies the values at launch).
    unsafe {
        sys::cuLaunchKernelEx(
            &config,
            func.cu_function(),
            params.as_mut_ptr(),
            std::ptr::null_mut(),
        )
        .result()
    }?;
    Ok(())
}

/// How a part of a weight is kept on the device.
enum Storage<T> {
    /// `[rows, in]` values of `T`.
    Dense(CudaSlice<T>),
    /// `[rows, in]` weights in ggml blocks, as the file stores them.
    Blocks {
        data: CudaSlice<u8>,
        format: BlockFormat,
    },
}

/// Consecutive output rows of a weight stored one way.
struct Part<T> {
    storage: Storage<T>,
    rows: usize,
}

impl<T> Part<T> {
    /// Bytes of one weight row of `k` values.
    fn row_bytes(&self, k: usize) -> usize {
        match &self.storage {
            Storage::Dense(_) => k * std::mem::size_of::<T>(),
            Storage::Blocks { format, .. } => k / format.block * format.bytes,
        }
    }

    /// Values a GEMV lane reads at a time (`Unit` in decoder.cu): 16 bytes of `T`, or 8 weights
    /// of a block.
    fn unit(&self) -> usize {
        match &self.storage {
            Storage::Dense(_) => crate::engine::vec_width::<T>(),
            Storage::Blocks { .. } => 8,
        }
    }

    /// The device address of its first row.
    fn ptr(&self, stream: &CudaStream) -> u64 {
        match &self.storage {
            Storage::Dense(d) => d.device_ptr(stream).0,
            Storage::Blocks { data, .. } => data.device_ptr(stream).0,
        }
    }
}

/// A dense layer on the device: `[out, in]` in parts (q, k and v stacked may keep different
/// block formats), its bias unless it is all zeros.
struct Weight<T> {
    parts: Vec<Part<T>>,
    bias: Option<CudaSlice<T>>,
    out_features: usize,
    in_features: usize,
}

impl<T> Weight<T> {
    fn has_blocks(&self) -> bool {
        self.parts
            .iter()
            .any(|p| matches!(p.storage, Storage::Blocks { .. }))
    }

    /// Bytes on the device.
    fn bytes(&self) -> usize {
        let parts: usize = self
            .parts
            .iter()
            .map(|p| p.rows * p.row_bytes(self.in_features))
            .sum();
        parts
            + self
                .bias
                .as_ref()
                .map_or(0, |b| b.len() * std::mem::size_of::<T>())
    }
}

/// A device address as cudarc's slice traits see it: cuBLAS on part of a buffer (a stacked
/// weight's rows, an output's columns). `len` is the values from `ptr` to the buffer's end.
struct At<'s, T> {
    ptr: u64,
    len: usize,
    stream: &'s Arc<CudaStream>,
    _t: PhantomData<T>,
}

impl<'s, T> At<'s, T> {
    fn new(stream: &'s Arc<CudaStream>, ptr: u64, len: usize) -> Self {
        At {
            ptr,
            len,
            stream,
            _t: PhantomData,
        }
    }
}

impl<T> DeviceSlice<T> for At<'_, T> {
    fn len(&self) -> usize {
        self.len
    }
    fn stream(&self) -> &Arc<CudaStream> {
        self.stream
    }
}

impl<T> DevicePtr<T> for At<'_, T> {
    fn device_ptr<'a>(&'a self, _stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

impl<T> DevicePtrMut<T> for At<'_, T> {
    fn device_ptr_mut<'a>(&'a mut self, _stream: &'a CudaStream) -> (u64, SyncOnDrop<'a>) {
        (self.ptr, SyncOnDrop::Sync(None))
    }
}

/// The heads `rope_split` splits a stacked projection into: `rows` rows (`n_new` per batch row) of
/// `heads` query heads, then `kv_heads` key and as many value heads, into caches of `cap` columns.
#[derive(Clone, Copy)]
struct SplitShape {
    heads: usize,
    kv_heads: usize,
    rows: usize,
    n_new: usize,
    cap: usize,
}

/// A relative position bias on the device: the bucket of every distance key − query in
/// `-offset..=offset` (at `distance + offset`), and the bias table `[buckets, heads]`.
struct Relative<T> {
    buckets: CudaSlice<i32>,
    table: CudaSlice<T>,
    offset: i32,
}

/// A norm on the device: a LayerNorm has `beta` (zeros when the checkpoint has none), an
/// RMSNorm not.
struct Norm<T> {
    gamma: CudaSlice<T>,
    beta: Option<CudaSlice<T>>,
}

/// A layer's cross-attention: the query, output and norm applied to the decoder's rows; the key
/// and value projections of the encoder's states, stacked `[2 * heads * head_dim, memory]` with
/// the bias always present (the split reads it).
struct CrossLayer<T> {
    norm: Norm<T>,
    query: Weight<T>,
    kv: Weight<T>,
    output: Weight<T>,
}

struct Layer<T> {
    input_norm: Norm<T>,
    /// q, k and v stacked: `[(heads + 2 * kv_heads) * head_dim, hidden]`, with the bias always
    /// present (zeros when the checkpoint has none: the RoPE kernel reads it).
    qkv: Weight<T>,
    output: Weight<T>,
    cross: Option<CrossLayer<T>>,
    post_norm: Norm<T>,
    /// gate and up stacked: `[2 * intermediate, hidden]`; the up projection alone in a plain MLP.
    gate_up: Weight<T>,
    down: Weight<T>,
    /// The sliding window, or 0.
    window: i32,
}

/// Sizes of the model.
#[derive(Clone, Copy)]
struct Dims {
    vocab: usize,
    hidden: usize,
    heads: usize,
    kv_heads: usize,
    head_dim: usize,
    intermediate: usize,
    eps: f32,
    act: i32,
    /// Whether the MLP is gated.
    gated: bool,
    max_positions: usize,
    valid_positions: Option<usize>,
    /// Positions index a learned table (below `max_positions`).
    learned_positions: bool,
    /// The width of the encoder states the cross-attention reads, if it has one.
    memory: Option<usize>,
    /// Whether queries see only the columns up to their own.
    causal: bool,
    /// What scores are multiplied by.
    score_scale: f32,
}

/// A [`DecoderSpec`] resident on the GPU in `T`.
pub struct Decoder<T: Elem> {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    kernels: Kernels,
    dims: Dims,
    /// The token embedding (and the LM head when tied).
    embed: Weight<T>,
    /// RoPE's frequencies (rotary positions).
    inv_freq: Option<CudaSlice<f32>>,
    /// The learned position table `[max_positions, hidden]` (learned positions).
    position_table: Option<CudaSlice<T>>,
    /// The relative position bias (relative positions).
    relative: Option<Relative<T>>,
    layers: Vec<Layer<T>>,
    final_norm: Norm<T>,
    /// The LM head; `None`: the token embedding (tied).
    lm_head: Option<Weight<T>>,
    /// Page-locked host memory the logits come back through.
    staging: Mutex<Option<PinnedHostSlice<T>>>,
    /// cuBLAS's workspace, set explicitly so GEMMs can be captured into graphs.
    _workspace: CudaSlice<u8>,
    /// Rows up to which products run on `gemv_*` ([`GEMV_ENV`]; 0: none).
    gemv_rows: usize,
    /// Whether GEMVs start overlapped with the kernel before them ([`OVERLAP_ENV`]; compute
    /// capability 9.0 and later).
    overlap: bool,
    /// Whether a prefill's self-attention may run on tensor cores ([`FLASH_MIN_COLUMNS`]): f16
    /// storage, heads of 32 or 64, compute capability 8.0 or later, not switched off by
    /// [`crate::engine::FUSED_ATTENTION_ENV`].
    flash_prefill: bool,
    /// Values of the scratch a call dequantizes block weights into for cuBLAS (0: no block
    /// weights).
    scratch_values: usize,
    /// Bytes of the weights on the device.
    weight_bytes: usize,
    /// Per-stage device times on stderr after every uncaptured call
    /// ([`crate::engine::PROFILE_ENV`]).
    profile: bool,
}

/// Bytes of cuBLAS workspace (NVIDIA's recommendation for Hopper).
const BLAS_WORKSPACE: usize = 32 << 20;

/// One batch's KV cache and attention mask on the device.
struct Cache<T> {
    batch: usize,
    capacity: usize,
    keys: Vec<CudaSlice<T>>,
    values: Vec<CudaSlice<T>>,
    /// `[batch, capacity]`: 1 for a token, 0 for padding.
    mask: CudaSlice<i32>,
}

/// The buffers of one call: the uploaded inputs `[past, ids, positions, mask]` and every
/// activation.
struct Buffers<T> {
    input: CudaSlice<i32>,
    x: CudaSlice<T>,
    hb: CudaSlice<T>,
    qkv: CudaSlice<T>,
    q: CudaSlice<T>,
    ctx: CudaSlice<T>,
    y: CudaSlice<T>,
    gu: CudaSlice<T>,
    act: CudaSlice<T>,
    logits: CudaSlice<T>,
    /// Block weights dequantized for cuBLAS (calls whose products are not all GEMVs).
    scratch: Option<CudaSlice<T>>,
    /// The cross-attention's partial outputs, when it splits its keys.
    parts: Option<CudaSlice<f32>>,
}

/// The one-token step of a session as a CUDA graph: its buffers stay at the addresses the graph
/// was captured with; each step uploads its inputs into them and replays the graph.
struct StepGraph<T> {
    buffers: Buffers<T>,
    graph: Option<SendGraph>,
}

/// A captured graph that may move between threads with its session.
struct SendGraph(CudaGraph);

// SAFETY: CUDA graph and executable-graph handles are not tied to the thread that made them;
// cudarc binds the context to the launching thread, and a session (which owns the graph) is used
// by one thread at a time (`&mut`).
unsafe impl Send for SendGraph {}

/// The keys and values of a cross-attention's encoder states, one pair per layer
/// `[batch, heads, frames, head_dim]`, computed when the state is made, and which frames are
/// tokens (none: all).
struct Memory<T> {
    keys: Vec<CudaSlice<T>>,
    values: Vec<CudaSlice<T>>,
    frames: usize,
    mask: Option<CudaSlice<i32>>,
}

/// The encoder's output a decoder with cross-attention reads.
#[derive(Debug, Clone, Copy)]
pub struct EncoderStates<'a> {
    /// `[batch, frames, width]`, f32, row-major.
    pub values: &'a [f32],
    /// Frames per row.
    pub frames: usize,
    /// `[batch, frames]`: 1 for a token, 0 for padding (none: every frame is a token).
    pub mask: Option<&'a [i32]>,
}

/// One batch's decoding state: the cache, the columns in it, and the captured step.
pub struct State<T> {
    cache: Cache<T>,
    /// The cross-attention's keys and values (a decoder with cross-attention).
    memory: Option<Memory<T>>,
    /// Columns already in the cache.
    past: usize,
    step: Option<StepGraph<T>>,
    /// Whether steps replay a CUDA graph ([`GRAPHS_ENV`]; off after a capture fails).
    graphs: bool,
    /// The penalised f32 logits `[batch, vocab]` of the last [`Decoder::forward_top`].
    scores: Option<CudaSlice<f32>>,
}

/// Set to `0` / `off` to run every decoding step as separate launches instead of replaying a
/// CUDA graph.
pub const GRAPHS_ENV: &str = "IPFS_ACCELERATE_CUDA_GRAPHS";

/// Which logits a call returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogitsOf {
    /// The last new column of each row: `[batch, vocab]`.
    Last,
    /// Every new column: `[batch, new, vocab]`.
    Every,
    /// No head: every new column's final-normed states `[batch, new, hidden]` (an encoder stack
    /// run on the decoder, such as T5's).
    States,
}

/// One call's new columns, row-major `[batch, new]` each.
pub struct Columns<'a> {
    /// Token ids (below the vocabulary size).
    pub ids: &'a [i32],
    /// RoPE positions (non-negative).
    pub positions: &'a [i32],
    /// 1 for a token, 0 for padding.
    pub mask: &'a [i32],
    /// Input embeddings that replace some columns' token embeddings.
    pub replaced: Option<Replaced<'a>>,
}

/// Input embeddings that replace the token embeddings of some of a call's columns, before any
/// position embedding is added (LLaVA's image features at its image tokens).
#[derive(Debug, Clone, Copy)]
pub struct Replaced<'a> {
    /// Indices into the call's `[batch, new]` columns (row-major), ascending.
    pub columns: &'a [usize],
    /// `[columns.len(), hidden]` finite f32, f16 or bf16 values (copied as they are when in the
    /// engine's storage type).
    pub values: &'a HostTensor,
}

/// [`Replaced`] ready to copy: its runs `(first column, first value row, length)` and its values
/// in the storage type (borrowed when the values are in it already).
type Upload<'a, T> = (Vec<(usize, usize, usize)>, std::borrow::Cow<'a, [T]>);

/// The fewest new columns a call's self-attention runs on tensor cores for (the flash kernel
/// computes 64 queries a block; a decoding step's few go to `cached_attention`).
const FLASH_MIN_COLUMNS: usize = 16;

/// What [`Decoder::run`] computes besides its buffers: `new` columns per row after `past`
/// cached ones (`None` inside a captured graph, where the device's count is read), and the
/// replaced input embeddings.
struct Call<'c, 'a, T: Clone> {
    new: usize,
    past: Option<usize>,
    replaced: Option<&'c Upload<'a, T>>,
}

impl Replaced<'_> {
    /// The replaced columns as runs `(first column, first value row, length)` of consecutive
    /// columns, after checking them against `rows` columns of `hidden` values.
    fn runs(&self, rows: usize, hidden: usize) -> Result<Vec<(usize, usize, usize)>, EngineError> {
        let n = self.columns.len();
        if self.values.shape() != [n, hidden] || !self.values.dtype().is_float() {
            return Err(EngineError::Input(format!(
                "replacement values of shape {:?} ({}) for {n} columns of hidden size {hidden}",
                self.values.shape(),
                self.values.dtype()
            )));
        }
        if let Some(w) = self.columns.windows(2).find(|w| w[0] >= w[1]) {
            return Err(EngineError::Input(format!(
                "replaced columns must ascend: {} then {}",
                w[0], w[1]
            )));
        }
        if let Some(&c) = self.columns.last().filter(|&&c| c >= rows) {
            return Err(EngineError::Input(format!(
                "replaced column {c} of a call of {rows} columns"
            )));
        }
        self.values
            .check_finite("the replacement embeddings")
            .map_err(|e| EngineError::Input(e.to_string()))?;
        let mut runs: Vec<(usize, usize, usize)> = Vec::new();
        for (k, &c) in self.columns.iter().enumerate() {
            match runs.last_mut() {
                Some((first, _, len)) if *first + *len == c => *len += 1,
                _ => runs.push((c, k, 1)),
            }
        }
        Ok(runs)
    }
}

impl<T: Elem> Decoder<T>
where
    CudaBlas: Gemm<T>,
{
    /// Checks `spec`, compiles the kernels and uploads the weights to device `ordinal`.
    pub fn load(spec: &DecoderSpec, ordinal: usize) -> Result<Self, EngineError> {
        check_decoder_spec(spec)?;
        // Only the block formats the model stores are compiled, by NVRTC on its own threads while
        // the context opens and the weights go up.
        let mut formats: Vec<BlockFormat> = spec
            .dense_layers()
            .filter_map(|d| BlockFormat::of(d.blocks.as_ref()?.ggml_type))
            .collect();
        formats.sort_by_key(|f| f.index);
        formats.dedup();
        let compiling = start_compile::<T>(ordinal, KernelSet::decoder(&formats))?;
        let (stream, blas) = open_stream(ordinal)?;
        let workspace = stream.alloc_zeros::<u8>(BLAS_WORKSPACE)?;
        {
            let (ptr, _sync) = workspace.device_ptr(&stream);
            // SAFETY: the workspace lives as long as the handle (both fields of the decoder) and
            // is used on the handle's stream only.
            let status = unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ptr as *mut std::ffi::c_void,
                    BLAS_WORKSPACE,
                )
            };
            if status != cudarc::cublas::sys::cublasStatus_t::CUBLAS_STATUS_SUCCESS {
                return Err(EngineError::Spec(format!(
                    "cuBLAS refused its workspace: {status:?}"
                )));
            }
        }
        let up = |v: &[f32]| -> Result<CudaSlice<T>, EngineError> {
            let mut d =
                unsafe { device_buffer(&stream, v.len(), || format!("{} weights", v.len())) }?;
            stream.memcpy_htod(&T::from_f32_slice(v), &mut d)?;
            Ok(d)
        };
        let layer_norm = spec.norm == DecoderNorm::Layer;
        let norm = |n: &NormWeights| -> Result<Norm<T>, EngineError> {
            Ok(Norm {
                gamma: up(&n.gamma)?,
                // A LayerNorm's shift is always uploaded: the kernels tell the kinds apart by it.
                beta: if layer_norm { Some(up(&n.beta)?) } else { None },
            })
        };
        // Consecutive layers stored alike become one part (f32 values converted to T, blocks
        // concatenated row by row); a layer in another format starts a new part.
        let stacked = |name: &str,
                       layers: &[&DenseWeights],
                       keep_zero_bias: bool|
         -> Result<Weight<T>, EngineError> {
            let k = layers[0].in_features;
            let mut parts: Vec<Part<T>> = Vec::new();
            let mut start = 0;
            while start < layers.len() {
                let kind = layers[start].blocks.as_ref().map(|b| b.ggml_type);
                let end = start
                    + layers[start..]
                        .iter()
                        .take_while(|l| l.blocks.as_ref().map(|b| b.ggml_type) == kind)
                        .count();
                let group = &layers[start..end];
                let rows: usize = group.iter().map(|l| l.out_features).sum();
                let storage = match (kind, kind.and_then(half_dtype)) {
                    (None, _) => {
                        let values: Vec<f32> = group
                            .iter()
                            .flat_map(|l| l.weight.iter().copied())
                            .collect();
                        Storage::Dense(up(&values)?)
                    }
                    (Some(_), Some(dtype)) => {
                        // The host tensor checks the length and converts (F16 / BF16 to f32).
                        let mut values = Vec::with_capacity(rows * k);
                        for l in group {
                            let data = l
                                .blocks
                                .as_ref()
                                .map(|b| b.data.clone())
                                .unwrap_or_default();
                            let shape = vec![l.out_features, k];
                            let t = HostTensor::from_bytes(name, shape, dtype, data)
                                .map_err(|e| EngineError::Spec(e.to_string()))?;
                            values.extend(t.to_f32_vec());
                        }
                        Storage::Dense(up(&values)?)
                    }
                    (Some(id), None) => {
                        let format = BlockFormat::of(id).ok_or_else(|| {
                            EngineError::Spec(format!(
                                "{name}: ggml type {id} is not a block format the decoder reads \
                                 ({})",
                                BLOCK_FORMATS.map(|f| f.name).join(", ")
                            ))
                        })?;
                        let mut bytes = Vec::new();
                        for l in group {
                            let b = l.blocks.as_ref().map_or(&[][..], |b| &b.data[..]);
                            let want = format.row_bytes(k).map(|r| r * l.out_features);
                            if want != Some(b.len()) {
                                return Err(EngineError::Spec(format!(
                                    "{name}: {} bytes of {} blocks for [{}, {k}] weights \
                                     (expected {})",
                                    b.len(),
                                    format.name,
                                    l.out_features,
                                    want.map_or_else(
                                        || format!("a multiple of {} inputs", format.block),
                                        |w| w.to_string()
                                    )
                                )));
                            }
                            bytes.extend_from_slice(b);
                        }
                        let mut data = unsafe {
                            device_buffer::<u8>(&stream, bytes.len(), || {
                                format!("{name}'s {} blocks", format.name)
                            })
                        }?;
                        stream.memcpy_htod(&bytes, &mut data)?;
                        Storage::Blocks { data, format }
                    }
                };
                parts.push(Part { storage, rows });
                start = end;
            }
            let bias: Vec<f32> = layers.iter().flat_map(|p| p.bias.iter().copied()).collect();
            Ok(Weight {
                parts,
                bias: if keep_zero_bias || bias.iter().any(|&b| b != 0.0) {
                    Some(up(&bias)?)
                } else {
                    None
                },
                out_features: layers.iter().map(|p| p.out_features).sum(),
                in_features: k,
            })
        };
        let layers = spec
            .layers
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let name = |what: &str| format!("layer {i} {what}");
                let cross = l
                    .cross
                    .as_ref()
                    .map(|c| -> Result<CrossLayer<T>, EngineError> {
                        Ok(CrossLayer {
                            norm: norm(&c.norm)?,
                            // Its bias is kept even when zero: the prompt's split adds it.
                            query: stacked(&name("cross query"), &[&c.query], true)?,
                            kv: stacked(&name("cross key / value"), &[&c.key, &c.value], true)?,
                            output: stacked(&name("cross output"), &[&c.output], false)?,
                        })
                    })
                    .transpose()?;
                let mlp_in: Vec<&DenseWeights> = l.gate.iter().chain([&l.up]).collect();
                Ok(Layer {
                    input_norm: norm(&l.input_norm)?,
                    qkv: stacked(&name("q / k / v"), &[&l.query, &l.key, &l.value], true)?,
                    output: stacked(&name("output"), &[&l.output], false)?,
                    cross,
                    post_norm: norm(&l.post_norm)?,
                    gate_up: stacked(&name("gate / up"), &mlp_in, false)?,
                    down: stacked(&name("down"), &[&l.down], false)?,
                    window: l.window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
                })
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
        let embed = stacked("the token embedding", &[&spec.embed], false)?;
        let lm_head = spec
            .lm_head
            .as_ref()
            .map(|h| stacked("the LM head", &[h], false))
            .transpose()?;
        let weights = || {
            layers
                .iter()
                .flat_map(|l| {
                    [&l.qkv, &l.output, &l.gate_up, &l.down]
                        .into_iter()
                        .chain(l.cross.iter().flat_map(|c| [&c.query, &c.kv, &c.output]))
                })
                .chain(std::iter::once(&embed))
                .chain(lm_head.as_ref())
        };
        let scratch_values = weights()
            .filter(|w| w.has_blocks())
            .map(|w| w.out_features * w.in_features)
            .max()
            .map_or(0, |most| {
                most.min(SCRATCH_VALUES.max(spec.hidden.max(spec.intermediate)))
            });
        let (inv_freq, position_table, relative) = match &spec.positions {
            DecoderPositions::Rotary(r) => (Some(stream.clone_htod(&r.inv_freq)?), None, None),
            DecoderPositions::Learned(table) => (None, Some(up(table)?), None),
            DecoderPositions::Relative(r) => {
                let reach = spec.max_positions as i64 - 1;
                let buckets: Vec<i32> = (-reach..=reach).map(|d| r.bucket(d) as i32).collect();
                let relative = Relative {
                    buckets: stream.clone_htod(&buckets)?,
                    table: up(&r.table)?,
                    offset: reach as i32,
                };
                (None, None, Some(relative))
            }
        };
        let vector_values = position_table.as_ref().map_or(0, |t| t.len())
            + relative.as_ref().map_or(0, |r| r.table.len())
            + spec
                .norms()
                .map(|n| n.gamma.len() + if layer_norm { n.gamma.len() } else { 0 })
                .sum::<usize>();
        let weight_bytes =
            weights().map(Weight::bytes).sum::<usize>() + vector_values * std::mem::size_of::<T>();
        let kernels = Kernels::from_module(&compiling.load(stream.context())?, &formats)?;
        let decoder = Decoder {
            kernels,
            dims: Dims {
                vocab: spec.vocab,
                hidden: spec.hidden,
                heads: spec.heads,
                kv_heads: spec.kv_heads,
                head_dim: spec.head_dim,
                intermediate: spec.intermediate,
                eps: spec.eps,
                act: act_code(spec.activation),
                gated: spec.gated(),
                max_positions: spec.max_positions,
                valid_positions: spec.rotary().and_then(|r| r.valid_positions),
                learned_positions: position_table.is_some(),
                memory: spec.memory_width(),
                causal: spec.causal,
                score_scale: spec.score_scale as f32,
            },
            embed,
            inv_freq,
            position_table,
            relative,
            layers,
            final_norm: norm(&spec.final_norm)?,
            lm_head,
            scratch_values,
            weight_bytes,
            staging: Mutex::new(None),
            _workspace: workspace,
            gemv_rows: gemv_rows(scratch_values > 0),
            overlap: stream.context().compute_capability()?.0 >= 9 && !switched_off(OVERLAP_ENV),
            flash_prefill: T::DTYPE == DType::F16
                && matches!(spec.head_dim, 32 | 64)
                && stream.context().compute_capability()?.0 >= 8
                && !switched_off(crate::engine::FUSED_ATTENTION_ENV),
            profile: crate::engine::profile_requested(),
            blas,
            stream,
        };
        decoder.stream.synchronize()?;
        Ok(decoder)
    }

    /// An empty cache for `batch` rows of at most `capacity` columns each; a cache the device
    /// cannot hold is [`EngineError::OutOfMemory`] naming its size. A decoder with
    /// cross-attention needs the encoder's states, whose keys and values every layer computes here
    /// once.
    pub fn new_state(
        &self,
        batch: usize,
        capacity: usize,
        memory: Option<EncoderStates<'_>>,
    ) -> Result<State<T>, EngineError> {
        let d = &self.dims;
        let memory = match (d.memory, memory) {
            (None, None) => None,
            (None, Some(_)) => {
                return Err(EngineError::Input(
                    "encoder states for a decoder without cross-attention".into(),
                ))
            }
            (Some(width), None) => {
                return Err(EngineError::Input(format!(
                    "the decoder's cross-attention needs encoder states of width {width}"
                )))
            }
            (Some(width), Some(m)) => {
                let frames = m.frames;
                if frames == 0 || m.values.len() != batch * frames * width {
                    return Err(EngineError::Input(format!(
                        "{} encoder values for {batch} rows × {frames} frames × {width} features",
                        m.values.len()
                    )));
                }
                if m.mask.is_some_and(|k| k.len() != batch * frames) {
                    return Err(EngineError::Input(format!(
                        "an encoder mask of {} values for {batch} rows × {frames} frames",
                        m.mask.map_or(0, <[i32]>::len)
                    )));
                }
                if let Some(bad) = m.values.iter().find(|v| !v.is_finite()) {
                    return Err(EngineError::Input(format!("the encoder states hold {bad}")));
                }
                Some(m)
            }
        };
        if batch == 0 || capacity == 0 {
            return Err(EngineError::Input(format!(
                "a KV cache of {batch} rows × {capacity} columns holds nothing"
            )));
        }
        if capacity > d.max_positions {
            return Err(EngineError::Input(format!(
                "a KV cache of {capacity} columns exceeds the model's {} positions",
                d.max_positions
            )));
        }
        let per_layer = batch * d.kv_heads * capacity * d.head_dim;
        let what = || {
            format!(
                "the KV cache of {batch} rows × {capacity} columns ({} layers × 2 × {per_layer} values)",
                self.layers.len()
            )
        };
        let mut keys = Vec::with_capacity(self.layers.len());
        let mut values = Vec::with_capacity(self.layers.len());
        for _ in &self.layers {
            // SAFETY: a cache column is written (rope_split) before any query reads it.
            keys.push(unsafe { device_buffer::<T>(&self.stream, per_layer, what) }?);
            values.push(unsafe { device_buffer::<T>(&self.stream, per_layer, what) }?);
        }
        let memory = match memory {
            Some(m) => Some(self.memory(batch, m)?),
            None => None,
        };
        Ok(State {
            cache: Cache {
                batch,
                capacity,
                keys,
                values,
                mask: self.stream.alloc_zeros::<i32>(batch * capacity)?,
            },
            memory,
            past: 0,
            step: None,
            graphs: !switched_off(GRAPHS_ENV),
            scores: None,
        })
    }

    /// Every layer's cross-attention keys and values of `states` `[batch, frames, width]`: one
    /// product with the stacked key / value weight, split into heads (the value bias added).
    fn memory(&self, batch: usize, m: EncoderStates<'_>) -> Result<Memory<T>, EngineError> {
        let (states, frames) = (m.values, m.frames);
        let d = &self.dims;
        let s = &self.stream;
        let rows = batch * frames;
        let width = d.heads * d.head_dim;
        let what = |n: usize| {
            move || {
                format!("the cross-attention's keys and values of {batch} × {frames} frames ({n} values)")
            }
        };
        let mut x = unsafe { device_buffer::<T>(s, states.len(), what(states.len())) }?;
        s.memcpy_htod(&T::from_f32_slice(states), &mut x)?;
        // SAFETY: written by the product before the split reads it.
        let mut kv = unsafe { device_buffer::<T>(s, rows * 2 * width, what(rows * 2 * width)) }?;
        let mut scratch = if self.scratch_values > 0 {
            Some(unsafe { device_buffer::<T>(s, self.scratch_values, what(self.scratch_values)) }?)
        } else {
            None
        };
        let zero = s.alloc_zeros::<i32>(1)?;
        let (mut keys, mut values) = (Vec::new(), Vec::new());
        for layer in &self.layers {
            let cross = layer
                .cross
                .as_ref()
                .ok_or_else(|| EngineError::Spec("a layer without cross-attention".into()))?;
            let w = &cross.kv;
            let x_ptr = x.device_ptr(s).0;
            let kv_ptr = kv.device_ptr_mut(s).0;
            self.linear(w, (x_ptr, w.in_features), rows, kv_ptr, scratch.as_mut())?;
            // SAFETY: both written in full by the split below.
            let mut k = unsafe { device_buffer::<T>(s, rows * width, what(rows * width)) }?;
            let mut v = unsafe { device_buffer::<T>(s, rows * width, what(rows * width)) }?;
            // No query heads, no rotation: the keys and values of every frame (the value bias
            // added), `cap` = `n_new` = frames.
            let shape = SplitShape {
                heads: 0,
                kv_heads: d.heads,
                rows,
                n_new: frames,
                cap: frames,
            };
            let (k_ptr, v_ptr) = (k.device_ptr_mut(s).0, v.device_ptr_mut(s).0);
            let past = zero.device_ptr(s).0;
            self.split(w, kv_ptr, shape, (0, past), (0, k_ptr, v_ptr))?;
            keys.push(k);
            values.push(v);
        }
        Ok(Memory {
            keys,
            values,
            frames,
            mask: m.mask.map(|k| s.clone_htod(k)).transpose()?,
        })
    }

    /// `rope_split` of the product of `w` at `qkv` (a device pointer) plus `w`'s bias: query heads
    /// to `q`, key and value heads into the caches `k` / `v` at column `past[0]` + i (`q`, `k`,
    /// `v` and `past` device pointers, 0 where `shape` has no such heads), rotated by RoPE at
    /// `positions` when it is not 0 and the model has rotary frequencies.
    fn split(
        &self,
        w: &Weight<T>,
        qkv: u64,
        shape: SplitShape,
        (positions, past): (u64, u64),
        (q, k, v): (u64, u64, u64),
    ) -> Result<(), EngineError> {
        let s = &self.stream;
        let bias = w
            .bias
            .as_ref()
            .ok_or_else(|| EngineError::Spec("a split projection without its bias".into()))?;
        let inv_freq = match (&self.inv_freq, positions) {
            (Some(f), p) if p != 0 => f.device_ptr(s).0,
            _ => 0,
        };
        let dh = self.dims.head_dim;
        let ints = [shape.heads, shape.kv_heads, dh, shape.n_new, shape.cap].map(|n| n as i32);
        let mut args = s.launch_builder(&self.kernels.rope_split);
        args.arg(&qkv)
            .arg(bias)
            .arg(&positions)
            .arg(&inv_freq)
            .arg(&past);
        for n in &ints {
            args.arg(n);
        }
        args.arg(&q).arg(&k).arg(&v);
        // SAFETY: rope_split(qkv, bias, positions, inv_freq, past, heads, kv_heads, head_dim,
        // n_new, cap, q, k, v): `rows` rows of (heads + 2 × kv_heads) × head_dim values at `qkv`
        // and as many bias values; `rows` positions when rotating; q holds `rows` rows of heads,
        // the caches `batch × kv_heads × cap × head_dim` values (the callers' buffers).
        unsafe {
            args.launch(LaunchConfig {
                grid_dim: (
                    shape.rows as u32,
                    (shape.heads + 2 * shape.kv_heads) as u32,
                    1,
                ),
                block_dim: ((dh / 2) as u32, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        Ok(())
    }

    /// Whether a product of `rows` rows of `k` values (row stride `x_stride`) runs on the GEMV
    /// kernels: the rows are few enough ([`GEMV_ENV`]) and 16-byte aligned.
    fn gemv_fits(&self, k: usize, x_stride: usize, rows: usize) -> bool {
        let vec = crate::engine::vec_width::<T>();
        rows <= self.gemv_rows && k.is_multiple_of(vec) && x_stride.is_multiple_of(vec)
    }

    /// `gemv_*` launches, one per part of `w`: `y = [residual +] act(x' · Wᵀ [+ bias])`, x' the
    /// epilogue's norm of x when given (see decoder.cu). `x` is a device pointer and row
    /// stride; `y` (and the residual, which is `y` itself when `in_place`) a device pointer to
    /// rows of `w.out_features` values — half of them when the epilogue is `gated` (one part).
    fn gemv(
        &self,
        w: &Weight<T>,
        (x, x_stride): (u64, usize),
        rows: usize,
        epilogue: Epilogue<'_, T>,
        y: u64,
    ) -> Result<(), EngineError> {
        let s = &self.stream;
        let size = std::mem::size_of::<T>() as u64;
        let (stride_i, rows_i) = (x_stride as i32, rows as i32);
        let (k_i, y_stride) = (w.in_features as i32, w.out_features as i32);
        let bias = epilogue.bias.map(|b| b.device_ptr(s).0);
        let gamma = epilogue.norm.map_or(0, |n| n.gamma.device_ptr(s).0);
        let beta = epilogue
            .norm
            .and_then(|n| n.beta.as_ref())
            .map_or(0, |b| b.device_ptr(s).0);
        let gated_i = epilogue.gated.unwrap_or(-1);
        let act_i = epilogue.act.unwrap_or(-1);
        if epilogue.gated.is_some() && (w.parts.len() != 1 || epilogue.in_place) {
            return Err(EngineError::Spec(
                "a gated product takes one part and writes its own output".into(),
            ));
        }
        let y_stride = if epilogue.gated.is_some() {
            y_stride / 2
        } else {
            y_stride
        };
        let mut first = 0u64;
        for part in &w.parts {
            let row_bytes = part.row_bytes(w.in_features) as i64;
            let w_ptr = part.ptr(s);
            let y_part = y + first * size;
            let bias_part = bias.map_or(0, |b| b + first * size);
            let residual = if epilogue.in_place { y_part } else { 0 };
            let mut split = gemv_split(part.rows, w.in_features / part.unit());
            // Outputs a block computes: gated, pairs of a gate and an up feature.
            let (out, per_block) = if epilogue.gated.is_some() {
                split = split.min(GEMV_WARPS / 2);
                (part.rows / 2, GEMV_WARPS / split / 2)
            } else {
                (part.rows, GEMV_WARPS / split)
            };
            let (out_i, split_i) = (out as i32, split as i32);
            let kernels = self.kernels.of(&part.storage)?;
            let wide = beta != 0 || epilogue.act.is_some();
            let func = match (&part.storage, wide, rows == 1) {
                (Storage::Dense(_), true, true) => &self.kernels.wide_dense.1,
                (Storage::Dense(_), true, false) => &self.kernels.wide_dense.0,
                (Storage::Blocks { format, .. }, true, _) => {
                    return Err(EngineError::Spec(format!(
                        "a LayerNorm or plain MLP over {} blocks (the decoder reads those \
                         decoders' weights dense)",
                        format.name
                    )))
                }
                (_, false, true) => &kernels.gemv1,
                (_, false, false) => &kernels.gemv,
            };
            let mut args = RawArgs::default();
            args.arg(w_ptr)
                .arg(row_bytes)
                .arg(x)
                .arg(stride_i)
                .arg(rows_i)
                .arg(out_i)
                .arg(k_i)
                .arg(gamma)
                .arg(beta)
                .arg(self.dims.eps)
                .arg(bias_part)
                .arg(residual)
                .arg(y_part)
                .arg(y_stride)
                .arg(split_i)
                .arg(gated_i)
                .arg(act_i);
            let cfg = LaunchConfig {
                grid_dim: ((out as u32).div_ceil(per_block), 1, 1),
                block_dim: (32 * GEMV_WARPS, 1, 1),
                shared_mem_bytes: 0,
            };
            // SAFETY: `gemv[1]_*(w, row_bytes, x, x_stride, rows, out, k, gamma, beta, eps,
            // bias, residual, y, y_stride, split, gated, act)` (8-byte pointers and row_bytes,
            // 4-byte integers and eps, in this order) reads the part's rows of `row_bytes` (`out`,
            // or 2 × `out` gated), `rows` rows of `k` values of `x` (16-byte aligned:
            // `gemv_fits`), `k` of gamma and beta, as many bias values as weight rows, and reads /
            // writes `out` columns of `rows` rows of `y`.
            unsafe { launch_raw(s, func, cfg, &mut args, self.overlap) }?;
            first += part.rows as u64;
        }
        Ok(())
    }

    /// `dequant_*`: `rows` rows of a part into `out` as `T` — rows `ids[r]` (a device pointer)
    /// when `ids` is not 0, else rows `first..first + rows`.
    fn dequant(
        &self,
        part: &Part<T>,
        k: usize,
        (ids, first): (u64, usize),
        rows: usize,
        out: u64,
    ) -> Result<(), EngineError> {
        let s = &self.stream;
        let unit = match part.storage {
            Storage::Dense(_) => crate::engine::vec_width::<T>(),
            Storage::Blocks { .. } => BLOCK_UNIT,
        };
        let (row_bytes, first_i, k_i) = (part.row_bytes(k) as i64, first as i32, k as i32);
        let w_ptr = part.ptr(s);
        let mut args = s.launch_builder(&self.kernels.of(&part.storage)?.dequant);
        args.arg(&w_ptr)
            .arg(&row_bytes)
            .arg(&ids)
            .arg(&first_i)
            .arg(&k_i)
            .arg(&out);
        // SAFETY: `dequant_*(w, row_bytes, ids, first, k, out)` reads `rows` rows of the part
        // (ids below its rows: checked against the vocabulary) and writes `rows × k` values.
        unsafe {
            args.launch(LaunchConfig {
                grid_dim: (rows as u32, (k / unit).div_ceil(256) as u32, 1),
                block_dim: (256, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        Ok(())
    }

    /// `y[rows, out] = x[rows, in] · Wᵀ` (no bias), row `r` of `x` at `x + r * x_stride` values,
    /// of `y` at `y + r * out`: the engine's GEMV kernels for a decoding step's few rows, cuBLAS
    /// otherwise (block weights dequantized into `scratch` a slice of rows at a time first).
    fn linear(
        &self,
        w: &Weight<T>,
        (x, x_stride): (u64, usize),
        rows: usize,
        y: u64,
        scratch: Option<&mut CudaSlice<T>>,
    ) -> Result<(), EngineError> {
        let k = w.in_features;
        if self.gemv_fits(k, x_stride, rows) {
            return self.gemv(w, (x, x_stride), rows, Epilogue::default(), y);
        }
        let s = &self.stream;
        let size = std::mem::size_of::<T>() as u64;
        let x_at = At::<T>::new(s, x, (rows - 1) * x_stride + k);
        let gemm = |a: &dyn Fn() -> (u64, usize), m: usize, first: usize| {
            let cfg = GemmConfig {
                transa: CUBLAS_OP_T,
                transb: CUBLAS_OP_N,
                m: m as i32,
                n: rows as i32,
                k: k as i32,
                alpha: T::from_f32(1.0),
                lda: k as i32,
                ldb: x_stride as i32,
                beta: T::from_f32(0.0),
                ldc: w.out_features as i32,
            };
            let (a_ptr, a_len) = a();
            let a_at = At::<T>::new(s, a_ptr, a_len);
            let mut y_at = At::<T>::new(s, y + first as u64 * size, rows * w.out_features - first);
            // SAFETY: `a` holds `m` rows of `k` values, `x` `rows` rows of stride `x_stride`,
            // and `y` `rows` rows of `out_features` from which columns `first..first + m` are
            // written.
            unsafe { self.blas.gemm(cfg, &a_at, &x_at, &mut y_at) }
        };
        let mut scratch = scratch;
        let mut first = 0;
        for part in &w.parts {
            match &part.storage {
                Storage::Dense(d) => {
                    gemm(&|| (d.device_ptr(s).0, d.len()), part.rows, first)?;
                }
                Storage::Blocks { .. } => {
                    let buf = scratch.as_deref_mut().ok_or_else(|| {
                        EngineError::Spec("no scratch for a block weight's product".into())
                    })?;
                    let chunk = (buf.len() / k).clamp(1, part.rows);
                    let buf_ptr = buf.device_ptr_mut(s).0;
                    for r0 in (0..part.rows).step_by(chunk) {
                        let n = chunk.min(part.rows - r0);
                        self.dequant(part, k, (0, r0), n, buf_ptr)?;
                        gemm(&|| (buf_ptr, n * k), n, first + r0)?;
                    }
                }
            }
            first += part.rows;
        }
        Ok(())
    }

    /// Runs `columns` (`new` per row) after the columns already in `state` and returns the
    /// logits `of` the last or every new column, in f32. A one-token step replays the session's
    /// CUDA graph (captured on the first step) unless graphs are off.
    pub fn forward(
        &self,
        state: &mut State<T>,
        columns: &Columns<'_>,
        new: usize,
        of: LogitsOf,
    ) -> Result<Vec<f32>, EngineError> {
        self.compute(state, columns, new, of, |logits| self.download(logits))
    }

    /// [`Decoder::forward`] of the last column, greedy on the device: each row's argmax (the
    /// lowest index on ties, as the host's argmax), `batch` indices to the host instead of
    /// `batch × vocab` logits. NaN logits are an error.
    pub fn forward_argmax(
        &self,
        state: &mut State<T>,
        columns: &Columns<'_>,
        new: usize,
    ) -> Result<Vec<u32>, EngineError> {
        let batch = state.cache.batch;
        self.compute(state, columns, new, LogitsOf::Last, |logits| {
            self.argmax(logits, batch)
        })
    }

    /// The index of the largest value of each of `rows` rows of `logits`.
    fn argmax(&self, logits: &CudaSlice<T>, rows: usize) -> Result<Vec<u32>, EngineError> {
        let vocab = (logits.len() / rows) as i32;
        // SAFETY: written in full by the launch below before it is read.
        let mut out = unsafe {
            device_buffer::<i32>(&self.stream, rows, || format!("{rows} greedy tokens"))
        }?;
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (ARGMAX_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `argmax_rows(logits, vocab, out)` (decoder.cu) over `rows` rows of `vocab`
        // values with ARGMAX_THREADS threads; `out` holds `rows` indices.
        unsafe {
            self.stream
                .launch_builder(&self.kernels.argmax_rows)
                .arg(logits)
                .arg(&vocab)
                .arg(&mut out)
                .launch(cfg)?;
        }
        let picked = self.stream.clone_dtoh(&out)?;
        picked
            .into_iter()
            .map(|i| {
                u32::try_from(i)
                    .map_err(|_| EngineError::Numeric("the model produced NaN logits".into()))
            })
            .collect()
    }

    /// [`Decoder::forward`] of the last column, with each row's most likely tokens after its
    /// repetition penalty (and its softmax total when asked) instead of the logits; the
    /// penalised logits stay on the device for [`Decoder::scores`]. NaN logits are an error.
    pub fn forward_top(
        &self,
        state: &mut State<T>,
        columns: &Columns<'_>,
        new: usize,
        rows: &[TopRequest<'_>],
    ) -> Result<Vec<TopTokens>, EngineError> {
        let batch = state.cache.batch;
        if rows.len() != batch {
            return Err(EngineError::Input(format!(
                "{} sampling requests for a batch of {batch}",
                rows.len()
            )));
        }
        state.scores = None;
        let (top, scores) = self.compute(state, columns, new, LogitsOf::Last, |logits| {
            self.top_tokens(logits, rows)
        })?;
        state.scores = Some(scores);
        Ok(top)
    }

    /// Row `row` of the penalised logits of the last [`Decoder::forward_top`].
    pub fn scores(&self, state: &State<T>, row: usize) -> Result<Vec<f32>, EngineError> {
        let scores = state
            .scores
            .as_ref()
            .ok_or_else(|| EngineError::Input("no sampled step to read scores of".into()))?;
        let batch = state.cache.batch;
        if row >= batch {
            return Err(EngineError::Input(format!(
                "row {row} of a batch of {batch}"
            )));
        }
        let vocab = scores.len() / batch;
        Ok(self
            .stream
            .clone_dtoh(&scores.slice(row * vocab..(row + 1) * vocab))?)
    }

    /// `sample_chunks` and `sample_merge` over `logits` `[rows, vocab]`: each row's most likely
    /// tokens and the penalised logits.
    fn top_tokens(
        &self,
        logits: &CudaSlice<T>,
        rows: &[TopRequest<'_>],
    ) -> Result<(Vec<TopTokens>, CudaSlice<f32>), EngineError> {
        let n = rows.len();
        let vocab = logits.len() / n.max(1);
        if vocab > MAX_TOP_VOCAB {
            return Err(EngineError::Input(format!(
                "a vocabulary of {vocab} (sampling on the device takes up to {MAX_TOP_VOCAB})"
            )));
        }
        let chunks = vocab.div_ceil(SAMPLE_CHUNK);
        // offsets (n + 1), then the penalised tokens; penalties (n), then temperatures (n).
        let mut ints: Vec<i32> = Vec::with_capacity(n + 1);
        ints.push(0);
        for r in rows {
            let last = ints[ints.len() - 1];
            ints.push(last + r.penalized.len() as i32);
        }
        ints.extend(
            rows.iter()
                .flat_map(|r| r.penalized.iter().map(|&t| t as i32)),
        );
        let floats: Vec<f32> = rows
            .iter()
            .map(|r| r.penalty)
            .chain(rows.iter().map(|r| r.total_at.unwrap_or(0.0)))
            .collect();
        let s = &self.stream;
        let ints_d = s.clone_htod(&ints)?;
        let floats_d = s.clone_htod(&floats)?;
        let what = |part: &'static str| move || format!("{part} of sampling {n} rows of {vocab}");
        // SAFETY: every element is written by the launches below before it is read.
        let (mut scores, mut top, mut nan, mut out) = unsafe {
            (
                device_buffer::<f32>(s, n * vocab, what("the scores"))?,
                device_buffer::<u64>(s, n * chunks * TOP_TOKENS, what("the chunks' tokens"))?,
                device_buffer::<i32>(s, n * chunks, what("the NaN flags"))?,
                device_buffer::<u64>(s, n * (TOP_TOKENS + 2), what("the tokens"))?,
            )
        };
        let (vocab_i, chunks_i) = (vocab as i32, chunks as i32);
        let (offsets, tokens) = (ints_d.slice(..n + 1), ints_d.slice(n + 1..));
        let (penalties, temperatures) = (floats_d.slice(..n), floats_d.slice(n..));
        let block = |grid: (u32, u32, u32)| LaunchConfig {
            grid_dim: grid,
            block_dim: (SAMPLE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: `sample_chunks` (decoder.cu) over `n` rows of `vocab` in `chunks` blocks of
        // SAMPLE_CHUNK each; `offsets` has n + 1 entries bounding `tokens`; `scores`, `top`
        // and `nan` hold n × vocab, n × chunks × TOP_TOKENS and n × chunks values. Then
        // `sample_merge` over the same, `out` holding n × (TOP_TOKENS + 2) values.
        unsafe {
            s.launch_builder(&self.kernels.sample_chunks)
                .arg(logits)
                .arg(&vocab_i)
                .arg(&offsets)
                .arg(&tokens)
                .arg(&penalties)
                .arg(&mut scores)
                .arg(&mut top)
                .arg(&mut nan)
                .launch(block((chunks as u32, n as u32, 1)))?;
            s.launch_builder(&self.kernels.sample_merge)
                .arg(&top)
                .arg(&nan)
                .arg(&chunks_i)
                .arg(&scores)
                .arg(&vocab_i)
                .arg(&temperatures)
                .arg(&mut out)
                .launch(block((n as u32, 1, 1)))?;
        }
        let host = s.clone_dtoh(&out)?;
        let picked = host
            .chunks(TOP_TOKENS + 2)
            .zip(rows)
            .map(|(row, request)| {
                if row[TOP_TOKENS + 1] != 0 {
                    return Err(EngineError::Numeric("the model produced NaN logits".into()));
                }
                Ok(TopTokens {
                    top: row[..TOP_TOKENS.min(vocab)]
                        .iter()
                        .map(|&k| top_entry(k))
                        .collect(),
                    total: request.total_at.map(|_| f64::from_bits(row[TOP_TOKENS])),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok((picked, scores))
    }

    /// Runs the columns as [`Decoder::forward`] does and hands the logits on the device to
    /// `finish`.
    fn compute<R>(
        &self,
        state: &mut State<T>,
        columns: &Columns<'_>,
        new: usize,
        of: LogitsOf,
        finish: impl FnOnce(&CudaSlice<T>) -> Result<R, EngineError>,
    ) -> Result<R, EngineError> {
        let host = self.check_columns(state, columns, new)?;
        let batch = state.cache.batch;
        let d = &self.dims;
        // The replacements in the storage type, and where they go.
        let replaced = match &columns.replaced {
            Some(r) => {
                let runs = r.runs(batch * new, d.hidden)?;
                let same = (r.values.dtype() == T::DTYPE)
                    .then(|| bytemuck::try_cast_slice::<u8, T>(&r.values.bytes()[..]).ok())
                    .flatten();
                let values = match same {
                    Some(v) => std::borrow::Cow::Borrowed(v),
                    None => std::borrow::Cow::Owned(T::from_f32_slice(&r.values.to_f32_vec())),
                };
                Some((runs, values))
            }
            None => None,
        };
        self.stream.context().bind_to_thread()?;
        if new == 1 && of == LogitsOf::Last && state.graphs && replaced.is_none() {
            match self.graph_step(state, &host) {
                Ok(()) => match &state.step {
                    Some(step) => return finish(&step.buffers.logits),
                    None => unreachable!("graph_step keeps the step"),
                },
                Err(e) => {
                    tracing::warn!(
                        "cuBLAS decoder: the decoding step could not run as a CUDA graph ({e}); \
                         it runs as separate launches from now on"
                    );
                    state.graphs = false;
                    state.step = None;
                }
            }
        }
        let out_rows = match of {
            LogitsOf::Last => batch,
            LogitsOf::Every => batch * new,
            // No logits: the states end in the normalised activations.
            LogitsOf::States => 0,
        };
        let frames = state.memory.as_ref().map(|m| m.frames);
        let cap = state.cache.capacity;
        let mut buffers = self.buffers((batch, new, cap), out_rows, frames)?;
        self.stream.memcpy_htod(&host, &mut buffers.input)?;
        let memory = state.memory.as_ref();
        self.run(
            &mut state.cache,
            memory,
            &mut buffers,
            Call {
                new,
                past: Some(state.past),
                replaced: replaced.as_ref(),
            },
            of,
            self.profile,
        )?;
        state.past += new;
        finish(match of {
            LogitsOf::States => &buffers.hb,
            _ => &buffers.logits,
        })
    }

    /// One token per row through the session's graph (captured now if it is the first step);
    /// the logits end in the step's buffers.
    fn graph_step(&self, state: &mut State<T>, host: &[i32]) -> Result<(), EngineError> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        let batch = state.cache.batch;
        if state.step.is_none() {
            state.step = Some(StepGraph {
                buffers: self.buffers(
                    (batch, 1, state.cache.capacity),
                    batch,
                    state.memory.as_ref().map(|m| m.frames),
                )?,
                graph: None,
            });
        }
        let Some(step) = state.step.as_mut() else {
            unreachable!("created above")
        };
        self.stream.memcpy_htod(host, &mut step.buffers.input)?;
        if step.graph.is_none() {
            self.stream
                .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
            let ran = self.run(
                &mut state.cache,
                state.memory.as_ref(),
                &mut step.buffers,
                Call {
                    new: 1,
                    past: None,
                    replaced: None,
                },
                LogitsOf::Last,
                false,
            );
            let graph = self.stream.end_capture(CUgraphInstantiate_flags(0));
            ran?;
            step.graph = Some(SendGraph(graph?.ok_or_else(|| {
                EngineError::Spec("stream capture returned no graph".into())
            })?));
        }
        if let Some(SendGraph(graph)) = &step.graph {
            graph.launch()?;
        }
        state.past += 1;
        Ok(())
    }

    /// Checks a call's columns against the model and the cache; the upload `[past, ids,
    /// positions, mask]`.
    fn check_columns(
        &self,
        state: &State<T>,
        columns: &Columns<'_>,
        new: usize,
    ) -> Result<Vec<i32>, EngineError> {
        let d = &self.dims;
        let (batch, cap, past) = (state.cache.batch, state.cache.capacity, state.past);
        let rows = batch * new;
        if new == 0 {
            return Err(EngineError::Input(
                "a call needs at least one new column".into(),
            ));
        }
        for (name, v) in [
            ("ids", columns.ids),
            ("positions", columns.positions),
            ("mask", columns.mask),
        ] {
            if v.len() != rows {
                return Err(EngineError::Input(format!(
                    "{} {name} for {batch} rows × {new} new columns",
                    v.len()
                )));
            }
        }
        if past + new > cap {
            return Err(EngineError::Input(format!(
                "{past} cached + {new} new columns exceed the cache's {cap}"
            )));
        }
        if let Some(bad) = columns
            .ids
            .iter()
            .find(|&&t| t < 0 || t as usize >= d.vocab)
        {
            return Err(EngineError::Input(format!(
                "token {bad} is outside the vocabulary of {}",
                d.vocab
            )));
        }
        if let Some(bad) = columns.positions.iter().find(|&&p| p < 0) {
            return Err(EngineError::Input(format!("negative position {bad}")));
        }
        if d.learned_positions {
            if let Some(bad) = columns
                .positions
                .iter()
                .find(|&&p| p as usize >= d.max_positions)
            {
                return Err(EngineError::Input(format!(
                    "position {bad} is past the model's {} learned positions",
                    d.max_positions
                )));
            }
        }
        if let Some(limit) = d.valid_positions {
            if columns.positions.iter().any(|&p| p as usize >= limit) {
                return Err(EngineError::Input(format!(
                    "dynamic RoPE scaling changes the frequencies past {limit} positions, \
                     which this engine does not implement"
                )));
            }
        }
        let mut host = Vec::with_capacity(1 + 3 * rows);
        host.push(past as i32);
        host.extend_from_slice(columns.ids);
        host.extend_from_slice(columns.positions);
        host.extend_from_slice(columns.mask);
        Ok(host)
    }

    /// The buffers of a call of `new` columns per row over a cache of `cap` columns, with
    /// `out_rows` rows of logits (and a cross-attention over `frames` encoder states).
    fn buffers(
        &self,
        (batch, new, cap): (usize, usize, usize),
        out_rows: usize,
        frames: Option<usize>,
    ) -> Result<Buffers<T>, EngineError> {
        let d = &self.dims;
        let rows = batch * new;
        let s = &self.stream;
        let alloc = |n: usize, what: &str| -> Result<CudaSlice<T>, EngineError> {
            // SAFETY: every buffer is written in full before it is read (`run`).
            unsafe {
                device_buffer(s, n, || {
                    format!("{what} of {batch} rows × {new} columns ({n} values)")
                })
            }
        };
        let (h, q_width) = (d.hidden, d.heads * d.head_dim);
        let qkv_width = (d.heads + 2 * d.kv_heads) * d.head_dim;
        Ok(Buffers {
            // SAFETY: written by the upload before any kernel reads it.
            input: unsafe { device_buffer(s, 1 + 3 * rows, || "the inputs".to_string()) }?,
            x: alloc(rows * h, "the residual stream")?,
            hb: alloc(rows * h, "the normalised activations")?,
            qkv: alloc(rows * qkv_width, "the q / k / v projections")?,
            q: alloc(rows * q_width, "the queries")?,
            ctx: alloc(rows * q_width, "the attention output")?,
            y: alloc(rows * h, "a projection's output")?,
            gu: alloc(rows * 2 * d.intermediate, "the gate / up projections")?,
            act: alloc(rows * d.intermediate, "the MLP activations")?,
            logits: alloc((out_rows * d.vocab).max(1), "the logits")?,
            scratch: if self.scratch_values > 0 && !self.all_gemv(rows, out_rows) {
                Some(alloc(self.scratch_values, "dequantized weights")?)
            } else {
                None
            },
            parts: {
                // The most splits of the cross-attention or of the self-attention.
                let threads = attention_threads(d.head_dim) as usize;
                let cross = frames.map_or(1, |keys| cross_splits(rows, d.heads, keys, threads).0);
                let splits = cross.max(self.self_splits(rows, cap).0);
                match splits {
                    1 => None,
                    splits => {
                        let n = rows * d.heads * splits * (d.head_dim + 2);
                        // SAFETY: every split's values are written before the join reads them.
                        Some(unsafe {
                            device_buffer(s, n, || {
                                format!("the attention's {splits} splits ({n} values)")
                            })
                        }?)
                    }
                }
            },
        })
    }

    /// How a call of `rows` query rows splits the self-attention's keys over a cache of `cap`
    /// columns: `(splits, keys per split)` as [`cross_splits`] (by the capacity, so a captured
    /// step's grid holds as the cache fills; splits past a query's column are empty). One split
    /// for T5's relative attention.
    fn self_splits(&self, rows: usize, cap: usize) -> (usize, usize) {
        if self.relative.is_some() {
            return (1, cap);
        }
        let threads = attention_threads(self.dims.head_dim) as usize;
        cross_splits(rows, self.dims.heads, cap, threads)
    }

    /// Whether every product of a call of `rows` rows (`out_rows` of logits) runs on the GEMV
    /// kernels, each RMSNorm and residual add fused into them.
    fn all_gemv(&self, rows: usize, out_rows: usize) -> bool {
        let d = &self.dims;
        let q_width = d.heads * d.head_dim;
        let vec = crate::engine::vec_width::<T>();
        self.gemv_fits(d.hidden, d.hidden, rows)
            && self.gemv_fits(q_width, q_width, rows)
            && self.gemv_fits(d.intermediate, d.intermediate, rows)
            && self.gemv_fits(d.hidden, d.hidden, out_rows)
            && (rows == out_rows || (rows / out_rows * d.hidden).is_multiple_of(vec))
    }

    /// Every launch of one call (no allocation, no host synchronisation, so it can be captured):
    /// the inputs are already in `b.input`, the logits end in `b.logits`.
    fn run(
        &self,
        cache: &mut Cache<T>,
        memory: Option<&Memory<T>>,
        b: &mut Buffers<T>,
        call: Call<'_, '_, T>,
        of: LogitsOf,
        profile: bool,
    ) -> Result<(), EngineError> {
        let Call {
            new,
            past,
            replaced,
        } = call;
        let d = self.dims;
        let s = &self.stream;
        let mut prof = crate::engine::Profile::new(profile.then_some(s))?;
        let (batch, cap) = (cache.batch, cache.capacity);
        let rows = batch * new;
        let past_v = b.input.slice(0..1);
        let ids_v = b.input.slice(1..1 + rows);
        let pos_v = b.input.slice(1 + rows..1 + 2 * rows);
        let mask_v = b.input.slice(1 + 2 * rows..1 + 3 * rows);
        let (h, dh) = (d.hidden, d.head_dim);
        let q_width = d.heads * dh;
        let (n_i, cap_i, h_i) = (new as i32, cap as i32, h as i32);
        let (heads_i, kv_i, dh_i) = (d.heads as i32, d.kv_heads as i32, dh as i32);
        let (inter_i, gated_i) = (d.intermediate as i32, i32::from(d.gated));
        // SAFETY (launches): each argument list matches its kernel's signature in decoder.cu and
        // every buffer holds the rows × widths the grid covers.
        unsafe {
            s.launch_builder(&self.kernels.append_mask)
                .arg(&mask_v)
                .arg(&past_v)
                .arg(&n_i)
                .arg(&cap_i)
                .arg(&mut cache.mask)
                .launch(LaunchConfig {
                    grid_dim: (batch as u32, 1, 1),
                    block_dim: (new.clamp(32, 256) as u32, 1, 1),
                    shared_mem_bytes: 0,
                })?;
        }
        let norm_cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: ((h + 32) * 4) as u32,
        };
        let att_threads = attention_threads(dh);
        let vec = crate::engine::vec_width::<T>();
        let att_cfg = LaunchConfig {
            grid_dim: (new as u32, d.heads as u32, batch as u32),
            block_dim: (att_threads, 1, 1),
            shared_mem_bytes: ((dh + att_threads as usize * (1 + vec) + 32) * 4) as u32,
        };
        let scale = d.score_scale;
        // residual_norm(y or null, bias or null, x, gamma, beta or null, eps, hidden, out).
        let residual_norm = |y: Option<&CudaSlice<T>>,
                             bias: Option<&CudaSlice<T>>,
                             x: &mut CudaSlice<T>,
                             norm: &Norm<T>,
                             out: &mut CudaSlice<T>|
         -> Result<(), EngineError> {
            let mut args = s.launch_builder(&self.kernels.residual_norm);
            arg_or_null(&mut args, y);
            arg_or_null(&mut args, bias);
            args.arg(x).arg(&norm.gamma);
            arg_or_null(&mut args, norm.beta.as_ref());
            args.arg(&d.eps).arg(&h_i).arg(out);
            // SAFETY: as above; rows × hidden in every buffer.
            unsafe { args.launch(norm_cfg) }?;
            Ok(())
        };
        // combine(parts, splits, ctx): the join of an attention's splits into its output.
        let combine = |parts: &CudaSlice<f32>,
                       splits: usize,
                       ctx: &mut CudaSlice<T>|
         -> Result<(), EngineError> {
            let splits_i = splits as i32;
            // SAFETY: `cross_combine(parts, heads, head_dim, splits, out)` over the parts written
            // by the attention before it, `rows × heads × head_dim` outputs.
            unsafe {
                s.launch_builder(&self.kernels.cross_combine)
                    .arg(parts)
                    .arg(&heads_i)
                    .arg(&dh_i)
                    .arg(&splits_i)
                    .arg(ctx)
                    .launch(LaunchConfig {
                        grid_dim: (rows as u32, d.heads as u32, 1),
                        block_dim: (att_threads, 1, 1),
                        shared_mem_bytes: 0,
                    })?;
            }
            Ok(())
        };
        // cross_attention(q, keys, values of `frames` states, parts or none, ctx): the attention,
        // its keys split across blocks (and the splits joined) when `parts` is given and the
        // keys are worth splitting.
        let cross_attention = |q: &CudaSlice<T>,
                               keys: &CudaSlice<T>,
                               values: &CudaSlice<T>,
                               (frames, mask): (usize, Option<&CudaSlice<i32>>),
                               parts: Option<&mut CudaSlice<f32>>,
                               ctx: &mut CudaSlice<T>|
         -> Result<(), EngineError> {
            let k = &self.kernels;
            let kernel = if dh.is_multiple_of(vec) {
                &k.cross_attention
            } else {
                &k.cross_attention_scalar
            };
            let (splits, per) = match parts {
                Some(_) => cross_splits(rows, d.heads, frames, att_threads as usize),
                None => (1, frames),
            };
            let parts = parts.filter(|_| splits > 1);
            let (keys_i, per_i) = (frames as i32, per as i32);
            let mut args = s.launch_builder(kernel);
            args.arg(q).arg(keys).arg(values);
            arg_or_null(&mut args, mask);
            args.arg(&heads_i)
                .arg(&dh_i)
                .arg(&n_i)
                .arg(&keys_i)
                .arg(&per_i)
                .arg(&scale);
            let parts = parts.map(|p| &*p);
            arg_or_null(&mut args, parts);
            args.arg(&mut *ctx);
            let cfg = LaunchConfig {
                grid_dim: ((new * splits) as u32, d.heads as u32, batch as u32),
                ..att_cfg
            };
            // SAFETY: `cross_attention(q, k, v, mask, heads, head_dim, n_new, keys, split_keys,
            // scale, parts, out)`: the keys and values hold `batch × heads × frames × head_dim`
            // values, the mask (when given) `batch × frames`, `parts` (when given) `rows × heads ×
            // splits × (head_dim + 2)` floats.
            unsafe { args.launch(cfg) }?;
            if let Some(parts) = parts {
                combine(parts, splits, ctx)?;
            }
            Ok(())
        };
        // A decoding step's few rows: every norm runs inside the GEMV that reads it and every
        // residual add inside the GEMV that produces it (6 launches a layer instead of 9).
        let (out_rows, first, stride) = match of {
            LogitsOf::Last => (batch, (new - 1) * h, new * h),
            LogitsOf::Every | LogitsOf::States => (rows, 0, h),
        };
        // States come out of the last norm kernel, which the GEMVs would fuse away.
        let fused = of != LogitsOf::States && self.all_gemv(rows, out_rows);
        let ptr = |buf: &mut CudaSlice<T>| buf.device_ptr_mut(s).0;
        let (x_ptr, hb_ptr, ctx_ptr) = (ptr(&mut b.x), ptr(&mut b.hb), ptr(&mut b.ctx));
        let (qkv_ptr, gu_ptr, act_ptr) = (ptr(&mut b.qkv), ptr(&mut b.gu), ptr(&mut b.act));
        let (y_ptr, q_ptr, logits_ptr) = (ptr(&mut b.y), ptr(&mut b.q), ptr(&mut b.logits));
        let (pos_ptr, past_ptr) = (pos_v.device_ptr(s).0, past_v.device_ptr(s).0);
        let inter = d.intermediate;
        match &self.embed.parts[..] {
            [part @ Part {
                storage: Storage::Blocks { .. },
                ..
            }] => {
                let ids = ids_v.device_ptr(s).0;
                self.dequant(part, h, (ids, 0), rows, x_ptr)?;
            }
            [Part {
                storage: Storage::Dense(table),
                ..
            }] => unsafe {
                s.launch_builder(&self.kernels.gather_rows)
                    .arg(&ids_v)
                    .arg(table)
                    .arg(&h_i)
                    .arg(&mut b.x)
                    .launch(rows_by_columns(rows, h))?;
            },
            _ => return Err(EngineError::Spec("the embedding is one table".into())),
        }
        // Replaced columns: their values over the token embeddings, one copy a run (on the
        // stream, so after the gather).
        if let Some((runs, values)) = replaced {
            for &(column, from, len) in runs {
                let mut dst = b.x.slice_mut(column * h..(column + len) * h);
                s.memcpy_htod(&values[from * h..(from + len) * h], &mut dst)?;
            }
        }
        if let Some(table) = &self.position_table {
            unsafe {
                s.launch_builder(&self.kernels.add_positions)
                    .arg(&pos_v)
                    .arg(table)
                    .arg(&h_i)
                    .arg(&mut b.x)
                    .launch(rows_by_columns(rows, h))?;
            }
        }
        prof.mark("embed")?;
        if !fused {
            residual_norm(None, None, &mut b.x, &self.layers[0].input_norm, &mut b.hb)?;
            prof.mark("norm")?;
        }
        for (l, layer) in self.layers.iter().enumerate() {
            let w = &layer.qkv;
            if fused {
                let norm = Epilogue::norm(&layer.input_norm, None);
                self.gemv(w, (x_ptr, h), rows, norm, qkv_ptr)?;
            } else {
                self.linear(w, (hb_ptr, h), rows, qkv_ptr, b.scratch.as_mut())?;
            }
            prof.mark("qkv")?;
            let (keys, values) = (&mut cache.keys[l], &mut cache.values[l]);
            let shape = SplitShape {
                heads: d.heads,
                kv_heads: d.kv_heads,
                rows,
                n_new: new,
                cap,
            };
            let into = (q_ptr, keys.device_ptr_mut(s).0, values.device_ptr_mut(s).0);
            self.split(w, qkv_ptr, shape, (pos_ptr, past_ptr), into)?;
            prof.mark("rope")?;
            // The self-attention: with a relative position bias (T5), else causal over the cache
            // (RoPE already applied). Both read q, the cache, its mask and the past first.
            let k = &self.kernels;
            // A prefill's causal attention on tensor cores, where it applies.
            let flash_past = past.filter(|&past| {
                self.flash_prefill
                    && self.relative.is_none()
                    && d.causal
                    && new >= FLASH_MIN_COLUMNS
                    && (layer.window <= 0 || past + new <= layer.window as usize)
            });
            if let Some(past) = flash_past {
                let kernel = match dh {
                    32 => &k.cached_flash_attention.0,
                    _ => &k.cached_flash_attention.1,
                };
                let scale_log2 = scale * std::f32::consts::LOG2_E;
                let cfg = LaunchConfig {
                    grid_dim: (
                        new.div_ceil(crate::engine::FLASH_ROWS) as u32,
                        (batch * d.heads) as u32,
                        1,
                    ),
                    block_dim: (2 * crate::engine::FLASH_ROWS as u32, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: `cached_flash_attention_<d>(q, k, v, mask, past, n_new, heads,
                // kv_heads, cap, scale_log2, out)` (decoder.cu) over (query tiles, batch · heads)
                // blocks; the caches hold `batch × kv_heads × cap × head_dim` values whose first
                // `past + new` columns are written, q and out `batch · new` rows of `heads ×
                // head_dim`, the mask `batch × cap`.
                unsafe {
                    s.launch_builder(kernel)
                        .arg(&b.q)
                        .arg(&*keys)
                        .arg(&*values)
                        .arg(&cache.mask)
                        .arg(&(past as i32))
                        .arg(&n_i)
                        .arg(&heads_i)
                        .arg(&kv_i)
                        .arg(&cap_i)
                        .arg(&scale_log2)
                        .arg(&mut b.ctx)
                        .launch(cfg)?;
                }
            } else {
                let kernel = match (&self.relative, dh.is_multiple_of(vec)) {
                    (Some(_), true) => &k.relative_attention,
                    (Some(_), false) => &k.relative_attention_scalar,
                    (None, true) => &k.cached_attention,
                    (None, false) => &k.cached_attention_scalar,
                };
                // The causal kernel's keys in splits when a call's few queries would leave the
                // GPU idle (flash-decoding), joined below.
                let (splits, per) = match &b.parts {
                    Some(_) => self.self_splits(rows, cap),
                    None => (1, cap),
                };
                let per_i = per as i32;
                let mut args = s.launch_builder(kernel);
                args.arg(&b.q)
                    .arg(&*keys)
                    .arg(&*values)
                    .arg(&cache.mask)
                    .arg(&past_v)
                    .arg(&heads_i);
                let causal_i = i32::from(d.causal);
                match &self.relative {
                    Some(rel) => {
                        args.arg(&dh_i)
                            .arg(&n_i)
                            .arg(&cap_i)
                            .arg(&causal_i)
                            .arg(&rel.buckets)
                            .arg(&rel.table)
                            .arg(&rel.offset)
                            .arg(&scale);
                    }
                    None => {
                        args.arg(&kv_i)
                            .arg(&dh_i)
                            .arg(&n_i)
                            .arg(&cap_i)
                            .arg(&layer.window)
                            .arg(&scale)
                            .arg(&per_i);
                        arg_or_null(&mut args, b.parts.as_ref().filter(|_| splits > 1))
                    }
                };
                args.arg(&mut b.ctx);
                let att_cfg = LaunchConfig {
                    grid_dim: ((new * splits) as u32, d.heads as u32, batch as u32),
                    ..att_cfg
                };
                // SAFETY: cached_attention(q, k, v, mask, past, heads, kv_heads, head_dim,
                // n_new, cap, window, scale, split_keys, parts, out) or relative_attention(q, k,
                // v, mask, past, heads, head_dim, n_new, cap, causal, rel_bucket, rel_table,
                // rel_offset, scale, out); the relative form reads one key / value head per query
                // head (checked at load) and the buckets of distances -offset..=offset (a cache
                // holds at most max_positions columns); `parts` (when given) holds `rows × heads ×
                // splits × (head_dim + 2)` floats.
                unsafe { args.launch(att_cfg) }?;
                if let (true, Some(parts)) = (splits > 1, b.parts.as_ref()) {
                    combine(parts, splits, &mut b.ctx)?;
                }
            }
            prof.mark("attention")?;
            let o = &layer.output;
            // The norm after the self-attention: the cross-attention's, else the MLP's.
            let next_norm = layer.cross.as_ref().map_or(&layer.post_norm, |c| &c.norm);
            if fused {
                let add = Epilogue::add_into(o.bias.as_ref());
                self.gemv(o, (ctx_ptr, q_width), rows, add, x_ptr)?;
            } else {
                self.linear(o, (ctx_ptr, q_width), rows, y_ptr, b.scratch.as_mut())?;
                let (y, bias) = (Some(&b.y), o.bias.as_ref());
                residual_norm(y, bias, &mut b.x, next_norm, &mut b.hb)?;
            }
            prof.mark("o")?;
            if let Some(cross) = &layer.cross {
                let m = memory.ok_or_else(|| {
                    EngineError::Spec("a cross-attention without encoder states".into())
                })?;
                let qw = &cross.query;
                if fused {
                    let norm = Epilogue::norm(&cross.norm, qw.bias.as_ref());
                    self.gemv(qw, (x_ptr, h), rows, norm, q_ptr)?;
                } else {
                    self.linear(qw, (hb_ptr, h), rows, qkv_ptr, b.scratch.as_mut())?;
                    // The split with no key / value heads adds the queries' bias.
                    let shape = SplitShape {
                        heads: d.heads,
                        kv_heads: 0,
                        rows,
                        n_new: new,
                        cap,
                    };
                    self.split(qw, qkv_ptr, shape, (0, past_ptr), (q_ptr, 0, 0))?;
                }
                let (keys, values) = (&m.keys[l], &m.values[l]);
                let parts = b.parts.as_mut();
                let memory = (m.frames, m.mask.as_ref());
                cross_attention(&b.q, keys, values, memory, parts, &mut b.ctx)?;
                let co = &cross.output;
                if fused {
                    let add = Epilogue::add_into(co.bias.as_ref());
                    self.gemv(co, (ctx_ptr, q_width), rows, add, x_ptr)?;
                } else {
                    self.linear(co, (ctx_ptr, q_width), rows, y_ptr, b.scratch.as_mut())?;
                    let (y, bias) = (Some(&b.y), co.bias.as_ref());
                    residual_norm(y, bias, &mut b.x, &layer.post_norm, &mut b.hb)?;
                }
                prof.mark("cross attention")?;
            }
            let gup = &layer.gate_up;
            // A gate / up weight of one format computes act(gate) * up in the GEMV's epilogue.
            let act_in_gemv = fused && (!d.gated || gup.parts.len() == 1);
            if act_in_gemv {
                let act = Epilogue::mlp_norm(&layer.post_norm, gup.bias.as_ref(), d.act, d.gated);
                self.gemv(gup, (x_ptr, h), rows, act, act_ptr)?;
            } else if fused {
                let norm = Epilogue::norm(&layer.post_norm, None);
                self.gemv(gup, (x_ptr, h), rows, norm, gu_ptr)?;
            } else {
                self.linear(gup, (hb_ptr, h), rows, gu_ptr, b.scratch.as_mut())?;
            }
            prof.mark("gate_up")?;
            if !act_in_gemv {
                unsafe {
                    let mut args = s.launch_builder(&self.kernels.mlp_act);
                    args.arg(&b.gu);
                    arg_or_null(&mut args, gup.bias.as_ref());
                    args.arg(&inter_i)
                        .arg(&d.act)
                        .arg(&gated_i)
                        .arg(&mut b.act)
                        .launch(rows_by_columns(rows, inter))?;
                }
                prof.mark("act")?;
            }
            let dn = &layer.down;
            if fused {
                let add = Epilogue::add_into(dn.bias.as_ref());
                self.gemv(dn, (act_ptr, inter), rows, add, x_ptr)?;
                prof.mark("down")?;
            } else {
                self.linear(dn, (act_ptr, inter), rows, y_ptr, b.scratch.as_mut())?;
                prof.mark("down")?;
                let next = self
                    .layers
                    .get(l + 1)
                    .map_or(&self.final_norm, |n| &n.input_norm);
                residual_norm(Some(&b.y), dn.bias.as_ref(), &mut b.x, next, &mut b.hb)?;
                prof.mark("norm")?;
            }
        }
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let size = std::mem::size_of::<T>() as u64;
        if of == LogitsOf::States {
            // The last layer's norm wrote the final norm's output into `hb`.
        } else if fused {
            let norm = Epilogue::norm(&self.final_norm, None);
            let last = x_ptr + first as u64 * size;
            self.gemv(head, (last, stride), out_rows, norm, logits_ptr)?;
        } else {
            let last = hb_ptr + first as u64 * size;
            self.linear(
                head,
                (last, stride),
                out_rows,
                logits_ptr,
                b.scratch.as_mut(),
            )?;
        }
        prof.mark("lm_head")?;
        if profile {
            s.synchronize()?;
            prof.report("decoder", batch, new)?;
        }
        Ok(())
    }

    /// `x` to the host as f32, through the page-locked staging buffer.
    fn download(&self, x: &CudaSlice<T>) -> Result<Vec<f32>, EngineError> {
        read_back(&self.stream, &self.staging, x, T::to_f32_vec)
    }
}

/// The engine's limits on top of [`DecoderSpec::validate`].
pub fn check_decoder_spec(spec: &DecoderSpec) -> Result<(), EngineError> {
    spec.validate()
        .map_err(|e| EngineError::Spec(e.to_string()))?;
    if spec.head_dim > MAX_HEAD_DIM {
        return Err(EngineError::Spec(format!(
            "heads of {} features (the attention kernel takes up to {MAX_HEAD_DIM})",
            spec.head_dim
        )));
    }
    if spec.relative().is_some() && spec.kv_heads != spec.heads {
        return Err(EngineError::Spec(format!(
            "a relative position bias with {} key / value heads for {} query heads (the kernel \
             reads one per query head)",
            spec.kv_heads, spec.heads
        )));
    }
    if spec.rotary().is_none() && !spec.head_dim.is_multiple_of(2) {
        return Err(EngineError::Spec(format!(
            "heads of {} features (the split kernel takes pairs of features)",
            spec.head_dim
        )));
    }
    if (spec.hidden + 32) * 4 > 48 * 1024 {
        return Err(EngineError::Spec(format!(
            "hidden size {} exceeds the norm kernel's shared memory",
            spec.hidden
        )));
    }
    Ok(())
}

/// A decoder of either storage type, as the runner holds it.
trait AnyDecoder: Send + Sync {
    fn peak_memory(&self) -> Option<u64>;
    fn weight_bytes(&self) -> usize;
    fn new_state(
        &self,
        batch: usize,
        capacity: usize,
        memory: Option<EncoderStates<'_>>,
    ) -> Result<Box<dyn Any + Send>, EngineError>;
    fn forward(
        &self,
        state: &mut (dyn Any + Send),
        columns: &Columns<'_>,
        new: usize,
        of: LogitsOf,
    ) -> Result<Vec<f32>, EngineError>;
    fn forward_argmax(
        &self,
        state: &mut (dyn Any + Send),
        columns: &Columns<'_>,
        new: usize,
    ) -> Result<Vec<u32>, EngineError>;
    fn forward_top(
        &self,
        state: &mut (dyn Any + Send),
        columns: &Columns<'_>,
        new: usize,
        rows: &[TopRequest<'_>],
    ) -> Result<Vec<TopTokens>, EngineError>;
    fn scores(&self, state: &mut (dyn Any + Send), row: usize) -> Result<Vec<f32>, EngineError>;
}

impl<T: Elem> AnyDecoder for Decoder<T>
where
    CudaBlas: Gemm<T>,
{
    fn peak_memory(&self) -> Option<u64> {
        crate::engine::pool_bytes(&self.stream, crate::engine::PoolBytes::Peak)
    }

    fn weight_bytes(&self) -> usize {
        self.weight_bytes
    }

    fn new_state(
        &self,
        batch: usize,
        capacity: usize,
        memory: Option<EncoderStates<'_>>,
    ) -> Result<Box<dyn Any + Send>, EngineError> {
        Ok(Box::new(Decoder::new_state(self, batch, capacity, memory)?))
    }

    fn forward(
        &self,
        state: &mut (dyn Any + Send),
        columns: &Columns<'_>,
        new: usize,
        of: LogitsOf,
    ) -> Result<Vec<f32>, EngineError> {
        Decoder::forward(self, own_state(state)?, columns, new, of)
    }

    fn forward_argmax(
        &self,
        state: &mut (dyn Any + Send),
        columns: &Columns<'_>,
        new: usize,
    ) -> Result<Vec<u32>, EngineError> {
        Decoder::forward_argmax(self, own_state(state)?, columns, new)
    }

    fn forward_top(
        &self,
        state: &mut (dyn Any + Send),
        columns: &Columns<'_>,
        new: usize,
        rows: &[TopRequest<'_>],
    ) -> Result<Vec<TopTokens>, EngineError> {
        Decoder::forward_top(self, own_state(state)?, columns, new, rows)
    }

    fn scores(&self, state: &mut (dyn Any + Send), row: usize) -> Result<Vec<f32>, EngineError> {
        Decoder::scores(self, own_state(state)?, row)
    }
}

/// A session's state as the decoder of storage type `T` keeps it.
fn own_state<T: Elem>(state: &mut (dyn Any + Send)) -> Result<&mut State<T>, EngineError> {
    state
        .downcast_mut::<State<T>>()
        .ok_or_else(|| EngineError::Spec("a cache of another precision".into()))
}

/// A [`DecoderSpec`] on CUDA device 0 in f32 or f16, whichever was asked: load it once, then
/// start a [`DecodeSession`] per generation.
pub struct DecoderEngine {
    inner: Box<dyn AnyDecoder>,
    precision: Precision,
    vocab: usize,
    max_positions: usize,
    memory_width: Option<usize>,
}

impl DecoderEngine {
    /// Whether the decoder takes weights kept in ggml type `id`: it computes on the block formats
    /// ([`BLOCK_FORMATS`]) as they are, and converts F16 / BF16 to its precision at upload; other
    /// weights come as f32 values.
    pub fn reads_ggml_type(id: u32) -> bool {
        BlockFormat::of(id).is_some() || half_dtype(id).is_some()
    }

    /// Probes libcuda / NVRTC / cuBLAS, checks `spec`, compiles the kernels and uploads the
    /// weights in `precision` (f32 or f16; layers that keep ggml blocks stay in them).
    pub fn load(spec: &DecoderSpec, precision: Precision) -> Result<Self, EngineError> {
        probe()?;
        let inner: Box<dyn AnyDecoder> = match precision {
            Precision::F32 => Box::new(Decoder::<f32>::load(spec, 0)?),
            Precision::F16 => Box::new(Decoder::<half::f16>::load(spec, 0)?),
            other => return Err(EngineError::Precision(other.name().into())),
        };
        Ok(DecoderEngine {
            inner,
            precision,
            vocab: spec.vocab,
            max_positions: spec.max_positions,
            memory_width: spec.memory_width(),
        })
    }

    /// The precision it computes in.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The vocabulary size (the width of each row of logits).
    pub fn vocab(&self) -> usize {
        self.vocab
    }

    /// The longest context.
    pub fn max_positions(&self) -> usize {
        self.max_positions
    }

    /// The most device memory the device's default pool has held at once: the weights, KV caches
    /// and a call's activations (and whatever else of the process allocates from that pool, such
    /// as an encoder engine); `None` when the driver cannot say.
    pub fn peak_memory(&self) -> Option<u64> {
        self.inner.peak_memory()
    }

    /// Bytes the weights take on the device (ggml blocks as stored, the rest in the precision).
    pub fn weight_bytes(&self) -> usize {
        self.inner.weight_bytes()
    }

    /// A session of `batch` rows whose KV cache holds `capacity` columns per row.
    pub fn session(&self, batch: usize, capacity: usize) -> Result<DecodeSession<'_>, EngineError> {
        Ok(DecodeSession {
            engine: self,
            state: self.inner.new_state(batch, capacity, None)?,
        })
    }

    /// A session of a decoder with cross-attention over `states`, the encoder's output: every
    /// layer's keys and values of the states are computed now, once.
    pub fn session_over(
        &self,
        batch: usize,
        capacity: usize,
        states: EncoderStates<'_>,
    ) -> Result<DecodeSession<'_>, EngineError> {
        Ok(DecodeSession {
            engine: self,
            state: self.inner.new_state(batch, capacity, Some(states))?,
        })
    }

    /// The width of the encoder states the decoder's cross-attention reads, if it has one.
    pub fn memory_width(&self) -> Option<usize> {
        self.memory_width
    }
}

/// One batch being decoded: its KV cache lives on the device until the session is dropped.
pub struct DecodeSession<'e> {
    engine: &'e DecoderEngine,
    state: Box<dyn Any + Send>,
}

impl DecodeSession<'_> {
    /// Runs `new` columns per row after those already cached; the logits `of` the last or every
    /// new column, f32, row-major.
    pub fn forward(
        &mut self,
        columns: &Columns<'_>,
        new: usize,
        of: LogitsOf,
    ) -> Result<Vec<f32>, EngineError> {
        self.engine
            .inner
            .forward(self.state.as_mut(), columns, new, of)
    }

    /// Runs `new` columns per row and returns each row's greedy next token, picked on the device
    /// (the argmax of its logits, the lowest index on ties); NaN logits are an error.
    pub fn forward_argmax(
        &mut self,
        columns: &Columns<'_>,
        new: usize,
    ) -> Result<Vec<u32>, EngineError> {
        self.engine
            .inner
            .forward_argmax(self.state.as_mut(), columns, new)
    }

    /// Runs `new` columns per row and returns each row's [`TOP_TOKENS`] most likely next tokens
    /// after its repetition penalty, chosen on the device (with the row's softmax total where
    /// `rows[r].total_at` asks), for the host to sample from; the penalised logits stay on the
    /// device for [`scores`](Self::scores). Vocabularies up to [`MAX_TOP_VOCAB`]; NaN logits are
    /// an error.
    pub fn forward_top(
        &mut self,
        columns: &Columns<'_>,
        new: usize,
        rows: &[TopRequest<'_>],
    ) -> Result<Vec<TopTokens>, EngineError> {
        self.engine
            .inner
            .forward_top(self.state.as_mut(), columns, new, rows)
    }

    /// Row `row` of the penalised logits of the last [`forward_top`](Self::forward_top) (for a
    /// choice its most likely tokens do not decide).
    pub fn scores(&mut self, row: usize) -> Result<Vec<f32>, EngineError> {
        self.engine.inner.scores(self.state.as_mut(), row)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_types_convert_exactly() {
        let values = [0.0f32, 1.5, -2.25, 65504.0, 1e-3];
        let f16: Vec<u8> = values
            .iter()
            .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
            .collect();
        let bf16: Vec<u8> = values
            .iter()
            .flat_map(|&v| half::bf16::from_f32(v).to_le_bytes())
            .collect();
        let want = |round: fn(f32) -> f32| values.iter().map(|&v| round(v)).collect::<Vec<_>>();
        // What the upload converts them with: the host tensor of the ggml type's dtype.
        let read = |id: u32, bytes: Vec<u8>| {
            let dtype = half_dtype(id).expect("a 16-bit float type");
            HostTensor::from_bytes("w", vec![values.len()], dtype, bytes.into())
                .unwrap()
                .to_f32_vec()
        };
        assert_eq!(read(1, f16), want(|v| half::f16::from_f32(v).to_f32()));
        assert_eq!(read(30, bf16), want(|v| half::bf16::from_f32(v).to_f32()));
        assert!(DecoderEngine::reads_ggml_type(1) && DecoderEngine::reads_ggml_type(30));
        assert!(DecoderEngine::reads_ggml_type(12) && !DecoderEngine::reads_ggml_type(10));
    }

    #[test]
    fn cross_attention_splits_cover_the_keys_once() {
        // Whisper-tiny's 1500 frames: one row of 6 heads splits into chunks of at most 128
        // keys; batch 8 into fewer; a prompt's many rows not at all.
        assert_eq!(cross_splits(1, 6, 1500, 128), (12, 125));
        assert_eq!(cross_splits(8, 6, 1500, 128), (6, 250));
        assert_eq!(cross_splits(400, 6, 1500, 128), (1, 1500));
        for (rows, heads, keys) in [(1, 1, 1), (1, 6, 7), (3, 4, 1000), (1, 20, 1501)] {
            let (splits, per) = cross_splits(rows, heads, keys, 128);
            assert!(
                splits * per >= keys && (splits - 1) * per < keys,
                "{rows} {heads} {keys}"
            );
        }
    }

    #[test]
    fn attention_blocks_cover_the_head() {
        for dh in [8, 64, 80, 128, 256, 1024] {
            let t = attention_threads(dh) as usize;
            assert!(t.is_multiple_of(32) && t >= dh && t <= 1024, "{dh}: {t}");
        }
    }
}
