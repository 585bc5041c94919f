//! Size rules, centre crop, rescale + normalise, and padding, as HF's torchvision-backed image
//! processors do them.

use super::decode::RgbImage;
use super::error::{ImageError, ImageResult};
use crate::limits::{Limit, Limits};

/// How `size` in `preprocessor_config.json` sets the resized `(height, width)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SizeRule {
    /// `{"height", "width"}`: exactly this size, aspect ratio not kept.
    Exact {
        /// Output height.
        height: usize,
        /// Output width.
        width: usize,
    },
    /// `{"shortest_edge"}`: the shorter side becomes this, the longer one keeps the aspect ratio
    /// (truncated), as HF's `get_resize_output_image_size(default_to_square=False)`.
    ShortestEdge(usize),
    /// `{"shortest_edge", "longest_edge"}`: the shorter side becomes `shortest` unless that would
    /// make the longer side exceed `longest`, in which case the longer side becomes `longest`
    /// (HF's `get_size_with_aspect_ratio`, DETR's rule).
    ShortestLongest {
        /// Target of the shorter side.
        shortest: usize,
        /// Bound on the longer side.
        longest: usize,
    },
    /// `{"longest_edge"}`: the longer side becomes this, the shorter one keeps the aspect ratio
    /// (truncated, at least 1).
    LongestEdge(usize),
    /// `{"max_height", "max_width"}`: the largest size within both bounds that keeps the aspect
    /// ratio (HF's `get_image_size_for_max_height_width`).
    MaxHeightWidth {
        /// Bound on the height.
        max_height: usize,
        /// Bound on the width.
        max_width: usize,
    },
}

impl SizeRule {
    /// The `(height, width)` an image of `(height, width)` is resized to. Sizes that round down
    /// to zero (extreme aspect ratios) are an error.
    pub fn output_size(&self, (height, width): (usize, usize)) -> ImageResult<(usize, usize)> {
        if height == 0 || width == 0 {
            return Err(ImageError::Empty { width, height });
        }
        let (h, w) = (height as f64, width as f64);
        let out = match *self {
            SizeRule::Exact { height, width } => (height, width),
            SizeRule::ShortestEdge(size) => {
                let (short, long) = if width <= height {
                    (width, height)
                } else {
                    (height, width)
                };
                let new_long = ((size as u128 * long as u128) as f64 / short as f64) as usize;
                if width <= height {
                    (new_long, size)
                } else {
                    (size, new_long)
                }
            }
            SizeRule::ShortestLongest { shortest, longest } => {
                size_with_aspect_ratio((height, width), shortest, Some(longest))
            }
            SizeRule::LongestEdge(size) => {
                if width >= height {
                    (((size as u128 * height as u128) as f64 / w) as usize, size)
                } else {
                    (size, ((size as u128 * width as u128) as f64 / h) as usize)
                }
            }
            SizeRule::MaxHeightWidth {
                max_height,
                max_width,
            } => {
                let scale = (max_height as f64 / h).min(max_width as f64 / w);
                ((h * scale) as usize, (w * scale) as usize)
            }
        };
        if out.0 == 0 || out.1 == 0 {
            return Err(ImageError::InvalidInput(format!(
                "a {width}x{height} image would be resized to {}x{} by {self:?}",
                out.1, out.0
            )));
        }
        Ok(out)
    }
}

/// HF's `get_size_with_aspect_ratio`, with its float arithmetic and Python's round-half-even.
fn size_with_aspect_ratio(
    (height, width): (usize, usize),
    mut size: usize,
    max_size: Option<usize>,
) -> (usize, usize) {
    let (h, w) = (height as f64, width as f64);
    let mut raw_size = None;
    if let Some(max_size) = max_size {
        let min_orig = h.min(w);
        let max_orig = h.max(w);
        if max_orig / min_orig * size as f64 > max_size as f64 {
            let raw = max_size as f64 * min_orig / max_orig;
            raw_size = Some(raw);
            size = raw.round_ties_even() as usize;
        }
    }
    if (height <= width && height == size) || (width <= height && width == size) {
        (height, width)
    } else if width < height {
        let oh = match raw_size {
            Some(raw) => (raw * h / w) as usize,
            None => ((size as u128 * height as u128) as f64 / w) as usize,
        };
        (oh, size)
    } else {
        let ow = match raw_size {
            Some(raw) => (raw * w / h) as usize,
            None => ((size as u128 * width as u128) as f64 / h) as usize,
        };
        (size, ow)
    }
}

/// Pads an 8-bit image with zeros: `(left, top, right, bottom)` pixels. The padded size must be
/// within [`Limits::current`]'s output bounds.
pub fn pad_u8(img: &RgbImage, pads: (usize, usize, usize, usize)) -> ImageResult<RgbImage> {
    pad_u8_with(img, pads, &Limits::current())
}

/// [`pad_u8`] within `limits`.
pub(crate) fn pad_u8_with(
    img: &RgbImage,
    (left, top, right, bottom): (usize, usize, usize, usize),
    limits: &Limits,
) -> ImageResult<RgbImage> {
    let (h, w) = img.size();
    let overflow = || ImageError::InvalidInput(format!("padding a {w}x{h} image overflows"));
    let nh = h
        .checked_add(top)
        .and_then(|v| v.checked_add(bottom))
        .ok_or_else(overflow)?;
    let nw = w
        .checked_add(left)
        .and_then(|v| v.checked_add(right))
        .ok_or_else(overflow)?;
    check_output(limits, "padded image", nh, nw)?;
    let mut data = vec![0u8; nh * nw * 3];
    for y in 0..h {
        let src = &img.data()[y * w * 3..(y + 1) * w * 3];
        let dst = ((y + top) * nw + left) * 3;
        data[dst..dst + w * 3].copy_from_slice(src);
    }
    RgbImage::new(nw, nh, data)
}

/// Checks a `height × width` output against [`Limits::max_output_side`] and
/// [`Limits::max_output_pixels`] (before it is allocated).
pub(crate) fn check_output(
    limits: &Limits,
    what: &str,
    height: usize,
    width: usize,
) -> ImageResult<()> {
    let side = height.max(width);
    limits.check(
        Limit::OutputSide,
        || format!("{what} of {width}x{height} pixels"),
        side as u128,
    )?;
    limits.check(
        Limit::OutputPixels,
        || format!("{what} of {width}x{height} pixels"),
        height as u128 * width as u128,
    )?;
    Ok(())
}

/// Copies the `height × width` window whose top-left corner is `(top, left)`; the window must lie
/// inside the image.
pub fn crop(
    img: &RgbImage,
    top: usize,
    left: usize,
    height: usize,
    width: usize,
) -> ImageResult<RgbImage> {
    let (h, w) = img.size();
    if top.checked_add(height).is_none_or(|b| b > h)
        || left.checked_add(width).is_none_or(|r| r > w)
    {
        return Err(ImageError::InvalidInput(format!(
            "crop {width}x{height} at ({left}, {top}) leaves the {w}x{h} image"
        )));
    }
    let mut data = Vec::with_capacity(height * width * 3);
    for y in top..top + height {
        data.extend_from_slice(&img.data()[(y * w + left) * 3..(y * w + left + width) * 3]);
    }
    RgbImage::new(width, height, data)
}

/// HF's torchvision `center_crop`: an image smaller than the crop is first padded with zeros
/// (the extra pixel of an odd difference on the right / bottom), then the centred window
/// (`top = int((h - crop_h) / 2)`) is taken. The crop must be within [`Limits::current`]'s output
/// bounds.
pub fn center_crop(img: &RgbImage, crop_h: usize, crop_w: usize) -> ImageResult<RgbImage> {
    center_crop_with(img, crop_h, crop_w, &Limits::current())
}

/// [`center_crop`] within `limits`.
pub(crate) fn center_crop_with(
    img: &RgbImage,
    crop_h: usize,
    crop_w: usize,
    limits: &Limits,
) -> ImageResult<RgbImage> {
    if crop_h == 0 || crop_w == 0 {
        return Err(ImageError::InvalidInput(format!(
            "crop size {crop_w}x{crop_h} is empty"
        )));
    }
    let (h, w) = img.size();
    let padded;
    let mut img = img;
    if crop_w > w || crop_h > h {
        let dw = crop_w.saturating_sub(w);
        let dh = crop_h.saturating_sub(h);
        check_output(limits, "centre crop", crop_h, crop_w)?;
        padded = pad_u8_with(
            img,
            (dw / 2, dh / 2, dw.div_ceil(2), dh.div_ceil(2)),
            limits,
        )?;
        img = &padded;
    }
    let (h, w) = img.size();
    let top = (h - crop_h) / 2;
    let left = (w - crop_w) / 2;
    crop(img, top, left, crop_h, crop_w)
}

/// A float image, channels first (`[channels, height, width]`), as fed to a model.
#[derive(Debug, Clone, PartialEq)]
pub struct FloatImage {
    /// Channels (3).
    pub channels: usize,
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
    /// `channels * height * width` values, channel-major.
    pub data: Vec<f32>,
}

/// Rescaling and normalisation of 8-bit values into model input.
#[derive(Debug, Clone, PartialEq)]
pub struct Normalization {
    /// Multiply by `rescale_factor` (`1/255`) when set.
    pub rescale: Option<f64>,
    /// Subtract the per-channel mean and divide by the std (after rescaling) when set.
    pub mean_std: Option<([f32; 3], [f32; 3])>,
}

impl Normalization {
    /// `rgb` (8-bit, interleaved) as a channels-first float image: HF's fused rescale + normalise,
    /// `(x - mean/f) / (std/f)` in float32 with `f` the rescale factor.
    pub fn apply(&self, img: &RgbImage) -> FloatImage {
        let (h, w) = img.size();
        let n = h * w;
        let mut data = vec![0f32; 3 * n];
        let (shift, div, mul) = match (self.rescale, &self.mean_std) {
            (Some(f), Some((mean, std))) => {
                let inv = (1.0 / f) as f32;
                (mean.map(|m| m * inv), std.map(|s| s * inv), 1.0)
            }
            (None, Some((mean, std))) => (*mean, *std, 1.0),
            (Some(f), None) => ([0.0; 3], [1.0; 3], f as f32),
            (None, None) => ([0.0; 3], [1.0; 3], 1.0),
        };
        for (i, px) in img.data().chunks_exact(3).enumerate() {
            for c in 0..3 {
                data[c * n + i] = (px[c] as f32 * mul - shift[c]) / div[c];
            }
        }
        FloatImage {
            channels: 3,
            height: h,
            width: w,
            data,
        }
    }
}

/// Pads float images with zeros on the bottom and right to a common `(height, width)` (the
/// largest of the batch when `size` is `None`), returning the padded images and the pixel masks
/// (`1` over the image, `0` over padding), as DETR's image processor does. The padded size must be
/// within [`Limits::current`]'s output bounds.
pub fn pad_batch(
    images: &[FloatImage],
    size: Option<(usize, usize)>,
) -> ImageResult<(Vec<FloatImage>, Vec<Vec<i64>>)> {
    pad_batch_with(images, size, &Limits::current())
}

/// [`pad_batch`] within `limits`.
pub(crate) fn pad_batch_with(
    images: &[FloatImage],
    size: Option<(usize, usize)>,
    limits: &Limits,
) -> ImageResult<(Vec<FloatImage>, Vec<Vec<i64>>)> {
    let (ph, pw) = match size {
        Some(s) => s,
        None => (
            images.iter().map(|i| i.height).max().unwrap_or(0),
            images.iter().map(|i| i.width).max().unwrap_or(0),
        ),
    };
    check_output(limits, "padded batch image", ph, pw)?;
    let mut padded = Vec::with_capacity(images.len());
    let mut masks = Vec::with_capacity(images.len());
    for img in images {
        let len = img
            .channels
            .checked_mul(img.height)
            .and_then(|v| v.checked_mul(img.width));
        if len != Some(img.data.len()) {
            return Err(ImageError::InvalidInput(format!(
                "{} values do not hold a {}x{}x{} image",
                img.data.len(),
                img.channels,
                img.height,
                img.width
            )));
        }
        if img.height > ph || img.width > pw {
            return Err(ImageError::InvalidInput(format!(
                "cannot pad a {}x{} image to {pw}x{ph}",
                img.width, img.height
            )));
        }
        let mut data = vec![0f32; img.channels * ph * pw];
        for c in 0..img.channels {
            for y in 0..img.height {
                let src = &img.data[(c * img.height + y) * img.width..][..img.width];
                data[(c * ph + y) * pw..][..img.width].copy_from_slice(src);
            }
        }
        let mut mask = vec![0i64; ph * pw];
        for y in 0..img.height {
            mask[y * pw..y * pw + img.width].fill(1);
        }
        padded.push(FloatImage {
            channels: img.channels,
            height: ph,
            width: pw,
            data,
        });
        masks.push(mask);
    }
    Ok((padded, masks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shortest_edge_keeps_aspect_ratio_truncating() {
        let r = SizeRule::ShortestEdge(224);
        assert_eq!(r.output_size((123, 211)).unwrap(), (224, 384));
        assert_eq!(r.output_size((300, 100)).unwrap(), (672, 224));
    }

    #[test]
    fn shortest_longest_caps_the_long_side() {
        let r = SizeRule::ShortestLongest {
            shortest: 96,
            longest: 160,
        };
        assert_eq!(r.output_size((123, 211)).unwrap(), (93, 160));
        let r = SizeRule::ShortestLongest {
            shortest: 800,
            longest: 1333,
        };
        assert_eq!(r.output_size((480, 640)).unwrap(), (800, 1066));
        assert_eq!(r.output_size((800, 1000)).unwrap(), (800, 1000));
        assert_eq!(r.output_size((800, 600)).unwrap(), (1066, 800));
    }

    #[test]
    fn degenerate_sizes_are_errors() {
        let r = SizeRule::ShortestLongest {
            shortest: 10,
            longest: 20,
        };
        assert!(r.output_size((1, 5000)).is_err());
        assert!(SizeRule::ShortestEdge(4).output_size((0, 3)).is_err());
    }

    #[test]
    fn center_crop_pads_small_images() {
        let img = RgbImage::new(1, 1, vec![9, 9, 9]).unwrap();
        let out = center_crop(&img, 3, 2).unwrap();
        assert_eq!(out.size(), (3, 2));
        // Left pad 0, top pad 1: the pixel lands at (x=0, y=1).
        assert_eq!(out.pixel(0, 1), Some([9, 9, 9]));
        assert_eq!(out.pixel(1, 1), Some([0, 0, 0]));
    }

    #[test]
    fn pad_batch_masks_the_padding() {
        let a = FloatImage {
            channels: 3,
            height: 1,
            width: 2,
            data: vec![1.0; 6],
        };
        let b = FloatImage {
            channels: 3,
            height: 2,
            width: 1,
            data: vec![2.0; 6],
        };
        let (p, m) = pad_batch(&[a, b], None).unwrap();
        assert_eq!((p[0].height, p[0].width), (2, 2));
        assert_eq!(m[0], vec![1, 1, 0, 0]);
        assert_eq!(m[1], vec![1, 0, 1, 0]);
        assert_eq!(&p[0].data[..4], &[1.0, 1.0, 0.0, 0.0]);
    }
}
