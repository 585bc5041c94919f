//! # ipfs-accelerate-vit
//!
//! A port of HF transformers' `modeling_vit.py`, generic over burn's `Backend`: [`VitModel`]
//! (patch embedding as a reshape + matmul, CLS token, position embeddings — bicubically
//! interpolated for images of another size — the shared pre-LN encoder of
//! [`ipfs_accelerate_nn::transformer`], final layer norm, optional pooler) and the
//! `ViTForImageClassification` head, with [`VitTasks::classify`] returning the top-k labels.
//!
//! Checkpoints load as `save_pretrained` writes them (`encoder.layer.N.attention.attention.query`,
//! with the `vit.` prefix of task heads) or in transformers 5's module layout (`layers.N`).

mod config;
mod encoder_spec;
mod model;
mod runner;

pub use config::{Size2, VitConfig, VitHead};
pub use encoder_spec::{encoder_spec, encoder_spec_from};
pub use model::{Vit, VitLayout, VitModel, VitOutput};
pub use runner::{top_predictions, Prediction, VitFamily, VitRunner, VitTasks};
