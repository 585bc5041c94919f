//! Attention helpers: masks, head splitting and scaled dot-product attention.

use burn::tensor::{activation, backend::Backend, Tensor, TensorData};

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
/// 0 = padding) becomes `[batch, heads, queries, keys]` holding 0 or `f32::MIN` (HF's convention),
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
    let offset = keys.saturating_sub(queries);
    let mut rows = Vec::with_capacity(batch * queries * keys);
    for b in 0..batch {
        let m = &mask[b * keys..(b + 1) * keys];
        for q in 0..queries {
            rows.extend(m.iter().enumerate().map(|(k, &keep)| {
                if keep == 0 || (causal && k > q + offset) {
                    f32::MIN
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
    let scale = scale.unwrap_or(1.0 / (head_dim as f64).sqrt());
    let mut scores = q.matmul(k.swap_dims(2, 3)).mul_scalar(scale);
    if let Some(bias) = bias {
        scores = scores + bias.clone();
    }
    activation::softmax(scores, 3).matmul(v)
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
