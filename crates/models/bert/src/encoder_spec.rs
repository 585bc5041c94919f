//! BERT's one description ([`describe`], [`describe_head`]): a backend-neutral [`EncoderSpec`]
//! read as host values for engines that do not run through burn (the cuBLAS encoder of the
//! `cuda` feature), or as burn modules for [`crate::BertModel`].

use std::path::Path;

use ipfs_accelerate_core::{
    EncoderHead, EncoderInput, EncoderLayerWeights, EncoderSpec, JsonConfig, NormPlacement, Pooler,
    Result, TensorSource, TokenEmbeddings,
};
use ipfs_accelerate_nn::spec::{SpecReader, WeightReader};

use crate::{names, BertConfig, BertHead};

/// Reads the BERT checkpoint in `dir` (config.json + safetensors, or a random-weight folder) as
/// an [`EncoderSpec`], with its task head (sequence classification over the pooled output, token
/// classification, question answering) when it has one. RoBERTa-family checkpoints number their
/// positions from `pad_token_id + 1` ([`TokenEmbeddings::padding_idx`]).
pub fn encoder_spec(dir: &Path) -> Result<EncoderSpec> {
    let config = BertConfig::from_file(&dir.join("config.json"))?;
    encoder_spec_from(&config, ipfs_accelerate_io::open_weights(dir)?)
}

/// [`encoder_spec`] of a configuration and a weight source (a folder's files, or weights held in
/// memory such as the embedded model's).
pub fn encoder_spec_from(
    config: &BertConfig,
    source: std::sync::Arc<dyn TensorSource>,
) -> Result<EncoderSpec> {
    let prefix = names::encoder_prefix(source.as_ref());
    encoder_spec_under(config, source, prefix)
}

/// [`encoder_spec_from`] with the encoder's tensors under `prefix` (`text_model` for CLAP's
/// text tower, a RoBERTa trunk inside another model).
pub fn encoder_spec_under(
    config: &BertConfig,
    source: std::sync::Arc<dyn TensorSource>,
    prefix: &str,
) -> Result<EncoderSpec> {
    let source = names::bert_names(source);
    let mut spec = describe(&SpecReader::new(source.as_ref(), prefix), config)?;
    // The heads sit beside the encoder (`classifier.`, `qa_outputs.`).
    spec.head = describe_head(&SpecReader::new(source.as_ref(), ""), config)?;
    spec.validate()?;
    Ok(spec)
}

/// BERT's trunk, the one description of its architecture: embeddings, post-norm layers and the
/// pooler (when the checkpoint has one), read by `reader` (rooted where `embeddings.` and
/// `encoder.` live) as host values for the engines ([`SpecReader`]) or as burn modules for
/// [`crate::BertModel`]. Task heads come from [`describe_head`].
pub fn describe<R: WeightReader>(
    reader: &R,
    config: &BertConfig,
) -> Result<EncoderSpec<R::Dense, R::Norm, R::Table>> {
    let (h, i) = (config.hidden_size, config.intermediate_size);
    let eps = config.layer_norm_eps;
    let mut layers = Vec::with_capacity(config.num_hidden_layers);
    for n in 0..config.num_hidden_layers {
        let l = reader.under(&format!("encoder.layer.{n}"));
        layers.push(EncoderLayerWeights {
            query: l.linear("attention.self.query", h, h, true)?,
            key: l.linear("attention.self.key", h, h, true)?,
            value: l.linear("attention.self.value", h, h, true)?,
            attention_output: l.linear("attention.output.dense", h, h, true)?,
            attention_norm: l.layer_norm("attention.output.LayerNorm", h, eps)?,
            intermediate: l.linear("intermediate.dense", i, h, true)?,
            output: l.linear("output.dense", h, i, true)?,
            output_norm: l.layer_norm("output.LayerNorm", h, eps)?,
            messages: None,
        });
    }
    let pooler = if reader.holds("pooler.dense.weight") {
        Some(Pooler::tanh(reader.linear("pooler.dense", h, h, true)?))
    } else {
        None
    };
    let e = reader.under("embeddings");
    Ok(EncoderSpec {
        family: "bert".into(),
        hidden: h,
        heads: config.num_attention_heads,
        intermediate: i,
        eps: eps as f32,
        activation: config.hidden_act,
        input: EncoderInput::Tokens(TokenEmbeddings {
            vocab: config.vocab_size,
            max_positions: config.max_position_embeddings,
            type_vocab: config.type_vocab_size,
            word: e.table("word_embeddings.weight", &[config.vocab_size, h])?,
            position: e.table(
                "position_embeddings.weight",
                &[config.max_position_embeddings, h],
            )?,
            token_type: match config.type_vocab_size {
                0 => None,
                n => Some(e.table("token_type_embeddings.weight", &[n, h])?),
            },
            padding_idx: config.position_padding_idx(),
        }),
        embedding_norm: Some(e.layer_norm("LayerNorm", h, eps)?),
        norm: NormPlacement::Post,
        layers,
        final_norm: None,
        pooler,
        head: None,
        causal: false,
        projection: None,
    })
}

/// The task head `config` names (sequence classification over the pooled output, token
/// classification, question answering), read by `root` (where `classifier.` and `qa_outputs.`
/// live), or `None` for a bare encoder.
pub fn describe_head<R: WeightReader>(
    root: &R,
    config: &BertConfig,
) -> Result<Option<EncoderHead<R::Dense>>> {
    let (h, labels) = (config.hidden_size, config.num_labels());
    Ok(match config.head() {
        BertHead::Base => None,
        BertHead::SequenceClassification => Some(EncoderHead::Pooled(root.linear(
            "classifier",
            labels,
            h,
            true,
        )?)),
        BertHead::TokenClassification => Some(EncoderHead::EveryToken(root.linear(
            "classifier",
            labels,
            h,
            true,
        )?)),
        BertHead::QuestionAnswering => {
            Some(EncoderHead::Span(root.linear("qa_outputs", 2, h, true)?))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The spec, executed by its f64 reference, computes every fixture's outputs (the
    /// description itself is checked, without the GPU engine that runs it).
    #[test]
    fn the_spec_computes_hf_outputs() {
        ipfs_accelerate_conformance::assert_spec_computes_fixtures(
            "the_spec_computes_hf_outputs",
            "bert",
            encoder_spec,
        );
    }

    #[test]
    fn fixtures_read_as_specs_holding_the_checkpoint_tensors() {
        let fixtures = ipfs_accelerate_conformance::family_fixtures("encoder_spec", "bert");
        for fixture in fixtures {
            let config = BertConfig::from_file(&fixture.dir.join("config.json")).unwrap();
            let spec = encoder_spec(&fixture.dir).unwrap();
            let weights = ipfs_accelerate_io::open_weights(&fixture.dir).unwrap();
            let head_name = match (&spec.head, config.head()) {
                (None, BertHead::Base) => None,
                (Some(EncoderHead::Pooled(_)), BertHead::SequenceClassification)
                | (Some(EncoderHead::EveryToken(_)), BertHead::TokenClassification) => {
                    Some("classifier.weight")
                }
                (Some(EncoderHead::Span(_)), BertHead::QuestionAnswering) => {
                    Some("qa_outputs.weight")
                }
                (got, want) => panic!("{}: head {got:?} for {want:?}", fixture.variant),
            };
            if let (Some(name), Some(head)) = (head_name, &spec.head) {
                assert_eq!(
                    &weights.tensor(name).unwrap().to_f32_vec(),
                    &head.dense().weight,
                    "{}",
                    fixture.variant
                );
            }
            assert_eq!(spec.layers.len(), config.num_hidden_layers);
            assert_eq!(
                (spec.hidden, spec.heads),
                (config.hidden_size, config.num_attention_heads)
            );
            let last = config.num_hidden_layers - 1;
            for (name, got) in [
                (
                    "embeddings.word_embeddings.weight",
                    match &spec.input {
                        EncoderInput::Tokens(t) => &t.word,
                        _ => unreachable!("BERT reads tokens"),
                    },
                ),
                (
                    &format!("encoder.layer.{last}.output.dense.weight") as &str,
                    &spec.layers[last].output.weight,
                ),
                (
                    &format!("encoder.layer.{last}.attention.self.value.bias") as &str,
                    &spec.layers[last].value.bias,
                ),
            ] {
                // A checkpoint with a head keeps the encoder under `bert.`.
                let name = match names::encoder_prefix(weights.as_ref()) {
                    "" => name.to_string(),
                    p => format!("{p}.{name}"),
                };
                assert_eq!(&weights.tensor(&name).unwrap().to_f32_vec(), got, "{name}");
            }
        }
    }

    #[test]
    fn a_random_weight_folder_reads_as_a_spec() {
        let dir = std::env::temp_dir().join(format!("bert-spec-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let config = r#"{"model_type": "bert", "vocab_size": 50, "hidden_size": 16,
            "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 32,
            "max_position_embeddings": 20, "hidden_act": "gelu_new"}"#;
        std::fs::write(dir.join("config.json"), config).unwrap();
        std::fs::write(
            dir.join(ipfs_accelerate_io::RANDOM_INIT_FILE),
            r#"{"seed": 1, "std": 0.02}"#,
        )
        .unwrap();
        let spec = encoder_spec(&dir);
        std::fs::remove_dir_all(&dir).ok();
        let spec = spec.unwrap();
        assert_eq!(
            spec.activation,
            ipfs_accelerate_core::EncoderActivation::GeluTanh
        );
        assert_eq!(spec.layers[1].intermediate.weight.len(), 32 * 16);
        let EncoderInput::Tokens(t) = &spec.input else {
            unreachable!("BERT reads tokens")
        };
        assert!(t.word.iter().any(|&v| v != 0.0));
    }
}
