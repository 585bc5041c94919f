//! Whisper behind the uniform [`ModelRunner`] interface, and the transcription task.

use ipfs_accelerate_core::JsonConfig;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor, TensorData};
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, ModelRunner, Result, TensorMap, TensorSource,
};
use ipfs_accelerate_nn::{
    convert::{float_from_host, float_to_host},
    generate::{generate, GenerationConfig, Resumed, TokenDecoder},
};
use ipfs_accelerate_preprocess::{
    audio::{LogMel, WhisperFeatureConfig, WhisperFeatureExtractor},
    TextTokenizer,
};

use crate::generate::{check_positions, pick_language, Suppressed};
use crate::{Suppression, Whisper, WhisperConfig, WhisperGenerationConfig, WhisperTokenDecoder};

/// The Whisper family: loads a checkpoint folder as a [`WhisperRunner`].
pub struct WhisperFamily;

impl Family for WhisperFamily {
    const NAME: &'static str = "whisper";

    fn load<B: Backend>(
        dir: &Path,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Box<dyn ModelRunner>> {
        Ok(Box::new(WhisperRunner::<B>::from_dir(dir, device, kind)?))
    }
}

/// Options of a transcription.
#[derive(Debug, Clone, PartialEq)]
pub struct TranscribeOptions {
    /// Language token (`"en"` or `"<|en|>"`) for multilingual checkpoints; detected when `None`.
    pub language: Option<String>,
    /// `"transcribe"` (default) or `"translate"`, for checkpoints with task tokens.
    pub task: String,
    /// Tokens to generate at most (default: up to the generation config's `max_length`).
    pub max_new_tokens: Option<usize>,
    /// Resample audio whose rate differs from the feature extractor's (else it is an error).
    pub resample: bool,
    /// Decode with the KV cache (the default) or recompute every step.
    pub use_cache: bool,
}

impl Default for TranscribeOptions {
    fn default() -> Self {
        TranscribeOptions {
            language: None,
            task: "transcribe".into(),
            max_new_tokens: None,
            resample: true,
            use_cache: true,
        }
    }
}

/// The result of a transcription.
#[derive(Debug, Clone, PartialEq)]
pub struct Transcription {
    /// The decoder prompt (`<|startoftranscript|>`, language, task, `<|notimestamps|>`).
    pub prompt: Vec<u32>,
    /// Generated token ids (end-of-text included when reached).
    pub tokens: Vec<u32>,
    /// The text (special tokens skipped), when the checkpoint has a `tokenizer.json`.
    pub text: Option<String>,
    /// Whether the audio was longer than the model's window and was cut.
    pub truncated: bool,
}

/// Everything of a Whisper checkpoint but its weights: the configuration, the feature extractor,
/// the generation config and the (optional) tokenizer. Transcription is described here once,
/// for any [`WhisperExecutor`] (the burn modules, an ONNX export).
pub struct WhisperAssets {
    /// The model configuration.
    pub config: WhisperConfig,
    /// The log-mel front end.
    pub features: WhisperFeatureExtractor,
    /// Prompt tokens, suppression and limits.
    pub generation: WhisperGenerationConfig,
    /// Decodes tokens to text, when the checkpoint has a `tokenizer.json`.
    pub tokenizer: Option<TextTokenizer>,
}

/// What transcription needs from an executor of Whisper's encoder and decoder. Every executor
/// that is also a [`ModelRunner`] is a [`WhisperTasks`].
pub trait WhisperExecutor {
    /// The checkpoint's configuration, feature extractor, generation config and tokenizer.
    fn assets(&self) -> &WhisperAssets;
    /// The encoder's output as the executor keeps it.
    type Encoded;
    /// Encodes one log-mel spectrogram (already checked against the model's shape).
    fn encode(&self, features: &LogMel) -> Result<Self::Encoded>;
    /// A decoder over `encoded` whose rows start from `prompts` (KV-cached when `use_cache` and
    /// the executor has a cache).
    fn decoder<'a>(
        &'a self,
        encoded: &'a Self::Encoded,
        prompts: &[Vec<u32>],
        use_cache: bool,
    ) -> Result<Box<dyn TokenDecoder + 'a>>;
}

impl WhisperAssets {
    /// Reads `config.json` and, when present, `generation_config.json`,
    /// `preprocessor_config.json` (else features sized for the model) and `tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let config = WhisperConfig::from_file(&dir.join("config.json"))?;
        let pre = dir.join("preprocessor_config.json");
        let features = if pre.is_file() {
            WhisperFeatureConfig::from_file(&pre)?
        } else {
            WhisperFeatureConfig::for_model(config.num_mel_bins, config.input_frames())?
        };
        let tok = dir.join("tokenizer.json");
        let tokenizer = if tok.is_file() {
            Some(TextTokenizer::from_file(&tok, config.max_target_positions)?)
        } else {
            None
        };
        let generation = WhisperGenerationConfig::from_dir(dir)?;
        generation.validate(config.vocab_size, &dir.join("generation_config.json"))?;
        let mut assets = Self::new(config, features)?;
        assets.generation = generation;
        assets.tokenizer = tokenizer;
        Ok(assets)
    }

    /// The configuration with a feature extractor config (which must produce the model's mel
    /// bins and input frames); no tokenizer, default generation config.
    pub fn new(config: WhisperConfig, features: WhisperFeatureConfig) -> Result<Self> {
        if features.feature_size != config.num_mel_bins
            || features.num_frames() != config.input_frames()
        {
            return Err(Error::config(
                "preprocessor_config.json",
                format!(
                    "the feature extractor gives {} mel bins × {} frames, the model takes {} × {}",
                    features.feature_size,
                    features.num_frames(),
                    config.num_mel_bins,
                    config.input_frames()
                ),
            ));
        }
        Ok(WhisperAssets {
            config,
            features: WhisperFeatureExtractor::new(features)?,
            generation: WhisperGenerationConfig::default(),
            tokenizer: None,
        })
    }

    /// Checks that `features` has the model's mel bins and frames.
    pub fn check_features(&self, features: &LogMel) -> Result<()> {
        let c = &self.config;
        if features.mels != c.num_mel_bins
            || features.frames != c.input_frames()
            || features.data.len() != features.mels * features.frames
        {
            return Err(Error::InvalidInput(format!(
                "log-mel of {} × {} (with {} values) for a model taking {} × {}",
                features.mels,
                features.frames,
                features.data.len(),
                c.num_mel_bins,
                c.input_frames()
            )));
        }
        Ok(())
    }

    /// The decoder prompt for `options`: `<|startoftranscript|>`, then for checkpoints that have
    /// them the language (given, or detected with `detect` over the language tokens), the task and
    /// `<|notimestamps|>`.
    fn prompt(
        &self,
        options: &TranscribeOptions,
        detect: impl FnOnce(&[u32]) -> Result<u32>,
    ) -> Result<Vec<u32>> {
        let g = &self.generation;
        let mut prompt = vec![self.config.decoder_start_token_id];
        if g.multilingual() && !g.lang_to_id.is_empty() {
            let lang = match &options.language {
                Some(l) => {
                    let key = if l.starts_with("<|") {
                        l.clone()
                    } else {
                        format!("<|{l}|>")
                    };
                    *g.lang_to_id.get(&key).ok_or_else(|| {
                        Error::InvalidInput(format!("unknown language `{l}` for this checkpoint"))
                    })?
                }
                None => detect(&g.lang_to_id.values().copied().collect::<Vec<u32>>())?,
            };
            prompt.push(lang);
        }
        if !g.task_to_id.is_empty() {
            let task = g.task_to_id.get(&options.task).ok_or_else(|| {
                Error::InvalidInput(format!(
                    "unknown task `{}` (this checkpoint knows {:?})",
                    options.task,
                    g.task_to_id.keys().collect::<Vec<_>>()
                ))
            })?;
            prompt.push(*task);
        }
        if let Some(t) = g.no_timestamps_token_id {
            prompt.push(t);
        }
        Ok(prompt)
    }

    /// Transcribes log-mel features of one waveform on `executor`: encoder, prompt (language
    /// detected from the decoder's first logits when not given), greedy decoding with the
    /// generation config's suppression and end of text, then the tokenizer.
    pub fn transcribe_features<E: WhisperExecutor + ?Sized>(
        &self,
        executor: &E,
        features: &LogMel,
        options: &TranscribeOptions,
    ) -> Result<Transcription> {
        self.check_features(features)?;
        let encoded = executor.encode(features)?;
        let c = &self.config;
        // Detection reads `<|startoftranscript|>` alone; its decoder (cross K/V computed, one token
        // cached) is kept to go on with the rest of the prompt.
        let mut detection = None;
        let prompt = self.prompt(options, |languages| {
            let mut first = executor.decoder(&encoded, &[vec![c.decoder_start_token_id]], true)?;
            let vocab = first.vocab();
            let logits = first.prefill()?;
            let language = pick_language(&logits, vocab, languages)?[0];
            detection = Some((first, logits));
            Ok(language)
        })?;
        let max_length = self
            .generation
            .max_length
            .unwrap_or(c.max_target_positions)
            .min(c.max_target_positions + 1);
        let max_new_tokens = options
            .max_new_tokens
            .unwrap_or(max_length.saturating_sub(prompt.len()));
        let eos = self.generation.eos_token_id.or(c.eos_token_id);
        let config = GenerationConfig {
            max_new_tokens,
            stop_tokens: eos.into_iter().collect(),
            ..Default::default()
        };
        check_positions(prompt.len(), &config, c.max_target_positions)?;
        let suppression = Suppression {
            always: self.generation.suppress_tokens.clone(),
            at_begin: self.generation.begin_suppress_tokens.clone(),
        };
        let prompts = std::slice::from_ref(&prompt);
        let decoder: Box<dyn TokenDecoder + '_> = match detection {
            Some((first, logits)) if options.use_cache => {
                Box::new(Resumed::new(first, logits, vec![prompt[1..].to_vec()])?)
            }
            _ => executor.decoder(&encoded, prompts, options.use_cache)?,
        };
        let tokens = generate(
            &mut Suppressed::new(decoder, suppression)?,
            prompts,
            &config,
            |_, _| ControlFlow::Continue(()),
        )?
        .into_iter()
        .next()
        .unwrap_or_default();
        let text = match &self.tokenizer {
            Some(t) => Some(t.decode(&tokens)?),
            None => None,
        };
        Ok(Transcription {
            prompt,
            tokens,
            text,
            truncated: features.truncated,
        })
    }

    /// Transcribes mono `samples` at `sample_rate` Hz (resampled to the feature extractor's rate
    /// when `options.resample`) on `executor`: log-mel, then
    /// [`transcribe_features`](Self::transcribe_features).
    pub fn transcribe<E: WhisperExecutor + ?Sized>(
        &self,
        executor: &E,
        samples: &[f32],
        sample_rate: u32,
        options: &TranscribeOptions,
    ) -> Result<Transcription> {
        // Cut to the window before resampling: a long input costs no more than one window.
        let features = self
            .features
            .extract_any_rate(samples, sample_rate, options.resample)?;
        self.transcribe_features(executor, &features, options)
    }
}

/// A loaded Whisper checkpoint on one backend, with its feature extractor, generation config
/// and (optional) tokenizer.
pub struct WhisperRunner<B: Backend> {
    model: Whisper<B>,
    assets: WhisperAssets,
    device: B::Device,
    kind: BackendKind,
    /// Another executor of [`crate::encoder_spec`] that encodes instead of the burn encoder.
    encoder_engine: Option<EncoderEngine>,
}

/// A runner of [`crate::encoder_spec`] (the cuBLAS engine on `cuda`): `input_features` in,
/// `last_hidden_state` out.
struct EncoderEngine {
    runner: Box<dyn ModelRunner>,
    /// `<engine> encoder`, what [`ModelRunner::engine`] says of the Whisper runner.
    label: String,
}

impl EncoderEngine {
    /// The `last_hidden_state` of `inputs`' `input_features` (the engine reads no other input).
    fn states(&self, inputs: &TensorMap) -> Result<HostTensor> {
        self.runner
            .run(inputs)?
            .remove("last_hidden_state")
            .ok_or_else(|| {
                Error::Compute("the encoder engine returned no last_hidden_state".into())
            })
    }
}

impl<B: Backend> WhisperExecutor for WhisperRunner<B> {
    type Encoded = Tensor<B, 3>;

    fn assets(&self) -> &WhisperAssets {
        &self.assets
    }

    fn encode(&self, features: &LogMel) -> Result<Tensor<B, 3>> {
        if self.encoder_engine.is_some() {
            let x = HostTensor::from_f32(vec![1, features.mels, features.frames], &features.data)?;
            let mut inputs = TensorMap::new();
            inputs.insert("input_features".into(), x);
            return self.encode_inputs(&inputs);
        }
        let x = Tensor::from_data(
            TensorData::new(features.data.clone(), [1, features.mels, features.frames]),
            &self.device,
        );
        self.model.encode(x)
    }

    fn decoder<'a>(
        &'a self,
        encoded: &'a Tensor<B, 3>,
        prompts: &[Vec<u32>],
        use_cache: bool,
    ) -> Result<Box<dyn TokenDecoder + 'a>> {
        Ok(Box::new(WhisperTokenDecoder::new(
            &self.model,
            encoded.clone(),
            prompts,
            use_cache,
        )?))
    }
}

impl<B: Backend> WhisperRunner<B> {
    /// Loads the weights and the [`WhisperAssets`] of a checkpoint folder.
    pub fn from_dir(dir: &Path, device: &B::Device, kind: BackendKind) -> Result<Self> {
        Self::from_dir_loading(dir, device, kind, true)
    }

    /// The [`WhisperAssets`] of a checkpoint folder and its weights, the encoder's only
    /// `with_encoder`.
    fn from_dir_loading(
        dir: &Path,
        device: &B::Device,
        kind: BackendKind,
        with_encoder: bool,
    ) -> Result<Self> {
        let assets = WhisperAssets::from_dir(dir)?;
        let weights = ipfs_accelerate_io::open_weights(dir)?;
        Ok(WhisperRunner {
            model: Whisper::load_parts(weights, &assets.config, device, with_encoder)?,
            assets,
            device: device.clone(),
            kind,
            encoder_engine: None,
        })
    }

    /// Loads the decoder of a checkpoint folder (and its [`WhisperAssets`]) and encodes with
    /// `engine` ([`WhisperRunner::with_encoder_engine`]); the burn encoder's weights are not
    /// loaded.
    pub fn from_dir_with_encoder_engine(
        dir: &Path,
        device: &B::Device,
        kind: BackendKind,
        engine: Box<dyn ModelRunner>,
    ) -> Result<Self> {
        let runner = Self::from_dir_loading(dir, device, kind, false)?;
        Ok(runner.with_encoder_engine(engine))
    }

    /// Encodes with `engine` instead of the burn encoder: a runner of this checkpoint's
    /// [`crate::encoder_spec`] (`input_features` in, `last_hidden_state` out), such as the cuBLAS
    /// engine on `cuda`. Its states are handed to the decoder once per request.
    pub fn with_encoder_engine(mut self, engine: Box<dyn ModelRunner>) -> Self {
        let label = format!("{} encoder", engine.engine().unwrap_or("engine"));
        self.encoder_engine = Some(EncoderEngine {
            runner: engine,
            label,
        });
        self
    }

    /// Loads the model from a weight source with a feature extractor config (which must produce
    /// the model's mel bins and input frames); no tokenizer, default generation config.
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &WhisperConfig,
        features: WhisperFeatureConfig,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Self> {
        let assets = WhisperAssets::new(config.clone(), features)?;
        Ok(WhisperRunner {
            model: Whisper::load(source, config, device)?,
            assets,
            device: device.clone(),
            kind,
            encoder_engine: None,
        })
    }

    /// The model.
    pub fn model(&self) -> &Whisper<B> {
        &self.model
    }

    /// The configuration, feature extractor, generation config and tokenizer.
    pub fn assets(&self) -> &WhisperAssets {
        &self.assets
    }

    /// The feature extractor.
    pub fn feature_extractor(&self) -> &WhisperFeatureExtractor {
        &self.assets.features
    }

    /// The generation config.
    pub fn generation_config(&self) -> &WhisperGenerationConfig {
        &self.assets.generation
    }

    /// Transcribes log-mel features of one waveform.
    pub fn transcribe_features(
        &self,
        features: &LogMel,
        options: &TranscribeOptions,
    ) -> Result<Transcription> {
        self.assets.transcribe_features(self, features, options)
    }

    /// Transcribes mono `samples` at `sample_rate` Hz (resampled to the feature extractor's rate
    /// when `options.resample`): log-mel → encoder → greedy decoding with the KV cache, timestamps
    /// off.
    pub fn transcribe_with(
        &self,
        samples: &[f32],
        sample_rate: u32,
        options: &TranscribeOptions,
    ) -> Result<Transcription> {
        self.assets.transcribe(self, samples, sample_rate, options)
    }

    /// [`WhisperRunner::transcribe_with`] with the default options.
    pub fn transcribe(&self, samples: &[f32], sample_rate: u32) -> Result<Transcription> {
        self.transcribe_with(samples, sample_rate, &TranscribeOptions::default())
    }
}

/// An integer input tensor of shape `[batch, n]` as rows.
fn int_rows(inputs: &TensorMap, name: &str, batch: usize) -> Result<Option<(Vec<i64>, usize)>> {
    let Some(t) = inputs.get(name) else {
        return Ok(None);
    };
    match t.shape() {
        &[b, n] if b == batch && n > 0 => Ok(Some((t.to_i64_vec()?, n))),
        other => Err(Error::InvalidInput(format!(
            "{name} must be [{batch}, n ≥ 1] for {batch} audio inputs, got {other:?}"
        ))),
    }
}

impl<B: Backend> WhisperRunner<B> {
    /// The encoder output of the input `input_features` `[batch, mels, frames]`, by the encoder
    /// engine when there is one.
    fn encode_inputs(&self, inputs: &TensorMap) -> Result<Tensor<B, 3>> {
        if let Some(engine) = &self.encoder_engine {
            return float_from_host::<B, 3>(&engine.states(inputs)?, &self.device);
        }
        let features = inputs
            .get("input_features")
            .ok_or_else(|| Error::InvalidInput("missing input `input_features`".into()))?;
        self.model
            .encode(float_from_host::<B, 3>(features, &self.device)?)
    }
}

impl<B: Backend> ModelRunner for WhisperRunner<B> {
    fn family(&self) -> &str {
        WhisperFamily::NAME
    }

    fn backend(&self) -> BackendKind {
        self.kind
    }

    fn engine(&self) -> Option<&str> {
        self.encoder_engine.as_ref().map(|e| e.label.as_str())
    }

    /// Inputs: `input_features` `[batch, mels, frames]`; optional `decoder_input_ids` `[batch, n]`
    /// (→ `logits`) with `decoder_attention_mask`, and `greedy_steps` `[1]` (→ `greedy_tokens`,
    /// argmax from `greedy_prompt` or `decoder_start_token_id`, no stop token, no suppression).
    /// Always returns `encoder_last_hidden_state`.
    fn generate_ids(
        &self,
        inputs: &TensorMap,
        max_new_tokens: usize,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>> {
        let encoder = self.encode_inputs(inputs)?;
        let prompts = vec![vec![self.model.config().decoder_start_token_id]];
        let rows = self.model.generate_from_encoder(
            encoder,
            &prompts,
            &GenerationConfig::exact_greedy(max_new_tokens),
            Suppression::default(),
            true,
            |_, t| on_token(t),
        )?;
        ipfs_accelerate_nn::generate::single_row(rows)
    }

    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        let decodes = ["decoder_input_ids", "greedy_steps"]
            .iter()
            .any(|name| inputs.contains_key(*name));
        // With an encoder engine its states are the output as they are, and go to the decoder's
        // device only when something decodes.
        let engine_states = match &self.encoder_engine {
            Some(engine) => Some(engine.states(inputs)?),
            None => None,
        };
        let engine_states = match engine_states {
            Some(states) if !decodes => {
                let mut out = TensorMap::new();
                out.insert("encoder_last_hidden_state".into(), states);
                return Ok(out);
            }
            other => other,
        };
        let encoder = match &engine_states {
            Some(states) => float_from_host::<B, 3>(states, &self.device)?,
            None => self.encode_inputs(inputs)?,
        };
        let batch = encoder.dims()[0];
        let start = self.model.config().decoder_start_token_id;
        let mut out = decode_outputs(
            inputs,
            batch,
            start,
            |ids, len, mask| float_to_host(self.model.forward_logits(&encoder, ids, len, mask)?),
            |prompts, config| {
                self.model.generate_from_encoder(
                    encoder.clone(),
                    prompts,
                    config,
                    Suppression::default(),
                    true,
                    |_, _| ControlFlow::Continue(()),
                )
            },
        )?;
        let states = match engine_states {
            Some(states) => states,
            None => float_to_host(encoder)?,
        };
        out.insert("encoder_last_hidden_state".into(), states);
        Ok(out)
    }
}

/// The decoding outputs of a Whisper [`ModelRunner::run`] over `batch` encoded inputs, for any
/// executor: with `decoder_input_ids` `[batch, n]` (and `decoder_attention_mask`) the `logits`
/// `[batch, n, vocab]` that `logits(ids, n, mask)` computes; with `greedy_steps` `[1]` the
/// `greedy_tokens` `[batch, steps]` that `greedy(prompts, config)` generates from `greedy_prompt`
/// (or `start`) without suppression or a stop token.
pub fn decode_outputs(
    inputs: &TensorMap,
    batch: usize,
    start: u32,
    logits: impl FnOnce(&[i64], usize, Option<&[i64]>) -> Result<HostTensor>,
    greedy: impl FnOnce(&[Vec<u32>], &GenerationConfig) -> Result<Vec<Vec<u32>>>,
) -> Result<TensorMap> {
    let mut out = TensorMap::new();
    if let Some((ids, len)) = int_rows(inputs, "decoder_input_ids", batch)? {
        let mask = int_rows(inputs, "decoder_attention_mask", batch)?;
        if let Some((_, n)) = &mask {
            if *n != len {
                return Err(Error::InvalidInput(format!(
                    "decoder_attention_mask has {n} columns, decoder_input_ids {len}"
                )));
            }
        }
        let logits = logits(&ids, len, mask.as_ref().map(|(m, _)| m.as_slice()))?;
        out.insert("logits".into(), logits);
    }
    if let Some(steps) = ipfs_accelerate_nn::generate::greedy_steps(inputs)? {
        let prompts: Vec<Vec<u32>> = match int_rows(inputs, "greedy_prompt", batch)? {
            Some((ids, n)) => ids
                .chunks(n)
                .map(|r| {
                    r.iter()
                        .map(|&t| u32::try_from(t).unwrap_or(u32::MAX))
                        .collect()
                })
                .collect(),
            None => vec![vec![start]; batch],
        };
        let config = GenerationConfig {
            max_new_tokens: steps,
            ..Default::default()
        };
        let rows = greedy(&prompts, &config)?;
        let flat: Vec<i64> = rows.iter().flatten().map(|&t| i64::from(t)).collect();
        out.insert(
            "greedy_tokens".into(),
            HostTensor::from_i64(vec![batch, steps], &flat)?,
        );
    }
    Ok(out)
}

/// The object-safe task interface of a loaded Whisper, whatever backend it runs on.
pub trait WhisperTasks: ModelRunner {
    /// The configuration.
    fn config(&self) -> &WhisperConfig;
    /// Transcribes mono samples at `sample_rate` Hz with `options`.
    fn transcribe_with(
        &self,
        samples: &[f32],
        sample_rate: u32,
        options: &TranscribeOptions,
    ) -> Result<Transcription>;
    /// Transcribes a log-mel spectrogram with `options`.
    fn transcribe_features(
        &self,
        features: &LogMel,
        options: &TranscribeOptions,
    ) -> Result<Transcription>;
}

impl<E: WhisperExecutor + ModelRunner> WhisperTasks for E {
    fn config(&self) -> &WhisperConfig {
        &self.assets().config
    }

    fn transcribe_with(
        &self,
        samples: &[f32],
        sample_rate: u32,
        options: &TranscribeOptions,
    ) -> Result<Transcription> {
        self.assets()
            .transcribe(self, samples, sample_rate, options)
    }

    fn transcribe_features(
        &self,
        features: &LogMel,
        options: &TranscribeOptions,
    ) -> Result<Transcription> {
        self.assets().transcribe_features(self, features, options)
    }
}
