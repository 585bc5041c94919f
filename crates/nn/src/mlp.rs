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

/// The three projections' names under a gated MLP's prefix: gate, up, down.
pub const GATED_MLP_NAMES: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

impl<B: Backend> GatedMlp<B> {
    /// Quantizes the three projections (see [`Linear::quantize`]).
    pub fn quantize(&mut self, q: crate::WeightQuantization) -> Result<()> {
        for l in [&mut self.gate, &mut self.up, &mut self.down] {
            l.quantize(q)?;
        }
        Ok(())
    }

    /// Bytes the projections' weights take in memory.
    pub fn weight_bytes(&self) -> usize {
        [&self.gate, &self.up, &self.down]
            .iter()
            .map(|l| l.weight_bytes())
            .sum()
    }

    /// Loads the three projections under `vb` (`hidden` → `intermediate` → `hidden`).
    pub fn load(
        vb: &VarBuilder<B>,
        hidden: usize,
        intermediate: usize,
        bias: bool,
        act: Activation,
    ) -> Result<Self> {
        let [gate, up, down] = GATED_MLP_NAMES;
        Ok(GatedMlp {
            gate: Linear::load(&vb.pp(gate), hidden, intermediate, bias)?,
            up: Linear::load(&vb.pp(up), hidden, intermediate, bias)?,
            down: Linear::load(&vb.pp(down), intermediate, hidden, bias)?,
            act,
        })
    }

    /// Applies the block over the last dimension of `x`.
    pub fn forward<const D: usize>(&self, x: Tensor<B, D>) -> Tensor<B, D> {
        let gated = self.gate.forward_act(x.clone(), self.act) * self.up.forward(x);
        self.down.forward(gated)
    }
}
