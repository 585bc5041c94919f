//! ggml tensor types and their reference dequantisation.
//!
//! Every `dequantize_row_*` here follows ggml's reference C code (`ggml-quants.c`) operation by
//! operation — the same products in the same order, in f32 — so the output is bit-identical to
//! ggml's and to the numpy port in the `gguf` Python package (`gguf/quants.py`).

use half::{bf16, f16};
use rayon::prelude::*;

use crate::IoError;

/// Elements per super-block of the k-quants.
pub const QK_K: usize = 256;

/// The element / block types a GGUF tensor can be stored in (`enum ggml_type`; the discriminant is
/// the id written in the file).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum GgmlType {
    /// 32-bit float.
    F32 = 0,
    /// IEEE half precision.
    F16 = 1,
    /// 32 weights: f16 scale, 4-bit values offset by 8.
    Q4_0 = 2,
    /// 32 weights: f16 scale and minimum, 4-bit values.
    Q4_1 = 3,
    /// 32 weights: f16 scale, 5-bit values offset by 16.
    Q5_0 = 6,
    /// 32 weights: f16 scale and minimum, 5-bit values.
    Q5_1 = 7,
    /// 32 weights: f16 scale, int8 values.
    Q8_0 = 8,
    /// 32 weights: f16 scale and f16 scaled sum, int8 values (an activation format).
    Q8_1 = 9,
    /// 256 weights: 16 sub-blocks with 4-bit scales and minimums, 2-bit values.
    Q2_K = 10,
    /// 256 weights: 16 sub-blocks with 6-bit scales, 3-bit values.
    Q3_K = 11,
    /// 256 weights: 8 sub-blocks with 6-bit scales and minimums, 4-bit values.
    Q4_K = 12,
    /// 256 weights: 8 sub-blocks with 6-bit scales and minimums, 5-bit values.
    Q5_K = 13,
    /// 256 weights: 16 sub-blocks with int8 scales, 6-bit values.
    Q6_K = 14,
    /// 256 weights: f32 scale, int8 values, int16 block sums (an activation format).
    Q8_K = 15,
    /// i-quant, 2.06 bits per weight.
    IQ2_XXS = 16,
    /// i-quant, 2.31 bits per weight.
    IQ2_XS = 17,
    /// i-quant, 3.06 bits per weight.
    IQ3_XXS = 18,
    /// i-quant, 1.56 bits per weight.
    IQ1_S = 19,
    /// 32 weights: f16 scale, 4-bit indices into a non-linear table.
    IQ4_NL = 20,
    /// i-quant, 3.44 bits per weight.
    IQ3_S = 21,
    /// i-quant, 2.5 bits per weight.
    IQ2_S = 22,
    /// 256 weights: f16 scale, 6-bit sub-block scales, 4-bit indices into a non-linear table.
    IQ4_XS = 23,
    /// 8-bit signed integer.
    I8 = 24,
    /// 16-bit signed integer.
    I16 = 25,
    /// 32-bit signed integer.
    I32 = 26,
    /// 64-bit signed integer.
    I64 = 27,
    /// 64-bit float.
    F64 = 28,
    /// i-quant, 1.75 bits per weight.
    IQ1_M = 29,
    /// bfloat16.
    BF16 = 30,
    /// Ternary, 1.69 bits per weight.
    TQ1_0 = 34,
    /// Ternary, 2.06 bits per weight.
    TQ2_0 = 35,
    /// Microscaling FP4 (e8m0 scale, e2m1 values).
    MXFP4 = 39,
    /// NVIDIA FP4 (e4m3 scales, e2m1 values).
    NVFP4 = 40,
    /// 1-bit values with an f16 scale.
    Q1_0 = 41,
}

impl GgmlType {
    /// Every known type, in id order.
    pub const ALL: [GgmlType; 34] = [
        GgmlType::F32,
        GgmlType::F16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Q8_1,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q8_K,
        GgmlType::IQ2_XXS,
        GgmlType::IQ2_XS,
        GgmlType::IQ3_XXS,
        GgmlType::IQ1_S,
        GgmlType::IQ4_NL,
        GgmlType::IQ3_S,
        GgmlType::IQ2_S,
        GgmlType::IQ4_XS,
        GgmlType::I8,
        GgmlType::I16,
        GgmlType::I32,
        GgmlType::I64,
        GgmlType::F64,
        GgmlType::IQ1_M,
        GgmlType::BF16,
        GgmlType::TQ1_0,
        GgmlType::TQ2_0,
        GgmlType::MXFP4,
        GgmlType::NVFP4,
        GgmlType::Q1_0,
    ];

    /// The type with this file id, if known.
    pub fn from_id(id: u32) -> Option<GgmlType> {
        Self::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// The id written in GGUF files.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name for the type (`q4_K`, `f16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "f32",
            GgmlType::F16 => "f16",
            GgmlType::Q4_0 => "q4_0",
            GgmlType::Q4_1 => "q4_1",
            GgmlType::Q5_0 => "q5_0",
            GgmlType::Q5_1 => "q5_1",
            GgmlType::Q8_0 => "q8_0",
            GgmlType::Q8_1 => "q8_1",
            GgmlType::Q2_K => "q2_K",
            GgmlType::Q3_K => "q3_K",
            GgmlType::Q4_K => "q4_K",
            GgmlType::Q5_K => "q5_K",
            GgmlType::Q6_K => "q6_K",
            GgmlType::Q8_K => "q8_K",
            GgmlType::IQ2_XXS => "iq2_xxs",
            GgmlType::IQ2_XS => "iq2_xs",
            GgmlType::IQ3_XXS => "iq3_xxs",
            GgmlType::IQ1_S => "iq1_s",
            GgmlType::IQ4_NL => "iq4_nl",
            GgmlType::IQ3_S => "iq3_s",
            GgmlType::IQ2_S => "iq2_s",
            GgmlType::IQ4_XS => "iq4_xs",
            GgmlType::I8 => "i8",
            GgmlType::I16 => "i16",
            GgmlType::I32 => "i32",
            GgmlType::I64 => "i64",
            GgmlType::F64 => "f64",
            GgmlType::IQ1_M => "iq1_m",
            GgmlType::BF16 => "bf16",
            GgmlType::TQ1_0 => "tq1_0",
            GgmlType::TQ2_0 => "tq2_0",
            GgmlType::MXFP4 => "mxfp4",
            GgmlType::NVFP4 => "nvfp4",
            GgmlType::Q1_0 => "q1_0",
        }
    }

    /// Elements per block (1 for plain element types).
    pub fn block_size(self) -> usize {
        match self {
            GgmlType::F32
            | GgmlType::F16
            | GgmlType::BF16
            | GgmlType::F64
            | GgmlType::I8
            | GgmlType::I16
            | GgmlType::I32
            | GgmlType::I64 => 1,
            GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::Q8_1
            | GgmlType::IQ4_NL
            | GgmlType::MXFP4 => 32,
            GgmlType::NVFP4 => 64,
            GgmlType::Q1_0 => 128,
            GgmlType::Q2_K
            | GgmlType::Q3_K
            | GgmlType::Q4_K
            | GgmlType::Q5_K
            | GgmlType::Q6_K
            | GgmlType::Q8_K
            | GgmlType::IQ2_XXS
            | GgmlType::IQ2_XS
            | GgmlType::IQ3_XXS
            | GgmlType::IQ1_S
            | GgmlType::IQ3_S
            | GgmlType::IQ2_S
            | GgmlType::IQ4_XS
            | GgmlType::IQ1_M
            | GgmlType::TQ1_0
            | GgmlType::TQ2_0 => QK_K,
        }
    }

    /// Bytes per block (`sizeof(block_*)` in ggml-common.h).
    pub fn type_size(self) -> usize {
        match self {
            GgmlType::F32 | GgmlType::I32 => 4,
            GgmlType::F16 | GgmlType::BF16 | GgmlType::I16 => 2,
            GgmlType::F64 | GgmlType::I64 => 8,
            GgmlType::I8 => 1,
            GgmlType::Q4_0 | GgmlType::IQ4_NL => 2 + 16,
            GgmlType::Q4_1 => 2 + 2 + 16,
            GgmlType::Q5_0 => 2 + 4 + 16,
            GgmlType::Q5_1 => 2 + 2 + 4 + 16,
            GgmlType::Q8_0 => 2 + 32,
            GgmlType::Q8_1 => 2 + 2 + 32,
            GgmlType::Q2_K => 2 + 2 + QK_K / 16 + QK_K / 4,
            GgmlType::Q3_K => 2 + QK_K / 4 + QK_K / 8 + 12,
            GgmlType::Q4_K => 2 + 2 + 12 + QK_K / 2,
            GgmlType::Q5_K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            GgmlType::Q6_K => 2 + QK_K / 2 + QK_K / 4 + QK_K / 16,
            GgmlType::Q8_K => 4 + QK_K + QK_K / 8,
            GgmlType::IQ2_XXS => 2 + QK_K / 4,
            GgmlType::IQ2_XS => 2 + QK_K / 4 + QK_K / 32,
            GgmlType::IQ3_XXS => 2 + QK_K / 4 + QK_K / 8,
            GgmlType::IQ1_S => 2 + QK_K / 8 + QK_K / 16,
            GgmlType::IQ3_S => 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4,
            GgmlType::IQ2_S => 2 + QK_K / 4 + QK_K / 16,
            GgmlType::IQ4_XS => 2 + 2 + QK_K / 2 + QK_K / 64,
            GgmlType::IQ1_M => QK_K / 8 + QK_K / 16 + QK_K / 32,
            GgmlType::TQ1_0 => 2 + 4 * 13,
            GgmlType::TQ2_0 => 2 + 64,
            GgmlType::MXFP4 => 1 + 16,
            GgmlType::NVFP4 => 4 + 32,
            GgmlType::Q1_0 => 2 + 16,
        }
    }

    /// Whether [`dequantize`] supports this type.
    pub fn can_dequantize(self) -> bool {
        !matches!(
            self,
            GgmlType::IQ2_XXS
                | GgmlType::IQ2_XS
                | GgmlType::IQ3_XXS
                | GgmlType::IQ1_S
                | GgmlType::IQ3_S
                | GgmlType::IQ2_S
                | GgmlType::IQ1_M
                | GgmlType::TQ1_0
                | GgmlType::TQ2_0
                | GgmlType::MXFP4
                | GgmlType::NVFP4
                | GgmlType::Q1_0
        )
    }

    /// Bytes taken by `n_elements` values, or `None` when `n_elements` is not a whole number of
    /// blocks (or the size overflows).
    pub fn bytes_for(self, n_elements: usize) -> Option<usize> {
        if !n_elements.is_multiple_of(self.block_size()) {
            return None;
        }
        (n_elements / self.block_size()).checked_mul(self.type_size())
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Dequantizes `n_elements` values of type `ty` stored in `data` to f32, bit-exactly as ggml's
/// reference `dequantize_row_*`. `data` must hold exactly `n_elements / block_size` blocks;
/// anything else (or a type without a dequantisation here) is an [`IoError::Dequantize`].
pub fn dequantize(ty: GgmlType, data: &[u8], n_elements: usize) -> Result<Vec<f32>, IoError> {
    let err = |reason: String| IoError::Dequantize {
        ty: ty.name().to_string(),
        reason,
    };
    let expected = ty.bytes_for(n_elements).ok_or_else(|| {
        err(format!(
            "{n_elements} elements are not a whole number of {}-element blocks",
            ty.block_size()
        ))
    })?;
    if data.len() != expected {
        return Err(err(format!(
            "{} bytes given, {n_elements} elements take {expected}",
            data.len()
        )));
    }
    if !ty.can_dequantize() {
        return Err(err("this type has no dequantisation here".into()));
    }
    let mut out = vec![0f32; n_elements];
    dequantize_into(ty, data, &mut out);
    Ok(out)
}

/// Dequantizes into `out`; the lengths were checked by the caller.
fn dequantize_into(ty: GgmlType, data: &[u8], out: &mut [f32]) {
    match ty {
        GgmlType::F32 => blocks::<1, 4>(data, out, |b, y| y[0] = f32::from_le_bytes(*b)),
        GgmlType::F16 => blocks::<1, 2>(data, out, |b, y| y[0] = f16::from_le_bytes(*b).to_f32()),
        GgmlType::BF16 => blocks::<1, 2>(data, out, |b, y| y[0] = bf16::from_le_bytes(*b).to_f32()),
        GgmlType::F64 => blocks::<1, 8>(data, out, |b, y| y[0] = f64::from_le_bytes(*b) as f32),
        GgmlType::I8 => blocks::<1, 1>(data, out, |b, y| y[0] = b[0] as i8 as f32),
        GgmlType::I16 => blocks::<1, 2>(data, out, |b, y| y[0] = i16::from_le_bytes(*b) as f32),
        GgmlType::I32 => blocks::<1, 4>(data, out, |b, y| y[0] = i32::from_le_bytes(*b) as f32),
        GgmlType::I64 => blocks::<1, 8>(data, out, |b, y| y[0] = i64::from_le_bytes(*b) as f32),
        GgmlType::Q4_0 => blocks::<32, 18>(data, out, q4_0),
        GgmlType::Q4_1 => blocks::<32, 20>(data, out, q4_1),
        GgmlType::Q5_0 => blocks::<32, 22>(data, out, q5_0),
        GgmlType::Q5_1 => blocks::<32, 24>(data, out, q5_1),
        GgmlType::Q8_0 => blocks::<32, 34>(data, out, q8_0),
        GgmlType::Q8_1 => blocks::<32, 36>(data, out, q8_1),
        GgmlType::Q2_K => blocks::<QK_K, 84>(data, out, q2_k),
        GgmlType::Q3_K => blocks::<QK_K, 110>(data, out, q3_k),
        GgmlType::Q4_K => blocks::<QK_K, 144>(data, out, q4_k),
        GgmlType::Q5_K => blocks::<QK_K, 176>(data, out, q5_k),
        GgmlType::Q6_K => blocks::<QK_K, 210>(data, out, q6_k),
        GgmlType::Q8_K => blocks::<QK_K, 292>(data, out, q8_k),
        GgmlType::IQ4_NL => blocks::<32, 18>(data, out, iq4_nl),
        GgmlType::IQ4_XS => blocks::<QK_K, 136>(data, out, iq4_xs),
        // Rejected by `can_dequantize` before we get here.
        GgmlType::IQ2_XXS
        | GgmlType::IQ2_XS
        | GgmlType::IQ3_XXS
        | GgmlType::IQ1_S
        | GgmlType::IQ3_S
        | GgmlType::IQ2_S
        | GgmlType::IQ1_M
        | GgmlType::TQ1_0
        | GgmlType::TQ2_0
        | GgmlType::MXFP4
        | GgmlType::NVFP4
        | GgmlType::Q1_0 => {}
    }
}

/// Blocks per parallel task: about 16 K output values, so small tensors stay on one thread.
const fn blocks_per_task(block: usize) -> usize {
    let n = 16384 / block;
    if n == 0 {
        1
    } else {
        n
    }
}

/// Runs `f` on every (block bytes, block output) pair, in parallel over runs of blocks.
fn blocks<const BS: usize, const TS: usize>(
    data: &[u8],
    out: &mut [f32],
    f: impl Fn(&[u8; TS], &mut [f32; BS]) + Sync,
) {
    let (src, _) = data.as_chunks::<TS>();
    let (dst, _) = out.as_chunks_mut::<BS>();
    let per_task = blocks_per_task(BS);
    if src.len() <= per_task {
        src.iter().zip(dst.iter_mut()).for_each(|(b, y)| f(b, y));
        return;
    }
    src.par_chunks(per_task)
        .zip(dst.par_chunks_mut(per_task))
        .for_each(|(bs, ys)| bs.iter().zip(ys.iter_mut()).for_each(|(b, y)| f(b, y)));
}

#[inline(always)]
fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// `dequantize_row_q4_0`.
fn q4_0(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        let x0 = (qs[j] & 0x0F) as i32 - 8;
        let x1 = (qs[j] >> 4) as i32 - 8;
        y[j] = x0 as f32 * d;
        y[j + 16] = x1 as f32 * d;
    }
}

/// `dequantize_row_q4_1`.
fn q4_1(b: &[u8; 20], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qs = &b[4..20];
    for j in 0..16 {
        let x0 = (qs[j] & 0x0F) as f32;
        let x1 = (qs[j] >> 4) as f32;
        y[j] = x0 * d + m;
        y[j + 16] = x1 * d + m;
    }
}

/// `dequantize_row_q5_0`.
fn q5_0(b: &[u8; 22], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let qh = u32_at(b, 2);
    let qs = &b[6..22];
    for j in 0..16 {
        let xh0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
        let x0 = ((qs[j] & 0x0F) | xh0) as i32 - 16;
        let x1 = ((qs[j] >> 4) | xh1) as i32 - 16;
        y[j] = x0 as f32 * d;
        y[j + 16] = x1 as f32 * d;
    }
}

/// `dequantize_row_q5_1`.
fn q5_1(b: &[u8; 24], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let m = f16_at(b, 2);
    let qh = u32_at(b, 4);
    let qs = &b[8..24];
    for j in 0..16 {
        let xh0 = (((qh >> j) << 4) & 0x10) as u8;
        let xh1 = ((qh >> (j + 12)) & 0x10) as u8;
        let x0 = (qs[j] & 0x0F) | xh0;
        let x1 = (qs[j] >> 4) | xh1;
        y[j] = x0 as f32 * d + m;
        y[j + 16] = x1 as f32 * d + m;
    }
}

/// `dequantize_row_q8_0`.
fn q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[2..34]) {
        *v = (q as i8) as f32 * d;
    }
}

/// Q8_1 (ggml has no `dequantize_row_q8_1`; the values are `qs * d`, `s` is `d * sum(qs)`).
fn q8_1(b: &[u8; 36], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[4..36]) {
        *v = (q as i8) as f32 * d;
    }
}

/// `dequantize_row_q2_K`.
fn q2_k(b: &[u8; 84], y: &mut [f32; QK_K]) {
    let scales = &b[0..16];
    let d = f16_at(b, 80);
    let min = f16_at(b, 82);
    let mut out = 0;
    let mut is = 0;
    for n in 0..QK_K / 128 {
        let q = &b[16 + 32 * n..16 + 32 * n + 32];
        let mut shift = 0;
        for _ in 0..4 {
            for half in 0..2 {
                let sc = scales[is];
                is += 1;
                let dl = d * (sc & 0x0F) as f32;
                let ml = min * (sc >> 4) as f32;
                for l in 0..16 {
                    y[out] = dl * ((q[l + 16 * half] >> shift) & 3) as f32 - ml;
                    out += 1;
                }
            }
            shift += 2;
        }
    }
}

/// `dequantize_row_q3_K`.
fn q3_k(b: &[u8; 110], y: &mut [f32; QK_K]) {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let hm = &b[0..32];
    let d_all = f16_at(b, 108);
    let mut aux = [u32_at(b, 96), u32_at(b, 100), u32_at(b, 104), 0];
    let tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4);
    aux[3] = ((aux[1] >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4);
    aux[0] = (aux[0] & KMASK2) | ((tmp & KMASK1) << 4);
    aux[1] = (aux[1] & KMASK2) | (((tmp >> 2) & KMASK1) << 4);
    let mut scales = [0i8; 16];
    for (i, w) in aux.iter().enumerate() {
        for (k, byte) in w.to_le_bytes().iter().enumerate() {
            scales[4 * i + k] = *byte as i8;
        }
    }
    let mut out = 0;
    let mut is = 0;
    let mut m: u8 = 1;
    for n in 0..QK_K / 128 {
        let q = &b[32 + 32 * n..32 + 32 * n + 32];
        let mut shift = 0;
        for _ in 0..4 {
            for half in 0..2 {
                let dl = d_all * (scales[is] as i32 - 32) as f32;
                is += 1;
                for l in 0..16 {
                    let i = l + 16 * half;
                    let low = ((q[i] >> shift) & 3) as i32;
                    let high = if hm[i] & m != 0 { 0 } else { 4 };
                    y[out] = dl * (low - high) as f32;
                    out += 1;
                }
            }
            shift += 2;
            m = m.wrapping_shl(1);
        }
    }
}

/// `get_scale_min_k4`: the 6-bit scale and minimum of sub-block `j` of a Q4_K / Q5_K block.
#[inline(always)]
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0F) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// `dequantize_row_q4_K`.
fn q4_k(b: &[u8; 144], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let scales = &b[4..16];
    for (j, chunk) in y.chunks_exact_mut(64).enumerate() {
        let q = &b[16 + 32 * j..16 + 32 * j + 32];
        let (sc, m) = scale_min_k4(2 * j, scales);
        let (d1, m1) = (d * sc as f32, min * m as f32);
        let (sc, m) = scale_min_k4(2 * j + 1, scales);
        let (d2, m2) = (d * sc as f32, min * m as f32);
        for l in 0..32 {
            chunk[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            chunk[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// `dequantize_row_q5_K`.
fn q5_k(b: &[u8; 176], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let scales = &b[4..16];
    let qh = &b[16..48];
    let mut u1: u8 = 1;
    let mut u2: u8 = 2;
    for (j, chunk) in y.chunks_exact_mut(64).enumerate() {
        let ql = &b[48 + 32 * j..48 + 32 * j + 32];
        let (sc, m) = scale_min_k4(2 * j, scales);
        let (d1, m1) = (d * sc as f32, min * m as f32);
        let (sc, m) = scale_min_k4(2 * j + 1, scales);
        let (d2, m2) = (d * sc as f32, min * m as f32);
        for l in 0..32 {
            let h1 = if qh[l] & u1 != 0 { 16 } else { 0 };
            let h2 = if qh[l] & u2 != 0 { 16 } else { 0 };
            chunk[l] = d1 * ((ql[l] & 0x0F) + h1) as f32 - m1;
            chunk[l + 32] = d2 * ((ql[l] >> 4) + h2) as f32 - m2;
        }
        u1 = u1.wrapping_shl(2);
        u2 = u2.wrapping_shl(2);
    }
}

/// `dequantize_row_q6_K`.
fn q6_k(b: &[u8; 210], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 208);
    for (n, chunk) in y.chunks_exact_mut(128).enumerate() {
        let ql = &b[64 * n..64 * n + 64];
        let qh = &b[128 + 32 * n..128 + 32 * n + 32];
        let sc = &b[192 + 8 * n..192 + 8 * n + 8];
        for l in 0..32 {
            let is = l / 16;
            let q1 = ((ql[l] & 0x0F) | ((qh[l] & 3) << 4)) as i32 - 32;
            let q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) as i32 - 32;
            let q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i32 - 32;
            let q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i32 - 32;
            chunk[l] = d * (sc[is] as i8) as f32 * q1 as f32;
            chunk[l + 32] = d * (sc[is + 2] as i8) as f32 * q2 as f32;
            chunk[l + 64] = d * (sc[is + 4] as i8) as f32 * q3 as f32;
            chunk[l + 96] = d * (sc[is + 6] as i8) as f32 * q4 as f32;
        }
    }
}

/// `dequantize_row_q8_K`.
fn q8_k(b: &[u8; 292], y: &mut [f32; QK_K]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (v, &q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
        *v = d * (q as i8) as f32;
    }
}

/// The non-linear levels of IQ4_NL / IQ4_XS (`kvalues_iq4nl`).
const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// `dequantize_row_iq4_nl`.
fn iq4_nl(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = d * KVALUES_IQ4NL[(qs[j] & 0x0F) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
    }
}

/// `dequantize_row_iq4_xs`.
fn iq4_xs(b: &[u8; 136], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let scales_l = &b[4..8];
    for (ib, chunk) in y.chunks_exact_mut(32).enumerate() {
        let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
        let ls = ((scales_l[ib / 2] >> (4 * (ib % 2))) & 0x0F) as i32
            | ((((scales_h >> (2 * ib)) & 3) as i32) << 4);
        let dl = d * (ls - 32) as f32;
        for j in 0..16 {
            chunk[j] = dl * KVALUES_IQ4NL[(qs[j] & 0x0F) as usize] as f32;
            chunk[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip_and_sizes_match_ggml() {
        for t in GgmlType::ALL {
            assert_eq!(GgmlType::from_id(t.id()), Some(t));
        }
        assert_eq!(GgmlType::from_id(4), None);
        assert_eq!(GgmlType::from_id(1000), None);
        assert_eq!(GgmlType::Q4_K.type_size(), 144);
        assert_eq!(GgmlType::Q6_K.type_size(), 210);
        assert_eq!(GgmlType::Q3_K.type_size(), 110);
        assert_eq!(GgmlType::Q2_K.type_size(), 84);
        assert_eq!(GgmlType::Q5_K.type_size(), 176);
        assert_eq!(GgmlType::Q8_K.type_size(), 292);
        assert_eq!(GgmlType::IQ4_XS.type_size(), 136);
    }

    #[test]
    fn wrong_lengths_and_unsupported_types_are_errors() {
        assert!(dequantize(GgmlType::Q4_0, &[0; 18], 33).is_err());
        assert!(dequantize(GgmlType::Q4_0, &[0; 17], 32).is_err());
        assert!(dequantize(GgmlType::IQ2_XXS, &[0; 66], 256).is_err());
        assert_eq!(
            dequantize(GgmlType::F32, &[], 0).unwrap(),
            Vec::<f32>::new()
        );
    }

    #[test]
    fn q8_0_by_hand() {
        let mut b = vec![0u8; 34];
        b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        for (i, v) in b[2..].iter_mut().enumerate() {
            *v = (i as i8 - 16) as u8;
        }
        let y = dequantize(GgmlType::Q8_0, &b, 32).unwrap();
        let want: Vec<f32> = (0..32).map(|i| (i as f32 - 16.0) * 0.5).collect();
        assert_eq!(y, want);
    }

    #[test]
    fn q8_1_by_hand() {
        let mut b = vec![0u8; 36];
        b[..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        b[2..4].copy_from_slice(&f16::from_f32(99.0).to_le_bytes());
        for (i, v) in b[4..].iter_mut().enumerate() {
            *v = (i as i8 * 3 - 40) as u8;
        }
        let y = dequantize(GgmlType::Q8_1, &b, 32).unwrap();
        let want: Vec<f32> = (0..32).map(|i| (i * 3 - 40) as f32 * 0.25).collect();
        assert_eq!(y, want);
    }

    #[test]
    fn parallel_path_matches_serial() {
        // Enough blocks to take the parallel path; each block has its own scale.
        let n_blocks = 3000;
        let mut data = Vec::with_capacity(n_blocks * 18);
        for i in 0..n_blocks {
            data.extend_from_slice(&f16::from_f32(i as f32 * 0.01).to_le_bytes());
            data.extend((0..16).map(|k| ((i + k) % 256) as u8));
        }
        let y = dequantize(GgmlType::Q4_0, &data, n_blocks * 32).unwrap();
        for (i, blk) in data.chunks_exact(18).enumerate() {
            let mut want = [0f32; 32];
            q4_0(blk.try_into().unwrap(), &mut want);
            assert_eq!(&y[i * 32..i * 32 + 32], &want);
        }
    }
}
