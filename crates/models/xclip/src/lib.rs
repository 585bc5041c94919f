//! # ipfs-accelerate-xclip
//!
//! A port of HF transformers' `modeling_x_clip.py` (`XCLIPModel`), generic over burn's `Backend`:
//!
//! - the vision tower: CLIP vision embeddings per frame, `pre_layernorm`, then cross-frame layers
//!   (each frame's class token becomes a message token, the messages of one video attend to each
//!   other, every frame attends over its tokens plus its message, the MLP runs on the frame
//!   tokens), `post_layernorm` on the class tokens, `visual_projection`: one description
//!   ([`describe_vision`]) that the burn tower and the engines run;
//! - the multi-frame integration transformer (MIT): frame positions, a CLIP encoder
//!   ([`describe_mit`]), a residual and the mean over frames → `video_embeds`;
//! - the text side: CLIP's text tower ([`ipfs_accelerate_clip::ClipTextTransformer`], pooled at
//!   the largest token id as HF forces) and `text_projection`; the prompt generator lets every
//!   text attend to the frame-averaged patch tokens of each video (`prompts_visual_layernorm`,
//!   `prompts_visual_projection`), scaled by `alpha` and added to the text → per-video
//!   `text_embeds` `[videos, texts, dim]`;
//! - `logits_per_video = exp(logit_scale) · video · text` of the L2-normalised embeddings.
//!
//! Videos have exactly `vision_config.num_frames` frames (the cross-frame attention and the MIT
//! positions are built for that count); `ipfs_accelerate_preprocess::video` samples and loads
//! them.
//!
//! Tasks ([`XclipTasks`]): normalised video embeddings and video classification (label prompts →
//! probabilities, the softmax of `logits_per_video`).
//!
//! ```no_run
//! use std::path::Path;
//! use ipfs_accelerate_core::{BackendKind, HostTensor};
//! use ipfs_accelerate_xclip::{ClipTextInputs, XclipRunner, XclipTasks};
//! # fn main() -> ipfs_accelerate_core::Result<()> {
//! let xclip = XclipRunner::<burn_flex::Flex>::load_dir(
//!     Path::new("xclip-base-patch32"),
//!     &Default::default(),
//!     BackendKind::Cpu,
//! )?;
//! // [frames, 3, 224, 224] from ipfs_accelerate_preprocess::video::load_frames.
//! let frames = HostTensor::from_f32(vec![8, 3, 224, 224], &vec![0.0; 8 * 3 * 224 * 224])?;
//! // One tokenised prompt per label (padded rows + attention mask, or equal-length rows).
//! let labels = ClipTextInputs::from_rows(&[vec![49406, 2368, 49407], vec![49406, 1929, 49407]])?;
//! let probabilities = xclip.classify_video(&frames, &labels)?; // [videos][labels]
//! let embeddings = xclip.video_embeds(&frames)?; // [videos][projection_dim]
//! # let _ = (probabilities, embeddings); Ok(()) }
//! ```

mod config;
mod model;
mod runner;
mod spec;

pub use config::{XclipConfig, XclipVisionConfig};
pub use ipfs_accelerate_clip::ClipTextInputs;
pub use model::{
    XclipModel, XclipOutput, XclipVideoFeatures, XclipVisionOutput, XclipVisionTransformer,
};
pub use runner::{XclipFamily, XclipRunner, XclipTasks};
pub use spec::{describe_mit, describe_vision, mit_spec, text_encoder_spec, vision_encoder_spec};
