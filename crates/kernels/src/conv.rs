//! One-dimensional convolutions over channels-last values, as matrix products whose rows are
//! the input's overlapping windows: with the taps ordered by offset, then channel, a window of
//! a channels-last signal is a contiguous run of memory, so the product reads the windows in
//! place at a row stride of `stride · channels` and no im2col buffer is built. Then a
//! per-channel norm for such values (Wav2Vec2's GroupNorm of one group per channel), and 2-D
//! convolutions over channels-first images as one product with a column matrix per image.

use rayon::prelude::*;

use crate::linear::{finish_parallel, finish_rows, product, EpilogueActivation};

/// The shape of a 1-D convolution over channels-last values `[batch, length, channels]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv1d {
    /// Signals.
    pub batch: usize,
    /// Frames per signal.
    pub length: usize,
    /// Input channels per frame.
    pub channels: usize,
    /// Output channels per frame.
    pub out_channels: usize,
    /// Taps per channel.
    pub kernel: usize,
    /// Frames between windows.
    pub stride: usize,
    /// Zero frames added at each end.
    pub padding: usize,
    /// Channel groups (each output channel sees the input channels of its group).
    pub groups: usize,
}

impl Conv1d {
    /// Output frames per signal, `(length + 2 · padding − kernel) / stride + 1`, or `None` when
    /// no window fits or the shape is inconsistent (a zero kernel, stride or group count, or
    /// groups that do not divide both channel counts).
    pub fn out_length(&self) -> Option<usize> {
        let consistent = self.kernel > 0
            && self.stride > 0
            && self.groups > 0
            && self.channels.is_multiple_of(self.groups)
            && self.out_channels.is_multiple_of(self.groups);
        let padded = self.length.checked_add(self.padding.checked_mul(2)?)?;
        (consistent && padded >= self.kernel).then(|| (padded - self.kernel) / self.stride + 1)
    }
}

/// A pointer that rayon's tasks may share: each task writes its own disjoint part.
#[derive(Clone, Copy)]
struct SharedOut(*mut f32);
// SAFETY: the tasks that share it write disjoint elements (see `conv1d`).
unsafe impl Send for SharedOut {}
// SAFETY: as above.
unsafe impl Sync for SharedOut {}

impl SharedOut {
    /// The element `offset` places in (a method, so closures capture the whole `Send` value).
    fn at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset)
    }
}

/// `activation(conv(x) + bias)` for channels-last `x` `[batch, length, channels]`: returns
/// `[batch, out_length, out_channels]` (see [`Conv1d::out_length`]).
///
/// `w` is `[channels / groups · kernel, out_channels]`, its row `c · kernel + j` the tap at
/// offset `j` of the group's input channel `c`: PyTorch's `[out, in / groups, kernel]` weight
/// flattened per output channel and transposed. Each group's taps are reordered once per call
/// to offset-major order (a copy of the weight); the input is copied only when it needs
/// padding or has several groups (then split per group).
///
/// # Panics
/// When a slice's length does not match the shape, or the shape has no output
/// ([`Conv1d::out_length`] is `None`).
pub fn conv1d(
    x: &[f32],
    shape: Conv1d,
    w: &[f32],
    bias: Option<&[f32]>,
    activation: EpilogueActivation,
) -> Vec<f32> {
    let out_length = shape
        .out_length()
        .expect("conv1d: the shape has no output frames");
    let Conv1d {
        batch,
        length,
        channels,
        out_channels: out,
        kernel,
        stride,
        padding,
        groups,
    } = shape;
    let (per_group_in, per_group_out) = (channels / groups, out / groups);
    let taps = per_group_in * kernel;
    assert_eq!(
        x.len(),
        batch * length * channels,
        "conv1d: input is not [batch, length, channels]"
    );
    assert_eq!(
        w.len(),
        taps * out,
        "conv1d: weight is not [channels / groups · kernel, out]"
    );
    assert!(
        bias.is_none_or(|b| b.len() == out),
        "conv1d: bias is not [out]"
    );
    let rows = batch * out_length;
    if taps == 0 || rows * out == 0 {
        // No input channels (every output is the bias), or no output at all.
        let mut y = vec![0f32; rows * out];
        finish_parallel(&mut y, rows, out, bias, None, activation);
        return y;
    }

    // Group g's taps in window order: row j · per_group_in + c of its [taps, per_group_out].
    let mut ordered = vec![0f32; groups * taps * per_group_out];
    ordered
        .par_chunks_mut(taps * per_group_out)
        .enumerate()
        .for_each(|(g, dst)| {
            for c in 0..per_group_in {
                for j in 0..kernel {
                    let src = &w[(c * kernel + j) * out + g * per_group_out..][..per_group_out];
                    dst[(j * per_group_in + c) * per_group_out..][..per_group_out]
                        .copy_from_slice(src);
                }
            }
        });

    // Each (signal, group)'s frames as contiguous rows of the group's channels, zero-padded.
    let padded = length + 2 * padding;
    let split = groups > 1 || padding > 0;
    let mut staged = Vec::new();
    if split {
        staged = vec![0f32; batch * groups * padded * per_group_in];
        staged
            .par_chunks_mut(padded * per_group_in)
            .enumerate()
            .for_each(|(bg, dst)| {
                let (b, g) = (bg / groups, bg % groups);
                for t in 0..length {
                    let src = &x[(b * length + t) * channels + g * per_group_in..][..per_group_in];
                    dst[(t + padding) * per_group_in..][..per_group_in].copy_from_slice(src);
                }
            });
    }
    let (source, signal_len) = if split {
        (&staged[..], padded * per_group_in)
    } else {
        (x, length * channels)
    };

    let mut y: Vec<f32> = Vec::with_capacity(rows * out);
    let tasks = batch * groups;
    let work = out_length * taps * per_group_out;
    let parallel_tasks = groups > 1 && tasks > 1;
    let inner = if !parallel_tasks && work >= crate::PARALLEL_THRESHOLD * 16 {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    let dst = SharedOut(y.as_mut_ptr());
    let run_task = |task: usize| {
        let (b, g) = (task / groups, task % groups);
        let lhs = &source[(b * groups + g) * signal_len..][..signal_len];
        let rhs = &ordered[g * taps * per_group_out..][..taps * per_group_out];
        // SAFETY: window i reads lhs[i · stride · per_group_in ..][.. taps], inside `lhs`
        // because (out_length − 1) · stride + kernel ≤ the signal's (padded) frames; rhs is
        // [taps, per_group_out]; task (b, g) writes rows b · out_length .. + out_length,
        // columns g · per_group_out .. + per_group_out of `y` (capacity rows × out), which
        // no other task writes, without reading them (`read_dst = false`).
        unsafe {
            product(
                [out_length, per_group_out, taps],
                (dst.at(b * out_length * out + g * per_group_out), out),
                (lhs.as_ptr(), stride * per_group_in),
                (rhs.as_ptr(), per_group_out),
                inner,
            );
        }
    };
    if parallel_tasks {
        (0..tasks).into_par_iter().for_each(run_task);
    } else {
        (0..tasks).for_each(run_task);
    }
    // SAFETY: the tasks together wrote every one of the rows × out values.
    unsafe { y.set_len(rows * out) };
    finish_parallel(&mut y, rows, out, bias, None, activation);
    y
}

/// The shape of a 2-D convolution of one group over `[batch, channels, height, width]` values
/// (no dilation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2d {
    /// Images.
    pub batch: usize,
    /// Input channels.
    pub channels: usize,
    /// Input rows.
    pub height: usize,
    /// Input columns.
    pub width: usize,
    /// Output channels.
    pub out_channels: usize,
    /// Kernel rows and columns.
    pub kernel: [usize; 2],
    /// Rows and columns between windows.
    pub stride: [usize; 2],
    /// Zero rows and columns added at each edge.
    pub padding: [usize; 2],
}

impl Conv2d {
    /// Output rows and columns, or `None` when no window fits or a kernel or stride is zero.
    pub fn out_size(&self) -> Option<[usize; 2]> {
        let side = |input: usize, i: usize| -> Option<usize> {
            let padded = input.checked_add(self.padding[i].checked_mul(2)?)?;
            let ok = self.kernel[i] > 0 && self.stride[i] > 0 && padded >= self.kernel[i];
            ok.then(|| (padded - self.kernel[i]) / self.stride[i] + 1)
        };
        Some([side(self.height, 0)?, side(self.width, 1)?])
    }
}

/// Row `tap` of the `[channels · kh · kw, oh · ow]` column matrix of one image `x`
/// `[channels, height, width]`: the input value under tap `(c, ky, kx)` of every window, zero
/// in the padding.
fn column_row(x: &[f32], s: &Conv2d, [oh, ow]: [usize; 2], tap: usize, row: &mut [f32]) {
    let [kh, kw] = s.kernel;
    let [sh, sw] = s.stride;
    let [ph, pw] = s.padding;
    let (c, ky, kx) = (tap / (kh * kw), (tap / kw) % kh, tap % kw);
    // Columns ox whose input column ox · sw + kx − pw lies inside the image.
    let first = pw.saturating_sub(kx).div_ceil(sw);
    let last = (s.width + pw)
        .checked_sub(kx + 1)
        .map_or(0, |m| m / sw + 1)
        .min(ow);
    for (oy, dst) in row.chunks_exact_mut(ow).take(oh).enumerate() {
        let iy = oy * sh + ky;
        if iy < ph || iy - ph >= s.height || first >= last {
            dst.fill(0.0);
            continue;
        }
        let src = &x[(c * s.height + iy - ph) * s.width..][..s.width];
        dst[..first].fill(0.0);
        dst[last..].fill(0.0);
        let start = first * sw + kx - pw;
        if sw == 1 {
            dst[first..last].copy_from_slice(&src[start..start + (last - first)]);
        } else {
            for (d, v) in dst[first..last]
                .iter_mut()
                .zip(src[start..].iter().step_by(sw))
            {
                *d = *v;
            }
        }
    }
}

/// `activation(conv(x) + bias + residual)` for `x` `[batch, channels, height, width]` and
/// PyTorch's weight `w` `[out, channels, kh, kw]`: returns `[batch, out, oh, ow]` (see
/// [`Conv2d::out_size`]), the shape `residual` must have. Each
/// image is one product of the weight with its column matrix (built in parallel, one row per
/// tap), or with the image itself for a 1 × 1 kernel of stride 1 without padding.
///
/// # Panics
/// When a slice's length does not match the shape, or the shape has no output.
pub fn conv2d(
    x: &[f32],
    shape: Conv2d,
    w: &[f32],
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    activation: EpilogueActivation,
) -> Vec<f32> {
    let [oh, ow] = shape.out_size().expect("conv2d: the shape has no output");
    let Conv2d {
        batch,
        channels,
        height,
        width,
        out_channels: out,
        kernel: [kh, kw],
        ..
    } = shape;
    let (image, positions, taps) = (channels * height * width, oh * ow, channels * kh * kw);
    assert_eq!(
        x.len(),
        batch * image,
        "conv2d: input is not [batch, channels, height, width]"
    );
    assert_eq!(
        w.len(),
        out * taps,
        "conv2d: weight is not [out, channels, kh, kw]"
    );
    assert!(
        bias.is_none_or(|b| b.len() == out),
        "conv2d: bias is not [out]"
    );
    assert!(
        residual.is_none_or(|r| r.len() == batch * out * oh * ow),
        "conv2d: residual is not [batch, out, oh, ow]"
    );
    let direct = [kh, kw] == [1, 1] && shape.stride == [1, 1] && shape.padding == [0, 0];
    let mut columns = if direct {
        Vec::new()
    } else {
        vec![0f32; taps * positions]
    };
    let mut y: Vec<f32> = Vec::with_capacity(batch * out * positions);
    let parallelism = if out * positions * taps >= crate::PARALLEL_THRESHOLD * 16 {
        gemm::Parallelism::Rayon(0)
    } else {
        gemm::Parallelism::None
    };
    for b in 0..batch {
        let xb = &x[b * image..][..image];
        let rhs: &[f32] = if direct {
            xb
        } else {
            columns
                .par_chunks_mut(positions.max(1))
                .enumerate()
                .for_each(|(tap, row)| column_row(xb, &shape, [oh, ow], tap, row));
            &columns
        };
        if out * positions == 0 || taps == 0 {
            continue;
        }
        // SAFETY: `y` has capacity for batch × out × positions values and image b's
        // out × positions block is written whole (read_dst = false) before the length is set;
        // `w` is [out, taps] and `rhs` [taps, positions], both row-major.
        unsafe {
            product(
                [out, positions, taps],
                (y.as_mut_ptr().add(b * out * positions), positions),
                (w.as_ptr(), taps),
                (rhs.as_ptr(), positions),
                parallelism,
            );
        }
    }
    if taps == 0 {
        y.resize(batch * out * positions, 0.0);
    } else {
        // SAFETY: every image's block was written above.
        unsafe { y.set_len(batch * out * positions) };
    }
    let idle = bias.is_none() && residual.is_none() && activation == EpilogueActivation::Identity;
    if !idle && positions > 0 {
        y.par_chunks_mut(positions)
            .enumerate()
            .for_each(|(i, row)| {
                if let Some(bias) = bias {
                    let v = bias[i % out];
                    row.iter_mut().for_each(|x| *x += v);
                }
                let res = residual.map(|r| &r[i * positions..][..positions]);
                finish_rows(row, positions, None, res, activation);
            });
    }
    y
}

multiversion! {
    /// `v · scale + shift` per channel over rows of `scale.len()` values.
    fn scale_shift_rows(rows: &mut [f32], scale: &[f32], shift: &[f32]) {
        for row in rows.chunks_exact_mut(scale.len()) {
            for ((v, s), t) in row.iter_mut().zip(scale).zip(shift) {
                *v = *v * *s + *t;
            }
        }
    }
}

/// Per-channel sums of `f(v)` over rows of `channels` values, in f64, split across threads.
fn channel_sums(x: &[f32], channels: usize, f: impl Fn(usize, f32) -> f64 + Sync) -> Vec<f64> {
    let rows_per_task = (crate::PARALLEL_THRESHOLD / channels.max(1)).max(1);
    x.par_chunks(rows_per_task * channels)
        .map(|chunk| {
            let mut sums = vec![0f64; channels];
            for row in chunk.chunks_exact(channels) {
                for (c, (s, &v)) in sums.iter_mut().zip(row).enumerate() {
                    *s += f(c, v);
                }
            }
            sums
        })
        .reduce(
            || vec![0f64; channels],
            |mut a, b| {
                a.iter_mut().zip(&b).for_each(|(a, b)| *a += b);
                a
            },
        )
}

/// Normalises each channel of channels-last `x` `[batch, length, channels]` over its frames
/// (the mean, then the biased variance around it; `eps` inside the square root), scales and
/// shifts it by `gamma` and `beta`, then applies `activation`, in place: a GroupNorm of one
/// group per channel on channels-last values.
///
/// # Panics
/// When `x` is not `batch · length · channels` long, or `gamma` / `beta` not `channels`.
pub fn channel_norm(
    x: &mut [f32],
    [batch, length, channels]: [usize; 3],
    gamma: &[f32],
    beta: Option<&[f32]>,
    eps: f32,
    activation: EpilogueActivation,
) {
    assert_eq!(
        x.len(),
        batch * length * channels,
        "channel_norm: x is not [batch, length, channels]"
    );
    assert_eq!(
        gamma.len(),
        channels,
        "channel_norm: gamma is not [channels]"
    );
    assert!(
        beta.is_none_or(|b| b.len() == channels),
        "channel_norm: beta is not [channels]"
    );
    if x.is_empty() {
        return;
    }
    let rows_per_task = (crate::PARALLEL_THRESHOLD / channels).max(1);
    for signal in x.chunks_exact_mut(length * channels) {
        let n = length as f64;
        let mean: Vec<f64> = channel_sums(signal, channels, |_, v| f64::from(v))
            .into_iter()
            .map(|s| s / n)
            .collect();
        let var = channel_sums(signal, channels, |c, v| (f64::from(v) - mean[c]).powi(2));
        let (scale, shift): (Vec<f32>, Vec<f32>) = (0..channels)
            .map(|c| {
                let s = f64::from(gamma[c]) / (var[c] / n + f64::from(eps)).sqrt();
                let t = beta.map_or(0.0, |b| f64::from(b[c])) - mean[c] * s;
                (s as f32, t as f32)
            })
            .unzip();
        signal
            .par_chunks_mut(rows_per_task * channels)
            .for_each(|chunk| scale_shift_rows(chunk, &scale, &shift));
        finish_parallel(signal, length, channels, None, None, activation);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The definition: `[batch, out_length, out]` from channels-last `x` and PyTorch's weight
    /// layout `[out, in / groups, kernel]`, in f64.
    fn reference(x: &[f32], s: Conv1d, torch_w: &[f32], bias: &[f32]) -> Vec<f64> {
        let n = s.out_length().unwrap();
        let (cin, cout) = (s.channels / s.groups, s.out_channels / s.groups);
        let mut y = vec![0f64; s.batch * n * s.out_channels];
        for b in 0..s.batch {
            for t in 0..n {
                for o in 0..s.out_channels {
                    let g = o / cout;
                    let mut acc = f64::from(bias[o]);
                    for c in 0..cin {
                        for j in 0..s.kernel {
                            let pos = (t * s.stride + j) as isize - s.padding as isize;
                            if pos < 0 || pos as usize >= s.length {
                                continue;
                            }
                            let xv = x[(b * s.length + pos as usize) * s.channels + g * cin + c];
                            let wv = torch_w[(o * cin + c) * s.kernel + j];
                            acc += f64::from(xv) * f64::from(wv);
                        }
                    }
                    y[(b * n + t) * s.out_channels + o] = acc;
                }
            }
        }
        y
    }

    #[test]
    fn convolutions_match_the_definition() {
        let shapes = [
            // Wav2Vec2's first convolution (one channel), a strided one, Whisper's padded ones,
            // a grouped "same" convolution with an even kernel, and a batch.
            (1, 53, 1, 8, 10, 5, 0, 1),
            (2, 40, 12, 16, 3, 2, 0, 1),
            (1, 30, 6, 10, 3, 1, 1, 1),
            (2, 31, 10, 10, 3, 2, 1, 1),
            (2, 17, 12, 8, 4, 1, 2, 4),
            (3, 9, 8, 8, 9, 1, 4, 2),
        ];
        for (batch, length, channels, out, kernel, stride, padding, groups) in shapes {
            let s = Conv1d {
                batch,
                length,
                channels,
                out_channels: out,
                kernel,
                stride,
                padding,
                groups,
            };
            let taps = channels / groups * kernel;
            let x: Vec<f32> = (0..batch * length * channels)
                .map(|i| ((i * 37) % 23) as f32 * 0.1 - 1.1)
                .collect();
            let torch_w: Vec<f32> = (0..out * taps)
                .map(|i| ((i * 11) % 17) as f32 * 0.05 - 0.4)
                .collect();
            let bias: Vec<f32> = (0..out).map(|i| i as f32 * 0.1 - 0.3).collect();
            // The description's form: [taps, out], row c · kernel + j.
            let mut w = vec![0f32; taps * out];
            for o in 0..out {
                for t in 0..taps {
                    w[t * out + o] = torch_w[o * taps + t];
                }
            }
            let want = reference(&x, s, &torch_w, &bias);
            let got = conv1d(&x, s, &w, Some(&bias), EpilogueActivation::Identity);
            assert_eq!(got.len(), want.len(), "{s:?}");
            for (g, w) in got.iter().zip(&want) {
                assert!((f64::from(*g) - w).abs() < 1e-4, "{s:?}: {g} against {w}");
            }
            let relu = conv1d(&x, s, &w, Some(&bias), EpilogueActivation::Relu);
            for (g, w) in relu.iter().zip(&want) {
                assert!((f64::from(*g) - w.max(0.0)).abs() < 1e-4, "{s:?} relu");
            }
        }
    }

    #[test]
    fn image_convolutions_match_the_definition() {
        // (batch, channels, height, width, out, [kh, kw], [sh, sw], [ph, pw]): a ResNet stem,
        // 3 × 3 of stride 1 and 2, 1 × 1 direct and strided, a kernel wider than the image with
        // padding, uneven strides and padding.
        let shapes = [
            (1, 3, 19, 17, 4, [7, 7], [2, 2], [3, 3]),
            (2, 5, 9, 8, 6, [3, 3], [1, 1], [1, 1]),
            (1, 4, 9, 11, 3, [3, 3], [2, 2], [1, 1]),
            (2, 6, 5, 7, 5, [1, 1], [1, 1], [0, 0]),
            (1, 6, 7, 7, 5, [1, 1], [2, 2], [0, 0]),
            (1, 2, 3, 2, 3, [3, 5], [1, 1], [1, 2]),
            (1, 3, 10, 9, 2, [2, 3], [3, 2], [0, 1]),
        ];
        for (batch, channels, height, width, out, kernel, stride, padding) in shapes {
            let s = Conv2d {
                batch,
                channels,
                height,
                width,
                out_channels: out,
                kernel,
                stride,
                padding,
            };
            let [oh, ow] = s.out_size().unwrap();
            let taps = channels * kernel[0] * kernel[1];
            let x: Vec<f32> = (0..batch * channels * height * width)
                .map(|i| ((i * 37) % 23) as f32 * 0.1 - 1.1)
                .collect();
            let w: Vec<f32> = (0..out * taps)
                .map(|i| ((i * 11) % 17) as f32 * 0.05 - 0.4)
                .collect();
            let bias: Vec<f32> = (0..out).map(|i| i as f32 * 0.1 - 0.3).collect();
            let got = conv2d(&x, s, &w, Some(&bias), None, EpilogueActivation::Identity);
            let residual: Vec<f32> = (0..got.len()).map(|i| (i % 7) as f32 * 0.3 - 0.9).collect();
            let relu = conv2d(
                &x,
                s,
                &w,
                Some(&bias),
                Some(&residual),
                EpilogueActivation::Relu,
            );
            for ((r, g), res) in relu.iter().zip(&got).zip(&residual) {
                assert!(
                    (r - (g + res).max(0.0)).abs() < 1e-6,
                    "{s:?} residual + relu"
                );
            }
            assert_eq!(got.len(), batch * out * oh * ow, "{s:?}");
            for b in 0..batch {
                for o in 0..out {
                    for oy in 0..oh {
                        for ox in 0..ow {
                            let mut want = f64::from(bias[o]);
                            for c in 0..channels {
                                for ky in 0..kernel[0] {
                                    for kx in 0..kernel[1] {
                                        let iy =
                                            (oy * stride[0] + ky) as isize - padding[0] as isize;
                                        let ix =
                                            (ox * stride[1] + kx) as isize - padding[1] as isize;
                                        if iy < 0
                                            || ix < 0
                                            || iy as usize >= height
                                            || ix as usize >= width
                                        {
                                            continue;
                                        }
                                        let xv = x[((b * channels + c) * height + iy as usize)
                                            * width
                                            + ix as usize];
                                        let wv = w[((o * channels + c) * kernel[0] + ky)
                                            * kernel[1]
                                            + kx];
                                        want += f64::from(xv) * f64::from(wv);
                                    }
                                }
                            }
                            let g = got[((b * out + o) * oh + oy) * ow + ox];
                            assert!(
                                (f64::from(g) - want).abs() < 1e-4,
                                "{s:?} ({b}, {o}, {oy}, {ox}): {g} against {want}"
                            );
                        }
                    }
                }
            }
        }
        let none = Conv2d {
            batch: 1,
            channels: 1,
            height: 2,
            width: 2,
            out_channels: 1,
            kernel: [3, 3],
            stride: [1, 1],
            padding: [0, 0],
        };
        assert_eq!(none.out_size(), None);
        // No input channels: every output is the bias (and the activation of it).
        let empty = Conv2d {
            channels: 0,
            padding: [1, 1],
            ..none
        };
        let y = conv2d(
            &[],
            empty,
            &[],
            Some(&[-0.5]),
            None,
            EpilogueActivation::Relu,
        );
        assert_eq!(y, vec![0.0; 4]);
        let y = conv2d(
            &[],
            empty,
            &[],
            Some(&[0.5]),
            None,
            EpilogueActivation::Identity,
        );
        assert_eq!(y, vec![0.5; 4]);
        assert_eq!(
            Conv2d {
                stride: [0, 1],
                padding: [1, 1],
                ..none
            }
            .out_size(),
            None
        );
    }

    #[test]
    fn shapes_without_output_are_refused() {
        let base = Conv1d {
            batch: 1,
            length: 4,
            channels: 2,
            out_channels: 2,
            kernel: 5,
            stride: 1,
            padding: 0,
            groups: 1,
        };
        assert_eq!(base.out_length(), None);
        assert_eq!(Conv1d { padding: 1, ..base }.out_length(), Some(2));
        assert_eq!(
            Conv1d {
                stride: 0,
                padding: 1,
                ..base
            }
            .out_length(),
            None
        );
        assert_eq!(
            Conv1d {
                groups: 3,
                padding: 1,
                ..base
            }
            .out_length(),
            None
        );
        // No input channels: every output is the bias.
        let empty = Conv1d {
            channels: 0,
            padding: 1,
            ..base
        };
        let y = conv1d(
            &[],
            empty,
            &[],
            Some(&[0.5, -1.0]),
            EpilogueActivation::Identity,
        );
        assert_eq!(y, vec![0.5, -1.0, 0.5, -1.0]);
    }

    #[test]
    fn channel_norm_matches_the_definition() {
        let (batch, length, channels) = (2, 37, 5);
        let x: Vec<f32> = (0..batch * length * channels)
            .map(|i| ((i * 29) % 31) as f32 * 0.3 - 2.0 + (i % channels) as f32)
            .collect();
        let gamma: Vec<f32> = (0..channels).map(|c| 0.5 + c as f32 * 0.25).collect();
        let beta: Vec<f32> = (0..channels).map(|c| c as f32 * 0.1 - 0.2).collect();
        let eps = 1e-5f32;
        let mut got = x.clone();
        channel_norm(
            &mut got,
            [batch, length, channels],
            &gamma,
            Some(&beta),
            eps,
            EpilogueActivation::GeluErf,
        );
        for b in 0..batch {
            for c in 0..channels {
                let at = |t: usize| f64::from(x[(b * length + t) * channels + c]);
                let mean = (0..length).map(at).sum::<f64>() / length as f64;
                let var = (0..length).map(|t| (at(t) - mean).powi(2)).sum::<f64>() / length as f64;
                for t in 0..length {
                    let v = (at(t) - mean) / (var + f64::from(eps)).sqrt() * f64::from(gamma[c])
                        + f64::from(beta[c]);
                    let gelu = 0.5 * v * (1.0 + erf(v / std::f64::consts::SQRT_2));
                    let g = f64::from(got[(b * length + t) * channels + c]);
                    assert!(
                        (g - gelu).abs() < 1e-5,
                        "({b}, {t}, {c}): {g} against {gelu}"
                    );
                }
            }
        }
    }

    /// erf by Abramowitz & Stegun 7.1.26 (absolute error below 1.5e-7, under the test's bar).
    fn erf(x: f64) -> f64 {
        let t = 1.0 / (1.0 + 0.327_591_1 * x.abs());
        let y = 1.0
            - (((((1.061_405_429 * t - 1.453_152_027) * t) + 1.421_413_741) * t - 0.284_496_736)
                * t
                + 0.254_829_592)
                * t
                * (-x * x).exp();
        y.copysign(x)
    }
}
