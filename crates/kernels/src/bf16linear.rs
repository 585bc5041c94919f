//! bf16 linear layers: the weight stored as bfloat16 (half the bytes of f32), the activations
//! rounded to bfloat16 on the fly, products summed in f32.
//!
//! `y[r, j] = Σ_i bf16(x[r, i]) · bf16(w[j, i])`: every product of two bf16 values is exact in
//! f32 (8 + 8 significant bits), so next to the product of the rounded operands the only error
//! is that of the f32 sums, at most `γ_k · Σ_i |x_i · w_i|` (`γ_k = k·u / (1 − k·u)`,
//! `u = 2⁻²⁴`) whatever the order. Rounding is to nearest, ties to even; NaN stays NaN.
//!
//! Five kernels, the widest the CPU has chosen at run time:
//! - **AMX-BF16** (`tdpbf16ps`: a 16 × 16 tile of f32 sums takes the products of 16 rows × 32
//!   in-features × 16 outputs per instruction), on tiles of 32 rows × 32 outputs (four tiles of
//!   sums, two of activations, two of weights, every tile register); the weight's panels are
//!   the tiles' operand layout as they are, read with a stride of a panel row, and the
//!   activations are rounded as for AVX-512 BF16. Only where [`crate::amx_support`] says the OS
//!   gave this process the tile state.
//! - **AVX-512 BF16** (`vdpbf16ps`: each f32 lane adds the products of one pair of bf16 values,
//!   32 products per instruction), on tiles of 8 rows × 32 outputs held in 16 registers; the
//!   activations are rounded by `vcvtne2ps2bf16`. Like those instructions always do, it treats
//!   denormal inputs as zero and flushes denormal sums to zero; elsewhere its rounding is the
//!   same as [`round_bf16`]'s.
//! - **AVX-512F** and **AVX2 + FMA**: the packed weight is widened to f32 as it is loaded (a
//!   bf16 is the upper half of an f32: one shift or mask per register) and multiplied by
//!   activations kept as bf16-rounded f32.
//! - **Scalar**, everywhere else.
//!
//! Weights are packed once ([`PackedBf16`]) into panels of 32 outputs with pairs of consecutive
//! in-features interleaved (`[panel][pair][output][2]`, the operand layout of `vdpbf16ps`), so
//! each kernel reads its panel front to back. The product runs on every rayon thread over tiles
//! of rows × panels; the bias, residual and activation of an [`Epilogue`] are applied to each
//! tile while it is in cache.

use rayon::prelude::*;

use crate::aligned::AlignedVec;
use crate::linear::{finish_rows, Epilogue};
use crate::qlinear::{finish_tile, OutPtr, TileEpilogue};

/// Outputs per packed panel (two 512-bit registers of f32 sums).
const PANEL: usize = 32;
/// The most rows one kernel call computes (the `tile_rows` of every ISA is at most this).
const MAX_TILE_ROWS: usize = 8;

/// Which instructions run a bf16 linear layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bf16Isa {
    /// Portable Rust.
    Scalar,
    /// AVX2 + FMA on widened f32 values.
    Avx2,
    /// AVX-512F on widened f32 values.
    Avx512,
    /// AVX-512 BF16 `vdpbf16ps` on bf16 pairs.
    Avx512Bf16,
    /// AMX-BF16 `tdpbf16ps` on tiles of bf16 pairs.
    Amx,
}

impl Bf16Isa {
    /// Every kernel, narrowest first.
    pub const ALL: [Bf16Isa; 5] = [
        Bf16Isa::Scalar,
        Bf16Isa::Avx2,
        Bf16Isa::Avx512,
        Bf16Isa::Avx512Bf16,
        Bf16Isa::Amx,
    ];

    /// Whether this CPU runs the kernel.
    pub fn available(self) -> bool {
        match self {
            Bf16Isa::Scalar => true,
            #[cfg(target_arch = "x86_64")]
            Bf16Isa::Avx2 => {
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
            }
            #[cfg(target_arch = "x86_64")]
            Bf16Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(target_arch = "x86_64")]
            Bf16Isa::Avx512Bf16 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512bf16")
            }
            Bf16Isa::Amx => crate::amx_support().bf16(),
            #[cfg(not(target_arch = "x86_64"))]
            _ => false,
        }
    }

    /// The fastest kernel this CPU runs: the widest, except that Intel CPUs take the AVX-512F
    /// kernel over `vdpbf16ps`. Measured on the GPU host's Xeon (AVX512_BF16 and AMX), one core,
    /// 1024 rows: `vdpbf16ps` reached 36–42 GMAC/s, half of f32 FMA through gemm and of the
    /// AVX-512F kernel (widened bf16, FMA), while Zen 4 runs it at twice f32's rate. (Intel's
    /// fast bf16 path is AMX, chosen first where the OS allows it.)
    pub fn detect() -> Bf16Isa {
        let intel = cpu_vendor_is_intel();
        *Bf16Isa::ALL
            .iter()
            .rev()
            .filter(|isa| !(intel && **isa == Bf16Isa::Avx512Bf16))
            .find(|isa| isa.available())
            .unwrap_or(&Bf16Isa::Scalar)
    }

    /// A short name (`"scalar"`, `"avx2"`, `"avx512f"`, `"avx512bf16"`).
    pub fn name(self) -> &'static str {
        match self {
            Bf16Isa::Scalar => "scalar",
            Bf16Isa::Avx2 => "avx2",
            Bf16Isa::Avx512 => "avx512f",
            Bf16Isa::Avx512Bf16 => "avx512bf16",
            Bf16Isa::Amx => "amx-bf16",
        }
    }

    /// Rows one call of the kernel computes.
    fn tile_rows(self) -> usize {
        match self {
            Bf16Isa::Scalar | Bf16Isa::Avx2 => 4,
            Bf16Isa::Avx512 | Bf16Isa::Avx512Bf16 => 8,
            Bf16Isa::Amx => AMX_ROWS,
        }
    }

    /// In-feature pairs a packed panel holds for `k` in-features: `k / 2` rounded up, and for
    /// AMX to whole tiles of 16 pairs (the padding is zero).
    fn pairs(self, k: usize) -> usize {
        match self {
            Bf16Isa::Amx => k.div_ceil(2 * AMX_PAIRS) * AMX_PAIRS,
            _ => k.div_ceil(2),
        }
    }

    /// Whether the kernel reads bf16 bits (else bf16-rounded f32 values).
    fn reads_bits(self) -> bool {
        matches!(self, Bf16Isa::Avx512Bf16 | Bf16Isa::Amx)
    }
}

/// Rows of the AMX kernel's tile (two tiles of 16 rows of activations).
const AMX_ROWS: usize = 32;
/// In-feature pairs per AMX tile of activations (16 rows of 64 bytes).
const AMX_PAIRS: usize = 16;

/// The bf16 bits of `v` rounded to nearest, ties to even (NaN stays a quiet NaN).
#[inline(always)]
fn bf16_bits(v: f32) -> u16 {
    let b = v.to_bits();
    let rounded = b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16;
    let nan = (b >> 16) | 0x40;
    (if v.is_nan() { nan } else { rounded }) as u16
}

/// The f32 value of bf16 bits.
#[inline(always)]
fn bf16_value(h: u16) -> f32 {
    f32::from_bits(u32::from(h) << 16)
}

/// `v` rounded to bf16 (to nearest, ties to even) as the kernels round their operands.
pub fn round_bf16(v: f32) -> f32 {
    bf16_value(bf16_bits(v))
}

/// An f32 weight `[n, k]` (n outputs of k in-features, PyTorch's `[out, in]`) rounded to bf16
/// and packed for [`linear_bf16`]: panels of 32 outputs (the last zero-padded), in-features in
/// interleaved pairs (k zero-padded to even).
#[derive(Debug, Clone)]
pub struct PackedBf16 {
    n: usize,
    k: usize,
    isa: Bf16Isa,
    /// bf16 bits, `[panel][pair][output in panel][2]`.
    data: AlignedVec<u16>,
}

impl PackedBf16 {
    /// Packs row-major `[n, k]` `w` for the widest kernel this CPU runs. `None` when the length
    /// does not match the shape.
    pub fn new(w: &[f32], n: usize, k: usize) -> Option<Self> {
        Self::with_isa(w, n, k, Bf16Isa::detect())
    }

    /// As [`PackedBf16::new`] for the kernel `isa` (`None` also when this CPU lacks it).
    pub fn with_isa(w: &[f32], n: usize, k: usize, isa: Bf16Isa) -> Option<Self> {
        if w.len() != n.checked_mul(k)? {
            return None;
        }
        Self::pack(n, k, isa, |j, i| w[j * k + i])
    }

    /// Packs row-major `[k, n]` `w` (in-features × outputs, the transpose of
    /// [`PackedBf16::new`]'s layout) for the widest kernel this CPU runs. `None` when the length
    /// does not match the shape.
    pub fn from_kn(w: &[f32], k: usize, n: usize) -> Option<Self> {
        Self::from_kn_with_isa(w, k, n, Bf16Isa::detect())
    }

    /// As [`PackedBf16::from_kn`] for the kernel `isa` (`None` also when this CPU lacks it).
    pub fn from_kn_with_isa(w: &[f32], k: usize, n: usize, isa: Bf16Isa) -> Option<Self> {
        if w.len() != n.checked_mul(k)? {
            return None;
        }
        Self::pack(n, k, isa, |j, i| w[i * n + j])
    }

    /// Packs the weight whose value for output `j` and in-feature `i` is `at(j, i)`.
    fn pack(n: usize, k: usize, isa: Bf16Isa, at: impl Fn(usize, usize) -> f32) -> Option<Self> {
        if !isa.available() {
            return None;
        }
        let panels = n.div_ceil(PANEL);
        let pairs = isa.pairs(k);
        let len = panels.checked_mul(pairs)?.checked_mul(2 * PANEL)?;
        let mut data = AlignedVec::<u16>::zeroed(len);
        for (p, panel) in data
            .chunks_exact_mut((pairs * 2 * PANEL).max(1))
            .enumerate()
        {
            let width = PANEL.min(n - p * PANEL);
            for (i, pair) in panel.chunks_exact_mut(2 * PANEL).enumerate() {
                for l in 0..2.min(k.saturating_sub(2 * i)) {
                    for c in 0..width {
                        pair[2 * c + l] = bf16_bits(at(p * PANEL + c, 2 * i + l));
                    }
                }
            }
        }
        Some(PackedBf16 { n, k, isa, data })
    }

    /// Outputs.
    pub fn n(&self) -> usize {
        self.n
    }

    /// In-features.
    pub fn k(&self) -> usize {
        self.k
    }

    /// The kernel it is packed for.
    pub fn isa(&self) -> Bf16Isa {
        self.isa
    }

    /// Bytes it holds (bf16 values with their padding).
    pub fn bytes(&self) -> usize {
        2 * self.data.len()
    }

    /// The weight `[n, k]` it holds: the packed values, each the bf16 rounding of the f32 it
    /// was packed from.
    pub fn unpack(&self) -> Vec<f32> {
        let (n, k) = (self.n, self.k);
        let pairs = self.isa.pairs(k);
        let mut w = vec![0f32; n * k];
        for j in 0..n {
            let (p, c) = (j / PANEL, j % PANEL);
            for i in 0..k {
                let at = ((p * pairs + i / 2) * PANEL + c) * 2 + i % 2;
                w[j * k + i] = bf16_value(self.data[at]);
            }
        }
        w
    }
}

/// Rounds each row of `x` (`[rows, k]`) to bf16 bits in `out` (`[rows, kp]`, the padding 0)
/// for the AVX-512 BF16 kernel, with its conversion instruction (denormal inputs become 0).
fn round_rows_bits(x: &[f32], k: usize, kp: usize, out: &mut [u16]) {
    assert!(kp >= k && x.len() / k.max(1) <= out.len() / kp.max(1));
    // SAFETY: bits are only made for a weight packed for AVX-512 BF16, so the CPU has it; the
    // lengths are checked above.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        x86::round_rows_bf16(x, k, kp, out)
    }
    #[cfg(not(target_arch = "x86_64"))]
    for (row, o) in x.chunks_exact(k).zip(out.chunks_exact_mut(kp)) {
        for (d, v) in o.iter_mut().zip(row) {
            *d = bf16_bits(*v);
        }
        o[k..].fill(0);
    }
}

multiversion! {
    /// Rounds each row of `x` (`[rows, k]`) to bf16 values kept as f32 in `out` (`[rows, kp]`,
    /// the padding 0).
    fn round_rows_f32(x: &[f32], k: usize, kp: usize, out: &mut [f32]) {
        for (row, o) in x.chunks_exact(k).zip(out.chunks_exact_mut(kp)) {
            for (d, v) in o.iter_mut().zip(row) {
                *d = bf16_value(bf16_bits(*v));
            }
            o[k..].fill(0.0);
        }
    }
}

/// The rounded activations, in the form the kernel reads.
enum Activations {
    /// bf16 bits (AVX-512 BF16, AMX), `[rows, kp]` (for AMX the rows rounded up to whole tiles,
    /// the extra rows zero).
    Bits(AlignedVec<u16>),
    /// bf16 values as f32 (the others), `[rows, kp]`.
    Floats(Vec<f32>),
}

impl Activations {
    /// The rows of `x` (`[rows, k]`, `k > 0`) rounded for the kernel `isa`, `[rows, kp]`; on
    /// every rayon thread when `parallel` and they are many.
    fn round(isa: Bf16Isa, x: &[f32], k: usize, kp: usize, parallel: bool) -> Self {
        let rows = x.len() / k;
        let rows_per_task = (crate::PARALLEL_THRESHOLD / k).max(1);
        if isa.reads_bits() {
            let padded = if isa == Bf16Isa::Amx {
                rows.next_multiple_of(AMX_ROWS)
            } else {
                rows
            };
            let mut b = AlignedVec::<u16>::zeroed(padded * kp);
            if !parallel || rows <= rows_per_task {
                round_rows_bits(x, k, kp, &mut b);
            } else {
                x.par_chunks(rows_per_task * k)
                    .zip(b.par_chunks_mut(rows_per_task * kp))
                    .for_each(|(x, b)| round_rows_bits(x, k, kp, b));
            }
            Activations::Bits(b)
        } else {
            let mut f = vec![0f32; rows * kp];
            if !parallel || rows <= rows_per_task {
                round_rows_f32(x, k, kp, &mut f);
            } else {
                x.par_chunks(rows_per_task * k)
                    .zip(f.par_chunks_mut(rows_per_task * kp))
                    .for_each(|(x, f)| round_rows_f32(x, k, kp, f));
            }
            Activations::Floats(f)
        }
    }
}

/// One kernel call's operands: `rows` rows of rounded activations (stride `kp`, even) and one
/// packed panel (`kp / 2` pairs × 32 outputs × 2); the kernel writes the first `width` of the
/// 32 sums of each row `r` to `out + r · ldc`.
struct Tile<'a> {
    /// `rows × kp` bf16 bits (AVX-512 BF16; AMX: 32 rows, those past `rows` zero), empty
    /// otherwise.
    bits: &'a [u16],
    /// `rows × kp` bf16 values as f32 (the other kernels), empty otherwise.
    floats: &'a [f32],
    kp: usize,
    rows: usize,
    panel: &'a [u16],
    out: *mut f32,
    ldc: usize,
    width: usize,
    /// The epilogue the AVX-512 kernels apply in registers as they store; `None` leaves it to
    /// [`finish_tile`].
    fused: Option<TileEpilogue>,
}

impl Tile<'_> {
    /// Writes the first `width` values of `sums` (32 per row) to the tile's output rows.
    ///
    /// # Safety
    /// `out + r · ldc .. + width` is writable for every row `r < rows`, and no other thread
    /// accesses it.
    unsafe fn store(&self, sums: &[f32]) {
        for (r, row) in sums.chunks_exact(PANEL).take(self.rows).enumerate() {
            std::ptr::copy_nonoverlapping(row.as_ptr(), self.out.add(r * self.ldc), self.width);
        }
    }
}

/// The scalar kernel.
///
/// # Safety
/// As [`Tile::store`].
unsafe fn tile_scalar(t: &Tile<'_>) {
    let mut sums = [0f32; MAX_TILE_ROWS * PANEL];
    for (r, acc) in sums.chunks_exact_mut(PANEL).take(t.rows).enumerate() {
        let xr = &t.floats[r * t.kp..(r + 1) * t.kp];
        for (xp, wp) in xr.chunks_exact(2).zip(t.panel.chunks_exact(2 * PANEL)) {
            for (c, a) in acc.iter_mut().enumerate() {
                *a += xp[0] * bf16_value(wp[2 * c]);
                *a += xp[1] * bf16_value(wp[2 * c + 1]);
            }
        }
    }
    t.store(&sums);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Tile, MAX_TILE_ROWS, PANEL};

    /// The masks of the first `width` lanes of two 16-lane registers.
    #[inline(always)]
    fn masks(width: usize) -> (__mmask16, __mmask16) {
        let m = if width >= 32 {
            u32::MAX
        } else {
            (1u32 << width) - 1
        };
        (m as u16, (m >> 16) as u16)
    }

    /// Rounds each row of `x` (`[rows, k]`) to bf16 bits in `out` (`[rows, kp]`, the padding
    /// 0) with `vcvtne2ps2bf16` (ties to even; denormal inputs become 0).
    ///
    /// # Safety
    /// The CPU supports AVX-512F and AVX-512 BF16; `kp ≥ k`, `out` holds as many rows as `x`.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn round_rows_bf16(x: &[f32], k: usize, kp: usize, out: &mut [u16]) {
        for (row, o) in x.chunks_exact(k).zip(out.chunks_exact_mut(kp)) {
            let (src, dst) = (row.as_ptr(), o.as_mut_ptr());
            let mut i = 0;
            while i + 32 <= k {
                let lo = _mm512_loadu_ps(src.add(i));
                let hi = _mm512_loadu_ps(src.add(i + 16));
                let v: __m512i = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                _mm512_storeu_si512(dst.add(i) as *mut __m512i, v);
                i += 32;
            }
            if i < kp {
                // The last values and the padding, through zero-masked loads.
                let (m0, m1) = masks(k - i);
                let lo = _mm512_maskz_loadu_ps(m0, src.add(i));
                let hi = _mm512_maskz_loadu_ps(m1, src.add(i + 16));
                let v: [u16; 32] = std::mem::transmute(_mm512_cvtne2ps_pbh(hi, lo));
                o[i..].copy_from_slice(&v[..kp - i]);
            }
        }
    }

    /// Stores the first `width` of the 32 sums in `acc` of each row to `t.out + r · t.ldc`.
    #[inline(always)]
    unsafe fn store_rows<const MR: usize>(t: &Tile<'_>, acc: &[[__m512; 2]; MR]) {
        let (m0, m1) = masks(t.width);
        let mut acc = *acc;
        if let Some(e) = t.fused {
            crate::qlinear::x86::finish_in_registers(&mut acc, e, t.ldc, (m0, m1));
        }
        for (r, a) in acc.iter().enumerate() {
            let o = t.out.add(r * t.ldc);
            _mm512_mask_storeu_ps(o, m0, a[0]);
            _mm512_mask_storeu_ps(o.add(16), m1, a[1]);
        }
    }
    use std::arch::x86_64::*;

    /// `MR` rows of the AVX-512 BF16 kernel: per pair of in-features, the panel's two registers
    /// of 16 output pairs times each row's pair broadcast, summed by `vdpbf16ps`.
    #[inline(always)]
    unsafe fn tile_bf16_rows<const MR: usize>(t: &Tile<'_>) {
        let pairs = t.kp / 2;
        let x = t.bits.as_ptr();
        let w = t.panel.as_ptr();
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for i in 0..pairs {
            let wp = w.add(i * 2 * PANEL);
            let w0: __m512bh = std::mem::transmute(_mm512_loadu_si512(wp as *const __m512i));
            let w1: __m512bh =
                std::mem::transmute(_mm512_loadu_si512(wp.add(PANEL) as *const __m512i));
            for (r, a) in acc.iter_mut().enumerate() {
                let xv = (x.add(r * t.kp + 2 * i) as *const i32).read_unaligned();
                let xb: __m512bh = std::mem::transmute(_mm512_set1_epi32(xv));
                a[0] = _mm512_dpbf16_ps(a[0], xb, w0);
                a[1] = _mm512_dpbf16_ps(a[1], xb, w1);
            }
        }
        store_rows(t, &acc);
    }

    /// Every tile register 16 rows of 64 bytes: sums `tmm0..tmm3` (rows 0..16 and 16..32 ×
    /// outputs 0..16 and 16..32), activations `tmm4`, `tmm5`, weights `tmm6`, `tmm7`.
    pub(super) const AMX_CONFIG: crate::amx::TileConfig = crate::amx::TileConfig::new()
        .tile(0, 16, 64)
        .tile(1, 16, 64)
        .tile(2, 16, 64)
        .tile(3, 16, 64)
        .tile(4, 16, 64)
        .tile(5, 16, 64)
        .tile(6, 16, 64)
        .tile(7, 16, 64);

    /// The AMX-BF16 kernel on 16 (`TWO == false`) or 32 rows: per 32 in-features, one or two
    /// tiles of activations times the panel's two tiles of weights (16 pairs × 16 outputs,
    /// read with the stride of a panel row), into two or four tiles of sums; then the sums go
    /// through memory to registers for the epilogue and the masked stores.
    #[inline(always)]
    unsafe fn tile_amx_rows<const TWO: bool>(t: &Tile<'_>) {
        use crate::amx::tile;
        const ROW: usize = 2 * PANEL * 2; // bytes per packed pair of 32 outputs
        let a = t.bits.as_ptr() as *const u8;
        let lda = t.kp * 2;
        let w = t.panel.as_ptr() as *const u8;
        tile::zero::<0>();
        tile::zero::<1>();
        if TWO {
            tile::zero::<2>();
            tile::zero::<3>();
        }
        for s in 0..t.kp / (2 * super::AMX_PAIRS) {
            // Each load comes right before its first use and as late after the previous step's
            // last reader of its register as it can: tiles are not renamed, so a load waits
            // for the instructions still reading its register (loading both weight tiles first
            // made every step wait for the whole previous one; 53 % of the bf16 forward sat
            // in this loop on the Xeon).
            let wp = w.add(s * super::AMX_PAIRS * ROW);
            tile::load::<4>(a.add(s * 64), lda);
            tile::load::<6>(wp, ROW);
            tile::dpbf16ps::<0, 4, 6>();
            tile::load::<7>(wp.add(64), ROW);
            tile::dpbf16ps::<1, 4, 7>();
            if TWO {
                tile::load::<5>(a.add(16 * lda + s * 64), lda);
                tile::dpbf16ps::<2, 5, 6>();
                tile::dpbf16ps::<3, 5, 7>();
            }
        }
        #[repr(align(64))]
        struct Sums([f32; super::AMX_ROWS * PANEL]);
        let mut sums = Sums([0.0; super::AMX_ROWS * PANEL]);
        let c = sums.0.as_mut_ptr();
        let ldc = PANEL * 4;
        tile::store::<0>(c as *mut u8, ldc);
        tile::store::<1>(c.add(16) as *mut u8, ldc);
        if TWO {
            tile::store::<2>(c.add(16 * PANEL) as *mut u8, ldc);
            tile::store::<3>(c.add(16 * PANEL + 16) as *mut u8, ldc);
        }
        let masks = masks(t.width);
        crate::qlinear::x86::finish_and_store_rows(c, t.rows, t.fused, t.out, t.ldc, masks);
    }

    /// The AMX-BF16 kernel over one tile (up to 32 rows).
    ///
    /// # Safety
    /// [`crate::amx_support`] is ready for bf16 and this thread's tiles are configured as
    /// [`AMX_CONFIG`]; `t.bits` holds 32 rows of `t.kp` values (a multiple of 32), `t.panel`
    /// `t.kp × 32`; `t.width ≤ 32` and the output as [`Tile::store`] requires.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub(super) unsafe fn tile_amx(t: &Tile<'_>) {
        if t.rows > 16 {
            tile_amx_rows::<true>(t)
        } else {
            tile_amx_rows::<false>(t)
        }
    }

    /// The AVX-512 BF16 kernel over one tile (up to 8 rows).
    ///
    /// # Safety
    /// The CPU supports AVX-512F and AVX-512 BF16; `t.bits` holds `t.rows × t.kp` values,
    /// `t.panel` `t.kp × 32`; `t.width ≤ 32` and the output as [`Tile::store`] requires.
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn tile_bf16(t: &Tile<'_>) {
        match t.rows {
            8 => tile_bf16_rows::<8>(t),
            7 => tile_bf16_rows::<7>(t),
            6 => tile_bf16_rows::<6>(t),
            5 => tile_bf16_rows::<5>(t),
            4 => tile_bf16_rows::<4>(t),
            3 => tile_bf16_rows::<3>(t),
            2 => tile_bf16_rows::<2>(t),
            _ => tile_bf16_rows::<1>(t),
        }
    }

    /// `MR` rows of the AVX-512F kernel: per pair, the panel's bf16 pairs widened to two f32
    /// registers each (even in-feature: shifted up; odd: low half masked off), times each row's
    /// two values broadcast.
    #[inline(always)]
    unsafe fn tile_avx512_rows<const MR: usize>(t: &Tile<'_>) {
        let pairs = t.kp / 2;
        let x = t.floats.as_ptr();
        let w = t.panel.as_ptr();
        let high = _mm512_set1_epi32(-65536);
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for i in 0..pairs {
            let wp = w.add(i * 2 * PANEL);
            let v0 = _mm512_loadu_si512(wp as *const __m512i);
            let v1 = _mm512_loadu_si512(wp.add(PANEL) as *const __m512i);
            let e0 = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v0));
            let e1 = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v1));
            let o0 = _mm512_castsi512_ps(_mm512_and_si512(v0, high));
            let o1 = _mm512_castsi512_ps(_mm512_and_si512(v1, high));
            for (r, a) in acc.iter_mut().enumerate() {
                let xe = _mm512_set1_ps(*x.add(r * t.kp + 2 * i));
                let xo = _mm512_set1_ps(*x.add(r * t.kp + 2 * i + 1));
                a[0] = _mm512_fmadd_ps(xe, e0, a[0]);
                a[1] = _mm512_fmadd_ps(xe, e1, a[1]);
                a[0] = _mm512_fmadd_ps(xo, o0, a[0]);
                a[1] = _mm512_fmadd_ps(xo, o1, a[1]);
            }
        }
        store_rows(t, &acc);
    }

    /// The AVX-512F kernel over one tile (up to 8 rows).
    ///
    /// # Safety
    /// The CPU supports AVX-512F; `t.floats` holds `t.rows × t.kp` values, `t.panel`
    /// `t.kp × 32`; `t.width ≤ 32` and the output as [`Tile::store`] requires.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn tile_avx512(t: &Tile<'_>) {
        match t.rows {
            8 => tile_avx512_rows::<8>(t),
            7 => tile_avx512_rows::<7>(t),
            6 => tile_avx512_rows::<6>(t),
            5 => tile_avx512_rows::<5>(t),
            4 => tile_avx512_rows::<4>(t),
            3 => tile_avx512_rows::<3>(t),
            2 => tile_avx512_rows::<2>(t),
            _ => tile_avx512_rows::<1>(t),
        }
    }

    /// `MR` rows of the AVX2 kernel, one half of the panel (16 outputs) at a time.
    #[inline(always)]
    unsafe fn tile_avx2_rows<const MR: usize>(t: &Tile<'_>) {
        let mut sums = [0f32; MAX_TILE_ROWS * PANEL];
        let pairs = t.kp / 2;
        let x = t.floats.as_ptr();
        let w = t.panel.as_ptr();
        let high = _mm256_set1_epi32(-65536);
        for half in 0..2 {
            let mut acc = [[_mm256_setzero_ps(); 2]; MR];
            for i in 0..pairs {
                let wp = w.add(i * 2 * PANEL + half * PANEL);
                let v0 = _mm256_loadu_si256(wp as *const __m256i);
                let v1 = _mm256_loadu_si256(wp.add(16) as *const __m256i);
                let e0 = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v0));
                let e1 = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v1));
                let o0 = _mm256_castsi256_ps(_mm256_and_si256(v0, high));
                let o1 = _mm256_castsi256_ps(_mm256_and_si256(v1, high));
                for (r, a) in acc.iter_mut().enumerate() {
                    let xe = _mm256_set1_ps(*x.add(r * t.kp + 2 * i));
                    let xo = _mm256_set1_ps(*x.add(r * t.kp + 2 * i + 1));
                    a[0] = _mm256_fmadd_ps(xe, e0, a[0]);
                    a[1] = _mm256_fmadd_ps(xe, e1, a[1]);
                    a[0] = _mm256_fmadd_ps(xo, o0, a[0]);
                    a[1] = _mm256_fmadd_ps(xo, o1, a[1]);
                }
            }
            for (r, a) in acc.iter().enumerate() {
                let o = sums.as_mut_ptr().add(r * PANEL + half * 16);
                _mm256_storeu_ps(o, a[0]);
                _mm256_storeu_ps(o.add(8), a[1]);
            }
        }
        t.store(&sums);
    }

    /// The AVX2 kernel over one tile (up to 4 rows).
    ///
    /// # Safety
    /// The CPU supports AVX2 and FMA; otherwise as [`tile_avx512`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn tile_avx2(t: &Tile<'_>) {
        match t.rows {
            4 => tile_avx2_rows::<4>(t),
            3 => tile_avx2_rows::<3>(t),
            2 => tile_avx2_rows::<2>(t),
            _ => tile_avx2_rows::<1>(t),
        }
    }
}

/// Runs the packed weight's kernel over one tile.
///
/// # Safety
/// As [`Tile::store`].
unsafe fn run_tile(isa: Bf16Isa, t: &Tile<'_>) {
    let rows_read = if isa == Bf16Isa::Amx {
        AMX_ROWS
    } else {
        t.rows
    };
    assert!(
        t.rows <= isa.tile_rows()
            && t.width <= PANEL
            && t.panel.len() >= t.kp * PANEL
            && t.bits.len().max(t.floats.len()) >= rows_read * t.kp
            && (isa != Bf16Isa::Amx || t.kp.is_multiple_of(2 * AMX_PAIRS))
    );
    match isa {
        Bf16Isa::Scalar => tile_scalar(t),
        // SAFETY: a PackedBf16 is only built for a kernel the CPU supports
        // (`Bf16Isa::available`); the slices hold what the kernels read (asserted above); the
        // output is the caller's to give.
        #[cfg(target_arch = "x86_64")]
        Bf16Isa::Avx2 => x86::tile_avx2(t),
        #[cfg(target_arch = "x86_64")]
        Bf16Isa::Avx512 => x86::tile_avx512(t),
        #[cfg(target_arch = "x86_64")]
        Bf16Isa::Avx512Bf16 => x86::tile_bf16(t),
        // SAFETY: as above, and `linear_bf16` configures the tiles for `x86::AMX_CONFIG` on
        // each task that runs AMX tiles.
        #[cfg(target_arch = "x86_64")]
        Bf16Isa::Amx => x86::tile_amx(t),
        #[cfg(not(target_arch = "x86_64"))]
        _ => tile_scalar(t),
    }
}

/// `activation(x · Wᵀ + bias + residual)` (see [`Epilogue`]) for `x` `[rows, k]` and a packed
/// bf16 weight `[n, k]`; returns `[rows, n]`. `x` is rounded to bf16 and the products summed in
/// f32 (see the module documentation); the product runs on every rayon thread when it is
/// large. `None` when `k` is not the weight's or a slice's length does not match the shapes.
pub fn linear_bf16(
    x: &[f32],
    rows: usize,
    k: usize,
    w: &PackedBf16,
    epilogue: Epilogue<'_>,
) -> Option<Vec<f32>> {
    let n = w.n;
    let Epilogue {
        bias,
        residual,
        activation,
    } = epilogue;
    let size = rows.checked_mul(n)?;
    if k != w.k
        || x.len() != rows.checked_mul(k)?
        || bias.is_some_and(|b| b.len() != n)
        || residual.is_some_and(|r| r.len() != size)
    {
        return None;
    }
    let fused = bias.is_some() || residual.is_some() || activation != Default::default();
    if size == 0 || k == 0 {
        let mut out = vec![0f32; size];
        if fused && size > 0 {
            finish_rows(&mut out, n, bias, residual, activation);
        }
        return Some(out);
    }
    let isa = w.isa;
    // The AVX-512 kernels apply the epilogue in registers as they store a tile; the others leave
    // it to `finish_tile` (one pass over the tile while it is in cache).
    let in_kernel = fused && matches!(isa, Bf16Isa::Avx512 | Bf16Isa::Avx512Bf16 | Bf16Isa::Amx);
    let kp = isa.pairs(k) * 2;
    let panels = n.div_ceil(PANEL);
    let mr = isa.tile_rows();

    // Tiles of `row_block` rows × `panel_block` panels; enough of them to keep every thread busy.
    let threads = rayon::current_num_threads().max(1);
    let tasks_wanted = if size.saturating_mul(k) >= crate::PARALLEL_THRESHOLD * 16 {
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
    // Each task rounds its own rows when no other task reads them (no second pass over the
    // activations, and they are still in cache when the kernel reads them); otherwise they are
    // rounded once for all tasks first.
    let shared = (panel_tasks > 1).then(|| Activations::round(isa, x, k, kp, tasks > 1));

    let panel_len = kp * PANEL;
    // Every value is written once by the tasks below before the length is set.
    let mut out: Vec<f32> = Vec::with_capacity(size);
    let out_ptr = OutPtr(out.as_mut_ptr());
    let task = |t: usize| {
        let (rt, pt) = (t / panel_tasks, t % panel_tasks);
        let (r0, r1) = (rt * row_block, ((rt + 1) * row_block).min(rows));
        let (p0, p1) = (pt * panel_block, ((pt + 1) * panel_block).min(panels));
        let local;
        let (xr, first) = match &shared {
            Some(xr) => (xr, 0),
            None => {
                local = Activations::round(isa, &x[r0 * k..r1 * k], k, kp, false);
                (&local, r0)
            }
        };
        // SAFETY: an AMX weight is only packed where `amx_support` is ready; nothing else runs
        // on this thread until the task ends (no rayon call below).
        #[cfg(target_arch = "x86_64")]
        let _tiles = (isa == Bf16Isa::Amx)
            .then(|| unsafe { crate::amx::TileScope::enter(&x86::AMX_CONFIG) });
        for p in p0..p1 {
            let panel = &w.data[p * panel_len..(p + 1) * panel_len];
            let c0 = p * PANEL;
            let width = PANEL.min(n - c0);
            let mut r = r0;
            while r < r1 {
                let tile_rows = mr.min(r1 - r);
                // The AMX kernel reads whole tiles (the rows are padded to them).
                let read = if isa == Bf16Isa::Amx { mr } else { tile_rows };
                let rows = (r - first) * kp..(r - first + read) * kp;
                let (bits, floats) = match xr {
                    Activations::Bits(b) => (&b[rows], &[][..]),
                    Activations::Floats(f) => (&[][..], &f[rows]),
                };
                let tile = Tile {
                    bits,
                    floats,
                    kp,
                    rows: tile_rows,
                    panel,
                    // SAFETY: row r, column c0 lies within the output.
                    out: unsafe { out_ptr.at(r * n + c0) },
                    ldc: n,
                    width,
                    fused: in_kernel.then(|| TileEpilogue {
                        // SAFETY: column c0 and row r, column c0 lie within the bias and the
                        // residual (their lengths were checked above).
                        bias: bias.map(|b| unsafe { b.as_ptr().add(c0) }),
                        residual: residual.map(|res| unsafe { res.as_ptr().add(r * n + c0) }),
                        activation,
                    }),
                };
                // SAFETY: rows r .. r + tile_rows ≤ rows, columns c0 .. c0 + width ≤ n lie in
                // this task's rectangle, which no other task accesses.
                unsafe { run_tile(isa, &tile) };
                if fused && !in_kernel {
                    // SAFETY: as above; the kernel has just written these values.
                    unsafe { finish_tile(out_ptr, r..r + tile_rows, n, c0, width, &epilogue) };
                }
                r += tile_rows;
            }
        }
    };
    if tasks == 1 {
        task(0);
    } else {
        (0..tasks).into_par_iter().for_each(task);
    }
    // SAFETY: the tasks cover every row and every panel, so every value has been written.
    unsafe { out.set_len(size) };
    Some(out)
}

/// Whether the CPU's vendor string is `GenuineIntel`.
fn cpu_vendor_is_intel() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // `cpuid` leaf 0 (the vendor string) exists on every x86-64 CPU.
        let r = std::arch::x86_64::__cpuid(0);
        let mut vendor = [0u8; 12];
        vendor[..4].copy_from_slice(&r.ebx.to_le_bytes());
        vendor[4..8].copy_from_slice(&r.edx.to_le_bytes());
        vendor[8..].copy_from_slice(&r.ecx.to_le_bytes());
        &vendor == b"GenuineIntel"
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::EpilogueActivation;
    use rand::{Rng, SeedableRng};

    const ACTIVATIONS: [EpilogueActivation; 6] = [
        EpilogueActivation::Identity,
        EpilogueActivation::GeluErf,
        EpilogueActivation::GeluTanh,
        EpilogueActivation::Silu,
        EpilogueActivation::QuickGelu,
        EpilogueActivation::Relu,
    ];

    /// `γ_m = m·u / (1 − m·u)`: the relative bound on a sum of `m` terms rounded `m` times
    /// with unit roundoff `u` (Higham, Accuracy and Stability, §3.1), relative to `Σ |term|`.
    fn gamma(m: usize, u: f64) -> f64 {
        let mu = m as f64 * u;
        mu / (1.0 - mu)
    }

    /// erf in f64: its Maclaurin series for |x| ≤ 4 (terms below 1e5, so cancellation costs
    /// < 1e-10), the asymptotic series of erfc beyond (truncation < 1e-12).
    fn erf(x: f64) -> f64 {
        let a = x.abs();
        let v = if a <= 4.0 {
            let (mut term, mut sum) = (a, a);
            for n in 1..200 {
                term *= -a * a / n as f64;
                let t = term / (2 * n + 1) as f64;
                sum += t;
                if t.abs() < 1e-17 * sum.abs() {
                    break;
                }
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            let z = 1.0 / (2.0 * a * a);
            let series = 1.0 - z + 3.0 * z * z - 15.0 * z * z * z + 105.0 * z.powi(4);
            1.0 - (-a * a).exp() / (a * std::f64::consts::PI.sqrt()) * series
        };
        v.copysign(x)
    }

    fn activate(a: EpilogueActivation, z: f64) -> f64 {
        match a {
            EpilogueActivation::Identity => z,
            EpilogueActivation::GeluErf => 0.5 * z * (1.0 + erf(z / 2f64.sqrt())),
            EpilogueActivation::GeluTanh => {
                let c = (2.0 / std::f64::consts::PI).sqrt();
                0.5 * z * (1.0 + (c * (z + 0.044715 * z * z * z)).tanh())
            }
            EpilogueActivation::Silu => z / (1.0 + (-z).exp()),
            EpilogueActivation::QuickGelu => z / (1.0 + (-1.702 * z).exp()),
            EpilogueActivation::Relu => z.max(0.0),
        }
    }

    #[test]
    fn every_kernel_matches_an_f64_reference() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        // rows 1..=13 (every partial tile of 4 and 8 rows), odd k, n not a multiple of 16 or
        // 32; the last three are large enough to run on several threads (tasks of whole rows,
        // which round their own activations, and of rows × panels, which share them).
        let shapes = [
            (1, 1, 1),
            (2, 3, 5),
            (3, 7, 17),
            (4, 16, 32),
            (5, 33, 31),
            (6, 64, 33),
            (7, 95, 48),
            (8, 128, 64),
            (9, 129, 70),
            (10, 200, 16),
            (11, 255, 100),
            (12, 384, 40),
            (13, 77, 130),
            // AMX tiles of 16 and 32 rows with a short second tile.
            (20, 96, 40),
            (45, 700, 33),
            (70, 385, 97),
            (200, 384, 70),
            (600, 101, 20),
        ];
        let isas: Vec<Bf16Isa> = Bf16Isa::ALL.into_iter().filter(|i| i.available()).collect();
        eprintln!("bf16 kernels tested: {isas:?}");
        let u32_ = f64::from(f32::EPSILON) / 2.0;
        let u64_ = f64::EPSILON / 2.0;
        for &(rows, k, n) in &shapes {
            let scale = 2.0 / (k as f32).sqrt();
            let mut x: Vec<f32> = (0..rows * k)
                .map(|_| rng.random_range(-2.0f32..2.0))
                .collect();
            if rows > 2 {
                x[k..2 * k].fill(0.0);
            }
            let w: Vec<f32> = (0..n * k)
                .map(|_| rng.random_range(-scale..scale))
                .collect();
            let bias: Vec<f32> = (0..n).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            let res: Vec<f32> = (0..rows * n)
                .map(|_| rng.random_range(-1.0f32..1.0))
                .collect();
            // The product of the bf16-rounded operands and Σ |x_i · w_i|, in f64.
            let mut exact = vec![0f64; rows * n];
            let mut mag = vec![0f64; rows * n];
            for r in 0..rows {
                for j in 0..n {
                    for i in 0..k {
                        let p = f64::from(round_bf16(x[r * k + i]))
                            * f64::from(round_bf16(w[j * k + i]));
                        exact[r * n + j] += p;
                        mag[r * n + j] += p.abs();
                    }
                }
            }
            let rounded: Vec<f32> = w.iter().map(|&v| round_bf16(v)).collect();
            for &isa in &isas {
                let packed = PackedBf16::with_isa(&w, n, k, isa).unwrap();
                assert_eq!(packed.unpack(), rounded, "{isa:?} {n}x{k}");
                let plain = linear_bf16(&x, rows, k, &packed, Epilogue::default()).unwrap();
                for i in 0..rows * n {
                    // f32 sums of k exact products, against an f64 sum of the same.
                    let bound = (gamma(k, u32_) + gamma(k, u64_)) * mag[i];
                    let err = (f64::from(plain[i]) - exact[i]).abs();
                    assert!(
                        err <= bound,
                        "{isa:?} {rows}x{k}x{n} at {i}: {} vs {} (bound {bound:e})",
                        plain[i],
                        exact[i]
                    );
                }
                for activation in ACTIVATIONS {
                    for (use_bias, use_res) in
                        [(false, false), (true, false), (false, true), (true, true)]
                    {
                        let epi = Epilogue {
                            bias: use_bias.then_some(&bias[..]),
                            residual: use_res.then_some(&res[..]),
                            activation,
                        };
                        let got = linear_bf16(&x, rows, k, &packed, epi).unwrap();
                        // Fused, the epilogue is exactly `finish_rows` over the product.
                        let mut unfused = plain.clone();
                        finish_rows(&mut unfused, n, epi.bias, epi.residual, activation);
                        assert_eq!(got, unfused, "{isa:?} {rows}x{k}x{n} {epi:?}");
                        for r in 0..rows {
                            for (j, &bj) in bias.iter().enumerate() {
                                let i = r * n + j;
                                let b = if use_bias { f64::from(bj) } else { 0.0 };
                                let s = if use_res { f64::from(res[i]) } else { 0.0 };
                                let z = exact[i] + b + s;
                                let want = activate(activation, z);
                                // The pre-activation: k + 2 f32 roundings over its terms; the
                                // activation: |f'| ≤ 1.13 for all of them (GELU's maximum
                                // slope, 1.129), plus its own accuracy (math.rs's tests).
                                let pre = (gamma(k + 2, u32_) + gamma(k + 2, u64_))
                                    * (mag[i] + b.abs() + s.abs());
                                let bound =
                                    1.13 * pre + 0.75e-7 * z.abs() + 5e-7 * (1.0 + want.abs());
                                let err = (f64::from(got[i]) - want).abs();
                                assert!(
                                    err <= bound,
                                    "{isa:?} {rows}x{k}x{n} {activation:?} {use_bias}/{use_res} [{r},{j}]: {} vs {want}",
                                    got[i]
                                );
                            }
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn both_weight_layouts_pack_alike() {
        let (n, k) = (45, 13);
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut t = vec![0f32; n * k];
        for j in 0..n {
            for i in 0..k {
                t[i * n + j] = w[j * k + i];
            }
        }
        for isa in Bf16Isa::ALL.into_iter().filter(|i| i.available()) {
            let a = PackedBf16::with_isa(&w, n, k, isa).unwrap();
            let b = PackedBf16::from_kn_with_isa(&t, k, n, isa).unwrap();
            assert_eq!(a.data, b.data);
            assert_eq!((b.n(), b.k(), b.isa()), (n, k, isa));
            // Two panels of 32 outputs, 7 pairs each (AMX: one tile of 16).
            let pairs = if isa == Bf16Isa::Amx { 16 } else { 7 };
            assert_eq!(b.bytes(), 2 * 2 * pairs * 32 * 2);
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        let r = |bits: u32| round_bf16(f32::from_bits(bits)).to_bits();
        assert_eq!(r(0x3f80_8000), 0x3f80_0000); // tie, even below
        assert_eq!(r(0x3f81_8000), 0x3f82_0000); // tie, even above
        assert_eq!(r(0x3f80_8001), 0x3f81_0000);
        assert_eq!(r(0x3f80_7fff), 0x3f80_0000);
        assert_eq!(r(0xbf81_8000), 0xbf82_0000);
        assert_eq!(round_bf16(f32::MAX), f32::INFINITY);
        assert_eq!(round_bf16(f32::NEG_INFINITY), f32::NEG_INFINITY);
        assert!(round_bf16(f32::NAN).is_nan());
        // A NaN whose payload lies in the low half stays NaN rather than becoming infinity.
        assert!(round_bf16(f32::from_bits(0x7f80_0001)).is_nan());
        assert_eq!(round_bf16(-0.0).to_bits(), 0x8000_0000);
    }

    #[test]
    fn activations_round_as_round_bf16_outside_denormals() {
        if !Bf16Isa::Avx512Bf16.available() {
            return;
        }
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut x: Vec<f32> = (0..3 * 71)
            .map(|_| f32::from_bits(rng.random::<u32>() | 0x0080_0000))
            .collect();
        let specials = [
            f32::from_bits(0x3f80_8000),
            f32::from_bits(0x3f81_8000),
            f32::MAX,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x7fa0_0000),
            0.0,
            -0.0,
            f32::MIN_POSITIVE,
        ];
        x[..specials.len()].copy_from_slice(&specials);
        for k in [71, 32, 3] {
            let rows = x.len() / k;
            let kp = k.div_ceil(2) * 2;
            let mut out = vec![1u16; rows * kp];
            round_rows_bits(&x[..rows * k], k, kp, &mut out);
            for r in 0..rows {
                for i in 0..kp {
                    let want = if i < k { bf16_bits(x[r * k + i]) } else { 0 };
                    assert_eq!(out[r * kp + i], want, "{:e}", x[r * k + i.min(k - 1)]);
                }
            }
        }
    }

    #[test]
    fn bad_shapes_are_refused() {
        assert!(PackedBf16::new(&[0.0; 8], 2, 4).is_some());
        assert!(PackedBf16::new(&[0.0; 7], 2, 4).is_none());
        assert!(PackedBf16::from_kn(&[0.0; 9], 4, 2).is_none());
        assert!(PackedBf16::new(&[], usize::MAX, 2).is_none());
        let w = PackedBf16::new(&[1.0; 8], 2, 4).unwrap();
        let x = [1.0f32; 12];
        assert_eq!(
            linear_bf16(&x, 3, 4, &w, Epilogue::default()),
            Some(vec![4.0; 6])
        );
        assert!(linear_bf16(&x[..11], 3, 4, &w, Epilogue::default()).is_none());
        assert!(linear_bf16(&x, 4, 3, &w, Epilogue::default()).is_none());
        assert!(linear_bf16(&x, usize::MAX, 4, &w, Epilogue::default()).is_none());
        let short = Epilogue {
            bias: Some(&[1.0]),
            ..Epilogue::default()
        };
        assert!(linear_bf16(&x, 3, 4, &w, short).is_none());
        let short = Epilogue {
            residual: Some(&[1.0; 5]),
            ..Epilogue::default()
        };
        assert!(linear_bf16(&x, 3, 4, &w, short).is_none());
        assert_eq!(
            linear_bf16(&[], 0, 4, &w, Epilogue::default()),
            Some(vec![])
        );

        let w = PackedBf16::new(&[], 3, 0).unwrap();
        let bias = [1.0, 2.0, 3.0];
        let epi = Epilogue {
            bias: Some(&bias),
            ..Epilogue::default()
        };
        assert_eq!(
            linear_bf16(&[], 2, 0, &w, epi),
            Some(vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0])
        );
    }
}
