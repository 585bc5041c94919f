//! Convolutions and the normalisations that sit next to them in CNN-style blocks.
//!
//! - [`Conv1d`] / [`Conv2d`]: PyTorch's `nn.Conv1d` / `nn.Conv2d` (stride, symmetric zero padding,
//!   dilation, groups, optional bias) over burn's `conv1d` / `conv2d`, loaded from the PyTorch
//!   weight layout `[out, in / groups, k...]`.
//! - [`FrozenBatchNorm`]: batch norm with fixed running statistics (`nn.BatchNorm*d` in eval mode,
//!   DETR's `DetrFrozenBatchNorm2d`), channels on dimension 1.
//! - [`GroupNorm`]: `nn.GroupNorm` (biased variance, `eps` inside the square root), channels on
//!   dimension 1.
//! - [`max_pool2d`]: `nn.MaxPool2d` with implicit `-inf` padding.
//! - [`weight_norm`] / [`load_weight_normed`]: weight-normed parameters (`w = g * v / ‖v‖`),
//!   stored either as `weight_g` / `weight_v` or as `parametrizations.weight.original0` / `original1`.

use burn::tensor::{backend::Backend, ops::ConvOptions, Tensor};
use ipfs_accelerate_core::{Error, Result};

use crate::{Activation, ActivationForward, VarBuilder};

/// The geometry of an N-d convolution: PyTorch's `stride`, `padding` (zeros, both sides),
/// `dilation`, `groups` and `bias` arguments. [`ConvParams::default`] is stride 1, no padding,
/// dilation 1, one group, with bias.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConvParams<const N: usize> {
    /// Step between windows, per spatial dimension (non-zero).
    pub stride: [usize; N],
    /// Zeros added at both ends of each spatial dimension.
    pub padding: [usize; N],
    /// Spacing between kernel taps (non-zero).
    pub dilation: [usize; N],
    /// Channel groups; input and output channels must both be divisible by it.
    pub groups: usize,
    /// Whether the layer has a bias.
    pub bias: bool,
}

impl<const N: usize> Default for ConvParams<N> {
    fn default() -> Self {
        ConvParams {
            stride: [1; N],
            padding: [0; N],
            dilation: [1; N],
            groups: 1,
            bias: true,
        }
    }
}

impl<const N: usize> ConvParams<N> {
    /// The same stride in every spatial dimension.
    pub fn with_stride(mut self, stride: usize) -> Self {
        self.stride = [stride; N];
        self
    }

    /// The same padding in every spatial dimension.
    pub fn with_padding(mut self, padding: usize) -> Self {
        self.padding = [padding; N];
        self
    }

    /// The same dilation in every spatial dimension.
    pub fn with_dilation(mut self, dilation: usize) -> Self {
        self.dilation = [dilation; N];
        self
    }

    /// Channel groups.
    pub fn with_groups(mut self, groups: usize) -> Self {
        self.groups = groups;
        self
    }

    /// With or without bias.
    pub fn with_bias(mut self, bias: bool) -> Self {
        self.bias = bias;
        self
    }

    /// The output length of each spatial dimension for an input of `input` (PyTorch's formula
    /// `(in + 2p - d (k - 1) - 1) / s + 1`), or `None` when the (padded) input is shorter than
    /// the dilated kernel.
    pub fn output_size(&self, input: [usize; N], kernel: [usize; N]) -> Option<[usize; N]> {
        let mut out = [0; N];
        for i in 0..N {
            let span = self.dilation[i] * (kernel[i].checked_sub(1)?) + 1;
            let padded = input[i] + 2 * self.padding[i];
            out[i] = padded.checked_sub(span)? / self.stride[i].max(1) + 1;
        }
        Some(out)
    }

    fn check(&self, name: &str, in_channels: usize, out_channels: usize) -> Result<()> {
        let bad = |why: String| Err(Error::InvalidInput(format!("convolution `{name}`: {why}")));
        if self.groups == 0 || self.stride.contains(&0) || self.dilation.contains(&0) {
            return bad(format!(
                "groups {}, stride {:?} and dilation {:?} must be non-zero",
                self.groups, self.stride, self.dilation
            ));
        }
        if in_channels == 0 || out_channels == 0 {
            return bad("channel counts must be positive".into());
        }
        if !in_channels.is_multiple_of(self.groups) || !out_channels.is_multiple_of(self.groups) {
            return bad(format!(
                "{in_channels} input and {out_channels} output channels are not divisible by {} groups",
                self.groups
            ));
        }
        Ok(())
    }

    fn burn_options(&self) -> ConvOptions<N> {
        ConvOptions::new(self.stride, self.padding, self.dilation, self.groups)
    }
}

/// An N-d convolution with weight rank `W = N + 2`; use the aliases [`Conv1d`] and [`Conv2d`].
#[derive(Debug, Clone)]
pub struct Conv<B: Backend, const N: usize, const W: usize> {
    weight: Tensor<B, W>,
    bias: Option<Tensor<B, 1>>,
    params: ConvParams<N>,
}

/// `nn.Conv1d`: input `[batch, in, length]`, weight `[out, in / groups, k]`.
pub type Conv1d<B> = Conv<B, 1, 3>;
/// `nn.Conv2d`: input `[batch, in, height, width]`, weight `[out, in / groups, kh, kw]`.
pub type Conv2d<B> = Conv<B, 2, 4>;

impl<B: Backend, const N: usize, const W: usize> Conv<B, N, W> {
    /// Loads `weight` `[out, in / groups, kernel...]` (and `bias` `[out]` when `params.bias`)
    /// under `vb`, checking the shapes and the geometry.
    pub fn load(
        vb: &VarBuilder<B>,
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; N],
        params: ConvParams<N>,
    ) -> Result<Self> {
        params.check(&vb.path("weight"), in_channels, out_channels)?;
        if W != N + 2 || kernel.contains(&0) {
            return Err(Error::InvalidInput(format!(
                "convolution `{}`: kernel {kernel:?} must be non-zero, weight rank {W} = {N} + 2",
                vb.path("weight")
            )));
        }
        let mut shape = [0usize; W];
        shape[0] = out_channels;
        shape[1] = in_channels / params.groups;
        shape[2..].copy_from_slice(&kernel);
        let weight = vb.tensor("weight", shape)?;
        let bias = if params.bias {
            Some(vb.tensor("bias", [out_channels])?)
        } else {
            None
        };
        Ok(Conv {
            weight,
            bias,
            params,
        })
    }

    /// From a weight already on the device (for weights computed at load time, such as weight
    /// norm); `params.bias` is ignored in favour of whether `bias` is given.
    pub fn from_tensors(
        weight: Tensor<B, W>,
        bias: Option<Tensor<B, 1>>,
        params: ConvParams<N>,
    ) -> Result<Self> {
        let dims = weight.dims();
        if W != N + 2 {
            return Err(Error::InvalidInput(format!(
                "convolution weight of rank {W} for {N} spatial dimensions"
            )));
        }
        params.check("weight", dims[1] * params.groups, dims[0])?;
        if let Some(b) = &bias {
            if b.dims()[0] != dims[0] {
                return Err(Error::ShapeMismatch {
                    name: "convolution bias".into(),
                    expected: vec![dims[0]],
                    actual: b.dims().to_vec(),
                });
            }
        }
        let params = ConvParams {
            bias: bias.is_some(),
            ..params
        };
        Ok(Conv {
            weight,
            bias,
            params,
        })
    }

    /// Input channels the layer expects.
    pub fn in_channels(&self) -> usize {
        self.weight.dims()[1] * self.params.groups
    }

    /// Output channels.
    pub fn out_channels(&self) -> usize {
        self.weight.dims()[0]
    }

    /// The kernel size per spatial dimension.
    pub fn kernel(&self) -> [usize; N] {
        let dims = self.weight.dims();
        let mut k = [0; N];
        k.copy_from_slice(&dims[2..]);
        k
    }

    /// The geometry.
    pub fn params(&self) -> &ConvParams<N> {
        &self.params
    }

    /// The output spatial size for an input of spatial size `input` (`None` when too small).
    pub fn output_size(&self, input: [usize; N]) -> Option<[usize; N]> {
        self.params.output_size(input, self.kernel())
    }
}

impl<B: Backend> Conv1d<B> {
    /// `[batch, in, length]` → `[batch, out, length']`. The caller guarantees `in` equals
    /// [`Conv::in_channels`] and the input is at least as long as the dilated kernel.
    pub fn forward(&self, x: Tensor<B, 3>) -> Tensor<B, 3> {
        crate::exact::conv1d(
            x,
            self.weight.clone(),
            self.bias.clone(),
            self.params.burn_options(),
        )
    }
}

impl<B: Backend> Conv2d<B> {
    /// `[batch, in, h, w]` → `[batch, out, h', w']`. The caller guarantees `in` equals
    /// [`Conv::in_channels`] and the input is at least as large as the dilated kernel. On the
    /// CPU backend a convolution of one group without dilation is one product per image with
    /// its column matrix (`fast::conv2d`).
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.forward_fused(x, None, None)
    }

    /// `act(self.forward(x))`, with the activation applied in the bias pass on the CPU backend.
    pub fn forward_act(&self, x: Tensor<B, 4>, act: Option<Activation>) -> Tensor<B, 4> {
        self.forward_fused(x, None, act)
    }

    /// `act(self.forward(x) + residual)` (a residual connection of the output's shape), with the
    /// add and the activation in the bias pass on the CPU backend.
    pub fn forward_add_act(
        &self,
        x: Tensor<B, 4>,
        residual: Tensor<B, 4>,
        act: Activation,
    ) -> Tensor<B, 4> {
        self.forward_fused(x, Some(residual), Some(act))
    }

    fn forward_fused(
        &self,
        x: Tensor<B, 4>,
        residual: Option<Tensor<B, 4>>,
        act: Option<Activation>,
    ) -> Tensor<B, 4> {
        let p = &self.params;
        if p.groups == 1 && p.dilation == [1, 1] {
            let geometry = [p.stride, p.padding];
            let (bias, res) = (self.bias.as_ref(), residual.as_ref());
            if let Some(y) = crate::fast::conv2d(&x, &self.weight, bias, geometry, res, act) {
                return y;
            }
        }
        let mut y = crate::exact::conv2d(
            x,
            self.weight.clone(),
            self.bias.clone(),
            self.params.burn_options(),
        );
        if let Some(r) = residual {
            y = y + r;
        }
        match act {
            Some(act) => act.forward(y),
            None => y,
        }
    }
}

impl<B: Backend, const N: usize, const W: usize> Conv<B, N, W> {
    /// This convolution followed by `norm`, as one convolution: each output channel's weights
    /// and bias scaled by the norm's scale, its shift added to the bias (`conv(x) · s + t =
    /// conv_{w·s, b·s + t}(x)`; PyTorch's `fuse_conv_bn_eval`). A norm of another channel count
    /// is an error.
    pub fn with_norm_folded(self, norm: &FrozenBatchNorm<B>) -> Result<Self> {
        let out = self.out_channels();
        if norm.channels() != out {
            return Err(Error::InvalidInput(format!(
                "a batch norm of {} channels after a convolution of {out}",
                norm.channels()
            )));
        }
        let mut shape = [1usize; W];
        shape[0] = out;
        let weight = self.weight * norm.scale.clone().reshape(shape);
        let bias = match self.bias {
            Some(b) => b * norm.scale.clone() + norm.shift.clone(),
            None => norm.shift.clone(),
        };
        Ok(Conv {
            weight,
            bias: Some(bias),
            params: ConvParams {
                bias: true,
                ..self.params
            },
        })
    }
}

/// `nn.MaxPool2d(kernel, stride, padding)` over `[batch, c, h, w]` (padding never wins the max).
pub fn max_pool2d<B: Backend>(
    x: Tensor<B, 4>,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
) -> Tensor<B, 4> {
    burn::tensor::module::max_pool2d(x, kernel, stride, padding, [1, 1], false)
}

/// `nn.GroupNorm`'s arithmetic: `x` `[batch, channels, ...]` normalised over each group of
/// `channels / groups` channels and every position (biased variance, `eps` inside the square
/// root), then scaled by `weight` and shifted by `bias` per channel. The caller guarantees that
/// `groups` divides the channels.
pub(crate) fn group_norm<B: Backend, const D: usize>(
    x: Tensor<B, D>,
    groups: usize,
    weight: Option<&Tensor<B, 1>>,
    bias: Option<&Tensor<B, 1>>,
    eps: f64,
) -> Tensor<B, D> {
    let dims = x.dims();
    let batch = dims[0];
    let per_group = x.shape().num_elements() / (batch * groups).max(1);
    let grouped: Tensor<B, 3> = x.reshape([batch, groups, per_group]);
    let (var, mean) = grouped.clone().var_mean_bias(2);
    let normed = (grouped - mean) / var.add_scalar(eps).sqrt();
    let mut y: Tensor<B, D> = normed.reshape(dims);
    if let Some(w) = weight {
        y = y * per_channel::<B, D>(w);
    }
    if let Some(b) = bias {
        y = y + per_channel::<B, D>(b);
    }
    y
}

/// A per-channel `[1, C, 1, ...]` view of a `[C]` vector, to broadcast over dimension 1.
fn per_channel<B: Backend, const D: usize>(v: &Tensor<B, 1>) -> Tensor<B, D> {
    let mut shape = [1usize; D];
    shape[1] = v.dims()[0];
    v.clone().reshape(shape)
}

fn check_channels(what: &str, dims: &[usize], channels: usize) -> Result<()> {
    if dims.len() < 2 || dims[1] != channels {
        return Err(Error::InvalidInput(format!(
            "{what} expects {channels} channels on dimension 1, got shape {dims:?}"
        )));
    }
    Ok(())
}

/// Batch normalisation with frozen statistics (`nn.BatchNorm*d` in eval mode, DETR's
/// `DetrFrozenBatchNorm2d`): `x * scale + shift` with `scale = weight * rsqrt(running_var + eps)`
/// and `shift = bias - running_mean * scale`, folded once at load time. Channels on dimension 1.
#[derive(Debug, Clone)]
pub struct FrozenBatchNorm<B: Backend> {
    scale: Tensor<B, 1>,
    shift: Tensor<B, 1>,
}

impl<B: Backend> FrozenBatchNorm<B> {
    /// Loads `weight`, `bias`, `running_mean` and `running_var` (each `[channels]`) under `vb`.
    pub fn load(vb: &VarBuilder<B>, channels: usize, eps: f64) -> Result<Self> {
        let weight = vb.tensor("weight", [channels])?;
        let bias = vb.tensor("bias", [channels])?;
        let mean = vb.tensor("running_mean", [channels])?;
        let var = vb.tensor("running_var", [channels])?;
        Ok(Self::from_tensors(weight, bias, mean, var, eps))
    }

    /// From the four statistics tensors, each `[channels]`.
    pub fn from_tensors(
        weight: Tensor<B, 1>,
        bias: Tensor<B, 1>,
        running_mean: Tensor<B, 1>,
        running_var: Tensor<B, 1>,
        eps: f64,
    ) -> Self {
        let scale = weight * running_var.add_scalar(eps).sqrt().recip();
        let shift = bias - running_mean * scale.clone();
        FrozenBatchNorm { scale, shift }
    }

    /// Channels.
    pub fn channels(&self) -> usize {
        self.scale.dims()[0]
    }

    /// Normalises `x` `[batch, channels, ...]`; the caller guarantees the channel count.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        x * per_channel::<B, D>(&self.scale) + per_channel::<B, D>(&self.shift)
    }

    /// [`FrozenBatchNorm::forward`] with the channel count checked first.
    pub fn try_forward<const D: usize>(&self, x: Tensor<B, D>) -> Result<Tensor<B, D>> {
        check_channels("batch norm", &x.dims(), self.channels())?;
        Ok(self.forward(x))
    }
}

/// `nn.GroupNorm(groups, channels, eps, affine)`: statistics over each group of channels and all
/// positions (biased variance), then a per-channel affine transform. Channels on dimension 1.
#[derive(Debug, Clone)]
pub struct GroupNorm<B: Backend> {
    groups: usize,
    channels: usize,
    weight: Option<Tensor<B, 1>>,
    bias: Option<Tensor<B, 1>>,
    eps: f64,
}

impl<B: Backend> GroupNorm<B> {
    /// Loads the affine `weight` and `bias` (each `[channels]`) under `vb`.
    pub fn load(vb: &VarBuilder<B>, groups: usize, channels: usize, eps: f64) -> Result<Self> {
        Self::check(groups, channels)?;
        Ok(GroupNorm {
            groups,
            channels,
            weight: Some(vb.tensor("weight", [channels])?),
            bias: Some(vb.tensor("bias", [channels])?),
            eps,
        })
    }

    /// Without the affine transform (`affine=False`).
    pub fn without_affine(groups: usize, channels: usize, eps: f64) -> Result<Self> {
        Self::check(groups, channels)?;
        Ok(GroupNorm {
            groups,
            channels,
            weight: None,
            bias: None,
            eps,
        })
    }

    fn check(groups: usize, channels: usize) -> Result<()> {
        if groups == 0 || channels == 0 || !channels.is_multiple_of(groups) {
            return Err(Error::InvalidInput(format!(
                "group norm: {channels} channels cannot be split into {groups} groups"
            )));
        }
        Ok(())
    }

    /// Channels.
    pub fn channels(&self) -> usize {
        self.channels
    }

    /// Normalises `x` `[batch, channels, ...]`; the caller guarantees the channel count.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        group_norm(
            x,
            self.groups,
            self.weight.as_ref(),
            self.bias.as_ref(),
            self.eps,
        )
    }

    /// [`GroupNorm::forward`] with the channel count checked first.
    pub fn try_forward<const D: usize>(&self, x: Tensor<B, D>) -> Result<Tensor<B, D>> {
        check_channels("group norm", &x.dims(), self.channels)?;
        Ok(self.forward(x))
    }
}

/// Weight normalisation (`torch.nn.utils.weight_norm` and `parametrizations.weight_norm`):
/// `w = g * v / ‖v‖`, the norm taken over every dimension where the magnitude `g` has size 1
/// (PyTorch's `dim` is the one dimension `g` keeps). `g` has the rank of `v`.
pub fn weight_norm<B: Backend, const D: usize>(
    v: Tensor<B, D>,
    g: Tensor<B, D>,
) -> Result<Tensor<B, D>> {
    let (vd, gd) = (v.dims(), g.dims());
    if vd.iter().zip(&gd).any(|(a, b)| *b != 1 && b != a) {
        return Err(Error::ShapeMismatch {
            name: "weight norm magnitude (weight_g)".into(),
            expected: vd.to_vec(),
            actual: gd.to_vec(),
        });
    }
    let mut sq = v.clone().powi_scalar(2);
    for (d, &size) in gd.iter().enumerate() {
        if size == 1 {
            sq = sq.sum_dim(d);
        }
    }
    Ok(v * g / sq.sqrt())
}

/// Loads a weight of `shape` under `vb` that was trained with weight norm over `dim`: the
/// magnitude and direction stored as `weight_g` / `weight_v` (`nn.utils.weight_norm`) or as
/// `parametrizations.weight.original0` / `original1` (`nn.utils.parametrizations.weight_norm`),
/// recombined with [`weight_norm`]; a plain `weight` (already folded) is used as is.
pub fn load_weight_normed<B: Backend, const D: usize>(
    vb: &VarBuilder<B>,
    shape: [usize; D],
    dim: usize,
) -> Result<Tensor<B, D>> {
    if dim >= D {
        return Err(Error::InvalidInput(format!(
            "weight norm of `{}` over dimension {dim} of a rank-{D} weight",
            vb.path("weight")
        )));
    }
    let mut g_shape = [1usize; D];
    g_shape[dim] = shape[dim];
    if let Some((g, v)) = weight_norm_names(|name| vb.contains(name)) {
        return weight_norm(vb.tensor(v, shape)?, vb.tensor(g, g_shape)?);
    }
    if vb.contains("weight") {
        return vb.tensor("weight", shape);
    }
    Err(missing_weight_normed(vb.path("weight_g")))
}

/// The names of a weight-normed weight's magnitude and direction under a module, when
/// `contains` finds either: `parametrizations.weight.original0` / `original1`
/// (`nn.utils.parametrizations.weight_norm`), else `weight_g` / `weight_v`
/// (`nn.utils.weight_norm`).
pub fn weight_norm_names(contains: impl Fn(&str) -> bool) -> Option<(&'static str, &'static str)> {
    [
        (
            "parametrizations.weight.original0",
            "parametrizations.weight.original1",
        ),
        ("weight_g", "weight_v"),
    ]
    .into_iter()
    .find(|(g, v)| contains(g) || contains(v))
}

/// The error for a module that has neither a weight-normed weight nor a plain `weight`.
pub fn missing_weight_normed(name: String) -> Error {
    Error::MissingTensor {
        name,
        source_name: "the checkpoint (looked for weight_g / weight_v, \
                      parametrizations.weight.original0 / original1 and weight)"
            .into(),
    }
}

#[cfg(test)]
mod weight_norm_tests {
    use super::*;
    use burn::tensor::TensorData;
    use burn_flex::Flex;

    #[test]
    fn weight_norm_normalises_over_the_other_dimensions() {
        let dev = Default::default();
        // v [2, 1, 3], g over dim 2: [1, 1, 3].
        let v = vec![3.0f32, 1.0, 2.0, 4.0, 0.0, 2.0];
        let g = vec![10.0f32, 0.5, 1.0];
        let w = weight_norm(
            Tensor::<Flex, 3>::from_data(TensorData::new(v.clone(), [2, 1, 3]), &dev),
            Tensor::<Flex, 3>::from_data(TensorData::new(g.clone(), [1, 1, 3]), &dev),
        )
        .unwrap()
        .into_data()
        .to_vec::<f32>()
        .unwrap();
        for k in 0..3 {
            let norm = (v[k] * v[k] + v[3 + k] * v[3 + k]).sqrt();
            for o in 0..2 {
                let want = g[k] * v[o * 3 + k] / norm;
                assert!(
                    (w[o * 3 + k] - want).abs() < 1e-6,
                    "{} vs {want}",
                    w[o * 3 + k]
                );
            }
        }
        let bad = weight_norm(
            Tensor::<Flex, 3>::zeros([2, 1, 3], &dev),
            Tensor::<Flex, 3>::zeros([1, 1, 4], &dev),
        );
        assert!(bad.is_err());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::tensor::TensorData;
    use burn_flex::Flex;

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i * 7 + seed * 13) % 17) as f32) / 8.0 - 1.0)
            .collect()
    }

    /// Direct PyTorch-semantics conv2d on the host.
    #[allow(clippy::too_many_arguments)]
    fn naive_conv2d(
        x: &[f32],
        [b, c, h, w]: [usize; 4],
        wt: &[f32],
        [o, cg, kh, kw]: [usize; 4],
        bias: &[f32],
        p: &ConvParams<2>,
    ) -> (Vec<f32>, [usize; 4]) {
        let [oh, ow] = p.output_size([h, w], [kh, kw]).unwrap();
        let og = o / p.groups;
        let mut out = vec![0f32; b * o * oh * ow];
        for bi in 0..b {
            for oc in 0..o {
                let g = oc / og;
                for y in 0..oh {
                    for xx in 0..ow {
                        let mut acc = bias[oc];
                        for ic in 0..cg {
                            let cin = g * cg + ic;
                            for ky in 0..kh {
                                for kx in 0..kw {
                                    let iy = (y * p.stride[0] + ky * p.dilation[0]) as isize
                                        - p.padding[0] as isize;
                                    let ix = (xx * p.stride[1] + kx * p.dilation[1]) as isize
                                        - p.padding[1] as isize;
                                    if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                        continue;
                                    }
                                    let xi = ((bi * c + cin) * h + iy as usize) * w + ix as usize;
                                    let wi = ((oc * cg + ic) * kh + ky) * kw + kx;
                                    acc += x[xi] * wt[wi];
                                }
                            }
                        }
                        out[((bi * o + oc) * oh + y) * ow + xx] = acc;
                    }
                }
            }
        }
        (out, [b, o, oh, ow])
    }

    /// The largest difference between a `Conv2d` of values from `seed` and `naive_conv2d`.
    fn against_naive(
        [b, c, h, w]: [usize; 4],
        o: usize,
        k: usize,
        p: ConvParams<2>,
        seed: usize,
    ) -> f32 {
        let dev = Default::default();
        let cg = c / p.groups;
        let (x, wt, bias) = (
            values(b * c * h * w, seed),
            values(o * cg * k * k, seed + 1),
            values(o, seed + 2),
        );
        let conv = Conv2d::<Flex>::from_tensors(
            Tensor::from_data(TensorData::new(wt.clone(), [o, cg, k, k]), &dev),
            Some(Tensor::from_data(TensorData::new(bias.clone(), [o]), &dev)),
            p,
        )
        .unwrap();
        assert_eq!(conv.in_channels(), c);
        let got = conv.forward(Tensor::from_data(
            TensorData::new(x.clone(), [b, c, h, w]),
            &dev,
        ));
        let (want, shape) = naive_conv2d(&x, [b, c, h, w], &wt, [o, cg, k, k], &bias, &p);
        assert_eq!(got.dims(), shape);
        let got = got.into_data().to_vec::<f32>().unwrap();
        got.iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max)
    }

    /// One group without dilation: the CPU's product with a column matrix (and the direct
    /// product for a 1 × 1 kernel).
    #[test]
    fn conv2d_of_one_group_matches_naive() {
        for (k, stride, padding) in [(3, 2, 1), (1, 1, 0), (7, 2, 3)] {
            let p = ConvParams::<2>::default()
                .with_stride(stride)
                .with_padding(padding);
            let diff = against_naive([2, 3, 9, 8], 5, k, p, 4);
            assert!(diff < 1e-4, "k {k}: max diff {diff}");
        }
    }

    /// A frozen batch norm folded into the convolution before it gives the pair's output, and
    /// the fused activation its activation.
    #[test]
    fn a_folded_norm_is_the_convolution_then_the_norm() {
        let dev = Default::default();
        let (b, c, h, w, o, k) = (2, 3, 6, 5, 4, 3);
        let p = ConvParams::<2>::default().with_padding(1);
        let t = |v: Vec<f32>, n: usize| Tensor::<Flex, 1>::from_data(TensorData::new(v, [n]), &dev);
        let conv = Conv2d::<Flex>::from_tensors(
            Tensor::from_data(
                TensorData::new(values(o * c * k * k, 7), [o, c, k, k]),
                &dev,
            ),
            Some(t(values(o, 8), o)),
            p,
        )
        .unwrap();
        let variance: Vec<f32> = values(o, 9).iter().map(|v| v.abs() + 0.5).collect();
        let norm = FrozenBatchNorm::from_tensors(
            t(values(o, 10), o),
            t(values(o, 11), o),
            t(values(o, 12), o),
            t(variance, o),
            1e-5,
        );
        let x = Tensor::<Flex, 4>::from_data(
            TensorData::new(values(b * c * h * w, 13), [b, c, h, w]),
            &dev,
        );
        let want = Activation::Relu.forward(norm.forward(conv.forward(x.clone())));
        let folded = conv.clone().with_norm_folded(&norm).unwrap();
        let got = folded.forward_act(x.clone(), Some(Activation::Relu));
        let diff = (got - want).abs().max().into_scalar();
        assert!(diff < 1e-5, "{diff}");
        let residual = norm.forward(conv.forward(x.clone())) * 0.5 - 0.25;
        let want =
            Activation::Relu.forward(norm.forward(conv.forward(x.clone())) + residual.clone());
        let got = folded.forward_add_act(x, residual, Activation::Relu);
        let diff = (got - want).abs().max().into_scalar();
        assert!(diff < 1e-5, "residual: {diff}");
        let other = FrozenBatchNorm::from_tensors(
            t(vec![1.0; 2], 2),
            t(vec![0.0; 2], 2),
            t(vec![0.0; 2], 2),
            t(vec![1.0; 2], 2),
            1e-5,
        );
        let err = conv.with_norm_folded(&other).unwrap_err().to_string();
        assert!(
            err.contains("2 channels") && err.contains("convolution of 4"),
            "{err}"
        );
    }

    #[test]
    fn conv2d_matches_naive_with_stride_padding_dilation_groups() {
        let p = ConvParams::<2>::default()
            .with_stride(2)
            .with_padding(2)
            .with_dilation(2)
            .with_groups(2);
        let diff = against_naive([2, 4, 7, 6], 6, 3, p, 1);
        assert!(diff < 1e-4, "max diff {diff}");
    }

    #[test]
    fn conv1d_is_conv2d_of_height_one() {
        let dev = Default::default();
        let (b, c, l, o, k) = (1, 2, 9, 3, 3);
        let p1 = ConvParams::<1>::default().with_stride(2).with_padding(1);
        let x = values(b * c * l, 4);
        let wt = values(o * c * k, 5);
        let conv = Conv1d::<Flex>::from_tensors(
            Tensor::from_data(TensorData::new(wt.clone(), [o, c, k]), &dev),
            None,
            p1,
        )
        .unwrap();
        let got = conv.forward(Tensor::from_data(
            TensorData::new(x.clone(), [b, c, l]),
            &dev,
        ));
        let p2 = ConvParams {
            stride: [1, 2],
            padding: [0, 1],
            dilation: [1, 1],
            groups: 1,
            bias: false,
        };
        let (want, shape) = naive_conv2d(&x, [b, c, 1, l], &wt, [o, c, 1, k], &vec![0.0; o], &p2);
        assert_eq!(got.dims(), [shape[0], shape[1], shape[3]]);
        let got = got.into_data().to_vec::<f32>().unwrap();
        for (a, b) in got.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn bad_geometry_is_an_error() {
        let dev = Default::default();
        let w = Tensor::<Flex, 4>::zeros([4, 3, 1, 1], &dev);
        let p = ConvParams::<2>::default().with_groups(3);
        // 4 output channels are not divisible by 3 groups.
        assert!(Conv2d::from_tensors(w.clone(), None, p).is_err());
        let p = ConvParams::<2>::default().with_stride(0);
        assert!(Conv2d::from_tensors(w, None, p).is_err());
        assert!(GroupNorm::<Flex>::without_affine(3, 4, 1e-5).is_err());
        assert_eq!(
            ConvParams::<1>::default().output_size([2], [3]),
            None,
            "input shorter than the kernel"
        );
    }

    #[test]
    fn frozen_batch_norm_and_group_norm_match_formulas() {
        let dev = Default::default();
        let (b, c, h, w) = (2, 4, 3, 2);
        let x = values(b * c * h * w, 6);
        let xt = Tensor::<Flex, 4>::from_data(TensorData::new(x.clone(), [b, c, h, w]), &dev);
        let t = |v: Vec<f32>| Tensor::<Flex, 1>::from_data(TensorData::new(v, [c]), &dev);
        let (wt, bs, rm, rv) = (
            vec![1.0, 2.0, -1.0, 0.5],
            vec![0.1, 0.0, 0.3, -0.2],
            vec![0.5, -0.5, 0.0, 1.0],
            vec![1.0, 4.0, 0.25, 2.0],
        );
        let bn = FrozenBatchNorm::from_tensors(
            t(wt.clone()),
            t(bs.clone()),
            t(rm.clone()),
            t(rv.clone()),
            1e-5,
        );
        let got = bn
            .try_forward(xt.clone())
            .unwrap()
            .into_data()
            .to_vec::<f32>()
            .unwrap();
        for (i, g) in got.iter().enumerate() {
            let ch = (i / (h * w)) % c;
            let want = (x[i] - rm[ch]) / (rv[ch] + 1e-5).sqrt() * wt[ch] + bs[ch];
            assert!((g - want).abs() < 1e-5, "{g} vs {want}");
        }
        assert!(bn
            .try_forward(Tensor::<Flex, 4>::zeros([1, 3, 1, 1], &dev))
            .is_err());

        let gn = GroupNorm {
            groups: 2,
            channels: c,
            weight: Some(t(wt.clone())),
            bias: Some(t(bs.clone())),
            eps: 1e-5,
        };
        let got = gn.forward(xt).into_data().to_vec::<f32>().unwrap();
        let group = (c / 2) * h * w;
        for (gi, chunk) in x.chunks(group).enumerate() {
            let mean = chunk.iter().sum::<f32>() / group as f32;
            let var = chunk.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / group as f32;
            for (j, v) in chunk.iter().enumerate() {
                let i = gi * group + j;
                let ch = (i / (h * w)) % c;
                let want = (v - mean) / (var + 1e-5).sqrt() * wt[ch] + bs[ch];
                assert!((got[i] - want).abs() < 1e-4, "{} vs {want}", got[i]);
            }
        }
    }
}
