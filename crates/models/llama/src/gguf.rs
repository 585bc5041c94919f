//! llama.cpp GGUF checkpoints: [`LlamaConfig::from_gguf`] reads the configuration from the
//! metadata and [`GgufWeights`] serves the tensors under HF's names, undoing the row permutation
//! llama.cpp's converter applies to LLaMA's query / key projections.

use std::path::PathBuf;
use std::sync::Arc;

use ipfs_accelerate_core::{Error, HostTensor, QuantizedBlocks, Result, TensorSource};
use ipfs_accelerate_io::gguf::{GgmlType, GgufFile, GgufValue};
use ipfs_accelerate_nn::{rope::RopeParameters, Activation};

use crate::config::TokenIds;
use crate::{Architecture, LlamaConfig};

impl LlamaConfig {
    /// The configuration of a GGUF file whose `general.architecture` is `llama` or `qwen2`, from
    /// the `<arch>.*` keys (`embedding_length`, `block_count`, `attention.head_count(_kv)`,
    /// `attention.key_length`, `feed_forward_length`, `rope.freq_base`, `rope.scaling.*`,
    /// `attention.layer_norm_rms_epsilon`, `context_length`), the vocabulary size from the token
    /// list, tied embeddings when there is no `output.weight`, and the special token ids.
    pub fn from_gguf(file: &GgufFile) -> Result<Self> {
        let origin = PathBuf::from(file.name());
        let arch_name = file
            .architecture()
            .ok_or_else(|| Error::config(&origin, "no `general.architecture` key"))?;
        let arch = Architecture::from_name(arch_name).ok_or_else(|| {
            Error::config(
                &origin,
                format!("architecture `{arch_name}` is not a LLaMA or Qwen2 decoder"),
            )
        })?;
        let key = |k: &str| format!("{arch_name}.{k}");
        let uint = |k: &str| -> Result<Option<usize>> {
            match file.get(&key(k)) {
                None => Ok(None),
                Some(v) => v
                    .as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .map(Some)
                    .ok_or_else(|| {
                        Error::config(
                            &origin,
                            format!("`{}` is a {}, not a count", key(k), v.type_name()),
                        )
                    }),
            }
        };
        let required = |k: &str| -> Result<usize> {
            uint(k)?.ok_or_else(|| Error::config(&origin, format!("missing key `{}`", key(k))))
        };
        let float = |k: &str| -> Result<Option<f64>> {
            match file.get(&key(k)) {
                None => Ok(None),
                Some(v) => v.as_f64().map(Some).ok_or_else(|| {
                    Error::config(
                        &origin,
                        format!("`{}` is a {}, not a number", key(k), v.type_name()),
                    )
                }),
            }
        };
        if file.contains("rope_freqs.weight") {
            return Err(Error::config(
                &origin,
                "per-frequency RoPE factors (`rope_freqs.weight`, LLaMA 3.1 scaling) are not supported",
            ));
        }
        let hidden = required("embedding_length")?;
        let heads = required("attention.head_count")?;
        let vocab = match file
            .get("tokenizer.ggml.tokens")
            .and_then(GgufValue::as_array)
        {
            Some(tokens) => tokens.len(),
            None => match uint("vocab_size")? {
                Some(v) => v,
                None => file
                    .shape_of("token_embd.weight")
                    .and_then(|s| s.first().copied())
                    .ok_or_else(|| Error::config(&origin, "no token list and no token_embd"))?,
            },
        };
        let rope_scaling = match file
            .get(&key("rope.scaling.type"))
            .and_then(GgufValue::as_str)
        {
            None | Some("none") => None,
            Some(kind) => Some(RopeParameters {
                rope_type: Some(kind.to_string()),
                factor: float("rope.scaling.factor")?,
                original_max_position_embeddings: uint("rope.scaling.original_context_length")?,
                ..Default::default()
            }),
        };
        let special = file.special_tokens();
        let id = |t: Option<u32>| t.map(|t| TokenIds::One(i64::from(t)));
        let config = LlamaConfig {
            model_type: Some(arch.name().to_string()),
            vocab_size: vocab,
            hidden_size: hidden,
            intermediate_size: required("feed_forward_length")?,
            num_hidden_layers: required("block_count")?,
            num_attention_heads: heads,
            num_key_value_heads: uint("attention.head_count_kv")?,
            head_dim: uint("attention.key_length")?,
            hidden_act: Activation::Silu,
            max_position_embeddings: uint("context_length")?,
            rms_norm_eps: float("attention.layer_norm_rms_epsilon")?.unwrap_or(1e-6),
            tie_word_embeddings: !file.contains("output.weight"),
            attention_bias: false,
            mlp_bias: false,
            rope_parameters: None,
            rope_scaling,
            rope_theta: float("rope.freq_base")?,
            partial_rotary_factor: None,
            use_sliding_window: false,
            sliding_window: None,
            max_window_layers: None,
            layer_types: None,
            bos_token_id: id(special.bos),
            eos_token_id: id(special.eos),
            pad_token_id: special.pad.map(i64::from),
            architecture: arch,
        };
        config.validate(&origin)?;
        Ok(config)
    }
}

/// Whole-model tensors: (HF name, GGUF name).
const GLOBAL_NAMES: [(&str, &str); 3] = [
    ("model.embed_tokens.weight", "token_embd.weight"),
    ("model.norm.weight", "output_norm.weight"),
    ("lm_head.weight", "output.weight"),
];

/// Per-layer modules: (HF module under `model.layers.N`, GGUF module under `blk.N`).
const LAYER_NAMES: [(&str, &str); 9] = [
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
    ("input_layernorm", "attn_norm"),
    ("post_attention_layernorm", "ffn_norm"),
];

/// Renames through the tables, HF → GGUF or (`to_hf`) back.
fn rename(name: &str, to_hf: bool) -> Option<String> {
    let pick = |&(hf, gguf): &(&'static str, &'static str)| {
        if to_hf {
            (gguf, hf)
        } else {
            (hf, gguf)
        }
    };
    if let Some((_, to)) = GLOBAL_NAMES
        .iter()
        .map(pick)
        .find(|(from, _)| *from == name)
    {
        return Some(to.to_string());
    }
    let (from_prefix, to_prefix) = pick(&("model.layers.", "blk."));
    let (layer, rest) = name.strip_prefix(from_prefix)?.split_once('.')?;
    layer.parse::<usize>().ok()?;
    let (module, param) = rest.rsplit_once('.')?;
    let (_, to) = LAYER_NAMES
        .iter()
        .map(pick)
        .find(|(from, _)| *from == module)?;
    Some(format!("{to_prefix}{layer}.{to}.{param}"))
}

/// The GGUF tensor name of an HF tensor name of a LLaMA / Qwen2 checkpoint
/// (`model.layers.3.self_attn.q_proj.weight` → `blk.3.attn_q.weight`).
pub fn gguf_name(hf: &str) -> Option<String> {
    rename(hf, false)
}

/// The HF name of a GGUF tensor name (inverse of [`gguf_name`]).
pub fn hf_name(gguf: &str) -> Option<String> {
    rename(gguf, true)
}

/// Undoes llama.cpp's `permute` of a query / key projection with `heads` heads: the converter
/// stores row `2j + s` of each head where HF has row `s · head_dim/2 + j` (rotary halves
/// interleaved). Works on weights `[rows, in]` and biases `[rows]`.
pub fn unpermute_rows(values: &[f32], rows: usize, heads: usize) -> Result<Vec<f32>> {
    unpermute(values, rows, heads)
}

/// [`unpermute_rows`] on rows of any element: `values` is `rows` rows of equal length (the raw
/// blocks of a quantized weight: a row of blocks is a row of values, blocks lie along the
/// in-features).
pub fn unpermute<T: Copy + Default>(values: &[T], rows: usize, heads: usize) -> Result<Vec<T>> {
    if heads == 0 || rows == 0 || !rows.is_multiple_of(heads) || !(rows / heads).is_multiple_of(2) {
        return Err(Error::InvalidInput(format!(
            "cannot un-permute {rows} rows over {heads} heads"
        )));
    }
    if !values.len().is_multiple_of(rows) {
        return Err(Error::InvalidInput(format!(
            "{} values are not {rows} rows",
            values.len()
        )));
    }
    let width = values.len() / rows;
    let head_dim = rows / heads;
    let half = head_dim / 2;
    let mut out = vec![T::default(); values.len()];
    for h in 0..heads {
        for s in 0..2 {
            for j in 0..half {
                let hf = h * head_dim + s * half + j;
                let gg = h * head_dim + 2 * j + s;
                out[hf * width..(hf + 1) * width]
                    .copy_from_slice(&values[gg * width..(gg + 1) * width]);
            }
        }
    }
    Ok(out)
}

/// A GGUF file seen under HF tensor names, dequantized to f32 ([`TensorSource::tensor`]) or as
/// raw blocks ([`TensorSource::quantized_blocks`]); for the `llama` architecture the query / key
/// rows are un-permuted so HF's `rotate_half` RoPE applies.
pub struct GgufWeights {
    file: Arc<GgufFile>,
    arch: Architecture,
    heads: usize,
    kv_heads: usize,
}

impl GgufWeights {
    /// Wraps `file` for a model of `config` (heads decide the un-permutation).
    pub fn new(file: Arc<GgufFile>, config: &LlamaConfig) -> Self {
        GgufWeights {
            file,
            arch: config.architecture,
            heads: config.num_attention_heads,
            kv_heads: config.kv_heads(),
        }
    }

    fn permuted_heads(&self, hf: &str) -> Option<usize> {
        if self.arch != Architecture::Llama {
            return None;
        }
        if hf.contains(".self_attn.q_proj.") {
            Some(self.heads)
        } else if hf.contains(".self_attn.k_proj.") {
            Some(self.kv_heads)
        } else {
            None
        }
    }
}

impl TensorSource for GgufWeights {
    fn source_name(&self) -> String {
        self.file.source_name()
    }

    fn contains(&self, name: &str) -> bool {
        gguf_name(name).is_some_and(|g| self.file.contains(&g))
    }

    fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        self.file.shape_of(&gguf_name(name)?)
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        let gguf = gguf_name(name).ok_or_else(|| Error::MissingTensor {
            name: name.to_string(),
            source_name: format!("{} (no GGUF name for it)", self.file.source_name()),
        })?;
        let t = self.file.tensor(&gguf)?;
        match self.permuted_heads(name) {
            None => Ok(t),
            Some(heads) => {
                let rows = t.shape().first().copied().unwrap_or(0);
                let values = unpermute_rows(&t.to_f32_vec(), rows, heads).map_err(|e| {
                    Error::InvalidInput(format!("tensor `{gguf}` in {}: {e}", self.file.name()))
                })?;
                HostTensor::from_f32(t.shape().to_vec(), &values)
            }
        }
    }

    fn names(&self) -> Vec<String> {
        self.file
            .names()
            .iter()
            .filter_map(|n| hf_name(n))
            .collect()
    }

    /// The file's quantized blocks (a zero-copy slice of the map); LLaMA's query / key weights
    /// get their block rows un-permuted into an owned copy.
    fn quantized_blocks(&self, name: &str) -> Result<Option<QuantizedBlocks>> {
        let Some(gguf) = gguf_name(name) else {
            return Ok(None);
        };
        let Some(mut blocks) = self.file.quantized_blocks(&gguf)? else {
            return Ok(None);
        };
        if let Some(heads) = self.permuted_heads(name) {
            let rows = blocks.shape[0];
            let data = unpermute(&blocks.data, rows, heads).map_err(|e| {
                let ty = GgmlType::from_id(blocks.ggml_type).map_or("?", GgmlType::name);
                Error::InvalidInput(format!(
                    "tensor `{gguf}` ({ty}) in {}: {e}",
                    self.file.name()
                ))
            })?;
            blocks.data = data.into();
        }
        Ok(Some(blocks))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for hf in [
            "model.embed_tokens.weight",
            "model.norm.weight",
            "lm_head.weight",
            "model.layers.12.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.bias",
            "model.layers.3.mlp.down_proj.weight",
            "model.layers.3.post_attention_layernorm.weight",
        ] {
            let g = gguf_name(hf).unwrap();
            assert_eq!(hf_name(&g).as_deref(), Some(hf), "{g}");
        }
        assert_eq!(
            gguf_name("model.layers.1.self_attn.o_proj.weight").as_deref(),
            Some("blk.1.attn_output.weight")
        );
        assert!(gguf_name("model.layers.x.mlp.up_proj.weight").is_none());
        assert!(hf_name("rope_freqs.weight").is_none());
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // llama.cpp: w.reshape(heads, 2, d/2, in).swapaxes(1, 2).reshape(w.shape)
        let (heads, head_dim, width) = (2, 6, 3);
        let rows = heads * head_dim;
        let hf: Vec<f32> = (0..rows * width).map(|i| i as f32).collect();
        let mut permuted = vec![0f32; hf.len()];
        for h in 0..heads {
            for s in 0..2 {
                for j in 0..head_dim / 2 {
                    let src = h * head_dim + s * head_dim / 2 + j;
                    let dst = h * head_dim + j * 2 + s;
                    permuted[dst * width..(dst + 1) * width]
                        .copy_from_slice(&hf[src * width..(src + 1) * width]);
                }
            }
        }
        assert_ne!(permuted, hf);
        assert_eq!(unpermute_rows(&permuted, rows, heads).unwrap(), hf);
        assert!(unpermute_rows(&permuted, rows, 5).is_err());
    }
}
