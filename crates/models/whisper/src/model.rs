//! Whisper's encoder (two GELU convolutions, sinusoidal positions, pre-LN layers) and decoder
//! (learned positions, causal self-attention with a KV cache, cross-attention over the encoder),
//! with the output projection tied to the token embedding.

use std::sync::Arc;

use burn::tensor::{backend::Backend, Int, Tensor};
use ipfs_accelerate_core::{Error, Result, TensorSource};
use ipfs_accelerate_nn::{
    attention::{
        padding_bias, AttentionConfig, MultiHeadAttention, ProjectionBias, ProjectionNames,
    },
    convert::int_tensor,
    transformer::{Mlp, PreLnNames},
    trunk::Trunk,
    Activation, Embedding, KvCache, LayerNorm, Linear, VarBuilder,
};

use crate::config::{WhisperConfig, LAYER_NORM_EPS};

/// Whisper's attention projections: `k_proj` has no bias, the other three do.
pub(crate) const WHISPER_BIAS: ProjectionBias = ProjectionBias {
    q: true,
    k: false,
    v: true,
    o: true,
};

/// The weight names of `WhisperEncoderLayer` for the shared pre-LN layer.
pub(crate) const ENCODER_LAYER_NAMES: PreLnNames<'static> = PreLnNames {
    norm1: "self_attn_layer_norm",
    attention: ProjectionNames {
        q: "self_attn.q_proj",
        k: "self_attn.k_proj",
        v: "self_attn.v_proj",
        o: "self_attn.out_proj",
    },
    norm2: "final_layer_norm",
    fc1: "fc1",
    fc2: "fc2",
};

fn attention<B: Backend>(
    vb: &VarBuilder<B>,
    d: usize,
    heads: usize,
) -> Result<MultiHeadAttention<B>> {
    MultiHeadAttention::load(
        vb,
        AttentionConfig::new(d, heads, WHISPER_BIAS),
        ProjectionNames::OUT_PROJ,
    )
}

/// The decoder's pre-LN feed-forward sub-block `x + fc2(act(fc1(final_layer_norm(x))))`.
struct FeedForward<B: Backend> {
    norm: LayerNorm<B>,
    mlp: Mlp<B>,
}

impl<B: Backend> FeedForward<B> {
    fn load(vb: &VarBuilder<B>, d: usize, ffn: usize, act: Activation) -> Result<Self> {
        Ok(FeedForward {
            norm: LayerNorm::load(&vb.pp("final_layer_norm"), d, LAYER_NORM_EPS)?,
            mlp: Mlp::load(vb, ("fc1", "fc2"), d, ffn, act)?,
        })
    }

    fn residual(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        x.clone() + self.mlp.forward(self.norm.forward(x))
    }
}

/// `WhisperEncoder`: log-mel `[batch, num_mel_bins, 2 * max_source_positions]` →
/// `[batch, max_source_positions, d_model]`; Whisper's description
/// ([`crate::describe_encoder`]) run by the shared burn trunk executor.
pub struct WhisperEncoder<B: Backend> {
    trunk: Trunk<B>,
}

impl<B: Backend> WhisperEncoder<B> {
    /// Loads the encoder from `vb` (rooted at `model.encoder`).
    pub fn load(vb: &VarBuilder<B>, c: &WhisperConfig) -> Result<Self> {
        Ok(WhisperEncoder {
            trunk: Trunk::new(crate::describe_encoder(vb, c)?, vb.device())?,
        })
    }

    /// Encodes `features` `[batch, num_mel_bins, frames]`; the frame count must be exactly
    /// `2 * max_source_positions`, as HF requires.
    pub fn forward(&self, features: Tensor<B, 3>) -> Result<Tensor<B, 3>> {
        Ok(self.trunk.forward_frames(features)?.last_hidden_state)
    }
}

struct DecoderLayer<B: Backend> {
    self_attn: MultiHeadAttention<B>,
    self_attn_layer_norm: LayerNorm<B>,
    encoder_attn: MultiHeadAttention<B>,
    encoder_attn_layer_norm: LayerNorm<B>,
    feed_forward: FeedForward<B>,
}

impl<B: Backend> DecoderLayer<B> {
    fn load(vb: &VarBuilder<B>, c: &WhisperConfig) -> Result<Self> {
        let (d, heads) = (c.d_model, c.decoder_attention_heads);
        Ok(DecoderLayer {
            self_attn: attention(&vb.pp("self_attn"), d, heads)?,
            self_attn_layer_norm: LayerNorm::load(
                &vb.pp("self_attn_layer_norm"),
                d,
                LAYER_NORM_EPS,
            )?,
            encoder_attn: attention(&vb.pp("encoder_attn"), d, heads)?,
            encoder_attn_layer_norm: LayerNorm::load(
                &vb.pp("encoder_attn_layer_norm"),
                d,
                LAYER_NORM_EPS,
            )?,
            feed_forward: FeedForward::load(vb, d, c.decoder_ffn_dim, c.activation_function)?,
        })
    }
}

/// Per-layer keys and values of a decoding session: self-attention grows step by step, the
/// cross-attention keys and values of the encoder output are computed once.
#[derive(Debug, Clone)]
pub struct DecoderCache<B: Backend> {
    /// Self-attention keys / values (appended every step).
    pub self_attn: KvCache<B>,
    /// Cross-attention keys / values of the encoder output.
    pub cross_attn: KvCache<B>,
}

/// `WhisperDecoder`: token ids → hidden states after the final layer norm.
pub struct WhisperDecoder<B: Backend> {
    embed_tokens: Embedding<B>,
    positions: Tensor<B, 2>,
    layers: Vec<DecoderLayer<B>>,
    norm: LayerNorm<B>,
    heads: usize,
}

impl<B: Backend> WhisperDecoder<B> {
    /// Loads the decoder from `vb` (rooted at `model.decoder`).
    pub fn load(vb: &VarBuilder<B>, c: &WhisperConfig) -> Result<Self> {
        let d = c.d_model;
        Ok(WhisperDecoder {
            embed_tokens: Embedding::load(&vb.pp("embed_tokens"), c.vocab_size, d)?,
            positions: vb.tensor("embed_positions.weight", [c.max_target_positions, d])?,
            layers: (0..c.decoder_layers)
                .map(|i| DecoderLayer::load(&vb.pp(format!("layers.{i}")), c))
                .collect::<Result<_>>()?,
            norm: LayerNorm::load(&vb.pp("layer_norm"), d, LAYER_NORM_EPS)?,
            heads: c.decoder_attention_heads,
        })
    }

    /// The cross-attention keys and values of `encoder` `[batch, frames, d_model]` for every layer,
    /// in a fresh cache with an empty self-attention part.
    pub fn new_cache(&self, encoder: &Tensor<B, 3>) -> DecoderCache<B> {
        let mut cross = KvCache::new(self.layers.len());
        for (i, layer) in self.layers.iter().enumerate() {
            let (k, v) = layer.encoder_attn.project_kv(encoder.clone());
            cross.set(i, k, v);
        }
        DecoderCache {
            self_attn: KvCache::new(self.layers.len()),
            cross_attn: cross,
        }
    }

    /// Runs the decoder over `ids` (row-major `[batch, len]`) placed after the positions already
    /// in `cache.self_attn`, appending their keys and values. `mask` (row-major
    /// `[batch, cached + len]`, 1 = token, 0 = padding) masks padded keys; without it every key is
    /// visible, causally.
    pub fn forward(
        &self,
        ids: &[i64],
        len: usize,
        cache: &mut DecoderCache<B>,
        mask: Option<&[i64]>,
    ) -> Result<Tensor<B, 3>> {
        let [max_positions, _] = self.positions.dims();
        if len == 0 || ids.is_empty() || !ids.len().is_multiple_of(len) {
            return Err(Error::InvalidInput(format!(
                "decoder ids: {} values do not form rows of {len} tokens",
                ids.len()
            )));
        }
        let batch = ids.len() / len;
        let offset = cache.self_attn.seq_len();
        let keys = offset + len;
        if keys > max_positions {
            return Err(Error::InvalidInput(format!(
                "decoder sequence of {keys} tokens is longer than the model's {max_positions} positions"
            )));
        }
        self.embed_tokens.check_ids("decoder_input_ids", ids)?;
        let device = self.positions.device();
        let bias = match mask {
            Some(m) if m.len() != batch * keys => {
                return Err(Error::InvalidInput(format!(
                    "decoder attention mask has {} values, expected [{batch}, {keys}]",
                    m.len()
                )))
            }
            Some(m) => Some(padding_bias::<B>(
                m, batch, keys, self.heads, len, true, &device,
            )),
            None if len > 1 => {
                let ones = vec![1i64; batch * keys];
                Some(padding_bias::<B>(
                    &ones, batch, keys, self.heads, len, true, &device,
                ))
            }
            // One new token sees every cached position: no mask.
            None => None,
        };
        let ids: Tensor<B, 2, Int> = int_tensor(ids.to_vec(), [batch, len], &device);
        let mut x = self.embed_tokens.forward(ids)
            + self
                .positions
                .clone()
                .narrow(0, offset, len)
                .unsqueeze::<3>();
        for (i, layer) in self.layers.iter().enumerate() {
            let h = layer.self_attn_layer_norm.forward(x.clone());
            let q = layer.self_attn.project_q(h.clone());
            let (k, v) = layer.self_attn.project_kv(h);
            let (k, v) = cache.self_attn.append(i, k, v);
            x = x + layer.self_attn.attend(q, k, v, bias.as_ref());

            let (ck, cv) = cache.cross_attn.get(i).ok_or_else(|| {
                Error::InvalidInput(format!(
                    "decoder cache has no cross-attention keys for layer {i} (build it with new_cache)"
                ))
            })?;
            let q = layer
                .encoder_attn
                .project_q(layer.encoder_attn_layer_norm.forward(x.clone()));
            x = x + layer.encoder_attn.attend(q, ck, cv, None);
            x = layer.feed_forward.residual(x);
        }
        Ok(self.norm.forward(x))
    }
}

/// `WhisperForConditionalGeneration`: encoder, decoder and the output projection.
pub struct Whisper<B: Backend> {
    /// The encoder; `None` when loaded without it ([`Whisper::load_without_encoder`]).
    pub encoder: Option<WhisperEncoder<B>>,
    /// The decoder.
    pub decoder: WhisperDecoder<B>,
    proj_out: Linear<B>,
    config: WhisperConfig,
}

impl<B: Backend> Whisper<B> {
    /// Loads a checkpoint of `WhisperForConditionalGeneration` (tensors under `model.`) or of the
    /// bare `WhisperModel` (no prefix). `proj_out` is the token embedding when tied (the default),
    /// else `proj_out.weight`.
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &WhisperConfig,
        device: &B::Device,
    ) -> Result<Self> {
        Self::load_parts(source, config, device, true)
    }

    /// [`Whisper::load`] without the encoder's weights, for a model whose encoder runs elsewhere
    /// (an engine of [`crate::encoder_spec`]): [`Whisper::encode`] is then an error.
    pub fn load_without_encoder(
        source: Arc<dyn TensorSource>,
        config: &WhisperConfig,
        device: &B::Device,
    ) -> Result<Self> {
        Self::load_parts(source, config, device, false)
    }

    /// [`Whisper::load`], or with `with_encoder` false [`Whisper::load_without_encoder`].
    pub(crate) fn load_parts(
        source: Arc<dyn TensorSource>,
        config: &WhisperConfig,
        device: &B::Device,
        with_encoder: bool,
    ) -> Result<Self> {
        let root = VarBuilder::<B>::new(source.clone(), device);
        let base = if source.contains("model.encoder.conv1.weight") {
            root.pp("model")
        } else {
            root.clone()
        };
        let encoder = with_encoder
            .then(|| WhisperEncoder::load(&base.pp("encoder"), config))
            .transpose()?;
        let decoder = WhisperDecoder::load(&base.pp("decoder"), config)?;
        let proj_out = if config.tie_word_embeddings {
            Linear::from_tensors(decoder.embed_tokens.weight().clone(), None)
        } else {
            Linear::load(
                &root.pp("proj_out"),
                config.d_model,
                config.vocab_size,
                false,
            )?
        };
        Ok(Whisper {
            encoder,
            decoder,
            proj_out,
            config: config.clone(),
        })
    }

    /// The configuration.
    pub fn config(&self) -> &WhisperConfig {
        &self.config
    }

    /// Encodes log-mel features `[batch, num_mel_bins, frames]`.
    pub fn encode(&self, features: Tensor<B, 3>) -> Result<Tensor<B, 3>> {
        self.encoder
            .as_ref()
            .ok_or_else(|| {
                Error::InvalidInput(
                    "this Whisper was loaded without its encoder (an encoder engine encodes)"
                        .into(),
                )
            })?
            .forward(features)
    }

    /// A decoding cache over an encoder output.
    pub fn new_cache(&self, encoder: &Tensor<B, 3>) -> DecoderCache<B> {
        self.decoder.new_cache(encoder)
    }

    /// Decoder hidden states for `ids` (`[batch, len]`, after what `cache` holds).
    pub fn decode(
        &self,
        ids: &[i64],
        len: usize,
        cache: &mut DecoderCache<B>,
        mask: Option<&[i64]>,
    ) -> Result<Tensor<B, 3>> {
        self.decoder.forward(ids, len, cache, mask)
    }

    /// Vocabulary logits of decoder hidden states.
    pub fn logits(&self, hidden: Tensor<B, 3>) -> Tensor<B, 3> {
        self.proj_out.forward(hidden)
    }

    /// Logits `[batch, len, vocab]` of `decoder_input_ids` over an encoder output, recomputed
    /// from scratch (HF's forward with `decoder_input_ids`).
    pub fn forward_logits(
        &self,
        encoder: &Tensor<B, 3>,
        decoder_input_ids: &[i64],
        len: usize,
        decoder_attention_mask: Option<&[i64]>,
    ) -> Result<Tensor<B, 3>> {
        let mut cache = self.new_cache(encoder);
        let [batch, _, _] = encoder.dims();
        if decoder_input_ids.len() != batch * len {
            return Err(Error::InvalidInput(format!(
                "decoder_input_ids hold {} ids, expected [{batch}, {len}] for {batch} audio inputs",
                decoder_input_ids.len()
            )));
        }
        let hidden = self.decode(decoder_input_ids, len, &mut cache, decoder_attention_mask)?;
        Ok(self.logits(hidden))
    }
}
