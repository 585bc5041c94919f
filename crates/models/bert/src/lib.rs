//! # ipfs-accelerate-bert
//!
//! A port of HF transformers' `modeling_bert.py`: [`BertModel`] (embeddings, encoder, pooler) and the
//! heads of `BertForSequenceClassification`, `BertForTokenClassification` and
//! `BertForQuestionAnswering`, generic over burn's `Backend`. Post-processing lives here too:
//! sentence-transformers pooling, label softmax, and the best question-answering span.
//!
//! Checkpoints load from HF's tensor names (with or without the `bert.` prefix heads use, and with
//! the legacy `LayerNorm.gamma` / `beta` spelling) through [`names::bert_names`].

mod config;
mod encoder_spec;
mod model;
pub mod names;
mod runner;
pub mod tasks;

pub use config::{preset, BertConfig, BertHead, BERT_LIKE_MODEL_TYPES};
pub use encoder_spec::{encoder_spec, encoder_spec_from, encoder_spec_under};
pub use ipfs_accelerate_core::roberta_position_ids;
pub use model::{Bert, BertModel, BertOutput, HeadLogits};
pub use runner::{BertFamily, BertInputs, BertRunner, BertTasks, HostLogits};
