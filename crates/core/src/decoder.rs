//! A backend-neutral description of a causal decoder LM trunk (LLaMA, Qwen2 and the decoders
//! shaped like them) as host weights in HF's layouts: token embedding, pre-norm layers of RoPE
//! grouped-query attention and a gated MLP, RMSNorm, and the language-model head (tied to the
//! embedding or its own). Model crates build it from their checkpoints
//! (`ipfs_accelerate_llama::decoder_spec`); engines that do not run through burn (the cuBLAS
//! engine of the `cuda` feature) execute it, so the weight-name table stays in the model crate.

use crate::{DenseWeights, Error, Result};

/// The activation of a gated MLP: `down(act(gate(x)) * up(x))`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatedActivation {
    /// `x * sigmoid(x)` (LLaMA, Qwen2, Mistral).
    Silu,
    /// GELU with the tanh approximation (Gemma).
    GeluTanh,
    /// Exact GELU (erf).
    Gelu,
}

/// Rotary position embeddings as the engine applies them: `x * cos + rotate_half(x) * sin` on
/// whole heads, with angles `position * inv_freq[i]` (HF's `rotate_half` layout: feature `i` pairs
/// with `i + head_dim / 2`).
#[derive(Debug, Clone, PartialEq)]
pub struct RotarySpec {
    /// `head_dim / 2` inverse frequencies, scaling (linear, llama3) already applied.
    pub inv_freq: Vec<f32>,
    /// With dynamic NTK scaling the frequencies change once a sequence passes this many
    /// positions; an engine refuses longer sequences. `None`: they never change.
    pub valid_positions: Option<usize>,
}

/// One decoder layer: `x += o(attn(rope(q(n1(x))), rope(k(n1(x))), v(n1(x))))`, then
/// `x += down(act(gate(n2(x))) * up(n2(x)))`, with RMSNorms `n1`, `n2`.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderLayerWeights {
    /// RMSNorm scale before attention, `[hidden]`.
    pub input_norm: Vec<f32>,
    /// Query projection, `[heads * head_dim, hidden]` (zero bias when the checkpoint has none).
    pub query: DenseWeights,
    /// Key projection, `[kv_heads * head_dim, hidden]`.
    pub key: DenseWeights,
    /// Value projection, `[kv_heads * head_dim, hidden]`.
    pub value: DenseWeights,
    /// Output projection, `[hidden, heads * head_dim]`.
    pub output: DenseWeights,
    /// RMSNorm scale before the MLP, `[hidden]`.
    pub post_norm: Vec<f32>,
    /// Gate projection, `[intermediate, hidden]`.
    pub gate: DenseWeights,
    /// Up projection, `[intermediate, hidden]`.
    pub up: DenseWeights,
    /// Down projection, `[hidden, intermediate]`.
    pub down: DenseWeights,
    /// Sliding-window attention: a query sees the last `window` columns (itself included).
    pub window: Option<usize>,
}

/// A causal decoder LM: what an engine needs to run prefill and cached decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderSpec {
    /// The family it was read from (`llama`, `qwen2`), for messages.
    pub family: String,
    /// Vocabulary size.
    pub vocab: usize,
    /// Hidden size.
    pub hidden: usize,
    /// Query heads.
    pub heads: usize,
    /// Key / value heads (divides `heads`).
    pub kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// MLP inner size.
    pub intermediate: usize,
    /// RMSNorm epsilon.
    pub eps: f32,
    /// Longest context the checkpoint supports.
    pub max_positions: usize,
    /// The MLP's gate activation.
    pub activation: GatedActivation,
    /// Rotary embeddings.
    pub rotary: RotarySpec,
    /// Token embedding `[vocab, hidden]` (its bias is zeros; the LM head too when `lm_head` is
    /// `None`).
    pub embed: DenseWeights,
    /// The layers.
    pub layers: Vec<DecoderLayerWeights>,
    /// Final RMSNorm scale, `[hidden]`.
    pub final_norm: Vec<f32>,
    /// The LM head `[vocab, hidden]`; `None` when it is the token embedding (tied).
    pub lm_head: Option<DenseWeights>,
}

impl DecoderSpec {
    /// Checks every size and buffer against the header fields.
    pub fn validate(&self) -> Result<()> {
        let bad = |reason: String| {
            Err(Error::InvalidInput(format!(
                "{} decoder: {reason}",
                self.family
            )))
        };
        let (h, dh) = (self.hidden, self.head_dim);
        if h == 0 || self.heads == 0 || self.kv_heads == 0 || dh == 0 || self.intermediate == 0 {
            return bad(
                "hidden, heads, kv heads, head size and intermediate must be positive".into(),
            );
        }
        if self.vocab == 0 || self.max_positions == 0 {
            return bad("vocabulary and positions must be positive".into());
        }
        if !self.heads.is_multiple_of(self.kv_heads) {
            return bad(format!(
                "{} query heads are not a multiple of {} key / value heads",
                self.heads, self.kv_heads
            ));
        }
        if !dh.is_multiple_of(2) || self.rotary.inv_freq.len() != dh / 2 {
            return bad(format!(
                "{} rotary frequencies for heads of {dh} (an even size, half as many frequencies)",
                self.rotary.inv_freq.len()
            ));
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return bad(format!(
                "RMSNorm epsilon {} is not a non-negative number",
                self.eps
            ));
        }
        let check_len = |name: String, v: &[f32], expected: Vec<usize>| {
            if v.len() != expected.iter().product::<usize>() {
                return Err(Error::ShapeMismatch {
                    name,
                    expected,
                    actual: vec![v.len()],
                });
            }
            Ok(())
        };
        self.embed.check("embed_tokens", self.vocab, h)?;
        check_len("norm.weight".into(), &self.final_norm, vec![h])?;
        if let Some(head) = &self.lm_head {
            head.check("lm_head", self.vocab, h)?;
        }
        let (q, kv) = (self.heads * dh, self.kv_heads * dh);
        for (i, l) in self.layers.iter().enumerate() {
            let p = format!("layers.{i}");
            check_len(
                format!("{p}.input_layernorm.weight"),
                &l.input_norm,
                vec![h],
            )?;
            check_len(
                format!("{p}.post_attention_layernorm.weight"),
                &l.post_norm,
                vec![h],
            )?;
            l.query.check(&format!("{p}.self_attn.q_proj"), q, h)?;
            l.key.check(&format!("{p}.self_attn.k_proj"), kv, h)?;
            l.value.check(&format!("{p}.self_attn.v_proj"), kv, h)?;
            l.output.check(&format!("{p}.self_attn.o_proj"), h, q)?;
            l.gate
                .check(&format!("{p}.mlp.gate_proj"), self.intermediate, h)?;
            l.up.check(&format!("{p}.mlp.up_proj"), self.intermediate, h)?;
            l.down
                .check(&format!("{p}.mlp.down_proj"), h, self.intermediate)?;
            if l.window == Some(0) {
                return bad(format!("layer {i} has a sliding window of 0 positions"));
            }
        }
        if self.layers.is_empty() {
            return bad("no layers".into());
        }
        Ok(())
    }

    /// Bytes of the weights as f32 (the tied head counted once).
    pub fn float_bytes(&self) -> usize {
        let dense = |d: &DenseWeights| d.out_features * d.in_features + d.bias.len();
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                l.input_norm.len()
                    + l.post_norm.len()
                    + [
                        &l.query, &l.key, &l.value, &l.output, &l.gate, &l.up, &l.down,
                    ]
                    .iter()
                    .map(|d| dense(d))
                    .sum::<usize>()
            })
            .sum();
        4 * (self.embed.out_features * self.embed.in_features
            + self.final_norm.len()
            + layers
            + self.lm_head.as_ref().map_or(0, dense))
    }

    /// Every dense layer: the embedding, each layer's seven projections, the head when untied.
    pub fn dense_layers(&self) -> impl Iterator<Item = &DenseWeights> {
        std::iter::once(&self.embed)
            .chain(self.layers.iter().flat_map(|l| {
                [
                    &l.query, &l.key, &l.value, &l.output, &l.gate, &l.up, &l.down,
                ]
            }))
            .chain(self.lm_head.as_ref())
    }

    /// Bytes of the weights as stored: ggml blocks as the file has them, f32 otherwise (norms
    /// and biases in f32).
    pub fn stored_bytes(&self) -> usize {
        let norms: usize = self
            .layers
            .iter()
            .map(|l| l.input_norm.len() + l.post_norm.len())
            .sum::<usize>()
            + self.final_norm.len();
        4 * norms
            + self
                .dense_layers()
                .map(DenseWeights::stored_bytes)
                .sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(out: usize, inp: usize) -> DenseWeights {
        DenseWeights::new(out, inp, vec![0.5; out * inp], vec![0.0; out])
    }

    fn tiny() -> DecoderSpec {
        let (h, dh, heads, kv, inter) = (8, 4, 2, 1, 12);
        DecoderSpec {
            family: "llama".into(),
            vocab: 5,
            hidden: h,
            heads,
            kv_heads: kv,
            head_dim: dh,
            intermediate: inter,
            eps: 1e-6,
            max_positions: 16,
            activation: GatedActivation::Silu,
            rotary: RotarySpec {
                inv_freq: vec![1.0, 0.01],
                valid_positions: None,
            },
            embed: DenseWeights::new(5, h, vec![0.1; 5 * h], vec![0.0; 5]),
            layers: vec![DecoderLayerWeights {
                input_norm: vec![1.0; h],
                query: dense(heads * dh, h),
                key: dense(kv * dh, h),
                value: dense(kv * dh, h),
                output: dense(h, heads * dh),
                post_norm: vec![1.0; h],
                gate: dense(inter, h),
                up: dense(inter, h),
                down: dense(h, inter),
                window: None,
            }],
            final_norm: vec![1.0; h],
            lm_head: None,
        }
    }

    #[test]
    fn a_consistent_spec_validates_and_counts_its_bytes() {
        let s = tiny();
        s.validate().unwrap();
        let layer =
            8 + 8 + (8 * 8 + 8) + 2 * (4 * 8 + 4) + (8 * 8 + 8) + 2 * (12 * 8 + 12) + (8 * 12 + 8);
        assert_eq!(s.float_bytes(), 4 * (5 * 8 + 8 + layer));
    }

    #[test]
    fn inconsistent_specs_name_what_is_wrong() {
        let mut s = tiny();
        s.kv_heads = 3;
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("multiple of 3"));
        let mut s = tiny();
        s.rotary.inv_freq.push(0.5);
        assert!(s.validate().unwrap_err().to_string().contains("rotary"));
        let mut s = tiny();
        s.layers[0].key = dense(8, 8);
        assert!(s.validate().unwrap_err().to_string().contains("k_proj"));
        let mut s = tiny();
        s.embed.weight.pop();
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("embed_tokens"));
        let mut s = tiny();
        s.layers[0].window = Some(0);
        assert!(s.validate().unwrap_err().to_string().contains("window"));
    }
}
