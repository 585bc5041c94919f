//! `config.json` of CLIP checkpoints (`CLIPConfig` with its text and vision sub-configs).

use std::path::Path;

use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::Activation;

/// An integer or a list of integers (HF allows `eos_token_id` to be either; the first is used).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(untagged)]
pub enum TokenIds {
    /// One id.
    One(i64),
    /// Several ids.
    Many(Vec<i64>),
}

impl TokenIds {
    /// The id CLIP pools at.
    pub fn first(&self) -> Option<i64> {
        match self {
            TokenIds::One(i) => Some(*i),
            TokenIds::Many(v) => v.first().copied(),
        }
    }
}

/// HF's `CLIPTextConfig`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ClipTextConfig {
    /// Vocabulary size.
    #[serde(default = "t_vocab")]
    pub vocab_size: usize,
    /// Model width.
    #[serde(default = "t_hidden")]
    pub hidden_size: usize,
    /// MLP inner width.
    #[serde(default = "t_inter")]
    pub intermediate_size: usize,
    /// Encoder layers.
    #[serde(default = "twelve")]
    pub num_hidden_layers: usize,
    /// Attention heads.
    #[serde(default = "t_heads")]
    pub num_attention_heads: usize,
    /// Learned positions (the longest input).
    #[serde(default = "t_positions")]
    pub max_position_embeddings: usize,
    /// MLP activation.
    #[serde(default = "quick_gelu")]
    pub hidden_act: Activation,
    /// Layer-norm epsilon.
    #[serde(default = "eps")]
    pub layer_norm_eps: f64,
    /// End-of-text id: the text is pooled at its first occurrence (at the largest id when it is
    /// the legacy value 2).
    #[serde(default = "t_eos")]
    pub eos_token_id: TokenIds,
}

/// HF's `CLIPVisionConfig`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ClipVisionConfig {
    /// Model width.
    #[serde(default = "v_hidden")]
    pub hidden_size: usize,
    /// MLP inner width.
    #[serde(default = "v_inter")]
    pub intermediate_size: usize,
    /// Encoder layers.
    #[serde(default = "twelve")]
    pub num_hidden_layers: usize,
    /// Attention heads.
    #[serde(default = "twelve")]
    pub num_attention_heads: usize,
    /// Input channels.
    #[serde(default = "three")]
    pub num_channels: usize,
    /// Image size the position embeddings were trained for.
    #[serde(default = "v_image")]
    pub image_size: usize,
    /// Patch size.
    #[serde(default = "v_patch")]
    pub patch_size: usize,
    /// MLP activation.
    #[serde(default = "quick_gelu")]
    pub hidden_act: Activation,
    /// Layer-norm epsilon.
    #[serde(default = "eps")]
    pub layer_norm_eps: f64,
}

/// HF's `CLIPConfig`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ClipConfig {
    /// The text tower.
    pub text_config: ClipTextConfig,
    /// The vision tower.
    pub vision_config: ClipVisionConfig,
    /// Width of the shared embedding space.
    #[serde(default = "projection")]
    pub projection_dim: usize,
    /// Initial `logit_scale` (the checkpoint's value is used).
    #[serde(default = "logit_scale")]
    pub logit_scale_init_value: f64,
}

fn t_vocab() -> usize {
    49408
}
fn t_hidden() -> usize {
    512
}
fn t_inter() -> usize {
    2048
}
fn twelve() -> usize {
    12
}
fn t_heads() -> usize {
    8
}
fn t_positions() -> usize {
    77
}
fn quick_gelu() -> Activation {
    Activation::QuickGelu
}
fn eps() -> f64 {
    1e-5
}
fn t_eos() -> TokenIds {
    TokenIds::One(49407)
}
fn v_hidden() -> usize {
    768
}
fn v_inter() -> usize {
    3072
}
fn three() -> usize {
    3
}
fn v_image() -> usize {
    224
}
fn v_patch() -> usize {
    32
}
fn projection() -> usize {
    512
}
fn logit_scale() -> f64 {
    2.6592
}

/// Validates one tower's sizes: every `(field, value)` positive, `hidden` divisible by `heads`,
/// `eps` finite and non-negative; errors name `tower.field` (shared with X-CLIP).
pub fn check_tower(
    origin: &Path,
    tower: &str,
    sizes: &[(&str, usize)],
    hidden: usize,
    heads: usize,
    eps: f64,
) -> Result<()> {
    for (name, v) in sizes {
        if *v == 0 {
            return Err(Error::config(
                origin,
                format!("`{tower}.{name}` must be positive"),
            ));
        }
    }
    if !hidden.is_multiple_of(heads) {
        return Err(Error::config(
            origin,
            format!("{tower}: hidden_size {hidden} is not divisible by {heads} heads"),
        ));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(Error::config(
            origin,
            format!("{tower}: layer_norm_eps {eps} is invalid"),
        ));
    }
    Ok(())
}

impl ipfs_accelerate_core::JsonConfig for ClipConfig {
    fn validate(&self, origin: &Path) -> Result<()> {
        self.check(origin)
    }
}

impl ClipConfig {
    fn check(&self, origin: &Path) -> Result<()> {
        self.text_config.check(origin, "text_config")?;
        self.vision_config.check(origin, "vision_config")?;
        if self.projection_dim == 0 {
            return Err(Error::config(origin, "`projection_dim` must be positive"));
        }
        Ok(())
    }
}

impl ClipTextConfig {
    /// Validates the sizes (positive, width divisible by heads), epsilon and `eos_token_id`;
    /// errors name the field under `tower` (`text_config`). Shared with X-CLIP.
    pub fn check(&self, origin: &Path, tower: &str) -> Result<()> {
        let t = self;
        check_tower(
            origin,
            tower,
            &[
                ("vocab_size", t.vocab_size),
                ("hidden_size", t.hidden_size),
                ("intermediate_size", t.intermediate_size),
                ("num_attention_heads", t.num_attention_heads),
                ("max_position_embeddings", t.max_position_embeddings),
            ],
            t.hidden_size,
            t.num_attention_heads,
            t.layer_norm_eps,
        )?;
        if t.eos_token_id.first().is_none() {
            return Err(Error::config(
                origin,
                format!("`{tower}.eos_token_id` is empty"),
            ));
        }
        Ok(())
    }
}

impl ClipVisionConfig {
    /// Validates the sizes (positive, width divisible by heads, at least one patch) and epsilon;
    /// errors name the field under `tower` (`vision_config`). Shared with X-CLIP.
    pub fn check(&self, origin: &Path, tower: &str) -> Result<()> {
        let v = self;
        check_tower(
            origin,
            tower,
            &[
                ("hidden_size", v.hidden_size),
                ("intermediate_size", v.intermediate_size),
                ("num_attention_heads", v.num_attention_heads),
                ("num_channels", v.num_channels),
                ("patch_size", v.patch_size),
                (
                    "image_size / patch_size",
                    v.image_size / v.patch_size.max(1),
                ),
            ],
            v.hidden_size,
            v.num_attention_heads,
            v.layer_norm_eps,
        )
    }
}

impl ClipVisionConfig {
    /// Patches per side at the configured image size.
    pub fn grid(&self) -> usize {
        self.image_size / self.patch_size
    }
}
