//! Generation: T5's decoder as a [`TokenDecoder`] for the shared generation loop.

use std::ops::ControlFlow;

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::{
    convert::float_to_vec,
    generate::{generate, GenerationConfig, TokenDecoder},
};

use crate::{DecoderCache, T5Inputs, T5};

/// T5's decoder over one encoded batch, step by step. With a KV cache each step feeds only the new
/// token; without one every step recomputes the whole decoder sequence (HF's `use_cache=False`),
/// which is slower but is the reference the cached path must match.
pub struct T5TokenDecoder<'a, B: Backend> {
    model: &'a T5<B>,
    encoder: Tensor<B, 3>,
    encoder_mask: Vec<i64>,
    start: u32,
    cache: Option<DecoderCache<B>>,
    tokens: Vec<Vec<i64>>,
}

impl<'a, B: Backend> T5TokenDecoder<'a, B> {
    /// A decoder over `encoder` `[batch, seq, d_model]` (the encoder's output for a mask
    /// `encoder_mask`), starting every row at the config's `decoder_start_token_id`.
    pub fn new(
        model: &'a T5<B>,
        encoder: Tensor<B, 3>,
        encoder_mask: Vec<i64>,
        use_cache: bool,
    ) -> Result<Self> {
        let [batch, seq, _] = encoder.dims();
        model.check_mask(&encoder_mask, batch, seq)?;
        Ok(T5TokenDecoder {
            start: model.config().start_token()?,
            cache: use_cache.then(|| model.new_cache()),
            tokens: vec![Vec::new(); batch],
            model,
            encoder,
            encoder_mask,
        })
    }

    /// The decoder tokens of each row so far (start token included).
    pub fn tokens(&self) -> &[Vec<i64>] {
        &self.tokens
    }

    /// Logits `[batch, vocab]` of the position after the last token in `self.tokens`.
    fn next_logits(&mut self, new: &[i64]) -> Result<Vec<f32>> {
        let batch = self.tokens.len();
        let (ids, len) = match self.cache.as_ref() {
            Some(_) => (new.to_vec(), 1),
            None => {
                let len = self.tokens.first().map(Vec::len).unwrap_or(0);
                (self.tokens.concat(), len)
            }
        };
        let hidden = self.model.decode(
            &ids,
            len,
            &self.encoder,
            &self.encoder_mask,
            self.cache.as_mut(),
        )?;
        let d = self.model.config().d_model;
        let last: Tensor<B, 3> = hidden.narrow(1, len - 1, 1).reshape([batch, 1, d]);
        float_to_vec(self.model.lm_logits(last))
    }
}

impl<B: Backend> TokenDecoder for T5TokenDecoder<'_, B> {
    fn batch(&self) -> usize {
        self.tokens.len()
    }

    fn vocab(&self) -> usize {
        self.model.config().vocab_size
    }

    fn prefill(&mut self) -> Result<Vec<f32>> {
        if let Some(cache) = self.cache.as_mut() {
            *cache = self.model.new_cache();
        }
        let start = vec![i64::from(self.start); self.tokens.len()];
        self.tokens = start.iter().map(|&t| vec![t]).collect();
        self.next_logits(&start)
    }

    fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if tokens.len() != self.tokens.len() {
            return Err(Error::InvalidInput(format!(
                "{} tokens for a decoder batch of {}",
                tokens.len(),
                self.tokens.len()
            )));
        }
        if self.tokens.first().is_none_or(Vec::is_empty) {
            return Err(Error::InvalidInput("step() before prefill()".into()));
        }
        let new: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
        for (row, &t) in self.tokens.iter_mut().zip(&new) {
            row.push(t);
        }
        self.next_logits(&new)
    }
}

impl<B: Backend> T5<B> {
    /// Generates from rows of token ids (`attention_mask` optional: without it, shorter rows are
    /// right-padded with the pad id and masked) through the shared generation loop, with the KV
    /// cache. `on_token(row, token)` streams each token; returns the generated tokens per row (the
    /// decoder start token excluded).
    pub fn generate(
        &self,
        input_ids: &[Vec<i64>],
        attention_mask: Option<&[Vec<i64>]>,
        config: &GenerationConfig,
        on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        let pad = self.config().pad_token_id.map(i64::from).unwrap_or(0);
        let inputs = T5Inputs::from_rows(input_ids, attention_mask, pad)?;
        self.generate_inputs(&inputs, config, true, on_token)
    }

    /// [`T5::generate`] on tokenised inputs; `use_cache: false` recomputes the whole decoder at
    /// every step.
    pub fn generate_inputs(
        &self,
        inputs: &T5Inputs,
        config: &GenerationConfig,
        use_cache: bool,
        on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        config.validate()?;
        let encoder = self.encode(inputs)?;
        self.generate_from_encoder(encoder, &inputs.attention_mask, config, use_cache, on_token)
    }

    /// Generation over an encoder output already computed (`encoder_mask` row-major `[batch, seq]`).
    pub fn generate_from_encoder(
        &self,
        encoder: Tensor<B, 3>,
        encoder_mask: &[i64],
        config: &GenerationConfig,
        use_cache: bool,
        on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        let mut decoder = T5TokenDecoder::new(self, encoder, encoder_mask.to_vec(), use_cache)?;
        let start = self.config().start_token()?;
        let prompts = vec![vec![start]; decoder.batch()];
        generate(&mut decoder, &prompts, config, on_token)
    }
}
