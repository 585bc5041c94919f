//! `CLIPModel` over two tower runners that are not burn's (the cuBLAS encoder running the specs
//! of [`crate::text_encoder_spec`] / [`crate::vision_encoder_spec`], or their f64 reference): the
//! towers give projected embeddings, this normalises them and forms the image-text logits as HF's
//! `CLIPModel.forward` does.

use ipfs_accelerate_core::{BackendKind, Error, HostTensor, ModelRunner, Result, TensorMap};

use crate::{ClipConfig, ClipTasks, ClipTextInputs};

/// CLIP from a text tower (`input_ids`, `attention_mask` → `text_embeds`, unnormalised) and a
/// vision tower (`pixel_values` → `image_embeds`, unnormalised), with the checkpoint's
/// `logit_scale`. Outputs as [`crate::ClipRunner`]'s.
pub struct TowerRunner {
    text: Box<dyn ModelRunner>,
    vision: Box<dyn ModelRunner>,
    config: ClipConfig,
    logit_scale: f32,
}

/// `x / ‖x‖₂` of each row (HF's `_get_vector_norm`, no epsilon).
fn normalized(rows: Vec<Vec<f32>>) -> Vec<Vec<f32>> {
    rows.into_iter()
        .map(|r| {
            let n = r
                .iter()
                .map(|v| (*v as f64) * (*v as f64))
                .sum::<f64>()
                .sqrt();
            r.iter().map(|v| (*v as f64 / n) as f32).collect()
        })
        .collect()
}

/// `exp(scale) · image · text` for every image (rows) and text (columns).
fn logits(images: &[Vec<f32>], texts: &[Vec<f32>], scale: f32) -> Vec<Vec<f32>> {
    let t = (scale as f64).exp();
    images
        .iter()
        .map(|i| {
            texts
                .iter()
                .map(|x| {
                    (t * i
                        .iter()
                        .zip(x)
                        .map(|(a, b)| *a as f64 * *b as f64)
                        .sum::<f64>()) as f32
                })
                .collect()
        })
        .collect()
}

fn tensor(rows: &[Vec<f32>], width: usize) -> Result<HostTensor> {
    HostTensor::from_f32(vec![rows.len(), width], &rows.concat())
}

impl TowerRunner {
    /// Combines the towers. Both must come from the same checkpoint as `config`.
    pub fn new(
        text: Box<dyn ModelRunner>,
        vision: Box<dyn ModelRunner>,
        config: ClipConfig,
        logit_scale: f32,
    ) -> Self {
        TowerRunner {
            text,
            vision,
            config,
            logit_scale,
        }
    }

    /// One tower's `name` output as rows of `projection_dim`.
    fn embeds(
        &self,
        tower: &dyn ModelRunner,
        inputs: TensorMap,
        name: &str,
    ) -> Result<Vec<Vec<f32>>> {
        let out = tower.run(&inputs)?;
        let t = out.get(name).ok_or_else(|| {
            Error::InvalidInput(format!("the CLIP tower gave no `{name}` output"))
        })?;
        let width = self.config.projection_dim.max(1);
        Ok(t.to_f32_vec().chunks(width).map(<[f32]>::to_vec).collect())
    }

    fn text_rows(&self, text: &ClipTextInputs) -> Result<Vec<Vec<f32>>> {
        let shape = vec![text.batch, text.seq];
        let mut inputs = TensorMap::new();
        inputs.insert(
            "input_ids".into(),
            HostTensor::from_i64(shape.clone(), &text.input_ids)?,
        );
        inputs.insert(
            "attention_mask".into(),
            HostTensor::from_i64(shape, &text.attention_mask)?,
        );
        Ok(normalized(self.embeds(
            self.text.as_ref(),
            inputs,
            "text_embeds",
        )?))
    }

    fn image_rows(&self, pixels: &HostTensor) -> Result<Vec<Vec<f32>>> {
        let mut inputs = TensorMap::new();
        inputs.insert("pixel_values".into(), pixels.clone());
        Ok(normalized(self.embeds(
            self.vision.as_ref(),
            inputs,
            "image_embeds",
        )?))
    }
}

impl ModelRunner for TowerRunner {
    fn family(&self) -> &str {
        "clip"
    }

    fn backend(&self) -> BackendKind {
        self.vision.backend()
    }

    fn engine(&self) -> Option<&str> {
        self.vision.engine()
    }

    fn device_memory_in_use(&self) -> Option<u64> {
        match (
            self.text.device_memory_in_use(),
            self.vision.device_memory_in_use(),
        ) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        }
    }

    /// `input_ids` (+ `attention_mask`) give `text_embeds`, `pixel_values` give `image_embeds`,
    /// both together also `logits_per_image` and `logits_per_text`.
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        let p = self.config.projection_dim;
        let text = inputs
            .contains_key("input_ids")
            .then(|| ClipTextInputs::from_tensors(inputs))
            .transpose()?
            .map(|t| self.text_rows(&t))
            .transpose()?;
        let images = inputs
            .get("pixel_values")
            .map(|px| self.image_rows(px))
            .transpose()?;
        let mut out = TensorMap::new();
        match (&text, &images) {
            (None, None) => {
                return Err(Error::InvalidInput(
                    "CLIP needs `input_ids` and / or `pixel_values`".into(),
                ))
            }
            (Some(t), Some(i)) => {
                let per_image = logits(i, t, self.logit_scale);
                // HF's logits_per_text is the transpose.
                let per_text: Vec<Vec<f32>> = (0..t.len())
                    .map(|x| per_image.iter().map(|row| row[x]).collect())
                    .collect();
                out.insert("logits_per_image".into(), tensor(&per_image, t.len())?);
                out.insert("logits_per_text".into(), tensor(&per_text, i.len())?);
            }
            _ => {}
        }
        if let Some(t) = &text {
            out.insert("text_embeds".into(), tensor(t, p)?);
        }
        if let Some(i) = &images {
            out.insert("image_embeds".into(), tensor(i, p)?);
        }
        Ok(out)
    }
}

impl ClipTasks for TowerRunner {
    fn config(&self) -> &ClipConfig {
        &self.config
    }

    fn text_embeds(&self, text: &ClipTextInputs) -> Result<Vec<Vec<f32>>> {
        self.text_rows(text)
    }

    fn image_embeds(&self, pixel_values: &HostTensor) -> Result<Vec<Vec<f32>>> {
        self.image_rows(pixel_values)
    }

    fn zero_shot(
        &self,
        pixel_values: &HostTensor,
        labels: &ClipTextInputs,
    ) -> Result<Vec<Vec<f32>>> {
        let texts = self.text_rows(labels)?;
        let images = self.image_rows(pixel_values)?;
        Ok(logits(&images, &texts, self.logit_scale)
            .iter()
            .map(|row| ipfs_accelerate_core::softmax(row))
            .collect())
    }
}
