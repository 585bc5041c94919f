//! Dense linear layers with PyTorch weight layout on disk.

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::Result;

use crate::VarBuilder;

/// `y = x Wᵀ + b`, loaded from PyTorch's `weight` `[out, in]` and `bias` `[out]`.
/// The weight is kept as `[in, out]` so the matmul reads it row-major.
#[derive(Debug, Clone)]
pub struct Linear<B: Backend> {
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
}

impl<B: Backend> Linear<B> {
    /// Loads `weight` (and `bias` when `bias` is true) under `vb`.
    pub fn load(vb: &VarBuilder<B>, in_dim: usize, out_dim: usize, bias: bool) -> Result<Self> {
        let weight = vb.tensor("weight", [out_dim, in_dim])?;
        let bias = if bias {
            Some(vb.tensor("bias", [out_dim])?)
        } else {
            None
        };
        Ok(Self::from_tensors(weight, bias))
    }

    /// From a PyTorch-layout weight `[out, in]` and optional bias.
    pub fn from_tensors(weight_out_in: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Self {
        let weight = weight_out_in.transpose();
        // Materialise the transposed layout once so every forward reads contiguous memory.
        let weight = Tensor::from_data(weight.to_data(), &weight.device());
        Linear { weight, bias }
    }

    /// Output features.
    pub fn out_dim(&self) -> usize {
        self.weight.dims()[1]
    }

    /// Applies the layer over the last dimension of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let mut dims = x.dims();
        let in_dim = dims[D - 1];
        let rows = x.shape().num_elements() / in_dim.max(1);
        let x2: Tensor<B, 2> = x.reshape([rows, in_dim]);
        let y = burn::tensor::module::linear(x2, self.weight.clone(), self.bias.clone());
        dims[D - 1] = self.out_dim();
        y.reshape(dims)
    }
}
