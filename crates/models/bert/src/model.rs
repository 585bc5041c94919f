//! The BERT encoder and its task heads.

use std::sync::Arc;

use burn::tensor::{activation, backend::Backend, Int, Tensor};
use ipfs_accelerate_core::{roberta_position_ids, Error, Result, TensorSource};
use ipfs_accelerate_nn::{
    attention::{merge_heads, padding_bias, sdpa, split_heads},
    convert::int_tensor,
    Embedding, LayerNorm, Linear, VarBuilder,
};

use crate::{names, BertConfig, BertHead};

struct Embeddings<B: Backend> {
    word: Embedding<B>,
    position: Embedding<B>,
    token_type: Embedding<B>,
    norm: LayerNorm<B>,
}

impl<B: Backend> Embeddings<B> {
    fn load(vb: &VarBuilder<B>, c: &BertConfig) -> Result<Self> {
        Ok(Embeddings {
            word: Embedding::load(&vb.pp("word_embeddings"), c.vocab_size, c.hidden_size)?,
            position: Embedding::load(
                &vb.pp("position_embeddings"),
                c.max_position_embeddings,
                c.hidden_size,
            )?,
            token_type: Embedding::load(
                &vb.pp("token_type_embeddings"),
                c.type_vocab_size,
                c.hidden_size,
            )?,
            norm: LayerNorm::load(&vb.pp("LayerNorm"), c.hidden_size, c.layer_norm_eps)?,
        })
    }

    fn forward(
        &self,
        ids: Tensor<B, 2, Int>,
        types: Tensor<B, 2, Int>,
        positions: Tensor<B, 2, Int>,
    ) -> Tensor<B, 3> {
        let x = self.word.forward(ids)
            + self.token_type.forward(types)
            + self.position.forward(positions);
        self.norm.forward(x)
    }
}

struct Layer<B: Backend> {
    query: Linear<B>,
    key: Linear<B>,
    value: Linear<B>,
    attn_out: Linear<B>,
    attn_norm: LayerNorm<B>,
    intermediate: Linear<B>,
    output: Linear<B>,
    out_norm: LayerNorm<B>,
    heads: usize,
    act: ipfs_accelerate_nn::Activation,
}

impl<B: Backend> Layer<B> {
    fn load(vb: &VarBuilder<B>, c: &BertConfig) -> Result<Self> {
        let h = c.hidden_size;
        let att = vb.pp("attention");
        let sa = att.pp("self");
        Ok(Layer {
            query: Linear::load(&sa.pp("query"), h, h, true)?,
            key: Linear::load(&sa.pp("key"), h, h, true)?,
            value: Linear::load(&sa.pp("value"), h, h, true)?,
            attn_out: Linear::load(&att.pp("output.dense"), h, h, true)?,
            attn_norm: LayerNorm::load(&att.pp("output.LayerNorm"), h, c.layer_norm_eps)?,
            intermediate: Linear::load(&vb.pp("intermediate.dense"), h, c.intermediate_size, true)?,
            output: Linear::load(&vb.pp("output.dense"), c.intermediate_size, h, true)?,
            out_norm: LayerNorm::load(&vb.pp("output.LayerNorm"), h, c.layer_norm_eps)?,
            heads: c.num_attention_heads,
            act: c.hidden_act,
        })
    }

    fn forward(&self, x: Tensor<B, 3>, bias: Option<&Tensor<B, 4>>) -> Tensor<B, 3> {
        let q = split_heads(self.query.forward(x.clone()), self.heads);
        let k = split_heads(self.key.forward(x.clone()), self.heads);
        let v = split_heads(self.value.forward(x.clone()), self.heads);
        let ctx = merge_heads(sdpa(q, k, v, bias, None));
        let x = self.attn_norm.forward(self.attn_out.forward_add(ctx, x));
        let inner = self.intermediate.forward_act(x.clone(), self.act);
        self.out_norm.forward(self.output.forward_add(inner, x))
    }
}

/// Outputs of the bare encoder.
#[derive(Debug, Clone)]
pub struct BertOutput<B: Backend> {
    /// `[batch, seq, hidden]`.
    pub last_hidden_state: Tensor<B, 3>,
    /// `[batch, hidden]`: tanh(dense(first token)), when the checkpoint has a pooler.
    pub pooler_output: Option<Tensor<B, 2>>,
}

/// `BertModel`: embeddings, encoder layers and the optional pooler.
pub struct BertModel<B: Backend> {
    embeddings: Embeddings<B>,
    layers: Vec<Layer<B>>,
    pooler: Option<Linear<B>>,
    config: BertConfig,
    device: B::Device,
}

impl<B: Backend> BertModel<B> {
    /// Loads the encoder from `vb` (rooted where `embeddings.` and `encoder.` live).
    pub fn load(vb: &VarBuilder<B>, config: &BertConfig) -> Result<Self> {
        let embeddings = Embeddings::load(&vb.pp("embeddings"), config)?;
        let layers = (0..config.num_hidden_layers)
            .map(|i| Layer::load(&vb.pp(format!("encoder.layer.{i}")), config))
            .collect::<Result<Vec<_>>>()?;
        let pooler = if vb.contains("pooler.dense.weight") {
            Some(Linear::load(
                &vb.pp("pooler.dense"),
                config.hidden_size,
                config.hidden_size,
                true,
            )?)
        } else {
            None
        };
        Ok(BertModel {
            embeddings,
            layers,
            pooler,
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
        self.embeddings.word.check_ids("input_ids", ids)?;
        if let Some(t) = types {
            self.embeddings.token_type.check_ids("token_type_ids", t)?;
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
    ) -> BertOutput<B> {
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
        self.pooler.is_some()
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
    ) -> BertOutput<B> {
        let [batch, seq] = input_ids.dims();
        let mut x = self
            .embeddings
            .forward(input_ids, token_type_ids, position_ids);
        // No padding (one text, or texts of equal length): no mask to add.
        let bias = attention_mask.contains(&0).then(|| {
            let heads = self.config.num_attention_heads;
            padding_bias::<B>(attention_mask, batch, seq, heads, seq, false, &self.device)
        });
        for layer in &self.layers {
            x = layer.forward(x, bias.as_ref());
        }
        let pooler_output = self.pooler.as_ref().map(|p| {
            let first: Tensor<B, 2> = x
                .clone()
                .narrow(1, 0, 1)
                .reshape([batch, self.config.hidden_size]);
            activation::tanh(p.forward(first))
        });
        BertOutput {
            last_hidden_state: x,
            pooler_output,
        }
    }
}

/// A BERT checkpoint with whichever head its config names.
pub struct Bert<B: Backend> {
    /// The encoder.
    pub model: BertModel<B>,
    head: BertHead,
    classifier: Option<Linear<B>>,
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
        let h = config.hidden_size;
        let classifier = match head {
            BertHead::Base => None,
            BertHead::SequenceClassification | BertHead::TokenClassification => Some(Linear::load(
                &root.pp("classifier"),
                h,
                config.num_labels(),
                true,
            )?),
            BertHead::QuestionAnswering => Some(Linear::load(&root.pp("qa_outputs"), h, 2, true)?),
        };
        if head == BertHead::SequenceClassification && model.pooler.is_none() {
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
        let classifier = self.classifier.as_ref()?;
        Some(match self.head {
            BertHead::Base => return None,
            BertHead::SequenceClassification => {
                HeadLogits::Sequence(classifier.forward(out.pooler_output.clone()?))
            }
            BertHead::TokenClassification => {
                HeadLogits::Token(classifier.forward(out.last_hidden_state.clone()))
            }
            BertHead::QuestionAnswering => {
                let logits = classifier.forward(out.last_hidden_state.clone());
                let [b, s, _] = logits.dims();
                let start = logits.clone().narrow(2, 0, 1).reshape([b, s]);
                let end = logits.narrow(2, 1, 1).reshape([b, s]);
                HeadLogits::Span { start, end }
            }
        })
    }
}

/// The logits a head produces.
#[derive(Debug, Clone)]
pub enum HeadLogits<B: Backend> {
    /// `[batch, labels]`.
    Sequence(Tensor<B, 2>),
    /// `[batch, seq, labels]`.
    Token(Tensor<B, 3>),
    /// `[batch, seq]` each.
    Span {
        /// Start logits.
        start: Tensor<B, 2>,
        /// End logits.
        end: Tensor<B, 2>,
    },
}
