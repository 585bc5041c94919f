//! ViT's one description ([`describe`], [`describe_head`]: patch embeddings, pre-norm layers,
//! final layer norm, pooler, classifier), read as host values for engines that do not run
//! through burn (the cuBLAS encoder of the `cuda` feature) or as burn modules for
//! [`crate::VitModel`]. The names come from [`VitLayout`].

use std::path::Path;

use ipfs_accelerate_core::{
    EncoderHead, EncoderInput, EncoderSpec, Error, JsonConfig, NormPlacement, PatchEmbeddings,
    Pooler, Result, TensorSource,
};
use ipfs_accelerate_nn::{
    attention::ProjectionBias,
    spec::{pre_norm_layer, SpecReader, WeightReader},
};

use crate::{VitConfig, VitHead, VitLayout};

/// Reads the ViT checkpoint in `dir` (config.json + safetensors, or a random-weight folder) as an
/// [`EncoderSpec`]. What the engines cannot run (non-square patches, a classification head
/// without labels, whose logits are the class token itself) is an [`Error::InvalidInput`]
/// saying so; such checkpoints run on the burn model.
pub fn encoder_spec(dir: &Path) -> Result<EncoderSpec> {
    let config = VitConfig::from_file(&dir.join("config.json"))?;
    encoder_spec_from(&config, ipfs_accelerate_io::open_weights(dir)?)
}

/// [`encoder_spec`] of a configuration and a weight source.
pub fn encoder_spec_from(
    config: &VitConfig,
    source: std::sync::Arc<dyn TensorSource>,
) -> Result<EncoderSpec> {
    let c = config;
    let unsupported = |what: String| Err(Error::InvalidInput(format!("the encoder spec: {what}")));
    if c.head() == VitHead::ImageClassification && c.num_labels() == 0 {
        return unsupported("a classification head without labels".into());
    }
    let layout = VitLayout::detect(source.as_ref());
    let vit = SpecReader::new(source.as_ref(), layout.prefix);
    let mut spec = describe(&vit, c, &layout)?;
    spec.head = describe_head(&SpecReader::new(source.as_ref(), ""), c)?;
    spec.validate()?;
    Ok(spec)
}

/// ViT's trunk, the one description of its architecture: patch embeddings with the class
/// token and positions, pre-norm layers, the final layer norm and the pooler (when the
/// checkpoint has one), read by `vit` (rooted where `embeddings.` lives, in `layout`) as host
/// values for the engines ([`SpecReader`]) or as burn modules for [`crate::VitModel`]. Patches
/// must be square (`patch_size` may be a pair).
pub fn describe<R: WeightReader>(
    vit: &R,
    c: &VitConfig,
    layout: &VitLayout,
) -> Result<EncoderSpec<R::Dense, R::Norm, R::Table>> {
    let (ph, pw) = c.patch_size.hw();
    if ph != pw {
        return Err(Error::InvalidInput(format!(
            "ViT with patches of {ph}x{pw}: only square patches are supported"
        )));
    }
    let (h, i, p, ch) = (
        c.hidden_size,
        c.intermediate_size,
        c.patch(),
        c.num_channels,
    );
    let eps = c.layer_norm_eps;
    let (rows, cols) = c.grid();
    let emb = vit.under("embeddings");
    let input = EncoderInput::Patches(PatchEmbeddings {
        channels: ch,
        patch: p,
        image: c.image_size.hw(),
        projection: emb.flattened("patch_embeddings.projection", h, &[ch, p, p], true)?,
        class: emb.table("cls_token", &[1, 1, h])?,
        position: emb.table("position_embeddings", &[1, rows * cols + 1, h])?,
    });
    let layers = (0..c.num_hidden_layers)
        .map(|n| {
            let layer = vit.under(&format!("{}.{n}", layout.layers));
            let bias = ProjectionBias::qkv(c.qkv_bias);
            pre_norm_layer(&layer, &layout.names, (h, i), bias, eps)
        })
        .collect::<Result<Vec<_>>>()?;
    let pooler = if vit.holds("pooler.dense.weight") {
        let out = c.pooler_output_size.unwrap_or(h);
        Some(Pooler {
            dense: vit.linear("pooler.dense", out, h, true)?,
            activation: c.pooler_act,
        })
    } else {
        None
    };
    Ok(EncoderSpec {
        family: "vit".into(),
        hidden: h,
        heads: c.num_attention_heads,
        intermediate: i,
        eps: eps as f32,
        activation: c.hidden_act,
        input,
        embedding_norm: None,
        norm: NormPlacement::Pre,
        layers,
        final_norm: Some(vit.layer_norm("layernorm", h, eps)?),
        pooler,
        head: None,
        causal: false,
        projection: None,
    })
}

/// `ViTForImageClassification`'s classifier over the final-normed class token, read by `root`
/// (where `classifier.` lives); `None` for a bare `ViTModel` or a head without labels.
pub fn describe_head<R: WeightReader>(
    root: &R,
    c: &VitConfig,
) -> Result<Option<EncoderHead<R::Dense>>> {
    Ok(match c.head() {
        VitHead::ImageClassification if c.num_labels() > 0 => Some(EncoderHead::FirstToken(
            root.linear("classifier", c.num_labels(), c.hidden_size, true)?,
        )),
        _ => None,
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
            "vit",
            encoder_spec,
        );
    }

    #[test]
    fn fixtures_read_as_specs_holding_the_checkpoint_tensors() {
        for fixture in ipfs_accelerate_conformance::family_fixtures("encoder_spec", "vit") {
            let config = VitConfig::from_file(&fixture.dir.join("config.json")).unwrap();
            let spec = encoder_spec(&fixture.dir).unwrap();
            assert_eq!(spec.layers.len(), config.num_hidden_layers);
            assert_eq!(spec.norm, NormPlacement::Pre);
            assert_eq!(
                spec.head.as_ref().map(|c| c.dense().out_features),
                (config.head() == VitHead::ImageClassification).then(|| config.num_labels())
            );
            let weights = ipfs_accelerate_io::open_weights(&fixture.dir).unwrap();
            let layout = VitLayout::detect(weights.as_ref());
            let p = if layout.prefix.is_empty() { "" } else { "vit." };
            let last = config.num_hidden_layers - 1;
            let EncoderInput::Patches(patches) = &spec.input else {
                panic!("ViT reads patches")
            };
            for (name, got) in [
                (
                    format!("{p}embeddings.patch_embeddings.projection.weight"),
                    &patches.projection.weight,
                ),
                (
                    format!("{p}{}.{last}.{}.weight", layout.layers, layout.names.fc2),
                    &spec.layers[last].output.weight,
                ),
                (
                    format!("{p}{}.0.{}.bias", layout.layers, layout.names.norm1),
                    &spec.layers[0].attention_norm.beta,
                ),
            ] {
                assert_eq!(&weights.tensor(&name).unwrap().to_f32_vec(), got, "{name}");
            }
        }
    }
}
