//! Tokenizer glue.

use std::path::Path;

use tokenizers::{
    PaddingParams, PaddingStrategy, PostProcessor, Tokenizer, TruncationParams, TruncationStrategy,
};

/// Errors raised while preprocessing input.
#[derive(Debug, thiserror::Error)]
pub enum PreprocessError {
    /// tokenizer.json could not be read or parsed.
    #[error("tokenizer {origin}: {reason}")]
    Tokenizer {
        /// Where it came from.
        origin: String,
        /// What failed.
        reason: String,
    },
    /// An input is empty.
    #[error("empty input: {0}")]
    Empty(String),
    /// Encoding failed.
    #[error("tokenization failed: {0}")]
    Encode(String),
    /// A chat template failed to render or ran past its limits.
    #[error("chat template: {0}")]
    ChatTemplate(String),
}

impl From<PreprocessError> for ipfs_accelerate_core::Error {
    fn from(e: PreprocessError) -> Self {
        ipfs_accelerate_core::Error::InvalidInput(e.to_string())
    }
}

/// A batch of tokenised text, row-major `[batch, seq]`, padded to the longest row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Encoded {
    /// Rows.
    pub batch: usize,
    /// Padded length.
    pub seq: usize,
    /// Token ids.
    pub input_ids: Vec<i64>,
    /// 1 for tokens, 0 for padding.
    pub attention_mask: Vec<i64>,
    /// Segment ids (1 for the second text of a pair).
    pub token_type_ids: Vec<i64>,
    /// Per row: whether it was cut to the maximum length.
    pub truncated: Vec<bool>,
    /// Per row and token: byte offsets into the text the token came from.
    pub offsets: Vec<Vec<(usize, usize)>>,
    /// Per row and token: which text of the pair (0 or 1) the token belongs to; `None` for special
    /// tokens and padding.
    pub sequence_ids: Vec<Vec<Option<usize>>>,
}

impl Encoded {
    /// Number of rows that were truncated.
    pub fn truncated_count(&self) -> usize {
        self.truncated.iter().filter(|t| **t).count()
    }

    /// Tokens of each row (the ones of its attention mask).
    pub fn lengths(&self) -> Vec<usize> {
        (0..self.batch).map(|r| self.length(r)).collect()
    }

    /// Tokens of row `r`.
    fn length(&self, r: usize) -> usize {
        self.attention_mask[r * self.seq..(r + 1) * self.seq]
            .iter()
            .filter(|&&m| m != 0)
            .count()
    }

    /// The rows `rows` (in that order) cut to their own longest length: a batch padded no more
    /// than it needs. Padding is on the right ([`TextTokenizer`]'s), so each row keeps every
    /// token.
    pub fn select(&self, rows: &[usize]) -> Encoded {
        let seq = rows.iter().map(|&r| self.length(r)).max().unwrap_or(0);
        let cut = |v: &[i64], r: usize| v[r * self.seq..r * self.seq + seq].to_vec();
        Encoded {
            batch: rows.len(),
            seq,
            input_ids: rows.iter().flat_map(|&r| cut(&self.input_ids, r)).collect(),
            attention_mask: rows
                .iter()
                .flat_map(|&r| cut(&self.attention_mask, r))
                .collect(),
            token_type_ids: rows
                .iter()
                .flat_map(|&r| cut(&self.token_type_ids, r))
                .collect(),
            truncated: rows.iter().map(|&r| self.truncated[r]).collect(),
            offsets: rows
                .iter()
                .map(|&r| self.offsets[r].iter().take(seq).copied().collect())
                .collect(),
            sequence_ids: rows
                .iter()
                .map(|&r| self.sequence_ids[r].iter().take(seq).copied().collect())
                .collect(),
        }
    }
}

/// Splits rows sorted longest first (`lengths`, in tokens) into consecutive chunks of at most
/// `max_rows` rows that minimise the padded positions the chunks run (each chunk padded to its
/// first, longest row) plus `overhead` positions per chunk (what one more forward pass costs, in
/// token positions). Text-embeddings-inference and vLLM batch by tokens for the same reason: a
/// batch of mixed lengths padded to its longest wastes the difference.
pub fn plan_chunks(
    lengths: &[usize],
    max_rows: usize,
    overhead: usize,
) -> Vec<std::ops::Range<usize>> {
    let n = lengths.len();
    let max_rows = max_rows.max(1);
    // best[i]: the least cost of the first i rows; from[i]: where the last chunk of it starts.
    let mut best = vec![usize::MAX; n + 1];
    let mut from = vec![0; n + 1];
    best[0] = 0;
    for end in 1..=n {
        for start in end.saturating_sub(max_rows)..end {
            let cost = best[start]
                .saturating_add(overhead)
                .saturating_add((end - start) * lengths[start]);
            if cost < best[end] {
                best[end] = cost;
                from[end] = start;
            }
        }
    }
    let mut chunks = Vec::new();
    let mut end = n;
    while end > 0 {
        chunks.push(from[end]..end);
        end = from[end];
    }
    chunks.reverse();
    chunks
}

/// A `tokenizers` tokenizer configured for batched model input.
#[derive(Clone)]
pub struct TextTokenizer {
    inner: Tokenizer,
    max_len: usize,
}

impl TextTokenizer {
    /// Loads `tokenizer.json`; inputs are truncated to `max_len` tokens.
    pub fn from_file(path: &Path, max_len: usize) -> Result<Self, PreprocessError> {
        let inner = Tokenizer::from_file(path).map_err(|e| PreprocessError::Tokenizer {
            origin: path.display().to_string(),
            reason: e.to_string(),
        })?;
        Self::configure(inner, max_len, &path.display().to_string())
    }

    /// Parses tokenizer JSON held in memory.
    pub fn from_bytes(bytes: &[u8], max_len: usize) -> Result<Self, PreprocessError> {
        let inner = Tokenizer::from_bytes(bytes).map_err(|e| PreprocessError::Tokenizer {
            origin: "embedded tokenizer.json".into(),
            reason: e.to_string(),
        })?;
        Self::configure(inner, max_len, "embedded tokenizer.json")
    }

    fn configure(
        mut inner: Tokenizer,
        max_len: usize,
        origin: &str,
    ) -> Result<Self, PreprocessError> {
        // tokenizers subtracts the special tokens from the limit (an overflow panic when the limit
        // is smaller): a pair needs them all plus one token of text.
        let special = inner
            .get_post_processor()
            .map(|p| p.added_tokens(true))
            .unwrap_or(0);
        if max_len <= special {
            return Err(PreprocessError::Tokenizer {
                origin: origin.to_string(),
                reason: format!(
                    "the maximum length {max_len} leaves no room for text: the tokenizer adds \
                     {special} special tokens, so the model's max_position_embeddings (or \
                     sentence-transformers' max_seq_length) must be at least {}",
                    special + 1
                ),
            });
        }
        let pad_id = inner.get_padding().map(|p| p.pad_id).unwrap_or(0);
        let pad_token = inner
            .get_padding()
            .map(|p| p.pad_token.clone())
            .unwrap_or_else(|| "[PAD]".into());
        inner.with_padding(Some(PaddingParams {
            strategy: PaddingStrategy::BatchLongest,
            pad_id,
            pad_token,
            ..Default::default()
        }));
        inner
            .with_truncation(Some(TruncationParams {
                max_length: max_len,
                strategy: TruncationStrategy::LongestFirst,
                ..Default::default()
            }))
            .map_err(|e| PreprocessError::Tokenizer {
                origin: origin.to_string(),
                reason: e.to_string(),
            })?;
        Ok(TextTokenizer { inner, max_len })
    }

    /// The maximum number of tokens per row.
    pub fn max_len(&self) -> usize {
        self.max_len
    }

    /// The underlying tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.inner
    }

    /// Tokenises single texts (with special tokens). An empty list or an empty / blank text is an
    /// error naming it.
    pub fn encode_batch(&self, texts: &[&str]) -> Result<Encoded, PreprocessError> {
        check_texts(texts, "text")?;
        let encodings = self
            .inner
            .encode_batch(texts.to_vec(), true)
            .map_err(|e| PreprocessError::Encode(e.to_string()))?;
        Ok(collect(&encodings))
    }

    /// Tokenises `(first, second)` pairs, e.g. (question, context); only the second text is
    /// truncated when a pair is too long.
    pub fn encode_pairs(&self, pairs: &[(&str, &str)]) -> Result<Encoded, PreprocessError> {
        let firsts: Vec<&str> = pairs.iter().map(|p| p.0).collect();
        let seconds: Vec<&str> = pairs.iter().map(|p| p.1).collect();
        check_texts(&firsts, "question")?;
        check_texts(&seconds, "context")?;
        let mut tok = self.inner.clone();
        tok.with_truncation(Some(TruncationParams {
            max_length: self.max_len,
            strategy: TruncationStrategy::OnlySecond,
            ..Default::default()
        }))
        .map_err(|e| PreprocessError::Encode(e.to_string()))?;
        let inputs: Vec<tokenizers::EncodeInput> = pairs
            .iter()
            .map(|(a, b)| (a.to_string(), b.to_string()).into())
            .collect();
        let encodings = tok
            .encode_batch(inputs, true)
            .map_err(|e| PreprocessError::Encode(e.to_string()))?;
        Ok(collect(&encodings))
    }

    /// Decodes ids back to text (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String, PreprocessError> {
        self.inner
            .decode(ids, true)
            .map_err(|e| PreprocessError::Encode(e.to_string()))
    }
}

/// Default largest total of text bytes one call may tokenise (64 MiB; inputs are truncated to
/// the model's length only after tokenisation, which sees every byte).
pub const DEFAULT_MAX_INPUT_BYTES: usize = 64 << 20;

/// The total-input limit: `IPFS_ACCELERATE_MAX_INPUT_BYTES`, else [`DEFAULT_MAX_INPUT_BYTES`].
fn max_input_bytes() -> usize {
    std::env::var("IPFS_ACCELERATE_MAX_INPUT_BYTES")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(DEFAULT_MAX_INPUT_BYTES)
}

fn check_texts(texts: &[&str], what: &str) -> Result<(), PreprocessError> {
    if texts.is_empty() {
        return Err(PreprocessError::Empty(format!("no {what} given")));
    }
    if let Some(i) = texts.iter().position(|t| t.trim().is_empty()) {
        return Err(PreprocessError::Empty(format!("{what} #{i} is empty")));
    }
    let total: usize = texts.iter().map(|t| t.len()).sum();
    let limit = max_input_bytes();
    if total > limit {
        return Err(PreprocessError::Encode(format!(
            "the {what}s total {total} bytes, more than the {limit} one call may tokenise \
             (split the input, or raise IPFS_ACCELERATE_MAX_INPUT_BYTES)"
        )));
    }
    Ok(())
}

fn collect(encodings: &[tokenizers::Encoding]) -> Encoded {
    let batch = encodings.len();
    let seq = encodings.iter().map(|e| e.len()).max().unwrap_or(0);
    let mut out = Encoded {
        batch,
        seq,
        input_ids: Vec::with_capacity(batch * seq),
        attention_mask: Vec::with_capacity(batch * seq),
        token_type_ids: Vec::with_capacity(batch * seq),
        truncated: Vec::with_capacity(batch),
        offsets: Vec::with_capacity(batch),
        sequence_ids: Vec::with_capacity(batch),
    };
    for e in encodings {
        out.input_ids.extend(e.get_ids().iter().map(|&v| v as i64));
        out.attention_mask
            .extend(e.get_attention_mask().iter().map(|&v| v as i64));
        out.token_type_ids
            .extend(e.get_type_ids().iter().map(|&v| v as i64));
        out.truncated.push(!e.get_overflowing().is_empty());
        out.offsets.push(e.get_offsets().to_vec());
        out.sequence_ids.push(e.get_sequence_ids());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The cost `plan_chunks` minimises, of a given split.
    fn cost(lengths: &[usize], chunks: &[std::ops::Range<usize>], overhead: usize) -> usize {
        chunks
            .iter()
            .map(|c| overhead + c.len() * lengths[c.start])
            .sum()
    }

    /// Every split of `n` rows into chunks of at most `max` rows.
    fn splits(n: usize, max: usize) -> Vec<Vec<std::ops::Range<usize>>> {
        if n == 0 {
            return vec![vec![]];
        }
        let mut out = Vec::new();
        for first in 1..=max.min(n) {
            for mut rest in splits(n - first, max) {
                rest.iter_mut()
                    .for_each(|r| *r = r.start + first..r.end + first);
                rest.insert(0, 0..first);
                out.push(rest);
            }
        }
        out
    }

    #[test]
    fn chunks_cover_the_rows_in_order_and_cost_least() {
        let lengths = [40, 38, 21, 20, 20, 9, 8, 8, 7];
        for (max, overhead) in [(4, 0), (4, 16), (9, 16), (2, 100), (9, 1000)] {
            let plan = plan_chunks(&lengths, max, overhead);
            assert_eq!(plan.first().unwrap().start, 0);
            assert_eq!(plan.last().unwrap().end, lengths.len());
            assert!(plan.windows(2).all(|w| w[0].end == w[1].start));
            assert!(plan.iter().all(|c| !c.is_empty() && c.len() <= max));
            let least = splits(lengths.len(), max)
                .iter()
                .map(|s| cost(&lengths, s, overhead))
                .min()
                .unwrap();
            assert_eq!(
                cost(&lengths, &plan, overhead),
                least,
                "max {max}, overhead {overhead}"
            );
        }
        // Equal lengths: full chunks; a huge overhead: as few chunks as the cap allows.
        assert_eq!(plan_chunks(&[5; 7], 3, 1).len(), 3);
        assert_eq!(plan_chunks(&lengths, 9, 1000), vec![0..9]);
        assert!(plan_chunks(&[], 4, 1).is_empty());
    }

    #[test]
    fn selected_rows_keep_their_tokens_and_lose_padding() {
        // Three right-padded rows of 3, 1 and 2 tokens.
        let enc = Encoded {
            batch: 3,
            seq: 3,
            input_ids: vec![1, 2, 3, 4, 0, 0, 5, 6, 0],
            attention_mask: vec![1, 1, 1, 1, 0, 0, 1, 1, 0],
            token_type_ids: vec![0; 9],
            truncated: vec![false, true, false],
            offsets: vec![
                vec![(0, 1); 3],
                vec![(0, 2), (0, 0), (0, 0)],
                vec![(0, 3); 3],
            ],
            sequence_ids: vec![vec![Some(0); 3]; 3],
        };
        assert_eq!(enc.lengths(), vec![3, 1, 2]);
        let sub = enc.select(&[2, 1]);
        assert_eq!((sub.batch, sub.seq), (2, 2));
        assert_eq!(sub.input_ids, vec![5, 6, 4, 0]);
        assert_eq!(sub.attention_mask, vec![1, 1, 1, 0]);
        assert_eq!(sub.truncated, vec![false, true]);
        assert_eq!(sub.offsets[1], vec![(0, 2), (0, 0)]);
        assert_eq!(sub.sequence_ids[0].len(), 2);
    }
}
