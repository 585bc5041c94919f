//! AVX2 and AVX-512 VNNI dot products of weight rows with one quantized activation row (the
//! sums of [`super::dot`], 32 values per 256-bit register).
//!
//! Weight codes are unsigned (offsets and minimums are applied through the activation sums), so
//! each product is one u8 × s8 multiply: `vpdpbusd` (VNNI) or `vpmaddubsw` + `vpmaddwd` (AVX2,
//! whose 16-bit pair sums cannot saturate: at most 2·63·127 = 16 002, 2·128·127 = 32 512 for
//! Q8_0's magnitudes). Sub-block scales of the k-quants multiply the 16-bit pair sums inside the
//! same integer accumulator (`vpmaddwd` / `vpdpwssd`).
//!
//! Eight weight rows are taken together: their eight integer sums of a block are reduced into
//! one register (a lane per row) and scaled by the eight rows' block scales with one multiply-add,
//! so the per-block float work and the final horizontal sums are shared; the rows left over take
//! a one-row kernel. Each generic body is compiled twice, for AVX2 + FMA + F16C and for AVX-512
//! VNNI (with VL and BW, which also give mask-register shortcuts).
//!
//! Safety: every function here is `unsafe` for the same two reasons, stated once: the CPU has
//! the features of the kernel it is inlined into (AVX2 + FMA + F16C; AVX-512 F / BW / VL / VNNI
//! for the `VNNI = true` bodies and the 512-bit helpers), which `isa_available` checks before a
//! kernel is chosen; and the pointers cover what they read: a weight block of the format (`TS`
//! bytes) at each block pointer, `QK` activation codes and `QK / 16` sums at each activation
//! pointer (the callers derive them from `GgmlBlocks`' checked shape and from activations
//! quantized with the same `k`).

use std::arch::x86_64::*;

use super::act::ActRow;
use super::format::{iq4xs_scale, k4_scales_mins, q3k_scales, KVALUES_IQ4NL};

/// An f16 at `p` (any alignment) as f32.
///
/// # Safety
/// Two bytes are readable at `p`; the CPU has F16C.
#[inline(always)]
unsafe fn f16(p: *const u8) -> f32 {
    let h = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
}

/// The f16 at `p + r·stride` of eight rows r as eight f32 lanes.
#[inline(always)]
unsafe fn f16x8(p: *const u8, stride: usize) -> __m256 {
    let h = |r: usize| (p.add(r * stride) as *const i16).read_unaligned();
    _mm256_cvtph_ps(_mm_setr_epi16(
        h(0),
        h(1),
        h(2),
        h(3),
        h(4),
        h(5),
        h(6),
        h(7),
    ))
}

/// The sum of the eight lanes.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// The lane sums of eight registers `v0..v8`, in order, in one register, from their pairwise
/// `vphaddd`s `[hadd(v0, v1), hadd(v2, v3), hadd(v4, v5), hadd(v6, v7)]`.
#[inline(always)]
unsafe fn reduce_pairs(t: &[__m256i; 4]) -> __m256i {
    // Per 128-bit half: [s0, s1, s2, s3] and [s4, s5, s6, s7] of that half.
    let u0 = _mm256_hadd_epi32(t[0], t[1]);
    let u1 = _mm256_hadd_epi32(t[2], t[3]);
    _mm256_add_epi32(
        _mm256_permute2x128_si256(u0, u1, 0x20),
        _mm256_permute2x128_si256(u0, u1, 0x31),
    )
}

#[inline(always)]
unsafe fn load(p: *const u8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

#[inline(always)]
unsafe fn loadx(p: *const i8) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

/// `acc + Σ` of each 4 adjacent `u·s` products (u unsigned, s signed bytes) per i32 lane.
#[inline(always)]
unsafe fn dot_us<const VNNI: bool>(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
    if VNNI {
        _mm256_dpbusd_epi32(acc, u, s)
    } else {
        let p = _mm256_maddubs_epi16(u, s);
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)))
    }
}

/// `acc + Σ` of each 2 adjacent 16-bit pair sums of `u·s` times the 16-bit `scale` of its lane.
#[inline(always)]
unsafe fn dot_us_scaled<const VNNI: bool>(
    acc: __m256i,
    u: __m256i,
    s: __m256i,
    scale: __m256i,
) -> __m256i {
    let p = _mm256_maddubs_epi16(u, s);
    if VNNI {
        _mm256_dpwssd_epi32(acc, p, scale)
    } else {
        _mm256_add_epi32(acc, _mm256_madd_epi16(p, scale))
    }
}

/// 16 bytes at `p` as 32 nibbles: the low nibbles in bytes 0..16, the high ones in 16..32.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let raw = _mm_loadu_si128(p.cast());
    let both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Byte `i` is 0x10 where bit `i` of `bits` is set, else 0.
#[inline(always)]
unsafe fn bit16<const VNNI: bool>(bits: u32) -> __m256i {
    let v16 = _mm256_set1_epi8(0x10);
    if VNNI {
        _mm256_maskz_mov_epi8(bits, v16)
    } else {
        let v = _mm256_set1_epi32(bits as i32);
        // Byte i takes byte i / 8 of `bits` (in-lane: each lane holds all four).
        let spread = _mm256_setr_epi8(
            0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3,
            3, 3, 3,
        );
        let v = _mm256_shuffle_epi8(v, spread);
        let sel = _mm256_set1_epi64x(0x8040_2010_0804_0201u64 as i64);
        let set = _mm256_cmpeq_epi8(_mm256_and_si256(v, sel), sel);
        _mm256_and_si256(set, v16)
    }
}

/// A `vpshufb` pattern over 8 scales held as i16 in both 128-bit halves: every 16-bit lane of
/// the low half takes scale `lo`, of the high half scale `hi`.
#[inline(always)]
unsafe fn pick(lo: i32, hi: i32) -> __m256i {
    let l = ((2 * lo) | ((2 * lo + 1) << 8)) as i16;
    let h = ((2 * hi) | ((2 * hi + 1) << 8)) as i16;
    _mm256_set_m128i(_mm_set1_epi16(h), _mm_set1_epi16(l))
}

/// How a format's second scale enters the row value.
#[derive(PartialEq, Eq)]
enum Second {
    /// It does not (Q8_0, Q6_K).
    None,
    /// `m_w · ds` per 32-block (the offsets and minimums of Q4_0 … Q5_1).
    Ds,
    /// `m_w · d_x · M` with the integer `M` of [`Format::ints`] (the k-quants' minimums).
    Sums,
}

/// The activation codes and sums of 16 of one block of `R` activation rows.
type Acts<const R: usize> = ([*const i8; R], [*const i16; R]);

/// A block format: the row value is `Σ_b d_x·(d_w·I + [m_w·M]) + [m_w·ds]` (see [`Second`]).
trait Format {
    /// Bytes per block.
    const TS: usize;
    /// Values per block (the activation block).
    const QK: usize;
    /// How `m_w` enters.
    const SECOND: Second;
    /// The integer sums `(I, M)` (in lanes) of the block at `blk` with each of `R` activation
    /// rows: the weight codes are decoded once for all of them.
    unsafe fn ints<const VNNI: bool, const R: usize>(
        blk: *const u8,
        a: &Acts<R>,
    ) -> [(__m256i, __m256i); R];
    /// `(d_w, m_w)` of the block at `blk`.
    unsafe fn scales(blk: *const u8) -> (f32, f32);
    /// `(d_w, m_w)` of the blocks at `blk + r·stride`, r < 8.
    unsafe fn scales8(blk: *const u8, stride: usize) -> (__m256, __m256);
}

/// Defines a 32-value format with codes `$codes(blk)` (unsigned, signed for `Second::None`),
/// its scale at 0 and its second scale `$m` (of the block pointer and `d`).
macro_rules! format32 {
    ($name:ident, $ts:literal, $second:expr, |$blk:ident| $codes:expr, |$b2:ident, $d:ident| $m:expr, |$b8:ident, $stride:ident, $d8:ident| $m8:expr) => {
        struct $name;
        impl Format for $name {
            const TS: usize = $ts;
            const QK: usize = 32;
            const SECOND: Second = $second;
            #[inline(always)]
            unsafe fn ints<const VNNI: bool, const R: usize>(
                $blk: *const u8,
                a: &Acts<R>,
            ) -> [(__m256i, __m256i); R] {
                let q: __m256i = $codes;
                let zero = _mm256_setzero_si256();
                let mut out = [(zero, zero); R];
                for (o, x) in out.iter_mut().zip(a.0) {
                    let x = loadx(x);
                    o.0 = if $second == Second::None {
                        // Signed codes: |q| (unsigned; -128 becomes 128) times x with q's sign.
                        dot_us::<VNNI>(zero, _mm256_sign_epi8(q, q), _mm256_sign_epi8(x, q))
                    } else {
                        dot_us::<VNNI>(zero, q, x)
                    };
                }
                out
            }
            #[inline(always)]
            unsafe fn scales($b2: *const u8) -> (f32, f32) {
                let $d = f16($b2);
                ($d, $m)
            }
            #[inline(always)]
            unsafe fn scales8($b8: *const u8, $stride: usize) -> (__m256, __m256) {
                let $d8 = f16x8($b8, $stride);
                ($d8, $m8)
            }
        }
    };
}

format32!(
    Q4_0,
    18,
    Second::Ds,
    |blk| nibbles(blk.add(2)),
    |_b, d| -8.0 * d,
    |_b, _s, d| _mm256_mul_ps(d, _mm256_set1_ps(-8.0))
);
format32!(
    Q4_1,
    20,
    Second::Ds,
    |blk| nibbles(blk.add(4)),
    |b, _d| f16(b.add(2)),
    |b, s, _d| f16x8(b.add(2), s)
);
format32!(
    Q5_0,
    22,
    Second::Ds,
    |blk| _mm256_or_si256(
        nibbles(blk.add(6)),
        bit16::<VNNI>((blk.add(2) as *const u32).read_unaligned())
    ),
    |_b, d| -16.0 * d,
    |_b, _s, d| _mm256_mul_ps(d, _mm256_set1_ps(-16.0))
);
format32!(
    Q5_1,
    24,
    Second::Ds,
    |blk| _mm256_or_si256(
        nibbles(blk.add(8)),
        bit16::<VNNI>((blk.add(4) as *const u32).read_unaligned())
    ),
    |b, _d| f16(b.add(2)),
    |b, s, _d| f16x8(b.add(2), s)
);
format32!(
    Q8_0,
    34,
    Second::None,
    |blk| load(blk.add(2)),
    |_b, _d| 0.0,
    |_b, _s, _d| _mm256_setzero_ps()
);

format32!(
    IQ4NL,
    18,
    Second::None,
    |blk| _mm256_shuffle_epi8(iq4_levels(), nibbles(blk.add(2))),
    |_b, _d| 0.0,
    |_b, _s, _d| _mm256_setzero_ps()
);

/// The sixteen IQ4 levels in both 128-bit halves (a `vpshufb` table).
#[inline(always)]
unsafe fn iq4_levels() -> __m256i {
    _mm256_broadcastsi128_si256(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()))
}

/// IQ4_XS: `I = Σ_s sc_s·Σ v·qx` over its eight 32-value sub-blocks, `v` the (signed) levels.
struct IQ4XS;
impl Format for IQ4XS {
    const TS: usize = 136;
    const QK: usize = 256;
    const SECOND: Second = Second::None;
    #[inline(always)]
    unsafe fn ints<const VNNI: bool, const R: usize>(
        blk: *const u8,
        a: &Acts<R>,
    ) -> [(__m256i, __m256i); R] {
        let zero = _mm256_setzero_si256();
        let mut out = [(zero, zero); R];
        let levels = iq4_levels();
        let head = std::slice::from_raw_parts(blk, 8);
        for ib in 0..8 {
            let v = _mm256_shuffle_epi8(levels, nibbles(blk.add(8 + 16 * ib)));
            let sc = _mm256_set1_epi16(iq4xs_scale(head, ib) as i16);
            let abs = _mm256_sign_epi8(v, v);
            for (o, x) in out.iter_mut().zip(a.0) {
                let x = _mm256_sign_epi8(loadx(x.add(32 * ib)), v);
                o.0 = dot_us_scaled::<VNNI>(o.0, abs, x, sc);
            }
        }
        out
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> (f32, f32) {
        (f16(blk), 0.0)
    }
    #[inline(always)]
    unsafe fn scales8(blk: *const u8, stride: usize) -> (__m256, __m256) {
        (f16x8(blk, stride), _mm256_setzero_ps())
    }
}

/// Q2_K (`THREE = false`: `I = Σ_s sc_s·Σ q·qx`, `M = Σ_s m_s·Σ qx`, `(d_w, m_w) = (d, -dmin)`)
/// and Q3_K (`THREE = true`: `I = Σ_s (sc_s - 32)·(Σ u·qx - 4·Σ qx)` with `u = q + 4` in
/// `0..8`), over sixteen 16-value sub-blocks; the 2-bit fields of 32 bytes, shifted by 2·j,
/// are the 32 values `128·n + 32·j + ..`.
struct Q23K<const THREE: bool>;
impl<const THREE: bool> Format for Q23K<THREE> {
    const TS: usize = if THREE { 110 } else { 84 };
    const QK: usize = 256;
    const SECOND: Second = if THREE { Second::None } else { Second::Sums };
    #[inline(always)]
    unsafe fn ints<const VNNI: bool, const R: usize>(
        blk: *const u8,
        a: &Acts<R>,
    ) -> [(__m256i, __m256i); R] {
        let zero = _mm256_setzero_si256();
        let mut out = [(zero, zero); R];
        let m3 = _mm256_set1_epi8(3);
        let one = _mm256_set1_epi8(1);
        let sc16 = if THREE {
            let raw = q3k_scales(std::slice::from_raw_parts(blk.add(96), 12));
            let sc = _mm_sub_epi8(_mm_loadu_si128(raw.as_ptr().cast()), _mm_set1_epi8(32));
            let sc16 = _mm256_cvtepi8_epi16(sc);
            // 4 · Σ_s sc_s · Σ qx: the offset of the codes, taken off at the start.
            for (o, bs) in out.iter_mut().zip(a.1) {
                let sums = _mm256_madd_epi16(sc16, _mm256_loadu_si256(bs.cast()));
                o.0 = _mm256_sub_epi32(zero, _mm256_slli_epi32(sums, 2));
            }
            sc16
        } else {
            let raw = _mm_loadu_si128(blk.cast());
            let m4 = _mm_set1_epi8(0x0F);
            let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
            for (o, bs) in out.iter_mut().zip(a.1) {
                o.1 = _mm256_madd_epi16(mins, _mm256_loadu_si256(bs.cast()));
            }
            _mm256_cvtepu8_epi16(_mm_and_si128(raw, m4))
        };
        let qs = blk.add(if THREE { 32 } else { 16 });
        let hm = if THREE { load(blk) } else { zero };
        for n in 0..2 {
            let scales = if n == 0 {
                _mm256_permute2x128_si256(sc16, sc16, 0x00)
            } else {
                _mm256_permute2x128_si256(sc16, sc16, 0x11)
            };
            // Shifting 16-bit lanes keeps each byte's own next bits at the bottom.
            let mut q = load(qs.add(32 * n));
            let mut high = if n == 0 { hm } else { _mm256_srli_epi16(hm, 4) };
            for j in 0..4 {
                let mut codes = _mm256_and_si256(q, m3);
                q = _mm256_srli_epi16(q, 2);
                if THREE {
                    let h = _mm256_and_si256(high, one);
                    codes = _mm256_or_si256(codes, _mm256_slli_epi16(h, 2));
                    high = _mm256_srli_epi16(high, 1);
                }
                let vi = j as i32;
                let sc = _mm256_shuffle_epi8(scales, pick(2 * vi, 2 * vi + 1));
                for (o, x) in out.iter_mut().zip(a.0) {
                    let x = loadx(x.add(128 * n + 32 * j));
                    o.0 = dot_us_scaled::<VNNI>(o.0, codes, x, sc);
                }
            }
        }
        out
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> (f32, f32) {
        if THREE {
            (f16(blk.add(108)), 0.0)
        } else {
            (f16(blk.add(80)), -f16(blk.add(82)))
        }
    }
    #[inline(always)]
    unsafe fn scales8(blk: *const u8, stride: usize) -> (__m256, __m256) {
        if THREE {
            (f16x8(blk.add(108), stride), _mm256_setzero_ps())
        } else {
            let m = f16x8(blk.add(82), stride);
            (
                f16x8(blk.add(80), stride),
                _mm256_xor_ps(m, _mm256_set1_ps(-0.0)),
            )
        }
    }
}

/// Q4_K (`FIVE = false`) and Q5_K (`FIVE = true`): `I = Σ_s sc_s·Σ q·qx`, `M = Σ_s m_s·Σ qx`,
/// `(d_w, m_w) = (d, -dmin)`.
struct Q45K<const FIVE: bool>;
impl<const FIVE: bool> Format for Q45K<FIVE> {
    const TS: usize = if FIVE { 176 } else { 144 };
    const QK: usize = 256;
    const SECOND: Second = Second::Sums;
    #[inline(always)]
    unsafe fn ints<const VNNI: bool, const R: usize>(
        blk: *const u8,
        a: &Acts<R>,
    ) -> [(__m256i, __m256i); R] {
        let zero = _mm256_setzero_si256();
        let mut out = [(zero, zero); R];
        let (sc, mn) = k4_scales_mins(std::slice::from_raw_parts(blk.add(4), 12));
        // Σ_s m_s · Σ qx over sub-block s: minimums doubled against the sums of 16.
        let mins = _mm_cvtsi64_si128(mn as i64);
        let mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins));
        for (o, bs) in out.iter_mut().zip(a.1) {
            o.1 = _mm256_madd_epi16(mins, _mm256_loadu_si256(bs.cast()));
        }
        let scales8 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64));
        if VNNI {
            let isums = q45k_512::<FIVE, R>(blk, &a.0, scales8);
            for (o, i) in out.iter_mut().zip(isums) {
                o.0 = i;
            }
            return out;
        }
        let m4 = _mm256_set1_epi8(0x0F);
        let one = _mm256_set1_epi8(1);
        let scales = _mm256_broadcastsi128_si256(scales8);
        let q = blk.add(if FIVE { 48 } else { 16 });
        let mut high = if FIVE { load(blk.add(16)) } else { zero };
        for j in 0..4 {
            let raw = load(q.add(32 * j));
            let mut lo = _mm256_and_si256(raw, m4);
            let mut hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4);
            if FIVE {
                // Bit 2j of qh (then 2j + 1) is the fifth bit; shifting 16-bit lanes by one a
                // step keeps each byte's own next bit in bit 0.
                lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(high, one), 4));
                high = _mm256_srli_epi16(high, 1);
                hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(high, one), 4));
                high = _mm256_srli_epi16(high, 1);
            }
            let s = 2 * j as i32;
            let (slo, shi) = (
                _mm256_shuffle_epi8(scales, pick(s, s)),
                _mm256_shuffle_epi8(scales, pick(s + 1, s + 1)),
            );
            for (o, x) in out.iter_mut().zip(a.0) {
                o.0 = dot_us_scaled::<VNNI>(o.0, lo, loadx(x.add(64 * j)), slo);
                o.0 = dot_us_scaled::<VNNI>(o.0, hi, loadx(x.add(64 * j + 32)), shi);
            }
        }
        out
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> (f32, f32) {
        (f16(blk), -f16(blk.add(2)))
    }
    #[inline(always)]
    unsafe fn scales8(blk: *const u8, stride: usize) -> (__m256, __m256) {
        let m = f16x8(blk.add(2), stride);
        (f16x8(blk, stride), _mm256_xor_ps(m, _mm256_set1_ps(-0.0)))
    }
}

/// Q6_K: `I = Σ_s sc_s·(Σ q·qx - 32·Σ qx)` over its sixteen 16-value sub-blocks.
struct Q6K;
impl Format for Q6K {
    const TS: usize = 210;
    const QK: usize = 256;
    const SECOND: Second = Second::None;
    #[inline(always)]
    unsafe fn ints<const VNNI: bool, const R: usize>(
        blk: *const u8,
        a: &Acts<R>,
    ) -> [(__m256i, __m256i); R] {
        let zero = _mm256_setzero_si256();
        let mut out = [(zero, zero); R];
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192).cast()));
        // 32 · Σ_s sc_s · Σ qx over the 16 values of scale s (the codes' offset), taken off
        // at the start.
        for (o, bs) in out.iter_mut().zip(a.1) {
            let sums = _mm256_madd_epi16(sc16, _mm256_loadu_si256(bs.cast()));
            o.0 = _mm256_sub_epi32(zero, _mm256_slli_epi32(sums, 5));
        }
        if VNNI {
            let isums = q6k_512::<R>(blk, &a.0, sc16);
            for (o, i) in out.iter_mut().zip(isums) {
                o.0 = _mm256_add_epi32(o.0, i);
            }
            return out;
        }
        let m4 = _mm256_set1_epi8(0x0F);
        let m30 = _mm256_set1_epi8(0x30);
        for n in 0..2 {
            let scales = if n == 0 {
                _mm256_permute2x128_si256(sc16, sc16, 0x00)
            } else {
                _mm256_permute2x128_si256(sc16, sc16, 0x11)
            };
            let ql0 = load(blk.add(64 * n));
            let ql1 = load(blk.add(64 * n + 32));
            let qh = load(blk.add(128 + 32 * n));
            let q1 = _mm256_or_si256(
                _mm256_and_si256(ql0, m4),
                _mm256_and_si256(_mm256_slli_epi16(qh, 4), m30),
            );
            let q2 = _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_and_si256(_mm256_slli_epi16(qh, 2), m30),
            );
            let q3 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(ql0, 4), m4),
                _mm256_and_si256(qh, m30),
            );
            let q4 = _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16(ql1, 4), m4),
                _mm256_and_si256(_mm256_srli_epi16(qh, 2), m30),
            );
            for (v, q) in [q1, q2, q3, q4].into_iter().enumerate() {
                let vi = v as i32;
                let sc = _mm256_shuffle_epi8(scales, pick(2 * vi, 2 * vi + 1));
                for (o, x) in out.iter_mut().zip(a.0) {
                    o.0 = dot_us_scaled::<VNNI>(o.0, q, loadx(x.add(128 * n + 32 * v)), sc);
                }
            }
        }
        out
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> (f32, f32) {
        (f16(blk.add(208)), 0.0)
    }
    #[inline(always)]
    unsafe fn scales8(blk: *const u8, stride: usize) -> (__m256, __m256) {
        (f16x8(blk.add(208), stride), _mm256_setzero_ps())
    }
}

/// 32 i16 lanes: lane `t` holds `base + t / div`.
const fn lanes16(base: i16, div: usize) -> [i16; 32] {
    let mut a = [0i16; 32];
    let mut t = 0;
    while t < 32 {
        a[t] = base + (t / div) as i16;
        t += 1;
    }
    a
}

/// 32 i16 lanes: `lo` in the low 256 bits, `hi` in the high.
const fn halves16(lo: i16, hi: i16) -> [i16; 32] {
    let mut a = [lo; 32];
    let mut t = 16;
    while t < 32 {
        a[t] = hi;
        t += 1;
    }
    a
}

#[inline(always)]
unsafe fn load_lanes(a: &[i16; 32]) -> __m512i {
    _mm512_loadu_si512(a.as_ptr().cast())
}

/// The halves of a 512-bit register added.
#[inline(always)]
unsafe fn fold512(v: __m512i) -> __m256i {
    _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v))
}

/// Q4_K / Q5_K's `Σ_s sc_s·Σ q·qx` with 512-bit registers for each of `R` activation rows:
/// the low and high nibbles of each 32 bytes are 64 consecutive values (two sub-blocks), one
/// register of codes against one of activations.
///
/// # Safety
/// The CPU has AVX-512 F, BW and VNNI; the block and 256 activation codes of each row are
/// readable.
#[inline(always)]
unsafe fn q45k_512<const FIVE: bool, const R: usize>(
    blk: *const u8,
    x: &[*const i8; R],
    scales: __m128i,
) -> [__m256i; R] {
    const SHIFT: [i16; 32] = halves16(0, 4);
    const PICK: [[i16; 32]; 4] = [
        lanes16(0, 16),
        lanes16(2, 16),
        lanes16(4, 16),
        lanes16(6, 16),
    ];
    const HIGH: [[i16; 32]; 4] = [
        halves16(0, 1),
        halves16(2, 3),
        halves16(4, 5),
        halves16(6, 7),
    ];
    let m4 = _mm512_set1_epi8(0x0F);
    let one = _mm512_set1_epi8(1);
    let scales = _mm512_zextsi128_si512(scales);
    let shift = load_lanes(&SHIFT);
    let q = blk.add(if FIVE { 48 } else { 16 });
    let qh = if FIVE {
        _mm512_broadcast_i64x4(load(blk.add(16)))
    } else {
        _mm512_setzero_si512()
    };
    let mut isum = [_mm512_setzero_si512(); R];
    for j in 0..4 {
        let raw = _mm512_broadcast_i64x4(load(q.add(32 * j)));
        let mut codes = _mm512_and_si512(_mm512_srlv_epi16(raw, shift), m4);
        if FIVE {
            // Bits 2j and 2j + 1 of qh: the fifth bits of the two sub-blocks.
            let h = _mm512_and_si512(_mm512_srlv_epi16(qh, load_lanes(&HIGH[j])), one);
            codes = _mm512_or_si512(codes, _mm512_slli_epi16::<4>(h));
        }
        let sc = _mm512_permutexvar_epi16(load_lanes(&PICK[j]), scales);
        for (s, x) in isum.iter_mut().zip(x) {
            let p = _mm512_maddubs_epi16(codes, _mm512_loadu_si512(x.add(64 * j).cast()));
            *s = _mm512_dpwssd_epi32(*s, p, sc);
        }
    }
    isum.map(|s| fold512(s))
}

/// Q6_K's `Σ_s sc_s·Σ q·qx` with 512-bit registers for each of `R` activation rows: per 128
/// values, the 64 bytes of `ql` give the low nibbles of values 0..64 and the high ones of
/// 64..128, `qh` (in both halves) their top two bits.
///
/// # Safety
/// As [`q45k_512`].
#[inline(always)]
unsafe fn q6k_512<const R: usize>(
    blk: *const u8,
    x: &[*const i8; R],
    sc16: __m256i,
) -> [__m256i; R] {
    const UP: [i16; 32] = halves16(4, 2);
    const DOWN: [i16; 32] = halves16(0, 2);
    const PICK: [[i16; 32]; 4] = [lanes16(0, 8), lanes16(4, 8), lanes16(8, 8), lanes16(12, 8)];
    let m4 = _mm512_set1_epi8(0x0F);
    let m30 = _mm512_set1_epi8(0x30);
    let scales = _mm512_zextsi256_si512(sc16);
    let (up, down) = (load_lanes(&UP), load_lanes(&DOWN));
    let mut isum = [_mm512_setzero_si512(); R];
    for n in 0..2 {
        let l = _mm512_loadu_si512(blk.add(64 * n).cast());
        let h = _mm512_broadcast_i64x4(load(blk.add(128 + 32 * n)));
        // Values 0..64 (q1, q2) and 64..128 (q3, q4) of this half.
        let a = _mm512_or_si512(
            _mm512_and_si512(l, m4),
            _mm512_and_si512(_mm512_sllv_epi16(h, up), m30),
        );
        let b = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16::<4>(l), m4),
            _mm512_and_si512(_mm512_srlv_epi16(h, down), m30),
        );
        let sa = _mm512_permutexvar_epi16(load_lanes(&PICK[2 * n]), scales);
        let sb = _mm512_permutexvar_epi16(load_lanes(&PICK[2 * n + 1]), scales);
        for (s, x) in isum.iter_mut().zip(x) {
            let xa = _mm512_loadu_si512(x.add(128 * n).cast());
            let xb = _mm512_loadu_si512(x.add(128 * n + 64).cast());
            *s = _mm512_dpwssd_epi32(*s, _mm512_maddubs_epi16(a, xa), sa);
            *s = _mm512_dpwssd_epi32(*s, _mm512_maddubs_epi16(b, xb), sb);
        }
    }
    isum.map(|s| fold512(s))
}

/// The pointers to block `b`'s codes and sums of 16 in each of `R` activation rows.
///
/// # Safety
/// Block `b` exists in every row.
#[inline(always)]
unsafe fn block_acts<F: Format, const R: usize>(acts: &[ActRow<'_>; R], b: usize) -> Acts<R> {
    (
        acts.map(|a| a.qs.as_ptr().add(b * F::QK)),
        // The 32-value formats' rows have no sums of 16 (an empty slice) and never read them:
        // `wrapping_add` keeps the unused pointer computation defined.
        acts.map(|a| a.bsums.as_ptr().wrapping_add(b * F::QK / 16)),
    )
}

/// One weight row at `w` against `R` activation rows, into `out[a]`.
///
/// # Safety
/// See the module documentation; `w` holds `acts[0].d.len()` blocks, each `out[a]` is writable.
#[inline(always)]
unsafe fn row1<F: Format, const VNNI: bool, const R: usize>(
    w: *const u8,
    acts: &[ActRow<'_>; R],
    out: [*mut f32; R],
) {
    let nb = acts[0].d.len();
    let zero = _mm256_setzero_ps();
    let (mut acc, mut acc2) = ([zero; R], [zero; R]);
    let mut corr = [0f32; R];
    for b in 0..nb {
        let blk = w.add(b * F::TS);
        let ints = F::ints::<VNNI, R>(blk, &block_acts::<F, R>(acts, b));
        let (dw, mw) = F::scales(blk);
        for (t, ((i, m), a)) in ints.into_iter().zip(acts).enumerate() {
            let dx = *a.d.get_unchecked(b);
            acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(dw * dx), acc[t]);
            match F::SECOND {
                Second::None => {}
                Second::Ds => corr[t] = mw.mul_add(*a.ds.get_unchecked(b), corr[t]),
                Second::Sums => {
                    let m = _mm256_cvtepi32_ps(m);
                    acc2[t] = _mm256_fmadd_ps(m, _mm256_set1_ps(mw * dx), acc2[t]);
                }
            }
        }
    }
    for t in 0..R {
        *out[t] = hsum(_mm256_add_ps(acc[t], acc2[t])) + corr[t];
    }
}

/// Eight weight rows at `w + r·stride` against `R` activation rows, into `out[a][..8]`,
/// prefetching the `next` bytes (the next eight rows) as it goes, so that memory is read in
/// order.
///
/// # Safety
/// See the module documentation; each of the eight rows holds `acts[0].d.len()` blocks, each
/// `out[a]` has eight writable values.
#[inline(always)]
unsafe fn rows8<F: Format, const VNNI: bool, const R: usize>(
    w: *const u8,
    stride: usize,
    acts: &[ActRow<'_>; R],
    out: [*mut f32; R],
    next: &[u8],
) {
    let nb = acts[0].d.len();
    // Cache lines of `next` to prefetch per block.
    let lines = next.len().div_ceil(64);
    let per_block = lines.div_ceil(nb.max(1));
    let mut line = 0;
    let zero = _mm256_setzero_ps();
    let (mut acc, mut acc2) = ([zero; R], [zero; R]);
    let izero = _mm256_setzero_si256();
    for b in 0..nb {
        let blk = w.add(b * F::TS);
        for _ in 0..per_block {
            if line < lines {
                _mm_prefetch::<_MM_HINT_T0>(next.as_ptr().add(64 * line).cast());
                line += 1;
            }
        }
        let ba = block_acts::<F, R>(acts, b);
        // Rows in pairs, their sums reduced pairwise at once (fewer live registers).
        let mut is = [[izero; 4]; R];
        let mut ms = [[izero; 4]; R];
        for p in 0..4 {
            let e = F::ints::<VNNI, R>(blk.add(2 * p * stride), &ba);
            let o = F::ints::<VNNI, R>(blk.add((2 * p + 1) * stride), &ba);
            for t in 0..R {
                is[t][p] = _mm256_hadd_epi32(e[t].0, o[t].0);
                if F::SECOND == Second::Sums {
                    ms[t][p] = _mm256_hadd_epi32(e[t].1, o[t].1);
                }
            }
        }
        let (dw, mw) = F::scales8(blk, stride);
        for (t, a) in acts.iter().enumerate() {
            let dx = _mm256_set1_ps(*a.d.get_unchecked(b));
            let i = _mm256_cvtepi32_ps(reduce_pairs(&is[t]));
            acc[t] = _mm256_fmadd_ps(i, _mm256_mul_ps(dw, dx), acc[t]);
            match F::SECOND {
                Second::None => {}
                Second::Ds => {
                    let ds = _mm256_set1_ps(*a.ds.get_unchecked(b));
                    acc2[t] = _mm256_fmadd_ps(mw, ds, acc2[t]);
                }
                Second::Sums => {
                    let m = _mm256_cvtepi32_ps(reduce_pairs(&ms[t]));
                    acc2[t] = _mm256_fmadd_ps(m, _mm256_mul_ps(mw, dx), acc2[t]);
                }
            }
        }
    }
    for t in 0..R {
        _mm256_storeu_ps(out[t], _mm256_add_ps(acc[t], acc2[t]));
    }
}

/// Weight rows `j` (at `w + j·stride`, `m` of them) against `R` activation rows: `out[a] + j`
/// gets row j's value with activation row a; eight weight rows at a time.
///
/// # Safety
/// See the module documentation; `w` holds `m` rows, `out[a] + j` is writable for j < m.
#[inline(always)]
unsafe fn rows_r<F: Format, const VNNI: bool, const R: usize>(
    w: &[u8],
    stride: usize,
    m: usize,
    acts: &[ActRow<'_>; R],
    out: [*mut f32; R],
) {
    let wp = w.as_ptr();
    let mut j = 0;
    while j + 8 <= m {
        let next = w
            .get((j + 8) * stride..((j + 16).min(m) * stride))
            .unwrap_or(&[]);
        rows8::<F, VNNI, R>(
            wp.add(j * stride),
            stride,
            acts,
            out.map(|o| o.add(j)),
            next,
        );
        j += 8;
    }
    while j < m {
        row1::<F, VNNI, R>(wp.add(j * stride), acts, out.map(|o| o.add(j)));
        j += 1;
    }
}

/// Weight rows `j` (`m` = `w.len() / stride` of them) against every activation row `a`, into
/// `out[a·ostride + j]`: up to four activation rows (two with AVX2's 16 registers) share each
/// decoded weight block.
///
/// # Safety
/// See the module documentation; `out + a·ostride + j` is writable for every a and j.
#[inline(always)]
unsafe fn rows<F: Format, const VNNI: bool>(
    w: &[u8],
    stride: usize,
    acts: &[ActRow<'_>],
    out: *mut f32,
    ostride: usize,
) {
    let m = w.len() / stride.max(1);
    let mut a0 = 0;
    while a0 < acts.len() {
        let left = acts.len() - a0;
        let o = |t: usize| out.add((a0 + t) * ostride);
        if VNNI && left >= 4 {
            let a = [acts[a0], acts[a0 + 1], acts[a0 + 2], acts[a0 + 3]];
            rows_r::<F, VNNI, 4>(w, stride, m, &a, [o(0), o(1), o(2), o(3)]);
            a0 += 4;
        } else if left >= 2 {
            rows_r::<F, VNNI, 2>(w, stride, m, &[acts[a0], acts[a0 + 1]], [o(0), o(1)]);
            a0 += 2;
        } else {
            rows_r::<F, VNNI, 1>(w, stride, m, &[acts[a0]], [o(0)]);
            a0 += 1;
        }
    }
}

/// Defines the AVX2 and the VNNI compilation of each format's kernel.
macro_rules! compile {
    ($($f:ty => $avx2:ident, $vnni:ident;)*) => {$(
        /// The AVX2 kernel.
        ///
        /// # Safety
        /// The CPU has AVX2, FMA and F16C; `w` holds whole rows of `stride` bytes, each the
        /// blocks of `k` values; `acts` are activation rows of the same `k` quantized for this
        /// format; `out + a·ostride + j` is writable for every activation row a and weight
        /// row j.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn $avx2(
            w: &[u8],
            stride: usize,
            acts: &[ActRow<'_>],
            out: *mut f32,
            ostride: usize,
        ) {
            rows::<$f, false>(w, stride, acts, out, ostride)
        }
        /// The AVX-512 VNNI kernel.
        ///
        /// # Safety
        /// The CPU has AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C; as the AVX2 kernel.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(super) unsafe fn $vnni(
            w: &[u8],
            stride: usize,
            acts: &[ActRow<'_>],
            out: *mut f32,
            ostride: usize,
        ) {
            rows::<$f, true>(w, stride, acts, out, ostride)
        }
    )*};
}

compile! {
    Q4_0 => q4_0_avx2, q4_0_vnni;
    Q4_1 => q4_1_avx2, q4_1_vnni;
    Q5_0 => q5_0_avx2, q5_0_vnni;
    Q5_1 => q5_1_avx2, q5_1_vnni;
    Q8_0 => q8_0_avx2, q8_0_vnni;
    Q45K<false> => q4_k_avx2, q4_k_vnni;
    Q45K<true> => q5_k_avx2, q5_k_vnni;
    Q6K => q6_k_avx2, q6_k_vnni;
    Q23K<false> => q2_k_avx2, q2_k_vnni;
    Q23K<true> => q3_k_avx2, q3_k_vnni;
    IQ4NL => iq4_nl_avx2, iq4_nl_vnni;
    IQ4XS => iq4_xs_avx2, iq4_xs_vnni;
}
