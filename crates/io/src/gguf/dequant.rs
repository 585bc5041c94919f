//! ggml tensor types and their dequantisation.
//!
//! The block formats are described once, in `ipfs-accelerate-kernels` ([`BlockType`],
//! [`dequantize_row`]): its `dequantize_row` follows ggml's reference C code (`ggml-quants.c`)
//! operation by operation — the same products in the same order, in f32 — so the output is
//! bit-identical to ggml's and to the numpy port in the `gguf` Python package
//! (`gguf/quants.py`). The plain integer and f64 element types are converted here.

use ipfs_accelerate_kernels::{dequantize_row, BlockType};
use rayon::prelude::*;

use crate::IoError;

/// Elements per super-block of the k-quants.
pub const QK_K: usize = ipfs_accelerate_kernels::QK_K;

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

    /// The block format of the kernels crate for this type (`None` for the integer and f64
    /// element types and the formats it does not read).
    pub fn block_type(self) -> Option<BlockType> {
        BlockType::from_id(self.id())
    }

    /// Elements per block (1 for plain element types).
    pub fn block_size(self) -> usize {
        if let Some(b) = self.block_type() {
            return b.block_size();
        }
        match self {
            GgmlType::F64 | GgmlType::I8 | GgmlType::I16 | GgmlType::I32 | GgmlType::I64 => 1,
            GgmlType::MXFP4 => 32,
            GgmlType::NVFP4 => 64,
            GgmlType::Q1_0 => 128,
            GgmlType::IQ2_XXS
            | GgmlType::IQ2_XS
            | GgmlType::IQ3_XXS
            | GgmlType::IQ1_S
            | GgmlType::IQ3_S
            | GgmlType::IQ2_S
            | GgmlType::IQ1_M
            | GgmlType::TQ1_0
            | GgmlType::TQ2_0 => QK_K,
            // The block formats, answered above.
            _ => 1,
        }
    }

    /// Bytes per block (`sizeof(block_*)` in ggml-common.h).
    pub fn type_size(self) -> usize {
        if let Some(b) = self.block_type() {
            return b.type_size();
        }
        match self {
            GgmlType::I32 => 4,
            GgmlType::I16 => 2,
            GgmlType::F64 | GgmlType::I64 => 8,
            GgmlType::I8 => 1,
            GgmlType::IQ2_XXS => 2 + QK_K / 4,
            GgmlType::IQ2_XS => 2 + QK_K / 4 + QK_K / 32,
            GgmlType::IQ3_XXS => 2 + QK_K / 4 + QK_K / 8,
            GgmlType::IQ1_S => 2 + QK_K / 8 + QK_K / 16,
            GgmlType::IQ3_S => 2 + QK_K / 4 + QK_K / 8 + QK_K / 32 + 4,
            GgmlType::IQ2_S => 2 + QK_K / 4 + QK_K / 16,
            GgmlType::IQ1_M => QK_K / 8 + QK_K / 16 + QK_K / 32,
            GgmlType::TQ1_0 => 2 + 4 * 13,
            GgmlType::TQ2_0 => 2 + 64,
            GgmlType::MXFP4 => 1 + 16,
            GgmlType::NVFP4 => 4 + 32,
            GgmlType::Q1_0 => 2 + 16,
            // The block formats, answered above.
            _ => 0,
        }
    }

    /// Whether [`dequantize`] supports this type.
    pub fn can_dequantize(self) -> bool {
        self.block_type().is_some()
            || matches!(
                self,
                GgmlType::F64 | GgmlType::I8 | GgmlType::I16 | GgmlType::I32 | GgmlType::I64
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
    match ty.block_type() {
        Some(bt) => {
            // Runs of about 16 K values per task, so small tensors stay on one thread.
            let (bs, ts) = (bt.block_size(), bt.type_size());
            let per_task = (16_384 / bs).max(1);
            let run = |(src, dst): (&[u8], &mut [f32])| {
                // The caller checked that data holds out.len() / bs blocks; each run is whole
                // blocks of both, so this cannot fail.
                let _ = dequantize_row(bt, src, dst);
            };
            if data.len() <= per_task * ts {
                run((data, out));
            } else {
                data.par_chunks(per_task * ts)
                    .zip(out.par_chunks_mut(per_task * bs))
                    .for_each(run);
            }
        }
        None => match ty {
            GgmlType::F64 => elements::<8>(data, out, |b| f64::from_le_bytes(b) as f32),
            GgmlType::I8 => elements::<1>(data, out, |b| b[0] as i8 as f32),
            GgmlType::I16 => elements::<2>(data, out, |b| i16::from_le_bytes(b) as f32),
            GgmlType::I32 => elements::<4>(data, out, |b| i32::from_le_bytes(b) as f32),
            GgmlType::I64 => elements::<8>(data, out, |b| i64::from_le_bytes(b) as f32),
            // Rejected by `can_dequantize` before we get here.
            _ => {}
        },
    }
}

/// Converts each `N`-byte element of `data` with `f`.
fn elements<const N: usize>(data: &[u8], out: &mut [f32], f: impl Fn([u8; N]) -> f32) {
    let (src, _) = data.as_chunks::<N>();
    for (b, y) in src.iter().zip(out.iter_mut()) {
        *y = f(*b);
    }
}

#[cfg(test)]
mod tests {
    use half::f16;

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
            dequantize_row(BlockType::Q4_0, blk, &mut want).unwrap();
            assert_eq!(&y[i * 32..i * 32 + 32], &want);
        }
    }
}
