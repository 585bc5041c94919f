//! The feed-forward block ([`Mlp`]) and the weight names of a pre-norm encoder layer
//! ([`PreLnNames`]: `x + attn(ln1(x))`, then `h + fc2(act(fc1(ln2(h))))`), given per family so
//! every checkpoint layout reads through the same description ([`crate::spec::pre_norm_layer`],
//! run by [`crate::trunk::Trunk`]).

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::Result;

use crate::attention::ProjectionNames;
use crate::{Activation, Linear, VarBuilder};

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
