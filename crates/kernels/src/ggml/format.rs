//! The ggml block formats: their ids and sizes, a borrowed `[n, k]` weight in them, and the one
//! reference dequantisation of each (`dequantize_row_*` of ggml's `ggml-quants.c`, operation by
//! operation in f32, so the values are bit-identical to ggml's).
//!
//! Blocks are read byte by byte (`from_le_bytes`), never through casts, so the data may sit at
//! any address (a memory-mapped file at an arbitrary offset).

use std::fmt;

/// Elements per super-block of the k-quants.
pub const QK_K: usize = 256;

/// A ggml weight format these kernels read (`enum ggml_type`; the discriminant is the id written
/// in GGUF files).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum BlockType {
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
    /// 32 weights: f16 scale and f16 scaled sum, int8 values.
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
    /// 256 weights: f32 scale, int8 values, int16 sums of 16.
    Q8_K = 15,
    /// 32 weights: f16 scale, 4-bit indices into a non-linear table.
    IQ4_NL = 20,
    /// 256 weights: f16 scale, 6-bit sub-block scales, 4-bit indices into a non-linear table.
    IQ4_XS = 23,
    /// bfloat16.
    BF16 = 30,
}

impl BlockType {
    /// Every format, in id order.
    pub const ALL: [BlockType; 17] = [
        BlockType::F32,
        BlockType::F16,
        BlockType::Q4_0,
        BlockType::Q4_1,
        BlockType::Q5_0,
        BlockType::Q5_1,
        BlockType::Q8_0,
        BlockType::Q8_1,
        BlockType::Q2_K,
        BlockType::Q3_K,
        BlockType::Q4_K,
        BlockType::Q5_K,
        BlockType::Q6_K,
        BlockType::Q8_K,
        BlockType::IQ4_NL,
        BlockType::IQ4_XS,
        BlockType::BF16,
    ];

    /// The format with this ggml id, if these kernels read it.
    pub fn from_id(id: u32) -> Option<BlockType> {
        Self::ALL.iter().copied().find(|t| t.id() == id)
    }

    /// The ggml id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// ggml's name (`q4_K`, `f16`, ...).
    pub fn name(self) -> &'static str {
        match self {
            BlockType::F32 => "f32",
            BlockType::F16 => "f16",
            BlockType::Q4_0 => "q4_0",
            BlockType::Q4_1 => "q4_1",
            BlockType::Q5_0 => "q5_0",
            BlockType::Q5_1 => "q5_1",
            BlockType::Q8_0 => "q8_0",
            BlockType::Q8_1 => "q8_1",
            BlockType::Q2_K => "q2_K",
            BlockType::Q3_K => "q3_K",
            BlockType::Q4_K => "q4_K",
            BlockType::Q5_K => "q5_K",
            BlockType::Q6_K => "q6_K",
            BlockType::Q8_K => "q8_K",
            BlockType::IQ4_NL => "iq4_nl",
            BlockType::IQ4_XS => "iq4_xs",
            BlockType::BF16 => "bf16",
        }
    }

    /// Elements per block (1 for the float types).
    pub fn block_size(self) -> usize {
        match self {
            BlockType::F32 | BlockType::F16 | BlockType::BF16 => 1,
            BlockType::Q4_0
            | BlockType::Q4_1
            | BlockType::Q5_0
            | BlockType::Q5_1
            | BlockType::Q8_0
            | BlockType::Q8_1
            | BlockType::IQ4_NL => 32,
            BlockType::Q2_K
            | BlockType::Q3_K
            | BlockType::Q4_K
            | BlockType::Q5_K
            | BlockType::Q6_K
            | BlockType::Q8_K
            | BlockType::IQ4_XS => QK_K,
        }
    }

    /// Bytes per block (`sizeof(block_*)` in ggml-common.h).
    pub fn type_size(self) -> usize {
        match self {
            BlockType::F32 => 4,
            BlockType::F16 | BlockType::BF16 => 2,
            BlockType::Q4_0 | BlockType::IQ4_NL => 2 + 16,
            BlockType::Q4_1 => 2 + 2 + 16,
            BlockType::Q5_0 => 2 + 4 + 16,
            BlockType::Q5_1 => 2 + 2 + 4 + 16,
            BlockType::Q8_0 => 2 + 32,
            BlockType::Q8_1 => 2 + 2 + 32,
            BlockType::Q2_K => 2 + 2 + QK_K / 16 + QK_K / 4,
            BlockType::Q3_K => 2 + QK_K / 4 + QK_K / 8 + 12,
            BlockType::Q4_K => 2 + 2 + 12 + QK_K / 2,
            BlockType::Q5_K => 2 + 2 + 12 + QK_K / 8 + QK_K / 2,
            BlockType::Q6_K => 2 + QK_K / 2 + QK_K / 4 + QK_K / 16,
            BlockType::Q8_K => 4 + QK_K + QK_K / 8,
            BlockType::IQ4_XS => 2 + 2 + QK_K / 2 + QK_K / 64,
        }
    }

    /// Bytes taken by `elements` values: `None` when they are not a whole number of blocks or
    /// the size overflows.
    pub fn bytes_for(self, elements: usize) -> Option<usize> {
        if !elements.is_multiple_of(self.block_size()) {
            return None;
        }
        (elements / self.block_size()).checked_mul(self.type_size())
    }
}

impl fmt::Display for BlockType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why ggml data cannot be read as asked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GgmlError {
    /// A row of `k` values is not a whole number of `ty`'s blocks.
    PartialBlock {
        /// The format.
        ty: BlockType,
        /// Values asked for.
        k: usize,
    },
    /// The data's length is not what the shape takes (`expected` is `None` when it overflows).
    Length {
        /// The format.
        ty: BlockType,
        /// Bytes the shape takes.
        expected: Option<usize>,
        /// Bytes given.
        got: usize,
    },
    /// Quantizing into this format is not implemented.
    NotQuantizable {
        /// The format.
        ty: BlockType,
    },
}

impl fmt::Display for GgmlError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GgmlError::PartialBlock { ty, k } => write!(
                f,
                "{k} {ty} values are not a whole number of {}-value blocks",
                ty.block_size()
            ),
            GgmlError::Length {
                ty,
                expected: Some(e),
                got,
            } => write!(f, "{got} bytes of {ty} data given, the shape takes {e}"),
            GgmlError::Length {
                ty,
                expected: None,
                got,
            } => write!(f, "{got} bytes of {ty} data given, the shape overflows"),
            GgmlError::NotQuantizable { ty } => write!(f, "quantizing to {ty} is not implemented"),
        }
    }
}

impl std::error::Error for GgmlError {}

/// A borrowed ggml weight `[n, k]` (n outputs of k in-features, PyTorch's `[out, in]`) in its
/// block layout: row-major as ggml stores it, each row `k / block_size` consecutive blocks. The
/// bytes may lie at any address.
#[derive(Debug, Clone, Copy)]
pub struct GgmlBlocks<'a> {
    ty: BlockType,
    n: usize,
    k: usize,
    row_bytes: usize,
    data: &'a [u8],
}

impl<'a> GgmlBlocks<'a> {
    /// Views `data` as `[n, k]` values of `ty`: an error when `k` is not a whole number of blocks
    /// or `data` is not exactly `n` rows long.
    pub fn new(ty: BlockType, data: &'a [u8], n: usize, k: usize) -> Result<Self, GgmlError> {
        let row_bytes = ty.bytes_for(k).ok_or(GgmlError::PartialBlock { ty, k })?;
        let expected = row_bytes.checked_mul(n);
        if expected != Some(data.len()) {
            return Err(GgmlError::Length {
                ty,
                expected,
                got: data.len(),
            });
        }
        Ok(GgmlBlocks {
            ty,
            n,
            k,
            row_bytes,
            data,
        })
    }

    /// The format.
    pub fn ty(&self) -> BlockType {
        self.ty
    }

    /// Outputs (rows).
    pub fn n(&self) -> usize {
        self.n
    }

    /// In-features (values per row).
    pub fn k(&self) -> usize {
        self.k
    }

    /// Bytes per row.
    pub fn row_bytes(&self) -> usize {
        self.row_bytes
    }

    /// All the bytes.
    pub fn data(&self) -> &'a [u8] {
        self.data
    }

    /// The bytes of rows `start..end` (`None` when out of range).
    pub fn rows(&self, start: usize, end: usize) -> Option<&'a [u8]> {
        if start > end || end > self.n {
            return None;
        }
        self.data.get(start * self.row_bytes..end * self.row_bytes)
    }

    /// The whole weight dequantized to f32 `[n, k]` (for references and comparisons; the linear
    /// kernels never build it).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.n * self.k];
        // The shape was checked in `new`.
        if dequantize_row(self.ty, self.data, &mut out).is_err() {
            out.fill(f32::NAN);
        }
        out
    }
}

/// `f16` bits to f32, exactly (subnormals kept, NaN payloads kept with the quiet bit set, as
/// `vcvtph2ps` and the `half` crate do).
#[inline(always)]
pub fn f16_to_f32(h: u16) -> f32 {
    // Branch-free (so that loops over it vectorise): the exponent and mantissa bits moved to
    // f32's places and scaled by 2^112 give every finite value exactly, subnormals included;
    // infinities and NaNs are picked apart.
    let h = u32::from(h);
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7FFF;
    let finite = f32::from_bits(em << 13) * f32::from_bits(0x7780_0000);
    let man = em & 0x3FF;
    let special = 0x7F80_0000 | (man << 13) | if man != 0 { 0x0040_0000 } else { 0 };
    let bits = if em >= 0x7C00 {
        special
    } else {
        finite.to_bits()
    };
    f32::from_bits(sign | bits)
}

/// `bfloat16` bits to f32 (a NaN gets the quiet bit, as the `half` crate does).
#[inline(always)]
pub fn bf16_to_f32(h: u16) -> f32 {
    if h & 0x7FFF > 0x7F80 {
        f32::from_bits((u32::from(h) | 0x0040) << 16)
    } else {
        f32::from_bits(u32::from(h) << 16)
    }
}

#[inline(always)]
pub(crate) fn f16_at(b: &[u8], at: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[at], b[at + 1]]))
}

#[inline(always)]
fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Dequantizes values of type `ty` stored in `data` into `out`, bit-exactly as ggml's reference
/// `dequantize_row_*`: an error when `out` is not a whole number of blocks or `data` is not the
/// bytes they take.
pub fn dequantize_row(ty: BlockType, data: &[u8], out: &mut [f32]) -> Result<(), GgmlError> {
    let expected = ty
        .bytes_for(out.len())
        .ok_or(GgmlError::PartialBlock { ty, k: out.len() })?;
    if data.len() != expected {
        return Err(GgmlError::Length {
            ty,
            expected: Some(expected),
            got: data.len(),
        });
    }
    dequantize_checked(ty, data, out);
    Ok(())
}

multiversion! {
    /// [`dequantize_row`] after its length checks (compiled for the widest vector extension).
    pub(crate) fn dequantize_checked(ty: BlockType, data: &[u8], out: &mut [f32]) {
        match ty {
            BlockType::F32 => blocks::<1, 4>(data, out, |b, y| y[0] = f32::from_le_bytes(*b)),
            BlockType::F16 => {
                blocks::<1, 2>(data, out, |b, y| y[0] = f16_to_f32(u16::from_le_bytes(*b)))
            }
            BlockType::BF16 => {
                blocks::<1, 2>(data, out, |b, y| y[0] = bf16_to_f32(u16::from_le_bytes(*b)))
            }
            BlockType::Q4_0 => blocks::<32, 18>(data, out, q4_0),
            BlockType::Q4_1 => blocks::<32, 20>(data, out, q4_1),
            BlockType::Q5_0 => blocks::<32, 22>(data, out, q5_0),
            BlockType::Q5_1 => blocks::<32, 24>(data, out, q5_1),
            BlockType::Q8_0 => blocks::<32, 34>(data, out, q8_0),
            BlockType::Q8_1 => blocks::<32, 36>(data, out, q8_1),
            BlockType::Q2_K => blocks::<QK_K, 84>(data, out, q2_k),
            BlockType::Q3_K => blocks::<QK_K, 110>(data, out, q3_k),
            BlockType::Q4_K => blocks::<QK_K, 144>(data, out, q4_k),
            BlockType::Q5_K => blocks::<QK_K, 176>(data, out, q5_k),
            BlockType::Q6_K => blocks::<QK_K, 210>(data, out, q6_k),
            BlockType::Q8_K => blocks::<QK_K, 292>(data, out, q8_k),
            BlockType::IQ4_NL => blocks::<32, 18>(data, out, iq4_nl),
            BlockType::IQ4_XS => blocks::<QK_K, 136>(data, out, iq4_xs),
        }
    }
}

/// Runs `f` on every (block bytes, block output) pair.
#[inline(always)]
fn blocks<const BS: usize, const TS: usize>(
    data: &[u8],
    out: &mut [f32],
    f: impl Fn(&[u8; TS], &mut [f32; BS]),
) {
    let (src, _) = data.as_chunks::<TS>();
    let (dst, _) = out.as_chunks_mut::<BS>();
    src.iter().zip(dst.iter_mut()).for_each(|(b, y)| f(b, y));
}

/// `dequantize_row_q4_0`.
#[inline(always)]
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
#[inline(always)]
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
#[inline(always)]
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
#[inline(always)]
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
#[inline(always)]
fn q8_0(b: &[u8; 34], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[2..34]) {
        *v = (q as i8) as f32 * d;
    }
}

/// Q8_1 (ggml has no `dequantize_row_q8_1`; the values are `qs * d`, `s` is `d * sum(qs)`).
#[inline(always)]
fn q8_1(b: &[u8; 36], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    for (v, &q) in y.iter_mut().zip(&b[4..36]) {
        *v = (q as i8) as f32 * d;
    }
}

/// `dequantize_row_q2_K`.
#[inline(always)]
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

/// The sixteen 6-bit scales of a Q3_K block (`0..64`, used as `scale - 32`) from its 12 packed
/// bytes.
#[inline(always)]
pub(crate) fn q3k_scales(s: &[u8]) -> [u8; 16] {
    const KMASK1: u32 = 0x0303_0303;
    const KMASK2: u32 = 0x0f0f_0f0f;
    let mut aux = [u32_at(s, 0), u32_at(s, 4), u32_at(s, 8), 0];
    let tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & KMASK2) | (((tmp >> 4) & KMASK1) << 4);
    aux[3] = ((aux[1] >> 4) & KMASK2) | (((tmp >> 6) & KMASK1) << 4);
    aux[0] = (aux[0] & KMASK2) | ((tmp & KMASK1) << 4);
    aux[1] = (aux[1] & KMASK2) | (((tmp >> 2) & KMASK1) << 4);
    let mut scales = [0u8; 16];
    for (i, w) in aux.iter().enumerate() {
        scales[4 * i..4 * i + 4].copy_from_slice(&w.to_le_bytes());
    }
    scales
}

/// `dequantize_row_q3_K`.
#[inline(always)]
fn q3_k(b: &[u8; 110], y: &mut [f32; QK_K]) {
    let hm = &b[0..32];
    let d_all = f16_at(b, 108);
    let scales = q3k_scales(&b[96..108]);
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

/// The eight 6-bit scales and eight 6-bit minimums of a Q4_K / Q5_K block from its 12 packed
/// bytes (ggml's `get_scale_min_k4` for every sub-block at once), one per byte of each `u64`
/// (sub-block `j` in byte `j`).
#[inline(always)]
pub(crate) fn k4_scales_mins(s: &[u8]) -> (u64, u64) {
    let a = u32_at(s, 0);
    let b = u32_at(s, 4);
    let c = u32_at(s, 8);
    // Sub-blocks 0..4: the low 6 bits of bytes 0..4 (scales) and 4..8 (minimums); 4..8: a
    // nibble of bytes 8..12 with the top 2 bits of bytes 0..4 / 4..8 above it.
    let sc_lo = a & 0x3F3F_3F3F;
    let m_lo = b & 0x3F3F_3F3F;
    let sc_hi = (c & 0x0F0F_0F0F) | ((a >> 2) & 0x3030_3030);
    let m_hi = ((c >> 4) & 0x0F0F_0F0F) | ((b >> 2) & 0x3030_3030);
    (
        u64::from(sc_lo) | (u64::from(sc_hi) << 32),
        u64::from(m_lo) | (u64::from(m_hi) << 32),
    )
}

/// Byte `j` of a `u64`.
#[inline(always)]
pub(crate) fn byte(v: u64, j: usize) -> u8 {
    (v >> (8 * j)) as u8
}

/// `dequantize_row_q4_K`.
#[inline(always)]
fn q4_k(b: &[u8; 144], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let (scales, mins) = k4_scales_mins(&b[4..16]);
    for (j, chunk) in y.chunks_exact_mut(64).enumerate() {
        let q = &b[16 + 32 * j..16 + 32 * j + 32];
        let d1 = d * byte(scales, 2 * j) as f32;
        let m1 = min * byte(mins, 2 * j) as f32;
        let d2 = d * byte(scales, 2 * j + 1) as f32;
        let m2 = min * byte(mins, 2 * j + 1) as f32;
        for l in 0..32 {
            chunk[l] = d1 * (q[l] & 0x0F) as f32 - m1;
            chunk[l + 32] = d2 * (q[l] >> 4) as f32 - m2;
        }
    }
}

/// `dequantize_row_q5_K`.
#[inline(always)]
fn q5_k(b: &[u8; 176], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    let min = f16_at(b, 2);
    let (scales, mins) = k4_scales_mins(&b[4..16]);
    let qh = &b[16..48];
    let mut u1: u8 = 1;
    let mut u2: u8 = 2;
    for (j, chunk) in y.chunks_exact_mut(64).enumerate() {
        let ql = &b[48 + 32 * j..48 + 32 * j + 32];
        let d1 = d * byte(scales, 2 * j) as f32;
        let m1 = min * byte(mins, 2 * j) as f32;
        let d2 = d * byte(scales, 2 * j + 1) as f32;
        let m2 = min * byte(mins, 2 * j + 1) as f32;
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
#[inline(always)]
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
#[inline(always)]
fn q8_k(b: &[u8; 292], y: &mut [f32; QK_K]) {
    let d = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    for (v, &q) in y.iter_mut().zip(&b[4..4 + QK_K]) {
        *v = d * (q as i8) as f32;
    }
}

/// The non-linear levels of IQ4_NL / IQ4_XS (`kvalues_iq4nl`).
pub(crate) const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// `dequantize_row_iq4_nl`.
#[inline(always)]
fn iq4_nl(b: &[u8; 18], y: &mut [f32; 32]) {
    let d = f16_at(b, 0);
    let qs = &b[2..18];
    for j in 0..16 {
        y[j] = d * KVALUES_IQ4NL[(qs[j] & 0x0F) as usize] as f32;
        y[j + 16] = d * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
    }
}

/// The scale of sub-block `ib` (32 values) of an IQ4_XS block, `-32..32`.
#[inline(always)]
pub(crate) fn iq4xs_scale(b: &[u8], ib: usize) -> i32 {
    let scales_h = u16::from_le_bytes([b[2], b[3]]);
    let low = ((b[4 + ib / 2] >> (4 * (ib % 2))) & 0x0F) as i32;
    (low | ((((scales_h >> (2 * ib)) & 3) as i32) << 4)) - 32
}

/// `dequantize_row_iq4_xs`.
#[inline(always)]
fn iq4_xs(b: &[u8; 136], y: &mut [f32; QK_K]) {
    let d = f16_at(b, 0);
    for (ib, chunk) in y.chunks_exact_mut(32).enumerate() {
        let qs = &b[8 + 16 * ib..8 + 16 * ib + 16];
        let dl = d * iq4xs_scale(b, ib) as f32;
        for j in 0..16 {
            chunk[j] = dl * KVALUES_IQ4NL[(qs[j] & 0x0F) as usize] as f32;
            chunk[j + 16] = dl * KVALUES_IQ4NL[(qs[j] >> 4) as usize] as f32;
        }
    }
}
