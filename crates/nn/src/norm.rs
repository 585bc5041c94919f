//! Normalisation layers.

use burn::tensor::{backend::Backend, DType, Tensor, TensorPrimitive};
use ipfs_accelerate_core::Result;

use crate::{Activation, ActivationForward, VarBuilder};

/// Layer normalisation over the last dimension (biased variance, `eps` inside the square root),
/// computed by the backend's fused kernel.
#[derive(Debug, Clone)]
pub struct LayerNorm<B: Backend> {
    gamma: Tensor<B, 1>,
    beta: Option<Tensor<B, 1>>,
    eps: f64,
}

impl<B: Backend> LayerNorm<B> {
    /// Loads `weight` and `bias` of size `dim` under `vb`.
    pub fn load(vb: &VarBuilder<B>, dim: usize, eps: f64) -> Result<Self> {
        Ok(LayerNorm {
            gamma: vb.tensor("weight", [dim])?,
            beta: Some(vb.tensor("bias", [dim])?),
            eps,
        })
    }

    /// Normalises `x` over its last dimension.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        Tensor::from_primitive(TensorPrimitive::Float(B::layer_norm(
            x.into_primitive().tensor(),
            self.gamma.clone().into_primitive().tensor(),
            self.beta.clone().map(|b| b.into_primitive().tensor()),
            self.eps,
        )))
    }

    /// Normalises each channel of channels-last `x` `[batch, length, channels]` over its frames,
    /// scales and shifts it by that channel's weight and bias, then applies `act`: a GroupNorm of
    /// one group per channel (Wav2Vec2's first feature convolution, [`crate::conv::GroupNorm`]'s
    /// arithmetic), held as this norm's `channels`-wide weights and epsilon. One kernel on the
    /// CPU backend (`kernels::channel_norm`: the statistics, then the scale, shift and
    /// activation in place).
    pub fn forward_channels(&self, x: Tensor<B, 3>, act: Activation) -> Tensor<B, 3> {
        let x = match crate::fast::channel_norm(
            x,
            &self.gamma,
            self.beta.as_ref(),
            self.eps,
            Some(act),
        ) {
            Ok(y) => return y,
            Err(x) => x,
        };
        let channels = self.gamma.dims()[0];
        let channels_first = x.swap_dims(1, 2);
        let y = crate::conv::group_norm(
            channels_first,
            channels,
            Some(&self.gamma),
            self.beta.as_ref(),
            self.eps,
        );
        act.forward(y.swap_dims(1, 2))
    }
}

/// Root-mean-square normalisation (LLaMA, T5): `x / sqrt(mean(x²) + eps) * weight`, computed in f32.
#[derive(Debug, Clone)]
pub struct RmsNorm<B: Backend> {
    weight: Tensor<B, 1>,
    eps: f64,
}

impl<B: Backend> RmsNorm<B> {
    /// Loads `weight` of size `dim` under `vb`.
    pub fn load(vb: &VarBuilder<B>, dim: usize, eps: f64) -> Result<Self> {
        Ok(RmsNorm {
            weight: vb.tensor("weight", [dim])?,
            eps,
        })
    }

    /// Normalises `x` over its last dimension. In f16 / bf16 the statistic and the division run
    /// in f32 and the result is cast back before the weight (as HF's LLaMA and T5 norms: `x²`
    /// overflows f16 above 256).
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let dtype = x.dtype();
        let narrow = matches!(dtype, DType::F16 | DType::BF16);
        let x = if narrow { x.cast(DType::F32) } else { x };
        let rms = x
            .clone()
            .powi_scalar(2)
            .mean_dim(D - 1)
            .add_scalar(self.eps)
            .sqrt();
        let normed = x.div(rms);
        let normed = if narrow { normed.cast(dtype) } else { normed };
        normed.mul(self.weight.clone().unsqueeze::<D>())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;
    use burn_flex::Flex;

    /// The CPU's fused per-channel norm (channels last) against GroupNorm's arithmetic on the
    /// channels-first view.
    #[test]
    fn the_channel_norm_matches_group_norm() {
        let dev = Default::default();
        let (batch, length, channels) = (2, 33, 6);
        let v = |n: usize, s: usize| -> Vec<f32> {
            (0..n)
                .map(|i| ((i * 13 + s) % 23) as f32 * 0.2 - 1.5)
                .collect()
        };
        let norm = LayerNorm::<Flex> {
            gamma: Tensor::from_data(TensorData::new(v(channels, 1), [channels]), &dev),
            beta: Some(Tensor::from_data(
                TensorData::new(v(channels, 2), [channels]),
                &dev,
            )),
            eps: 1e-5,
        };
        let x = Tensor::<Flex, 3>::from_data(
            TensorData::new(v(batch * length * channels, 3), [batch, length, channels]),
            &dev,
        );
        let got = norm.forward_channels(x.clone(), Activation::Gelu);
        let want = crate::conv::group_norm(
            x.swap_dims(1, 2),
            channels,
            Some(&norm.gamma),
            norm.beta.as_ref(),
            norm.eps,
        );
        let want = Activation::Gelu.forward(want.swap_dims(1, 2));
        let diff = (got - want).abs().max().into_scalar();
        assert!(diff < 1e-5, "{diff}");
    }
}
