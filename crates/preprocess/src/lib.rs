//! # ipfs-accelerate-preprocess
//!
//! Turning user input into model input. Text: [`TextTokenizer`] wraps HF `tokenizers` (tokenizer.json)
//! with batch padding to the longest row, truncation to the model's maximum length (reported, never
//! silent), sentence pairs for question answering, and character offsets for answer extraction.
//! Images: [`image`] decodes, resizes (PIL / torchvision-compatible), crops, normalises and batches
//! images as HF's image processors do (CLIP, ViT, DETR padding + pixel_mask, LLaVA-NeXT anyres).
//! Audio: [`audio`] decodes WAV, resamples, and computes Whisper log-mel / Wav2Vec2 input values.

pub mod audio;
pub mod image;
mod text;
pub mod video;

pub use text::{Encoded, PreprocessError, TextTokenizer};
