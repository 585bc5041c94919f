//! The checkpoint as a backend-neutral [`DecoderSpec`], read through the same names the burn
//! modules load (HF's `model.layers.N.self_attn.q_proj`, ...), for engines that execute the spec
//! (the cuBLAS engine of the `cuda` feature).

use std::path::Path;

use ipfs_accelerate_core::{
    DecoderLayerWeights, DecoderNorm, DecoderPositions, DecoderSpec, Result, RotarySpec,
    TensorSource,
};
use ipfs_accelerate_nn::{
    attention::ProjectionNames,
    mlp::GATED_MLP_NAMES,
    rope::{RopeScaling, RotaryEmbedding},
    spec::{gated_activation, SpecReader},
};

use crate::{Architecture, LlamaConfig};

/// The [`DecoderSpec`] of the checkpoint folder `dir` (config.json and safetensors), with the
/// configuration it was read from.
pub fn decoder_spec(dir: &Path) -> Result<(DecoderSpec, LlamaConfig)> {
    let config = LlamaConfig::from_file(&dir.join("config.json"), Architecture::Llama)?;
    let weights = ipfs_accelerate_io::open_weights(dir)?;
    Ok((decoder_spec_from(&config, weights.as_ref())?, config))
}

/// The [`DecoderSpec`] of `config` with weights from any source (a folder's files, a GGUF file's
/// dequantized blocks through [`crate::GgufWeights`]).
pub fn decoder_spec_from(config: &LlamaConfig, source: &dyn TensorSource) -> Result<DecoderSpec> {
    read_spec(config, SpecReader::new(source, ""))
}

/// [`decoder_spec_from`], keeping the weights the source stores in a ggml block type `keep`
/// accepts (a GGUF file's, say) as those blocks ([`ipfs_accelerate_core::DenseWeights::blocks`])
/// for an engine that computes on them; the others are read as f32.
pub fn decoder_spec_keeping_blocks(
    config: &LlamaConfig,
    source: &dyn TensorSource,
    keep: &(dyn Fn(u32) -> bool + Sync),
) -> Result<DecoderSpec> {
    read_spec(config, SpecReader::new(source, "").keeping_blocks(keep))
}

fn read_spec(config: &LlamaConfig, root: SpecReader<'_>) -> Result<DecoderSpec> {
    let c = config;
    let (h, dh, inter) = (c.hidden_size, c.head_dim(), c.intermediate_size);
    let (q, kv) = (c.num_attention_heads * dh, c.kv_heads() * dh);
    let m = root.pp("model");
    let names = ProjectionNames::O_PROJ;
    let bias = c.attention_biases();
    let mlp_bias = c.mlp_biases();
    let [gate, up, down] = GATED_MLP_NAMES;
    let layers = (0..c.num_hidden_layers)
        .map(|i| {
            let l = m.pp(&format!("layers.{i}"));
            let [query, key, value, output] =
                l.pp("self_attn").attention(&names, h, (q, kv), bias)?;
            let f = l.pp("mlp");
            Ok(DecoderLayerWeights {
                input_norm: l.rms_norm("input_layernorm", h)?,
                query,
                key,
                value,
                output,
                cross: None,
                post_norm: l.rms_norm("post_attention_layernorm", h)?,
                gate: Some(f.dense_with(gate, inter, h, mlp_bias)?),
                up: f.dense_with(up, inter, h, mlp_bias)?,
                down: f.dense_with(down, h, inter, mlp_bias)?,
                window: c.layer_window(i),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let rope = RotaryEmbedding::new(c.rope()?)?;
    let valid_positions = match rope.config().scaling {
        RopeScaling::Dynamic {
            max_position_embeddings,
            ..
        } => Some(max_position_embeddings),
        _ => None,
    };
    let spec = DecoderSpec {
        family: c.architecture.name().into(),
        vocab: c.vocab_size,
        hidden: h,
        heads: c.num_attention_heads,
        kv_heads: c.kv_heads(),
        head_dim: dh,
        intermediate: inter,
        causal: true,
        score_scale: 1.0 / (dh as f64).sqrt(),
        norm: DecoderNorm::Rms,
        eps: c.rms_norm_eps as f32,
        max_positions: c.max_position_embeddings(),
        activation: gated_activation(c.hidden_act)?,
        positions: DecoderPositions::Rotary(RotarySpec {
            inv_freq: rope.inv_freq(0).into_owned(),
            valid_positions,
        }),
        embed: m.matrix("embed_tokens.weight", c.vocab_size, h)?,
        layers,
        final_norm: m.rms_norm("norm", h)?,
        lm_head: if c.tie_word_embeddings {
            None
        } else {
            Some(root.dense_with("lm_head", c.vocab_size, h, false)?)
        },
    };
    spec.validate()?;
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The shipped LLaMA and Qwen2 fixtures read into specs whose description, executed as written
    /// in f64, gives HF's logits within the fixtures' tolerance.
    #[test]
    fn the_spec_computes_hf_logits() {
        let mut seen = 0;
        for family in ["llama", "qwen2"] {
            for fixture in ipfs_accelerate_conformance::family_fixtures("decoder spec", family) {
                let meta = fixture.meta().unwrap();
                let (spec, _) = decoder_spec(&fixture.dir).unwrap();
                let reference = fixture.reference().unwrap();
                let ids_t = reference.raw("input_ids").unwrap();
                let ids = ids_t.to_i64_vec().unwrap();
                let want = reference.raw("logits").unwrap().to_f64_vec();
                let seq = ids_t.shape()[1];
                let got: Vec<f64> = ids
                    .chunks(seq)
                    .flat_map(|row| {
                        spec.reference_logits(row, None)
                            .unwrap()
                            .into_iter()
                            .flatten()
                    })
                    .collect();
                let err = ipfs_accelerate_conformance::relative_error(&got, &want);
                let tol = meta.tolerance.get("logits").copied().unwrap_or(1e-4);
                assert!(
                    err <= tol,
                    "{}: relative error {err} > {tol}",
                    fixture.dir.display()
                );
                seen += 1;
            }
        }
        if ipfs_accelerate_conformance::shared_dir("decoder spec").is_some() {
            assert!(seen >= 2, "expected the llama and qwen2 fixtures");
        }
    }
}
