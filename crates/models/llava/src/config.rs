//! `config.json` of LLaVA-1.5 and LLaVA-NeXT checkpoints (HF's `LlavaConfig` /
//! `LlavaNextConfig`): a CLIP vision sub-config, a LLaMA / Mistral / Qwen2 text sub-config and the
//! multimodal fields.

use std::path::Path;

use ipfs_accelerate_clip::ClipVisionConfig;
use ipfs_accelerate_core::{Error, JsonConfig, Result};
use ipfs_accelerate_llama::{Architecture, LlamaConfig};
use ipfs_accelerate_nn::Activation;

use crate::anyres::MAX_SIDE;
use serde_json::{json, Map, Value};

/// Which of the two models a checkpoint is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LlavaVariant {
    /// `LlavaForConditionalGeneration` (LLaVA-1.5): one fixed-size view per image.
    #[default]
    Llava,
    /// `LlavaNextForConditionalGeneration` (LLaVA-NeXT / 1.6): anyres base view + tiles, unpadded,
    /// with `image_newline` after every row of tile features.
    LlavaNext,
}

impl LlavaVariant {
    /// The `model_type` / family name (`llava`, `llava_next`).
    pub const fn name(self) -> &'static str {
        match self {
            LlavaVariant::Llava => "llava",
            LlavaVariant::LlavaNext => "llava_next",
        }
    }
}

/// `vision_feature_layer`: one hidden-state index of the vision tower, or several whose features
/// are concatenated (negative indices count from the end, as Python's).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(untagged)]
pub enum FeatureLayers {
    /// One layer (`-2` in LLaVA-1.5).
    One(i64),
    /// Several layers, features concatenated in this order.
    Many(Vec<i64>),
}

impl FeatureLayers {
    /// The indices as a list.
    pub fn to_vec(&self) -> Vec<i64> {
        match self {
            FeatureLayers::One(i) => vec![*i],
            FeatureLayers::Many(v) => v.clone(),
        }
    }
}

/// `vision_feature_select_strategy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum SelectStrategy {
    /// Drop the class token of every view.
    #[default]
    Default,
    /// Keep every token.
    Full,
}

/// The fields of HF's `LlavaConfig` / `LlavaNextConfig` this port uses, with the sub-configs
/// resolved as HF resolves them (absent sub-config → the class defaults; a text sub-config of
/// `model_type` `mistral` or `qwen2` becomes the matching [`LlamaConfig`]).
#[derive(Debug, Clone, serde::Deserialize)]
#[serde(try_from = "Value")]
pub struct LlavaConfig {
    /// `llava` or `llava_next` (from `model_type`; absent: the loading family decides).
    pub variant: LlavaVariant,
    /// Whether `model_type` named the variant.
    pub variant_stated: bool,
    /// The CLIP vision tower.
    pub vision_config: ClipVisionConfig,
    /// The language model.
    pub text_config: LlamaConfig,
    /// The placeholder id that image features replace (`image_token_id`, legacy
    /// `image_token_index`; HF default 32000).
    pub image_token_id: i64,
    /// Image tokens per image the processor of a LLaVA-1.5 checkpoint inserts (informative; the
    /// count is derived from the vision tower).
    pub image_seq_length: usize,
    /// Activation between the projector's two linear layers.
    pub projector_hidden_act: Activation,
    /// Which vision hidden state(s) feed the projector.
    pub vision_feature_layer: FeatureLayers,
    /// Whether the class token is dropped.
    pub vision_feature_select_strategy: SelectStrategy,
    /// Biases on the projector's linear layers.
    pub multimodal_projector_bias: bool,
    /// LLaVA-NeXT's candidate `(height, width)` resolutions (HF's default list when absent).
    pub image_grid_pinpoints: Vec<(usize, usize)>,
}

/// HF's defaults of the text sub-config classes for the fields [`LlamaConfig`] requires.
fn text_defaults(model_type: &str) -> Option<Value> {
    Some(match model_type {
        "llama" => json!({"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
            "num_hidden_layers": 32, "num_attention_heads": 32, "max_position_embeddings": 2048,
            "bos_token_id": 1, "eos_token_id": 2}),
        "mistral" => json!({"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
            "max_position_embeddings": 131072, "bos_token_id": 1, "eos_token_id": 2,
            "sliding_window": 4096}),
        "qwen2" => json!({"vocab_size": 151936, "hidden_size": 4096, "intermediate_size": 22016,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
            "max_position_embeddings": 32768}),
        _ => return None,
    })
}

/// `CLIPVisionConfig` with LLaVA's `init_kwargs`, used when `vision_config` is absent.
fn default_vision() -> Value {
    json!({"model_type": "clip_vision_model", "intermediate_size": 4096, "hidden_size": 1024,
        "patch_size": 14, "image_size": 336, "num_hidden_layers": 24, "num_attention_heads": 16})
}

fn object(v: Option<&Value>, key: &str) -> std::result::Result<Option<Map<String, Value>>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(m)) => Ok(Some(m.clone())),
        Some(other) => Err(format!("`{key}` must be an object, got {other}")),
    }
}

fn field<T: serde::de::DeserializeOwned>(
    root: &Map<String, Value>,
    key: &str,
    default: T,
) -> std::result::Result<T, String> {
    match root.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(v) => serde_json::from_value(v.clone()).map_err(|e| format!("`{key}`: {e}")),
    }
}

fn text_config(
    raw: Option<Map<String, Value>>,
    tie: bool,
) -> std::result::Result<LlamaConfig, String> {
    let mut text = raw.unwrap_or_default();
    let model_type = match text.get("model_type") {
        None | Some(Value::Null) => "llama".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(format!("`text_config.model_type` {other} is not a string")),
    };
    let defaults = text_defaults(&model_type).ok_or_else(|| {
        format!("text model `{model_type}` is not supported (llama, mistral or qwen2)")
    })?;
    if let Value::Object(d) = defaults {
        for (k, v) in d {
            text.entry(k).or_insert(v);
        }
    }
    if model_type == "mistral" {
        // Mistral is LLaMA without biases, plus a sliding window on every layer when set.
        if let Some(w) = text.get("sliding_window").filter(|w| !w.is_null()) {
            return Err(format!(
                "`text_config.sliding_window` {w}: sliding-window Mistral text models are not \
                 supported (only `null`)"
            ));
        }
        text.insert("model_type".into(), Value::String("llama".into()));
        text.insert("attention_bias".into(), Value::Bool(false));
        text.insert("mlp_bias".into(), Value::Bool(false));
    }
    if tie {
        text.insert("tie_word_embeddings".into(), Value::Bool(true));
    }
    let json = Value::Object(text).to_string();
    LlamaConfig::from_json(&json, Path::new("text_config"), Architecture::Llama)
        .map_err(|e| format!("text_config: {e}"))
}

impl TryFrom<Value> for LlavaConfig {
    type Error = String;

    fn try_from(v: Value) -> std::result::Result<Self, String> {
        let Value::Object(root) = v else {
            return Err("config.json is not a JSON object".into());
        };
        let (variant, variant_stated) = match root.get("model_type") {
            None | Some(Value::Null) => (LlavaVariant::Llava, false),
            Some(Value::String(t)) if t == "llava" => (LlavaVariant::Llava, true),
            Some(Value::String(t)) if t == "llava_next" => (LlavaVariant::LlavaNext, true),
            Some(other) => {
                return Err(format!(
                    "model_type {other} is not a LLaVA or LLaVA-NeXT checkpoint"
                ))
            }
        };
        let vision = object(root.get("vision_config"), "vision_config")?
            .map(Value::Object)
            .unwrap_or_else(default_vision);
        match vision.get("model_type") {
            None | Some(Value::Null) => {}
            Some(Value::String(t)) if t == "clip_vision_model" => {}
            Some(other) => {
                return Err(format!(
                    "vision tower {other} is not supported (clip_vision_model only)"
                ))
            }
        }
        let vision_config: ClipVisionConfig =
            serde_json::from_value(vision).map_err(|e| format!("vision_config: {e}"))?;
        let text_raw = object(root.get("text_config"), "text_config")?;
        let text_tie = text_raw
            .as_ref()
            .and_then(|t| t.get("tie_word_embeddings"))
            .and_then(Value::as_bool)
            .unwrap_or(false);
        let tie = field(&root, "tie_word_embeddings", false)? || text_tie;
        let text_config = text_config(text_raw, tie)?;
        let image_token_id = match root.get("image_token_id").filter(|v| !v.is_null()) {
            Some(_) => field(&root, "image_token_id", 0i64)?,
            None => field(&root, "image_token_index", 32000i64)?,
        };
        let pinpoints: Option<Vec<[usize; 2]>> = field(&root, "image_grid_pinpoints", None)?;
        let image_grid_pinpoints = pinpoints
            .map(|p| p.into_iter().map(|[h, w]| (h, w)).collect())
            .unwrap_or_else(|| vec![(336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)]);
        Ok(LlavaConfig {
            variant,
            variant_stated,
            vision_config,
            text_config,
            image_token_id,
            image_seq_length: field(&root, "image_seq_length", 576usize)?,
            projector_hidden_act: field(&root, "projector_hidden_act", Activation::Gelu)?,
            vision_feature_layer: field(&root, "vision_feature_layer", FeatureLayers::One(-2))?,
            vision_feature_select_strategy: field(
                &root,
                "vision_feature_select_strategy",
                SelectStrategy::Default,
            )?,
            multimodal_projector_bias: field(&root, "multimodal_projector_bias", true)?,
            image_grid_pinpoints,
        })
    }
}

impl JsonConfig for LlavaConfig {
    fn validate(&self, origin: &Path) -> Result<()> {
        let bad = |reason: String| Err(Error::config(origin, reason));
        self.text_config
            .validate(origin)
            .map_err(|e| Error::config(origin, format!("text_config: {e}")))?;
        self.vision_config.check(origin, "vision_config")?;
        let layers = self.vision_config.num_hidden_layers;
        let indices = self.vision_feature_layer.to_vec();
        if indices.is_empty() {
            return bad("`vision_feature_layer` is an empty list".into());
        }
        for i in indices {
            if resolve_layer(i, layers).is_none() {
                return bad(format!(
                    "`vision_feature_layer` {i} is not a hidden state of a {layers}-layer vision \
                     tower (valid: -{} ..= {layers})",
                    layers + 1
                ));
            }
        }
        let vocab = self.text_config.vocab_size as i64;
        if !(0..vocab).contains(&self.image_token_id) {
            return bad(format!(
                "`image_token_id` {} is outside the vocabulary of {vocab}",
                self.image_token_id
            ));
        }
        if self.variant == LlavaVariant::LlavaNext {
            let size = self.vision_config.image_size;
            if self.image_grid_pinpoints.is_empty() {
                return bad("`image_grid_pinpoints` is empty".into());
            }
            if let Some((h, w)) = self.image_grid_pinpoints.iter().find(|(h, w)| {
                *h == 0 || *w == 0 || h % size != 0 || w % size != 0 || (*h).max(*w) > MAX_SIDE
            }) {
                return bad(format!(
                    "`image_grid_pinpoints` entry [{h}, {w}] is not a positive multiple of the \
                     vision image_size {size} (at most {MAX_SIDE})"
                ));
            }
            if self.vision_feature_select_strategy == SelectStrategy::Full {
                // HF's pack_image_features reshapes each tile to the patch grid, which a class
                // token breaks (its view / newline concatenation fails).
                return bad(
                    "`vision_feature_select_strategy` \"full\" keeps CLIP's class token, which \
                     LLaVA-NeXT's tile packing cannot reshape (use \"default\")"
                        .into(),
                );
            }
        }
        Ok(())
    }
}

/// The index into HF's `hidden_states` tuple (`layers + 1` entries) of a possibly negative
/// `vision_feature_layer` entry: the number of encoder layers run.
pub fn resolve_layer(index: i64, layers: usize) -> Option<usize> {
    let count = layers as i64 + 1;
    let i = if index < 0 { count + index } else { index };
    (0..count).contains(&i).then_some(i as usize)
}

impl LlavaConfig {
    /// Reads `config.json` as `variant` when `model_type` is absent; a `model_type` naming the
    /// other variant is an error.
    pub fn from_file_as(path: &Path, variant: LlavaVariant) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json_as(&text, path, variant)
    }

    /// Parses config JSON as `variant` (see [`from_file_as`](Self::from_file_as)).
    pub fn from_json_as(text: &str, origin: &Path, variant: LlavaVariant) -> Result<Self> {
        let mut config: LlavaConfig =
            serde_json::from_str(text).map_err(|e| Error::config(origin, e.to_string()))?;
        if config.variant_stated && config.variant != variant {
            return Err(Error::config(
                origin,
                format!(
                    "a {} checkpoint cannot be loaded as {}",
                    config.variant.name(),
                    variant.name()
                ),
            ));
        }
        config.variant = variant;
        if variant == LlavaVariant::Llava {
            // Only LLaVA-NeXT has candidate resolutions.
            config.image_grid_pinpoints.clear();
        }
        config.validate(origin)?;
        Ok(config)
    }

    /// Vision patches per side of one view.
    pub fn grid(&self) -> usize {
        self.vision_config.grid()
    }

    /// The encoder depths (`hidden_states` indices) whose features are concatenated.
    pub fn feature_layers(&self) -> Vec<usize> {
        let layers = self.vision_config.num_hidden_layers;
        self.vision_feature_layer
            .to_vec()
            .into_iter()
            .filter_map(|i| resolve_layer(i, layers))
            .collect()
    }

    /// Tokens of one view after feature selection (`grid²`, plus the class token with `full`).
    pub fn tokens_per_view(&self) -> usize {
        let g = self.grid();
        g * g + usize::from(self.vision_feature_select_strategy == SelectStrategy::Full)
    }

    /// The number of features an image of original `(height, width)` gives (the size matters
    /// for LLaVA-NeXT only): what its `<image>` placeholder must be expanded to.
    pub fn image_feature_count(&self, image_size: (usize, usize)) -> Result<usize> {
        let base = self.tokens_per_view();
        match self.variant {
            LlavaVariant::Llava => Ok(base),
            LlavaVariant::LlavaNext => {
                Ok(crate::AnyresLayout::new(self, image_size)?.feature_count(base))
            }
        }
    }

    /// Expands each image placeholder (`image_token_id`) of a tokenised prompt into as many image
    /// tokens as the corresponding image (of original `(height, width)`, in order) gives
    /// features, as HF's processor does to each `<image>`.
    pub fn expand_image_tokens(
        &self,
        prompt: &[u32],
        image_sizes: &[(usize, usize)],
    ) -> Result<Vec<u32>> {
        let counts = image_sizes
            .iter()
            .map(|&s| self.image_feature_count(s))
            .collect::<Result<Vec<_>>>()?;
        let token = u32::try_from(self.image_token_id)
            .map_err(|_| Error::InvalidInput("image_token_id is negative".into()))?;
        crate::expand_image_tokens(prompt, token, &counts)
    }
}
