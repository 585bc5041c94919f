//! Relative position biases (T5 and its relatives): Mesh-TensorFlow's log-spaced distance buckets
//! and the learned per-head bias table looked up from them.

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::Result;

use crate::{convert::int_tensor, Embedding, VarBuilder};

/// The bucket of a relative position (one description, in core).
pub use ipfs_accelerate_core::decoder::relative_position_bucket;

/// Buckets of a `[queries, keys]` grid, row-major, where query `i` sits at position
/// `offset + i` (tokens already cached) and key `j` at position `j`.
pub fn relative_position_buckets(
    queries: usize,
    keys: usize,
    offset: usize,
    bidirectional: bool,
    num_buckets: usize,
    max_distance: usize,
) -> Vec<i64> {
    let mut out = Vec::with_capacity(queries * keys);
    for q in 0..queries {
        let qpos = (offset + q) as i64;
        out.extend((0..keys).map(|k| {
            relative_position_bucket(k as i64 - qpos, bidirectional, num_buckets, max_distance)
                as i64
        }));
    }
    out
}

/// A learned relative position bias: a `[num_buckets, heads]` table (HF's
/// `relative_attention_bias.weight`) turned into an additive attention bias per head.
#[derive(Debug, Clone)]
pub struct RelativePositionBias<B: Backend> {
    table: Embedding<B>,
    heads: usize,
    bidirectional: bool,
    max_distance: usize,
}

impl<B: Backend> RelativePositionBias<B> {
    /// Loads `weight` `[num_buckets, heads]` under `vb`; `bidirectional` for encoders, causal
    /// (unidirectional) buckets for decoders.
    pub fn load(
        vb: &VarBuilder<B>,
        num_buckets: usize,
        heads: usize,
        max_distance: usize,
        bidirectional: bool,
    ) -> Result<Self> {
        Ok(RelativePositionBias {
            table: Embedding::load(vb, num_buckets, heads)?,
            heads,
            bidirectional,
            max_distance,
        })
    }

    /// The bias `[1, heads, queries, keys]` for queries at positions `offset..offset + queries`
    /// over keys at `0..keys`.
    pub fn forward(&self, queries: usize, keys: usize, offset: usize) -> Tensor<B, 4> {
        let buckets = relative_position_buckets(
            queries,
            keys,
            offset,
            self.bidirectional,
            self.table.num_embeddings(),
            self.max_distance,
        );
        let device = self.table.weight().device();
        let ids = int_tensor::<B, 2>(buckets, [queries, keys], &device);
        // [queries, keys, heads] → [1, heads, queries, keys]
        let values = self.table.forward(ids);
        let values = values.permute([2, 0, 1]).unsqueeze_dim::<4>(0);
        // Materialise the permuted layout once so every layer adds it contiguously.
        Tensor::from_data(values.to_data(), &device)
    }

    /// Number of heads.
    pub fn heads(&self) -> usize {
        self.heads
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_match_hf() {
        // Values from HF's `T5Attention._relative_position_bucket` (32 buckets, max distance 128).
        let rel: Vec<i64> = vec![
            -200, -128, -60, -17, -16, -9, -8, -1, 0, 1, 7, 8, 9, 50, 127, 500,
        ];
        let bi: Vec<usize> = rel
            .iter()
            .map(|&r| relative_position_bucket(r, true, 32, 128))
            .collect();
        assert_eq!(
            bi,
            [15, 15, 13, 10, 10, 8, 8, 1, 0, 17, 23, 24, 24, 29, 31, 31]
        );
        let uni: Vec<usize> = rel
            .iter()
            .map(|&r| relative_position_bucket(r, false, 32, 128))
            .collect();
        assert_eq!(uni, [31, 31, 26, 16, 16, 9, 8, 1, 0, 0, 0, 0, 0, 0, 0, 0]);
    }

    #[test]
    fn grid_uses_the_query_offset() {
        let g = relative_position_buckets(1, 4, 3, false, 8, 20);
        let full = relative_position_buckets(4, 4, 0, false, 8, 20);
        assert_eq!(g, full[12..16].to_vec());
    }
}
