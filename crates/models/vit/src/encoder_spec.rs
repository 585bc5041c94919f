//! ViT's checkpoint as a backend-neutral [`EncoderSpec`] (patch embeddings, pre-norm layers,
//! final layer norm, pooler, classifier), for engines that do not run through burn (the cuBLAS
//! encoder of the `cuda` feature). The names come from the same tables the burn model loads
//! through ([`VitLayout`], `PreLnNames`).

use std::path::Path;

use ipfs_accelerate_core::{
    DenseWeights, EncoderHead, EncoderInput, EncoderSpec, Error, JsonConfig, NormPlacement,
    PatchEmbeddings, Result, TensorSource,
};
use ipfs_accelerate_nn::{
    attention::ProjectionBias,
    spec::{encoder_activation, SpecReader},
    Activation,
};

use crate::{VitConfig, VitHead, VitLayout};

/// Reads the ViT checkpoint in `dir` (config.json + safetensors, or a random-weight folder) as an
/// [`EncoderSpec`]. What the spec cannot describe (non-square patches, a pooler other than
/// `tanh` over the hidden size, a classification head without labels) is an
/// [`Error::InvalidInput`] saying so; such checkpoints run on the burn model.
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
    let (ph, pw) = c.patch_size.hw();
    if ph != pw {
        return unsupported(format!("patches of {ph}x{pw} are not square"));
    }
    let activation = encoder_activation(c.hidden_act);
    let layout = VitLayout::detect(source.as_ref());
    let root = SpecReader::new(source.as_ref(), "");
    let vit = SpecReader::new(source.as_ref(), layout.prefix);
    let (h, i, p, ch) = (
        c.hidden_size,
        c.intermediate_size,
        c.patch(),
        c.num_channels,
    );
    let (rows, cols) = c.grid();
    let emb = vit.pp("embeddings");
    let projection = DenseWeights::new(
        h,
        ch * p * p,
        emb.read("patch_embeddings.projection.weight", &[h, ch, p, p])?,
        emb.read("patch_embeddings.projection.bias", &[h])?,
    );
    let input = EncoderInput::Patches(PatchEmbeddings {
        channels: ch,
        patch: p,
        image: c.image_size.hw(),
        projection,
        class: emb.read("cls_token", &[1, 1, h])?,
        position: emb.read("position_embeddings", &[1, rows * cols + 1, h])?,
    });
    let layers = (0..c.num_hidden_layers)
        .map(|n| {
            vit.pp(&format!("{}.{n}", layout.layers)).pre_ln_layer(
                &layout.names,
                h,
                i,
                ProjectionBias::qkv(c.qkv_bias),
            )
        })
        .collect::<Result<Vec<_>>>()?;
    let pooler = if vit.has("pooler.dense.weight") {
        let out = c.pooler_output_size.unwrap_or(h);
        if out != h || c.pooler_act != Activation::Tanh {
            return unsupported(format!(
                "the pooler is tanh over {h} features, not {:?} over {out}",
                c.pooler_act
            ));
        }
        Some(vit.dense("pooler.dense", h, h)?)
    } else {
        None
    };
    let classifier = match c.head() {
        VitHead::ImageClassification if c.num_labels() == 0 => {
            return unsupported("a classification head without labels".into())
        }
        VitHead::ImageClassification => Some(EncoderHead::FirstToken(root.dense(
            "classifier",
            c.num_labels(),
            h,
        )?)),
        VitHead::Base => None,
    };
    let spec = EncoderSpec {
        family: "vit".into(),
        hidden: h,
        heads: c.num_attention_heads,
        intermediate: i,
        eps: c.layer_norm_eps as f32,
        activation,
        input,
        embedding_norm: None,
        norm: NormPlacement::Pre,
        layers,
        final_norm: Some(vit.norm("layernorm", h)?),
        pooler,
        head: classifier,
        causal: false,
        projection: None,
    };
    spec.validate()?;
    Ok(spec)
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
