//! The activation functions HF configs name in `hidden_act` / `hidden_activation`.

use std::str::FromStr;

use burn::tensor::{activation, backend::Backend, Tensor};
use ipfs_accelerate_core::Error;

/// An activation function, parsed from HF's `hidden_act` strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(try_from = "String")]
pub enum Activation {
    /// Exact GELU with erf (`gelu`, `gelu_python`).
    Gelu,
    /// GELU with the tanh approximation (`gelu_new`, `gelu_pytorch_tanh`, `gelu_fast`, `gelu_accurate`).
    GeluTanh,
    /// `x * sigmoid(1.702 x)` (CLIP's `quick_gelu`).
    QuickGelu,
    /// `max(0, x)`.
    Relu,
    /// `min(max(0, x), 6)`.
    Relu6,
    /// `x * sigmoid(x)` (`silu`, `swish`).
    Silu,
    /// Logistic sigmoid.
    Sigmoid,
    /// Hyperbolic tangent.
    Tanh,
    /// `x * tanh(softplus(x))`.
    Mish,
    /// Identity (`linear`).
    Identity,
}

impl FromStr for Activation {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "gelu" | "gelu_python" => Activation::Gelu,
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" | "gelu_accurate" => {
                Activation::GeluTanh
            }
            "quick_gelu" => Activation::QuickGelu,
            "relu" => Activation::Relu,
            "relu6" => Activation::Relu6,
            "silu" | "swish" => Activation::Silu,
            "sigmoid" => Activation::Sigmoid,
            "tanh" => Activation::Tanh,
            "mish" => Activation::Mish,
            "linear" => Activation::Identity,
            other => {
                return Err(Error::InvalidInput(format!(
                    "unsupported activation `{other}`"
                )))
            }
        })
    }
}

impl TryFrom<String> for Activation {
    type Error = String;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse().map_err(|e: Error| e.to_string())
    }
}

impl Activation {
    /// Applies the activation element-wise.
    pub fn forward<B: Backend, const D: usize>(self, x: Tensor<B, D>) -> Tensor<B, D> {
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
