//! HF's ResNet backbone (`modeling_resnet.py`) with every batch norm frozen
//! (`DetrFrozenBatchNorm2d`), as DETR's `DetrConvEncoder` uses it.

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::{Error, Result};
use ipfs_accelerate_nn::ActivationForward;
use ipfs_accelerate_nn::{
    conv::{max_pool2d, Conv2d, ConvParams, FrozenBatchNorm},
    Activation, VarBuilder,
};

use crate::config::{ResNetConfig, ResNetLayerType, BATCH_NORM_EPS};

/// `ResNetConvLayer`: conv (no bias, padding `k / 2`) → frozen batch norm → optional activation,
/// the norm folded into the convolution at load time ([`Conv2d::with_norm_folded`]).
struct ConvLayer<B: Backend> {
    conv: Conv2d<B>,
    act: Option<Activation>,
}

impl<B: Backend> ConvLayer<B> {
    fn load(
        vb: &VarBuilder<B>,
        in_ch: usize,
        out_ch: usize,
        kernel: usize,
        stride: usize,
        act: Option<Activation>,
    ) -> Result<Self> {
        let params = ConvParams::default()
            .with_stride(stride)
            .with_padding(kernel / 2)
            .with_bias(false);
        let conv = Conv2d::load(&vb.pp("convolution"), in_ch, out_ch, [kernel; 2], params)?;
        let norm = FrozenBatchNorm::load(&vb.pp("normalization"), out_ch, BATCH_NORM_EPS)?;
        Ok(ConvLayer {
            conv: conv.with_norm_folded(&norm)?,
            act,
        })
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        self.conv.forward_act(x, self.act)
    }
}

/// A residual layer: a basic (3x3, 3x3) or bottleneck (1x1, 3x3, 1x1) stack plus a shortcut that
/// projects (1x1 conv + norm) when channels or stride change.
struct ResidualLayer<B: Backend> {
    convs: Vec<ConvLayer<B>>,
    shortcut: Option<ConvLayer<B>>,
    act: Activation,
}

impl<B: Backend> ResidualLayer<B> {
    fn load(
        vb: &VarBuilder<B>,
        c: &ResNetConfig,
        in_ch: usize,
        out_ch: usize,
        stride: usize,
    ) -> Result<Self> {
        // The inner convolutions use ResNetConvLayer's default activation (ReLU), not hidden_act.
        let relu = Some(Activation::Relu);
        let l = vb.pp("layer");
        let convs = match c.layer_type {
            ResNetLayerType::Basic => vec![
                ConvLayer::load(&l.pp("0"), in_ch, out_ch, 3, stride, relu)?,
                ConvLayer::load(&l.pp("1"), out_ch, out_ch, 3, 1, None)?,
            ],
            ResNetLayerType::Bottleneck => {
                let reduced = out_ch / 4;
                let (s1, s2) = if c.downsample_in_bottleneck {
                    (stride, 1)
                } else {
                    (1, stride)
                };
                vec![
                    ConvLayer::load(&l.pp("0"), in_ch, reduced, 1, s1, relu)?,
                    ConvLayer::load(&l.pp("1"), reduced, reduced, 3, s2, relu)?,
                    ConvLayer::load(&l.pp("2"), reduced, out_ch, 1, 1, None)?,
                ]
            }
        };
        let shortcut = if in_ch != out_ch || stride != 1 {
            Some(ConvLayer::load(
                &vb.pp("shortcut"),
                in_ch,
                out_ch,
                1,
                stride,
                None,
            )?)
        } else {
            None
        };
        Ok(ResidualLayer {
            convs,
            shortcut,
            act: c.hidden_act,
        })
    }

    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let residual = match &self.shortcut {
            Some(s) => s.forward(x.clone()),
            None => x.clone(),
        };
        // The stack's last convolution has no activation of its own: the residual add and the
        // layer's activation run in its output pass.
        match self.convs.split_last() {
            Some((last, first)) => {
                let h = first.iter().fold(x, |h, conv| conv.forward(h));
                last.conv.forward_add_act(h, residual, self.act)
            }
            None => self.act.forward(x + residual),
        }
    }
}

/// `ResNetBackbone` up to the stage DETR reads: stem (7x7 stride-2 conv, norm, activation,
/// 3x3 stride-2 max pool) and the residual stages.
pub struct ResNetBackbone<B: Backend> {
    stem: ConvLayer<B>,
    stages: Vec<Vec<ResidualLayer<B>>>,
    in_channels: usize,
    out_channels: usize,
}

impl<B: Backend> ResNetBackbone<B> {
    /// Loads the stem and the stages up to [`ResNetConfig::out_stage`] from `vb` (rooted where
    /// `embedder.` and `encoder.` live).
    pub fn load(vb: &VarBuilder<B>, c: &ResNetConfig) -> Result<Self> {
        let stem = ConvLayer::load(
            &vb.pp("embedder.embedder"),
            c.num_channels,
            c.embedding_size,
            7,
            2,
            Some(c.hidden_act),
        )?;
        let last = c.out_stage()?;
        let mut stages = Vec::with_capacity(last);
        let mut in_ch = c.embedding_size;
        for s in 0..last {
            let out_ch = c.hidden_sizes[s];
            let first_stride = if s > 0 || c.downsample_in_first_stage {
                2
            } else {
                1
            };
            let svb = vb.pp(format!("encoder.stages.{s}.layers"));
            // HF builds one layer even for a depth of 0.
            let layers = (0..c.depths[s].max(1))
                .map(|i| {
                    let (inp, stride) = if i == 0 {
                        (in_ch, first_stride)
                    } else {
                        (out_ch, 1)
                    };
                    ResidualLayer::load(&svb.pp(i.to_string()), c, inp, out_ch, stride)
                })
                .collect::<Result<Vec<_>>>()?;
            stages.push(layers);
            in_ch = out_ch;
        }
        Ok(ResNetBackbone {
            stem,
            stages,
            in_channels: c.num_channels,
            out_channels: c.channels_of(last),
        })
    }

    /// Input channels.
    pub fn in_channels(&self) -> usize {
        self.in_channels
    }

    /// Channels of the returned feature map.
    pub fn out_channels(&self) -> usize {
        self.out_channels
    }

    /// `[batch, channels, h, w]` → the feature map `[batch, out_channels, h', w']`.
    pub fn forward(&self, pixel_values: Tensor<B, 4>) -> Result<Tensor<B, 4>> {
        let dims = pixel_values.dims();
        if dims[1] != self.in_channels || dims[2] == 0 || dims[3] == 0 || dims[0] == 0 {
            return Err(Error::InvalidInput(format!(
                "pixel_values must be [batch, {}, height, width] with non-zero sizes, got {dims:?}",
                self.in_channels
            )));
        }
        let x = self.stem.forward(pixel_values);
        let x = max_pool2d(x, [3, 3], [2, 2], [1, 1]);
        Ok(self
            .stages
            .iter()
            .flatten()
            .fold(x, |h, layer| layer.forward(h)))
    }
}
