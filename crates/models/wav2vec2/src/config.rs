//! `config.json` of Wav2Vec2 checkpoints.

use std::path::Path;

use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::Activation;

/// How the convolutional feature encoder normalises.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FeatExtractNorm {
    /// Group norm (one group per channel) after the first convolution only (wav2vec2-base).
    Group,
    /// Layer norm over channels after every convolution (wav2vec2-large-lv60, XLS-R).
    Layer,
}

/// The fields of HF's `Wav2Vec2Config` this port uses (HF's defaults for absent ones).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct Wav2Vec2Config {
    /// CTC vocabulary size.
    #[serde(default = "d_vocab")]
    pub vocab_size: usize,
    /// Transformer width.
    #[serde(default = "d_hidden")]
    pub hidden_size: usize,
    /// Transformer layers.
    #[serde(default = "d_layers")]
    pub num_hidden_layers: usize,
    /// Attention heads.
    #[serde(default = "d_heads")]
    pub num_attention_heads: usize,
    /// Feed-forward size.
    #[serde(default = "d_inter")]
    pub intermediate_size: usize,
    /// Feed-forward activation.
    #[serde(default = "d_act")]
    pub hidden_act: Activation,
    /// Epsilon of the transformer's layer norms.
    #[serde(default = "d_eps")]
    pub layer_norm_eps: f64,
    /// Normalisation of the feature encoder.
    #[serde(default = "d_norm")]
    pub feat_extract_norm: FeatExtractNorm,
    /// Activation of the feature encoder and the positional convolution.
    #[serde(default = "d_act")]
    pub feat_extract_activation: Activation,
    /// Output channels of each feature-encoder convolution.
    #[serde(default = "d_conv_dim")]
    pub conv_dim: Vec<usize>,
    /// Strides of the feature-encoder convolutions.
    #[serde(default = "d_conv_stride")]
    pub conv_stride: Vec<usize>,
    /// Kernel sizes of the feature-encoder convolutions.
    #[serde(default = "d_conv_kernel")]
    pub conv_kernel: Vec<usize>,
    /// Whether the feature-encoder convolutions have biases.
    #[serde(default)]
    pub conv_bias: bool,
    /// Kernel of the positional convolution.
    #[serde(default = "d_pos_k")]
    pub num_conv_pos_embeddings: usize,
    /// Groups of the positional convolution.
    #[serde(default = "d_pos_g")]
    pub num_conv_pos_embedding_groups: usize,
    /// Pre-LN ("stable") transformer layers with a final layer norm instead of post-LN layers.
    #[serde(default)]
    pub do_stable_layer_norm: bool,
    /// The CTC blank (padding) token.
    #[serde(default)]
    pub pad_token_id: Option<usize>,
    /// Adapter layers after the encoder (not supported).
    #[serde(default)]
    pub add_adapter: bool,
    /// Attention adapters of MMS checkpoints (not supported).
    #[serde(default)]
    pub adapter_attn_dim: Option<usize>,
    /// Architectures (a CTC head when `Wav2Vec2ForCTC`).
    #[serde(default)]
    pub architectures: Vec<String>,
}

fn d_vocab() -> usize {
    32
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
    1e-5
}
fn d_norm() -> FeatExtractNorm {
    FeatExtractNorm::Group
}
fn d_conv_dim() -> Vec<usize> {
    vec![512; 7]
}
fn d_conv_stride() -> Vec<usize> {
    vec![5, 2, 2, 2, 2, 2, 2]
}
fn d_conv_kernel() -> Vec<usize> {
    vec![10, 3, 3, 3, 3, 2, 2]
}
fn d_pos_k() -> usize {
    128
}
fn d_pos_g() -> usize {
    16
}

impl ipfs_accelerate_core::JsonConfig for Wav2Vec2Config {
    fn validate(&self, origin: &Path) -> Result<()> {
        self.check(origin)
    }
}

impl Wav2Vec2Config {
    fn check(&self, origin: &Path) -> Result<()> {
        let bad = |reason: String| Err(Error::config(origin, reason));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("num_conv_pos_embeddings", self.num_conv_pos_embeddings),
            (
                "num_conv_pos_embedding_groups",
                self.num_conv_pos_embedding_groups,
            ),
        ] {
            if v == 0 {
                return bad(format!("`{name}` must be positive"));
            }
        }
        let n = self.conv_dim.len();
        if n == 0 || self.conv_stride.len() != n || self.conv_kernel.len() != n {
            return bad(format!(
                "conv_dim, conv_stride and conv_kernel must have the same non-zero length, got {}, {} and {}",
                n,
                self.conv_stride.len(),
                self.conv_kernel.len()
            ));
        }
        if self
            .conv_dim
            .iter()
            .chain(&self.conv_stride)
            .chain(&self.conv_kernel)
            .any(|v| *v == 0)
        {
            return bad("convolution sizes, strides and kernels must be positive".into());
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return bad(format!(
                "hidden_size {} is not divisible by num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if !self
            .hidden_size
            .is_multiple_of(self.num_conv_pos_embedding_groups)
        {
            return bad(format!(
                "hidden_size {} is not divisible by num_conv_pos_embedding_groups {}",
                self.hidden_size, self.num_conv_pos_embedding_groups
            ));
        }
        if self.add_adapter || self.adapter_attn_dim.is_some() {
            return bad("adapter layers (add_adapter / adapter_attn_dim) are not supported".into());
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps >= 0.0) {
            return bad(format!("layer_norm_eps {} is invalid", self.layer_norm_eps));
        }
        if let Some(p) = self.pad_token_id {
            if p >= self.vocab_size {
                return bad(format!(
                    "pad_token_id {p} is outside the vocabulary of {}",
                    self.vocab_size
                ));
            }
        }
        Ok(())
    }

    /// Whether the checkpoint carries a CTC head (`lm_head`).
    pub fn has_ctc_head(&self) -> bool {
        self.architectures.iter().any(|a| a.ends_with("ForCTC"))
    }

    /// Frames the feature encoder produces from `samples` input samples (HF's
    /// `_get_feat_extract_output_lengths`); `None` when the input is shorter than its receptive field.
    pub fn output_frames(&self, samples: usize) -> Option<usize> {
        self.conv_kernel
            .iter()
            .zip(&self.conv_stride)
            .try_fold(samples, |len, (&k, &s)| {
                len.checked_sub(k).map(|r| r / s + 1)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipfs_accelerate_core::JsonConfig;

    #[test]
    fn defaults_lengths_and_errors() {
        let c = Wav2Vec2Config::from_json("{}", Path::new("t")).unwrap();
        assert_eq!(c.conv_dim.len(), 7);
        assert_eq!(c.feat_extract_norm, FeatExtractNorm::Group);
        // wav2vec2-base: 1 s of 16 kHz audio gives 49 frames.
        assert_eq!(c.output_frames(16_000), Some(49));
        assert_eq!(c.output_frames(399), None);
        assert_eq!(c.output_frames(400), Some(1));
        for bad in [
            r#"{"conv_dim": [4, 4], "conv_stride": [2], "conv_kernel": [3, 3]}"#,
            r#"{"hidden_size": 30}"#,
            r#"{"feat_extract_norm": "batch"}"#,
            r#"{"add_adapter": true}"#,
            r#"{"pad_token_id": 40}"#,
            r#"{"conv_stride": [0, 2, 2, 2, 2, 2, 2]}"#,
        ] {
            assert!(
                Wav2Vec2Config::from_json(bad, Path::new("t")).is_err(),
                "{bad}"
            );
        }
    }
}
