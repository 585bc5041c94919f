//! What every task loader shares: resolving a model to a local folder, loading its runner on the
//! first usable backend, and timing the calls.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ipfs_accelerate_core::{BackendKind, Metrics, Precision, Selection, Stopwatch};
use ipfs_accelerate_io::ResolveOptions;
use ipfs_accelerate_nn::gptq::{calibrate, GptqOptions};
use ipfs_accelerate_nn::weights::{load_scope, LoadSettings, LoadedWeights, WeightStats};
use ipfs_accelerate_nn::WeightQuantization;

use crate::backends::{load_on_first_usable, resolve_preferences, WithBackend};
use crate::Result;

/// Where a model comes from and which backends may run it.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Backend preference list (`None`: the default preferences, `IPFS_ACCELERATE_BACKENDS`
    /// honoured).
    pub backends: Option<Vec<BackendKind>>,
    /// Never download; use local files and the HF cache only.
    pub offline: bool,
    /// Keep the linear layers' weights quantized (int8 / int4 blocks; embeddings, norms and
    /// convolutions stay float). Default: float.
    pub quantization: WeightQuantization,
    /// Share weight tensors with other models loaded from the same files in this process
    /// (default off; see `docs/memory.md`).
    pub share_weights: bool,
    /// The float type to compute in (default f32; f16 / bf16 where the device computes in them,
    /// fixed per device and process: see [`Precision`]).
    pub precision: Precision,
    /// The hub revision (branch, tag or commit) of a hub id that names none (`org/name@rev`
    /// names it in the id); default `main`.
    pub revision: Option<String>,
    /// The longest text input in tokens, for the text tasks ([`crate::Pipeline`]): longer
    /// texts are truncated (default: the checkpoint's limit).
    pub max_length: Option<usize>,
    /// Inputs per forward pass where a call takes many ([`crate::Pipeline`]'s texts; default
    /// 32).
    pub batch_size: Option<usize>,
}

impl LoadOptions {
    /// `spec` with [`revision`](Self::revision) appended when it is a hub id without one.
    pub(crate) fn spec_with_revision(&self, spec: &str) -> String {
        match &self.revision {
            Some(rev)
                if spec != crate::EMBEDDED_SPEC
                    && !spec.contains('@')
                    && !Path::new(spec).exists() =>
            {
                format!("{spec}@{rev}")
            }
            _ => spec.to_string(),
        }
    }

    /// Resolves `spec` at these options' revision, offline or not, with the `optional` files it
    /// has (see [`model_dir`]); returns the folder.
    pub(crate) fn model_dir(&self, spec: &str, optional: &[&str]) -> Result<PathBuf> {
        model_dir(&self.spec_with_revision(spec), self.offline, optional)
    }
}

/// Loads with `work` inside a weight load scope ([`load_scope`]) set up for the backend it runs
/// on, so every family's `VarBuilder` quantizes and shares as `quantization` and `share` ask.
pub(crate) struct Scoped<W> {
    /// The family's loader.
    pub(crate) work: W,
    /// How to keep the linear weights.
    pub(crate) quantization: WeightQuantization,
    /// Whether to share weights with other loads.
    pub(crate) share: bool,
}

impl<W> Scoped<W> {
    /// The load scope's settings on the backend `kind`.
    fn settings(&self, kind: BackendKind) -> LoadSettings {
        LoadSettings::default()
            .quantize(self.quantization)
            .share(self.share)
            .on(kind, 0)
    }
}

impl<W: WithBackend> WithBackend for Scoped<W> {
    type Output = (W::Output, LoadedWeights);

    fn run<H: ipfs_accelerate_core::Backend>(self, hal: &H) -> Result<Self::Output> {
        let settings = self.settings(hal.kind());
        let (out, weights) = load_scope(settings, || self.work.run(hal));
        Ok((out?, weights))
    }

    fn without_device(self, kind: BackendKind) -> std::result::Result<Result<Self::Output>, Self> {
        let Scoped {
            work,
            quantization,
            share,
        } = self;
        match work.without_device(kind) {
            Ok(out) => Ok(out.map(|o| (o, LoadedWeights::default()))),
            Err(work) => Err(Scoped {
                work,
                quantization,
                share,
            }),
        }
    }
}

/// Like [`Scoped`], with the int4 weights calibrated first ([`calibrate`], GPTQ): loads the model
/// float, runs the calibration inputs through it with `run`, solves every linear layer that ran,
/// then loads it again keeping those layers as GPTQ chose (the others rounded to nearest). The
/// float copy is dropped before the final load.
pub(crate) struct Calibrated<'a, W: WithBackend> {
    /// The family's loader (cloned for each load) and how to keep its weights (int4).
    pub(crate) scoped: Scoped<W>,
    /// The solver's settings.
    pub(crate) options: GptqOptions,
    /// Runs the calibration inputs through a loaded model.
    pub(crate) run: &'a dyn Fn(&W::Output) -> Result<()>,
}

impl<W: WithBackend + Clone> WithBackend for Calibrated<'_, W> {
    /// The model, its weights, the time calibration took (float loads, calibration passes and
    /// solving; not the final load) and the number of layers calibrated.
    type Output = (W::Output, LoadedWeights, Duration, usize);

    fn run<H: ipfs_accelerate_core::Backend>(self, hal: &H) -> Result<Self::Output> {
        let settings = self.scoped.settings(hal.kind());
        let work = self.scoped.work;
        let clock = std::time::Instant::now();
        let calibrated = calibrate(&settings, &self.options, || work.clone().run(hal), self.run)?;
        let duration = clock.elapsed();
        let layers = calibrated.len();
        let settings = settings.calibrated(Some(calibrated));
        let (out, weights) = load_scope(settings, || work.run(hal));
        Ok((out?, weights, duration, layers))
    }
}

/// Resolves `spec` (a folder, a name under `$IPFS_ACCELERATE_MODELS`, or a hub id) and makes sure
/// `config.json`, the weights and the `optional` files it has are local; returns the folder.
pub(crate) fn model_dir(spec: &str, offline: bool, optional: &[&str]) -> Result<PathBuf> {
    let files = ipfs_accelerate_io::resolve(
        spec,
        ResolveOptions {
            offline,
            progress: true,
            ..Default::default()
        },
    )?;
    let config = files.get("config.json")?;
    files.weight_files()?;
    for name in optional {
        files.get_optional(name)?;
    }
    Ok(config
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from(".")))
}

/// The `model_type` of `model`'s `config.json` (`bert`, `llama`, `whisper`, ...; empty when the
/// config has none): a folder, a name under `$IPFS_ACCELERATE_MODELS`, or a hub id (fetched unless
/// `offline`). Tells an application which loader a checkpoint needs.
pub fn checkpoint_model_type(model: &str, offline: bool) -> Result<String> {
    model_type(&model_dir(model, offline, &[])?)
}

/// The `model_type` of the checkpoint in `dir` (empty when the config has none).
pub(crate) fn model_type(dir: &Path) -> Result<String> {
    let path = dir.join("config.json");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| ipfs_accelerate_core::Error::config(&path, format!("cannot read: {e}")))?;
    let value: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ipfs_accelerate_core::Error::config(&path, format!("invalid JSON: {e}")))?;
    Ok(value
        .get("model_type")
        .and_then(|v| v.as_str())
        .unwrap_or_default()
        .to_string())
}

/// A label with its probability: the one label type of every classifying task (text, image,
/// zero-shot image / video / audio).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Label {
    /// The label: the checkpoint's `id2label` name, or the candidate as given (zero-shot).
    pub label: String,
    /// Softmax probability (over the checkpoint's classes, or over the given candidates).
    pub score: f32,
    /// The class index in the checkpoint's `id2label`; `None` for zero-shot candidates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub index: Option<usize>,
}

/// Each row of probabilities (one per label, in `labels` order) as labels sorted by score, most
/// likely first.
#[allow(dead_code)] // used by the zero-shot families that are compiled in
pub(crate) fn rank_labels(labels: &[&str], probs: Vec<Vec<f32>>) -> Vec<Vec<Label>> {
    probs
        .into_iter()
        .map(|row| {
            let mut scored: Vec<Label> = labels
                .iter()
                .zip(row)
                .map(|(l, score)| Label {
                    label: l.to_string(),
                    score,
                    index: None,
                })
                .collect();
            scored.sort_by(|a, b| b.score.total_cmp(&a.score));
            scored
        })
        .collect()
}

/// Tokenises one prompt per label (`{}` in `template` replaced by the label); empty labels are an
/// error.
#[allow(dead_code)] // used by the zero-shot families that are compiled in
pub(crate) fn encode_labels(
    tokenizer: &ipfs_accelerate_preprocess::TextTokenizer,
    labels: &[&str],
    template: &str,
) -> Result<ipfs_accelerate_core::TokenBatch> {
    if labels.is_empty() || labels.iter().any(|l| l.trim().is_empty()) {
        return Err(crate::Error::Core(
            ipfs_accelerate_core::Error::InvalidInput(
                "zero-shot classification needs non-empty labels".into(),
            ),
        ));
    }
    let prompts: Vec<String> = labels.iter().map(|l| template.replace("{}", l)).collect();
    let refs: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let enc = tokenizer.encode_batch(&refs)?;
    Ok(ipfs_accelerate_core::TokenBatch {
        batch: enc.batch,
        seq: enc.seq,
        input_ids: enc.input_ids,
        attention_mask: enc.attention_mask,
    })
}

/// CLIP-style text inputs (X-CLIP uses CLIP's text tower) of a token batch.
#[cfg(feature = "clip")]
pub(crate) fn clip_text(
    b: ipfs_accelerate_core::TokenBatch,
) -> ipfs_accelerate_clip::ClipTextInputs {
    ipfs_accelerate_clip::ClipTextInputs {
        batch: b.batch,
        seq: b.seq,
        input_ids: b.input_ids,
        attention_mask: b.attention_mask,
    }
}

/// A model of type `T` (a family's task trait object) loaded on one backend.
pub(crate) struct Loaded<T: ?Sized> {
    pub(crate) model: Box<T>,
    pub(crate) selection: Selection,
    pub(crate) init: Duration,
    pub(crate) dir: PathBuf,
    pub(crate) weights: LoadedWeights,
}

/// Builds a task's model from the checkpoint's ONNX export in a folder on a graph backend.
pub(crate) type GraphLoader<T> = dyn Fn(BackendKind, &std::path::Path) -> Result<Box<T>>;

/// Loads a checkpoint folder on an engine that is not burn (the cuBLAS encoder on `cuda`), or
/// says why it cannot; the native backends then load it and the reason is logged.
#[allow(dead_code)] // unused in builds without an engine
pub(crate) type EngineLoader<T> =
    dyn Fn(BackendKind, &std::path::Path, &LoadOptions) -> std::result::Result<Box<T>, String>;

/// `Some(&$loader)` as a [`GraphLoader`] in builds with ONNX Runtime (feature `onnx`), `None`
/// without: the task type then runs on the native backends only.
#[allow(unused_macros)] // unused in builds without a task type with a graph path
macro_rules! graph {
    ($loader:ident) => {{
        #[cfg(feature = "onnx")]
        let graph: Option<&crate::loaded::GraphLoader<_>> = Some(&$loader);
        #[cfg(not(feature = "onnx"))]
        let graph = None;
        graph
    }};
}
#[allow(unused_imports)]
pub(crate) use graph;

impl<T: ?Sized> Loaded<T> {
    /// Resolves `spec` and loads it with `work` (made fresh per backend attempt).
    pub(crate) fn load<W: WithBackend<Output = Box<T>>>(
        spec: &str,
        options: &LoadOptions,
        optional_files: &[&str],
        work: impl FnMut(PathBuf) -> W,
    ) -> Result<Self> {
        Self::load_with_graph(spec, options, optional_files, work, None)
    }

    /// [`load`](Self::load) for a task type that also runs the checkpoint's ONNX export on the
    /// graph backends (ONNX Runtime, browsers): `graph` builds the model from the export.
    #[allow(dead_code)] // used by the task types with a graph path
    pub(crate) fn load_with_graph<W: WithBackend<Output = Box<T>>>(
        spec: &str,
        options: &LoadOptions,
        optional_files: &[&str],
        work: impl FnMut(PathBuf) -> W,
        graph: Option<&GraphLoader<T>>,
    ) -> Result<Self> {
        Self::load_with_engines(spec, options, optional_files, work, graph, None)
    }

    /// [`Self::load_with_graph`], trying `engine` first for each native backend it may take (the
    /// cuBLAS encoder on `cuda`).
    pub(crate) fn load_with_engines<W: WithBackend<Output = Box<T>>>(
        spec: &str,
        options: &LoadOptions,
        optional_files: &[&str],
        work: impl FnMut(PathBuf) -> W,
        graph: Option<&GraphLoader<T>>,
        engine: Option<&EngineLoader<T>>,
    ) -> Result<Self> {
        let clock = Stopwatch::start();
        let dir = options.model_dir(spec, optional_files)?;
        Self::from_dir(dir, options, clock, work, graph, engine)
    }

    /// Loads a model already resolved to `dir` with `work` (made fresh per backend attempt);
    /// `clock` started when loading began (the init time includes resolving).
    pub(crate) fn from_dir<W: WithBackend<Output = Box<T>>>(
        dir: PathBuf,
        options: &LoadOptions,
        mut clock: Stopwatch,
        mut work: impl FnMut(PathBuf) -> W,
        graph: Option<&GraphLoader<T>>,
        engine: Option<&EngineLoader<T>>,
    ) -> Result<Self> {
        let preferences = resolve_preferences(options.backends.clone(), true)?;
        let ((model, weights), selection) = crate::backends::load_in_order(
            &preferences,
            |kinds| {
                if let (Some(engine), Some(&kind)) = (engine, kinds.first()) {
                    match engine(kind, &dir, options).and_then(|model| {
                        Ok(((model, LoadedWeights::default()), {
                            crate::backends::usable_selection(kind)?
                        }))
                    }) {
                        Ok(found) => return Ok(found),
                        Err(reason) => tracing::info!(
                            "{}: {kind}'s engine does not run it ({reason}); burn does",
                            dir.display()
                        ),
                    }
                }
                load_on_first_usable(kinds, options.precision, || Scoped {
                    work: work(dir.clone()),
                    quantization: options.quantization,
                    share: options.share_weights,
                })
            },
            |kind| {
                let graph = graph.ok_or_else(|| {
                    format!(
                        "{kind} runs ONNX exports through the text pipeline (BERT), image \
                         classification (ViT), zero-shot (CLIP) and speech recognition \
                         (Whisper, Wav2Vec2) so far; this task runs on the native backends"
                    )
                })?;
                let selection = crate::backends::graph_selection(
                    kind,
                    options.quantization,
                    options.precision,
                )?;
                let model = graph(kind, &dir).map_err(|e| e.to_string())?;
                Ok(((model, LoadedWeights::default()), selection))
            },
        )?;
        Ok(Loaded {
            model,
            selection,
            init: clock.lap(),
            dir,
            weights,
        })
    }

    /// What the model's weights take in memory, as kept.
    pub(crate) fn weights(&self) -> WeightStats {
        self.weights.stats()
    }

    /// Runs `call` in three timed phases and wraps its value with the metrics; the inference
    /// on the kernels' pool on the CPU backend ([`on_cpu_pool`]).
    pub(crate) fn timed<P: Send, I: Send, V>(
        &self,
        items: usize,
        preprocess: impl FnOnce() -> Result<P>,
        infer: impl FnOnce(&T, P) -> Result<I> + Send,
        postprocess: impl FnOnce(I) -> Result<V>,
    ) -> Result<Output<V>>
    where
        T: Sync,
    {
        let kind = self.selection.device.kind;
        self.timed_here(
            items,
            preprocess,
            |model, prepared| on_cpu_pool(kind, || infer(model, prepared)),
            postprocess,
        )
    }

    /// [`timed`](Self::timed) with the inference on the calling thread: for inference that calls
    /// back into the caller (streamed text).
    pub(crate) fn timed_here<P, I, V>(
        &self,
        items: usize,
        preprocess: impl FnOnce() -> Result<P>,
        infer: impl FnOnce(&T, P) -> Result<I>,
        postprocess: impl FnOnce(I) -> Result<V>,
    ) -> Result<Output<V>> {
        let mut clock = Stopwatch::start();
        let prepared = preprocess()?;
        let preprocess = clock.lap();
        let raw = infer(&self.model, prepared)?;
        let inference = clock.lap();
        let value = postprocess(raw)?;
        let metrics = call_metrics(
            &self.selection,
            self.init,
            [preprocess, inference],
            &mut clock,
            items,
        );
        Ok(Output { value, metrics })
    }
}

/// Runs `forward` on a thread of the kernels' pool on the CPU backend
/// ([`ipfs_accelerate_nn::fast::on_pool`]), so that its parallel loops start there instead of
/// each being handed over from the calling thread (a wake-up and a sleep per loop): MiniLM
/// embeddings of 64 sentences measured 11–12 % faster on 2 Zen 4 cores. On other backends in
/// place (a GPU's context belongs to the calling thread).
pub(crate) fn on_cpu_pool<R: Send>(backend: BackendKind, forward: impl FnOnce() -> R + Send) -> R {
    if backend == BackendKind::Cpu {
        ipfs_accelerate_nn::fast::on_pool(forward)
    } else {
        forward()
    }
}

/// The metrics of one call: `phases` are the preprocess and inference times; the postprocess
/// time is the clock's lap now.
pub(crate) fn call_metrics(
    selection: &Selection,
    init: Duration,
    [preprocess, inference]: [Duration; 2],
    clock: &mut Stopwatch,
    items: usize,
) -> Metrics {
    Metrics {
        backend: selection.device.kind.to_string(),
        init,
        preprocess,
        inference,
        postprocess: clock.lap(),
        total: clock.total(),
        items,
        ..Default::default()
    }
}

/// Defines a [`WithBackend`] loader that builds `$runner::<B>::$method(dir, device, kind)` and
/// boxes it as the task trait object `$tasks`.
#[allow(unused_macros)] // unused in builds without a family that loads from a folder
macro_rules! dir_loader {
    ($(#[$doc:meta])* $name:ident => $tasks:path, $runner:ident :: $method:ident) => {
        $(#[$doc])*
        struct $name(std::path::PathBuf);

        impl crate::backends::WithBackend for $name {
            type Output = Box<dyn $tasks>;

            fn run<H: ipfs_accelerate_core::Backend>(self, hal: &H) -> crate::Result<Self::Output> {
                Ok(Box::new($runner::<H::Burn>::$method(
                    &self.0,
                    &hal.device(),
                    hal.kind(),
                )?))
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use dir_loader;

/// Defines a task type: a public struct holding the loaded model `inner: Loaded<dyn $tasks>` and
/// the given extra fields, with its `selection()` accessor.
#[allow(unused_macros)] // unused in builds without a task type
macro_rules! task_type {
    ($(#[$doc:meta])* $name:ident => $tasks:path { $($field:ident: $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        pub struct $name {
            inner: crate::loaded::Loaded<dyn $tasks>,
            $($field: $ty,)*
        }

        impl $name {
            /// The backend it runs on and the preferences that were skipped.
            pub fn selection(&self) -> &ipfs_accelerate_core::Selection {
                &self.inner.selection
            }

            /// What the model's weights take in memory, as kept (quantized or float).
            pub fn weights(&self) -> ipfs_accelerate_nn::weights::WeightStats {
                self.inner.weights()
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use task_type;

/// A result with the metrics of the call that produced it (what every task API returns).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Output<T> {
    /// The result.
    pub value: T,
    /// Measured timings.
    pub metrics: ipfs_accelerate_core::Metrics,
}

/// Implements `ModelRunner` for a task model `$ty` that runs through its `runner` field (an ONNX
/// export's `OnnxRunner`, or an engine's boxed runner): the graph backends' and engines' versions
/// of the task traits.
#[allow(unused_macros)] // unused in builds without a task type with another engine
macro_rules! graph_model_runner {
    ($ty:ty, $family:literal) => {
        impl ipfs_accelerate_core::ModelRunner for $ty {
            fn family(&self) -> &str {
                $family
            }

            fn backend(&self) -> ipfs_accelerate_core::BackendKind {
                ipfs_accelerate_core::ModelRunner::backend(&self.runner)
            }

            fn run(
                &self,
                inputs: &ipfs_accelerate_core::TensorMap,
            ) -> ipfs_accelerate_core::Result<ipfs_accelerate_core::TensorMap> {
                ipfs_accelerate_core::ModelRunner::run(&self.runner, inputs)
            }

            fn placement(&self) -> Option<String> {
                ipfs_accelerate_core::ModelRunner::placement(&self.runner)
            }

            fn engine(&self) -> Option<&str> {
                ipfs_accelerate_core::ModelRunner::engine(&self.runner)
            }

            fn device_memory_in_use(&self) -> Option<u64> {
                ipfs_accelerate_core::ModelRunner::device_memory_in_use(&self.runner)
            }
        }
    };
}
#[allow(unused_imports)]
pub(crate) use graph_model_runner;

/// The `name` output of an ONNX export's run as f32 values, or an error naming the outputs
/// there are.
#[allow(dead_code)] // used by the task types with another engine
pub(crate) fn output_f32(
    out: &ipfs_accelerate_core::TensorMap,
    name: &str,
) -> ipfs_accelerate_core::Result<Vec<f32>> {
    Ok(out
        .get(name)
        .ok_or_else(|| {
            ipfs_accelerate_core::Error::InvalidInput(format!(
                "the ONNX export has no output `{name}` (outputs: {})",
                out.keys().cloned().collect::<Vec<_>>().join(", ")
            ))
        })?
        .to_f32_vec())
}
