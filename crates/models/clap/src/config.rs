//! `config.json` of CLAP checkpoints (`ClapConfig` with its text and audio sub-configs).

use std::path::Path;

use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::Activation;

/// An integer or a list of integers (HF's `patch_size` / `patch_stride` accept both).
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(untagged)]
pub enum IntOrPair {
    /// The same value for both dimensions.
    One(usize),
    /// `[height, width]`.
    Many(Vec<usize>),
}

impl IntOrPair {
    /// `[height, width]`, `None` for a list that is not two long.
    pub fn pair(&self) -> Option<[usize; 2]> {
        match self {
            IntOrPair::One(v) => Some([*v, *v]),
            IntOrPair::Many(v) => <[usize; 2]>::try_from(v.as_slice()).ok(),
        }
    }
}

/// HF's `ClapTextConfig` (a RoBERTa encoder).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ClapTextConfig {
    /// Vocabulary size.
    #[serde(default = "t_vocab")]
    pub vocab_size: usize,
    /// Model width.
    #[serde(default = "t_hidden")]
    pub hidden_size: usize,
    /// Encoder layers.
    #[serde(default = "twelve")]
    pub num_hidden_layers: usize,
    /// Attention heads.
    #[serde(default = "twelve")]
    pub num_attention_heads: usize,
    /// Feed-forward inner width.
    #[serde(default = "t_inter")]
    pub intermediate_size: usize,
    /// Feed-forward activation.
    #[serde(default = "gelu")]
    pub hidden_act: Activation,
    /// Learned positions (RoBERTa numbers them from `pad_token_id + 1`).
    #[serde(default = "t_positions")]
    pub max_position_embeddings: usize,
    /// Segment vocabulary (the model always uses segment 0).
    #[serde(default = "one")]
    pub type_vocab_size: usize,
    /// Layer-norm epsilon.
    #[serde(default = "t_eps")]
    pub layer_norm_eps: f64,
    /// Padding id: padding tokens keep position `pad_token_id`.
    #[serde(default = "t_pad")]
    pub pad_token_id: Option<i64>,
}

/// HF's `ClapAudioConfig` (the HTSAT Swin transformer).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ClapAudioConfig {
    /// Attention window side.
    #[serde(default = "eight")]
    pub window_size: usize,
    /// Mel bins of the input features.
    #[serde(default = "a_mels")]
    pub num_mel_bins: usize,
    /// Side of the square "image" the spectrogram is folded into.
    #[serde(default = "a_spec")]
    pub spec_size: usize,
    /// MLP activation.
    #[serde(default = "gelu")]
    pub hidden_act: Activation,
    /// Patch-embedding kernel.
    #[serde(default = "four")]
    pub patch_size: IntOrPair,
    /// Patch-embedding stride.
    #[serde(default = "four")]
    pub patch_stride: IntOrPair,
    /// Width of the last stage (must equal `patch_embeds_hidden_size · 2^(stages − 1)`).
    #[serde(default = "a_hidden")]
    pub hidden_size: usize,
    /// Blocks per stage.
    #[serde(default = "a_depths")]
    pub depths: Vec<usize>,
    /// Heads per stage.
    #[serde(default = "a_heads")]
    pub num_attention_heads: Vec<usize>,
    /// Feature fusion (not supported).
    #[serde(default)]
    pub enable_fusion: bool,
    /// Fusion variant (only read when fusion is on).
    #[serde(default)]
    pub fusion_type: Option<String>,
    /// Channels of the input features.
    #[serde(default = "one")]
    pub patch_embed_input_channels: usize,
    /// Whether patch embeddings are flattened to tokens (must be true).
    #[serde(default = "yes")]
    pub flatten_patch_embeds: bool,
    /// Width of the first stage.
    #[serde(default = "a_patch_hidden")]
    pub patch_embeds_hidden_size: usize,
    /// Layer norm after the patch embedding.
    #[serde(default = "yes")]
    pub enable_patch_layer_norm: bool,
    /// Whether query / key / value projections have biases.
    #[serde(default = "yes")]
    pub qkv_bias: bool,
    /// MLP width as a multiple of the stage width.
    #[serde(default = "a_mlp_ratio")]
    pub mlp_ratio: f64,
    /// Layer-norm epsilon of the Swin blocks.
    #[serde(default = "a_eps")]
    pub layer_norm_eps: f64,
}

/// HF's `ClapConfig`.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ClapConfig {
    /// The text tower.
    pub text_config: ClapTextConfig,
    /// The audio tower.
    pub audio_config: ClapAudioConfig,
    /// Width of the shared embedding space (overrides the sub-configs', as HF does).
    #[serde(default = "projection")]
    pub projection_dim: usize,
    /// Activation between the two projection layers (overrides the sub-configs').
    #[serde(default = "relu")]
    pub projection_hidden_act: Activation,
}

fn t_vocab() -> usize {
    50265
}
fn t_hidden() -> usize {
    768
}
fn twelve() -> usize {
    12
}
fn t_inter() -> usize {
    3072
}
fn gelu() -> Activation {
    Activation::Gelu
}
fn relu() -> Activation {
    Activation::Relu
}
fn t_positions() -> usize {
    514
}
fn one() -> usize {
    1
}
fn t_eps() -> f64 {
    1e-12
}
fn t_pad() -> Option<i64> {
    Some(1)
}
fn eight() -> usize {
    8
}
fn a_mels() -> usize {
    64
}
fn a_spec() -> usize {
    256
}
fn four() -> IntOrPair {
    IntOrPair::One(4)
}
fn a_hidden() -> usize {
    768
}
fn a_depths() -> Vec<usize> {
    vec![2, 2, 6, 2]
}
fn a_heads() -> Vec<usize> {
    vec![4, 8, 16, 32]
}
fn yes() -> bool {
    true
}
fn a_patch_hidden() -> usize {
    96
}
fn a_mlp_ratio() -> f64 {
    4.0
}
fn a_eps() -> f64 {
    1e-5
}
fn projection() -> usize {
    512
}

fn positive(origin: &Path, sizes: &[(&str, usize)]) -> Result<()> {
    match sizes.iter().find(|(_, v)| *v == 0) {
        Some((name, _)) => Err(Error::config(origin, format!("`{name}` must be positive"))),
        None => Ok(()),
    }
}

fn valid_eps(origin: &Path, name: &str, eps: f64) -> Result<()> {
    if eps.is_finite() && eps >= 0.0 {
        Ok(())
    } else {
        Err(Error::config(origin, format!("`{name}` {eps} is invalid")))
    }
}

impl ipfs_accelerate_core::JsonConfig for ClapConfig {
    fn validate(&self, origin: &Path) -> Result<()> {
        if self.projection_dim == 0 {
            return Err(Error::config(origin, "`projection_dim` must be positive"));
        }
        self.text_config.check(origin)?;
        self.audio_config.check(origin)
    }
}

impl ClapTextConfig {
    fn check(&self, origin: &Path) -> Result<()> {
        positive(
            origin,
            &[
                ("text_config.vocab_size", self.vocab_size),
                ("text_config.hidden_size", self.hidden_size),
                ("text_config.num_attention_heads", self.num_attention_heads),
                ("text_config.intermediate_size", self.intermediate_size),
                (
                    "text_config.max_position_embeddings",
                    self.max_position_embeddings,
                ),
                ("text_config.type_vocab_size", self.type_vocab_size),
            ],
        )?;
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return Err(Error::config(
                origin,
                format!(
                    "text_config: hidden_size {} is not divisible by {} heads",
                    self.hidden_size, self.num_attention_heads
                ),
            ));
        }
        match self.pad_token_id {
            Some(p) if p >= 0 && (p as usize) < self.vocab_size => {}
            other => {
                return Err(Error::config(
                    origin,
                    format!(
                        "`text_config.pad_token_id` {other:?} must be an id below vocab_size {} \
                         (RoBERTa positions are counted from it)",
                        self.vocab_size
                    ),
                ))
            }
        }
        valid_eps(origin, "text_config.layer_norm_eps", self.layer_norm_eps)
    }

    /// The padding id (validated to be present).
    pub fn pad_id(&self) -> i64 {
        self.pad_token_id.unwrap_or(1)
    }
}

/// The geometry of the HTSAT audio tower derived from its config.
#[derive(Debug, Clone, PartialEq)]
pub struct HtsatGeometry {
    /// `spec_size / num_mel_bins`: how many time slices are stacked along the frequency axis.
    pub freq_ratio: usize,
    /// Time frames the features are resized to (`spec_size · freq_ratio`).
    pub spec_width: usize,
    /// Mel bins the features are resized to (`spec_size / freq_ratio`).
    pub spec_height: usize,
    /// Patch-embedding kernel `[h, w]`.
    pub patch: [usize; 2],
    /// Patch-embedding stride `[h, w]`.
    pub stride: [usize; 2],
    /// Patch-embedding zero padding `[h, w]`.
    pub padding: [usize; 2],
    /// Token grid `(rows, cols)` of each stage.
    pub resolutions: Vec<(usize, usize)>,
    /// Width of each stage.
    pub dims: Vec<usize>,
    /// MLP inner width of each stage.
    pub mlp_dims: Vec<usize>,
}

impl ClapAudioConfig {
    fn check(&self, origin: &Path) -> Result<()> {
        self.geometry_checked(origin).map(|_| ())
    }

    /// The derived geometry; only valid for a validated config (use after loading).
    pub fn geometry(&self) -> Result<HtsatGeometry> {
        self.geometry_checked(Path::new("audio_config"))
    }

    fn geometry_checked(&self, origin: &Path) -> Result<HtsatGeometry> {
        let bad = |reason: String| Err(Error::config(origin, format!("audio_config: {reason}")));
        if self.enable_fusion {
            return bad(format!(
                "feature fusion (enable_fusion, fusion_type {:?}) is not supported",
                self.fusion_type
            ));
        }
        if !self.flatten_patch_embeds {
            return bad("flatten_patch_embeds = false is not supported".into());
        }
        positive(
            origin,
            &[
                ("audio_config.window_size", self.window_size),
                ("audio_config.num_mel_bins", self.num_mel_bins),
                ("audio_config.spec_size", self.spec_size),
                (
                    "audio_config.patch_embed_input_channels",
                    self.patch_embed_input_channels,
                ),
                (
                    "audio_config.patch_embeds_hidden_size",
                    self.patch_embeds_hidden_size,
                ),
                ("audio_config.depths", self.depths.len()),
            ],
        )?;
        valid_eps(origin, "audio_config.layer_norm_eps", self.layer_norm_eps)?;
        if self.depths.len() != self.num_attention_heads.len() {
            return bad(format!(
                "{} stages in depths but {} in num_attention_heads",
                self.depths.len(),
                self.num_attention_heads.len()
            ));
        }
        let freq_ratio = self.spec_size / self.num_mel_bins;
        if freq_ratio == 0 {
            return bad(format!(
                "num_mel_bins {} is larger than spec_size {}",
                self.num_mel_bins, self.spec_size
            ));
        }
        let spec_height = self.spec_size / freq_ratio;
        if spec_height * freq_ratio != self.spec_size {
            return bad(format!(
                "spec_size {} is not a multiple of spec_size / num_mel_bins = {freq_ratio}",
                self.spec_size
            ));
        }
        let (Some(patch), Some(stride)) = (self.patch_size.pair(), self.patch_stride.pair()) else {
            return bad("patch_size and patch_stride must be an integer or two integers".into());
        };
        if patch.contains(&0) || stride.contains(&0) || patch[0] < stride[0] || patch[1] < stride[1]
        {
            return bad(format!(
                "patch_size {patch:?} must be positive and at least patch_stride {stride:?}"
            ));
        }
        let padding = [(patch[0] - stride[0]) / 2, (patch[1] - stride[1]) / 2];
        let mut grid = [0; 2];
        for i in 0..2 {
            let padded = self.spec_size + 2 * padding[i];
            let conv = padded.checked_sub(patch[i]).map(|v| v / stride[i] + 1);
            grid[i] = self.spec_size / stride[i];
            if conv != Some(grid[i]) || grid[i] == 0 {
                return bad(format!(
                    "the patch embedding of a {0}×{0} spectrogram gives {conv:?} patches, \
                     not spec_size / patch_stride = {1}",
                    self.spec_size, grid[i]
                ));
            }
        }
        let stages = self.depths.len();
        let mut resolutions = Vec::with_capacity(stages);
        let mut dims = Vec::with_capacity(stages);
        let mut mlp_dims = Vec::with_capacity(stages);
        for (i, &heads) in self.num_attention_heads.iter().enumerate() {
            let scale = 1usize << i;
            let res = (grid[0] / scale, grid[1] / scale);
            let dim = self.patch_embeds_hidden_size * scale;
            if i + 1 < stages && !(res.0.is_multiple_of(2) && res.1.is_multiple_of(2)) {
                return bad(format!(
                    "stage {i} has an odd token grid {res:?} and cannot be merged"
                ));
            }
            if res.0.min(res.1) < self.window_size {
                return bad(format!(
                    "stage {i} token grid {res:?} is smaller than window_size {}",
                    self.window_size
                ));
            }
            if heads == 0 || !dim.is_multiple_of(heads) {
                return bad(format!(
                    "stage {i} width {dim} is not divisible by {heads} heads"
                ));
            }
            let mlp = self.mlp_ratio * dim as f64;
            if !(mlp.is_finite() && mlp >= 1.0) {
                return bad(format!("mlp_ratio {} gives no MLP width", self.mlp_ratio));
            }
            resolutions.push(res);
            dims.push(dim);
            mlp_dims.push(mlp as usize);
        }
        let features = dims[stages - 1];
        if self.hidden_size != features {
            return bad(format!(
                "hidden_size {} differs from the last stage's width {features}",
                self.hidden_size
            ));
        }
        // HF's final fold of the token grid into (freq bins, time) before the average pool.
        let last = resolutions[stages - 1];
        let down = 1usize << (stages - 1);
        let freq = self.spec_size / down / stride[0];
        let time = self.spec_size / down / stride[1];
        let c_freq = freq / freq_ratio;
        if freq * time != last.0 * last.1 || c_freq == 0 || !freq.is_multiple_of(c_freq) {
            return bad(format!(
                "the last token grid {last:?} cannot be folded into {freq_ratio} frequency groups"
            ));
        }
        Ok(HtsatGeometry {
            freq_ratio,
            spec_width: self.spec_size * freq_ratio,
            spec_height,
            patch,
            stride,
            padding,
            resolutions,
            dims,
            mlp_dims,
        })
    }
}
