//! The geometry of LLaVA-NeXT's anyres features, computed on the host from the original image
//! size alone: the chosen grid resolution, the tile grid, HF's `unpad_image` crop of the tile
//! features and the resulting feature count (which is what the processor expands `<image>` to).

use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_preprocess::image::select_best_resolution;

use crate::LlavaConfig;

/// The largest image side (and `image_grid_pinpoints` side) accepted, far beyond any real image;
/// it keeps every area and tile count of the geometry within integer range.
pub const MAX_SIDE: usize = 1 << 20;

/// The part of a `rows × cols` feature grid HF's `unpad_image` keeps: `rows` rows from `top`,
/// `cols` columns from `left`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unpad {
    /// First kept row.
    pub top: usize,
    /// First kept column.
    pub left: usize,
    /// Kept rows.
    pub rows: usize,
    /// Kept columns.
    pub cols: usize,
}

/// Python's `int(round(x, 7))` for the non-negative sizes `unpad_image` computes.
fn int_round7(x: f64) -> usize {
    ((x * 1e7).round() / 1e7).trunc().max(0.0) as usize
}

/// HF's `unpad_image` on a `(height, width)` grid of features of an image whose original size is
/// `(orig_h, orig_w)`: the padding that the anyres resize added around the image is cut off
/// symmetrically along the axis where the aspect ratios differ.
pub fn unpad_region((orig_h, orig_w): (usize, usize), (height, width): (usize, usize)) -> Unpad {
    let original_aspect = orig_w as f64 / orig_h as f64;
    let current_aspect = width as f64 / height as f64;
    if original_aspect > current_aspect {
        let scale = width as f64 / orig_w as f64;
        let new_height = int_round7(orig_h as f64 * scale);
        let padding = height.saturating_sub(new_height) / 2;
        Unpad {
            top: padding,
            left: 0,
            rows: height.saturating_sub(2 * padding),
            cols: width,
        }
    } else {
        let scale = height as f64 / orig_h as f64;
        let new_width = int_round7(orig_w as f64 * scale);
        let padding = width.saturating_sub(new_width) / 2;
        Unpad {
            top: 0,
            left: padding,
            rows: height,
            cols: width.saturating_sub(2 * padding),
        }
    }
}

/// How one image's features are laid out by LLaVA-NeXT (`get_anyres_image_grid_shape`,
/// `image_size_to_num_patches`, `pack_image_features`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AnyresLayout {
    /// The chosen `(height, width)` of `image_grid_pinpoints`.
    pub resolution: (usize, usize),
    /// Tiles per column.
    pub tiles_high: usize,
    /// Tiles per row.
    pub tiles_wide: usize,
    /// Vision patches per side of one view.
    pub grid: usize,
    /// The crop of the `(tiles_high · grid) × (tiles_wide · grid)` tile-feature grid kept.
    pub unpad: Unpad,
}

impl AnyresLayout {
    /// The layout of an image of original `(height, width)` under `config`.
    pub fn new(config: &LlavaConfig, (height, width): (usize, usize)) -> Result<Self> {
        if height == 0 || width == 0 || height > MAX_SIDE || width > MAX_SIDE {
            return Err(Error::InvalidInput(format!(
                "image size {height}x{width} is empty or larger than {MAX_SIDE} pixels a side"
            )));
        }
        let resolution = select_best_resolution((height, width), &config.image_grid_pinpoints)
            .ok_or_else(|| Error::InvalidInput("no image_grid_pinpoints to choose from".into()))?;
        let view = config.vision_config.image_size;
        let grid = config.grid();
        let (tiles_high, tiles_wide) = (resolution.0 / view, resolution.1 / view);
        if tiles_high == 0 || tiles_wide == 0 {
            return Err(Error::InvalidInput(format!(
                "grid resolution {resolution:?} holds no {view}-pixel tile"
            )));
        }
        let unpad = unpad_region((height, width), (tiles_high * grid, tiles_wide * grid));
        Ok(AnyresLayout {
            resolution,
            tiles_high,
            tiles_wide,
            grid,
            unpad,
        })
    }

    /// Views the vision tower encodes: the base view plus the tiles.
    pub fn views(&self) -> usize {
        1 + self.tiles_high * self.tiles_wide
    }

    /// Features of the image: the base view's `base_tokens`, then every kept row of tile
    /// features followed by one `image_newline`.
    pub fn feature_count(&self, base_tokens: usize) -> usize {
        base_tokens + self.unpad.rows * (self.unpad.cols + 1)
    }

    /// Where each of the image's packed features comes from (HF's `pack_image_features`), given
    /// its views' features `[views · tokens]` (view-major, `tokens = grid²` each): `Some(row)` of
    /// those, or `None` for `image_newline`. The base view's rows come first, then the tile
    /// features arranged as the image (tiles row by row, each tile's patch grid inside), cut to
    /// [`AnyresLayout::unpad`], with a newline after every row.
    pub fn packed_rows(&self, tokens: usize) -> Vec<Option<usize>> {
        let (g, u) = (self.grid, self.unpad);
        let mut rows: Vec<Option<usize>> = (0..tokens).map(Some).collect();
        for r in u.top..u.top + u.rows {
            for c in u.left..u.left + u.cols {
                let view = 1 + (r / g) * self.tiles_wide + c / g;
                rows.push(Some(view * tokens + (r % g) * g + c % g));
            }
            rows.push(None);
        }
        rows
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unpad_cuts_the_padding_of_the_short_axis() {
        // A wide image in a square grid: rows are cut.
        assert_eq!(
            unpad_region((37, 61), (8, 8)),
            Unpad {
                top: 2,
                left: 0,
                rows: 4,
                cols: 8
            }
        );
        // A tall image: columns are cut.
        let u = unpad_region((100, 40), (24, 24));
        assert_eq!((u.top, u.rows), (0, 24));
        assert_eq!(u.cols, 24 - 2 * ((24 - 9) / 2));
        // Same aspect ratio: nothing is cut.
        assert_eq!(unpad_region((30, 60), (4, 8)).rows, 4);
        assert_eq!(unpad_region((30, 60), (4, 8)).cols, 8);
    }

    #[test]
    fn packed_rows_arrange_the_tiles_as_the_image() {
        // 2 tiles high × 1 wide of a 2×2 patch grid, rows 1..3 of the 4×2 feature grid kept.
        let layout = AnyresLayout {
            resolution: (4, 2),
            tiles_high: 2,
            tiles_wide: 1,
            grid: 2,
            unpad: Unpad {
                top: 1,
                left: 0,
                rows: 2,
                cols: 2,
            },
        };
        let rows = layout.packed_rows(4);
        assert_eq!(rows.len(), layout.feature_count(4));
        // Base view 0..4; grid row 1 is tile 1's (view 1) patch row 1; grid row 2 is tile 2's
        // (view 2) patch row 0.
        let expected = [0, 1, 2, 3].map(Some).into_iter().chain([
            Some(6),
            Some(7),
            None,
            Some(8),
            Some(9),
            None,
        ]);
        assert!(rows.into_iter().eq(expected));
    }

    #[test]
    fn rounding_to_seven_digits_snaps_float_noise() {
        assert_eq!(int_round7(23.999_999_999_9), 24);
        assert_eq!(int_round7(23.5), 23);
        assert_eq!(int_round7(0.0), 0);
    }
}
