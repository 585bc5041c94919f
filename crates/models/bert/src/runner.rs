//! BERT behind the uniform [`ModelRunner`] interface, and the tokenised-input type.

use ipfs_accelerate_core::JsonConfig;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use ipfs_accelerate_core::{
    BackendKind, Error, Family, ModelRunner, Result, TensorMap, TensorSource,
};
use ipfs_accelerate_nn::convert::{float_to_host, float_to_vec, int_tensor};

use crate::tasks::{l2_normalize, Pooling};
use crate::{Bert, BertConfig, BertHead, BertOutput, HeadLogits};

/// Tokenised input: row-major `[batch, seq]` ids, attention mask and segment ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BertInputs {
    /// Rows.
    pub batch: usize,
    /// Columns (padded length).
    pub seq: usize,
    /// Token ids.
    pub input_ids: Vec<i64>,
    /// 1 for tokens, 0 for padding.
    pub attention_mask: Vec<i64>,
    /// Segment ids (0 when the model has one segment).
    pub token_type_ids: Vec<i64>,
}

impl BertInputs {
    /// Builds inputs from named host tensors (`input_ids` required; `attention_mask` defaults to
    /// ones, `token_type_ids` to zeros), checking that the shapes agree.
    pub fn from_tensors(inputs: &TensorMap) -> Result<Self> {
        let t = ipfs_accelerate_core::TokenBatch::from_tensors(inputs)?;
        Ok(BertInputs {
            token_type_ids: t.optional(inputs, "token_type_ids", 0)?,
            batch: t.batch,
            seq: t.seq,
            input_ids: t.input_ids,
            attention_mask: t.attention_mask,
        })
    }
}

/// The BERT family: loads a checkpoint folder as a [`BertRunner`].
pub struct BertFamily;

impl Family for BertFamily {
    const NAME: &'static str = "bert";

    fn load<B: Backend>(
        dir: &std::path::Path,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Box<dyn ModelRunner>> {
        let config = BertConfig::from_file(&dir.join("config.json"))?;
        let weights = ipfs_accelerate_io::open_weights(dir)?;
        Ok(Box::new(BertRunner::<B>::load(
            weights, &config, device, kind,
        )?))
    }
}

/// A loaded BERT checkpoint on one backend.
pub struct BertRunner<B: Backend> {
    bert: Bert<B>,
    device: B::Device,
    kind: BackendKind,
}

impl<B: Backend> BertRunner<B> {
    /// Loads the checkpoint onto `device`.
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &BertConfig,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Self> {
        Ok(BertRunner {
            bert: Bert::load(source, config, device)?,
            device: device.clone(),
            kind,
        })
    }

    /// The model.
    pub fn bert(&self) -> &Bert<B> {
        &self.bert
    }

    /// The configuration.
    pub fn config(&self) -> &BertConfig {
        self.bert.config()
    }

    /// The device it runs on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// Validates `inputs` and runs the encoder.
    pub fn encode(&self, inputs: &BertInputs) -> Result<BertOutput<B>> {
        for (name, v) in [
            ("input_ids", &inputs.input_ids),
            ("attention_mask", &inputs.attention_mask),
            ("token_type_ids", &inputs.token_type_ids),
        ] {
            if v.len() != inputs.batch * inputs.seq {
                return Err(Error::InvalidInput(format!(
                    "{name} has {} values for shape [{}, {}]",
                    v.len(),
                    inputs.batch,
                    inputs.seq
                )));
            }
        }
        self.bert.model.check_inputs(
            &inputs.input_ids,
            Some(&inputs.token_type_ids),
            inputs.seq,
        )?;
        let shape = [inputs.batch, inputs.seq];
        let t = |v: &Vec<i64>| int_tensor::<B, 2>(v.clone(), shape, &self.device);
        self.bert.model.forward(
            t(&inputs.input_ids),
            &inputs.attention_mask,
            t(&inputs.token_type_ids),
        )
    }
}

impl<B: Backend> ModelRunner for BertRunner<B> {
    fn family(&self) -> &str {
        "bert"
    }

    fn backend(&self) -> BackendKind {
        self.kind
    }

    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        let inputs = BertInputs::from_tensors(inputs)?;
        let out = self.encode(&inputs)?;
        let mut map = TensorMap::new();
        match self.bert.head_logits(&out) {
            None => {
                if let Some(p) = out.pooler_output.clone() {
                    map.insert("pooler_output".into(), float_to_host(p)?);
                }
                map.insert(
                    "last_hidden_state".into(),
                    float_to_host(out.last_hidden_state)?,
                );
            }
            Some(HeadLogits::Sequence(l)) => {
                map.insert("logits".into(), float_to_host(l)?);
            }
            Some(HeadLogits::Token(l)) => {
                map.insert("logits".into(), float_to_host(l)?);
            }
            Some(HeadLogits::Span { start, end }) => {
                map.insert("start_logits".into(), float_to_host(start)?);
                map.insert("end_logits".into(), float_to_host(end)?);
            }
        }
        Ok(map)
    }
}

/// Logits copied to the host, row-major.
#[derive(Debug, Clone, PartialEq)]
pub enum HostLogits {
    /// `[batch, labels]`.
    Sequence {
        /// Number of labels.
        labels: usize,
        /// Values.
        data: Vec<f32>,
    },
    /// `[batch, seq, labels]`.
    Token {
        /// Number of labels.
        labels: usize,
        /// Values.
        data: Vec<f32>,
    },
    /// `[batch, seq]` each.
    Span {
        /// Start logits.
        start: Vec<f32>,
        /// End logits.
        end: Vec<f32>,
    },
}

/// The object-safe task interface of a loaded BERT, whatever backend it runs on.
pub trait BertTasks: ModelRunner {
    /// The configuration.
    fn config(&self) -> &BertConfig;
    /// The head the checkpoint carries.
    fn head(&self) -> BertHead;
    /// Sentence embeddings `[batch][hidden]`: encoder → pooling → optional L2 normalisation.
    fn embed(
        &self,
        inputs: &BertInputs,
        pooling: Pooling,
        normalize: bool,
    ) -> Result<Vec<Vec<f32>>>;
    /// The head's logits on the host.
    fn logits(&self, inputs: &BertInputs) -> Result<HostLogits>;
}

impl<B: Backend> BertTasks for BertRunner<B> {
    fn config(&self) -> &BertConfig {
        self.bert.config()
    }

    fn head(&self) -> BertHead {
        self.bert.head()
    }

    fn embed(
        &self,
        inputs: &BertInputs,
        pooling: Pooling,
        normalize: bool,
    ) -> Result<Vec<Vec<f32>>> {
        let out = self.encode(inputs)?;
        let mask = int_tensor::<B, 2>(
            inputs.attention_mask.clone(),
            [inputs.batch, inputs.seq],
            &self.device,
        );
        let mut pooled = pooling.pool(out.last_hidden_state, mask);
        if normalize {
            pooled = l2_normalize(pooled);
        }
        let dim = pooled.dims()[1];
        let flat = float_to_vec(pooled)?;
        Ok(flat.chunks(dim.max(1)).map(<[f32]>::to_vec).collect())
    }

    fn logits(&self, inputs: &BertInputs) -> Result<HostLogits> {
        let out = self.encode(inputs)?;
        let labels = self.bert.config().num_labels();
        match self.bert.head_logits(&out) {
            Some(HeadLogits::Sequence(l)) => Ok(HostLogits::Sequence {
                labels,
                data: float_to_vec(l)?,
            }),
            Some(HeadLogits::Token(l)) => Ok(HostLogits::Token {
                labels,
                data: float_to_vec(l)?,
            }),
            Some(HeadLogits::Span { start, end }) => Ok(HostLogits::Span {
                start: float_to_vec(start)?,
                end: float_to_vec(end)?,
            }),
            None => Err(Error::InvalidInput(
                "this checkpoint is a bare BertModel: it has no task head (use embeddings)".into(),
            )),
        }
    }
}
