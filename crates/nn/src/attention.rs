//! Attention helpers: masks, head splitting and scaled dot-product attention.

use burn::tensor::{
    backend::Backend, module::attention, ops::AttentionModuleOptions, Bool, Int, Tensor,
};

/// A key-padding mask for attention: `attention_mask` `[batch, keys]` (1 = attend, 0 = padding)
/// becomes a boolean `[batch, 1, 1, keys]` that is `true` where attention is forbidden.
pub fn padding_mask<B: Backend>(attention_mask: Tensor<B, 2, Int>) -> Tensor<B, 4, Bool> {
    attention_mask.equal_elem(0).unsqueeze_dims::<4>(&[1, 2])
}

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

/// Scaled dot-product attention over `[batch, heads, seq, head_dim]` tensors by the backend's
/// attention kernel. `mask` (`true` = forbidden) broadcasts from `[batch, 1, 1|q, k]`;
/// `bias` is added to the scores (relative position biases); `scale` defaults to `1/sqrt(head_dim)`.
pub fn sdpa<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    mask: Option<Tensor<B, 4, Bool>>,
    bias: Option<Tensor<B, 4>>,
    scale: Option<f64>,
    causal: bool,
) -> Tensor<B, 4> {
    let [b, h, sq, _] = q.dims();
    let sk = k.dims()[2];
    let mask = mask.map(|m| m.expand([b, h, sq, sk]));
    let bias = bias.map(|x| x.expand([b, h, sq, sk]));
    let options = AttentionModuleOptions {
        scale,
        softcap: None,
        is_causal: causal,
    };
    attention(q, k, v, mask, bias, options)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::{activation::softmax, TensorData};
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
        let am = Tensor::<Flex, 2, Int>::from_data(
            TensorData::new(vec![1i64, 1, 1, 1, 1, 0], [2, 3]),
            &dev,
        );
        let out = sdpa(
            q.clone(),
            k.clone(),
            v.clone(),
            Some(padding_mask(am.clone())),
            None,
            None,
            false,
        );
        let scores = q.matmul(k.swap_dims(2, 3)) / 2.0;
        let m = padding_mask(am).expand([2, 2, 3, 3]);
        let naive = softmax(scores.mask_fill(m, f32::NEG_INFINITY), 3).matmul(v);
        let diff = (out - naive).abs().max().into_scalar();
        assert!(diff < 1e-5, "max diff {diff}");
    }
}
