//! # ipfs-accelerate-nn
//!
//! Blocks every model family shares, written once over burn's `Backend` so they run on every backend:
//! [`VarBuilder`] (named weights with shape checks), [`Linear`], [`LayerNorm`], [`RmsNorm`],
//! [`Embedding`], [`Activation`] (every `hidden_act` HF configs use), attention helpers
//! ([`attention::padding_bias`], [`attention::split_heads`], [`attention::sdpa`]) and conversions
//! between [`HostTensor`](ipfs_accelerate_core::HostTensor) and burn tensors.

pub mod activation;
pub mod attention;
pub mod conv;
pub mod convert;
mod embedding;
pub mod exact;
pub mod fast;
pub mod generate;
pub mod ggml;
pub mod gptq;
pub mod kv_cache;
mod linear;
pub mod mlp;
mod norm;
pub mod position;
pub mod quant;
pub mod rope;
pub mod spec;
pub mod transformer;
pub mod trunk;
mod var_builder;
pub mod vision;
pub mod weights;

pub use activation::{Activation, ActivationForward};
pub use embedding::Embedding;
pub use kv_cache::KvCache;
pub use linear::Linear;
pub use norm::{LayerNorm, RmsNorm};
pub use quant::{LinearWeight, WeightQuantization};
pub use var_builder::VarBuilder;
pub use weights::{load_scope, LoadSettings, LoadedWeights, WeightStats};

/// Re-export of the burn backend trait models are generic over.
pub use burn::tensor::backend::Backend as BurnBackend;
