//! Whisper's encoder as a backend-neutral [`EncoderSpec`], for engines that do not run through
//! burn: the log-mel frames through two GELU convolutions (the second of stride 2), plus the
//! learned `embed_positions`, then pre-norm layers (`k_proj` without a bias) and the final
//! `layer_norm`. The layer names are the table the burn encoder loads with
//! (`ENCODER_LAYER_NAMES`).

use ipfs_accelerate_core::{
    EncoderActivation, EncoderInput, EncoderSpec, FrameConv, FrameEmbeddings, NormPlacement,
    Result, TensorSource,
};
use ipfs_accelerate_nn::spec::{encoder_activation, SpecReader};

use crate::model::{ENCODER_LAYER_NAMES, WHISPER_BIAS};
use crate::{WhisperConfig, LAYER_NORM_EPS};

/// The encoder of a `WhisperForConditionalGeneration` (tensors under `model.encoder`) or bare
/// `WhisperModel` (`encoder`) checkpoint; its output is `encoder_last_hidden_state`.
pub fn encoder_spec(config: &WhisperConfig, source: &dyn TensorSource) -> Result<EncoderSpec> {
    let c = config;
    let (d, mels) = (c.d_model, c.num_mel_bins);
    let base = if source.contains("model.encoder.conv1.weight") {
        "model.encoder"
    } else {
        "encoder"
    };
    let enc = SpecReader::new(source, base);
    // HF's `WhisperEncoder` applies exact GELU after each convolution whatever the layers use.
    let conv = |name: &str, inp: usize, stride: usize| -> Result<FrameConv> {
        let mut dense = enc.matrix(&format!("{name}.weight"), d, inp * 3)?;
        dense.bias = enc.read(&format!("{name}.bias"), &[d])?;
        Ok(FrameConv {
            conv: dense,
            kernel: 3,
            stride,
            padding: 1,
        })
    };
    let input = EncoderInput::Frames(FrameEmbeddings {
        channels: mels,
        frames: c.input_frames(),
        convs: vec![conv("conv1", mels, 1)?, conv("conv2", d, 2)?],
        activation: EncoderActivation::Gelu,
        position: enc.read("embed_positions.weight", &[c.max_source_positions, d])?,
    });
    let spec = EncoderSpec {
        family: "whisper".into(),
        // An encoder's last hidden states alone: no pooler, head or projection.
        pooler: None,
        head: None,
        projection: None,
        causal: false,
        hidden: d,
        heads: c.encoder_attention_heads,
        intermediate: c.encoder_ffn_dim,
        eps: LAYER_NORM_EPS as f32,
        activation: encoder_activation(c.activation_function)?,
        input,
        embedding_norm: None,
        norm: NormPlacement::Pre,
        layers: (0..c.encoder_layers)
            .map(|n| {
                enc.pp(&format!("layers.{n}")).pre_ln_layer(
                    &ENCODER_LAYER_NAMES,
                    d,
                    c.encoder_ffn_dim,
                    WHISPER_BIAS,
                )
            })
            .collect::<Result<_>>()?,
        final_norm: Some(enc.norm("layer_norm", d)?),
    };
    spec.validate().map(|()| spec)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipfs_accelerate_conformance::{family_fixtures, relative_error};
    use ipfs_accelerate_core::{JsonConfig, ReferenceInput};

    /// The encoder's spec, executed by its f64 reference, computes the fixtures' (float64)
    /// `encoder_last_hidden_state`.
    #[test]
    fn the_encoder_spec_computes_hf_encoder_states() {
        let fixtures = family_fixtures("the_encoder_spec_computes_hf_encoder_states", "whisper");
        let mut checked = 0;
        for fixture in fixtures {
            let reference = fixture.dir.join("reference.safetensors");
            if !fixture.dir.join("model.safetensors").is_file() {
                continue; // the feature extractor's fixture: no model
            }
            let config = WhisperConfig::from_file(&fixture.dir.join("config.json")).unwrap();
            let source = ipfs_accelerate_io::open_weights(&fixture.dir).unwrap();
            let spec = encoder_spec(&config, source.as_ref()).unwrap();
            let refs = ipfs_accelerate_io::SafeTensorsFile::open(&reference).unwrap();
            let features = refs.tensor("input_features").unwrap();
            let want = refs.tensor("encoder_last_hidden_state").unwrap();
            let batch = features.shape()[0];
            let out = spec
                .reference_forward(&ReferenceInput::Frames {
                    batch,
                    values: &features.to_f32_vec(),
                })
                .unwrap();
            let EncoderInput::Frames(f) = &spec.input else {
                unreachable!("built with frames")
            };
            assert_eq!(want.shape(), [batch, f.tokens(), config.d_model]);
            let error = relative_error(&out.last_hidden_state, &want.to_f64_vec());
            // Both sides are float64: the fixture's bar (for f32 engines) would let a tanh GELU
            // in place of the exact one pass (8e-5), this one does not.
            let bar = 1e-9;
            eprintln!(
                "{}: encoder_last_hidden_state rel. error {error:.3e}",
                fixture.variant
            );
            assert!(error <= bar, "{}: {error} against {bar}", fixture.variant);
            checked += 1;
        }
        if checked == 0 {
            eprintln!("the_encoder_spec_computes_hf_encoder_states: no whisper model fixture");
        }
    }
}
