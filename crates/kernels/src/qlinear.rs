//! Int8 linear layers: activations quantized per row on the fly, weights kept as signed 8-bit
//! codes with one f32 scale per block of consecutive in-features of one output (the format of
//! GGUF's Q8_0 and of `ipfs-accelerate-nn`'s int8 weights), products summed exactly in 32-bit
//! integers and scaled to f32 once per block.
//!
//! `y[r, j] = Σ_b sx[r, b] · s[j, b] · Σ_{i ∈ b} qx[r, i] · qw[j, i]`, with `qx = round(x / sx)`
//! in `-127..=127` and `sx[r, b] = max|x[r, i ∈ b]| / 127`: the activations are quantized per
//! block of the weight's block size too (as llama.cpp's Q8_0 activations), so an outlier costs
//! precision only in its own block. The only error next to the dequantized f32 product is the
//! rounding of the activations (at most `sx[r, b] / 2` per value).
//!
//! Four kernels, the widest the CPU has chosen at run time:
//! - **AMX-INT8** (`tdpbssd`: a 16 × 16 tile of i32 sums takes the products of 16 rows × 64
//!   in-features × 16 outputs per instruction, s8 × s8), on tiles of 32 rows × 32 outputs (four
//!   tiles of sums, two of activations, two of weights). Per block the tiles of sums start at
//!   zero, take the block's in-features (up to 64 per instruction), and go through memory to
//!   AVX-512 registers, which scale them and add them to the rows' f32 sums in the order the
//!   VNNI kernel does (so the two give the same bits). The weight's panels are the VNNI layout
//!   with signed codes, read as tiles with the stride of a panel row. Only for blocks of at
//!   most 64 in-features or whole multiples of 64, and where [`crate::amx_support`] says the
//!   OS gave this process the tile state.
//! - **AVX-512 VNNI** (`vpdpbusd`, u8 × s8 → i32 four products at a time): the weight codes are
//!   stored shifted to `qw + 128` (unsigned) and each block's accumulator starts at
//!   `-128 · Σ qx`, which the activations' quantization sums, so the sum stays exact. Tiles of
//!   6 rows × 32 outputs (12 + 12 registers of i32 and f32 sums); per block the i32 sums are
//!   converted and added with one `vmulps` (weight scales × the row's scale) and one
//!   `vfmadd`. On Zen 4 `vpdpbusd` runs two per cycle, and these two float operations per
//!   row, 16 outputs and block take about one `vpdpbusd` slot each: with blocks of 32 (8
//!   `vpdpbusd` per row and 16 outputs) the kernel reaches at most ~80 % of the dot-product
//!   peak.
//! - **AVX2** (`vpmaddwd`, s16 × s16 → i32 two products at a time): the activations are stored
//!   as 16-bit codes and the weight codes widened as they are loaded. Exact, unlike the u8 × s8
//!   `vpmaddubsw`, whose 16-bit pair sums saturate (255 · 127 · 2 > 32 767); its saturation-free
//!   form (`|qw| · (qx · sign(qw))`) needs a third instruction per product and measured ~25 %
//!   slower than this one on Zen 3.
//! - **Scalar**, everywhere else.
//!
//! Weights are packed once ([`PackedInt8`]) into panels of 32 outputs (VNNI: two registers, so
//! each broadcast activation feeds two `vpdpbusd`) or 16 (AVX2, scalar) whose codes are
//! interleaved in groups of 4 in-features (VNNI, scalar) or 2 (AVX2), the operand layout of each
//! instruction. The activations are quantized with vectorised code (AVX-512 for VNNI, AVX2 for
//! AVX2), by each task for its own rows when no other task reads them; the product runs on
//! every rayon thread over tiles of rows × panels (in chunks of in-features for long rows), and
//! the bias, residual and activation of an [`Epilogue`] are applied to each finished tile.

use rayon::prelude::*;

use crate::aligned::AlignedVec;
use crate::linear::{finish_rows, Epilogue};

/// In-features per chunk of the product (rounded down to whole blocks; the rows' f32 sums wait
/// in the output between chunks): a chunk of a VNNI panel (32 × 4096 bytes) stays in L2 while
/// every row tile of a task reads it. Shorter chunks (256..512) measured slower at k = 1536.
const K_CHUNK: usize = 4096;
/// Outputs per packed panel of the AVX2 and scalar kernels (two 256-bit registers of i32 sums).
const PANEL: usize = 16;
/// Outputs per packed panel of the VNNI kernel (two 512-bit registers of i32 sums, so each
/// broadcast activation feeds two `vpdpbusd`).
const VNNI_PANEL: usize = 32;
/// The most rows of any kernel's tile.
const MAX_TILE_ROWS: usize = 8;
/// In-features per interleaved group at most (the four bytes one 32-bit lane of `vpdpbusd`
/// sums); every block size is a multiple of it.
const GROUP: usize = 4;
/// Rows of the AMX kernel's tile (two tiles of 16 rows of activations).
const AMX_ROWS: usize = 32;
/// In-features per `tdpbssd` at most (a tile row of 64 bytes).
const AMX_STEP: usize = 64;

/// Which integer instructions run an int8 linear layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Int8Isa {
    /// Portable Rust.
    Scalar,
    /// AVX2 `vpmaddwd` on 16-bit codes.
    Avx2,
    /// AVX-512 VNNI `vpdpbusd` on 512-bit registers.
    Avx512Vnni,
    /// AMX-INT8 `tdpbssd` on tiles.
    Amx,
}

impl Int8Isa {
    /// Every kernel, narrowest first.
    pub const ALL: [Int8Isa; 4] = [
        Int8Isa::Scalar,
        Int8Isa::Avx2,
        Int8Isa::Avx512Vnni,
        Int8Isa::Amx,
    ];

    /// Whether this CPU runs the kernel.
    pub fn available(self) -> bool {
        match self {
            Int8Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Int8Isa::Avx512Vnni => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bw")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512vnni")
            }
            Int8Isa::Amx => crate::amx_support().int8(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The widest kernel this CPU runs.
    pub fn detect() -> Int8Isa {
        *Int8Isa::ALL
            .iter()
            .rev()
            .find(|isa| isa.available())
            .unwrap_or(&Int8Isa::Scalar)
    }

    /// The widest kernel this CPU runs for blocks of `block` in-features (AMX takes blocks of
    /// at most 64 or whole multiples of 64).
    pub fn detect_for_block(block: usize) -> Int8Isa {
        *Int8Isa::ALL
            .iter()
            .rev()
            .find(|isa| isa.available() && isa.takes_block(block))
            .unwrap_or(&Int8Isa::Scalar)
    }

    /// Whether the kernel runs blocks of `block` in-features (a positive multiple of 4).
    fn takes_block(self, block: usize) -> bool {
        self != Int8Isa::Amx || block <= AMX_STEP || block.is_multiple_of(AMX_STEP)
    }

    /// In-features the packed codes and the quantized activations hold for `k`: `k` rounded
    /// up to whole groups, and for AMX to whole blocks (the padding is zero).
    fn padded_k(self, k: usize, block: usize) -> usize {
        match self {
            Int8Isa::Amx => k.div_ceil(block) * block,
            _ => k.div_ceil(self.group()) * self.group(),
        }
    }

    /// A short name (`"scalar"`, `"avx2"`, `"avx512vnni"`).
    pub fn name(self) -> &'static str {
        match self {
            Int8Isa::Scalar => "scalar",
            Int8Isa::Avx2 => "avx2",
            Int8Isa::Avx512Vnni => "avx512vnni",
            Int8Isa::Amx => "amx-int8",
        }
    }

    /// Rows one call of the kernel's inner tile computes.
    fn tile_rows(self) -> usize {
        match self {
            Int8Isa::Scalar => 4,
            Int8Isa::Avx2 => 6,
            Int8Isa::Avx512Vnni => 6,
            Int8Isa::Amx => AMX_ROWS,
        }
    }

    /// Outputs per packed panel.
    fn panel(self) -> usize {
        match self {
            Int8Isa::Avx512Vnni | Int8Isa::Amx => VNNI_PANEL,
            Int8Isa::Scalar | Int8Isa::Avx2 => PANEL,
        }
    }

    /// Whether the weight codes are stored as `qw + 128` (unsigned) for this kernel.
    fn unsigned_weights(self) -> bool {
        self == Int8Isa::Avx512Vnni
    }

    /// In-features per interleaved group of the packed codes.
    fn group(self) -> usize {
        match self {
            Int8Isa::Avx2 => 2,
            Int8Isa::Scalar | Int8Isa::Avx512Vnni | Int8Isa::Amx => 4,
        }
    }
}

/// An int8 weight `[n, k]` (n outputs of k in-features, PyTorch's `[out, in]`) packed for
/// [`linear_int8`]: codes in panels of 32 (VNNI) or 16 outputs, interleaved by groups of 4 or 2
/// in-features (zero-padded; the panel and group of the kernel it is packed for; stored as
/// `qw + 128` for the VNNI kernel), one f32 scale per block of `block` in-features of each
/// output.
#[derive(Debug, Clone)]
pub struct PackedInt8 {
    n: usize,
    k: usize,
    block: usize,
    isa: Int8Isa,
    /// `[panel][group][output in panel][isa.group()]`.
    codes: AlignedVec<i8>,
    /// `[panel][block][output in panel]`.
    scales: Vec<f32>,
}

impl PackedInt8 {
    /// Packs row-major `[n, k]` `codes` with `scales` `[n, ceil(k / block)]` (the scale of
    /// `codes[j * k + i]` is `scales[j * blocks + i / block]`) for the widest kernel this CPU
    /// runs for `block`. `None` when the lengths do not match the shape or `block` is not a
    /// positive multiple of 4.
    pub fn new(codes: &[i8], scales: &[f32], n: usize, k: usize, block: usize) -> Option<Self> {
        Self::with_isa(codes, scales, n, k, block, Int8Isa::detect_for_block(block))
    }

    /// As [`PackedInt8::new`] for the kernel `isa` (`None` also when this CPU lacks it or it
    /// does not take `block`).
    pub fn with_isa(
        codes: &[i8],
        scales: &[f32],
        n: usize,
        k: usize,
        block: usize,
        isa: Int8Isa,
    ) -> Option<Self> {
        if block == 0 || !block.is_multiple_of(GROUP) || !isa.available() || !isa.takes_block(block)
        {
            return None;
        }
        let blocks = k.div_ceil(block);
        if codes.len() != n.checked_mul(k)? || scales.len() != n.checked_mul(blocks)? {
            return None;
        }
        let panel = isa.panel();
        let panels = n.div_ceil(panel);
        let group = isa.group();
        let groups = isa.padded_k(k, block) / group;
        let shift = if isa.unsigned_weights() { 128 } else { 0 };
        // The padding holds the code of 0.
        let mut packed = AlignedVec::<i8>::zeroed(panels * groups * panel * group);
        packed.fill(shift as u8 as i8);
        let mut packed_scales = vec![0f32; panels * blocks * panel];
        for j in 0..n {
            let (p, c) = (j / panel, j % panel);
            let row = &codes[j * k..(j + 1) * k];
            for (i, &q) in row.iter().enumerate() {
                let (g, l) = (i / group, i % group);
                packed[((p * groups + g) * panel + c) * group + l] =
                    (i32::from(q) + shift) as u8 as i8;
            }
            for b in 0..blocks {
                packed_scales[(p * blocks + b) * panel + c] = scales[j * blocks + b];
            }
        }
        Some(PackedInt8 {
            n,
            k,
            block,
            isa,
            codes: packed,
            scales: packed_scales,
        })
    }

    /// Outputs.
    pub fn n(&self) -> usize {
        self.n
    }

    /// In-features.
    pub fn k(&self) -> usize {
        self.k
    }

    /// In-features per scale.
    pub fn block(&self) -> usize {
        self.block
    }

    /// The kernel it is packed for.
    pub fn isa(&self) -> Int8Isa {
        self.isa
    }

    /// Bytes it holds (codes with their padding, and scales).
    pub fn bytes(&self) -> usize {
        self.codes.len() + 4 * self.scales.len()
    }

    /// The codes `[n, k]` and scales `[n, ceil(k / block)]` it was packed from.
    pub fn unpack(&self) -> (Vec<i8>, Vec<f32>) {
        let (n, k) = (self.n, self.k);
        let blocks = k.div_ceil(self.block);
        let group = self.isa.group();
        let groups = self.isa.padded_k(k, self.block) / group;
        let panel = self.isa.panel();
        let shift = if self.isa.unsigned_weights() { 128 } else { 0 };
        let mut codes = vec![0i8; n * k];
        let mut scales = vec![0f32; n * blocks];
        for j in 0..n {
            let (p, c) = (j / panel, j % panel);
            for i in 0..k {
                let (g, l) = (i / group, i % group);
                let q = self.codes[((p * groups + g) * panel + c) * group + l];
                let q = if shift > 0 {
                    i32::from(q as u8)
                } else {
                    i32::from(q)
                };
                codes[j * k + i] = (q - shift) as i8;
            }
            for b in 0..blocks {
                scales[j * blocks + b] = self.scales[(p * blocks + b) * panel + c];
            }
        }
        (codes, scales)
    }
}

/// A block's scale `max|x| / 127` and its inverse (both 0 for a zero or non-finite block).
#[inline(always)]
fn row_scale(row: &[f32]) -> (f32, f32) {
    // 16 running maxima, so the loop vectorises (`max` is exact, so the order does not matter).
    const LANES: usize = 16;
    let mut m = [0f32; LANES];
    let mut chunks = row.chunks_exact(LANES);
    for c in &mut chunks {
        for (m, v) in m.iter_mut().zip(c) {
            *m = m.max(v.abs());
        }
    }
    for (m, v) in m.iter_mut().zip(chunks.remainder()) {
        *m = m.max(v.abs());
    }
    let amax = m.iter().fold(0f32, |a, &b| a.max(b));
    if amax > 0.0 && amax.is_finite() {
        (amax / 127.0, 127.0 / amax)
    } else {
        (0.0, 0.0)
    }
}

/// `x / scale` rounded to the nearest code (ties to even) within `-127..=127`.
#[inline(always)]
fn code(v: f32, inv: f32) -> i32 {
    (v * inv).round_ties_even().clamp(-127.0, 127.0) as i32
}

/// [`quantize_rows_i8`] (through an AVX-512 version for the VNNI kernel): codes, scales and
/// `-128 ·` each block's code sum in `offsets`.
#[allow(clippy::too_many_arguments)]
fn quantize_rows(
    isa: Int8Isa,
    x: &[f32],
    k: usize,
    kp: usize,
    block: usize,
    q: &mut [i8],
    scales: &mut [f32],
    offsets: &mut [i32],
) {
    #[cfg(target_arch = "x86_64")]
    if matches!(isa, Int8Isa::Avx512Vnni | Int8Isa::Amx) {
        // SAFETY: a VNNI or AMX weight is only packed on a CPU with AVX-512 F, BW, VL (and VNNI
        // or AMX: `Int8Isa::available`, `amx_support`); the slices hold what `linear_int8` cuts
        // them to.
        return unsafe { x86::quantize_rows_vnni(x, k, kp, block, q, scales, offsets) };
    }
    quantize_rows_i8(x, k, kp, block, q, scales, offsets);
}

multiversion! {
    /// Quantizes each row of `x` (`[rows, k]`) to `-127..=127` codes in `q` (`[rows, kp]`, the
    /// padding left 0), one scale per block of `block` values in `scales` and `-128 ·` the
    /// block's code sum in `offsets` (both `[rows, ceil(k / block)]`).
    fn quantize_rows_i8(
        x: &[f32],
        k: usize,
        kp: usize,
        block: usize,
        q: &mut [i8],
        scales: &mut [f32],
        offsets: &mut [i32],
    ) {
        let blocks = k.div_ceil(block);
        for (((row, qrow), s), o) in x
            .chunks_exact(k)
            .zip(q.chunks_exact_mut(kp))
            .zip(scales.chunks_exact_mut(blocks))
            .zip(offsets.chunks_exact_mut(blocks))
        {
            for (((xb, qb), sb), ob) in row.chunks(block).zip(qrow.chunks_mut(block)).zip(s).zip(o) {
                let (scale, inv) = row_scale(xb);
                *sb = scale;
                let mut sum = 0i32;
                for (d, v) in qb.iter_mut().zip(xb) {
                    let c = code(*v, inv);
                    sum += c;
                    *d = c as i8;
                }
                *ob = -128 * sum;
            }
            qrow[k..].fill(0);
        }
    }
}

/// [`quantize_rows_i16`] for the AVX2 kernel, through an AVX2 version.
fn quantize_rows16(
    x: &[f32],
    k: usize,
    kp: usize,
    block: usize,
    q: &mut [i16],
    scales: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if Int8Isa::Avx2.available() {
        // SAFETY: the CPU supports AVX2; the slices hold what `linear_int8` cuts them to.
        return unsafe { x86::quantize_rows_avx2(x, k, kp, block, q, scales) };
    }
    quantize_rows_i16(x, k, kp, block, q, scales);
}

multiversion! {
    /// As [`quantize_rows_i8`], with 16-bit codes (and no offsets).
    fn quantize_rows_i16(
        x: &[f32],
        k: usize,
        kp: usize,
        block: usize,
        q: &mut [i16],
        scales: &mut [f32],
    ) {
        let blocks = k.div_ceil(block);
        for ((row, qrow), s) in x
            .chunks_exact(k)
            .zip(q.chunks_exact_mut(kp))
            .zip(scales.chunks_exact_mut(blocks))
        {
            for ((xb, qb), sb) in row.chunks(block).zip(qrow.chunks_mut(block)).zip(s) {
                let (scale, inv) = row_scale(xb);
                *sb = scale;
                for (d, v) in qb.iter_mut().zip(xb) {
                    *d = code(*v, inv) as i16;
                }
            }
            qrow[k..].fill(0);
        }
    }
}

/// The quantized activations' codes, in the width the kernel reads.
enum Codes {
    I8(AlignedVec<i8>),
    I16(Vec<i16>),
}

/// Quantized activations: `[rows, kp]` codes, their scales and, with 8-bit codes, `-128 ·` each
/// block's code sum (`[rows, ceil(k / block)]` each; the VNNI kernel starts its sums there).
struct Activations {
    codes: Codes,
    scales: Vec<f32>,
    offsets: Vec<i32>,
}

impl Activations {
    /// Quantizes `x` (`[rows, k]`) for `isa`; on every rayon thread when `parallel` and there
    /// are many rows.
    fn quantize(
        isa: Int8Isa,
        x: &[f32],
        k: usize,
        kp: usize,
        block: usize,
        parallel: bool,
    ) -> Self {
        if k == 0 {
            return Activations {
                codes: Codes::I8(AlignedVec::zeroed(0)),
                scales: Vec::new(),
                offsets: Vec::new(),
            };
        }
        let rows = x.len() / k;
        let blocks = k.div_ceil(block);
        let mut scales = vec![0f32; rows * blocks];
        let chunk = (crate::PARALLEL_THRESHOLD / k).max(1);
        let parallel = parallel && rows > chunk;
        let mut offsets = Vec::new();
        let codes = if isa == Int8Isa::Avx2 {
            let mut q = vec![0i16; rows * kp];
            if parallel {
                x.par_chunks(chunk * k)
                    .zip(q.par_chunks_mut(chunk * kp))
                    .zip(scales.par_chunks_mut(chunk * blocks))
                    .for_each(|((x, q), s)| quantize_rows16(x, k, kp, block, q, s));
            } else {
                quantize_rows16(x, k, kp, block, &mut q, &mut scales);
            }
            Codes::I16(q)
        } else {
            // The AMX kernel reads whole tiles of rows (the extra rows are zero).
            let padded = if isa == Int8Isa::Amx {
                rows.next_multiple_of(AMX_ROWS)
            } else {
                rows
            };
            let mut q = AlignedVec::<i8>::zeroed(padded * kp);
            offsets = vec![0i32; rows * blocks];
            if parallel {
                x.par_chunks(chunk * k)
                    .zip(q.par_chunks_mut(chunk * kp))
                    .zip(scales.par_chunks_mut(chunk * blocks))
                    .zip(offsets.par_chunks_mut(chunk * blocks))
                    .for_each(|(((x, q), s), o)| quantize_rows(isa, x, k, kp, block, q, s, o));
            } else {
                quantize_rows(isa, x, k, kp, block, &mut q, &mut scales, &mut offsets);
            }
            Codes::I8(q)
        };
        Activations {
            codes,
            scales,
            offsets,
        }
    }
}

/// One tile's operands: `rows` quantized activation rows starting at `x` (stride `kp`), one
/// panel of the weight, the rows' scales; the kernel writes the first `width` of the panel's
/// outputs of each row `r` to `out + r · ldc`.
struct Tile<'a> {
    /// 8-bit codes (scalar, VNNI; AMX: 32 rows, those past `rows` zero), `rows × kp`; empty
    /// for AVX2.
    x: &'a [i8],
    /// 16-bit codes (AVX2), `rows × kp`; empty otherwise.
    x16: &'a [i16],
    kp: usize,
    rows: usize,
    codes: &'a [i8],
    scales: &'a [f32],
    blocks: usize,
    block_groups: usize,
    /// The blocks this call sums: `b0 .. b1`; when `b0 > 0` the sums of the blocks before are
    /// read from the output (and the new ones added to them).
    b0: usize,
    b1: usize,
    /// The rows' activation scales, `rows × blocks`.
    row_scales: &'a [f32],
    /// `-128 ·` the rows' code sums per block, `rows × blocks` (VNNI only).
    row_offsets: &'a [i32],
    out: *mut f32,
    ldc: usize,
    width: usize,
    /// The epilogue the kernel applies in registers as it stores the last blocks' sums, when it
    /// can (the VNNI kernel); `None` leaves it to [`finish_tile`].
    fused: Option<TileEpilogue>,
}

/// A linear layer's epilogue for one tile, applied in registers by the kernels that can: the
/// bias at the tile's first column, the residual at its first row and column (stride `ldc`).
#[derive(Clone, Copy)]
pub(crate) struct TileEpilogue {
    pub(crate) bias: Option<*const f32>,
    pub(crate) residual: Option<*const f32>,
    pub(crate) activation: crate::EpilogueActivation,
}

impl Tile<'_> {
    /// The sums of the blocks before `b0` (0 when `b0 == 0`): the first `width` values of each
    /// output row, into rows of `panel` values of `sums`.
    ///
    /// # Safety
    /// As [`Tile::store`], readable.
    unsafe fn load(&self, sums: &mut [f32], panel: usize) {
        if self.b0 == 0 {
            return;
        }
        for (r, row) in sums.chunks_exact_mut(panel).take(self.rows).enumerate() {
            std::ptr::copy_nonoverlapping(self.out.add(r * self.ldc), row.as_mut_ptr(), self.width);
        }
    }

    /// Writes the first `width` values of each row of `sums` (stride `panel`) to the output.
    ///
    /// # Safety
    /// `out + r · ldc .. + width` is writable for every row `r < rows`, and no other thread
    /// accesses it.
    unsafe fn store(&self, sums: &[f32], panel: usize) {
        for (r, row) in sums.chunks_exact(panel).take(self.rows).enumerate() {
            std::ptr::copy_nonoverlapping(row.as_ptr(), self.out.add(r * self.ldc), self.width);
        }
    }
}

/// The scalar kernel.
///
/// # Safety
/// As [`Tile::store`].
unsafe fn tile_scalar(t: &Tile<'_>) {
    let groups = t.kp / GROUP;
    let mut out = [0f32; MAX_TILE_ROWS * PANEL];
    t.load(&mut out, PANEL);
    for r in 0..t.rows {
        let xr = &t.x[r * t.kp..(r + 1) * t.kp];
        let mut acc = [0f32; PANEL];
        acc.copy_from_slice(&out[r * PANEL..(r + 1) * PANEL]);
        for b in t.b0..t.b1 {
            let g0 = b * t.block_groups;
            let g1 = (g0 + t.block_groups).min(groups);
            let mut sums = [0i32; PANEL];
            for g in g0..g1 {
                let w = &t.codes[g * PANEL * GROUP..(g + 1) * PANEL * GROUP];
                let xg = &xr[g * GROUP..(g + 1) * GROUP];
                for (c, s) in sums.iter_mut().enumerate() {
                    for l in 0..GROUP {
                        *s += i32::from(xg[l]) * i32::from(w[c * GROUP + l]);
                    }
                }
            }
            let sc = &t.scales[b * PANEL..(b + 1) * PANEL];
            let xs = t.row_scales[r * t.blocks + b];
            for c in 0..PANEL {
                acc[c] += sums[c] as f32 * (sc[c] * xs);
            }
        }
        out[r * PANEL..(r + 1) * PANEL].copy_from_slice(&acc);
    }
    t.store(&out, PANEL);
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{Tile, GROUP, MAX_TILE_ROWS, PANEL, VNNI_PANEL};
    use std::arch::x86_64::*;

    /// The mask of the first `n` (at most 16) lanes.
    #[inline(always)]
    fn lanes(n: usize) -> __mmask16 {
        if n >= 16 {
            !0
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }

    /// `max |x[i]|` over `i0 .. i1` (NaN ignored, as by `f32::max`: `vmaxps` returns its
    /// second operand when the first is NaN).
    #[inline(always)]
    unsafe fn block_amax(x: *const f32, i0: usize, i1: usize) -> f32 {
        let mut m = _mm512_setzero_ps();
        let mut i = i0;
        while i + 16 <= i1 {
            m = _mm512_max_ps(_mm512_abs_ps(_mm512_loadu_ps(x.add(i))), m);
            i += 16;
        }
        if i < i1 {
            let v = _mm512_maskz_loadu_ps(lanes(i1 - i), x.add(i));
            m = _mm512_max_ps(_mm512_abs_ps(v), m);
        }
        _mm512_reduce_max_ps(m)
    }

    /// Codes of `x[i0 .. i1]` times `inv` (as `code`: NaN to 0, clamped to ±127, rounded to
    /// nearest even, the default rounding of `vcvtps2dq`) to `q[i0 .. i1]`; returns their sum.
    #[inline(always)]
    unsafe fn quantize_block(x: *const f32, q: *mut i8, i0: usize, i1: usize, inv: f32) -> i32 {
        let inv = _mm512_set1_ps(inv);
        let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
        let codes = |v: __m512| {
            let t = _mm512_mul_ps(v, inv);
            let t = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(t, t), t);
            _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(t, lo), hi))
        };
        let mut sum = _mm512_setzero_si512();
        let mut i = i0;
        while i + 16 <= i1 {
            let c = codes(_mm512_loadu_ps(x.add(i)));
            sum = _mm512_add_epi32(sum, c);
            _mm_storeu_si128(q.add(i) as *mut __m128i, _mm512_cvtepi32_epi8(c));
            i += 16;
        }
        if i < i1 {
            let mask = lanes(i1 - i);
            let c = codes(_mm512_maskz_loadu_ps(mask, x.add(i)));
            sum = _mm512_add_epi32(sum, c);
            _mm_mask_storeu_epi8(q.add(i), mask, _mm512_cvtepi32_epi8(c));
        }
        _mm512_reduce_add_epi32(sum)
    }

    /// [`super::quantize_rows_i8`], 16 values per instruction (and the scales of 16 blocks per
    /// division), and `-128 ·` each block's code sum in `offsets` (what the unsigned weight
    /// codes `qw + 128` add to the block's sum).
    ///
    /// # Safety
    /// The CPU supports AVX-512 F, BW and VL; `k > 0`, `x` holds `rows × k` values, `q`
    /// `rows × kp`, `scales` and `offsets` `rows × ceil(k / block)`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    pub(super) unsafe fn quantize_rows_vnni(
        x: &[f32],
        k: usize,
        kp: usize,
        block: usize,
        q: &mut [i8],
        scales: &mut [f32],
        offsets: &mut [i32],
    ) {
        const BATCH: usize = 16;
        let blocks = k.div_ceil(block);
        let (zero, inf) = (_mm512_setzero_ps(), _mm512_set1_ps(f32::INFINITY));
        let c127 = _mm512_set1_ps(127.0);
        for (((row, qrow), s), o) in x
            .chunks_exact(k)
            .zip(q.chunks_exact_mut(kp))
            .zip(scales.chunks_exact_mut(blocks))
            .zip(offsets.chunks_exact_mut(blocks))
        {
            let (xr, qr) = (row.as_ptr(), qrow.as_mut_ptr());
            for ((b0, s), o) in (0..blocks)
                .step_by(BATCH)
                .zip(s.chunks_mut(BATCH))
                .zip(o.chunks_mut(BATCH))
            {
                let mut amax = [0f32; BATCH];
                for (j, a) in amax.iter_mut().take(s.len()).enumerate() {
                    let i0 = (b0 + j) * block;
                    *a = block_amax(xr, i0, (i0 + block).min(k));
                }
                // Scales and inverses of 16 blocks at once; 0 for a zero or non-finite block.
                let a = _mm512_loadu_ps(amax.as_ptr());
                let valid = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(a, zero)
                    & _mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, inf);
                let scale = _mm512_maskz_div_ps(valid, a, c127);
                let mut inv = [0f32; BATCH];
                _mm512_storeu_ps(inv.as_mut_ptr(), _mm512_maskz_div_ps(valid, c127, a));
                _mm512_mask_storeu_ps(s.as_mut_ptr(), lanes(s.len()), scale);
                for (j, (o, &inv)) in o.iter_mut().zip(&inv).enumerate() {
                    let i0 = (b0 + j) * block;
                    *o = -128 * quantize_block(xr, qr, i0, (i0 + block).min(k), inv);
                }
            }
            if kp > k {
                qrow[k..].fill(0);
            }
        }
    }

    /// [`super::quantize_rows_i16`], 8 values per instruction (the last `block % 8` of each
    /// block one at a time).
    ///
    /// # Safety
    /// The CPU supports AVX2; `k > 0`, `x` holds `rows × k` values, `q` `rows × kp` and
    /// `scales` `rows × ceil(k / block)`.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn quantize_rows_avx2(
        x: &[f32],
        k: usize,
        kp: usize,
        block: usize,
        q: &mut [i16],
        scales: &mut [f32],
    ) {
        let blocks = k.div_ceil(block);
        let abs = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff));
        let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
        for ((row, qrow), s) in x
            .chunks_exact(k)
            .zip(q.chunks_exact_mut(kp))
            .zip(scales.chunks_exact_mut(blocks))
        {
            for ((xb, qb), sb) in row.chunks(block).zip(qrow.chunks_mut(block)).zip(s) {
                let whole = xb.len() / 8 * 8;
                // NaN is ignored, as by `f32::max`: `vmaxps` returns its second operand when
                // the first is NaN.
                let mut m = _mm256_setzero_ps();
                for i in (0..whole).step_by(8) {
                    let v = _mm256_and_ps(_mm256_loadu_ps(xb.as_ptr().add(i)), abs);
                    m = _mm256_max_ps(v, m);
                }
                let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
                let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
                let m = _mm_max_ss(m, _mm_movehdup_ps(m));
                let amax = xb[whole..]
                    .iter()
                    .fold(_mm_cvtss_f32(m), |a, v| a.max(v.abs()));
                let (scale, inv) = if amax > 0.0 && amax.is_finite() {
                    (amax / 127.0, 127.0 / amax)
                } else {
                    (0.0, 0.0)
                };
                *sb = scale;
                let invv = _mm256_set1_ps(inv);
                for i in (0..whole).step_by(8) {
                    // As `code`: NaN to 0, clamped, rounded to nearest even (the default
                    // rounding of `vcvtps2dq`).
                    let t = _mm256_mul_ps(_mm256_loadu_ps(xb.as_ptr().add(i)), invv);
                    let t = _mm256_and_ps(t, _mm256_cmp_ps::<_CMP_ORD_Q>(t, t));
                    let c = _mm256_cvtps_epi32(_mm256_min_ps(_mm256_max_ps(t, lo), hi));
                    let c =
                        _mm_packs_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
                    _mm_storeu_si128(qb.as_mut_ptr().add(i) as *mut __m128i, c);
                }
                for (d, v) in qb[whole..].iter_mut().zip(&xb[whole..]) {
                    *d = super::code(*v, inv) as i16;
                }
            }
            qrow[k..].fill(0);
        }
    }

    /// `MR` rows of the AVX2 kernel: per pair of in-features, the 16 outputs' codes widened to
    /// 16 bits (two registers) times each row's pair of codes broadcast, summed by `vpmaddwd`.
    #[inline(always)]
    unsafe fn tile_avx2_rows<const MR: usize>(t: &Tile<'_>) {
        const PAIR: usize = 2;
        let pairs = t.kp / PAIR;
        let x = t.x16.as_ptr();
        let w = t.codes.as_ptr();
        let mut out = [0f32; MAX_TILE_ROWS * PANEL];
        t.load(&mut out, PANEL);
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for (r, a) in acc.iter_mut().enumerate() {
            let o = out.as_ptr().add(r * PANEL);
            *a = [_mm256_loadu_ps(o), _mm256_loadu_ps(o.add(8))];
        }
        for b in t.b0..t.b1 {
            let g0 = b * t.block_groups;
            let g1 = (g0 + t.block_groups).min(pairs);
            let mut sums = [[_mm256_setzero_si256(); 2]; MR];
            for g in g0..g1 {
                let wp = w.add(g * PANEL * PAIR);
                let w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wp as *const __m128i));
                let w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(wp.add(16) as *const __m128i));
                for (r, s) in sums.iter_mut().enumerate() {
                    let xv = (x.add(r * t.kp + g * PAIR) as *const i32).read_unaligned();
                    let xb = _mm256_set1_epi32(xv);
                    s[0] = _mm256_add_epi32(s[0], _mm256_madd_epi16(w0, xb));
                    s[1] = _mm256_add_epi32(s[1], _mm256_madd_epi16(w1, xb));
                }
            }
            let sc = t.scales.as_ptr().add(b * PANEL);
            let s0 = _mm256_loadu_ps(sc);
            let s1 = _mm256_loadu_ps(sc.add(8));
            for (r, (a, s)) in acc.iter_mut().zip(&sums).enumerate() {
                let xs = _mm256_set1_ps(*t.row_scales.get_unchecked(r * t.blocks + b));
                let (s0, s1) = (_mm256_mul_ps(s0, xs), _mm256_mul_ps(s1, xs));
                a[0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[0]), s0, a[0]);
                a[1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[1]), s1, a[1]);
            }
        }
        for (r, a) in acc.iter().enumerate() {
            let o = out.as_mut_ptr().add(r * PANEL);
            _mm256_storeu_ps(o, a[0]);
            _mm256_storeu_ps(o.add(8), a[1]);
        }
        t.store(&out, PANEL);
    }

    /// The AVX2 kernel over one tile (up to 6 rows).
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA; `t` holds `t.rows` rows of `kp` codes, the panel's
    /// `kp / 2` pairs and `blocks` scales; the output as [`Tile::store`] requires.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_avx2(t: &Tile<'_>) {
        match t.rows {
            6 => tile_avx2_rows::<6>(t),
            5 => tile_avx2_rows::<5>(t),
            4 => tile_avx2_rows::<4>(t),
            3 => tile_avx2_rows::<3>(t),
            2 => tile_avx2_rows::<2>(t),
            _ => tile_avx2_rows::<1>(t),
        }
    }

    /// Adds the products of `n` groups of 4 in-features to the i32 sums of `MR` rows × 32
    /// outputs: per group, the panel's two registers of 16 outputs' (unsigned) codes times each
    /// row's 4 codes broadcast, summed by `vpdpbusd`. `x[r]` and `w` point at the first group.
    #[inline(always)]
    unsafe fn vnni_groups<const MR: usize>(
        x: &[*const i8; MR],
        w: *const i8,
        n: usize,
        sums: &mut [[__m512i; 2]; MR],
    ) {
        for g in 0..n {
            let wp = w.add(g * VNNI_PANEL * GROUP);
            let w0 = _mm512_loadu_si512(wp as *const __m512i);
            let w1 = _mm512_loadu_si512(wp.add(64) as *const __m512i);
            for (s, xr) in sums.iter_mut().zip(x) {
                let xb = _mm512_set1_epi32((xr.add(g * GROUP) as *const i32).read_unaligned());
                s[0] = _mm512_dpbusd_epi32(s[0], w0, xb);
                s[1] = _mm512_dpbusd_epi32(s[1], w1, xb);
            }
        }
    }

    /// `MR` rows × 32 outputs of the VNNI kernel (blocks of `BG` groups when `BG > 0`, so the
    /// group loop unrolls; `t.block_groups` otherwise): per block, the i32 sums of
    /// [`vnni_groups`] start at the rows' offsets, then are converted and added to the rows'
    /// f32 sums with the block's weight scales times the row's scale.
    #[inline(always)]
    unsafe fn tile_vnni_rows<const MR: usize, const BG: usize>(t: &Tile<'_>) {
        const P: usize = VNNI_PANEL;
        let groups = t.kp / GROUP;
        let (m0, m1) = (lanes(t.width), lanes(t.width.saturating_sub(16)));
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        if t.b0 > 0 {
            for (r, a) in acc.iter_mut().enumerate() {
                let o = t.out.add(r * t.ldc);
                *a = [
                    _mm512_maskz_loadu_ps(m0, o),
                    _mm512_maskz_loadu_ps(m1, o.add(16)),
                ];
            }
        }
        let mut x = [t.x.as_ptr(); MR];
        for (r, xr) in x.iter_mut().enumerate() {
            *xr = xr.add(r * t.kp);
        }
        let w = t.codes.as_ptr();
        let (xs, offsets) = (t.row_scales.as_ptr(), t.row_offsets.as_ptr());
        for b in t.b0..t.b1 {
            let g0 = b * t.block_groups;
            let n = t.block_groups.min(groups - g0);
            // Starting at -128 · Σ qx cancels the +128 of the unsigned weight codes.
            let mut sums = [[_mm512_setzero_si512(); 2]; MR];
            for (r, s) in sums.iter_mut().enumerate() {
                let o = _mm512_set1_epi32(*offsets.add(r * t.blocks + b));
                *s = [o, o];
            }
            let xg = x.map(|xr| xr.add(g0 * GROUP));
            let wg = w.add(g0 * P * GROUP);
            if BG > 0 && n == BG {
                vnni_groups(&xg, wg, BG, &mut sums);
            } else {
                vnni_groups(&xg, wg, n, &mut sums);
            }
            let sc = t.scales.as_ptr().add(b * P);
            let (sc0, sc1) = (_mm512_loadu_ps(sc), _mm512_loadu_ps(sc.add(16)));
            for (r, (a, s)) in acc.iter_mut().zip(&sums).enumerate() {
                let xs = _mm512_set1_ps(*xs.add(r * t.blocks + b));
                a[0] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[0]), _mm512_mul_ps(sc0, xs), a[0]);
                a[1] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[1]), _mm512_mul_ps(sc1, xs), a[1]);
            }
        }
        if let (Some(e), true) = (t.fused, t.b1 == t.blocks) {
            finish_in_registers(&mut acc, e, t.ldc, (m0, m1));
        }
        for (r, a) in acc.iter().enumerate() {
            let o = t.out.add(r * t.ldc);
            _mm512_mask_storeu_ps(o, m0, a[0]);
            _mm512_mask_storeu_ps(o.add(16), m1, a[1]);
        }
    }

    /// `activation(sums + residual + bias)` (in `finish_rows`' order, so the results are the same
    /// to the bit) over `MR` rows × 32 outputs held in registers (the
    /// columns beyond the masks are never stored, so what they hold does not matter). Shared
    /// with the AVX-512 bf16 kernels.
    #[inline(always)]
    pub(crate) unsafe fn finish_in_registers<const MR: usize>(
        acc: &mut [[__m512; 2]; MR],
        e: super::TileEpilogue,
        ldc: usize,
        (m0, m1): (__mmask16, __mmask16),
    ) {
        if let Some(res) = e.residual {
            for (r, a) in acc.iter_mut().enumerate() {
                let p = res.add(r * ldc);
                a[0] = _mm512_add_ps(a[0], _mm512_maskz_loadu_ps(m0, p));
                a[1] = _mm512_add_ps(a[1], _mm512_maskz_loadu_ps(m1, p.add(16)));
            }
        }
        if let Some(b) = e.bias {
            let (b0, b1) = (
                _mm512_maskz_loadu_ps(m0, b),
                _mm512_maskz_loadu_ps(m1, b.add(16)),
            );
            for a in acc.iter_mut() {
                a[0] = _mm512_add_ps(a[0], b0);
                a[1] = _mm512_add_ps(a[1], b1);
            }
        }
        if e.activation != crate::EpilogueActivation::Identity {
            let mut v = [0f32; 32];
            for a in acc.iter_mut() {
                _mm512_storeu_ps(v.as_mut_ptr(), a[0]);
                _mm512_storeu_ps(v.as_mut_ptr().add(16), a[1]);
                crate::linear::activate_panel(&mut v, e.activation);
                a[0] = _mm512_loadu_ps(v.as_ptr());
                a[1] = _mm512_loadu_ps(v.as_ptr().add(16));
            }
        }
    }

    /// The AMX configuration for blocks of `block` in-features: sums `tmm0..tmm3` (16 rows ×
    /// 16 i32), activations `tmm4`, `tmm5` (16 rows × one step of in-features, `min(block,
    /// 64)`), weights `tmm6`, `tmm7` (a step's groups of 4 × 16 outputs × 4 bytes).
    pub(super) fn amx_config(block: usize) -> crate::amx::TileConfig {
        let step = block.min(super::AMX_STEP);
        let (a, b) = (step as u16, (step / GROUP) as u8);
        crate::amx::TileConfig::new()
            .tile(0, 16, 64)
            .tile(1, 16, 64)
            .tile(2, 16, 64)
            .tile(3, 16, 64)
            .tile(4, 16, a)
            .tile(5, 16, a)
            .tile(6, b, 64)
            .tile(7, b, 64)
    }

    /// The AMX-INT8 kernel on 16 (`TWO == false`) or 32 rows × 32 outputs: per block, the
    /// tiles of sums start at 0 and take the block's steps (one or two tiles of activations
    /// times the panel's two tiles of weights, read with the stride of a panel row); then they
    /// go through memory to registers, where they are scaled and added to the rows' f32 sums
    /// (kept in memory, 32 rows × 32) exactly as [`tile_vnni_rows`] adds them.
    #[inline(always)]
    unsafe fn tile_amx_rows<const TWO: bool>(t: &Tile<'_>) {
        use crate::amx::tile;
        const P: usize = VNNI_PANEL;
        const ROWS: usize = super::AMX_ROWS;
        // Bytes per packed group of 4 in-features of 32 outputs.
        const ROW: usize = P * GROUP;
        let rows = if TWO { ROWS } else { 16 };
        let block = t.block_groups * GROUP;
        let step = block.min(super::AMX_STEP);
        let a = t.x.as_ptr() as *const u8;
        let lda = t.kp;
        let w = t.codes.as_ptr() as *const u8;
        let (m0, m1) = lanes2(t.width);
        #[repr(align(64))]
        struct Buf<T>([T; ROWS * P]);
        let mut acc = Buf([0f32; ROWS * P]);
        let acc = acc.0.as_mut_ptr();
        if t.b0 > 0 {
            for r in 0..t.rows {
                let o = t.out.add(r * t.ldc);
                _mm512_storeu_ps(acc.add(r * P), _mm512_maskz_loadu_ps(m0, o));
                _mm512_storeu_ps(acc.add(r * P + 16), _mm512_maskz_loadu_ps(m1, o.add(16)));
            }
        }
        let mut sums = Buf([0i32; ROWS * P]);
        let c = sums.0.as_mut_ptr();
        let xs = t.row_scales.as_ptr();
        for b in t.b0..t.b1 {
            tile::zero::<0>();
            tile::zero::<1>();
            if TWO {
                tile::zero::<2>();
                tile::zero::<3>();
            }
            let mut i = b * block;
            while i < (b + 1) * block {
                // Loads ordered as in the bf16 AMX kernel: each right before its first use.
                let wp = w.add(i / GROUP * ROW);
                tile::load::<4>(a.add(i), lda);
                tile::load::<6>(wp, ROW);
                tile::dpbssd::<0, 4, 6>();
                tile::load::<7>(wp.add(64), ROW);
                tile::dpbssd::<1, 4, 7>();
                if TWO {
                    tile::load::<5>(a.add(16 * lda + i), lda);
                    tile::dpbssd::<2, 5, 6>();
                    tile::dpbssd::<3, 5, 7>();
                }
                i += step;
            }
            tile::store::<0>(c as *mut u8, P * 4);
            tile::store::<1>(c.add(16) as *mut u8, P * 4);
            if TWO {
                tile::store::<2>(c.add(16 * P) as *mut u8, P * 4);
                tile::store::<3>(c.add(16 * P + 16) as *mut u8, P * 4);
            }
            let sc = t.scales.as_ptr().add(b * P);
            let (sc0, sc1) = (_mm512_loadu_ps(sc), _mm512_loadu_ps(sc.add(16)));
            for r in 0..rows.min(t.rows) {
                let x = _mm512_set1_ps(*xs.add(r * t.blocks + b));
                let (s, o) = (c.add(r * P), acc.add(r * P));
                let s0 = _mm512_cvtepi32_ps(_mm512_loadu_si512(s as *const __m512i));
                let s1 = _mm512_cvtepi32_ps(_mm512_loadu_si512(s.add(16) as *const __m512i));
                let a0 = _mm512_fmadd_ps(s0, _mm512_mul_ps(sc0, x), _mm512_loadu_ps(o));
                let a1 = _mm512_fmadd_ps(s1, _mm512_mul_ps(sc1, x), _mm512_loadu_ps(o.add(16)));
                _mm512_storeu_ps(o, a0);
                _mm512_storeu_ps(o.add(16), a1);
            }
        }
        let fused = t.fused.filter(|_| t.b1 == t.blocks);
        finish_and_store_rows(acc, t.rows, fused, t.out, t.ldc, (m0, m1));
    }

    /// Stores `rows` rows of 32 f32 sums at `sums` (32 apart) to `out + r · ldc`, the lanes
    /// the masks keep, through the epilogue `fused` (its residual at row `r`, column 0) when
    /// there is one. The AMX kernels' last step, after their tiles of sums went to memory.
    #[inline(always)]
    pub(crate) unsafe fn finish_and_store_rows(
        sums: *const f32,
        rows: usize,
        fused: Option<super::TileEpilogue>,
        out: *mut f32,
        ldc: usize,
        (m0, m1): (__mmask16, __mmask16),
    ) {
        for r in 0..rows {
            let s = sums.add(r * VNNI_PANEL);
            let mut a = [[_mm512_loadu_ps(s), _mm512_loadu_ps(s.add(16))]];
            if let Some(mut e) = fused {
                e.residual = e.residual.map(|p| p.add(r * ldc));
                finish_in_registers(&mut a, e, ldc, (m0, m1));
            }
            let o = out.add(r * ldc);
            _mm512_mask_storeu_ps(o, m0, a[0][0]);
            _mm512_mask_storeu_ps(o.add(16), m1, a[0][1]);
        }
    }

    /// The masks of the first `width` (at most 32) lanes of two 16-lane registers.
    #[inline(always)]
    fn lanes2(width: usize) -> (__mmask16, __mmask16) {
        (lanes(width), lanes(width.saturating_sub(16)))
    }

    /// The AMX-INT8 kernel over one tile (up to 32 rows).
    ///
    /// # Safety
    /// [`crate::amx_support`] is ready for int8 and this thread's tiles are configured as
    /// [`amx_config`] for the weight's block; `t.x` holds 32 rows of `t.kp` codes (whole
    /// blocks), the panel `t.kp / 4` groups of 32 × 4 signed codes and `blocks × 32` scales;
    /// the output as [`Tile::store`] requires.
    #[target_feature(enable = "avx512f,avx512bw,fma")]
    pub(super) unsafe fn tile_amx(t: &Tile<'_>) {
        if t.rows > 16 {
            tile_amx_rows::<true>(t)
        } else {
            tile_amx_rows::<false>(t)
        }
    }

    /// [`tile_vnni_rows`] with the group loop unrolled for blocks of 32 in-features.
    #[inline(always)]
    unsafe fn tile_vnni_blocks<const MR: usize>(t: &Tile<'_>) {
        if t.block_groups == 8 {
            tile_vnni_rows::<MR, 8>(t)
        } else {
            tile_vnni_rows::<MR, 0>(t)
        }
    }

    /// The AVX-512 VNNI kernel over one tile (up to `Int8Isa::tile_rows` rows).
    ///
    /// # Safety
    /// The CPU supports AVX-512 F, BW and VNNI; `t` holds `t.rows` rows of `kp` codes, the
    /// panel's `kp / 4` groups of 32 × 4 codes and `blocks × 32` scales, the rows' `blocks`
    /// scales and offsets each; the output
    /// as [`Tile::store`] requires.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    pub(super) unsafe fn tile_vnni(t: &Tile<'_>) {
        match t.rows {
            8 => tile_vnni_blocks::<8>(t),
            7 => tile_vnni_blocks::<7>(t),
            6 => tile_vnni_blocks::<6>(t),
            5 => tile_vnni_blocks::<5>(t),
            4 => tile_vnni_blocks::<4>(t),
            3 => tile_vnni_blocks::<3>(t),
            2 => tile_vnni_blocks::<2>(t),
            _ => tile_vnni_blocks::<1>(t),
        }
    }
}

/// Runs the packed weight's kernel over one tile.
///
/// # Safety
/// As [`Tile::store`]; the tile's slices are cut to the sizes the kernels read.
unsafe fn run_tile(isa: Int8Isa, t: &Tile<'_>) {
    debug_assert!(t.rows <= isa.tile_rows() && t.width <= isa.panel());
    match isa {
        Int8Isa::Scalar => tile_scalar(t),
        // SAFETY: a PackedInt8 is only built for a kernel the CPU supports
        // (`Int8Isa::available`).
        #[cfg(target_arch = "x86_64")]
        Int8Isa::Avx2 => x86::tile_avx2(t),
        #[cfg(target_arch = "x86_64")]
        Int8Isa::Avx512Vnni => x86::tile_vnni(t),
        // SAFETY: as above, and `linear_int8` configures the tiles with `x86::amx_config` for
        // the weight's block on each task that runs AMX tiles.
        #[cfg(target_arch = "x86_64")]
        Int8Isa::Amx => x86::tile_amx(t),
        #[cfg(not(target_arch = "x86_64"))]
        _ => tile_scalar(t),
    }
}

/// An output pointer shared by tasks that write disjoint tiles.
#[derive(Clone, Copy)]
pub(crate) struct OutPtr(pub(crate) *mut f32);
impl OutPtr {
    /// The pointer `i` values past the start (a method, so closures capture the whole
    /// `Send + Sync` wrapper rather than its raw pointer field).
    ///
    /// # Safety
    /// `i` is within the output.
    pub(crate) unsafe fn at(self, i: usize) -> *mut f32 {
        self.0.add(i)
    }
}

/// Applies `epilogue` to the rows `rows` of columns `c0 .. c0 + width` of the `[_, n]` output
/// behind `out` (a finished tile, while it is in cache).
///
/// # Safety
/// Those values are initialised, and no other thread accesses them meanwhile.
pub(crate) unsafe fn finish_tile(
    out: OutPtr,
    rows: std::ops::Range<usize>,
    n: usize,
    c0: usize,
    width: usize,
    epilogue: &Epilogue<'_>,
) {
    for row in rows {
        let dst = std::slice::from_raw_parts_mut(out.at(row * n + c0), width);
        finish_rows(
            dst,
            width,
            epilogue.bias.map(|b| &b[c0..c0 + width]),
            epilogue
                .residual
                .map(|res| &res[row * n + c0..row * n + c0 + width]),
            epilogue.activation,
        );
    }
}

// SAFETY: every task writes its own rectangle of the output (see `linear_int8`, `linear_bf16`
// and `linear_ggml`).
unsafe impl Send for OutPtr {}
// SAFETY: as above.
unsafe impl Sync for OutPtr {}

/// `activation(x · Wᵀ + bias + residual)` (see [`Epilogue`]) for `x` `[rows, k]` and a packed
/// int8 weight `[n, k]`; returns `[rows, n]`. Each block of each row of `x` is quantized to int8
/// with its own scale (see the module documentation); the product runs on every rayon thread when it is
/// large.
///
/// # Panics
/// When a slice's length does not match the shapes.
pub fn linear_int8(x: &[f32], rows: usize, w: &PackedInt8, epilogue: Epilogue<'_>) -> Vec<f32> {
    let (n, k) = (w.n, w.k);
    let Epilogue {
        bias,
        residual,
        activation,
    } = epilogue;
    assert_eq!(x.len(), rows * k, "linear_int8: input is not [rows, k]");
    assert!(
        bias.is_none_or(|b| b.len() == n),
        "linear_int8: bias is not [n]"
    );
    assert!(
        residual.is_none_or(|r| r.len() == rows * n),
        "linear_int8: residual is not [rows, n]"
    );
    let size = rows * n;
    let fused = bias.is_some() || residual.is_some() || activation != Default::default();
    if size == 0 || k == 0 {
        let mut out = vec![0f32; size];
        if fused && size > 0 {
            finish_rows(&mut out, n, bias, residual, activation);
        }
        return out;
    }
    let isa = w.isa;
    // The VNNI kernel applies the epilogue in registers as it stores a tile's last sums; the
    // others leave it to `finish_tile` (one pass over the tile while it is in cache).
    let in_kernel = fused && matches!(isa, Int8Isa::Avx512Vnni | Int8Isa::Amx);
    let group = isa.group();
    let kp = isa.padded_k(k, w.block);
    let groups = kp / group;
    let blocks = k.div_ceil(w.block);
    let panels = n.div_ceil(isa.panel());
    let mr = isa.tile_rows();

    let block = w.block;
    // Tiles of `row_block` rows × `panel_block` panels; enough of them to keep every thread busy.
    let threads = rayon::current_num_threads().max(1);
    let work = rows * n * k.max(1);
    let tasks_wanted = if work >= crate::PARALLEL_THRESHOLD * 16 {
        threads * 8
    } else {
        1
    };
    let row_tiles = rows.div_ceil(mr);
    let row_block = (row_tiles.div_ceil(tasks_wanted).clamp(1, 16)) * mr;
    let row_tasks = rows.div_ceil(row_block);
    let panel_tasks = tasks_wanted.div_ceil(row_tasks).clamp(1, panels);
    let panel_block = panels.div_ceil(panel_tasks);
    let panel_tasks = panels.div_ceil(panel_block);
    let tasks = row_tasks * panel_tasks;
    // Each task quantizes its own rows when no other task reads them (no second pass over the
    // activations, and they are still in cache when the kernel reads them); otherwise they are
    // quantized once for all tasks first.
    let shared = (panel_tasks > 1).then(|| Activations::quantize(isa, x, k, kp, block, tasks > 1));
    // The in-features are run in chunks of whole blocks (see `K_CHUNK`).
    let chunk_blocks = (K_CHUNK / block).max(1);

    let block_groups = w.block / group;
    let panel = isa.panel();
    let panel_codes = groups * panel * group;
    let panel_scales = blocks * panel;
    // Every value is written by the tasks below (the first chunk of each tile) before the
    // length is set.
    let mut out: Vec<f32> = Vec::with_capacity(size);
    let out_ptr = OutPtr(out.as_mut_ptr());
    let task = |t: usize| {
        let (rt, pt) = (t / panel_tasks, t % panel_tasks);
        let (r0, r1) = (rt * row_block, ((rt + 1) * row_block).min(rows));
        let (p0, p1) = (pt * panel_block, ((pt + 1) * panel_block).min(panels));
        let local;
        let (xq, first) = match &shared {
            Some(q) => (q, 0),
            None => {
                local = Activations::quantize(isa, &x[r0 * k..r1 * k], k, kp, block, false);
                (&local, r0)
            }
        };
        // SAFETY: an AMX weight is only packed where `amx_support` is ready; nothing else runs
        // on this thread until the task ends (no rayon call below).
        #[cfg(target_arch = "x86_64")]
        let _tiles = (isa == Int8Isa::Amx)
            .then(|| unsafe { crate::amx::TileScope::enter(&x86::amx_config(block)) });
        for b0 in (0..blocks).step_by(chunk_blocks) {
            let b1 = (b0 + chunk_blocks).min(blocks);
            for p in p0..p1 {
                let codes = &w.codes[p * panel_codes..(p + 1) * panel_codes];
                let scales = &w.scales[p * panel_scales..(p + 1) * panel_scales];
                let c0 = p * panel;
                let width = panel.min(n - c0);
                let mut r = r0;
                while r < r1 {
                    let tile_rows = mr.min(r1 - r);
                    // The AMX kernel reads whole tiles (the rows are padded to them).
                    let read = if isa == Int8Isa::Amx { mr } else { tile_rows };
                    let rs = (r - first) * kp..(r - first + read) * kp;
                    let (x8, x16) = match &xq.codes {
                        Codes::I8(q) => (&q[rs], &[][..]),
                        Codes::I16(q) => (&[][..], &q[rs]),
                    };
                    let rb = (r - first) * blocks..(r - first + tile_rows) * blocks;
                    let tile = Tile {
                        x: x8,
                        x16,
                        kp,
                        rows: tile_rows,
                        codes,
                        scales,
                        blocks,
                        block_groups,
                        b0,
                        b1,
                        row_scales: &xq.scales[rb.clone()],
                        row_offsets: xq.offsets.get(rb).unwrap_or(&[]),
                        // SAFETY: row r, column c0 lies within the output.
                        out: unsafe { out_ptr.at(r * n + c0) },
                        ldc: n,
                        width,
                        fused: in_kernel.then(|| TileEpilogue {
                            // SAFETY: column c0 and row r, column c0 lie within the bias and
                            // the residual (their lengths were checked above).
                            bias: bias.map(|b| unsafe { b.as_ptr().add(c0) }),
                            residual: residual.map(|res| unsafe { res.as_ptr().add(r * n + c0) }),
                            activation,
                        }),
                    };
                    // SAFETY: rows r .. r + tile_rows ≤ rows, columns c0 .. c0 + width ≤ n lie
                    // in this task's rectangle, which no other task accesses.
                    unsafe { run_tile(isa, &tile) };
                    if fused && !in_kernel && b1 == blocks {
                        // SAFETY: the kernel has just written these values, in this task's
                        // rectangle.
                        unsafe { finish_tile(out_ptr, r..r + tile_rows, n, c0, width, &epilogue) };
                    }
                    r += tile_rows;
                }
            }
        }
    };
    if tasks == 1 {
        task(0);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
    // SAFETY: the tasks cover every row and every panel, and the first chunk of in-features
    // (k > 0) writes every value of a tile, so every value has been written.
    unsafe { out.set_len(size) };
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EpilogueActivation;
    use rand::{Rng, SeedableRng};

    #[test]
    fn vectorised_quantization_matches_the_portable_one() {
        // Ties, NaN, infinities, zeros and signed zeros, tails shorter than a register.
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        for &(rows, k, block) in &[
            (3usize, 37usize, 4usize),
            (2, 100, 32),
            (4, 200, 200),
            (1, 64, 64),
        ] {
            let kp = k.div_ceil(GROUP) * GROUP;
            let mut x: Vec<f32> = (0..rows * k)
                .map(|_| rng.random_range(-3.0f32..3.0))
                .collect();
            // A block whose maximum is 127, so halves are exact ties.
            for (i, v) in x[..block.min(k)].iter_mut().enumerate() {
                *v = (i as f32 - 20.0) * 0.5;
            }
            x[0] = 127.0;
            x[k / 2] = f32::NAN;
            x[k - 1] = -0.0;
            if rows > 1 {
                x[k + 1] = f32::INFINITY;
                x[2 * k - 1] = f32::NEG_INFINITY;
            }
            if rows > 2 {
                x[2 * k..3 * k].fill(0.0);
            }
            let blocks = k.div_ceil(block);
            let mut want = (
                vec![0i8; rows * kp],
                vec![0f32; rows * blocks],
                vec![0i32; rows * blocks],
            );
            quantize_rows_i8(&x, k, kp, block, &mut want.0, &mut want.1, &mut want.2);
            for (r, o) in want.2.chunks(blocks).enumerate() {
                for (b, &o) in o.iter().enumerate() {
                    let codes = &want.0[r * kp + b * block..r * kp + ((b + 1) * block).min(k)];
                    assert_eq!(o, -128 * codes.iter().map(|&c| i32::from(c)).sum::<i32>());
                }
            }
            let bits = |s: &[f32]| s.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            // The 16-bit codes (AVX2 kernel): the same codes and scales.
            let mut got16 = (vec![0i16; rows * kp], vec![0f32; rows * blocks]);
            quantize_rows16(&x, k, kp, block, &mut got16.0, &mut got16.1);
            let wide: Vec<i16> = want.0.iter().map(|&c| i16::from(c)).collect();
            assert_eq!(got16.0, wide, "16-bit {rows}x{k}/{block} codes");
            assert_eq!(
                bits(&got16.1),
                bits(&want.1),
                "16-bit {rows}x{k}/{block} scales"
            );
            for isa in Int8Isa::ALL.into_iter().filter(|i| i.available()) {
                if isa == Int8Isa::Avx2 {
                    continue;
                }
                let mut got = (
                    vec![0i8; rows * kp],
                    vec![0f32; rows * blocks],
                    vec![0i32; rows * blocks],
                );
                quantize_rows(isa, &x, k, kp, block, &mut got.0, &mut got.1, &mut got.2);
                assert_eq!(got.2, want.2, "{isa:?} {rows}x{k}/{block} offsets");
                assert_eq!(got.0, want.0, "{isa:?} {rows}x{k}/{block} codes");
                assert_eq!(
                    bits(&got.1),
                    bits(&want.1),
                    "{isa:?} {rows}x{k}/{block} scales"
                );
            }
        }
    }

    /// Symmetric per-block codes and scales of a random `[n, k]` weight.
    fn random_weight(
        rng: &mut rand::rngs::StdRng,
        n: usize,
        k: usize,
        block: usize,
    ) -> (Vec<i8>, Vec<f32>) {
        let blocks = k.div_ceil(block);
        let mut codes = vec![0i8; n * k];
        let mut scales = vec![0f32; n * blocks];
        for j in 0..n {
            for b in 0..blocks {
                let scale = rng.random_range(0.001f32..0.05);
                scales[j * blocks + b] = scale;
                for i in b * block..((b + 1) * block).min(k) {
                    // Extremes included: -128 and ±127 are where 16-bit sums could saturate.
                    codes[j * k + i] = match rng.random_range(0..20) {
                        0 => -128,
                        1 => 127,
                        2 => -127,
                        _ => rng.random_range(-127i32..=127) as i8,
                    };
                }
            }
        }
        (codes, scales)
    }

    /// Checks every kernel on a random `[rows, k]` × `[n, k]` product against the exact product
    /// of the quantized operands (in f64) and the f32 product.
    fn check_shape(rng: &mut rand::rngs::StdRng, rows: usize, k: usize, n: usize, block: usize) {
        let isas: Vec<Int8Isa> = Int8Isa::ALL.into_iter().filter(|i| i.available()).collect();
        let (codes, scales) = random_weight(rng, n, k, block);
        let blocks = k.div_ceil(block);
        let mut x: Vec<f32> = (0..rows * k)
            .map(|_| rng.random_range(-2.0f32..2.0))
            .collect();
        if rows > 2 {
            // An all-zero row (scale 0) and one with an outlier.
            x[k..2 * k].fill(0.0);
            x[2 * k] = 40.0;
        }
        let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
        let res: Vec<f32> = (0..rows * n)
            .map(|_| rng.random_range(-1.0f32..1.0))
            .collect();
        let w = |j: usize, i: usize| {
            f64::from(codes[j * k + i]) * f64::from(scales[j * blocks + i / block])
        };
        for isa in &isas {
            let packed = PackedInt8::with_isa(&codes, &scales, n, k, block, *isa).unwrap();
            assert_eq!(packed.unpack(), (codes.clone(), scales.clone()));
            let epi = Epilogue {
                bias: Some(&bias),
                residual: Some(&res),
                activation: EpilogueActivation::Identity,
            };
            let got = linear_int8(&x, rows, &packed, epi);
            let plain = linear_int8(&x, rows, &packed, Epilogue::default());
            let relu = Epilogue {
                activation: EpilogueActivation::Relu,
                ..epi
            };
            let relu = linear_int8(&x, rows, &packed, relu);
            // Every activation, applied in the kernel's registers or after it, as `finish_rows`
            // applies it to the plain product.
            for activation in [
                EpilogueActivation::GeluErf,
                EpilogueActivation::GeluTanh,
                EpilogueActivation::Silu,
                EpilogueActivation::QuickGelu,
            ] {
                let fused = linear_int8(&x, rows, &packed, Epilogue { activation, ..epi });
                let mut want = plain.clone();
                finish_rows(&mut want, n, Some(&bias), Some(&res), activation);
                for (i, (g, w)) in fused.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
                        "{isa:?} {activation:?} [{i}]: {g} vs {w}"
                    );
                }
            }
            for r in 0..rows {
                let xr = &x[r * k..(r + 1) * k];
                // Each block of the row has its own scale.
                let block_scale = |i: usize| {
                    let b = i / block;
                    let xb = &xr[b * block..((b + 1) * block).min(k)];
                    let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                    let inv = if amax > 0.0 { 127.0 / amax } else { 0.0 };
                    (amax / 127.0, inv)
                };
                for j in 0..n {
                    // The exact product of the quantized activations and the weight.
                    let mut exact = 0f64;
                    // The f32 product and the bound on what activation rounding changes.
                    let (mut float, mut bound, mut mag) = (0f64, 0f64, 0f64);
                    for (i, &xi) in xr.iter().enumerate() {
                        let (sx, inv) = block_scale(i);
                        let q = (xi * inv).round_ties_even().clamp(-127.0, 127.0);
                        exact += f64::from(q) * f64::from(sx) * w(j, i);
                        float += f64::from(xi) * w(j, i);
                        bound += w(j, i).abs() * f64::from(sx) * 0.5;
                        mag += (f64::from(xi) * w(j, i)).abs();
                    }
                    let g = f64::from(plain[r * n + j]);
                    let tol = 1e-5 * (1.0 + mag);
                    assert!(
                        (g - exact).abs() <= tol,
                        "{isa:?} {rows}x{k}x{n}/{block} [{r},{j}]: {g} vs {exact}"
                    );
                    assert!(
                        (g - float).abs() <= bound + tol,
                        "{isa:?} {rows}x{k}x{n} [{r},{j}]: {g} vs f32 {float} (bound {bound})"
                    );
                    let want = exact + f64::from(bias[j]) + f64::from(res[r * n + j]);
                    let f = f64::from(got[r * n + j]);
                    assert!(
                        (f - want).abs() <= tol + 1e-6 * want.abs(),
                        "{isa:?} epilogue [{r},{j}]"
                    );
                    let f = f64::from(relu[r * n + j]);
                    assert!(
                        (f - want.max(0.0)).abs() <= tol + 1e-6 * want.abs(),
                        "{isa:?} relu [{r},{j}]"
                    );
                }
            }
        }
    }

    #[test]
    fn every_kernel_matches_an_f64_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let shapes = [
            (1, 1, 1, 4),
            (1, 7, 5, 4),
            (3, 33, 17, 32),
            (5, 64, 16, 32),
            (9, 100, 31, 8),
            (17, 129, 45, 64),
            (33, 384, 40, 32),
            (70, 96, 130, 32),
            // Two chunks of in-features (K_CHUNK = 4096), the second one short.
            (7, 4136, 33, 8),
            // Large enough for parallel tasks: over panels (the activations quantized once for
            // all tasks) and over rows (each task quantizing its own).
            (3, 4096, 100, 32),
            (576, 64, 40, 16),
        ];
        eprintln!(
            "int8 kernels tested: {:?}",
            Int8Isa::ALL
                .into_iter()
                .filter(|i| i.available())
                .collect::<Vec<_>>()
        );
        for &(rows, k, n, block) in &shapes {
            check_shape(&mut rng, rows, k, n, block);
        }
    }

    #[test]
    fn every_tile_and_panel_edge() {
        // Every row count of a tile and its remainders, panels of 32 cut at every kind of
        // width, several blocks.
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        for rows in 1..=13 {
            for &n in &[1, 15, 16, 17, 31, 32, 33, 47, 64, 79] {
                check_shape(&mut rng, rows, 72, n, 8);
            }
        }
    }

    #[test]
    fn kernels_agree_exactly_on_integer_sums() {
        // Every kernel sums the same integers; with one block the f32 results are identical.
        let mut rng = rand::rngs::StdRng::seed_from_u64(11);
        let (rows, k, n) = (13, 200, 37);
        let (codes, scales) = random_weight(&mut rng, n, k, 200);
        let x: Vec<f32> = (0..rows * k)
            .map(|_| rng.random_range(-3.0f32..3.0))
            .collect();
        let outs: Vec<Vec<f32>> = Int8Isa::ALL
            .into_iter()
            .filter_map(|isa| PackedInt8::with_isa(&codes, &scales, n, k, 200, isa))
            .map(|w| linear_int8(&x, rows, &w, Epilogue::default()))
            .collect();
        for o in &outs[1..] {
            assert_eq!(o, &outs[0]);
        }
    }

    #[test]
    fn amx_gives_the_vnni_kernels_bits() {
        // Both kernels sum each block's integers exactly and add them to the f32 sums in the
        // same order, so they agree to the bit: every tile edge (rows 1..=33, outputs cut at
        // 16 and 32), every block kind AMX takes (one short step, one full step, several
        // steps), a last block cut short, and a product long enough for two chunks.
        if !(Int8Isa::Amx.available() && Int8Isa::Avx512Vnni.available()) {
            eprintln!("skipped: AMX-INT8 ({})", crate::amx_support().describe());
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(13);
        let shapes = [
            (1, 64, 17, 32),
            (15, 96, 32, 8),
            (16, 128, 33, 64),
            (17, 384, 16, 128),
            (31, 200, 47, 40),
            (32, 256, 64, 256),
            (33, 1536, 70, 128),
            (100, 4200, 40, 64),
            (7, 100, 5, 16),
        ];
        for &(rows, k, n, block) in &shapes {
            let (codes, scales) = random_weight(&mut rng, n, k, block);
            let x: Vec<f32> = (0..rows * k)
                .map(|_| rng.random_range(-3.0f32..3.0))
                .collect();
            let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let res: Vec<f32> = (0..rows * n)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect();
            let amx = PackedInt8::with_isa(&codes, &scales, n, k, block, Int8Isa::Amx).unwrap();
            let vnni =
                PackedInt8::with_isa(&codes, &scales, n, k, block, Int8Isa::Avx512Vnni).unwrap();
            assert_eq!(amx.unpack(), (codes.clone(), scales.clone()));
            for epi in [
                Epilogue::default(),
                Epilogue {
                    bias: Some(&bias),
                    residual: Some(&res),
                    activation: EpilogueActivation::GeluErf,
                },
            ] {
                let (a, v) = (
                    linear_int8(&x, rows, &amx, epi),
                    linear_int8(&x, rows, &vnni, epi),
                );
                assert_eq!(a, v, "{rows}x{k}x{n}/{block} {epi:?}");
            }
        }
        // Blocks AMX does not take fall back to the next kernel.
        assert!(PackedInt8::with_isa(&[0; 96], &[1.0], 1, 96, 96, Int8Isa::Amx).is_none());
        let w = PackedInt8::new(&[0; 96], &[1.0], 1, 96, 96).unwrap();
        assert_eq!(w.isa(), Int8Isa::Avx512Vnni);
    }

    #[test]
    fn bad_shapes_and_blocks_are_refused() {
        assert!(PackedInt8::new(&[0; 8], &[1.0; 2], 2, 4, 4).is_some());
        assert!(PackedInt8::new(&[0; 8], &[1.0; 2], 2, 4, 3).is_none());
        assert!(PackedInt8::new(&[0; 8], &[1.0; 2], 2, 4, 0).is_none());
        assert!(PackedInt8::new(&[0; 7], &[1.0; 2], 2, 4, 4).is_none());
        assert!(PackedInt8::new(&[0; 8], &[1.0; 3], 2, 4, 4).is_none());
        let w = PackedInt8::new(&[], &[], 3, 0, 32).unwrap();
        let bias = [1.0, 2.0, 3.0];
        let epi = Epilogue {
            bias: Some(&bias),
            ..Epilogue::default()
        };
        assert_eq!(
            linear_int8(&[], 2, &w, epi),
            vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0]
        );
    }
}
