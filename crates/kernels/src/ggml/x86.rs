//! AVX2 and AVX-512 VNNI dot products of one weight row with one quantized activation row (the
//! sums of [`super::dot`], 32 values per 256-bit register).
//!
//! Weight codes are unsigned (offsets and minimums are applied through the activation sums), so
//! each product is one u8 × s8 multiply: `vpdpbusd` (VNNI) or `vpmaddubsw` + `vpmaddwd` (AVX2,
//! whose 16-bit pair sums cannot saturate: at most 2·63·127 = 16 002, 2·128·127 = 32 512 for
//! Q8_0's magnitudes). Sub-block scales of the k-quants multiply the 16-bit pair sums inside the
//! same integer accumulator (`vpmaddwd` / `vpdpwssd`); one float multiply-add per block follows.
//! Each generic body is compiled twice, for AVX2 + FMA + F16C and for AVX-512 VNNI (with VL and
//! BW, which also give mask-register shortcuts).

use std::arch::x86_64::*;

use super::act::ActRow;
use super::format::k4_scales_mins;

/// An f16 at `p` (any alignment) as f32.
///
/// # Safety
/// Two bytes are readable at `p`; the CPU has F16C.
#[inline(always)]
unsafe fn f16(p: *const u8) -> f32 {
    let h = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
}

/// The sum of the eight lanes.
#[inline(always)]
unsafe fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
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

/// A 32-value format: its codes (unsigned, or signed for Q8_0) and the `(d_w, m_w)` that
/// multiply `d_x·Σ q·qx` and `ds = d_x·Σ qx`.
trait Format32 {
    /// Bytes per block.
    const TS: usize;
    /// Whether the codes are signed (no offset or minimum).
    const SIGNED: bool;
    /// The 32 codes of the block at `blk`.
    unsafe fn codes<const VNNI: bool>(blk: *const u8) -> __m256i;
    /// `(d_w, m_w)` of the block at `blk`.
    unsafe fn scales(blk: *const u8) -> (f32, f32);
}

struct Q4_0;
impl Format32 for Q4_0 {
    const TS: usize = 18;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn codes<const VNNI: bool>(blk: *const u8) -> __m256i {
        nibbles(blk.add(2))
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> (f32, f32) {
        let d = f16(blk);
        (d, -8.0 * d)
    }
}

struct Q4_1;
impl Format32 for Q4_1 {
    const TS: usize = 20;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn codes<const VNNI: bool>(blk: *const u8) -> __m256i {
        nibbles(blk.add(4))
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> (f32, f32) {
        (f16(blk), f16(blk.add(2)))
    }
}

struct Q5_0;
impl Format32 for Q5_0 {
    const TS: usize = 22;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn codes<const VNNI: bool>(blk: *const u8) -> __m256i {
        let qh = (blk.add(2) as *const u32).read_unaligned();
        _mm256_or_si256(nibbles(blk.add(6)), bit16::<VNNI>(qh))
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> (f32, f32) {
        let d = f16(blk);
        (d, -16.0 * d)
    }
}

struct Q5_1;
impl Format32 for Q5_1 {
    const TS: usize = 24;
    const SIGNED: bool = false;
    #[inline(always)]
    unsafe fn codes<const VNNI: bool>(blk: *const u8) -> __m256i {
        let qh = (blk.add(4) as *const u32).read_unaligned();
        _mm256_or_si256(nibbles(blk.add(8)), bit16::<VNNI>(qh))
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> (f32, f32) {
        (f16(blk), f16(blk.add(2)))
    }
}

struct Q8_0;
impl Format32 for Q8_0 {
    const TS: usize = 34;
    const SIGNED: bool = true;
    #[inline(always)]
    unsafe fn codes<const VNNI: bool>(blk: *const u8) -> __m256i {
        load(blk.add(2))
    }
    #[inline(always)]
    unsafe fn scales(blk: *const u8) -> (f32, f32) {
        (f16(blk), 0.0)
    }
}

/// One block `b` of a 32-value format added to the accumulators.
#[inline(always)]
unsafe fn step32<F: Format32, const VNNI: bool>(
    wp: *const u8,
    a: &ActRow<'_>,
    b: usize,
    acc: __m256,
    corr: f32,
) -> (__m256, f32) {
    let blk = wp.add(b * F::TS);
    let q = F::codes::<VNNI>(blk);
    let x = loadx(a.qs.as_ptr().add(32 * b));
    let p = if F::SIGNED {
        // |q| (unsigned; -128 becomes 128) times x with q's sign.
        dot_us::<VNNI>(
            _mm256_setzero_si256(),
            _mm256_sign_epi8(q, q),
            _mm256_sign_epi8(x, q),
        )
    } else {
        dot_us::<VNNI>(_mm256_setzero_si256(), q, x)
    };
    let (dw, mw) = F::scales(blk);
    let dx = *a.d.get_unchecked(b);
    let acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), _mm256_set1_ps(dw * dx), acc);
    let corr = if F::SIGNED {
        corr
    } else {
        mw.mul_add(*a.ds.get_unchecked(b), corr)
    };
    (acc, corr)
}

/// A row of a 32-value format: two independent accumulator chains.
#[inline(always)]
unsafe fn blocks32<F: Format32, const VNNI: bool>(w: &[u8], a: &ActRow<'_>) -> f32 {
    let nb = a.d.len();
    let wp = w.as_ptr();
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let (mut corr0, mut corr1) = (0f32, 0f32);
    let mut b = 0;
    while b + 2 <= nb {
        (acc0, corr0) = step32::<F, VNNI>(wp, a, b, acc0, corr0);
        (acc1, corr1) = step32::<F, VNNI>(wp, a, b + 1, acc1, corr1);
        b += 2;
    }
    if b < nb {
        (acc0, corr0) = step32::<F, VNNI>(wp, a, b, acc0, corr0);
    }
    hsum(_mm256_add_ps(acc0, acc1)) + (corr0 + corr1)
}

/// A 16-bit scale pattern for `vpshufb` over 8 scales held as i16 in both 128-bit lanes: every
/// 16-bit lane of the low half takes scale `lo`, of the high half scale `hi`.
#[inline(always)]
unsafe fn pick(lo: i32, hi: i32) -> __m256i {
    let l = ((2 * lo) | ((2 * lo + 1) << 8)) as i16;
    let h = ((2 * hi) | ((2 * hi + 1) << 8)) as i16;
    _mm256_set_m128i(_mm_set1_epi16(h), _mm_set1_epi16(l))
}

/// Q4_K (`FIVE = false`) and Q5_K (`FIVE = true`).
#[inline(always)]
unsafe fn q45_k<const VNNI: bool, const FIVE: bool>(w: &[u8], a: &ActRow<'_>) -> f32 {
    const fn ts(five: bool) -> usize {
        if five {
            176
        } else {
            144
        }
    }
    let nb = a.d.len();
    let (wp, xp, bp) = (w.as_ptr(), a.qs.as_ptr(), a.bsums.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let one = _mm256_set1_epi8(1);
    let mut acc = _mm256_setzero_ps();
    let mut accm = _mm256_setzero_ps();
    for b in 0..nb {
        let blk = wp.add(b * ts(FIVE));
        let dx = *a.d.get_unchecked(b);
        let d = f16(blk) * dx;
        let dmin = f16(blk.add(2)) * dx;
        let (sc, mn) = k4_scales_mins(std::slice::from_raw_parts(blk.add(4), 12));
        // Σ_s m_s · Σ qx over sub-block s: minimums doubled against the sums of 16.
        let mins = _mm_cvtsi64_si128(mn as i64);
        let mins = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins));
        let bs = _mm256_loadu_si256(bp.add(16 * b).cast());
        accm = _mm256_fmadd_ps(
            _mm256_cvtepi32_ps(_mm256_madd_epi16(mins, bs)),
            _mm256_set1_ps(dmin),
            accm,
        );
        let scales = _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(sc as i64)));
        let (q, x) = if FIVE {
            (blk.add(48), xp.add(256 * b))
        } else {
            (blk.add(16), xp.add(256 * b))
        };
        let mut high = if FIVE {
            load(blk.add(16))
        } else {
            _mm256_setzero_si256()
        };
        let mut isum = _mm256_setzero_si256();
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
            isum = dot_us_scaled::<VNNI>(
                isum,
                lo,
                loadx(x.add(64 * j)),
                _mm256_shuffle_epi8(scales, pick(s, s)),
            );
            isum = dot_us_scaled::<VNNI>(
                isum,
                hi,
                loadx(x.add(64 * j + 32)),
                _mm256_shuffle_epi8(scales, pick(s + 1, s + 1)),
            );
        }
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d), acc);
    }
    hsum(acc) - hsum(accm)
}

#[inline(always)]
unsafe fn q6_k<const VNNI: bool>(w: &[u8], a: &ActRow<'_>) -> f32 {
    let nb = a.d.len();
    let (wp, xp, bp) = (w.as_ptr(), a.qs.as_ptr(), a.bsums.as_ptr());
    let m4 = _mm256_set1_epi8(0x0F);
    let m30 = _mm256_set1_epi8(0x30);
    let mut acc = _mm256_setzero_ps();
    for b in 0..nb {
        let blk = wp.add(b * 210);
        let d = f16(blk.add(208)) * *a.d.get_unchecked(b);
        let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(blk.add(192).cast()));
        let bs = _mm256_loadu_si256(bp.add(16 * b).cast());
        // 32 · Σ_s sc_s · Σ qx over the 16 values of scale s: the codes' offset.
        let offset = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5);
        let mut isum = _mm256_setzero_si256();
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
            let x = xp.add(256 * b + 128 * n);
            for (v, q) in [q1, q2, q3, q4].into_iter().enumerate() {
                let v = v as i32;
                isum = dot_us_scaled::<VNNI>(
                    isum,
                    q,
                    loadx(x.add(32 * v as usize)),
                    _mm256_shuffle_epi8(scales, pick(2 * v, 2 * v + 1)),
                );
            }
        }
        isum = _mm256_sub_epi32(isum, offset);
        acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(d), acc);
    }
    hsum(acc)
}

/// Defines the AVX2 and the VNNI compilation of each generic kernel.
macro_rules! compile {
    ($($avx2:ident = $f_avx2:path, $vnni:ident = $f_vnni:path;)*) => {$(
        /// The AVX2 kernel.
        ///
        /// # Safety
        /// The CPU has AVX2, FMA and F16C; `w` holds the blocks of one row of `k` values and
        /// `a` one activation row of the same `k`.
        #[target_feature(enable = "avx2,fma,f16c")]
        pub(super) unsafe fn $avx2(w: &[u8], a: &ActRow<'_>) -> f32 {
            $f_avx2(w, a)
        }
        /// The AVX-512 VNNI kernel.
        ///
        /// # Safety
        /// The CPU has AVX-512 F, BW, VL and VNNI, AVX2, FMA and F16C; as the AVX2 kernel.
        #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
        pub(super) unsafe fn $vnni(w: &[u8], a: &ActRow<'_>) -> f32 {
            $f_vnni(w, a)
        }
    )*};
}

compile! {
    q4_0_avx2 = blocks32::<Q4_0, false>, q4_0_vnni = blocks32::<Q4_0, true>;
    q4_1_avx2 = blocks32::<Q4_1, false>, q4_1_vnni = blocks32::<Q4_1, true>;
    q5_0_avx2 = blocks32::<Q5_0, false>, q5_0_vnni = blocks32::<Q5_0, true>;
    q5_1_avx2 = blocks32::<Q5_1, false>, q5_1_vnni = blocks32::<Q5_1, true>;
    q8_0_avx2 = blocks32::<Q8_0, false>, q8_0_vnni = blocks32::<Q8_0, true>;
    q4_k_avx2 = q45_k::<false, false>, q4_k_vnni = q45_k::<true, false>;
    q5_k_avx2 = q45_k::<false, true>, q5_k_vnni = q45_k::<true, true>;
    q6_k_avx2 = q6_k::<false>, q6_k_vnni = q6_k::<true>;
}
