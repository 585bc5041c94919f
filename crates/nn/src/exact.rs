//! Full-f32 products on backends whose f32 matrix kernels round their inputs to TF32.
//!
//! CubeCL's CUDA matmul and convolution kernels run f32 inputs through the tensor cores as TF32
//! (10 mantissa bits; Ampere and later), which moves some models' outputs by up to a few percent
//! (T5's unscaled attention, DETR's ResNet). HF transformers computes in true f32 (PyTorch's
//! `allow_tf32` is off by default for matmuls). On a backend registered with
//! [`split_f32_products`], every product this module computes is split the way cuBLAS's 3xTF32
//! mode does it: `a = a_hi + a_lo` with `a_hi` exact in TF32 (rounded through bf16) and
//! `a ≈ a_hi + a_lo` to ~2⁻¹⁹, then `a·b ≈ a_hi·b_hi + a_hi·b_lo + a_lo·b_hi`. The dropped
//! `a_lo·b_lo` term is ~2⁻¹⁸ of the product, so the result is as close to f32 as the unsplit
//! kernel is to TF32, for three tensor-core passes (still faster than one f32 SIMT pass).
//!
//! Every other backend (and f16 / bf16 tensors anywhere) takes the plain product: one check of
//! an atomic flag.

use std::any::TypeId;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

use burn::tensor::backend::Backend;
use burn::tensor::ops::ConvOptions;
use burn::tensor::{DType, Tensor};

/// Whether any backend type is registered (the fast path for every other backend).
static ANY: AtomicBool = AtomicBool::new(false);
/// The registered burn backend types.
static SPLIT: RwLock<Vec<TypeId>> = RwLock::new(Vec::new());

/// Makes every f32 product of this module on the burn backend `B` a split (3-pass) product for
/// the rest of the process. Idempotent.
pub fn split_f32_products<B: Backend>() {
    let id = TypeId::of::<B>();
    let mut types = SPLIT.write().unwrap_or_else(|e| e.into_inner());
    if !types.contains(&id) {
        types.push(id);
    }
    ANY.store(true, Ordering::Release);
}

/// Whether f32 products on `B` are split ([`split_f32_products`]).
pub fn splits_f32_products<B: Backend>() -> bool {
    ANY.load(Ordering::Acquire)
        && SPLIT
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .contains(&TypeId::of::<B>())
}

/// Whether the product of `a` and `b` is to be split: both f32, on a registered backend.
fn splits<B: Backend, const DA: usize, const DB: usize>(
    a: &Tensor<B, DA>,
    b: &Tensor<B, DB>,
) -> bool {
    a.dtype() == DType::F32 && b.dtype() == DType::F32 && splits_f32_products::<B>()
}

/// `(hi, lo)` with `hi` exactly representable in TF32 (rounded to bf16's 8 mantissa bits, same
/// exponent range as f32) and `lo = t - hi` exact in f32.
fn split<B: Backend, const D: usize>(t: Tensor<B, D>) -> (Tensor<B, D>, Tensor<B, D>) {
    let hi = t.clone().cast(DType::BF16).cast(DType::F32);
    let lo = t - hi.clone();
    (hi, lo)
}

/// `f(a, b)` for a product `f` that is linear in each argument, as the three split products
/// `f(a_hi, b_hi) + f(a_hi, b_lo) + f(a_lo, b_hi)`.
fn split_product<B: Backend, const DA: usize, const DB: usize, const DO: usize>(
    a: Tensor<B, DA>,
    b: Tensor<B, DB>,
    f: impl Fn(Tensor<B, DA>, Tensor<B, DB>) -> Tensor<B, DO>,
) -> Tensor<B, DO> {
    let (a_hi, a_lo) = split(a);
    let (b_hi, b_lo) = split(b);
    f(a_hi.clone(), b_hi.clone()) + f(a_hi, b_lo) + f(a_lo, b_hi)
}

/// `a.matmul(b)` (batched over the leading dimensions), in full f32 on a registered backend.
pub fn matmul<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
    if !splits(&a, &b) {
        return a.matmul(b);
    }
    split_product(a, b, |a, b| a.matmul(b))
}

/// burn's `module::linear` (`x Wᵀ + bias`, `weight` is `[in, out]`), in full f32 on a registered
/// backend.
pub fn linear<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, D> {
    if !splits(&x, &weight) {
        return burn::tensor::module::linear(x, weight, bias);
    }
    let y = split_product(x, weight, |x, w| burn::tensor::module::linear(x, w, None));
    match bias {
        Some(b) => y + b.unsqueeze(),
        None => y,
    }
}

/// burn's `module::conv1d`, in full f32 on a registered backend.
pub fn conv1d<B: Backend>(
    x: Tensor<B, 3>,
    weight: Tensor<B, 3>,
    bias: Option<Tensor<B, 1>>,
    options: ConvOptions<1>,
) -> Tensor<B, 3> {
    if !splits(&x, &weight) {
        return burn::tensor::module::conv1d(x, weight, bias, options);
    }
    let y = split_product(x, weight, |x, w| {
        burn::tensor::module::conv1d(x, w, None, options.clone())
    });
    add_channel_bias(y, bias)
}

/// burn's `module::conv2d`, in full f32 on a registered backend.
pub fn conv2d<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    bias: Option<Tensor<B, 1>>,
    options: ConvOptions<2>,
) -> Tensor<B, 4> {
    if !splits(&x, &weight) {
        return burn::tensor::module::conv2d(x, weight, bias, options);
    }
    add_channel_bias(
        split_product(x, weight, |x, w| {
            burn::tensor::module::conv2d(x, w, None, options.clone())
        }),
        bias,
    )
}

/// `y + bias` with `bias` over `y`'s channel dimension (dimension 1).
fn add_channel_bias<B: Backend, const D: usize>(
    y: Tensor<B, D>,
    bias: Option<Tensor<B, 1>>,
) -> Tensor<B, D> {
    let Some(bias) = bias else { return y };
    let mut shape = [1; D];
    shape[1] = bias.dims()[0];
    y + bias.reshape(shape)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;
    use burn_flex::Flex;

    /// The split is exact: hi + lo == t, and hi has at most 8 significant mantissa bits.
    #[test]
    fn split_parts_add_up_and_hi_fits_tf32() {
        let v: Vec<f32> = (0..64)
            .map(|i| (i as f32 * 0.37).exp().sin() * 7.1)
            .collect();
        let t = Tensor::<Flex, 1>::from_data(TensorData::new(v, [64]), &Default::default());
        let (hi, lo) = split(t.clone());
        let back: Vec<f32> = (hi.clone() + lo).into_data().to_vec().unwrap();
        let want: Vec<f32> = t.into_data().to_vec().unwrap();
        assert_eq!(back, want);
        for h in hi.into_data().to_vec::<f32>().unwrap() {
            assert_eq!(
                h.to_bits() & 0xffff,
                0,
                "{h} has more than bf16's mantissa bits"
            );
        }
    }
}
