//! BERT's tensor-name table.

use std::sync::Arc;

use ipfs_accelerate_core::TensorSource;
use ipfs_accelerate_io::NameMap;

/// Legacy spellings found in older (TF-converted) BERT checkpoints, `wanted` → `stored`.
pub const LEGACY_SUFFIXES: &[(&str, &str)] = &[
    ("LayerNorm.weight", "LayerNorm.gamma"),
    ("LayerNorm.bias", "LayerNorm.beta"),
];

/// The prefix under which the encoder's tensors are stored: `bert` / `roberta` for the task
/// heads (`bert.embeddings...`), empty for a bare `BertModel` / `RobertaModel` checkpoint.
pub fn encoder_prefix(source: &dyn TensorSource) -> &'static str {
    ["bert", "roberta"]
        .into_iter()
        .find(|p| source.contains(&format!("{p}.embeddings.word_embeddings.weight")))
        .unwrap_or("")
}

/// The weight source seen through BERT's name table. RoBERTa's sequence-classification head
/// (`classifier.dense`, tanh, `classifier.out_proj` on the first token) is BERT's pooler and
/// classifier under other names, and is read as them.
pub fn bert_names(source: Arc<dyn TensorSource>) -> Arc<dyn TensorSource> {
    let mut map = LEGACY_SUFFIXES
        .iter()
        .fold(NameMap::new(source.clone()), |m, (w, s)| m.alias(w, s));
    if source.contains("classifier.out_proj.weight") {
        map = map
            .layout(
                "roberta.pooler.dense.",
                &["roberta.pooler.dense.", "classifier.dense."],
            )
            .layout(
                "classifier.weight",
                &["classifier.weight", "classifier.out_proj.weight"],
            )
            .layout(
                "classifier.bias",
                &["classifier.bias", "classifier.out_proj.bias"],
            );
    }
    Arc::new(map)
}

/// Every tensor a checkpoint of `config` holds, with its shape, under HF's names (the encoder
/// under `bert.` when the config names a task head). This is BERT's name table.
pub fn tensor_shapes(config: &crate::BertConfig) -> Vec<(String, Vec<usize>)> {
    use crate::BertHead;
    let h = config.hidden_size;
    let head = config.head();
    let p = if head == BertHead::Base { "" } else { "bert." };
    let mut v: Vec<(String, Vec<usize>)> = vec![
        (
            format!("{p}embeddings.word_embeddings.weight"),
            vec![config.vocab_size, h],
        ),
        (
            format!("{p}embeddings.position_embeddings.weight"),
            vec![config.max_position_embeddings, h],
        ),
        (
            format!("{p}embeddings.token_type_embeddings.weight"),
            vec![config.type_vocab_size, h],
        ),
        (format!("{p}embeddings.LayerNorm.weight"), vec![h]),
        (format!("{p}embeddings.LayerNorm.bias"), vec![h]),
    ];
    for i in 0..config.num_hidden_layers {
        let l = format!("{p}encoder.layer.{i}");
        for (name, out, inp) in [
            ("attention.self.query", h, h),
            ("attention.self.key", h, h),
            ("attention.self.value", h, h),
            ("attention.output.dense", h, h),
            ("intermediate.dense", config.intermediate_size, h),
            ("output.dense", h, config.intermediate_size),
        ] {
            v.push((format!("{l}.{name}.weight"), vec![out, inp]));
            v.push((format!("{l}.{name}.bias"), vec![out]));
        }
        for norm in ["attention.output.LayerNorm", "output.LayerNorm"] {
            v.push((format!("{l}.{norm}.weight"), vec![h]));
            v.push((format!("{l}.{norm}.bias"), vec![h]));
        }
    }
    if head != BertHead::TokenClassification && head != BertHead::QuestionAnswering {
        v.push((format!("{p}pooler.dense.weight"), vec![h, h]));
        v.push((format!("{p}pooler.dense.bias"), vec![h]));
    }
    match head {
        BertHead::Base => {}
        BertHead::SequenceClassification | BertHead::TokenClassification => {
            v.push(("classifier.weight".into(), vec![config.num_labels(), h]));
            v.push(("classifier.bias".into(), vec![config.num_labels()]));
        }
        BertHead::QuestionAnswering => {
            v.push(("qa_outputs.weight".into(), vec![2, h]));
            v.push(("qa_outputs.bias".into(), vec![2]));
        }
    }
    v
}
