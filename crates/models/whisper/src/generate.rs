//! Generation: Whisper's decoder as a [`TokenDecoder`] for the shared generation loop, with the
//! token suppression of Whisper's generation config and language detection.

use std::ops::ControlFlow;

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::{
    convert::float_to_vec,
    generate::{argmax, generate, GenerationConfig, TokenDecoder},
};

use crate::{DecoderCache, Whisper};

/// Tokens whose logits are set to −∞: `always` at every step (`suppress_tokens`), `at_begin` only
/// for the first generated token (`begin_suppress_tokens`), as HF's logits processors.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Suppression {
    /// Never generated.
    pub always: Vec<u32>,
    /// Not generated first.
    pub at_begin: Vec<u32>,
}

impl Suppression {
    /// Checks that every suppressed token is inside a vocabulary of `vocab`.
    pub fn validate(&self, vocab: usize) -> Result<()> {
        match self
            .always
            .iter()
            .chain(&self.at_begin)
            .find(|t| **t as usize >= vocab)
        {
            Some(bad) => Err(Error::InvalidInput(format!(
                "suppressed token {bad} is outside the vocabulary of {vocab}"
            ))),
            None => Ok(()),
        }
    }

    /// Sets the banned logits of every `vocab`-wide row to −∞ (`first`: the first generated token).
    fn apply(&self, logits: &mut [f32], vocab: usize, first: bool) {
        for row in logits.chunks_mut(vocab) {
            let banned = self
                .always
                .iter()
                .chain(self.at_begin.iter().filter(|_| first));
            for &t in banned {
                if let Some(l) = row.get_mut(t as usize) {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
    }
}

/// Any Whisper decoder (burn modules, an ONNX export) with [`Suppression`] applied to its logits.
pub struct Suppressed<D> {
    inner: D,
    suppression: Suppression,
    generated: usize,
}

impl<D: TokenDecoder> Suppressed<D> {
    /// `inner` with `suppression` (checked against its vocabulary).
    pub fn new(inner: D, suppression: Suppression) -> Result<Self> {
        suppression.validate(inner.vocab())?;
        Ok(Suppressed {
            inner,
            suppression,
            generated: 0,
        })
    }

    fn suppress(&mut self, mut logits: Vec<f32>) -> Vec<f32> {
        self.suppression
            .apply(&mut logits, self.inner.vocab().max(1), self.generated == 0);
        self.generated += 1;
        logits
    }
}

impl<D: TokenDecoder> TokenDecoder for Suppressed<D> {
    fn batch(&self) -> usize {
        self.inner.batch()
    }

    fn vocab(&self) -> usize {
        self.inner.vocab()
    }

    fn prefill(&mut self) -> Result<Vec<f32>> {
        self.generated = 0;
        let logits = self.inner.prefill()?;
        Ok(self.suppress(logits))
    }

    fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        let logits = self.inner.step(tokens)?;
        Ok(self.suppress(logits))
    }
}

/// The checks every Whisper decoder makes on its prompts: `batch` non-empty rows of equal length.
pub fn check_prompts(prompts: &[Vec<u32>], batch: usize) -> Result<()> {
    let len = prompts.first().map_or(0, Vec::len);
    if prompts.len() != batch || len == 0 || prompts.iter().any(|p| p.len() != len) {
        return Err(Error::InvalidInput(format!(
            "decoder prompts must be {batch} non-empty rows of equal length, got lengths {:?}",
            prompts.iter().map(Vec::len).collect::<Vec<_>>()
        )));
    }
    Ok(())
}

/// Checks that a prompt of `prompt_len` tokens plus `config.max_new_tokens` fit the decoder's
/// `positions` (the last generated token is never fed back, so prompt + new − 1 positions).
pub fn check_positions(
    prompt_len: usize,
    config: &GenerationConfig,
    positions: usize,
) -> Result<()> {
    config.validate()?;
    if prompt_len + config.max_new_tokens.saturating_sub(1) > positions {
        return Err(Error::InvalidInput(format!(
            "a prompt of {prompt_len} tokens plus {} new tokens exceeds the decoder's {positions} positions",
            config.max_new_tokens
        )));
    }
    Ok(())
}

/// The most likely of `language_tokens` in each `vocab`-wide row of `logits` (HF's language
/// detection, on the logits after `<|startoftranscript|>`).
pub fn pick_language(logits: &[f32], vocab: usize, language_tokens: &[u32]) -> Result<Vec<u32>> {
    if language_tokens.is_empty() {
        return Err(Error::InvalidInput(
            "no language tokens to choose from".into(),
        ));
    }
    logits
        .chunks(vocab.max(1))
        .map(|row| {
            let scores: Vec<f32> = language_tokens
                .iter()
                .map(|&t| row.get(t as usize).copied().unwrap_or(f32::NEG_INFINITY))
                .collect();
            Ok(language_tokens[argmax(&scores) as usize])
        })
        .collect()
}

/// Whisper's decoder over one encoded batch. With a KV cache each step feeds only the new token
/// and reuses the cross-attention keys computed once; without one every step recomputes the whole
/// decoder (HF's `use_cache=False`), the reference the cached path must match.
pub struct WhisperTokenDecoder<'a, B: Backend> {
    model: &'a Whisper<B>,
    encoder: Tensor<B, 3>,
    prompts: Vec<Vec<i64>>,
    use_cache: bool,
    cache: Option<DecoderCache<B>>,
    tokens: Vec<Vec<i64>>,
}

impl<'a, B: Backend> WhisperTokenDecoder<'a, B> {
    /// A decoder over `encoder` `[batch, frames, d_model]` whose rows start from `prompts` (one
    /// per row, all of the same non-zero length, e.g. `[<|startoftranscript|>]`).
    pub fn new(
        model: &'a Whisper<B>,
        encoder: Tensor<B, 3>,
        prompts: &[Vec<u32>],
        use_cache: bool,
    ) -> Result<Self> {
        let [batch, _, _] = encoder.dims();
        check_prompts(prompts, batch)?;
        Ok(WhisperTokenDecoder {
            model,
            encoder,
            prompts: prompts
                .iter()
                .map(|p| p.iter().map(|&t| i64::from(t)).collect())
                .collect(),
            use_cache,
            cache: None,
            tokens: Vec::new(),
        })
    }

    /// The decoder tokens of each row so far (prompt included).
    pub fn tokens(&self) -> &[Vec<i64>] {
        &self.tokens
    }

    /// Runs the decoder on `fed` (row-major, `len` per row) and returns the logits of each row's
    /// last position, `[batch, vocab]`.
    fn logits_after(&mut self, fed: &[i64], len: usize) -> Result<Vec<f32>> {
        let batch = self.tokens.len();
        let mut fresh;
        let cache = match self.cache.as_mut() {
            Some(c) => c,
            None => {
                fresh = self.model.new_cache(&self.encoder);
                &mut fresh
            }
        };
        let hidden = self.model.decode(fed, len, cache, None)?;
        let d = self.model.config().d_model;
        let last: Tensor<B, 3> = hidden.narrow(1, len - 1, 1).reshape([batch, 1, d]);
        float_to_vec(self.model.logits(last))
    }
}

impl<B: Backend> TokenDecoder for WhisperTokenDecoder<'_, B> {
    fn batch(&self) -> usize {
        self.prompts.len()
    }

    fn vocab(&self) -> usize {
        self.model.config().vocab_size
    }

    fn prefill(&mut self) -> Result<Vec<f32>> {
        self.tokens = self.prompts.clone();
        self.cache = self.use_cache.then(|| self.model.new_cache(&self.encoder));
        let len = self.prompts[0].len();
        let fed = self.tokens.concat();
        self.logits_after(&fed, len)
    }

    fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if self.tokens.is_empty() {
            return Err(Error::InvalidInput(
                "the decoder must be prefilled before stepping".into(),
            ));
        }
        if tokens.len() != self.tokens.len() {
            return Err(Error::InvalidInput(format!(
                "step with {} tokens for {} rows",
                tokens.len(),
                self.tokens.len()
            )));
        }
        for (row, &t) in self.tokens.iter_mut().zip(tokens) {
            row.push(i64::from(t));
        }
        if self.cache.is_some() {
            let fed: Vec<i64> = tokens.iter().map(|&t| i64::from(t)).collect();
            self.logits_after(&fed, 1)
        } else {
            let len = self.tokens[0].len();
            let fed = self.tokens.concat();
            self.logits_after(&fed, len)
        }
    }
}

impl<B: Backend> Whisper<B> {
    /// Generates from an encoder output through the shared loop: each row starts from its prompt;
    /// `on_token(row, token)` streams tokens. Returns the generated tokens per row (prompt
    /// excluded, stop token included). Errors when prompt plus generated tokens would exceed the
    /// decoder's positions.
    pub fn generate_from_encoder(
        &self,
        encoder: Tensor<B, 3>,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
        suppression: Suppression,
        use_cache: bool,
        on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        let prompt_len = prompts.first().map_or(0, Vec::len);
        check_positions(prompt_len, config, self.config().max_target_positions)?;
        let decoder = WhisperTokenDecoder::new(self, encoder, prompts, use_cache)?;
        generate(
            &mut Suppressed::new(decoder, suppression)?,
            prompts,
            config,
            on_token,
        )
    }
}
