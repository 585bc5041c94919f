//! `config.json` of LLaMA and Qwen2 checkpoints (HF's `LlamaConfig` / `Qwen2Config`).

use std::path::Path;

use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::rope::{RopeConfig, RopeParameters};
use ipfs_accelerate_nn::Activation;

/// Which of the two decoders a checkpoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Architecture {
    /// `LlamaForCausalLM`: projection biases from `attention_bias` / `mlp_bias`.
    #[default]
    Llama,
    /// `Qwen2ForCausalLM`: biases on q / k / v (never on o or the MLP), optional sliding window.
    Qwen2,
}

impl Architecture {
    /// The `model_type` / family name (`llama`, `qwen2`).
    pub fn name(self) -> &'static str {
        match self {
            Architecture::Llama => "llama",
            Architecture::Qwen2 => "qwen2",
        }
    }

    /// The architecture named by a `model_type` (or GGUF `general.architecture`).
    pub fn from_name(name: &str) -> Option<Self> {
        match name {
            "llama" => Some(Architecture::Llama),
            "qwen2" => Some(Architecture::Qwen2),
            _ => None,
        }
    }
}

/// One id or a list of ids (`eos_token_id` may be either).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    /// A single id.
    One(i64),
    /// Several ids.
    Many(Vec<i64>),
}

impl TokenIds {
    /// The ids as a list.
    pub fn to_vec(&self) -> Vec<i64> {
        match self {
            TokenIds::One(i) => vec![*i],
            TokenIds::Many(v) => v.clone(),
        }
    }
}

/// The fields of HF's `LlamaConfig` / `Qwen2Config` this port uses. Optional fields hold what
/// `config.json` says; the accessor methods apply HF's defaults for the architecture.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct LlamaConfig {
    /// `llama` or `qwen2` (absent: the family loading it decides).
    #[serde(default)]
    pub model_type: Option<String>,
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// MLP inner size.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key / value heads (grouped-query attention); `None` means `num_attention_heads`.
    #[serde(default)]
    pub num_key_value_heads: Option<usize>,
    /// Width of one head; `None` means `hidden_size / num_attention_heads`.
    #[serde(default)]
    pub head_dim: Option<usize>,
    /// MLP activation.
    #[serde(default = "default_act")]
    pub hidden_act: Activation,
    /// Longest supported context (HF default 2048 for LLaMA, 32768 for Qwen2).
    #[serde(default)]
    pub max_position_embeddings: Option<usize>,
    /// RMSNorm epsilon.
    #[serde(default = "default_eps")]
    pub rms_norm_eps: f64,
    /// Whether `lm_head` shares the token embedding.
    #[serde(default)]
    pub tie_word_embeddings: bool,
    /// LLaMA: bias on the four attention projections.
    #[serde(default)]
    pub attention_bias: bool,
    /// LLaMA: bias on the MLP projections.
    #[serde(default)]
    pub mlp_bias: bool,
    /// RoPE parameters (transformers ≥ 5).
    #[serde(default)]
    pub rope_parameters: Option<RopeParameters>,
    /// RoPE scaling (transformers < 5).
    #[serde(default)]
    pub rope_scaling: Option<RopeParameters>,
    /// RoPE base (transformers < 5).
    #[serde(default)]
    pub rope_theta: Option<f64>,
    /// Fraction of each head that is rotated.
    #[serde(default)]
    pub partial_rotary_factor: Option<f64>,
    /// Qwen2: whether sliding-window layers exist.
    #[serde(default)]
    pub use_sliding_window: bool,
    /// Qwen2: the window (HF default 4096).
    #[serde(default)]
    pub sliding_window: Option<usize>,
    /// Qwen2: layers from this index on use the window (HF default 28).
    #[serde(default)]
    pub max_window_layers: Option<usize>,
    /// Qwen2: `full_attention` / `sliding_attention` per layer.
    #[serde(default)]
    pub layer_types: Option<Vec<String>>,
    /// Beginning-of-sequence token.
    #[serde(default)]
    pub bos_token_id: Option<TokenIds>,
    /// End-of-sequence token(s).
    #[serde(default)]
    pub eos_token_id: Option<TokenIds>,
    /// Padding token.
    #[serde(default)]
    pub pad_token_id: Option<i64>,
    /// The architecture (from `model_type`, or the loading family's).
    #[serde(skip)]
    pub architecture: Architecture,
}

fn default_act() -> Activation {
    Activation::Silu
}
fn default_eps() -> f64 {
    1e-6
}

impl LlamaConfig {
    /// Reads and validates `config.json`; `default` is the architecture when `model_type` is absent.
    pub fn from_file(path: &Path, default: Architecture) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json(&text, path, default)
    }

    /// Parses and validates config JSON (`origin` names it in errors).
    pub fn from_json(text: &str, origin: &Path, default: Architecture) -> Result<Self> {
        let mut cfg: LlamaConfig =
            serde_json::from_str(text).map_err(|e| Error::config(origin, e.to_string()))?;
        cfg.architecture = match cfg.model_type.as_deref() {
            None => default,
            Some(t) => Architecture::from_name(t).ok_or_else(|| {
                Error::config(
                    origin,
                    format!("model_type `{t}` is not a LLaMA or Qwen2 decoder"),
                )
            })?,
        };
        cfg.validate(origin)?;
        Ok(cfg)
    }

    /// Checks sizes, head layout, RoPE parameters and layer types.
    pub fn validate(&self, origin: &Path) -> Result<()> {
        let bad = |reason: String| Err(Error::config(origin, reason));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.kv_heads()),
            ("head_dim", self.head_dim()),
            ("max_position_embeddings", self.max_position_embeddings()),
        ] {
            if v == 0 {
                return bad(format!("`{name}` must be positive"));
            }
        }
        if self.head_dim.is_none() && !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return bad(format!(
                "hidden_size {} is not divisible by num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !self.num_attention_heads.is_multiple_of(self.kv_heads()) {
            return bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads,
                self.kv_heads()
            ));
        }
        if !(self.rms_norm_eps.is_finite() && self.rms_norm_eps >= 0.0) {
            return bad(format!("rms_norm_eps {} is invalid", self.rms_norm_eps));
        }
        if let Some(types) = &self.layer_types {
            if types.len() != self.num_hidden_layers {
                return bad(format!(
                    "layer_types has {} entries for {} layers",
                    types.len(),
                    self.num_hidden_layers
                ));
            }
            if let Some(t) = types
                .iter()
                .find(|t| !matches!(t.as_str(), "full_attention" | "sliding_attention"))
            {
                return bad(format!("layer type `{t}` is not supported"));
            }
        }
        if self.sliding_window() == Some(0) {
            return bad("sliding_window must be positive".into());
        }
        self.rope()
            .map_err(|e| Error::config(origin, e.to_string()))?;
        Ok(())
    }

    /// Key / value heads.
    pub fn kv_heads(&self) -> usize {
        self.num_key_value_heads.unwrap_or(self.num_attention_heads)
    }

    /// Width of one head.
    pub fn head_dim(&self) -> usize {
        self.head_dim
            .unwrap_or(self.hidden_size / self.num_attention_heads.max(1))
    }

    /// Longest context, with HF's per-architecture default.
    pub fn max_position_embeddings(&self) -> usize {
        self.max_position_embeddings
            .unwrap_or(match self.architecture {
                Architecture::Llama => 2048,
                Architecture::Qwen2 => 32768,
            })
    }

    /// The rotary embedding, resolved as `LlamaRotaryEmbedding` does: the `default` kind rotates
    /// the whole head (`partial_rotary_factor` is ignored there); scaled kinds rotate
    /// `int(head_dim * partial_rotary_factor)` features, which must then be the whole head since
    /// LLaMA's `apply_rotary_pos_emb` has no pass-through part.
    pub fn rope(&self) -> Result<RopeConfig> {
        let params = RopeParameters::standardize(
            self.rope_parameters.as_ref(),
            self.rope_scaling.as_ref(),
            self.rope_theta,
            self.partial_rotary_factor,
        );
        let head_dim = self.head_dim();
        let rope = if params.kind() == "default" {
            RopeParameters {
                partial_rotary_factor: None,
                ..params
            }
            .resolve(head_dim, self.max_position_embeddings())?
        } else {
            params.resolve(head_dim, self.max_position_embeddings())?
        };
        if rope.rotary_dim != head_dim {
            return Err(Error::InvalidInput(format!(
                "partial rotary embeddings ({} of {head_dim} features) are not supported by {}",
                rope.rotary_dim,
                self.architecture.name()
            )));
        }
        Ok(rope)
    }

    /// Qwen2's window when sliding layers are enabled (`sliding_window` only counts with
    /// `use_sliding_window`, as `Qwen2Config.__post_init__` does).
    pub fn sliding_window(&self) -> Option<usize> {
        match self.architecture {
            Architecture::Qwen2 if self.use_sliding_window => {
                Some(self.sliding_window.unwrap_or(4096))
            }
            _ => None,
        }
    }

    /// The attention window of layer `i` (`None`: full causal attention).
    pub fn layer_window(&self, i: usize) -> Option<usize> {
        let window = self.sliding_window()?;
        let sliding = match &self.layer_types {
            Some(types) => types.get(i).is_some_and(|t| t == "sliding_attention"),
            None => i >= self.max_window_layers.unwrap_or(28),
        };
        sliding.then_some(window)
    }

    /// The id padding columns get: `pad_token_id` when it is in the vocabulary, else 0 (masked
    /// out either way).
    pub fn padding_id(&self) -> i64 {
        self.pad_token_id
            .filter(|&p| p >= 0 && (p as usize) < self.vocab_size)
            .unwrap_or(0)
    }

    /// Generation defaults of this checkpoint: greedy, stopping at its EOS token(s).
    pub fn default_generation_config(&self) -> ipfs_accelerate_nn::generate::GenerationConfig {
        ipfs_accelerate_nn::generate::GenerationConfig {
            stop_tokens: self.eos_token_ids(),
            ..Default::default()
        }
    }

    /// Bytes the weights take as f32, as a float load holds them (a tied head as its own
    /// transposed copy).
    pub fn float_weight_bytes(&self) -> usize {
        let stored: usize = self
            .weight_shapes()
            .iter()
            .map(|(_, shape)| shape.iter().product::<usize>())
            .sum();
        let tied = if self.tie_word_embeddings {
            self.vocab_size * self.hidden_size
        } else {
            0
        };
        4 * (stored + tied)
    }

    /// Biases of the q, k, v, o projections.
    pub fn attention_biases(&self) -> ipfs_accelerate_nn::attention::ProjectionBias {
        use ipfs_accelerate_nn::attention::ProjectionBias;
        match self.architecture {
            Architecture::Llama if self.attention_bias => ProjectionBias::ALL,
            Architecture::Llama => ProjectionBias::NONE,
            Architecture::Qwen2 => ProjectionBias {
                q: true,
                k: true,
                v: true,
                o: false,
            },
        }
    }

    /// Bias of the MLP projections.
    pub fn mlp_biases(&self) -> bool {
        self.architecture == Architecture::Llama && self.mlp_bias
    }

    /// Every weight tensor a checkpoint of this configuration holds, under HF's names, with its
    /// shape (for random-weight benchmarks and tests through `RandomWeights`).
    pub fn weight_shapes(&self) -> Vec<(String, Vec<usize>)> {
        let (h, inter) = (self.hidden_size, self.intermediate_size);
        let q = self.num_attention_heads * self.head_dim();
        let kv = self.kv_heads() * self.head_dim();
        let mut out = vec![
            (
                "model.embed_tokens.weight".to_string(),
                vec![self.vocab_size, h],
            ),
            ("model.norm.weight".to_string(), vec![h]),
        ];
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![self.vocab_size, h]));
        }
        let bias = self.attention_biases();
        let mlp_bias = self.mlp_biases();
        for i in 0..self.num_hidden_layers {
            let p = format!("model.layers.{i}");
            for (name, out_dim, in_dim, has_bias) in [
                ("self_attn.q_proj", q, h, bias.q),
                ("self_attn.k_proj", kv, h, bias.k),
                ("self_attn.v_proj", kv, h, bias.v),
                ("self_attn.o_proj", h, q, bias.o),
                ("mlp.gate_proj", inter, h, mlp_bias),
                ("mlp.up_proj", inter, h, mlp_bias),
                ("mlp.down_proj", h, inter, mlp_bias),
            ] {
                out.push((format!("{p}.{name}.weight"), vec![out_dim, in_dim]));
                if has_bias {
                    out.push((format!("{p}.{name}.bias"), vec![out_dim]));
                }
            }
            for norm in ["input_layernorm", "post_attention_layernorm"] {
                out.push((format!("{p}.{norm}.weight"), vec![h]));
            }
        }
        out
    }

    /// End-of-sequence ids (for stopping generation).
    pub fn eos_token_ids(&self) -> Vec<u32> {
        self.eos_token_id
            .as_ref()
            .map(TokenIds::to_vec)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|i| u32::try_from(i).ok())
            .collect()
    }
}
