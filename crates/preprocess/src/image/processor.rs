//! The image processor: a resolved config applied to a batch of decoded images.

use std::borrow::Cow;
use std::path::Path;

use ipfs_accelerate_core::{HostTensor, TensorMap};

use super::anyres::anyres_views_with;
use super::config::{ImageProcessorConfig, ProcessorKind};
use super::decode::RgbImage;
use super::error::{ImageError, ImageResult};
use super::ops::{center_crop_with, check_output, pad_batch_with, FloatImage};
use super::resize::resize_with;
use crate::limits::Limits;

/// Model input made from a batch of images, under HF's names.
#[derive(Debug, Clone)]
pub struct ProcessedImages {
    /// `[batch, 3, height, width]` f32, or `[batch, views, 3, height, width]` for LLaVA-NeXT.
    pub pixel_values: HostTensor,
    /// `[batch, height, width]` i64, 1 over image pixels and 0 over padding (DETR).
    pub pixel_mask: Option<HostTensor>,
    /// `[batch, 2]` i64 original `(height, width)` of each image (LLaVA-NeXT).
    pub image_sizes: Option<HostTensor>,
    /// Original `(height, width)` of each image.
    pub original_sizes: Vec<(usize, usize)>,
    /// `(height, width)` of each image after resize / crop and before padding (for LLaVA-NeXT:
    /// of one view).
    pub processed_sizes: Vec<(usize, usize)>,
}

impl ProcessedImages {
    /// The tensors under their HF names (`pixel_values`, and `pixel_mask` / `image_sizes` when
    /// produced), ready for a [`ModelRunner`](ipfs_accelerate_core::ModelRunner).
    pub fn into_tensor_map(self) -> TensorMap {
        let mut map = TensorMap::new();
        map.insert("pixel_values".into(), self.pixel_values);
        if let Some(m) = self.pixel_mask {
            map.insert("pixel_mask".into(), m);
        }
        if let Some(s) = self.image_sizes {
            map.insert("image_sizes".into(), s);
        }
        map
    }
}

/// An HF image processor (CLIP, ViT, DETR, LLaVA-NeXT or a generic one) as configured by its
/// `preprocessor_config.json`, computing what the torchvision-backed processors of transformers
/// 5.x compute.
#[derive(Debug, Clone)]
pub struct ImageProcessor {
    config: ImageProcessorConfig,
    limits: Limits,
}

fn tensor_error(e: ipfs_accelerate_core::Error) -> ImageError {
    ImageError::InvalidInput(e.to_string())
}

impl ImageProcessor {
    /// A processor for `config` within [`Limits::current`] (sizes past them are errors when an
    /// image is processed).
    pub fn new(config: ImageProcessorConfig) -> Self {
        ImageProcessor {
            config,
            limits: Limits::current(),
        }
    }

    /// A processor for `config` within `limits`, the config's sizes checked now.
    pub fn with_limits(config: ImageProcessorConfig, limits: Limits) -> ImageResult<Self> {
        config.check_limits(&limits, "image processor config")?;
        Ok(ImageProcessor { config, limits })
    }

    /// The limits it runs within.
    pub fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Reads `preprocessor_config.json`.
    pub fn from_file(path: impl AsRef<Path>) -> ImageResult<Self> {
        Ok(Self::new(ImageProcessorConfig::from_file(path)?))
    }

    /// The configuration.
    pub fn config(&self) -> &ImageProcessorConfig {
        &self.config
    }

    /// Resize (when `do_resize`) and centre crop (when `do_center_crop`, except for DETR, whose
    /// processor has no crop step) of one 8-bit image.
    pub fn resize_and_crop<'a>(&self, img: &'a RgbImage) -> ImageResult<Cow<'a, RgbImage>> {
        let c = &self.config;
        let mut img = Cow::Borrowed(img);
        if c.do_resize {
            let (h, w) = c.size.output_size(img.size())?;
            img = Cow::Owned(resize_with(&img, h, w, c.resample, &self.limits)?);
        }
        if c.do_center_crop && c.kind != ProcessorKind::Detr {
            if let Some((ch, cw)) = c.crop_size {
                img = Cow::Owned(center_crop_with(&img, ch, cw, &self.limits)?);
            }
        }
        Ok(img)
    }

    /// One image through resize, crop, rescale and normalise: `[3, height, width]` floats.
    pub fn process_one(&self, img: &RgbImage) -> ImageResult<FloatImage> {
        let img = self.resize_and_crop(img)?;
        check_output(&self.limits, "processed image", img.height(), img.width())?;
        Ok(self.config.normalization().apply(&img))
    }

    /// Preprocesses a batch. Images of different processed sizes need `do_pad` (DETR pads to the
    /// largest and returns `pixel_mask`); LLaVA-NeXT returns every image's views and
    /// `image_sizes`, padding the view count when `do_pad`.
    pub fn preprocess(&self, images: &[RgbImage]) -> ImageResult<ProcessedImages> {
        if images.is_empty() {
            return Err(ImageError::InvalidInput("no images to preprocess".into()));
        }
        if self.config.kind == ProcessorKind::LlavaNext {
            return self.preprocess_anyres(images);
        }
        let processed = images
            .iter()
            .map(|i| self.process_one(i))
            .collect::<ImageResult<Vec<_>>>()?;
        let processed_sizes: Vec<_> = processed.iter().map(|p| (p.height, p.width)).collect();
        let original_sizes: Vec<_> = images.iter().map(RgbImage::size).collect();
        let (images, masks) = if self.config.do_pad {
            let (p, m) = pad_batch_with(&processed, self.config.pad_size, &self.limits)?;
            (p, Some(m))
        } else {
            (processed, None)
        };
        let pixel_values = stack(&images)?;
        let pixel_mask = match masks {
            Some(m) if self.config.kind == ProcessorKind::Detr => {
                let (h, w) = (images[0].height, images[0].width);
                let flat: Vec<i64> = m.concat();
                Some(HostTensor::from_i64(vec![m.len(), h, w], &flat).map_err(tensor_error)?)
            }
            _ => None,
        };
        Ok(ProcessedImages {
            pixel_values,
            pixel_mask,
            image_sizes: None,
            original_sizes,
            processed_sizes,
        })
    }

    fn preprocess_anyres(&self, images: &[RgbImage]) -> ImageResult<ProcessedImages> {
        let c = &self.config;
        let (base_size, tile) = c.anyres_base_and_tile()?;
        let mut per_image = Vec::with_capacity(images.len());
        for img in images {
            let views = anyres_views_with(
                img,
                &c.image_grid_pinpoints,
                base_size,
                tile,
                c.resample,
                &self.limits,
            )?;
            let views = views
                .iter()
                .map(|v| self.process_one(v))
                .collect::<ImageResult<Vec<_>>>()?;
            per_image.push(views);
        }
        let most = per_image.iter().map(Vec::len).max().unwrap_or(0);
        let first = &per_image[0][0];
        let (vh, vw) = (first.height, first.width);
        let view_len = 3 * vh * vw;
        let mut data = Vec::with_capacity(images.len() * most * view_len);
        for views in &per_image {
            if views.len() != most && !c.do_pad {
                return Err(ImageError::InvalidInput(format!(
                    "images give {} and {most} views: enable do_pad to batch them",
                    views.len()
                )));
            }
            for v in views {
                if (v.height, v.width) != (vh, vw) {
                    return Err(ImageError::InvalidInput(format!(
                        "views of {}x{} and {vw}x{vh} pixels cannot be stacked",
                        v.width, v.height
                    )));
                }
                data.extend_from_slice(&v.data);
            }
            data.resize(data.len() + (most - views.len()) * view_len, 0.0);
        }
        let pixel_values = HostTensor::from_f32(vec![images.len(), most, 3, vh, vw], &data)
            .map_err(tensor_error)?;
        let original_sizes: Vec<_> = images.iter().map(RgbImage::size).collect();
        let sizes: Vec<i64> = original_sizes
            .iter()
            .flat_map(|&(h, w)| [h as i64, w as i64])
            .collect();
        Ok(ProcessedImages {
            pixel_values,
            pixel_mask: None,
            image_sizes: Some(
                HostTensor::from_i64(vec![images.len(), 2], &sizes).map_err(tensor_error)?,
            ),
            processed_sizes: vec![(vh, vw); images.len()],
            original_sizes,
        })
    }
}

/// Stacks equally sized float images into `[batch, channels, height, width]`.
pub fn stack(images: &[FloatImage]) -> ImageResult<HostTensor> {
    let Some(first) = images.first() else {
        return Err(ImageError::InvalidInput("no images to stack".into()));
    };
    let shape = (first.channels, first.height, first.width);
    let mut data = Vec::with_capacity(images.len() * first.data.len());
    for img in images {
        if (img.channels, img.height, img.width) != shape {
            return Err(ImageError::InvalidInput(format!(
                "images of {}x{} and {}x{} pixels cannot be stacked without padding (do_pad)",
                img.width, img.height, first.width, first.height
            )));
        }
        data.extend_from_slice(&img.data);
    }
    HostTensor::from_f32(vec![images.len(), shape.0, shape.1, shape.2], &data).map_err(tensor_error)
}
