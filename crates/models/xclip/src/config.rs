//! `config.json` of X-CLIP checkpoints (`XCLIPConfig` with its text and vision sub-configs).

use std::path::Path;

use ipfs_accelerate_clip::{check_tower, ClipTextConfig, ClipVisionConfig};
use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::Activation;

/// HF's `XCLIPVisionConfig`: a CLIP vision tower plus the frame count and the multi-frame
/// integration transformer (MIT) sizes.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct XclipVisionConfig {
    /// The CLIP-style fields (sizes, patches, activation, epsilon).
    #[serde(flatten)]
    pub base: ClipVisionConfig,
    /// Frames per video; the cross-frame attention and the MIT positions are built for exactly
    /// this many.
    #[serde(default = "eight")]
    pub num_frames: usize,
    /// MIT width (the class tokens enter it after `visual_projection`, so it equals
    /// `projection_dim`).
    #[serde(default = "mit_hidden")]
    pub mit_hidden_size: usize,
    /// MIT MLP inner width.
    #[serde(default = "mit_inter")]
    pub mit_intermediate_size: usize,
    /// MIT layers.
    #[serde(default = "one")]
    pub mit_num_hidden_layers: usize,
    /// MIT attention heads.
    #[serde(default = "eight")]
    pub mit_num_attention_heads: usize,
}

/// HF's `XCLIPConfig`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct XclipConfig {
    /// The text tower (a CLIP text transformer; X-CLIP always pools at the largest token id,
    /// HF's forced legacy `eos_token_id = 2`, whatever the config says).
    pub text_config: ClipTextConfig,
    /// The vision tower.
    pub vision_config: XclipVisionConfig,
    /// Width of the shared embedding space.
    #[serde(default = "projection")]
    pub projection_dim: usize,
    /// Layers of the video-specific prompt generator.
    #[serde(default = "two")]
    pub prompt_layers: usize,
    /// Initial prompt scale (the checkpoint's `prompts_generator.alpha` is used).
    #[serde(default = "alpha")]
    pub prompt_alpha: f64,
    /// Activation of the prompt generator's MLP.
    #[serde(default = "quick_gelu")]
    pub prompt_hidden_act: Activation,
    /// Heads of the prompt generator's cross-attention.
    #[serde(default = "eight")]
    pub prompt_num_attention_heads: usize,
    /// Initial `logit_scale` (the checkpoint's value is used).
    #[serde(default = "logit_scale")]
    pub logit_scale_init_value: f64,
}

fn one() -> usize {
    1
}
fn two() -> usize {
    2
}
fn eight() -> usize {
    8
}
fn mit_hidden() -> usize {
    512
}
fn mit_inter() -> usize {
    2048
}
fn projection() -> usize {
    512
}
fn alpha() -> f64 {
    0.1
}
fn quick_gelu() -> Activation {
    Activation::QuickGelu
}
fn logit_scale() -> f64 {
    2.6592
}

impl ipfs_accelerate_core::JsonConfig for XclipConfig {
    fn validate(&self, origin: &Path) -> Result<()> {
        self.text_config.check(origin, "text_config")?;
        let v = &self.vision_config;
        v.base.check(origin, "vision_config")?;
        check_tower(
            origin,
            "vision_config",
            &[
                ("num_frames", v.num_frames),
                ("mit_hidden_size", v.mit_hidden_size),
                ("mit_intermediate_size", v.mit_intermediate_size),
                ("mit_num_attention_heads", v.mit_num_attention_heads),
            ],
            v.mit_hidden_size,
            v.mit_num_attention_heads,
            v.base.layer_norm_eps,
        )?;
        let p = self.projection_dim;
        let heads = self.prompt_num_attention_heads;
        if p == 0 || heads == 0 || !p.is_multiple_of(heads) {
            return Err(Error::config(
                origin,
                format!(
                    "`projection_dim` {p} must be positive and divisible by \
                     `prompt_num_attention_heads` {heads}"
                ),
            ));
        }
        if v.mit_hidden_size != p {
            return Err(Error::config(
                origin,
                format!(
                    "`vision_config.mit_hidden_size` {} differs from `projection_dim` {p}: the MIT \
                     runs on the projected class tokens",
                    v.mit_hidden_size
                ),
            ));
        }
        Ok(())
    }
}

impl XclipConfig {
    /// The text tower's config as the CLIP text transformer reads it, with HF's forced legacy
    /// pooling (`eos_token_id = 2`: the position of the largest id).
    pub fn clip_text_config(&self) -> ClipTextConfig {
        ClipTextConfig {
            eos_token_id: ipfs_accelerate_clip::TokenIds::One(2),
            ..self.text_config.clone()
        }
    }
}
