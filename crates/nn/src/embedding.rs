//! Token / position embedding tables.

use burn::tensor::{backend::Backend, Int, Tensor};
use ipfs_accelerate_core::{Error, Result};

use crate::VarBuilder;

/// A lookup table `[num_embeddings, dim]`.
#[derive(Debug, Clone)]
pub struct Embedding<B: Backend> {
    weight: Tensor<B, 2>,
}

impl<B: Backend> Embedding<B> {
    /// Loads `weight` of shape `[num, dim]` under `vb`.
    pub fn load(vb: &VarBuilder<B>, num: usize, dim: usize) -> Result<Self> {
        Ok(Embedding {
            weight: vb.tensor("weight", [num, dim])?,
        })
    }

    /// Rows in the table.
    pub fn num_embeddings(&self) -> usize {
        self.weight.dims()[0]
    }

    /// The table itself (for tied output projections).
    pub fn weight(&self) -> &Tensor<B, 2> {
        &self.weight
    }

    /// Checks host-side ids against the table size, so a bad id is an error and not an
    /// out-of-bounds read inside a kernel.
    pub fn check_ids(&self, what: &str, ids: &[i64]) -> Result<()> {
        let n = self.num_embeddings() as i64;
        match ids.iter().find(|&&i| i < 0 || i >= n) {
            Some(bad) => Err(Error::InvalidInput(format!(
                "{what} contains {bad}, outside the table of {n} entries"
            ))),
            None => Ok(()),
        }
    }

    /// `ids` `[batch, seq]` → `[batch, seq, dim]`.
    pub fn forward(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        burn::tensor::module::embedding(self.weight.clone(), ids)
    }
}
