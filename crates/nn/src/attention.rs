//! Attention helpers: masks, head splitting and scaled dot-product attention.

use std::sync::atomic::{AtomicBool, Ordering};

use burn::tensor::{activation, backend::Backend, Tensor, TensorData};
use ipfs_accelerate_core::{Error, Result};

use crate::{exact, Linear, VarBuilder};

/// `[batch, seq, heads * head_dim]` → `[batch, heads, seq, head_dim]`.
pub fn split_heads<B: Backend>(x: Tensor<B, 3>, heads: usize) -> Tensor<B, 4> {
    let [b, s, hidden] = x.dims();
    x.reshape([b, s, heads, hidden / heads]).swap_dims(1, 2)
}

/// `[batch, heads, seq, head_dim]` → `[batch, seq, heads * head_dim]`.
pub fn merge_heads<B: Backend>(x: Tensor<B, 4>) -> Tensor<B, 3> {
    let [b, h, s, d] = x.dims();
    x.swap_dims(1, 2).reshape([b, s, h * d])
}

/// The additive attention bias of a key-padding mask: `mask` `[batch, keys]` (row-major, 1 = attend,
/// 0 = padding) becomes `[batch, heads, queries, keys]` holding 0 or [`mask_min`] (HF's convention),
/// materialised once per forward so every layer adds it with one contiguous, vectorised add.
/// With `causal`, keys after the query position are masked too (decoders).
pub fn padding_bias<B: Backend>(
    mask: &[i64],
    batch: usize,
    keys: usize,
    heads: usize,
    queries: usize,
    causal: bool,
    device: &B::Device,
) -> Tensor<B, 4> {
    mask_bias(mask, batch, keys, heads, queries, device, |q, k| {
        !causal || k <= q
    })
}

/// The causal bias of a decoder layer with a sliding window (Mistral, Qwen2's sliding layers), as
/// HF's `sliding_window_overlay`: the query at cache position `q` (the queries are the last
/// `queries` of `keys` positions) sees key `k` when `k` is not padding and `q - window < k <= q`.
/// Same layout and values as [`padding_bias`].
pub fn sliding_window_bias<B: Backend>(
    mask: &[i64],
    batch: usize,
    keys: usize,
    heads: usize,
    queries: usize,
    window: usize,
    device: &B::Device,
) -> Tensor<B, 4> {
    mask_bias(mask, batch, keys, heads, queries, device, |q, k| {
        k <= q && k + window > q
    })
}

/// The most negative finite value of the float type `device` computes in (HF's
/// `torch.finfo(dtype).min`): what masked attention scores become. `f32::MIN` would turn into
/// -inf in f16 / bf16, and a row with every key masked into NaN.
pub fn mask_min<B: Backend>(device: &B::Device) -> f32 {
    match burn::tensor::DType::from(burn::tensor::get_device_settings::<B>(device).float_dtype) {
        burn::tensor::DType::F16 => burn::tensor::f16::MIN.to_f32(),
        burn::tensor::DType::BF16 => burn::tensor::bf16::MIN.to_f32(),
        _ => f32::MIN,
    }
}

/// `[batch, heads, queries, keys]` of 0 where `mask` keeps the key and `visible(query position,
/// key position)` holds (query positions offset so the queries are the last of the keys), else
/// [`mask_min`].
fn mask_bias<B: Backend>(
    mask: &[i64],
    batch: usize,
    keys: usize,
    heads: usize,
    queries: usize,
    device: &B::Device,
    visible: impl Fn(usize, usize) -> bool,
) -> Tensor<B, 4> {
    let offset = keys.saturating_sub(queries);
    let masked = mask_min::<B>(device);
    let mut rows = Vec::with_capacity(batch * queries * keys);
    for b in 0..batch {
        let m = &mask[b * keys..(b + 1) * keys];
        for q in 0..queries {
            rows.extend(m.iter().enumerate().map(|(k, &keep)| {
                if keep == 0 || !visible(q + offset, k) {
                    masked
                } else {
                    0.0
                }
            }));
        }
    }
    let per_batch = queries * keys;
    let mut data = Vec::with_capacity(batch * heads * per_batch);
    for b in 0..batch {
        for _ in 0..heads {
            data.extend_from_slice(&rows[b * per_batch..(b + 1) * per_batch]);
        }
    }
    Tensor::from_data(TensorData::new(data, [batch, heads, queries, keys]), device)
}

/// Whether [`sdpa`] may hand unmasked attention to burn's fused attention op (set by
/// [`set_fused_attention`]; on by default).
static FUSED_ATTENTION: AtomicBool = AtomicBool::new(true);

/// Turns the fused attention path of [`sdpa`] on or off for this process. With it on, attention
/// without a bias and with the default scale goes to burn's `module::attention`, which the CubeCL
/// backends (cuda, wgpu, rocm) run as one flash-attention kernel (autotuned against the unfused
/// kernels); the facade turns it off with kernel fusion.
pub fn set_fused_attention(on: bool) {
    FUSED_ATTENTION.store(on, Ordering::Relaxed);
}

/// Whether `q`'s attention takes burn's fused op: the path is on, the backend is not the CPU one
/// (whose own fused kernel is [`crate::fast::attention`]), and its f32 products are not split
/// ([`crate::exact`]: the flash kernel's inner products would round to TF32).
fn uses_fused_attention<B: Backend>(q: &Tensor<B, 4>) -> bool {
    FUSED_ATTENTION.load(Ordering::Relaxed)
        && !crate::fast::is_cpu_backend::<B>()
        && !(q.dtype() == burn::tensor::DType::F32 && exact::splits_f32_products::<B>())
}

/// Scaled dot-product attention over `[batch, heads, seq, head_dim]` tensors:
/// `softmax(q kᵀ · scale + bias) v`, with `scale` defaulting to `1/sqrt(head_dim)` and `bias` an
/// additive `[batch, heads, queries, keys]` tensor (padding / causal masks from [`padding_bias`],
/// relative position biases). Written as two batched matmuls that read `q`, `k`, `v` through their
/// strides, so the head split costs no copy.
pub fn sdpa<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    bias: Option<&Tensor<B, 4>>,
    scale: Option<f64>,
) -> Tensor<B, 4> {
    let head_dim = q.dims()[3];
    if bias.is_none() && scale.is_none() && q.dims()[1] == k.dims()[1] && uses_fused_attention(&q) {
        return burn::tensor::module::attention(q, k, v, None, None, Default::default());
    }
    let scale = scale.unwrap_or(1.0 / (head_dim as f64).sqrt());
    if let Some(out) = crate::fast::attention(&q, &k, &v, bias, scale) {
        return out;
    }
    let mut scores = exact::matmul(q, k.swap_dims(2, 3)).mul_scalar(scale);
    if let Some(bias) = bias {
        scores = scores + bias.clone();
    }
    exact::matmul(activation::softmax(scores, 3), v)
}

/// Which of the four projections of a [`MultiHeadAttention`] carry a bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProjectionBias {
    /// Query projection.
    pub q: bool,
    /// Key projection.
    pub k: bool,
    /// Value projection.
    pub v: bool,
    /// Output projection.
    pub o: bool,
}

impl ProjectionBias {
    /// Every projection has a bias (BERT, ViT, CLIP, DETR).
    pub const ALL: ProjectionBias = ProjectionBias {
        q: true,
        k: true,
        v: true,
        o: true,
    };
    /// No projection has a bias (LLaMA, T5).
    pub const NONE: ProjectionBias = ProjectionBias {
        q: false,
        k: false,
        v: false,
        o: false,
    };

    /// q, k and v with a bias or not (ViT's `qkv_bias`), the output projection with one.
    pub const fn qkv(bias: bool) -> ProjectionBias {
        ProjectionBias {
            q: bias,
            k: bias,
            v: bias,
            o: true,
        }
    }
}

/// The weight names of the four projections relative to the attention module's prefix, e.g.
/// `q_proj` / `k_proj` / `v_proj` / `out_proj` (CLIP, Whisper), `q` / `k` / `v` / `o` (T5),
/// `attention.query` / `attention.key` / `attention.value` / `output.dense` (ViT).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProjectionNames<'a> {
    /// Query.
    pub q: &'a str,
    /// Key.
    pub k: &'a str,
    /// Value.
    pub v: &'a str,
    /// Output.
    pub o: &'a str,
}

impl ProjectionNames<'static> {
    /// `q_proj`, `k_proj`, `v_proj`, `out_proj` (CLIP, Whisper, BART-style).
    pub const OUT_PROJ: ProjectionNames<'static> = ProjectionNames {
        q: "q_proj",
        k: "k_proj",
        v: "v_proj",
        o: "out_proj",
    };
    /// `q_proj`, `k_proj`, `v_proj`, `o_proj` (LLaMA, Qwen2).
    pub const O_PROJ: ProjectionNames<'static> = ProjectionNames {
        q: "q_proj",
        k: "k_proj",
        v: "v_proj",
        o: "o_proj",
    };
}

/// Sizes and options of a [`MultiHeadAttention`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionConfig {
    /// Width of the query input (and of the output).
    pub hidden: usize,
    /// Width of the key / value input (equal to `hidden` except for some cross-attentions).
    pub kv_input: usize,
    /// Query heads.
    pub heads: usize,
    /// Key / value heads (`heads` unless grouped-query attention).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Score scale; `None` is `1/sqrt(head_dim)` (T5 uses 1.0).
    pub scale: Option<f64>,
    /// Which projections have biases.
    pub bias: ProjectionBias,
}

impl AttentionConfig {
    /// Standard multi-head attention: `heads` heads of `hidden / heads`, keys from the same width.
    pub fn new(hidden: usize, heads: usize, bias: ProjectionBias) -> Self {
        AttentionConfig {
            hidden,
            kv_input: hidden,
            heads,
            kv_heads: heads,
            head_dim: hidden / heads.max(1),
            scale: None,
            bias,
        }
    }
}

/// Multi-head attention with separate query, key, value and output projections, usable as self-
/// or cross-attention, with grouped-query attention (`kv_heads < heads`), an optional additive bias
/// (masks, relative positions) and access to the projected heads so callers can apply rotary
/// embeddings or keep a KV cache between [`MultiHeadAttention::project_kv`] and
/// [`MultiHeadAttention::attend`].
#[derive(Debug, Clone)]
pub struct MultiHeadAttention<B: Backend> {
    q: Linear<B>,
    k: Linear<B>,
    v: Linear<B>,
    o: Linear<B>,
    config: AttentionConfig,
}

impl<B: Backend> MultiHeadAttention<B> {
    /// Quantizes the four projections (see [`Linear::quantize`]).
    pub fn quantize(&mut self, q: crate::WeightQuantization) -> Result<()> {
        for l in [&mut self.q, &mut self.k, &mut self.v, &mut self.o] {
            l.quantize(q)?;
        }
        Ok(())
    }

    /// Bytes the projections' weights and biases take in memory.
    pub fn weight_bytes(&self) -> usize {
        [&self.q, &self.k, &self.v, &self.o]
            .iter()
            .map(|l| l.weight_bytes())
            .sum()
    }

    /// Loads the four projections under `vb` with the given names.
    pub fn load(
        vb: &VarBuilder<B>,
        config: AttentionConfig,
        names: ProjectionNames<'_>,
    ) -> Result<Self> {
        let AttentionConfig {
            hidden,
            kv_input,
            heads,
            kv_heads,
            head_dim,
            bias,
            ..
        } = config;
        if heads == 0 || kv_heads == 0 || head_dim == 0 || heads % kv_heads != 0 {
            return Err(Error::InvalidInput(format!(
                "attention {}: {heads} heads, {kv_heads} key/value heads of width {head_dim} \
                 (heads must be a positive multiple of key/value heads)",
                vb.path("")
            )));
        }
        Ok(MultiHeadAttention {
            q: Linear::load(&vb.pp(names.q), hidden, heads * head_dim, bias.q)?,
            k: Linear::load(&vb.pp(names.k), kv_input, kv_heads * head_dim, bias.k)?,
            v: Linear::load(&vb.pp(names.v), kv_input, kv_heads * head_dim, bias.v)?,
            o: Linear::load(&vb.pp(names.o), heads * head_dim, hidden, bias.o)?,
            config,
        })
    }

    /// The sizes and options.
    pub fn config(&self) -> &AttentionConfig {
        &self.config
    }

    /// Projects `x` `[batch, seq, hidden]` to query heads `[batch, heads, seq, head_dim]`.
    pub fn project_q(&self, x: Tensor<B, 3>) -> Tensor<B, 4> {
        split_heads(self.q.forward(x), self.config.heads)
    }

    /// Projects `x` to key heads `[batch, kv_heads, seq, head_dim]`.
    pub fn project_k(&self, x: Tensor<B, 3>) -> Tensor<B, 4> {
        split_heads(self.k.forward(x), self.config.kv_heads)
    }

    /// Projects `x` to value heads `[batch, kv_heads, seq, head_dim]`.
    pub fn project_v(&self, x: Tensor<B, 3>) -> Tensor<B, 4> {
        split_heads(self.v.forward(x), self.config.kv_heads)
    }

    /// Key and value heads of `x`.
    pub fn project_kv(&self, x: Tensor<B, 3>) -> (Tensor<B, 4>, Tensor<B, 4>) {
        (self.project_k(x.clone()), self.project_v(x))
    }

    /// Attention of query heads over key / value heads (repeated for grouped-query attention),
    /// merged and passed through the output projection: `[batch, queries, hidden]`.
    pub fn attend(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        bias: Option<&Tensor<B, 4>>,
    ) -> Tensor<B, 3> {
        self.output(self.attend_heads(q, k, v, bias))
    }

    /// The per-head attention result before merging, `[batch, heads, queries, head_dim]`, for
    /// callers that adjust it before [`MultiHeadAttention::output`].
    pub fn attend_heads(
        &self,
        q: Tensor<B, 4>,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
        bias: Option<&Tensor<B, 4>>,
    ) -> Tensor<B, 4> {
        // The CPU kernel reads grouped key / value heads in place.
        let scale = self
            .config
            .scale
            .unwrap_or(1.0 / (q.dims()[3] as f64).sqrt());
        if let Some(out) = crate::fast::attention(&q, &k, &v, bias, scale) {
            return out;
        }
        let groups = self.config.heads / self.config.kv_heads;
        let shared_bias = bias.is_none_or(|b| b.dims()[1] == 1);
        if groups <= 1 || !shared_bias {
            let (k, v) = (repeat_kv(k, groups), repeat_kv(v, groups));
            return sdpa(q, k, v, bias, self.config.scale);
        }
        // Grouped-query attention without copying the keys and values once per query head: the
        // query heads sharing a key / value head (heads are kv-major: head = kv * groups + g) are
        // stacked along the sequence axis, `[b, kv, groups * s, d]`, and the bias (the same for
        // every head) is repeated per group.
        let [b, h, s, d] = q.dims();
        let kv = h / groups;
        let q = q.reshape([b, kv, groups * s, d]);
        let bias = bias.map(|x| {
            let [bb, _, bs, t] = x.dims();
            if bs == 1 {
                // One row for every query position: it broadcasts over the stacked rows as is.
                return x.clone();
            }
            x.clone()
                .unsqueeze_dim::<5>(1)
                .expand([bb, groups, 1, bs, t])
                .reshape([bb, 1, groups * bs, t])
        });
        sdpa(q, k, v, bias.as_ref(), self.config.scale).reshape([b, h, s, d])
    }

    /// Merges heads `[batch, heads, seq, head_dim]` and applies the output projection.
    pub fn output(&self, heads: Tensor<B, 4>) -> Tensor<B, 3> {
        self.o.forward(merge_heads(heads))
    }

    /// [`MultiHeadAttention::output`] plus a residual `[batch, seq, hidden]`, added in the
    /// projection's output pass on the CPU backend.
    pub fn output_add(&self, heads: Tensor<B, 4>, residual: Tensor<B, 3>) -> Tensor<B, 3> {
        self.o.forward_add(merge_heads(heads), residual)
    }

    /// Self-attention over `x` plus a residual: `residual + attention(x)`.
    pub fn forward_add(
        &self,
        x: Tensor<B, 3>,
        bias: Option<&Tensor<B, 4>>,
        residual: Tensor<B, 3>,
    ) -> Tensor<B, 3> {
        let q = self.project_q(x.clone());
        let (k, v) = self.project_kv(x);
        self.output_add(self.attend_heads(q, k, v, bias), residual)
    }

    /// Self-attention over `x` `[batch, seq, hidden]`.
    pub fn forward(&self, x: Tensor<B, 3>, bias: Option<&Tensor<B, 4>>) -> Tensor<B, 3> {
        let q = self.project_q(x.clone());
        let (k, v) = self.project_kv(x);
        self.attend(q, k, v, bias)
    }

    /// Attention with separate query, key and value inputs (cross-attention; DETR adds position
    /// embeddings to queries and keys but not to values).
    pub fn forward_qkv(
        &self,
        query: Tensor<B, 3>,
        key: Tensor<B, 3>,
        value: Tensor<B, 3>,
        bias: Option<&Tensor<B, 4>>,
    ) -> Tensor<B, 3> {
        let q = self.project_q(query);
        let k = self.project_k(key);
        let v = self.project_v(value);
        self.attend(q, k, v, bias)
    }
}

/// Repeats each key / value head `groups` times: `[b, kv, s, d]` → `[b, kv * groups, s, d]`
/// (grouped-query attention; a no-op when `groups` is 1).
pub fn repeat_kv<B: Backend>(x: Tensor<B, 4>, groups: usize) -> Tensor<B, 4> {
    if groups <= 1 {
        return x;
    }
    let [b, kv, s, d] = x.dims();
    x.unsqueeze_dim::<5>(2)
        .expand([b, kv, groups, s, d])
        .reshape([b, kv * groups, s, d])
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{activation::softmax, Bool, Int};
    use burn_flex::Flex;

    #[test]
    fn sdpa_matches_naive_with_padding() {
        let dev = Default::default();
        let vals: Vec<f32> = (0..2 * 2 * 3 * 4)
            .map(|i| ((i * 7 % 11) as f32) / 5.0 - 1.0)
            .collect();
        let t = |off: usize| {
            let v: Vec<f32> = vals.iter().map(|x| x * (1.0 + off as f32 * 0.3)).collect();
            Tensor::<Flex, 4>::from_data(TensorData::new(v, [2, 2, 3, 4]), &dev)
        };
        let (q, k, v) = (t(0), t(1), t(2));
        let mask = vec![1i64, 1, 1, 1, 1, 0];
        let am = Tensor::<Flex, 2, Int>::from_data(TensorData::new(mask.clone(), [2, 3]), &dev);
        let bias = padding_bias::<Flex>(&mask, 2, 3, 2, 3, false, &dev);
        let out = sdpa(q.clone(), k.clone(), v.clone(), Some(&bias), None);
        let scores = q.matmul(k.swap_dims(2, 3)) / 2.0;
        // Independent reference: boolean mask filled with -inf, as HF's eager attention.
        let m: Tensor<Flex, 4, Bool> = am
            .equal_elem(0)
            .unsqueeze_dims::<4>(&[1, 2])
            .expand([2, 2, 3, 3]);
        let naive = softmax(scores.mask_fill(m, f32::NEG_INFINITY), 3).matmul(v);
        let diff = (out - naive).abs().max().into_scalar();
        assert!(diff < 1e-5, "max diff {diff}");
    }
}
