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
    let amax = x.iter().fold(0f32, |m, v| if m > v.abs() { m } else { v.abs() });
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

    #[test]
    fn dump_for_c() {
        let dir = std::path::Path::new("/tmp/ggmlref");
        let mut sets: Vec<Vec<f32>> = vec![mixed()];
        for seed in 0..20u64 {
            let std = [1e-4f32, 0.02, 1.0, 300.0][seed as usize % 4];
            let mut x = normal(64 * QK_K, 100 + seed, std);
            if seed % 3 == 0 {
                // ties: multiples of 1/16 and 1/32 of a power of two
                x.iter_mut().for_each(|v| *v = (*v * 32.0 / std).round() / 32.0);
            }
            if seed % 5 == 1 {
                x.iter_mut().step_by(7).for_each(|v| *v = -v.abs() * 3.0);
            }
            sets.push(x);
        }
        for (k, x) in sets.iter().enumerate() {
            std::fs::write(dir.join(format!("in{k}.f32")), x.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
            for ty in QUANTIZED_FORMATS {
                std::fs::write(dir.join(format!("rust{k}_{}.bin", ty.name())), quantize_row(ty, x).unwrap()).unwrap();
            }
        }
    }

    #[test]
    fn measure() {
        for ty in QUANTIZED_FORMATS {
            let mut worst_rms = 0f32;
            let mut worst_max = 0f32;
            for (seed, std) in [(11, 0.02), (12, 1.0)] {
                let mut x = normal(64 * QK_K, seed, std);
                x[1000] = 10.0 * std;
                let q = quantize_row(ty, &x).unwrap();
                let mut y = vec![0f32; x.len()];
                dequantize_row(ty, &q, &mut y).unwrap();
                for (xb, yb) in x.chunks(ty.block_size()).zip(y.chunks(ty.block_size())) {
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let sq: f32 = xb.iter().zip(yb).map(|(a, b)| (a - b) * (a - b)).sum();
                    let rms = (sq / xb.len() as f32).sqrt() / amax;
                    let mx = xb.iter().zip(yb).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / amax;
                    worst_rms = worst_rms.max(rms);
                    worst_max = worst_max.max(mx);
                }
            }
            let x = mixed();
            let q = quantize_row(ty, &x).unwrap();
            let mut y = vec![0f32; x.len()];
            dequantize_row(ty, &q, &mut y).unwrap();
            let mut mixed_rms = 0f32;
            let mut mixed_max = 0f32;
            for (xb, yb) in x.chunks(ty.block_size()).zip(y.chunks(ty.block_size())) {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                if amax == 0.0 { continue; }
                let sq: f32 = xb.iter().zip(yb).map(|(a, b)| (a - b) * (a - b)).sum();
                mixed_rms = mixed_rms.max((sq / xb.len() as f32).sqrt() / amax);
                mixed_max = mixed_max.max(xb.iter().zip(yb).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / amax);
            }
            eprintln!("{ty}: worst rms 1/{:.1} max 1/{:.1}; mixed rms 1/{:.1} max 1/{:.1}", 1.0 / worst_rms, 1.0 / worst_max, 1.0/mixed_rms, 1.0/mixed_max);
        }
    }
}
#[cfg(test)]
mod speed {
    #[path = "/tmp/old_quantize.rs"]
    #[allow(dead_code)]
    mod old;
    #[test]
    fn compare_err() {
        use crate::ggml::dequantize_row;
        for ty in super::QUANTIZED_FORMATS {
            for std in [0.02f32, 1.0] {
                let mut s = 12345u64;
                let x: Vec<f32> = (0..(1 << 18)).map(|_| { let u: f32 = (0..4).map(|_| { s ^= s << 13; s ^= s >> 7; s ^= s << 17; (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5 }).sum(); u * std * 1.732 }).collect();
                let e = |q: Vec<u8>| { let mut y = vec![0f32; x.len()]; dequantize_row(ty, &q, &mut y).unwrap(); (x.iter().zip(&y).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>() / x.len() as f64).sqrt() / std as f64 };
                eprintln!("{ty} std {std}: rms/std new {:.5} old {:.5}", e(super::quantize_row(ty, &x).unwrap()), e(old::quantize_row(ty, &x).unwrap()));
            }
        }
    }

    #[test]
    fn speed() {
        let x: Vec<f32> = (0..(1 << 22)).map(|i| ((i as f32 * 0.7381).sin() * 0.02)).collect();
        for ty in super::QUANTIZED_FORMATS {
            let t = std::time::Instant::now();
            let q = super::quantize_row(ty, &x).unwrap();
            eprintln!("{ty}: {:.1} ns/value ({})", t.elapsed().as_nanos() as f64 / x.len() as f64, q.len());
            let t = std::time::Instant::now();
            let q = old::quantize_row(ty, &x).unwrap();
            eprintln!("  old {ty}: {:.1} ns/value ({})", t.elapsed().as_nanos() as f64 / x.len() as f64, q.len());
        }
    }
}
