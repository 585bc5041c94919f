//! Host-side helpers of DETR's spatial bookkeeping: the pixel mask at feature-map resolution and
//! the sine position embeddings computed from it.

/// PyTorch's `nearest` source index (`interpolate(..., size=...)` without a scale factor):
/// `min(floor(dst * (in / out)), in - 1)` in single precision.
fn nearest_source(dst: usize, input: usize, output: usize) -> usize {
    if input == output {
        return dst;
    }
    if output == 2 * input {
        return dst >> 1;
    }
    let scale = input as f32 / output as f32;
    ((dst as f32 * scale).floor() as usize).min(input - 1)
}

/// `interpolate(pixel_mask[None].float(), size=(h, w)).to(bool)[0]`: `mask` `[batch, H, W]`
/// (non-zero = real pixel) sampled at `[h, w]` with nearest neighbour → `[batch, h * w]` of 0 / 1.
pub fn downsample_mask(
    mask: &[i64],
    batch: usize,
    [in_h, in_w]: [usize; 2],
    [h, w]: [usize; 2],
) -> Vec<i64> {
    let mut out = Vec::with_capacity(batch * h * w);
    for b in 0..batch {
        let plane = &mask[b * in_h * in_w..(b + 1) * in_h * in_w];
        for y in 0..h {
            let sy = nearest_source(y, in_h, h);
            for x in 0..w {
                let sx = nearest_source(x, in_w, w);
                out.push(i64::from(plane[sy * in_w + sx] != 0));
            }
        }
    }
    out
}

/// `DetrSinePositionEmbedding(features, temperature=10000, normalize=True, scale=2π)` of a
/// `[h, w]` map with `mask` `[batch, h * w]`, laid out as DETR's encoder reads it:
/// `[batch, h * w, 2 * features]`, the y half first, each half interleaving
/// `sin(e / t_k), cos(e / t_k)` with `t_k = 10000^(2k / features)`, where `e` is the cumulative
/// count of real pixels along the axis, normalised by the last one (+ 1e-6) and scaled by 2π.
pub fn sine_position_embedding(
    mask: &[i64],
    batch: usize,
    [h, w]: [usize; 2],
    features: usize,
) -> Vec<f32> {
    const EPS: f64 = 1e-6;
    let scale = 2.0 * std::f64::consts::PI;
    let dim_t: Vec<f64> = (0..features)
        .map(|i| 10000f64.powf((2 * (i / 2)) as f64 / features as f64))
        .collect();
    let d = 2 * features;
    let mut out = vec![0f32; batch * h * w * d];
    let mut y_embed = vec![0f64; h * w];
    let mut x_embed = vec![0f64; h * w];
    for b in 0..batch {
        let m = &mask[b * h * w..(b + 1) * h * w];
        let at = |y: usize, x: usize| if m[y * w + x] != 0 { 1.0 } else { 0.0 };
        for x in 0..w {
            let mut acc = 0.0;
            for y in 0..h {
                acc += at(y, x);
                y_embed[y * w + x] = acc;
            }
        }
        for y in 0..h {
            let mut acc = 0.0;
            for x in 0..w {
                acc += at(y, x);
                x_embed[y * w + x] = acc;
            }
        }
        for y in 0..h {
            for x in 0..w {
                let i = y * w + x;
                let ey = y_embed[i] / (y_embed[(h - 1) * w + x] + EPS) * scale;
                let ex = x_embed[i] / (x_embed[y * w + w - 1] + EPS) * scale;
                let row = &mut out[(b * h * w + i) * d..(b * h * w + i + 1) * d];
                for (k, t) in dim_t.iter().enumerate() {
                    let (vy, vx) = (ey / t, ex / t);
                    let (fy, fx) = if k % 2 == 0 {
                        (vy.sin(), vx.sin())
                    } else {
                        (vy.cos(), vx.cos())
                    };
                    row[k] = fy as f32;
                    row[features + k] = fx as f32;
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_matches_torch_indices() {
        // torch: interpolate(arange(10)[None,None].float(), size=4, mode="nearest") → 0, 2, 5, 7.
        let idx: Vec<usize> = (0..4).map(|i| nearest_source(i, 10, 4)).collect();
        assert_eq!(idx, vec![0, 2, 5, 7]);
        // Upsampling 3 → 7: 0 0 0 1 1 2 2.
        let idx: Vec<usize> = (0..7).map(|i| nearest_source(i, 3, 7)).collect();
        assert_eq!(idx, vec![0, 0, 0, 1, 1, 2, 2]);
    }

    #[test]
    fn sine_embedding_of_full_mask() {
        let (h, w, f) = (2, 3, 4);
        let pos = sine_position_embedding(&[1; 6], 1, [h, w], f);
        // Pixel (y=1, x=0): ey = 2/(2+eps)*2π ≈ 2π, ex = 1/(3+eps)*2π.
        let row = &pos[3 * 2 * f..4 * 2 * f];
        let ey = 2.0 / (2.0 + 1e-6) * 2.0 * std::f64::consts::PI;
        let ex = 1.0 / (3.0 + 1e-6) * 2.0 * std::f64::consts::PI;
        let t1 = 10000f64.powf(2.0 / 4.0);
        let want = [
            ey.sin(),
            ey.cos(),
            (ey / t1).sin(),
            (ey / t1).cos(),
            ex.sin(),
            ex.cos(),
            (ex / t1).sin(),
            (ex / t1).cos(),
        ];
        for (g, w) in row.iter().zip(want) {
            assert!((f64::from(*g) - w).abs() < 1e-6, "{g} vs {w}");
        }
    }
}
