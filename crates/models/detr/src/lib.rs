//! # ipfs-accelerate-detr
//!
//! A port of HF transformers' `DetrForObjectDetection` (`modeling_detr.py`) with the HF ResNet
//! backbone (`modeling_resnet.py`, basic or bottleneck layers, batch norms frozen), generic over
//! burn's `Backend`: backbone → 1x1 input projection → post-norm transformer encoder with sine (or
//! learned) 2-D position embeddings honouring the pixel mask → decoder over learned object queries
//! → class logits (`num_labels + 1`, the last is "no object") and sigmoid boxes.
//!
//! Post-processing follows `DetrImageProcessor.post_process_object_detection`
//! ([`post_process_object_detection`]); [`DetrTasks::detect`] is the task API. Timm backbones are
//! rejected with a typed config error.

mod backbone;
mod config;
mod model;
pub mod position;
pub mod post;
mod runner;

pub use backbone::ResNetBackbone;
pub use config::{DetrConfig, ResNetConfig, ResNetLayerType, BATCH_NORM_EPS, LAYER_NORM_EPS};
pub use model::{Detr, DetrOutput};
pub use post::{post_outputs, DEFAULT_THRESHOLD};
pub use post::{post_process_object_detection, Detection};
pub use runner::{DetrFamily, DetrRunner, DetrTasks, HostDetections};
