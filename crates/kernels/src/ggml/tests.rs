#![allow(clippy::needless_range_loop)]

use rand::{Rng, SeedableRng};

use super::*;
use crate::EpilogueActivation;

type Rng64 = rand::rngs::StdRng;

/// A random finite f16 of magnitude 2^(e - 15), e in `exp`, with a random sign if `signed`.
fn f16_bits(rng: &mut Rng64, exp: std::ops::RangeInclusive<u16>, signed: bool) -> [u8; 2] {
    let sign = if signed && rng.random::<bool>() {
        0x8000
    } else {
        0
    };
    let e = rng.random_range(exp);
    let m = rng.random_range(0..1024u16);
    (sign | (e << 10) | m).to_le_bytes()
}

/// Offsets of the f16 scale (`true`: may be negative) and minimum fields of a block of `ty`.
fn f16_fields(ty: BlockType) -> &'static [(usize, bool)] {
    match ty {
        BlockType::Q4_0 | BlockType::Q5_0 | BlockType::Q8_0 | BlockType::IQ4_NL => &[(0, true)],
        BlockType::Q4_1 | BlockType::Q5_1 | BlockType::Q8_1 => &[(0, true), (2, true)],
        BlockType::Q4_K | BlockType::Q5_K => &[(0, true), (2, true)],
        BlockType::Q2_K => &[(80, true), (82, true)],
        BlockType::Q3_K => &[(108, true)],
        BlockType::Q6_K => &[(208, true)],
        BlockType::IQ4_XS => &[(0, true)],
        BlockType::F32 | BlockType::F16 | BlockType::BF16 | BlockType::Q8_K => &[],
    }
}

/// `n · k` values of `ty` as random valid blocks: random codes, finite scales.
fn random_blocks(rng: &mut Rng64, ty: BlockType, n: usize, k: usize) -> Vec<u8> {
    let ts = ty.type_size();
    let blocks = n * k / ty.block_size();
    let mut data = vec![0u8; blocks * ts];
    rng.fill(&mut data[..]);
    for blk in data.chunks_exact_mut(ts) {
        match ty {
            BlockType::F32 => {
                let v: f32 = rng.random_range(-1.0..1.0);
                blk.copy_from_slice(&v.to_le_bytes());
            }
            BlockType::F16 => blk.copy_from_slice(&f16_bits(rng, 5..=16, true)),
            BlockType::BF16 => {
                let sign = if rng.random::<bool>() { 0x8000u16 } else { 0 };
                let bits = sign | (rng.random_range(110u16..=128) << 7) | rng.random_range(0..128);
                blk.copy_from_slice(&bits.to_le_bytes());
            }
            BlockType::Q8_K => {
                let d: f32 = rng.random_range(-0.02..0.02);
                blk[..4].copy_from_slice(&d.to_le_bytes());
            }
            _ => {
                for &(at, signed) in f16_fields(ty) {
                    blk[at..at + 2].copy_from_slice(&f16_bits(rng, 5..=12, signed));
                }
            }
        }
        // Extreme codes: -128 in Q8_0 (|q| = 128 as an unsigned operand).
        if ty == BlockType::Q8_0 && rng.random_range(0..4) == 0 {
            blk[2 + rng.random_range(0..32)] = 0x80;
        }
    }
    data
}

fn f16_field(blk: &[u8], at: usize) -> f64 {
    f64::from(f16_to_f32(u16::from_le_bytes([blk[at], blk[at + 1]])))
}

/// A bound on the magnitude of the terms a kernel combines for one value of this block (the
/// scaled code and the offset or minimum, each at its largest), or for the formats without an
/// integer kernel the largest dequantized value.
fn part_bound(ty: BlockType, blk: &[u8], values: &[f32]) -> f64 {
    let d = || f16_field(blk, 0).abs();
    let m = || f16_field(blk, 2).abs();
    match ty {
        BlockType::Q4_0 => 23.0 * d(),
        BlockType::Q4_1 => 15.0 * d() + m(),
        BlockType::Q5_0 => 47.0 * d(),
        BlockType::Q5_1 => 31.0 * d() + m(),
        BlockType::Q8_0 => 128.0 * d(),
        BlockType::Q4_K => 63.0 * 15.0 * d() + 63.0 * m(),
        BlockType::Q5_K => 63.0 * 31.0 * d() + 63.0 * m(),
        BlockType::Q6_K => 128.0 * 95.0 * f16_field(blk, 208).abs(),
        BlockType::Q2_K => 15.0 * 3.0 * f16_field(blk, 80).abs() + 15.0 * f16_field(blk, 82).abs(),
        BlockType::Q3_K => 32.0 * 11.0 * f16_field(blk, 108).abs(),
        BlockType::IQ4_NL => 127.0 * d(),
        BlockType::IQ4_XS => 32.0 * 127.0 * d(),
        _ => values.iter().fold(0f64, |a, v| a.max(f64::from(v.abs()))),
    }
}

/// The activation block the decode path quantizes `ty`'s activations in.
fn act_block(ty: BlockType) -> usize {
    if ty.block_size() == QK_K {
        QK_K
    } else {
        32
    }
}

/// What [`act::QuantActs`] makes of `x`: per value `(x̂, d_b)` (the dequantized code and its
/// block's scale).
fn quantized(x: &[f32], block: usize) -> Vec<(f64, f64)> {
    let mut out = Vec::with_capacity(x.len());
    for xb in x.chunks(block) {
        let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
        if amax == 0.0 {
            out.extend(xb.iter().map(|_| (0.0, 0.0)));
            continue;
        }
        let (d, inv) = (amax / 127.0, 127.0 / amax);
        for v in xb {
            let q = (v * inv).round_ties_even().clamp(-127.0, 127.0);
            out.push((f64::from(q) * f64::from(d), f64::from(d)));
        }
    }
    out
}

/// Per output `[rows, n]`: the f64 product of the dequantized weight and `x`, the bound on
/// what any path may differ from it, the f64 product with the quantized activations and the
/// bound of the integer path against that.
struct Reference {
    exact: Vec<f64>,
    bound: Vec<f64>,
    quantized: Vec<f64>,
    float_bound: Vec<f64>,
}

fn reference(ty: BlockType, data: &[u8], x: &[f32], rows: usize, n: usize, k: usize) -> Reference {
    let u = f64::from(f32::EPSILON) / 2.0;
    let w = GgmlBlocks::new(ty, data, n, k).unwrap().dequantize();
    let bs = ty.block_size();
    let ts = ty.type_size();
    // The part bound of every value.
    let mut parts = vec![0f64; n * k];
    for (b, blk) in data.chunks_exact(ts).enumerate() {
        let p = part_bound(ty, blk, &w[b * bs..(b + 1) * bs]);
        parts[b * bs..(b + 1) * bs].fill(p);
    }
    // Any summation order of k + 16 rounded terms, and the dequantized f32 weight's own
    // rounding (3 operations at most) against the exact scaled codes.
    let nf = (k + 16) as f64;
    let gamma = nf * u / (1.0 - nf * u) + 3.0 * u;
    let mut r = Reference {
        exact: vec![0.0; rows * n],
        bound: vec![0.0; rows * n],
        quantized: vec![0.0; rows * n],
        float_bound: vec![0.0; rows * n],
    };
    for row in 0..rows {
        let xr = &x[row * k..(row + 1) * k];
        let xq = quantized(xr, act_block(ty));
        for j in 0..n {
            let (mut exact, mut quant, mut act_err, mut mag) = (0f64, 0f64, 0f64, 0f64);
            for i in 0..k {
                let (wi, xi) = (f64::from(w[j * k + i]), f64::from(xr[i]));
                let (xh, d) = xq[i];
                exact += wi * xi;
                quant += wi * xh;
                // |x - x̂| <= d / 2 + 4u|x| (the rounding of x / d and of d itself).
                act_err += wi.abs() * (d / 2.0 + 4.0 * u * xi.abs());
                mag += (xi.abs() * (1.0 + 4.0 * u) + d / 2.0) * parts[j * k + i];
            }
            let o = row * n + j;
            r.exact[o] = exact;
            r.quantized[o] = quant;
            r.float_bound[o] = gamma * mag;
            r.bound[o] = act_err + gamma * mag;
        }
    }
    r
}

fn available_isas() -> Vec<Int8Isa> {
    Int8Isa::ALL
        .into_iter()
        .filter(|isa| isa_available(*isa))
        .collect()
}

fn shapes(ty: BlockType) -> (Vec<usize>, Vec<usize>) {
    let ks = match ty.block_size() {
        1 => vec![1, 37, 96],
        32 => vec![32, 96, 224],
        _ => vec![256, 768],
    };
    (ks, vec![1, 17, 40])
}

#[test]
fn every_format_isa_and_path_is_within_the_derived_bound() {
    let mut rng = Rng64::seed_from_u64(1);
    let isas = available_isas();
    eprintln!("ggml kernels tested: {isas:?}");
    for ty in BlockType::ALL {
        let (ks, ns) = shapes(ty);
        for &k in &ks {
            for &n in &ns {
                let data = random_blocks(&mut rng, ty, n, k);
                let w = GgmlBlocks::new(ty, &data, n, k).unwrap();
                for rows in 1..=9 {
                    let mut x: Vec<f32> = (0..rows * k)
                        .map(|_| rng.random_range(-2.0f32..2.0))
                        .collect();
                    if rows > 2 {
                        // An all-zero row and an outlier.
                        x[k..2 * k].fill(0.0);
                        x[2 * k] = 40.0;
                    }
                    let r = reference(ty, &data, &x, rows, n, k);
                    let integer = dot_kernel(ty, Int8Isa::Scalar).is_some();
                    for &isa in &isas {
                        for path in [GgmlPath::Dot, GgmlPath::Panels, GgmlPath::Auto] {
                            let got =
                                linear_ggml_with(&x, rows, k, &w, Epilogue::default(), isa, path)
                                    .unwrap();
                            let integer_path = integer
                                && (path == GgmlPath::Dot
                                    || path == GgmlPath::Auto && rows < PANEL_MIN_ROWS_FLOAT);
                            for o in 0..rows * n {
                                let g = f64::from(got[o]);
                                assert!(
                                    (g - r.exact[o]).abs() <= r.bound[o],
                                    "{ty} {isa:?} {path:?} rows {rows} k {k} n {n} [{o}]: {g} vs {} (bound {})",
                                    r.exact[o],
                                    r.bound[o]
                                );
                                if integer_path {
                                    // Against the product with the quantized activations only
                                    // f32 rounding remains.
                                    assert!(
                                        (g - r.quantized[o]).abs() <= r.float_bound[o],
                                        "{ty} {isa:?} {path:?} rows {rows} k {k} n {n} [{o}]: {g} vs quantized {} (bound {})",
                                        r.quantized[o],
                                        r.float_bound[o]
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn epilogue_is_applied_on_both_paths() {
    let mut rng = Rng64::seed_from_u64(2);
    let (ty, rows, k, n) = (BlockType::Q4_K, 5, 512, 37);
    let data = random_blocks(&mut rng, ty, n, k);
    let w = GgmlBlocks::new(ty, &data, n, k).unwrap();
    let x: Vec<f32> = (0..rows * k)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
    let res: Vec<f32> = (0..rows * n)
        .map(|_| rng.random_range(-1.0f32..1.0))
        .collect();
    for path in [GgmlPath::Dot, GgmlPath::Panels] {
        let isa = ggml_isa();
        let plain = linear_ggml_with(&x, rows, k, &w, Epilogue::default(), isa, path).unwrap();
        let epi = Epilogue {
            bias: Some(&bias),
            residual: Some(&res),
            activation: EpilogueActivation::Relu,
        };
        let got = linear_ggml_with(&x, rows, k, &w, epi, isa, path).unwrap();
        for r in 0..rows {
            for j in 0..n {
                let want = (plain[r * n + j] + res[r * n + j] + bias[j]).max(0.0);
                assert_eq!(got[r * n + j], want, "{path:?} [{r},{j}]");
            }
        }
    }
}

#[test]
fn large_shapes_split_over_tasks_and_agree() {
    // Enough outputs for several tasks on every path; unaligned weight bytes.
    let mut rng = Rng64::seed_from_u64(3);
    for ty in [
        BlockType::Q4_K,
        BlockType::Q8_0,
        BlockType::Q6_K,
        BlockType::Q4_1,
    ] {
        let (k, n) = (512, 1000);
        let data = random_blocks(&mut rng, ty, n, k);
        let mut shifted = vec![0u8; data.len() + 1];
        shifted[1..].copy_from_slice(&data);
        let w = GgmlBlocks::new(ty, &data, n, k).unwrap();
        let w_odd = GgmlBlocks::new(ty, &shifted[1..], n, k).unwrap();
        for rows in [1, 3, 20] {
            let x: Vec<f32> = (0..rows * k)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect();
            let r = reference(ty, &data, &x, rows, n, k);
            let got = linear_ggml(&x, rows, k, &w, Epilogue::default());
            let got_odd = linear_ggml(&x, rows, k, &w_odd, Epilogue::default());
            assert_eq!(got, got_odd, "{ty} rows {rows}: unaligned data");
            for o in 0..rows * n {
                let g = f64::from(got[o]);
                assert!(
                    (g - r.exact[o]).abs() <= r.bound[o],
                    "{ty} rows {rows} [{o}]"
                );
            }
        }
    }
}

#[test]
fn non_finite_activations_give_nan() {
    let mut rng = Rng64::seed_from_u64(4);
    let (k, n) = (256, 8);
    for ty in [BlockType::Q4_0, BlockType::Q4_K] {
        let data = random_blocks(&mut rng, ty, n, k);
        let w = GgmlBlocks::new(ty, &data, n, k).unwrap();
        let mut x = vec![0.5f32; 2 * k];
        x[k + 3] = f32::INFINITY;
        for isa in available_isas() {
            let y =
                linear_ggml_with(&x, 2, k, &w, Epilogue::default(), isa, GgmlPath::Dot).unwrap();
            assert!(y[..n].iter().all(|v| v.is_finite()), "{ty} {isa:?}");
            assert!(y[n..].iter().all(|v| v.is_nan()), "{ty} {isa:?}");
        }
    }
}

#[test]
fn empty_shapes() {
    let bias = [1.0f32, 2.0, 3.0];
    let epi = Epilogue {
        bias: Some(&bias),
        ..Epilogue::default()
    };
    let w = GgmlBlocks::new(BlockType::Q4_0, &[], 3, 0).unwrap();
    assert_eq!(
        linear_ggml(&[], 2, 0, &w, epi),
        vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
    );
    let w = GgmlBlocks::new(BlockType::Q8_0, &[0; 34 * 3], 3, 32).unwrap();
    assert!(linear_ggml(&[], 0, 32, &w, epi).is_empty());
}

#[test]
fn bad_shapes_and_lengths_are_errors() {
    let ty = BlockType::Q4_K;
    assert!(GgmlBlocks::new(ty, &[0; 144 * 2], 2, 256).is_ok());
    assert_eq!(
        GgmlBlocks::new(ty, &[0; 144 * 2], 2, 255).unwrap_err(),
        GgmlError::PartialBlock { ty, k: 255 }
    );
    assert_eq!(
        GgmlBlocks::new(ty, &[0; 144 * 2 - 1], 2, 256).unwrap_err(),
        GgmlError::Length {
            ty,
            expected: Some(288),
            got: 287
        }
    );
    assert!(matches!(
        GgmlBlocks::new(ty, &[0; 144], usize::MAX, 256),
        Err(GgmlError::Length { expected: None, .. })
    ));
    assert!(GgmlBlocks::new(ty, &[0; 144], 1, usize::MAX).is_err());
    let mut out = [0f32; 32];
    assert!(dequantize_row(BlockType::Q4_0, &[0; 18], &mut out).is_ok());
    assert!(dequantize_row(BlockType::Q4_0, &[0; 17], &mut out).is_err());
    assert!(dequantize_row(BlockType::Q4_0, &[0; 18], &mut out[..31]).is_err());
    assert!(dequantize_row(BlockType::Q4_K, &[0; 18], &mut out).is_err());
    let w = GgmlBlocks::new(BlockType::Q8_0, &[0; 34 * 3], 3, 32).unwrap();
    assert_eq!(w.rows(1, 3).map(<[u8]>::len), Some(68));
    assert!(w.rows(2, 4).is_none());
    assert!(w.rows(2, 1).is_none());
}

#[test]
fn ids_and_sizes_match_ggml() {
    for t in BlockType::ALL {
        assert_eq!(BlockType::from_id(t.id()), Some(t));
        assert!(
            BlockType::ALL
                .iter()
                .filter(|u| u.name() == t.name())
                .count()
                == 1
        );
    }
    assert_eq!(BlockType::from_id(4), None);
    assert_eq!(BlockType::Q4_K.type_size(), 144);
    assert_eq!(BlockType::Q5_K.type_size(), 176);
    assert_eq!(BlockType::Q6_K.type_size(), 210);
    assert_eq!(BlockType::Q8_K.type_size(), 292);
    assert_eq!(BlockType::IQ4_XS.type_size(), 136);
    assert_eq!(BlockType::Q4_0.bytes_for(64), Some(36));
    assert_eq!(BlockType::Q4_0.bytes_for(65), None);
}

#[test]
fn f16_conversion_is_exact_for_every_value() {
    // Every f16 against the hardware conversion where there is one, else spot values.
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("f16c") {
        for h in 0..=u16::MAX {
            // SAFETY: the CPU has F16C.
            let want = unsafe {
                use std::arch::x86_64::*;
                #[target_feature(enable = "f16c")]
                unsafe fn cvt(h: u16) -> f32 {
                    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
                }
                cvt(h)
            };
            assert_eq!(f16_to_f32(h).to_bits(), want.to_bits(), "{h:#06x}");
        }
    }
    assert_eq!(f16_to_f32(0x3C00), 1.0);
    assert_eq!(f16_to_f32(0xC000), -2.0);
    assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
    assert_eq!(f16_to_f32(0x7BFF), 65504.0);
    assert_eq!(f16_to_f32(0xFC00), f32::NEG_INFINITY);
    assert!(f16_to_f32(0x7E01).is_nan());
    assert_eq!(bf16_to_f32(0x3F80), 1.0);
    assert_eq!(bf16_to_f32(0x7F81).to_bits(), 0x7FC1_0000);
}

#[test]
fn scalar_and_simd_kernels_sum_the_same_integers() {
    // With one block per row each kernel's float work is a few operations on the same exact
    // integer sums: the results agree to a few ulp.
    let mut rng = Rng64::seed_from_u64(5);
    let isas = available_isas();
    for ty in BlockType::ALL {
        if dot_kernel(ty, Int8Isa::Scalar).is_none() {
            continue;
        }
        let (k, n) = (ty.block_size(), 64);
        let data = random_blocks(&mut rng, ty, n, k);
        let w = GgmlBlocks::new(ty, &data, n, k).unwrap();
        let x: Vec<f32> = (0..k).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let outs: Vec<Vec<f32>> = isas
            .iter()
            .map(|&isa| {
                linear_ggml_with(&x, 1, k, &w, Epilogue::default(), isa, GgmlPath::Dot).unwrap()
            })
            .collect();
        let r = reference(ty, &data, &x, 1, n, k);
        for o in &outs[1..] {
            for j in 0..n {
                let tol = 4.0 * r.float_bound[j];
                assert!(
                    (f64::from(o[j]) - f64::from(outs[0][j])).abs() <= tol,
                    "{ty} [{j}]: {} vs scalar {}",
                    o[j],
                    outs[0][j]
                );
            }
        }
    }
}
