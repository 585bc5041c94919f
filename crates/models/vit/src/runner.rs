//! ViT behind the uniform [`ModelRunner`] interface, and the image-classification task.

use ipfs_accelerate_core::JsonConfig;
use std::sync::Arc;

use burn::tensor::{activation::softmax, backend::Backend};
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, ModelRunner, Result, TensorMap, TensorSource,
};
use ipfs_accelerate_nn::{
    convert::{float_to_host, float_to_vec},
    vision::pixel_values,
};

use crate::{Vit, VitConfig, VitHead, VitOutput};

/// The ViT family: loads a checkpoint folder as a [`VitRunner`].
pub struct VitFamily;

impl Family for VitFamily {
    const NAME: &'static str = "vit";

    fn load<B: Backend>(
        dir: &std::path::Path,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Box<dyn ModelRunner>> {
        Ok(Box::new(VitRunner::<B>::load_dir(dir, device, kind)?))
    }
}

/// A loaded ViT checkpoint on one backend.
pub struct VitRunner<B: Backend> {
    vit: Vit<B>,
    device: B::Device,
    kind: BackendKind,
}

impl<B: Backend> VitRunner<B> {
    /// Loads a checkpoint folder (`config.json` + safetensors).
    pub fn load_dir(dir: &std::path::Path, device: &B::Device, kind: BackendKind) -> Result<Self> {
        let config = VitConfig::from_file(&dir.join("config.json"))?;
        let weights = ipfs_accelerate_io::open_weights(dir)?;
        Self::load(weights, &config, device, kind)
    }

    /// Loads the checkpoint onto `device`.
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &VitConfig,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Self> {
        Ok(VitRunner {
            vit: Vit::load(source, config, device)?,
            device: device.clone(),
            kind,
        })
    }

    /// The model.
    pub fn vit(&self) -> &Vit<B> {
        &self.vit
    }

    /// Validates `pixel_values` `[batch, channels, height, width]` and runs the encoder.
    pub fn encode(&self, pixels: &HostTensor) -> Result<VitOutput<B>> {
        let x = pixel_values::<B>(pixels, self.vit.config().num_channels, &self.device)?;
        self.vit.model.forward(x)
    }
}

impl<B: Backend> ModelRunner for VitRunner<B> {
    fn family(&self) -> &str {
        VitFamily::NAME
    }

    fn backend(&self) -> BackendKind {
        self.kind
    }

    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        let pixels = inputs
            .get("pixel_values")
            .ok_or_else(|| Error::InvalidInput("missing input `pixel_values`".into()))?;
        let out = self.encode(pixels)?;
        let mut map = TensorMap::new();
        if self.vit.head() == VitHead::ImageClassification {
            map.insert("logits".into(), float_to_host(self.vit.logits(&out)?)?);
            return Ok(map);
        }
        if let Some(p) = out.pooler_output {
            map.insert("pooler_output".into(), float_to_host(p)?);
        }
        map.insert(
            "last_hidden_state".into(),
            float_to_host(out.last_hidden_state)?,
        );
        Ok(map)
    }
}

/// One predicted class.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Prediction {
    /// The label name from `id2label`.
    pub label: String,
    /// The class index.
    pub index: usize,
    /// Its softmax probability.
    pub score: f32,
}

/// The object-safe task interface of a loaded ViT, whatever backend it runs on.
pub trait VitTasks: ModelRunner {
    /// The configuration.
    fn config(&self) -> &VitConfig;
    /// Image classification: for every image of `pixel_values` `[batch, 3, H, W]` the `top_k`
    /// most probable labels, best first (softmax over the classifier's logits).
    fn classify(&self, pixel_values: &HostTensor, top_k: usize) -> Result<Vec<Vec<Prediction>>>;
}

impl<B: Backend> VitTasks for VitRunner<B> {
    fn config(&self) -> &VitConfig {
        self.vit.config()
    }

    fn classify(&self, pixels: &HostTensor, top_k: usize) -> Result<Vec<Vec<Prediction>>> {
        let out = self.encode(pixels)?;
        let logits = self.vit.logits(&out)?;
        let labels = logits.dims()[1];
        let probs = float_to_vec(softmax(logits, 1))?;
        Ok(top_predictions(self.vit.config(), &probs, labels, top_k))
    }
}

/// The `top_k` most probable classes of each row of `probs` (`[rows, labels]` softmax
/// probabilities), best first, named by `config`'s `id2label`. Every executor of the classifier
/// (burn, an ONNX export) ranks through this.
pub fn top_predictions(
    config: &VitConfig,
    probs: &[f32],
    labels: usize,
    top_k: usize,
) -> Vec<Vec<Prediction>> {
    probs
        .chunks(labels.max(1))
        .map(|row| {
            let mut order: Vec<usize> = (0..row.len()).collect();
            order.sort_by(|&a, &b| row[b].total_cmp(&row[a]));
            order
                .into_iter()
                .take(top_k)
                .map(|i| Prediction {
                    label: config.label(i),
                    index: i,
                    score: row[i],
                })
                .collect()
        })
        .collect()
}
