//! The models a server runs: what kind each checkpoint is, and loading one replica of it.

use std::path::Path;

use ipfs_accelerate::{BackendKind, LoadOptions, Pipeline, Task};

/// What a served model does, which decides the endpoints that accept it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ModelKind {
    /// A BERT-family encoder: `/v1/embeddings`, `/embed`, and `/predict` when it has a
    /// sequence-classification head.
    Encoder,
    /// A decoder LM (LLaMA, Qwen2; a folder or a `.gguf`): `/v1/completions`,
    /// `/v1/chat/completions`.
    Generator,
    /// Whisper or Wav2Vec2: `/v1/audio/transcriptions`.
    Speech,
    /// ViT with a classification head: `/v1/images/classifications`.
    ImageClassifier,
    /// CLIP: `/v1/images/zero-shot`.
    ZeroShotImage,
    /// DETR: `/v1/images/detections`.
    Detector,
}

impl ModelKind {
    /// The kind of `source` (`embedded`, a `.gguf` file, a folder, a hub id), from its file type or
    /// the `model_type` in its config.
    pub fn of(source: &str, offline: bool) -> ipfs_accelerate::Result<ModelKind> {
        if source == ipfs_accelerate::EMBEDDED_SPEC {
            return Ok(ModelKind::Encoder);
        }
        let path = Path::new(source);
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        {
            return Ok(ModelKind::Generator);
        }
        let model_type = ipfs_accelerate::checkpoint_model_type(source, offline)?;
        Ok(match model_type.as_str() {
            "bert" | "roberta" | "xlm-roberta" | "camembert" => ModelKind::Encoder,
            "llama" | "qwen2" | "mistral" => ModelKind::Generator,
            "whisper" | "wav2vec2" => ModelKind::Speech,
            "vit" => ModelKind::ImageClassifier,
            "clip" => ModelKind::ZeroShotImage,
            "detr" => ModelKind::Detector,
            other => {
                return Err(ipfs_accelerate::Error::Unsupported(format!(
                    "{source}: model_type `{other}` is not served (served: bert, llama, qwen2, \
                     mistral, whisper, wav2vec2, vit, clip, detr)"
                )))
            }
        })
    }

    /// The kind's name as `/v1/models` and error messages give it.
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Encoder => "encoder",
            ModelKind::Generator => "generator",
            ModelKind::Speech => "speech",
            ModelKind::ImageClassifier => "image-classifier",
            ModelKind::ZeroShotImage => "zero-shot-image",
            ModelKind::Detector => "detector",
        }
    }
}

/// One loaded replica of a model.
pub enum Engine {
    /// An encoder pipeline.
    Encoder(Pipeline),
    /// A decoder LM.
    Generator(ipfs_accelerate::text::TextGenerator),
    /// A speech recogniser.
    Speech(ipfs_accelerate::speech::Transcriber),
    /// A ViT classifier.
    ImageClassifier(ipfs_accelerate::vision::ImageClassifier),
    /// A CLIP zero-shot classifier.
    ZeroShotImage(ipfs_accelerate::vision::ZeroShotClassifier),
    /// A DETR detector.
    Detector(ipfs_accelerate::vision::ObjectDetector),
}

impl Engine {
    /// Loads `source` as a `kind` model on the first usable backend of `options.backends`.
    pub fn load(
        kind: ModelKind,
        source: &str,
        options: &LoadOptions,
    ) -> ipfs_accelerate::Result<Engine> {
        use ipfs_accelerate::vision;
        Ok(match kind {
            ModelKind::Encoder => {
                let mut builder = Pipeline::builder(source)
                    .task(Task::Auto)
                    .offline(options.offline)
                    .progress(false)
                    .quantize(options.quantization)
                    .precision(options.precision)
                    .share_weights(options.share_weights);
                if let Some(list) = &options.backends {
                    builder = builder.backends(list.clone()).env_override(false);
                }
                Engine::Encoder(builder.build()?)
            }
            ModelKind::Generator => {
                Engine::Generator(ipfs_accelerate::text::TextGenerator::load(source, options)?)
            }
            ModelKind::Speech => {
                Engine::Speech(ipfs_accelerate::speech::Transcriber::load(source, options)?)
            }
            ModelKind::ImageClassifier => {
                Engine::ImageClassifier(vision::ImageClassifier::load(source, options)?)
            }
            ModelKind::ZeroShotImage => {
                Engine::ZeroShotImage(vision::ZeroShotClassifier::load(source, options)?)
            }
            ModelKind::Detector => Engine::Detector(vision::ObjectDetector::load(source, options)?),
        })
    }

    /// The backend the replica runs on.
    pub fn backend(&self) -> BackendKind {
        self.selection().device.kind
    }

    /// The selected device and the skipped preferences.
    pub fn selection(&self) -> &ipfs_accelerate::core::Selection {
        match self {
            Engine::Encoder(p) => p.selection(),
            Engine::Generator(g) => g.selection(),
            Engine::Speech(s) => s.selection(),
            Engine::ImageClassifier(m) => m.selection(),
            Engine::ZeroShotImage(m) => m.selection(),
            Engine::Detector(m) => m.selection(),
        }
    }
}
