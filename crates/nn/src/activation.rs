//! The activation functions HF configs name in `hidden_act` / `hidden_activation`: one enum,
//! [`ipfs_accelerate_core::EncoderActivation`] (which the trunk descriptions and the engines
//! read), applied to burn tensors through [`ActivationForward`].

use burn::tensor::{activation, backend::Backend, Tensor};

/// An activation function, parsed from HF's `hidden_act` strings.
pub use ipfs_accelerate_core::EncoderActivation as Activation;

/// An activation applied to burn tensors.
pub trait ActivationForward {
    /// Applies the activation element-wise.
    fn forward<B: Backend, const D: usize>(self, x: Tensor<B, D>) -> Tensor<B, D>;
}

impl ActivationForward for Activation {
    fn forward<B: Backend, const D: usize>(self, x: Tensor<B, D>) -> Tensor<B, D> {
        let x = match crate::fast::activation(x, self) {
            Ok(y) => return y,
            Err(x) => x,
        };
        match self {
            Activation::Gelu => activation::gelu(x),
            Activation::GeluTanh => activation::gelu_approximate(x),
            Activation::QuickGelu => x.clone() * activation::sigmoid(x * 1.702),
            Activation::Relu => activation::relu(x),
            Activation::Relu6 => x.clamp(0.0, 6.0),
            Activation::Silu => activation::silu(x),
            Activation::Sigmoid => activation::sigmoid(x),
            Activation::Tanh => activation::tanh(x),
            Activation::Mish => activation::mish(x),
            Activation::Identity => x,
        }
    }
}
