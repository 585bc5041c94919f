//! What a [`DecoderSpec`] means, executed in plain f64 loops on the host: the reference the
//! engines that run the spec are tested against, and the check that a family's spec computes its
//! HF logits (without a GPU). Slow by design; not an inference path.

use crate::decoder::{DecoderNorm, DecoderPositions, DecoderSpec, GatedActivation};
use crate::encoder::EncoderActivation;
use crate::encoder_reference::{dense, norm as layer_norm};
use crate::{Error, NormWeights, Result};

impl GatedActivation {
    /// The activation of `x`, in f64 (the reference's arithmetic).
    pub fn apply(self, x: f64) -> f64 {
        match self {
            GatedActivation::Silu => x / (1.0 + (-x).exp()),
            GatedActivation::Gelu => EncoderActivation::Gelu.apply(x),
            GatedActivation::GeluTanh => EncoderActivation::GeluTanh.apply(x),
            GatedActivation::Relu => x.max(0.0),
        }
    }
}

/// The encoder states a cross-attention reads, `[frames][width]`, and which frames are tokens
/// (1) or padding (0; every frame is a token without a mask).
#[derive(Debug, Clone, Copy)]
pub struct ReferenceMemory<'a> {
    /// The states.
    pub states: &'a [Vec<f64>],
    /// The padding mask, `[frames]`.
    pub mask: Option<&'a [i64]>,
}

/// Rotates one head in place at `pos` (HF's `rotate_half`: feature `i` pairs with `i + d / 2`).
fn rope(x: &mut [f64], inv_freq: &[f32], pos: usize) {
    let half = x.len() / 2;
    for i in 0..half {
        // The angle as HF computes it: position times frequency in f32.
        let a = f64::from(pos as f32 * inv_freq[i]);
        let (c, s) = (a.cos(), a.sin());
        let (x1, x2) = (x[i], x[i + half]);
        x[i] = x1 * c - x2 * s;
        x[i + half] = x2 * c + x1 * s;
    }
}

/// The attention output `[heads * head_dim]` of one query over `keys` / `values` (rows of
/// `kv_heads * head_dim`), grouped-query heads sharing a key / value head; scores times `scale`,
/// plus `bias(head, key index)`.
pub(crate) fn attend(
    q: &[f64],
    (keys, values): (&[&[f64]], &[&[f64]]),
    (heads, kv_heads): (usize, usize),
    scale: f64,
    bias: &dyn Fn(usize, usize) -> f64,
) -> Vec<f64> {
    let dh = q.len() / heads;
    let group = heads / kv_heads;
    let mut ctx = vec![0.0; q.len()];
    for h in 0..heads {
        let kvh = h / group;
        let qh = &q[h * dh..(h + 1) * dh];
        let scores: Vec<f64> = keys
            .iter()
            .enumerate()
            .map(|(j, k)| {
                let kh = &k[kvh * dh..(kvh + 1) * dh];
                let dot: f64 = qh.iter().zip(kh).map(|(a, b)| a * b).sum();
                dot * scale + bias(h, j)
            })
            .collect();
        let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let e: Vec<f64> = scores.iter().map(|v| (v - mx).exp()).collect();
        let z: f64 = e.iter().sum();
        for (w, v) in e.iter().zip(values) {
            for d in 0..dh {
                ctx[h * dh + d] += w / z * v[kvh * dh + d];
            }
        }
    }
    ctx
}

impl DecoderSpec {
    /// The spec's norm of one row.
    fn reference_norm(&self, n: &NormWeights, x: &[f64]) -> Vec<f64> {
        match self.norm {
            DecoderNorm::Layer => layer_norm(n, self.eps, x),
            DecoderNorm::Rms => {
                let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
                let inv = 1.0 / (ms + f64::from(self.eps)).sqrt();
                x.iter()
                    .zip(&n.gamma)
                    .map(|(v, g)| v * inv * f64::from(*g))
                    .collect()
            }
        }
    }

    /// The logits `[ids.len()][vocab]` of one unpadded row of token ids at positions 0, 1, ...:
    /// the head of [`DecoderSpec::reference_states`].
    pub fn reference_logits(
        &self,
        ids: &[i64],
        memory: Option<ReferenceMemory<'_>>,
    ) -> Result<Vec<Vec<f64>>> {
        self.reference_logits_replacing(ids, memory, &[])
    }

    /// [`DecoderSpec::reference_logits`] with the token embeddings of some positions replaced
    /// before any position embedding is added: `replaced` pairs a position with its `hidden`
    /// input values (LLaVA's image features).
    pub fn reference_logits_replacing(
        &self,
        ids: &[i64],
        memory: Option<ReferenceMemory<'_>>,
        replaced: &[(usize, &[f32])],
    ) -> Result<Vec<Vec<f64>>> {
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        Ok(self
            .states(ids, None, memory, replaced)?
            .iter()
            .map(|r| dense(head, r))
            .collect())
    }

    /// The final-normed states `[ids.len()][hidden]` of one row of token ids at positions 0, 1,
    /// ..., computed in f64 from the spec as written: keys whose `mask` is 0 are padding (no query
    /// sees them); `memory` is the encoder's states when the spec has cross-attention. Weights
    /// kept in ggml blocks are not read: such specs are refused.
    pub fn reference_states(
        &self,
        ids: &[i64],
        mask: Option<&[i64]>,
        memory: Option<ReferenceMemory<'_>>,
    ) -> Result<Vec<Vec<f64>>> {
        self.states(ids, mask, memory, &[])
    }

    /// [`DecoderSpec::reference_states`] with the input embeddings of the positions in
    /// `replaced` replaced.
    fn states(
        &self,
        ids: &[i64],
        mask: Option<&[i64]>,
        memory: Option<ReferenceMemory<'_>>,
        replaced: &[(usize, &[f32])],
    ) -> Result<Vec<Vec<f64>>> {
        self.validate()?;
        if let Some((p, v)) = replaced
            .iter()
            .find(|(p, v)| *p >= ids.len() || v.len() != self.hidden)
        {
            return Err(Error::InvalidInput(format!(
                "{} replacement values at position {p} of {} (hidden size {})",
                v.len(),
                ids.len(),
                self.hidden
            )));
        }
        if self.dense_layers().any(|d| d.blocks.is_some()) {
            return Err(Error::InvalidInput(
                "the reference reads f32 weights, not ggml blocks".into(),
            ));
        }
        if ids.len() > self.max_positions {
            return Err(Error::InvalidInput(format!(
                "{} tokens exceed the decoder's {} positions",
                ids.len(),
                self.max_positions
            )));
        }
        if mask.is_some_and(|m| m.len() != ids.len()) {
            return Err(Error::InvalidInput(
                "a mask of another length than the ids".into(),
            ));
        }
        let memory = match (self.memory_width(), memory) {
            (None, _) => None,
            (Some(w), Some(m))
                if !m.states.is_empty()
                    && m.states.iter().all(|r| r.len() == w)
                    && m.mask.is_none_or(|k| k.len() == m.states.len()) =>
            {
                Some(m)
            }
            (Some(w), _) => {
                return Err(Error::InvalidInput(format!(
                    "the decoder's cross-attention needs encoder states of width {w}"
                )))
            }
        };
        let token = |mask: Option<&[i64]>, j: usize| mask.is_none_or(|m| m[j] != 0);
        let h = self.hidden;
        let mut x: Vec<Vec<f64>> = Vec::with_capacity(ids.len());
        for (p, &t) in ids.iter().enumerate() {
            let t = usize::try_from(t)
                .ok()
                .filter(|&t| t < self.vocab)
                .ok_or_else(|| {
                    Error::InvalidInput(format!("token {t} is outside the vocabulary"))
                })?;
            let input = match replaced.iter().find(|(q, _)| *q == p) {
                Some((_, values)) => values,
                None => &self.embed.weight[t * h..(t + 1) * h],
            };
            let mut row: Vec<f64> = input.iter().map(|&v| v.into()).collect();
            if let DecoderPositions::Learned(table) = &self.positions {
                for (a, b) in row.iter_mut().zip(&table[p * h..(p + 1) * h]) {
                    *a += f64::from(*b);
                }
            }
            x.push(row);
        }
        let n = ids.len();
        let relative = self.relative();
        for l in &self.layers {
            let normed: Vec<Vec<f64>> = x
                .iter()
                .map(|r| self.reference_norm(&l.input_norm, r))
                .collect();
            let mut q: Vec<Vec<f64>> = normed.iter().map(|r| dense(&l.query, r)).collect();
            let mut k: Vec<Vec<f64>> = normed.iter().map(|r| dense(&l.key, r)).collect();
            let v: Vec<Vec<f64>> = normed.iter().map(|r| dense(&l.value, r)).collect();
            if let Some(r) = self.rotary() {
                for (p, (qr, kr)) in q.iter_mut().zip(k.iter_mut()).enumerate() {
                    qr.chunks_mut(self.head_dim)
                        .for_each(|hd| rope(hd, &r.inv_freq, p));
                    kr.chunks_mut(self.head_dim)
                        .for_each(|hd| rope(hd, &r.inv_freq, p));
                }
            }
            // The cross-attention's keys and values (of the memory's tokens), once for every
            // position.
            let cross_kv = match (&l.cross, memory) {
                (Some(c), Some(m)) => {
                    let kept = || {
                        m.states
                            .iter()
                            .enumerate()
                            .filter(|(j, _)| token(m.mask, *j))
                            .map(|(_, r)| r)
                    };
                    Some((
                        kept().map(|r| dense(&c.key, r)).collect::<Vec<_>>(),
                        kept().map(|r| dense(&c.value, r)).collect::<Vec<_>>(),
                    ))
                }
                _ => None,
            };
            for (p, xr) in x.iter_mut().enumerate() {
                let first = l.window.map_or(0, |w| (p + 1).saturating_sub(w));
                let last = if self.causal { p } else { n - 1 };
                let seen: Vec<usize> = (first..=last).filter(|&j| token(mask, j)).collect();
                let keys: Vec<&[f64]> = seen.iter().map(|&j| k[j].as_slice()).collect();
                let values: Vec<&[f64]> = seen.iter().map(|&j| v[j].as_slice()).collect();
                let bias = |head: usize, at: usize| match relative {
                    Some(r) => {
                        let bucket = r.bucket(seen[at] as i64 - p as i64);
                        f64::from(r.table[bucket * self.heads + head])
                    }
                    None => 0.0,
                };
                let heads = (self.heads, self.kv_heads);
                let ctx = attend(&q[p], (&keys, &values), heads, self.score_scale, &bias);
                for (a, b) in xr.iter_mut().zip(dense(&l.output, &ctx)) {
                    *a += b;
                }
                if let (Some(c), Some((ck, cv))) = (&l.cross, &cross_kv) {
                    let cq = dense(&c.query, &self.reference_norm(&c.norm, xr));
                    let keys: Vec<&[f64]> = ck.iter().map(Vec::as_slice).collect();
                    let values: Vec<&[f64]> = cv.iter().map(Vec::as_slice).collect();
                    let heads = (self.heads, self.heads);
                    let ctx = attend(&cq, (&keys, &values), heads, self.score_scale, &|_, _| 0.0);
                    for (a, b) in xr.iter_mut().zip(dense(&c.output, &ctx)) {
                        *a += b;
                    }
                }
                let n2 = self.reference_norm(&l.post_norm, xr);
                let up = dense(&l.up, &n2);
                let act: Vec<f64> = match &l.gate {
                    Some(gate) => dense(gate, &n2)
                        .iter()
                        .zip(&up)
                        .map(|(g, u)| self.activation.apply(*g) * u)
                        .collect(),
                    None => up.iter().map(|u| self.activation.apply(*u)).collect(),
                };
                for (a, b) in xr.iter_mut().zip(dense(&l.down, &act)) {
                    *a += b;
                }
            }
        }
        Ok(x.iter()
            .map(|r| self.reference_norm(&self.final_norm, r))
            .collect())
    }
}
