//! `Pipeline`: resolve → select → load once, then run tasks with measured metrics.

use ipfs_accelerate_core::JsonConfig;
use std::time::Duration;

use ipfs_accelerate_bert::{
    tasks::{best_span, softmax, Span},
    BertConfig, BertHead, BertInputs, BertRunner, BertTasks, HostLogits,
};
use ipfs_accelerate_core::{
    BackendKind, Metrics, Precision, ProbeBackend, Selection, SkippedBackend, Stopwatch,
};
use ipfs_accelerate_io::ResolveOptions;
use ipfs_accelerate_nn::gptq::GptqOptions;
use ipfs_accelerate_nn::weights::{LoadedWeights, WeightStats};
use ipfs_accelerate_nn::WeightQuantization;
use ipfs_accelerate_preprocess::{plan_chunks, Encoded, PreprocessError, TextTokenizer};

/// How token vectors become one sentence vector ([`Pipeline::pooling`]; read from
/// sentence-transformers' `1_Pooling/config.json`).
pub use ipfs_accelerate_bert::tasks::Pooling;

use crate::assets::Assets;
use crate::backends::{load_on_first_usable, resolve_preferences, WithBackend};
use crate::loaded::{Calibrated, Label, LoadOptions, Output, Scoped};
use crate::{Error, Result};

/// The built-in calibration corpus ([`PipelineBuilder::calibrate_default`]): 146 short English
/// sentences across everyday topics (travel, science, cooking, sport, finance, software, ...),
/// one per line, written for this purpose. It deliberately shares no sentence with
/// `shared/refs/minilm_public_sentences.txt`, the evaluation set the quantization tests compare
/// against, so calibration never sees what it is judged on.
pub const DEFAULT_CALIBRATION_TEXT: &str = include_str!("../data/calibration_en.txt");

/// The non-empty lines of a calibration text (one text per line, surrounding whitespace trimmed).
pub fn calibration_lines(text: &str) -> Vec<String> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect()
}

/// What calibrating a pipeline's int4 weights did and took ([`Pipeline::calibration`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct CalibrationReport {
    /// Calibration texts run through the model (per pass).
    pub texts: usize,
    /// Linear layers whose int4 weights GPTQ chose (the others were rounded to nearest).
    pub layers: usize,
    /// Time from the first float load to the solved weights: the float load(s), the calibration
    /// pass(es) and the solver (the final load is not included).
    pub duration: Duration,
}

/// What a pipeline is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Task {
    /// Whatever the checkpoint's head does (embeddings for a bare encoder).
    #[default]
    Auto,
    /// Sentence embeddings (any encoder).
    Embed,
    /// Sequence classification (labels with probabilities).
    Classify,
    /// Token classification (a label per token).
    TokenClassify,
    /// Extractive question answering.
    QuestionAnswering,
}

/// Configures and builds a [`Pipeline`].
#[derive(Debug, Clone)]
pub struct PipelineBuilder {
    model: String,
    task: Task,
    backends: Option<Vec<BackendKind>>,
    env_override: bool,
    resolve: ResolveOptions,
    max_length: Option<usize>,
    quantization: WeightQuantization,
    share_weights: bool,
    calibration: Option<Vec<String>>,
    gptq: GptqOptions,
    precision: Precision,
    batch_size: usize,
}

/// The default number of texts per forward of [`Pipeline::embed`] / [`Pipeline::classify`]
/// (sentence-transformers' default).
pub const DEFAULT_BATCH_SIZE: usize = 32;

/// Texts tokenised at once by [`Pipeline::embed`] and [`Pipeline::classify`] before they are
/// split into forward passes (bounds the padded token matrix of a huge input).
const TOKENIZE_WINDOW: usize = 1024;

/// What one more forward pass costs, in padded token positions (MiniLM on 2 Zen 4 cores: batch 1
/// × 8 tokens takes 3.2 ms where batch 32 spends 0.15 ms per position, so a pass costs about
/// 15 positions of work before its first token): a chunk is split off when the padding it saves
/// is worth more.
const FORWARD_OVERHEAD_TOKENS: usize = 16;

/// Set to `off` to run each chunk of [`DEFAULT_BATCH_SIZE`] texts as one forward padded to its
/// longest (the behaviour before length-planned chunks; for measuring them).
pub const SPLIT_BATCHES_ENV: &str = "IPFS_ACCELERATE_SPLIT_BATCHES";

/// [`FORWARD_OVERHEAD_TOKENS`], or a cost no padding outweighs when [`SPLIT_BATCHES_ENV`] is off.
fn forward_overhead_tokens() -> usize {
    match crate::backends::env_switch(SPLIT_BATCHES_ENV) {
        Some(false) => 1 << 40,
        _ => FORWARD_OVERHEAD_TOKENS,
    }
}

impl PipelineBuilder {
    /// Texts per forward pass at most (default `DEFAULT_BATCH_SIZE`, 32): [`Pipeline::embed`] and
    /// [`Pipeline::classify`] sort their input by length and run it in chunks of up to this many,
    /// smaller where that saves padding (so short texts are not padded to the longest one and
    /// memory stays bounded), and return the results in the input's order. 0 counts as 1.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n.max(1);
        self
    }

    /// Keep the linear layers' weights quantized in memory: `Int8 { block_size }` or
    /// `Int4 { block_size }` blocks (embeddings and norms stay float; a layer whose in-features
    /// are not a multiple of the block size stays float). Default: float.
    /// [`Pipeline::weights`] reports the memory.
    pub fn quantize(mut self, q: WeightQuantization) -> Self {
        self.quantization = q;
        self
    }

    /// Calibrate the int4 weights on `texts` (GPTQ, see `ipfs_accelerate::gptq`): the model is
    /// loaded float, runs each text, and every linear layer that ran is quantized to minimise
    /// the change of its outputs on those inputs, in the same int4 format and memory as
    /// [`quantize`](Self::quantize) alone, which rounds each weight to nearest. Needs
    /// `quantize(Int4 { .. })`; blank texts are skipped, at least one must remain. Loading takes
    /// longer by one float load, the calibration pass and the solver
    /// ([`Pipeline::calibration`]).
    pub fn calibrate<S: Into<String>>(mut self, texts: impl IntoIterator<Item = S>) -> Self {
        self.calibration = Some(texts.into_iter().map(Into::into).collect());
        self
    }

    /// [`calibrate`](Self::calibrate) on the built-in English corpus
    /// ([`DEFAULT_CALIBRATION_TEXT`]).
    pub fn calibrate_default(self) -> Self {
        self.calibrate(calibration_lines(DEFAULT_CALIBRATION_TEXT))
    }

    /// The GPTQ solver's settings for [`calibrate`](Self::calibrate) (default:
    /// `GptqOptions::default()`).
    pub fn gptq_options(mut self, options: GptqOptions) -> Self {
        self.gptq = options;
        self
    }

    /// Compute in `precision` (default f32). f16 / bf16 run where the device computes in them
    /// (a backend that does not is skipped with the reason); a device's precision is fixed by
    /// its first model in a process (see `ipfs_accelerate::Precision`).
    pub fn precision(mut self, precision: Precision) -> Self {
        self.precision = precision;
        self
    }

    /// Share weight tensors with the other pipelines of this process that load the same weight
    /// files (each tensor is held once; see `docs/memory.md`). Default: off.
    pub fn share_weights(mut self, share: bool) -> Self {
        self.share_weights = share;
        self
    }

    /// The task to run (default: [`Task::Auto`]).
    pub fn task(mut self, task: Task) -> Self {
        self.task = task;
        self
    }

    /// Backend preference, first usable wins. `IPFS_ACCELERATE_BACKENDS` overrides it when set.
    pub fn backends(mut self, backends: impl IntoIterator<Item = BackendKind>) -> Self {
        self.backends = Some(backends.into_iter().collect());
        self
    }

    /// Whether `IPFS_ACCELERATE_BACKENDS` may override [`backends`](Self::backends) (default: yes,
    /// so deployments can steer a program without rebuilding it). Command lines that take an
    /// explicit `--backend` turn it off.
    pub fn env_override(mut self, allow: bool) -> Self {
        self.env_override = allow;
        self
    }

    /// Never download (also `HF_HUB_OFFLINE=1`).
    pub fn offline(mut self, offline: bool) -> Self {
        self.resolve.offline = offline;
        self
    }

    /// Show download progress bars (default on).
    pub fn progress(mut self, progress: bool) -> Self {
        self.resolve.progress = progress;
        self
    }

    /// Truncate inputs to this many tokens (default: sentence-transformers' `max_seq_length`, else
    /// the model's positions).
    pub fn max_length(mut self, tokens: usize) -> Self {
        self.max_length = Some(tokens);
        self
    }

    /// Resolves the model, selects a backend and loads the weights. A backend that fails to load
    /// the model is recorded in [`Pipeline::skipped`] and the next one is tried.
    pub fn build(self) -> Result<Pipeline> {
        let mut clock = Stopwatch::start();
        let preferences = resolve_preferences(self.backends.clone(), self.env_override)?;
        let assets = Assets::resolve(&self.model, self.resolve.clone())?;
        let (config_text, config_path) = assets.config()?;
        let model_type = serde_json::from_str::<serde_json::Value>(&config_text)
            .map_err(|e| ipfs_accelerate_core::Error::config(&config_path, e.to_string()))?
            .get("model_type")
            .and_then(|v| v.as_str())
            .unwrap_or_default()
            .to_string();
        if !ipfs_accelerate_bert::BERT_LIKE_MODEL_TYPES.contains(&model_type.as_str()) {
            return Err(Error::Unsupported(format!(
                "model_type `{model_type}` of {}: the pipeline runs the BERT-architecture \
                 encoders ({})",
                assets.name(),
                ipfs_accelerate_bert::BERT_LIKE_MODEL_TYPES.join(", ")
            )));
        }
        let config = BertConfig::from_json(&config_text, &config_path)?;
        let task = resolve_task(self.task, config.head())?;
        let weights = assets.weights()?;
        let st_max = assets
            .optional_text("sentence_bert_config.json")?
            .and_then(|(t, _)| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|v| v.get("max_seq_length").and_then(|m| m.as_u64()))
            .map(|m| m as usize);
        let max_len = self
            .max_length
            .or(st_max)
            .unwrap_or(config.max_sequence_length())
            .min(config.max_sequence_length());
        let tokenizer = assets.tokenizer(max_len)?.ok_or_else(|| {
            Error::Unsupported(format!("{} has no tokenizer.json", assets.name()))
        })?;
        let pooling = match assets.optional_text("1_Pooling/config.json")? {
            Some((text, path)) => Pooling::from_config_json(&text, &path)?,
            None => Pooling::Mean,
        };

        self.quantization.validate()?;
        let work = LoadBert {
            weights: weights.clone(),
            config: &config,
        };
        // ONNX Runtime / browser preferences run the checkpoint's ONNX export; the native ones
        // load the weights. Tried in the order given, each failure recorded.
        let (((model, hal), loaded, calibration), selection) = crate::backends::load_in_order(
            &preferences,
            |kinds| {
                #[cfg(feature = "cuda")]
                if kinds.first() == Some(&BackendKind::Cuda) {
                    match self.load_cublas(&assets, &config) {
                        Ok(found) => return Ok(found),
                        Err(reason) => tracing::info!(
                            "{}: the cuBLAS encoder does not run it ({reason}); burn's CubeCL \
                             kernels do",
                            assets.name()
                        ),
                    }
                }
                self.load_native(kinds, &work, &tokenizer, task, pooling)
            },
            |kind| self.load_graph(kind, &assets, &config),
        )?;
        Ok(Pipeline {
            model,
            hal,
            weights: loaded,
            calibration,
            tokenizer,
            pooling,
            task,
            model_name: assets.name(),
            selection,
            init: clock.lap(),
            first_call: std::sync::atomic::AtomicBool::new(true),
            batch_size: self.batch_size,
        })
    }

    /// Loads the weights on the first usable of the native backends `preferences`.
    fn load_native(
        &self,
        preferences: &[BackendKind],
        work: &LoadBert<'_>,
        tokenizer: &TextTokenizer,
        task: Task,
        pooling: Pooling,
    ) -> Result<(Loaded, Selection)> {
        Ok(match &self.calibration {
            None => {
                let (((model, hal), loaded), selection) =
                    load_on_first_usable(preferences, self.precision, || Scoped {
                        work: work.clone(),
                        quantization: self.quantization,
                        share: self.share_weights,
                    })?;
                (((model, hal), loaded, None), selection)
            }
            Some(texts) => {
                let encoded = calibration_inputs(tokenizer, texts, self.quantization)?;
                self.gptq.validate()?;
                // The head the pipeline runs: the encoder and pooling for embeddings, the whole
                // head otherwise, so every layer a task uses is calibrated.
                let run = |(model, _): &(Box<dyn BertTasks>, Box<dyn ProbeBackend>)| -> Result<()> {
                    for enc in &encoded {
                        if task == Task::Embed {
                            model.embed(&to_inputs(enc), pooling, false)?;
                        } else {
                            model.logits(&to_inputs(enc))?;
                        }
                    }
                    Ok(())
                };
                let ((model, loaded, duration, layers), selection) =
                    load_on_first_usable(preferences, self.precision, || Calibrated {
                        scoped: Scoped {
                            work: work.clone(),
                            quantization: self.quantization,
                            share: self.share_weights,
                        },
                        options: self.gptq,
                        run: &run,
                    })?;
                let report = CalibrationReport {
                    texts: encoded.len(),
                    layers,
                    duration,
                };
                ((model, loaded, Some(report)), selection)
            }
        })
    }

    /// The model on `cuda` through the cuBLAS encoder (f32 or f16 GEMMs on cuBLAS, fused NVRTC
    /// kernels; the task heads on the device too), with the same tokenizer, pooling and head
    /// post-processing; why not, when it cannot take the model (quantized weights, bf16,
    /// calibration, a missing library, no GPU).
    #[cfg(feature = "cuda")]
    fn load_cublas(
        &self,
        assets: &Assets,
        config: &BertConfig,
    ) -> std::result::Result<(Loaded, Selection), String> {
        if !crate::cublas_encoder() {
            return Err(format!("{} is off", crate::CUBLAS_ENV));
        }
        if self.calibration.is_some() || self.quantization != WeightQuantization::None {
            return Err("it keeps float weights (no quantization)".into());
        }
        let selection = crate::backends::usable_selection(BackendKind::Cuda)?;
        let weights = assets.weights().map_err(|e| e.to_string())?;
        let runner = crate::backends::cublas_bert_from(config, weights, self.precision)?;
        let hal = crate::compiled_backends()
            .into_iter()
            .find(|b| b.kind() == BackendKind::Cuda)
            .ok_or_else(|| "cuda is not compiled in".to_string())?;
        let model: Box<dyn BertTasks> = Box::new(graph::GraphBert {
            runner,
            config: config.clone(),
        });
        Ok((((model, hal), LoadedWeights::default(), None), selection))
    }

    /// Loads the checkpoint's ONNX export on the graph backend `kind` (ONNX Runtime with its
    /// provider, or a browser); why not, when it cannot.
    #[allow(unused_variables)]
    fn load_graph(
        &self,
        kind: BackendKind,
        assets: &Assets,
        config: &BertConfig,
    ) -> std::result::Result<(Loaded, Selection), String> {
        if self.calibration.is_some() {
            return Err(format!(
                "{kind} runs the checkpoint's f32 ONNX export: calibration applies to the native \
                 backends"
            ));
        }
        let selection = crate::backends::graph_selection(kind, self.quantization, self.precision)?;
        let dir = assets.dir().ok_or_else(|| {
            format!(
                "{} has no ONNX export (the embedded model is weights only)",
                assets.name()
            )
        })?;
        let hal = crate::compiled_backends()
            .into_iter()
            .find(|b| b.kind() == kind)
            .ok_or_else(|| format!("{kind} is not compiled in"))?;
        #[cfg(feature = "onnx")]
        {
            let model: Box<dyn BertTasks> = Box::new(graph::GraphBert {
                runner: Box::new(
                    crate::onnx::graph_runner("bert", kind, &dir).map_err(|e| e.to_string())?,
                ),
                config: config.clone(),
            });
            Ok((((model, hal), LoadedWeights::default(), None), selection))
        }
        #[cfg(not(feature = "onnx"))]
        Err(format!("{kind}: not compiled in (enable feature `onnx`)"))
    }
}

/// A loaded model with its backend, weight record and calibration report.
type Loaded = (
    (Box<dyn BertTasks>, Box<dyn ProbeBackend>),
    LoadedWeights,
    Option<CalibrationReport>,
);

/// BERT on a runner outside burn: the checkpoint's ONNX export on a graph backend (ONNX Runtime,
/// a browser), or the cuBLAS encoder on `cuda`.
#[cfg(any(feature = "onnx", feature = "cuda"))]
mod graph {
    use ipfs_accelerate_bert::{
        tasks::Pooling, BertConfig, BertHead, BertInputs, BertTasks, HostLogits,
    };
    use ipfs_accelerate_core::{HostTensor, ModelRunner, TensorMap};

    /// BERT through a runner with HF's input and output names (`last_hidden_state`, `logits`,
    /// `start_logits`): an ONNX graph (ONNX Runtime or a browser) or an engine (cuBLAS). The same
    /// tokenizer, pooling ([`Pooling::pool_host`]) and head post-processing as the burn path.
    pub(super) struct GraphBert {
        pub(super) runner: Box<dyn ModelRunner>,
        pub(super) config: BertConfig,
    }

    impl GraphBert {
        /// Runs the export on `inputs`.
        fn outputs(&self, inputs: &BertInputs) -> ipfs_accelerate_core::Result<TensorMap> {
            let shape = vec![inputs.batch, inputs.seq];
            let mut map = TensorMap::new();
            for (name, values) in [
                ("input_ids", &inputs.input_ids),
                ("attention_mask", &inputs.attention_mask),
                ("token_type_ids", &inputs.token_type_ids),
            ] {
                map.insert(name.into(), HostTensor::from_i64(shape.clone(), values)?);
            }
            self.runner.run(&map)
        }
    }

    crate::loaded::graph_model_runner!(GraphBert, "bert");

    impl BertTasks for GraphBert {
        fn config(&self) -> &BertConfig {
            &self.config
        }

        fn head(&self) -> BertHead {
            self.config.head()
        }

        fn embed(
            &self,
            inputs: &BertInputs,
            pooling: Pooling,
            normalize: bool,
        ) -> ipfs_accelerate_core::Result<Vec<Vec<f32>>> {
            let hidden = crate::loaded::output_f32(&self.outputs(inputs)?, "last_hidden_state")?;
            Ok(pooling.pool_host(
                &hidden,
                &inputs.attention_mask,
                inputs.batch,
                inputs.seq,
                normalize,
            ))
        }

        fn logits(&self, inputs: &BertInputs) -> ipfs_accelerate_core::Result<HostLogits> {
            let out = self.outputs(inputs)?;
            let labels = self.config.num_labels();
            Ok(match self.config.head() {
                BertHead::SequenceClassification => HostLogits::Sequence {
                    labels,
                    data: crate::loaded::output_f32(&out, "logits")?,
                },
                BertHead::TokenClassification => HostLogits::Token {
                    labels,
                    data: crate::loaded::output_f32(&out, "logits")?,
                },
                BertHead::QuestionAnswering => HostLogits::Span {
                    start: crate::loaded::output_f32(&out, "start_logits")?,
                    end: crate::loaded::output_f32(&out, "end_logits")?,
                },
                BertHead::Base => {
                    return Err(ipfs_accelerate_core::Error::InvalidInput(
                        "this checkpoint is a bare BertModel: it has no task head (use embeddings)"
                            .into(),
                    ))
                }
            })
        }
    }
}

fn resolve_task(task: Task, head: BertHead) -> Result<Task> {
    let needed = match task {
        Task::Auto => {
            return Ok(match head {
                BertHead::Base => Task::Embed,
                BertHead::SequenceClassification => Task::Classify,
                BertHead::TokenClassification => Task::TokenClassify,
                BertHead::QuestionAnswering => Task::QuestionAnswering,
            })
        }
        Task::Embed => return Ok(Task::Embed),
        Task::Classify => BertHead::SequenceClassification,
        Task::TokenClassify => BertHead::TokenClassification,
        Task::QuestionAnswering => BertHead::QuestionAnswering,
    };
    if needed == head {
        Ok(task)
    } else {
        Err(Error::Unsupported(format!(
            "task {task:?} needs a checkpoint with the {needed:?} head; this one has {head:?}"
        )))
    }
}

/// The calibration texts tokenized one by one (no padding in the recorded inputs); an error when
/// none is left or the quantization is not int4.
fn calibration_inputs(
    tokenizer: &TextTokenizer,
    texts: &[String],
    q: WeightQuantization,
) -> Result<Vec<Encoded>> {
    ipfs_accelerate_nn::gptq::calibration_block_size(q)?;
    let encoded = texts
        .iter()
        .filter(|t| !t.trim().is_empty())
        .map(|t| tokenizer.encode_batch(&[t.as_str()]))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    if encoded.is_empty() {
        return Err(ipfs_accelerate_core::Error::InvalidInput(
            "calibration needs at least one non-empty text".into(),
        )
        .into());
    }
    Ok(encoded)
}

#[derive(Clone)]
struct LoadBert<'a> {
    weights: std::sync::Arc<dyn ipfs_accelerate_core::TensorSource>,
    config: &'a BertConfig,
}

impl WithBackend for LoadBert<'_> {
    type Output = (Box<dyn BertTasks>, Box<dyn ProbeBackend>);

    fn run<H: ipfs_accelerate_core::Backend>(self, hal: &H) -> Result<Self::Output> {
        let runner =
            BertRunner::<H::Burn>::load(self.weights, self.config, &hal.device(), hal.kind())?;
        Ok((Box::new(runner), Box::new(hal.clone())))
    }
}

/// A loaded model on a selected backend.
pub struct Pipeline {
    model: Box<dyn BertTasks>,
    hal: Box<dyn ProbeBackend>,
    weights: LoadedWeights,
    calibration: Option<CalibrationReport>,
    tokenizer: TextTokenizer,
    pooling: Pooling,
    task: Task,
    model_name: String,
    selection: Selection,
    init: Duration,
    first_call: std::sync::atomic::AtomicBool,
    batch_size: usize,
}

/// Items, tokens (with padding) and truncated inputs of a call.
#[derive(Default)]
struct Counts {
    items: usize,
    tokens: usize,
    truncated: usize,
}

/// An extracted answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Answer {
    /// The answer text, cut from the context.
    pub text: String,
    /// Byte offset of the answer in the context.
    pub start: usize,
    /// Byte offset one past the answer's end.
    pub end: usize,
    /// p(start) · p(end).
    pub score: f32,
}

/// A token and its predicted label.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct TokenLabel {
    /// The text of the token (from its offsets).
    pub token: String,
    /// Byte offsets in the input.
    pub start: usize,
    /// Byte offset one past the end.
    pub end: usize,
    /// Best label.
    pub label: String,
    /// Its probability.
    pub score: f32,
}

impl Pipeline {
    /// Starts configuring a pipeline for `model`: a local directory, a hub id (`org/name`,
    /// `org/name@revision`), or [`EMBEDDED_SPEC`](crate::EMBEDDED_SPEC) for the built-in default.
    pub fn builder(model: impl Into<String>) -> PipelineBuilder {
        PipelineBuilder {
            model: model.into(),
            task: Task::Auto,
            backends: None,
            env_override: true,
            resolve: ResolveOptions::default(),
            max_length: None,
            quantization: WeightQuantization::None,
            share_weights: false,
            calibration: None,
            gptq: GptqOptions::default(),
            precision: Precision::F32,
            batch_size: DEFAULT_BATCH_SIZE,
        }
    }

    /// Loads `model` for `task` with the options every task type takes (the builder's
    /// equivalent: backends, offline, revision, quantization, precision, weight sharing, max
    /// length, batch size).
    ///
    /// ```no_run
    /// use ipfs_accelerate::{LoadOptions, Pipeline, Task};
    ///
    /// # fn main() -> ipfs_accelerate::Result<()> {
    /// let pipe = Pipeline::load("sentence-transformers/all-MiniLM-L6-v2", Task::Embed, &LoadOptions::default())?;
    /// let out = pipe.embed(&["Hello, world!"], true)?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn load(model: &str, task: Task, options: &LoadOptions) -> Result<Pipeline> {
        let mut builder = Pipeline::builder(options.spec_with_revision(model))
            .task(task)
            .offline(options.offline)
            .quantize(options.quantization)
            .precision(options.precision)
            .share_weights(options.share_weights);
        if let Some(backends) = &options.backends {
            builder = builder.backends(backends.iter().copied());
        }
        if let Some(n) = options.max_length {
            builder = builder.max_length(n);
        }
        if let Some(n) = options.batch_size {
            builder = builder.batch_size(n);
        }
        builder.build()
    }

    /// What calibrating the int4 weights took, when the builder asked for it
    /// ([`PipelineBuilder::calibrate`]).
    pub fn calibration(&self) -> Option<&CalibrationReport> {
        self.calibration.as_ref()
    }

    /// What the model's weights take in memory, as kept (quantized or float, shared or not).
    pub fn weights(&self) -> WeightStats {
        self.weights.stats()
    }

    /// The backend it runs on.
    pub fn backend(&self) -> BackendKind {
        self.selection.device.kind
    }

    /// The selected device and the preferences that were skipped, with reasons.
    pub fn selection(&self) -> &Selection {
        &self.selection
    }

    /// Preferences that were skipped, with reasons.
    pub fn skipped(&self) -> &[SkippedBackend] {
        &self.selection.skipped
    }

    /// The task it runs.
    pub fn task(&self) -> Task {
        self.task
    }

    /// The model's name.
    pub fn model_name(&self) -> &str {
        &self.model_name
    }

    /// The model configuration.
    pub fn config(&self) -> &BertConfig {
        self.model.config()
    }

    /// The sentence pooling used by [`Pipeline::embed`].
    pub fn pooling(&self) -> Pooling {
        self.pooling
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &TextTokenizer {
        &self.tokenizer
    }

    /// The uniform named-tensor interface of the loaded model.
    pub fn runner(&self) -> &dyn ipfs_accelerate_core::ModelRunner {
        self.model.as_ref()
    }

    fn metrics(
        &self,
        clock: &Stopwatch,
        enc: &Encoded,
        pre: Duration,
        inf: Duration,
        post: Duration,
    ) -> Metrics {
        let counts = Counts {
            items: enc.batch,
            tokens: enc.batch * enc.seq,
            truncated: enc.truncated_count(),
        };
        self.metrics_of(clock, counts, pre, inf, post)
    }

    /// [`metrics`](Self::metrics) of a call that ran several chunks.
    fn metrics_of(
        &self,
        clock: &Stopwatch,
        counts: Counts,
        pre: Duration,
        inf: Duration,
        post: Duration,
    ) -> Metrics {
        let first = self
            .first_call
            .swap(false, std::sync::atomic::Ordering::Relaxed);
        Metrics {
            backend: self.backend().to_string(),
            init: if first { self.init } else { Duration::ZERO },
            preprocess: pre,
            inference: inf,
            postprocess: post,
            total: clock.total(),
            items: counts.items,
            tokens: counts.tokens,
            truncated: counts.truncated,
            memory_bytes: self.hal.memory_in_use(),
        }
    }

    /// Sentence embeddings, one vector per text (pooling from the model's sentence-transformers
    /// config, mean by default), L2-normalised when `normalize`.
    pub fn embed(&self, texts: &[&str], normalize: bool) -> Result<Output<Vec<Vec<f32>>>> {
        let _span = tracing::info_span!("pipeline.run", task = "embed").entered();
        self.chunked(texts, |enc| {
            self.model.embed(&to_inputs(enc), self.pooling, normalize)
        })
    }

    /// Runs `texts` through `forward` in chunks of at most the batch size and returns one result
    /// per text in the input's order, with the chunks' times and counts summed. The texts are
    /// tokenised in windows of [`TOKENIZE_WINDOW`] (longest characters first), sorted by tokens,
    /// and split where the padding a chunk would carry costs more than one more forward pass
    /// ([`plan_chunks`] with [`FORWARD_OVERHEAD_TOKENS`]): mixed lengths run in several
    /// tightly padded forwards instead of one padded to the longest ([`SPLIT_BATCHES_ENV`]).
    fn chunked<T: Send>(
        &self,
        texts: &[&str],
        mut forward: impl FnMut(&Encoded) -> ipfs_accelerate_core::Result<Vec<T>> + Send,
    ) -> Result<Output<Vec<T>>> {
        let mut clock = Stopwatch::start();
        if texts.is_empty() {
            // The tokenizer's error for an empty batch.
            self.tokenizer.encode_batch(texts)?;
        }
        let mut order: Vec<usize> = (0..texts.len()).collect();
        if texts.len() > TOKENIZE_WINDOW {
            order.sort_by_key(|&i| std::cmp::Reverse(texts[i].len()));
        }
        let (mut pre, mut inf) = (Duration::ZERO, Duration::ZERO);
        let mut counts = Counts::default();
        let mut results: Vec<Option<T>> = (0..texts.len()).map(|_| None).collect();
        for window in order.chunks(TOKENIZE_WINDOW) {
            let batch: Vec<&str> = window.iter().map(|&i| texts[i]).collect();
            let all = self.tokenizer.encode_batch(&batch)?;
            let lengths = all.lengths();
            // Rows of `all` (positions in `window`), most tokens first.
            let mut rows: Vec<usize> = (0..window.len()).collect();
            rows.sort_by_key(|&r| std::cmp::Reverse(lengths[r]));
            let sorted: Vec<usize> = rows.iter().map(|&r| lengths[r]).collect();
            pre += clock.lap();
            for range in plan_chunks(&sorted, self.batch_size, forward_overhead_tokens()) {
                let chunk = &rows[range];
                let enc = all.select(chunk);
                pre += clock.lap();
                let out = crate::loaded::on_cpu_pool(self.backend(), || forward(&enc))?;
                inf += clock.lap();
                counts.items += enc.batch;
                counts.tokens += enc.batch * enc.seq;
                counts.truncated += enc.truncated_count();
                if out.len() != chunk.len() {
                    return Err(Error::Core(ipfs_accelerate_core::Error::Compute(format!(
                        "{} results for a chunk of {} texts",
                        out.len(),
                        chunk.len()
                    ))));
                }
                for (&r, value) in chunk.iter().zip(out) {
                    results[window[r]] = Some(value);
                }
            }
        }
        let value = results.into_iter().flatten().collect();
        let metrics = self.metrics_of(&clock, counts, pre, inf, Duration::ZERO);
        Ok(Output { value, metrics })
    }

    /// Tokenises with `encode`, runs the head, and times both (the device synchronised before the
    /// inference clock is read).
    fn timed_logits(
        &self,
        clock: &mut Stopwatch,
        encode: impl FnOnce(&TextTokenizer) -> std::result::Result<Encoded, PreprocessError>,
    ) -> Result<(Encoded, HostLogits, Duration, Duration)> {
        let enc = encode(&self.tokenizer)?;
        let pre = clock.lap();
        let logits =
            crate::loaded::on_cpu_pool(self.backend(), || self.model.logits(&to_inputs(&enc)))?;
        self.hal.synchronize()?;
        let inf = clock.lap();
        Ok((enc, logits, pre, inf))
    }

    /// Sequence classification: for each text, every label with its probability, best first.
    pub fn classify(&self, texts: &[&str]) -> Result<Output<Vec<Vec<Label>>>> {
        let _span = tracing::info_span!("pipeline.run", task = "classify").entered();
        self.chunked(texts, |enc| {
            let logits = self.model.logits(&to_inputs(enc))?;
            self.hal.synchronize()?;
            let HostLogits::Sequence { labels, data } = logits else {
                return Err(ipfs_accelerate_core::Error::InvalidInput(
                    "this checkpoint is not a sequence classifier".into(),
                ));
            };
            Ok(data
                .chunks(labels.max(1))
                .map(|row| self.ranked(row))
                .collect())
        })
    }

    /// Token classification: for each text, the best label of every (non-special) token.
    pub fn classify_tokens(&self, texts: &[&str]) -> Result<Output<Vec<Vec<TokenLabel>>>> {
        let _span = tracing::info_span!("pipeline.run", task = "token-classify").entered();
        let mut clock = Stopwatch::start();
        let (enc, logits, pre, inf) = self.timed_logits(&mut clock, |t| t.encode_batch(texts))?;
        let HostLogits::Token { labels, data } = logits else {
            return Err(Error::Unsupported(
                "this checkpoint is not a token classifier".into(),
            ));
        };
        let mut value = Vec::with_capacity(enc.batch);
        for (row, text) in texts.iter().enumerate() {
            let mut tokens = Vec::new();
            for t in 0..enc.seq {
                if enc.sequence_ids[row].get(t).copied().flatten().is_none() {
                    continue;
                }
                let at = (row * enc.seq + t) * labels;
                let best = self.ranked(&data[at..at + labels]).remove(0);
                let (s, e) = enc.offsets[row][t];
                tokens.push(TokenLabel {
                    token: text.get(s..e).unwrap_or_default().to_string(),
                    start: s,
                    end: e,
                    label: best.label,
                    score: best.score,
                });
            }
            value.push(tokens);
        }
        let post = clock.lap();
        let metrics = self.metrics(&clock, &enc, pre, inf, post);
        Ok(Output { value, metrics })
    }

    /// Extractive question answering: the best span of `context` answering `question`.
    pub fn answer(&self, question: &str, context: &str) -> Result<Output<Answer>> {
        let _span = tracing::info_span!("pipeline.run", task = "qa").entered();
        let mut clock = Stopwatch::start();
        let (enc, logits, pre, inf) =
            self.timed_logits(&mut clock, |t| t.encode_pairs(&[(question, context)]))?;
        let HostLogits::Span { start, end } = logits else {
            return Err(Error::Unsupported(
                "this checkpoint is not a question-answering model".into(),
            ));
        };
        let allowed: Vec<bool> = enc.sequence_ids[0].iter().map(|s| *s == Some(1)).collect();
        let Span {
            start: s,
            end: e,
            score,
        } = best_span(&start, &end, &allowed, 30).ok_or_else(|| {
            ipfs_accelerate_core::Error::InvalidInput(
                "the context has no tokens left after truncation".into(),
            )
        })?;
        let (cs, _) = enc.offsets[0][s];
        let (_, ce) = enc.offsets[0][e];
        let value = Answer {
            text: context.get(cs..ce).unwrap_or_default().to_string(),
            start: cs,
            end: ce,
            score,
        };
        let post = clock.lap();
        let metrics = self.metrics(&clock, &enc, pre, inf, post);
        Ok(Output { value, metrics })
    }

    fn ranked(&self, logits: &[f32]) -> Vec<Label> {
        let config = self.model.config();
        let mut labels: Vec<Label> = softmax(logits)
            .into_iter()
            .enumerate()
            .map(|(i, score)| Label {
                label: config.label(i),
                score,
                index: Some(i),
            })
            .collect();
        labels.sort_by(|a, b| b.score.total_cmp(&a.score));
        labels
    }
}

fn to_inputs(enc: &Encoded) -> BertInputs {
    BertInputs {
        batch: enc.batch,
        seq: enc.seq,
        input_ids: enc.input_ids.clone(),
        attention_mask: enc.attention_mask.clone(),
        token_type_ids: enc.token_type_ids.clone(),
    }
}
