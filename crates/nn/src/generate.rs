//! Token generation shared by every generating family (LLaMA, Qwen2, T5, Whisper, LLaVA):
//! a [`TokenDecoder`] turns tokens into next-token logits (with its own KV cache), and [`generate`]
//! runs the loop — greedy or seeded sampling (temperature, top-k, top-p), repetition penalty, stop
//! tokens, `max_new_tokens`, and a streaming callback per token.

use std::ops::ControlFlow;

use ipfs_accelerate_core::{Error, Result, TensorMap};
use rand::{rngs::StdRng, Rng, SeedableRng};

/// A model that produces next-token logits for a batch of sequences, step by step.
pub trait TokenDecoder {
    /// Rows in the batch.
    fn batch(&self) -> usize;
    /// Vocabulary size (length of each row of logits).
    fn vocab(&self) -> usize;
    /// Processes the prompt the decoder was built with and returns the logits of the next token,
    /// row-major `[batch, vocab]`.
    fn prefill(&mut self) -> Result<Vec<f32>>;
    /// Feeds one new token per row and returns the logits of the next token, `[batch, vocab]`.
    fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>>;
    /// [`step`](Self::step) that also chooses each row's next token where the logits are (a
    /// GPU), as [`Sampler::pick`] would from them: `picks[row]` holds the row's sampler settings,
    /// its history and the sampler's draw ([`pick_drawn`] and [`choose_among`] are the CPU's
    /// choice for the decoder to finish with). `None` (the default) when the decoder cannot; the
    /// caller then steps and picks from the logits with the same draws.
    fn step_pick(&mut self, tokens: &[u32], picks: &[RowPick<'_>]) -> Option<Result<Vec<u32>>> {
        let _ = (tokens, picks);
        None
    }
}

/// A boxed decoder (an executor chosen at run time) is a decoder.
impl<D: TokenDecoder + ?Sized> TokenDecoder for Box<D> {
    fn batch(&self) -> usize {
        (**self).batch()
    }
    fn vocab(&self) -> usize {
        (**self).vocab()
    }
    fn prefill(&mut self) -> Result<Vec<f32>> {
        (**self).prefill()
    }
    fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        (**self).step(tokens)
    }
    fn step_pick(&mut self, tokens: &[u32], picks: &[RowPick<'_>]) -> Option<Result<Vec<u32>>> {
        (**self).step_pick(tokens, picks)
    }
}

/// A decoder that has already read the start of its prompt (its [`prefill`](TokenDecoder::prefill)
/// returned `logits`) and goes on with the rest: its own `prefill` feeds `rest` one token per row
/// and step, and returns the logits after the last (or `logits` when nothing is left). Whisper's
/// language detection reads `<|startoftranscript|>` alone; the transcription then continues that
/// decoder instead of building a second one that computes the encoder's cross K/V again.
pub struct Resumed<D> {
    decoder: D,
    logits: Option<Vec<f32>>,
    rest: Vec<Vec<u32>>,
}

impl<D: TokenDecoder> Resumed<D> {
    /// `decoder` after its prefill (which returned `logits`), with `rest[row]` still to read;
    /// every row has as many tokens left.
    pub fn new(decoder: D, logits: Vec<f32>, rest: Vec<Vec<u32>>) -> Result<Self> {
        let batch = decoder.batch();
        if rest.len() != batch || rest.iter().any(|r| r.len() != rest[0].len()) {
            return Err(Error::InvalidInput(format!(
                "a resumed decoder of {batch} rows needs as many equally long token lists, got {:?}",
                rest.iter().map(Vec::len).collect::<Vec<_>>()
            )));
        }
        if logits.len() != batch * decoder.vocab() {
            return Err(Error::InvalidInput(format!(
                "a resumed decoder of {batch} rows and {} tokens needs {} logits, got {}",
                decoder.vocab(),
                batch * decoder.vocab(),
                logits.len()
            )));
        }
        Ok(Self {
            decoder,
            logits: Some(logits),
            rest,
        })
    }
}

impl<D: TokenDecoder> TokenDecoder for Resumed<D> {
    fn batch(&self) -> usize {
        self.decoder.batch()
    }
    fn vocab(&self) -> usize {
        self.decoder.vocab()
    }
    fn prefill(&mut self) -> Result<Vec<f32>> {
        let mut logits = self.logits.take().ok_or_else(|| {
            Error::InvalidInput("a resumed decoder's prefill runs once".to_string())
        })?;
        for column in 0..self.rest.first().map_or(0, Vec::len) {
            let tokens: Vec<u32> = self.rest.iter().map(|row| row[column]).collect();
            logits = self.decoder.step(&tokens)?;
        }
        Ok(logits)
    }
    fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        self.decoder.step(tokens)
    }
    fn step_pick(&mut self, tokens: &[u32], picks: &[RowPick<'_>]) -> Option<Result<Vec<u32>>> {
        self.decoder.step_pick(tokens, picks)
    }
}

/// A decoder whose batch can change between steps: requests join a running batch and leave it
/// when they finish (continuous batching, [`generate_continuous`]).
pub trait RowDecoder: TokenDecoder {
    /// Runs `prompts` through the model (together, apart from the running rows) and adds them
    /// as rows after the existing ones; returns their next-token logits `[prompts, vocab]`. On
    /// an error the batch is unchanged. Only after [`prefill`](TokenDecoder::prefill) (or on a
    /// decoder whose rows all left).
    fn admit(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<f32>>;
    /// Keeps only the rows `keep` (ascending indices into the batch), freeing the others.
    fn retain(&mut self, keep: &[usize]) -> Result<()>;
}

/// One request of [`generate_continuous`]: its prompt tokens and its options.
#[derive(Debug, Clone, PartialEq)]
pub struct RowRequest {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Its limits, stop tokens and sampler.
    pub config: GenerationConfig,
}

/// How the next token is chosen from the logits.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Sampling {
    /// The most likely token (the first on ties, as `torch.argmax`).
    Greedy,
    /// A draw from the softmax of `logits / temperature`, restricted to the `top_k` most likely
    /// tokens and then to the smallest set whose probability reaches `top_p` (HF's order).
    Sample {
        /// Softmax temperature (> 0).
        temperature: f32,
        /// Keep only this many most likely tokens.
        top_k: Option<usize>,
        /// Nucleus: keep the most likely tokens whose cumulative probability reaches this.
        top_p: Option<f32>,
    },
}

/// Options of [`generate`].
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationConfig {
    /// Tokens to generate at most per row.
    pub max_new_tokens: usize,
    /// Greedy or sampling.
    pub sampling: Sampling,
    /// HF's `repetition_penalty` (1.0 = off): logits of tokens already in the sequence are divided
    /// by it when positive and multiplied by it when negative.
    pub repetition_penalty: f32,
    /// Tokens that end a row (EOS); the stop token itself is kept in the output.
    pub stop_tokens: Vec<u32>,
    /// Seed of the sampler (sampling is reproducible for a given seed).
    pub seed: u64,
}

impl GenerationConfig {
    /// Greedy decoding of exactly `max_new_tokens` tokens (no stop token): what
    /// `ModelRunner::generate_ids` runs for the benchmarks.
    pub fn exact_greedy(max_new_tokens: usize) -> Self {
        GenerationConfig {
            max_new_tokens,
            ..Default::default()
        }
    }
}

/// The `greedy_steps` input of a reference run (an integer tensor holding one count ≥ 0), if
/// given: how many argmax steps a runner's `run` takes (the conformance fixtures' decoding).
pub fn greedy_steps(inputs: &TensorMap) -> Result<Option<usize>> {
    let Some(t) = inputs.get("greedy_steps") else {
        return Ok(None);
    };
    match t.to_i64_vec()?.as_slice() {
        &[n] if n >= 0 => Ok(Some(n as usize)),
        other => Err(Error::InvalidInput(format!(
            "greedy_steps must be one non-negative count, got {other:?}"
        ))),
    }
}

/// The one row of a batch-1 generation, or an error naming `rows`.
pub fn single_row(rows: Vec<Vec<u32>>) -> Result<Vec<u32>> {
    let n = rows.len();
    let mut rows = rows.into_iter();
    match (rows.next(), rows.next()) {
        (Some(row), None) => Ok(row),
        _ => Err(Error::InvalidInput(format!(
            "token generation runs one row, the inputs have {n}"
        ))),
    }
}

impl Default for GenerationConfig {
    fn default() -> Self {
        GenerationConfig {
            max_new_tokens: 32,
            sampling: Sampling::Greedy,
            repetition_penalty: 1.0,
            stop_tokens: Vec::new(),
            seed: 0,
        }
    }
}

impl GenerationConfig {
    /// Checks the options are usable.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(Error::InvalidInput(m));
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return bad(format!(
                "repetition_penalty must be > 0, got {}",
                self.repetition_penalty
            ));
        }
        if let Sampling::Sample {
            temperature,
            top_k,
            top_p,
        } = self.sampling
        {
            if !(temperature.is_finite() && temperature > 0.0) {
                return bad(format!("temperature must be > 0, got {temperature}"));
            }
            if top_k == Some(0) {
                return bad("top_k must be at least 1".into());
            }
            if let Some(p) = top_p {
                if !(p > 0.0 && p <= 1.0) {
                    return bad(format!("top_p must be in (0, 1], got {p}"));
                }
            }
        }
        Ok(())
    }
}

/// What choosing one row's next token takes: the row's sampler settings, its tokens so far and
/// the sampler's draw for this token. A decoder that picks where its logits are
/// ([`TokenDecoder::step_pick`]) gets one per row.
#[derive(Debug, Clone, Copy)]
pub struct RowPick<'a> {
    /// Greedy or sampling.
    pub sampling: Sampling,
    /// HF's `repetition_penalty` (1.0 = off).
    pub repetition_penalty: f32,
    /// The row's tokens so far (prompt and generated), for the penalty.
    pub history: &'a [u32],
    /// The sampler's uniform draw in `[0, 1)` for this token (0 when greedy).
    pub draw: f64,
}

impl<'a> RowPick<'a> {
    /// A greedy pick without a penalty (what a finished row, whose token is not used, asks).
    pub fn greedy(history: &'a [u32]) -> Self {
        RowPick {
            sampling: Sampling::Greedy,
            repetition_penalty: 1.0,
            history,
            draw: 0.0,
        }
    }

    /// Whether this pick is the argmax of the unpenalised logits.
    pub fn is_plain_greedy(&self) -> bool {
        self.sampling == Sampling::Greedy && self.repetition_penalty == 1.0
    }

    /// The temperature `T` of the whole row's softmax total that [`choose_among`] reads for
    /// this pick over a vocabulary of `vocab`: sampling whose top-k keeps the whole row; `None`
    /// when it reads no total (greedy, or top-k below the vocabulary).
    pub fn total_at(&self, vocab: usize) -> Option<f32> {
        match self.sampling {
            Sampling::Sample {
                temperature, top_k, ..
            } if top_k.is_none_or(|k| k >= vocab) => Some(temperature),
            _ => None,
        }
    }
}

/// Picks next tokens from logits according to a [`GenerationConfig`].
#[derive(Debug, Clone)]
pub struct Sampler {
    config: GenerationConfig,
    rng: StdRng,
}

impl Sampler {
    /// A sampler seeded from `config.seed`.
    pub fn new(config: GenerationConfig) -> Result<Self> {
        config.validate()?;
        let rng = StdRng::seed_from_u64(config.seed);
        Ok(Sampler { config, rng })
    }

    /// The next token for one row of `logits`, given the tokens of that row so far (prompt and
    /// generated) for the repetition penalty. `logits` is modified in place.
    pub fn pick(&mut self, logits: &mut [f32], history: &[u32]) -> Result<u32> {
        let pick = self.next_pick(history);
        pick_drawn(logits, &pick)
    }

    /// What the next pick of a row with `history` takes, drawing from the seeded generator when
    /// sampling (as [`pick`](Self::pick) does): pass it to [`pick_drawn`] or
    /// [`choose_among`].
    pub fn next_pick<'a>(&mut self, history: &'a [u32]) -> RowPick<'a> {
        let draw = match self.config.sampling {
            Sampling::Greedy => 0.0,
            Sampling::Sample { .. } => self.rng.random(),
        };
        self.drawn(history, draw)
    }

    /// The pick of a row with `history` whose draw was already made (`draw`).
    pub fn drawn<'a>(&self, history: &'a [u32], draw: f64) -> RowPick<'a> {
        RowPick {
            sampling: self.config.sampling,
            repetition_penalty: self.config.repetition_penalty,
            history,
            draw,
        }
    }
}

/// HF's repetition penalty on one row of logits: each distinct token of `history` once, its
/// logit divided by `penalty` when positive and multiplied when negative.
pub fn penalize(logits: &mut [f32], history: &[u32], penalty: f32) {
    if penalty == 1.0 {
        return;
    }
    for t in penalized_tokens(history) {
        if let Some(l) = logits.get_mut(t as usize) {
            *l = if *l < 0.0 { *l * penalty } else { *l / penalty };
        }
    }
}

/// The distinct tokens of `history`, ascending: those the repetition penalty changes.
pub fn penalized_tokens(history: &[u32]) -> Vec<u32> {
    let mut tokens = history.to_vec();
    tokens.sort_unstable();
    tokens.dedup();
    tokens
}

/// [`Sampler::pick`] after its draw: the penalty, the NaN check, then the choice.
pub fn pick_drawn(logits: &mut [f32], pick: &RowPick<'_>) -> Result<u32> {
    if logits.is_empty() {
        return Err(Error::InvalidInput("empty logits row".into()));
    }
    penalize(logits, pick.history, pick.repetition_penalty);
    if logits.iter().any(|v| v.is_nan()) {
        return Err(Error::Compute("the model produced NaN logits".into()));
    }
    Ok(match pick.sampling {
        Sampling::Greedy => argmax(logits),
        Sampling::Sample {
            temperature,
            top_k,
            top_p,
        } => {
            let mut order: Vec<usize> = (0..logits.len()).collect();
            // Most likely first; ties keep the lower id first.
            order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
            if let Some(k) = top_k {
                order.truncate(k.max(1));
            }
            let values: Vec<f32> = order.iter().map(|&i| logits[i]).collect();
            let at = sample_index(&values, values.len(), None, temperature, top_p, pick.draw)
                .unwrap_or(values.len() - 1);
            order[at] as u32
        }
    })
}

/// [`pick_drawn`]'s choice from a row's most likely tokens alone: `top` holds the first
/// `top.len()` `(token, penalised logit)` of the row in the sampler's order (largest first,
/// ties by the lower token), `vocab` is the row's length and `total` the sum over the whole row
/// of `exp(f64(logit / T − max / T))` (needed only when sampling keeps more tokens than `top`
/// holds, and top-k keeps the whole row). The same token as [`pick_drawn`] on the whole row (bit
/// for bit when `top` holds every kept token; otherwise up to the rounding of `total`), or
/// `None` when `top` does not decide (the nucleus or the draw reaches past it, or top-k keeps
/// more than `top` holds but not the whole row). A decoder that picks on its device uses it.
pub fn choose_among(
    top: &[(u32, f32)],
    total: Option<f64>,
    vocab: usize,
    pick: &RowPick<'_>,
) -> Option<u32> {
    let first = top.first()?;
    match pick.sampling {
        Sampling::Greedy => Some(first.0),
        Sampling::Sample {
            temperature,
            top_k,
            top_p,
        } => {
            let kept = top_k.map_or(vocab, |k| k.clamp(1, vocab.max(1)));
            // The row's total is the kept tokens' only when top-k keeps the whole row.
            let total = total.filter(|_| pick.total_at(vocab).is_some());
            let values: Vec<f32> = top.iter().take(kept).map(|t| t.1).collect();
            let at = sample_index(&values, kept, total, temperature, top_p, pick.draw)?;
            Some(top[at].0)
        }
    }
}

/// The sampler's draw among the `kept` most likely tokens: `values` are the logits of the first
/// of them in order (all `kept`, or a prefix with `total`, the sum of `exp(v / T − max)` over
/// all `kept`). Softmax at temperature `temperature`, then the smallest prefix whose mass
/// reaches `top_p`, then the index where the cumulative mass passes `draw` (the last kept index
/// when rounding leaves it short); `None` when a prefix cannot decide.
fn sample_index(
    values: &[f32],
    kept: usize,
    total: Option<f64>,
    temperature: f32,
    top_p: Option<f32>,
    draw: f64,
) -> Option<usize> {
    let complete = values.len() >= kept;
    let max = values.first()? / temperature;
    let mut probs: Vec<f64> = values[..kept.min(values.len())]
        .iter()
        .map(|&v| f64::from(v / temperature - max).exp())
        .collect();
    let total: f64 = if complete { probs.iter().sum() } else { total? };
    probs.iter_mut().for_each(|p| *p /= total);
    let mut decided = complete;
    if let Some(p) = top_p {
        // Keep the smallest prefix whose mass reaches p (at least one token).
        let mut acc = 0.0;
        let mut keep = None;
        for (i, q) in probs.iter().enumerate() {
            acc += q;
            if acc >= f64::from(p) {
                keep = Some(i + 1);
                break;
            }
        }
        match keep {
            Some(k) => probs.truncate(k.max(1)),
            None if !complete => return None,
            None => {}
        }
        decided = true;
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|q| *q /= total);
    }
    let mut acc = 0.0;
    for (i, q) in probs.iter().enumerate() {
        acc += q;
        if draw < acc {
            return Some(i);
        }
    }
    decided.then(|| probs.len() - 1)
}

/// A row's token from its `logits` by `sampler`: with the draw it already made for this token
/// (`drawn`: a decoder declined to pick after the draws were made), else drawing now.
fn pick_row(
    sampler: &mut Sampler,
    logits: &mut [f32],
    history: &[u32],
    drawn: Option<f64>,
) -> Result<u32> {
    match drawn {
        Some(draw) => pick_drawn(logits, &sampler.drawn(history, draw)),
        None => sampler.pick(logits, history),
    }
}

/// Index of the largest value (the first one on ties).
pub fn argmax(values: &[f32]) -> u32 {
    let mut best = 0;
    for (i, v) in values.iter().enumerate() {
        if *v > values[best] {
            best = i;
        }
    }
    best as u32
}

/// Runs `decoder` until every row produced a stop token or `max_new_tokens` tokens.
///
/// `prompts` are the tokens each row starts with (for the repetition penalty; the decoder already
/// holds them). `on_token(row, token)` is called for every generated token as soon as it is
/// chosen; returning `ControlFlow::Break(())` stops generation early. Rows that finished are fed
/// their last token again so the batch stays aligned; their output does not grow. Returns the
/// generated tokens per row (stop tokens included). One sampler draws for every row in turn.
pub fn generate(
    decoder: &mut dyn TokenDecoder,
    prompts: &[Vec<u32>],
    config: &GenerationConfig,
    on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
) -> Result<Vec<Vec<u32>>> {
    let mut sampler = [Sampler::new(config.clone())?];
    let limits = vec![config; prompts.len()];
    run_rows(decoder, prompts, &limits, &mut sampler, on_token, Stop::All)
}

/// [`generate`] with a configuration per row (its own seeded sampler, token limit and stop
/// tokens), as independent requests decoded together: each row's tokens are those it gets alone
/// (up to the rounding a batched product may change), and `ControlFlow::Break` from
/// `on_token(row, _)` ends that row only.
pub fn generate_each(
    decoder: &mut dyn TokenDecoder,
    prompts: &[Vec<u32>],
    configs: &[GenerationConfig],
    on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
) -> Result<Vec<Vec<u32>>> {
    if configs.len() != prompts.len() {
        return Err(Error::InvalidInput(format!(
            "{} generation configs for {} prompts",
            configs.len(),
            prompts.len()
        )));
    }
    let mut samplers = configs
        .iter()
        .map(|c| Sampler::new(c.clone()))
        .collect::<Result<Vec<_>>>()?;
    let limits: Vec<&GenerationConfig> = configs.iter().collect();
    run_rows(
        decoder,
        prompts,
        &limits,
        &mut samplers,
        on_token,
        Stop::Row,
    )
}

/// Continuous batching: decodes `first` (the requests `decoder` was built with, not yet
/// prefilled) and, between steps, up to `max_rows` rows in all: `admit(free)` may hand up to
/// `free` more requests (more are admitted too), run through the model together and added to
/// the batch at once (one by one when that fails, so a prompt the model rejects fails alone), and
/// a row leaves the batch as soon as it ends (stop token, token limit, or `Break` from its
/// `on_token`). Requests are numbered in arrival order (`first` are `0..first.len()`);
/// `on_token(request, token)` streams each token and `on_done(request, result)` ends each
/// request — with its tokens, or the error of its own admission (a prompt the model rejects, bad
/// options), which fails only that request. Each request gets the tokens it would get alone (up
/// to the rounding of a batched product), as with [`generate_each`]. After the first token the
/// decoder may pick each step's tokens itself ([`TokenDecoder::step_pick`], with each row's
/// own draws). An error of a whole step is returned; requests not yet ended got no `on_done`.
pub fn generate_continuous(
    decoder: &mut dyn RowDecoder,
    first: Vec<RowRequest>,
    max_rows: usize,
    mut admit: impl FnMut(usize) -> Vec<RowRequest>,
    mut on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
    mut on_done: impl FnMut(usize, Result<Vec<u32>>),
) -> Result<()> {
    /// A request being decoded.
    struct Live {
        id: usize,
        sampler: Sampler,
        history: Vec<u32>,
        out: Vec<u32>,
        config: GenerationConfig,
    }
    let live = |id: usize, request: RowRequest| -> Result<Live> {
        Ok(Live {
            id,
            sampler: Sampler::new(request.config.clone())?,
            history: request.prompt,
            out: Vec::new(),
            config: request.config,
        })
    };
    if first.len() != decoder.batch() {
        return Err(Error::InvalidInput(format!(
            "{} requests for a decoder batch of {}",
            first.len(),
            decoder.batch()
        )));
    }
    let vocab = decoder.vocab();
    let mut next_id = first.len();
    let mut rows = first
        .into_iter()
        .enumerate()
        .map(|(id, r)| live(id, r))
        .collect::<Result<Vec<_>>>()?;
    // Requests that want no token end before the model runs.
    let keep: Vec<usize> = (0..rows.len())
        .filter(|&i| rows[i].config.max_new_tokens > 0)
        .collect();
    if keep.len() < rows.len() {
        decoder.retain(&keep)?;
        rows.retain(|r| {
            let ends = r.config.max_new_tokens == 0;
            if ends {
                on_done(r.id, Ok(Vec::new()));
            }
            !ends
        });
    }
    let mut logits = if rows.is_empty() {
        Vec::new()
    } else {
        decoder.prefill()?
    };
    // Each row's next token when the decoder picked it ([`TokenDecoder::step_pick`]); the rows
    // it left to the host have their logits in `logits`, in order, and the draw already made
    // for them in `drawn` (none for a row just prefilled: its sampler draws as it picks).
    let mut picked: Vec<Option<u32>> = vec![None; rows.len()];
    let mut drawn: Vec<Option<f64>> = vec![None; rows.len()];
    loop {
        let from_logits = picked.iter().filter(|p| p.is_none()).count();
        if logits.len() != from_logits * vocab {
            return Err(Error::Compute(format!(
                "decoder returned {} logits for {from_logits} rows × vocab {vocab}",
                logits.len()
            )));
        }
        if let Some(t) = picked.iter().flatten().find(|&&t| t as usize >= vocab) {
            return Err(Error::Compute(format!(
                "decoder picked token {t} of a vocabulary of {vocab}"
            )));
        }
        let mut next = Vec::with_capacity(rows.len());
        let mut ended = Vec::with_capacity(rows.len());
        let mut chunks = logits.chunks_mut(vocab.max(1));
        for (i, row) in rows.iter_mut().enumerate() {
            let token = match picked[i] {
                Some(token) => token,
                None => {
                    let chunk = chunks.next().ok_or_else(|| {
                        Error::Compute("fewer rows of logits than rows to pick".into())
                    })?;
                    pick_row(&mut row.sampler, chunk, &row.history, drawn[i])?
                }
            };
            row.history.push(token);
            row.out.push(token);
            let mut ends = row.config.stop_tokens.contains(&token)
                || row.out.len() >= row.config.max_new_tokens;
            ends |= on_token(row.id, token).is_break();
            ended.push(ends);
            next.push(token);
        }
        if ended.contains(&true) {
            let keep: Vec<usize> = (0..rows.len()).filter(|&i| !ended[i]).collect();
            decoder.retain(&keep)?;
            next = keep.iter().map(|&i| next[i]).collect();
            let mut kept = Vec::with_capacity(keep.len());
            for (row, ends) in rows.into_iter().zip(ended) {
                if ends {
                    on_done(row.id, Ok(row.out));
                } else {
                    kept.push(row);
                }
            }
            rows = kept;
        }
        logits = Vec::new();
        picked = vec![None; rows.len()];
        drawn = vec![None; rows.len()];
        if !rows.is_empty() {
            // The next picks' draws (each row's own sampler), for the decoder or for here.
            let picks: Vec<RowPick<'_>> = rows
                .iter_mut()
                .map(|r| r.sampler.next_pick(&r.history))
                .collect();
            let draws: Vec<f64> = picks.iter().map(|p| p.draw).collect();
            match decoder.step_pick(&next, &picks) {
                Some(tokens) => {
                    let tokens = tokens?;
                    if tokens.len() != rows.len() {
                        return Err(Error::Compute(format!(
                            "decoder picked {} tokens for {} rows",
                            tokens.len(),
                            rows.len()
                        )));
                    }
                    picked = tokens.into_iter().map(Some).collect();
                }
                None => {
                    drawn = draws.into_iter().map(Some).collect();
                    logits = decoder.step(&next)?;
                }
            }
        }
        let free = max_rows.saturating_sub(rows.len());
        if free > 0 {
            let mut joining = Vec::new();
            for request in admit(free) {
                let id = next_id;
                next_id += 1;
                if request.config.max_new_tokens == 0 {
                    on_done(id, Ok(Vec::new()));
                    continue;
                }
                match live(id, request) {
                    Ok(row) => joining.push(row),
                    Err(e) => on_done(id, Err(e)),
                }
            }
            // Together first; when that fails, one at a time, so only the prompts the model
            // rejects fail (a lone prompt's error is its own).
            let prompts: Vec<Vec<u32>> = joining.iter().map(|r| r.history.clone()).collect();
            let groups: Vec<&[Vec<u32>]> = match joining.len() {
                0 => Vec::new(),
                1 => vec![&prompts[..]],
                _ => match decoder.admit(&prompts) {
                    Ok(l) => {
                        check_admitted(&l, prompts.len(), vocab)?;
                        logits.extend(l);
                        picked.extend(std::iter::repeat_n(None, joining.len()));
                        drawn.extend(std::iter::repeat_n(None, joining.len()));
                        rows.append(&mut joining);
                        Vec::new()
                    }
                    Err(_) => prompts.chunks(1).collect(),
                },
            };
            for (row, prompt) in joining.into_iter().zip(groups) {
                match decoder.admit(prompt) {
                    Ok(l) => {
                        check_admitted(&l, 1, vocab)?;
                        logits.extend(l);
                        picked.push(None);
                        drawn.push(None);
                        rows.push(row);
                    }
                    Err(e) => on_done(row.id, Err(e)),
                }
            }
        }
        if rows.is_empty() {
            return Ok(());
        }
    }
}

/// `Err` unless `logits` holds `rows` rows of `vocab` (what [`RowDecoder::admit`] returns).
fn check_admitted(logits: &[f32], rows: usize, vocab: usize) -> Result<()> {
    if logits.len() == rows * vocab {
        return Ok(());
    }
    Err(Error::Compute(format!(
        "decoder returned {} logits for {rows} admitted rows of vocab {vocab}",
        logits.len()
    )))
}

/// What a `Break` from the token callback ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Stop {
    All,
    Row,
}

/// The decoding loop of [`generate`] and [`generate_each`]: `samplers` holds one sampler that
/// draws for every row in turn, or one per row; `limits[row]` gives each row's token limit and
/// stop tokens. After the prefill the decoder may pick each step's tokens itself
/// ([`TokenDecoder::step_pick`], with the draws the samplers would make); when it cannot, the
/// tokens are picked here from its logits with the same draws.
fn run_rows(
    decoder: &mut dyn TokenDecoder,
    prompts: &[Vec<u32>],
    limits: &[&GenerationConfig],
    samplers: &mut [Sampler],
    mut on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
    scope: Stop,
) -> Result<Vec<Vec<u32>>> {
    let batch = decoder.batch();
    let vocab = decoder.vocab();
    if prompts.len() != batch {
        return Err(Error::InvalidInput(format!(
            "{} prompts for a decoder batch of {batch}",
            prompts.len()
        )));
    }
    let shared = samplers.len() == 1;
    let mut history: Vec<Vec<u32>> = prompts.to_vec();
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); batch];
    let mut done: Vec<bool> = limits.iter().map(|c| c.max_new_tokens == 0).collect();
    if done.iter().all(|d| *d) {
        return Ok(out);
    }
    let mut logits = decoder.prefill()?;
    // The tokens the decoder picked itself in the last step, instead of `logits`.
    let mut picked: Option<Vec<u32>> = None;
    // The draws of the last step's picks, when the decoder left them to the host.
    let mut drawn: Option<Vec<f64>> = None;
    loop {
        match &picked {
            Some(tokens)
                if tokens.len() != batch || tokens.iter().any(|&t| t as usize >= vocab) =>
            {
                return Err(Error::Compute(format!(
                    "decoder picked {tokens:?} for batch {batch} × vocab {vocab}"
                )));
            }
            Some(_) => {}
            None if logits.len() != batch * vocab => {
                return Err(Error::Compute(format!(
                    "decoder returned {} logits for batch {batch} × vocab {vocab}",
                    logits.len()
                )));
            }
            None => {}
        }
        let mut next = Vec::with_capacity(batch);
        let mut stop = false;
        for row in 0..batch {
            if done[row] {
                next.push(history[row].last().copied().unwrap_or(0));
                continue;
            }
            let token = match &picked {
                Some(tokens) => tokens[row],
                None => pick_row(
                    &mut samplers[if shared { 0 } else { row }],
                    &mut logits[row * vocab..(row + 1) * vocab],
                    &history[row],
                    drawn.as_ref().map(|d| d[row]),
                )?,
            };
            history[row].push(token);
            out[row].push(token);
            let limit = limits[row];
            if limit.stop_tokens.contains(&token) || out[row].len() >= limit.max_new_tokens {
                done[row] = true;
            }
            if on_token(row, token).is_break() {
                match scope {
                    Stop::All => stop = true,
                    Stop::Row => done[row] = true,
                }
            }
            next.push(token);
        }
        if stop || done.iter().all(|d| *d) {
            return Ok(out);
        }
        // The next picks' draws, in row order (as picking here would draw them).
        let picks: Vec<RowPick<'_>> = (0..batch)
            .map(|row| {
                if done[row] {
                    RowPick::greedy(&history[row])
                } else {
                    samplers[if shared { 0 } else { row }].next_pick(&history[row])
                }
            })
            .collect();
        match decoder.step_pick(&next, &picks) {
            Some(tokens) => {
                picked = Some(tokens?);
                drawn = None;
            }
            None => {
                drawn = Some(picks.iter().map(|p| p.draw).collect());
                logits = decoder.step(&next)?;
                picked = None;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real (if tiny) decoder: a bigram table, next logits = row of the last token.
    struct Bigram {
        table: Vec<Vec<f32>>,
        last: Vec<u32>,
    }

    impl TokenDecoder for Bigram {
        fn batch(&self) -> usize {
            self.last.len()
        }
        fn vocab(&self) -> usize {
            self.table.len()
        }
        fn prefill(&mut self) -> Result<Vec<f32>> {
            Ok(self
                .last
                .iter()
                .flat_map(|&t| self.table[t as usize].clone())
                .collect())
        }
        fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
            self.last = tokens.to_vec();
            self.prefill()
        }
    }

    impl RowDecoder for Bigram {
        fn admit(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<f32>> {
            let mut logits = Vec::new();
            let mut last = Vec::new();
            for prompt in prompts {
                let &t = prompt
                    .last()
                    .ok_or_else(|| Error::InvalidInput("empty prompt".into()))?;
                let row = self
                    .table
                    .get(t as usize)
                    .ok_or_else(|| Error::InvalidInput(format!("token {t} out of range")))?;
                logits.extend_from_slice(row);
                last.push(t);
            }
            self.last.extend(last);
            Ok(logits)
        }
        fn retain(&mut self, keep: &[usize]) -> Result<()> {
            self.last = keep.iter().map(|&i| self.last[i]).collect();
            Ok(())
        }
    }

    fn bigram(last: Vec<u32>) -> Bigram {
        // token i prefers i+1 (mod 4), token 3 prefers 0
        let table = (0..4)
            .map(|i| {
                (0..4)
                    .map(|j| {
                        if j == (i + 1) % 4 {
                            2.0
                        } else {
                            0.5 * j as f32
                        }
                    })
                    .collect()
            })
            .collect();
        Bigram { table, last }
    }

    #[test]
    fn greedy_stops_at_eos_and_max() {
        let mut d = bigram(vec![0, 2]);
        let cfg = GenerationConfig {
            max_new_tokens: 5,
            stop_tokens: vec![3],
            ..Default::default()
        };
        let mut streamed = Vec::new();
        let out = generate(&mut d, &[vec![0], vec![2]], &cfg, |r, t| {
            streamed.push((r, t));
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(out, vec![vec![1, 2, 3], vec![3]]);
        assert_eq!(streamed.len(), 4);
    }

    /// A bigram decoder that picks tokens itself from its `top` most likely logits alone (as a
    /// GPU decoder does), falling back to the whole row when they do not decide; counts the
    /// steps it picked and the rows that fell back.
    struct PicksItself {
        inner: Bigram,
        top: usize,
        steps: usize,
        fallbacks: usize,
    }

    fn picks_itself(last: Vec<u32>, top: usize) -> PicksItself {
        PicksItself {
            inner: bigram(last),
            top,
            steps: 0,
            fallbacks: 0,
        }
    }

    /// The sum of `exp(f64(v / t - max / t))` over `row`, what a device computes for
    /// [`choose_among`].
    fn total(row: &[f32], t: f32) -> f64 {
        let max = row.iter().copied().fold(f32::NEG_INFINITY, f32::max) / t;
        row.iter().map(|&v| f64::from(v / t - max).exp()).sum()
    }

    /// The `top` most likely `(token, logit)` of `row`, in the sampler's order.
    fn most_likely(row: &[f32], top: usize) -> Vec<(u32, f32)> {
        let mut order: Vec<(u32, f32)> = row
            .iter()
            .enumerate()
            .map(|(i, &v)| (i as u32, v))
            .collect();
        order.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        order.truncate(top);
        order
    }

    impl TokenDecoder for PicksItself {
        fn batch(&self) -> usize {
            self.inner.batch()
        }
        fn vocab(&self) -> usize {
            self.inner.vocab()
        }
        fn prefill(&mut self) -> Result<Vec<f32>> {
            self.inner.prefill()
        }
        fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
            self.inner.step(tokens)
        }
        fn step_pick(&mut self, tokens: &[u32], picks: &[RowPick<'_>]) -> Option<Result<Vec<u32>>> {
            self.steps += 1;
            let vocab = self.inner.vocab();
            let logits = match self.inner.step(tokens) {
                Ok(l) => l,
                Err(e) => return Some(Err(e)),
            };
            let mut out = Vec::new();
            for (row, pick) in logits.chunks(vocab).zip(picks) {
                let mut row = row.to_vec();
                penalize(&mut row, pick.history, pick.repetition_penalty);
                let total = pick.total_at(vocab).map(|t| total(&row, t));
                match choose_among(&most_likely(&row, self.top), total, vocab, pick) {
                    Some(t) => out.push(t),
                    None => {
                        self.fallbacks += 1;
                        let unpenalised = RowPick {
                            repetition_penalty: 1.0,
                            ..*pick
                        };
                        match pick_drawn(&mut row, &unpenalised) {
                            Ok(t) => out.push(t),
                            Err(e) => return Some(Err(e)),
                        }
                    }
                }
            }
            Some(Ok(out))
        }
    }

    impl RowDecoder for PicksItself {
        fn admit(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<f32>> {
            self.inner.admit(prompts)
        }
        fn retain(&mut self, keep: &[usize]) -> Result<()> {
            self.inner.retain(keep)
        }
    }

    /// Continuous batching asks a decoder that picks tokens itself, with each row's own draws:
    /// the same tokens as picking from its logits.
    #[test]
    fn continuous_batching_with_a_decoder_that_picks() {
        let request = |t: u32, config: GenerationConfig| RowRequest {
            prompt: vec![t],
            config,
        };
        let sample = |seed, penalty, top_k| GenerationConfig {
            max_new_tokens: 9,
            sampling: Sampling::Sample {
                temperature: 0.8,
                top_k,
                top_p: Some(0.95),
            },
            repetition_penalty: penalty,
            seed,
            ..Default::default()
        };
        let first = vec![request(0, sample(1, 1.2, None)), request(1, greedy_to_3())];
        let arrivals = || {
            vec![
                vec![request(2, sample(5, 1.0, Some(2)))],
                vec![],
                vec![request(3, sample(7, 1.5, None)), request(1, greedy_to_3())],
            ]
            .into_iter()
        };
        let run = |decoder: &mut dyn RowDecoder| {
            let mut arrivals = arrivals();
            let mut done: Vec<Option<Vec<u32>>> = vec![None; 5];
            generate_continuous(
                decoder,
                first.clone(),
                3,
                |_| arrivals.next().unwrap_or_default(),
                |_, _| ControlFlow::Continue(()),
                |id, r| done[id] = Some(r.unwrap()),
            )
            .unwrap();
            done
        };
        let on_host = run(&mut bigram(vec![0, 1]));
        assert!(on_host.iter().all(Option::is_some), "{on_host:?}");
        for top in [1, 2, 4] {
            let mut itself = picks_itself(vec![0, 1], top);
            assert_eq!(run(&mut itself), on_host, "top {top}");
            assert!(itself.steps > 5);
        }
    }

    #[test]
    fn decoders_that_pick_tokens_give_the_same_tokens() {
        let prompts = [vec![0], vec![2]];
        let greedy = GenerationConfig {
            max_new_tokens: 5,
            stop_tokens: vec![3],
            ..Default::default()
        };
        let sample = |top_k, top_p, penalty| GenerationConfig {
            max_new_tokens: 40,
            sampling: Sampling::Sample {
                temperature: 0.7,
                top_k,
                top_p,
            },
            repetition_penalty: penalty,
            seed: 11,
            ..Default::default()
        };
        let configs = [
            greedy.clone(),
            GenerationConfig {
                repetition_penalty: 1.5,
                ..greedy
            },
            sample(None, None, 1.0),
            sample(Some(2), None, 1.3),
            sample(Some(3), Some(0.6), 1.0),
            sample(None, Some(0.9), 1.2),
        ];
        for config in &configs {
            let on_host = generate(&mut bigram(vec![0, 2]), &prompts, config, |_, _| {
                ControlFlow::Continue(())
            })
            .unwrap();
            for top in [1, 2, 4] {
                let mut itself = picks_itself(vec![0, 2], top);
                let picked = generate(&mut itself, &prompts, config, |_, _| {
                    ControlFlow::Continue(())
                });
                assert_eq!(picked.unwrap(), on_host, "{config:?}, top {top}");
                assert_eq!(
                    itself.steps,
                    on_host.iter().map(Vec::len).max().unwrap() - 1,
                    "every step after the prefill picked by the decoder"
                );
                if top == 4 {
                    assert_eq!(itself.fallbacks, 0, "the whole row always decides");
                }
            }
            let configs = vec![config.clone(), sample(Some(2), Some(0.5), 1.1)];
            let alone = generate_each(&mut bigram(vec![0, 2]), &prompts, &configs, |_, _| {
                ControlFlow::Continue(())
            })
            .unwrap();
            let mut itself = picks_itself(vec![0, 2], 2);
            let picked = generate_each(&mut itself, &prompts, &configs, |_, _| {
                ControlFlow::Continue(())
            });
            assert_eq!(picked.unwrap(), alone, "{configs:?}");
        }
    }

    /// `choose_among` on a row's most likely tokens is `pick_drawn` on the whole row whenever
    /// it decides, and it decides whenever the prefix holds every kept token.
    #[test]
    fn choosing_among_the_most_likely_tokens_is_the_whole_rows_choice() {
        let mut rng = StdRng::seed_from_u64(3);
        let vocab = 50;
        let mut decided = 0;
        for case in 0..3000 {
            let spread = [0.5f32, 2.0, 6.0][case % 3];
            let mut row: Vec<f32> = (0..vocab)
                .map(|_| (rng.random::<f32>() - 0.5) * spread)
                .collect();
            // Ties, and a value repeated at a later index.
            row[7] = row[3];
            let top_k = [None, Some(1), Some(5), Some(20), Some(80)][case % 5];
            let top_p = [None, Some(0.3), Some(0.9), Some(1.0)][case % 4];
            let temperature = [0.3f32, 1.0, 2.5][(case / 7) % 3];
            let pick = RowPick {
                sampling: Sampling::Sample {
                    temperature,
                    top_k,
                    top_p,
                },
                repetition_penalty: 1.0,
                history: &[],
                draw: rng.random(),
            };
            let want = pick_drawn(&mut row.clone(), &pick).unwrap();
            let total = Some(total(&row, temperature));
            for top in [1, 8, 20, vocab] {
                let got = choose_among(&most_likely(&row, top), total, vocab, &pick);
                let kept = top_k.map_or(vocab, |k| k.min(vocab));
                if top >= kept {
                    assert_eq!(got, Some(want), "case {case}, top {top}");
                } else if let Some(got) = got {
                    assert_eq!(got, want, "case {case}, top {top}");
                    decided += 1;
                }
            }
        }
        assert!(decided > 500, "prefixes decide often: {decided}");
        let greedy = RowPick::greedy(&[]);
        assert_eq!(
            choose_among(&[(4, 1.0), (2, 0.5)], None, 9, &greedy),
            Some(4)
        );
        assert_eq!(choose_among(&[], None, 9, &greedy), None);
    }

    /// HF penalises each distinct token of the sequence once, however often it occurs.
    #[test]
    fn repetition_penalty_applies_once_per_token() {
        let mut logits = vec![3.0, -2.0, 1.0];
        penalize(&mut logits, &[0, 1, 0, 0, 1], 2.0);
        assert_eq!(logits, vec![1.5, -4.0, 1.0]);
        assert_eq!(penalized_tokens(&[5, 1, 5, 2, 1]), vec![1, 2, 5]);
    }

    #[test]
    fn repetition_penalty_changes_the_choice() {
        let mut s = Sampler::new(GenerationConfig {
            repetition_penalty: 10.0,
            ..Default::default()
        })
        .unwrap();
        let mut logits = vec![1.0, 3.0, 2.0];
        assert_eq!(s.pick(&mut logits, &[1]).unwrap(), 2);
        let mut neg = vec![-1.0, -0.5];
        assert_eq!(s.pick(&mut neg, &[1]).unwrap(), 0);
    }

    #[test]
    fn sampling_is_seeded_and_respects_top_k() {
        let cfg = GenerationConfig {
            sampling: Sampling::Sample {
                temperature: 1.0,
                top_k: Some(2),
                top_p: None,
            },
            seed: 7,
            ..Default::default()
        };
        let draw = |cfg: &GenerationConfig| {
            let mut s = Sampler::new(cfg.clone()).unwrap();
            (0..200)
                .map(|_| s.pick(&mut [0.0, 1.0, 1.2, -3.0], &[]).unwrap())
                .collect::<Vec<_>>()
        };
        let a = draw(&cfg);
        assert_eq!(a, draw(&cfg));
        assert!(a.iter().all(|t| *t == 1 || *t == 2));
        assert!(a.contains(&1) && a.contains(&2));
        let tight = GenerationConfig {
            sampling: Sampling::Sample {
                temperature: 1.0,
                top_k: None,
                top_p: Some(0.01),
            },
            ..cfg
        };
        assert!(draw(&tight).iter().all(|t| *t == 2));
    }

    #[test]
    fn invalid_options_are_errors() {
        for sampling in [
            Sampling::Sample {
                temperature: 0.0,
                top_k: None,
                top_p: None,
            },
            Sampling::Sample {
                temperature: 1.0,
                top_k: Some(0),
                top_p: None,
            },
            Sampling::Sample {
                temperature: 1.0,
                top_k: None,
                top_p: Some(1.5),
            },
        ] {
            let cfg = GenerationConfig {
                sampling,
                ..Default::default()
            };
            assert!(Sampler::new(cfg).is_err());
        }
        let mut d = bigram(vec![0]);
        assert!(generate(&mut d, &[], &GenerationConfig::default(), |_, _| {
            ControlFlow::Continue(())
        })
        .is_err());
    }

    /// Seeded sampling at temperature 1.5 of up to `max_new_tokens` tokens, no stop token.
    fn sampled(seed: u64, max_new_tokens: usize) -> GenerationConfig {
        GenerationConfig {
            sampling: Sampling::Sample {
                temperature: 1.5,
                top_k: None,
                top_p: None,
            },
            seed,
            max_new_tokens,
            ..Default::default()
        }
    }

    /// Greedy decoding of up to 5 tokens, stopping at token 3.
    fn greedy_to_3() -> GenerationConfig {
        GenerationConfig {
            max_new_tokens: 5,
            stop_tokens: vec![3],
            ..Default::default()
        }
    }

    /// Rows with their own configurations decode as each would alone: seeded samples, token
    /// limits, stop tokens; a `Break` ends only its row.
    #[test]
    fn each_row_keeps_its_own_configuration() {
        let sample = |seed| sampled(seed, 12);
        let greedy = greedy_to_3();
        let configs = [sample(1), greedy.clone(), sample(9)];
        let prompts = vec![vec![0], vec![1], vec![2]];
        let alone: Vec<Vec<u32>> = (0..3)
            .map(|r| {
                let mut d = bigram(vec![prompts[r][0]]);
                generate_each(&mut d, &prompts[r..r + 1], &configs[r..r + 1], |_, _| {
                    ControlFlow::Continue(())
                })
                .unwrap()
                .remove(0)
            })
            .collect();
        let mut d = bigram(vec![0, 1, 2]);
        let together =
            generate_each(&mut d, &prompts, &configs, |_, _| ControlFlow::Continue(())).unwrap();
        assert_eq!(together, alone);
        assert_eq!(together[1], vec![2, 3]); // greedy 1 → 2 → 3 (a stop token)
        assert_eq!(together[0].len(), 12);
        // Row 0 stops after its second token; the others run on.
        let mut d = bigram(vec![0, 1, 2]);
        let mut seen = 0;
        let cut = generate_each(&mut d, &prompts, &configs, |row, _| {
            seen += usize::from(row == 0);
            if row == 0 && seen == 2 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .unwrap();
        assert_eq!(cut[0], alone[0][..2].to_vec());
        assert_eq!(cut[2], alone[2]);
        let mut d = bigram(vec![0]);
        assert!(generate_each(&mut d, &prompts[..1], &configs, |_, _| {
            ControlFlow::Continue(())
        })
        .is_err());
    }

    /// Requests that join a running batch, or leave it early, get the tokens they get alone; a
    /// request whose admission fails ends with its error and the others go on.
    #[test]
    fn continuous_batching_admits_and_retires_rows() {
        let sample = |seed| sampled(seed, 7);
        let greedy = greedy_to_3();
        let request = |t: u32, config: &GenerationConfig| RowRequest {
            prompt: vec![t],
            config: config.clone(),
        };
        let alone = |r: &RowRequest| -> Vec<u32> {
            let mut d = bigram(r.prompt.clone());
            generate_each(
                &mut d,
                std::slice::from_ref(&r.prompt),
                std::slice::from_ref(&r.config),
                |_, _| ControlFlow::Continue(()),
            )
            .unwrap()
            .remove(0)
        };
        let first = vec![request(0, &sample(1)), request(1, &greedy)];
        // Arrivals: two after the first step, none, then three (one that wants no token, one
        // with bad options, one with a prompt the model rejects), then one more.
        let mut arrivals = vec![
            vec![request(2, &sample(4)), request(0, &greedy)],
            vec![],
            vec![
                request(1, &GenerationConfig::exact_greedy(0)),
                request(
                    2,
                    &GenerationConfig {
                        repetition_penalty: 0.0,
                        ..greedy.clone()
                    },
                ),
                request(9, &greedy),
                request(2, &greedy),
            ],
            vec![request(3, &sample(8))],
        ]
        .into_iter();
        let mut queue: Vec<RowRequest> = Vec::new();
        let mut all = first.clone();
        let mut free_seen = Vec::new();
        let mut streamed: Vec<Vec<u32>> = vec![Vec::new(); 10];
        let mut done: Vec<Option<Result<Vec<u32>>>> = (0..10).map(|_| None).collect();
        let mut d = bigram(vec![0, 1]);
        generate_continuous(
            &mut d,
            first,
            4,
            |free| {
                free_seen.push(free);
                queue.extend(arrivals.next().unwrap_or_default());
                let got: Vec<RowRequest> = queue.drain(..free.min(queue.len())).collect();
                all.extend(got.iter().cloned());
                got
            },
            |id, t| {
                streamed[id].push(t);
                ControlFlow::Continue(())
            },
            |id, result| {
                assert!(done[id].is_none(), "request {id} ended twice");
                done[id] = Some(result);
            },
        )
        .unwrap();
        assert_eq!(all.len(), 9);
        for (id, r) in all.iter().enumerate() {
            match (id, done[id].as_ref().expect("every request ends")) {
                (5, Err(e)) => assert!(e.to_string().contains("repetition_penalty"), "{e}"),
                (6, Err(e)) => assert!(e.to_string().contains("out of range"), "{e}"),
                (_, Ok(tokens)) => {
                    assert_eq!(tokens, &alone(r), "request {id}");
                    assert_eq!(&streamed[id], tokens);
                }
                (_, Err(e)) => panic!("request {id} failed: {e}"),
            }
        }
        assert_eq!(
            done[4].as_ref().unwrap().as_ref().unwrap(),
            &Vec::<u32>::new()
        );
        assert!(free_seen.iter().all(|&f| f <= 4), "{free_seen:?}");
        assert!(queue.is_empty() && arrivals.next().is_none());
        assert!(done[9].is_none());
    }
}
