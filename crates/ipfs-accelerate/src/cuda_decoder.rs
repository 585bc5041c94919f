//! LLaMA / Qwen2 on the cuBLAS engine's decoder (`ipfs_accelerate_backend_cublas::DecoderEngine`):
//! the checkpoint's [`ipfs_accelerate_core::DecoderSpec`] executed with a device-resident KV cache,
//! behind the same interfaces as the burn model ([`TextGeneration`], [`ModelRunner`]) and the
//! shared generation loop (sampling, stop tokens, streaming).

use std::ops::ControlFlow;

use ipfs_accelerate_backend_cublas::{Columns, DecodeSession, DecoderEngine, LogitsOf};
use ipfs_accelerate_core::{
    BackendKind, DecoderSpec, Error, HostTensor, ModelRunner, Precision, Result, TensorMap,
};
use ipfs_accelerate_llama::{
    check_vocab, greedy_steps, greedy_tokens, positions_from_mask, same_shape_ids, token_matrix,
    LlamaConfig, TextGeneration,
};
use ipfs_accelerate_nn::generate::{generate, GenerationConfig, TokenDecoder};
use ipfs_accelerate_nn::WeightQuantization;

/// The environment variable that keeps generation on `cuda` off the cuBLAS decoder (`0` / `off`):
/// it then runs on burn's CubeCL kernels in f32.
pub const CUDA_DECODER_ENV: &str = "IPFS_ACCELERATE_CUDA_DECODER";

/// A decoder LM loaded on the cuBLAS engine.
pub struct CudaDecoder {
    engine: DecoderEngine,
    config: LlamaConfig,
    chat_template: Option<String>,
    weight_bytes: usize,
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
        if std::env::var(CUDA_DECODER_ENV)
            .ok()
            .and_then(|v| crate::backends::parse_switch(&v).ok())
            == Some(false)
        {
            return Err(format!("{CUDA_DECODER_ENV} is off"));
        }
        let engine = DecoderEngine::load(spec, precision).map_err(|e| e.to_string())?;
        let per_value = if precision == Precision::F16 { 2 } else { 4 };
        Ok(CudaDecoder {
            engine,
            config: config.clone(),
            chat_template,
            weight_bytes: spec.float_bytes() / 4 * per_value,
        })
    }

    /// A token decoder over `prompts` (left-padded into one batch, as the burn decoder does) whose
    /// cache holds the prompt and `max_new` tokens.
    fn decoder(&self, prompts: &[Vec<u32>], max_new: usize) -> Result<EngineTokens<'_>> {
        if prompts.is_empty() || prompts.iter().any(Vec::is_empty) {
            return Err(Error::InvalidInput("an empty prompt".into()));
        }
        let vocab = self.engine.vocab();
        let len = prompts.iter().map(Vec::len).max().unwrap_or(0);
        let capacity = len + max_new;
        if capacity > self.engine.max_positions() {
            return Err(Error::InvalidInput(format!(
                "a prompt of {len} tokens + {max_new} new tokens exceeds the model's {} positions",
                self.engine.max_positions()
            )));
        }
        let pad = self
            .config
            .pad_token_id
            .filter(|&p| p >= 0 && (p as usize) < vocab)
            .unwrap_or(0) as i32;
        let (mut ids, mut mask) = (Vec::new(), Vec::new());
        for p in prompts {
            if let Some(bad) = p.iter().find(|&&t| t as usize >= vocab) {
                return Err(Error::InvalidInput(format!(
                    "token {bad} is outside the vocabulary of {vocab}"
                )));
            }
            let padding = len - p.len();
            ids.extend(std::iter::repeat_n(pad, padding));
            ids.extend(p.iter().map(|&t| t as i32));
            mask.extend(std::iter::repeat_n(0i64, padding));
            mask.extend(std::iter::repeat_n(1i64, p.len()));
        }
        let positions: Vec<i32> = positions_from_mask(&mask, prompts.len(), len)
            .into_iter()
            .map(|p| p as i32)
            .collect();
        let next = positions.chunks(len).map(|r| r[len - 1] + 1).collect();
        Ok(EngineTokens {
            session: self.engine.session(prompts.len(), capacity)?,
            prompt: Some(Prompt {
                ids,
                positions,
                mask: mask.iter().map(|&m| m as i32).collect(),
                len,
            }),
            next,
            vocab,
        })
    }

    /// Logits `[batch, seq, vocab]` of every position (one uncached pass).
    fn logits(&self, inputs: &TensorMap, input_ids: &HostTensor) -> Result<HostTensor> {
        let [batch, seq] = token_matrix("input_ids", input_ids)?;
        let ids = input_ids.to_i64_vec()?;
        check_vocab("input_ids", &ids, self.engine.vocab())?;
        let positions = same_shape_ids(inputs, "position_ids", input_ids)?
            .unwrap_or_else(|| (0..batch).flat_map(|_| 0..seq as i64).collect());
        let mask = same_shape_ids(inputs, "attention_mask", input_ids)?
            .unwrap_or_else(|| vec![1; batch * seq]);
        let narrow = |v: &[i64]| -> Vec<i32> { v.iter().map(|&x| x as i32).collect() };
        let mut session = self.engine.session(batch, seq)?;
        let logits = session.forward(
            &Columns {
                ids: &narrow(&ids),
                positions: &narrow(&positions),
                mask: &narrow(&mask),
            },
            seq,
            LogitsOf::Every,
        )?;
        HostTensor::from_f32(vec![batch, seq, self.engine.vocab()], &logits)
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

/// A left-padded prompt: ids, positions and mask `[batch, len]`, and `len`.
struct Prompt {
    ids: Vec<i32>,
    positions: Vec<i32>,
    mask: Vec<i32>,
    len: usize,
}

/// One generation's [`TokenDecoder`] on the engine: the prompt on the first call, one token per
/// row after it.
struct EngineTokens<'e> {
    session: DecodeSession<'e>,
    /// The padded prompt, until prefill.
    prompt: Option<Prompt>,
    /// The next position of each row.
    next: Vec<i32>,
    vocab: usize,
}

impl TokenDecoder for EngineTokens<'_> {
    fn batch(&self) -> usize {
        self.next.len()
    }

    fn vocab(&self) -> usize {
        self.vocab
    }

    fn prefill(&mut self) -> Result<Vec<f32>> {
        let p = self
            .prompt
            .take()
            .ok_or_else(|| Error::InvalidInput("prefill called twice on one decoder".into()))?;
        let columns = Columns {
            ids: &p.ids,
            positions: &p.positions,
            mask: &p.mask,
        };
        Ok(self.session.forward(&columns, p.len, LogitsOf::Last)?)
    }

    fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if self.prompt.is_some() {
            return Err(Error::InvalidInput("step called before prefill".into()));
        }
        if tokens.len() != self.next.len() {
            return Err(Error::InvalidInput(format!(
                "{} tokens for a batch of {}",
                tokens.len(),
                self.next.len()
            )));
        }
        let ids: Vec<i32> = tokens.iter().map(|&t| t as i32).collect();
        let positions = self.next.clone();
        let mask = vec![1; tokens.len()];
        let logits = self.session.forward(
            &Columns {
                ids: &ids,
                positions: &positions,
                mask: &mask,
            },
            1,
            LogitsOf::Last,
        )?;
        self.next.iter_mut().for_each(|p| *p += 1);
        Ok(logits)
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
        let mut map = TensorMap::new();
        if let Some(ids) = inputs.get("input_ids") {
            map.insert("logits".into(), self.logits(inputs, ids)?);
        }
        if let Some(prompt) = inputs.get("greedy_prompt") {
            let [rows, cols] = token_matrix("greedy_prompt", prompt)?;
            let steps = greedy_steps(inputs)?;
            let ids = prompt.to_i64_vec()?;
            check_vocab("greedy_prompt", &ids, self.engine.vocab())?;
            let prompts: Vec<Vec<u32>> = ids
                .chunks(cols)
                .take(rows)
                .map(|r| r.iter().map(|&t| t as u32).collect())
                .collect();
            let tokens = greedy_tokens(&prompts, steps, |prompts, config| {
                self.generate_rows(prompts, config, |_, _| ControlFlow::Continue(()))
            })?;
            map.insert("greedy_tokens".into(), tokens);
        }
        if map.is_empty() {
            return Err(Error::InvalidInput(
                "missing input: `input_ids` or `greedy_prompt`".into(),
            ));
        }
        Ok(map)
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
        GenerationConfig {
            stop_tokens: self.config.eos_token_ids(),
            ..GenerationConfig::default()
        }
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
        self.weight_bytes
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
}
