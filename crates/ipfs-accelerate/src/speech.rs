//! Speech recognition from WAV files or samples: Whisper (encoder-decoder) or Wav2Vec2 (CTC),
//! chosen by the checkpoint's `model_type`.
//!
//! ```no_run
//! use ipfs_accelerate::speech::Transcriber;
//! use ipfs_accelerate::LoadOptions;
//!
//! # fn main() -> ipfs_accelerate::Result<()> {
//! let asr = Transcriber::load("openai/whisper-tiny", &LoadOptions::default())?;
//! let out = asr.transcribe_file("speech.wav")?;
//! println!("{}", out.value.text);
//! # Ok(())
//! # }
//! ```

use std::path::Path;

use ipfs_accelerate_core::{Selection, Stopwatch};
/// Mono PCM at a sample rate: what [`Transcriber::transcribe`] takes (re-exported: in-memory
/// audio needs no other crate).
pub use ipfs_accelerate_preprocess::audio::Audio;

use crate::loaded::{dir_loader, graph, model_type, LoadOptions, Loaded};
use crate::{Error, Output, Result};

#[cfg(all(feature = "wav2vec2", any(feature = "cuda", feature = "onnx")))]
use ipfs_accelerate_wav2vec2::Wav2Vec2OnRunner;
#[cfg(feature = "wav2vec2")]
use ipfs_accelerate_wav2vec2::{Wav2Vec2Runner, Wav2Vec2Tasks};
#[cfg(feature = "whisper")]
use ipfs_accelerate_whisper::{TranscribeOptions, WhisperRunner, WhisperTasks};

/// Loads a Whisper checkpoint folder. On `cuda` the encoder and decoder run on the cuBLAS engines
/// (`ipfs_accelerate_whisper::encoder_spec` and `decoder_spec`) when they can take the checkpoint;
/// else the encoder alone when it can, and the decoder on burn's; else burn runs both. The reason
/// for each step down is logged.
#[cfg(feature = "whisper")]
pub(crate) struct LoadWhisper {
    pub(crate) dir: std::path::PathBuf,
    pub(crate) options: LoadOptions,
}

#[cfg(feature = "whisper")]
impl LoadWhisper {
    fn runner<B: burn::tensor::backend::Backend>(
        self,
        device: &B::Device,
        kind: ipfs_accelerate_core::BackendKind,
    ) -> Result<WhisperRunner<B>> {
        #[cfg(feature = "cuda")]
        if kind == ipfs_accelerate_core::BackendKind::Cuda {
            use ipfs_accelerate_core::JsonConfig;
            let engine = crate::backends::cublas_encoder_for(kind, &self.options, || {
                let config = ipfs_accelerate_whisper::WhisperConfig::from_file(
                    &self.dir.join("config.json"),
                )?;
                let weights = ipfs_accelerate_io::open_weights(&self.dir)?;
                ipfs_accelerate_whisper::encoder_spec(&config, weights.as_ref())
            });
            match engine {
                // The burn encoder's weights are then not loaded.
                Ok(engine) => {
                    return Ok(WhisperRunner::<B>::from_dir_with_encoder_engine(
                        &self.dir, device, kind, engine,
                    )?)
                }
                Err(reason) => tracing::info!(
                    "whisper on cuda: the cuBLAS encoder cannot run {} ({reason}); burn encodes",
                    self.dir.display()
                ),
            }
        }
        let _ = &self.options;
        Ok(WhisperRunner::<B>::from_dir(&self.dir, device, kind)?)
    }
}

#[cfg(feature = "whisper")]
impl crate::backends::WithBackend for LoadWhisper {
    type Output = Box<dyn WhisperTasks>;

    fn run<H: ipfs_accelerate_core::Backend>(self, hal: &H) -> Result<Self::Output> {
        Ok(Box::new(self.runner::<H::Burn>(&hal.device(), hal.kind())?))
    }

    /// On `cuda`, both halves on the cuBLAS engines (no burn device at all) when they can take
    /// the checkpoint.
    fn without_device(
        self,
        kind: ipfs_accelerate_core::BackendKind,
    ) -> std::result::Result<Result<Self::Output>, Self> {
        #[cfg(feature = "cuda")]
        if let Some(model) = crate::backends::cublas_engines(
            kind,
            "whisper",
            &self.dir,
            "the decoder runs on burn",
            || crate::cuda_whisper::CudaWhisper::load(&self.dir, &self.options),
        ) {
            return Ok(Ok(Box::new(model)));
        }
        let _ = kind;
        Err(self)
    }
}
#[cfg(feature = "wav2vec2")]
dir_loader!(
    /// Loads a Wav2Vec2 checkpoint folder on burn.
    LoadWav2Vec2 => Wav2Vec2Tasks, Wav2Vec2Runner::from_dir
);

/// Wav2Vec2 on the cuBLAS encoder on `cuda` (f32 / f16 float weights), from the checkpoint's
/// [`ipfs_accelerate_wav2vec2::encoder_spec`]; why not, otherwise (burn then runs it).
#[cfg(all(feature = "wav2vec2", feature = "cuda"))]
fn engine_wav2vec2(
    kind: ipfs_accelerate_core::BackendKind,
    dir: &Path,
    options: &LoadOptions,
) -> std::result::Result<Box<dyn Wav2Vec2Tasks>, String> {
    let runner = crate::backends::cublas_encoder_for(kind, options, || {
        crate::backends::encoder_spec_of("wav2vec2", dir)
    })?;
    let model = Wav2Vec2OnRunner::from_dir(dir, runner).map_err(|e| e.to_string())?;
    Ok(Box::new(model))
}

/// Wav2Vec2 on a graph backend (ONNX Runtime): the checkpoint's ONNX export, recognised by the
/// same feature extractor, CTC collapse and vocabulary as the native path.
#[cfg(all(feature = "wav2vec2", feature = "onnx"))]
fn graph_wav2vec2(
    kind: ipfs_accelerate_core::BackendKind,
    dir: &Path,
) -> Result<Box<dyn Wav2Vec2Tasks>> {
    let runner = crate::onnx::graph_runner("wav2vec2", kind, dir)?;
    Ok(Box::new(Wav2Vec2OnRunner::from_dir(dir, Box::new(runner))?))
}

/// Whisper on a graph backend (ONNX Runtime, a browser): the checkpoint's `encoder.onnx` and
/// `decoder.onnx`, transcribed by the same [`ipfs_accelerate_whisper::WhisperAssets`] steps
/// (prompt, language detection, suppression, end of text) as the native path.
#[cfg(all(feature = "whisper", feature = "onnx"))]
mod graph_whisper {
    use ipfs_accelerate_core::{HostTensor, Result, TensorMap};
    use ipfs_accelerate_nn::generate::TokenDecoder;
    use ipfs_accelerate_preprocess::audio::LogMel;
    use ipfs_accelerate_whisper::{WhisperAssets, WhisperExecutor, WhisperTasks};

    use crate::onnx::OnnxRunner;

    /// The export's runner and the checkpoint's other files.
    struct GraphWhisper {
        runner: OnnxRunner,
        assets: WhisperAssets,
    }

    crate::loaded::graph_model_runner!(GraphWhisper, "whisper");

    impl WhisperExecutor for GraphWhisper {
        /// The decoder's inputs with the encoder's output among them.
        type Encoded = TensorMap;

        fn assets(&self) -> &WhisperAssets {
            &self.assets
        }

        fn encode(&self, features: &LogMel) -> Result<TensorMap> {
            let mut inputs = TensorMap::new();
            inputs.insert(
                "input_features".into(),
                HostTensor::from_f32(vec![1, features.mels, features.frames], &features.data)?,
            );
            let context = self.runner.decoder_context(&inputs)?;
            if let Some(hidden) = context.get("encoder_hidden_states") {
                hidden.check_finite("the encoder's output")?;
            }
            Ok(context)
        }

        fn decoder<'a>(
            &'a self,
            encoded: &'a TensorMap,
            prompts: &[Vec<u32>],
            _use_cache: bool,
        ) -> Result<Box<dyn TokenDecoder + 'a>> {
            let rows = prompts
                .iter()
                .map(|p| p.iter().map(|&t| i64::from(t)).collect())
                .collect();
            let decoder = self
                .runner
                .token_decoder(encoded.clone(), "decoder_input_ids", rows)?;
            let vocab = self.assets.config.vocab_size;
            if decoder.vocab() != vocab {
                return Err(ipfs_accelerate_core::Error::Compute(format!(
                    "the decoder export gives {} logits per token, config.json's vocab_size is {vocab}",
                    decoder.vocab()
                )));
            }
            Ok(Box::new(decoder))
        }
    }

    /// Whisper from the export in `dir` on the graph backend `kind`.
    pub(super) fn load(
        kind: ipfs_accelerate_core::BackendKind,
        dir: &std::path::Path,
    ) -> crate::Result<Box<dyn WhisperTasks>> {
        let assets = WhisperAssets::from_dir(dir)?;
        let runner = crate::onnx::graph_runner("whisper", kind, dir)?;
        Ok(Box::new(GraphWhisper { runner, assets }))
    }
}

/// A transcription.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Transcript {
    /// The text (empty when the checkpoint has no vocabulary to decode with).
    pub text: String,
    /// The token ids (Whisper: generated tokens; Wav2Vec2: CTC labels after collapsing).
    pub tokens: Vec<i64>,
    /// Whether the audio was longer than the model's window and was cut (Whisper: 30 s).
    pub truncated: bool,
    /// Seconds of audio.
    pub duration_s: f64,
}

enum Model {
    #[cfg(feature = "whisper")]
    Whisper(Loaded<dyn WhisperTasks>),
    #[cfg(feature = "wav2vec2")]
    Wav2Vec2(Loaded<dyn Wav2Vec2Tasks>),
}

/// A loaded speech-recognition model.
pub struct Transcriber {
    model: Model,
    /// Tokens Whisper may generate at most (`None`: the generation config's limit).
    pub max_new_tokens: Option<usize>,
    /// Whisper's language (`"en"`); detected when `None`.
    pub language: Option<String>,
}

impl Transcriber {
    /// Loads `model` (folder, `$IPFS_ACCELERATE_MODELS` name or hub id) on the first usable
    /// backend: a Whisper or a Wav2Vec2 CTC checkpoint.
    pub fn load(model: &str, options: &LoadOptions) -> Result<Self> {
        let extra = [
            "preprocessor_config.json",
            "tokenizer.json",
            "generation_config.json",
            "vocab.json",
            "tokenizer_config.json",
        ];
        let clock = Stopwatch::start();
        let dir = options.model_dir(model, &extra)?;
        let model = match model_type(&dir)?.as_str() {
            #[cfg(feature = "whisper")]
            "whisper" => {
                #[cfg(feature = "onnx")]
                let whisper_graph = graph_whisper::load;
                Model::Whisper(Loaded::from_dir(
                    dir,
                    options,
                    clock,
                    |dir| LoadWhisper {
                        dir,
                        options: options.clone(),
                    },
                    graph!(whisper_graph),
                    None,
                )?)
            }
            #[cfg(feature = "wav2vec2")]
            "wav2vec2" => {
                #[cfg(feature = "cuda")]
                let engine: Option<
                    &crate::loaded::EngineLoader<dyn Wav2Vec2Tasks>,
                > = Some(&engine_wav2vec2);
                #[cfg(not(feature = "cuda"))]
                let engine = None;
                #[cfg(feature = "onnx")]
                let wav2vec2_graph = graph_wav2vec2;
                Model::Wav2Vec2(Loaded::from_dir(
                    dir,
                    options,
                    clock,
                    LoadWav2Vec2,
                    graph!(wav2vec2_graph),
                    engine,
                )?)
            }
            other => {
                return Err(Error::Unsupported(format!(
                "{model}: model_type `{other}` is not a speech-recognition family of this build \
                     (whisper, wav2vec2)"
            )))
            }
        };
        Ok(Transcriber {
            model,
            max_new_tokens: None,
            language: None,
        })
    }

    /// The backend it runs on and the preferences that were skipped.
    pub fn selection(&self) -> &Selection {
        match &self.model {
            #[cfg(feature = "whisper")]
            Model::Whisper(m) => &m.selection,
            #[cfg(feature = "wav2vec2")]
            Model::Wav2Vec2(m) => &m.selection,
        }
    }

    /// The family name (`whisper` or `wav2vec2`).
    pub fn family(&self) -> &'static str {
        match &self.model {
            #[cfg(feature = "whisper")]
            Model::Whisper(_) => "whisper",
            #[cfg(feature = "wav2vec2")]
            Model::Wav2Vec2(_) => "wav2vec2",
        }
    }

    /// The engine that runs the model when it is not the family's burn module (`cublas`: the
    /// cuBLAS engines on `cuda`); `None` when burn (or an ONNX export) runs it.
    pub fn engine(&self) -> Option<&str> {
        use ipfs_accelerate_core::ModelRunner;
        match &self.model {
            #[cfg(feature = "whisper")]
            Model::Whisper(m) => m.model.engine(),
            #[cfg(feature = "wav2vec2")]
            Model::Wav2Vec2(m) => m.model.engine(),
        }
    }

    /// Transcribes mono `audio` (resampled to the model's rate when it differs).
    pub fn transcribe(&self, audio: &Audio) -> Result<Output<Transcript>> {
        let duration_s = audio.duration_secs();
        match &self.model {
            #[cfg(feature = "whisper")]
            Model::Whisper(m) => {
                let options = TranscribeOptions {
                    language: self.language.clone(),
                    max_new_tokens: self.max_new_tokens,
                    ..Default::default()
                };
                m.timed(
                    1,
                    || Ok(()),
                    |w, ()| Ok(w.transcribe_with(&audio.samples, audio.sample_rate, &options)?),
                    |t| {
                        Ok(Transcript {
                            text: t.text.unwrap_or_default().trim().to_string(),
                            tokens: t.tokens.iter().map(|&x| i64::from(x)).collect(),
                            truncated: t.truncated,
                            duration_s,
                        })
                    },
                )
            }
            #[cfg(feature = "wav2vec2")]
            Model::Wav2Vec2(m) => m.timed(
                1,
                || Ok(()),
                |w, ()| Ok(w.transcribe_with(&audio.samples, audio.sample_rate, true)?),
                |t| {
                    Ok(Transcript {
                        text: t.text.unwrap_or_default(),
                        tokens: t.ids,
                        truncated: false,
                        duration_s,
                    })
                },
            ),
        }
    }

    /// [`transcribe`](Self::transcribe) of a WAV file (8/16/24/32-bit PCM or float, any channel
    /// count, any rate).
    pub fn transcribe_file(&self, path: impl AsRef<Path>) -> Result<Output<Transcript>> {
        self.transcribe(&crate::load_audio(path)?)
    }
}
