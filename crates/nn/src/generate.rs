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
    /// [`step`](Self::step) when every row decodes greedily (no repetition penalty): the argmax
    /// of each row's next-token logits (the first on ties; an error for NaN logits), picked where
    /// the logits are (a GPU) instead of sending them back. `None` (the default) when the decoder
    /// cannot; the caller then steps and picks from the logits.
    fn step_greedy(&mut self, tokens: &[u32]) -> Option<Result<Vec<u32>>> {
        let _ = tokens;
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
    fn step_greedy(&mut self, tokens: &[u32]) -> Option<Result<Vec<u32>>> {
        (**self).step_greedy(tokens)
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
        if logits.is_empty() {
            return Err(Error::InvalidInput("empty logits row".into()));
        }
        let penalty = self.config.repetition_penalty;
        if penalty != 1.0 {
            for &t in history {
                if let Some(l) = logits.get_mut(t as usize) {
                    *l = if *l < 0.0 { *l * penalty } else { *l / penalty };
                }
            }
        }
        if logits.iter().any(|v| v.is_nan()) {
            return Err(Error::Compute("the model produced NaN logits".into()));
        }
        match self.config.sampling {
            Sampling::Greedy => Ok(argmax(logits)),
            Sampling::Sample {
                temperature,
                top_k,
                top_p,
            } => Ok(self.sample(logits, temperature, top_k, top_p)),
        }
    }

    fn sample(
        &mut self,
        logits: &[f32],
        temperature: f32,
        top_k: Option<usize>,
        top_p: Option<f32>,
    ) -> u32 {
        let mut order: Vec<usize> = (0..logits.len()).collect();
        // Most likely first; ties keep the lower id first.
        order.sort_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
        if let Some(k) = top_k {
            order.truncate(k.max(1));
        }
        let max = logits[order[0]] / temperature;
        let mut probs: Vec<f64> = order
            .iter()
            .map(|&i| f64::from(logits[i] / temperature - max).exp())
            .collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|p| *p /= total);
        if let Some(p) = top_p {
            // Keep the smallest prefix whose mass reaches p (at least one token).
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, q) in probs.iter().enumerate() {
                acc += q;
                if acc >= f64::from(p) {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep.max(1));
            let total: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|q| *q /= total);
        }
        let draw: f64 = self.rng.random();
        let mut acc = 0.0;
        for (i, q) in probs.iter().enumerate() {
            acc += q;
            if draw < acc {
                return order[i] as u32;
            }
        }
        order[probs.len() - 1] as u32
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
    let mut sampler = Sampler::new(config.clone())?;
    let limits = vec![config; prompts.len()];
    run_rows(
        decoder,
        prompts,
        &limits,
        |_, logits, history| sampler.pick(logits, history),
        on_token,
        Stop::All,
    )
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
        |row, logits, history| samplers[row].pick(logits, history),
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
/// to the rounding of a batched product), as with [`generate_each`]. An error of a whole step is
/// returned; requests not yet ended got no `on_done`.
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
    loop {
        if logits.len() != rows.len() * vocab {
            return Err(Error::Compute(format!(
                "decoder returned {} logits for {} rows × vocab {vocab}",
                logits.len(),
                rows.len()
            )));
        }
        let mut next = Vec::with_capacity(rows.len());
        let mut ended = Vec::with_capacity(rows.len());
        for (row, chunk) in rows.iter_mut().zip(logits.chunks_mut(vocab.max(1))) {
            let token = row.sampler.pick(chunk, &row.history)?;
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
        logits = if rows.is_empty() {
            Vec::new()
        } else {
            decoder.step(&next)?
        };
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

/// The decoding loop of [`generate`] and [`generate_each`]: `pick(row, logits, history)` chooses
/// each row's token; `limits[row]` gives its token limit and stop tokens.
fn run_rows(
    decoder: &mut dyn TokenDecoder,
    prompts: &[Vec<u32>],
    limits: &[&GenerationConfig],
    mut pick: impl FnMut(usize, &mut [f32], &[u32]) -> Result<u32>,
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
    let mut history: Vec<Vec<u32>> = prompts.to_vec();
    let mut out: Vec<Vec<u32>> = vec![Vec::new(); batch];
    let mut done: Vec<bool> = limits.iter().map(|c| c.max_new_tokens == 0).collect();
    if done.iter().all(|d| *d) {
        return Ok(out);
    }
    // Every row greedy without a penalty: the decoder may pick on its device.
    let device_greedy = limits
        .iter()
        .all(|c| c.sampling == Sampling::Greedy && c.repetition_penalty == 1.0);
    let mut logits = decoder.prefill()?;
    // The tokens the decoder picked itself in the last step, instead of `logits`.
    let mut picked: Option<Vec<u32>> = None;
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
                None => pick(
                    row,
                    &mut logits[row * vocab..(row + 1) * vocab],
                    &history[row],
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
        picked = match device_greedy.then(|| decoder.step_greedy(&next)).flatten() {
            Some(tokens) => Some(tokens?),
            None => {
                logits = decoder.step(&next)?;
                None
            }
        };
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

    /// A bigram decoder that picks greedy tokens itself, counting the steps it picked.
    struct PicksItself(Bigram, usize);

    impl TokenDecoder for PicksItself {
        fn batch(&self) -> usize {
            self.0.batch()
        }
        fn vocab(&self) -> usize {
            self.0.vocab()
        }
        fn prefill(&mut self) -> Result<Vec<f32>> {
            self.0.prefill()
        }
        fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
            self.0.step(tokens)
        }
        fn step_greedy(&mut self, tokens: &[u32]) -> Option<Result<Vec<u32>>> {
            self.1 += 1;
            let vocab = self.0.vocab();
            Some(
                self.0
                    .step(tokens)
                    .map(|l| l.chunks(vocab).map(argmax).collect()),
            )
        }
    }

    #[test]
    fn decoders_that_pick_greedy_tokens_give_the_same_tokens() {
        let prompts = [vec![0], vec![2]];
        let greedy = GenerationConfig {
            max_new_tokens: 5,
            stop_tokens: vec![3],
            ..Default::default()
        };
        let on_host = generate(&mut bigram(vec![0, 2]), &prompts, &greedy, |_, _| {
            ControlFlow::Continue(())
        })
        .unwrap();
        let mut itself = PicksItself(bigram(vec![0, 2]), 0);
        let picked = generate(&mut itself, &prompts, &greedy, |_, _| {
            ControlFlow::Continue(())
        });
        assert_eq!(picked.unwrap(), on_host);
        assert_eq!(
            itself.1, 2,
            "every step after the prefill picked by the decoder"
        );
        // A penalty (or sampling) needs the logits: the decoder is not asked.
        let penalized = GenerationConfig {
            repetition_penalty: 1.5,
            ..greedy
        };
        let mut asked = PicksItself(bigram(vec![0, 2]), 0);
        generate(&mut asked, &prompts, &penalized, |_, _| {
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(asked.1, 0);
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
