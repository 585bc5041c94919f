//! Drawing detection boxes onto an image for `detect --draw`.

use std::path::Path;

use anyhow::Context;
use ipfs_accelerate::vision::Detection;
use ipfs_accelerate_preprocess::image::RgbImage;

/// Distinct colours, picked by label id.
const PALETTE: [[u8; 3]; 8] = [
    [230, 25, 75],
    [60, 180, 75],
    [255, 225, 25],
    [0, 130, 200],
    [245, 130, 48],
    [145, 30, 180],
    [70, 240, 240],
    [240, 50, 230],
];

/// Writes `image` with a rectangle (3 px, coloured by label) around every detection to `path`
/// (format from the extension, PNG recommended).
pub(crate) fn boxes(image: &RgbImage, detections: &[Detection], path: &Path) -> anyhow::Result<()> {
    let (w, h) = (image.width() as u32, image.height() as u32);
    let mut canvas = image::RgbImage::from_raw(w, h, image.data().to_vec())
        .context("image buffer does not match its size")?;
    for d in detections {
        let colour = image::Rgb(PALETTE[d.label_id % PALETTE.len()]);
        let clamp = |v: f32, max: u32| (v.round().max(0.0) as u32).min(max.saturating_sub(1));
        let [x0, y0, x1, y1] = d.box_xyxy;
        let (x0, x1) = (clamp(x0.min(x1), w), clamp(x0.max(x1), w));
        let (y0, y1) = (clamp(y0.min(y1), h), clamp(y0.max(y1), h));
        for t in 0..3u32 {
            for x in x0..=x1 {
                for y in [y0.saturating_add(t).min(y1), y1.saturating_sub(t).max(y0)] {
                    canvas.put_pixel(x, y, colour);
                }
            }
            for y in y0..=y1 {
                for x in [x0.saturating_add(t).min(x1), x1.saturating_sub(t).max(x0)] {
                    canvas.put_pixel(x, y, colour);
                }
            }
        }
    }
    canvas
        .save(path)
        .with_context(|| format!("writing {}", path.display()))
}
