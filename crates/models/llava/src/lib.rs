//! # ipfs-accelerate-llava
//!
//! A port of HF transformers' `modeling_llava.py` (`LlavaForConditionalGeneration`, LLaVA-1.5) and
//! `modeling_llava_next.py` (`LlavaNextForConditionalGeneration`, LLaVA-NeXT / 1.6), generic over
//! burn's `Backend`:
//!
//! - the CLIP vision tower of [`ipfs_accelerate_clip`] read at `vision_feature_layer` (one index
//!   or a list whose hidden states are concatenated), the class token dropped with the `default`
//!   strategy;
//! - the multimodal projector (`linear_1` → `projector_hidden_act` → `linear_2`);
//! - LLaVA-NeXT's anyres packing ([`AnyresLayout`]): base view + tiles of the best
//!   `image_grid_pinpoints` resolution, tile features arranged as the image, unpadded to the
//!   original aspect ratio (HF's `unpad_image`) with `image_newline` after every row;
//! - the features spliced into the LLaMA / Mistral / Qwen2 decoder of [`ipfs_accelerate_llama`] at
//!   the `image_token_id` positions (a count mismatch is [`Error::InvalidInput`]); generation
//!   prefills the spliced embeddings and decodes with the KV cache through the shared loop of
//!   [`ipfs_accelerate_nn::generate`].
//!
//! Weights load from both HF layouts (transformers 5.x `model.language_model.*` and the 4.x
//! `language_model.model.*` of the hub checkpoints, see [`LlavaWeights`]). [`LlavaFamily`] and
//! [`LlavaNextFamily`] plug into the conformance runner (`logits`, `greedy_tokens`,
//! `image_feature_count`).
//!
//! ## Describing an image
//!
//! A checkpoint folder as the hub has it (`llava-hf/llava-1.5-7b-hf`,
//! `llava-hf/llava-v1.6-mistral-7b-hf`): `config.json`, safetensors, `preprocessor_config.json`,
//! `tokenizer.json`, and the chat template. [`LlavaProcessor`] formats the question with the
//! chat template, preprocesses the image, tokenises and expands `<image>`; the runner generates.
//!
//! ```no_run
//! use std::ops::ControlFlow;
//! use std::path::Path;
//!
//! use burn_flex::Flex;
//! use ipfs_accelerate_core::BackendKind;
//! use ipfs_accelerate_llava::{LlavaProcessor, LlavaRunner, LlavaTasks, LlavaVariant};
//! use ipfs_accelerate_preprocess::image::load_image;
//!
//! # fn main() -> ipfs_accelerate_core::Result<()> {
//! let dir = Path::new("llava-1.5-7b-hf");
//! let model =
//!     LlavaRunner::<Flex>::load_dir(dir, LlavaVariant::Llava, &Default::default(), BackendKind::Cpu)?;
//! let processor = LlavaProcessor::from_dir(dir)?;
//! let prompt = processor.chat_prompt("What is in this picture?", 1)?;
//! // "USER: <image>\nWhat is in this picture? ASSISTANT:"
//! let inputs = processor.prepare(&model, &[load_image("cat.jpg")?], &prompt)?;
//! let mut config = model.default_generation_config();
//! config.max_new_tokens = 64;
//! let mut ids = Vec::new();
//! LlavaTasks::generate(&model, &inputs, &config, &mut |t| {
//!     ids.push(t);
//!     if let Ok(text) = processor.decode(&ids) {
//!         eprint!("\r{text}");
//!     }
//!     ControlFlow::Continue(())
//! })?;
//! println!("{}", processor.decode(&ids)?);
//! # Ok(()) }
//! ```
//!
//! With token ids at hand, [`LlavaRunner::expand_image_tokens`] expands the placeholders and
//! [`LlavaRunner::generate`] takes `pixel_values` (and, for LLaVA-NeXT, `image_sizes`) directly.
//!
//! [`Error::InvalidInput`]: ipfs_accelerate_core::Error::InvalidInput

mod anyres;
mod config;
mod model;
mod names;
mod processor;
mod runner;
mod spec;

pub use anyres::{unpad_region, AnyresLayout, Unpad, MAX_SIDE};
pub use config::{resolve_layer, FeatureLayers, LlavaConfig, LlavaVariant, SelectStrategy};
pub use model::{read_image_sizes, LlavaModel, PromptTokens};
pub use names::LlavaWeights;
pub use processor::{render_chat_template, LlavaInputs, LlavaProcessor};
pub use runner::{
    expand_image_tokens, generate_ids_with, run_llava, stop_tokens, LlavaFamily, LlavaNextFamily,
    LlavaRunner, LlavaTasks,
};
pub use spec::{
    image_features_with, image_newline, image_slots, text_spec, tower_spec, ImageFeatures,
};
