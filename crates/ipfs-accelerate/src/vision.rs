//! Image tasks: classification (ViT), zero-shot classification (CLIP) and object detection (DETR),
//! from image files to labelled results, each with the model's own image processor.
//!
//! ```no_run
//! use ipfs_accelerate::vision::ImageClassifier;
//! use ipfs_accelerate::LoadOptions;
//!
//! # fn main() -> ipfs_accelerate::Result<()> {
//! let vit = ImageClassifier::load("google/vit-base-patch16-224", &LoadOptions::default())?;
//! let out = vit.classify_files(&["cat.jpg"], 3)?;
//! for p in &out.value[0] {
//!     println!("{:>6.3} {}", p.score, p.label);
//! }
//! # Ok(())
//! # }
//! ```

use std::path::Path;

use ipfs_accelerate_preprocess::image::{
    load_image, ImageProcessor, ImageProcessorConfig, ProcessedImages, ProcessorKind, SizeRule,
};

#[cfg(feature = "clip")]
use crate::loaded::{clip_text, encode_labels, rank_labels, Label};
use crate::loaded::{dir_loader, graph, task_type, LoadOptions, Loaded};
use crate::{Error, Output, Result};

const PREPROCESSOR: &str = "preprocessor_config.json";

/// The checkpoint's image processor; without a `preprocessor_config.json`, the class defaults of
/// `kind` sized for the model's `(height, width)` input when it has a fixed one.
pub(crate) fn image_processor(
    dir: &Path,
    kind: ProcessorKind,
    model_size: Option<(usize, usize)>,
) -> Result<ImageProcessor> {
    let path = dir.join(PREPROCESSOR);
    if path.is_file() {
        return Ok(ImageProcessor::from_file(&path).map_err(ipfs_accelerate_core::Error::from)?);
    }
    let mut config = ImageProcessorConfig::defaults(kind);
    if let Some((height, width)) = model_size {
        if config.do_center_crop {
            config.size = SizeRule::ShortestEdge(height.min(width));
            config.crop_size = Some((height, width));
        } else {
            config.size = SizeRule::Exact { height, width };
        }
    }
    Ok(ImageProcessor::new(config))
}

/// The decoded image type every vision task takes (re-exported: in-memory images need no
/// other crate).
pub use ipfs_accelerate_preprocess::image::RgbImage;

/// Decodes image files (PNG / JPEG; grayscale, RGBA and 16-bit are converted to RGB).
pub fn load_images<P: AsRef<Path>>(paths: &[P]) -> Result<Vec<RgbImage>> {
    if paths.is_empty() {
        return Err(invalid("no images given".into()));
    }
    paths
        .iter()
        .map(|p| {
            load_image(p.as_ref()).map_err(|e| invalid(format!("{}: {e}", p.as_ref().display())))
        })
        .collect()
}

fn invalid(msg: String) -> Error {
    Error::Core(ipfs_accelerate_core::Error::InvalidInput(msg))
}

fn preprocess(processor: &ImageProcessor, images: &[RgbImage]) -> Result<ProcessedImages> {
    Ok(processor
        .preprocess(images)
        .map_err(ipfs_accelerate_core::Error::from)?)
}

#[cfg(feature = "vit")]
pub use classify::ImageClassifier;
#[cfg(feature = "vit")]
#[cfg(feature = "vit")]
mod classify {
    use super::*;
    use ipfs_accelerate_vit::{VitRunner, VitTasks};

    use crate::loaded::Label;

    dir_loader!(
        /// Loads a ViT checkpoint folder.
        LoadVit => VitTasks, VitRunner::load_dir
    );

    task_type!(
        /// An image classifier (ViT with a classification head) with its image processor.
        ImageClassifier => VitTasks {
            processor: ImageProcessor,
        }
    );

    /// ViT on a graph backend (ONNX Runtime, a browser): the checkpoint's ONNX export, ranked
    /// by the same [`ipfs_accelerate_vit::top_predictions`] as the native path.
    #[cfg(feature = "onnx")]
    fn graph_vit(kind: ipfs_accelerate_core::BackendKind, dir: &Path) -> Result<Box<dyn VitTasks>> {
        crate::onnx::graph_model("vit", kind, dir, |runner, config| -> Box<dyn VitTasks> {
            Box::new(RunnerVit {
                runner: Box::new(runner),
                config,
            })
        })
    }

    /// ViT on the cuBLAS encoder on `cuda` (f32 / f16 float weights), from the checkpoint's
    /// [`ipfs_accelerate_vit::encoder_spec`]; why not, otherwise.
    #[cfg(feature = "cuda")]
    fn engine_vit(
        kind: ipfs_accelerate_core::BackendKind,
        dir: &Path,
        options: &LoadOptions,
    ) -> std::result::Result<Box<dyn VitTasks>, String> {
        use ipfs_accelerate_core::JsonConfig;
        let config = ipfs_accelerate_vit::VitConfig::from_file(&dir.join("config.json"))
            .map_err(|e| e.to_string())?;
        let runner = crate::backends::cublas_encoder_for(kind, options, || {
            ipfs_accelerate_vit::encoder_spec_from(&config, ipfs_accelerate_io::open_weights(dir)?)
        })?;
        Ok(Box::new(RunnerVit { runner, config }))
    }

    /// ViT through a runner that is not burn's (an ONNX export, the cuBLAS encoder): its
    /// `logits` output is `[batch, labels]`.
    #[cfg(any(feature = "onnx", feature = "cuda"))]
    struct RunnerVit {
        runner: Box<dyn ipfs_accelerate_core::ModelRunner>,
        config: ipfs_accelerate_vit::VitConfig,
    }

    #[cfg(any(feature = "onnx", feature = "cuda"))]
    crate::loaded::graph_model_runner!(RunnerVit, "vit");

    #[cfg(any(feature = "onnx", feature = "cuda"))]
    impl VitTasks for RunnerVit {
        fn config(&self) -> &ipfs_accelerate_vit::VitConfig {
            &self.config
        }

        fn classify(
            &self,
            pixel_values: &ipfs_accelerate_core::HostTensor,
            top_k: usize,
        ) -> ipfs_accelerate_core::Result<Vec<Vec<ipfs_accelerate_vit::Prediction>>> {
            let mut inputs = ipfs_accelerate_core::TensorMap::new();
            inputs.insert("pixel_values".into(), pixel_values.clone());
            use ipfs_accelerate_core::ModelRunner;
            let logits = crate::loaded::output_f32(&self.runner.run(&inputs)?, "logits")?;
            let labels = self.config.num_labels().max(1);
            let probs: Vec<f32> = logits
                .chunks(labels)
                .flat_map(ipfs_accelerate_core::softmax)
                .collect();
            Ok(ipfs_accelerate_vit::top_predictions(
                &self.config,
                &probs,
                labels,
                top_k,
            ))
        }
    }

    impl ImageClassifier {
        /// Loads `model` (folder, `$IPFS_ACCELERATE_MODELS` name or hub id) on the first usable
        /// backend.
        pub fn load(model: &str, options: &LoadOptions) -> Result<Self> {
            #[cfg(feature = "cuda")]
            let engine: Option<&crate::loaded::EngineLoader<dyn VitTasks>> = Some(&engine_vit);
            #[cfg(not(feature = "cuda"))]
            let engine = None;
            let inner = Loaded::load_with_engines(
                model,
                options,
                &[PREPROCESSOR],
                LoadVit,
                graph!(graph_vit),
                engine,
            )?;
            let size = inner.model.config().image_size.hw();
            let processor = image_processor(&inner.dir, ProcessorKind::Vit, Some(size))?;
            Ok(ImageClassifier { inner, processor })
        }

        /// The `top_k` most likely labels of each image, most likely first.
        pub fn classify(
            &self,
            images: &[RgbImage],
            top_k: usize,
        ) -> Result<Output<Vec<Vec<Label>>>> {
            self.inner.timed(
                images.len(),
                || preprocess(&self.processor, images),
                |m, p| Ok(m.classify(&p.pixel_values, top_k.max(1))?),
                |rows| {
                    Ok(rows
                        .into_iter()
                        .map(|row| {
                            row.into_iter()
                                .map(|p| Label {
                                    label: p.label,
                                    score: p.score,
                                    index: Some(p.index),
                                })
                                .collect()
                        })
                        .collect())
                },
            )
        }

        /// [`classify`](Self::classify) of image files.
        pub fn classify_files<P: AsRef<Path>>(
            &self,
            paths: &[P],
            top_k: usize,
        ) -> Result<Output<Vec<Vec<Label>>>> {
            self.classify(&load_images(paths)?, top_k)
        }
    }
}

#[cfg(feature = "clip")]
pub use zero_shot::ZeroShotClassifier;

#[cfg(feature = "clip")]
mod zero_shot {
    use super::*;
    use ipfs_accelerate_clip::{ClipRunner, ClipTasks};
    use ipfs_accelerate_preprocess::TextTokenizer;

    dir_loader!(
        /// Loads a CLIP checkpoint folder.
        LoadClip => ClipTasks, ClipRunner::load_dir
    );

    /// CLIP on a graph backend (ONNX Runtime, a browser): the checkpoint's ONNX export (one graph
    /// of `input_ids`, `attention_mask`, `pixel_values` to `text_embeds`, `image_embeds`,
    /// `logits_per_image`, as HF's `CLIPModel` exports).
    #[cfg(feature = "onnx")]
    fn graph_clip(
        kind: ipfs_accelerate_core::BackendKind,
        dir: &Path,
    ) -> Result<Box<dyn ClipTasks>> {
        crate::onnx::graph_model("clip", kind, dir, |runner, config| -> Box<dyn ClipTasks> {
            Box::new(GraphClip { runner, config })
        })
    }

    /// CLIP through its ONNX export. The export takes text and pixels together: an embedding of
    /// one side runs with a placeholder of the other (one black image, or a one-token text).
    #[cfg(feature = "onnx")]
    struct GraphClip {
        runner: crate::onnx::OnnxRunner,
        config: ipfs_accelerate_clip::ClipConfig,
    }

    #[cfg(feature = "onnx")]
    crate::loaded::graph_model_runner!(GraphClip, "clip");

    #[cfg(feature = "onnx")]
    impl GraphClip {
        /// Runs the export on `text` and `pixels` (placeholders where `None`); the output `name`
        /// as rows of `width`.
        fn rows(
            &self,
            text: Option<&ipfs_accelerate_clip::ClipTextInputs>,
            pixels: Option<&ipfs_accelerate_core::HostTensor>,
            name: &str,
        ) -> ipfs_accelerate_core::Result<Vec<Vec<f32>>> {
            use ipfs_accelerate_core::{HostTensor, ModelRunner, TensorMap};
            let side = self.config.vision_config.image_size;
            let mut inputs = TensorMap::new();
            let (ids, mask, shape) = match text {
                Some(t) => (
                    t.input_ids.clone(),
                    t.attention_mask.clone(),
                    vec![t.batch, t.seq],
                ),
                None => (vec![0], vec![1], vec![1, 1]),
            };
            inputs.insert(
                "input_ids".into(),
                HostTensor::from_i64(shape.clone(), &ids)?,
            );
            inputs.insert("attention_mask".into(), HostTensor::from_i64(shape, &mask)?);
            let black;
            let pixels = match pixels {
                Some(p) => p,
                None => {
                    black =
                        HostTensor::from_f32(vec![1, 3, side, side], &vec![0.0; 3 * side * side])?;
                    &black
                }
            };
            inputs.insert("pixel_values".into(), pixels.clone());
            let out = self.runner.run(&inputs)?;
            let rows = match name {
                "logits_per_image" => text.map_or(1, |t| t.batch),
                _ => self.config.projection_dim,
            };
            Ok(crate::loaded::output_f32(&out, name)?
                .chunks(rows.max(1))
                .map(<[f32]>::to_vec)
                .collect())
        }
    }

    #[cfg(feature = "onnx")]
    impl ClipTasks for GraphClip {
        fn config(&self) -> &ipfs_accelerate_clip::ClipConfig {
            &self.config
        }

        fn text_embeds(
            &self,
            text: &ipfs_accelerate_clip::ClipTextInputs,
        ) -> ipfs_accelerate_core::Result<Vec<Vec<f32>>> {
            self.rows(Some(text), None, "text_embeds")
        }

        fn image_embeds(
            &self,
            pixel_values: &ipfs_accelerate_core::HostTensor,
        ) -> ipfs_accelerate_core::Result<Vec<Vec<f32>>> {
            self.rows(None, Some(pixel_values), "image_embeds")
        }

        fn zero_shot(
            &self,
            pixel_values: &ipfs_accelerate_core::HostTensor,
            labels: &ipfs_accelerate_clip::ClipTextInputs,
        ) -> ipfs_accelerate_core::Result<Vec<Vec<f32>>> {
            let logits = self.rows(Some(labels), Some(pixel_values), "logits_per_image")?;
            Ok(logits
                .iter()
                .map(|row| ipfs_accelerate_core::softmax(row))
                .collect())
        }
    }

    /// CLIP on the cuBLAS encoder on `cuda` (f32 / f16 float weights, images of the checkpoint's
    /// size); why not, otherwise.
    #[cfg(feature = "cuda")]
    fn engine_clip(
        kind: ipfs_accelerate_core::BackendKind,
        dir: &Path,
        options: &LoadOptions,
    ) -> std::result::Result<Box<dyn ClipTasks>, String> {
        Ok(Box::new(crate::backends::cublas_clip(kind, dir, options)?))
    }

    task_type!(
        /// Zero-shot image classification with CLIP: the probability of each free-text label.
        ZeroShotClassifier => ClipTasks {
            processor: ImageProcessor,
            tokenizer: TextTokenizer,
        }
    );

    impl ZeroShotClassifier {
        /// Loads `model` (it needs `tokenizer.json`) on the first usable backend.
        pub fn load(model: &str, options: &LoadOptions) -> Result<Self> {
            #[cfg(feature = "cuda")]
            let engine: Option<&crate::loaded::EngineLoader<dyn ClipTasks>> = Some(&engine_clip);
            #[cfg(not(feature = "cuda"))]
            let engine = None;
            let inner = Loaded::load_with_engines(
                model,
                options,
                &[PREPROCESSOR, "tokenizer.json"],
                LoadClip,
                graph!(graph_clip),
                engine,
            )?;
            let side = inner.model.config().vision_config.image_size;
            let processor = image_processor(&inner.dir, ProcessorKind::Clip, Some((side, side)))?;
            let max_len = inner.model.config().text_config.max_position_embeddings;
            let tokenizer = TextTokenizer::from_file(&inner.dir.join("tokenizer.json"), max_len)?;
            Ok(ZeroShotClassifier {
                inner,
                processor,
                tokenizer,
            })
        }

        /// For each image, every label with its probability, most likely first. Each label is
        /// embedded through `template` (`{}` is replaced by the label; CLIP's usual template is
        /// `"a photo of a {}"`).
        pub fn classify(
            &self,
            images: &[RgbImage],
            labels: &[&str],
            template: &str,
        ) -> Result<Output<Vec<Vec<Label>>>> {
            self.inner.timed(
                images.len(),
                || {
                    let text = clip_text(encode_labels(&self.tokenizer, labels, template)?);
                    Ok((preprocess(&self.processor, images)?, text))
                },
                |m, (p, text)| Ok(m.zero_shot(&p.pixel_values, &text)?),
                |probs| Ok(rank_labels(labels, probs)),
            )
        }

        /// CLIP's image embeddings, one per image: HF `CLIPModel`'s `image_embeds` (projected and
        /// L2-normalised) — image search compares them with [`embed_texts`](Self::embed_texts)
        /// by dot product (= cosine similarity).
        pub fn embed_images(&self, images: &[RgbImage]) -> Result<Output<Vec<Vec<f32>>>> {
            self.inner.timed(
                images.len(),
                || preprocess(&self.processor, images),
                |m, p| Ok(m.image_embeds(&p.pixel_values)?),
                Ok,
            )
        }

        /// CLIP's text embeddings, one per text: HF `CLIPModel`'s `text_embeds` (projected and
        /// L2-normalised).
        pub fn embed_texts(&self, texts: &[&str]) -> Result<Output<Vec<Vec<f32>>>> {
            self.inner.timed(
                texts.len(),
                || Ok(clip_text(encode_labels(&self.tokenizer, texts, "{}")?)),
                |m, text| Ok(m.text_embeds(&text)?),
                Ok,
            )
        }
    }
}

#[cfg(feature = "detr")]
pub use detect::ObjectDetector;
#[cfg(feature = "detr")]
pub use ipfs_accelerate_detr::Detection;

#[cfg(feature = "detr")]
mod detect {
    use super::*;
    use ipfs_accelerate_detr::{Detection, DetrRunner, DetrTasks};

    dir_loader!(
        /// Loads a DETR checkpoint folder.
        LoadDetr => DetrTasks, DetrRunner::load_dir
    );

    task_type!(
        /// Object detection with DETR: boxes in pixels of each original image.
        ObjectDetector => DetrTasks {
            processor: ImageProcessor,
        }
    );

    impl ObjectDetector {
        /// Loads `model` on the first usable backend.
        pub fn load(model: &str, options: &LoadOptions) -> Result<Self> {
            let inner = Loaded::load(model, options, &[PREPROCESSOR], LoadDetr)?;
            let processor = image_processor(&inner.dir, ProcessorKind::Detr, None)?;
            Ok(ObjectDetector { inner, processor })
        }

        /// Objects scoring above `threshold` in each image, boxes as (x0, y0, x1, y1) pixels.
        pub fn detect(
            &self,
            images: &[RgbImage],
            threshold: f64,
        ) -> Result<Output<Vec<Vec<Detection>>>> {
            if !(0.0..=1.0).contains(&threshold) {
                return Err(invalid(format!(
                    "threshold must be within [0, 1], got {threshold}"
                )));
            }
            self.inner.timed(
                images.len(),
                || preprocess(&self.processor, images),
                |m, p| {
                    let sizes: Vec<[usize; 2]> =
                        p.original_sizes.iter().map(|&(h, w)| [h, w]).collect();
                    Ok(m.detect(
                        &p.pixel_values,
                        p.pixel_mask.as_ref(),
                        threshold,
                        Some(&sizes),
                    )?)
                },
                Ok,
            )
        }
    }
}
