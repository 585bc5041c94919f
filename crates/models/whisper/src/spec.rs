//! Whisper as backend-neutral specs, for engines that do not run through burn.
//!
//! - [`encoder_spec`]: [`describe_encoder`], the one description of the encoder that the burn
//!   [`crate::WhisperEncoder`] runs too, read as host values.
//! - [`decoder_spec`]: token embedding plus learned positions, pre-norm layers of causal
//!   self-attention, cross-attention over the encoder's states and a GELU MLP, the final
//!   `layer_norm`, and `proj_out` (the token embedding when tied).

use ipfs_accelerate_core::{
    CrossAttentionWeights, DecoderLayerWeights, DecoderNorm, DecoderPositions, DecoderSpec,
    EncoderActivation, EncoderInput, EncoderSpec, FrameConv, FrameEmbeddings, NormPlacement,
    Result, TensorSource,
};
use ipfs_accelerate_nn::attention::ProjectionNames;
use ipfs_accelerate_nn::spec::{gated_activation, pre_norm_layer, SpecReader, WeightReader};

use crate::model::{ENCODER_LAYER_NAMES, WHISPER_BIAS};
use crate::{WhisperConfig, LAYER_NORM_EPS};

/// The prefix of the encoder's and decoder's tensors: `model` in a
/// `WhisperForConditionalGeneration` checkpoint, none in a bare `WhisperModel`.
fn base(source: &dyn TensorSource) -> &'static str {
    if source.contains("model.encoder.conv1.weight")
        || source.contains("model.decoder.embed_tokens.weight")
    {
        "model."
    } else {
        ""
    }
}

/// The encoder of a `WhisperForConditionalGeneration` (tensors under `model.encoder`) or bare
/// `WhisperModel` (`encoder`) checkpoint, as host values; its output is
/// `encoder_last_hidden_state`.
pub fn encoder_spec(config: &WhisperConfig, source: &dyn TensorSource) -> Result<EncoderSpec> {
    let enc = SpecReader::new(source, &format!("{}encoder", base(source)));
    let spec = describe_encoder(&enc, config)?;
    spec.validate().map(|()| spec)
}

/// Whisper's encoder, the one description of it, read by `enc` (HF's `encoder`) as host values
/// for the engines ([`encoder_spec`]) or as burn modules for [`crate::WhisperEncoder`]: the
/// log-mel frames through two GELU convolutions (the second of stride 2), plus the learned
/// `embed_positions`, then pre-norm layers (`k_proj` without a bias) and the final
/// `layer_norm`.
pub fn describe_encoder<R: WeightReader>(
    enc: &R,
    config: &WhisperConfig,
) -> Result<EncoderSpec<R::Dense, R::Norm, R::Table>> {
    let c = config;
    let (d, mels, eps) = (c.d_model, c.num_mel_bins, LAYER_NORM_EPS);
    let conv = |name: &str, inp: usize, stride: usize| -> Result<FrameConv<R::Dense>> {
        Ok(FrameConv {
            conv: enc.flattened(name, d, &[inp, 3], true)?,
            kernel: 3,
            stride,
            padding: 1,
        })
    };
    let input = EncoderInput::Frames(FrameEmbeddings {
        channels: mels,
        frames: c.input_frames(),
        convs: vec![conv("conv1", mels, 1)?, conv("conv2", d, 2)?],
        // HF's `WhisperEncoder` applies exact GELU after each convolution whatever the layers
        // use.
        activation: EncoderActivation::Gelu,
        position: enc.table("embed_positions.weight", &[c.max_source_positions, d])?,
    });
    Ok(EncoderSpec {
        family: "whisper".into(),
        // An encoder's last hidden states alone: no pooler, head or projection.
        pooler: None,
        head: None,
        projection: None,
        causal: false,
        hidden: d,
        heads: c.encoder_attention_heads,
        intermediate: c.encoder_ffn_dim,
        eps: eps as f32,
        activation: c.activation_function,
        input,
        embedding_norm: None,
        norm: NormPlacement::Pre,
        layers: (0..c.encoder_layers)
            .map(|n| {
                pre_norm_layer(
                    &enc.under(&format!("layers.{n}")),
                    &ENCODER_LAYER_NAMES,
                    (d, c.encoder_ffn_dim),
                    WHISPER_BIAS,
                    eps,
                )
            })
            .collect::<Result<_>>()?,
        final_norm: Some(enc.layer_norm("layer_norm", d, eps)?),
    })
}

/// The decoder of a `WhisperForConditionalGeneration` (tensors under `model.decoder`, `proj_out`)
/// or bare `WhisperModel` (`decoder`) checkpoint: token ids and the encoder's states in, logits
/// out.
pub fn decoder_spec(config: &WhisperConfig, source: &dyn TensorSource) -> Result<DecoderSpec> {
    let c = config;
    let (d, heads, ffn) = (c.d_model, c.decoder_attention_heads, c.decoder_ffn_dim);
    let root = SpecReader::new(source, "");
    let dec = SpecReader::new(source, &format!("{}decoder", base(source)));
    let attention =
        |a: SpecReader<'_>| a.attention(&ProjectionNames::OUT_PROJ, d, (d, d), WHISPER_BIAS);
    let layers = (0..c.decoder_layers)
        .map(|i| {
            let l = dec.pp(&format!("layers.{i}"));
            let [query, key, value, output] = attention(l.pp("self_attn"))?;
            let [cq, ck, cv, co] = attention(l.pp("encoder_attn"))?;
            Ok(DecoderLayerWeights {
                input_norm: l.norm("self_attn_layer_norm", d)?,
                query,
                key,
                value,
                output,
                cross: Some(CrossAttentionWeights {
                    norm: l.norm("encoder_attn_layer_norm", d)?,
                    query: cq,
                    key: ck,
                    value: cv,
                    output: co,
                }),
                post_norm: l.norm("final_layer_norm", d)?,
                gate: None,
                up: l.dense("fc1", ffn, d)?,
                down: l.dense("fc2", d, ffn)?,
                window: None,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let spec = DecoderSpec {
        family: "whisper".into(),
        vocab: c.vocab_size,
        hidden: d,
        heads,
        kv_heads: heads,
        head_dim: d / heads.max(1),
        intermediate: ffn,
        causal: true,
        score_scale: 1.0 / ((d / heads.max(1)) as f64).sqrt(),
        norm: DecoderNorm::Layer,
        eps: LAYER_NORM_EPS as f32,
        max_positions: c.max_target_positions,
        activation: gated_activation(c.activation_function)?,
        positions: DecoderPositions::Learned(
            dec.read("embed_positions.weight", &[c.max_target_positions, d])?,
        ),
        embed: dec.matrix("embed_tokens.weight", c.vocab_size, d)?,
        layers,
        final_norm: dec.norm("layer_norm", d)?,
        lm_head: if c.tie_word_embeddings {
            None
        } else {
            Some(root.dense_with("proj_out", c.vocab_size, d, false)?)
        },
    };
    if heads == 0 || !d.is_multiple_of(heads) {
        return Err(ipfs_accelerate_core::Error::InvalidInput(format!(
            "whisper decoder: d_model {d} is not a multiple of {heads} heads"
        )));
    }
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

    /// The decoder's spec, executed by its f64 reference over the fixtures' encoder states,
    /// computes their (float64) `logits` of `decoder_input_ids`.
    #[test]
    fn the_decoder_spec_computes_hf_logits() {
        let fixtures = family_fixtures("the_decoder_spec_computes_hf_logits", "whisper");
        let mut checked = 0;
        for fixture in fixtures {
            if !fixture.dir.join("model.safetensors").is_file() {
                continue; // the feature extractor's fixture: no model
            }
            let config = WhisperConfig::from_file(&fixture.dir.join("config.json")).unwrap();
            let source = ipfs_accelerate_io::open_weights(&fixture.dir).unwrap();
            let spec = decoder_spec(&config, source.as_ref()).unwrap();
            let refs = ipfs_accelerate_io::SafeTensorsFile::open(
                fixture.dir.join("reference.safetensors"),
            )
            .unwrap();
            let ids_t = refs.tensor("decoder_input_ids").unwrap();
            let states = refs.tensor("encoder_last_hidden_state").unwrap();
            let want = refs.tensor("logits").unwrap().to_f64_vec();
            let (len, d) = (ids_t.shape()[1], config.d_model);
            let frames = states.shape()[1];
            let ids = ids_t.to_i64_vec().unwrap();
            let states = states.to_f64_vec();
            let got: Vec<f64> = ids
                .chunks(len)
                .enumerate()
                .flat_map(|(b, row)| {
                    let memory: Vec<Vec<f64>> = states[b * frames * d..(b + 1) * frames * d]
                        .chunks(d)
                        .map(<[f64]>::to_vec)
                        .collect();
                    let memory = ipfs_accelerate_core::ReferenceMemory {
                        states: &memory,
                        mask: None,
                    };
                    spec.reference_logits(row, Some(memory))
                        .unwrap()
                        .into_iter()
                        .flatten()
                })
                .collect();
            let error = relative_error(&got, &want);
            eprintln!("{}: logits rel. error {error:.3e}", fixture.variant);
            assert!(error <= 1e-9, "{}: {error}", fixture.variant);
            checked += 1;
        }
        if checked == 0 {
            eprintln!("the_decoder_spec_computes_hf_logits: no whisper model fixture");
        }
    }
}
