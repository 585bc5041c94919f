//! A `tokenizers::Tokenizer` rebuilt from a GGUF file's `tokenizer.ggml.*` metadata.
//!
//! Two vocabularies are supported, as llama.cpp and transformers' GGUF conversion build them:
//!
//! - `gpt2`: byte-level BPE (tokens + merges). The pre-tokenizer follows `tokenizer.ggml.pre`:
//!   the GPT-2 regex by default, digits split one by one for the StarCoder / SmolLM family, and a
//!   `Split` regex for the LLaMA-3 and Qwen-2 families (and the other splits transformers knows).
//! - `llama`: sentencepiece-style BPE (tokens + scores, merges derived from the scores the way
//!   transformers' `generate_merges` does), `▁` for spaces (prefixed once unless
//!   `tokenizer.ggml.add_space_prefix` is false), byte fallback to `<0xXX>` tokens.
//!
//! Tokens the file marks CONTROL or UNKNOWN (and the bos / eos / unk / pad ids) become special
//! added tokens, USER_DEFINED ones plain added tokens, so both are matched whole in the text. BOS
//! / EOS are added by a template post-processor when `add_bos` / `add_eos` say so.

use std::collections::{BTreeMap, HashMap, HashSet};

use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::normalizers::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::processors::template::{SpecialToken, TemplateProcessing};
use tokenizers::{
    AddedToken, DecoderWrapper, PostProcessorWrapper, PreTokenizerWrapper, SplitDelimiterBehavior,
    Tokenizer,
};

use super::value::GgufValue;

/// Token type ids of `tokenizer.ggml.token_type` (llama.cpp's `llama_token_type`).
const TOKEN_UNKNOWN: i32 = 2;
const TOKEN_CONTROL: i32 = 3;
const TOKEN_USER_DEFINED: i32 = 4;

/// The special token ids and flags a GGUF file's tokenizer metadata declares.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpecialTokens {
    /// `tokenizer.ggml.bos_token_id` (absent, or out of the vocabulary: `None`).
    pub bos: Option<u32>,
    /// `tokenizer.ggml.eos_token_id`.
    pub eos: Option<u32>,
    /// `tokenizer.ggml.padding_token_id`.
    pub pad: Option<u32>,
    /// `tokenizer.ggml.unknown_token_id`.
    pub unk: Option<u32>,
    /// Whether encoding prepends BOS: `tokenizer.ggml.add_bos_token`; when absent, true for
    /// sentencepiece (`llama`) vocabularies and LLaMA-3-style BPE, false otherwise (llama.cpp's
    /// defaults).
    pub add_bos: bool,
    /// Whether encoding appends EOS: `tokenizer.ggml.add_eos_token` (default false).
    pub add_eos: bool,
}

/// Pre-tokenizer regexes (`tokenizer.ggml.pre` → the split llama.cpp / transformers apply).
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN35_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const TEKKEN_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const GPT4O_SPLIT: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// How a byte-level vocabulary splits text before BPE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreKind {
    /// GPT-2's regex (the ByteLevel pre-tokenizer's own).
    Gpt2,
    /// Every digit on its own, then GPT-2's regex (StarCoder, SmolLM, ...).
    DigitsGpt2,
    /// A `Split` regex, then byte-level mapping; `llama3` says whether whole words in the
    /// vocabulary skip the merges (LLaMA-3's `ignore_merges`).
    Split(&'static str, bool),
}

/// Pre-tokenizer names understood (`tokenizer.ggml.pre`), for error messages.
pub const SUPPORTED_PRE: &[&str] = &[
    "default",
    "gpt2",
    "gpt-2",
    "smollm",
    "starcoder",
    "refact",
    "command-r",
    "codeshell",
    "exaone",
    "minerva-7b",
    "llama3",
    "llama-v3",
    "llama-bpe",
    "falcon3",
    "falcon-h1",
    "pixtral",
    "midm-2.0",
    "lfm2",
    "dbrx",
    "smaug-bpe",
    "tekken",
    "qwen2",
    "deepseek-r1-qwen",
    "megrez",
    "qwen35",
    "gpt-4o",
    "llama4",
];

fn pre_kind(pre: Option<&str>) -> Option<PreKind> {
    Some(match pre {
        None | Some("default" | "gpt2" | "gpt-2") => PreKind::Gpt2,
        Some(
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone" | "minerva-7b",
        ) => PreKind::DigitsGpt2,
        Some(
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
            | "lfm2" | "dbrx" | "smaug-bpe",
        ) => PreKind::Split(LLAMA3_SPLIT, true),
        Some("tekken") => PreKind::Split(TEKKEN_SPLIT, false),
        Some("qwen2" | "deepseek-r1-qwen" | "megrez") => PreKind::Split(QWEN2_SPLIT, false),
        Some("qwen35") => PreKind::Split(QWEN35_SPLIT, false),
        Some("gpt-4o" | "llama4") => PreKind::Split(GPT4O_SPLIT, false),
        Some(_) => return None,
    })
}

/// Reads the special token ids and the add-bos / add-eos flags.
pub(crate) fn special_tokens(meta: &BTreeMap<String, GgufValue>) -> SpecialTokens {
    let n_tokens = meta
        .get("tokenizer.ggml.tokens")
        .and_then(GgufValue::as_array)
        .map_or(0, <[GgufValue]>::len);
    let id = |key: &str| {
        meta.get(key)
            .and_then(GgufValue::as_u64)
            .filter(|&v| v < n_tokens as u64)
            .map(|v| v as u32)
    };
    let flag = |key: &str| meta.get(key).and_then(GgufValue::as_bool);
    let model = meta.get("tokenizer.ggml.model").and_then(GgufValue::as_str);
    let pre = meta.get("tokenizer.ggml.pre").and_then(GgufValue::as_str);
    let default_bos = match model {
        Some("llama") => true,
        Some("gpt2") => matches!(pre_kind(pre), Some(PreKind::Split(_, true))),
        _ => false,
    };
    SpecialTokens {
        bos: id("tokenizer.ggml.bos_token_id"),
        eos: id("tokenizer.ggml.eos_token_id"),
        pad: id("tokenizer.ggml.padding_token_id"),
        unk: id("tokenizer.ggml.unknown_token_id"),
        add_bos: flag("tokenizer.ggml.add_bos_token").unwrap_or(default_bos),
        add_eos: flag("tokenizer.ggml.add_eos_token").unwrap_or(false),
    }
}

type R<T> = Result<T, String>;

fn strings<'a>(meta: &'a BTreeMap<String, GgufValue>, key: &str) -> R<Option<Vec<&'a str>>> {
    let Some(v) = meta.get(key) else {
        return Ok(None);
    };
    let items = v
        .as_array()
        .ok_or_else(|| format!("`{key}` is a {}, not an array", v.type_name()))?;
    items
        .iter()
        .enumerate()
        .map(|(i, s)| {
            s.as_str()
                .ok_or_else(|| format!("`{key}`[{i}] is a {}, not a string", s.type_name()))
        })
        .collect::<R<Vec<_>>>()
        .map(Some)
}

fn numbers<T>(
    meta: &BTreeMap<String, GgufValue>,
    key: &str,
    n: usize,
    conv: impl Fn(&GgufValue) -> Option<T>,
) -> R<Option<Vec<T>>> {
    let Some(v) = meta.get(key) else {
        return Ok(None);
    };
    let items = v
        .as_array()
        .ok_or_else(|| format!("`{key}` is a {}, not an array", v.type_name()))?;
    if items.len() != n {
        return Err(format!(
            "`{key}` has {} entries for {n} tokens",
            items.len()
        ));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, x)| conv(x).ok_or_else(|| format!("`{key}`[{i}] is a {}", x.type_name())))
        .collect::<R<Vec<_>>>()
        .map(Some)
}

/// The largest vocabulary a GGUF tokenizer may have (real ones have up to ~256k tokens).
pub const MAX_VOCABULARY: usize = 1 << 22;
/// The longest token, in bytes (real vocabularies stay under a few hundred).
pub const MAX_TOKEN_BYTES: usize = 1 << 16;
/// The work budget of deriving merges from a vocabulary: the sum of its tokens' squared lengths
/// (the derivation splits every token at every character; real vocabularies need ~10^7).
pub const MAX_MERGE_WORK: u64 = 1 << 33;

/// Bounds the vocabulary before anything is built from it: a hostile file with one 1 MB token
/// or millions of tokens would otherwise cost minutes of CPU and gigabytes of memory.
fn check_vocabulary(tokens: &[&str]) -> R<()> {
    if tokens.len() > MAX_VOCABULARY {
        return Err(format!(
            "{} tokens, more than the {MAX_VOCABULARY} a vocabulary may have",
            tokens.len()
        ));
    }
    let mut work = 0u64;
    for (i, t) in tokens.iter().enumerate() {
        if t.len() > MAX_TOKEN_BYTES {
            return Err(format!(
                "token {i} has {} bytes, more than the {MAX_TOKEN_BYTES} a token may have",
                t.len()
            ));
        }
        work = work.saturating_add((t.len() as u64).pow(2));
    }
    if work > MAX_MERGE_WORK {
        return Err(format!(
            "the tokens are too long in total to derive merges from (sum of squared lengths {work} > {MAX_MERGE_WORK})"
        ));
    }
    Ok(())
}

/// Builds the tokenizer; errors are reasons, the caller names the file.
pub(crate) fn build(meta: &BTreeMap<String, GgufValue>) -> R<Tokenizer> {
    let model = meta
        .get("tokenizer.ggml.model")
        .ok_or("no `tokenizer.ggml.model` metadata (the file carries no tokenizer)")?;
    let model = model
        .as_str()
        .ok_or_else(|| format!("`tokenizer.ggml.model` is a {}", model.type_name()))?;
    let tokens = strings(meta, "tokenizer.ggml.tokens")?.ok_or("no `tokenizer.ggml.tokens`")?;
    if tokens.is_empty() {
        return Err("`tokenizer.ggml.tokens` is empty".into());
    }
    check_vocabulary(&tokens)?;
    let n = tokens.len();
    let types = numbers(meta, "tokenizer.ggml.token_type", n, |v| {
        v.as_i64().and_then(|x| i32::try_from(x).ok())
    })?;
    let scores = numbers(meta, "tokenizer.ggml.scores", n, GgufValue::as_f64)?;
    let merges = strings(meta, "tokenizer.ggml.merges")?
        .map(|m| m.iter().map(|s| split_merge(s)).collect::<R<Vec<_>>>())
        .transpose()?;
    let special = special_tokens(meta);
    for (key, value) in [
        ("bos", meta.get("tokenizer.ggml.bos_token_id")),
        ("eos", meta.get("tokenizer.ggml.eos_token_id")),
    ] {
        if let Some(v) = value {
            if v.as_u64().is_none_or(|id| id >= n as u64) {
                return Err(format!(
                    "{key} token id {v:?} is outside the vocabulary of {n} tokens"
                ));
            }
        }
    }

    let mut tokenizer = match model {
        "gpt2" => {
            let pre_name = meta.get("tokenizer.ggml.pre").and_then(GgufValue::as_str);
            let pre = pre_kind(pre_name).ok_or_else(|| {
                format!(
                    "unsupported pre-tokenizer `tokenizer.ggml.pre` = {:?} (supported: {})",
                    pre_name.unwrap_or_default(),
                    SUPPORTED_PRE.join(", ")
                )
            })?;
            byte_level(&tokens, merges, scores.as_deref(), pre)?
        }
        "llama" => {
            let add_prefix = meta
                .get("tokenizer.ggml.add_space_prefix")
                .and_then(GgufValue::as_bool)
                .unwrap_or(true);
            sentencepiece(&tokens, merges, scores.as_deref(), &special, add_prefix)?
        }
        other => {
            return Err(format!(
                "unsupported tokenizer model `tokenizer.ggml.model` = {other:?} (supported: gpt2, llama)"
            ))
        }
    };

    add_special_tokens(&mut tokenizer, model, &tokens, types.as_deref(), &special);
    if special.add_bos || special.add_eos {
        tokenizer.with_post_processor(Some(template(&tokens, &special)?));
    }
    Ok(tokenizer)
}

/// A merge `"a b"`: split at the first space after the first character (llama.cpp's rule).
fn split_merge(s: &str) -> R<(String, String)> {
    let first = s.chars().next().map_or(0, char::len_utf8);
    match s[first..].find(' ') {
        Some(at) => Ok((s[..first + at].to_string(), s[first + at + 1..].to_string())),
        None => Err(format!("merge {s:?} has no space separating its two parts")),
    }
}

/// GPT-2's byte → printable character table (`bytes_to_unicode`).
fn bytes_to_unicode() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut extra = 0u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = (b'!'..=b'~').contains(&(b as u8))
            || (0xA1..=0xAC).contains(&b)
            || (0xAE..=0xFF).contains(&b);
        let code = if printable {
            b as u32
        } else {
            extra += 1;
            255 + extra
        };
        *slot = char::from_u32(code).unwrap_or('\0');
    }
    table
}

fn byte_level(
    tokens: &[&str],
    merges: Option<Vec<(String, String)>>,
    scores: Option<&[f64]>,
    pre: PreKind,
) -> R<Tokenizer> {
    // Tokens spelled outside the byte alphabet are respelled byte by byte (transformers does the
    // same), so every vocabulary entry is reachable.
    let table = bytes_to_unicode();
    let alphabet: HashSet<char> = table.iter().copied().collect();
    let spelled: Vec<String> = tokens
        .iter()
        .map(|t| {
            if t.chars().all(|c| alphabet.contains(&c)) {
                t.to_string()
            } else {
                t.bytes().map(|b| table[b as usize]).collect()
            }
        })
        .collect();
    let merges = match merges {
        Some(m) => m,
        None => {
            let scores =
                scores.ok_or("a gpt2 vocabulary without `tokenizer.ggml.merges` or scores")?;
            let refs: Vec<&str> = spelled.iter().map(String::as_str).collect();
            generate_merges(&refs, Some(scores))
        }
    };
    let vocab: Vocab = spelled
        .into_iter()
        .enumerate()
        .map(|(i, t)| (t, i as u32))
        .collect();
    let ignore_merges = matches!(pre, PreKind::Split(_, true));
    let bpe = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .ignore_merges(ignore_merges)
        .build()
        .map_err(|e| format!("invalid BPE vocabulary / merges: {e}"))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let pre_tokenizer = match pre {
        PreKind::Gpt2 => PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
        PreKind::DigitsGpt2 => PreTokenizerWrapper::Sequence(PreSequence::new(vec![
            PreTokenizerWrapper::Digits(Digits::new(true)),
            PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, true)),
        ])),
        PreKind::Split(regex, _) => {
            let split = Split::new(
                SplitPattern::Regex(regex.to_string()),
                SplitDelimiterBehavior::Isolated,
                false,
            )
            .map_err(|e| format!("pre-tokenizer regex: {e}"))?;
            PreTokenizerWrapper::Sequence(PreSequence::new(vec![
                PreTokenizerWrapper::Split(split),
                PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, true, false)),
            ]))
        }
    };
    tokenizer.with_pre_tokenizer(Some(pre_tokenizer));
    tokenizer.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));
    Ok(tokenizer)
}

fn sentencepiece(
    tokens: &[&str],
    merges: Option<Vec<(String, String)>>,
    scores: Option<&[f64]>,
    special: &SpecialTokens,
    add_prefix: bool,
) -> R<Tokenizer> {
    let merges = merges.unwrap_or_else(|| generate_merges(tokens, scores));
    let vocab: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| (t.to_string(), i as u32))
        .collect();
    let mut builder = BPE::builder()
        .vocab_and_merges(vocab, merges)
        .fuse_unk(true)
        .byte_fallback(true);
    if let Some(unk) = special.unk {
        builder = builder.unk_token(tokens[unk as usize].to_string());
    }
    let bpe = builder
        .build()
        .map_err(|e| format!("invalid BPE vocabulary / merges: {e}"))?;
    let mut tokenizer = Tokenizer::new(bpe);
    let scheme = if add_prefix {
        PrependScheme::First
    } else {
        PrependScheme::Never
    };
    tokenizer.with_pre_tokenizer(Some(PreTokenizerWrapper::Metaspace(Metaspace::new(
        '▁', scheme, false,
    ))));
    let replace = Replace::new("▁", " ").map_err(|e| format!("decoder: {e}"))?;
    let mut decoders = vec![
        DecoderWrapper::Replace(replace),
        DecoderWrapper::ByteFallback(ByteFallback::new()),
        DecoderWrapper::Fuse(Fuse::new()),
    ];
    if add_prefix {
        decoders.push(DecoderWrapper::Strip(Strip::new(' ', 1, 0)));
    }
    tokenizer.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(
        decoders,
    ))));
    Ok(tokenizer)
}

/// transformers' `generate_merges`: every split of every token into two tokens of the vocabulary,
/// best first — by the merged token's score (descending) when there are scores, else by its id
/// (ascending) — then by the pieces' lengths; ties keep vocabulary order.
fn generate_merges(tokens: &[&str], scores: Option<&[f64]>) -> Vec<(String, String)> {
    // A dict {token: last index}; iteration in first-appearance order.
    let mut vocab: HashMap<&str, usize> = HashMap::with_capacity(tokens.len());
    let mut order: Vec<&str> = Vec::with_capacity(tokens.len());
    for (i, t) in tokens.iter().enumerate() {
        if vocab.insert(t, i).is_none() {
            order.push(t);
        }
    }
    let key_of = |t: &str| -> f64 {
        let i = vocab[t];
        scores.map_or(i as f64, |s| s[i])
    };
    let mut merges: Vec<(&str, &str, f64)> = Vec::new();
    for merged in order {
        let score = key_of(merged);
        let mut local: Vec<(&str, &str, f64)> = merged
            .char_indices()
            .skip(1)
            .map(|(at, _)| merged.split_at(at))
            .filter(|(l, r)| vocab.contains_key(l) && vocab.contains_key(r))
            .map(|(l, r)| (l, r, score))
            .collect();
        local.sort_by_key(|(l, r, _)| (vocab[l], vocab[r]));
        merges.extend(local);
    }
    let key = |m: &(&str, &str, f64)| (m.2, m.0.chars().count(), m.1.chars().count());
    let cmp = |a: &(&str, &str, f64), b: &(&str, &str, f64)| {
        let (ka, kb) = (key(a), key(b));
        ka.0.partial_cmp(&kb.0)
            .unwrap_or(std::cmp::Ordering::Equal)
            .then(ka.1.cmp(&kb.1))
            .then(ka.2.cmp(&kb.2))
    };
    if scores.is_some() {
        merges.sort_by(|a, b| cmp(b, a));
    } else {
        merges.sort_by(cmp);
    }
    merges
        .into_iter()
        .map(|(l, r, _)| (l.to_string(), r.to_string()))
        .collect()
}

/// Control / unknown tokens and the declared special ids as special added tokens, user-defined
/// tokens as plain added tokens. In a byte-level vocabulary a control token spelled outside the
/// byte alphabet is a converter mislabel and is left out (as transformers does).
fn add_special_tokens(
    tokenizer: &mut Tokenizer,
    model: &str,
    tokens: &[&str],
    types: Option<&[i32]>,
    special: &SpecialTokens,
) {
    let alphabet: Option<HashSet<char>> =
        (model == "gpt2").then(|| bytes_to_unicode().into_iter().collect());
    let spelled_ok = |t: &str| {
        alphabet
            .as_ref()
            .is_none_or(|a| t.chars().all(|c| a.contains(&c)))
    };
    let declared: HashSet<u32> = [special.bos, special.eos, special.unk, special.pad]
        .into_iter()
        .flatten()
        .collect();
    let mut specials = Vec::new();
    let mut user = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let ty = types.map(|ty| ty[i]);
        let is_special =
            matches!(ty, Some(TOKEN_CONTROL | TOKEN_UNKNOWN)) || declared.contains(&(i as u32));
        if t.is_empty() {
            continue;
        }
        if is_special && spelled_ok(t) {
            specials.push(AddedToken::from(t.to_string(), true).normalized(false));
        } else if ty == Some(TOKEN_USER_DEFINED) {
            user.push(AddedToken::from(t.to_string(), false).normalized(false));
        }
    }
    tokenizer.add_special_tokens(&specials);
    tokenizer.add_tokens(&user);
}

/// `bos $A eos` (pair: `bos $A eos bos $B eos`) with the parts the flags ask for.
fn template(tokens: &[&str], special: &SpecialTokens) -> R<PostProcessorWrapper> {
    let mut parts: Vec<SpecialToken> = Vec::new();
    let mut piece = |flag: bool, id: Option<u32>, name: &str, what: &str| -> R<Option<String>> {
        if !flag {
            return Ok(None);
        }
        let id = id.ok_or_else(|| format!("add_{what}_token is set but no {what} token id"))?;
        let token = SpecialToken::new(
            name.to_string(),
            vec![id],
            vec![tokens[id as usize].to_string()],
        )
        .map_err(|e| e.to_string())?;
        parts.push(token);
        Ok(Some(name.to_string()))
    };
    let bos = piece(special.add_bos, special.bos, "[GGUF_BOS]", "bos")?;
    let eos = piece(special.add_eos, special.eos, "[GGUF_EOS]", "eos")?;
    let seq = |s: &str, type_id: u32| {
        let mut v = Vec::new();
        if let Some(b) = &bos {
            v.push(format!("{b}:{type_id}"));
        }
        v.push(format!("${s}:{type_id}"));
        if let Some(e) = &eos {
            v.push(format!("{e}:{type_id}"));
        }
        v.join(" ")
    };
    let single = seq("A", 0);
    let pair = format!("{single} {}", seq("B", 1));
    let processing = TemplateProcessing::builder()
        .try_single(single)
        .and_then(|b| b.try_pair(pair))
        .map_err(|e| format!("post-processor template: {e}"))?
        .special_tokens(parts)
        .build()
        .map_err(|e| format!("post-processor: {e}"))?;
    Ok(PostProcessorWrapper::Template(processing))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merges_split_at_first_space_after_first_char() {
        assert_eq!(
            split_merge("a b").unwrap(),
            ("a".to_string(), "b".to_string())
        );
        assert_eq!(
            split_merge("  x").unwrap(),
            (" ".to_string(), "x".to_string())
        );
        assert!(split_merge("ab").is_err());
    }

    #[test]
    fn byte_table_matches_gpt2() {
        let t = bytes_to_unicode();
        assert_eq!(t[b'a' as usize], 'a');
        assert_eq!(t[b' ' as usize], 'Ġ');
        assert_eq!(t[b'\n' as usize], 'Ċ');
        assert_eq!(t[0xAD], 'Ń');
        assert_eq!(t[0x7F], 'ġ');
    }

    #[test]
    fn generated_merges_follow_scores() {
        let tokens = ["a", "b", "c", "ab", "bc", "abc"];
        let scores = [0.0, 0.0, 0.0, -2.0, -1.0, -0.5];
        let m = generate_merges(&tokens, Some(&scores));
        let m: Vec<String> = m.iter().map(|(l, r)| format!("{l} {r}")).collect();
        // "abc" (score -0.5): "a"+"bc" and "ab"+"c" (sorted by the ids of the pieces, then
        // stable-sorted by score and lengths, longest first); then "bc", then "ab".
        assert_eq!(m, ["ab c", "a bc", "b c", "a b"]);
    }
}
