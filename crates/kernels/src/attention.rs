//! Scaled dot-product attention over strided views, writing the merged-head layout.

use rayon::prelude::*;

use crate::math::exp_row;

/// Query rows per parallel task (bounds the score scratch to `QUERY_BLOCK × keys`).
const QUERY_BLOCK: usize = 64;

/// Bias values at or below this mask their key (HF's masks use the float type's most negative
/// finite value, `f32::MIN` in f32).
const MASKED: f32 = f32::MIN / 2.0;

/// A read-only 4-D view `[d0, d1, d2, d3]` into a slice: element `[i, j, k, l]` is
/// `data[offset + i·s0 + j·s1 + k·s2 + l·s3]`. Strides are non-negative; a stride of 0
/// broadcasts that dimension; the stride of a dimension of size 1 is ignored.
#[derive(Debug, Clone, Copy)]
pub struct StridedView<'a> {
    data: &'a [f32],
    offset: usize,
    shape: [usize; 4],
    strides: [usize; 4],
}

impl<'a> StridedView<'a> {
    /// The view, or `None` when a stride is negative or an element would fall outside `data`.
    pub fn new(
        data: &'a [f32],
        offset: usize,
        shape: [usize; 4],
        strides: [isize; 4],
    ) -> Option<Self> {
        let mut s = [0usize; 4];
        let mut last = offset;
        for d in 0..4 {
            // A dimension of size 1 is only ever read at index 0: its stride does not matter.
            s[d] = if shape[d] == 1 {
                0
            } else {
                usize::try_from(strides[d]).ok()?
            };
            if shape[d] == 0 {
                return Some(StridedView {
                    data,
                    offset,
                    shape,
                    strides: s,
                });
            }
            last = last.checked_add((shape[d] - 1).checked_mul(s[d])?)?;
        }
        (last < data.len()).then_some(StridedView {
            data,
            offset,
            shape,
            strides: s,
        })
    }

    /// The view's shape.
    pub fn shape(&self) -> [usize; 4] {
        self.shape
    }

    /// Pointer to element `[i, j, k, 0]`.
    fn ptr(&self, i: usize, j: usize, k: usize) -> *const f32 {
        let idx = self.offset + i * self.strides[0] + j * self.strides[1] + k * self.strides[2];
        // SAFETY: `new` checked that every in-shape index lies inside `data`; callers pass
        // in-shape indices.
        unsafe { self.data.as_ptr().add(idx) }
    }
}

/// A raw output pointer shared by tasks that write disjoint elements.
#[derive(Clone, Copy)]
struct OutPtr(*mut f32);

impl OutPtr {
    /// The pointer (a method, so closures capture the `Sync` wrapper, not the raw field).
    fn get(self) -> *mut f32 {
        self.0
    }
}
// SAFETY: every task writes a disjoint set of elements (its own batch, head and query rows).
unsafe impl Send for OutPtr {}
unsafe impl Sync for OutPtr {}

multiversion! {
    /// Multiplies `rows` rows of `width` values, `row_stride` apart from `ptr`, by their factors.
    fn scale_rows(out: OutPtr, row_stride: usize, width: usize, factors: &[f32]) {
        for (r, f) in factors.iter().enumerate() {
            // SAFETY: the caller owns these `factors.len()` rows of `width` values.
            let row = unsafe { std::slice::from_raw_parts_mut(out.get().add(r * row_stride), width) };
            for v in row {
                *v *= *f;
            }
        }
    }
}

/// `softmax(q kᵀ · scale + bias) v` for `q` `[batch, heads, queries, dim]`, `k`
/// `[batch, kv_heads, keys, dim]` and `v` `[batch, kv_heads, keys, v_dim]` (grouped-query
/// attention when `kv_heads` divides `heads`), with an optional additive `bias`
/// `[batch or 1, heads or 1, queries, keys]`. Writes `out` as `[batch, queries, heads, v_dim]`
/// row-major, the layout a merge of the heads wants, so no transpose copy follows. Parallel over
/// batch × heads × blocks of queries.
///
/// # Panics
/// When the shapes disagree or `out` has the wrong length.
pub fn attention(
    q: StridedView<'_>,
    k: StridedView<'_>,
    v: StridedView<'_>,
    bias: Option<StridedView<'_>>,
    scale: f32,
    out: &mut [f32],
) {
    let [batch, heads, queries, dim] = q.shape;
    let [kb, kv_heads, keys, kd] = k.shape;
    let [vb, vh, vk, v_dim] = v.shape;
    assert!(
        kb == batch && vb == batch && kd == dim && vh == kv_heads && vk == keys,
        "attention: q {:?}, k {:?}, v {:?} disagree",
        q.shape,
        k.shape,
        v.shape
    );
    assert!(
        kv_heads > 0 && heads.is_multiple_of(kv_heads),
        "attention: {heads} heads, {kv_heads} kv heads"
    );
    if let Some(b) = &bias {
        let [bb, bh, bq, bk] = b.shape;
        assert!(
            (bb == batch || bb == 1) && (bh == heads || bh == 1) && bq == queries && bk == keys,
            "attention: bias {:?} for scores [{batch}, {heads}, {queries}, {keys}]",
            b.shape
        );
    }
    assert_eq!(
        out.len(),
        batch * queries * heads * v_dim,
        "attention: output length"
    );
    if out.is_empty() {
        return;
    }
    let group = heads / kv_heads;
    let blocks = queries.div_ceil(QUERY_BLOCK);
    let out_ptr = OutPtr(out.as_mut_ptr());
    let task = |t: usize| {
        let (bh, blk) = (t / blocks, t % blocks);
        let (bi, hi) = (bh / heads, bh % heads);
        let kh = hi / group;
        let (mut q0, mut rows) = (
            blk * QUERY_BLOCK,
            QUERY_BLOCK.min(queries - blk * QUERY_BLOCK),
        );
        // A left-padded row's padding is skipped, so that the products see exactly the operands
        // of the row alone and it decodes in a left-padded batch as it does alone, bit for bit:
        // leading queries whose every key is masked (padding positions) get zeros, as PyTorch's
        // SDPA gives them, and leading keys masked for every remaining query (their weights
        // are zero) are left out of the products.
        let (bias_at, first) = match &bias {
            Some(b) => {
                let (i, j) = (
                    if b.shape[0] == 1 { 0 } else { bi },
                    if b.shape[1] == 1 { 0 } else { hi },
                );
                let at = move |r: usize, c: usize| {
                    b.data[b.offset
                        + i * b.strides[0]
                        + j * b.strides[1]
                        + r * b.strides[2]
                        + c * b.strides[3]]
                };
                let blind = (q0..q0 + rows)
                    .take_while(|&r| (0..keys).all(|c| at(r, c) <= MASKED))
                    .count();
                let dst = out_ptr.get();
                for r in q0..q0 + blind {
                    // SAFETY: row r of this (batch, head) is this task's, in bounds.
                    unsafe {
                        std::ptr::write_bytes(
                            dst.add(((bi * queries + r) * heads + hi) * v_dim),
                            0,
                            v_dim,
                        )
                    };
                }
                q0 += blind;
                rows -= blind;
                let masked = (0..keys)
                    .take_while(|&c| (q0..q0 + rows).all(|r| at(r, c) <= MASKED))
                    .count();
                (Some((b, i, j)), masked)
            }
            None => (None, 0),
        };
        if rows == 0 {
            return;
        }
        let seen = keys - first;
        let mut scores = vec![0.0f32; rows * seen];
        // SAFETY: the views were bounds-checked at construction and every index below is in
        // shape; `scores` is rows × keys; the output rows of this (batch, head, block) are
        // written by this task only.
        unsafe {
            if seen > 0 && dim > 0 {
                gemm::gemm(
                    rows,
                    seen,
                    dim,
                    scores.as_mut_ptr(),
                    1,
                    seen as isize,
                    false,
                    q.ptr(bi, hi, q0),
                    q.strides[3] as isize,
                    q.strides[2] as isize,
                    k.ptr(bi, kh, first),
                    k.strides[2] as isize,
                    k.strides[3] as isize,
                    0.0,
                    scale,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
            }
            let mut inv_sums = [0.0f32; QUERY_BLOCK];
            for (r, row) in scores.chunks_exact_mut(seen.max(1)).enumerate() {
                let (bias_row, stride) = match bias_at {
                    Some((b, i, j)) => {
                        let start = b.offset
                            + i * b.strides[0]
                            + j * b.strides[1]
                            + (q0 + r) * b.strides[2]
                            + first * b.strides[3];
                        let end = start + (seen - 1) * b.strides[3] + 1;
                        (&b.data[start..end], b.strides[3])
                    }
                    None => (&[][..], 1),
                };
                inv_sums[r] = exp_row(row, bias_row, stride);
            }
            let dst = out_ptr
                .get()
                .add(((bi * queries + q0) * heads + hi) * v_dim);
            if seen == 0 {
                for r in 0..rows {
                    std::ptr::write_bytes(dst.add(r * heads * v_dim), 0, v_dim);
                }
            } else {
                gemm::gemm(
                    rows,
                    v_dim,
                    seen,
                    dst,
                    1,
                    (heads * v_dim) as isize,
                    false,
                    scores.as_ptr(),
                    1,
                    seen as isize,
                    v.ptr(bi, kh, first),
                    v.strides[3] as isize,
                    v.strides[2] as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    gemm::Parallelism::None,
                );
                scale_rows(OutPtr(dst), heads * v_dim, v_dim, &inv_sums[..rows]);
            }
        }
    };
    let tasks = batch * heads * blocks;
    if tasks == 1 || batch * heads * queries * keys * dim < crate::PARALLEL_THRESHOLD {
        (0..tasks).for_each(task);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn contiguous(shape: [usize; 4]) -> [isize; 4] {
        [
            (shape[1] * shape[2] * shape[3]) as isize,
            (shape[2] * shape[3]) as isize,
            shape[3] as isize,
            1,
        ]
    }

    /// A left-padded row (its first keys masked for every query) gives the bits of the same
    /// row without the padding: what makes a batch of left-padded sequences decode as each
    /// does alone. Queries that see no key get zeros.
    #[test]
    fn leading_masked_keys_give_the_unpadded_bits() {
        let (h, d, dv) = (4, 64, 64);
        // Irregular values, so that a different order of the sums shows in the bits.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut noise = |n: usize| -> Vec<f32> {
            (0..n)
                .map(|_| {
                    seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                    ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 3.0
                })
                .collect()
        };
        for (pad, real, sq) in [
            (1usize, 21usize, 3usize),
            (12, 5, 1),
            (14, 3, 1),
            (14, 6, 2),
            (40, 21, 3),
        ] {
            let sk = pad + real;
            let qd = noise(h * sq * d);
            let kd = noise(h * sk * d);
            let vd = noise(h * sk * dv);
            // Causal over the real keys, padding masked.
            let bias: Vec<f32> = (0..sq * sk)
                .map(|i| {
                    let (qi, ki) = (i / sk, i % sk);
                    if ki < pad || ki - pad > qi + real - sq {
                        f32::MIN
                    } else {
                        0.0
                    }
                })
                .collect();
            fn view(data: &[f32], shape: [usize; 4], from: usize) -> StridedView<'_> {
                let st = contiguous([shape[0], shape[1], shape[2] + from, shape[3]]);
                StridedView::new(data, from * shape[3], shape, st).unwrap()
            }
            let run = |from: usize| {
                let keys = sk - from;
                let q = view(&qd, [1, h, sq, d], 0);
                let k = view(&kd, [1, h, keys, d], from);
                let v = view(&vd, [1, h, keys, dv], from);
                let b = StridedView::new(&bias, from, [1, 1, sq, keys], [0, 0, sk as isize, 1])
                    .unwrap();
                let mut out = vec![f32::NAN; sq * h * dv];
                attention(q, k, v, Some(b), 0.3, &mut out);
                out
            };
            let padded = run(0);
            let alone = run(pad);
            assert!(
                padded
                    .iter()
                    .zip(&alone)
                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                "pad {pad}: {padded:?} vs {alone:?}"
            );
        }
        // Every key masked: zeros, as PyTorch's SDPA gives.
        let data = vec![0.5f32; 2 * 4];
        let q = StridedView::new(&data[..4], 0, [1, 1, 1, 4], contiguous([1, 1, 1, 4])).unwrap();
        let k = StridedView::new(&data, 0, [1, 1, 2, 4], contiguous([1, 1, 2, 4])).unwrap();
        let masks = [f32::MIN, f32::MIN];
        let b = StridedView::new(&masks, 0, [1, 1, 1, 2], contiguous([1, 1, 1, 2])).unwrap();
        let mut out = vec![f32::NAN; 4];
        attention(q, k, k, Some(b), 1.0, &mut out);
        assert_eq!(out, vec![0.0; 4]);
    }

    #[test]
    fn matches_a_naive_reference_with_gqa_bias_and_strided_query() {
        let (b, h, kvh, sq, sk, d, dv) = (2, 4, 2, 70, 33, 8, 5);
        // q stored as [b, sq, h, d] and viewed as [b, h, sq, d].
        let qd: Vec<f32> = (0..b * sq * h * d)
            .map(|i| ((i * 37) % 23) as f32 * 0.05 - 0.5)
            .collect();
        let kd: Vec<f32> = (0..b * kvh * sk * d)
            .map(|i| ((i * 11) % 19) as f32 * 0.07 - 0.6)
            .collect();
        let vd: Vec<f32> = (0..b * kvh * sk * dv)
            .map(|i| ((i * 7) % 13) as f32 * 0.1 - 0.6)
            .collect();
        let bd: Vec<f32> = (0..b * sq * sk)
            .map(|i| {
                if i % 5 == 0 {
                    f32::MIN
                } else {
                    (i % 3) as f32 * 0.1
                }
            })
            .collect();
        let q = StridedView::new(
            &qd,
            0,
            [b, h, sq, d],
            [(sq * h * d) as isize, d as isize, (h * d) as isize, 1],
        )
        .unwrap();
        let k = StridedView::new(&kd, 0, [b, kvh, sk, d], contiguous([b, kvh, sk, d])).unwrap();
        let v = StridedView::new(&vd, 0, [b, kvh, sk, dv], contiguous([b, kvh, sk, dv])).unwrap();
        let bias = StridedView::new(
            &bd,
            0,
            [b, 1, sq, sk],
            [(sq * sk) as isize, 0, sk as isize, 1],
        )
        .unwrap();
        let scale = 0.3;
        let mut out = vec![f32::NAN; b * sq * h * dv];
        attention(q, k, v, Some(bias), scale, &mut out);
        for bi in 0..b {
            for hi in 0..h {
                let kh = hi / (h / kvh);
                for qi in 0..sq {
                    let s: Vec<f64> = (0..sk)
                        .map(|ki| {
                            let dot: f64 = (0..d)
                                .map(|x| {
                                    qd[((bi * sq + qi) * h + hi) * d + x] as f64
                                        * kd[((bi * kvh + kh) * sk + ki) * d + x] as f64
                                })
                                .sum();
                            dot * scale as f64 + bd[(bi * sq + qi) * sk + ki] as f64
                        })
                        .collect();
                    let m = s.iter().cloned().fold(f64::MIN, f64::max);
                    let e: Vec<f64> = s.iter().map(|x| (x - m).exp()).collect();
                    let z: f64 = e.iter().sum();
                    for x in 0..dv {
                        let want: f64 = (0..sk)
                            .map(|ki| e[ki] / z * vd[((bi * kvh + kh) * sk + ki) * dv + x] as f64)
                            .sum();
                        let got = out[((bi * sq + qi) * h + hi) * dv + x] as f64;
                        assert!(
                            (got - want).abs() < 1e-5,
                            "b{bi} h{hi} q{qi} x{x}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn out_of_bounds_views_are_refused() {
        let data = vec![0.0f32; 10];
        assert!(StridedView::new(&data, 0, [1, 1, 2, 5], [10, 10, 5, 1]).is_some());
        assert!(StridedView::new(&data, 1, [1, 1, 2, 5], [10, 10, 5, 1]).is_none());
        assert!(StridedView::new(&data, 0, [1, 1, 2, 5], [10, 10, -5, 1]).is_none());
    }
}
