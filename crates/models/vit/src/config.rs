//! `config.json` of ViT checkpoints.

use std::collections::BTreeMap;
use std::path::Path;

use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::Activation;

/// An integer or a `[height, width]` pair (HF accepts both for `image_size` and `patch_size`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(untagged)]
pub enum Size2 {
    /// Square.
    Square(usize),
    /// `[height, width]`.
    Pair([usize; 2]),
}

impl Size2 {
    /// `(height, width)`.
    pub fn hw(self) -> (usize, usize) {
        match self {
            Size2::Square(s) => (s, s),
            Size2::Pair([h, w]) => (h, w),
        }
    }
}

/// The fields of HF's `ViTConfig` this port uses.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct VitConfig {
    /// Model width.
    #[serde(default = "d_hidden")]
    pub hidden_size: usize,
    /// Encoder layers.
    #[serde(default = "d_layers")]
    pub num_hidden_layers: usize,
    /// Attention heads.
    #[serde(default = "d_heads")]
    pub num_attention_heads: usize,
    /// MLP inner width.
    #[serde(default = "d_inter")]
    pub intermediate_size: usize,
    /// MLP activation.
    #[serde(default = "d_act")]
    pub hidden_act: Activation,
    /// Layer-norm epsilon.
    #[serde(default = "d_eps")]
    pub layer_norm_eps: f64,
    /// Image size the position embeddings were trained for.
    #[serde(default = "d_image")]
    pub image_size: Size2,
    /// Patch size (square patches only).
    #[serde(default = "d_patch")]
    pub patch_size: Size2,
    /// Input channels.
    #[serde(default = "d_channels")]
    pub num_channels: usize,
    /// Whether query / key / value projections have biases.
    #[serde(default = "d_true")]
    pub qkv_bias: bool,
    /// Pooler output width (`hidden_size` when absent).
    #[serde(default)]
    pub pooler_output_size: Option<usize>,
    /// Pooler activation.
    #[serde(default = "d_pooler_act")]
    pub pooler_act: Activation,
    /// Architectures (picks the head).
    #[serde(default)]
    pub architectures: Vec<String>,
    /// Label names of the classification head.
    #[serde(default)]
    pub id2label: BTreeMap<String, String>,
    /// Number of labels when `id2label` is absent.
    #[serde(default)]
    pub num_labels: Option<usize>,
}

fn d_hidden() -> usize {
    768
}
fn d_layers() -> usize {
    12
}
fn d_heads() -> usize {
    12
}
fn d_inter() -> usize {
    3072
}
fn d_act() -> Activation {
    Activation::Gelu
}
fn d_eps() -> f64 {
    1e-12
}
fn d_image() -> Size2 {
    Size2::Square(224)
}
fn d_patch() -> Size2 {
    Size2::Square(16)
}
fn d_channels() -> usize {
    3
}
fn d_true() -> bool {
    true
}
fn d_pooler_act() -> Activation {
    Activation::Tanh
}

/// Which head a ViT checkpoint carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VitHead {
    /// `ViTModel`: last_hidden_state and (when the checkpoint has one) pooler_output.
    Base,
    /// `ViTForImageClassification`: logits from the final-normed CLS token.
    ImageClassification,
}

impl ipfs_accelerate_core::JsonConfig for VitConfig {
    fn validate(&self, origin: &Path) -> Result<()> {
        self.check(origin)
    }
}

impl VitConfig {
    fn check(&self, origin: &Path) -> Result<()> {
        let bad = |reason: String| Err(Error::config(origin, reason));
        let (ih, iw) = self.image_size.hw();
        let (ph, pw) = self.patch_size.hw();
        for (name, v) in [
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("num_channels", self.num_channels),
            ("image_size", ih.min(iw)),
            ("patch_size", ph.min(pw)),
        ] {
            if v == 0 {
                return bad(format!("`{name}` must be positive"));
            }
        }
        if ph != pw {
            return bad(format!("non-square patches {ph}x{pw} are not supported"));
        }
        if ih < ph || iw < pw {
            return bad(format!(
                "image_size {ih}x{iw} is smaller than one {ph}x{pw} patch"
            ));
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return bad(format!(
                "hidden_size {} is not divisible by num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps >= 0.0) {
            return bad(format!("layer_norm_eps {} is invalid", self.layer_norm_eps));
        }
        Ok(())
    }

    /// The head named by `architectures` (the bare model when none is named).
    pub fn head(&self) -> VitHead {
        match self.architectures.first().map(String::as_str) {
            Some("ViTForImageClassification") => VitHead::ImageClassification,
            _ => VitHead::Base,
        }
    }

    /// Number of labels of the classification head.
    pub fn num_labels(&self) -> usize {
        ipfs_accelerate_core::label_count(&self.id2label, self.num_labels)
    }

    /// The label name of class `i` (`LABEL_i` when the config names none).
    pub fn label(&self, i: usize) -> String {
        ipfs_accelerate_core::label_name(&self.id2label, i)
    }

    /// Patch side in pixels.
    pub fn patch(&self) -> usize {
        self.patch_size.hw().0
    }

    /// The `(rows, columns)` patch grid at the configured image size.
    pub fn grid(&self) -> (usize, usize) {
        let (h, w) = self.image_size.hw();
        (h / self.patch(), w / self.patch())
    }
}
