//! Dense linear layers with PyTorch weight layout on disk.

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::Result;

use crate::quant::LinearWeight;
use crate::ActivationForward;
use crate::{Activation, VarBuilder, WeightQuantization};

/// `y = x Wᵀ + b`, loaded from PyTorch's `weight` `[out, in]` and `bias` `[out]`.
/// A float weight is kept as `[in, out]` so the matmul reads it row-major; a quantized one as
/// [`LinearWeight`] describes.
#[derive(Debug, Clone)]
pub struct Linear<B: Backend> {
    weight: LinearWeight<B>,
    bias: Option<Tensor<B, 1>>,
}

impl<B: Backend> Linear<B> {
    /// Loads `weight` (and `bias` when `bias` is true) under `vb`, kept as the builder's
    /// [`VarBuilder::quantization`] asks (float when the in-features are not a multiple of its
    /// block size; [`VarBuilder::weights`] counts those layers).
    pub fn load(vb: &VarBuilder<B>, in_dim: usize, out_dim: usize, bias: bool) -> Result<Self> {
        let weight = vb.linear_weight("weight", in_dim, out_dim)?;
        let bias = if bias {
            Some(vb.tensor("bias", [out_dim])?)
        } else {
            None
        };
        Ok(Linear { weight, bias })
    }

    /// From a PyTorch-layout weight `[out, in]` and optional bias (kept float).
    pub fn from_tensors(weight_out_in: Tensor<B, 2>, bias: Option<Tensor<B, 1>>) -> Self {
        Linear {
            weight: LinearWeight::float(weight_out_in),
            bias,
        }
    }

    /// From a weight as kept (shared, not copied) and an optional bias `[out]`: a tied output
    /// projection on an embedding's ggml blocks ([`crate::Embedding::tied_head`]).
    pub fn from_weight(weight: LinearWeight<B>, bias: Option<Tensor<B, 1>>) -> Self {
        Linear { weight, bias }
    }

    /// Keeps the weight quantized in memory as `q` from now on (from float weights; see
    /// [`crate::quant`] for the formats). In-features that are not a multiple of the block size,
    /// or a layer that is already quantized, are errors.
    pub fn quantize(&mut self, q: WeightQuantization) -> Result<()> {
        self.weight = self.weight.quantized(q)?;
        Ok(())
    }

    /// How the weight is kept in memory.
    pub fn quantization(&self) -> WeightQuantization {
        self.weight.quantization()
    }

    /// The weight as kept.
    pub fn weight(&self) -> &LinearWeight<B> {
        &self.weight
    }

    /// The bias `[out]`, when the layer has one.
    pub fn bias(&self) -> Option<&Tensor<B, 1>> {
        self.bias.as_ref()
    }

    /// Bytes the weight and bias take in memory.
    pub fn weight_bytes(&self) -> usize {
        let bias = self
            .bias
            .as_ref()
            .map_or(0, |b| b.dims()[0] * b.dtype().size());
        self.weight.bytes() + bias
    }

    /// Output features.
    pub fn out_dim(&self) -> usize {
        self.weight.out_dim()
    }

    /// Applies the layer over the last dimension of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.forward_fused(x, None, None)
    }

    /// `act(self.forward(x))`, with the activation applied in the layer's output pass on the
    /// CPU backend (see [`crate::fast`]).
    pub fn forward_act<const D: usize>(&self, x: Tensor<B, D>, act: Activation) -> Tensor<B, D> {
        self.forward_fused(x, None, Some(act))
    }

    /// `self.forward(x) + residual` (a residual connection), with the add done in the layer's
    /// output pass on the CPU backend.
    pub fn forward_add<const D: usize>(
        &self,
        x: Tensor<B, D>,
        residual: Tensor<B, D>,
    ) -> Tensor<B, D> {
        self.forward_fused(x, Some(residual), None)
    }

    /// `act(x Wᵀ + b + residual)` over the last dimension of `x`.
    fn forward_fused<const D: usize>(
        &self,
        x: Tensor<B, D>,
        residual: Option<Tensor<B, D>>,
        act: Option<Activation>,
    ) -> Tensor<B, D> {
        let mut dims = x.dims();
        let in_dim = dims[D - 1];
        let rows = x.shape().num_elements() / in_dim.max(1);
        let x2: Tensor<B, 2> = x.reshape([rows, in_dim]);
        crate::gptq::observe(&self.weight, &x2);
        dims[D - 1] = self.out_dim();
        let residual = residual.map(|r| r.reshape([rows, self.out_dim()]));
        let (bias, res) = (self.bias.as_ref(), residual.as_ref());
        let packed = if let Some(w) = self.weight.ggml() {
            crate::fast::linear_ggml(&x2, w, bias, res, act)
        } else if let Some(w) = self.weight.packed_int8() {
            crate::fast::linear_int8(&x2, w, bias, res, act)
        } else if let Some(w) = self.weight.packed_bf16() {
            crate::fast::linear_bf16(&x2, w, bias, res, act)
        } else {
            None
        };
        if let Some(y) = packed {
            return y.reshape(dims);
        }
        let weight = self.weight.matrix();
        let fused = crate::fast::linear(&x2, &weight, self.bias.as_ref(), residual.as_ref(), act);
        if let Some(y) = fused {
            return y.reshape(dims);
        }
        let mut y = crate::exact::linear(x2, weight, self.bias.clone());
        if let Some(r) = residual {
            y = y + r;
        }
        if let Some(act) = act {
            y = act.forward(y);
        }
        y.reshape(dims)
    }
}
