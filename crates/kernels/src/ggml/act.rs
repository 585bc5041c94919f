//! Activations quantized for the integer dot products: each block of 32 values (for the 32-value
//! formats, as ggml's Q8_0 / Q8_1) or of 256 (for the k-quants, as ggml's Q8_K) gets its own scale
//! `d = max|x| / 127` and codes `q = round(x / d)` in `-127..=127`, so `|x - q·d| <= d / 2` (plus
//! a few ulp of `x`). Beside them: per 32-block `d · Σ q` (the term the offsets and minimums of
//! the 32-value formats multiply), per 16 values of a 256-block `Σ q` (what the k-quants'
//! minimums and offsets multiply).

/// Quantized activation rows of one block size.
pub(crate) struct QuantActs {
    k: usize,
    block: usize,
    /// `[rows, k]` codes.
    qs: Vec<i8>,
    /// `[rows, k / block]` scales.
    d: Vec<f32>,
    /// `[rows, k / 32]` `d · Σ q` (32-blocks only).
    ds: Vec<f32>,
    /// `[rows, k / 16]` `Σ q` of each 16 values (256-blocks only).
    bsums: Vec<i16>,
}

/// One row of [`QuantActs`].
#[derive(Clone, Copy)]
pub(crate) struct ActRow<'a> {
    pub qs: &'a [i8],
    pub d: &'a [f32],
    pub ds: &'a [f32],
    pub bsums: &'a [i16],
}

impl QuantActs {
    /// Quantizes `x` (`[rows, k]`, `k` a multiple of `block`, 32 or 256).
    pub(crate) fn new(x: &[f32], rows: usize, k: usize, block: usize) -> QuantActs {
        debug_assert!(block == 32 || block == 256);
        debug_assert!(k.is_multiple_of(block) && x.len() == rows * k);
        let mut qs = vec![0i8; rows * k];
        let mut d = vec![0f32; rows * k / block];
        quantize_blocks(x, block, &mut qs, &mut d);
        let (ds, bsums) = if block == 32 {
            let ds = qs
                .chunks_exact(32)
                .zip(&d)
                .map(|(q, d)| d * q.iter().map(|&v| i32::from(v)).sum::<i32>() as f32)
                .collect();
            (ds, Vec::new())
        } else {
            let bsums = qs
                .chunks_exact(16)
                .map(|q| q.iter().map(|&v| i16::from(v)).sum::<i16>())
                .collect();
            (Vec::new(), bsums)
        };
        QuantActs {
            k,
            block,
            qs,
            d,
            ds,
            bsums,
        }
    }

    /// Row `r`.
    pub(crate) fn row(&self, r: usize) -> ActRow<'_> {
        let (k, nb) = (self.k, self.k / self.block);
        ActRow {
            qs: &self.qs[r * k..(r + 1) * k],
            d: &self.d[r * nb..(r + 1) * nb],
            ds: if self.ds.is_empty() {
                &[]
            } else {
                &self.ds[r * k / 32..(r + 1) * k / 32]
            },
            bsums: if self.bsums.is_empty() {
                &[]
            } else {
                &self.bsums[r * k / 16..(r + 1) * k / 16]
            },
        }
    }
}

multiversion! {
    /// Codes and scales of each `block` values of `x` (a block with a non-finite value gets a
    /// NaN scale, so the products it enters are NaN as in f32).
    fn quantize_blocks(x: &[f32], block: usize, qs: &mut [i8], d: &mut [f32]) {
        for ((xb, qb), db) in x.chunks_exact(block).zip(qs.chunks_exact_mut(block)).zip(d.iter_mut()) {
            let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
            // 0 · v is NaN exactly for an infinite or NaN v.
            let finite = xb.iter().fold(0f32, |s, v| s + 0.0 * v) == 0.0;
            if !finite {
                *db = f32::NAN;
                qb.fill(0);
            } else if amax == 0.0 {
                *db = 0.0;
                qb.fill(0);
            } else {
                *db = amax / 127.0;
                let inv = 127.0 / amax;
                for (q, v) in qb.iter_mut().zip(xb) {
                    *q = (v * inv).round_ties_even().clamp(-127.0, 127.0) as i8;
                }
            }
        }
    }
}
