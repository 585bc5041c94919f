//! # ipfs-accelerate-preprocess
//!
//! Turning user input into model input. Text: [`TextTokenizer`] wraps HF `tokenizers` (tokenizer.json)
//! with batch padding to the longest row, truncation to the model's maximum length (reported, never
//! silent), sentence pairs for question answering, and character offsets for answer extraction.

mod text;

pub use text::{Encoded, PreprocessError, TextTokenizer};
