//! # ipfs-accelerate-clap
//!
//! A port of HF transformers' `modeling_clap.py` (`ClapModel` without feature fusion, e.g.
//! `laion/clap-htsat-unfused`), generic over burn's `Backend`:
//!
//! - the text tower ([`ClapTextModel`]): RoBERTa, i.e. the BERT encoder of
//!   `ipfs-accelerate-bert` with positions counted from `pad_token_id + 1` and BERT's pooler;
//! - the audio tower ([`HtsatEncoder`]): batch norm over mel bins, `reshape_mel2img` (bicubic
//!   resize with `align_corners=True`), patch embedding, Swin stages with shifted windows and
//!   patch merging, final norm and the token mean HF uses as `pooler_output`;
//! - both `ClapProjectionLayer`s, L2-normalised embeddings and `logits_per_audio` /
//!   `logits_per_text` scaled by `exp(logit_scale_a)` / `exp(logit_scale_t)`.
//!
//! Raw audio goes through [`ipfs_accelerate_preprocess::audio::ClapFeatureExtractor`] (HF's
//! non-fusion path: repeat-padding, Slaney mels, dB). Checkpoints with `enable_fusion` are a
//! typed [`ipfs_accelerate_core::Error::InvalidConfig`].
//!
//! Tasks ([`ClapTasks`]): text and audio embeddings, zero-shot audio classification, features
//! from a WAV file (decoded, resampled to the extractor's rate).
//!
//! ```no_run
//! use burn_flex::Flex;
//! use ipfs_accelerate_clap::{ClapRunner, ClapTasks};
//! use ipfs_accelerate_core::{BackendKind, TokenBatch};
//!
//! # fn main() -> ipfs_accelerate_core::Result<()> {
//! let clap = ClapRunner::<Flex>::load_dir(
//!     "clap-htsat-unfused".as_ref(),
//!     &Default::default(),
//!     BackendKind::Cpu,
//! )?;
//! // One tokenised prompt per label ("the sound of a dog", "the sound of rain"), padded.
//! let labels = TokenBatch {
//!     batch: 2,
//!     seq: 8,
//!     input_ids: vec![0, 627, 2369, 9, 10, 2335, 2, 1, 0, 627, 2369, 9, 1895, 2, 1, 1],
//!     attention_mask: vec![1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0, 0],
//! };
//! let probabilities = clap.classify_wav("bark.wav".as_ref(), &labels)?;
//! println!("{probabilities:?}");
//! # Ok(())
//! # }
//! ```

mod config;
mod htsat;
mod model;
mod runner;
mod spec;
mod text;

pub use config::{ClapAudioConfig, ClapConfig, ClapTextConfig, HtsatGeometry, IntOrPair};
pub use htsat::{relative_position_index, shifted_window_mask, HtsatEncoder};
pub use model::{l2_rows, ClapModel, ClapOutput, ClapProjection};
pub use runner::{feature_extractor_for, ClapFamily, ClapRunner, ClapTasks};
pub use spec::text_encoder_spec;
pub use text::ClapTextModel;
