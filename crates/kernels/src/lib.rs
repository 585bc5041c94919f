//! # ipfs-accelerate-kernels
//!
//! Vectorised f32 kernels for the CPU backend, on plain slices so they are independent of any
//! tensor library: exact (erf) and tanh GELU, SiLU, row softmax, a linear layer with
//! its bias, residual and activation fused into the matrix multiply's output pass, and scaled
//! dot-product attention over strided `[batch, heads, seq, dim]` views that writes the merged-head
//! layout directly; int8 linear layers ([`linear_int8`]) and linear layers on ggml / GGUF weights
//! kept in their quantized block layout ([`linear_ggml`] on a [`GgmlBlocks`] view, with the one
//! reference dequantisation of each block format, [`dequantize_row`]).
//!
//! Each element-wise kernel is written once as branch-free scalar code and compiled three times
//! (AVX-512, AVX2 + FMA, baseline); the widest version the CPU supports is chosen at run time, so
//! one binary runs everywhere. Matrix products go through the [`gemm`] crate (the same kernels
//! burn-flex uses). Transcendentals use polynomial approximations accurate to a few ulp
//! (`exp`: relative error < 2e-7; `erf`: absolute error < 1.5e-7, Abramowitz & Stegun 7.1.26,
//! the formula PyTorch's vectorised `erf` uses).
//!
//! ```
//! let mut x = vec![-1.0f32, 0.0, 1.0, 2.0];
//! ipfs_accelerate_kernels::gelu_erf(&mut x);
//! assert!((x[2] - 0.841_344_7).abs() < 1e-6);
//! ```

/// Defines `pub fn $name(args)` that runs `$body` compiled for the widest vector extension the
/// CPU has (AVX-512, else AVX2 + FMA, else the baseline target), chosen at run time.
macro_rules! multiversion {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) $(-> $ret)? {
            #[inline(always)]
            fn body($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f,avx512vl,avx512dq,avx512bw,avx2,fma,bmi2")]
                unsafe fn avx512($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2,fma,bmi2")]
                unsafe fn avx2($($arg: $ty),*) $(-> $ret)? {
                    body($($arg),*)
                }
                if std::arch::is_x86_feature_detected!("avx512f") {
                    // SAFETY: the CPU supports every feature `avx512` is compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the CPU supports every feature `avx2` is compiled for.
                    return unsafe { avx2($($arg),*) };
                }
            }
            body($($arg),*)
        }
    };
}

mod aligned;
mod amx;
mod attention;
mod bf16linear;
mod conv;
mod ggml;
mod linear;
mod math;
mod qlinear;

pub use amx::{amx_support, AmxSupport};
pub use attention::{attention, StridedView};
pub use bf16linear::{linear_bf16, round_bf16, Bf16Isa, PackedBf16};
pub use conv::{channel_norm, conv1d, conv2d, Conv1d, Conv2d};
pub use ggml::{
    bf16_to_f32, dequantize_row, f16_to_f32, ggml_isa, linear_ggml, linear_ggml_with, BlockType,
    GgmlBlocks, GgmlError, GgmlPath, PANEL_MIN_ROWS, PANEL_MIN_ROWS_FLOAT, QK_K,
};
pub use ggml::{quantize_row, QUANTIZED_FORMATS};
pub use linear::{linear, Epilogue, EpilogueActivation};
pub use math::{exp, gelu_erf, gelu_tanh, quick_gelu, silu, softmax_rows};
pub use qlinear::{linear_int8, Int8Isa, PackedInt8};

/// Work (multiply-adds) below which a kernel runs on the calling thread.
const PARALLEL_THRESHOLD: usize = 1 << 16;
