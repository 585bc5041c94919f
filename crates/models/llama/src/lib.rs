//! # ipfs-accelerate-llama
//!
//! A port of HF transformers' `modeling_llama.py` and `modeling_qwen2.py` (one decoder, two
//! configurations), generic over burn's `Backend`: RMSNorm, rotary embeddings (default, linear,
//! dynamic and llama3 scaling), grouped-query attention with Qwen2's q / k / v biases and sliding
//! window, the SiLU-gated MLP, tied or untied `lm_head`, causal and left-padding masks.
//!
//! [`LlamaDecoder`] implements the shared [`TokenDecoder`](ipfs_accelerate_nn::generate::TokenDecoder)
//! over a KV cache, so [`LlamaRunner::generate`] streams tokens through the shared generation loop.
//! [`LlamaRunner::from_gguf`] loads llama.cpp GGUF files ([`LlamaConfig::from_gguf`],
//! [`GgufWeights`]). [`LlamaFamily`] and [`Qwen2Family`] plug both into the conformance runner.

mod config;
mod decoder;
pub mod gguf;
mod model;
mod runner;
mod spec;

pub use config::{Architecture, LlamaConfig, TokenIds};
pub use decoder::{left_padded, DecodeMode, LeftPadded, LlamaDecoder};
pub use gguf::GgufWeights;
pub use model::{positions_from_mask, DecoderInput, LlamaModel};
pub use runner::{
    check_vocab, forward_inputs, greedy_steps, greedy_tokens, read_chat_template, run_causal_lm,
    same_shape_ids, token_matrix, ForwardInputs, LlamaFamily, LlamaRunner, Qwen2Family,
    TextGeneration,
};
pub use spec::{decoder_spec, decoder_spec_from, decoder_spec_keeping_blocks};
