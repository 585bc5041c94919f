//! Quantizing f32 values into the ggml block formats (the inverse of [`dequantize_row`]): the
//! byte layouts are ggml's, so `dequantize_row` (and ggml, and every GGUF reader) reads them.
//!
//! The 32-weight formats follow ggml's reference `quantize_row_*_ref` (Q8_0, Q4_0, Q4_1, Q5_0,
//! Q5_1). The k-quants (Q4_K, Q5_K, Q6_K) use a simpler scale search than ggml's iterative
//! `make_qkx2_quants` / `make_qx_quants`: each sub-block's range (min / max, or the largest
//! magnitude) gives its scale, the super-block's f16 scales are the largest sub-scales over 63
//! (or 127), and the values are rounded with the *decoded* sub-scales, so dequantisation is
//! consistent. Errors are within the formats' bounds (see the tests) but slightly larger than
//! llama.cpp's search gives: these blocks are for random-weight benchmarks, `--quantize` on
//! engines that compute on blocks, and tests.
//!
//! [`dequantize_row`]: super::dequantize_row

use super::format::{BlockType, GgmlError, QK_K};

/// The block formats [`quantize_row`] writes (besides the float types).
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

/// `values` (a whole number of blocks of `ty`) quantized into `ty`'s blocks.
pub fn quantize_row(ty: BlockType, values: &[f32]) -> Result<Vec<u8>, GgmlError> {
    let bs = ty.block_size();
    if !values.len().is_multiple_of(bs) {
        return Err(GgmlError::PartialBlock {
            ty,
            k: values.len(),
        });
    }
    let mut out = Vec::with_capacity(values.len() / bs * ty.type_size());
    let block: fn(&[f32], &mut Vec<u8>) = match ty {
        BlockType::F32 => |x, o| x.iter().for_each(|v| o.extend(v.to_le_bytes())),
        BlockType::F16 => |x, o| x.iter().for_each(|&v| o.extend(f16_bits(v).to_le_bytes())),
        BlockType::Q8_0 => q8_0,
        BlockType::Q4_0 => |x, o| q_sym(x, o, 4),
        BlockType::Q5_0 => |x, o| q_sym(x, o, 5),
        BlockType::Q4_1 => |x, o| q_affine(x, o, 4),
        BlockType::Q5_1 => |x, o| q_affine(x, o, 5),
        BlockType::Q4_K => |x, o| q_k_affine(x, o, 4),
        BlockType::Q5_K => |x, o| q_k_affine(x, o, 5),
        BlockType::Q6_K => q6_k,
        other => return Err(GgmlError::NotQuantizable { ty: other }),
    };
    for chunk in values.chunks(bs) {
        block(chunk, &mut out);
    }
    Ok(out)
}

/// IEEE half bits of `v`, rounded to nearest even (overflow to infinity).
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

fn f16_round(v: f32) -> f32 {
    super::format::f16_to_f32(f16_bits(v))
}

fn round_i(v: f32) -> i32 {
    v.round() as i32
}

/// Q8_0: the largest magnitude over 127.
fn q8_0(x: &[f32], out: &mut Vec<u8>) {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    out.extend(f16_bits(d).to_le_bytes());
    out.extend(x.iter().map(|v| round_i(v * id) as i8 as u8));
}

/// Q4_0 / Q5_0 (`bits`): the value of largest magnitude maps to -2^(bits-1).
fn q_sym(x: &[f32], out: &mut Vec<u8>, bits: u32) {
    let levels = 1 << bits;
    let half = (levels / 2) as f32;
    let max = x
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let d = max / -half;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    let q: Vec<u8> = x
        .iter()
        .map(|v| ((v * id + half + 0.5) as i32).clamp(0, levels - 1) as u8)
        .collect();
    out.extend(f16_bits(d).to_le_bytes());
    pack_32(&q, bits, out);
}

/// Q4_1 / Q5_1: min and max map to 0 and 2^bits - 1.
fn q_affine(x: &[f32], out: &mut Vec<u8>, bits: u32) {
    let levels = (1 << bits) - 1;
    let min = x.iter().copied().fold(f32::INFINITY, f32::min);
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
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

/// Q4_K / Q5_K: eight sub-blocks of 32, each `x ≈ d·sc·q − dmin·m` with 6-bit `sc` and `m`.
fn q_k_affine(x: &[f32], out: &mut Vec<u8>, bits: u32) {
    let levels = ((1 << bits) - 1) as f32;
    let mut scales = [0f32; 8];
    let mut mins = [0f32; 8];
    for (j, sub) in x.chunks(32).enumerate() {
        let min = sub.iter().copied().fold(f32::INFINITY, f32::min).min(0.0);
        let max = sub.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        scales[j] = (max - min) / levels;
        mins[j] = -min;
    }
    let max_scale = scales.iter().copied().fold(0f32, f32::max);
    let max_min = mins.iter().copied().fold(0f32, f32::max);
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut ls = [0u8; 8];
    let mut lm = [0u8; 8];
    for j in 0..8 {
        ls[j] = round_i(inv_scale * scales[j]).clamp(0, 63) as u8;
        lm[j] = round_i(inv_min * mins[j]).clamp(0, 63) as u8;
    }
    let d = f16_round(max_scale / 63.0);
    let dmin = f16_round(max_min / 63.0);
    let mut q = [0u8; QK_K];
    for (j, sub) in x.chunks(32).enumerate() {
        let dj = d * f32::from(ls[j]);
        let mj = dmin * f32::from(lm[j]);
        for (l, &v) in sub.iter().enumerate() {
            q[32 * j + l] = if dj == 0.0 {
                0
            } else {
                round_i((v + mj) / dj).clamp(0, levels as i32) as u8
            };
        }
    }
    out.extend(f16_bits(d).to_le_bytes());
    out.extend(f16_bits(dmin).to_le_bytes());
    out.extend(pack_scales_k4(&ls, &lm));
    if bits == 5 {
        let mut qh = [0u8; 32];
        for (i, &v) in q.iter().enumerate() {
            qh[i % 32] |= (v >> 4) << (i / 32);
        }
        out.extend(qh);
    }
    for c in 0..4 {
        out.extend((0..32).map(|l| (q[64 * c + l] & 0xf) | ((q[64 * c + 32 + l] & 0xf) << 4)));
    }
}

/// Q6_K: sixteen sub-blocks of 16, `x ≈ d·sc·(q − 32)` with int8 `sc`.
fn q6_k(x: &[f32], out: &mut Vec<u8>) {
    let mut scales = [0f32; 16];
    for (j, sub) in x.chunks(16).enumerate() {
        let max = sub
            .iter()
            .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
        scales[j] = max / -32.0;
    }
    let max_scale = scales
        .iter()
        .fold(0f32, |m, &v| if v.abs() > m.abs() { v } else { m });
    let iscale = if max_scale != 0.0 {
        -128.0 / max_scale
    } else {
        0.0
    };
    let d = f16_round(if iscale != 0.0 { 1.0 / iscale } else { 0.0 });
    let mut sc = [0i8; 16];
    let mut q = [32u8; QK_K];
    for (j, sub) in x.chunks(16).enumerate() {
        sc[j] = round_i(iscale * scales[j]).clamp(-128, 127) as i8;
        let dj = d * f32::from(sc[j]);
        if dj == 0.0 {
            continue;
        }
        for (l, &v) in sub.iter().enumerate() {
            q[16 * j + l] = (round_i(v / dj).clamp(-32, 31) + 32) as u8;
        }
    }
    let mut ql = [0u8; 128];
    let mut qh = [0u8; 64];
    for n in 0..2 {
        let (j, ql, qh) = (128 * n, &mut ql[64 * n..], &mut qh[32 * n..]);
        for l in 0..32 {
            let [a, b, c, e] = [q[j + l], q[j + l + 32], q[j + l + 64], q[j + l + 96]];
            ql[l] = (a & 0xf) | ((c & 0xf) << 4);
            ql[l + 32] = (b & 0xf) | ((e & 0xf) << 4);
            qh[l] = (a >> 4) | ((b >> 4) << 2) | ((c >> 4) << 4) | ((e >> 4) << 6);
        }
    }
    out.extend(ql);
    out.extend(qh);
    out.extend(sc.map(|s| s as u8));
    out.extend(f16_bits(d).to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::super::format::{dequantize_row, f16_to_f32};
    use super::*;

    /// The largest error per weight relative to the largest magnitude of its (super-)block: half
    /// a step of the format (a whole step for the clamped positive extreme of Q4_0 / Q5_0, whose
    /// levels run -2^(b-1) .. 2^(b-1) - 1), widened for the f16 scales and the k-quants' 6-bit
    /// sub-scales; about 1.25× the worst these seeds give.
    fn bound(ty: BlockType) -> f32 {
        match ty {
            BlockType::Q8_0 => 1.0 / 220.0,
            BlockType::Q4_0 => 2.0 / 15.0,
            BlockType::Q5_0 => 1.0 / 15.0,
            BlockType::Q4_1 => 1.0 / 13.0,
            BlockType::Q5_1 => 1.0 / 26.0,
            BlockType::Q4_K => 1.0 / 20.0,
            BlockType::Q5_K => 1.0 / 40.0,
            _ => 1.0 / 50.0, // Q6_K
        }
    }

    fn values(n: usize, seed: u64, std: f32) -> Vec<f32> {
        let mut s = seed | 1;
        (0..n)
            .map(|_| {
                // Sum of four uniforms: roughly normal.
                let u: f32 = (0..4)
                    .map(|_| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        (s >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                    })
                    .sum();
                u * std * 1.7
            })
            .collect()
    }

    #[test]
    fn every_format_round_trips_within_its_bound() {
        for ty in QUANTIZED_FORMATS {
            let n = 2 * QK_K;
            for (seed, std) in [(1, 0.02), (2, 1.0), (3, 30.0)] {
                let mut x = values(n, seed, std);
                x[..ty.block_size()].fill(0.0); // a block of zeros
                x[n - 3] = 10.0 * std; // an outlier
                let q = quantize_row(ty, &x).unwrap();
                assert_eq!(Some(q.len()), ty.bytes_for(n), "{ty}");
                let mut y = vec![0f32; n];
                dequantize_row(ty, &q, &mut y).unwrap();
                assert!(
                    y[..ty.block_size()].iter().all(|&v| v == 0.0),
                    "{ty}: zeros"
                );
                let span = ty.block_size();
                for (b, (xb, yb)) in x.chunks(span).zip(y.chunks(span)).enumerate() {
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let worst = xb
                        .iter()
                        .zip(yb)
                        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                    assert!(
                        worst <= bound(ty) * amax + 1e-30,
                        "{ty} std {std} block {b}: error {worst} of max {amax}"
                    );
                }
            }
        }
    }

    #[test]
    fn exactly_representable_values_come_back_exactly() {
        let x: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.25).collect();
        // Q8_0: d = 4 / 127 is not a power of two, but Q4_1's d and min are.
        let q = quantize_row(BlockType::Q4_1, &x[..16].repeat(2)).unwrap();
        let mut y = vec![0f32; 32];
        dequantize_row(BlockType::Q4_1, &q, &mut y).unwrap();
        assert_eq!(y, x[..16].repeat(2));
        let ints: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 127.0 / 16.0).collect();
        let q = quantize_row(BlockType::Q8_0, &ints).unwrap();
        assert_eq!(f16_to_f32(u16::from_le_bytes([q[0], q[1]])), 1.0);
        dequantize_row(BlockType::Q8_0, &q, &mut y).unwrap();
        let want: Vec<f32> = ints.iter().map(|v| v.round()).collect();
        assert_eq!(y, want);
    }

    #[test]
    fn bad_lengths_and_unsupported_formats_are_errors() {
        assert!(matches!(
            quantize_row(BlockType::Q4_K, &[0.0; 100]),
            Err(GgmlError::PartialBlock { .. })
        ));
        assert!(matches!(
            quantize_row(BlockType::Q2_K, &[0.0; 256]),
            Err(GgmlError::NotQuantizable { .. })
        ));
        assert_eq!(
            quantize_row(BlockType::Q8_0, &[]).unwrap(),
            Vec::<u8>::new()
        );
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
