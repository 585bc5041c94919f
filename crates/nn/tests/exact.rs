//! The split (3xTF32-style) products of `nn::exact` on a registered backend: in a process of their
//! own, because registering burn-flex makes every other product of the process split too.

use burn::tensor::ops::ConvOptions;
use burn::tensor::{Tensor, TensorData};
use burn_flex::Flex;
use ipfs_accelerate_nn::exact::{conv2d, linear, matmul, split_f32_products, splits_f32_products};

fn rand_tensor<const D: usize>(shape: [usize; D], seed: f32) -> Tensor<Flex, D> {
    let n: usize = shape.iter().product();
    let v: Vec<f32> = (0..n)
        .map(|i| ((i as f32 * 0.7311 + seed).sin() * 1e3).fract() * 3.0)
        .collect();
    Tensor::from_data(TensorData::new(v, shape), &Default::default())
}

fn close(x: Vec<f32>, y: Vec<f32>) {
    assert_eq!(x.len(), y.len());
    for (p, q) in x.iter().zip(&y) {
        assert!((p - q).abs() <= 1e-4 * (1.0 + q.abs()), "{p} vs {q}");
    }
}

/// burn-flex computes true f32, so the split products and the plain ones are both f32 products:
/// they agree to f32 rounding (the split only reorders the sums).
#[test]
fn split_products_match_plain_products() {
    let a = rand_tensor([2, 5, 7], 0.1);
    let b = rand_tensor([2, 7, 3], 0.2);
    let x = rand_tensor([2, 3, 6, 6], 0.4);
    let w = rand_tensor([4, 3, 3, 3], 0.5);
    let bias = rand_tensor([4], 0.6);
    let lw = rand_tensor([7, 3], 0.7);
    let lb = rand_tensor([3], 0.8);
    let opts = ConvOptions::new([1, 1], [1, 1], [1, 1], 1);
    let plain_mm = a.clone().matmul(b.clone());
    let plain_conv =
        burn::tensor::module::conv2d(x.clone(), w.clone(), Some(bias.clone()), opts.clone());
    let plain_linear = burn::tensor::module::linear(a.clone(), lw.clone(), Some(lb.clone()));
    assert!(!splits_f32_products::<Flex>());
    split_f32_products::<Flex>();
    assert!(splits_f32_products::<Flex>());
    close(
        matmul(a.clone(), b).into_data().to_vec().unwrap(),
        plain_mm.into_data().to_vec().unwrap(),
    );
    close(
        conv2d(x, w, Some(bias), opts).into_data().to_vec().unwrap(),
        plain_conv.into_data().to_vec().unwrap(),
    );
    close(
        linear(a, lw, Some(lb)).into_data().to_vec().unwrap(),
        plain_linear.into_data().to_vec().unwrap(),
    );
}
