//! Separable, antialiased resampling of 8-bit images, computed the way PIL's `Image.resize` and
//! torchvision's `resize(..., antialias=True)` on uint8 tensors (what HF's image processors call)
//! compute it: each output pixel is a weighted sum over the input pixels under a filter whose
//! support is widened by the downscaling factor, horizontal pass first, every pass rounded to
//! 8 bits with fixed-point weights.

use super::decode::RgbImage;
use super::error::{ImageError, ImageResult};
use super::ops::check_output;
use crate::limits::{Limit, Limits};

/// A resampling filter, numbered as PIL's `Image.Resampling` (`resample` in
/// `preprocessor_config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Resample {
    /// 0: nearest neighbour at pixel centres (torchvision's `NEAREST_EXACT`).
    Nearest,
    /// 1: Lanczos, 3 lobes.
    Lanczos,
    /// 2: triangle filter.
    Bilinear,
    /// 3: cubic convolution with `a = -0.5` (PIL's and torch's antialiased bicubic).
    Bicubic,
    /// 4: box filter (area average when downscaling).
    Box,
    /// 5: Hamming-windowed sinc.
    Hamming,
}

impl Resample {
    /// The filter of a PIL resampling id (`None` for ids PIL does not define).
    pub fn from_pil(id: i64) -> Option<Resample> {
        Some(match id {
            0 => Resample::Nearest,
            1 => Resample::Lanczos,
            2 => Resample::Bilinear,
            3 => Resample::Bicubic,
            4 => Resample::Box,
            5 => Resample::Hamming,
            _ => return None,
        })
    }

    /// PIL's id of this filter.
    pub fn pil_id(self) -> i64 {
        match self {
            Resample::Nearest => 0,
            Resample::Lanczos => 1,
            Resample::Bilinear => 2,
            Resample::Bicubic => 3,
            Resample::Box => 4,
            Resample::Hamming => 5,
        }
    }

    /// Half-width of the filter at scale 1.
    fn support(self) -> f64 {
        match self {
            Resample::Nearest | Resample::Box => 0.5,
            Resample::Bilinear | Resample::Hamming => 1.0,
            Resample::Bicubic => 2.0,
            Resample::Lanczos => 3.0,
        }
    }

    /// The filter's value at `x` (PIL's `Resample.c` filters).
    fn weight(self, x: f64) -> f64 {
        fn sinc(x: f64) -> f64 {
            if x == 0.0 {
                1.0
            } else {
                let x = x * std::f64::consts::PI;
                x.sin() / x
            }
        }
        match self {
            Resample::Nearest | Resample::Box => {
                if x > -0.5 && x <= 0.5 {
                    1.0
                } else {
                    0.0
                }
            }
            Resample::Bilinear => {
                let x = x.abs();
                if x < 1.0 {
                    1.0 - x
                } else {
                    0.0
                }
            }
            Resample::Bicubic => {
                const A: f64 = -0.5;
                let x = x.abs();
                if x < 1.0 {
                    ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0
                } else if x < 2.0 {
                    (((x - 5.0) * x + 8.0) * x - 4.0) * A
                } else {
                    0.0
                }
            }
            Resample::Hamming => {
                let x = x.abs();
                if x == 0.0 {
                    1.0
                } else if x >= 1.0 {
                    0.0
                } else {
                    let px = x * std::f64::consts::PI;
                    px.sin() / px * (0.54 + 0.46 * px.cos())
                }
            }
            Resample::Lanczos => {
                if (-3.0..3.0).contains(&x) {
                    sinc(x) * sinc(x / 3.0)
                } else {
                    0.0
                }
            }
        }
    }
}

/// The taps of one resampling pass: for every output index, the first input index, the number
/// of taps, and their fixed-point weights (`precision` fractional bits).
struct Taps {
    start: Vec<usize>,
    len: Vec<usize>,
    ksize: usize,
    weights: Vec<i32>,
    precision: u32,
}

impl Taps {
    /// Antialiased taps from `in_size` to `out_size` samples (PIL's `precompute_coeffs`; torch's
    /// `_compute_indices_weights_aa` + `_compute_int16_weights_aa`).
    fn new(in_size: usize, out_size: usize, filter: Resample) -> Taps {
        let scale = in_size as f64 / out_size as f64;
        let filterscale = scale.max(1.0);
        let support = filter.support() * filterscale;
        let ksize = support.ceil() as usize * 2 + 1;
        let mut start = Vec::with_capacity(out_size);
        let mut len = Vec::with_capacity(out_size);
        let mut real = vec![0f64; out_size * ksize];
        for xx in 0..out_size {
            let center = (xx as f64 + 0.5) * scale;
            // C's `(int)` truncates toward zero; negative starts clamp to 0 anyway.
            let xmin = ((center - support + 0.5) as i64).max(0) as usize;
            let xmax = ((center + support + 0.5) as i64).min(in_size as i64).max(0) as usize;
            let n = xmax.saturating_sub(xmin).min(ksize);
            let w = &mut real[xx * ksize..xx * ksize + n];
            let mut total = 0.0;
            for (x, wx) in w.iter_mut().enumerate() {
                *wx = filter.weight((x as f64 + xmin as f64 - center + 0.5) / filterscale);
                total += *wx;
            }
            if total != 0.0 {
                w.iter_mut().for_each(|v| *v /= total);
            }
            start.push(xmin);
            len.push(n);
        }
        // Fixed point as torch's uint8 kernels: as many fractional bits (≤ 22) as keep the
        // largest weight within 15 bits.
        let w_max = real.iter().cloned().fold(0.0f64, f64::max);
        let mut precision = 0u32;
        while precision < 22 {
            let next = (0.5 + w_max * (1u64 << (precision + 1)) as f64) as i64;
            if next >= 1 << 15 {
                break;
            }
            precision += 1;
        }
        let one = (1u64 << precision) as f64;
        let weights = real
            .iter()
            .map(|&w| {
                let v = w * one;
                if v < 0.0 {
                    (-0.5 + v) as i32
                } else {
                    (0.5 + v) as i32
                }
            })
            .collect();
        Taps {
            start,
            len,
            ksize,
            weights,
            precision,
        }
    }

    /// One output sample from `at(i)` = the input sample at index `i`.
    #[inline]
    fn apply(&self, out: usize, at: impl Fn(usize) -> u8) -> u8 {
        let w = &self.weights[out * self.ksize..out * self.ksize + self.len[out]];
        let base = self.start[out];
        let mut acc: i64 = if self.precision > 0 {
            1 << (self.precision - 1)
        } else {
            0
        };
        for (k, &wk) in w.iter().enumerate() {
            acc += at(base + k) as i64 * wk as i64;
        }
        (acc >> self.precision).clamp(0, 255) as u8
    }
}

/// Resizes interleaved 8-bit pixels (`channels` per pixel) from `in_h × in_w` to
/// `out_h × out_w`. Antialiased filters run the horizontal pass, then the vertical pass, each
/// skipped when that side keeps its size; [`Resample::Nearest`] picks the pixel whose centre is
/// nearest (`floor((i + 0.5) · in / out)`). The output (and the intermediate `in_h × out_w`
/// pass) must be within [`Limits::current`]'s output bounds.
pub fn resize_u8(
    data: &[u8],
    channels: usize,
    input: (usize, usize),
    output: (usize, usize),
    filter: Resample,
) -> ImageResult<Vec<u8>> {
    resize_u8_with(data, channels, input, output, filter, &Limits::current())
}

/// [`resize_u8`] within `limits`.
pub(crate) fn resize_u8_with(
    data: &[u8],
    channels: usize,
    (in_h, in_w): (usize, usize),
    (out_h, out_w): (usize, usize),
    filter: Resample,
    limits: &Limits,
) -> ImageResult<Vec<u8>> {
    if in_h == 0 || in_w == 0 || channels == 0 {
        return Err(ImageError::Empty {
            width: in_w,
            height: in_h,
        });
    }
    if out_h == 0 || out_w == 0 {
        return Err(ImageError::InvalidInput(format!(
            "cannot resize {in_w}x{in_h} to an empty {out_w}x{out_h} image"
        )));
    }
    check_output(limits, "resize target", out_h, out_w)?;
    let input_len = in_h.checked_mul(in_w).and_then(|v| v.checked_mul(channels));
    if input_len != Some(data.len()) {
        return Err(ImageError::InvalidInput(format!(
            "{} bytes do not hold {in_w}x{in_h}x{channels} samples",
            data.len()
        )));
    }
    let c = channels;
    if filter == Resample::Nearest {
        // torch computes the scale in f32.
        let index = |o: usize, n_in: usize, n_out: usize| -> usize {
            let scale = n_in as f32 / n_out as f32;
            (((o as f32 + 0.5) * scale).floor() as usize).min(n_in - 1)
        };
        let xs: Vec<usize> = (0..out_w).map(|x| index(x, in_w, out_w)).collect();
        let mut out = Vec::with_capacity(out_h * out_w * c);
        for y in 0..out_h {
            let row = &data[index(y, in_h, out_h) * in_w * c..][..in_w * c];
            for &x in &xs {
                out.extend_from_slice(&row[x * c..x * c + c]);
            }
        }
        return Ok(out);
    }
    // The horizontal pass keeps the input's height: bound its buffer as one more image.
    if out_w != in_w && out_h != in_h {
        let pixels = in_h as u128 * out_w as u128;
        limits.check(
            Limit::OutputPixels,
            || format!("resize intermediate of {out_w}x{in_h} pixels"),
            pixels,
        )?;
    }
    let mut cur: std::borrow::Cow<[u8]> = std::borrow::Cow::Borrowed(data);
    if out_w != in_w {
        let taps = Taps::new(in_w, out_w, filter);
        let mut out = vec![0u8; in_h * out_w * c];
        for y in 0..in_h {
            let row = &cur[y * in_w * c..(y + 1) * in_w * c];
            let orow = &mut out[y * out_w * c..(y + 1) * out_w * c];
            for x in 0..out_w {
                for ch in 0..c {
                    orow[x * c + ch] = taps.apply(x, |i| row[i * c + ch]);
                }
            }
        }
        cur = std::borrow::Cow::Owned(out);
    }
    if out_h != in_h {
        let taps = Taps::new(in_h, out_h, filter);
        let stride = out_w * c;
        let mut out = vec![0u8; out_h * stride];
        for y in 0..out_h {
            let orow = &mut out[y * stride..(y + 1) * stride];
            for (j, o) in orow.iter_mut().enumerate() {
                *o = taps.apply(y, |i| cur[i * stride + j]);
            }
        }
        cur = std::borrow::Cow::Owned(out);
    }
    Ok(cur.into_owned())
}

/// Resizes an RGB image to `height × width` (see [`resize_u8`]).
pub fn resize(
    img: &RgbImage,
    height: usize,
    width: usize,
    filter: Resample,
) -> ImageResult<RgbImage> {
    resize_with(img, height, width, filter, &Limits::current())
}

/// [`resize`] within `limits`.
pub(crate) fn resize_with(
    img: &RgbImage,
    height: usize,
    width: usize,
    filter: Resample,
    limits: &Limits,
) -> ImageResult<RgbImage> {
    if (height, width) == img.size() {
        return Ok(img.clone());
    }
    let data = resize_u8_with(img.data(), 3, img.size(), (height, width), filter, limits)?;
    RgbImage::new(width, height, data)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_image_stays_constant() {
        let data = vec![77u8; 5 * 7 * 3];
        for f in [
            Resample::Bilinear,
            Resample::Bicubic,
            Resample::Lanczos,
            Resample::Box,
            Resample::Hamming,
            Resample::Nearest,
        ] {
            for (h, w) in [(3, 4), (11, 13), (5, 2)] {
                let out = resize_u8(&data, 3, (5, 7), (h, w), f).unwrap();
                assert_eq!(out.len(), h * w * 3);
                assert!(out.iter().all(|&v| v == 77), "{f:?} {h}x{w}");
            }
        }
    }

    #[test]
    fn box_downscale_by_two_averages_pairs() {
        // One row 0, 10, 20, 30 → box filter halves it into (0+10)/2, (20+30)/2.
        let out = resize_u8(&[0, 10, 20, 30], 1, (1, 4), (1, 2), Resample::Box).unwrap();
        assert_eq!(out, vec![5, 25]);
    }

    #[test]
    fn bilinear_upscale_by_two_matches_hand_computation() {
        // 0, 100 → 4 samples at centres 0.25, 0.75, 1.25, 1.75 of the input grid:
        // clamped taps give 0, 25, 75, 100.
        let out = resize_u8(&[0, 100], 1, (1, 2), (1, 4), Resample::Bilinear).unwrap();
        assert_eq!(out, vec![0, 25, 75, 100]);
    }

    #[test]
    fn zero_target_is_an_error() {
        assert!(resize_u8(&[1, 2, 3], 3, (1, 1), (0, 4), Resample::Bilinear).is_err());
        assert!(resize_u8(&[1, 2], 3, (1, 1), (2, 2), Resample::Bilinear).is_err());
    }
}
