//! Model configurations read from HF `config.json` files.

use std::collections::BTreeMap;
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

/// The number of classes of an HF classification head: the size of `id2label` when the config
/// names its labels, else `num_labels`, else HF's default of 2.
pub fn label_count(id2label: &BTreeMap<String, String>, num_labels: Option<usize>) -> usize {
    if id2label.is_empty() {
        num_labels.unwrap_or(2)
    } else {
        id2label.len()
    }
}

/// The name of class `i` from `id2label` (`LABEL_i`, HF's default name, when absent).
pub fn label_name(id2label: &BTreeMap<String, String>, i: usize) -> String {
    id2label
        .get(&i.to_string())
        .cloned()
        .unwrap_or_else(|| format!("LABEL_{i}"))
}
