//! Greedy CTC decoding to text, as HF's `Wav2Vec2CTCTokenizer.decode` on argmax ids: collapse
//! repeats, drop the blank (pad) token, the word delimiter `|` becomes a space, strip.

use std::collections::HashMap;
use std::path::Path;

use ipfs_accelerate_core::{Error, Result};
use serde_json::Value;

/// Collapses runs of equal ids and drops `blank`: the CTC path → label sequence.
pub fn ctc_collapse(ids: &[i64], blank: i64) -> Vec<i64> {
    let mut out = Vec::new();
    let mut prev = None;
    for &id in ids {
        if prev != Some(id) && id != blank {
            out.push(id);
        }
        prev = Some(id);
    }
    out
}

/// The vocabulary of a CTC checkpoint (`vocab.json` plus `tokenizer_config.json`).
#[derive(Debug, Clone, PartialEq)]
pub struct CtcVocab {
    tokens: HashMap<i64, String>,
    blank: i64,
    unk: String,
    word_delimiter: String,
    replace_word_delimiter: String,
    lower_case: bool,
}

fn token_string(v: Option<&Value>) -> Option<String> {
    match v? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

impl CtcVocab {
    /// `vocab.json` (token → id) and, when given, `tokenizer_config.json` (pad / unk / word
    /// delimiter tokens, `do_lower_case`). The blank is the pad token's id (`<pad>` by default).
    pub fn from_json(vocab: &str, tokenizer_config: Option<&str>, origin: &Path) -> Result<Self> {
        let bad = |reason: String| Error::config(origin, reason);
        let map: HashMap<String, Value> =
            serde_json::from_str(vocab).map_err(|e| bad(format!("vocab.json: {e}")))?;
        let mut tokens = HashMap::with_capacity(map.len());
        for (tok, id) in map {
            let id = id.as_i64().ok_or_else(|| {
                bad(format!(
                    "vocab.json: `{tok}` maps to {id}, not an id (per-language vocabularies are not supported)"
                ))
            })?;
            tokens.insert(id, tok);
        }
        let cfg: Value = match tokenizer_config {
            Some(t) => {
                serde_json::from_str(t).map_err(|e| bad(format!("tokenizer_config.json: {e}")))?
            }
            None => Value::Null,
        };
        let pad = token_string(cfg.get("pad_token")).unwrap_or_else(|| "<pad>".into());
        let blank = tokens
            .iter()
            .find(|(_, t)| **t == pad)
            .map(|(id, _)| *id)
            .ok_or_else(|| bad(format!("vocab.json has no pad (CTC blank) token `{pad}`")))?;
        Ok(CtcVocab {
            tokens,
            blank,
            unk: token_string(cfg.get("unk_token")).unwrap_or_else(|| "<unk>".into()),
            word_delimiter: token_string(cfg.get("word_delimiter_token"))
                .unwrap_or_else(|| "|".into()),
            replace_word_delimiter: cfg
                .get("replace_word_delimiter_char")
                .and_then(Value::as_str)
                .unwrap_or(" ")
                .to_string(),
            lower_case: cfg
                .get("do_lower_case")
                .and_then(Value::as_bool)
                .unwrap_or(false),
        })
    }

    /// Reads `vocab.json` (and `tokenizer_config.json` when present) from `dir`; `None` when the
    /// checkpoint has no `vocab.json`.
    pub fn from_dir(dir: &Path) -> Result<Option<Self>> {
        let vocab = dir.join("vocab.json");
        if !vocab.is_file() {
            return Ok(None);
        }
        let read = |p: &Path| std::fs::read_to_string(p).map_err(|e| Error::io(p, e));
        let tc = dir.join("tokenizer_config.json");
        let tc = if tc.is_file() { Some(read(&tc)?) } else { None };
        Self::from_json(&read(&vocab)?, tc.as_deref(), &vocab).map(Some)
    }

    /// The blank (pad) id.
    pub fn blank(&self) -> i64 {
        self.blank
    }

    /// Text of a frame-level argmax path.
    pub fn decode(&self, path: &[i64]) -> String {
        let text: String = ctc_collapse(path, self.blank)
            .iter()
            .map(|id| {
                let tok = self.tokens.get(id).unwrap_or(&self.unk);
                if *tok == self.word_delimiter {
                    self.replace_word_delimiter.as_str()
                } else {
                    tok.as_str()
                }
            })
            .collect();
        let text = text.trim();
        if self.lower_case {
            text.to_lowercase()
        } else {
            text.to_string()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: &str =
        r#"{"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3, "|": 4, "A": 5, "B": 6, "C": 7}"#;

    #[test]
    fn collapse_then_drop_blank() {
        assert_eq!(
            ctc_collapse(&[5, 5, 0, 5, 6, 6, 0, 0, 4, 7], 0),
            vec![5, 5, 6, 4, 7]
        );
        assert!(ctc_collapse(&[0, 0], 0).is_empty());
    }

    #[test]
    fn decodes_words() {
        let v = CtcVocab::from_json(VOCAB, None, Path::new("t")).unwrap();
        assert_eq!(v.blank(), 0);
        assert_eq!(v.decode(&[4, 5, 5, 0, 5, 6, 4, 4, 7, 0, 4]), "AAB C");
        assert_eq!(v.decode(&[99]), "<unk>");
        let lower = CtcVocab::from_json(
            &VOCAB.replace("<pad>", "[PAD]"),
            Some(r#"{"pad_token": {"content": "[PAD]"}, "do_lower_case": true}"#),
            Path::new("t"),
        )
        .unwrap();
        assert_eq!(lower.decode(&[5, 0, 6]), "ab");
        assert!(CtcVocab::from_json(r#"{"A": 1}"#, None, Path::new("t")).is_err());
        assert!(CtcVocab::from_json(r#"{"en": {"A": 1}}"#, None, Path::new("t")).is_err());
        assert!(CtcVocab::from_json("[", None, Path::new("t")).is_err());
    }
}
