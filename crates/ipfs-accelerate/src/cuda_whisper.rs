//! Whisper wholly on the cuBLAS engine: the encoder's [`ipfs_accelerate_core::EncoderSpec`] on
//! the encoder engine, the decoder's [`ipfs_accelerate_core::DecoderSpec`] on the decoder engine
//! (cross-attention keys and values of the encoder's states computed once per request, a
//! device-resident KV cache, the decoding step replayed as a CUDA graph). Transcription (prompt,
//! language detection, suppression, end of text) is [`WhisperAssets`]'s, as on every executor.

use std::ops::ControlFlow;
use std::path::Path;

use ipfs_accelerate_backend_cublas::{DecodeSession, DecoderEngine, EncoderStates};
use ipfs_accelerate_core::{BackendKind, Error, HostTensor, ModelRunner, Result, TensorMap};
use ipfs_accelerate_nn::generate::{generate, single_row, GenerationConfig, TokenDecoder};
use ipfs_accelerate_preprocess::audio::LogMel;
use ipfs_accelerate_whisper::{decode_outputs, WhisperAssets, WhisperExecutor};

use crate::cuda_tokens::EngineTokens;

/// A Whisper checkpoint on the cuBLAS encoder and decoder engines.
pub(crate) struct CudaWhisper {
    encoder: Box<dyn ModelRunner>,
    decoder: DecoderEngine,
    assets: WhisperAssets,
}

impl CudaWhisper {
    /// Loads the checkpoint folder `dir` on both engines in `options`' precision; why not, as a
    /// sentence, when either cannot take it (switched off, a missing library, no device, an
    /// unsupported shape or option).
    pub(crate) fn load(
        dir: &Path,
        options: &crate::LoadOptions,
    ) -> std::result::Result<Self, String> {
        crate::cuda_tokens::float_engine_allowed(options)?;
        let assets = WhisperAssets::from_dir(dir).map_err(|e| e.to_string())?;
        let weights = ipfs_accelerate_io::open_weights(dir).map_err(|e| e.to_string())?;
        let encoder = crate::backends::cublas_encoder_for(BackendKind::Cuda, options, || {
            ipfs_accelerate_whisper::encoder_spec(&assets.config, weights.as_ref())
        })?;
        let decoder = crate::cuda_tokens::engine_of(
            ipfs_accelerate_whisper::decoder_spec(&assets.config, weights.as_ref()),
            options.precision,
        )?;
        Ok(CudaWhisper {
            encoder,
            decoder,
            assets,
        })
    }

    /// The encoder's `last_hidden_state` `[batch, frames, d_model]` of `inputs`' `input_features`.
    fn states(&self, inputs: &TensorMap) -> Result<HostTensor> {
        self.encoder
            .run(inputs)?
            .remove("last_hidden_state")
            .ok_or_else(|| {
                Error::Compute("the encoder engine returned no last_hidden_state".into())
            })
    }

    /// A decoding session over `states` whose KV cache holds `capacity` columns per row.
    fn session(&self, states: &HostTensor, capacity: usize) -> Result<DecodeSession<'_>> {
        let &[batch, frames, _] = states.shape() else {
            return Err(Error::Compute(format!(
                "encoder states of shape {:?}",
                states.shape()
            )));
        };
        // The host tensor's own f32 values when it holds f32 (the encoder engine's output does).
        let owned;
        let values = match states.as_f32() {
            Some(v) => v,
            None => {
                owned = states.to_f32_vec();
                &owned
            }
        };
        let states = EncoderStates {
            values,
            frames,
            mask: None,
        };
        Ok(self.decoder.session_over(batch, capacity, states)?)
    }

    /// A token decoder over `states` whose rows start from `prompts` (one length, as
    /// [`WhisperExecutor::decoder`] takes them).
    fn tokens(&self, states: &HostTensor, prompts: &[Vec<u32>]) -> Result<EngineTokens<'_>> {
        ipfs_accelerate_whisper::check_prompts(prompts, states.shape()[0])?;
        let session = self.session(states, self.decoder.max_positions())?;
        Ok(EngineTokens::unpadded(
            session,
            prompts,
            self.decoder.vocab(),
        ))
    }

    /// Logits `[batch, len, vocab]` of `ids` (row-major `[batch, len]`, positions from 0) with
    /// `mask` (1 = token, 0 = padding; all tokens without one) after `states`.
    fn logits(
        &self,
        states: &HostTensor,
        ids: &[i64],
        len: usize,
        mask: Option<&[i64]>,
    ) -> Result<HostTensor> {
        let dims = (states.shape()[0], len, self.decoder.vocab());
        crate::cuda_tokens::logits_of_every(
            self.session(states, len)?,
            dims,
            ids,
            (None, mask),
            None,
        )
    }

    /// Greedy rows from `prompts` after `states` (no suppression), through the shared loop.
    fn greedy(
        &self,
        states: &HostTensor,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
        on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        let len = prompts.first().map_or(0, Vec::len);
        ipfs_accelerate_whisper::check_positions(len, config, self.decoder.max_positions())?;
        let mut decoder = self.tokens(states, prompts)?;
        generate(&mut decoder, prompts, config, on_token)
    }
}

impl WhisperExecutor for CudaWhisper {
    /// The encoder's states on the host: a session uploads them once.
    type Encoded = HostTensor;

    fn assets(&self) -> &WhisperAssets {
        &self.assets
    }

    fn encode(&self, features: &LogMel) -> Result<HostTensor> {
        let x = HostTensor::from_f32(vec![1, features.mels, features.frames], &features.data)?;
        let mut inputs = TensorMap::new();
        inputs.insert("input_features".into(), x);
        self.states(&inputs)
    }

    /// The engine always caches (`use_cache` is the burn decoder's reference switch).
    fn decoder<'a>(
        &'a self,
        encoded: &'a HostTensor,
        prompts: &[Vec<u32>],
        _use_cache: bool,
    ) -> Result<Box<dyn TokenDecoder + 'a>> {
        Ok(Box::new(self.tokens(encoded, prompts)?))
    }
}

impl ModelRunner for CudaWhisper {
    crate::cuda_tokens::cublas_identity!("whisper", decoder);

    /// `input_features` → `encoder_last_hidden_state`, and as [`decode_outputs`] says `logits`
    /// and `greedy_tokens`.
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        let states = self.states(inputs)?;
        let batch = states.shape().first().copied().unwrap_or(0);
        let start = self.assets.config.decoder_start_token_id;
        let mut out = decode_outputs(
            inputs,
            batch,
            start,
            |ids, len, mask| self.logits(&states, ids, len, mask),
            |prompts, config| {
                self.greedy(&states, prompts, config, |_, _| ControlFlow::Continue(()))
            },
        )?;
        out.insert("encoder_last_hidden_state".into(), states);
        Ok(out)
    }

    /// Greedy tokens from `decoder_start_token_id` after `input_features` (no stop token, no
    /// suppression): the benchmark's generation.
    fn generate_ids(
        &self,
        inputs: &TensorMap,
        max_new_tokens: usize,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>> {
        let states = self.states(inputs)?;
        let prompts = vec![vec![self.assets.config.decoder_start_token_id]];
        let config = GenerationConfig::exact_greedy(max_new_tokens);
        single_row(self.greedy(&states, &prompts, &config, |_, t| on_token(t))?)
    }
}
