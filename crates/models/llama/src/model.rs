//! The decoder: token embedding, pre-norm layers (RoPE grouped-query attention + gated MLP), final
//! RMSNorm and the language-model head, with an optional KV cache.

use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor, TensorData};
use ipfs_accelerate_core::{Error, Result, TensorSource};
use ipfs_accelerate_nn::{
    attention::{
        padding_bias, sliding_window_bias, AttentionConfig, MultiHeadAttention, ProjectionNames,
    },
    convert::int_tensor,
    mlp::GatedMlp,
    rope::{RopeScaling, RotaryEmbedding},
    Embedding, KvCache, Linear, RmsNorm, VarBuilder,
};

use crate::LlamaConfig;
use ipfs_accelerate_nn::WeightQuantization;

/// One forward call's tokens: `ids` and `positions` row-major `[batch, seq]`, `mask` `[batch,
/// keys]` over every position the call attends to (cached ones first, then these `seq`), 1 for
/// tokens and 0 for padding.
#[derive(Debug, Clone, Copy)]
pub struct DecoderInput<'a> {
    /// Rows.
    pub batch: usize,
    /// New positions per row.
    pub seq: usize,
    /// Token ids `[batch, seq]`.
    pub ids: &'a [i64],
    /// Position ids `[batch, seq]` (RoPE).
    pub positions: &'a [i64],
    /// Attention mask `[batch, cached + seq]`.
    pub mask: &'a [i64],
}

/// HF's position ids for a (left-)padded mask `[batch, seq]`: `cumsum(mask) - 1`, 0 on padding,
/// as `generate` derives them.
pub fn positions_from_mask(mask: &[i64], batch: usize, seq: usize) -> Vec<i64> {
    let mut out = Vec::with_capacity(batch * seq);
    for row in mask.chunks(seq.max(1)).take(batch) {
        let mut sum = 0;
        for &m in row {
            sum += i64::from(m != 0);
            out.push(if m == 0 { 0 } else { sum - 1 });
        }
    }
    out
}

/// The attention bias of one kind of layer (full causal or one sliding window) for one call.
struct Masking<B: Backend> {
    bias: Tensor<B, 4>,
    keep: Option<Tensor<B, 4>>,
    window: Option<usize>,
}

/// `[batch, 1, queries, 1]`: 0 for queries that see no key at all (left padding before any token),
/// 1 elsewhere; `None` when every query sees a key. PyTorch's SDPA, HF's default attention, returns
/// zeros for such rows, so their outputs are zeroed to match.
fn attended_rows<B: Backend>(
    mask: &[i64],
    batch: usize,
    keys: usize,
    queries: usize,
    window: Option<usize>,
    device: &B::Device,
) -> Option<Tensor<B, 4>> {
    let offset = keys - queries;
    let mut keep = Vec::with_capacity(batch * queries);
    for row in mask.chunks(keys).take(batch) {
        for q in 0..queries {
            let pos = q + offset;
            let first = window.map_or(0, |w| (pos + 1).saturating_sub(w));
            let sees = row[first..=pos].iter().any(|&m| m != 0);
            keep.push(if sees { 1f32 } else { 0.0 });
        }
    }
    keep.contains(&0.0)
        .then(|| Tensor::from_data(TensorData::new(keep, [batch, 1, queries, 1]), device))
}

struct DecoderLayer<B: Backend> {
    attn: MultiHeadAttention<B>,
    mlp: GatedMlp<B>,
    input_norm: RmsNorm<B>,
    post_norm: RmsNorm<B>,
    window: Option<usize>,
}

/// A LLaMA / Qwen2 causal language model (`LlamaForCausalLM`, `Qwen2ForCausalLM`).
pub struct LlamaModel<B: Backend> {
    embed: Embedding<B>,
    layers: Vec<DecoderLayer<B>>,
    norm: RmsNorm<B>,
    lm_head: Linear<B>,
    rope: RotaryEmbedding,
    config: LlamaConfig,
    device: B::Device,
}

impl<B: Backend> LlamaModel<B> {
    /// Loads the weights under HF's names (`model.embed_tokens`, `model.layers.N.self_attn.q_proj`,
    /// ..., `lm_head`, absent when `tie_word_embeddings`).
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &LlamaConfig,
        device: &B::Device,
    ) -> Result<Self> {
        let vb = VarBuilder::<B>::new(source, device);
        let m = vb.pp("model");
        let c = config;
        let hidden = c.hidden_size;
        let embed = Embedding::load(&m.pp("embed_tokens"), c.vocab_size, hidden)?;
        let attention = AttentionConfig {
            hidden,
            kv_input: hidden,
            heads: c.num_attention_heads,
            kv_heads: c.kv_heads(),
            head_dim: c.head_dim(),
            scale: None,
            bias: c.attention_biases(),
        };
        let layers = (0..c.num_hidden_layers)
            .map(|i| {
                let l = m.pp(format!("layers.{i}"));
                Ok(DecoderLayer {
                    attn: MultiHeadAttention::load(
                        &l.pp("self_attn"),
                        attention,
                        ProjectionNames::O_PROJ,
                    )?,
                    mlp: GatedMlp::load(
                        &l.pp("mlp"),
                        hidden,
                        c.intermediate_size,
                        c.mlp_biases(),
                        c.hidden_act,
                    )?,
                    input_norm: RmsNorm::load(&l.pp("input_layernorm"), hidden, c.rms_norm_eps)?,
                    post_norm: RmsNorm::load(
                        &l.pp("post_attention_layernorm"),
                        hidden,
                        c.rms_norm_eps,
                    )?,
                    window: c.layer_window(i),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let norm = RmsNorm::load(&m.pp("norm"), hidden, c.rms_norm_eps)?;
        let lm_head = if c.tie_word_embeddings {
            embed.tied_head()
        } else {
            Linear::load(&vb.pp("lm_head"), hidden, c.vocab_size, false)?
        };
        Ok(LlamaModel {
            embed,
            layers,
            norm,
            lm_head,
            rope: RotaryEmbedding::new(c.rope()?)?,
            config: c.clone(),
            device: device.clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        &self.config
    }

    /// The device it runs on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// Vocabulary size (width of the logits).
    pub fn vocab(&self) -> usize {
        self.lm_head.out_dim()
    }

    /// Keeps the linear layers' weights (attention, MLP, and the LM head) quantized in memory;
    /// the token embedding and the norms stay as loaded. A tied LM head gets its own quantized
    /// copy of the embedding (it had a transposed float one, or shared the embedding's ggml
    /// blocks).
    pub fn quantize(&mut self, q: WeightQuantization) -> Result<()> {
        for layer in &mut self.layers {
            layer.attn.quantize(q)?;
            layer.mlp.quantize(q)?;
        }
        self.lm_head.quantize(q)
    }

    /// Bytes the weights take in memory: the token embedding (f32 or ggml blocks), the norms
    /// (f32) and every linear layer as it is kept (float, quantized or ggml blocks); a tied head
    /// on the embedding's blocks is counted once.
    pub fn weight_bytes(&self) -> usize {
        let c = &self.config;
        let embed = self.embed.bytes();
        let shared = |a: Option<&ipfs_accelerate_nn::LinearWeight<B>>| {
            a.and_then(|w| w.ggml()).map(|g| g.data().as_ptr())
        };
        let head = match shared(self.embed.ggml()) {
            Some(p) if shared(Some(self.lm_head.weight())) == Some(p) => 0,
            _ => self.lm_head.weight_bytes(),
        };
        let norms = (2 * self.layers.len() + 1) * c.hidden_size * 4;
        let layers: usize = self
            .layers
            .iter()
            .map(|l| l.attn.weight_bytes() + l.mlp.weight_bytes())
            .sum();
        embed + norms + layers + head
    }

    /// Bytes the weights take as f32, as a float load holds them (a tied head as its own
    /// transposed copy): what [`weight_bytes`](Self::weight_bytes) compares with.
    pub fn float_weight_bytes(&self) -> usize {
        self.config.float_weight_bytes()
    }

    /// An empty KV cache sized for this model.
    pub fn new_cache(&self) -> KvCache<B> {
        KvCache::new(self.layers.len())
    }

    fn check(&self, input: &DecoderInput<'_>, cached: usize) -> Result<()> {
        let DecoderInput {
            batch, seq, ids, ..
        } = *input;
        if ids.len() != batch * seq {
            return Err(Error::InvalidInput(format!(
                "input_ids has {} values, expected {} (batch {batch}, {seq} new positions)",
                ids.len(),
                batch * seq
            )));
        }
        self.check_positions(batch, seq, input.positions, input.mask, cached)?;
        self.embed.check_ids("input_ids", ids)
    }

    fn check_positions(
        &self,
        batch: usize,
        seq: usize,
        positions: &[i64],
        mask: &[i64],
        cached: usize,
    ) -> Result<()> {
        if batch == 0 || seq == 0 {
            return Err(Error::InvalidInput(format!(
                "empty input: batch {batch}, sequence {seq}"
            )));
        }
        let keys = cached + seq;
        for (name, len, want) in [
            ("position_ids", positions.len(), batch * seq),
            ("attention_mask", mask.len(), batch * keys),
        ] {
            if len != want {
                return Err(Error::InvalidInput(format!(
                    "{name} has {len} values, expected {want} (batch {batch}, {seq} new and \
                     {cached} cached positions)"
                )));
            }
        }
        let limit = self.config.max_position_embeddings() as i64;
        let dynamic = matches!(self.rope.config().scaling, RopeScaling::Dynamic { .. });
        if let Some(p) = positions
            .iter()
            .find(|&&p| p < 0 || (!dynamic && p >= limit))
        {
            return Err(Error::InvalidInput(format!(
                "position {p} is outside the model's context of {limit} positions"
            )));
        }
        Ok(())
    }

    /// The token embeddings `[batch, seq, hidden]` of `ids` (row-major `[batch, seq]`, checked
    /// against the vocabulary): the decoder's input for models that splice other embeddings in
    /// (LLaVA's image features) before [`forward_hidden_embeds`](Self::forward_hidden_embeds).
    pub fn embed_tokens(&self, ids: &[i64], batch: usize, seq: usize) -> Result<Tensor<B, 3>> {
        if ids.len() != batch * seq || ids.is_empty() {
            return Err(Error::InvalidInput(format!(
                "{} token ids do not form a non-empty [{batch}, {seq}] batch",
                ids.len()
            )));
        }
        self.embed.check_ids("input_ids", ids)?;
        Ok(self
            .embed
            .forward(int_tensor::<B, 2>(ids.to_vec(), [batch, seq], &self.device)))
    }

    /// Runs the decoder over `input` and returns the final hidden states `[batch, seq, hidden]`.
    /// With a `cache`, the keys and values of the new positions are appended to it and the
    /// attention covers the cached positions too (`input.mask` spans both).
    pub fn forward_hidden(
        &self,
        input: &DecoderInput<'_>,
        cache: Option<&mut KvCache<B>>,
    ) -> Result<Tensor<B, 3>> {
        let cached = cache.as_ref().map_or(0, |c| c.seq_len());
        self.check(input, cached)?;
        let embeds = self.embed_tokens(input.ids, input.batch, input.seq)?;
        self.forward_hidden_embeds(embeds, input.positions, input.mask, cache)
    }

    /// [`forward_hidden`](Self::forward_hidden) from input embeddings `[batch, seq, hidden]`
    /// instead of token ids (HF's `inputs_embeds`); `positions` `[batch, seq]` and `mask`
    /// `[batch, cached + seq]` as in [`DecoderInput`].
    pub fn forward_hidden_embeds(
        &self,
        embeds: Tensor<B, 3>,
        positions: &[i64],
        mask: &[i64],
        mut cache: Option<&mut KvCache<B>>,
    ) -> Result<Tensor<B, 3>> {
        let [batch, seq, width] = embeds.dims();
        if width != self.config.hidden_size {
            return Err(Error::InvalidInput(format!(
                "input embeddings of width {width}, the model's hidden size is {}",
                self.config.hidden_size
            )));
        }
        let cached = cache.as_ref().map_or(0, |c| c.seq_len());
        if let Some((k, _)) = cache.as_ref().and_then(|c| c.get(0)) {
            if k.dims()[0] != batch {
                return Err(Error::InvalidInput(format!(
                    "the KV cache holds {} rows, the input {batch}",
                    k.dims()[0]
                )));
            }
        }
        self.check_positions(batch, seq, positions, mask, cached)?;
        let keys = cached + seq;
        // One bias row set for every head: it broadcasts over the heads, and it lets grouped-query
        // attention stack the query heads of a key/value head instead of copying keys and values.
        let heads = 1;
        let dev = &self.device;
        let (cos, sin) = self.rope.cos_sin::<B>(positions, batch, seq, dev)?;
        let masking = |window: Option<usize>| Masking {
            bias: match window {
                None => padding_bias::<B>(mask, batch, keys, heads, seq, true, dev),
                Some(w) => sliding_window_bias::<B>(mask, batch, keys, heads, seq, w, dev),
            },
            keep: attended_rows::<B>(mask, batch, keys, seq, window, dev),
            window,
        };
        let full = masking(None);
        let mut windowed: Option<Masking<B>> = None;
        let mut x = embeds;
        for (i, layer) in self.layers.iter().enumerate() {
            let m = match layer.window {
                None => &full,
                Some(w) => {
                    if windowed.as_ref().is_none_or(|m| m.window != Some(w)) {
                        windowed = Some(masking(Some(w)));
                    }
                    windowed.as_ref().unwrap_or(&full)
                }
            };
            let h = layer.input_norm.forward(x.clone());
            let q = self.rope.apply(layer.attn.project_q(h.clone()), &cos, &sin);
            let (k, v) = layer.attn.project_kv(h);
            let k = self.rope.apply(k, &cos, &sin);
            let (k, v) = match cache.as_deref_mut() {
                Some(c) => c.append(i, k, v),
                None => (k, v),
            };
            let mut heads_out = layer.attn.attend_heads(q, k, v, Some(&m.bias));
            if let Some(keep) = &m.keep {
                heads_out = heads_out * keep.clone();
            }
            x = x + layer.attn.output(heads_out);
            x = x.clone() + layer.mlp.forward(layer.post_norm.forward(x));
        }
        Ok(self.norm.forward(x))
    }

    /// The language-model head over hidden states `[batch, seq, hidden]` → logits `[batch, seq,
    /// vocab]`.
    pub fn logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        self.lm_head.forward(hidden)
    }

    /// Logits `[batch, vocab]` of the last position of `hidden` `[batch, seq, hidden]` (the head
    /// runs on one position per row).
    pub fn last_logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 2> {
        let [batch, seq, width] = hidden.dims();
        let last = hidden.narrow(1, seq - 1, 1).reshape([batch, width]);
        self.lm_head.forward(last)
    }

    /// Logits `[batch, seq, vocab]` of every position.
    pub fn forward(
        &self,
        input: &DecoderInput<'_>,
        cache: Option<&mut KvCache<B>>,
    ) -> Result<Tensor<B, 3>> {
        Ok(self.lm_head.forward(self.forward_hidden(input, cache)?))
    }

    /// Logits `[batch, vocab]` of the last position only (what generation needs; the head runs
    /// on one position per row).
    pub fn forward_last(
        &self,
        input: &DecoderInput<'_>,
        cache: Option<&mut KvCache<B>>,
    ) -> Result<Tensor<B, 2>> {
        Ok(self.last_logits(self.forward_hidden(input, cache)?))
    }
}
