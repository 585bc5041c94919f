//! Vision-transformer input blocks shared by ViT, CLIP's vision tower, LLaVA and X-CLIP: the rows
//! of a patch embedding (a convolution whose stride equals its kernel, computed as a reshape and
//! a matmul by the trunk's dense layer) and PyTorch's bicubic interpolation of position-embedding
//! grids (`interpolate_pos_encoding`).

use burn::tensor::{backend::Backend, Tensor, TensorData};
use ipfs_accelerate_core::{Error, HostTensor, Result};

/// Checks that `t` is float `pixel_values` `[batch, channels, height, width]` with the model's
/// channel count, no empty dimension and only finite values, and moves it to `device`.
pub fn pixel_values<B: Backend>(
    t: &HostTensor,
    channels: usize,
    device: &B::Device,
) -> Result<Tensor<B, 4>> {
    let &[b, c, h, w] = t.shape() else {
        return Err(Error::InvalidInput(format!(
            "pixel_values must be [batch, channels, height, width], got {:?}",
            t.shape()
        )));
    };
    if !t.dtype().is_float() {
        return Err(Error::InvalidInput(format!(
            "pixel_values must be floats, got {}",
            t.dtype()
        )));
    }
    if c != channels {
        return Err(Error::InvalidInput(format!(
            "pixel_values have {c} channels, the model expects {channels}"
        )));
    }
    if b == 0 || h == 0 || w == 0 {
        return Err(Error::InvalidInput(format!(
            "pixel_values {:?} are empty",
            t.shape()
        )));
    }
    let values = t.to_f32_vec();
    if values.iter().any(|v| !v.is_finite()) {
        return Err(Error::InvalidInput(
            "pixel_values hold NaN or infinite values".into(),
        ));
    }
    Ok(Tensor::from_data(
        TensorData::new(values, [b, c, h, w]),
        device,
    ))
}

/// `pixel_values` `[batch, channels, height, width]` cut into `patch × patch` squares, one row
/// each in the order of a `[hidden, channels, patch, patch]` convolution weight's inputs:
/// `[batch · rows · columns, channels · patch · patch]`, and the `(rows, columns)` grid
/// (trailing pixels that do not fill a patch are dropped, as the strided convolution drops
/// them). An image of other channels than `channels`, or holding no patch, is an error.
pub fn patch_rows<B: Backend>(
    pixel_values: Tensor<B, 4>,
    channels: usize,
    patch: usize,
) -> Result<(Tensor<B, 2>, (usize, usize))> {
    let [b, c, h, w] = pixel_values.dims();
    let p = patch.max(1);
    if c != channels {
        return Err(Error::InvalidInput(format!(
            "pixel_values have {c} channels, the model expects {channels}"
        )));
    }
    let (gh, gw) = (h / p, w / p);
    if b == 0 || gh == 0 || gw == 0 {
        return Err(Error::InvalidInput(format!(
            "pixel_values [{b}, {c}, {h}, {w}] hold no {p}x{p} patch"
        )));
    }
    let x = if (gh * p, gw * p) != (h, w) {
        pixel_values.narrow(2, 0, gh * p).narrow(3, 0, gw * p)
    } else {
        pixel_values
    };
    let rows = x
        .reshape([b, c, gh, p, gw, p])
        .permute([0, 2, 4, 1, 3, 5])
        .reshape([b * gh * gw, c * p * p]);
    Ok((rows, (gh, gw)))
}

/// The `[out, in]` matrix of PyTorch's `interpolate(mode="bicubic", align_corners=False)` along
/// one axis (no antialiasing): source `scale · (o + 0.5) − 0.5` with `scale = in / out`, Keys'
/// cubic with `A = -0.75`, border taps clamped. Row-major.
pub fn bicubic_matrix(input: usize, output: usize) -> Vec<f32> {
    // PyTorch computes the scale and source index in f32.
    let scale = input as f32 / output as f32;
    cubic_matrix(input, output, |o| scale * (o as f32 + 0.5) - 0.5)
}

/// The `[out, in]` matrix of PyTorch's `interpolate(mode="bicubic", align_corners=True)` along
/// one axis: source `o · (in − 1) / (out − 1)` (0 when `out` is 1), otherwise as
/// [`bicubic_matrix`]. Row-major.
pub fn bicubic_matrix_align_corners(input: usize, output: usize) -> Vec<f32> {
    let scale = if output > 1 {
        (input as f32 - 1.0) / (output as f32 - 1.0)
    } else {
        0.0
    };
    cubic_matrix(input, output, |o| scale * o as f32)
}

/// Keys' cubic (`A = -0.75`) interpolation weights from source positions `source(o)`, the index
/// guarded as PyTorch's `guard_index_and_lambda`, border taps clamped.
fn cubic_matrix(input: usize, output: usize, source: impl Fn(usize) -> f32) -> Vec<f32> {
    const A: f64 = -0.75;
    let cc1 = |x: f64| ((A + 2.0) * x - (A + 3.0)) * x * x + 1.0;
    let cc2 = |x: f64| ((A * x - 5.0 * A) * x + 8.0 * A) * x - 4.0 * A;
    let mut m = vec![0f32; output * input];
    for o in 0..output {
        let real = source(o);
        let base = real.floor().min(input as f32 - 1.0);
        let t = (real - base).clamp(0.0, 1.0) as f64;
        let weights = [cc2(t + 1.0), cc1(t), cc1(1.0 - t), cc2(2.0 - t)];
        for (k, w) in weights.iter().enumerate() {
            let i = (base as i64 - 1 + k as i64).clamp(0, input as i64 - 1) as usize;
            m[o * input + i] += *w as f32;
        }
    }
    m
}

/// Bicubic resize (PyTorch's, see [`bicubic_matrix`]) of a `[channels, height, width]` grid to
/// `[channels, out_h, out_w]`, as two matmuls on the device.
pub fn interpolate_bicubic<B: Backend>(
    grid: Tensor<B, 3>,
    out_h: usize,
    out_w: usize,
) -> Tensor<B, 3> {
    let [c, h, w] = grid.dims();
    let device = grid.device();
    if (h, w) == (out_h, out_w) {
        return grid;
    }
    let mx: Tensor<B, 2> = Tensor::from_data(
        TensorData::new(bicubic_matrix(w, out_w), [out_w, w]),
        &device,
    );
    let my: Tensor<B, 2> = Tensor::from_data(
        TensorData::new(bicubic_matrix(h, out_h), [out_h, h]),
        &device,
    );
    // Along the width: [c·h, w] × [w, out_w].
    let x = crate::exact::matmul(grid.reshape([c * h, w]), mx.transpose()).reshape([c, h, out_w]);
    // Along the height: [out_h, h] × [c, h, out_w] for every channel.
    crate::exact::matmul(my.unsqueeze::<3>().expand([c, out_h, h]), x)
}

/// ViT / CLIP `interpolate_pos_encoding`: `positions` `[1 + n, hidden]` (class position first,
/// then an `s × s` grid with `s² = n`) adapted to a `rows × cols` patch grid: the class position
/// is kept, the grid is resized bicubically. Returned unchanged when the grid already matches.
pub fn interpolate_positions<B: Backend>(
    positions: Tensor<B, 2>,
    rows: usize,
    cols: usize,
) -> Result<Tensor<B, 2>> {
    let [n1, dim] = positions.dims();
    let n = n1.saturating_sub(1);
    let side = (n as f64).sqrt().round() as usize;
    if side * side != n || n == 0 {
        return Err(Error::InvalidInput(format!(
            "cannot interpolate {n} position embeddings: not a square grid"
        )));
    }
    if (side, side) == (rows, cols) {
        return Ok(positions);
    }
    let class = positions.clone().narrow(0, 0, 1);
    let grid = positions
        .narrow(0, 1, n)
        .reshape([side, side, dim])
        .permute([2, 0, 1]);
    let resized = interpolate_bicubic(grid, rows, cols)
        .permute([1, 2, 0])
        .reshape([rows * cols, dim]);
    Ok(Tensor::cat(vec![class, resized], 0))
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;

    #[test]
    fn bicubic_rows_sum_to_one_and_identity_at_scale_one() {
        for (i, o) in [(4, 7), (7, 4), (5, 5), (1, 3)] {
            let m = bicubic_matrix(i, o);
            for r in 0..o {
                let s: f32 = m[r * i..(r + 1) * i].iter().sum();
                assert!((s - 1.0).abs() < 1e-5, "{i}->{o} row {r}: {s}");
            }
        }
        let m = bicubic_matrix(3, 3);
        assert_eq!(m, vec![1., 0., 0., 0., 1., 0., 0., 0., 1.]);
    }

    #[test]
    fn bicubic_upscale_matches_pytorch_values() {
        // torch.nn.functional.interpolate(torch.tensor([[[0., 1., 4., 9.]]]), size=6,
        // mode="bicubic" on a [1, 1, 1, 4] grid) = these values.
        let m = bicubic_matrix(4, 6);
        let x = [0f32, 1., 4., 9.];
        let y: Vec<f32> = (0..6)
            .map(|r| (0..4).map(|c| m[r * 4 + c] * x[c]).sum())
            .collect();
        let want = [
            -0.086_805_58f32,
            0.21875,
            1.430_555,
            3.152_777_7,
            6.78125,
            9.434_029,
        ];
        for (a, b) in y.iter().zip(want) {
            assert!((a - b).abs() < 1e-5, "{y:?}");
        }
    }

    #[test]
    fn patch_rows_times_the_weight_equal_a_strided_convolution() {
        let dev = Default::default();
        let (c, hid, p) = (2, 3, 2);
        let wv: Vec<f32> = (0..hid * c * p * p)
            .map(|i| (i as f32 * 0.37).sin())
            .collect();
        let xv: Vec<f32> = (0..c * 4 * 6).map(|i| (i as f32 * 0.11).cos()).collect();
        let w = Tensor::<Flex, 4>::from_data(TensorData::new(wv.clone(), [hid, c, p, p]), &dev);
        let x = Tensor::<Flex, 4>::from_data(TensorData::new(xv, [1, c, 4, 6]), &dev);
        let (rows, (gh, gw)) = patch_rows(x.clone(), c, p).unwrap();
        assert_eq!((gh, gw), (2, 3));
        let weight = w.clone().reshape([hid, c * p * p]).transpose();
        let got = rows.matmul(weight).reshape([1, gh * gw, hid]);
        let conv = burn::tensor::module::conv2d(
            x,
            w,
            None,
            burn::tensor::ops::ConvOptions::new([p, p], [0, 0], [1, 1], 1),
        );
        let want = conv.reshape([1, hid, 6]).swap_dims(1, 2);
        let diff = (got - want).abs().max().into_scalar();
        assert!(diff < 1e-5, "{diff}");
    }
}
