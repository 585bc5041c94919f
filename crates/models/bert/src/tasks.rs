//! Post-processing: sentence pooling, label probabilities, question-answering spans.

use std::path::Path;

use burn::tensor::{backend::Backend, Int, Tensor};
use ipfs_accelerate_core::{Error, Result};

/// sentence-transformers pooling modes (`1_Pooling/config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// Mean over the tokens the attention mask keeps.
    Mean,
    /// The first (`[CLS]`) token.
    Cls,
    /// Element-wise max over kept tokens.
    Max,
    /// Sum over kept tokens divided by sqrt(token count).
    MeanSqrtLen,
}

impl Pooling {
    /// Reads sentence-transformers' pooling config (`1_Pooling/config.json`).
    pub fn from_config_file(path: &Path) -> Result<Pooling> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_config_json(&text, path)
    }

    /// Parses sentence-transformers' pooling config; mean pooling when it enables no mode.
    pub fn from_config_json(text: &str, origin: &Path) -> Result<Pooling> {
        let v: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::config(origin, e.to_string()))?;
        let on = |k: &str| v.get(k).and_then(|x| x.as_bool()).unwrap_or(false);
        Ok(if on("pooling_mode_cls_token") {
            Pooling::Cls
        } else if on("pooling_mode_max_tokens") {
            Pooling::Max
        } else if on("pooling_mode_mean_sqrt_len_tokens") {
            Pooling::MeanSqrtLen
        } else {
            Pooling::Mean
        })
    }

    /// Pools `hidden` `[batch, seq, dim]` under `mask` `[batch, seq]` into `[batch, dim]`.
    pub fn pool<B: Backend>(self, hidden: Tensor<B, 3>, mask: Tensor<B, 2, Int>) -> Tensor<B, 2> {
        let [b, s, d] = hidden.dims();
        let m: Tensor<B, 3> = mask.float().unsqueeze_dim(2);
        match self {
            Pooling::Cls => hidden.narrow(1, 0, 1).reshape([b, d]),
            Pooling::Mean | Pooling::MeanSqrtLen => {
                let sum: Tensor<B, 2> = (hidden * m.clone()).sum_dim(1).reshape([b, d]);
                let count: Tensor<B, 2> = m.sum_dim(1).reshape([b, 1]).clamp_min(1e-9);
                if self == Pooling::Mean {
                    sum / count
                } else {
                    sum / count.sqrt()
                }
            }
            Pooling::Max => {
                let masked = hidden.mask_fill(m.equal_elem(0.0).expand([b, s, d]), -1e9);
                masked.max_dim(1).reshape([b, d])
            }
        }
    }
}

impl Pooling {
    /// [`pool`](Self::pool) on host values, for engines that return the encoder output to the
    /// host (ONNX Runtime): `hidden` is `[batch, seq, dim]` row-major, `mask` `[batch, seq]`;
    /// one vector per row, L2-normalised (eps 1e-12) when `normalize`.
    pub fn pool_host(
        self,
        hidden: &[f32],
        mask: &[i64],
        batch: usize,
        seq: usize,
        normalize: bool,
    ) -> Vec<Vec<f32>> {
        let dim = hidden.len() / (batch * seq).max(1);
        (0..batch)
            .map(|b| {
                let token = |t: usize| &hidden[(b * seq + t) * dim..(b * seq + t + 1) * dim];
                let kept: Vec<usize> = (0..seq).filter(|&t| mask[b * seq + t] != 0).collect();
                let mut v = match self {
                    Pooling::Cls => token(0).to_vec(),
                    Pooling::Mean | Pooling::MeanSqrtLen => {
                        let mut sum = vec![0f32; dim];
                        for &t in &kept {
                            sum.iter_mut().zip(token(t)).for_each(|(s, x)| *s += x);
                        }
                        let count = (kept.len() as f32).max(1e-9);
                        let div = if self == Pooling::Mean {
                            count
                        } else {
                            count.sqrt()
                        };
                        sum.iter().map(|s| s / div).collect()
                    }
                    Pooling::Max => (0..dim)
                        .map(|d| {
                            (0..seq)
                                .map(|t| {
                                    if mask[b * seq + t] != 0 {
                                        token(t)[d]
                                    } else {
                                        -1e9
                                    }
                                })
                                .fold(f32::NEG_INFINITY, f32::max)
                        })
                        .collect(),
                };
                if normalize {
                    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(1e-12);
                    v.iter_mut().for_each(|x| *x /= norm);
                }
                v
            })
            .collect()
    }
}

/// L2-normalises each row (as sentence-transformers' `Normalize` module, eps 1e-12).
pub fn l2_normalize<B: Backend>(x: Tensor<B, 2>) -> Tensor<B, 2> {
    let norm = x.clone().powi_scalar(2).sum_dim(1).sqrt().clamp_min(1e-12);
    x / norm
}

pub use ipfs_accelerate_core::softmax;

/// The best answer span of question answering.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Span {
    /// First token of the answer.
    pub start: usize,
    /// Last token of the answer (inclusive).
    pub end: usize,
    /// p(start) · p(end), the probabilities taken over the allowed tokens (HF's pipeline score).
    pub score: f32,
}

/// HF's question-answering decoding: softmax over the allowed (context) tokens of start and end
/// logits, then the pair `start ≤ end < start + max_answer_len` with the largest `p(start)·p(end)`.
pub fn best_span(
    start_logits: &[f32],
    end_logits: &[f32],
    allowed: &[bool],
    max_answer_len: usize,
) -> Option<Span> {
    let masked = |l: &[f32]| -> Vec<f32> {
        l.iter()
            .zip(allowed)
            .map(|(&v, &ok)| if ok { v } else { -10000.0 })
            .collect()
    };
    let ps = softmax(&masked(start_logits));
    let pe = softmax(&masked(end_logits));
    let mut best: Option<Span> = None;
    for s in (0..ps.len()).filter(|&i| allowed[i]) {
        for e in (s..pe.len().min(s + max_answer_len)).filter(|&j| allowed[j]) {
            let score = ps[s] * pe[e];
            if best.as_ref().is_none_or(|b| score > b.score) {
                best = Some(Span {
                    start: s,
                    end: e,
                    score,
                });
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn span_respects_allowed_tokens_and_length() {
        let start = [9.0, 1.0, 5.0, 0.0, 0.0];
        let end = [9.0, 0.0, 3.0, 6.0, 0.0];
        let allowed = [false, true, true, true, true];
        let s = best_span(&start, &end, &allowed, 15).unwrap();
        assert_eq!((s.start, s.end), (2, 3));
        let s = best_span(&start, &end, &allowed, 1).unwrap();
        assert_eq!((s.start, s.end), (2, 2));
        assert!(best_span(&start, &end, &[false; 5], 15).is_none());
    }
}
