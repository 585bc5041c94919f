//! The BERT encoder and its task heads.

use std::sync::Arc;

use burn::tensor::{backend::Backend, Int, Tensor};
use ipfs_accelerate_core::{roberta_position_ids, EncoderHead, Error, Result, TensorSource};
pub use ipfs_accelerate_nn::trunk::HeadLogits;
use ipfs_accelerate_nn::{
    convert::int_tensor,
    trunk::{head_logits, Trunk, TrunkOutput},
    Linear, VarBuilder,
};

use crate::{names, BertConfig, BertHead};

/// Outputs of the bare encoder: `last_hidden_state` `[batch, seq, hidden]` and, when the
/// checkpoint has a pooler, `pooler_output` `[batch, hidden]` (tanh(dense(first token))).
pub type BertOutput<B> = TrunkOutput<B>;

/// `BertModel`: embeddings, encoder layers and the optional pooler: BERT's description
/// ([`crate::encoder_spec::describe`]) run by the shared burn trunk executor.
pub struct BertModel<B: Backend> {
    trunk: Trunk<B>,
    config: BertConfig,
    device: B::Device,
}

impl<B: Backend> BertModel<B> {
    /// Loads the encoder from `vb` (rooted where `embeddings.` and `encoder.` live).
    pub fn load(vb: &VarBuilder<B>, config: &BertConfig) -> Result<Self> {
        let spec = crate::encoder_spec::describe(vb, config)?;
        Ok(BertModel {
            trunk: Trunk::new(spec, vb.device())?,
            config: config.clone(),
            device: vb.device().clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &BertConfig {
        &self.config
    }

    /// Checks token ids, segment ids and lengths on the host, so bad input is a typed error.
    pub fn check_inputs(&self, ids: &[i64], types: Option<&[i64]>, seq: usize) -> Result<()> {
        if seq == 0 || ids.is_empty() {
            return Err(Error::InvalidInput("empty input: no tokens".into()));
        }
        if seq > self.config.max_sequence_length() {
            return Err(Error::InvalidInput(format!(
                "sequence of {seq} tokens is longer than the model's {} positions (truncate it)",
                self.config.max_sequence_length()
            )));
        }
        if let Some(word) = self.trunk.word_table() {
            word.check_ids("input_ids", ids)?;
        }
        if let (Some(t), Some(table)) = (types, self.trunk.token_type_table()) {
            table.check_ids("token_type_ids", t)?;
        }
        Ok(())
    }

    /// Runs the encoder. Inputs are `[batch, seq]`; `attention_mask` (row-major, on the host) is
    /// 1 for tokens and 0 for padding. Positions are `0..seq`, or for the RoBERTa family counted
    /// over the unmasked tokens from `pad_token_id + 1` (padding keeps `pad_token_id`), as HF's
    /// `create_position_ids_from_input_ids` does for the padding its tokenizer adds.
    pub fn forward(
        &self,
        input_ids: Tensor<B, 2, Int>,
        attention_mask: &[i64],
        token_type_ids: Tensor<B, 2, Int>,
    ) -> Result<BertOutput<B>> {
        let [batch, seq] = input_ids.dims();
        let positions: Vec<i64> = match self.config.position_padding_idx() {
            Some(pad) if attention_mask.len() == batch * seq => {
                let marks: Vec<i64> = attention_mask
                    .iter()
                    .map(|&m| if m == 0 { pad } else { pad + 1 })
                    .collect();
                roberta_position_ids(&marks, seq, pad)
            }
            Some(pad) => (0..batch)
                .flat_map(|_| (pad + 1)..(pad + 1 + seq as i64))
                .collect(),
            None => (0..batch).flat_map(|_| 0..seq as i64).collect(),
        };
        let positions = int_tensor::<B, 2>(positions, [batch, seq], &self.device);
        self.forward_with_positions(input_ids, attention_mask, token_type_ids, positions)
    }

    /// Whether the checkpoint has a pooler (`pooler.dense`).
    pub fn has_pooler(&self) -> bool {
        self.trunk.spec().pooler.is_some()
    }

    /// [`BertModel::forward`] with caller-chosen `position_ids` `[batch, seq]` (RoBERTa-style
    /// encoders such as CLAP's text tower number positions from `padding_idx + 1`, see
    /// [`roberta_position_ids`]). The caller guarantees every id is below
    /// `max_position_embeddings`.
    pub fn forward_with_positions(
        &self,
        input_ids: Tensor<B, 2, Int>,
        attention_mask: &[i64],
        token_type_ids: Tensor<B, 2, Int>,
        position_ids: Tensor<B, 2, Int>,
    ) -> Result<BertOutput<B>> {
        self.trunk.forward_tokens(
            input_ids,
            attention_mask,
            Some(token_type_ids),
            position_ids,
        )
    }
}

/// A BERT checkpoint with whichever head its config names.
pub struct Bert<B: Backend> {
    /// The encoder.
    pub model: BertModel<B>,
    head: BertHead,
    classifier: Option<EncoderHead<Linear<B>>>,
}

impl<B: Backend> Bert<B> {
    /// Loads encoder and head from a weight source, following BERT's name table.
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &BertConfig,
        device: &B::Device,
    ) -> Result<Self> {
        let prefix = names::encoder_prefix(source.as_ref());
        let source = names::bert_names(source);
        let root = VarBuilder::<B>::new(source, device);
        let model = BertModel::load(&root.pp(prefix), config)?;
        let head = config.head();
        let classifier = crate::encoder_spec::describe_head(&root, config)?;
        if head == BertHead::SequenceClassification && !model.has_pooler() {
            return Err(Error::MissingTensor {
                name: if prefix.is_empty() {
                    "pooler.dense.weight".into()
                } else {
                    format!("{prefix}.pooler.dense.weight")
                },
                source_name: "the sequence-classification checkpoint".into(),
            });
        }
        Ok(Bert {
            model,
            head,
            classifier,
        })
    }

    /// The head this checkpoint carries.
    pub fn head(&self) -> BertHead {
        self.head
    }

    /// The configuration.
    pub fn config(&self) -> &BertConfig {
        self.model.config()
    }

    /// Applies the head to encoder outputs: classification logits `[batch, labels]`,
    /// token logits `[batch, seq, labels]`, or QA `(start, end)` logits `[batch, seq]` each.
    pub fn head_logits(&self, out: &BertOutput<B>) -> Option<HeadLogits<B>> {
        head_logits(self.classifier.as_ref()?, out)
    }
}
