//! `config.json` of T5 checkpoints, resolved the way HF's `T5Config.__post_init__` does.

use std::path::Path;

use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::{generate::GenerationConfig, Activation};

/// An id or a list of ids (`eos_token_id` may be either).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(i64),
    Many(Vec<i64>),
}

/// The fields of config.json as written, with HF's defaults.
#[derive(Debug, Clone, serde::Deserialize)]
struct RawConfig {
    #[serde(default = "d_vocab")]
    vocab_size: usize,
    #[serde(default = "d_model")]
    d_model: usize,
    #[serde(default = "d_kv")]
    d_kv: usize,
    #[serde(default = "d_ff")]
    d_ff: usize,
    #[serde(default = "d_layers")]
    num_layers: usize,
    #[serde(default)]
    num_decoder_layers: Option<usize>,
    #[serde(default = "d_heads")]
    num_heads: usize,
    #[serde(default = "d_buckets")]
    relative_attention_num_buckets: usize,
    #[serde(default = "d_max_distance")]
    relative_attention_max_distance: usize,
    #[serde(default = "d_eps")]
    layer_norm_epsilon: f64,
    #[serde(default = "d_ffp")]
    feed_forward_proj: String,
    #[serde(default)]
    dense_act_fn: Option<String>,
    #[serde(default)]
    is_gated_act: Option<bool>,
    #[serde(default)]
    tie_word_embeddings: Option<bool>,
    #[serde(default)]
    scale_decoder_outputs: Option<bool>,
    #[serde(default)]
    decoder_start_token_id: Option<i64>,
    #[serde(default)]
    bos_token_id: Option<i64>,
    #[serde(default = "d_pad")]
    pad_token_id: Option<i64>,
    #[serde(default = "d_eos")]
    eos_token_id: Option<OneOrMany>,
    #[serde(default)]
    n_positions: Option<usize>,
}

fn d_vocab() -> usize {
    32128
}
fn d_model() -> usize {
    512
}
fn d_kv() -> usize {
    64
}
fn d_ff() -> usize {
    2048
}
fn d_layers() -> usize {
    6
}
fn d_heads() -> usize {
    8
}
fn d_buckets() -> usize {
    32
}
fn d_max_distance() -> usize {
    128
}
fn d_eps() -> f64 {
    1e-6
}
fn d_ffp() -> String {
    "relu".into()
}
fn d_pad() -> Option<i64> {
    Some(0)
}
fn d_eos() -> Option<OneOrMany> {
    Some(OneOrMany::One(1))
}

/// A validated T5 configuration (T5, T5 v1.1, FLAN-T5, mT5 layouts).
#[derive(Debug, Clone, PartialEq)]
pub struct T5Config {
    /// Vocabulary size (rows of the shared embedding and of the LM head).
    pub vocab_size: usize,
    /// Hidden size.
    pub d_model: usize,
    /// Width of one attention head.
    pub d_kv: usize,
    /// Feed-forward inner size.
    pub d_ff: usize,
    /// Encoder blocks.
    pub num_layers: usize,
    /// Decoder blocks (`num_layers` when the config names none).
    pub num_decoder_layers: usize,
    /// Attention heads.
    pub num_heads: usize,
    /// Relative position buckets.
    pub relative_attention_num_buckets: usize,
    /// Distance beyond which relative positions share a bucket.
    pub relative_attention_max_distance: usize,
    /// RMS-norm epsilon.
    pub layer_norm_epsilon: f64,
    /// Whether the feed-forward is gated (`gated-gelu`: `act(wi_0 x) * wi_1 x`).
    pub is_gated_act: bool,
    /// The feed-forward activation (`relu` for T5, `gelu_new` for `gated-gelu`).
    pub dense_act_fn: Activation,
    /// Whether the decoder output is scaled by `d_model^-0.5` before the LM head (original T5, whose
    /// LM head is the shared embedding; not T5 v1.1 / FLAN-T5).
    pub scale_decoder_outputs: bool,
    /// The first decoder token (T5 uses the pad id, 0).
    pub decoder_start_token_id: Option<u32>,
    /// Padding id.
    pub pad_token_id: Option<u32>,
    /// End-of-sequence ids (generation stops at any of them).
    pub eos_token_ids: Vec<u32>,
    /// Tokenizer truncation length (`n_positions`, 512 when absent; T5 itself has no position limit).
    pub max_input_tokens: usize,
}

impl T5Config {
    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json(&text, path)
    }

    /// Parses and validates config JSON (`origin` names it in errors).
    pub fn from_json(text: &str, origin: &Path) -> Result<Self> {
        let raw: RawConfig =
            serde_json::from_str(text).map_err(|e| Error::config(origin, e.to_string()))?;
        Self::resolve(raw, origin)
    }

    fn resolve(raw: RawConfig, origin: &Path) -> Result<Self> {
        let bad = |reason: String| Error::config(origin, reason);
        for (name, v) in [
            ("vocab_size", raw.vocab_size),
            ("d_model", raw.d_model),
            ("d_kv", raw.d_kv),
            ("d_ff", raw.d_ff),
            ("num_layers", raw.num_layers),
            ("num_heads", raw.num_heads),
        ] {
            if v == 0 {
                return Err(bad(format!("`{name}` must be positive")));
            }
        }
        let num_decoder_layers = raw.num_decoder_layers.unwrap_or(raw.num_layers);
        if num_decoder_layers == 0 {
            return Err(bad("`num_decoder_layers` must be positive".into()));
        }
        let (buckets, max_distance) = (
            raw.relative_attention_num_buckets,
            raw.relative_attention_max_distance,
        );
        // Bidirectional buckets split in two halves of exact and log-spaced distances: fewer than 4
        // buckets or a max distance within the exact range divides by zero in the bucket formula.
        if buckets < 4 || max_distance <= buckets / 2 {
            return Err(bad(format!(
                "relative_attention_num_buckets {buckets} must be at least 4 and \
                 relative_attention_max_distance {max_distance} larger than half of it"
            )));
        }
        if !(raw.layer_norm_epsilon.is_finite() && raw.layer_norm_epsilon >= 0.0) {
            return Err(bad(format!(
                "layer_norm_epsilon {} is invalid",
                raw.layer_norm_epsilon
            )));
        }
        // HF: `gated-{ACT}` or `{ACT}`; "gated-gelu" means gelu_new for backward compatibility.
        let parts: Vec<&str> = raw.feed_forward_proj.split('-').collect();
        if parts.len() > 2 || (parts.len() == 2 && parts[0] != "gated") {
            return Err(bad(format!(
                "feed_forward_proj `{}` is not `gated-{{ACT_FN}}` or `{{ACT_FN}}` (e.g. `gated-gelu`, `relu`)",
                raw.feed_forward_proj
            )));
        }
        let mut act_name = parts[parts.len() - 1].to_string();
        if raw.feed_forward_proj == "gated-gelu" {
            act_name = "gelu_new".into();
        }
        // Values stored in config.json override the derived ones, as in HF.
        let act_name = raw.dense_act_fn.clone().unwrap_or(act_name);
        let dense_act_fn: Activation = act_name.parse().map_err(|e: Error| {
            bad(format!(
                "feed_forward_proj `{}`: {e}",
                raw.feed_forward_proj
            ))
        })?;
        let is_gated_act = raw.is_gated_act.unwrap_or(parts[0] == "gated");
        let scale_decoder_outputs = raw
            .scale_decoder_outputs
            .unwrap_or(raw.tie_word_embeddings != Some(false));
        let id = |name: &str, v: Option<i64>| -> Result<Option<u32>> {
            v.map(|v| {
                u32::try_from(v)
                    .ok()
                    .filter(|&u| (u as usize) < raw.vocab_size)
                    .ok_or_else(|| bad(format!("`{name}` {v} is outside the vocabulary")))
            })
            .transpose()
        };
        let eos: Vec<i64> = match raw.eos_token_id.clone() {
            None => Vec::new(),
            Some(OneOrMany::One(v)) => vec![v],
            Some(OneOrMany::Many(v)) => v,
        };
        let eos_token_ids = eos
            .into_iter()
            .map(|v| id("eos_token_id", Some(v)).map(Option::unwrap_or_default))
            .collect::<Result<Vec<u32>>>()?;
        Ok(T5Config {
            vocab_size: raw.vocab_size,
            d_model: raw.d_model,
            d_kv: raw.d_kv,
            d_ff: raw.d_ff,
            num_layers: raw.num_layers,
            num_decoder_layers,
            num_heads: raw.num_heads,
            relative_attention_num_buckets: buckets,
            relative_attention_max_distance: max_distance,
            layer_norm_epsilon: raw.layer_norm_epsilon,
            is_gated_act,
            dense_act_fn,
            scale_decoder_outputs,
            decoder_start_token_id: id(
                "decoder_start_token_id",
                raw.decoder_start_token_id.or(raw.bos_token_id),
            )?,
            pad_token_id: id("pad_token_id", raw.pad_token_id)?,
            eos_token_ids,
            max_input_tokens: raw.n_positions.unwrap_or(512).max(1),
        })
    }

    /// Width of all heads together.
    pub fn inner_dim(&self) -> usize {
        self.num_heads * self.d_kv
    }

    /// The decoder's first token, or an error when the config names none.
    pub fn start_token(&self) -> Result<u32> {
        self.decoder_start_token_id.ok_or_else(|| {
            Error::InvalidInput(
                "the config has no decoder_start_token_id (nor bos_token_id) to start decoding"
                    .into(),
            )
        })
    }

    /// Generation options with the checkpoint's end-of-sequence ids as stop tokens.
    pub fn generation_config(&self, max_new_tokens: usize) -> GenerationConfig {
        GenerationConfig {
            max_new_tokens,
            stop_tokens: self.eos_token_ids.clone(),
            ..Default::default()
        }
    }
}

/// Named configurations of well-known checkpoints, for benchmarks with random weights:
/// `t5-small`, `t5-base`, `flan-t5-small`, `flan-t5-base`.
pub fn preset(name: &str) -> Option<T5Config> {
    let (d_model, d_kv, d_ff, layers, heads, flan) = match name {
        "t5-small" => (512, 64, 2048, 6, 8, false),
        "t5-base" => (768, 64, 3072, 12, 12, false),
        "flan-t5-small" => (512, 64, 1024, 8, 6, true),
        "flan-t5-base" => (768, 64, 2048, 12, 12, true),
        _ => return None,
    };
    let (ffp, tie) = if flan {
        ("gated-gelu", false)
    } else {
        ("relu", true)
    };
    let json = format!(
        r#"{{"model_type":"t5","vocab_size":32128,"d_model":{d_model},"d_kv":{d_kv},"d_ff":{d_ff},
            "num_layers":{layers},"num_heads":{heads},"feed_forward_proj":"{ffp}",
            "tie_word_embeddings":{tie},"decoder_start_token_id":0}}"#
    );
    T5Config::from_json(&json, Path::new(name)).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(json: &str) -> Result<T5Config> {
        T5Config::from_json(json, Path::new("test"))
    }

    #[test]
    fn resolves_like_hf() {
        let c = parse(
            r#"{"vocab_size":99,"feed_forward_proj":"gated-gelu","tie_word_embeddings":false}"#,
        )
        .unwrap();
        assert!(c.is_gated_act);
        assert_eq!(c.dense_act_fn, Activation::GeluTanh);
        assert!(!c.scale_decoder_outputs);
        assert_eq!(c.num_decoder_layers, 6);
        assert_eq!(c.eos_token_ids, vec![1]);
        let c =
            parse(r#"{"vocab_size":99,"feed_forward_proj":"gated-silu","num_decoder_layers":3}"#)
                .unwrap();
        assert_eq!((c.is_gated_act, c.dense_act_fn), (true, Activation::Silu));
        assert!(c.scale_decoder_outputs);
        assert_eq!(c.num_decoder_layers, 3);
        // A saved config carries scale_decoder_outputs explicitly; it wins over tie_word_embeddings.
        let c =
            parse(r#"{"vocab_size":99,"tie_word_embeddings":true,"scale_decoder_outputs":false}"#)
                .unwrap();
        assert!(!c.scale_decoder_outputs);
        assert_eq!(c.dense_act_fn, Activation::Relu);
        assert!(preset("flan-t5-small").is_some() && preset("t5-small").is_some());
    }

    #[test]
    fn invalid_configs_are_errors() {
        for json in [
            r#"{"feed_forward_proj":"foo-gelu"}"#,
            r#"{"feed_forward_proj":"gated-gelu-x"}"#,
            r#"{"feed_forward_proj":"nonsense"}"#,
            r#"{"d_model":0}"#,
            r#"{"num_heads":0}"#,
            r#"{"relative_attention_num_buckets":2}"#,
            r#"{"relative_attention_num_buckets":32,"relative_attention_max_distance":16}"#,
            r#"{"vocab_size":10,"eos_token_id":10}"#,
            r#"{"layer_norm_epsilon":-1}"#,
            r#"{"d_model":"x"}"#,
        ] {
            match parse(json) {
                Err(Error::InvalidConfig { .. }) => {}
                other => panic!("{json}: expected InvalidConfig, got {other:?}"),
            }
        }
    }
}
