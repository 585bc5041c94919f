//! Generation benchmarks of the decoder LMs (`bench --new N`): a prompt of `--prompt` tokens,
//! `N` new tokens with the KV cache, greedy, no stop at end-of-sequence. Each timed iteration is
//! one whole generation; a grid point is stored as two rows:
//!
//! - `shape_kind = "prefill"`: the timings are the time to the first new token (TTFT: the
//!   prompt, or the encoder and the decoder's first step);
//! - `shape_kind = "decode"`: the timings are ms per new token after the first;
//!
//! both with [`Measurement::new_tokens`], the medians [`Measurement::ttft_ms`] and
//! [`Measurement::decode_tokens_per_s`], and the process's peak RSS since the model started
//! loading. A decoder LM's prompt is [`prompt_ids`]: the same ids for every engine, so a peer on
//! the same GGUF file runs exactly the same tokens. T5's prompt is its encoder input (`--prompt`
//! tokens), Whisper's the log-mel input (`--prompt` frames, default 30 s) with the decoder start
//! token, LLaVA's the text tokens around one image's tokens.

use std::ops::ControlFlow;
use std::time::Instant;

use indicatif::ProgressBar;
use ipfs_accelerate::text::{GenerationConfig, TextGeneration};

use crate::record::{Measurement, Status};
use crate::{interrupted, stats, BenchError};

/// The default prompt length of a generation point, in tokens.
pub const DEFAULT_PROMPT: usize = 128;

/// A prompt of `len` token ids spread over a vocabulary of `vocab` (never an id below 3, which are
/// the usual special tokens), deterministic.
pub fn prompt_ids(len: usize, vocab: usize) -> Vec<u32> {
    let span = vocab.saturating_sub(3).max(1);
    (0..len)
        .map(|i| (3 + (i * 7919 + 1000) % span) as u32)
        .collect()
}

/// llama.cpp's names of `general.file_type` (its `llama_ftype`), the mix a file was quantized to.
const FILE_TYPES: &[(u64, &str)] = &[
    (0, "F32"),
    (1, "F16"),
    (2, "Q4_0"),
    (3, "Q4_1"),
    (7, "Q8_0"),
    (8, "Q5_0"),
    (9, "Q5_1"),
    (10, "Q2_K"),
    (11, "Q3_K_S"),
    (12, "Q3_K_M"),
    (13, "Q3_K_L"),
    (14, "Q4_K_S"),
    (15, "Q4_K_M"),
    (16, "Q5_K_S"),
    (17, "Q5_K_M"),
    (18, "Q6_K"),
    (25, "IQ4_NL"),
    (30, "IQ4_XS"),
    (32, "BF16"),
];

/// What the benchmark reads of a GGUF file, once: its precision label and its vocabulary size
/// (the prompt ids of a peer on the same file are drawn from it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GgufInfo {
    /// `general.file_type` (`Q4_K_M`, `Q4_1`, ...), else the block type of most of the weight
    /// elements, else `gguf`.
    pub dtype: String,
    /// Entries of `tokenizer.ggml.tokens`, when the file has a vocabulary.
    pub vocab: Option<usize>,
}

impl GgufInfo {
    /// Reads them from an open file.
    pub fn of(file: &ipfs_accelerate_io::gguf::GgufFile) -> GgufInfo {
        let vocab = file
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array().map(<[_]>::len));
        let named = file
            .get("general.file_type")
            .and_then(|v| v.as_u64())
            .and_then(|t| FILE_TYPES.iter().find(|(id, _)| *id == t));
        let dtype = match named {
            Some((_, name)) => name.to_string(),
            None => {
                let mut totals: Vec<(String, usize)> = Vec::new();
                for info in file.tensor_infos().iter().filter(|t| t.shape.len() == 2) {
                    let name = info.ggml_type.name().to_string();
                    match totals.iter_mut().find(|(n, _)| *n == name) {
                        Some((_, count)) => *count += info.n_elements(),
                        None => totals.push((name, info.n_elements())),
                    }
                }
                totals
                    .into_iter()
                    .max_by_key(|(_, count)| *count)
                    .map_or_else(|| "gguf".into(), |(name, _)| name.to_uppercase())
            }
        };
        GgufInfo { dtype, vocab }
    }
}

/// What one generation point asks for.
pub struct GenerationPoint<'a> {
    /// The measurement to fill (identity, load time), with `shape_kind` still unset.
    pub base: Measurement,
    /// Prompt tokens.
    pub prompt: usize,
    /// New tokens per iteration.
    pub new_tokens: usize,
    /// Untimed generations first.
    pub warmup: usize,
    /// Timed generations.
    pub iters: usize,
    /// Progress (one tick per generation).
    pub bar: &'a ProgressBar,
}

/// The prefill and decode rows of one point from per-iteration TTFTs and decode times. `ttft_ms`
/// and `decode_ms` are per timed iteration (decode: ms per new token after the first).
pub fn generation_rows(
    base: &Measurement,
    prompt: usize,
    new_tokens: usize,
    ttft_ms: Vec<f64>,
    decode_ms: Vec<f64>,
) -> [Measurement; 2] {
    // A batch decodes one token per row per step: rates are summed over the rows.
    let rows = f64::from(base.batch.max(1));
    let median = |v: &[f64]| stats::latency_stats(v).map(|l| l.p50_ms);
    let ttft = median(&ttft_ms);
    let decode_rate = median(&decode_ms)
        .filter(|&ms| ms > 0.0)
        .map(|ms| rows * 1e3 / ms);
    let row = |kind: &str, timings: Vec<f64>, tokens: f64| {
        let latency = stats::latency_stats(&timings);
        Measurement {
            shape_kind: kind.into(),
            seq: prompt as u32,
            new_tokens: Some(new_tokens as u32),
            iters_done: timings.len() as u32,
            latency,
            items_per_s: latency.map(|l| f64::from(base.batch) * 1e3 / l.mean_ms),
            tokens_per_s: latency.map(|l| tokens * 1e3 / l.mean_ms),
            ttft_ms: ttft,
            decode_tokens_per_s: decode_rate,
            timings_ms: timings,
            ..base.clone()
        }
    };
    [
        row("prefill", ttft_ms, rows * prompt as f64),
        row("decode", decode_ms, rows),
    ]
}

/// One generation: streams each new token to the callback, returns how many were generated.
pub type GenerateOnce<'a> =
    dyn Fn(&mut dyn FnMut(u32) -> ControlFlow<()>) -> Result<usize, String> + 'a;

/// The prompt ids and settings of a decoder LM's generation point, or why it cannot run.
pub fn decoder_request(
    decoder: &dyn TextGeneration,
    prompt: usize,
    new_tokens: usize,
) -> Result<(Vec<u32>, GenerationConfig), String> {
    let config = decoder.config();
    let positions = config.max_position_embeddings();
    if prompt + new_tokens > positions {
        return Err(format!(
            "a prompt of {prompt} tokens + {new_tokens} new tokens exceeds the model's {positions} \
             positions"
        ));
    }
    let generation = GenerationConfig {
        max_new_tokens: new_tokens,
        stop_tokens: Vec::new(),
        ..decoder.default_generation_config()
    };
    Ok((prompt_ids(prompt, config.vocab_size), generation))
}

/// Times `point.iters` generations (after `point.warmup` untimed ones) of `generate`.
pub fn measure_generation(
    generate: &GenerateOnce<'_>,
    point: GenerationPoint<'_>,
) -> [Measurement; 2] {
    let fail = |status: Status, reason: String| {
        let mut m = point.base.clone();
        m.status = status;
        m.reason = Some(reason);
        generation_rows(&m, point.prompt, point.new_tokens, Vec::new(), Vec::new())
    };
    if point.new_tokens < 2 {
        return fail(
            Status::Failed,
            "--new must be at least 2 (decode speed is timed after the first new token)".into(),
        );
    }
    // One generation: (time to the first token, ms per token after it), in ms.
    let once = || -> Result<(f64, f64), String> {
        let start = Instant::now();
        let mut first = None;
        let count = generate(&mut |_| {
            first.get_or_insert_with(|| start.elapsed());
            ControlFlow::Continue(())
        })?;
        let total = start.elapsed();
        point.bar.inc(1);
        let first = first.ok_or("generate returned no token")?;
        if count != point.new_tokens {
            return Err(format!(
                "generate returned {count} tokens, {} were asked",
                point.new_tokens
            ));
        }
        let rest = (total - first).as_secs_f64() * 1e3 / (count - 1) as f64;
        Ok((first.as_secs_f64() * 1e3, rest))
    };
    for _ in 0..point.warmup {
        if interrupted() {
            break;
        }
        if let Err(reason) = once() {
            return fail(Status::Failed, reason);
        }
    }
    let (mut ttft, mut decode) = (Vec::new(), Vec::new());
    let mut base = point.base.clone();
    for _ in 0..point.iters {
        if interrupted() {
            base.status = Status::Interrupted;
            base.reason = Some("interrupted by Ctrl-C".into());
            break;
        }
        match once() {
            Ok((first, rest)) => {
                ttft.push(first);
                decode.push(rest);
            }
            Err(reason) => {
                base.status = Status::Failed;
                base.reason = Some(reason);
                break;
            }
        }
    }
    base.host_rss_peak_bytes = crate::sysinfo::peak_rss_bytes();
    generation_rows(&base, point.prompt, point.new_tokens, ttft, decode)
}

/// The families whose generation is benchmarked: the decoder LMs (token-level through
/// [`TextGeneration`], GGUF files too) and the encoder-decoders and LLaVA towers through
/// `ModelRunner::generate_ids` on the family's synthesized inputs.
pub const GENERATING_FAMILIES: &[&str] =
    &["llama", "qwen2", "t5", "whisper", "llava", "llava_next"];

/// Whether `family` is generated through [`TextGeneration`] (the decoder LMs).
pub fn is_decoder_lm(family: &str) -> bool {
    matches!(family, "llama" | "qwen2")
}

/// Checks a generation grid: batch 1 only, prompt lengths of at least one token.
pub fn check_grid(batches: &[usize], prompts: &[usize]) -> Result<(), BenchError> {
    if batches.contains(&0) {
        return Err(BenchError::Spec("--batch sizes must be at least 1".into()));
    }
    if prompts.contains(&0) {
        return Err(BenchError::Spec(
            "--prompt lengths must be at least 1 token".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_ids_stay_in_the_vocabulary_and_skip_special_ids() {
        let ids = prompt_ids(500, 50);
        assert_eq!(ids.len(), 500);
        assert!(ids.iter().all(|&i| (3..50).contains(&i)));
        assert_eq!(ids, prompt_ids(500, 50));
    }

    #[test]
    fn rows_carry_ttft_and_decode_rate() {
        let base = Measurement {
            batch: 1,
            ..Default::default()
        };
        let [prefill, decode] =
            generation_rows(&base, 128, 64, vec![40.0, 50.0, 60.0], vec![5.0, 4.0, 6.0]);
        assert_eq!(prefill.shape_kind, "prefill");
        assert_eq!(decode.shape_kind, "decode");
        for r in [&prefill, &decode] {
            assert_eq!(r.seq, 128);
            assert_eq!(r.new_tokens, Some(64));
            assert_eq!(r.ttft_ms, Some(50.0));
            assert_eq!(r.decode_tokens_per_s, Some(200.0));
            assert_eq!(r.iters_done, 3);
        }
        assert!((prefill.tokens_per_s.unwrap() - 128.0 * 1e3 / 50.0).abs() < 1e-9);
        assert!((decode.tokens_per_s.unwrap() - 200.0).abs() < 1e-9);
        assert!(check_grid(&[2, 8], &[128]).is_ok());
        assert!(check_grid(&[0], &[128]).is_err());
        assert!(check_grid(&[1], &[0]).is_err());
        // A batch of 8 decodes 8 tokens a step: the rates are summed over its rows.
        let batch = Measurement {
            batch: 8,
            ..Default::default()
        };
        let [prefill, decode] = generation_rows(&batch, 128, 64, vec![50.0], vec![5.0]);
        assert_eq!(decode.decode_tokens_per_s, Some(1600.0));
        assert!((decode.tokens_per_s.unwrap() - 1600.0).abs() < 1e-9);
        assert!((prefill.tokens_per_s.unwrap() - 8.0 * 128.0 * 1e3 / 50.0).abs() < 1e-9);
    }
}
