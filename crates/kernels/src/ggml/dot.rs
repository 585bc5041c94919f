//! Portable integer dot products of one weight row (ggml blocks) with one quantized activation
//! row ([`ActRow`]): the sums the SIMD kernels compute, in plain Rust.
//!
//! Per block, the integer sum of weight codes × activation codes is exact in i32; the scales,
//! offsets and minimums are applied once per block (32-value formats) or once per 256 values
//! with the sub-block scales inside the integer sum (k-quants):
//! - Q4_0 / Q5_0: `Σ (q - o)·x = d_w·d_x·Σ q·qx - o·d_w·(d_x·Σ qx)` with `o` = 8 / 16;
//! - Q4_1 / Q5_1: `d_w·d_x·Σ q·qx + m_w·(d_x·Σ qx)`;
//! - Q8_0: `d_w·d_x·Σ q·qx`;
//! - Q4_K / Q5_K: `d_x·(d·Σ_s sc_s·Σ q·qx - dmin·Σ_s m_s·Σ qx)`;
//! - Q6_K: `d_x·d·Σ_s sc_s·(Σ q·qx - 32·Σ qx)`;
//! - Q2_K: `d_x·(d·Σ_s sc_s·Σ q·qx - dmin·Σ_s m_s·Σ qx)` over 16-value sub-blocks;
//! - Q3_K: `d_x·d·Σ_s (sc_s - 32)·Σ q·qx` with `q` in `-4..4`;
//! - IQ4_NL: `d_w·d_x·Σ v·qx` with `v` the table level of each code;
//! - IQ4_XS: `d_x·d·Σ_s sc_s·Σ v·qx` over 32-value sub-blocks.

use super::act::ActRow;
use super::format::{byte, f16_at, iq4xs_scale, k4_scales_mins, q3k_scales, KVALUES_IQ4NL};

/// `Σ w·x` over the 32-blocks of a Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 row: `codes` gives a
/// block's 32 unsigned (or signed) codes and `(d_w, m_w)`; the row value is
/// `Σ d_w·d_x·Σ q·qx + m_w·ds`.
#[inline(always)]
fn blocks32<const TS: usize>(
    w: &[u8],
    a: &ActRow<'_>,
    codes: impl Fn(&[u8; TS], &mut [i32; 32]) -> (f32, f32),
) -> f32 {
    let (blocks, _) = w.as_chunks::<TS>();
    let mut y = 0f32;
    let mut q = [0i32; 32];
    for (b, blk) in blocks.iter().enumerate() {
        let (dw, mw) = codes(blk, &mut q);
        let x = &a.qs[32 * b..32 * b + 32];
        let s: i32 = q.iter().zip(x).map(|(&q, &x)| q * i32::from(x)).sum();
        y += dw * a.d[b] * s as f32 + mw * a.ds[b];
    }
    y
}

fn q4_0(w: &[u8], a: &ActRow<'_>) -> f32 {
    blocks32::<18>(w, a, |b, q| {
        for j in 0..16 {
            q[j] = i32::from(b[2 + j] & 0x0F);
            q[j + 16] = i32::from(b[2 + j] >> 4);
        }
        let d = f16_at(b, 0);
        (d, -8.0 * d)
    })
}

fn q4_1(w: &[u8], a: &ActRow<'_>) -> f32 {
    blocks32::<20>(w, a, |b, q| {
        for j in 0..16 {
            q[j] = i32::from(b[4 + j] & 0x0F);
            q[j + 16] = i32::from(b[4 + j] >> 4);
        }
        (f16_at(b, 0), f16_at(b, 2))
    })
}

/// The 32 codes of a Q5_0 / Q5_1 block: 4 low bits from `qs`, the fifth from `qh`.
#[inline(always)]
fn five_bit(qh: u32, qs: &[u8], q: &mut [i32; 32]) {
    for j in 0..16 {
        q[j] = i32::from(qs[j] & 0x0F) | (((qh >> j) & 1) << 4) as i32;
        q[j + 16] = i32::from(qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4) as i32;
    }
}

fn q5_0(w: &[u8], a: &ActRow<'_>) -> f32 {
    blocks32::<22>(w, a, |b, q| {
        five_bit(u32::from_le_bytes([b[2], b[3], b[4], b[5]]), &b[6..22], q);
        let d = f16_at(b, 0);
        (d, -16.0 * d)
    })
}

fn q5_1(w: &[u8], a: &ActRow<'_>) -> f32 {
    blocks32::<24>(w, a, |b, q| {
        five_bit(u32::from_le_bytes([b[4], b[5], b[6], b[7]]), &b[8..24], q);
        (f16_at(b, 0), f16_at(b, 2))
    })
}

fn q8_0(w: &[u8], a: &ActRow<'_>) -> f32 {
    blocks32::<34>(w, a, |b, q| {
        for (q, &v) in q.iter_mut().zip(&b[2..34]) {
            *q = i32::from(v as i8);
        }
        (f16_at(b, 0), 0.0)
    })
}

fn iq4_nl(w: &[u8], a: &ActRow<'_>) -> f32 {
    blocks32::<18>(w, a, |b, q| {
        for j in 0..16 {
            q[j] = i32::from(KVALUES_IQ4NL[usize::from(b[2 + j] & 0x0F)]);
            q[j + 16] = i32::from(KVALUES_IQ4NL[usize::from(b[2 + j] >> 4)]);
        }
        (f16_at(b, 0), 0.0)
    })
}

/// The 2-bit field of value `e` of a Q2_K / Q3_K block whose 64 bytes of low bits start at
/// `qs`: bits `2·j` of byte `32·n + e % 32` for `e = 128·n + 32·j + ..`.
#[inline(always)]
fn two_bits(qs: &[u8], e: usize) -> i32 {
    let (n, j) = (e / 128, (e % 128) / 32);
    i32::from((qs[32 * n + e % 32] >> (2 * j)) & 3)
}

fn q2_k(w: &[u8], a: &ActRow<'_>) -> f32 {
    let (blocks, _) = w.as_chunks::<84>();
    let mut y = 0f32;
    for (b, blk) in blocks.iter().enumerate() {
        let x = &a.qs[256 * b..256 * b + 256];
        let bs = &a.bsums[16 * b..16 * b + 16];
        let (mut isum, mut msum) = (0i32, 0i32);
        for s in 0..16 {
            let dot: i32 = (16 * s..16 * s + 16)
                .map(|e| two_bits(&blk[16..80], e) * i32::from(x[e]))
                .sum();
            isum += i32::from(blk[s] & 0x0F) * dot;
            msum += i32::from(blk[s] >> 4) * i32::from(bs[s]);
        }
        let dx = a.d[b];
        y += dx * f16_at(blk, 80) * isum as f32 - dx * f16_at(blk, 82) * msum as f32;
    }
    y
}

fn q3_k(w: &[u8], a: &ActRow<'_>) -> f32 {
    let (blocks, _) = w.as_chunks::<110>();
    let mut y = 0f32;
    for (b, blk) in blocks.iter().enumerate() {
        let x = &a.qs[256 * b..256 * b + 256];
        let scales = q3k_scales(&blk[96..108]);
        let mut isum = 0i32;
        for (s, &sc) in scales.iter().enumerate() {
            let dot: i32 = (16 * s..16 * s + 16)
                .map(|e| {
                    // The high bit (bit 4·n + j of hmask[e % 32]) set means no -4.
                    let (n, j) = (e / 128, (e % 128) / 32);
                    let high = (blk[e % 32] >> (4 * n + j)) & 1;
                    let q = two_bits(&blk[32..96], e) - if high == 0 { 4 } else { 0 };
                    q * i32::from(x[e])
                })
                .sum();
            isum += (i32::from(sc) - 32) * dot;
        }
        y += a.d[b] * f16_at(blk, 108) * isum as f32;
    }
    y
}

fn iq4_xs(w: &[u8], a: &ActRow<'_>) -> f32 {
    let (blocks, _) = w.as_chunks::<136>();
    let mut y = 0f32;
    for (b, blk) in blocks.iter().enumerate() {
        let x = &a.qs[256 * b..256 * b + 256];
        let mut isum = 0i32;
        for ib in 0..8 {
            let qs = &blk[8 + 16 * ib..8 + 16 * ib + 16];
            let xs = &x[32 * ib..32 * ib + 32];
            let mut dot = 0i32;
            for j in 0..16 {
                dot += i32::from(KVALUES_IQ4NL[usize::from(qs[j] & 0x0F)]) * i32::from(xs[j]);
                dot += i32::from(KVALUES_IQ4NL[usize::from(qs[j] >> 4)]) * i32::from(xs[j + 16]);
            }
            isum += iq4xs_scale(blk, ib) * dot;
        }
        y += a.d[b] * f16_at(blk, 0) * isum as f32;
    }
    y
}

/// `Σ w·x` over the 256-blocks of a Q4_K / Q5_K row; `code(blk, e)` is the code of value `e`.
#[inline(always)]
fn k_scale_min<const TS: usize>(
    w: &[u8],
    a: &ActRow<'_>,
    code: impl Fn(&[u8; TS], usize) -> i32,
) -> f32 {
    let (blocks, _) = w.as_chunks::<TS>();
    let mut y = 0f32;
    for (b, blk) in blocks.iter().enumerate() {
        let (scales, mins) = k4_scales_mins(&blk[4..16]);
        let x = &a.qs[256 * b..256 * b + 256];
        let bs = &a.bsums[16 * b..16 * b + 16];
        let (mut isum, mut msum) = (0i32, 0i32);
        for s in 0..8 {
            let dot: i32 = (32 * s..32 * s + 32)
                .map(|e| code(blk, e) * i32::from(x[e]))
                .sum();
            isum += i32::from(byte(scales, s)) * dot;
            msum += i32::from(byte(mins, s)) * (i32::from(bs[2 * s]) + i32::from(bs[2 * s + 1]));
        }
        let dx = a.d[b];
        y += dx * f16_at(blk, 0) * isum as f32 - dx * f16_at(blk, 2) * msum as f32;
    }
    y
}

fn q4_k(w: &[u8], a: &ActRow<'_>) -> f32 {
    k_scale_min::<144>(w, a, |blk, e| {
        // Value e: byte 16 + 32·(e / 64) + e % 32, low nibble in the first half of the 64.
        let v = blk[16 + 32 * (e / 64) + e % 32];
        i32::from(if e % 64 < 32 { v & 0x0F } else { v >> 4 })
    })
}

fn q5_k(w: &[u8], a: &ActRow<'_>) -> f32 {
    k_scale_min::<176>(w, a, |blk, e| {
        let v = blk[48 + 32 * (e / 64) + e % 32];
        let low = if e % 64 < 32 { v & 0x0F } else { v >> 4 };
        // The fifth bit: bit e / 32 of qh[e % 32].
        let high = (blk[16 + e % 32] >> (e / 32)) & 1;
        i32::from(low | (high << 4))
    })
}

fn q6_k(w: &[u8], a: &ActRow<'_>) -> f32 {
    let (blocks, _) = w.as_chunks::<210>();
    let mut y = 0f32;
    for (b, blk) in blocks.iter().enumerate() {
        let x = &a.qs[256 * b..256 * b + 256];
        let bs = &a.bsums[16 * b..16 * b + 16];
        let mut isum = 0i32;
        for s in 0..16 {
            let mut dot = 0i32;
            for (e, &xe) in x.iter().enumerate().skip(16 * s).take(16) {
                // Value e = 128·n + 32·v + l: low nibble of ql[64·n + l + 32·(v % 2)] (the high
                // one for v >= 2), bits 2·v.. of qh[32·n + l].
                let (n, v, l) = (e / 128, (e % 128) / 32, e % 32);
                let ql = blk[64 * n + l + 32 * (v % 2)];
                let low = if v < 2 { ql & 0x0F } else { ql >> 4 };
                let high = (blk[128 + 32 * n + l] >> (2 * v)) & 3;
                dot += i32::from(low | (high << 4)) * i32::from(xe);
            }
            let sc = i32::from(blk[192 + s] as i8);
            isum += sc * (dot - 32 * i32::from(bs[s]));
        }
        y += a.d[b] * f16_at(blk, 208) * isum as f32;
    }
    y
}

/// Every weight row `j` of `w` (`stride` bytes each) against every activation row `a`, into
/// `out[a·ostride + j]`.
///
/// # Safety
/// `out + a·ostride + j` is writable for every activation row a and weight row j.
#[inline(always)]
unsafe fn each_row(
    w: &[u8],
    stride: usize,
    acts: &[ActRow<'_>],
    out: *mut f32,
    ostride: usize,
    row: impl Fn(&[u8], &ActRow<'_>) -> f32,
) {
    for (t, a) in acts.iter().enumerate() {
        for (j, r) in w.chunks_exact(stride).enumerate() {
            *out.add(t * ostride + j) = row(r, a);
        }
    }
}

/// Defines the many-row form of each one-row kernel.
macro_rules! many_rows {
    ($($row:ident => $rows:ident;)*) => {$(
        /// The portable kernel over every weight row (`stride` bytes each) of `w` and every
        /// activation row, into `out[a·ostride + j]`.
        ///
        /// # Safety
        /// `out + a·ostride + j` is writable for every activation row a and weight row j.
        pub(super) unsafe fn $rows(
            w: &[u8],
            stride: usize,
            acts: &[ActRow<'_>],
            out: *mut f32,
            ostride: usize,
        ) {
            each_row(w, stride, acts, out, ostride, $row)
        }
    )*};
}

many_rows! {
    q4_0 => q4_0_rows;
    q4_1 => q4_1_rows;
    q5_0 => q5_0_rows;
    q5_1 => q5_1_rows;
    q8_0 => q8_0_rows;
    q4_k => q4_k_rows;
    q5_k => q5_k_rows;
    q6_k => q6_k_rows;
    q2_k => q2_k_rows;
    q3_k => q3_k_rows;
    iq4_nl => iq4_nl_rows;
    iq4_xs => iq4_xs_rows;
}
