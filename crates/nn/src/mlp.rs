//! Feed-forward blocks.

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::Result;

use crate::{Activation, Linear, VarBuilder};

/// The gated MLP of LLaMA-style decoders: `down(act(gate(x)) * up(x))`, loaded from
/// `gate_proj`, `up_proj` and `down_proj` (HF's `LlamaMLP`, `Qwen2MLP`, `MistralMLP`).
#[derive(Debug, Clone)]
pub struct GatedMlp<B: Backend> {
    gate: Linear<B>,
    up: Linear<B>,
    down: Linear<B>,
    act: Activation,
}

impl<B: Backend> GatedMlp<B> {
    /// Loads the three projections under `vb` (`hidden` → `intermediate` → `hidden`).
    pub fn load(
        vb: &VarBuilder<B>,
        hidden: usize,
        intermediate: usize,
        bias: bool,
        act: Activation,
    ) -> Result<Self> {
        Ok(GatedMlp {
            gate: Linear::load(&vb.pp("gate_proj"), hidden, intermediate, bias)?,
            up: Linear::load(&vb.pp("up_proj"), hidden, intermediate, bias)?,
            down: Linear::load(&vb.pp("down_proj"), intermediate, hidden, bias)?,
            act,
        })
    }

    /// Applies the block over the last dimension of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let gated = self.act.forward(self.gate.forward(x.clone())) * self.up.forward(x);
        self.down.forward(gated)
    }
}
