//! A backend-neutral description of a pre-norm decoder trunk as host weights in HF's layouts:
//! token embedding (plus learned positions, or RoPE inside attention), layers of causal
//! grouped-query self-attention, cross-attention over an encoder's states (Whisper), a gated
//! (LLaMA, Qwen2) or plain (Whisper) MLP, RMSNorm or LayerNorm, and the language-model head (tied
//! to the embedding or its own). Model crates build it from their checkpoints
//! (`ipfs_accelerate_llama::decoder_spec`, `ipfs_accelerate_whisper::decoder_spec`); engines that
//! do not run through burn (the cuBLAS engine of the `cuda` feature) execute it, so the
//! weight-name table stays in the model crate. [`DecoderSpec::reference_logits`] executes it in
//! f64 as written: the definition every engine is tested against.

use crate::{DenseWeights, Error, NormWeights, Result};

/// The activation of the MLP: `down(act(gate(x)) * up(x))` when gated, `down(act(up(x)))` when
/// not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GatedActivation {
    /// `x * sigmoid(x)` (LLaMA, Qwen2, Mistral).
    Silu,
    /// GELU with the tanh approximation (Gemma).
    GeluTanh,
    /// Exact GELU (erf).
    Gelu,
    /// `max(x, 0)` (T5).
    Relu,
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

/// How the decoder normalises ([`NormWeights`]: an RMSNorm has no `beta`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoderNorm {
    /// `x / rms(x) * gamma` (LLaMA, Qwen2; HF rounds `x / rms(x)` to the storage type first).
    Rms,
    /// `(x - mean) / std * gamma + beta` (Whisper).
    Layer,
}

/// Where positions enter the decoder.
#[derive(Debug, Clone, PartialEq)]
pub enum DecoderPositions {
    /// Rotary embeddings of queries and keys (LLaMA, Qwen2).
    Rotary(RotarySpec),
    /// A learned table `[max_positions, hidden]` added to the token embeddings (Whisper).
    Learned(Vec<f32>),
    /// A learned bias of each head per bucket of relative distance, added to the self-attention's
    /// scores (T5).
    Relative(RelativeBias),
}

/// T5's relative position bias: `table[bucket(key − query), head]` is added to the score of a
/// query and a key (Mesh-TensorFlow's log-spaced buckets, [`relative_position_bucket`]).
#[derive(Debug, Clone, PartialEq)]
pub struct RelativeBias {
    /// `[buckets, heads]` (HF's `relative_attention_bias.weight`).
    pub table: Vec<f32>,
    /// Buckets.
    pub buckets: usize,
    /// Distances from which every distance shares the last bucket.
    pub max_distance: usize,
    /// Whether keys after the query get buckets of their own (an encoder) or share bucket 0.
    pub bidirectional: bool,
}

impl RelativeBias {
    /// The bucket of `relative_position` (key position − query position).
    pub fn bucket(&self, relative_position: i64) -> usize {
        relative_position_bucket(
            relative_position,
            self.bidirectional,
            self.buckets,
            self.max_distance,
        )
    }
}

/// The bucket of `relative_position` (= key position − query position), as HF's
/// `T5Attention._relative_position_bucket`: with `bidirectional` half of the buckets hold keys after
/// the query; otherwise keys after the query all fall in bucket 0. Half of the (remaining) buckets
/// are exact small distances, the rest log-spaced distances up to `max_distance`, beyond which all
/// distances share the last bucket. The logarithm is taken in f32, as PyTorch does.
pub fn relative_position_bucket(
    relative_position: i64,
    bidirectional: bool,
    num_buckets: usize,
    max_distance: usize,
) -> usize {
    let mut num_buckets = num_buckets as i64;
    let mut bucket = 0i64;
    let distance = if bidirectional {
        num_buckets /= 2;
        if relative_position > 0 {
            bucket += num_buckets;
        }
        relative_position.abs()
    } else {
        -relative_position.min(0)
    };
    let max_exact = num_buckets / 2;
    if distance < max_exact {
        bucket += distance;
    } else {
        // f32 arithmetic in PyTorch's order: log(d / max_exact) / log(max_distance / max_exact) * n.
        let ratio = distance as f32 / max_exact as f32;
        let denom = (max_distance as f64 / max_exact as f64).ln() as f32;
        let scaled = ratio.ln() / denom * (num_buckets - max_exact) as f32;
        let large = max_exact + scaled as i64;
        bucket += large.min(num_buckets - 1);
    }
    bucket.max(0) as usize
}

/// Cross-attention over an encoder's states (the decoder's "memory"), between the layer's
/// self-attention and its MLP: `x += o(attn(q(n(x)), k(m), v(m)))`, every query seeing every
/// state. Keys and values are computed once per request.
#[derive(Debug, Clone, PartialEq)]
pub struct CrossAttentionWeights {
    /// The norm before it.
    pub norm: NormWeights,
    /// Query projection, `[heads * head_dim, hidden]`.
    pub query: DenseWeights,
    /// Key projection, `[heads * head_dim, memory width]`.
    pub key: DenseWeights,
    /// Value projection, `[heads * head_dim, memory width]`.
    pub value: DenseWeights,
    /// Output projection, `[hidden, heads * head_dim]`.
    pub output: DenseWeights,
}

/// One decoder layer: `x += o(attn(rope(q(n1(x))), rope(k(n1(x))), v(n1(x))))`, then the
/// cross-attention when there is one, then `x += down(act(gate(n2(x))) * up(n2(x)))` (or
/// `down(act(up(n2(x))))` without a gate), with norms `n1`, `n2` of [`DecoderSpec::norm`].
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderLayerWeights {
    /// The norm before self-attention.
    pub input_norm: NormWeights,
    /// Query projection, `[heads * head_dim, hidden]` (zero bias when the checkpoint has none).
    pub query: DenseWeights,
    /// Key projection, `[kv_heads * head_dim, hidden]`.
    pub key: DenseWeights,
    /// Value projection, `[kv_heads * head_dim, hidden]`.
    pub value: DenseWeights,
    /// Output projection, `[hidden, heads * head_dim]`.
    pub output: DenseWeights,
    /// Cross-attention over the encoder's states (every layer of a decoder has one, or none).
    pub cross: Option<CrossAttentionWeights>,
    /// The norm before the MLP.
    pub post_norm: NormWeights,
    /// Gate projection, `[intermediate, hidden]`; `None`: a plain MLP.
    pub gate: Option<DenseWeights>,
    /// Up projection, `[intermediate, hidden]`.
    pub up: DenseWeights,
    /// Down projection, `[hidden, intermediate]`.
    pub down: DenseWeights,
    /// Sliding-window attention: a query sees the last `window` columns (itself included).
    pub window: Option<usize>,
}

/// A decoder LM: what an engine needs to run prefill and cached decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct DecoderSpec {
    /// The family it was read from (`llama`, `qwen2`, `whisper`), for messages.
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
    /// Whether a query sees only the columns up to its own (a decoder) or every column of its row
    /// (an encoder stack run on a decoder engine: T5's encoder).
    pub causal: bool,
    /// What scores are multiplied by: `1 / sqrt(head_dim)`, or 1 for T5 (folded into its weights).
    pub score_scale: f64,
    /// The norms' kind.
    pub norm: DecoderNorm,
    /// The norms' epsilon.
    pub eps: f32,
    /// Longest context the checkpoint supports.
    pub max_positions: usize,
    /// The MLP's activation.
    pub activation: GatedActivation,
    /// Rotary or learned positions.
    pub positions: DecoderPositions,
    /// Token embedding `[vocab, hidden]` (its bias is zeros; the LM head too when `lm_head` is
    /// `None`).
    pub embed: DenseWeights,
    /// The layers.
    pub layers: Vec<DecoderLayerWeights>,
    /// The norm before the head.
    pub final_norm: NormWeights,
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
        match &self.positions {
            DecoderPositions::Rotary(r) => {
                if !dh.is_multiple_of(2) || r.inv_freq.len() != dh / 2 {
                    return bad(format!(
                        "{} rotary frequencies for heads of {dh} (an even size, half as many \
                         frequencies)",
                        r.inv_freq.len()
                    ));
                }
            }
            DecoderPositions::Learned(table) => check_len(
                "embed_positions.weight".into(),
                table,
                vec![self.max_positions, h],
            )?,
            DecoderPositions::Relative(r) => {
                if r.buckets < 2 || r.max_distance == 0 {
                    return bad(format!(
                        "{} relative buckets up to distance {} (at least 2 and 1)",
                        r.buckets, r.max_distance
                    ));
                }
                check_len(
                    "relative_attention_bias.weight".into(),
                    &r.table,
                    vec![r.buckets, self.heads],
                )?;
            }
        }
        if !(self.score_scale.is_finite() && self.score_scale > 0.0) {
            return bad(format!("score scale {} is not positive", self.score_scale));
        }
        if !(self.eps.is_finite() && self.eps >= 0.0) {
            return bad(format!(
                "norm epsilon {} is not a non-negative number",
                self.eps
            ));
        }
        let norm = |name: String, n: &NormWeights| -> Result<()> {
            check_len(format!("{name}.weight"), &n.gamma, vec![h])?;
            match self.norm {
                DecoderNorm::Layer => check_len(format!("{name}.bias"), &n.beta, vec![h]),
                DecoderNorm::Rms if n.beta.is_empty() => Ok(()),
                DecoderNorm::Rms => Err(Error::InvalidInput(format!(
                    "{} decoder: {name} is an RMSNorm with a bias",
                    self.family
                ))),
            }
        };
        self.embed.check("embed_tokens", self.vocab, h)?;
        norm("norm".into(), &self.final_norm)?;
        if let Some(head) = &self.lm_head {
            head.check("lm_head", self.vocab, h)?;
        }
        let (q, kv) = (self.heads * dh, self.kv_heads * dh);
        let memory = self.memory_width();
        for (i, l) in self.layers.iter().enumerate() {
            let p = format!("layers.{i}");
            norm(format!("{p}.input_layernorm"), &l.input_norm)?;
            norm(format!("{p}.post_attention_layernorm"), &l.post_norm)?;
            l.query.check(&format!("{p}.self_attn.q_proj"), q, h)?;
            l.key.check(&format!("{p}.self_attn.k_proj"), kv, h)?;
            l.value.check(&format!("{p}.self_attn.v_proj"), kv, h)?;
            l.output.check(&format!("{p}.self_attn.o_proj"), h, q)?;
            match (&l.cross, memory) {
                (Some(c), Some(m)) => {
                    norm(format!("{p}.encoder_attn_layer_norm"), &c.norm)?;
                    c.query.check(&format!("{p}.encoder_attn.q_proj"), q, h)?;
                    c.key.check(&format!("{p}.encoder_attn.k_proj"), q, m)?;
                    c.value.check(&format!("{p}.encoder_attn.v_proj"), q, m)?;
                    c.output.check(&format!("{p}.encoder_attn.o_proj"), h, q)?;
                }
                (None, None) => {}
                _ => return bad("some layers have cross-attention and others not".into()),
            }
            if let Some(gate) = &l.gate {
                gate.check(&format!("{p}.mlp.gate_proj"), self.intermediate, h)?;
            }
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
        if self.layers.iter().any(|l| l.gate.is_some() != self.gated()) {
            return bad("some layers have a gated MLP and others not".into());
        }
        Ok(())
    }

    /// The width of the encoder states the cross-attention reads; `None` without
    /// cross-attention.
    pub fn memory_width(&self) -> Option<usize> {
        self.layers
            .first()
            .and_then(|l| l.cross.as_ref())
            .map(|c| c.key.in_features)
    }

    /// Whether the MLPs are gated (the first layer's says).
    pub fn gated(&self) -> bool {
        self.layers.first().is_some_and(|l| l.gate.is_some())
    }

    /// The rotary embeddings, when positions are rotary.
    pub fn rotary(&self) -> Option<&RotarySpec> {
        match &self.positions {
            DecoderPositions::Rotary(r) => Some(r),
            _ => None,
        }
    }

    /// The relative position bias, when positions are relative.
    pub fn relative(&self) -> Option<&RelativeBias> {
        match &self.positions {
            DecoderPositions::Relative(r) => Some(r),
            _ => None,
        }
    }

    /// Every norm: each layer's (self-attention, cross-attention, MLP), then the final one.
    pub fn norms(&self) -> impl Iterator<Item = &NormWeights> {
        self.layers
            .iter()
            .flat_map(|l| {
                std::iter::once(&l.input_norm)
                    .chain(l.cross.as_ref().map(|c| &c.norm))
                    .chain(std::iter::once(&l.post_norm))
            })
            .chain(std::iter::once(&self.final_norm))
    }

    /// Every dense layer: the embedding, each layer's projections (self-attention,
    /// cross-attention, MLP), the head when untied.
    pub fn dense_layers(&self) -> impl Iterator<Item = &DenseWeights> {
        std::iter::once(&self.embed)
            .chain(self.layers.iter().flat_map(|l| {
                [&l.query, &l.key, &l.value, &l.output]
                    .into_iter()
                    .chain(
                        l.cross
                            .iter()
                            .flat_map(|c| [&c.query, &c.key, &c.value, &c.output]),
                    )
                    .chain(l.gate.as_ref())
                    .chain([&l.up, &l.down])
            }))
            .chain(self.lm_head.as_ref())
    }

    /// Values of the norms and the learned position table (kept as f32 on the host).
    fn vector_values(&self) -> usize {
        let table = match &self.positions {
            DecoderPositions::Learned(t) => t.len(),
            DecoderPositions::Relative(r) => r.table.len(),
            DecoderPositions::Rotary(_) => 0,
        };
        table
            + self
                .norms()
                .map(|n| n.gamma.len() + n.beta.len())
                .sum::<usize>()
    }

    /// Bytes of the weights as f32 (the tied head counted once, the embedding's zero bias not).
    pub fn float_bytes(&self) -> usize {
        let dense: usize = self
            .dense_layers()
            .map(|d| d.out_features * d.in_features + d.bias.len())
            .sum();
        4 * (self.vector_values() + dense - self.embed.bias.len())
    }

    /// Bytes of the weights as stored: ggml blocks as the file has them, f32 otherwise (norms,
    /// positions and biases in f32).
    pub fn stored_bytes(&self) -> usize {
        4 * self.vector_values()
            + self
                .dense_layers()
                .map(DenseWeights::stored_bytes)
                .sum::<usize>()
    }
}

/// Checks that `v` holds the product of `expected` values.
fn check_len(name: String, v: &[f32], expected: Vec<usize>) -> Result<()> {
    if v.len() != expected.iter().product::<usize>() {
        return Err(Error::ShapeMismatch {
            name,
            expected,
            actual: vec![v.len()],
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense(out: usize, inp: usize) -> DenseWeights {
        DenseWeights::new(out, inp, vec![0.5; out * inp], vec![0.0; out])
    }

    fn rms(h: usize) -> NormWeights {
        NormWeights {
            gamma: vec![1.0; h],
            beta: vec![],
        }
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
            causal: true,
            score_scale: 0.5,
            norm: DecoderNorm::Rms,
            eps: 1e-6,
            max_positions: 16,
            activation: GatedActivation::Silu,
            positions: DecoderPositions::Rotary(RotarySpec {
                inv_freq: vec![1.0, 0.01],
                valid_positions: None,
            }),
            embed: DenseWeights::new(5, h, vec![0.1; 5 * h], vec![0.0; 5]),
            layers: vec![DecoderLayerWeights {
                input_norm: rms(h),
                query: dense(heads * dh, h),
                key: dense(kv * dh, h),
                value: dense(kv * dh, h),
                output: dense(h, heads * dh),
                cross: None,
                post_norm: rms(h),
                gate: Some(dense(inter, h)),
                up: dense(inter, h),
                down: dense(h, inter),
                window: None,
            }],
            final_norm: rms(h),
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
        if let DecoderPositions::Rotary(r) = &mut s.positions {
            r.inv_freq.push(0.5);
        }
        assert!(s.validate().unwrap_err().to_string().contains("rotary"));
        let mut s = tiny();
        s.layers[0].post_norm.beta = vec![0.0; 8];
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("RMSNorm with a bias"));
        let mut s = tiny();
        s.norm = DecoderNorm::Layer;
        assert!(s.validate().unwrap_err().to_string().contains("bias"));
        let mut s = tiny();
        s.positions = DecoderPositions::Learned(vec![0.0; 15 * 8]);
        assert!(s
            .validate()
            .unwrap_err()
            .to_string()
            .contains("embed_positions"));
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
