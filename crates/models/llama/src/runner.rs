//! LLaMA and Qwen2 behind the uniform [`ModelRunner`] interface, the two [`Family`] entries and
//! the text-generation task API.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use burn::tensor::backend::Backend;
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, ModelRunner, Result, TensorMap, TensorSource,
};
use ipfs_accelerate_io::gguf::GgufFile;
use ipfs_accelerate_nn::{
    convert::float_to_host,
    generate::{generate, GenerationConfig, RowRequest},
};

use crate::decoder::{DecodeMode, LlamaDecoder};
use crate::gguf::GgufWeights;
use crate::model::{DecoderInput, LlamaModel};
use crate::{Architecture, LlamaConfig};
use ipfs_accelerate_nn::WeightQuantization;

/// The LLaMA family (`LlamaForCausalLM` checkpoints).
pub struct LlamaFamily;

/// The Qwen2 family (`Qwen2ForCausalLM` checkpoints).
pub struct Qwen2Family;

fn load_dir<B: Backend>(
    dir: &Path,
    arch: Architecture,
    device: &B::Device,
    kind: BackendKind,
) -> Result<Box<dyn ModelRunner>> {
    let path = dir.join("config.json");
    let config = LlamaConfig::from_file(&path, arch)?;
    if config.architecture != arch {
        return Err(Error::config(
            &path,
            format!(
                "a {} checkpoint cannot be loaded as {}",
                config.architecture.name(),
                arch.name()
            ),
        ));
    }
    let weights = ipfs_accelerate_io::open_weights(dir)?;
    let mut runner = LlamaRunner::<B>::load(weights, &config, device, kind)?;
    runner.chat_template = read_chat_template(dir)?;
    Ok(Box::new(runner))
}

impl Family for LlamaFamily {
    const NAME: &'static str = "llama";

    fn load<B: Backend>(
        dir: &Path,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Box<dyn ModelRunner>> {
        load_dir::<B>(dir, Architecture::Llama, device, kind)
    }
}

impl Family for Qwen2Family {
    const NAME: &'static str = "qwen2";

    fn load<B: Backend>(
        dir: &Path,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Box<dyn ModelRunner>> {
        load_dir::<B>(dir, Architecture::Qwen2, device, kind)
    }
}

/// `chat_template` of `tokenizer_config.json` in `dir`, when the file and the key exist (a
/// string; the list form picks the template named `default`).
pub fn read_chat_template(dir: &Path) -> Result<Option<String>> {
    let path = dir.join("tokenizer_config.json");
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::config(&path, e.to_string()))?;
    Ok(match value.get("chat_template") {
        Some(serde_json::Value::String(s)) => Some(s.clone()),
        Some(serde_json::Value::Array(list)) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(|t| t.as_str())
            .map(str::to_string),
        _ => None,
    })
}

/// A loaded LLaMA / Qwen2 checkpoint on one backend.
pub struct LlamaRunner<B: Backend> {
    model: LlamaModel<B>,
    kind: BackendKind,
    chat_template: Option<String>,
}

impl<B: Backend> LlamaRunner<B> {
    /// Loads HF-named weights from `source` onto `device`.
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &LlamaConfig,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Self> {
        Ok(LlamaRunner {
            model: LlamaModel::load(source, config, device)?,
            kind,
            chat_template: None,
        })
    }

    /// Loads a llama.cpp GGUF file (architecture `llama` or `qwen2`): the configuration from its
    /// metadata, the weights (LLaMA's permuted q / k rows restored) kept in the file's quantized
    /// blocks on the CPU backend ([`ipfs_accelerate_nn::ggml`]: linear layers with no other
    /// quantization asked, the token embedding and a tied head) and dequantized to f32
    /// elsewhere, and its chat template.
    pub fn from_gguf(path: &Path, device: &B::Device, kind: BackendKind) -> Result<Self> {
        let file = Arc::new(GgufFile::open(path)?);
        let config = LlamaConfig::from_gguf(&file)?;
        let weights = GgufWeights::new(file.clone(), &config);
        let mut runner = Self::load(Arc::new(weights), &config, device, kind)?;
        runner.chat_template = file.chat_template().map(str::to_string);
        Ok(runner)
    }

    /// The model.
    pub fn model(&self) -> &LlamaModel<B> {
        &self.model
    }

    /// The configuration.
    pub fn config(&self) -> &LlamaConfig {
        self.model.config()
    }

    /// The chat template (Jinja) of the checkpoint's tokenizer, if it ships one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// Sets the chat template (e.g. read from a tokenizer config elsewhere).
    pub fn set_chat_template(&mut self, template: Option<String>) {
        self.chat_template = template;
    }

    /// Generation defaults of this checkpoint: greedy, stopping at its EOS token(s).
    pub fn default_generation_config(&self) -> GenerationConfig {
        self.config().default_generation_config()
    }

    /// Generates a continuation of `prompt` with the KV cache; `on_token` sees every token as soon
    /// as it is chosen and may stop generation with `ControlFlow::Break`. Returns the new tokens.
    pub fn generate(
        &self,
        prompt: &[u32],
        config: &GenerationConfig,
        mut on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>> {
        let mut out = self.generate_batch(&[prompt.to_vec()], config, |_, t| on_token(t))?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Generates continuations of several prompts at once (left-padded into one batch);
    /// `on_token(row, token)` streams them.
    pub fn generate_batch(
        &self,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
        on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        self.generate_with(prompts, config, DecodeMode::Cached, on_token)
    }

    /// [`generate_batch`](Self::generate_batch) with an explicit decoding mode.
    pub fn generate_with(
        &self,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
        mode: DecodeMode,
        on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        let mut decoder = LlamaDecoder::new(&self.model, prompts, mode)?;
        generate(&mut decoder, prompts, config, on_token)
    }

    /// Logits `[batch, seq, vocab]` of one uncached forward ([`ForwardInputs`]).
    fn logits(&self, f: &ForwardInputs) -> Result<HostTensor> {
        let input = DecoderInput {
            batch: f.batch,
            seq: f.seq,
            ids: &f.ids,
            positions: &f.positions,
            mask: &f.mask,
        };
        float_to_host(self.model.forward(&input, None)?)
    }
}

/// One uncached forward's inputs: `input_ids` `[batch, seq]` with its optional
/// `attention_mask` (all ones when absent) and `position_ids` (`0..seq` per row when absent, as
/// HF's forward; generation derives them from the mask instead, see [`positions_from_mask`](crate::positions_from_mask)).
#[derive(Debug, Clone, PartialEq)]
pub struct ForwardInputs {
    /// Rows.
    pub batch: usize,
    /// Columns.
    pub seq: usize,
    /// Token ids, row-major.
    pub ids: Vec<i64>,
    /// Position ids, row-major.
    pub positions: Vec<i64>,
    /// Attention mask, row-major.
    pub mask: Vec<i64>,
}

/// Reads [`ForwardInputs`] from `inputs` (`ids` is its `input_ids`).
pub fn forward_inputs(inputs: &TensorMap, ids: &HostTensor) -> Result<ForwardInputs> {
    let [batch, seq] = token_matrix("input_ids", ids)?;
    let positions = same_shape_ids(inputs, "position_ids", ids)?
        .unwrap_or_else(|| (0..batch).flat_map(|_| 0..seq as i64).collect());
    let mask =
        same_shape_ids(inputs, "attention_mask", ids)?.unwrap_or_else(|| vec![1; batch * seq]);
    Ok(ForwardInputs {
        batch,
        seq,
        ids: ids.to_i64_vec()?,
        positions,
        mask,
    })
}

/// The `run` of every executor of the family (`ModelRunner::run`): `input_ids` (+ optional
/// `attention_mask` / `position_ids`) → `logits` through `logits`; `greedy_prompt` +
/// `greedy_steps` → `greedy_tokens` through `decode`, which runs the prompts' rows under a greedy
/// [`GenerationConfig`] of that many new tokens (see [`greedy_tokens`]). At least one of the two
/// inputs is required.
pub fn run_causal_lm(
    inputs: &TensorMap,
    vocab: usize,
    logits: impl FnOnce(&ForwardInputs) -> Result<HostTensor>,
    decode: impl FnOnce(&[Vec<u32>], &GenerationConfig) -> Result<Vec<Vec<u32>>>,
) -> Result<TensorMap> {
    let mut map = TensorMap::new();
    if let Some(ids) = inputs.get("input_ids") {
        map.insert("logits".into(), logits(&forward_inputs(inputs, ids)?)?);
    }
    if let Some(prompt) = inputs.get("greedy_prompt") {
        let [rows, cols] = token_matrix("greedy_prompt", prompt)?;
        let steps = greedy_steps(inputs)?;
        let ids = prompt.to_i64_vec()?;
        check_vocab("greedy_prompt", &ids, vocab)?;
        let prompts: Vec<Vec<u32>> = ids
            .chunks(cols)
            .take(rows)
            .map(|r| r.iter().map(|&t| t as u32).collect())
            .collect();
        map.insert(
            "greedy_tokens".into(),
            greedy_tokens(&prompts, steps, decode)?,
        );
    }
    if map.is_empty() {
        return Err(Error::InvalidInput(
            "missing input: `input_ids` or `greedy_prompt`".into(),
        ));
    }
    Ok(map)
}

/// The `greedy_steps` input of a reference run, which a greedy run needs
/// ([`ipfs_accelerate_nn::generate::greedy_steps`]).
pub fn greedy_steps(inputs: &TensorMap) -> Result<usize> {
    ipfs_accelerate_nn::generate::greedy_steps(inputs)?
        .ok_or_else(|| Error::InvalidInput("missing input `greedy_steps`".into()))
}

/// Fails with [`Error::InvalidInput`] when a token of `ids` (the input `name`) is outside
/// `0..vocab`.
pub fn check_vocab(name: &str, ids: &[i64], vocab: usize) -> Result<()> {
    let vocab = vocab as i64;
    match ids.iter().find(|&&t| t < 0 || t >= vocab) {
        Some(bad) => Err(Error::InvalidInput(format!(
            "{name} contains {bad}, outside the vocabulary of {vocab}"
        ))),
        None => Ok(()),
    }
}

/// `steps` greedy tokens after each of `prompts` as the reference fixtures hold them: `decode`
/// runs the prompts under a greedy [`GenerationConfig`] of `steps` new tokens; I64
/// `[prompts, steps]`.
pub fn greedy_tokens(
    prompts: &[Vec<u32>],
    steps: usize,
    decode: impl FnOnce(&[Vec<u32>], &GenerationConfig) -> Result<Vec<Vec<u32>>>,
) -> Result<HostTensor> {
    let config = GenerationConfig {
        max_new_tokens: steps,
        ..GenerationConfig::default()
    };
    let out = decode(prompts, &config)?;
    let flat: Vec<i64> = out.iter().flatten().map(|&t| i64::from(t)).collect();
    HostTensor::from_i64(vec![prompts.len(), steps], &flat)
}

/// The optional input `name` (token-aligned, e.g. `attention_mask`) as i64 values, which must
/// have the shape of `ids`.
pub fn same_shape_ids(
    inputs: &TensorMap,
    name: &str,
    ids: &HostTensor,
) -> Result<Option<Vec<i64>>> {
    match inputs.get(name) {
        None => Ok(None),
        Some(t) if t.shape() == ids.shape() => Ok(Some(t.to_i64_vec()?)),
        Some(t) => Err(Error::InvalidInput(format!(
            "{name} has shape {:?}, input_ids {:?}",
            t.shape(),
            ids.shape()
        ))),
    }
}

/// `[batch, seq]` of the token matrix `t` (the input `name`), which must be non-empty.
pub fn token_matrix(name: &str, t: &HostTensor) -> Result<[usize; 2]> {
    match *t.shape() {
        [b, s] if b > 0 && s > 0 => Ok([b, s]),
        ref other => Err(Error::InvalidInput(format!(
            "{name} must be a non-empty [batch, seq] matrix, got shape {other:?}"
        ))),
    }
}

impl<B: Backend> ModelRunner for LlamaRunner<B> {
    fn family(&self) -> &str {
        self.config().architecture.name()
    }

    fn backend(&self) -> BackendKind {
        self.kind
    }

    /// `input_ids` (+ optional `attention_mask` / `position_ids`) → `logits`; `greedy_prompt` +
    /// `greedy_steps` → `greedy_tokens`, recomputing the whole sequence each step as the
    /// reference fixtures do. At least one of the two inputs is required.
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        run_causal_lm(
            inputs,
            self.config().vocab_size,
            |f| self.logits(f),
            |prompts, config| {
                self.generate_with(prompts, config, DecodeMode::Recompute, |_, _| {
                    ControlFlow::Continue(())
                })
            },
        )
    }
}

/// The object-safe text-generation interface of a loaded LLaMA / Qwen2, whatever backend it
/// runs on.
pub trait TextGeneration: ModelRunner {
    /// The configuration.
    fn config(&self) -> &LlamaConfig;
    /// The chat template, if the checkpoint ships one.
    fn chat_template(&self) -> Option<&str>;
    /// Greedy decoding stopping at the checkpoint's EOS token(s).
    fn default_generation_config(&self) -> GenerationConfig;
    /// Keeps the linear weights quantized in memory (see [`LlamaModel::quantize`]).
    fn quantize(&mut self, q: WeightQuantization) -> Result<()>;
    /// Bytes the weights take in memory.
    fn weight_bytes(&self) -> usize;
    /// Bytes the weights take as f32 (see [`LlamaModel::float_weight_bytes`]).
    fn float_weight_bytes(&self) -> usize;
    /// New tokens after `prompt`, streamed through `on_token`.
    fn generate(
        &self,
        prompt: &[u32],
        config: &GenerationConfig,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>>;
    /// New tokens after each of `prompts`, decoded together as one left-padded batch (one
    /// product per step for every row), each row with its own configuration (seeded sampler,
    /// limits: [`ipfs_accelerate_nn::generate::generate_each`]); `on_token(row, token)` streams
    /// them, and its `Break` ends that row.
    fn generate_each(
        &self,
        prompts: &[Vec<u32>],
        configs: &[GenerationConfig],
        on_token: &mut dyn FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>>;
    /// Whether requests can join a batch while it decodes
    /// ([`generate_continuous`](Self::generate_continuous) admits them); otherwise a batch runs
    /// as it started.
    fn joins_running_batches(&self) -> bool {
        false
    }
    /// Continuous batching ([`ipfs_accelerate_nn::generate::generate_continuous`]): decodes
    /// `first` and, between steps, the requests `admit(free)` hands (up to `max_rows` rows in
    /// all); requests are numbered in arrival order, `on_token(request, token)` streams and
    /// `on_done(request, result)` ends each. An executor that cannot change a running batch
    /// ([`joins_running_batches`](Self::joins_running_batches) false) decodes `first` as one
    /// batch and never calls `admit`.
    fn generate_continuous(
        &self,
        first: Vec<RowRequest>,
        max_rows: usize,
        admit: &mut dyn FnMut(usize) -> Vec<RowRequest>,
        on_token: &mut dyn FnMut(usize, u32) -> ControlFlow<()>,
        on_done: &mut dyn FnMut(usize, Result<Vec<u32>>),
    ) -> Result<()> {
        let _ = (max_rows, admit);
        let (prompts, configs): (Vec<Vec<u32>>, Vec<GenerationConfig>) =
            first.into_iter().map(|r| (r.prompt, r.config)).unzip();
        let rows = self.generate_each(&prompts, &configs, on_token)?;
        for (id, tokens) in rows.into_iter().enumerate() {
            on_done(id, Ok(tokens));
        }
        Ok(())
    }
}

impl<B: Backend> TextGeneration for LlamaRunner<B> {
    fn config(&self) -> &LlamaConfig {
        self.model.config()
    }

    fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    fn default_generation_config(&self) -> GenerationConfig {
        LlamaRunner::default_generation_config(self)
    }

    fn quantize(&mut self, q: WeightQuantization) -> Result<()> {
        self.model.quantize(q)
    }

    fn weight_bytes(&self) -> usize {
        self.model.weight_bytes()
    }

    fn float_weight_bytes(&self) -> usize {
        self.model.float_weight_bytes()
    }

    fn generate(
        &self,
        prompt: &[u32],
        config: &GenerationConfig,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>> {
        LlamaRunner::generate(self, prompt, config, on_token)
    }

    fn generate_each(
        &self,
        prompts: &[Vec<u32>],
        configs: &[GenerationConfig],
        on_token: &mut dyn FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        let mut decoder = LlamaDecoder::new(&self.model, prompts, DecodeMode::Cached)?;
        ipfs_accelerate_nn::generate::generate_each(&mut decoder, prompts, configs, on_token)
    }

    fn joins_running_batches(&self) -> bool {
        true
    }

    fn generate_continuous(
        &self,
        first: Vec<RowRequest>,
        max_rows: usize,
        admit: &mut dyn FnMut(usize) -> Vec<RowRequest>,
        on_token: &mut dyn FnMut(usize, u32) -> ControlFlow<()>,
        on_done: &mut dyn FnMut(usize, Result<Vec<u32>>),
    ) -> Result<()> {
        let prompts: Vec<Vec<u32>> = first.iter().map(|r| r.prompt.clone()).collect();
        let mut decoder = if prompts.is_empty() {
            LlamaDecoder::empty(&self.model)
        } else {
            LlamaDecoder::new(&self.model, &prompts, DecodeMode::Cached)?
        };
        ipfs_accelerate_nn::generate::generate_continuous(
            &mut decoder,
            first,
            max_rows,
            admit,
            on_token,
            on_done,
        )
    }
}
