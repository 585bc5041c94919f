//! The T5 encoder-decoder (`T5ForConditionalGeneration` of HF's `modeling_t5.py`).

use ipfs_accelerate_nn::ActivationForward;
use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::{Error, Result, TensorMap, TensorSource};
use ipfs_accelerate_nn::{
    attention::{
        padding_bias, AttentionConfig, MultiHeadAttention, ProjectionBias, ProjectionNames,
    },
    convert::int_tensor,
    position::RelativePositionBias,
    Activation, Embedding, KvCache, Linear, RmsNorm, VarBuilder,
};

use crate::T5Config;

/// T5's projection names: `q`, `k`, `v`, `o`.
pub(crate) const T5_PROJECTIONS: ProjectionNames<'static> = ProjectionNames {
    q: "q",
    k: "k",
    v: "v",
    o: "o",
};

/// `T5LayerFF`: `x + wo(act(wi x))`, or gated `x + wo(act(wi_0 x) * wi_1 x)`, on the RMS-normed input.
#[derive(Debug, Clone)]
struct FeedForward<B: Backend> {
    norm: RmsNorm<B>,
    wi: Linear<B>,
    gate_linear: Option<Linear<B>>,
    wo: Linear<B>,
    act: Activation,
}

impl<B: Backend> FeedForward<B> {
    fn load(vb: &VarBuilder<B>, c: &T5Config) -> Result<Self> {
        let dense = vb.pp("DenseReluDense");
        let (d, ff) = (c.d_model, c.d_ff);
        let (wi, gate_linear) = if c.is_gated_act {
            (
                Linear::load(&dense.pp("wi_0"), d, ff, false)?,
                Some(Linear::load(&dense.pp("wi_1"), d, ff, false)?),
            )
        } else {
            (Linear::load(&dense.pp("wi"), d, ff, false)?, None)
        };
        Ok(FeedForward {
            norm: RmsNorm::load(&vb.pp("layer_norm"), d, c.layer_norm_epsilon)?,
            wi,
            gate_linear,
            wo: Linear::load(&dense.pp("wo"), ff, d, false)?,
            act: c.dense_act_fn,
        })
    }

    fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        let h = self.norm.forward(x.clone());
        let mut inner = self.act.forward(self.wi.forward(h.clone()));
        if let Some(linear) = &self.gate_linear {
            inner = inner * linear.forward(h);
        }
        x + self.wo.forward(inner)
    }
}

/// A pre-norm attention sub-layer (`T5LayerSelfAttention` / `T5LayerCrossAttention`).
#[derive(Debug, Clone)]
struct AttentionLayer<B: Backend> {
    norm: RmsNorm<B>,
    attn: MultiHeadAttention<B>,
}

impl<B: Backend> AttentionLayer<B> {
    fn load(vb: &VarBuilder<B>, name: &str, c: &T5Config) -> Result<Self> {
        let config = AttentionConfig {
            hidden: c.d_model,
            kv_input: c.d_model,
            heads: c.num_heads,
            kv_heads: c.num_heads,
            head_dim: c.d_kv,
            // T5 folds the scale into its initialisation and does not scale scores.
            scale: Some(1.0),
            bias: ProjectionBias::NONE,
        };
        Ok(AttentionLayer {
            norm: RmsNorm::load(&vb.pp("layer_norm"), c.d_model, c.layer_norm_epsilon)?,
            attn: MultiHeadAttention::load(&vb.pp(name), config, T5_PROJECTIONS)?,
        })
    }
}

/// `T5Block`: self-attention, cross-attention (decoder only), feed-forward.
#[derive(Debug, Clone)]
struct Block<B: Backend> {
    self_attn: AttentionLayer<B>,
    cross_attn: Option<AttentionLayer<B>>,
    ff: FeedForward<B>,
}

/// One T5 stack (`T5Stack`): blocks sharing the first block's relative position bias, then the
/// final RMS norm.
#[derive(Debug, Clone)]
struct Stack<B: Backend> {
    blocks: Vec<Block<B>>,
    position: RelativePositionBias<B>,
    final_norm: RmsNorm<B>,
    heads: usize,
}

impl<B: Backend> Stack<B> {
    fn load(vb: &VarBuilder<B>, c: &T5Config, decoder: bool) -> Result<Self> {
        let layers = if decoder {
            c.num_decoder_layers
        } else {
            c.num_layers
        };
        let blocks = (0..layers)
            .map(|i| {
                let layer = vb.pp(format!("block.{i}.layer"));
                let cross_attn = if decoder {
                    Some(AttentionLayer::load(&layer.pp("1"), "EncDecAttention", c)?)
                } else {
                    None
                };
                let ff_index = if decoder { "2" } else { "1" };
                Ok(Block {
                    self_attn: AttentionLayer::load(&layer.pp("0"), "SelfAttention", c)?,
                    cross_attn,
                    ff: FeedForward::load(&layer.pp(ff_index), c)?,
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let position = RelativePositionBias::load(
            &vb.pp("block.0.layer.0.SelfAttention.relative_attention_bias"),
            c.relative_attention_num_buckets,
            c.num_heads,
            c.relative_attention_max_distance,
            !decoder,
        )?;
        Ok(Stack {
            blocks,
            position,
            final_norm: RmsNorm::load(&vb.pp("final_layer_norm"), c.d_model, c.layer_norm_epsilon)?,
            heads: c.num_heads,
        })
    }
}

/// Key / value caches of the decoder: self-attention grows by one position per step, cross-attention
/// holds the encoder's projected keys and values after the first step.
#[derive(Debug, Clone)]
pub struct DecoderCache<B: Backend> {
    self_attn: KvCache<B>,
    cross_attn: KvCache<B>,
}

impl<B: Backend> DecoderCache<B> {
    /// An empty cache for `layers` decoder blocks.
    pub fn new(layers: usize) -> Self {
        DecoderCache {
            self_attn: KvCache::new(layers),
            cross_attn: KvCache::new(layers),
        }
    }

    /// Decoder positions cached so far.
    pub fn seq_len(&self) -> usize {
        self.self_attn.seq_len()
    }
}

/// Tokenised encoder input: row-major `[batch, seq]` ids and attention mask.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct T5Inputs {
    /// Rows.
    pub batch: usize,
    /// Columns (padded length).
    pub seq: usize,
    /// Token ids.
    pub input_ids: Vec<i64>,
    /// 1 for tokens, 0 for padding.
    pub attention_mask: Vec<i64>,
}

impl T5Inputs {
    /// From rows of ids. Without a mask, shorter rows are padded on the right with `pad_id` and
    /// masked; with a mask, rows and mask rows must all have one length.
    pub fn from_rows(
        input_ids: &[Vec<i64>],
        attention_mask: Option<&[Vec<i64>]>,
        pad_id: i64,
    ) -> Result<Self> {
        let batch = input_ids.len();
        let seq = input_ids.iter().map(Vec::len).max().unwrap_or(0);
        if batch == 0 || input_ids.iter().any(Vec::is_empty) {
            return Err(Error::InvalidInput("empty input: no tokens".into()));
        }
        let mut ids = Vec::with_capacity(batch * seq);
        let mut mask = Vec::with_capacity(batch * seq);
        match attention_mask {
            None => {
                for row in input_ids {
                    ids.extend_from_slice(row);
                    ids.extend(std::iter::repeat_n(pad_id, seq - row.len()));
                    mask.extend(std::iter::repeat_n(1, row.len()));
                    mask.extend(std::iter::repeat_n(0, seq - row.len()));
                }
            }
            Some(m) => {
                let same = m.len() == batch
                    && input_ids
                        .iter()
                        .zip(m)
                        .all(|(r, mr)| r.len() == seq && mr.len() == seq);
                if !same {
                    return Err(Error::InvalidInput(
                        "attention_mask rows must match input_ids rows, all of one length".into(),
                    ));
                }
                input_ids.iter().for_each(|r| ids.extend_from_slice(r));
                m.iter().for_each(|r| mask.extend_from_slice(r));
            }
        }
        Ok(T5Inputs {
            batch,
            seq,
            input_ids: ids,
            attention_mask: mask,
        })
    }

    /// From named host tensors: `input_ids` `[batch, seq]` and optional `attention_mask` (ones when
    /// absent) of the same shape.
    pub fn from_tensors(inputs: &TensorMap) -> Result<Self> {
        let t = ipfs_accelerate_core::TokenBatch::from_tensors(inputs)?;
        Ok(T5Inputs {
            batch: t.batch,
            seq: t.seq,
            input_ids: t.input_ids,
            attention_mask: t.attention_mask,
        })
    }
}

/// `[batch, seq]` of a rank-2 shape, or an error naming the input.
pub(crate) fn matrix_dims(name: &str, shape: &[usize]) -> Result<[usize; 2]> {
    match shape {
        &[b, s] => Ok([b, s]),
        other => Err(Error::InvalidInput(format!(
            "{name} must be [batch, seq], got {other:?}"
        ))),
    }
}

/// `T5ForConditionalGeneration`: shared embedding, encoder, decoder and LM head.
#[derive(Debug, Clone)]
pub struct T5<B: Backend> {
    shared: Embedding<B>,
    encoder: Stack<B>,
    decoder: Stack<B>,
    lm_head: Linear<B>,
    config: T5Config,
    device: B::Device,
}

impl<B: Backend> T5<B> {
    /// Loads the model from HF's tensor names. The embedding is `shared.weight` (or the stacks'
    /// `embed_tokens.weight` when only those are stored); the LM head is `lm_head.weight` when the
    /// checkpoint has one and the shared embedding otherwise (HF ties them unless both are stored).
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &T5Config,
        device: &B::Device,
    ) -> Result<Self> {
        let vb = VarBuilder::<B>::new(source, device);
        let embedding = ["shared", "encoder.embed_tokens", "decoder.embed_tokens"]
            .into_iter()
            .find(|p| vb.contains(&format!("{p}.weight")))
            .unwrap_or("shared");
        let shared = Embedding::load(&vb.pp(embedding), config.vocab_size, config.d_model)?;
        let lm_head = if vb.contains("lm_head.weight") {
            Linear::load(&vb.pp("lm_head"), config.d_model, config.vocab_size, false)?
        } else {
            Linear::from_tensors(shared.weight().clone(), None)
        };
        Ok(T5 {
            encoder: Stack::load(&vb.pp("encoder"), config, false)?,
            decoder: Stack::load(&vb.pp("decoder"), config, true)?,
            shared,
            lm_head,
            config: config.clone(),
            device: device.clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &T5Config {
        &self.config
    }

    /// The device it runs on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// An empty decoder cache for this model.
    pub fn new_cache(&self) -> DecoderCache<B> {
        DecoderCache::new(self.decoder.blocks.len())
    }

    /// Checks `[batch, len]` ids on the host: non-empty, the right count, inside the vocabulary.
    pub fn check_ids(&self, what: &str, ids: &[i64], batch: usize, len: usize) -> Result<()> {
        if batch == 0 || len == 0 {
            return Err(Error::InvalidInput(format!(
                "empty input: {what} has no tokens"
            )));
        }
        if ids.len() != batch * len {
            return Err(Error::InvalidInput(format!(
                "{what} has {} values for shape [{batch}, {len}]",
                ids.len()
            )));
        }
        self.shared.check_ids(what, ids)
    }

    /// Checks an encoder attention mask: `batch * seq` values and at least one kept token per row.
    pub fn check_mask(&self, mask: &[i64], batch: usize, seq: usize) -> Result<()> {
        if mask.len() != batch * seq {
            return Err(Error::InvalidInput(format!(
                "attention_mask has {} values for input_ids of shape [{batch}, {seq}]",
                mask.len()
            )));
        }
        if let Some(row) = mask
            .chunks(seq.max(1))
            .position(|r| r.iter().all(|&m| m == 0))
        {
            return Err(Error::InvalidInput(format!(
                "attention_mask row {row} masks every token"
            )));
        }
        Ok(())
    }

    /// Runs the encoder on validated inputs: `[batch, seq, d_model]` (after the final norm).
    pub fn encode(&self, inputs: &T5Inputs) -> Result<Tensor<B, 3>> {
        let T5Inputs {
            batch,
            seq,
            ref input_ids,
            ref attention_mask,
        } = *inputs;
        self.check_ids("input_ids", input_ids, batch, seq)?;
        self.check_mask(attention_mask, batch, seq)?;
        let ids = int_tensor::<B, 2>(input_ids.clone(), [batch, seq], &self.device);
        let mut x = self.shared.forward(ids);
        let stack = &self.encoder;
        let mut bias = stack
            .position
            .forward(seq, seq, 0)
            .expand([batch, stack.heads, seq, seq]);
        if attention_mask.contains(&0) {
            let heads = stack.heads;
            bias = bias
                + padding_bias::<B>(attention_mask, batch, seq, heads, seq, false, &self.device);
        }
        for block in &stack.blocks {
            let sa = &block.self_attn;
            x = x.clone() + sa.attn.forward(sa.norm.forward(x), Some(&bias));
            x = block.ff.forward(x);
        }
        Ok(stack.final_norm.forward(x))
    }

    /// Runs the decoder on `ids` `[batch, len]` over the encoder output `encoder`
    /// `[batch, seq, d_model]` (padding in `encoder_mask`, row-major `[batch, seq]`) and returns its
    /// final hidden states `[batch, len, d_model]`. With a `cache`, `ids` are the positions after
    /// those already cached, and their keys and values are appended.
    pub fn decode(
        &self,
        ids: &[i64],
        len: usize,
        encoder: &Tensor<B, 3>,
        encoder_mask: &[i64],
        mut cache: Option<&mut DecoderCache<B>>,
    ) -> Result<Tensor<B, 3>> {
        let [batch, seq, width] = encoder.dims();
        if width != self.config.d_model {
            return Err(Error::InvalidInput(format!(
                "encoder states have width {width}, the model {}",
                self.config.d_model
            )));
        }
        self.check_ids("decoder_input_ids", ids, batch, len)?;
        self.check_mask(encoder_mask, batch, seq)?;
        let stack = &self.decoder;
        let heads = stack.heads;
        let past = cache.as_ref().map(|c| c.seq_len()).unwrap_or(0);
        let keys = past + len;
        // Relative position bias of the queries at past..past+len, plus the causal mask.
        let mut self_bias = stack
            .position
            .forward(len, keys, past)
            .expand([batch, heads, len, keys]);
        if len > 1 {
            let ones = vec![1i64; batch * keys];
            self_bias =
                self_bias + padding_bias::<B>(&ones, batch, keys, heads, len, true, &self.device);
        }
        let cross_bias = encoder_mask
            .contains(&0)
            .then(|| padding_bias::<B>(encoder_mask, batch, seq, heads, len, false, &self.device));

        let ids = int_tensor::<B, 2>(ids.to_vec(), [batch, len], &self.device);
        let mut x = self.shared.forward(ids);
        for (i, block) in stack.blocks.iter().enumerate() {
            let sa = &block.self_attn;
            let h = sa.norm.forward(x.clone());
            let q = sa.attn.project_q(h.clone());
            let (k, v) = sa.attn.project_kv(h);
            let (k, v) = match cache.as_deref_mut() {
                Some(c) => c.self_attn.append(i, k, v),
                None => (k, v),
            };
            x = x + sa.attn.attend(q, k, v, Some(&self_bias));

            if let Some(ca) = &block.cross_attn {
                let q = ca.attn.project_q(ca.norm.forward(x.clone()));
                let (k, v) = match cache.as_deref_mut() {
                    Some(c) => match c.cross_attn.get(i) {
                        Some(kv) => kv,
                        None => {
                            let (k, v) = ca.attn.project_kv(encoder.clone());
                            c.cross_attn.set(i, k.clone(), v.clone());
                            (k, v)
                        }
                    },
                    None => ca.attn.project_kv(encoder.clone()),
                };
                x = x + ca.attn.attend(q, k, v, cross_bias.as_ref());
            }
            x = block.ff.forward(x);
        }
        Ok(stack.final_norm.forward(x))
    }

    /// LM logits `[batch, len, vocab]` of decoder hidden states (scaled by `d_model^-0.5` first when
    /// the config says so, as original T5).
    pub fn lm_logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        let hidden = if self.config.scale_decoder_outputs {
            hidden.mul_scalar((self.config.d_model as f64).powf(-0.5))
        } else {
            hidden
        };
        self.lm_head.forward(hidden)
    }

    /// The full forward of `T5ForConditionalGeneration`: encoder output and the logits of
    /// `decoder_input_ids` (row-major `[batch, len]`).
    pub fn forward(
        &self,
        inputs: &T5Inputs,
        decoder_input_ids: &[i64],
        len: usize,
    ) -> Result<(Tensor<B, 3>, Tensor<B, 3>)> {
        let encoder = self.encode(inputs)?;
        let hidden = self.decode(
            decoder_input_ids,
            len,
            &encoder,
            &inputs.attention_mask,
            None,
        )?;
        Ok((encoder, self.lm_logits(hidden)))
    }
}
