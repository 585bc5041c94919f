//! Element-wise transcendental kernels: exp, GELU (erf and tanh forms), SiLU, softmax rows.

use rayon::prelude::*;

/// Elements per parallel task of an element-wise kernel.
const CHUNK: usize = 1 << 14;

/// `e^x` for one value, branch-free so loops over it vectorise: `x = n ln2 + r` with
/// `|r| ≤ ln2 / 2`, `e^r` by its degree-7 Taylor polynomial (relative error < 2e-7), `2^n` built
/// in the exponent bits. Inputs are clamped to `[-87, 88]` (results `1.6e-38 ..= 1.65e38`);
/// NaN stays NaN.
#[inline(always)]
pub(crate) fn exp_one(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // Adding 1.5 · 2^23 rounds to the nearest integer and leaves it in the low mantissa bits,
    // so `n` and `2^n` come without a float → int conversion (which does not vectorise).
    const ROUNDER: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = x * LOG2E + ROUNDER;
    let n = t - ROUNDER;
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0
                    + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r / 5040.0))))));
    // n ∈ [-126, 127]: the biased exponent n + 127 is a normal float's.
    let scale = f32::from_bits(
        t.to_bits()
            .wrapping_sub(ROUNDER.to_bits())
            .wrapping_add(127)
            << 23,
    );
    p * scale
}

/// Abramowitz & Stegun 7.1.26: for `a ≥ 0`, `erfc(a) ≈ poly(a) · e^{-a²}`, so
/// `erf(a) = 1 - erfc(a)` with absolute error < 1.5e-7.
#[inline(always)]
fn erfc_poly(a: f32) -> f32 {
    const P: f32 = 0.327_591_1;
    const A1: f32 = 0.254_829_6;
    const A2: f32 = -0.284_496_74;
    const A3: f32 = 1.421_413_7;
    const A4: f32 = -1.453_152_1;
    const A5: f32 = 1.061_405_4;
    let t = 1.0 / (1.0 + P * a);
    t * (A1 + t * (A2 + t * (A3 + t * (A4 + t * A5))))
}

/// `tanh(y) = 1 - 2 / (e^{2y} + 1)`.
#[inline(always)]
fn tanh_one(y: f32) -> f32 {
    1.0 - 2.0 / (exp_one(2.0 * y) + 1.0)
}

multiversion! {
    fn exp_serial(x: &mut [f32]) {
        for v in x.iter_mut() {
            *v = exp_one(*v);
        }
    }
}

/// Exact GELU of one value, `x/2 · (1 + erf(x/√2))`. `1 + erf` is taken from the same
/// approximation without the cancellation of adding 1 to ≈ −1 for negative `x`: absolute error
/// ≤ 0.75e-7 · |x|.
#[inline(always)]
pub(crate) fn gelu_erf_one(x: f32) -> f32 {
    let a = (x * std::f32::consts::FRAC_1_SQRT_2).abs();
    let erfc = erfc_poly(a) * exp_one(-a * a);
    let one_plus_erf = if x < 0.0 { erfc } else { 2.0 - erfc };
    0.5 * x * one_plus_erf
}

/// Tanh-approximated GELU of one value.
#[inline(always)]
pub(crate) fn gelu_tanh_one(a: f32) -> f32 {
    const C: f32 = 0.797_884_6; // sqrt(2 / pi)
    0.5 * a * (1.0 + tanh_one(C * (a + 0.044_715 * a * a * a)))
}

/// `a · sigmoid(slope · a)` of one value.
#[inline(always)]
pub(crate) fn sigmoid_mul_one(a: f32, slope: f32) -> f32 {
    a / (1.0 + exp_one(-slope * a))
}

multiversion! {
    fn gelu_erf_serial(x: &mut [f32]) {
        for v in x.iter_mut() {
            *v = gelu_erf_one(*v);
        }
    }
}

multiversion! {
    fn gelu_tanh_serial(x: &mut [f32]) {
        for v in x.iter_mut() {
            *v = gelu_tanh_one(*v);
        }
    }
}

multiversion! {
    fn sigmoid_mul_serial(x: &mut [f32], slope: f32) {
        for v in x.iter_mut() {
            *v = sigmoid_mul_one(*v, slope);
        }
    }
}

/// Runs `f` over `x` in parallel chunks when `x` is large.
fn par_apply(x: &mut [f32], f: impl Fn(&mut [f32]) + Send + Sync) {
    if x.len() <= CHUNK {
        f(x);
    } else {
        x.par_chunks_mut(CHUNK).for_each(f);
    }
}

/// `e^x` in place (see the crate docs for the accuracy).
pub fn exp(x: &mut [f32]) {
    par_apply(x, exp_serial);
}

/// Exact GELU in place: `x/2 · (1 + erf(x/√2))` (`hidden_act = "gelu"`).
pub fn gelu_erf(x: &mut [f32]) {
    par_apply(x, gelu_erf_serial);
}

/// GELU with the tanh approximation in place (`gelu_new`, `gelu_pytorch_tanh`).
pub fn gelu_tanh(x: &mut [f32]) {
    par_apply(x, gelu_tanh_serial);
}

/// SiLU in place: `x · sigmoid(x)`.
pub fn silu(x: &mut [f32]) {
    par_apply(x, |c| sigmoid_mul_serial(c, 1.0));
}

/// CLIP's quick GELU in place: `x · sigmoid(1.702 x)`.
pub fn quick_gelu(x: &mut [f32]) {
    par_apply(x, |c| sigmoid_mul_serial(c, 1.702));
}

multiversion! {
    /// One row of softmax weights before normalisation: adds the bias row (`bias[j · stride]`;
    /// none when `bias` is empty), replaces each value by `e^(value − max)` and returns `1 / Σ`
    /// (attention applies it to the narrower weighted sum of the values instead of every weight).
    pub(crate) fn exp_row(row: &mut [f32], bias: &[f32], stride: usize) -> f32 {
        if !bias.is_empty() {
            if stride == 1 {
                for (r, b) in row.iter_mut().zip(bias) {
                    *r += *b;
                }
            } else {
                for (j, r) in row.iter_mut().enumerate() {
                    *r += bias[j * stride];
                }
            }
        }
        let mut max = [f32::NEG_INFINITY; 16];
        let mut chunks = row.chunks_exact(16);
        for c in &mut chunks {
            for (m, v) in max.iter_mut().zip(c) {
                *m = m.max(*v);
            }
        }
        for v in chunks.remainder() {
            max[0] = max[0].max(*v);
        }
        let max = max.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let mut sum = [0.0f32; 16];
        let mut chunks = row.chunks_exact_mut(16);
        for c in &mut chunks {
            for (s, v) in sum.iter_mut().zip(c.iter_mut()) {
                *v = exp_one(*v - max);
                *s += *v;
            }
        }
        for v in chunks.into_remainder() {
            *v = exp_one(*v - max);
            sum[0] += *v;
        }
        1.0 / sum.iter().sum::<f32>()
    }
}

multiversion! {
    /// Softmax of one row in place.
    fn softmax_row(x: &mut [f32]) {
        let inv = exp_row(x, &[], 1);
        for v in x.iter_mut() {
            *v *= inv;
        }
    }
}

/// Softmax over each row of `cols` values of `x` (row-major), in place.
pub fn softmax_rows(x: &mut [f32], cols: usize) {
    if cols == 0 {
        return;
    }
    if x.len() <= CHUNK {
        x.chunks_mut(cols).for_each(softmax_row);
    } else {
        x.par_chunks_mut(cols).for_each(softmax_row);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// erf by Simpson's rule on 2/√π ∫₀ˣ e^{-t²} dt (error ~1e-13 for |x| ≤ 8).
    fn erf_ref(x: f64) -> f64 {
        let n = 4000;
        let h = x / n as f64;
        let f = |t: f64| (-t * t).exp();
        let mut s = f(0.0) + f(x);
        for i in 1..n {
            s += f(i as f64 * h) * if i % 2 == 1 { 4.0 } else { 2.0 };
        }
        s * h / 3.0 * 2.0 / std::f64::consts::PI.sqrt()
    }

    #[test]
    fn exp_is_accurate_over_its_range() {
        let mut xs: Vec<f32> = (-8700..=8800).map(|i| i as f32 * 0.01).collect();
        let want: Vec<f64> = xs.iter().map(|&x| (x as f64).exp()).collect();
        exp(&mut xs);
        for (g, w) in xs.iter().zip(&want) {
            assert!(((*g as f64) - w).abs() <= 3e-7 * w, "{g} vs {w}");
        }
    }

    #[test]
    fn exp_clamps_and_keeps_nan() {
        let mut xs = vec![-1000.0, f32::MIN, 1000.0, f32::NAN];
        exp(&mut xs);
        assert!(xs[0] > 0.0 && xs[0] < 1e-37);
        assert!(xs[1] < 1e-37);
        assert!(xs[2].is_finite() && xs[2] > 1e38);
        assert!(xs[3].is_nan());
    }

    #[test]
    fn gelu_matches_the_erf_definition() {
        let mut xs: Vec<f32> = (-2000..=2000).map(|i| i as f32 * 0.005).collect();
        let want: Vec<f64> = xs
            .iter()
            .map(|&x| {
                let x = x as f64;
                0.5 * x * (1.0 + erf_ref(x / 2f64.sqrt()))
            })
            .collect();
        let x0 = xs.clone();
        gelu_erf(&mut xs);
        for ((g, w), x) in xs.iter().zip(&want).zip(&x0) {
            // erf's absolute error (1.5e-7) scaled by x/2, plus a few ulp of f32 rounding.
            let bound = 0.75e-7 * x.abs() as f64 + 5e-7 * w.abs() + 1e-9;
            assert!(((*g as f64) - w).abs() <= bound, "gelu({x}) = {g} vs {w}");
        }
    }

    #[test]
    fn tanh_gelu_and_silu_match_their_definitions() {
        let base: Vec<f32> = (-1000..=1000).map(|i| i as f32 * 0.01).collect();
        let mut g = base.clone();
        gelu_tanh(&mut g);
        let mut s = base.clone();
        silu(&mut s);
        let mut q = base.clone();
        quick_gelu(&mut q);
        for (i, &x) in base.iter().enumerate() {
            let xd = x as f64;
            let gt = 0.5
                * xd
                * (1.0
                    + ((2.0 / std::f64::consts::PI).sqrt() * (xd + 0.044715 * xd.powi(3))).tanh());
            let st = xd / (1.0 + (-xd).exp());
            let qt = xd / (1.0 + (-1.702 * xd).exp());
            assert!(
                (g[i] as f64 - gt).abs() <= 5e-7 * (1.0 + gt.abs()),
                "gelu_tanh({x})"
            );
            assert!(
                (s[i] as f64 - st).abs() <= 5e-7 * (1.0 + st.abs()),
                "silu({x})"
            );
            assert!(
                (q[i] as f64 - qt).abs() <= 5e-7 * (1.0 + qt.abs()),
                "quick_gelu({x})"
            );
        }
    }

    #[test]
    fn softmax_rows_sum_to_one_and_match() {
        let cols = 37;
        let mut x: Vec<f32> = (0..cols * 5)
            .map(|i| ((i * 7919) % 101) as f32 * 0.3 - 15.0)
            .collect();
        let orig = x.clone();
        softmax_rows(&mut x, cols);
        for (r, row) in x.chunks(cols).enumerate() {
            let o = &orig[r * cols..(r + 1) * cols];
            let m = o.iter().cloned().fold(f32::MIN, f32::max) as f64;
            let s: f64 = o.iter().map(|&v| (v as f64 - m).exp()).sum();
            for (g, &v) in row.iter().zip(o) {
                let w = (v as f64 - m).exp() / s;
                assert!((*g as f64 - w).abs() <= 1e-6 * w.max(1e-30) + 1e-12);
            }
        }
    }
}
