//! Image preprocessing as HF transformers' image processors do it (the torchvision backend of
//! transformers 5.x): decode PNG / JPEG into RGB ([`decode_image`], with header dimensions checked
//! against [`DecodeLimits`] before decoding), then per [`ImageProcessorConfig`] (parsed from
//! `preprocessor_config.json`):
//!
//! 1. resize by a [`SizeRule`] (fixed size, shortest edge, shortest + longest edge, longest edge,
//!    max height / width) with an antialiased, separable resampler ([`resize`]) that computes what
//!    PIL / torchvision compute on 8-bit images;
//! 2. centre crop ([`center_crop`], zero-padding images smaller than the crop);
//! 3. rescale (`× 1/255`) and normalise by mean / std into channels-first floats
//!    ([`Normalization`]);
//! 4. batch: [`ImageProcessor::preprocess`] stacks `[batch, 3, H, W]`; DETR pads to the batch's
//!    largest image and returns `pixel_mask` ([`pad_batch`]); LLaVA-NeXT cuts each image into
//!    anyres views ([`anyres_views`], [`select_best_resolution`]) and returns `image_sizes`.
//!
//! ```no_run
//! use ipfs_accelerate_preprocess::image::{load_image, ImageProcessor};
//! # fn main() -> Result<(), ipfs_accelerate_preprocess::image::ImageError> {
//! let processor = ImageProcessor::from_file("model/preprocessor_config.json")?;
//! let batch = processor.preprocess(&[load_image("cat.jpg")?])?;
//! let inputs = batch.into_tensor_map(); // pixel_values (+ pixel_mask / image_sizes)
//! # let _ = inputs; Ok(()) }
//! ```

mod anyres;
mod config;
mod decode;
mod error;
mod ops;
mod processor;
mod resize;

pub use anyres::{anyres_views, patch_output_size, select_best_resolution};
pub use config::{ImageProcessorConfig, ProcessorKind};
pub use decode::{decode_image, decode_image_with_limits, load_image, DecodeLimits, RgbImage};
pub use error::{ImageError, ImageResult};
pub use ops::{center_crop, crop, pad_batch, pad_u8, FloatImage, Normalization, SizeRule};
pub use processor::{stack, ImageProcessor, ProcessedImages};
pub use resize::{resize, resize_u8, Resample};
