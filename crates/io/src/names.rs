//! Tensor-name mapping between checkpoints and model definitions.

use std::sync::Arc;

use ipfs_accelerate_core::{HostTensor, Result, TensorSource};

/// A view of a [`TensorSource`] under the names a model asks for: an optional prefix that is tried
/// first (`bert.` for task heads), and suffix aliases for legacy checkpoints (`LayerNorm.gamma` for
/// `LayerNorm.weight`). One table per family lives in the model crate; this is the mechanism.
#[derive(Clone)]
pub struct NameMap {
    inner: Arc<dyn TensorSource>,
    aliases: Vec<(String, String)>,
}

impl NameMap {
    /// Wraps a source with no aliases.
    pub fn new(inner: Arc<dyn TensorSource>) -> Self {
        NameMap {
            inner,
            aliases: Vec::new(),
        }
    }

    /// Adds a suffix alias: a request for a name ending in `wanted` falls back to the same name
    /// ending in `stored` when only that exists.
    pub fn alias(mut self, wanted: &str, stored: &str) -> Self {
        self.aliases.push((wanted.to_string(), stored.to_string()));
        self
    }

    fn lookup(&self, name: &str) -> Option<String> {
        if self.inner.contains(name) {
            return Some(name.to_string());
        }
        self.aliases.iter().find_map(|(wanted, stored)| {
            let base = name.strip_suffix(wanted.as_str())?;
            let candidate = format!("{base}{stored}");
            self.inner.contains(&candidate).then_some(candidate)
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
            None => self.inner.tensor(name),
        }
    }

    fn names(&self) -> Vec<String> {
        self.inner.names()
    }

    fn tensor_shaped(&self, name: &str, expected: &[usize]) -> Result<HostTensor> {
        match self.lookup(name) {
            Some(n) => self.inner.tensor_shaped(&n, expected),
            None => self.inner.tensor_shaped(name, expected),
        }
    }
}
