//! Incremental decoding: [`LlamaDecoder`] implements the shared [`TokenDecoder`] over a KV cache
//! (or, for reference checks, by recomputing the whole sequence every step).

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::{
    convert::float_to_vec,
    generate::{RowDecoder, TokenDecoder},
    KvCache,
};

use crate::model::{positions_from_mask, DecoderInput, LlamaModel};

/// How each step is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeMode {
    /// Keys and values of earlier positions are cached; a step runs one position per row.
    Cached,
    /// Every step runs the whole sequence again (no cache), as the reference fixtures decode.
    Recompute,
}

/// Prompts of different lengths as one batch, left-padded to the longest: per row, the ids,
/// the attention mask (0 on padding) and the position ids HF's `generate` derives from it
/// ([`positions_from_mask`]), and the padded length.
#[derive(Debug, Clone, PartialEq)]
pub struct LeftPadded {
    /// Token ids per row (`pad` first).
    pub ids: Vec<Vec<i64>>,
    /// Attention mask per row.
    pub mask: Vec<Vec<i64>>,
    /// Position ids per row.
    pub positions: Vec<Vec<i64>>,
    /// Columns of every row.
    pub len: usize,
}

/// `prompts` left-padded with `pad` into one batch: what every executor of the family decodes
/// (at least one prompt, none empty).
pub fn left_padded(prompts: &[Vec<u32>], pad: i64) -> Result<LeftPadded> {
    if prompts.is_empty() {
        return Err(Error::InvalidInput("no prompts to decode".into()));
    }
    if let Some(i) = prompts.iter().position(Vec::is_empty) {
        return Err(Error::InvalidInput(format!("prompt {i} is empty")));
    }
    let len = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(prompts.len());
    let mut mask = Vec::with_capacity(prompts.len());
    for p in prompts {
        let padding = len - p.len();
        let mut row = vec![pad; padding];
        row.extend(p.iter().map(|&t| i64::from(t)));
        ids.push(row);
        let mut m = vec![0i64; padding];
        m.resize(len, 1);
        mask.push(m);
    }
    let positions = mask
        .iter()
        .map(|m| positions_from_mask(m, 1, m.len()))
        .collect();
    Ok(LeftPadded {
        ids,
        mask,
        positions,
        len,
    })
}

/// A batch of prompts being decoded by a [`LlamaModel`]. Prompts of different lengths are
/// left-padded; the padding is masked out of attention and position ids come from the mask's
/// cumulative sum, as HF's `generate` does, so each row decodes as it would alone.
pub struct LlamaDecoder<'m, B: Backend> {
    model: &'m LlamaModel<B>,
    mode: DecodeMode,
    cache: KvCache<B>,
    /// Token ids per row (padding included).
    ids: Vec<Vec<i64>>,
    /// Attention mask per row.
    mask: Vec<Vec<i64>>,
    /// Position ids per row.
    positions: Vec<Vec<i64>>,
    /// Columns already run through the model.
    done: usize,
    /// Columns of the (padded) prompt.
    prompt_len: usize,
    /// Input embeddings of the prompt `[batch, prompt_len, hidden]` replacing its token
    /// embeddings (LLaVA's spliced image features); generated tokens are embedded as usual.
    prompt_embeds: Option<Tensor<B, 3>>,
}

impl<'m, B: Backend> LlamaDecoder<'m, B> {
    /// A decoder over `prompts` (at least one row, none empty, every id in the vocabulary).
    pub fn new(model: &'m LlamaModel<B>, prompts: &[Vec<u32>], mode: DecodeMode) -> Result<Self> {
        let LeftPadded {
            ids,
            mask,
            positions,
            len,
        } = left_padded(prompts, model.config().padding_id())?;
        Ok(LlamaDecoder {
            model,
            mode,
            cache: model.new_cache(),
            ids,
            mask,
            positions,
            done: 0,
            prompt_len: len,
            prompt_embeds: None,
        })
    }

    /// A cached decoder with no rows yet: rows join it through [`RowDecoder::admit`].
    pub fn empty(model: &'m LlamaModel<B>) -> Self {
        LlamaDecoder {
            model,
            mode: DecodeMode::Cached,
            cache: model.new_cache(),
            ids: Vec::new(),
            mask: Vec::new(),
            positions: Vec::new(),
            done: 0,
            prompt_len: 0,
            prompt_embeds: None,
        }
    }

    /// The left-padded prompt ids, row-major `[batch, prompt_len]`, and its attention mask (0 on
    /// padding), as the decoder runs them.
    pub fn prompt_ids(&self) -> (Vec<i64>, Vec<i64>) {
        let p = self.prompt_len;
        let ids = self
            .ids
            .iter()
            .flat_map(|r| r[..p].iter().copied())
            .collect();
        let mask = self
            .mask
            .iter()
            .flat_map(|r| r[..p].iter().copied())
            .collect();
        (ids, mask)
    }

    /// Replaces the prompt's token embeddings by `embeds` `[batch, prompt_len, hidden]` (laid out
    /// as [`prompt_ids`](Self::prompt_ids)), HF's `inputs_embeds`; only before
    /// [`prefill`](TokenDecoder::prefill). Generated tokens are embedded by the model's table; in
    /// [`DecodeMode::Recompute`] every step runs these embeddings again.
    pub fn set_prompt_embeds(&mut self, embeds: Tensor<B, 3>) -> Result<()> {
        if self.done != 0 {
            return Err(Error::InvalidInput(
                "prompt embeddings set after prefill".into(),
            ));
        }
        let want = [
            self.ids.len(),
            self.prompt_len,
            self.model.config().hidden_size,
        ];
        if embeds.dims() != want {
            return Err(Error::InvalidInput(format!(
                "prompt embeddings of shape {:?}, expected {want:?}",
                embeds.dims()
            )));
        }
        self.prompt_embeds = Some(embeds);
        Ok(())
    }

    /// Columns (padded length) of the sequence so far.
    pub fn len(&self) -> usize {
        self.ids.first().map_or(0, Vec::len)
    }

    /// Whether nothing is held (never true: a decoder has a prompt).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The cache (empty in [`DecodeMode::Recompute`]).
    pub fn cache(&self) -> &KvCache<B> {
        &self.cache
    }

    /// `Err` naming the first of `tokens` outside the model's vocabulary.
    fn check_vocabulary<'t>(&self, tokens: impl IntoIterator<Item = &'t u32>) -> Result<()> {
        let vocab = self.model.config().vocab_size;
        match tokens.into_iter().find(|&&t| t as usize >= vocab) {
            Some(bad) => Err(Error::InvalidInput(format!(
                "token {bad} is outside the vocabulary of {vocab}"
            ))),
            None => Ok(()),
        }
    }

    /// Puts `columns` padding columns (masked out) before every row: the cache, ids, mask and
    /// positions (padding's position is 0, as [`positions_from_mask`] gives it).
    fn pad_front(&mut self, columns: usize) {
        if columns == 0 {
            return;
        }
        let pad = self.model.config().padding_id();
        for ((ids, mask), positions) in self
            .ids
            .iter_mut()
            .zip(&mut self.mask)
            .zip(&mut self.positions)
        {
            ids.splice(0..0, std::iter::repeat_n(pad, columns));
            mask.splice(0..0, std::iter::repeat_n(0, columns));
            positions.splice(0..0, std::iter::repeat_n(0, columns));
        }
        self.cache.pad_front(columns);
        self.done += columns;
        self.prompt_len += columns;
    }

    /// Runs the columns not yet processed and returns the last position's logits (on the CPU
    /// backend on a thread of the kernels' pool: [`ipfs_accelerate_nn::fast::on_pool`]).
    fn run_pending(&mut self) -> Result<Vec<f32>> {
        if ipfs_accelerate_nn::fast::is_cpu_backend::<B>() {
            return ipfs_accelerate_nn::fast::on_pool(|| self.run_pending_here());
        }
        self.run_pending_here()
    }

    /// [`run_pending`](Self::run_pending) on the calling thread.
    fn run_pending_here(&mut self) -> Result<Vec<f32>> {
        let len = self.len();
        let start = match self.mode {
            DecodeMode::Cached => self.done,
            DecodeMode::Recompute => 0,
        };
        let flat = |rows: &[Vec<i64>], from: usize| -> Vec<i64> {
            rows.iter()
                .flat_map(|r| r[from..].iter().copied())
                .collect()
        };
        let ids = flat(&self.ids, start);
        let positions = flat(&self.positions, start);
        let mask = flat(&self.mask, 0);
        let input = DecoderInput {
            batch: self.ids.len(),
            seq: len - start,
            ids: &ids,
            positions: &positions,
            mask: &mask,
        };
        let cache = match self.mode {
            DecodeMode::Cached => Some(&mut self.cache),
            DecodeMode::Recompute => None,
        };
        let logits = match &self.prompt_embeds {
            None => self.model.forward_last(&input, cache)?,
            Some(prompt) => {
                let (batch, plen) = (input.batch, self.prompt_len);
                let mut parts = Vec::with_capacity(2);
                if start < plen {
                    parts.push(prompt.clone().narrow(1, start, plen - start));
                }
                let from = start.max(plen);
                if from < len {
                    let new = flat(&self.ids, from);
                    parts.push(self.model.embed_tokens(&new, batch, len - from)?);
                }
                let embeds = Tensor::cat(parts, 1);
                let hidden = self
                    .model
                    .forward_hidden_embeds(embeds, &positions, &mask, cache)?;
                self.model.last_logits(hidden)
            }
        };
        self.done = len;
        float_to_vec(logits)
    }
}

impl<B: Backend> TokenDecoder for LlamaDecoder<'_, B> {
    fn batch(&self) -> usize {
        self.ids.len()
    }

    fn vocab(&self) -> usize {
        self.model.vocab()
    }

    fn prefill(&mut self) -> Result<Vec<f32>> {
        if self.done != 0 {
            return Err(Error::InvalidInput(
                "prefill called twice on one decoder".into(),
            ));
        }
        self.run_pending()
    }

    fn step(&mut self, tokens: &[u32]) -> Result<Vec<f32>> {
        if self.done == 0 {
            return Err(Error::InvalidInput("step called before prefill".into()));
        }
        if tokens.len() != self.ids.len() {
            return Err(Error::InvalidInput(format!(
                "{} tokens for a batch of {}",
                tokens.len(),
                self.ids.len()
            )));
        }
        self.check_vocabulary(tokens)?;
        for (row, &t) in tokens.iter().enumerate() {
            let next = self.positions[row].last().map_or(0, |p| p + 1);
            self.ids[row].push(i64::from(t));
            self.mask[row].push(1);
            self.positions[row].push(next);
        }
        self.run_pending()
    }
}

/// Continuous batching: new requests are prefilled together (apart from the running rows) and
/// join the batch left-padded to its columns (or the batch is left-padded to theirs); padding is
/// masked out and position ids stay per row, so each row decodes as it would alone. Rows that leave are
/// dropped from the cache, and columns every remaining row masks out are trimmed away.
impl<B: Backend> RowDecoder for LlamaDecoder<'_, B> {
    fn admit(&mut self, prompts: &[Vec<u32>]) -> Result<Vec<f32>> {
        if self.mode != DecodeMode::Cached || self.prompt_embeds.is_some() {
            return Err(Error::InvalidInput(
                "rows join a batch only when decoding token prompts with the KV cache".into(),
            ));
        }
        if !self.ids.is_empty() && self.done != self.len() {
            return Err(Error::InvalidInput("a row joins only after prefill".into()));
        }
        self.check_vocabulary(prompts.iter().flatten())?;
        let mut row = LlamaDecoder::new(self.model, prompts, DecodeMode::Cached)?;
        let logits = row.prefill()?;
        if self.ids.is_empty() {
            *self = row;
            return Ok(logits);
        }
        let (columns, theirs) = (self.len(), row.len());
        if theirs > columns {
            self.pad_front(theirs - columns);
        } else {
            row.pad_front(columns - theirs);
        }
        self.cache.append_rows(row.cache);
        self.ids.extend(row.ids);
        self.mask.extend(row.mask);
        self.positions.extend(row.positions);
        Ok(logits)
    }

    fn retain(&mut self, keep: &[usize]) -> Result<()> {
        let rows = self.ids.len();
        if keep.windows(2).any(|w| w[0] >= w[1]) || keep.last().is_some_and(|&r| r >= rows) {
            return Err(Error::InvalidInput(format!(
                "rows to keep {keep:?} are not ascending indices into a batch of {rows}"
            )));
        }
        let pick = |v: &mut Vec<Vec<i64>>| {
            *v = keep.iter().map(|&r| std::mem::take(&mut v[r])).collect();
        };
        pick(&mut self.ids);
        pick(&mut self.mask);
        pick(&mut self.positions);
        if let Some(embeds) = self.prompt_embeds.take() {
            if !keep.is_empty() {
                self.prompt_embeds = Some(ipfs_accelerate_nn::kv_cache::select_rows(embeds, keep));
            }
        }
        self.cache.select_rows(keep);
        if keep.is_empty() {
            self.done = 0;
            self.prompt_len = 0;
            return Ok(());
        }
        // Leading columns no remaining row attends to (among those already run) go.
        let trim = self
            .mask
            .iter()
            .map(|m| m.iter().take_while(|&&x| x == 0).count())
            .min()
            .unwrap_or(0)
            .min(self.done);
        if trim > 0 && self.prompt_embeds.is_none() {
            for ((ids, mask), positions) in self
                .ids
                .iter_mut()
                .zip(&mut self.mask)
                .zip(&mut self.positions)
            {
                ids.drain(..trim);
                mask.drain(..trim);
                positions.drain(..trim);
            }
            self.cache.trim_front(trim);
            self.done -= trim;
            self.prompt_len = self.prompt_len.saturating_sub(trim);
        }
        Ok(())
    }
}
