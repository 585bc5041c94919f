//! Tensor-name mapping between checkpoints and model definitions.

use std::sync::Arc;

use ipfs_accelerate_core::{Error, HostTensor, Result, TensorSource};

/// A view of a [`TensorSource`] under the names a model asks for: suffix aliases for legacy
/// checkpoints (`LayerNorm.gamma` for `LayerNorm.weight`), and prefix layouts for checkpoints
/// saved under several module trees (LLaVA's `language_model.model.` or `model.language_model.`
/// for `model.`). One table per family lives in the model crate; this is the mechanism.
#[derive(Clone)]
pub struct NameMap {
    inner: Arc<dyn TensorSource>,
    aliases: Vec<(String, String)>,
    layouts: Vec<(String, Vec<String>)>,
}

impl NameMap {
    /// Wraps a source with no aliases.
    pub fn new(inner: Arc<dyn TensorSource>) -> Self {
        NameMap {
            inner,
            aliases: Vec::new(),
            layouts: Vec::new(),
        }
    }

    /// Adds a prefix layout: a request for a name starting with `wanted` is looked up as each of
    /// `stored` followed by the rest of the name, first match wins (the name itself only when
    /// `wanted` is among `stored`); a miss names every candidate.
    pub fn layout(mut self, wanted: &str, stored: &[&str]) -> Self {
        let stored = stored.iter().map(|s| s.to_string()).collect();
        self.layouts.push((wanted.to_string(), stored));
        self
    }

    /// Every stored name the prefix layouts give `name`, in the order they are tried (empty when
    /// no layout applies).
    pub fn candidates(&self, name: &str) -> Vec<String> {
        self.layouts
            .iter()
            .filter_map(|(wanted, stored)| {
                let rest = name.strip_prefix(wanted.as_str())?;
                Some(stored.iter().map(move |s| format!("{s}{rest}")))
            })
            .flatten()
            .collect()
    }

    /// Adds a suffix alias: a request for a name ending in `wanted` falls back to the same name
    /// ending in `stored` when only that exists.
    pub fn alias(mut self, wanted: &str, stored: &str) -> Self {
        self.aliases.push((wanted.to_string(), stored.to_string()));
        self
    }

    /// The stored name a request for `name` reads, if any: the first present candidate of the
    /// prefix layouts when one applies, else `name` itself or its first present suffix alias.
    pub fn lookup(&self, name: &str) -> Option<String> {
        let candidates = self.candidates(name);
        if !candidates.is_empty() {
            return candidates.into_iter().find(|c| self.inner.contains(c));
        }
        if self.inner.contains(name) {
            return Some(name.to_string());
        }
        self.aliases.iter().find_map(|(wanted, stored)| {
            let base = name.strip_suffix(wanted.as_str())?;
            let candidate = format!("{base}{stored}");
            self.inner.contains(&candidate).then_some(candidate)
        })
    }

    /// The error of a request for `name` that a prefix layout covers but nothing matched.
    fn missing(&self, name: &str) -> Option<Error> {
        let candidates = self.candidates(name);
        (!candidates.is_empty()).then(|| Error::MissingTensor {
            name: format!("{name} (stored as any of: {})", candidates.join(", ")),
            source_name: self.inner.source_name(),
        })
    }
}

impl TensorSource for NameMap {
    fn source_name(&self) -> String {
        self.inner.source_name()
    }

    fn contains(&self, name: &str) -> bool {
        self.lookup(name).is_some()
    }

    fn shape_of(&self, name: &str) -> Option<Vec<usize>> {
        self.lookup(name).and_then(|n| self.inner.shape_of(&n))
    }

    fn tensor(&self, name: &str) -> Result<HostTensor> {
        match self.lookup(name) {
            Some(n) => self.inner.tensor(&n),
            None => self
                .missing(name)
                .map_or_else(|| self.inner.tensor(name), Err),
        }
    }

    fn names(&self) -> Vec<String> {
        self.inner.names()
    }

    /// The inner source's identity with this map's tables: equal maps over equal sources serve
    /// the same tensors under the same names.
    fn identity(&self) -> Option<String> {
        let inner = self.inner.identity()?;
        Some(format!(
            "{inner}|aliases {:?}|layouts {:?}",
            self.aliases, self.layouts
        ))
    }

    fn tensor_shaped(&self, name: &str, expected: &[usize]) -> Result<HostTensor> {
        match self.lookup(name) {
            Some(n) => self.inner.tensor_shaped(&n, expected),
            None => self
                .missing(name)
                .map_or_else(|| self.inner.tensor_shaped(name, expected), Err),
        }
    }
}
