//! Fast paths for the CPU backend: when a model runs on burn-flex in f32, the hot blocks call the
//! fused, vectorised kernels of `ipfs-accelerate-kernels` on the tensors' storage instead of a
//! chain of burn ops (each of which allocates and walks its output once). Every other backend, and
//! burn-flex in other dtypes, keeps the generic burn code, so model code stays backend-generic.
//!
//! The kernels are on by default; `IPFS_ACCELERATE_CPU_KERNELS=0` turns them off (to compare, or
//! to rule them out when debugging).

use std::any::{Any, TypeId};
use std::cell::Cell;
use std::sync::OnceLock;

use burn::tensor::{backend::Backend, DType, Tensor, TensorData, TensorPrimitive};
use burn_flex::FlexTensor;
use ipfs_accelerate_kernels::{self as kernels, Epilogue, EpilogueActivation, StridedView};

use crate::Activation;

/// Whether the CPU kernels are enabled (`IPFS_ACCELERATE_CPU_KERNELS` is not `0` / `false` /
/// `off`), read once.
pub fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !switched_off("IPFS_ACCELERATE_CPU_KERNELS"))
}

/// Whether the environment variable `name` is `0`, `false` or `off`.
fn switched_off(name: &str) -> bool {
    matches!(std::env::var(name).as_deref(), Ok("0" | "false" | "off"))
}

/// Whether convolutions run on the kernels' products: the audio front ends' over their input's
/// windows (`kernels::conv1d`, channels last, with the fused per-channel norm) and images'
/// with a column matrix per image (`kernels::conv2d`). On with the kernels, unless
/// `IPFS_ACCELERATE_CPU_CONV` is `0` / `false` / `off` (burn-flex's convolutions then run, to
/// compare); read once.
fn windowed_convolutions() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| !switched_off("IPFS_ACCELERATE_CPU_CONV"))
}

/// Whether `B` is the CPU backend (burn-flex).
pub fn is_cpu_backend<B: Backend>() -> bool {
    TypeId::of::<B::FloatTensorPrimitive>() == TypeId::of::<FlexTensor>()
}

/// Whether `t` is an f32 burn-flex tensor the kernels can read.
fn eligible<B: Backend, const D: usize>(t: &Tensor<B, D>) -> bool {
    is_cpu_backend::<B>() && t.dtype() == DType::F32 && enabled()
}

/// The burn-flex tensor inside `t` (the caller checked [`eligible`]). `None` for a quantized
/// tensor.
fn into_flex<B: Backend, const D: usize>(t: Tensor<B, D>) -> Option<FlexTensor> {
    match t.into_primitive() {
        TensorPrimitive::Float(p) => {
            let boxed: Box<dyn Any> = Box::new(p);
            boxed.downcast::<FlexTensor>().ok().map(|b| *b)
        }
        TensorPrimitive::QFloat(_) => None,
    }
}

/// Wraps a burn-flex tensor back into `Tensor<B, D>` (`B` is burn-flex: checked by [`eligible`]).
fn from_flex<B: Backend, const D: usize>(t: FlexTensor) -> Tensor<B, D> {
    let boxed: Box<dyn Any> = Box::new(t);
    match boxed.downcast::<B::FloatTensorPrimitive>() {
        Ok(p) => Tensor::from_primitive(TensorPrimitive::Float(*p)),
        Err(_) => unreachable!("from_flex is only called when B's float tensor is FlexTensor"),
    }
}

/// A contiguous f32 tensor's values and shape (copying only when the layout is strided).
fn contiguous(t: FlexTensor) -> FlexTensor {
    if t.as_slice::<f32>().is_some() {
        t
    } else {
        t.to_contiguous()
    }
}

/// An optional tensor as a contiguous burn-flex tensor: `Some(None)` when absent, `None` when it
/// is quantized.
fn optional_flex<B: Backend, const D: usize>(
    t: Option<&Tensor<B, D>>,
) -> Option<Option<FlexTensor>> {
    match t {
        Some(t) => Some(Some(contiguous(into_flex(t.clone())?))),
        None => Some(None),
    }
}

/// The f32 values of an [`optional_flex`] tensor: `Some(None)` when absent.
fn optional_values(t: &Option<FlexTensor>) -> Option<Option<&[f32]>> {
    match t {
        Some(t) => Some(Some(t.as_slice::<f32>()?)),
        None => Some(None),
    }
}

/// `kernel` applied in place to a burn-flex tensor of `shape` (a copy only when it shares or
/// overhangs its storage).
fn in_place(flex: FlexTensor, shape: Vec<usize>, kernel: impl FnOnce(&mut [f32])) -> FlexTensor {
    let mut flex = contiguous(flex);
    if let Some(values) = flex.try_storage_mut::<f32>() {
        if values.len() == shape.iter().product::<usize>() {
            kernel(values);
            return flex;
        }
    }
    let mut values = flex
        .as_slice::<f32>()
        .map(<[f32]>::to_vec)
        .unwrap_or_default();
    kernel(&mut values);
    new_flex(values, shape)
}

/// A new contiguous f32 burn-flex tensor of `shape` holding `values`.
fn new_flex(values: Vec<f32>, shape: Vec<usize>) -> FlexTensor {
    FlexTensor::from_data(TensorData::new(values, shape))
}

/// The kernel's fused activation for an activation, when it has one.
fn epilogue_activation(act: Option<Activation>) -> Option<EpilogueActivation> {
    Some(match act {
        None | Some(Activation::Identity) => EpilogueActivation::Identity,
        Some(Activation::Gelu) => EpilogueActivation::GeluErf,
        Some(Activation::GeluTanh) => EpilogueActivation::GeluTanh,
        Some(Activation::Silu) => EpilogueActivation::Silu,
        Some(Activation::QuickGelu) => EpilogueActivation::QuickGelu,
        Some(Activation::Relu) => EpilogueActivation::Relu,
        Some(_) => return None,
    })
}

/// Whether int8 linear weights are packed for the CPU kernel: `B` is the CPU backend and the
/// kernels are on.
pub(crate) fn int8_kernel<B: Backend>() -> bool {
    is_cpu_backend::<B>() && enabled()
}

thread_local! {
    /// Set inside [`with_bf16_linears`].
    static BF16_LINEARS: Cell<bool> = const { Cell::new(false) };
}

/// Runs `load` with the float linear weights it loads on the CPU backend kept as bf16 and
/// multiplied by the bf16 kernel (`ipfs-accelerate-kernels`' `linear_bf16`: activations rounded
/// to bf16, products summed in f32, as PyTorch's bf16 matmuls), everything else in f32. This
/// is what `--precision bf16` means on the CPU. Other backends, and the CPU with its kernels
/// off, load as usual.
pub fn with_bf16_linears<T>(load: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            BF16_LINEARS.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(BF16_LINEARS.with(|c| c.replace(true)));
    load()
}

/// Whether a float linear weight loaded now for `B` is kept as bf16 (see
/// [`with_bf16_linears`]).
pub(crate) fn bf16_linears<B: Backend>() -> bool {
    is_cpu_backend::<B>() && enabled() && BF16_LINEARS.with(Cell::get)
}

/// `act(x · w + bias + residual)` for `x` `[rows, in]`, `w` `[in, out]`, through one fused kernel,
/// or `None` (inputs untouched) when the fast path does not apply.
pub(crate) fn linear<B: Backend>(
    x: &Tensor<B, 2>,
    w: &Tensor<B, 2>,
    bias: Option<&Tensor<B, 1>>,
    residual: Option<&Tensor<B, 2>>,
    act: Option<Activation>,
) -> Option<Tensor<B, 2>> {
    if !eligible(w) {
        return None;
    }
    let [k, n] = w.dims();
    let w = contiguous(into_flex(w.clone())?);
    let w = w.as_slice::<f32>()?;
    fused(x, k, n, bias, residual, act, |x, rows, epilogue| {
        Some(kernels::linear(x, rows, k, w, n, epilogue))
    })
}

/// `act(x · wᵀ + bias + residual)` for `x` `[rows, in]` and an int8 weight packed for the CPU
/// kernel (activations quantized per row, exact integer sums), or `None` (inputs untouched) when
/// the fast path does not apply.
pub(crate) fn linear_int8<B: Backend>(
    x: &Tensor<B, 2>,
    w: &kernels::PackedInt8,
    bias: Option<&Tensor<B, 1>>,
    residual: Option<&Tensor<B, 2>>,
    act: Option<Activation>,
) -> Option<Tensor<B, 2>> {
    fused(x, w.k(), w.n(), bias, residual, act, |x, rows, epilogue| {
        Some(kernels::linear_int8(x, rows, w, epilogue))
    })
}

/// `act(x · wᵀ + bias + residual)` for `x` `[rows, in]` and a bf16 weight packed for the CPU
/// kernel, or `None` (inputs untouched) when the fast path does not apply.
pub(crate) fn linear_bf16<B: Backend>(
    x: &Tensor<B, 2>,
    w: &kernels::PackedBf16,
    bias: Option<&Tensor<B, 1>>,
    residual: Option<&Tensor<B, 2>>,
    act: Option<Activation>,
) -> Option<Tensor<B, 2>> {
    fused(x, w.k(), w.n(), bias, residual, act, |x, rows, epilogue| {
        kernels::linear_bf16(x, rows, w.k(), w, epilogue)
    })
}

/// Runs `f` on a thread of rayon's global pool (the caller waits), or in place when already on
/// one. The kernels' parallel loops inside `f` then start from a pool thread: a loop costs no
/// hand-over from an outside thread to the pool (a wake-up and a sleep per loop, hundreds per
/// decoded token), and with one thread it runs inline. For a whole forward pass of a model on the
/// CPU backend.
pub fn on_pool<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    if rayon::current_thread_index().is_some() {
        return f();
    }
    rayon::scope(|_| f())
}

/// Whether weights the source hands over as ggml blocks are kept that way (see [`crate::ggml`]):
/// `B` is the CPU backend and the kernels are on.
pub(crate) fn ggml_kernel<B: Backend>() -> bool {
    is_cpu_backend::<B>() && enabled()
}

/// `act(x · wᵀ + bias + residual)` for `x` `[rows, in]` and a weight kept as ggml blocks
/// (`kernels::linear_ggml`), or `None` (inputs untouched) when the fast path does not apply.
pub(crate) fn linear_ggml<B: Backend>(
    x: &Tensor<B, 2>,
    w: &crate::ggml::GgmlWeight,
    bias: Option<&Tensor<B, 1>>,
    residual: Option<&Tensor<B, 2>>,
    act: Option<Activation>,
) -> Option<Tensor<B, 2>> {
    let blocks = w.blocks()?;
    fused(x, w.k(), w.n(), bias, residual, act, |x, rows, epilogue| {
        Some(kernels::linear_ggml(x, rows, blocks.k(), &blocks, epilogue))
    })
}

/// Runs `product(x, rows, epilogue)` (a `[rows, n]` result of `x` `[rows, k]`) with `bias`,
/// `residual` and `act` fused into its epilogue, when every tensor is an f32 burn-flex tensor of
/// the right shape and the activation has a fused form.
fn fused<B: Backend>(
    x: &Tensor<B, 2>,
    k: usize,
    n: usize,
    bias: Option<&Tensor<B, 1>>,
    residual: Option<&Tensor<B, 2>>,
    act: Option<Activation>,
    product: impl FnOnce(&[f32], usize, Epilogue<'_>) -> Option<Vec<f32>>,
) -> Option<Tensor<B, 2>> {
    if !(eligible(x) && bias.is_none_or(eligible) && residual.is_none_or(eligible)) {
        return None;
    }
    let activation = epilogue_activation(act)?;
    let [rows, xk] = x.dims();
    if xk != k
        || bias.is_some_and(|b| b.dims() != [n])
        || residual.is_some_and(|r| r.dims() != [rows, n])
    {
        return None;
    }
    let x = contiguous(into_flex(x.clone())?);
    let (bias, residual) = (optional_flex(bias)?, optional_flex(residual)?);
    let epilogue = Epilogue {
        bias: optional_values(&bias)?,
        residual: optional_values(&residual)?,
        activation,
    };
    let out = product(x.as_slice::<f32>()?, rows, epilogue)?;
    Some(from_flex(new_flex(out, vec![rows, n])))
}

/// The activation applied in place (a copy only when `x` shares its storage), or `x` back when
/// the fast path does not apply.
pub(crate) fn activation<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    act: Activation,
) -> Result<Tensor<B, D>, Tensor<B, D>> {
    let kernel: fn(&mut [f32]) = match act {
        Activation::Gelu => kernels::gelu_erf,
        Activation::GeluTanh => kernels::gelu_tanh,
        Activation::Silu => kernels::silu,
        Activation::QuickGelu => kernels::quick_gelu,
        _ => return Err(x),
    };
    if !eligible(&x) {
        return Err(x);
    }
    let shape = x.dims().to_vec();
    let Some(flex) = into_flex(x.clone()) else {
        return Err(x);
    };
    drop(x);
    Ok(from_flex(in_place(flex, shape, kernel)))
}

/// `act(conv(x) + bias)` for channels-last `x` `[batch, length, in]` and a convolution held as
/// the description holds it (`w` `[in / groups · kernel, out]`, taps ordered channel, then
/// offset), through the kernels' product over the input's windows in place
/// (`kernels::conv1d`). Returns `[batch, length', out]`, or `None` (inputs untouched) when the
/// fast path does not apply.
pub(crate) fn conv1d<B: Backend>(
    x: &Tensor<B, 3>,
    w: &Tensor<B, 2>,
    bias: Option<&Tensor<B, 1>>,
    [kernel, stride, padding, groups]: [usize; 4],
    act: Option<Activation>,
) -> Option<Tensor<B, 3>> {
    if !(eligible(x) && eligible(w) && bias.is_none_or(eligible) && windowed_convolutions()) {
        return None;
    }
    let activation = epilogue_activation(act)?;
    let [batch, length, channels] = x.dims();
    let [taps, out] = w.dims();
    let shape = kernels::Conv1d {
        batch,
        length,
        channels,
        out_channels: out,
        kernel,
        stride,
        padding,
        groups,
    };
    let out_length = shape.out_length()?;
    if taps != channels / groups * kernel || bias.is_some_and(|b| b.dims() != [out]) {
        return None;
    }
    let y = on_values(x, w, bias, |x, w, b| {
        kernels::conv1d(x, shape, w, b, activation)
    })?;
    Some(from_flex(new_flex(y, vec![batch, out_length, out])))
}

/// `f` on the f32 values of `x`, `w` and `bias` (copied only where a layout is strided), or
/// `None` for a quantized tensor.
fn on_values<B: Backend, const D: usize, const E: usize, R>(
    x: &Tensor<B, D>,
    w: &Tensor<B, E>,
    bias: Option<&Tensor<B, 1>>,
    f: impl FnOnce(&[f32], &[f32], Option<&[f32]>) -> R,
) -> Option<R> {
    let x = contiguous(into_flex(x.clone())?);
    let w = contiguous(into_flex(w.clone())?);
    let bias = optional_flex(bias)?;
    Some(f(
        x.as_slice::<f32>()?,
        w.as_slice::<f32>()?,
        optional_values(&bias)?,
    ))
}

/// `act(conv(x) + bias + residual)` for `x` `[batch, in, height, width]` and PyTorch's weight
/// `[out, in, kh, kw]` (one group, no dilation) through the kernels' product with a column
/// matrix per image (`kernels::conv2d`), or `None` (inputs untouched) when the fast path does
/// not apply.
pub(crate) fn conv2d<B: Backend>(
    x: &Tensor<B, 4>,
    w: &Tensor<B, 4>,
    bias: Option<&Tensor<B, 1>>,
    [stride, padding]: [[usize; 2]; 2],
    residual: Option<&Tensor<B, 4>>,
    act: Option<Activation>,
) -> Option<Tensor<B, 4>> {
    let inputs = eligible(x) && eligible(w) && bias.is_none_or(eligible);
    if !(inputs && residual.is_none_or(eligible) && windowed_convolutions()) {
        return None;
    }
    let activation = epilogue_activation(act)?;
    let [batch, channels, height, width] = x.dims();
    let [out, in_channels, kh, kw] = w.dims();
    let shape = kernels::Conv2d {
        batch,
        channels,
        height,
        width,
        out_channels: out,
        kernel: [kh, kw],
        stride,
        padding,
    };
    let [oh, ow] = shape.out_size()?;
    if in_channels != channels
        || bias.is_some_and(|b| b.dims() != [out])
        || residual.is_some_and(|r| r.dims() != [batch, out, oh, ow])
    {
        return None;
    }
    let residual = optional_flex(residual)?;
    let residual = optional_values(&residual)?;
    let y = on_values(x, w, bias, |x, w, b| {
        kernels::conv2d(x, shape, w, b, residual, activation)
    })?;
    Some(from_flex(new_flex(y, vec![batch, out, oh, ow])))
}

/// Each channel of channels-last `x` `[batch, length, channels]` normalised over its frames,
/// scaled and shifted, then `act`, in place (`kernels::channel_norm`; a copy only when `x`
/// shares its storage), or `x` back when the fast path does not apply.
pub(crate) fn channel_norm<B: Backend>(
    x: Tensor<B, 3>,
    gamma: &Tensor<B, 1>,
    beta: Option<&Tensor<B, 1>>,
    eps: f64,
    act: Option<Activation>,
) -> Result<Tensor<B, 3>, Tensor<B, 3>> {
    let dims = x.dims();
    let fits = eligible(&x)
        && windowed_convolutions()
        && eligible(gamma)
        && beta.is_none_or(eligible)
        && gamma.dims() == [dims[2]]
        && beta.is_none_or(|b| b.dims() == [dims[2]]);
    let Some(activation) = epilogue_activation(act).filter(|_| fits) else {
        return Err(x);
    };
    let (Some(gamma), Some(beta)) = (optional_flex(Some(gamma)), optional_flex(beta)) else {
        return Err(x);
    };
    let (Some(Some(g)), Some(b), Some(flex)) = (
        optional_values(&gamma),
        optional_values(&beta),
        into_flex(x.clone()),
    ) else {
        return Err(x);
    };
    drop(x);
    let eps = eps as f32;
    let normed = in_place(flex, dims.to_vec(), |values| {
        kernels::channel_norm(values, dims, g, b, eps, activation)
    });
    Ok(from_flex(normed))
}

/// A 4-D burn-flex tensor's storage as a strided view.
fn view(t: &FlexTensor) -> Option<StridedView<'_>> {
    let layout = t.layout();
    let shape = layout.shape();
    if shape.num_dims() != 4 {
        return None;
    }
    let s = layout.strides();
    StridedView::new(
        t.storage::<f32>(),
        layout.start_offset(),
        [shape[0], shape[1], shape[2], shape[3]],
        [s[0], s[1], s[2], s[3]],
    )
}

/// `softmax(q kᵀ · scale + bias) v` through the fused attention kernel, or `None` when the fast
/// path does not apply. The result is `[batch, heads, queries, v_dim]` viewed over a
/// `[batch, queries, heads, v_dim]` buffer, so merging the heads afterwards costs no copy.
pub(crate) fn attention<B: Backend>(
    q: &Tensor<B, 4>,
    k: &Tensor<B, 4>,
    v: &Tensor<B, 4>,
    bias: Option<&Tensor<B, 4>>,
    scale: f64,
) -> Option<Tensor<B, 4>> {
    if !(eligible(q) && eligible(k) && eligible(v) && bias.is_none_or(eligible)) {
        return None;
    }
    let [batch, heads, queries, _] = q.dims();
    let [_, kv_heads, keys, _] = k.dims();
    let v_dim = v.dims()[3];
    if k.dims()[0] != batch
        || v.dims()[..3] != k.dims()[..3]
        || q.dims()[3] != k.dims()[3]
        || kv_heads == 0
        || !heads.is_multiple_of(kv_heads)
    {
        return None;
    }
    if let Some(b) = bias {
        let [bb, bh, bq, bk] = b.dims();
        if !((bb == batch || bb == 1) && (bh == heads || bh == 1) && bq == queries && bk == keys) {
            return None;
        }
    }
    let (qf, kf, vf) = (
        into_flex(q.clone())?,
        into_flex(k.clone())?,
        into_flex(v.clone())?,
    );
    let bf = match bias {
        Some(b) => Some(into_flex(b.clone())?),
        None => None,
    };
    // A bias of one batch or one head is broadcast by the kernel (it reads index 0 of a size-1
    // dimension), so its own layout serves as is.
    let bias_view = match &bf {
        Some(b) => Some(view(b)?),
        None => None,
    };
    let mut out = vec![0.0f32; batch * queries * heads * v_dim];
    kernels::attention(
        view(&qf)?,
        view(&kf)?,
        view(&vf)?,
        bias_view,
        scale as f32,
        &mut out,
    );
    let merged = new_flex(out, vec![batch, queries, heads, v_dim]);
    Some(from_flex(merged.permute(&[0, 2, 1, 3])))
}

/// The CPU kernels this machine runs, chosen at run time, for reports such as `devices`:
/// `int8 avx512vnni, bf16 avx512bf16`, and where the CPU has AMX its state
/// (`; AMX ready (bf16, int8)` or `; AMX refused: <reason>`).
pub fn cpu_kernels() -> String {
    let amx = match ipfs_accelerate_kernels::amx_support() {
        ipfs_accelerate_kernels::AmxSupport::Absent => String::new(),
        other => format!("; AMX {}", other.describe()),
    };
    format!(
        "int8 {}, bf16 {}{amx}",
        ipfs_accelerate_kernels::Int8Isa::detect().name(),
        ipfs_accelerate_kernels::Bf16Isa::detect().name()
    )
}

/// Logs once, as a warning, why a CPU with AMX does not use it (the OS refused this process the
/// tile state, or `IPFS_ACCELERATE_NO_AMX` is set); the AVX-512 kernels run instead.
pub(crate) fn warn_if_amx_refused() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if let ipfs_accelerate_kernels::AmxSupport::Refused(why) =
            ipfs_accelerate_kernels::amx_support()
        {
            tracing::warn!(%why, "AMX unavailable; the AVX-512 int8 / bf16 kernels run instead");
        }
    });
}
