//! Linear layers: one matrix multiply with the bias, a residual and an activation applied in a
//! single pass over its output.

use rayon::prelude::*;

use crate::math::{gelu_erf_one, gelu_tanh_one, sigmoid_mul_one};

/// What a linear layer adds to its product in one pass over the output:
/// `activation(product + bias + residual)`.
#[derive(Debug, Clone, Copy, Default)]
pub struct Epilogue<'a> {
    /// `[n]`, added to every row.
    pub bias: Option<&'a [f32]>,
    /// `[rows, n]`, added element-wise (a residual connection).
    pub residual: Option<&'a [f32]>,
    /// Applied last.
    pub activation: EpilogueActivation,
}

/// The activation of an [`Epilogue`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EpilogueActivation {
    /// No activation.
    #[default]
    Identity,
    /// Exact GELU.
    GeluErf,
    /// Tanh-approximated GELU.
    GeluTanh,
    /// `x · sigmoid(x)`.
    Silu,
    /// `x · sigmoid(1.702 x)`.
    QuickGelu,
    /// `max(0, x)`.
    Relu,
}

/// `activation` over one panel of 32 values, for kernels that apply their epilogue in registers:
/// inlined into the caller's `target_feature` context, the fixed-length loops vectorise there.
#[inline(always)]
pub(crate) fn activate_panel(v: &mut [f32; 32], activation: EpilogueActivation) {
    match activation {
        EpilogueActivation::Identity => {}
        EpilogueActivation::GeluErf => v.iter_mut().for_each(|x| *x = gelu_erf_one(*x)),
        EpilogueActivation::GeluTanh => v.iter_mut().for_each(|x| *x = gelu_tanh_one(*x)),
        EpilogueActivation::Silu => v.iter_mut().for_each(|x| *x = sigmoid_mul_one(*x, 1.0)),
        EpilogueActivation::QuickGelu => v.iter_mut().for_each(|x| *x = sigmoid_mul_one(*x, 1.702)),
        EpilogueActivation::Relu => v.iter_mut().for_each(|x| *x = x.max(0.0)),
    }
}

multiversion! {
    /// `activation(out + residual + bias)` in place over rows of `n` values.
    pub(crate) fn finish_rows(
        out: &mut [f32],
        n: usize,
        bias: Option<&[f32]>,
        residual: Option<&[f32]>,
        activation: EpilogueActivation,
    ) {
        if let Some(res) = residual {
            for (o, r) in out.iter_mut().zip(res) {
                *o += *r;
            }
        }
        if let Some(bias) = bias {
            for row in out.chunks_exact_mut(n) {
                for (o, b) in row.iter_mut().zip(bias) {
                    *o += *b;
                }
            }
        }
        match activation {
            EpilogueActivation::Identity => {}
            EpilogueActivation::GeluErf => out.iter_mut().for_each(|v| *v = gelu_erf_one(*v)),
            EpilogueActivation::GeluTanh => out.iter_mut().for_each(|v| *v = gelu_tanh_one(*v)),
            EpilogueActivation::Silu => out.iter_mut().for_each(|v| *v = sigmoid_mul_one(*v, 1.0)),
            EpilogueActivation::QuickGelu => out.iter_mut().for_each(|v| *v = sigmoid_mul_one(*v, 1.702)),
            EpilogueActivation::Relu => out.iter_mut().for_each(|v| *v = v.max(0.0)),
        }
    }
}

/// `activation(x · w + bias + residual)` (see [`Epilogue`]): `x` is `[rows, k]`, `w` is
/// `[k, n]`, all row-major; returns `[rows, n]`. The product runs on every rayon
/// thread when it is large; the bias, residual and activation are applied in one pass after it.
///
/// # Panics
/// When a slice's length does not match the shapes.
pub fn linear(
    x: &[f32],
    rows: usize,
    k: usize,
    w: &[f32],
    n: usize,
    epilogue: Epilogue<'_>,
) -> Vec<f32> {
    let Epilogue {
        bias,
        residual,
        activation,
    } = epilogue;
    assert_eq!(x.len(), rows * k, "linear: input is not [rows, k]");
    assert_eq!(w.len(), k * n, "linear: weight is not [k, n]");
    assert!(bias.is_none_or(|b| b.len() == n), "linear: bias is not [n]");
    assert!(
        residual.is_none_or(|r| r.len() == rows * n),
        "linear: residual is not [rows, n]"
    );
    let mut out: Vec<f32> = Vec::with_capacity(rows * n);
    let work = rows * n * k;
    if k == 0 {
        out.resize(rows * n, 0.0);
    } else if rows * n > 0 {
        let parallelism = if work >= crate::PARALLEL_THRESHOLD * 16 {
            gemm::Parallelism::Rayon(0)
        } else {
            gemm::Parallelism::None
        };
        // SAFETY: `out` has capacity for rows × n values; gemm writes every one of them without
        // reading (`read_dst = false`) before the length is set; `x` and `w` hold rows × k and
        // k × n values with the strides given.
        unsafe {
            product(
                [rows, n, k],
                (out.as_mut_ptr(), n),
                (x.as_ptr(), k),
                (w.as_ptr(), n),
                parallelism,
            );
            out.set_len(rows * n);
        }
    }
    finish_parallel(&mut out, rows, n, bias, residual, activation);
    out
}

/// `dst = lhs · rhs` through `gemm`, each matrix row-major with unit column stride and its row
/// stride given beside its pointer: `lhs` `[m, k]`, `rhs` `[k, n]`, `dst` `[m, n]`, written
/// without being read.
///
/// # Safety
/// `lhs` must be valid for reads of `(m − 1) · lhs_rs + k` values, `rhs` of
/// `(k − 1) · rhs_rs + n`, `dst` for writes of `(m − 1) · dst_rs + n`, and nothing else may
/// access what `dst` covers meanwhile.
pub(crate) unsafe fn product(
    [m, n, k]: [usize; 3],
    (dst, dst_rs): (*mut f32, usize),
    (lhs, lhs_rs): (*const f32, usize),
    (rhs, rhs_rs): (*const f32, usize),
    parallelism: gemm::Parallelism,
) {
    // SAFETY: the caller's contract is gemm's for these strides.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst,
            1,
            dst_rs as isize,
            false,
            lhs,
            1,
            lhs_rs as isize,
            rhs,
            1,
            rhs_rs as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// [`finish_rows`] over `rows` rows of `n` values, split across rayon's threads when large.
pub(crate) fn finish_parallel(
    out: &mut [f32],
    rows: usize,
    n: usize,
    bias: Option<&[f32]>,
    residual: Option<&[f32]>,
    activation: EpilogueActivation,
) {
    let idle = bias.is_none() && residual.is_none() && activation == EpilogueActivation::Identity;
    if idle || n == 0 {
        return;
    }
    let rows_per_task = (crate::PARALLEL_THRESHOLD / n).max(1);
    if rows <= rows_per_task {
        finish_rows(out, n, bias, residual, activation);
    } else {
        out.par_chunks_mut(rows_per_task * n)
            .enumerate()
            .for_each(|(i, chunk)| {
                let start = i * rows_per_task * n;
                let res = residual.map(|r| &r[start..start + chunk.len()]);
                finish_rows(chunk, n, bias, res, activation);
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reference(x: &[f32], rows: usize, k: usize, w: &[f32], n: usize) -> Vec<f64> {
        let mut y = vec![0.0f64; rows * n];
        for r in 0..rows {
            for j in 0..n {
                y[r * n + j] = (0..k)
                    .map(|i| x[r * k + i] as f64 * w[i * n + j] as f64)
                    .sum();
            }
        }
        y
    }

    #[test]
    fn product_bias_residual_and_activation() {
        for &(rows, k, n) in &[(1, 1, 1), (3, 5, 7), (64, 96, 80), (300, 128, 256)] {
            let x: Vec<f32> = (0..rows * k)
                .map(|i| ((i * 13) % 7) as f32 * 0.1 - 0.3)
                .collect();
            let w: Vec<f32> = (0..k * n)
                .map(|i| ((i * 5) % 11) as f32 * 0.05 - 0.25)
                .collect();
            let b: Vec<f32> = (0..n).map(|i| i as f32 * 0.01).collect();
            let res: Vec<f32> = (0..rows * n).map(|i| (i % 3) as f32 - 1.0).collect();
            let want = reference(&x, rows, k, &w, n);
            let plain = linear(&x, rows, k, &w, n, Epilogue::default());
            let fused = Epilogue {
                bias: Some(&b),
                residual: Some(&res),
                activation: EpilogueActivation::Relu,
            };
            let fused = linear(&x, rows, k, &w, n, fused);
            for i in 0..rows * n {
                let tol = 1e-5 * (1.0 + want[i].abs());
                assert!((plain[i] as f64 - want[i]).abs() < tol);
                let f = (want[i] + b[i % n] as f64 + res[i] as f64).max(0.0);
                assert!((fused[i] as f64 - f).abs() < tol, "{rows}x{k}x{n} at {i}");
            }
        }
    }

    #[test]
    fn empty_inner_dimension_gives_the_bias() {
        let bias = Epilogue {
            bias: Some(&[1.0, 2.0, 3.0]),
            ..Epilogue::default()
        };
        let out = linear(&[], 2, 0, &[], 3, bias);
        assert_eq!(out, vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    }
}
