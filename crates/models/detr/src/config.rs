//! `config.json` of DETR checkpoints (HF `DetrConfig` with an HF `ResNetConfig` backbone).

use std::collections::BTreeMap;
use std::path::Path;

use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::Activation;

/// The layer type of a ResNet stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResNetLayerType {
    /// Two 3x3 convolutions (ResNet-18/34).
    Basic,
    /// 1x1 reduce, 3x3, 1x1 expand by 4 (ResNet-50 and deeper).
    Bottleneck,
}

/// The fields of HF's `ResNetConfig` the backbone uses.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ResNetConfig {
    /// Must be `resnet`.
    #[serde(default = "default_resnet")]
    pub model_type: String,
    /// Input channels.
    #[serde(default = "default_channels")]
    pub num_channels: usize,
    /// Channels of the stem convolution.
    #[serde(default = "default_embedding_size")]
    pub embedding_size: usize,
    /// Output channels of each stage.
    #[serde(default = "default_hidden_sizes")]
    pub hidden_sizes: Vec<usize>,
    /// Layers per stage.
    #[serde(default = "default_depths")]
    pub depths: Vec<usize>,
    /// Basic or bottleneck layers.
    #[serde(default = "default_layer_type")]
    pub layer_type: ResNetLayerType,
    /// Activation of the stem and of each layer's output (inner convolutions always use ReLU).
    #[serde(default = "default_act")]
    pub hidden_act: Activation,
    /// Whether the first stage downsamples (stride 2).
    #[serde(default)]
    pub downsample_in_first_stage: bool,
    /// Whether a bottleneck strides in its first 1x1 convolution instead of the 3x3.
    #[serde(default)]
    pub downsample_in_bottleneck: bool,
    /// Names of the stages whose feature maps the backbone returns (`stem`, `stage1`, ...).
    #[serde(default)]
    pub out_features: Option<Vec<String>>,
    /// Indices of those stages (0 is the stem).
    #[serde(default)]
    pub out_indices: Option<Vec<i64>>,
    /// Stage names (`stem`, `stage1`, ...).
    #[serde(default)]
    pub stage_names: Option<Vec<String>>,
}

/// The fields of HF's `DetrConfig` this port uses.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct DetrConfig {
    /// Architectures (`DetrForObjectDetection`).
    #[serde(default)]
    pub architectures: Vec<String>,
    /// The backbone's config; only HF ResNet (`model_type` `resnet`) is supported.
    #[serde(default)]
    pub backbone_config: Option<serde_json::Value>,
    /// Whether the backbone comes from timm (unsupported).
    #[serde(default)]
    pub use_timm_backbone: Option<bool>,
    /// Object queries (detection slots).
    #[serde(default = "default_queries")]
    pub num_queries: usize,
    /// Transformer width.
    #[serde(default = "default_d_model")]
    pub d_model: usize,
    /// Encoder layers.
    #[serde(default = "default_layers")]
    pub encoder_layers: usize,
    /// Encoder feed-forward width.
    #[serde(default = "default_ffn")]
    pub encoder_ffn_dim: usize,
    /// Encoder attention heads.
    #[serde(default = "default_heads")]
    pub encoder_attention_heads: usize,
    /// Decoder layers.
    #[serde(default = "default_layers")]
    pub decoder_layers: usize,
    /// Decoder feed-forward width.
    #[serde(default = "default_ffn")]
    pub decoder_ffn_dim: usize,
    /// Decoder attention heads.
    #[serde(default = "default_heads")]
    pub decoder_attention_heads: usize,
    /// Feed-forward activation.
    #[serde(default = "default_act")]
    pub activation_function: Activation,
    /// `sine` or `learned`.
    #[serde(default = "default_pos_type")]
    pub position_embedding_type: String,
    /// Label names of the classes (without the no-object class).
    #[serde(default)]
    pub id2label: BTreeMap<String, String>,
    /// Number of classes when `id2label` is absent.
    #[serde(default)]
    pub num_labels: Option<usize>,
    /// The parsed backbone config (filled by validation).
    #[serde(skip)]
    pub backbone: Option<ResNetConfig>,
}

fn default_resnet() -> String {
    "resnet".into()
}
fn default_channels() -> usize {
    3
}
fn default_embedding_size() -> usize {
    64
}
fn default_hidden_sizes() -> Vec<usize> {
    vec![256, 512, 1024, 2048]
}
fn default_depths() -> Vec<usize> {
    vec![3, 4, 6, 3]
}
fn default_layer_type() -> ResNetLayerType {
    ResNetLayerType::Bottleneck
}
fn default_act() -> Activation {
    Activation::Relu
}
fn default_queries() -> usize {
    100
}
fn default_d_model() -> usize {
    256
}
fn default_layers() -> usize {
    6
}
fn default_ffn() -> usize {
    2048
}
fn default_heads() -> usize {
    8
}
fn default_pos_type() -> String {
    "sine".into()
}

/// The layer-norm epsilon of DETR's transformer (PyTorch's `nn.LayerNorm` default).
pub const LAYER_NORM_EPS: f64 = 1e-5;
/// The epsilon of `DetrFrozenBatchNorm2d`.
pub const BATCH_NORM_EPS: f64 = 1e-5;

impl ResNetConfig {
    /// Number of stages.
    pub fn num_stages(&self) -> usize {
        self.depths.len()
    }

    /// The index of the feature map DETR uses: the last of `out_indices` / `out_features`
    /// (0 = stem, `i` = stage `i`), the last stage when neither is given.
    pub fn out_stage(&self) -> Result<usize> {
        let n = self.num_stages();
        let bad = |why: String| Err(Error::config("backbone_config", why));
        if let Some(idx) = self.out_indices.as_ref().and_then(|v| v.last()) {
            let i = if *idx < 0 { n as i64 + 1 + idx } else { *idx };
            if i < 0 || i > n as i64 {
                return bad(format!("out_indices {idx} is outside 0..={n}"));
            }
            return Ok(i as usize);
        }
        if let Some(name) = self.out_features.as_ref().and_then(|v| v.last()) {
            let names = self.stage_names();
            return match names.iter().position(|s| s == name) {
                Some(i) => Ok(i),
                None => bad(format!("out_features `{name}` is not one of {names:?}")),
            };
        }
        Ok(n)
    }

    /// `stem`, `stage1`, ... (from the config when given).
    pub fn stage_names(&self) -> Vec<String> {
        match &self.stage_names {
            Some(v) if v.len() == self.num_stages() + 1 => v.clone(),
            _ => std::iter::once("stem".to_string())
                .chain((1..=self.num_stages()).map(|i| format!("stage{i}")))
                .collect(),
        }
    }

    /// Channels of feature map `index` (0 = stem).
    pub fn channels_of(&self, index: usize) -> usize {
        if index == 0 {
            self.embedding_size
        } else {
            self.hidden_sizes[index - 1]
        }
    }

    fn validate(&self, origin: &Path) -> Result<()> {
        let bad = |reason: String| Err(Error::config(origin, format!("backbone_config: {reason}")));
        if self.model_type != "resnet" {
            return bad(format!(
                "backbone `{}` is not supported (only the HF ResNet backbone)",
                self.model_type
            ));
        }
        if self.num_channels == 0 || self.embedding_size == 0 {
            return bad("num_channels and embedding_size must be positive".into());
        }
        if self.depths.is_empty() || self.depths.len() != self.hidden_sizes.len() {
            return bad(format!(
                "depths {:?} and hidden_sizes {:?} must be non-empty and of equal length",
                self.depths, self.hidden_sizes
            ));
        }
        let min = match self.layer_type {
            ResNetLayerType::Basic => 1,
            ResNetLayerType::Bottleneck => 4,
        };
        if let Some(h) = self.hidden_sizes.iter().find(|&&h| h < min) {
            return bad(format!(
                "hidden size {h} is too small for {:?} layers (minimum {min})",
                self.layer_type
            ));
        }
        self.out_stage().map_err(|e| match e {
            Error::InvalidConfig { reason, .. } => Error::config(origin, reason),
            other => other,
        })?;
        Ok(())
    }
}

impl DetrConfig {
    /// Reads and validates `config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json(&text, path)
    }

    /// Parses and validates config JSON (`origin` names it in errors).
    pub fn from_json(text: &str, origin: &Path) -> Result<Self> {
        let mut cfg: DetrConfig =
            serde_json::from_str(text).map_err(|e| Error::config(origin, e.to_string()))?;
        cfg.backbone = Some(cfg.parse_backbone(origin)?);
        cfg.validate(origin)?;
        Ok(cfg)
    }

    fn parse_backbone(&self, origin: &Path) -> Result<ResNetConfig> {
        let bad = |reason: String| Err(Error::config(origin, reason));
        let Some(value) = &self.backbone_config else {
            return bad(
                "no backbone_config: the timm backbone (use_timm_backbone) is not supported, \
                 only the HF ResNet backbone"
                    .into(),
            );
        };
        let model_type = value.get("model_type").and_then(|v| v.as_str());
        if model_type != Some("resnet") {
            return bad(format!(
                "backbone model_type {model_type:?} is not supported (only the HF ResNet backbone, \
                 `resnet`; timm backbones are not)"
            ));
        }
        if self.use_timm_backbone == Some(true) {
            return bad("use_timm_backbone is true: timm backbones are not supported".into());
        }
        let backbone: ResNetConfig = serde_json::from_value(value.clone())
            .map_err(|e| Error::config(origin, format!("backbone_config: {e}")))?;
        backbone.validate(origin)?;
        Ok(backbone)
    }

    fn validate(&self, origin: &Path) -> Result<()> {
        let bad = |reason: String| Err(Error::config(origin, reason));
        for (name, v) in [
            ("d_model", self.d_model),
            ("num_queries", self.num_queries),
            ("encoder_ffn_dim", self.encoder_ffn_dim),
            ("decoder_ffn_dim", self.decoder_ffn_dim),
            ("encoder_attention_heads", self.encoder_attention_heads),
            ("decoder_attention_heads", self.decoder_attention_heads),
            ("num_labels", self.num_labels()),
        ] {
            if v == 0 {
                return bad(format!("`{name}` must be positive"));
            }
        }
        for heads in [self.encoder_attention_heads, self.decoder_attention_heads] {
            if !self.d_model.is_multiple_of(heads) {
                return bad(format!(
                    "d_model {} is not divisible by {heads} attention heads",
                    self.d_model
                ));
            }
        }
        match self.position_embedding_type.as_str() {
            // d_model / 2 features per axis, interleaved sin / cos pairs.
            "sine" if !self.d_model.is_multiple_of(4) => bad(format!(
                "sine position embeddings need d_model divisible by 4, got {}",
                self.d_model
            )),
            "learned" if !self.d_model.is_multiple_of(2) => bad(format!(
                "learned position embeddings need an even d_model, got {}",
                self.d_model
            )),
            "sine" | "learned" => Ok(()),
            other => bad(format!(
                "position_embedding_type `{other}` is not supported (`sine` or `learned`)"
            )),
        }
    }

    /// The backbone config (present after [`DetrConfig::from_json`]).
    pub fn backbone(&self) -> Result<&ResNetConfig> {
        self.backbone
            .as_ref()
            .ok_or_else(|| Error::config("config.json", "backbone_config was not parsed"))
    }

    /// Number of object classes (the classifier has one more: no object).
    pub fn num_labels(&self) -> usize {
        ipfs_accelerate_core::label_count(&self.id2label, self.num_labels)
    }

    /// The label name of class `i` (`LABEL_i` when the config names none).
    pub fn label(&self, i: usize) -> String {
        ipfs_accelerate_core::label_name(&self.id2label, i)
    }
}
