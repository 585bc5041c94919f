//! A generation's [`TokenDecoder`] on the cuBLAS decoder engine, shared by the decoders that run
//! on it (LLaMA / Qwen2 in `cuda_decoder`, Whisper in `cuda_whisper`): the prompt on the first
//! call, then one token per row, each step's tokens picked on the device (greedy there; sampled
//! from the few most likely tokens the device keeps, with the CPU sampler's draws).

#[cfg(any(feature = "whisper", feature = "t5"))]
use ipfs_accelerate_backend_cublas::DecoderEngine;
use ipfs_accelerate_backend_cublas::{
    Columns, DecodeSession, LogitsOf, Replaced, TopRequest, MAX_TOP_VOCAB,
};
use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::generate::{
    choose_among, penalized_tokens, pick_drawn, RowPick, TokenDecoder,
};

/// The environment variable that keeps generation on `cuda` off the cuBLAS decoder (`0` / `off`):
/// LLaMA / Qwen2 then run on burn's CubeCL kernels in f32, and Whisper's decoder too (its
/// encoder stays on the cuBLAS encoder).
pub(crate) const CUDA_DECODER_ENV: &str = "IPFS_ACCELERATE_CUDA_DECODER";

/// The environment variable that makes decoding on the cuBLAS decoder send every row's logits
/// to the host and pick there (`0` / `off`), instead of picking on the device.
pub(crate) const DEVICE_PICKS_ENV: &str = "IPFS_ACCELERATE_CUDA_DEVICE_PICKS";

/// Why a model may not load on the cuBLAS decoder engine in float weights with `options`: the
/// engine switched off ([`CUDA_DECODER_ENV`]) or quantized weights asked for.
#[cfg(any(feature = "whisper", feature = "t5", feature = "llava"))]
pub(crate) fn float_engine_allowed(options: &crate::LoadOptions) -> Result<(), String> {
    if crate::backends::env_switch(CUDA_DECODER_ENV) == Some(false) {
        return Err(format!("{CUDA_DECODER_ENV} is off"));
    }
    if options.quantization != ipfs_accelerate_nn::WeightQuantization::None {
        return Err("it keeps float weights (no quantization)".into());
    }
    Ok(())
}

/// `spec` (a family's decoder spec, or why it has none) on the cuBLAS decoder engine in
/// `precision`; why not as a sentence.
#[cfg(any(feature = "whisper", feature = "t5"))]
pub(crate) fn engine_of(
    spec: Result<ipfs_accelerate_core::DecoderSpec>,
    precision: ipfs_accelerate_core::Precision,
) -> Result<DecoderEngine, String> {
    let spec = spec.map_err(|e| e.to_string())?;
    DecoderEngine::load(&spec, precision).map_err(|e| e.to_string())
}

/// `values` as the engine's 32-bit ids, positions or mask, or an error naming the input `what`.
pub(crate) fn narrow(what: &str, values: &[i64]) -> Result<Vec<i32>> {
    values
        .iter()
        .map(|&v| {
            i32::try_from(v).map_err(|_| Error::InvalidInput(format!("{what}: {v} out of range")))
        })
        .collect()
}

/// Positions 0..len of each of `batch` rows.
pub(crate) fn positions(batch: usize, len: usize) -> Vec<i32> {
    (0..batch).flat_map(|_| 0..len as i32).collect()
}

/// Logits `[batch, len, vocab]` of every column of `ids` (row-major `[batch, len]`) in one
/// uncached call of `session`: at `positions` (none: 0, 1, ... per row), `mask` 1 for a token and
/// 0 for padding (none: all tokens), with the input embeddings of the columns in `replaced`
/// replaced.
pub(crate) fn logits_of_every(
    mut session: DecodeSession<'_>,
    (batch, len, vocab): (usize, usize, usize),
    ids: &[i64],
    (positions_of, mask): (Option<&[i64]>, Option<&[i64]>),
    replaced: Option<&Replacement>,
) -> Result<ipfs_accelerate_core::HostTensor> {
    if len == 0 || ids.len() != batch * len {
        return Err(Error::InvalidInput(format!(
            "{} decoder ids for [{batch}, {len}]",
            ids.len()
        )));
    }
    let positions = match positions_of {
        Some(p) => narrow("position_ids", p)?,
        None => positions(batch, len),
    };
    let mask = match mask {
        Some(m) => narrow("attention_mask", m)?,
        None => vec![1; batch * len],
    };
    let columns = Columns {
        ids: &narrow("input_ids", ids)?,
        positions: &positions,
        mask: &mask,
        replaced: replaced.map(Replacement::columns),
    };
    let logits = session.forward(&columns, len, LogitsOf::Every)?;
    ipfs_accelerate_core::HostTensor::from_f32(vec![batch, len, vocab], &logits)
}

/// The identity half of `ModelRunner` for a model on the cuBLAS engines: its `family`, `cuda`,
/// the `cublas` engine, and the peak of the device's memory pool (every engine allocates from
/// it), read through the engine field `engine`.
macro_rules! cublas_identity {
    ($family:expr, $engine:ident) => {
        fn family(&self) -> &str {
            $family
        }

        fn backend(&self) -> ipfs_accelerate_core::BackendKind {
            ipfs_accelerate_core::BackendKind::Cuda
        }

        fn engine(&self) -> Option<&str> {
            Some("cublas")
        }

        /// The peak of the device's memory pool: weights, caches and a call's activations.
        fn device_memory_in_use(&self) -> Option<u64> {
            self.$engine.peak_memory()
        }
    };
}
pub(crate) use cublas_identity;

/// A prompt (left-padded where rows differ in length): ids, positions and mask `[batch, len]`,
/// `len`, and input embeddings that replace some columns' token embeddings.
pub(crate) struct Prompt {
    pub(crate) ids: Vec<i32>,
    pub(crate) positions: Vec<i32>,
    pub(crate) mask: Vec<i32>,
    pub(crate) len: usize,
    pub(crate) replaced: Option<Replacement>,
}

/// Input embeddings for some of a call's columns (LLaVA's image features at its image tokens).
pub(crate) struct Replacement {
    /// Indices into the `[batch, len]` columns, ascending.
    pub(crate) columns: Vec<usize>,
    /// `[columns.len(), hidden]` floats.
    pub(crate) values: ipfs_accelerate_core::HostTensor,
}

impl Replacement {
    /// The engine's view of it.
    pub(crate) fn columns(&self) -> Replaced<'_> {
        Replaced {
            columns: &self.columns,
            values: &self.values,
        }
    }
}

/// One generation's [`TokenDecoder`] on the engine: the prompt on the first call, one token per
/// row after it.
pub(crate) struct EngineTokens<'e> {
    session: DecodeSession<'e>,
    /// The padded prompt, until prefill.
    prompt: Option<Prompt>,
    /// The next position of each row.
    next: Vec<i32>,
    vocab: usize,
    /// Steps pick on the device ([`DEVICE_PICKS_ENV`]).
    device_picks: bool,
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
            replaced: p.replaced.as_ref().map(Replacement::columns),
        };
        Ok(self.session.forward(&columns, p.len, LogitsOf::Last)?)
    }

    fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.step_with(tokens, |session, columns| {
            session.forward(columns, 1, LogitsOf::Last)
        })
    }

    /// Steps pick on the device: greedy rows without a penalty by an argmax there (`batch` ids
    /// come back instead of `batch × vocab` logits); otherwise the device applies the penalties
    /// and keeps each row's most likely tokens (and its softmax total), and the CPU sampler's
    /// choice is made from those with the same draws, from the whole row only when they do not
    /// decide.
    fn step_pick(&mut self, tokens: &[u32], picks: &[RowPick<'_>]) -> Option<Result<Vec<u32>>> {
        if !self.picks_on_device(picks) {
            return None;
        }
        if picks.iter().all(RowPick::is_plain_greedy) {
            return Some(self.step_with(tokens, |session, columns| {
                session.forward_argmax(columns, 1)
            }));
        }
        Some(self.sampled_step(tokens, picks))
    }
}

impl<'e> EngineTokens<'e> {
    /// A decoder over `session` whose rows start from `prompts` of one length, at positions 0,
    /// 1, ... without padding (Whisper's decoder prompts).
    pub(crate) fn unpadded(session: DecodeSession<'e>, prompts: &[Vec<u32>], vocab: usize) -> Self {
        let len = prompts.first().map_or(0, Vec::len);
        let prompt = Prompt {
            ids: prompts.iter().flatten().map(|&t| t as i32).collect(),
            positions: positions(prompts.len(), len),
            mask: vec![1; prompts.len() * len],
            len,
            replaced: None,
        };
        Self::new(session, prompt, vec![len as i32; prompts.len()], vocab)
    }

    /// A decoder over `session` that starts with `prompt`; `next` is each row's position after
    /// it.
    pub(crate) fn new(
        session: DecodeSession<'e>,
        prompt: Prompt,
        next: Vec<i32>,
        vocab: usize,
    ) -> Self {
        EngineTokens {
            session,
            prompt: Some(prompt),
            next,
            vocab,
            device_picks: crate::backends::env_switch(DEVICE_PICKS_ENV) != Some(false),
        }
    }

    /// Whether [`TokenDecoder::step_pick`] picks `picks` on the device (switched on, one per
    /// row, and a vocabulary the sampling kernels take unless every row is plain greedy).
    pub(crate) fn picks_on_device(&self, picks: &[RowPick<'_>]) -> bool {
        self.device_picks
            && picks.len() == self.next.len()
            && (self.vocab <= MAX_TOP_VOCAB || picks.iter().all(RowPick::is_plain_greedy))
    }

    /// One step whose tokens are chosen from each row's most likely tokens on the device.
    fn sampled_step(&mut self, tokens: &[u32], picks: &[RowPick<'_>]) -> Result<Vec<u32>> {
        let vocab = self.vocab;
        let penalized: Vec<Vec<u32>> = picks
            .iter()
            .map(|p| match p.repetition_penalty {
                1.0 => Vec::new(),
                _ => penalized_tokens(p.history),
            })
            .collect();
        let requests: Vec<TopRequest<'_>> = picks
            .iter()
            .zip(&penalized)
            .map(|(p, tokens)| TopRequest {
                penalty: p.repetition_penalty,
                penalized: tokens,
                total_at: p.total_at(vocab),
            })
            .collect();
        let top = self.step_with(tokens, |session, columns| {
            session.forward_top(columns, 1, &requests)
        })?;
        let mut picked = Vec::with_capacity(picks.len());
        for (row, (pick, top)) in picks.iter().zip(top).enumerate() {
            let token = match choose_among(&top.top, top.total, vocab, pick) {
                Some(token) => token,
                None => {
                    // The nucleus or the draw reaches past the kept tokens: the whole row (its
                    // penalty already applied).
                    let mut row_scores = self.session.scores(row)?;
                    let unpenalised = RowPick {
                        repetition_penalty: 1.0,
                        ..*pick
                    };
                    pick_drawn(&mut row_scores, &unpenalised)?
                }
            };
            picked.push(token);
        }
        Ok(picked)
    }

    /// Feeds one token per row (after the prefill) through `run` and advances the positions.
    fn step_with<R>(
        &mut self,
        tokens: &[u32],
        run: impl FnOnce(
            &mut DecodeSession<'_>,
            &Columns<'_>,
        ) -> std::result::Result<R, ipfs_accelerate_backend_cublas::EngineError>,
    ) -> Result<R> {
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
        let out = run(
            &mut self.session,
            &Columns {
                ids: &ids,
                positions: &positions,
                mask: &mask,
                replaced: None,
            },
        )?;
        self.next.iter_mut().for_each(|p| *p += 1);
        Ok(out)
    }
}
