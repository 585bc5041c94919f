//! LLaMA / Qwen2 on the cuBLAS engine's decoder (`ipfs_accelerate_backend_cublas::DecoderEngine`):
//! the checkpoint's [`ipfs_accelerate_core::DecoderSpec`] executed with a device-resident KV cache,
//! behind the same interfaces as the burn model ([`TextGeneration`], [`ModelRunner`]) and the
//! shared generation loop (sampling, stop tokens, streaming).

use std::ops::ControlFlow;

use ipfs_accelerate_backend_cublas::DecoderEngine;
use ipfs_accelerate_core::{
    BackendKind, DecoderSpec, Error, HostTensor, ModelRunner, Precision, Result, TensorMap,
};
use ipfs_accelerate_llama::{
    left_padded, run_causal_lm, ForwardInputs, LeftPadded, LlamaConfig, TextGeneration,
};
use ipfs_accelerate_nn::generate::{generate, GenerationConfig};
use ipfs_accelerate_nn::WeightQuantization;

use crate::cuda_tokens::{EngineTokens, Prompt, CUDA_DECODER_ENV};

/// A decoder LM loaded on the cuBLAS engine.
pub struct CudaDecoder {
    engine: DecoderEngine,
    config: LlamaConfig,
    chat_template: Option<String>,
}

impl CudaDecoder {
    /// Uploads `spec` in `precision` (f32 or f16); why not, as a sentence, when the engine cannot
    /// take it (switched off, a missing library, no device, an unsupported shape).
    pub fn load(
        spec: &DecoderSpec,
        config: &LlamaConfig,
        chat_template: Option<String>,
        precision: Precision,
    ) -> std::result::Result<Self, String> {
        if crate::backends::env_switch(CUDA_DECODER_ENV) == Some(false) {
            return Err(format!("{CUDA_DECODER_ENV} is off"));
        }
        let engine = DecoderEngine::load(spec, precision).map_err(|e| e.to_string())?;
        Ok(CudaDecoder {
            engine,
            config: config.clone(),
            chat_template,
        })
    }

    /// A token decoder over `prompts` (left-padded into one batch, as the burn decoder does) whose
    /// cache holds the prompt and `max_new` tokens. The engine checks the ids against the
    /// vocabulary and the cache against the model's positions.
    fn decoder(&self, prompts: &[Vec<u32>], max_new: usize) -> Result<EngineTokens<'_>> {
        let LeftPadded {
            ids,
            mask,
            positions,
            len,
        } = left_padded(prompts, self.config.padding_id())?;
        let flat = |rows: Vec<Vec<i64>>| -> Vec<i32> {
            rows.into_iter().flatten().map(|v| v as i32).collect()
        };
        let next = positions.iter().map(|r| r[len - 1] as i32 + 1).collect();
        let prompt = Prompt {
            ids: flat(ids),
            positions: flat(positions),
            mask: flat(mask),
            len,
        };
        let session = self.engine.session(prompts.len(), len + max_new)?;
        Ok(EngineTokens::new(
            session,
            prompt,
            next,
            self.engine.vocab(),
        ))
    }

    /// Logits `[batch, seq, vocab]` of every position (one uncached pass).
    fn logits(&self, f: &ForwardInputs) -> Result<HostTensor> {
        let session = self.engine.session(f.batch, f.seq)?;
        let dims = (f.batch, f.seq, self.engine.vocab());
        let (positions, mask) = (Some(&f.positions[..]), Some(&f.mask[..]));
        crate::cuda_tokens::logits_of_every(session, dims, &f.ids, positions, mask)
    }

    fn generate_rows(
        &self,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
        on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        let mut decoder = self.decoder(prompts, config.max_new_tokens)?;
        generate(&mut decoder, prompts, config, on_token)
    }
}

impl ModelRunner for CudaDecoder {
    fn family(&self) -> &str {
        self.config.architecture.name()
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn engine(&self) -> Option<&str> {
        Some("cublas")
    }

    /// The peak of the engine's device memory pool: weights, the largest KV cache and the
    /// activations of a call, which a generation benchmark reads after its runs.
    fn device_memory_in_use(&self) -> Option<u64> {
        self.engine.peak_memory()
    }

    /// `input_ids` (+ `attention_mask`, `position_ids`) → `logits`; `greedy_prompt` +
    /// `greedy_steps` → `greedy_tokens` (cached decoding: the same tokens as recomputing).
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        run_causal_lm(
            inputs,
            self.engine.vocab(),
            |f| self.logits(f),
            |prompts, config| self.generate_rows(prompts, config, |_, _| ControlFlow::Continue(())),
        )
    }
}

impl TextGeneration for CudaDecoder {
    fn config(&self) -> &LlamaConfig {
        &self.config
    }

    fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    fn default_generation_config(&self) -> GenerationConfig {
        self.config.default_generation_config()
    }

    fn quantize(&mut self, q: WeightQuantization) -> Result<()> {
        if q == WeightQuantization::None {
            return Ok(());
        }
        Err(Error::InvalidInput(format!(
            "the cuBLAS decoder keeps {} weights; load on cpu to quantize ({q:?})",
            self.engine.precision()
        )))
    }

    fn weight_bytes(&self) -> usize {
        self.engine.weight_bytes()
    }

    fn float_weight_bytes(&self) -> usize {
        self.config.float_weight_bytes()
    }

    fn generate(
        &self,
        prompt: &[u32],
        config: &GenerationConfig,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>> {
        let mut rows = self.generate_rows(&[prompt.to_vec()], config, |_, t| on_token(t))?;
        Ok(rows.pop().unwrap_or_default())
    }

    fn generate_each(
        &self,
        prompts: &[Vec<u32>],
        configs: &[GenerationConfig],
        on_token: &mut dyn FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        let max_new = configs.iter().map(|c| c.max_new_tokens).max().unwrap_or(0);
        let mut decoder = self.decoder(prompts, max_new)?;
        ipfs_accelerate_nn::generate::generate_each(&mut decoder, prompts, configs, on_token)
    }
}
