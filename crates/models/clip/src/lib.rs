//! # ipfs-accelerate-clip
//!
//! A port of HF transformers' `modeling_clip.py` (`CLIPModel`), generic over burn's `Backend`:
//! the text tower (token + position embeddings, causal pre-LN encoder with the attention mask,
//! final layer norm, pooled at the first `eos_token_id` — or the largest id for the legacy
//! `eos_token_id == 2`), the vision tower (patch embedding, class embedding, `pre_layrnorm`,
//! encoder, `post_layernorm` on the class token; position embeddings interpolated for other image
//! sizes), both projections and `logit_scale`. Both towers share the pre-LN layer of
//! [`ipfs_accelerate_nn::transformer`]; [`ClipVisionTransformer`] is public for LLaVA.
//!
//! Tasks ([`ClipTasks`]): normalised text and image embeddings, and zero-shot classification
//! (label prompts → probabilities, the softmax of `logits_per_image`).

mod config;
mod model;
mod runner;
mod spec;
mod towers;

pub use config::{check_tower, ClipConfig, ClipTextConfig, ClipVisionConfig, TokenIds};
pub use model::{
    l2_normalize, load_logit_scale, ClipModel, ClipOutput, ClipTextInputs, ClipTextTransformer,
    ClipVisionTransformer,
};
pub use runner::{ClipFamily, ClipRunner, ClipTasks};
pub use spec::{
    describe_encoder, describe_text, describe_text_projection, describe_vision,
    describe_vision_projection, encoder_specs, text_encoder_spec, text_tower_spec,
    vision_encoder_spec, vision_hidden_state_spec, vision_tower_spec,
};
pub use towers::TowerRunner;
