//! Where a model's files come from: local / cached / downloaded files, or the embedded default.

use std::path::PathBuf;
use std::sync::Arc;

use ipfs_accelerate_core::TensorSource;
use ipfs_accelerate_io::{resolve, ModelFiles, ResolveOptions, WeightStore};
use ipfs_accelerate_preprocess::TextTokenizer;

use crate::Result;

/// The model spec that selects the embedded default model.
pub const EMBEDDED_SPEC: &str = "embedded";

/// The hub repository the embedded default is made from, fetched (once, then cached) in builds
/// from the published crate, which leaves the 23 MB of weights out (crates.io takes 10 MB).
pub const EMBEDDED_HUB_ID: &str = "sentence-transformers/all-MiniLM-L6-v2";

/// The embedded default model: all-MiniLM-L6-v2 with int8 block-quantised weights (Apache-2.0,
/// sentence-transformers), dequantised at load. ~23 MB inside the binary, no network needed.
/// Compiled in with feature `embedded-default` when the crate's `assets/` folder is there (a
/// clone of the repository; the published crate leaves it out and fetches [`EMBEDDED_HUB_ID`]).
#[cfg(embedded_assets)]
pub mod embedded {
    /// A readable name.
    pub const NAME: &str = "all-MiniLM-L6-v2 (embedded, int8 blocks + f16 scales)";
    /// config.json.
    pub static CONFIG: &str = include_str!("../assets/all-MiniLM-L6-v2-int8/config.json");
    /// tokenizer.json.
    pub static TOKENIZER: &[u8] = include_bytes!("../assets/all-MiniLM-L6-v2-int8/tokenizer.json");
    /// sentence-transformers' 1_Pooling/config.json.
    pub static POOLING: &str = include_str!("../assets/all-MiniLM-L6-v2-int8/pooling_config.json");
    /// The compact weights.
    pub static WEIGHTS: &[u8] = include_bytes!("../assets/all-MiniLM-L6-v2-int8/model.safetensors");
    /// sentence-transformers' max_seq_length.
    pub const MAX_SEQ_LENGTH: usize = 256;
}

/// A resolved model.
pub(crate) enum Assets {
    Files(ModelFiles),
    #[cfg(embedded_assets)]
    Embedded,
}

impl Assets {
    pub(crate) fn resolve(spec: &str, options: ResolveOptions) -> Result<Assets> {
        if spec == EMBEDDED_SPEC {
            #[cfg(embedded_assets)]
            return Ok(Assets::Embedded);
            #[cfg(all(feature = "embedded-default", not(embedded_assets)))]
            return Ok(Assets::Files(resolve(EMBEDDED_HUB_ID, options)?));
            #[cfg(not(feature = "embedded-default"))]
            return Err(crate::Error::Unsupported(
                "this build has no embedded default model (feature `embedded-default`)".into(),
            ));
        }
        Ok(Assets::Files(resolve(spec, options)?))
    }

    /// The local folder of the model's files (`None` for the embedded model).
    #[allow(dead_code)] // used by the ONNX path of the pipeline
    pub(crate) fn dir(&self) -> Option<PathBuf> {
        match self {
            Assets::Files(f) => f
                .get("config.json")
                .ok()
                .and_then(|c| c.parent().map(std::path::Path::to_path_buf)),
            #[cfg(embedded_assets)]
            Assets::Embedded => None,
        }
    }

    pub(crate) fn name(&self) -> String {
        match self {
            Assets::Files(f) => f.display_name(),
            #[cfg(embedded_assets)]
            Assets::Embedded => embedded::NAME.to_string(),
        }
    }

    /// `config.json` text and a path naming it in errors.
    pub(crate) fn config(&self) -> Result<(String, PathBuf)> {
        match self {
            Assets::Files(f) => {
                let p = f.get("config.json")?;
                let text = std::fs::read_to_string(&p)
                    .map_err(|e| ipfs_accelerate_core::Error::io(&p, e))?;
                Ok((text, p))
            }
            #[cfg(embedded_assets)]
            Assets::Embedded => Ok((
                embedded::CONFIG.to_string(),
                PathBuf::from("embedded config.json"),
            )),
        }
    }

    pub(crate) fn weights(&self) -> Result<Arc<dyn TensorSource>> {
        match self {
            Assets::Files(f) => Ok(WeightStore::open(&f.weight_files()?)?.into_source()),
            #[cfg(embedded_assets)]
            Assets::Embedded => Ok(Arc::new(ipfs_accelerate_io::SafeTensorsFile::from_bytes(
                "embedded model.safetensors",
                bytes_static(embedded::WEIGHTS),
            )?)),
        }
    }

    /// The tokenizer, if the model ships one.
    pub(crate) fn tokenizer(&self, max_len: usize) -> Result<Option<TextTokenizer>> {
        match self {
            Assets::Files(f) => match f.get_optional("tokenizer.json")? {
                Some(p) => Ok(Some(TextTokenizer::from_file(&p, max_len)?)),
                None => Ok(None),
            },
            #[cfg(embedded_assets)]
            Assets::Embedded => Ok(Some(TextTokenizer::from_bytes(
                embedded::TOKENIZER,
                max_len,
            )?)),
        }
    }

    /// An optional text file of the model (`1_Pooling/config.json`, ...).
    pub(crate) fn optional_text(&self, file: &str) -> Result<Option<(String, PathBuf)>> {
        match self {
            Assets::Files(f) => match f.get_optional(file)? {
                Some(p) => {
                    let text = std::fs::read_to_string(&p)
                        .map_err(|e| ipfs_accelerate_core::Error::io(&p, e))?;
                    Ok(Some((text, p)))
                }
                None => Ok(None),
            },
            #[cfg(embedded_assets)]
            Assets::Embedded => Ok(match file {
                "1_Pooling/config.json" => {
                    Some((embedded::POOLING.to_string(), PathBuf::from(file)))
                }
                "sentence_bert_config.json" => Some((
                    format!("{{\"max_seq_length\": {}}}", embedded::MAX_SEQ_LENGTH),
                    PathBuf::from(file),
                )),
                _ => None,
            }),
        }
    }
}

#[cfg(embedded_assets)]
fn bytes_static(b: &'static [u8]) -> bytes::Bytes {
    bytes::Bytes::from_static(b)
}
