//! `config.json` and `generation_config.json` of Whisper checkpoints.

use std::collections::BTreeMap;
use std::path::Path;

use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::Activation;

/// The fields of HF's `WhisperConfig` this port uses.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct WhisperConfig {
    /// Vocabulary size.
    pub vocab_size: usize,
    /// Mel bins of the input features.
    pub num_mel_bins: usize,
    /// Model width.
    pub d_model: usize,
    /// Encoder layers.
    pub encoder_layers: usize,
    /// Encoder attention heads.
    pub encoder_attention_heads: usize,
    /// Encoder feed-forward size.
    pub encoder_ffn_dim: usize,
    /// Decoder layers.
    pub decoder_layers: usize,
    /// Decoder attention heads.
    pub decoder_attention_heads: usize,
    /// Decoder feed-forward size.
    pub decoder_ffn_dim: usize,
    /// Feed-forward activation.
    #[serde(default = "default_act")]
    pub activation_function: Activation,
    /// Encoder positions (input frames are twice this: conv2 has stride 2).
    pub max_source_positions: usize,
    /// Decoder positions.
    pub max_target_positions: usize,
    /// The token decoding starts from (`<|startoftranscript|>`).
    pub decoder_start_token_id: u32,
    /// End of text.
    #[serde(default)]
    pub eos_token_id: Option<u32>,
    /// Padding token.
    #[serde(default)]
    pub pad_token_id: Option<u32>,
    /// Whether `proj_out` shares the decoder's token embedding.
    #[serde(default = "default_true")]
    pub tie_word_embeddings: bool,
}

fn default_act() -> Activation {
    Activation::Gelu
}
fn default_true() -> bool {
    true
}

/// `nn.LayerNorm`'s default epsilon, which every Whisper layer norm uses.
pub const LAYER_NORM_EPS: f64 = 1e-5;

impl ipfs_accelerate_core::JsonConfig for WhisperConfig {
    fn validate(&self, origin: &Path) -> Result<()> {
        self.check(origin)
    }
}

impl WhisperConfig {
    fn check(&self, origin: &Path) -> Result<()> {
        let bad = |reason: String| Err(Error::config(origin, reason));
        for (name, v) in [
            ("vocab_size", self.vocab_size),
            ("num_mel_bins", self.num_mel_bins),
            ("d_model", self.d_model),
            ("encoder_attention_heads", self.encoder_attention_heads),
            ("encoder_ffn_dim", self.encoder_ffn_dim),
            ("decoder_attention_heads", self.decoder_attention_heads),
            ("decoder_ffn_dim", self.decoder_ffn_dim),
            ("max_source_positions", self.max_source_positions),
            ("max_target_positions", self.max_target_positions),
        ] {
            if v == 0 {
                return bad(format!("`{name}` must be positive"));
            }
        }
        for (name, heads) in [
            ("encoder_attention_heads", self.encoder_attention_heads),
            ("decoder_attention_heads", self.decoder_attention_heads),
        ] {
            if !self.d_model.is_multiple_of(heads) {
                return bad(format!(
                    "d_model {} is not divisible by {name} {heads}",
                    self.d_model
                ));
            }
        }
        for (name, id) in [
            ("decoder_start_token_id", Some(self.decoder_start_token_id)),
            ("eos_token_id", self.eos_token_id),
        ] {
            if let Some(id) = id {
                if id as usize >= self.vocab_size {
                    return bad(format!(
                        "{name} {id} is outside the vocabulary of {}",
                        self.vocab_size
                    ));
                }
            }
        }
        Ok(())
    }

    /// Input frames the encoder expects (`max_source_positions` × conv1 stride 1 × conv2 stride 2).
    pub fn input_frames(&self) -> usize {
        self.max_source_positions * 2
    }
}

/// The fields of `generation_config.json` that shape transcription.
#[derive(Debug, Clone, Default, serde::Deserialize)]
pub struct WhisperGenerationConfig {
    /// Longest decoder sequence (prompt included).
    #[serde(default)]
    pub max_length: Option<usize>,
    /// End of text (overrides the model config's).
    #[serde(default)]
    pub eos_token_id: Option<u32>,
    /// Tokens never generated.
    #[serde(default)]
    pub suppress_tokens: Vec<u32>,
    /// Tokens not generated as the first token.
    #[serde(default)]
    pub begin_suppress_tokens: Vec<u32>,
    /// `<|notimestamps|>`: requested after the task token, as timestamps are off.
    #[serde(default)]
    pub no_timestamps_token_id: Option<u32>,
    /// Whether the checkpoint takes a language token.
    #[serde(default)]
    pub is_multilingual: Option<bool>,
    /// Language tokens (`<|en|>` → id).
    #[serde(default)]
    pub lang_to_id: BTreeMap<String, u32>,
    /// Task tokens (`transcribe`, `translate` → id).
    #[serde(default)]
    pub task_to_id: BTreeMap<String, u32>,
}

impl WhisperGenerationConfig {
    /// Reads `generation_config.json`.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        serde_json::from_str(&text).map_err(|e| Error::config(path, e.to_string()))
    }

    /// The file in `dir` when present, the defaults otherwise.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("generation_config.json");
        if path.is_file() {
            Self::from_file(&path)
        } else {
            Ok(Self::default())
        }
    }

    /// Whether the checkpoint expects a language token after `<|startoftranscript|>`.
    pub fn multilingual(&self) -> bool {
        self.is_multilingual.unwrap_or(!self.lang_to_id.is_empty())
    }

    /// Checks every token id is in a vocabulary of `vocab` entries.
    pub fn validate(&self, vocab: usize, origin: &Path) -> Result<()> {
        let ids = self
            .suppress_tokens
            .iter()
            .chain(&self.begin_suppress_tokens)
            .chain(self.eos_token_id.iter())
            .chain(self.no_timestamps_token_id.iter())
            .chain(self.lang_to_id.values())
            .chain(self.task_to_id.values());
        for &id in ids {
            if id as usize >= vocab {
                return Err(Error::config(
                    origin,
                    format!("token id {id} is outside the vocabulary of {vocab}"),
                ));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipfs_accelerate_core::JsonConfig;

    const TINY: &str = r#"{"vocab_size": 99, "num_mel_bins": 16, "d_model": 32,
        "encoder_layers": 2, "encoder_attention_heads": 4, "encoder_ffn_dim": 37,
        "decoder_layers": 2, "decoder_attention_heads": 4, "decoder_ffn_dim": 37,
        "max_source_positions": 30, "max_target_positions": 40,
        "decoder_start_token_id": 96, "eos_token_id": 97}"#;

    #[test]
    fn parses_and_rejects_bad_configs() {
        let c = WhisperConfig::from_json(TINY, Path::new("t")).unwrap();
        assert_eq!(c.input_frames(), 60);
        assert!(c.tie_word_embeddings);
        assert_eq!(c.activation_function, Activation::Gelu);
        for (from, to) in [
            ("\"d_model\": 32", "\"d_model\": 30"),
            (
                "\"decoder_start_token_id\": 96",
                "\"decoder_start_token_id\": 99",
            ),
            (
                "\"vocab_size\": 99,",
                "\"vocab_size\": 99, \"activation_function\": \"nope\",",
            ),
            ("\"vocab_size\": 99", "\"vocab_size\": 0"),
        ] {
            let text = TINY.replace(from, to);
            assert!(
                WhisperConfig::from_json(&text, Path::new("t")).is_err(),
                "{to}"
            );
        }
        let g = WhisperGenerationConfig {
            suppress_tokens: vec![120],
            ..Default::default()
        };
        assert!(g.validate(99, Path::new("t")).is_err());
    }
}
