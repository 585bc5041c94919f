//! Linear layers on ggml (GGUF) weights kept in their quantized block layout, as llama.cpp runs
//! them: no f32 copy of the weight is ever built.
//!
//! - **Dot path** (decode): each activation row is quantized to int8 per block of 32 values
//!   (the 32-value formats, like ggml's Q8_0) or of 256 (the k-quants, like Q8_K), and each
//!   output is a sum of exact integer dot products per block, scaled once per block; AVX-512
//!   VNNI, AVX2 or portable kernels chosen at run time ([`Int8Isa`]), rayon over chunks of output
//!   rows. Every weight byte is read once and streamed (the memory-bound GEMV of token
//!   generation); eight weight rows share the float work of a block, and up to four activation
//!   rows share each decoded weight block. Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K,
//!   Q6_K, IQ4_NL and IQ4_XS have integer kernels; the others (F32, F16, BF16, Q8_1, Q8_K)
//!   dequantize one weight row at a time into a small f32 scratch and take f32 dot products.
//! - **Panel path** (prefill): panels of weight rows are dequantized to f32 into an L2-sized
//!   scratch and multiplied with every activation row by the f32 matrix multiply; the whole f32
//!   weight is never built.
//!
//! [`GgmlPath::Auto`] takes the panels from [`PANEL_MIN_ROWS`] rows for formats with SIMD
//! integer kernels (on a Zen 4 / 5 core the VNNI dot path measured as fast as the f32 gemm up
//! to 256 rows for Q8_0 / Q5_0 and 1.5–2× faster for Q4_K / Q6_K), from
//! [`PANEL_MIN_ROWS_FLOAT`] for the others.
//!
//! The only error of the decode path next to the f32 product of the dequantized weight is the
//! rounding of the activations: at most half a step (`d_b / 2`, `d_b = max|x| / 127` over the
//! value's block) per value, so `|y - x·w| <= Σ_i |w_i|·d_b(i) / 2` up to f32 rounding.

mod act;
mod dot;
mod format;
mod quantize;
#[cfg(test)]
mod tests;
#[cfg(target_arch = "x86_64")]
mod x86;

use rayon::prelude::*;

pub use format::{bf16_to_f32, dequantize_row, f16_to_f32, BlockType, GgmlBlocks, GgmlError, QK_K};
pub use quantize::{quantize_row, QUANTIZED_FORMATS};

use crate::linear::{finish_rows, Epilogue};
use crate::qlinear::OutPtr;
use crate::Int8Isa;
use act::{ActRow, QuantActs};

/// How [`linear_ggml_with`] runs the product.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GgmlPath {
    /// Dot products for few rows, dequantized panels and the f32 matrix multiply for many.
    #[default]
    Auto,
    /// Dot products of each weight row with each activation row (integer where the format has
    /// an integer kernel).
    Dot,
    /// Dequantized panels of weight rows and the f32 matrix multiply.
    Panels,
}

/// Rows from which [`GgmlPath::Auto`] takes the dequantized panels for formats with SIMD
/// integer kernels.
pub const PANEL_MIN_ROWS: usize = 256;

/// Rows from which [`GgmlPath::Auto`] takes the dequantized panels for the other formats (and
/// without SIMD kernels), whose dot path is an f32 dot product per row.
pub const PANEL_MIN_ROWS_FLOAT: usize = 8;

/// Dot products of every weight row `j` of `w` (`stride` bytes each) with every quantized
/// activation row `a`, into `out[a·ostride + j]`.
///
/// # Safety
/// The CPU runs the kernel; `w` holds whole rows, each the blocks of `k` values; the activation
/// rows hold `k` codes quantized for the format's activation block; `out + a·ostride + j` is
/// writable for every a and j.
type DotFn = unsafe fn(&[u8], usize, &[ActRow<'_>], *mut f32, usize);

/// Whether this CPU runs the ggml kernels of `isa` (the int8 check and F16C / FMA).
fn isa_available(isa: Int8Isa) -> bool {
    if !isa.available() {
        return false;
    }
    match isa {
        Int8Isa::Scalar => true,
        // No ggml block format has an AMX kernel: the VNNI ones run on AMX CPUs.
        Int8Isa::Amx => false,
        #[cfg(target_arch = "x86_64")]
        Int8Isa::Avx2 | Int8Isa::Avx512Vnni => {
            std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("f16c")
                && (isa == Int8Isa::Avx2
                    || std::arch::is_x86_feature_detected!("avx512vl")
                        && std::arch::is_x86_feature_detected!("avx512bw"))
        }
        #[cfg(not(target_arch = "x86_64"))]
        _ => false,
    }
}

/// The widest ggml kernel set this CPU runs (what [`linear_ggml`] uses; the int8 check of
/// [`Int8Isa::available`] plus F16C and FMA, and AVX-512 VL / BW for the VNNI kernels).
pub fn ggml_isa() -> Int8Isa {
    *Int8Isa::ALL
        .iter()
        .rev()
        .find(|isa| isa_available(**isa))
        .unwrap_or(&Int8Isa::Scalar)
}

/// The integer kernel of `ty` for `isa` and the block its activations are quantized in; `None`
/// for formats without one.
fn dot_kernel(ty: BlockType, isa: Int8Isa) -> Option<(DotFn, usize)> {
    #[cfg(target_arch = "x86_64")]
    {
        let pick = |avx2: DotFn, vnni: DotFn| match isa {
            Int8Isa::Avx512Vnni => Some(vnni),
            Int8Isa::Avx2 => Some(avx2),
            Int8Isa::Scalar | Int8Isa::Amx => None,
        };
        let simd = match ty {
            BlockType::Q4_0 => pick(x86::q4_0_avx2, x86::q4_0_vnni),
            BlockType::Q4_1 => pick(x86::q4_1_avx2, x86::q4_1_vnni),
            BlockType::Q5_0 => pick(x86::q5_0_avx2, x86::q5_0_vnni),
            BlockType::Q5_1 => pick(x86::q5_1_avx2, x86::q5_1_vnni),
            BlockType::Q8_0 => pick(x86::q8_0_avx2, x86::q8_0_vnni),
            BlockType::Q4_K => pick(x86::q4_k_avx2, x86::q4_k_vnni),
            BlockType::Q5_K => pick(x86::q5_k_avx2, x86::q5_k_vnni),
            BlockType::Q6_K => pick(x86::q6_k_avx2, x86::q6_k_vnni),
            BlockType::Q2_K => pick(x86::q2_k_avx2, x86::q2_k_vnni),
            BlockType::Q3_K => pick(x86::q3_k_avx2, x86::q3_k_vnni),
            BlockType::IQ4_NL => pick(x86::iq4_nl_avx2, x86::iq4_nl_vnni),
            BlockType::IQ4_XS => pick(x86::iq4_xs_avx2, x86::iq4_xs_vnni),
            _ => None,
        };
        if let Some(f) = simd {
            return Some((f, ty.block_size()));
        }
    }
    let scalar: DotFn = match ty {
        BlockType::Q4_0 => dot::q4_0_rows,
        BlockType::Q4_1 => dot::q4_1_rows,
        BlockType::Q5_0 => dot::q5_0_rows,
        BlockType::Q5_1 => dot::q5_1_rows,
        BlockType::Q8_0 => dot::q8_0_rows,
        BlockType::Q4_K => dot::q4_k_rows,
        BlockType::Q5_K => dot::q5_k_rows,
        BlockType::Q6_K => dot::q6_k_rows,
        BlockType::Q2_K => dot::q2_k_rows,
        BlockType::Q3_K => dot::q3_k_rows,
        BlockType::IQ4_NL => dot::iq4_nl_rows,
        BlockType::IQ4_XS => dot::iq4_xs_rows,
        _ => return None,
    };
    let _ = isa;
    Some((scalar, ty.block_size()))
}

multiversion! {
    /// `Σ a·b` in f32 (sixteen partial sums).
    fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let mut acc = [0f32; 16];
        let (ac, at) = a.as_chunks::<16>();
        let (bc, bt) = b.as_chunks::<16>();
        for (x, y) in ac.iter().zip(bc) {
            for i in 0..16 {
                acc[i] += x[i] * y[i];
            }
        }
        let mut s = at.iter().zip(bt).map(|(x, y)| x * y).sum::<f32>();
        for v in acc {
            s += v;
        }
        s
    }
}

/// `activation(x · Wᵀ + bias + residual)` (see [`Epilogue`]) for `x` `[rows, k]` and a ggml
/// weight `w` `[n, k]`; returns `[rows, n]`. The widest kernels this CPU runs, the path chosen
/// by the number of rows (see the module documentation).
///
/// # Panics
/// When `k` is not the weight's or a slice's length does not match the shapes.
pub fn linear_ggml(
    x: &[f32],
    rows: usize,
    k: usize,
    w: &GgmlBlocks<'_>,
    epilogue: Epilogue<'_>,
) -> Vec<f32> {
    linear_ggml_run(x, rows, k, w, epilogue, ggml_isa(), GgmlPath::Auto)
}

/// As [`linear_ggml`] with the kernels of `isa` and the path `path`; `None` when this CPU lacks
/// `isa`.
///
/// # Panics
/// As [`linear_ggml`].
pub fn linear_ggml_with(
    x: &[f32],
    rows: usize,
    k: usize,
    w: &GgmlBlocks<'_>,
    epilogue: Epilogue<'_>,
    isa: Int8Isa,
    path: GgmlPath,
) -> Option<Vec<f32>> {
    isa_available(isa).then(|| linear_ggml_run(x, rows, k, w, epilogue, isa, path))
}

fn linear_ggml_run(
    x: &[f32],
    rows: usize,
    k: usize,
    w: &GgmlBlocks<'_>,
    epilogue: Epilogue<'_>,
    isa: Int8Isa,
    path: GgmlPath,
) -> Vec<f32> {
    let n = w.n();
    assert_eq!(k, w.k(), "linear_ggml: k is not the weight's");
    assert_eq!(x.len(), rows * k, "linear_ggml: input is not [rows, k]");
    assert!(
        epilogue.bias.is_none_or(|b| b.len() == n),
        "linear_ggml: bias is not [n]"
    );
    assert!(
        epilogue.residual.is_none_or(|r| r.len() == rows * n),
        "linear_ggml: residual is not [rows, n]"
    );
    let mut out = vec![0f32; rows * n];
    if rows == 0 || n == 0 {
        return out;
    }
    let panels = match path {
        GgmlPath::Auto => {
            let simd = isa != Int8Isa::Scalar && dot_kernel(w.ty(), isa).is_some();
            rows >= if simd {
                PANEL_MIN_ROWS
            } else {
                PANEL_MIN_ROWS_FLOAT
            }
        }
        GgmlPath::Dot => false,
        GgmlPath::Panels => true,
    };
    if k == 0 {
        finish(&mut out, 0, rows, 0, n, n, &epilogue);
    } else if panels {
        panel_product(x, rows, w, &mut out, &epilogue);
    } else {
        dot_product(x, rows, w, &mut out, &epilogue, isa);
    }
    out
}

/// Applies the epilogue to rows `r0..r1`, columns `c0..c1` of `out` (`[rows, n]`).
fn finish(out: &mut [f32], r0: usize, r1: usize, c0: usize, c1: usize, n: usize, e: &Epilogue) {
    if e.bias.is_none() && e.residual.is_none() && e.activation == Default::default() {
        return;
    }
    for r in r0..r1 {
        finish_rows(
            &mut out[r * n + c0..r * n + c1],
            c1 - c0,
            e.bias.map(|b| &b[c0..c1]),
            e.residual.map(|res| &res[r * n + c0..r * n + c1]),
            e.activation,
        );
    }
}

/// As [`finish`] through the shared output pointer.
///
/// # Safety
/// The rectangle lies in `out` (`[rows, n]`) and no other task touches it meanwhile.
unsafe fn finish_shared(
    out: OutPtr,
    r0: usize,
    r1: usize,
    c0: usize,
    c1: usize,
    n: usize,
    e: &Epilogue,
) {
    if e.bias.is_none() && e.residual.is_none() && e.activation == Default::default() {
        return;
    }
    for r in r0..r1 {
        let dst = std::slice::from_raw_parts_mut(out.at(r * n + c0), c1 - c0);
        finish_rows(
            dst,
            c1 - c0,
            e.bias.map(|b| &b[c0..c1]),
            e.residual.map(|res| &res[r * n + c0..r * n + c1]),
            e.activation,
        );
    }
}

/// Output rows per task of the dot path: a multiple of 8 (the kernels' row group), about 64 K
/// multiply-adds a task at least, and at least 4 tasks a thread when there is that much work.
fn dot_chunk(n: usize, k: usize, rows: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    let min_chunk = (crate::PARALLEL_THRESHOLD / (k * rows).max(1)).max(1);
    n.div_ceil(threads * 4)
        .max(min_chunk)
        .next_multiple_of(8)
        .min(n)
}

/// Weight rows the dot path takes through all activation rows at a time (they stay in L1 / L2
/// meanwhile; the kernels take four activation rows per pass over them).
const DOT_SUB_ROWS: usize = 32;

/// The dot path: each weight row against each activation row.
fn dot_product(
    x: &[f32],
    rows: usize,
    w: &GgmlBlocks<'_>,
    out: &mut [f32],
    e: &Epilogue,
    isa: Int8Isa,
) {
    let (n, k, rb) = (w.n(), w.k(), w.row_bytes());
    let kernel = dot_kernel(w.ty(), isa);
    let acts = kernel.map(|(_, block)| QuantActs::new(x, rows, k, block));
    let act_rows: Option<Vec<ActRow<'_>>> =
        acts.as_ref().map(|a| (0..rows).map(|r| a.row(r)).collect());
    let chunk = dot_chunk(n, k, rows);
    let data = w.data();
    let out_ptr = OutPtr(out.as_mut_ptr());
    let task = |scratch: &mut Vec<f32>, t: usize| {
        let (j0, j1) = (t * chunk, ((t + 1) * chunk).min(n));
        let mut s0 = j0;
        while s0 < j1 {
            // One activation row: the whole chunk at once (the kernels prefetch ahead in it).
            let s1 = if rows == 1 {
                j1
            } else {
                (s0 + DOT_SUB_ROWS).min(j1)
            };
            let sub = &data[s0 * rb..s1 * rb];
            if let (Some((f, _)), Some(act_rows)) = (kernel, &act_rows) {
                // SAFETY: the kernel was chosen for this CPU (`isa_available`); `sub` holds
                // s1 - s0 rows of rb bytes, each the blocks of k values (the shape was checked
                // by `GgmlBlocks::new`); the activations were quantized for this kernel with the
                // same k; it writes (r, s0..s1) for every activation row r, in this task's
                // columns j0..j1 of `out`, which no other task touches.
                unsafe { f(sub, rb, act_rows, out_ptr.at(s0), n) };
            } else {
                scratch.resize(k, 0.0);
                for (j, row) in (s0..s1).zip(sub.chunks_exact(rb)) {
                    format::dequantize_checked(w.ty(), row, scratch);
                    for r in 0..rows {
                        let v = dot_f32(scratch, &x[r * k..(r + 1) * k]);
                        // SAFETY: as above.
                        unsafe { *out_ptr.at(r * n + j) = v };
                    }
                }
            }
            s0 = s1;
        }
        // SAFETY: columns j0..j1 of every row are this task's alone.
        unsafe { finish_shared(out_ptr, 0, rows, j0, j1, n, e) };
    };
    let tasks = n.div_ceil(chunk);
    if tasks == 1 {
        task(&mut Vec::new(), 0);
    } else {
        (0..tasks)
            .into_par_iter()
            .for_each_init(Vec::new, |scratch, t| task(scratch, t));
    }
}

/// Weight rows per dequantized panel: about 256 K f32 values (1 MiB, about L2), a multiple of
/// 16 from 64 to 256.
fn panel_rows(k: usize) -> usize {
    ((262_144 / k.max(1)) / 16 * 16).clamp(64, 256)
}

/// The panel path: panels of weight rows dequantized to f32, multiplied with the activations by
/// gemm; tasks are panels × blocks of activation rows.
fn panel_product(x: &[f32], rows: usize, w: &GgmlBlocks<'_>, out: &mut [f32], e: &Epilogue) {
    let (n, k, rb) = (w.n(), w.k(), w.row_bytes());
    let np = panel_rows(k).min(n);
    let panels = n.div_ceil(np);
    let threads = rayon::current_num_threads().max(1);
    let row_tasks = if panels >= 2 * threads {
        1
    } else {
        (2 * threads).div_ceil(panels).min(rows.div_ceil(16)).max(1)
    };
    let row_block = rows.div_ceil(row_tasks);
    let row_tasks = rows.div_ceil(row_block);
    let data = w.data();
    let out_ptr = OutPtr(out.as_mut_ptr());
    let task = |scratch: &mut Vec<f32>, t: usize| {
        let (p, rt) = (t / row_tasks, t % row_tasks);
        let (j0, j1) = (p * np, ((p + 1) * np).min(n));
        let (r0, r1) = (rt * row_block, ((rt + 1) * row_block).min(rows));
        let m = j1 - j0;
        scratch.resize(m * k, 0.0);
        format::dequantize_checked(w.ty(), &data[j0 * rb..j1 * rb], &mut scratch[..m * k]);
        // SAFETY: dst is rows r0..r1, columns j0..j1 of `out` (`[rows, n]`, row stride n), this
        // task's alone; gemm writes every element of it without reading (`read_dst = false`);
        // lhs is rows r0..r1 of x (`[rows, k]`) and rhs the panel, element (i, j) at j·k + i.
        unsafe {
            gemm::gemm(
                r1 - r0,
                m,
                k,
                out_ptr.at(r0 * n + j0),
                1,
                n as isize,
                false,
                x.as_ptr().add(r0 * k),
                1,
                k as isize,
                scratch.as_ptr(),
                k as isize,
                1,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::None,
            );
            finish_shared(out_ptr, r0, r1, j0, j1, n, e);
        }
    };
    let tasks = panels * row_tasks;
    if tasks == 1 {
        task(&mut Vec::new(), 0);
    } else {
        (0..tasks)
            .into_par_iter()
            .for_each_init(Vec::new, |scratch, t| task(scratch, t));
    }
}
