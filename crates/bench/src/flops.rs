//! Analytic floating-point operation counts of one forward pass, from the model's config and the
//! shapes of its inputs.
//!
//! What is counted: every matrix product (linear layers, attention scores `QKᵀ` and the weighted
//! sum `AV`, convolutions as the products they are), at 2 FLOPs per multiply-add, as executed —
//! causal attention is counted in full because the kernels compute the full score matrix before
//! masking. Not counted: element-wise work (norms, softmax, activations, residual adds), which is
//! under 1–2 % of the total at the sizes benchmarked, and embedding lookups (no arithmetic).
//!
//! Families counted: bert, vit, clip, llama, qwen2, t5, whisper, wav2vec2. The others (detr, clap,
//! llava, llava_next, xclip) return `None`, stored as NULL: no number is better than a guessed one.

use ipfs_accelerate_core::TensorMap;
use serde_json::Value;

/// FLOPs of one forward pass of `family` (with `config`, its config.json) on `inputs`.
pub fn forward_flops(family: &str, config: &Value, inputs: &TensorMap) -> Option<f64> {
    let dims = |name: &str| inputs.get(name).map(|t| t.shape().to_vec());
    match family {
        "bert" => {
            let ids = dims("input_ids")?;
            bert(config, ids[0] as f64, *ids.get(1)? as f64)
        }
        "vit" => {
            let px = dims("pixel_values")?;
            vit(config, px[0] as f64, *px.get(2)? as f64, *px.get(3)? as f64)
        }
        "clip" => {
            let ids = dims("input_ids")?;
            let px = dims("pixel_values")?;
            clip(config, ids[0] as f64, *ids.get(1)? as f64, px[0] as f64)
        }
        "llama" | "qwen2" => {
            let ids = dims("input_ids")?;
            decoder_lm(config, ids[0] as f64, *ids.get(1)? as f64)
        }
        "t5" => {
            let ids = dims("input_ids")?;
            let dec = dims("decoder_input_ids")?;
            t5(
                config,
                ids[0] as f64,
                *ids.get(1)? as f64,
                *dec.get(1)? as f64,
            )
        }
        "whisper" => {
            let feats = dims("input_features")?;
            // Without decoder tokens the encoder alone runs.
            let dec = dims("decoder_input_ids").map_or(Some(0), |d| d.get(1).copied())?;
            whisper(config, feats[0] as f64, *feats.get(2)? as f64, dec as f64)
        }
        "wav2vec2" => {
            let values = dims("input_values")?;
            wav2vec2(config, values[0] as f64, *values.get(1)? as f64)
        }
        _ => None,
    }
}

/// A number field of `config`.
fn num(config: &Value, key: &str) -> Option<f64> {
    config.get(key)?.as_f64()
}

/// A transformer encoder layer over `tokens = batch × seq` tokens: Q, K, V and output projections
/// (`4h²`), a two-matrix feed-forward (`2·h·inter`), and the attention products (`2·s²·h` each for
/// `QKᵀ` and `AV`, per sequence).
pub fn encoder_layer(batch: f64, seq: f64, hidden: f64, inter: f64) -> f64 {
    let tokens = batch * seq;
    2.0 * tokens * (4.0 * hidden * hidden + 2.0 * hidden * inter) + 4.0 * batch * seq * seq * hidden
}

/// BERT (`BertModel` + the task head its `architectures` names).
pub fn bert(config: &Value, batch: f64, seq: f64) -> Option<f64> {
    let h = num(config, "hidden_size")?;
    let inter = num(config, "intermediate_size")?;
    let layers = num(config, "num_hidden_layers")?;
    let labels = num(config, "num_labels")
        .or_else(|| Some(config.get("id2label")?.as_object()?.len() as f64))
        .unwrap_or(2.0);
    let head = match architecture(config).as_deref() {
        Some(a) if a.ends_with("ForSequenceClassification") => 2.0 * batch * h * (h + labels),
        Some(a) if a.ends_with("ForTokenClassification") => 2.0 * batch * seq * h * labels,
        Some(a) if a.ends_with("ForQuestionAnswering") => 2.0 * batch * seq * h * 2.0,
        // BertModel's pooler.
        _ => 2.0 * batch * h * h,
    };
    Some(layers * encoder_layer(batch, seq, h, inter) + head)
}

/// The first entry of `architectures`.
fn architecture(config: &Value) -> Option<String> {
    Some(config.get("architectures")?.get(0)?.as_str()?.to_string())
}

/// A ViT-style vision tower on `batch` images of `height × width`: patch embedding, the CLS token
/// plus patches through the encoder. Returns (FLOPs, hidden size).
fn vision_tower(config: &Value, batch: f64, height: f64, width: f64) -> Option<(f64, f64)> {
    let h = num(config, "hidden_size")?;
    let inter = num(config, "intermediate_size")?;
    let layers = num(config, "num_hidden_layers")?;
    let patch = num(config, "patch_size")?;
    let channels = num(config, "num_channels").unwrap_or(3.0);
    let patches = (height / patch).floor() * (width / patch).floor();
    let embed = 2.0 * batch * patches * channels * patch * patch * h;
    Some((
        embed + layers * encoder_layer(batch, patches + 1.0, h, inter),
        h,
    ))
}

/// ViT (`ViTModel` with its pooler, or `ViTForImageClassification`'s head).
pub fn vit(config: &Value, batch: f64, height: f64, width: f64) -> Option<f64> {
    let (tower, h) = vision_tower(config, batch, height, width)?;
    let head = match architecture(config).as_deref() {
        Some(a) if a.ends_with("ForImageClassification") => {
            let labels = config
                .get("id2label")
                .and_then(Value::as_object)
                .map(|m| m.len() as f64)
                .unwrap_or(2.0);
            2.0 * batch * h * labels
        }
        _ => 2.0 * batch * h * h,
    };
    Some(tower + head)
}

/// CLIP: text tower on `texts × seq` tokens, vision tower on `images` square images of the
/// config's size, both projections and the similarity logits.
pub fn clip(config: &Value, texts: f64, seq: f64, images: f64) -> Option<f64> {
    let text = config.get("text_config")?;
    let vision = config.get("vision_config")?;
    let proj = num(config, "projection_dim")?;
    let th = num(text, "hidden_size")?;
    let text_flops = num(text, "num_hidden_layers")?
        * encoder_layer(texts, seq, th, num(text, "intermediate_size")?);
    let side = num(vision, "image_size")?;
    let (vision_flops, vh) = vision_tower(vision, images, side, side)?;
    let projections = 2.0 * texts * th * proj + 2.0 * images * vh * proj;
    Some(text_flops + vision_flops + projections + 2.0 * texts * images * proj)
}

/// LLaMA / Qwen2 forward over `batch × seq` tokens with logits at every position (grouped-query
/// attention: K and V project to `num_key_value_heads` heads; SiLU-gated MLP of three matrices).
pub fn decoder_lm(config: &Value, batch: f64, seq: f64) -> Option<f64> {
    let h = num(config, "hidden_size")?;
    let inter = num(config, "intermediate_size")?;
    let layers = num(config, "num_hidden_layers")?;
    let vocab = num(config, "vocab_size")?;
    let heads = num(config, "num_attention_heads")?;
    let kv_heads = num(config, "num_key_value_heads").unwrap_or(heads);
    let head_dim = num(config, "head_dim").unwrap_or(h / heads);
    let tokens = batch * seq;
    let q = heads * head_dim;
    let kv = kv_heads * head_dim;
    let projections = h * q + 2.0 * h * kv + q * h + 3.0 * h * inter;
    let layer = 2.0 * tokens * projections + 4.0 * batch * seq * seq * q;
    Some(layers * layer + 2.0 * tokens * h * vocab)
}

/// T5: the encoder over `batch × seq` tokens and the decoder over `batch × dec` tokens (self- and
/// cross-attention), with the LM head.
pub fn t5(config: &Value, batch: f64, seq: f64, dec: f64) -> Option<f64> {
    let d = num(config, "d_model")?;
    let inner = num(config, "num_heads")? * num(config, "d_kv")?;
    let dff = num(config, "d_ff")?;
    let enc_layers = num(config, "num_layers")?;
    let dec_layers = num(config, "num_decoder_layers").unwrap_or(enc_layers);
    let vocab = num(config, "vocab_size")?;
    let gated = config
        .get("feed_forward_proj")
        .and_then(Value::as_str)
        .is_some_and(|p| p.starts_with("gated-"));
    let ffn = if gated { 3.0 } else { 2.0 } * d * dff;
    let (te, td) = (batch * seq, batch * dec);
    let encoder = 2.0 * te * (4.0 * d * inner + ffn) + 4.0 * batch * seq * seq * inner;
    let decoder = 2.0 * td * (4.0 * d * inner + 2.0 * d * inner + ffn)
        + 2.0 * te * 2.0 * d * inner
        + 4.0 * batch * dec * dec * inner
        + 4.0 * batch * dec * seq * inner;
    Some(enc_layers * encoder + dec_layers * decoder + 2.0 * td * d * vocab)
}

/// Whisper: the two-convolution front end over `frames` mel frames, the encoder over `frames / 2`
/// positions, and the decoder over `batch × dec` tokens with cross-attention and the LM head
/// (none without decoder tokens).
pub fn whisper(config: &Value, batch: f64, frames: f64, dec: f64) -> Option<f64> {
    let d = num(config, "d_model")?;
    let mels = num(config, "num_mel_bins")?;
    let vocab = num(config, "vocab_size")?;
    let enc_seq = (frames / 2.0).ceil();
    let convs = 2.0 * batch * frames * mels * 3.0 * d + 2.0 * batch * enc_seq * 3.0 * d * d;
    let encoder = num(config, "encoder_layers")?
        * encoder_layer(batch, enc_seq, d, num(config, "encoder_ffn_dim")?);
    if dec == 0.0 {
        return Some(convs + encoder);
    }
    let (te, td) = (batch * enc_seq, batch * dec);
    let dec_layer = 2.0 * td * (6.0 * d * d + 2.0 * d * num(config, "decoder_ffn_dim")?)
        + 2.0 * te * 2.0 * d * d
        + 4.0 * batch * dec * dec * d
        + 4.0 * batch * dec * enc_seq * d;
    Some(convs + encoder + num(config, "decoder_layers")? * dec_layer + 2.0 * td * d * vocab)
}

/// Wav2Vec2 with its CTC head on `batch × samples` audio: the convolutional feature extractor,
/// the feature projection, the grouped positional convolution, and the encoder.
pub fn wav2vec2(config: &Value, batch: f64, samples: f64) -> Option<f64> {
    let list = |key: &str| -> Option<Vec<f64>> {
        config
            .get(key)?
            .as_array()?
            .iter()
            .map(Value::as_f64)
            .collect()
    };
    let (dims, kernels, strides) = (
        list("conv_dim")?,
        list("conv_kernel")?,
        list("conv_stride")?,
    );
    let (mut len, mut channels, mut convs) = (samples, 1.0, 0.0);
    for ((out, k), s) in dims.iter().zip(&kernels).zip(&strides) {
        len = ((len - k) / s).floor() + 1.0;
        if len < 1.0 {
            return None;
        }
        convs += 2.0 * batch * len * channels * out * k;
        channels = *out;
    }
    let h = num(config, "hidden_size")?;
    let tokens = batch * len;
    let groups = num(config, "num_conv_pos_embedding_groups")?;
    let pos_kernel = num(config, "num_conv_pos_embeddings")?;
    let projection = 2.0 * tokens * channels * h;
    let pos_conv = 2.0 * tokens * h * (h / groups) * pos_kernel;
    let encoder = num(config, "num_hidden_layers")?
        * encoder_layer(batch, len, h, num(config, "intermediate_size")?);
    let head = 2.0 * tokens * h * num(config, "vocab_size")?;
    Some(convs + projection + pos_conv + encoder + head)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// all-MiniLM-L6-v2 at batch 1 × 128 tokens, counted by hand: the linear weights of one layer
    /// are 4·384² + 2·384·1536 = 1 769 472, six layers 10 616 832 parameters; 2·params·tokens =
    /// 2 717 908 992; attention 4·1·128²·384 per layer × 6 = 150 994 944; pooler 2·384² = 294 912.
    #[test]
    fn bert_matches_two_params_tokens_plus_attention() {
        let (_, json) = crate::configs::preset("minilm-l6").unwrap();
        let config: Value = serde_json::from_str(json).unwrap();
        let hand = 2_717_908_992.0 + 150_994_944.0 + 294_912.0;
        let counted = bert(&config, 1.0, 128.0).unwrap();
        assert!(
            ((counted - hand) / hand).abs() < 0.01,
            "{counted} vs {hand}"
        );
        // Batch scales linearly.
        let b8 = bert(&config, 8.0, 128.0).unwrap();
        assert!((b8 / counted - 8.0).abs() < 1e-9);
    }

    /// SmolLM2-135M, one token: twice the non-embedding linear weights plus the tied LM head
    /// (134.5 M parameters in all, of which 28.3 M embeddings used as the head), within 1 %.
    #[test]
    fn decoder_lm_one_token_is_twice_the_weights() {
        let (_, json) = crate::configs::preset("llama-135m").unwrap();
        let config: Value = serde_json::from_str(json).unwrap();
        let per_layer = 576.0 * 576.0 * 2.0 + 2.0 * 576.0 * 192.0 + 3.0 * 576.0 * 1536.0;
        let hand = 2.0 * (30.0 * per_layer + 576.0 * 49152.0) + 30.0 * 4.0 * 576.0;
        let counted = decoder_lm(&config, 1.0, 1.0).unwrap();
        assert!(
            ((counted - hand) / hand).abs() < 0.01,
            "{counted} vs {hand}"
        );
    }

    #[test]
    fn families_without_a_count_are_none() {
        assert!(forward_flops("detr", &Value::Null, &TensorMap::new()).is_none());
        assert!(forward_flops("bert", &Value::Null, &TensorMap::new()).is_none());
    }
}
