//! The checkpoint as a backend-neutral [`DecoderSpec`], read through the same names the burn
//! modules load (HF's `model.layers.N.self_attn.q_proj`, ...), for engines that execute the spec
//! (the cuBLAS engine of the `cuda` feature).

use std::path::Path;

use ipfs_accelerate_core::{DecoderLayerWeights, DecoderSpec, Result, RotarySpec, TensorSource};
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
            let a = l.pp("self_attn");
            let f = l.pp("mlp");
            Ok(DecoderLayerWeights {
                input_norm: l.scale("input_layernorm", h)?,
                query: a.dense_with(names.q, q, h, bias.q)?,
                key: a.dense_with(names.k, kv, h, bias.k)?,
                value: a.dense_with(names.v, kv, h, bias.v)?,
                output: a.dense_with(names.o, h, q, bias.o)?,
                post_norm: l.scale("post_attention_layernorm", h)?,
                gate: f.dense_with(gate, inter, h, mlp_bias)?,
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
        eps: c.rms_norm_eps as f32,
        max_positions: c.max_position_embeddings(),
        activation: gated_activation(c.hidden_act)?,
        rotary: RotarySpec {
            inv_freq: rope.inv_freq(0).into_owned(),
            valid_positions,
        },
        embed: m.matrix("embed_tokens.weight", c.vocab_size, h)?,
        layers,
        final_norm: m.scale("norm", h)?,
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
    use ipfs_accelerate_core::{DenseWeights, GatedActivation};

    /// `y = W x + b` in f64.
    fn dense(d: &DenseWeights, x: &[f64]) -> Vec<f64> {
        (0..d.out_features)
            .map(|o| {
                let w = &d.weight[o * d.in_features..(o + 1) * d.in_features];
                f64::from(d.bias[o]) + w.iter().zip(x).map(|(a, b)| f64::from(*a) * b).sum::<f64>()
            })
            .collect()
    }

    fn rms(x: &[f64], g: &[f32], eps: f32) -> Vec<f64> {
        let ms = x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64;
        let inv = 1.0 / (ms + f64::from(eps)).sqrt();
        x.iter()
            .zip(g)
            .map(|(v, g)| v * inv * f64::from(*g))
            .collect()
    }

    /// Rotates one head in place at `pos` (HF's `rotate_half` pairing `i` with `i + d / 2`).
    fn rope(x: &mut [f64], inv_freq: &[f32], pos: usize) {
        let half = x.len() / 2;
        for i in 0..half {
            let a = f64::from(pos as f32 * inv_freq[i]);
            let (c, s) = (a.cos(), a.sin());
            let (x1, x2) = (x[i], x[i + half]);
            x[i] = x1 * c - x2 * s;
            x[i + half] = x2 * c + x1 * s;
        }
    }

    /// Logits `[seq, vocab]` of one unpadded row, straight from the spec's description in f64:
    /// what every engine executing a [`DecoderSpec`] must compute.
    fn reference_forward(s: &DecoderSpec, ids: &[i64]) -> Vec<Vec<f64>> {
        let (h, dh) = (s.hidden, s.head_dim);
        let group = s.heads / s.kv_heads;
        let mut x: Vec<Vec<f64>> = ids
            .iter()
            .map(|&t| {
                s.embed.weight[t as usize * h..(t as usize + 1) * h]
                    .iter()
                    .map(|&v| v.into())
                    .collect()
            })
            .collect();
        for l in &s.layers {
            let n: Vec<Vec<f64>> = x.iter().map(|r| rms(r, &l.input_norm, s.eps)).collect();
            let mut q: Vec<Vec<f64>> = n.iter().map(|r| dense(&l.query, r)).collect();
            let mut k: Vec<Vec<f64>> = n.iter().map(|r| dense(&l.key, r)).collect();
            let v: Vec<Vec<f64>> = n.iter().map(|r| dense(&l.value, r)).collect();
            for (p, (qr, kr)) in q.iter_mut().zip(k.iter_mut()).enumerate() {
                qr.chunks_mut(dh)
                    .for_each(|hd| rope(hd, &s.rotary.inv_freq, p));
                kr.chunks_mut(dh)
                    .for_each(|hd| rope(hd, &s.rotary.inv_freq, p));
            }
            for (p, xr) in x.iter_mut().enumerate() {
                let mut ctx = vec![0.0; s.heads * dh];
                for hd in 0..s.heads {
                    let kvh = hd / group;
                    let first = l.window.map_or(0, |w| (p + 1).saturating_sub(w));
                    let qh = &q[p][hd * dh..(hd + 1) * dh];
                    let scores: Vec<f64> = (first..=p)
                        .map(|j| {
                            let kh = &k[j][kvh * dh..(kvh + 1) * dh];
                            qh.iter().zip(kh).map(|(a, b)| a * b).sum::<f64>() / (dh as f64).sqrt()
                        })
                        .collect();
                    let mx = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let e: Vec<f64> = scores.iter().map(|v| (v - mx).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for (j, w) in (first..=p).zip(&e) {
                        for d in 0..dh {
                            ctx[hd * dh + d] += w / z * v[j][kvh * dh + d];
                        }
                    }
                }
                for (a, b) in xr.iter_mut().zip(dense(&l.output, &ctx)) {
                    *a += b;
                }
                let n2 = rms(xr, &l.post_norm, s.eps);
                let g = dense(&l.gate, &n2);
                let u = dense(&l.up, &n2);
                let act: Vec<f64> = g
                    .iter()
                    .zip(&u)
                    .map(|(g, u)| {
                        let a = match s.activation {
                            GatedActivation::Silu => g / (1.0 + (-g).exp()),
                            other => panic!("the reference has no {other:?}"),
                        };
                        a * u
                    })
                    .collect();
                for (a, b) in xr.iter_mut().zip(dense(&l.down, &act)) {
                    *a += b;
                }
            }
        }
        let head = s.lm_head.as_ref().unwrap_or(&s.embed);
        x.iter()
            .map(|r| dense(head, &rms(r, &s.final_norm, s.eps)))
            .collect()
    }

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
                    .flat_map(|row| reference_forward(&spec, row).into_iter().flatten())
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
