//! The tensor-name table of LLaVA checkpoints: the modules ask for one canonical name each, and
//! [`LlavaWeights`] finds it under any of the layouts HF has saved:
//!
//! | module | transformers 5.x | transformers 4.x (`llava-hf/*` on the hub) |
//! |---|---|---|
//! | vision tower | `model.vision_tower.…` | `vision_tower.vision_model.…` (also `vision_tower.…`) |
//! | projector | `model.multi_modal_projector.…` | `multi_modal_projector.…` |
//! | text model | `model.language_model.…` | `language_model.model.…` |
//! | LM head | `lm_head.…` | `language_model.lm_head.…` |
//! | newline | `model.image_newline` | `image_newline` |

use std::sync::Arc;

use ipfs_accelerate_core::{Error, HostTensor, Result, TensorSource};

/// Canonical prefixes the modules ask for, and where each may be stored (first match wins).
const LAYOUT: &[(&str, &[&str])] = &[
    (
        "vision_tower.",
        &[
            "model.vision_tower.",
            "model.vision_tower.vision_model.",
            "vision_tower.vision_model.",
            "vision_tower.",
        ],
    ),
    (
        "multi_modal_projector.",
        &["model.multi_modal_projector.", "multi_modal_projector."],
    ),
    // The LLaMA decoder asks for `model.*` and `lm_head.*`, as a causal-LM checkpoint stores them.
    (
        "model.",
        &["model.language_model.", "language_model.model."],
    ),
    ("lm_head.", &["lm_head.", "language_model.lm_head."]),
    ("image_newline", &["model.image_newline", "image_newline"]),
];

/// A LLaVA checkpoint seen under the canonical names (see the module docs).
pub struct LlavaWeights {
    inner: Arc<dyn TensorSource>,
}

impl LlavaWeights {
    /// Wraps a checkpoint's tensors.
    pub fn new(inner: Arc<dyn TensorSource>) -> Self {
        LlavaWeights { inner }
    }

    /// Every stored name `name` may have, in the order they are tried.
    pub fn candidates(name: &str) -> Vec<String> {
        LAYOUT
            .iter()
            .filter_map(|(want, stored)| {
                let rest = name.strip_prefix(want)?;
                Some(stored.iter().map(move |s| format!("{s}{rest}")))
            })
            .flatten()
            .collect()
    }

    fn lookup(&self, name: &str) -> Option<String> {
        Self::candidates(name)
            .into_iter()
            .find(|c| self.inner.contains(c))
    }
}

impl TensorSource for LlavaWeights {
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
            None => Err(Error::MissingTensor {
                name: format!(
                    "{name} (stored as any of: {})",
                    Self::candidates(name).join(", ")
                ),
                source_name: self.inner.source_name(),
            }),
        }
    }

    fn names(&self) -> Vec<String> {
        self.inner.names()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_are_candidates() {
        let c = LlavaWeights::candidates("model.layers.0.mlp.up_proj.weight");
        assert_eq!(
            c,
            vec![
                "model.language_model.layers.0.mlp.up_proj.weight",
                "language_model.model.layers.0.mlp.up_proj.weight"
            ]
        );
        let v = LlavaWeights::candidates("vision_tower.pre_layrnorm.weight");
        assert!(v.contains(&"vision_tower.vision_model.pre_layrnorm.weight".to_string()));
        assert_eq!(
            LlavaWeights::candidates("lm_head.weight")[1],
            "language_model.lm_head.weight"
        );
        assert!(LlavaWeights::candidates("unrelated").is_empty());
    }
}
