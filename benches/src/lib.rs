//! Shared helpers of the criterion benchmarks: models of real size with random weights.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use ipfs_accelerate_bert::{names::tensor_shapes, preset, BertInputs, BertRunner};
use ipfs_accelerate_core::BackendKind;
use ipfs_accelerate_io::RandomWeights;

/// A BERT of a named preset (`bert-base`, `minilm-l6`) with random weights on `device`.
pub fn random_bert<B: Backend>(name: &str, device: &B::Device, kind: BackendKind) -> BertRunner<B> {
    let config = preset(name).unwrap_or_else(|| panic!("unknown preset {name}"));
    let source = Arc::new(RandomWeights::new(tensor_shapes(&config), 0, 0.02));
    BertRunner::load(source, &config, device, kind).expect("random weights match the preset")
}

/// `batch × seq` token ids spread over the vocabulary, full attention, one segment.
pub fn bert_inputs(batch: usize, seq: usize, vocab: usize) -> BertInputs {
    let n = batch * seq;
    BertInputs {
        batch,
        seq,
        input_ids: (0..n).map(|i| ((i * 7919 + 1000) % vocab) as i64).collect(),
        attention_mask: vec![1; n],
        token_type_ids: vec![0; n],
    }
}
