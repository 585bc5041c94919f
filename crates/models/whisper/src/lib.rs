//! # ipfs-accelerate-whisper
//!
//! A port of HF transformers' `modeling_whisper.py` (`WhisperForConditionalGeneration`), generic
//! over burn's `Backend`: the encoder (two GELU convolutions, the checkpoint's sinusoidal
//! positions, pre-LN layers), the decoder (learned positions, causal self-attention, cross-attention)
//! and `proj_out` tied to the token embedding. Generation runs through the shared loop of
//! `ipfs_accelerate_nn::generate` with a KV cache (self-attention appended per step,
//! cross-attention keys computed once), with Whisper's prompt (start of transcript, language,
//! task, no timestamps) and token suppression. [`WhisperRunner::transcribe`] goes from samples to
//! text: resampling, log-mel, encoder, greedy decoding, `tokenizer.json`.

mod config;
mod generate;
mod model;
mod runner;
mod spec;

pub use config::{WhisperConfig, WhisperGenerationConfig, LAYER_NORM_EPS};
pub use generate::{
    check_positions, check_prompts, pick_language, Suppressed, Suppression, WhisperTokenDecoder,
};
pub use model::{DecoderCache, Whisper, WhisperDecoder, WhisperEncoder};
pub use runner::{
    decode_outputs, TranscribeOptions, Transcription, WhisperAssets, WhisperExecutor,
    WhisperFamily, WhisperRunner, WhisperTasks,
};
pub use spec::{decoder_spec, describe_encoder, encoder_spec};
