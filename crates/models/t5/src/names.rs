//! HF tensor names of `T5ForConditionalGeneration` and the shapes a config implies.

use crate::T5Config;

/// Attention projection names under `…SelfAttention` / `…EncDecAttention`.
pub const ATTENTION_PROJECTIONS: [&str; 4] = ["q", "k", "v", "o"];

/// Every tensor a checkpoint of `config` holds, with its shape (`lm_head.weight` only when
/// `untied_lm_head`: T5 v1.1 / FLAN-T5 checkpoints store their own LM head).
pub fn weight_shapes(config: &T5Config, untied_lm_head: bool) -> Vec<(String, Vec<usize>)> {
    let (d, inner, ff) = (config.d_model, config.inner_dim(), config.d_ff);
    let mut v = vec![("shared.weight".to_string(), vec![config.vocab_size, d])];
    if untied_lm_head {
        v.push(("lm_head.weight".into(), vec![config.vocab_size, d]));
    }
    let ffn_names: &[&str] = if config.is_gated_act {
        &["wi_0", "wi_1"]
    } else {
        &["wi"]
    };
    for (stack, layers) in [
        ("encoder", config.num_layers),
        ("decoder", config.num_decoder_layers),
    ] {
        let decoder = stack == "decoder";
        for i in 0..layers {
            let b = format!("{stack}.block.{i}.layer");
            let mut attn = vec![format!("{b}.0.SelfAttention")];
            if decoder {
                attn.push(format!("{b}.1.EncDecAttention"));
            }
            for a in &attn {
                for p in ATTENTION_PROJECTIONS {
                    let shape = if p == "o" {
                        vec![d, inner]
                    } else {
                        vec![inner, d]
                    };
                    v.push((format!("{a}.{p}.weight"), shape));
                }
            }
            if i == 0 {
                v.push((
                    format!("{b}.0.SelfAttention.relative_attention_bias.weight"),
                    vec![config.relative_attention_num_buckets, config.num_heads],
                ));
            }
            let ff_index = if decoder { 2 } else { 1 };
            for n in 0..=ff_index {
                v.push((format!("{b}.{n}.layer_norm.weight"), vec![d]));
            }
            for name in ffn_names {
                v.push((
                    format!("{b}.{ff_index}.DenseReluDense.{name}.weight"),
                    vec![ff, d],
                ));
            }
            v.push((
                format!("{b}.{ff_index}.DenseReluDense.wo.weight"),
                vec![d, ff],
            ));
        }
        v.push((format!("{stack}.final_layer_norm.weight"), vec![d]));
    }
    v
}
