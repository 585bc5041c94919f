//! DETR behind the uniform [`ModelRunner`] interface, and the object-detection task API.

use std::sync::Arc;

use burn::tensor::backend::Backend;
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, ModelRunner, Result, TensorMap, TensorSource,
};
use ipfs_accelerate_nn::convert::{float_from_host, float_to_host, float_to_vec};

use crate::post::{post_outputs, post_process_object_detection, Detection};
use crate::{Detr, DetrConfig, DetrOutput};

/// The DETR family: loads a checkpoint folder as a [`DetrRunner`].
pub struct DetrFamily;

impl Family for DetrFamily {
    const NAME: &'static str = "detr";

    fn load<B: Backend>(
        dir: &std::path::Path,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Box<dyn ModelRunner>> {
        Ok(Box::new(DetrRunner::<B>::load_dir(dir, device, kind)?))
    }
}

/// A loaded DETR checkpoint on one backend.
pub struct DetrRunner<B: Backend> {
    detr: Detr<B>,
    kind: BackendKind,
}

/// Model outputs copied to the host, row-major.
#[derive(Debug, Clone, PartialEq)]
pub struct HostDetections {
    /// `[batch, queries, classes]` with `classes = num_labels + 1`.
    pub shape: [usize; 3],
    /// Class logits.
    pub logits: Vec<f32>,
    /// Boxes (cx, cy, w, h), relative, `[batch, queries, 4]`.
    pub pred_boxes: Vec<f32>,
}

impl<B: Backend> DetrRunner<B> {
    /// Loads a checkpoint folder (`config.json` + safetensors).
    pub fn load_dir(dir: &std::path::Path, device: &B::Device, kind: BackendKind) -> Result<Self> {
        let config = DetrConfig::from_file(&dir.join("config.json"))?;
        let weights = ipfs_accelerate_io::open_weights(dir)?;
        Self::load(weights, &config, device, kind)
    }

    /// Loads the checkpoint onto `device`.
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &DetrConfig,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Self> {
        Ok(DetrRunner {
            detr: Detr::load(source, config, device)?,
            kind,
        })
    }

    /// The model.
    pub fn detr(&self) -> &Detr<B> {
        &self.detr
    }

    /// Validates `pixel_values` `[batch, channels, height, width]` and `pixel_mask`
    /// `[batch, height, width]` (non-zero = real pixel; all ones when absent) and runs the model.
    pub fn forward_host(
        &self,
        pixel_values: &HostTensor,
        pixel_mask: Option<&HostTensor>,
    ) -> Result<DetrOutput<B>> {
        let dims = pixel_values.shape();
        if dims.len() != 4 || dims.contains(&0) || dims[1] != self.detr.in_channels() {
            return Err(Error::InvalidInput(format!(
                "pixel_values must be [batch, {}, height, width] with non-zero sizes, got {dims:?}",
                self.detr.in_channels()
            )));
        }
        if !pixel_values.dtype().is_float() {
            return Err(Error::InvalidInput(format!(
                "pixel_values must be a float tensor, got {}",
                pixel_values.dtype()
            )));
        }
        let mask = match pixel_mask {
            None => None,
            Some(m) => {
                let want = [dims[0], dims[2], dims[3]];
                if m.shape() != want {
                    return Err(Error::InvalidInput(format!(
                        "pixel_mask has shape {:?}, pixel_values {dims:?} needs {want:?}",
                        m.shape()
                    )));
                }
                let values: Vec<i64> = if m.dtype().is_float() {
                    m.to_f64_vec()
                        .iter()
                        .map(|&v| i64::from(v != 0.0))
                        .collect()
                } else {
                    m.to_i64_vec()?
                };
                Some(values)
            }
        };
        let x = float_from_host::<B, 4>(pixel_values, self.detr.device())?;
        self.detr.forward(x, mask.as_deref())
    }

    /// Runs the model and copies logits and boxes to the host.
    pub fn predict(
        &self,
        pixel_values: &HostTensor,
        pixel_mask: Option<&HostTensor>,
    ) -> Result<HostDetections> {
        let out = self.forward_host(pixel_values, pixel_mask)?;
        let shape = out.logits.dims();
        Ok(HostDetections {
            shape,
            logits: float_to_vec(out.logits)?,
            pred_boxes: float_to_vec(out.pred_boxes)?,
        })
    }

    fn post_process(
        &self,
        raw: &HostDetections,
        threshold: f64,
        target_sizes: Option<&[[usize; 2]]>,
    ) -> Result<Vec<Vec<Detection>>> {
        let config = self.detr.config();
        post_process_object_detection(
            &raw.logits,
            &raw.pred_boxes,
            raw.shape,
            threshold,
            target_sizes,
            &|i| config.label(i),
        )
    }
}

impl<B: Backend> ModelRunner for DetrRunner<B> {
    fn family(&self) -> &str {
        "detr"
    }

    fn backend(&self) -> BackendKind {
        self.kind
    }

    /// Inputs: `pixel_values`, optional `pixel_mask`, `threshold` (f64 `[1]`, default 0.5) and
    /// `target_sizes` (i64 `[batch, 2]`). Outputs: `logits`, `pred_boxes`, and the detections of
    /// every image concatenated in image order as `post_scores` `[n]`, `post_labels` `[n]`,
    /// `post_boxes` `[n, 4]`, with `post_counts` `[batch]` giving how many belong to each image.
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        let pixel_values = inputs
            .get("pixel_values")
            .ok_or_else(|| Error::InvalidInput("missing input `pixel_values`".into()))?;
        let out = self.forward_host(pixel_values, inputs.get("pixel_mask"))?;
        let logits = float_to_host(out.logits)?;
        let boxes = float_to_host(out.pred_boxes)?;
        let config = self.detr.config();
        post_outputs(logits, boxes, inputs, &|i| config.label(i))
    }
}

/// The object-safe task interface of a loaded DETR, whatever backend it runs on.
pub trait DetrTasks: ModelRunner {
    /// The configuration.
    fn config(&self) -> &DetrConfig;

    /// Detects objects: `pixel_values` `[batch, channels, height, width]` (normalised, as the
    /// image processor makes them), `pixel_mask` `[batch, height, width]` (1 = real pixel,
    /// `None` = no padding), keeping detections scoring above `threshold`; `target_sizes` (one
    /// `[height, width]` per image) scales boxes to pixels, else they stay relative.
    fn detect(
        &self,
        pixel_values: &HostTensor,
        pixel_mask: Option<&HostTensor>,
        threshold: f64,
        target_sizes: Option<&[[usize; 2]]>,
    ) -> Result<Vec<Vec<Detection>>>;
}

impl<B: Backend> DetrTasks for DetrRunner<B> {
    fn config(&self) -> &DetrConfig {
        self.detr.config()
    }

    fn detect(
        &self,
        pixel_values: &HostTensor,
        pixel_mask: Option<&HostTensor>,
        threshold: f64,
        target_sizes: Option<&[[usize; 2]]>,
    ) -> Result<Vec<Vec<Detection>>> {
        if !threshold.is_finite() {
            return Err(Error::InvalidInput(format!(
                "threshold {threshold} is not finite"
            )));
        }
        if let Some(sizes) = target_sizes {
            if sizes.len() != pixel_values.shape().first().copied().unwrap_or(0) {
                return Err(Error::InvalidInput(format!(
                    "{} target sizes for pixel_values of shape {:?}",
                    sizes.len(),
                    pixel_values.shape()
                )));
            }
        }
        let raw = self.predict(pixel_values, pixel_mask)?;
        self.post_process(&raw, threshold, target_sizes)
    }
}
