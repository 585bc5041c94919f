//! # ipfs-accelerate-t5
//!
//! A port of HF transformers' `modeling_t5.py` `T5ForConditionalGeneration`, generic over burn's
//! `Backend`: the shared embedding, encoder and decoder stacks of pre-norm blocks (RMS norm,
//! unscaled attention with a relative position bias learned by the first block and shared by the
//! others — bidirectional buckets in the encoder, causal ones in the decoder), the ReLU (T5) or
//! gated-GELU (T5 v1.1 / FLAN-T5) feed-forward, and the LM head (the shared embedding with the
//! `d_model^-0.5` rescale, or a separate `lm_head`).
//!
//! Generation runs through the shared loop of `ipfs_accelerate_nn::generate` with a
//! [`T5TokenDecoder`] that keeps self- and cross-attention keys and values in KV caches; text
//! input and output go through the checkpoint's `tokenizer.json` ([`T5Tasks::generate_text`]).

mod config;
mod generate;
mod model;
pub mod names;
mod runner;
mod spec;

pub use config::{preset, T5Config};
pub use generate::T5TokenDecoder;
pub use model::{DecoderCache, T5Inputs, T5};
pub use runner::{generate_ids, run_outputs, T5Executor, T5Family, T5Runner, T5Tasks};
pub use spec::{decoder_spec, encoder_stack_spec};
