//! The pre-LN transformer encoder layer of ViT, CLIP (both towers), LLaVA's vision tower and
//! X-CLIP: `x + attn(ln1(x))`, then `h + fc2(act(fc1(ln2(h))))`. Weight names are given per
//! family through [`PreLnNames`] so every checkpoint layout loads through the same code.

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::{Error, Result};

use crate::attention::{AttentionConfig, MultiHeadAttention, ProjectionBias, ProjectionNames};
use crate::{Activation, LayerNorm, Linear, VarBuilder};

/// A two-layer feed-forward block `fc2(act(fc1(x)))` (`ViTMLP`, `CLIPMLP`, BERT's
/// intermediate / output pair without its norm).
#[derive(Debug, Clone)]
pub struct Mlp<B: Backend> {
    fc1: Linear<B>,
    fc2: Linear<B>,
    act: Activation,
}

impl<B: Backend> Mlp<B> {
    /// Loads `fc1` (`hidden` → `intermediate`) and `fc2` (back to `hidden`), both with biases,
    /// from the names `fc1` / `fc2` under `vb`.
    pub fn load(
        vb: &VarBuilder<B>,
        (fc1, fc2): (&str, &str),
        hidden: usize,
        intermediate: usize,
        act: Activation,
    ) -> Result<Self> {
        Ok(Mlp {
            fc1: Linear::load(&vb.pp(fc1), hidden, intermediate, true)?,
            fc2: Linear::load(&vb.pp(fc2), intermediate, hidden, true)?,
            act,
        })
    }

    /// Applies the block over the last dimension of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        self.fc2.forward(self.fc1.forward_act(x, self.act))
    }

    /// `residual + self.forward(x)`, the add fused into `fc2` on the CPU backend.
    pub fn forward_add<const D: usize>(
        &self,
        x: Tensor<B, D>,
        residual: Tensor<B, D>,
    ) -> Tensor<B, D> {
        self.fc2
            .forward_add(self.fc1.forward_act(x, self.act), residual)
    }
}

/// Weight names of a [`PreLnLayer`], relative to the layer's prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreLnNames<'a> {
    /// The norm before attention.
    pub norm1: &'a str,
    /// The attention projections.
    pub attention: ProjectionNames<'a>,
    /// The norm before the MLP.
    pub norm2: &'a str,
    /// The MLP's first projection.
    pub fc1: &'a str,
    /// The MLP's second projection.
    pub fc2: &'a str,
}

impl PreLnNames<'static> {
    /// ViT as `save_pretrained` writes it (`encoder.layer.N.attention.attention.query`, ...).
    pub const VIT: PreLnNames<'static> = PreLnNames {
        norm1: "layernorm_before",
        attention: ProjectionNames {
            q: "attention.attention.query",
            k: "attention.attention.key",
            v: "attention.attention.value",
            o: "attention.output.dense",
        },
        norm2: "layernorm_after",
        fc1: "intermediate.dense",
        fc2: "output.dense",
    };
    /// ViT in transformers 5's module layout (`layers.N.attention.q_proj`, `mlp.fc1`, ...).
    pub const VIT_MODULES: PreLnNames<'static> = PreLnNames {
        norm1: "layernorm_before",
        attention: ProjectionNames {
            q: "attention.q_proj",
            k: "attention.k_proj",
            v: "attention.v_proj",
            o: "attention.o_proj",
        },
        norm2: "layernorm_after",
        fc1: "mlp.fc1",
        fc2: "mlp.fc2",
    };
    /// CLIP's `CLIPEncoderLayer` (`self_attn.q_proj`, `layer_norm1`, `mlp.fc1`, ...), also used by
    /// LLaVA's vision tower and X-CLIP.
    pub const CLIP: PreLnNames<'static> = PreLnNames {
        norm1: "layer_norm1",
        attention: ProjectionNames {
            q: "self_attn.q_proj",
            k: "self_attn.k_proj",
            v: "self_attn.v_proj",
            o: "self_attn.out_proj",
        },
        norm2: "layer_norm2",
        fc1: "mlp.fc1",
        fc2: "mlp.fc2",
    };
}

/// Sizes and options of a [`PreLnLayer`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PreLnConfig {
    /// Model width.
    pub hidden: usize,
    /// Attention heads.
    pub heads: usize,
    /// MLP inner width.
    pub intermediate: usize,
    /// MLP activation.
    pub act: Activation,
    /// Layer-norm epsilon.
    pub eps: f64,
    /// Which attention projections carry a bias (ViT's `qkv_bias` turns off q / k / v).
    pub bias: ProjectionBias,
}

impl PreLnConfig {
    fn check(&self) -> Result<()> {
        if self.hidden == 0 || self.heads == 0 || self.intermediate == 0 {
            return Err(Error::InvalidInput(format!(
                "pre-LN layer with hidden {}, heads {}, intermediate {}: all must be positive",
                self.hidden, self.heads, self.intermediate
            )));
        }
        if !self.hidden.is_multiple_of(self.heads) {
            return Err(Error::InvalidInput(format!(
                "hidden size {} is not divisible by {} heads",
                self.hidden, self.heads
            )));
        }
        Ok(())
    }
}

/// One pre-LN encoder layer.
#[derive(Debug, Clone)]
pub struct PreLnLayer<B: Backend> {
    norm1: LayerNorm<B>,
    attn: MultiHeadAttention<B>,
    norm2: LayerNorm<B>,
    mlp: Mlp<B>,
}

impl<B: Backend> PreLnLayer<B> {
    /// Loads the layer under `vb` (the layer's prefix) with the given names.
    pub fn load(vb: &VarBuilder<B>, config: &PreLnConfig, names: &PreLnNames<'_>) -> Result<Self> {
        config.check()?;
        let h = config.hidden;
        Ok(PreLnLayer {
            norm1: LayerNorm::load(&vb.pp(names.norm1), h, config.eps)?,
            attn: MultiHeadAttention::load(
                vb,
                AttentionConfig::new(h, config.heads, config.bias),
                names.attention,
            )?,
            norm2: LayerNorm::load(&vb.pp(names.norm2), h, config.eps)?,
            mlp: Mlp::load(
                vb,
                (names.fc1, names.fc2),
                h,
                config.intermediate,
                config.act,
            )?,
        })
    }

    /// `x` `[batch, seq, hidden]` through the layer; `bias` is an additive attention bias
    /// `[batch, heads, seq, seq]` (padding / causal masks).
    pub fn forward(&self, x: Tensor<B, 3>, bias: Option<&Tensor<B, 4>>) -> Tensor<B, 3> {
        self.forward_mlp(self.forward_attention(x, bias))
    }

    /// The attention half alone, `x + attn(ln1(x))` (X-CLIP attends over the frame tokens plus
    /// a message token, then drops the message token before the MLP half).
    pub fn forward_attention(&self, x: Tensor<B, 3>, bias: Option<&Tensor<B, 4>>) -> Tensor<B, 3> {
        self.attn
            .forward_add(self.norm1.forward(x.clone()), bias, x)
    }

    /// The MLP half alone, `h + fc2(act(fc1(ln2(h))))`.
    pub fn forward_mlp(&self, h: Tensor<B, 3>) -> Tensor<B, 3> {
        self.mlp.forward_add(self.norm2.forward(h.clone()), h)
    }
}

/// A stack of [`PreLnLayer`]s (`CLIPEncoder`, ViT's encoder).
#[derive(Debug, Clone)]
pub struct PreLnEncoder<B: Backend> {
    layers: Vec<PreLnLayer<B>>,
}

impl<B: Backend> PreLnEncoder<B> {
    /// Loads `count` layers stored as `<vb>.<i>.…` (`vb` at `encoder.layers` or `encoder.layer`).
    pub fn load(
        vb: &VarBuilder<B>,
        count: usize,
        config: &PreLnConfig,
        names: &PreLnNames<'_>,
    ) -> Result<Self> {
        let layers = (0..count)
            .map(|i| PreLnLayer::load(&vb.pp(i.to_string()), config, names))
            .collect::<Result<Vec<_>>>()?;
        Ok(PreLnEncoder { layers })
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether there are no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }

    /// Runs every layer.
    pub fn forward(&self, x: Tensor<B, 3>, bias: Option<&Tensor<B, 4>>) -> Tensor<B, 3> {
        self.forward_layers(x, bias, self.layers.len())
    }

    /// Runs the first `n` layers only (LLaVA takes the hidden state of layer −2: `len() - 1`).
    pub fn forward_layers(
        &self,
        mut x: Tensor<B, 3>,
        bias: Option<&Tensor<B, 4>>,
        n: usize,
    ) -> Tensor<B, 3> {
        for layer in self.layers.iter().take(n) {
            x = layer.forward(x, bias);
        }
        x
    }
}
