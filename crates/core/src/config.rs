//! Model configurations read from HF `config.json` files.

use std::collections::BTreeMap;
use std::path::Path;

use crate::{Error, Result};

/// A configuration parsed from JSON (HF's `config.json`) and validated before use, so that an
/// unusable value is an [`Error::InvalidConfig`] naming the file, never a panic later.
pub trait JsonConfig: serde::de::DeserializeOwned {
    /// Checks the values are usable; `origin` names the file in errors.
    fn validate(&self, origin: &Path) -> Result<()>;

    /// Parses and validates config JSON (`origin` names it in errors). Integers larger than
    /// `MAX_CONFIG_INTEGER` are refused before the typed parse, wherever they stand, so no size
    /// derived from a config can overflow when two of them are multiplied.
    fn from_json(text: &str, origin: &Path) -> Result<Self> {
        let value: serde_json::Value =
            serde_json::from_str(text).map_err(|e| Error::config(origin, e.to_string()))?;
        check_integers(&value, &mut String::new()).map_err(|r| Error::config(origin, r))?;
        let config: Self =
            serde_json::from_value(value).map_err(|e| Error::config(origin, e.to_string()))?;
        config.validate(origin)?;
        Ok(config)
    }

    /// Reads, parses and validates a config file.
    fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        Self::from_json(&text, path)
    }
}

/// The largest integer a model configuration may hold (2^32): far above any real dimension,
/// vocabulary or position count, and small enough that the product of two fits in 64 bits.
pub const MAX_CONFIG_INTEGER: u64 = 1 << 32;

/// Refuses integers beyond ±[`MAX_CONFIG_INTEGER`] anywhere in `value`, naming the key path.
fn check_integers(value: &serde_json::Value, path: &mut String) -> std::result::Result<(), String> {
    use serde_json::Value;
    match value {
        Value::Number(n) => {
            let too_large = match (n.as_u64(), n.as_i64()) {
                (Some(u), _) => u > MAX_CONFIG_INTEGER,
                (None, Some(i)) => i.unsigned_abs() > MAX_CONFIG_INTEGER,
                // Floats (eps, rope_theta, ...) are checked by each config's validation.
                (None, None) => false,
            };
            if too_large {
                return Err(format!(
                    "`{}` is {n}, beyond {MAX_CONFIG_INTEGER}, the largest size a configuration may hold",
                    if path.is_empty() { "value" } else { path.as_str() }
                ));
            }
            Ok(())
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                let len = path.len();
                path.push_str(&format!("[{i}]"));
                check_integers(item, path)?;
                path.truncate(len);
            }
            Ok(())
        }
        Value::Object(map) => {
            for (key, item) in map {
                let len = path.len();
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key);
                check_integers(item, path)?;
                path.truncate(len);
            }
            Ok(())
        }
        _ => Ok(()),
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

/// Softmax of one row of logits, on the host (the classifiers' probabilities).
pub fn softmax(logits: &[f32]) -> Vec<f32> {
    let max = logits.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|&l| (l - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}
