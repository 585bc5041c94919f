//! A causal decoder LM ([`DecoderSpec`]: LLaMA, Qwen2) on one CUDA stream: cuBLAS for every
//! product (q / k / v fused into one GEMM, gate and up into another) and the kernels of
//! `decoder.cu` for the rest: embedding rows, RMSNorm fused with the residual add, RoPE fused with
//! the split into the query and the device-resident KV cache, causal attention over the cache
//! (online softmax, grouped-query heads read in place, sliding windows), and the gated MLP's
//! activation. A [`State`] holds one batch's cache; a call runs any number of new columns
//! (the prompt, then one token per step) and returns the logits of the last or of every column.

use std::any::Any;
use std::sync::{Arc, Mutex};

use cudarc::cublas::sys::cublasOperation_t::{CUBLAS_OP_N, CUBLAS_OP_T};
use cudarc::cublas::{CudaBlas, Gemm, GemmConfig};
use cudarc::driver::{
    CudaFunction, CudaGraph, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, LaunchArgs,
    LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use ipfs_accelerate_core::{DecoderSpec, DenseWeights, GatedActivation, Precision};

use crate::engine::{compile_module, device_buffer, open_stream, read_back, rows_by_columns, Elem};
use crate::{probe, EngineError};

/// `activate`'s code in kernels.cu for a gated activation.
fn act_code(a: GatedActivation) -> i32 {
    match a {
        GatedActivation::Gelu => 0,
        GatedActivation::GeluTanh => 1,
        GatedActivation::Silu => 5,
    }
}

/// Threads of an attention block: a multiple of 32, at least the head size.
fn attention_threads(head_dim: usize) -> u32 {
    (head_dim.div_ceil(32) * 32).max(128) as u32
}

/// The largest head the kernels take (one attention block of 1024 threads covers it).
const MAX_HEAD_DIM: usize = 1024;

struct Kernels {
    gather_rows: CudaFunction,
    append_mask: CudaFunction,
    residual_rms_norm: CudaFunction,
    gated_act: CudaFunction,
    rope_split: CudaFunction,
    cached_attention: CudaFunction,
    /// `cached_attention` reading single values (heads that are not a whole number of packs).
    cached_attention_scalar: CudaFunction,
    gemv_rows: CudaFunction,
}

/// Rows up to which a product runs on `gemv_rows` instead of cuBLAS (`GEMV_ROWS` in decoder.cu).
const GEMV_ROWS: usize = 8;
/// Warps per block of `gemv_rows` (one output feature each).
const GEMV_WARPS: u32 = 8;

/// What `gemv_rows` does around its product.
#[derive(Clone, Copy)]
struct Epilogue<'a, T> {
    /// RMSNorm the input rows with this scale first.
    gamma: Option<&'a CudaSlice<T>>,
    /// Add this bias to the product.
    bias: Option<&'a CudaSlice<T>>,
    /// Add the product into the output (the residual stream) instead of overwriting it.
    in_place: bool,
}

impl<T> Default for Epilogue<'_, T> {
    fn default() -> Self {
        Epilogue {
            gamma: None,
            bias: None,
            in_place: false,
        }
    }
}

impl<'a, T> Epilogue<'a, T> {
    /// The product of the input's RMSNorm (scale `gamma`).
    fn norm(gamma: &'a CudaSlice<T>) -> Self {
        Epilogue {
            gamma: Some(gamma),
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

/// Set to `0` / `off` to run every product of the decoder on cuBLAS (the decoding step's
/// few-row products otherwise run on the engine's own GEMV kernel).
pub const GEMV_ENV: &str = "IPFS_ACCELERATE_CUDA_GEMV";

/// Whether the switch variable `name` is set to off.
fn switched_off(name: &str) -> bool {
    matches!(
        std::env::var(name)
            .as_deref()
            .map(str::to_ascii_lowercase)
            .as_deref(),
        Ok("0" | "off" | "false")
    )
}

/// A dense layer on the device: `weight` `[out, in]`, its bias unless it is all zeros.
struct Weight<T> {
    weight: CudaSlice<T>,
    bias: Option<CudaSlice<T>>,
    out_features: usize,
}

struct Layer<T> {
    input_norm: CudaSlice<T>,
    /// q, k and v stacked: `[(heads + 2 * kv_heads) * head_dim, hidden]`, with the bias always
    /// present (zeros when the checkpoint has none: the RoPE kernel reads it).
    qkv: Weight<T>,
    output: Weight<T>,
    post_norm: CudaSlice<T>,
    /// gate and up stacked: `[2 * intermediate, hidden]`.
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
    max_positions: usize,
    valid_positions: Option<usize>,
}

/// A [`DecoderSpec`] resident on the GPU in `T`.
pub struct Decoder<T: Elem> {
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    kernels: Kernels,
    dims: Dims,
    embed: CudaSlice<T>,
    inv_freq: CudaSlice<f32>,
    layers: Vec<Layer<T>>,
    final_norm: CudaSlice<T>,
    /// The LM head; `None`: the token embedding (tied).
    lm_head: Option<Weight<T>>,
    /// Page-locked host memory the logits come back through.
    staging: Mutex<Option<PinnedHostSlice<T>>>,
    /// cuBLAS's workspace, set explicitly so GEMMs can be captured into graphs.
    _workspace: CudaSlice<u8>,
    /// Whether few-row products run on `gemv_rows` ([`GEMV_ENV`]).
    gemv: bool,
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

/// One batch's decoding state: the cache, the columns in it, and the captured step.
pub struct State<T> {
    cache: Cache<T>,
    /// Columns already in the cache.
    past: usize,
    step: Option<StepGraph<T>>,
    /// Whether steps replay a CUDA graph ([`GRAPHS_ENV`]; off after a capture fails).
    graphs: bool,
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
}

/// One call's new columns, row-major `[batch, new]` each.
pub struct Columns<'a> {
    /// Token ids (below the vocabulary size).
    pub ids: &'a [i32],
    /// RoPE positions (non-negative).
    pub positions: &'a [i32],
    /// 1 for a token, 0 for padding.
    pub mask: &'a [i32],
}

impl<T: Elem> Decoder<T>
where
    CudaBlas: Gemm<T>,
{
    /// Checks `spec`, compiles the kernels and uploads the weights to device `ordinal`.
    pub fn load(spec: &DecoderSpec, ordinal: usize) -> Result<Self, EngineError> {
        check_decoder_spec(spec)?;
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
        let module = compile_module::<T>(stream.context())?;
        let f = |name: &str| module.load_function(name);
        let kernels = Kernels {
            gather_rows: f("gather_rows")?,
            append_mask: f("append_mask")?,
            residual_rms_norm: f("residual_rms_norm")?,
            gated_act: f("gated_act")?,
            rope_split: f("rope_split")?,
            cached_attention: f("cached_attention")?,
            cached_attention_scalar: f("cached_attention_scalar")?,
            gemv_rows: f("gemv_rows")?,
        };
        let up = |v: &[f32]| -> Result<CudaSlice<T>, EngineError> {
            let mut d =
                unsafe { device_buffer(&stream, v.len(), || format!("{} weights", v.len())) }?;
            stream.memcpy_htod(&T::from_f32_slice(v), &mut d)?;
            Ok(d)
        };
        let stacked =
            |parts: &[&DenseWeights], keep_zero_bias: bool| -> Result<Weight<T>, EngineError> {
                let weight: Vec<f32> = parts
                    .iter()
                    .flat_map(|p| p.weight.iter().copied())
                    .collect();
                let bias: Vec<f32> = parts.iter().flat_map(|p| p.bias.iter().copied()).collect();
                Ok(Weight {
                    weight: up(&weight)?,
                    bias: if keep_zero_bias || bias.iter().any(|&b| b != 0.0) {
                        Some(up(&bias)?)
                    } else {
                        None
                    },
                    out_features: parts.iter().map(|p| p.out_features).sum(),
                })
            };
        let layers = spec
            .layers
            .iter()
            .map(|l| {
                Ok(Layer {
                    input_norm: up(&l.input_norm)?,
                    qkv: stacked(&[&l.query, &l.key, &l.value], true)?,
                    output: stacked(&[&l.output], false)?,
                    post_norm: up(&l.post_norm)?,
                    gate_up: stacked(&[&l.gate, &l.up], false)?,
                    down: stacked(&[&l.down], false)?,
                    window: l.window.map_or(0, |w| w.min(i32::MAX as usize) as i32),
                })
            })
            .collect::<Result<Vec<_>, EngineError>>()?;
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
                max_positions: spec.max_positions,
                valid_positions: spec.rotary.valid_positions,
            },
            embed: up(&spec.embed)?,
            inv_freq: stream.clone_htod(&spec.rotary.inv_freq)?,
            layers,
            final_norm: up(&spec.final_norm)?,
            lm_head: spec
                .lm_head
                .as_ref()
                .map(|h| stacked(&[h], false))
                .transpose()?,
            staging: Mutex::new(None),
            _workspace: workspace,
            gemv: !switched_off(GEMV_ENV),
            profile: std::env::var(crate::engine::PROFILE_ENV).is_ok_and(|v| v == "1"),
            blas,
            stream,
        };
        decoder.stream.synchronize()?;
        Ok(decoder)
    }

    /// An empty cache for `batch` rows of at most `capacity` columns each; a cache the device
    /// cannot hold is [`EngineError::OutOfMemory`] naming its size.
    pub fn new_state(&self, batch: usize, capacity: usize) -> Result<State<T>, EngineError> {
        let d = &self.dims;
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
        Ok(State {
            cache: Cache {
                batch,
                capacity,
                keys,
                values,
                mask: self.stream.alloc_zeros::<i32>(batch * capacity)?,
            },
            past: 0,
            step: None,
            graphs: !switched_off(GRAPHS_ENV),
        })
    }

    /// Whether a product of `rows` rows of `k` values (row stride `x_stride`) runs on the GEMV
    /// kernel: it is on, the rows are few, and the rows are 16-byte aligned.
    fn gemv_fits(&self, k: usize, x_stride: usize, rows: usize) -> bool {
        let vec = crate::engine::vec_width::<T>();
        self.gemv && rows <= GEMV_ROWS && k.is_multiple_of(vec) && x_stride.is_multiple_of(vec)
    }

    /// One `gemv_rows` launch: `y = [residual +] (x' · Wᵀ [+ bias])`, x' the RMSNorm of x with
    /// `gamma` when given (see decoder.cu). `x` is a device pointer and row stride; `y` (and the
    /// residual, which is `y` itself when `in_place`) a device pointer.
    #[allow(clippy::too_many_arguments)]
    fn gemv(
        &self,
        w: &CudaSlice<T>,
        out_features: usize,
        in_features: usize,
        (x, x_stride): (u64, usize),
        rows: usize,
        epilogue: Epilogue<'_, T>,
        y: u64,
    ) -> Result<(), EngineError> {
        let (stride_i, rows_i) = (x_stride as i32, rows as i32);
        let (out_i, k_i) = (out_features as i32, in_features as i32);
        let mut args = self.stream.launch_builder(&self.kernels.gemv_rows);
        args.arg(w)
            .arg(&x)
            .arg(&stride_i)
            .arg(&rows_i)
            .arg(&out_i)
            .arg(&k_i);
        arg_or_null(&mut args, epilogue.gamma);
        args.arg(&self.dims.eps);
        arg_or_null(&mut args, epilogue.bias);
        // The residual is the output itself when adding in place.
        args.arg(if epilogue.in_place { &y } else { &NULL });
        args.arg(&y);
        // SAFETY: `gemv_rows(w, x, x_stride, rows, out, k, gamma, eps, bias, residual, y)` reads
        // `rows` rows of `k` values of `x` (16-byte aligned: `gemv_fits`), `k` of gamma, `out`
        // of the bias, and reads / writes `rows × out` values of `y`.
        unsafe {
            args.launch(LaunchConfig {
                grid_dim: ((out_features as u32).div_ceil(GEMV_WARPS), 1, 1),
                block_dim: (32 * GEMV_WARPS, 1, 1),
                shared_mem_bytes: 0,
            })
        }?;
        Ok(())
    }

    /// `y[rows, out] = x[rows, in] · Wᵀ` (no bias), row `r` of `x` at `r * x_stride`: the
    /// engine's GEMV kernel for a decoding step's few rows, cuBLAS otherwise.
    #[allow(clippy::too_many_arguments)]
    fn linear<X: DevicePtr<T>, Y: DevicePtrMut<T>>(
        &self,
        w: &CudaSlice<T>,
        out_features: usize,
        in_features: usize,
        x: &X,
        x_stride: usize,
        rows: usize,
        y: &mut Y,
    ) -> Result<(), EngineError> {
        if self.gemv_fits(in_features, x_stride, rows) {
            let (x_ptr, _x_sync) = x.device_ptr(&self.stream);
            let (y_ptr, _y_sync) = y.device_ptr_mut(&self.stream);
            return self.gemv(
                w,
                out_features,
                in_features,
                (x_ptr, x_stride),
                rows,
                Epilogue::default(),
                y_ptr,
            );
        }
        let cfg = GemmConfig {
            transa: CUBLAS_OP_T,
            transb: CUBLAS_OP_N,
            m: out_features as i32,
            n: rows as i32,
            k: in_features as i32,
            alpha: T::from_f32(1.0),
            lda: in_features as i32,
            ldb: x_stride as i32,
            beta: T::from_f32(0.0),
            ldc: out_features as i32,
        };
        // SAFETY: the callers size `x` and `y` for `rows` rows of these widths.
        unsafe { self.blas.gemm(cfg, w, x, y) }?;
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
        let host = self.check_columns(state, columns, new)?;
        let batch = state.cache.batch;
        self.stream.context().bind_to_thread()?;
        if new == 1 && of == LogitsOf::Last && state.graphs {
            match self.graph_step(state, &host) {
                Ok(logits) => return Ok(logits),
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
        };
        let mut buffers = self.buffers(batch, new, out_rows)?;
        self.stream.memcpy_htod(&host, &mut buffers.input)?;
        self.run(&mut state.cache, &mut buffers, new, of, self.profile)?;
        state.past += new;
        self.download(&buffers.logits)
    }

    /// One token per row through the session's graph (captured now if it is the first step).
    fn graph_step(&self, state: &mut State<T>, host: &[i32]) -> Result<Vec<f32>, EngineError> {
        use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
        let batch = state.cache.batch;
        if state.step.is_none() {
            state.step = Some(StepGraph {
                buffers: self.buffers(batch, 1, batch)?,
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
                &mut step.buffers,
                1,
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
        self.download(&step.buffers.logits)
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

    /// The buffers of a call of `new` columns per row, with `out_rows` rows of logits.
    fn buffers(
        &self,
        batch: usize,
        new: usize,
        out_rows: usize,
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
            logits: alloc(out_rows * d.vocab, "the logits")?,
        })
    }

    /// Every launch of one call (no allocation, no host synchronisation, so it can be captured):
    /// the inputs are already in `b.input`, the logits end in `b.logits`.
    fn run(
        &self,
        cache: &mut Cache<T>,
        b: &mut Buffers<T>,
        new: usize,
        of: LogitsOf,
        profile: bool,
    ) -> Result<(), EngineError> {
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
        let inter_i = d.intermediate as i32;
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
            s.launch_builder(&self.kernels.gather_rows)
                .arg(&ids_v)
                .arg(&self.embed)
                .arg(&h_i)
                .arg(&mut b.x)
                .launch(rows_by_columns(rows, h))?;
        }
        prof.mark("embed")?;
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
        let rope_cfg = LaunchConfig {
            grid_dim: (rows as u32, (d.heads + 2 * d.kv_heads) as u32, 1),
            block_dim: ((dh / 2) as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        let scale = 1.0 / (dh as f32).sqrt();
        // residual_rms_norm(y or null, bias or null, x, gamma, eps, hidden, out).
        let rms = |y: Option<&CudaSlice<T>>,
                   bias: Option<&CudaSlice<T>>,
                   x: &mut CudaSlice<T>,
                   gamma: &CudaSlice<T>,
                   out: &mut CudaSlice<T>|
         -> Result<(), EngineError> {
            let mut args = s.launch_builder(&self.kernels.residual_rms_norm);
            arg_or_null(&mut args, y);
            arg_or_null(&mut args, bias);
            args.arg(x).arg(gamma).arg(&d.eps).arg(&h_i).arg(out);
            // SAFETY: as above; rows × hidden in every buffer.
            unsafe { args.launch(norm_cfg) }?;
            Ok(())
        };
        // A decoding step's few rows: every RMSNorm runs inside the GEMV that reads it and every
        // residual add inside the GEMV that produces it (6 launches a layer instead of 9).
        let (out_rows, first, stride) = match of {
            LogitsOf::Last => (batch, (new - 1) * h, new * h),
            LogitsOf::Every => (rows, 0, h),
        };
        let fused = self.gemv_fits(h, h, rows)
            && self.gemv_fits(q_width, q_width, rows)
            && self.gemv_fits(d.intermediate, d.intermediate, rows)
            && self.gemv_fits(h, stride, out_rows);
        let ptr = |buf: &mut CudaSlice<T>| buf.device_ptr_mut(s).0;
        let (x_ptr, ctx_ptr, act_ptr) = (ptr(&mut b.x), ptr(&mut b.ctx), ptr(&mut b.act));
        let (qkv_ptr, gu_ptr, logits_ptr) = (ptr(&mut b.qkv), ptr(&mut b.gu), ptr(&mut b.logits));
        if !fused {
            rms(None, None, &mut b.x, &self.layers[0].input_norm, &mut b.hb)?;
            prof.mark("norm")?;
        }
        for (l, layer) in self.layers.iter().enumerate() {
            let w = &layer.qkv;
            if fused {
                let norm = Epilogue::norm(&layer.input_norm);
                self.gemv(
                    &w.weight,
                    w.out_features,
                    h,
                    (x_ptr, h),
                    rows,
                    norm,
                    qkv_ptr,
                )?;
            } else {
                self.linear(&w.weight, w.out_features, h, &b.hb, h, rows, &mut b.qkv)?;
            }
            prof.mark("qkv")?;
            let qkv_bias = w
                .bias
                .as_ref()
                .ok_or_else(|| EngineError::Spec("the fused q / k / v bias is missing".into()))?;
            let (keys, values) = (&mut cache.keys[l], &mut cache.values[l]);
            unsafe {
                s.launch_builder(&self.kernels.rope_split)
                    .arg(&b.qkv)
                    .arg(qkv_bias)
                    .arg(&pos_v)
                    .arg(&self.inv_freq)
                    .arg(&past_v)
                    .arg(&heads_i)
                    .arg(&kv_i)
                    .arg(&dh_i)
                    .arg(&n_i)
                    .arg(&cap_i)
                    .arg(&mut b.q)
                    .arg(&mut *keys)
                    .arg(&mut *values)
                    .launch(rope_cfg)?;
            }
            prof.mark("rope")?;
            unsafe {
                let attention = if dh.is_multiple_of(vec) {
                    &self.kernels.cached_attention
                } else {
                    &self.kernels.cached_attention_scalar
                };
                s.launch_builder(attention)
                    .arg(&b.q)
                    .arg(&*keys)
                    .arg(&*values)
                    .arg(&cache.mask)
                    .arg(&past_v)
                    .arg(&heads_i)
                    .arg(&kv_i)
                    .arg(&dh_i)
                    .arg(&n_i)
                    .arg(&cap_i)
                    .arg(&layer.window)
                    .arg(&scale)
                    .arg(&mut b.ctx)
                    .launch(att_cfg)?;
            }
            prof.mark("attention")?;
            let o = &layer.output;
            let gup = &layer.gate_up;
            if fused {
                let add = Epilogue::add_into(o.bias.as_ref());
                self.gemv(&o.weight, h, q_width, (ctx_ptr, q_width), rows, add, x_ptr)?;
                prof.mark("o")?;
                let norm = Epilogue::norm(&layer.post_norm);
                let width = 2 * d.intermediate;
                self.gemv(&gup.weight, width, h, (x_ptr, h), rows, norm, gu_ptr)?;
            } else {
                self.linear(&o.weight, h, q_width, &b.ctx, q_width, rows, &mut b.y)?;
                prof.mark("o")?;
                let (y, bias) = (Some(&b.y), o.bias.as_ref());
                rms(y, bias, &mut b.x, &layer.post_norm, &mut b.hb)?;
                prof.mark("norm")?;
                let width = 2 * d.intermediate;
                self.linear(&gup.weight, width, h, &b.hb, h, rows, &mut b.gu)?;
            }
            prof.mark("gate_up")?;
            unsafe {
                let mut args = s.launch_builder(&self.kernels.gated_act);
                args.arg(&b.gu);
                arg_or_null(&mut args, gup.bias.as_ref());
                args.arg(&inter_i)
                    .arg(&d.act)
                    .arg(&mut b.act)
                    .launch(rows_by_columns(rows, d.intermediate))?;
            }
            prof.mark("act")?;
            let dn = &layer.down;
            let inter = d.intermediate;
            if fused {
                let add = Epilogue::add_into(dn.bias.as_ref());
                self.gemv(&dn.weight, h, inter, (act_ptr, inter), rows, add, x_ptr)?;
                prof.mark("down")?;
            } else {
                self.linear(&dn.weight, h, inter, &b.act, inter, rows, &mut b.y)?;
                prof.mark("down")?;
                let next = self
                    .layers
                    .get(l + 1)
                    .map_or(&self.final_norm, |n| &n.input_norm);
                rms(Some(&b.y), dn.bias.as_ref(), &mut b.x, next, &mut b.hb)?;
                prof.mark("norm")?;
            }
        }
        let head = self.lm_head.as_ref().map_or(&self.embed, |w| &w.weight);
        if fused {
            let norm = Epilogue::norm(&self.final_norm);
            let last = x_ptr + (first * std::mem::size_of::<T>()) as u64;
            self.gemv(head, d.vocab, h, (last, stride), out_rows, norm, logits_ptr)?;
        } else {
            let last = b.hb.slice(first..);
            self.linear(head, d.vocab, h, &last, stride, out_rows, &mut b.logits)?;
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
    fn new_state(&self, batch: usize, capacity: usize) -> Result<Box<dyn Any + Send>, EngineError>;
    fn forward(
        &self,
        state: &mut (dyn Any + Send),
        columns: &Columns<'_>,
        new: usize,
        of: LogitsOf,
    ) -> Result<Vec<f32>, EngineError>;
}

impl<T: Elem> AnyDecoder for Decoder<T>
where
    CudaBlas: Gemm<T>,
{
    fn peak_memory(&self) -> Option<u64> {
        crate::engine::pool_bytes(&self.stream, crate::engine::PoolBytes::Peak)
    }

    fn new_state(&self, batch: usize, capacity: usize) -> Result<Box<dyn Any + Send>, EngineError> {
        Ok(Box::new(Decoder::new_state(self, batch, capacity)?))
    }

    fn forward(
        &self,
        state: &mut (dyn Any + Send),
        columns: &Columns<'_>,
        new: usize,
        of: LogitsOf,
    ) -> Result<Vec<f32>, EngineError> {
        let state = state
            .downcast_mut::<State<T>>()
            .ok_or_else(|| EngineError::Spec("a cache of another precision".into()))?;
        Decoder::forward(self, state, columns, new, of)
    }
}

/// A [`DecoderSpec`] on CUDA device 0 in f32 or f16, whichever was asked: load it once, then
/// start a [`DecodeSession`] per generation.
pub struct DecoderEngine {
    inner: Box<dyn AnyDecoder>,
    precision: Precision,
    vocab: usize,
    max_positions: usize,
}

impl DecoderEngine {
    /// Probes libcuda / NVRTC / cuBLAS, checks `spec`, compiles the kernels and uploads the
    /// weights in `precision` (f32 or f16).
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

    /// A session of `batch` rows whose KV cache holds `capacity` columns per row.
    pub fn session(&self, batch: usize, capacity: usize) -> Result<DecodeSession<'_>, EngineError> {
        Ok(DecodeSession {
            engine: self,
            state: self.inner.new_state(batch, capacity)?,
        })
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attention_blocks_cover_the_head() {
        for dh in [8, 64, 80, 128, 256, 1024] {
            let t = attention_threads(dh) as usize;
            assert!(t.is_multiple_of(32) && t >= dh && t <= 1024, "{dh}: {t}");
        }
    }
}
