//! A backend-neutral description of a BERT-style transformer encoder (embeddings, post-norm
//! layers, optional pooler) as host weights in HF's layouts. Model crates build it from their
//! checkpoints (`ipfs_accelerate_bert::encoder_spec`); engines that do not run through burn (the
//! cuBLAS encoder of the `cuda` feature) consume it, so the weight-name table stays in the model
//! crate and the math of the block is written once in the engine.

use crate::{Error, Result};

/// The feed-forward activation of an encoder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EncoderActivation {
    /// Exact GELU (erf).
    Gelu,
    /// GELU with the tanh approximation.
    GeluTanh,
    /// `max(0, x)`.
    Relu,
}

/// A dense layer in HF's layout: `weight` is `[out, in]` row-major, `bias` is `[out]`.
#[derive(Debug, Clone, PartialEq)]
pub struct DenseWeights {
    /// Output features.
    pub out_features: usize,
    /// Input features.
    pub in_features: usize,
    /// `[out, in]` row-major.
    pub weight: Vec<f32>,
    /// `[out]`.
    pub bias: Vec<f32>,
}

impl DenseWeights {
    /// Checks that the buffers hold `[out, in]` and `[out]`; `name` says which layer.
    pub fn check(&self, name: &str, out_features: usize, in_features: usize) -> Result<()> {
        let shape_err = |what: &str, expected: Vec<usize>, len: usize| Error::ShapeMismatch {
            name: format!("{name}.{what}"),
            expected,
            actual: vec![len],
        };
        if self.out_features != out_features || self.in_features != in_features {
            return Err(Error::ShapeMismatch {
                name: format!("{name}.weight"),
                expected: vec![out_features, in_features],
                actual: vec![self.out_features, self.in_features],
            });
        }
        if self.weight.len() != out_features * in_features {
            return Err(shape_err(
                "weight",
                vec![out_features * in_features],
                self.weight.len(),
            ));
        }
        if self.bias.len() != out_features {
            return Err(shape_err("bias", vec![out_features], self.bias.len()));
        }
        Ok(())
    }
}

/// A layer norm's scale and shift.
#[derive(Debug, Clone, PartialEq)]
pub struct NormWeights {
    /// Scale, `[hidden]`.
    pub gamma: Vec<f32>,
    /// Shift, `[hidden]`.
    pub beta: Vec<f32>,
}

/// One post-norm encoder layer: self-attention, add & norm, feed-forward, add & norm.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderLayerWeights {
    /// Query projection.
    pub query: DenseWeights,
    /// Key projection.
    pub key: DenseWeights,
    /// Value projection.
    pub value: DenseWeights,
    /// Attention output projection.
    pub attention_output: DenseWeights,
    /// Norm after the attention residual.
    pub attention_norm: NormWeights,
    /// Feed-forward up projection.
    pub intermediate: DenseWeights,
    /// Feed-forward down projection.
    pub output: DenseWeights,
    /// Norm after the feed-forward residual.
    pub output_norm: NormWeights,
}

/// A BERT-style encoder: word + absolute position + token type embeddings, layer norm, post-norm
/// layers, and an optional `tanh(dense(h[:, 0]))` pooler.
#[derive(Debug, Clone, PartialEq)]
pub struct EncoderSpec {
    /// The family it came from (`bert`), for runners and messages.
    pub family: String,
    /// Hidden size.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// Feed-forward size.
    pub intermediate: usize,
    /// Layer norm epsilon.
    pub eps: f32,
    /// Feed-forward activation.
    pub activation: EncoderActivation,
    /// Vocabulary size (rows of `word_embeddings`).
    pub vocab: usize,
    /// Longest sequence (rows of `position_embeddings`).
    pub max_positions: usize,
    /// Segment types (rows of `token_type_embeddings`).
    pub type_vocab: usize,
    /// `[vocab, hidden]`.
    pub word_embeddings: Vec<f32>,
    /// `[max_positions, hidden]`.
    pub position_embeddings: Vec<f32>,
    /// `[type_vocab, hidden]`.
    pub token_type_embeddings: Vec<f32>,
    /// Norm after the embeddings.
    pub embedding_norm: NormWeights,
    /// The layers, in order.
    pub layers: Vec<EncoderLayerWeights>,
    /// The pooler's dense layer, when the checkpoint has one.
    pub pooler: Option<DenseWeights>,
}

impl EncoderSpec {
    /// Checks every size against the dimensions, naming the first buffer that does not fit.
    pub fn validate(&self) -> Result<()> {
        let (h, i) = (self.hidden, self.intermediate);
        let bad = |reason: String| {
            Err(Error::InvalidInput(format!(
                "{} encoder: {reason}",
                self.family
            )))
        };
        if h == 0 || self.heads == 0 || i == 0 || self.vocab == 0 || self.max_positions == 0 {
            return bad(
                "hidden, heads, intermediate, vocabulary and positions must be positive".into(),
            );
        }
        if !h.is_multiple_of(self.heads) {
            return bad(format!(
                "hidden size {h} is not divisible by {} heads",
                self.heads
            ));
        }
        if self.type_vocab == 0 {
            return bad("type_vocab must be positive".into());
        }
        for (name, v, rows) in [
            ("word_embeddings", &self.word_embeddings, self.vocab),
            (
                "position_embeddings",
                &self.position_embeddings,
                self.max_positions,
            ),
            (
                "token_type_embeddings",
                &self.token_type_embeddings,
                self.type_vocab,
            ),
        ] {
            if v.len() != rows * h {
                return Err(Error::ShapeMismatch {
                    name: format!("embeddings.{name}"),
                    expected: vec![rows, h],
                    actual: vec![v.len()],
                });
            }
        }
        let check_norm = |name: String, n: &NormWeights| {
            if n.gamma.len() != h || n.beta.len() != h {
                return Err(Error::ShapeMismatch {
                    name,
                    expected: vec![h],
                    actual: vec![n.gamma.len(), n.beta.len()],
                });
            }
            Ok(())
        };
        check_norm("embeddings.LayerNorm".into(), &self.embedding_norm)?;
        for (n, l) in self.layers.iter().enumerate() {
            let p = format!("layer.{n}");
            l.query.check(&format!("{p}.query"), h, h)?;
            l.key.check(&format!("{p}.key"), h, h)?;
            l.value.check(&format!("{p}.value"), h, h)?;
            l.attention_output
                .check(&format!("{p}.attention.output"), h, h)?;
            l.intermediate.check(&format!("{p}.intermediate"), i, h)?;
            l.output.check(&format!("{p}.output"), h, i)?;
            check_norm(format!("{p}.attention.LayerNorm"), &l.attention_norm)?;
            check_norm(format!("{p}.output.LayerNorm"), &l.output_norm)?;
        }
        if let Some(p) = &self.pooler {
            p.check("pooler.dense", h, h)?;
        }
        Ok(())
    }

    /// Size of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden / self.heads.max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(out: usize, inp: usize) -> DenseWeights {
        DenseWeights {
            out_features: out,
            in_features: inp,
            weight: vec![0.0; out * inp],
            bias: vec![0.0; out],
        }
    }

    fn norm(h: usize) -> NormWeights {
        NormWeights {
            gamma: vec![1.0; h],
            beta: vec![0.0; h],
        }
    }

    fn spec(h: usize, i: usize) -> EncoderSpec {
        EncoderSpec {
            family: "bert".into(),
            hidden: h,
            heads: 2,
            intermediate: i,
            eps: 1e-12,
            activation: EncoderActivation::Gelu,
            vocab: 5,
            max_positions: 4,
            type_vocab: 2,
            word_embeddings: vec![0.0; 5 * h],
            position_embeddings: vec![0.0; 4 * h],
            token_type_embeddings: vec![0.0; 2 * h],
            embedding_norm: norm(h),
            layers: vec![EncoderLayerWeights {
                query: dense(h, h),
                key: dense(h, h),
                value: dense(h, h),
                attention_output: dense(h, h),
                attention_norm: norm(h),
                intermediate: dense(i, h),
                output: dense(h, i),
                output_norm: norm(h),
            }],
            pooler: Some(dense(h, h)),
        }
    }

    #[test]
    fn a_consistent_spec_validates() {
        spec(8, 16).validate().unwrap();
    }

    #[test]
    fn a_misshaped_layer_is_named() {
        let mut s = spec(8, 16);
        s.layers[0].intermediate = dense(16, 4);
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("layer.0.intermediate.weight"), "{e}");
        let mut s = spec(8, 16);
        s.layers[0].output_norm.beta.pop();
        let e = s.validate().unwrap_err().to_string();
        assert!(e.contains("layer.0.output.LayerNorm"), "{e}");
    }

    #[test]
    fn heads_must_divide_hidden() {
        let mut s = spec(8, 16);
        s.heads = 3;
        assert!(s.validate().unwrap_err().to_string().contains("divisible"));
    }
}
