//! Dense linear layers with PyTorch weight layout on disk.

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::{Error, Result};

use crate::{VarBuilder, WeightQuantization};

/// `y = x Wᵀ + b`, loaded from PyTorch's `weight` `[out, in]` and `bias` `[out]`.
/// The weight is kept as `[in, out]` so the matmul reads it row-major.
#[derive(Debug, Clone)]
pub struct Linear<B: Backend> {
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
    quantization: WeightQuantization,
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
        Linear {
            weight,
            bias,
            quantization: WeightQuantization::None,
        }
    }

    /// Keeps the weight quantized in memory as `q` (from float weights; the backend dequantizes it
    /// when the layer runs). Blocks run over consecutive weights of the stored `[in, out]` layout.
    /// A weight count that is not a multiple of the block size is an error.
    pub fn quantize(&mut self, q: WeightQuantization) -> Result<()> {
        q.validate()?;
        if self.quantization != WeightQuantization::None {
            return Err(Error::InvalidInput(
                "the layer is already quantized: quantize float weights only".into(),
            ));
        }
        let Some(scheme) = q.scheme() else {
            return Ok(());
        };
        let n = self.weight.shape().num_elements();
        if !n.is_multiple_of(q.block_size()) {
            return Err(Error::InvalidInput(format!(
                "a linear weight of {n} values is not a multiple of the quantization block size {}",
                q.block_size()
            )));
        }
        self.weight = self.weight.clone().quantize_dynamic(&scheme);
        self.quantization = q;
        Ok(())
    }

    /// How the weight is kept in memory.
    pub fn quantization(&self) -> WeightQuantization {
        self.quantization
    }

    /// Bytes the weight and bias take in memory.
    pub fn weight_bytes(&self) -> usize {
        let bias = self.bias.as_ref().map_or(0, |b| b.dims()[0] * 4);
        self.quantization.bytes(self.weight.shape().num_elements()) + bias
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
