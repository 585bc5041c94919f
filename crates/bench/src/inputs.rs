//! Inputs of one benchmark point, made from the model's config for a (batch, size) pair: token
//! ids spread over the vocabulary, images and audio of the shapes the model takes. The values are
//! deterministic and arbitrary (the benchmarks time the computation, which does not depend on
//! them); their shapes are the model's real ones.

use ipfs_accelerate_core::{Error, HostTensor, Result, TensorMap};
use serde_json::Value;

/// What the size axis of a family's grid counts, and its default value for a config.
pub fn size_axis(family: &str, config: &Value) -> (&'static str, usize) {
    let get = |v: &Value, k: &str| v.get(k).and_then(Value::as_u64).map(|n| n as usize);
    match family {
        "vit" => ("pixels", get(config, "image_size").unwrap_or(224)),
        "detr" => ("pixels", 512),
        "whisper" => (
            "frames",
            2 * get(config, "max_source_positions").unwrap_or(1500),
        ),
        "wav2vec2" => ("samples", 16_000),
        "clip" | "xclip" | "clap" => ("tokens", 16),
        _ => ("tokens", 128),
    }
}

/// `batch × seq` ids spread over `vocab` (never a special id below 3, never past the vocabulary).
fn token_ids(batch: usize, seq: usize, vocab: usize) -> Vec<i64> {
    let span = vocab.saturating_sub(3).max(1);
    (0..batch * seq)
        .map(|i| (3 + (i * 7919 + 1000) % span) as i64)
        .collect()
}

/// `n` pixel values in [-1, 1] (normalised images).
fn pixels(n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 37 % 255) as f32 / 127.5) - 1.0)
        .collect()
}

/// A number field of `config` (or of its sub-config `section`).
fn field(config: &Value, section: Option<&str>, key: &str) -> Result<usize> {
    let scope = match section {
        Some(s) => config
            .get(s)
            .ok_or_else(|| Error::InvalidInput(format!("config has no `{s}`")))?,
        None => config,
    };
    scope
        .get(key)
        .and_then(Value::as_u64)
        .map(|n| n as usize)
        .ok_or_else(|| {
            Error::InvalidInput(format!(
                "config has no number `{}{key}` to shape the benchmark inputs",
                section.map(|s| format!("{s}.")).unwrap_or_default()
            ))
        })
}

/// The inputs of `family` at `batch` and `size` (tokens, image side, mel frames or samples, as
/// [`size_axis`] says), under the names its runner takes.
pub fn synthesize(family: &str, config: &Value, batch: usize, size: usize) -> Result<TensorMap> {
    if batch == 0 || size == 0 {
        return Err(Error::InvalidInput(
            "batch and size must be at least 1".into(),
        ));
    }
    let mut m = TensorMap::new();
    let ids = |m: &mut TensorMap, section: Option<&str>, seq: usize| -> Result<()> {
        let vocab = field(config, section, "vocab_size")?;
        let mut ids = token_ids(batch, seq, vocab);
        // CLIP-style text towers pool at the end-of-text token: put it last in every row.
        if let Some(eos) = section
            .and_then(|s| config.get(s))
            .and_then(|c| c.get("eos_token_id"))
            .and_then(Value::as_i64)
            .filter(|&e| e > 2 && (e as usize) < vocab)
        {
            for row in ids.chunks_mut(seq) {
                if let Some(last) = row.last_mut() {
                    *last = eos;
                }
            }
        }
        m.insert(
            "input_ids".into(),
            HostTensor::from_i64(vec![batch, seq], &ids)?,
        );
        m.insert(
            "attention_mask".into(),
            HostTensor::from_i64(vec![batch, seq], &vec![1; batch * seq])?,
        );
        Ok(())
    };
    let image = |m: &mut TensorMap, lead: Vec<usize>, side: usize| -> Result<()> {
        let mut shape = lead;
        shape.extend([3, side, side]);
        let n = shape.iter().product();
        m.insert(
            "pixel_values".into(),
            HostTensor::from_f32(shape, &pixels(n))?,
        );
        Ok(())
    };
    match family {
        "bert" => {
            ids(&mut m, None, size)?;
            m.insert(
                "token_type_ids".into(),
                HostTensor::from_i64(vec![batch, size], &vec![0; batch * size])?,
            );
        }
        "llama" | "qwen2" => {
            let vocab = field(config, None, "vocab_size")?;
            m.insert(
                "input_ids".into(),
                HostTensor::from_i64(vec![batch, size], &token_ids(batch, size, vocab))?,
            );
        }
        "t5" => {
            ids(&mut m, None, size)?;
            let start = config
                .get("decoder_start_token_id")
                .and_then(Value::as_i64)
                .unwrap_or(0);
            m.insert(
                "decoder_input_ids".into(),
                HostTensor::from_i64(vec![batch, 1], &vec![start; batch])?,
            );
        }
        "whisper" => {
            let mels = field(config, None, "num_mel_bins")?;
            let n = batch * mels * size;
            let feats: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 / 97.0) - 0.5).collect();
            // The encoder alone (the runner returns `encoder_last_hidden_state` without
            // `decoder_input_ids`); decoding is measured by generation benchmarks (`--new`).
            m.insert(
                "input_features".into(),
                HostTensor::from_f32(vec![batch, mels, size], &feats)?,
            );
        }
        "wav2vec2" => {
            let n = batch * size;
            let wave: Vec<f32> = (0..n)
                .map(|i| (i as f32 * 440.0 * std::f32::consts::TAU / 16_000.0).sin() * 0.5)
                .collect();
            m.insert(
                "input_values".into(),
                HostTensor::from_f32(vec![batch, size], &wave)?,
            );
        }
        "vit" => image(&mut m, vec![batch], size)?,
        "detr" => {
            image(&mut m, vec![batch], size)?;
            m.insert(
                "pixel_mask".into(),
                HostTensor::from_i64(vec![batch, size, size], &vec![1; batch * size * size])?,
            );
        }
        "clip" => {
            ids(&mut m, Some("text_config"), size)?;
            image(
                &mut m,
                vec![batch],
                field(config, Some("vision_config"), "image_size")?,
            )?;
        }
        "xclip" => {
            ids(&mut m, Some("text_config"), size)?;
            let frames = field(config, Some("vision_config"), "num_frames")?;
            let side = field(config, Some("vision_config"), "image_size")?;
            image(&mut m, vec![batch, frames], side)?;
        }
        "clap" => {
            ids(&mut m, Some("text_config"), size)?;
            let spec = field(config, Some("audio_config"), "spec_size")?;
            let mels = field(config, Some("audio_config"), "num_mel_bins")?;
            let frames = spec * spec / mels.max(1);
            let n = batch * frames * mels;
            let feats: Vec<f32> = (0..n).map(|i| -((i % 89) as f32) / 10.0).collect();
            m.insert(
                "input_features".into(),
                HostTensor::from_f32(vec![batch, 1, frames, mels], &feats)?,
            );
        }
        "llava" => {
            let vocab = field(config, Some("text_config"), "vocab_size")?;
            let image_token = field(config, None, "image_token_id")
                .or_else(|_| field(config, None, "image_token_index"))?
                as i64;
            let image_tokens = field(config, None, "image_seq_length")?;
            let text = token_ids(batch, size, vocab);
            let mut all = Vec::with_capacity(batch * (size + image_tokens));
            for row in text.chunks(size) {
                all.push(row[0]);
                all.extend(std::iter::repeat_n(image_token, image_tokens));
                // Text ids never collide with the image token.
                all.extend(
                    row[1..]
                        .iter()
                        .map(|&t| if t == image_token { t - 1 } else { t }),
                );
            }
            m.insert(
                "input_ids".into(),
                HostTensor::from_i64(vec![batch, size + image_tokens], &all)?,
            );
            image(
                &mut m,
                vec![batch],
                field(config, Some("vision_config"), "image_size")?,
            )?;
        }
        other => {
            return Err(Error::InvalidInput(format!(
                "benchmark inputs for `{other}` are not synthesized: pass a fixture folder \
                 (with reference.safetensors) as --config to time it on the fixture's inputs"
            )))
        }
    }
    Ok(m)
}
