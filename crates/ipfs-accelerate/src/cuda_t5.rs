//! T5 wholly on the cuBLAS decoder engine: the encoder as a non-causal stack
//! ([`ipfs_accelerate_t5::encoder_stack_spec`], its final-normed states the output), the decoder
//! with cross-attention over them ([`ipfs_accelerate_t5::decoder_spec`]: keys and values of the
//! encoder's states computed once per request, padding masked, a device-resident KV cache, the
//! decoding step replayed as a CUDA graph). Generation, `run` and text-to-text are
//! [`T5Executor`]'s, as on burn.

use std::ops::ControlFlow;
use std::path::Path;

use ipfs_accelerate_backend_cublas::{
    Columns, DecodeSession, DecoderEngine, EncoderStates, LogitsOf,
};
use ipfs_accelerate_core::{Error, HostTensor, ModelRunner, Result, TensorMap};
use ipfs_accelerate_nn::generate::{generate, GenerationConfig};
use ipfs_accelerate_preprocess::TextTokenizer;
use ipfs_accelerate_t5::{T5Config, T5Executor, T5Inputs};

use crate::cuda_tokens::{narrow, positions, EngineTokens};

/// A T5 checkpoint on two decoder engines (encoder stack and decoder).
pub(crate) struct CudaT5 {
    encoder: DecoderEngine,
    decoder: DecoderEngine,
    config: T5Config,
    tokenizer: Option<TextTokenizer>,
}

/// The encoder's output on the host: `[batch, seq, d_model]` states and the padding mask they
/// were computed with.
pub(crate) struct Encoded {
    states: Vec<f32>,
    batch: usize,
    seq: usize,
    mask: Vec<i32>,
}

impl CudaT5 {
    /// Loads the checkpoint folder `dir` on the engine in `options`' precision; why not, as a
    /// sentence, when it cannot take it (switched off, quantized weights asked for, a missing
    /// library, no device, an unsupported shape).
    pub(crate) fn load(
        dir: &Path,
        options: &crate::LoadOptions,
    ) -> std::result::Result<Self, String> {
        crate::cuda_tokens::float_engine_allowed(options)?;
        let config = T5Config::from_file(&dir.join("config.json")).map_err(|e| e.to_string())?;
        let weights = ipfs_accelerate_io::open_weights(dir).map_err(|e| e.to_string())?;
        let precision = options.precision;
        let encoder = crate::cuda_tokens::engine_of(
            ipfs_accelerate_t5::encoder_stack_spec(&config, weights.as_ref()),
            precision,
        )?;
        let decoder = crate::cuda_tokens::engine_of(
            ipfs_accelerate_t5::decoder_spec(&config, weights.as_ref()),
            precision,
        )?;
        let tok = dir.join("tokenizer.json");
        let tokenizer = if tok.is_file() {
            Some(
                TextTokenizer::from_file(&tok, config.max_input_tokens)
                    .map_err(|e| e.to_string())?,
            )
        } else {
            None
        };
        Ok(CudaT5 {
            encoder,
            decoder,
            config,
            tokenizer,
        })
    }

    /// A decoding session over `encoded` whose KV cache holds `capacity` columns per row.
    fn session<'a>(&'a self, encoded: &Encoded, capacity: usize) -> Result<DecodeSession<'a>> {
        let states = EncoderStates {
            values: &encoded.states,
            frames: encoded.seq,
            mask: Some(&encoded.mask),
        };
        Ok(self.decoder.session_over(encoded.batch, capacity, states)?)
    }
}

impl T5Executor for CudaT5 {
    type Encoded = Encoded;

    fn config(&self) -> &T5Config {
        &self.config
    }

    fn tokenizer(&self) -> Option<&TextTokenizer> {
        self.tokenizer.as_ref()
    }

    /// The encoder stack over `inputs` (padding masked as keys), its final-normed states.
    fn encode(&self, inputs: &T5Inputs) -> Result<Encoded> {
        let (batch, seq) = (inputs.batch, inputs.seq);
        if batch == 0 || seq == 0 || inputs.input_ids.len() != batch * seq {
            return Err(Error::InvalidInput(format!(
                "input_ids of {} values for [{batch}, {seq}]",
                inputs.input_ids.len()
            )));
        }
        let mask = narrow("attention_mask", &inputs.attention_mask)?;
        if mask.len() != batch * seq {
            return Err(Error::InvalidInput(format!(
                "attention_mask has {} values for input_ids of shape [{batch}, {seq}]",
                mask.len()
            )));
        }
        if let Some(row) = mask.chunks(seq).position(|r| r.iter().all(|&m| m == 0)) {
            return Err(Error::InvalidInput(format!(
                "attention_mask row {row} masks every token"
            )));
        }
        let mut session = self.encoder.session(batch, seq)?;
        let columns = Columns {
            ids: &narrow("input_ids", &inputs.input_ids)?,
            positions: &positions(batch, seq),
            mask: &mask,
            replaced: None,
        };
        let states = session.forward(&columns, seq, LogitsOf::States)?;
        Ok(Encoded {
            states,
            batch,
            seq,
            mask,
        })
    }

    fn states(&self, encoded: &Encoded) -> Result<HostTensor> {
        HostTensor::from_f32(
            vec![encoded.batch, encoded.seq, self.config.d_model],
            &encoded.states,
        )
    }

    fn logits(
        &self,
        encoded: &Encoded,
        _inputs: &T5Inputs,
        ids: &[i64],
        len: usize,
    ) -> Result<HostTensor> {
        let dims = (encoded.batch, len, self.decoder.vocab());
        crate::cuda_tokens::logits_of_every(
            self.session(encoded, len)?,
            dims,
            ids,
            (None, None),
            None,
        )
    }

    fn generate_from(
        &self,
        encoded: &Encoded,
        _inputs: &T5Inputs,
        config: &GenerationConfig,
        on_token: &mut dyn FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        config.validate()?;
        let capacity = config.max_new_tokens.max(1);
        if capacity > self.decoder.max_positions() {
            return Err(Error::InvalidInput(format!(
                "{} new tokens exceed the decoder's {} positions",
                config.max_new_tokens,
                self.decoder.max_positions()
            )));
        }
        let prompts = vec![vec![self.config.start_token()?]; encoded.batch];
        let session = self.session(encoded, capacity)?;
        let mut decoder = EngineTokens::unpadded(session, &prompts, self.decoder.vocab());
        generate(&mut decoder, &prompts, config, on_token)
    }
}

impl ModelRunner for CudaT5 {
    crate::cuda_tokens::cublas_identity!("t5", decoder);

    fn generate_ids(
        &self,
        inputs: &TensorMap,
        max_new_tokens: usize,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>> {
        ipfs_accelerate_t5::generate_ids(self, inputs, max_new_tokens, on_token)
    }

    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        ipfs_accelerate_t5::run_outputs(self, inputs)
    }
}
