//! Key / value caches for incremental decoding.

use burn::tensor::{backend::Backend, Tensor};

/// Per-layer key / value heads `[batch, kv_heads, seq, head_dim]` kept between decoding steps.
///
/// Self-attention appends each step's keys and values ([`KvCache::append`]); cross-attention
/// computes the encoder's keys and values once and stores them ([`KvCache::set`]).
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    layers: Vec<Option<(Tensor<B, 4>, Tensor<B, 4>)>>,
}

impl<B: Backend> KvCache<B> {
    /// An empty cache for `layers` layers.
    pub fn new(layers: usize) -> Self {
        KvCache {
            layers: vec![None; layers],
        }
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }

    /// Positions cached so far (the sequence length of layer 0; 0 when empty).
    pub fn seq_len(&self) -> usize {
        self.layers
            .first()
            .and_then(|l| l.as_ref())
            .map(|(k, _)| k.dims()[2])
            .unwrap_or(0)
    }

    /// Appends `k` and `v` (`[batch, kv_heads, new, head_dim]`) to `layer` along the sequence and
    /// returns everything cached for it. Panics never: a layer index past the end grows the cache.
    pub fn append(
        &mut self,
        layer: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> (Tensor<B, 4>, Tensor<B, 4>) {
        if layer >= self.layers.len() {
            self.layers.resize(layer + 1, None);
        }
        let merged = match self.layers[layer].take() {
            Some((pk, pv)) => (Tensor::cat(vec![pk, k], 2), Tensor::cat(vec![pv, v], 2)),
            None => (k, v),
        };
        self.layers[layer] = Some(merged.clone());
        merged
    }

    /// Stores `k` and `v` for `layer`, replacing what was there (cross-attention keys).
    pub fn set(&mut self, layer: usize, k: Tensor<B, 4>, v: Tensor<B, 4>) {
        if layer >= self.layers.len() {
            self.layers.resize(layer + 1, None);
        }
        self.layers[layer] = Some((k, v));
    }

    /// What is cached for `layer`.
    pub fn get(&self, layer: usize) -> Option<(Tensor<B, 4>, Tensor<B, 4>)> {
        self.layers.get(layer).and_then(|l| l.clone())
    }

    /// Keeps only the batch rows in `rows` (in that order), e.g. after some sequences finished.
    pub fn select_rows(&mut self, rows: &[usize]) {
        if rows.is_empty() {
            self.clear();
            return;
        }
        for layer in self.layers.iter_mut().flatten() {
            *layer = (
                select_rows(layer.0.clone(), rows),
                select_rows(layer.1.clone(), rows),
            );
        }
    }

    /// Puts `columns` zero positions before every layer's cached ones (a row of the batch that
    /// starts later than a newly admitted one; the caller masks them out).
    pub fn pad_front(&mut self, columns: usize) {
        if columns == 0 {
            return;
        }
        let pad = |t: Tensor<B, 4>| {
            let [b, h, _, d] = t.dims();
            let zeros = Tensor::<B, 4>::zeros([b, h, columns, d], &t.device()).cast(t.dtype());
            Tensor::cat(vec![zeros, t], 2)
        };
        for layer in self.layers.iter_mut().flatten() {
            *layer = (pad(layer.0.clone()), pad(layer.1.clone()));
        }
    }

    /// Drops the first `columns` cached positions of every layer (columns every row masks out).
    pub fn trim_front(&mut self, columns: usize) {
        if columns == 0 {
            return;
        }
        for layer in self.layers.iter_mut().flatten() {
            let keep = layer.0.dims()[2].saturating_sub(columns);
            let from = layer.0.dims()[2] - keep;
            *layer = (
                layer.0.clone().narrow(2, from, keep),
                layer.1.clone().narrow(2, from, keep),
            );
        }
    }

    /// Appends the rows of `other` (same layers, same cached length) after this cache's rows.
    pub fn append_rows(&mut self, other: KvCache<B>) {
        if other.layers.len() > self.layers.len() {
            self.layers.resize(other.layers.len(), None);
        }
        for (mine, theirs) in self.layers.iter_mut().zip(other.layers) {
            *mine = match (mine.take(), theirs) {
                (Some((k, v)), Some((ok, ov))) => {
                    Some((Tensor::cat(vec![k, ok], 0), Tensor::cat(vec![v, ov], 0)))
                }
                (mine, theirs) => mine.or(theirs),
            };
        }
    }

    /// Empties every layer.
    pub fn clear(&mut self) {
        self.layers.iter_mut().for_each(|l| *l = None);
    }
}

/// The batch rows `rows` of `t` (dimension 0), in that order.
pub fn select_rows<B: Backend, const D: usize>(t: Tensor<B, D>, rows: &[usize]) -> Tensor<B, D> {
    let idx = Tensor::<B, 1, burn::tensor::Int>::from_data(
        burn::tensor::TensorData::new(
            rows.iter().map(|&r| r as i64).collect::<Vec<_>>(),
            [rows.len()],
        ),
        &t.device(),
    );
    t.select(0, idx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;
    use burn_flex::Flex;

    /// One row, two heads, `s` positions of 4 values, all `v`.
    fn t(s: usize, v: f32) -> Tensor<Flex, 4> {
        Tensor::from_data(
            TensorData::new(vec![v; 2 * s * 4], [1, 2, s, 4]),
            &Default::default(),
        )
    }

    #[test]
    fn append_concatenates_along_the_sequence() {
        let mut cache = KvCache::new(2);
        assert_eq!(cache.seq_len(), 0);
        cache.append(0, t(3, 1.0), t(3, 2.0));
        let (k, v) = cache.append(0, t(1, 5.0), t(1, 6.0));
        assert_eq!(k.dims(), [1, 2, 4, 4]);
        assert_eq!(cache.seq_len(), 4);
        let kv: Vec<f32> = k.into_data().to_vec().unwrap();
        assert_eq!(kv[0], 1.0);
        assert_eq!(kv[12], 5.0);
        let vv: Vec<f32> = v.into_data().to_vec().unwrap();
        assert_eq!(vv[15], 6.0);
        assert!(cache.get(1).is_none());
    }

    #[test]
    fn rows_join_padded_in_front_and_leave_trimmed() {
        let mut a = KvCache::new(1);
        a.append(0, t(3, 1.0), t(3, 2.0));
        let mut b = KvCache::new(1);
        b.append(0, t(1, 7.0), t(1, 8.0));
        b.pad_front(2);
        a.append_rows(b);
        let (k, v) = a.get(0).unwrap();
        assert_eq!(k.dims(), [2, 2, 3, 4]);
        let kv: Vec<f32> = k.into_data().to_vec().unwrap();
        // Row 1, head 0: two zero positions, then its own.
        assert_eq!(
            &kv[24..36],
            &[0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 7.0, 7.0, 7.0, 7.0]
        );
        assert_eq!(v.into_data().to_vec::<f32>().unwrap()[0], 2.0);
        a.select_rows(&[1]);
        a.trim_front(2);
        let (k, _) = a.get(0).unwrap();
        assert_eq!(k.dims(), [1, 2, 1, 4]);
        assert!(k
            .into_data()
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .all(|&x| x == 7.0));
    }
}
