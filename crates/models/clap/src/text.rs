//! CLAP's text tower (`ClapTextModel`): a RoBERTa encoder, i.e. BERT's embeddings and layers
//! ([`ipfs_accelerate_bert::BertModel`]) with positions counted from `pad_token_id + 1`, segment 0
//! everywhere, and BERT's pooler (`tanh(dense(first token))`).

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_bert::{BertConfig, BertModel};
use ipfs_accelerate_core::{token_position_ids, Error, Result, TokenBatch};
use ipfs_accelerate_nn::{convert::int_tensor, VarBuilder};

use crate::ClapTextConfig;

/// `ClapTextModel` with its pooler.
pub struct ClapTextModel<B: Backend> {
    bert: BertModel<B>,
    config: ClapTextConfig,
    device: B::Device,
}

impl ClapTextConfig {
    /// The same encoder as a [`BertConfig`] (absolute positions, the bare model).
    pub fn bert_config(&self) -> BertConfig {
        BertConfig {
            // Positions come from the caller (`roberta_position_ids`), not from the model type.
            model_type: None,
            vocab_size: self.vocab_size,
            hidden_size: self.hidden_size,
            num_hidden_layers: self.num_hidden_layers,
            num_attention_heads: self.num_attention_heads,
            intermediate_size: self.intermediate_size,
            hidden_act: self.hidden_act,
            max_position_embeddings: self.max_position_embeddings,
            type_vocab_size: self.type_vocab_size,
            layer_norm_eps: self.layer_norm_eps,
            pad_token_id: self.pad_token_id,
            position_embedding_type: "absolute".into(),
            architectures: Vec::new(),
            id2label: Default::default(),
            num_labels: None,
        }
    }
}

impl<B: Backend> ClapTextModel<B> {
    /// Loads the tower under `vb` (HF's `text_model`); the pooler is required.
    pub fn load(vb: &VarBuilder<B>, config: &ClapTextConfig) -> Result<Self> {
        let bert = BertModel::load(vb, &config.bert_config())?;
        if !bert.has_pooler() {
            return Err(Error::MissingTensor {
                name: vb.path("pooler.dense.weight"),
                source_name: "the CLAP checkpoint".into(),
            });
        }
        Ok(ClapTextModel {
            bert,
            config: config.clone(),
            device: vb.device().clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &ClapTextConfig {
        &self.config
    }

    /// RoBERTa position ids of `text`, checked against the position table
    /// ([`ipfs_accelerate_core::token_position_ids`], as the engines number them).
    pub fn position_ids(&self, text: &TokenBatch) -> Result<Vec<i64>> {
        token_position_ids(
            self.config.max_position_embeddings,
            Some(self.config.pad_id()),
            &text.input_ids,
            text.seq,
        )
    }

    /// The pooled output `[batch, hidden]` (`tanh(dense(first token))` of the last layer).
    pub fn forward(&self, text: &TokenBatch) -> Result<Tensor<B, 2>> {
        let (b, s) = (text.batch, text.seq);
        if b * s == 0 {
            return Err(Error::InvalidInput("empty text input: no tokens".into()));
        }
        if text.input_ids.len() != b * s || text.attention_mask.len() != b * s {
            return Err(Error::InvalidInput(format!(
                "input_ids ({}) / attention_mask ({}) do not hold [{b}, {s}] values",
                text.input_ids.len(),
                text.attention_mask.len()
            )));
        }
        self.bert.check_inputs(&text.input_ids, None, s)?;
        let positions = self.position_ids(text)?;
        let t = |v: Vec<i64>| int_tensor::<B, 2>(v, [b, s], &self.device);
        let out = self.bert.forward_with_positions(
            t(text.input_ids.clone()),
            &text.attention_mask,
            t(vec![0; b * s]),
            t(positions),
        )?;
        out.pooler_output
            .ok_or_else(|| Error::Compute("the text encoder returned no pooled output".into()))
    }
}

#[cfg(test)]
mod tests {
    use ipfs_accelerate_bert::roberta_position_ids;

    #[test]
    fn positions_skip_padding_and_start_after_it() {
        // HF: cumsum(ids != pad) * (ids != pad) + pad, per row.
        let ids = [0, 5, 1, 7, 1, 0, 1, 1, 1, 1];
        assert_eq!(
            roberta_position_ids(&ids, 5, 1),
            vec![2, 3, 1, 4, 1, 2, 1, 1, 1, 1]
        );
        assert_eq!(roberta_position_ids(&[4, 4, 9], 3, 4), vec![4, 4, 5]);
    }
}
