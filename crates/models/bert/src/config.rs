//! `config.json` of BERT checkpoints.

use ipfs_accelerate_core::JsonConfig;
use std::collections::BTreeMap;
use std::path::Path;

use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::Activation;

/// The fields of HF's `BertConfig` this port uses.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct BertConfig {
    /// `bert`, or one of the BERT-architecture encoders in [`BERT_LIKE_MODEL_TYPES`].
    #[serde(default)]
    pub model_type: Option<String>,
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

/// The `model_type`s with BERT's architecture that this crate loads: BERT itself, and the
/// RoBERTa family (RoBERTa, XLM-RoBERTa, CamemBERT: BERT's layers with positions counted from
/// `pad_token_id + 1` and the tensors under `roberta.`).
pub const BERT_LIKE_MODEL_TYPES: [&str; 4] = ["bert", "roberta", "xlm-roberta", "camembert"];

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
        if let Some(t) = &self.model_type {
            if !BERT_LIKE_MODEL_TYPES.contains(&t.as_str()) {
                return bad(format!(
                    "model_type `{t}` is not a BERT-architecture encoder ({})",
                    BERT_LIKE_MODEL_TYPES.join(", ")
                ));
            }
        }
        if let Some(pad) = self.position_padding_idx() {
            if pad < 0 || pad as usize + 1 >= self.max_position_embeddings {
                return bad(format!(
                    "pad_token_id {pad} leaves no positions of the {} (RoBERTa counts them from \
                     pad_token_id + 1)",
                    self.max_position_embeddings
                ));
            }
        }
        Ok(())
    }

    /// RoBERTa-family encoders number positions from `pad_token_id + 1` (padding keeps
    /// `pad_token_id`): the padding index, or `None` for BERT's `0..seq`.
    pub fn position_padding_idx(&self) -> Option<i64> {
        match self.model_type.as_deref() {
            Some("roberta" | "xlm-roberta" | "camembert") => Some(self.pad_token_id.unwrap_or(1)),
            _ => None,
        }
    }

    /// The longest input in tokens: the position table, less RoBERTa's offset.
    pub fn max_sequence_length(&self) -> usize {
        match self.position_padding_idx() {
            Some(pad) => self
                .max_position_embeddings
                .saturating_sub(pad.max(0) as usize + 1),
            None => self.max_position_embeddings,
        }
    }

    /// The head named by `architectures` (the bare model when none is named).
    pub fn head(&self) -> BertHead {
        // BertFor..., RobertaFor..., XLMRobertaFor..., CamembertFor...
        let arch = self.architectures.first().map(String::as_str).unwrap_or("");
        match arch.split_once("For").map(|(_, task)| task) {
            Some("SequenceClassification") => BertHead::SequenceClassification,
            Some("TokenClassification") => BertHead::TokenClassification,
            Some("QuestionAnswering") => BertHead::QuestionAnswering,
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
