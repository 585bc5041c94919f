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

use ipfs_accelerate_core::TensorSource;
use ipfs_accelerate_io::NameMap;

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

/// LLaVA checkpoints seen under the canonical names (see the module docs).
pub struct LlavaWeights;

impl LlavaWeights {
    /// A checkpoint's tensors under the canonical names: a [`NameMap`] with LLaVA's layouts.
    pub fn wrap(inner: Arc<dyn TensorSource>) -> NameMap {
        LAYOUT
            .iter()
            .fold(NameMap::new(inner), |m, (wanted, stored)| {
                m.layout(wanted, stored)
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_layouts_are_candidates() {
        let empty = ipfs_accelerate_io::WeightStore::from_files(Vec::new()).unwrap();
        let weights = LlavaWeights::wrap(empty.into_source());
        let c = weights.candidates("model.layers.0.mlp.up_proj.weight");
        assert_eq!(
            c,
            vec![
                "model.language_model.layers.0.mlp.up_proj.weight",
                "language_model.model.layers.0.mlp.up_proj.weight"
            ]
        );
        let v = weights.candidates("vision_tower.pre_layrnorm.weight");
        assert!(v.contains(&"vision_tower.vision_model.pre_layrnorm.weight".to_string()));
        assert_eq!(
            weights.candidates("lm_head.weight")[1],
            "language_model.lm_head.weight"
        );
        assert!(weights.candidates("unrelated").is_empty());
    }
}
