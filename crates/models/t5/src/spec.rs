//! T5 as backend-neutral [`DecoderSpec`]s, for engines that do not run through burn (the cuBLAS
//! decoder engine of the `cuda` feature). Both stacks are pre-norm trunks the decoder spec
//! describes: RMS norms, unscaled attention with the first block's relative position bias, a ReLU
//! or gated-GELU feed-forward, no biases.
//!
//! - [`encoder_stack_spec`]: the encoder, a non-causal stack (bidirectional buckets) whose
//!   final-normed states are the output.
//! - [`decoder_spec`]: the decoder (causal buckets, cross-attention over the encoder's states)
//!   and the LM head: the shared embedding with the `d_model^-0.5` rescale (folded into the final
//!   norm's scale), or the checkpoint's `lm_head`.

use ipfs_accelerate_core::{
    CrossAttentionWeights, DecoderLayerWeights, DecoderNorm, DecoderPositions, DecoderSpec,
    NormWeights, RelativeBias, Result, TensorSource,
};
use ipfs_accelerate_nn::attention::ProjectionBias;
use ipfs_accelerate_nn::spec::{gated_activation, SpecReader};

use crate::model::T5_PROJECTIONS;
use crate::T5Config;

/// The name of the shared token embedding (`shared`, or a stack's copy when only that is stored).
fn embedding(source: &dyn TensorSource) -> &'static str {
    ["shared", "encoder.embed_tokens", "decoder.embed_tokens"]
        .into_iter()
        .find(|p| source.contains(&format!("{p}.weight")))
        .unwrap_or("shared")
}

/// One stack (`encoder` or `decoder`) as a spec.
fn stack_spec(config: &T5Config, source: &dyn TensorSource, decoder: bool) -> Result<DecoderSpec> {
    let c = config;
    let (d, inner, ff) = (c.d_model, c.inner_dim(), c.d_ff);
    let root = SpecReader::new(source, "");
    let stack = root.pp(if decoder { "decoder" } else { "encoder" });
    let layers = if decoder {
        c.num_decoder_layers
    } else {
        c.num_layers
    };
    let attention =
        |a: SpecReader<'_>| a.attention(&T5_PROJECTIONS, d, (inner, inner), ProjectionBias::NONE);
    let layers = (0..layers)
        .map(|i| {
            let l = stack.pp(&format!("block.{i}.layer"));
            let [query, key, value, output] = attention(l.pp("0.SelfAttention"))?;
            let cross = if decoder {
                let [q, k, v, o] = attention(l.pp("1.EncDecAttention"))?;
                Some(CrossAttentionWeights {
                    norm: l.rms_norm("1.layer_norm", d)?,
                    query: q,
                    key: k,
                    value: v,
                    output: o,
                })
            } else {
                None
            };
            let f = l.pp(if decoder { "2" } else { "1" });
            let dense = f.pp("DenseReluDense");
            let (gate, up) = if c.is_gated_act {
                (
                    Some(dense.dense_with("wi_0", ff, d, false)?),
                    dense.dense_with("wi_1", ff, d, false)?,
                )
            } else {
                (None, dense.dense_with("wi", ff, d, false)?)
            };
            Ok(DecoderLayerWeights {
                input_norm: l.rms_norm("0.layer_norm", d)?,
                query,
                key,
                value,
                output,
                cross,
                post_norm: f.rms_norm("layer_norm", d)?,
                gate,
                up,
                down: dense.dense_with("wo", d, ff, false)?,
                window: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let buckets = c.relative_attention_num_buckets;
    let mut final_norm: NormWeights = stack.rms_norm("final_layer_norm", d)?;
    let lm_head = if decoder && source.contains("lm_head.weight") {
        Some(root.dense_with("lm_head", c.vocab_size, d, false)?)
    } else {
        None
    };
    if decoder && c.scale_decoder_outputs {
        // HF rescales the decoder's output by d_model^-0.5 before the head.
        let scale = (d as f64).powf(-0.5);
        for g in &mut final_norm.gamma {
            *g = (f64::from(*g) * scale) as f32;
        }
    }
    let spec = DecoderSpec {
        family: "t5".into(),
        vocab: c.vocab_size,
        hidden: d,
        heads: c.num_heads,
        kv_heads: c.num_heads,
        head_dim: c.d_kv,
        intermediate: ff,
        // T5 folds the scale into its initialisation and does not scale scores.
        causal: decoder,
        score_scale: 1.0,
        norm: DecoderNorm::Rms,
        eps: c.layer_norm_epsilon as f32,
        max_positions: c.max_input_tokens,
        activation: gated_activation(c.dense_act_fn)?,
        positions: DecoderPositions::Relative(RelativeBias {
            table: stack.read(
                "block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                &[buckets, c.num_heads],
            )?,
            buckets,
            max_distance: c.relative_attention_max_distance,
            bidirectional: !decoder,
        }),
        embed: root.matrix(&format!("{}.weight", embedding(source)), c.vocab_size, d)?,
        layers,
        final_norm,
        lm_head,
    };
    spec.validate().map(|()| spec)
}

/// T5's encoder stack: `input_ids` (with padding masked) to `encoder_last_hidden_state`, run as a
/// non-causal stack whose output is its final-normed states (no head).
pub fn encoder_stack_spec(config: &T5Config, source: &dyn TensorSource) -> Result<DecoderSpec> {
    stack_spec(config, source, false)
}

/// T5's decoder and LM head: decoder ids and the encoder's states (with their padding mask) to
/// logits.
pub fn decoder_spec(config: &T5Config, source: &dyn TensorSource) -> Result<DecoderSpec> {
    stack_spec(config, source, true)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipfs_accelerate_conformance::{family_fixtures, relative_error};
    use ipfs_accelerate_core::ReferenceMemory;

    /// Both stacks' specs, executed by the f64 reference, compute the fixtures' (float64)
    /// `encoder_last_hidden_state` (padded rows included) and `logits`.
    #[test]
    fn the_specs_compute_hf_outputs() {
        let mut checked = 0;
        for fixture in family_fixtures("the_specs_compute_hf_outputs", "t5") {
            let config = T5Config::from_file(&fixture.dir.join("config.json")).unwrap();
            let source = ipfs_accelerate_io::open_weights(&fixture.dir).unwrap();
            let encoder = encoder_stack_spec(&config, source.as_ref()).unwrap();
            let decoder = decoder_spec(&config, source.as_ref()).unwrap();
            let refs = fixture.reference().unwrap();
            let ids = refs.raw("input_ids").unwrap();
            let (batch, seq) = (ids.shape()[0], ids.shape()[1]);
            let ids = ids.to_i64_vec().unwrap();
            let mask = refs.raw("attention_mask").unwrap().to_i64_vec().unwrap();
            let dec = refs.raw("decoder_input_ids").unwrap();
            let len = dec.shape()[1];
            let dec = dec.to_i64_vec().unwrap();
            let (mut states, mut logits) = (Vec::new(), Vec::new());
            for b in 0..batch {
                let row = b * seq..(b + 1) * seq;
                let s = encoder
                    .reference_states(&ids[row.clone()], Some(&mask[row.clone()]), None)
                    .unwrap();
                let memory = ReferenceMemory {
                    states: &s,
                    mask: Some(&mask[row]),
                };
                let l = decoder
                    .reference_logits(&dec[b * len..(b + 1) * len], Some(memory))
                    .unwrap();
                states.extend(s.into_iter().flatten());
                logits.extend(l.into_iter().flatten());
            }
            for (name, got) in [("encoder_last_hidden_state", states), ("logits", logits)] {
                let want = refs.raw(name).unwrap().to_f64_vec();
                let error = relative_error(&got, &want);
                eprintln!("{}: {name} rel. error {error:.3e}", fixture.variant);
                // HF's T5LayerNorm takes the variance in f32 even in a float64 model, so the
                // reference differs from the f64 definition by f32 rounding in every norm
                // (5e-7); a wrong bias, bucket or scale costs orders of magnitude more.
                assert!(error <= 1e-5, "{} {name}: {error}", fixture.variant);
            }
            checked += 1;
        }
        if ipfs_accelerate_conformance::shared_dir("t5 specs").is_some() {
            assert!(checked >= 2, "expected the t5 and flan fixtures");
        }
    }
}
