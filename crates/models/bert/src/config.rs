//! `config.json` of BERT checkpoints.

use ipfs_accelerate_core::JsonConfig;
use std::collections::BTreeMap;
use std::path::Path;

use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::Activation;

/// The fields of HF's `BertConfig` this port uses.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct BertConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Hidden size.
    pub hidden_size: usize,
    /// Encoder layers.
    pub num_hidden_layers: usize,
    /// Attention heads.
    pub num_attention_heads: usize,
    /// Feed-forward inner size.
    pub intermediate_size: usize,
    /// Feed-forward activation.
    #[serde(default = "default_act")]
    pub hidden_act: Activation,
    /// Learned absolute positions.
    pub max_position_embeddings: usize,
    /// Segment (token type) vocabulary.
    #[serde(default = "default_type_vocab")]
    pub type_vocab_size: usize,
    /// Layer-norm epsilon.
    #[serde(default = "default_eps")]
    pub layer_norm_eps: f64,
    /// Padding token id.
    #[serde(default)]
    pub pad_token_id: Option<i64>,
    /// Only `absolute` is supported.
    #[serde(default = "default_pos_type")]
    pub position_embedding_type: String,
    /// Architectures (picks the head).
    #[serde(default)]
    pub architectures: Vec<String>,
    /// Label names of classification heads.
    #[serde(default)]
    pub id2label: BTreeMap<String, String>,
    /// Number of labels when `id2label` is absent.
    #[serde(default)]
    pub num_labels: Option<usize>,
}

fn default_act() -> Activation {
    Activation::Gelu
}
fn default_type_vocab() -> usize {
    2
}
fn default_eps() -> f64 {
    1e-12
}
fn default_pos_type() -> String {
    "absolute".into()
}

/// Which head a checkpoint carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BertHead {
    /// The bare encoder (`BertModel`): last_hidden_state and pooler_output.
    Base,
    /// `BertForSequenceClassification`: logits `[batch, labels]` from the pooled output.
    SequenceClassification,
    /// `BertForTokenClassification`: logits `[batch, seq, labels]`.
    TokenClassification,
    /// `BertForQuestionAnswering`: start and end logits `[batch, seq]`.
    QuestionAnswering,
}

impl ipfs_accelerate_core::JsonConfig for BertConfig {
    fn validate(&self, origin: &Path) -> Result<()> {
        self.check(origin)
    }
}

impl BertConfig {
    fn check(&self, origin: &Path) -> Result<()> {
        let bad = |reason: String| Err(Error::config(origin, reason));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("num_attention_heads", self.num_attention_heads),
            ("intermediate_size", self.intermediate_size),
            ("max_position_embeddings", self.max_position_embeddings),
            ("type_vocab_size", self.type_vocab_size),
        ] {
            if v == 0 {
                return bad(format!("`{name}` must be positive"));
            }
        }
        if !self.hidden_size.is_multiple_of(self.num_attention_heads) {
            return bad(format!(
                "hidden_size {} is not divisible by num_attention_heads {}",
                self.hidden_size, self.num_attention_heads
            ));
        }
        if self.position_embedding_type != "absolute" {
            return bad(format!(
                "position_embedding_type `{}` is not supported (only `absolute`)",
                self.position_embedding_type
            ));
        }
        if !(self.layer_norm_eps.is_finite() && self.layer_norm_eps >= 0.0) {
            return bad(format!("layer_norm_eps {} is invalid", self.layer_norm_eps));
        }
        Ok(())
    }

    /// The head named by `architectures` (the bare model when none is named).
    pub fn head(&self) -> BertHead {
        match self.architectures.first().map(String::as_str) {
            Some("BertForSequenceClassification") => BertHead::SequenceClassification,
            Some("BertForTokenClassification") => BertHead::TokenClassification,
            Some("BertForQuestionAnswering") => BertHead::QuestionAnswering,
            _ => BertHead::Base,
        }
    }

    /// Number of labels of a classification head.
    pub fn num_labels(&self) -> usize {
        ipfs_accelerate_core::label_count(&self.id2label, self.num_labels)
    }

    /// The label name of class `i` (`LABEL_i` when the config names none).
    pub fn label(&self, i: usize) -> String {
        ipfs_accelerate_core::label_name(&self.id2label, i)
    }

    /// Size of one attention head.
    pub fn head_dim(&self) -> usize {
        self.hidden_size / self.num_attention_heads
    }
}

/// Named configurations of well-known checkpoints, for benchmarks with random weights:
/// `bert-base` (bert-base-uncased), `bert-large`, `minilm-l6` (all-MiniLM-L6-v2).
pub fn preset(name: &str) -> Option<BertConfig> {
    let (hidden, layers, heads, inter) = match name {
        "bert-base" => (768, 12, 12, 3072),
        "bert-large" => (1024, 24, 16, 4096),
        "minilm-l6" | "all-MiniLM-L6-v2" => (384, 6, 12, 1536),
        _ => return None,
    };
    let json = format!(
        r#"{{"model_type":"bert","vocab_size":30522,"hidden_size":{hidden},"num_hidden_layers":{layers},
            "num_attention_heads":{heads},"intermediate_size":{inter},"max_position_embeddings":512}}"#
    );
    BertConfig::from_json(&json, Path::new(name)).ok()
}
