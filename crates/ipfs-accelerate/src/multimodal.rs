//! Multimodal tasks: describing images with LLaVA / LLaVA-NeXT, classifying videos (frames) with
//! X-CLIP, and classifying audio with CLAP. Each takes decoded inputs ([`RgbImage`], [`Audio`])
//! and has a `_file(s)` helper for paths.
//!
//! ```no_run
//! use ipfs_accelerate::multimodal::ImageDescriber;
//! use ipfs_accelerate::LoadOptions;
//!
//! # fn main() -> ipfs_accelerate::Result<()> {
//! let llava = ImageDescriber::load("llava-hf/llava-1.5-7b-hf", &LoadOptions::default())?;
//! let out = llava.describe_files(&["cat.jpg"], "What is in this picture?", 64, |piece| print!("{piece}"))?;
//! println!("\n{} tokens", out.value.token_ids.len());
//! # Ok(())
//! # }
//! ```

#[allow(unused_imports)]
use crate::loaded::{dir_loader, task_type, LoadOptions, Loaded};
#[cfg(any(feature = "xclip", feature = "clap"))]
use crate::loaded::{encode_labels, rank_labels, Label};
#[allow(unused_imports)]
use crate::{Error, Output, Result};
#[allow(unused_imports)]
use std::path::Path;

/// Mono PCM at a sample rate (re-exported: in-memory inputs need no other crate).
#[cfg(feature = "clap")]
pub use ipfs_accelerate_preprocess::audio::Audio;
/// The decoded image type (re-exported: in-memory inputs need no other crate).
#[cfg(any(feature = "llava", feature = "xclip"))]
pub use ipfs_accelerate_preprocess::image::RgbImage;

#[cfg(feature = "llava")]
pub(crate) use describe::LoadLlava;
#[cfg(feature = "llava")]
pub use describe::{Description, ImageDescriber};

#[cfg(feature = "llava")]
mod describe {
    use std::ops::ControlFlow;
    use std::path::PathBuf;

    use ipfs_accelerate_llava::{LlavaProcessor, LlavaRunner, LlavaTasks, LlavaVariant};

    use super::*;

    /// Loading a LLaVA / LLaVA-NeXT checkpoint folder, as work for
    /// [`crate::backends::with_backend`].
    pub(crate) struct LoadLlava {
        pub(crate) dir: PathBuf,
        pub(crate) variant: LlavaVariant,
        pub(crate) options: LoadOptions,
    }

    impl crate::backends::WithBackend for LoadLlava {
        type Output = Box<dyn LlavaTasks>;

        fn run<H: ipfs_accelerate_core::Backend>(self, hal: &H) -> Result<Self::Output> {
            Ok(Box::new(LlavaRunner::<H::Burn>::load_dir(
                &self.dir,
                self.variant,
                &hal.device(),
                hal.kind(),
            )?))
        }

        /// On `cuda`, the tower and the language model on the cuBLAS engines (no burn device at
        /// all) when they can take the checkpoint.
        fn without_device(
            self,
            kind: ipfs_accelerate_core::BackendKind,
        ) -> std::result::Result<Result<Self::Output>, Self> {
            #[cfg(feature = "cuda")]
            if let Some(model) = crate::backends::cublas_engines(
                kind,
                self.variant.name(),
                &self.dir,
                "burn runs it",
                || crate::cuda_llava::CudaLlava::load(&self.dir, self.variant, &self.options),
            ) {
                return Ok(Ok(Box::new(model)));
            }
            let _ = (kind, &self.options);
            Err(self)
        }
    }

    /// A generated description.
    #[derive(Debug, Clone, PartialEq, serde::Serialize)]
    pub struct Description {
        /// The generated text.
        pub text: String,
        /// The prompt's token ids after image-token expansion.
        pub prompt_tokens: usize,
        /// The generated token ids.
        pub token_ids: Vec<u32>,
    }

    task_type!(
        /// LLaVA-1.5 or LLaVA-NeXT (by the checkpoint's `model_type`) with its processor.
        ImageDescriber => LlavaTasks {
            processor: LlavaProcessor,
        }
    );

    impl ImageDescriber {
        /// Loads `model` (a folder with `config.json`, safetensors, `preprocessor_config.json`,
        /// `tokenizer.json` and the chat template, or a hub id) on the first usable backend.
        pub fn load(model: &str, options: &LoadOptions) -> Result<Self> {
            let extra = [
                "preprocessor_config.json",
                "tokenizer.json",
                "tokenizer_config.json",
                "processor_config.json",
                "chat_template.json",
                "chat_template.jinja",
                "generation_config.json",
            ];
            let clock = ipfs_accelerate_core::Stopwatch::start();
            let dir = options.model_dir(model, &extra)?;
            let variant = match crate::loaded::model_type(&dir)?.as_str() {
                "llava_next" => LlavaVariant::LlavaNext,
                _ => LlavaVariant::Llava,
            };
            let load = |dir| LoadLlava {
                dir,
                variant,
                options: options.clone(),
            };
            let inner = Loaded::from_dir(dir, options, clock, load, None, None)?;
            let processor = LlavaProcessor::from_dir(&inner.dir)?;
            Ok(ImageDescriber { inner, processor })
        }

        /// Answers `question` about the images with up to `max_new_tokens` greedy tokens,
        /// streaming the text through `on_text`.
        pub fn describe(
            &self,
            images: &[RgbImage],
            question: &str,
            max_new_tokens: usize,
            mut on_text: impl FnMut(&str),
        ) -> Result<Output<Description>> {
            if question.trim().is_empty() {
                return Err(Error::Core(ipfs_accelerate_core::Error::InvalidInput(
                    "empty prompt".into(),
                )));
            }
            let decoded = images;
            self.inner.timed_here(
                images.len(),
                || {
                    let prompt = self.processor.chat_prompt(question, decoded.len())?;
                    Ok(self
                        .processor
                        .prepare(self.inner.model.as_ref(), decoded, &prompt)?)
                },
                |m, inputs| {
                    let mut config = m.default_generation_config();
                    config.max_new_tokens = max_new_tokens;
                    let mut ids = Vec::new();
                    let mut printed = 0usize;
                    let tokens = m.generate(&inputs, &config, &mut |t| {
                        ids.push(t);
                        if let Ok(text) = self.processor.decode(&ids) {
                            if !text.ends_with('\u{FFFD}')
                                && text.len() > printed
                                && text.is_char_boundary(printed)
                            {
                                on_text(&text[printed..]);
                                printed = text.len();
                            }
                        }
                        ControlFlow::Continue(())
                    })?;
                    Ok((inputs.input_ids.len(), tokens))
                },
                |(prompt_tokens, token_ids)| {
                    Ok(Description {
                        text: self.processor.decode(&token_ids)?,
                        prompt_tokens,
                        token_ids,
                    })
                },
            )
        }

        /// [`describe`](Self::describe) of image files.
        pub fn describe_files<P: AsRef<Path>>(
            &self,
            paths: &[P],
            question: &str,
            max_new_tokens: usize,
            on_text: impl FnMut(&str),
        ) -> Result<Output<Description>> {
            let images = crate::vision::load_images(paths)?;
            self.describe(&images, question, max_new_tokens, on_text)
        }
    }
}

#[cfg(feature = "xclip")]
pub(crate) use video::LoadXclip;
#[cfg(feature = "xclip")]
pub use video::VideoClassifier;

#[cfg(feature = "xclip")]
mod video {
    use ipfs_accelerate_preprocess::image::ProcessorKind;
    use ipfs_accelerate_preprocess::video::{frames_to_pixels, load_sampled_frames, sample_frames};
    use ipfs_accelerate_preprocess::TextTokenizer;
    use ipfs_accelerate_xclip::{XclipRunner, XclipTasks};

    use crate::loaded::clip_text;

    use super::*;

    /// Loads an X-CLIP checkpoint folder. On `cuda` its two towers (the cross-frame vision
    /// layers, CLIP's text tower) run on the cuBLAS encoder
    /// ([`ipfs_accelerate_xclip::vision_encoder_spec`], [`ipfs_accelerate_xclip::text_encoder_spec`])
    /// when it can take the checkpoint, the reason logged when not; the MIT and the prompt
    /// generator run on burn.
    pub(crate) struct LoadXclip {
        pub(crate) dir: std::path::PathBuf,
        pub(crate) options: LoadOptions,
    }

    impl crate::backends::WithBackend for LoadXclip {
        type Output = Box<dyn XclipTasks>;

        fn run<H: ipfs_accelerate_core::Backend>(self, hal: &H) -> Result<Self::Output> {
            #[allow(unused_mut)]
            let mut runner =
                XclipRunner::<H::Burn>::load_dir(&self.dir, &hal.device(), hal.kind())?;
            #[cfg(feature = "cuda")]
            if hal.kind() == ipfs_accelerate_core::BackendKind::Cuda {
                use crate::backends::cublas_tower;
                use ipfs_accelerate_xclip::{text_encoder_spec, vision_encoder_spec};
                let config = runner.model().config().clone();
                // Each tower reads only its own tensors from the checkpoint's files.
                let source = || ipfs_accelerate_io::open_weights(&self.dir);
                let (kind, options) = (hal.kind(), &self.options);
                let tower = |name| ("xclip", name, self.dir.as_path());
                if let Some(engine) = cublas_tower(kind, options, tower("vision"), || {
                    vision_encoder_spec(&config, source()?.as_ref())
                }) {
                    runner = runner.with_vision_engine(engine);
                }
                if let Some(engine) = cublas_tower(kind, options, tower("text"), || {
                    text_encoder_spec(&config, source()?.as_ref())
                }) {
                    runner = runner.with_text_engine(engine);
                }
            }
            let _ = &self.options;
            Ok(Box::new(runner))
        }
    }

    task_type!(
        /// Video classification with X-CLIP: frames (image files) and free-text labels.
        VideoClassifier => XclipTasks {
            processor: ipfs_accelerate_preprocess::image::ImageProcessor,
            tokenizer: TextTokenizer,
        }
    );

    impl VideoClassifier {
        /// Loads `model` (it needs `tokenizer.json`) on the first usable backend.
        pub fn load(model: &str, options: &LoadOptions) -> Result<Self> {
            let inner = Loaded::load(
                model,
                options,
                &["preprocessor_config.json", "tokenizer.json"],
                |dir| LoadXclip {
                    dir,
                    options: options.clone(),
                },
            )?;
            let config = inner.model.config();
            let side = config.vision_config.base.image_size;
            let max_len = config.text_config.max_position_embeddings;
            let processor = crate::vision::image_processor(
                &inner.dir,
                ProcessorKind::Clip,
                Some((side, side)),
            )?;
            let tokenizer = TextTokenizer::from_file(&inner.dir.join("tokenizer.json"), max_len)?;
            Ok(VideoClassifier {
                inner,
                processor,
                tokenizer,
            })
        }

        /// Frames the model takes per video (`num_frames`); [`classify`](Self::classify) samples
        /// that many uniformly from the frames it is given.
        pub fn frames_per_video(&self) -> usize {
            self.inner.model.config().vision_config.num_frames
        }

        /// The probability of each label for the video whose frames (decoded, in order) are
        /// `frames`; `template` wraps each label (`{}`).
        pub fn classify(
            &self,
            frames: &[RgbImage],
            labels: &[&str],
            template: &str,
        ) -> Result<Output<Vec<Label>>> {
            self.classify_with(labels, template, || {
                if frames.is_empty() {
                    return Err(ipfs_accelerate_core::Error::InvalidInput(
                        "a video needs at least one frame".into(),
                    ));
                }
                let chosen: Vec<RgbImage> = sample_frames(frames.len(), self.frames_per_video())
                    .into_iter()
                    .map(|i| frames[i].clone())
                    .collect();
                Ok(frames_to_pixels(&chosen, &self.processor)?)
            })
        }

        /// [`classify`](Self::classify) of a video given as frame files in order (only the
        /// sampled frames are decoded).
        pub fn classify_files<P: AsRef<Path>>(
            &self,
            frames: &[P],
            labels: &[&str],
            template: &str,
        ) -> Result<Output<Vec<Label>>> {
            self.classify_with(labels, template, || {
                load_sampled_frames(frames, self.frames_per_video(), &self.processor)
                    .map_err(ipfs_accelerate_core::Error::from)
            })
        }

        fn classify_with(
            &self,
            labels: &[&str],
            template: &str,
            pixels: impl FnOnce() -> ipfs_accelerate_core::Result<ipfs_accelerate_core::HostTensor>,
        ) -> Result<Output<Vec<Label>>> {
            self.inner.timed(
                1,
                || {
                    let text = clip_text(encode_labels(&self.tokenizer, labels, template)?);
                    Ok((pixels()?, text))
                },
                |m, (pixels, text)| Ok(m.classify_video(&pixels, &text)?),
                |probs| Ok(rank_labels(labels, probs).pop().unwrap_or_default()),
            )
        }
    }
}

#[cfg(feature = "clap")]
pub use audio::AudioClassifier;
#[cfg(feature = "clap")]
pub(crate) use audio::LoadClap;

#[cfg(feature = "clap")]
mod audio {
    use ipfs_accelerate_clap::{ClapRunner, ClapTasks};
    use ipfs_accelerate_preprocess::TextTokenizer;

    use super::*;

    /// Loads a CLAP checkpoint folder. On `cuda` its text tower runs on the cuBLAS encoder
    /// ([`ipfs_accelerate_clap::text_encoder_spec`]) when it can take the checkpoint, the reason
    /// logged when not; the HTSAT audio tower runs on burn.
    pub(crate) struct LoadClap {
        pub(crate) dir: std::path::PathBuf,
        pub(crate) options: LoadOptions,
    }

    impl crate::backends::WithBackend for LoadClap {
        type Output = Box<dyn ClapTasks>;

        fn run<H: ipfs_accelerate_core::Backend>(self, hal: &H) -> Result<Self::Output> {
            #[allow(unused_mut)]
            let mut runner = ClapRunner::<H::Burn>::load_dir(&self.dir, &hal.device(), hal.kind())?;
            #[cfg(feature = "cuda")]
            if hal.kind() == ipfs_accelerate_core::BackendKind::Cuda {
                let tower = ("clap", "text", self.dir.as_path());
                if let Some(engine) =
                    crate::backends::cublas_tower(hal.kind(), &self.options, tower, || {
                        let weights = ipfs_accelerate_io::open_weights(&self.dir)?;
                        ipfs_accelerate_clap::text_encoder_spec(runner.model().config(), weights)
                    })
                {
                    runner = runner.with_text_engine(engine);
                }
            }
            let _ = &self.options;
            Ok(Box::new(runner))
        }
    }

    task_type!(
        /// Zero-shot audio classification with CLAP.
        AudioClassifier => ClapTasks {
            tokenizer: TextTokenizer,
        }
    );

    impl AudioClassifier {
        /// Loads `model` (it needs `tokenizer.json`) on the first usable backend.
        pub fn load(model: &str, options: &LoadOptions) -> Result<Self> {
            let inner = Loaded::load(
                model,
                options,
                &["preprocessor_config.json", "tokenizer.json"],
                |dir| LoadClap {
                    dir,
                    options: options.clone(),
                },
            )?;
            let max_len = inner.model.config().text_config.max_position_embeddings;
            let tokenizer = TextTokenizer::from_file(&inner.dir.join("tokenizer.json"), max_len)?;
            Ok(AudioClassifier { inner, tokenizer })
        }

        /// The probability of each label for mono `audio` (any rate; the first window of a long
        /// clip); `template` wraps each label (`{}`).
        pub fn classify(
            &self,
            audio: &Audio,
            labels: &[&str],
            template: &str,
        ) -> Result<Output<Vec<Label>>> {
            self.inner.timed(
                1,
                || {
                    let features = self
                        .inner
                        .model
                        .waveform_features(&audio.samples, audio.sample_rate)?;
                    let text = encode_labels(&self.tokenizer, labels, template)?;
                    Ok((features, text))
                },
                |m, (features, text)| Ok(m.zero_shot(&features, &text)?),
                |probs| Ok(rank_labels(labels, probs).pop().unwrap_or_default()),
            )
        }

        /// [`classify`](Self::classify) of a WAV file (8/16/24/32-bit PCM or float, channels
        /// mixed down).
        pub fn classify_file(
            &self,
            wav: impl AsRef<Path>,
            labels: &[&str],
            template: &str,
        ) -> Result<Output<Vec<Label>>> {
            self.classify(&crate::load_audio(wav)?, labels, template)
        }

        /// CLAP's audio embedding of mono `audio` (HF `ClapModel`'s `audio_embeds`: projected and
        /// L2-normalised; the first window of a long clip).
        pub fn embed_audio(&self, audio: &Audio) -> Result<Output<Vec<f32>>> {
            self.inner.timed(
                1,
                || {
                    Ok(self
                        .inner
                        .model
                        .waveform_features(&audio.samples, audio.sample_rate)?)
                },
                |m, features| Ok(m.audio_embeds(&features)?),
                |mut rows| Ok(rows.pop().unwrap_or_default()),
            )
        }

        /// [`embed_audio`](Self::embed_audio) of a WAV file.
        pub fn embed_audio_file(&self, wav: impl AsRef<Path>) -> Result<Output<Vec<f32>>> {
            self.embed_audio(&crate::load_audio(wav)?)
        }

        /// CLAP's text embeddings, one per text (HF `ClapModel`'s `text_embeds`: projected and
        /// L2-normalised).
        pub fn embed_texts(&self, texts: &[&str]) -> Result<Output<Vec<Vec<f32>>>> {
            self.inner.timed(
                texts.len(),
                || encode_labels(&self.tokenizer, texts, "{}"),
                |m, text| Ok(m.text_embeds(&text)?),
                Ok,
            )
        }
    }
}
