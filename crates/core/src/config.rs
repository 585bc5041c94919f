//! Model configurations read from HF `config.json` files.

use std::path::Path;

use crate::{Error, Result};

/// A configuration parsed from JSON (HF's `config.json`) and validated before use, so that an
/// unusable value is an [`Error::InvalidConfig`] naming the file, never a panic later.
pub trait JsonConfig: serde::de::DeserializeOwned {
    /// Checks the values are usable; `origin` names the file in errors.
    fn validate(&self, origin: &Path) -> Result<()>;

    /// Parses and validates config JSON (`origin` names it in errors).
    fn from_json(text: &str, origin: &Path) -> Result<Self> {
        let config: Self =
            serde_json::from_str(text).map_err(|e| Error::config(origin, e.to_string()))?;
        config.validate(origin)?;
        Ok(config)
    }

    /// Reads, parses and validates a config file.
    fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json(&text, path)
    }
}
