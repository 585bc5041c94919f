//! Token / position embedding tables.

use std::sync::OnceLock;

use burn::tensor::{backend::Backend, Int, Tensor, TensorData};
use ipfs_accelerate_core::{Error, Result};

use crate::{Linear, LinearWeight, VarBuilder};

/// A lookup table `[num_embeddings, dim]`: f32, or the ggml blocks of a GGUF file on the CPU
/// backend (see [`crate::ggml`]; a lookup dequantizes the rows it reads).
#[derive(Debug, Clone)]
pub struct Embedding<B: Backend> {
    table: Table<B>,
}

#[derive(Debug, Clone)]
enum Table<B: Backend> {
    Float(Tensor<B, 2>),
    /// The blocks as a `[num, dim]` linear weight (so a tied head shares them), and the f32
    /// table once [`Embedding::weight`] asked for it.
    Ggml {
        blocks: LinearWeight<B>,
        float: OnceLock<Tensor<B, 2>>,
    },
}

impl<B: Backend> Embedding<B> {
    /// Loads `weight` of shape `[num, dim]` under `vb`: as the source's ggml blocks when
    /// [`VarBuilder::ggml_table`] offers them, else f32.
    pub fn load(vb: &VarBuilder<B>, num: usize, dim: usize) -> Result<Self> {
        if let Some(blocks) = vb.ggml_table("weight", num, dim)? {
            return Ok(Embedding {
                table: Table::Ggml {
                    blocks,
                    float: OnceLock::new(),
                },
            });
        }
        Ok(Embedding {
            table: Table::Float(vb.tensor("weight", [num, dim])?),
        })
    }

    /// A float table `[num, dim]` as it is (a class token, position embeddings).
    pub fn from_table(weight: Tensor<B, 2>) -> Self {
        Embedding {
            table: Table::Float(weight),
        }
    }

    /// Rows in the table.
    pub fn num_embeddings(&self) -> usize {
        match &self.table {
            Table::Float(w) => w.dims()[0],
            Table::Ggml { blocks, .. } => blocks.out_dim(),
        }
    }

    /// The width of an embedding.
    pub fn dim(&self) -> usize {
        match &self.table {
            Table::Float(w) => w.dims()[1],
            Table::Ggml { blocks, .. } => blocks.in_dim(),
        }
    }

    /// The table itself as f32 (a ggml table is dequantized once, on the first call, and that
    /// copy is kept: prefer [`tied_head`](Self::tied_head) for a tied output projection).
    pub fn weight(&self) -> &Tensor<B, 2> {
        match &self.table {
            Table::Float(w) => w,
            Table::Ggml { blocks, float } => float.get_or_init(|| blocks.matrix().transpose()),
        }
    }

    /// The table's ggml blocks, when it is kept that way.
    pub fn ggml(&self) -> Option<&LinearWeight<B>> {
        match &self.table {
            Table::Float(_) => None,
            Table::Ggml { blocks, .. } => Some(blocks),
        }
    }

    /// A bias-free output projection `dim → num` on this table (tied word embeddings): on the
    /// same blocks when the table is ggml, else a transposed f32 copy.
    pub fn tied_head(&self) -> Linear<B> {
        match &self.table {
            Table::Float(w) => Linear::from_tensors(w.clone(), None),
            Table::Ggml { blocks, .. } => Linear::from_weight(blocks.clone(), None),
        }
    }

    /// Bytes the table takes as kept (blocks, or f32).
    pub fn bytes(&self) -> usize {
        match &self.table {
            Table::Float(w) => w.shape().num_elements() * w.dtype().size(),
            Table::Ggml { blocks, .. } => blocks.bytes(),
        }
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

    /// `ids` `[batch, seq]` → `[batch, seq, dim]` (a ggml table gives zeros for ids outside it:
    /// check them first with [`check_ids`](Self::check_ids)).
    pub fn forward(&self, ids: Tensor<B, 2, Int>) -> Tensor<B, 3> {
        match &self.table {
            Table::Float(w) => burn::tensor::module::embedding(w.clone(), ids),
            Table::Ggml { blocks, .. } => {
                let [batch, seq] = ids.dims();
                let device = ids.device();
                let ids = ids
                    .into_data()
                    .convert::<i64>()
                    .to_vec::<i64>()
                    .unwrap_or_default();
                let rows = match blocks.ggml() {
                    Some(g) => g.gather(&ids),
                    None => Vec::new(),
                };
                let dim = blocks.in_dim();
                let mut values = rows;
                values.resize(batch * seq * dim, 0.0);
                Tensor::from_data(TensorData::new(values, [batch, seq, dim]), &device)
            }
        }
    }
}
