//! Families on ONNX Runtime: a checkpoint folder's `model.onnx` (or `encoder.onnx` +
//! `decoder.onnx`, also under `onnx/` as the hub's exports lay them out) run with the same named
//! inputs and outputs as the native path. Generation goes through the shared loop
//! ([`ipfs_accelerate_nn::generate`]), recomputing the graph over the whole sequence each step
//! (the fixture exports have no past-key-value inputs).
//!
//! With the `webnn` feature the same exports also run in a headless browser on onnxruntime-web
//! (`BackendKind::Browser`: WebNN, WebGPU, wasm), through `OnnxRunner::load_browser` (feature `webnn`).

use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use ipfs_accelerate_backend_onnx::{OnnxSession, SessionOptions};
use ipfs_accelerate_core::{
    BackendKind, ExecutionProvider, HostTensor, ModelRunner, Result as CoreResult, TensorMap,
};
use ipfs_accelerate_nn::generate::{generate, GenerationConfig, TokenDecoder};

use crate::{Error, Result};

/// One graph: on ONNX Runtime, or on onnxruntime-web in a browser.
enum Graph {
    /// ONNX Runtime (an execution provider).
    Native(OnnxSession),
    /// onnxruntime-web in a headless browser (boxed: it is several times larger than a session).
    #[cfg(feature = "webnn")]
    Browser(Box<ipfs_accelerate_backend_webnn::BrowserGraph>),
}

impl Graph {
    fn run(&self, inputs: &TensorMap) -> CoreResult<TensorMap> {
        match self {
            Graph::Native(s) => Ok(s.run(inputs)?),
            #[cfg(feature = "webnn")]
            Graph::Browser(g) => Ok(g.run(inputs)?),
        }
    }

    fn path(&self) -> &Path {
        match self {
            Graph::Native(s) => s.path(),
            #[cfg(feature = "webnn")]
            Graph::Browser(g) => g.path(),
        }
    }

    fn input_names(&self) -> Vec<&str> {
        match self {
            Graph::Native(s) => s.input_names(),
            #[cfg(feature = "webnn")]
            Graph::Browser(g) => g.input_names(),
        }
    }

    /// Nodes per execution provider, and whether every node ran on the requested one (`None`
    /// when the runtime cannot tell).
    fn placement(&self) -> Option<(BTreeMap<String, usize>, Option<bool>)> {
        match self {
            Graph::Native(s) => s.node_placement().ok().map(|p| (p, None)),
            #[cfg(feature = "webnn")]
            Graph::Browser(g) => Some((g.placement(), Some(g.fully_placed()))),
        }
    }
}

/// The graphs of one model.
enum Graphs {
    /// One graph (`model.onnx`).
    Single(Graph),
    /// Encoder and decoder (`encoder.onnx`, `decoder.onnx`), joined by the encoder's
    /// `encoder_last_hidden_state` fed as the decoder's `encoder_hidden_states`.
    EncoderDecoder { encoder: Graph, decoder: Graph },
}

/// A family's ONNX export on one execution provider (ONNX Runtime, or a browser's).
pub struct OnnxRunner {
    family: String,
    backend: BackendKind,
    graphs: Graphs,
    decoder_start: Option<i64>,
    /// DETR's configuration (class names for post-processing), read once at load.
    #[cfg(feature = "detr")]
    detr: Option<ipfs_accelerate_detr::DetrConfig>,
    /// LLaVA's configuration (the image-token count check), read once at load.
    #[cfg(feature = "llava")]
    llava: Option<ipfs_accelerate_llava::LlavaConfig>,
}

/// Where the ONNX files of a checkpoint folder are: the folder itself or its `onnx/` subfolder.
fn onnx_dir(dir: &Path) -> Option<PathBuf> {
    [dir.to_path_buf(), dir.join("onnx")]
        .into_iter()
        .find(|d| d.join("model.onnx").is_file() || d.join("encoder.onnx").is_file())
}

impl OnnxRunner {
    /// Loads the ONNX export in `dir` for `family` on `provider`.
    pub fn load(
        family: &str,
        dir: &Path,
        provider: ExecutionProvider,
        options: &SessionOptions,
    ) -> Result<Self> {
        Self::load_with(family, dir, BackendKind::Onnx(provider), |path| {
            Ok(Graph::Native(
                OnnxSession::load(path, provider, options)
                    .map_err(ipfs_accelerate_core::Error::from)?,
            ))
        })
    }

    /// Loads the ONNX export in `dir` for `family` into `browser` (every graph of the model in
    /// the same browser) on `provider`.
    #[cfg(feature = "webnn")]
    pub fn load_browser(
        family: &str,
        dir: &Path,
        provider: ipfs_accelerate_core::BrowserProvider,
        browser: std::sync::Arc<ipfs_accelerate_backend_webnn::Browser>,
        options: ipfs_accelerate_backend_webnn::GraphOptions,
    ) -> Result<Self> {
        Self::load_with(family, dir, BackendKind::Browser(provider), |path| {
            Ok(Graph::Browser(Box::new(
                ipfs_accelerate_backend_webnn::BrowserGraph::load(
                    browser.clone(),
                    path,
                    provider,
                    options,
                )
                .map_err(ipfs_accelerate_core::Error::from)?,
            )))
        })
    }

    fn load_with(
        family: &str,
        dir: &Path,
        backend: BackendKind,
        load_graph: impl Fn(&Path) -> Result<Graph>,
    ) -> Result<Self> {
        let onnx = onnx_dir(dir).ok_or_else(|| {
            Error::Unsupported(format!(
                "{} has no ONNX export (model.onnx, or encoder.onnx + decoder.onnx, here or under onnx/)",
                dir.display()
            ))
        })?;
        let load = |name: &str| load_graph(&onnx.join(name));
        let graphs = if onnx.join("model.onnx").is_file() {
            Graphs::Single(load("model.onnx")?)
        } else {
            Graphs::EncoderDecoder {
                encoder: load("encoder.onnx")?,
                decoder: load("decoder.onnx")?,
            }
        };
        let decoder_start = std::fs::read_to_string(dir.join("config.json"))
            .ok()
            .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
            .and_then(|c| c.get("decoder_start_token_id").and_then(|v| v.as_i64()));
        Ok(OnnxRunner {
            family: family.to_string(),
            backend,
            graphs,
            decoder_start,
            #[cfg(feature = "detr")]
            detr: if family == "detr" {
                Some(ipfs_accelerate_detr::DetrConfig::from_file(
                    &dir.join("config.json"),
                )?)
            } else {
                None
            },
            #[cfg(feature = "llava")]
            llava: if family == "llava" {
                Some(ipfs_accelerate_llava::LlavaConfig::from_file_as(
                    &dir.join("config.json"),
                    ipfs_accelerate_llava::LlavaVariant::Llava,
                )?)
            } else {
                None
            },
        })
    }

    /// LLaVA: the prompt must hold one image token per image feature (HF raises otherwise; the
    /// graph's merge would fail or, on WebNN, clamp the out-of-range feature index).
    #[cfg(feature = "llava")]
    fn check_image_tokens(&self, inputs: &TensorMap) -> CoreResult<()> {
        let (Some(config), Some(pixels)) = (&self.llava, inputs.get("pixel_values")) else {
            return Ok(());
        };
        let features = pixels.shape().first().copied().unwrap_or(0) * config.tokens_per_view();
        for key in ["input_ids", "greedy_prompt"] {
            let Some(ids) = inputs.get(key) else { continue };
            let tokens = ids
                .to_i64_vec()?
                .iter()
                .filter(|&&t| t == config.image_token_id)
                .count();
            if tokens != features {
                return Err(ipfs_accelerate_core::Error::InvalidInput(format!(
                    "image features and image tokens do not match: `{key}` holds {tokens} image \
                     tokens (id {}), the images give {features} features",
                    config.image_token_id
                )));
            }
        }
        Ok(())
    }

    /// Runs the encoder (when there is one) and returns its outputs plus the decoder's inputs.
    fn encode(&self, inputs: &TensorMap) -> CoreResult<(TensorMap, TensorMap)> {
        match &self.graphs {
            Graphs::Single(_) => Ok((TensorMap::new(), inputs.clone())),
            Graphs::EncoderDecoder { encoder, .. } => {
                let enc = encoder.run(inputs)?;
                let hidden = enc
                    .get("encoder_last_hidden_state")
                    .or_else(|| enc.values().next())
                    .cloned()
                    .ok_or_else(|| {
                        ipfs_accelerate_core::Error::Compute("the encoder has no output".into())
                    })?;
                let mut dec_inputs = inputs.clone();
                dec_inputs.insert("encoder_hidden_states".into(), hidden);
                Ok((enc, dec_inputs))
            }
        }
    }

    /// The decoder's inputs for `inputs`: the encoder's output joined to them (encoder-decoder
    /// exports), or `inputs` as they are.
    pub(crate) fn decoder_context(&self, inputs: &TensorMap) -> CoreResult<TensorMap> {
        Ok(self.encode(inputs)?.1)
    }

    /// A decoder over the decoder graph whose rows start from `prompts` (fed as `key`, with
    /// `context` as the other inputs), recomputing the whole sequence each step. Runs the
    /// prompts once to learn the vocabulary; the first `prefill` returns those logits.
    pub(crate) fn token_decoder(
        &self,
        context: TensorMap,
        key: &'static str,
        prompts: Vec<Vec<i64>>,
    ) -> CoreResult<GraphDecoder<'_>> {
        let batch = prompts.len();
        let mut decoder = GraphDecoder {
            graph: self.decoder_graph(),
            key,
            context,
            seqs: prompts,
            vocab: 0,
            primed: None,
        };
        let first = decoder.last_logits()?;
        decoder.vocab = first.len() / batch.max(1);
        decoder.primed = Some(first);
        Ok(decoder)
    }

    fn decoder_graph(&self) -> &Graph {
        match &self.graphs {
            Graphs::Single(s) => s,
            Graphs::EncoderDecoder { decoder, .. } => decoder,
        }
    }

    /// Greedy tokens for `steps` steps through the shared generation loop.
    fn greedy(&self, inputs: &TensorMap, steps: usize) -> CoreResult<HostTensor> {
        let (_, context) = self.encode(inputs)?;
        let (key, prompts): (&'static str, Vec<Vec<i64>>) = match &self.graphs {
            Graphs::Single(_) => {
                let prompt = inputs
                    .get("greedy_prompt")
                    .or_else(|| inputs.get("input_ids"))
                    .ok_or_else(|| {
                        ipfs_accelerate_core::Error::InvalidInput(
                            "greedy decoding needs `greedy_prompt` or `input_ids`".into(),
                        )
                    })?;
                ("input_ids", rows(prompt)?)
            }
            Graphs::EncoderDecoder { .. } => {
                let start = self.decoder_start.ok_or_else(|| {
                    ipfs_accelerate_core::Error::InvalidInput(
                        "config.json has no decoder_start_token_id".into(),
                    )
                })?;
                let batch = context
                    .get("encoder_hidden_states")
                    .map(|t| t.shape()[0])
                    .unwrap_or(1);
                ("decoder_input_ids", vec![vec![start]; batch])
            }
        };
        let batch = prompts.len();
        let mut decoder = self.token_decoder(context, key, prompts.clone())?;
        let histories: Vec<Vec<u32>> = prompts
            .iter()
            .map(|r| r.iter().map(|&t| t.max(0) as u32).collect())
            .collect();
        let config = GenerationConfig {
            max_new_tokens: steps,
            ..Default::default()
        };
        let out = generate(&mut decoder, &histories, &config, |_, _| {
            ControlFlow::Continue(())
        })?;
        let flat: Vec<i64> = out.iter().flatten().map(|&t| i64::from(t)).collect();
        HostTensor::from_i64(vec![batch, steps], &flat)
    }
}

fn rows(t: &HostTensor) -> CoreResult<Vec<Vec<i64>>> {
    let v = t.to_i64_vec()?;
    let width = t.shape().last().copied().unwrap_or(0).max(1);
    Ok(v.chunks(width).map(<[i64]>::to_vec).collect())
}

/// A decoder graph run over the whole sequence each step.
pub(crate) struct GraphDecoder<'a> {
    graph: &'a Graph,
    key: &'static str,
    context: TensorMap,
    seqs: Vec<Vec<i64>>,
    vocab: usize,
    /// Logits already computed for the prompt (served by the first `prefill`).
    primed: Option<Vec<f32>>,
}

impl GraphDecoder<'_> {
    /// Logits of the last position of every row, `[batch * vocab]`.
    fn last_logits(&mut self) -> CoreResult<Vec<f32>> {
        let batch = self.seqs.len();
        let len = self.seqs.first().map(Vec::len).unwrap_or(0);
        let flat: Vec<i64> = self.seqs.iter().flatten().copied().collect();
        let mut inputs = self.context.clone();
        inputs.insert(
            self.key.into(),
            HostTensor::from_i64(vec![batch, len], &flat)?,
        );
        let out = self.graph.run(&inputs)?;
        let logits = out.get("logits").ok_or_else(|| {
            ipfs_accelerate_core::Error::Compute(format!(
                "{} has no `logits` output",
                self.graph.path().display()
            ))
        })?;
        let shape = logits.shape().to_vec();
        let (seq, vocab) = match shape.as_slice() {
            [b, s, v] if *b == batch => (*s, *v),
            other => {
                return Err(ipfs_accelerate_core::Error::Compute(format!(
                    "logits of shape {other:?} for batch {batch}"
                )))
            }
        };
        let all = logits.to_f32_vec();
        Ok((0..batch)
            .flat_map(|b| {
                let start = (b * seq + seq - 1) * vocab;
                all[start..start + vocab].to_vec()
            })
            .collect())
    }
}

impl TokenDecoder for GraphDecoder<'_> {
    fn batch(&self) -> usize {
        self.seqs.len()
    }
    fn vocab(&self) -> usize {
        self.vocab
    }
    fn prefill(&mut self) -> CoreResult<Vec<f32>> {
        match self.primed.take() {
            Some(l) => Ok(l),
            None => self.last_logits(),
        }
    }
    fn step(&mut self, tokens: &[u32]) -> CoreResult<Vec<f32>> {
        for (row, &t) in self.seqs.iter_mut().zip(tokens) {
            row.push(i64::from(t));
        }
        self.last_logits()
    }
}

impl ModelRunner for OnnxRunner {
    fn family(&self) -> &str {
        &self.family
    }

    fn backend(&self) -> BackendKind {
        self.backend
    }

    fn placement(&self) -> Option<String> {
        let graphs: Vec<&Graph> = match &self.graphs {
            Graphs::Single(s) => vec![s],
            Graphs::EncoderDecoder { encoder, decoder } => vec![encoder, decoder],
        };
        let mut total: BTreeMap<String, usize> = Default::default();
        let mut whole = Some(true);
        for g in graphs {
            let (placement, full) = g.placement()?;
            for (provider, n) in placement {
                *total.entry(provider).or_default() += n;
            }
            whole = match (whole, full) {
                (Some(a), Some(b)) => Some(a && b),
                _ => None,
            };
        }
        let text = total
            .iter()
            .map(|(p, n)| format!("{} {n}", p.trim_end_matches("ExecutionProvider")))
            .collect::<Vec<_>>()
            .join(", ");
        Some(match whole {
            Some(false) => format!("{text} (not wholly on {})", self.backend),
            _ => text,
        })
    }

    fn run(&self, inputs: &TensorMap) -> CoreResult<TensorMap> {
        #[cfg(feature = "llava")]
        self.check_image_tokens(inputs)?;
        let (mut out, dec_inputs) = self.encode(inputs)?;
        let needs_decoder = match &self.graphs {
            Graphs::Single(_) => true,
            Graphs::EncoderDecoder { decoder, .. } => decoder
                .input_names()
                .iter()
                .all(|n| dec_inputs.contains_key(*n)),
        };
        if needs_decoder {
            out.extend(self.decoder_graph().run(&dec_inputs)?);
        }
        #[cfg(feature = "detr")]
        if let Some(config) = &self.detr {
            if let (Some(logits), Some(boxes)) = (out.get("logits"), out.get("pred_boxes")) {
                // The same post-processing as the native path.
                let post = ipfs_accelerate_detr::post_outputs(
                    logits.clone(),
                    boxes.clone(),
                    inputs,
                    &|i| config.label(i),
                )?;
                out.extend(post);
            }
        }
        if let Some(steps) = inputs.get("greedy_steps") {
            let steps = steps.to_i64_vec()?.first().copied().unwrap_or(0).max(0) as usize;
            out.insert("greedy_tokens".into(), self.greedy(inputs, steps)?);
        }
        for (name, tensor) in &out {
            tensor.check_finite(&format!("output `{name}`"))?;
        }
        Ok(out)
    }
}

/// The runner of the ONNX export in `dir` for `family` on the graph backend `kind` (ONNX Runtime
/// with its provider, or a new headless browser with feature `webnn`).
pub(crate) fn graph_runner(family: &str, kind: BackendKind, dir: &Path) -> Result<OnnxRunner> {
    match kind {
        BackendKind::Onnx(provider) => {
            OnnxRunner::load(family, dir, provider, &SessionOptions::default())
        }
        #[cfg(feature = "webnn")]
        BackendKind::Browser(provider) => {
            let browser = ipfs_accelerate_backend_webnn::Browser::launch(&Default::default())
                .map_err(ipfs_accelerate_core::Error::from)?;
            OnnxRunner::load_browser(
                family,
                dir,
                provider,
                std::sync::Arc::new(browser),
                ipfs_accelerate_backend_webnn::GraphOptions::default(),
            )
        }
        other => Err(Error::Unsupported(format!(
            "{other}: not compiled in (enable feature `webnn`)"
        ))),
    }
}

/// The task model of `family` on the graph backend `kind` from the export in `dir`: its config
/// (`C`, read from config.json) and runner handed to `make`.
pub(crate) fn graph_model<C: ipfs_accelerate_core::JsonConfig, T: ?Sized>(
    family: &str,
    kind: BackendKind,
    dir: &Path,
    make: impl FnOnce(OnnxRunner, C) -> Box<T>,
) -> Result<Box<T>> {
    let config = C::from_file(&dir.join("config.json"))?;
    Ok(make(graph_runner(family, kind, dir)?, config))
}
