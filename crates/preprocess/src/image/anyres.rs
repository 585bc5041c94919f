//! LLaVA-NeXT's "anyres" views: the image resized into the best-fitting grid resolution, padded,
//! cut into tiles, plus a base view of the whole image.

use super::decode::RgbImage;
use super::error::{ImageError, ImageResult};
use super::ops::{check_output, crop, pad_u8_with};
use super::resize::{resize_with, Resample};
use crate::limits::{Limit, Limits};

/// HF's `select_best_resolution`: among `(height, width)` candidates, the one that keeps the most
/// of the image's resolution when it is scaled to fit, ties broken by the least wasted area
/// (the first such candidate wins). `None` when there are no candidates.
pub fn select_best_resolution(
    (height, width): (usize, usize),
    candidates: &[(usize, usize)],
) -> Option<(usize, usize)> {
    let (oh, ow) = (height as f64, width as f64);
    let mut best = None;
    let mut max_effective = 0i128;
    let mut min_wasted = i128::MAX;
    for &(h, w) in candidates {
        let scale = (w as f64 / ow).min(h as f64 / oh);
        let (dw, dh) = ((ow * scale) as i128, (oh * scale) as i128);
        let effective = (dw * dh).min(width as i128 * height as i128);
        let wasted = w as i128 * h as i128 - effective;
        if effective > max_effective || (effective == max_effective && wasted < min_wasted) {
            max_effective = effective;
            min_wasted = wasted;
            best = Some((h, w));
        }
    }
    best
}

/// HF's `get_patch_output_size`: the size an image of `(height, width)` is resized to so that it
/// fits `target` keeping its aspect ratio (the other side rounded up, capped at the target).
pub fn patch_output_size(
    (height, width): (usize, usize),
    (target_h, target_w): (usize, usize),
) -> (usize, usize) {
    let scale_w = target_w as f64 / width as f64;
    let scale_h = target_h as f64 / height as f64;
    if scale_w < scale_h {
        (
            ((height as f64 * scale_w).ceil() as usize).min(target_h),
            target_w,
        )
    } else {
        (
            target_h,
            ((width as f64 * scale_h).ceil() as usize).min(target_w),
        )
    }
}

/// The 8-bit views LLaVA-NeXT feeds its vision tower for one image, before each view's own
/// resize / crop / normalise: first the whole image resized to `base_size`, then the tiles
/// (`tile` pixels square, row by row) of the image resized into the best grid resolution and
/// centred on a zero background of that resolution. The grid and the views are bounded by
/// [`Limits::current`] (output sides and pixels, [`Limits::max_anyres_views`]) before anything is
/// resized.
pub fn anyres_views(
    img: &RgbImage,
    pinpoints: &[(usize, usize)],
    base_size: (usize, usize),
    tile: usize,
    resample: Resample,
) -> ImageResult<Vec<RgbImage>> {
    anyres_views_with(
        img,
        pinpoints,
        base_size,
        tile,
        resample,
        &Limits::current(),
    )
}

/// The number of views (base view + tiles) of a `grid` resolution cut into `tile`-pixel tiles.
pub(crate) fn anyres_view_count((h, w): (usize, usize), tile: usize) -> u128 {
    let tile = tile.max(1);
    h.div_ceil(tile) as u128 * w.div_ceil(tile) as u128 + 1
}

/// [`anyres_views`] within `limits`.
pub(crate) fn anyres_views_with(
    img: &RgbImage,
    pinpoints: &[(usize, usize)],
    base_size: (usize, usize),
    tile: usize,
    resample: Resample,
    limits: &Limits,
) -> ImageResult<Vec<RgbImage>> {
    if tile == 0 {
        return Err(ImageError::InvalidInput("anyres tile size is 0".into()));
    }
    let best = select_best_resolution(img.size(), pinpoints)
        .ok_or_else(|| ImageError::InvalidInput("no image_grid_pinpoints to choose from".into()))?;
    check_output(limits, "anyres grid resolution", best.0, best.1)?;
    check_output(limits, "anyres base view", base_size.0, base_size.1)?;
    limits.check(
        Limit::AnyresViews,
        || {
            format!(
                "anyres views of a {}x{} grid cut into {tile}-pixel tiles",
                best.1, best.0
            )
        },
        anyres_view_count(best, tile),
    )?;
    let (nh, nw) = patch_output_size(img.size(), best);
    let resized = resize_with(img, nh, nw, resample, limits)?;
    let (dh, dw) = (best.0.saturating_sub(nh), best.1.saturating_sub(nw));
    let padded = pad_u8_with(
        &resized,
        (dw / 2, dh / 2, dw.div_ceil(2), dh.div_ceil(2)),
        limits,
    )?;
    let mut views = vec![resize_with(
        img,
        base_size.0,
        base_size.1,
        resample,
        limits,
    )?];
    for top in (0..best.0).step_by(tile) {
        for left in (0..best.1).step_by(tile) {
            let th = tile.min(best.0 - top);
            let tw = tile.min(best.1 - left);
            views.push(crop(&padded, top, left, th, tw)?);
        }
    }
    Ok(views)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_resolution_prefers_effective_then_least_waste() {
        let pins = [(64, 128), (128, 64), (128, 128)];
        // A wide image fits 64x128 with no loss but 128x128 keeps more pixels.
        assert_eq!(select_best_resolution((123, 211), &pins), Some((128, 128)));
        // A small image is kept whole by every candidate: least waste wins.
        assert_eq!(select_best_resolution((30, 60), &pins), Some((64, 128)));
        assert_eq!(select_best_resolution((30, 60), &[]), None);
    }

    #[test]
    fn patch_size_fits_the_target() {
        assert_eq!(patch_output_size((123, 211), (128, 128)), (75, 128));
        assert_eq!(patch_output_size((211, 123), (128, 128)), (128, 75));
    }
}
