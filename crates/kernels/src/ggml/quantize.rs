//! Quantizing f32 values into the ggml block formats (the inverse of [`dequantize_row`]), as
//! ggml's reference `quantize_row_*_ref` (`ggml-quants.c`) does it, operation by operation in
//! f32: the same scale search (`make_qkx2_quants` for Q4_K / Q5_K, `make_qx_quants` for Q6_K),
//! the same roundings (`roundf` for Q8_0, truncation of `x + 8.5` for Q4_0, the round-half-even
//! `nearest_int` of the k-quants) and the same byte layouts. The blocks are therefore what
//! `llama-quantize` writes without an importance matrix (checked byte for byte against ggml's C
//! reference built without floating-point contraction; a build that fuses multiply-adds can
//! differ in the last rounding of a few values), and `dequantize_row`, ggml and every GGUF reader
//! read them.
//!
//! [`dequantize_row`]: super::dequantize_row

use super::format::{f16_to_f32, BlockType, GgmlError, QK_K};

/// The block formats [`quantize_row`] writes (besides the float types F32, F16 and BF16).
pub const QUANTIZED_FORMATS: [BlockType; 8] = [
    BlockType::Q8_0,
    BlockType::Q4_0,
    BlockType::Q4_1,
    BlockType::Q5_0,
    BlockType::Q5_1,
    BlockType::Q4_K,
    BlockType::Q5_K,
    BlockType::Q6_K,
];

/// `values` (a whole number of blocks of `ty`) quantized into `ty`'s blocks, as ggml's reference
/// `quantize_row_*_ref` lays them out: [`QUANTIZED_FORMATS`] and the float types F32, F16 and
/// BF16 (rounded to nearest even). Other formats are [`GgmlError::NotQuantizable`], a length that
/// is not a whole number of blocks [`GgmlError::PartialBlock`].
pub fn quantize_row(ty: BlockType, values: &[f32]) -> Result<Vec<u8>, GgmlError> {
    let block: fn(&[f32], &mut Vec<u8>) = match ty {
        BlockType::F32 => |x, o| o.extend(x[0].to_le_bytes()),
        BlockType::F16 => |x, o| o.extend(f16_bits(x[0]).to_le_bytes()),
        BlockType::BF16 => |x, o| o.extend(bf16_bits(x[0]).to_le_bytes()),
        BlockType::Q8_0 => q8_0,
        BlockType::Q4_0 => |x, o| q_sym(x, o, 4),
        BlockType::Q5_0 => |x, o| q_sym(x, o, 5),
        BlockType::Q4_1 => |x, o| q_affine(x, o, 4),
        BlockType::Q5_1 => |x, o| q_affine(x, o, 5),
        BlockType::Q4_K => |x, o| q_k_affine(x, o, 4),
        BlockType::Q5_K => |x, o| q_k_affine(x, o, 5),
        BlockType::Q6_K => q6_k,
        BlockType::Q8_1
        | BlockType::Q2_K
        | BlockType::Q3_K
        | BlockType::Q8_K
        | BlockType::IQ4_NL
        | BlockType::IQ4_XS => return Err(GgmlError::NotQuantizable { ty }),
    };
    let bs = ty.block_size();
    if !values.len().is_multiple_of(bs) {
        return Err(GgmlError::PartialBlock {
            ty,
            k: values.len(),
        });
    }
    let mut out = Vec::with_capacity(values.len() / bs * ty.type_size());
    for chunk in values.chunks_exact(bs) {
        block(chunk, &mut out);
    }
    Ok(out)
}

/// IEEE half bits of `v`, rounded to nearest even (overflow to infinity, NaN to a quiet NaN):
/// ggml's `GGML_FP32_TO_FP16`.
pub(crate) fn f16_bits(v: f32) -> u16 {
    let x = v.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let man = x & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        // Subnormal: shift the implicit bit in, round to nearest even.
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let rest = m & ((1 << shift) - 1);
        let mut h = m >> shift;
        if rest > half || (rest == half && h & 1 == 1) {
            h += 1;
        }
        return sign | h as u16;
    }
    let mut h = ((e as u32) << 10) | (man >> 13);
    let rest = man & 0x1fff;
    if rest > 0x1000 || (rest == 0x1000 && h & 1 == 1) {
        h += 1; // may carry into the exponent, which is the correct rounding
    }
    sign | h as u16
}

/// bfloat16 bits of `v`, rounded to nearest even (NaN kept quiet): ggml's `GGML_FP32_TO_BF16`.
pub(crate) fn bf16_bits(v: f32) -> u16 {
    let u = v.to_bits();
    if u & 0x7fff_ffff > 0x7f80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16
}

/// ggml's `nearest_int`: round half to even through the f32 adder (for `|v| <= 2^22`, which every
/// use here stays within for finite inputs; other values give some integer, then clamped).
#[inline(always)]
fn nearest_int(v: f32) -> i32 {
    let t = v + 12_582_912.0;
    (t.to_bits() & 0x7f_ffff) as i32 - 0x40_0000
}

/// `GROUP_MAX_EPS`: groups whose largest magnitude is below it are all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// `quantize_row_q8_0_ref`: the largest magnitude over 127, values rounded half away from zero.
fn q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x
        .iter()
        .fold(0f32, |m, v| if m > v.abs() { m } else { v.abs() });
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend(f16_bits(d).to_le_bytes());
    out.extend(x.iter().map(|v| (v * id).round() as i8 as u8));
}

/// `quantize_row_q4_0_ref` / `quantize_row_q5_0_ref` (`bits`): the value of largest magnitude
/// maps to `-2^(bits-1)`, the others truncated after adding `2^(bits-1) + 0.5`.
fn q_sym(x: &[f32], out: &mut Vec<u8>, bits: u32) {
    let levels = 1i32 << bits;
    let half = (levels / 2) as f32;
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    let d = max / -half;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    // `half + 0.5` is exact: one addition, as ggml's `x0 + 8.5f`.
    let offset = half + 0.5;
    let q: Vec<u8> = x
        .iter()
        .map(|v| ((v * id + offset) as i32).clamp(0, levels - 1) as u8)
        .collect();
    out.extend(f16_bits(d).to_le_bytes());
    pack_32(&q, bits, out);
}

/// `quantize_row_q4_1_ref` / `quantize_row_q5_1_ref`: min and max map to 0 and `2^bits - 1`.
fn q_affine(x: &[f32], out: &mut Vec<u8>, bits: u32) {
    let levels = (1i32 << bits) - 1;
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    let d = (max - min) / levels as f32;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q: Vec<u8> = x
        .iter()
        .map(|v| (((v - min) * id + 0.5) as i32).clamp(0, levels) as u8)
        .collect();
    out.extend(f16_bits(d).to_le_bytes());
    out.extend(f16_bits(min).to_le_bytes());
    pack_32(&q, bits, out);
}

/// 32 values of 4 or 5 bits: (for 5) the fifth bits as a little-endian u32, bit j for value j;
/// then 16 bytes, value j in the low nibble of byte j and value j + 16 in its high nibble.
fn pack_32(q: &[u8], bits: u32, out: &mut Vec<u8>) {
    if bits == 5 {
        let qh = q
            .iter()
            .enumerate()
            .fold(0u32, |h, (j, &v)| h | (u32::from(v >> 4) << j));
        out.extend(qh.to_le_bytes());
    }
    out.extend((0..16).map(|j| (q[j] & 0xf) | ((q[j + 16] & 0xf) << 4)));
}

/// ggml's `make_qkx2_quants` (squared error, no `use_mad`): the scale and minimum of `x ≈
/// scale·l − min` (`l` in `0..=nmax`, written to `l`) with the least `weights`-weighted error
/// over `nstep + 1` trial scales `(rmin + rdelta·is + nmax) / (max − min)`, each refined by least
/// squares. Returns `(scale, min)`, `min >= 0` the amount subtracted.
fn make_qkx2_quants(
    nmax: i32,
    x: &[f32],
    weights: &[f32],
    l: &mut [u8],
    (rmin, rdelta, nstep): (f32, f32, i32),
) -> (f32, f32) {
    let n = x.len();
    let (mut min, mut max) = (x[0], x[0]);
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for i in 1..n {
        if x[i] < min {
            min = x[i];
        }
        if x[i] > max {
            max = x[i];
        }
        let w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    let mut iscale = nmax as f32 / (max - min);
    let mut scale = 1.0 / iscale;
    let mut best_error = 0f32;
    for i in 0..n {
        let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
        l[i] = q as u8;
        let diff = scale * q as f32 + min - x[i];
        best_error += weights[i] * (diff * diff);
    }
    let mut laux = [0u8; 32];
    let laux = &mut laux[..n];
    for is in 0..=nstep {
        iscale = (rmin + rdelta * is as f32 + nmax as f32) / (max - min);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0f32, 0f32, 0f32);
        for i in 0..n {
            let q = nearest_int(iscale * (x[i] - min)).clamp(0, nmax);
            laux[i] = q as u8;
            let (w, q) = (weights[i], q as f32);
            sum_l += w * q;
            sum_l2 += w * q * q;
            sum_xl += w * q * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let mut cur_error = 0f32;
            for i in 0..n {
                let diff = this_scale * laux[i] as f32 + this_min - x[i];
                cur_error += weights[i] * (diff * diff);
            }
            if cur_error < best_error {
                l.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// ggml's `make_qx_quants` with `rmse_type` 1 and no importance weights (as Q6_K's reference
/// calls it): the signed scale of `x ≈ scale·(l − nmax)` (`l` in `0..2·nmax`, written to `l`)
/// maximising the `x²`-weighted fit over 19 trial scales `−(nmax + 0.1·is) / max`.
fn make_qx_quants(nmax: i32, x: &[f32], l: &mut [u8]) -> f32 {
    let (mut amax, mut max) = (0f32, 0f32);
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let code = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0f32, 0f32);
        for &v in x {
            let q = code(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        (sumlx, suml2)
    };
    let mut iscale = -(nmax as f32) / max;
    for (li, &v) in l.iter_mut().zip(x) {
        *li = (code(iscale, v) + nmax) as u8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (li, &v) in l.iter_mut().zip(x) {
                *li = (code(iscale, v) + nmax) as u8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// The 12 bytes of eight 6-bit scales and minimums of a Q4_K / Q5_K super-block (the layout
/// `get_scale_min_k4` reads).
fn pack_scales_k4(ls: &[u8; 8], lm: &[u8; 8]) -> [u8; 12] {
    let mut s = [0u8; 12];
    for j in 0..8 {
        if j < 4 {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (ls[j] & 0xf) | ((lm[j] & 0xf) << 4);
            s[j - 4] |= (ls[j] >> 4) << 6;
            s[j] |= (lm[j] >> 4) << 6;
        }
    }
    s
}

/// `quantize_row_q4_K_ref` / `quantize_row_q5_K_ref` (`bits`): eight sub-blocks of 32, each
/// `x ≈ d·sc·q − dmin·m` with 6-bit `sc` and `m`; each sub-block's scale and minimum from
/// [`make_qkx2_quants`] (weights `rms + |x|`), the super-block's f16 `d` / `dmin` the largest of
/// them over 63, and the values rounded again with the decoded sub-scales.
fn q_k_affine(x: &[f32], out: &mut Vec<u8>, bits: u32) {
    let nmax = (1i32 << bits) - 1;
    let search = if bits == 4 {
        (-1.0, 0.1, 20)
    } else {
        (-0.5, 0.1, 15)
    };
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    let (mut max_scale, mut max_min) = (0f32, 0f32);
    for (j, sub) in x.chunks_exact(32).enumerate() {
        let mut sum_x2 = 0f32;
        for &v in sub {
            sum_x2 += v * v;
        }
        let av_x = (sum_x2 / 32.0).sqrt();
        let mut weights = [0f32; 32];
        for (w, &v) in weights.iter_mut().zip(sub) {
            *w = av_x + v.abs();
        }
        let l = &mut l[32 * j..32 * j + 32];
        (scales[j], mins[j]) = make_qkx2_quants(nmax, sub, &weights, l, search);
        if scales[j] > max_scale {
            max_scale = scales[j];
        }
        if mins[j] > max_min {
            max_min = mins[j];
        }
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    // ggml stores `nearest_int` in a `uint8_t` (wrapping) before capping it at 63.
    let ls = std::array::from_fn(|j| (nearest_int(inv_scale * scales[j]) as u8).min(63));
    let lm = std::array::from_fn(|j| (nearest_int(inv_min * mins[j]) as u8).min(63));
    let d = f16_bits(max_scale / 63.0);
    let dmin = f16_bits(max_min / 63.0);
    for (j, sub) in x.chunks_exact(32).enumerate() {
        let dj = f16_to_f32(d) * f32::from(ls[j]);
        if dj == 0.0 {
            continue; // the search's values stay
        }
        let mj = f16_to_f32(dmin) * f32::from(lm[j]);
        for (q, &v) in l[32 * j..].iter_mut().zip(sub) {
            *q = nearest_int((v + mj) / dj).clamp(0, nmax) as u8;
        }
    }
    out.extend(d.to_le_bytes());
    out.extend(dmin.to_le_bytes());
    out.extend(pack_scales_k4(&ls, &lm));
    if bits == 5 {
        let mut qh = [0u8; 32];
        for (i, &v) in l.iter().enumerate() {
            qh[i % 32] |= (v >> 4) << (i / 32);
        }
        out.extend(qh);
    }
    for c in 0..4 {
        out.extend((0..32).map(|i| (l[64 * c + i] & 0xf) | ((l[64 * c + 32 + i] & 0xf) << 4)));
    }
}

/// `quantize_row_q6_K_ref`: sixteen sub-blocks of 16, `x ≈ d·sc·(q − 32)` with int8 `sc`; each
/// sub-block's scale from [`make_qx_quants`], `d` the largest magnitude over −128 (so that
/// sub-block's `sc` is −128), and the values rounded again with the decoded sub-scales.
fn q6_k(x: &[f32], out: &mut Vec<u8>) {
    let mut l = [0u8; QK_K];
    let mut scales = [0f32; 16];
    let (mut max_scale, mut max_abs_scale) = (0f32, 0f32);
    for (j, sub) in x.chunks_exact(16).enumerate() {
        scales[j] = make_qx_quants(32, sub, &mut l[16 * j..16 * j + 16]);
        if scales[j].abs() > max_abs_scale {
            max_abs_scale = scales[j].abs();
            max_scale = scales[j];
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        // ggml zeroes the whole block (d = 0).
        out.extend([0u8; 210]);
        return;
    }
    let iscale = -128.0 / max_scale;
    let d = f16_bits(1.0 / iscale);
    // ggml stores `MIN(127, nearest_int(..))` in an `int8_t` (wrapping).
    let sc: [i8; 16] = std::array::from_fn(|j| nearest_int(iscale * scales[j]).min(127) as i8);
    for (j, sub) in x.chunks_exact(16).enumerate() {
        let dj = f16_to_f32(d) * f32::from(sc[j]);
        if dj == 0.0 {
            continue; // the search's values stay
        }
        for (q, &v) in l[16 * j..].iter_mut().zip(sub) {
            *q = (nearest_int(v / dj).clamp(-32, 31) + 32) as u8;
        }
    }
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for n in 0..2 {
        let (j, ql, qh) = (128 * n, &mut ql[64 * n..], &mut qh[32 * n..]);
        for i in 0..32 {
            let [a, b, c, e] = [l[j + i], l[j + i + 32], l[j + i + 64], l[j + i + 96]];
            ql[i] = (a & 0xf) | ((c & 0xf) << 4);
            ql[i + 32] = (b & 0xf) | ((e & 0xf) << 4);
            qh[i] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6);
        }
    }
    out.extend(ql);
    out.extend(qh);
    out.extend(sc.map(|s| s as u8));
    out.extend(d.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::super::format::{bf16_to_f32, dequantize_row};
    use super::*;

    /// Deterministic roughly normal values of standard deviation `std` (xorshift64, the sum of
    /// four uniforms rescaled).
    fn normal(n: usize, seed: u64, std: f32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                let u: f32 = (0..4)
                    .map(|_| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                    })
                    .sum();
                u * std * 1.732_050_8
            })
            .collect()
    }

    /// Eight super-blocks that reach every path of the quantizers: zeros; std 1; std 0.02; std 1
    /// with an outlier; std 1 with one 32-value sub-block a hundred times smaller; a constant;
    /// positive values only; magnitudes around 1e4.
    fn mixed() -> Vec<f32> {
        let mut x = vec![0f32; QK_K];
        x.extend(normal(QK_K, 1, 1.0));
        x.extend(normal(QK_K, 2, 0.02));
        let mut o = normal(QK_K, 3, 1.0);
        o[77] = 12.0;
        x.extend(o);
        let mut s = normal(QK_K, 4, 1.0);
        s[96..128].iter_mut().for_each(|v| *v *= 0.01);
        x.extend(s);
        x.extend([0.5f32; QK_K]);
        x.extend(normal(QK_K, 5, 1.0).iter().map(|v| v.abs() + 0.1));
        x.extend(normal(QK_K, 6, 1e4));
        x
    }

    fn dequantized(ty: BlockType, q: &[u8], n: usize) -> Vec<f32> {
        let mut y = vec![f32::NAN; n];
        dequantize_row(ty, q, &mut y).unwrap();
        y
    }

    /// FNV-1a of the blocks of [`mixed`] as ggml's C reference writes them: the
    /// `quantize_row_*_ref` functions of `ggml-quants.c` (with `make_qkx2_quants` /
    /// `make_qx_quants`) and F16C's `_cvtss_sh` for `GGML_FP32_TO_FP16`, compiled by GCC 12 with
    /// `-O2 -ffp-contract=off`. The same comparison on twenty further rows of 16 384 values
    /// (std 1e-4 to 300, values on a 1/32 grid to make ties, runs of negative outliers) gave
    /// identical bytes for every format.
    const GGML_REFERENCE_FNV: [(BlockType, u64); 8] = [
        (BlockType::Q8_0, 0x9951_766d_fef0_59b6),
        (BlockType::Q4_0, 0x32f1_890f_0bb3_027a),
        (BlockType::Q4_1, 0x7f00_0bf1_8683_be8a),
        (BlockType::Q5_0, 0xe612_91b1_c48a_6824),
        (BlockType::Q5_1, 0x197a_edd0_f1fb_6374),
        (BlockType::Q4_K, 0x0e5f_94d7_32dc_ca79),
        (BlockType::Q5_K, 0x8d80_7e2d_8b46_95d2),
        (BlockType::Q6_K, 0x49d9_c4e8_49b6_8291),
    ];

    fn fnv1a(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    #[test]
    fn blocks_are_ggml_reference_bytes() {
        let x = mixed();
        for (ty, want) in GGML_REFERENCE_FNV {
            let q = quantize_row(ty, &x).unwrap();
            assert_eq!(fnv1a(&q), want, "{ty}");
        }
    }

    /// Bounds on the error over a block (a super-block for the k-quants) relative to its largest
    /// magnitude `A`: (RMS, largest).
    ///
    /// RMS: rounding to a step `h` errs by `h / √12` RMS, and `h` is `A/127` (Q8_0), `A/8`
    /// (Q4_0), `A/16` (Q5_0), at most `2A/15` (Q4_1, Q4_K: the range is at most `2A`), `2A/31`
    /// (Q5_1, Q5_K) and about `A/32` (Q6_K: a sub-block's largest magnitude over 32), that is
    /// `A/440`, `A/28`, `A/55`, `A/26`, `A/54`, `A/111`; the bounds allow about twice that:
    /// 1/250 (Q8_0), 1/12 (4-bit), 1/25 (5-bit), 1/60 (Q6_K).
    ///
    /// Largest: half a step plus the f16 rounding of the scale (`127·d·2^-11 = A/2048`) for
    /// Q8_0; a whole step for Q4_0 / Q5_0 (the positive extreme is clamped to `2^(b-1) - 1`);
    /// half a step plus the f16 rounding of `d` and `min` (`3A/2048`) for Q4_1 / Q5_1. The
    /// k-quants' search may clip an extreme for a smaller weighted squared error, so they have no
    /// tight worst case: their bounds are about 1.4× the worst of these inputs (1/13.6, 1/24.6,
    /// 1/62 of `A` for Q4_K, Q5_K, Q6_K).
    fn bounds(ty: BlockType) -> (f32, f32) {
        match ty {
            BlockType::Q8_0 => (1.0 / 250.0, 1.0 / 220.0),
            BlockType::Q4_0 => (1.0 / 12.0, 2.0 / 15.0),
            BlockType::Q5_0 => (1.0 / 25.0, 1.0 / 15.0),
            BlockType::Q4_1 => (1.0 / 12.0, 1.0 / 14.0),
            BlockType::Q5_1 => (1.0 / 25.0, 1.0 / 29.0),
            BlockType::Q4_K => (1.0 / 12.0, 1.0 / 10.0),
            BlockType::Q5_K => (1.0 / 25.0, 1.0 / 17.0),
            BlockType::Q6_K => (1.0 / 60.0, 1.0 / 45.0),
            other => unreachable!("{other}"),
        }
    }

    #[test]
    fn every_format_round_trips_within_its_bounds() {
        let mut rows = vec![mixed()];
        for (seed, std) in [(11, 0.02), (12, 1.0)] {
            let mut x = normal(32 * QK_K, seed, std);
            x[..QK_K].fill(0.0); // a (super-)block of zeros
            x[1000] = 10.0 * std; // an outlier
            rows.push(x);
        }
        for ty in QUANTIZED_FORMATS {
            let (rms_bound, max_bound) = bounds(ty);
            let (mut worst_rms, mut worst_max) = (0f32, 0f32);
            for x in &rows {
                let q = quantize_row(ty, x).unwrap();
                assert_eq!(Some(q.len()), ty.bytes_for(x.len()), "{ty}");
                let y = dequantized(ty, &q, x.len());
                let bs = ty.block_size();
                for (b, (xb, yb)) in x.chunks(bs).zip(y.chunks(bs)).enumerate() {
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                    if amax == 0.0 {
                        assert!(yb.iter().all(|&v| v == 0.0), "{ty} block {b}: zeros");
                        continue;
                    }
                    let sq: f32 = xb.iter().zip(yb).map(|(a, b)| (a - b) * (a - b)).sum();
                    let rms = (sq / bs as f32).sqrt() / amax;
                    let max = xb
                        .iter()
                        .zip(yb)
                        .fold(0f32, |m, (a, b)| m.max((a - b).abs()))
                        / amax;
                    assert!(rms <= rms_bound, "{ty} block {b}: RMS {rms} of max |x|");
                    assert!(max <= max_bound, "{ty} block {b}: error {max} of max |x|");
                    worst_rms = worst_rms.max(rms);
                    worst_max = worst_max.max(max);
                }
            }
            eprintln!(
                "{ty}: RMS <= 1/{:.1}, largest <= 1/{:.1} of max |x|",
                1.0 / worst_rms,
                1.0 / worst_max
            );
        }
    }

    /// `n` codes from `lo..=hi`, the first `lo` and the second `hi`.
    fn codes(lo: i32, hi: i32, n: usize) -> impl Iterator<Item = i32> {
        (0..n as i32).map(move |j| match j {
            0 => lo,
            1 => hi,
            _ => lo + (j * 37) % (hi - lo + 1),
        })
    }

    #[test]
    fn exactly_representable_values_come_back_exactly() {
        let u = 2f32.powi(-12);
        let mut cases: Vec<(BlockType, Vec<f32>)> = Vec::new();
        // Symmetric: codes times a power of two, the most negative code present (Q8_0:
        // integers -127..=127 times 2^-6).
        for (ty, lo, hi) in [
            (BlockType::Q8_0, -127, 127),
            (BlockType::Q4_0, -8, 7),
            (BlockType::Q5_0, -16, 15),
        ] {
            let s = 2f32.powi(-6);
            let x = (0..4).flat_map(|_| codes(lo, hi, 32)).map(|k| k as f32 * s);
            cases.push((ty, x.collect()));
        }
        // Affine: min + code·s with both extreme codes present.
        for (ty, hi) in [(BlockType::Q4_1, 15), (BlockType::Q5_1, 31)] {
            let x = (0..4)
                .flat_map(|_| codes(0, hi, 32))
                .map(|k| (k - 5) as f32 * 0.25);
            cases.push((ty, x.collect()));
        }
        // Q4_K / Q5_K: sub-block j is `k·c_j·u − e_j·8u` (so d = u, dmin = 8u, 6-bit scales
        // c_j and minimums e_j, the largest 63).
        for (ty, hi) in [(BlockType::Q4_K, 15), (BlockType::Q5_K, 31)] {
            let x = (0..8).flat_map(|j| {
                let (c, e) = (63 - 5 * j, 63 - 3 * j);
                codes(0, hi, 32).map(move |k| (k * c) as f32 * u - (e * 8) as f32 * u)
            });
            cases.push((ty, x.collect()));
        }
        // Q6_K: sub-block j is `k·c_j·u` (so d = -u and the int8 scales are -c_j, one -128).
        let x =
            (0..16).flat_map(|j| codes(-32, 31, 16).map(move |k| (k * (128 - 7 * j)) as f32 * u));
        cases.push((BlockType::Q6_K, x.collect()));
        for (ty, x) in cases {
            let y = dequantized(ty, &quantize_row(ty, &x).unwrap(), x.len());
            assert_eq!(y, x, "{ty}");
        }
    }

    #[test]
    fn zeros_quantize_to_zeros() {
        let x = [0f32; 2 * QK_K];
        for ty in QUANTIZED_FORMATS {
            let q = quantize_row(ty, &x).unwrap();
            assert!(
                dequantized(ty, &q, x.len()).iter().all(|&v| v == 0.0),
                "{ty}"
            );
        }
    }

    #[test]
    fn float_types_round_to_nearest_even() {
        let x = [
            1.0f32,
            -2.5,
            65504.0,
            1e-7,
            1.0 + 1.0 / 4096.0,
            1.0 + 3.0 / 4096.0,
        ];
        let f32s = dequantized(
            BlockType::F32,
            &quantize_row(BlockType::F32, &x).unwrap(),
            6,
        );
        assert_eq!(f32s, x);
        let f16s = dequantized(
            BlockType::F16,
            &quantize_row(BlockType::F16, &x).unwrap(),
            6,
        );
        let want = [1.0, -2.5, 65504.0, f16_to_f32(2), 1.0, 1.0 + 4.0 / 4096.0];
        assert_eq!(f16s, want);
        let y = [
            1.0f32,
            -2.5,
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            f32::INFINITY,
        ];
        let bf16s = dequantized(
            BlockType::BF16,
            &quantize_row(BlockType::BF16, &y).unwrap(),
            5,
        );
        assert_eq!(bf16s, [1.0, -2.5, 1.0, 1.0 + 4.0 / 256.0, f32::INFINITY]);
        assert!(bf16_to_f32(bf16_bits(f32::NAN)).is_nan());
    }

    #[test]
    fn bad_lengths_and_unsupported_formats_are_errors() {
        for (ty, n) in [
            (BlockType::Q4_K, 100),
            (BlockType::Q8_0, 33),
            (BlockType::Q6_K, 32),
        ] {
            assert_eq!(
                quantize_row(ty, &vec![0.0; n]),
                Err(GgmlError::PartialBlock { ty, k: n })
            );
        }
        for ty in BlockType::ALL {
            let supported = QUANTIZED_FORMATS.contains(&ty)
                || matches!(ty, BlockType::F32 | BlockType::F16 | BlockType::BF16);
            let got = quantize_row(ty, &[0.0; QK_K]);
            if supported {
                assert_eq!(got.unwrap().len(), ty.bytes_for(QK_K).unwrap(), "{ty}");
            } else {
                assert_eq!(got, Err(GgmlError::NotQuantizable { ty }));
                let msg = GgmlError::NotQuantizable { ty }.to_string();
                assert!(msg.contains(ty.name()), "{msg}");
            }
        }
        assert_eq!(
            quantize_row(BlockType::Q8_0, &[]).unwrap(),
            Vec::<u8>::new()
        );
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let cases = [
            (0.5, 0),
            (1.5, 2),
            (2.5, 2),
            (-0.5, 0),
            (-1.5, -2),
            (2.4999, 2),
            (-7.6, -8),
        ];
        for (v, want) in cases {
            assert_eq!(nearest_int(v), want, "{v}");
        }
    }

    #[test]
    fn half_conversion_rounds_to_nearest_even() {
        for bits in (0u16..0x7c00).step_by(7) {
            let v = f16_to_f32(bits);
            assert_eq!(f16_bits(v), bits, "{v}");
            assert_eq!(f16_bits(-v), bits | 0x8000);
        }
        assert_eq!(f16_bits(1.0 + 1.0 / 4096.0), 0x3c00); // a tie goes to even
        assert_eq!(f16_bits(1e6), 0x7c00);
    }
}
