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
use ipfs_accelerate_nn::generate::{
    generate, generate_continuous, GenerationConfig, RowDecoder, RowPick, RowRequest, TokenDecoder,
};
use ipfs_accelerate_nn::WeightQuantization;

use crate::cuda_tokens::{EngineTokens, Prompt, Replacement, CUDA_DECODER_ENV};

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
        self.decoder_replacing(prompts, max_new, |_, _| Ok(None))
    }

    /// [`CudaDecoder::decoder`] whose prefill replaces the input embeddings that `replace` picks
    /// from the padded batch's ids and mask (row-major `[batch, len]`).
    pub(crate) fn decoder_replacing(
        &self,
        prompts: &[Vec<u32>],
        max_new: usize,
        replace: impl FnOnce(&[i64], &[i64]) -> Result<Option<Replacement>>,
    ) -> Result<EngineTokens<'_>> {
        let LeftPadded {
            ids,
            mask,
            positions,
            len,
        } = left_padded(prompts, self.config.padding_id())?;
        let (ids, mask) = (ids.concat(), mask.concat());
        let replaced = replace(&ids, &mask)?;
        let narrow = |rows: &[i64]| -> Vec<i32> { rows.iter().map(|&v| v as i32).collect() };
        let next = positions.iter().map(|r| r[len - 1] as i32 + 1).collect();
        let prompt = Prompt {
            ids: narrow(&ids),
            positions: narrow(&positions.concat()),
            mask: narrow(&mask),
            len,
            replaced,
        };
        let session = self.engine.session(prompts.len(), len + max_new)?;
        Ok(EngineTokens::new(
            session,
            prompt,
            next,
            self.engine.vocab(),
        ))
    }

    /// The engine.
    pub(crate) fn engine(&self) -> &DecoderEngine {
        &self.engine
    }

    /// Logits `[batch, seq, vocab]` of every position (one uncached pass).
    fn logits(&self, f: &ForwardInputs) -> Result<HostTensor> {
        let session = self.engine.session(f.batch, f.seq)?;
        let dims = (f.batch, f.seq, self.engine.vocab());
        let (positions, mask) = (Some(&f.positions[..]), Some(&f.mask[..]));
        crate::cuda_tokens::logits_of_every(session, dims, &f.ids, (positions, mask), None)
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

    fn joins_running_batches(&self) -> bool {
        true
    }

    /// Continuous batching on the engine ([`EngineRows`]).
    fn generate_continuous(
        &self,
        first: Vec<RowRequest>,
        max_rows: usize,
        admit: &mut dyn FnMut(usize) -> Vec<RowRequest>,
        on_token: &mut dyn FnMut(usize, u32) -> ControlFlow<()>,
        on_done: &mut dyn FnMut(usize, Result<Vec<u32>>),
    ) -> Result<()> {
        let mut rows = EngineRows {
            model: self,
            histories: first.iter().map(|r| r.prompt.clone()).collect(),
            session: None,
        };
        generate_continuous(&mut rows, first, max_rows, admit, on_token, on_done)
    }
}

/// The fewest free columns a rebuilt cache gets (it gets as many as its rows' longest history
/// when that is more, so a long generation rebuilds a logarithmic number of times).
const MIN_ROOM: usize = 64;

/// The session of [`EngineRows`]: its decoder, whether each of its rows holds a running request
/// (false: one that finished), and its cache's columns in use and in all.
struct RowSession<'e> {
    tokens: EngineTokens<'e>,
    alive: Vec<bool>,
    columns: usize,
    capacity: usize,
}

/// Continuous batching on the cuBLAS decoder: a [`RowDecoder`] whose rows are whole requests.
/// The engine's KV cache holds one batch with one column count, so a request that joins, a cache
/// that is full, or a batch with more finished rows than running ones **rebuilds** it: the
/// running requests' histories (prompt and tokens so far) are prefilled again together, left
/// padded, in one pass. Between rebuilds every step is the session's ordinary (graph-replayed)
/// decoding step; finished rows ride along until the next rebuild drops them. Each request gets
/// the tokens it gets alone, up to the rounding of a batched product.
struct EngineRows<'e> {
    model: &'e CudaDecoder,
    /// Each running request's tokens so far, in batch order.
    histories: Vec<Vec<u32>>,
    session: Option<RowSession<'e>>,
}

impl<'e> EngineRows<'e> {
    /// A session over `histories`, prefilled: the logits of each one's next token.
    fn rebuild(&self, histories: &[Vec<u32>]) -> Result<(RowSession<'e>, Vec<f32>)> {
        let len = histories.iter().map(Vec::len).max().unwrap_or(0);
        let capacity = (len + len.max(MIN_ROOM)).min(self.model.engine.max_positions().max(len));
        let mut tokens = self.model.decoder(histories, capacity - len)?;
        let logits = tokens.prefill()?;
        let session = RowSession {
            tokens,
            alive: vec![true; histories.len()],
            columns: len,
            capacity,
        };
        Ok((session, logits))
    }
}

impl TokenDecoder for EngineRows<'_> {
    fn batch(&self) -> usize {
        self.histories.len()
    }

    fn vocab(&self) -> usize {
        self.model.engine.vocab()
    }

    fn prefill(&mut self) -> Result<Vec<f32>> {
        let (session, logits) = self.rebuild(&self.histories)?;
        self.session = Some(session);
        Ok(logits)
    }

    fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.check_tokens(tokens)?;
        for (history, &t) in self.histories.iter_mut().zip(tokens) {
            history.push(t);
        }
        let vocab = self.model.engine.vocab();
        let Some(session) = self.in_place() else {
            let (session, logits) = self.rebuild(&self.histories)?;
            self.session = Some(session);
            return Ok(logits);
        };
        let fed = session.fed(tokens);
        let logits = session.tokens.step(&fed)?;
        session.columns += 1;
        Ok(logits
            .chunks(vocab.max(1))
            .zip(&session.alive)
            .filter(|(_, &a)| a)
            .flat_map(|(row, _)| row.iter().copied())
            .collect())
    }

    /// A step in place picks on the device as the static decoder does (finished rows ask for a
    /// greedy token no one reads); a step that rebuilds the cache leaves the picks to the host.
    fn step_pick(&mut self, tokens: &[u32], picks: &[RowPick<'_>]) -> Option<Result<Vec<u32>>> {
        if self.check_tokens(tokens).is_err() || picks.len() != tokens.len() {
            return None;
        }
        let session = self.in_place()?;
        let mut live = picks.iter();
        let all: Vec<RowPick<'_>> = session
            .alive
            .iter()
            .map(|&a| match a {
                true => live.next().copied().unwrap_or(RowPick::greedy(&[])),
                false => RowPick::greedy(&[]),
            })
            .collect();
        if !session.tokens.picks_on_device(&all) {
            return None;
        }
        let fed = session.fed(tokens);
        let picked = match session.tokens.step_pick(&fed, &all)? {
            Ok(p) => p,
            Err(e) => return Some(Err(e)),
        };
        session.columns += 1;
        let picked: Vec<u32> = picked
            .into_iter()
            .zip(&session.alive)
            .filter(|(_, &a)| a)
            .map(|(t, _)| t)
            .collect();
        for (history, &t) in self.histories.iter_mut().zip(tokens) {
            history.push(t);
        }
        Some(Ok(picked))
    }
}

impl<'e> EngineRows<'e> {
    /// `Err` unless `tokens` has one per running request.
    fn check_tokens(&self, tokens: &[u32]) -> Result<()> {
        if tokens.len() == self.histories.len() {
            return Ok(());
        }
        Err(Error::InvalidInput(format!(
            "{} tokens for {} running requests",
            tokens.len(),
            self.histories.len()
        )))
    }

    /// The session, when the next step runs in it: it has a free column and no more finished
    /// rows than running ones (otherwise the step rebuilds the cache).
    fn in_place(&mut self) -> Option<&mut RowSession<'e>> {
        let live = self.histories.len();
        self.session
            .as_mut()
            .filter(|s| s.columns < s.capacity && s.alive.len() - live <= live)
    }
}

impl RowSession<'_> {
    /// The tokens of a step: the running rows' `tokens` in order, token 0 for finished rows
    /// (their logits are dropped).
    fn fed(&self, tokens: &[u32]) -> Vec<u32> {
        let mut next = tokens.iter();
        self.alive
            .iter()
            .map(|&a| {
                if a {
                    next.next().copied().unwrap_or(0)
                } else {
                    0
                }
            })
            .collect()
    }
}

impl RowDecoder for EngineRows<'_> {
    fn admit(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<f32>> {
        if prompts.is_empty() {
            return Ok(Vec::new());
        }
        let mut all = self.histories.clone();
        all.extend(prompts.iter().cloned());
        // The running batch stays as it is until the new session is prefilled.
        let (session, logits) = self.rebuild(&all)?;
        let vocab = self.model.engine.vocab();
        let joined = logits[self.histories.len() * vocab..].to_vec();
        self.histories = all;
        self.session = Some(session);
        Ok(joined)
    }

    fn retain(&mut self, keep: &[usize]) -> Result<()> {
        let live = self.histories.len();
        if keep.windows(2).any(|w| w[0] >= w[1]) || keep.last().is_some_and(|&k| k >= live) {
            return Err(Error::InvalidInput(format!(
                "rows {keep:?} to keep of {live} (ascending, below the batch)"
            )));
        }
        if let Some(session) = self.session.as_mut() {
            for (row, alive) in session.alive.iter_mut().filter(|a| **a).enumerate() {
                *alive = keep.binary_search(&row).is_ok();
            }
        }
        let mut row = 0;
        self.histories.retain(|_| {
            row += 1;
            keep.binary_search(&(row - 1)).is_ok()
        });
        if self.histories.is_empty() {
            // Nothing runs: the cache goes now.
            self.session = None;
        }
        Ok(())
    }
}
