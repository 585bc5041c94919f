//! LLaVA for engines that do not run through burn (the cuBLAS engines of the `cuda` feature): the
//! vision tower read at `vision_feature_layer` with the projector as its head
//! ([`tower_spec`]), the language model ([`text_spec`]), and the host steps between them that
//! every executor shares with the burn model: feature selection and LLaVA-NeXT's packing
//! ([`image_features_with`]) and the splice at the image tokens ([`image_slots`]).

use std::sync::Arc;

use half::{bf16, f16};
use ipfs_accelerate_core::{
    DType, DecoderSpec, EncoderHead, EncoderSpec, Error, HostTensor, Result, TensorSource,
};
use ipfs_accelerate_nn::spec::SpecReader;

use crate::config::{LlavaConfig, LlavaVariant};
use crate::model::anyres_views;
use crate::names::LlavaWeights;

/// The vision tower read at the checkpoint's one `vision_feature_layer`, the projector
/// (`linear_1` → `projector_hidden_act` → `linear_2`) as its head over every token: its `logits`
/// are each view's projected features `[views, tokens, text_hidden]`, class token included.
/// Several feature layers (concatenated by HF) are not one tower pass: an error.
pub fn tower_spec(config: &LlavaConfig, source: Arc<dyn TensorSource>) -> Result<EncoderSpec> {
    let layers = match config.feature_layers()[..] {
        [one] => one,
        _ => {
            return Err(Error::InvalidInput(format!(
                "vision_feature_layer {:?} concatenates several hidden states",
                config.vision_feature_layer
            )))
        }
    };
    let weights = LlavaWeights::wrap(source);
    let v = &config.vision_config;
    let text_hidden = config.text_config.hidden_size;
    let p = SpecReader::new(&weights, "multi_modal_projector");
    let bias = config.multimodal_projector_bias;
    let head = EncoderHead::EveryTokenMlp {
        up: p.dense_with("linear_1", text_hidden, v.hidden_size, bias)?,
        activation: config.projector_hidden_act,
        down: p.dense_with("linear_2", text_hidden, text_hidden, bias)?,
    };
    let mut spec = ipfs_accelerate_clip::vision_hidden_state_spec(
        v,
        &weights,
        "vision_tower",
        layers,
        Some(head),
    )?;
    spec.family = config.variant.name().into();
    Ok(spec)
}

/// The language model's [`DecoderSpec`] (LLaMA, Mistral or Qwen2 under LLaVA's names).
pub fn text_spec(config: &LlavaConfig, source: Arc<dyn TensorSource>) -> Result<DecoderSpec> {
    let weights = LlavaWeights::wrap(source);
    ipfs_accelerate_llama::decoder_spec_from(&config.text_config, &weights)
}

/// LLaVA-NeXT's `image_newline` `[text_hidden]` (none for LLaVA-1.5).
pub fn image_newline(
    config: &LlavaConfig,
    source: Arc<dyn TensorSource>,
) -> Result<Option<Vec<f32>>> {
    match config.variant {
        LlavaVariant::Llava => Ok(None),
        LlavaVariant::LlavaNext => {
            let weights = LlavaWeights::wrap(source);
            let h = config.text_config.hidden_size;
            Ok(Some(
                SpecReader::new(&weights, "").read("image_newline", &[h])?,
            ))
        }
    }
}

/// The images' features in the order they replace the image tokens: `values` `[rows,
/// text_hidden]` in the dtype the tower computed them in, `counts` the rows of each image.
#[derive(Debug, Clone)]
pub struct ImageFeatures {
    /// Every image's feature rows, one after the other.
    pub values: HostTensor,
    /// Rows per image.
    pub counts: Vec<usize>,
}

/// The images' features from `pixel_values` (and LLaVA-NeXT's `image_sizes`, see
/// [`crate::LlavaModel::image_features`] for the shapes): `project` runs the views
/// `[views, channels, size, size]` through [`tower_spec`] and returns its `logits`
/// `[views, tokens, text_hidden]` (f32, f16 or bf16); the class token is dropped with the
/// `default` strategy and LLaVA-NeXT's tiles packed with `newline` as HF's `pack_image_features`
/// does. The rows are gathered in one pass, in the dtype `project` returned.
pub fn image_features_with(
    config: &LlavaConfig,
    newline: Option<&[f32]>,
    pixels: &HostTensor,
    image_sizes: Option<&HostTensor>,
    project: impl FnOnce(&HostTensor) -> Result<HostTensor>,
) -> Result<ImageFeatures> {
    let d = config.text_config.hidden_size;
    let tokens = config.tokens_per_view();
    // Each image's rows: `Some(view, token)` of the projected views (after selection), or
    // `None` for the newline.
    let (views, layouts) = match config.variant {
        LlavaVariant::Llava => (std::borrow::Cow::Borrowed(pixels), Vec::new()),
        LlavaVariant::LlavaNext => {
            // (The config's validation refuses LLaVA-NeXT with the `full` strategy.)
            let (views, layouts) = anyres_views(config, pixels, image_sizes)?;
            (std::borrow::Cow::Owned(views), layouts)
        }
    };
    let count = views.shape().first().copied().unwrap_or(0);
    let images: Vec<Vec<Option<(usize, usize)>>> = match config.variant {
        LlavaVariant::Llava => (0..count)
            .map(|v| (0..tokens).map(|t| Some((v, t))).collect())
            .collect(),
        LlavaVariant::LlavaNext => {
            let mut first = 0;
            layouts
                .iter()
                .map(|layout| {
                    let rows = layout
                        .packed_rows(tokens)
                        .into_iter()
                        .map(|r| r.map(|r| (first + r / tokens, r % tokens)))
                        .collect();
                    first += layout.views();
                    rows
                })
                .collect()
        }
    };
    let projected = project(&views)?;
    let shape = projected.shape().to_vec();
    let all = shape.get(1).copied().unwrap_or(0);
    if shape.len() != 3 || shape[0] != count || shape[2] != d || all < tokens {
        return Err(Error::Compute(format!(
            "the vision tower gave features of shape {shape:?} for {count} views of {tokens} \
             features of width {d}"
        )));
    }
    let dtype = projected.dtype();
    let width = d * dtype.size();
    let newline: Vec<u8> = match newline {
        None => Vec::new(),
        Some(n) if n.len() != d => {
            return Err(Error::Compute(format!(
                "image_newline of {} values for features of width {d}",
                n.len()
            )))
        }
        Some(n) => match dtype {
            DType::F32 => n.iter().flat_map(|v| v.to_le_bytes()).collect(),
            DType::F16 => n
                .iter()
                .flat_map(|&v| f16::from_f32(v).to_le_bytes())
                .collect(),
            DType::BF16 => n
                .iter()
                .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
                .collect(),
            other => {
                return Err(Error::Compute(format!(
                    "the vision tower gave {other} features"
                )))
            }
        },
    };
    let skip = all - tokens;
    let source = &projected.bytes()[..];
    let rows: usize = images.iter().map(Vec::len).sum();
    let mut values = Vec::with_capacity(rows * width);
    for row in images.iter().flatten() {
        match *row {
            Some((view, token)) => {
                let at = (view * all + skip + token) * width;
                values.extend_from_slice(&source[at..at + width]);
            }
            None if newline.is_empty() => {
                return Err(Error::Compute(
                    "LLaVA-NeXT model without image_newline".into(),
                ))
            }
            None => values.extend_from_slice(&newline),
        }
    }
    Ok(ImageFeatures {
        values: HostTensor::from_bytes("image features", vec![rows, d], dtype, values.into())?,
        counts: images.iter().map(Vec::len).collect(),
    })
}

/// The positions of `ids` (row-major, any shape) that image features replace: every
/// `image_token_id` not masked out as padding (HF's `masked_scatter` order). Their number must
/// equal the `features` rows the images give.
pub fn image_slots(
    config: &LlavaConfig,
    ids: &[i64],
    mask: Option<&[i64]>,
    features: usize,
) -> Result<Vec<usize>> {
    let image = config.image_token_id;
    let slots: Vec<usize> = ids
        .iter()
        .enumerate()
        .filter(|&(i, &id)| id == image && mask.is_none_or(|m| m.get(i) != Some(&0)))
        .map(|(i, _)| i)
        .collect();
    if slots.len() != features {
        return Err(Error::InvalidInput(format!(
            "image features and image tokens do not match: the prompt holds {} image tokens \
             (id {image}), the images give {features} features",
            slots.len()
        )));
    }
    Ok(slots)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipfs_accelerate_conformance::{family_fixtures, relative_error, SpecReference};
    use ipfs_accelerate_core::{ModelRunner, TensorMap};

    /// The specs, executed by their f64 references with the host steps between them, compute
    /// HF's logits for every LLaVA and LLaVA-NeXT fixture: what an engine executing the specs
    /// must reproduce.
    #[test]
    fn the_specs_compute_hf_logits() {
        let mut seen = 0;
        for (family, variant) in [
            ("llava", LlavaVariant::Llava),
            ("llava_next", LlavaVariant::LlavaNext),
        ] {
            for fixture in family_fixtures("llava specs", family) {
                let config =
                    LlavaConfig::from_file_as(&fixture.dir.join("config.json"), variant).unwrap();
                let weights = ipfs_accelerate_io::open_weights(&fixture.dir).unwrap();
                let tower =
                    SpecReference::new(tower_spec(&config, weights.clone()).unwrap()).unwrap();
                let text = text_spec(&config, weights.clone()).unwrap();
                let newline = image_newline(&config, weights).unwrap();
                let inputs = fixture.inputs().unwrap();
                let features = image_features_with(
                    &config,
                    newline.as_deref(),
                    &inputs["pixel_values"],
                    inputs.get("image_sizes"),
                    |views| {
                        let mut map = TensorMap::new();
                        map.insert("pixel_values".into(), views.clone());
                        Ok(tower.run(&map)?.remove("logits").unwrap())
                    },
                )
                .unwrap();
                let d = config.text_config.hidden_size;
                let values = features.values.to_f32_vec();
                let rows: Vec<&[f32]> = values.chunks(d).collect();
                let ids_t = &inputs["input_ids"];
                let seq = ids_t.shape()[1];
                let ids = ids_t.to_i64_vec().unwrap();
                let slots = image_slots(&config, &ids, None, rows.len()).unwrap();
                let mut next = slots.iter().zip(rows).peekable();
                let mut got = Vec::new();
                for (r, row) in ids.chunks(seq).enumerate() {
                    let mut replaced = Vec::new();
                    while let Some((&slot, values)) = next.next_if(|(s, _)| **s < (r + 1) * seq) {
                        replaced.push((slot - r * seq, values));
                    }
                    let logits = text
                        .reference_logits_replacing(row, None, &replaced)
                        .unwrap();
                    got.extend(logits.into_iter().flatten());
                }
                let reference = fixture.reference().unwrap();
                let want = reference.raw("logits").unwrap().to_f64_vec();
                let err = relative_error(&got, &want);
                let tol = fixture.meta().unwrap().tolerance["logits"];
                assert!(err <= tol, "{family}: relative error {err} > {tol}");
                if let Ok(count) = reference.raw("image_feature_count") {
                    let counts: Vec<i64> = features.counts.iter().map(|&c| c as i64).collect();
                    assert_eq!(counts, count.to_i64_vec().unwrap());
                }
                seen += 1;
            }
        }
        assert!(seen > 0 || ipfs_accelerate_conformance::shared_dir("llava specs").is_none());
    }

    #[test]
    fn several_feature_layers_are_not_one_tower() {
        let text = r#"{"model_type": "llava", "vision_feature_layer": [-2, -1],
            "vision_config": {"hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
                "num_attention_heads": 2, "image_size": 8, "patch_size": 4},
            "text_config": {"model_type": "llama", "vocab_size": 40, "hidden_size": 8,
                "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2},
            "image_token_id": 39}"#;
        let config =
            LlavaConfig::from_json_as(text, std::path::Path::new("c"), LlavaVariant::Llava)
                .unwrap();
        let empty = ipfs_accelerate_io::WeightStore::from_files(Vec::new()).unwrap();
        let e = tower_spec(&config, empty.into_source()).unwrap_err();
        assert!(e.to_string().contains("several hidden states"), "{e}");
    }
}
