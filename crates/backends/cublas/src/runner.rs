//! The engine behind the uniform [`ModelRunner`] interface: HF input names in, HF output names
//! out, every input checked before it reaches the GPU.

use cudarc::cublas::{CudaBlas, Gemm};
use ipfs_accelerate_core::{
    BackendKind, EncoderSpec, Error, ModelRunner, Precision, Result, TensorMap, TokenBatch,
};

use crate::engine::{Elem, Encoder, EncoderOutput, Tokens};
use crate::{probe, EngineError};

/// An encoder of either storage type.
trait Forward: Send {
    fn forward(&self, tokens: &Tokens<'_>) -> Result<EncoderOutput, EngineError>;
    fn memory_in_use(&self) -> Option<u64>;
}

impl<T: Elem> Forward for Encoder<T>
where
    CudaBlas: Gemm<T>,
{
    fn forward(&self, tokens: &Tokens<'_>) -> Result<EncoderOutput, EngineError> {
        Encoder::forward(self, tokens)
    }
    fn memory_in_use(&self) -> Option<u64> {
        Encoder::memory_in_use(self)
    }
}

/// A BERT-style encoder loaded on CUDA device 0 through cuBLAS, run as a [`ModelRunner`]
/// (`input_ids`, `attention_mask`, `token_type_ids` → `last_hidden_state`, `pooler_output`).
pub struct EncoderRunner {
    family: String,
    vocab: usize,
    type_vocab: usize,
    max_positions: usize,
    precision: Precision,
    /// One call at a time: the engine's stream and scratch buffers are shared by its calls.
    engine: std::sync::Mutex<Box<dyn Forward>>,
}

impl EncoderRunner {
    /// Probes libcuda / NVRTC / cuBLAS, checks `spec`, compiles the kernels and uploads the
    /// weights in `precision` (f32 or f16).
    pub fn load(spec: &EncoderSpec, precision: Precision) -> Result<Self, EngineError> {
        probe()?;
        let engine: Box<dyn Forward> = match precision {
            Precision::F32 => Box::new(Encoder::<f32>::load(spec, 0)?),
            Precision::F16 => Box::new(Encoder::<half::f16>::load(spec, 0)?),
            other => return Err(EngineError::Precision(other.name().into())),
        };
        Ok(EncoderRunner {
            family: spec.family.clone(),
            vocab: spec.vocab,
            type_vocab: spec.type_vocab,
            max_positions: spec.max_positions,
            precision,
            engine: std::sync::Mutex::new(engine),
        })
    }

    /// The precision it computes in.
    pub fn precision(&self) -> Precision {
        self.precision
    }
}

/// `values` as i32, each checked to be in `0..limit`.
fn checked_ids(name: &str, values: &[i64], limit: usize) -> Result<Vec<i32>> {
    values
        .iter()
        .map(|&v| {
            if v < 0 || v as u64 >= limit as u64 {
                Err(Error::InvalidInput(format!(
                    "{name} holds {v}, outside 0..{limit}"
                )))
            } else {
                Ok(v as i32)
            }
        })
        .collect()
}

impl ModelRunner for EncoderRunner {
    fn family(&self) -> &str {
        &self.family
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn engine(&self) -> Option<&str> {
        Some("cublas")
    }

    fn device_memory_in_use(&self) -> Option<u64> {
        self.engine.lock().ok()?.memory_in_use()
    }

    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        let t = TokenBatch::from_tensors(inputs)?;
        if t.batch == 0 || t.seq == 0 {
            return Err(Error::InvalidInput(format!(
                "empty input: input_ids is [{}, {}]",
                t.batch, t.seq
            )));
        }
        if t.seq > crate::engine::MAX_KEYS {
            return Err(Error::InvalidInput(format!(
                "sequence of {} tokens exceeds the cuBLAS encoder's {} keys per attention row",
                t.seq,
                crate::engine::MAX_KEYS
            )));
        }
        if t.seq > self.max_positions {
            return Err(Error::InvalidInput(format!(
                "sequence of {} tokens exceeds max_position_embeddings {}",
                t.seq, self.max_positions
            )));
        }
        let types = t.optional(inputs, "token_type_ids", 0)?;
        let ids = checked_ids("input_ids", &t.input_ids, self.vocab)?;
        let types = checked_ids("token_type_ids", &types, self.type_vocab)?;
        let mask: Vec<i32> = t.attention_mask.iter().map(|&m| (m != 0) as i32).collect();
        let engine = self
            .engine
            .lock()
            .map_err(|_| Error::Compute("the cuBLAS encoder failed in another thread".into()))?;
        let out = engine.forward(&Tokens {
            batch: t.batch,
            seq: t.seq,
            ids: &ids,
            types: &types,
            mask: &mask,
        })?;
        let mut map = TensorMap::new();
        map.insert("last_hidden_state".into(), out.last_hidden_state);
        if let Some(p) = out.pooler_output {
            map.insert("pooler_output".into(), p);
        }
        Ok(map)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_outside_the_vocabulary_are_named_errors() {
        assert_eq!(checked_ids("input_ids", &[0, 4], 5).unwrap(), vec![0, 4]);
        let e = checked_ids("input_ids", &[0, 5], 5)
            .unwrap_err()
            .to_string();
        assert!(e.contains("input_ids holds 5, outside 0..5"), "{e}");
        let e = checked_ids("token_type_ids", &[-1], 2)
            .unwrap_err()
            .to_string();
        assert!(e.contains("token_type_ids holds -1"), "{e}");
    }
}
