//! T5 behind the uniform [`ModelRunner`] interface, and text-to-text generation.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, ModelRunner, Result, TensorMap, TensorSource,
};
use ipfs_accelerate_nn::{
    convert::float_to_host,
    generate::{GenerationConfig, Sampling},
};
use ipfs_accelerate_preprocess::TextTokenizer;

use crate::model::matrix_dims;
use crate::{T5Config, T5Inputs, T5};

/// The T5 family: loads a checkpoint folder as a [`T5Runner`].
pub struct T5Family;

impl T5Family {
    /// Loads the checkpoint in `dir` with its task interface (text-to-text when the folder has a
    /// `tokenizer.json`).
    pub fn load_tasks<B: Backend>(
        dir: &Path,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Box<dyn T5Tasks>> {
        Ok(Box::new(T5Runner::<B>::from_dir(dir, device, kind)?))
    }
}

impl Family for T5Family {
    const NAME: &'static str = "t5";

    fn load<B: Backend>(
        dir: &Path,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Box<dyn ModelRunner>> {
        Ok(Box::new(T5Runner::<B>::from_dir(dir, device, kind)?))
    }
}

/// A loaded T5 checkpoint on one backend, with its tokenizer when the folder has one.
pub struct T5Runner<B: Backend> {
    model: T5<B>,
    tokenizer: Option<TextTokenizer>,
    kind: BackendKind,
}

impl<B: Backend> T5Runner<B> {
    /// Loads `config.json`, the weights and (if present) `tokenizer.json` from `dir`.
    pub fn from_dir(dir: &Path, device: &B::Device, kind: BackendKind) -> Result<Self> {
        let config = T5Config::from_file(&dir.join("config.json"))?;
        let weights = ipfs_accelerate_io::open_weights(dir)?;
        let mut runner = Self::load(weights, &config, device, kind)?;
        let tok = dir.join("tokenizer.json");
        if tok.is_file() {
            runner.tokenizer = Some(TextTokenizer::from_file(&tok, config.max_input_tokens)?);
        }
        Ok(runner)
    }

    /// Loads the model from a weight source (no tokenizer).
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &T5Config,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Self> {
        Ok(T5Runner {
            model: T5::load(source, config, device)?,
            tokenizer: None,
            kind,
        })
    }

    /// Uses `tokenizer` for text input and output.
    pub fn with_tokenizer(mut self, tokenizer: TextTokenizer) -> Self {
        self.tokenizer = Some(tokenizer);
        self
    }

    /// The model.
    pub fn model(&self) -> &T5<B> {
        &self.model
    }
}

impl<B: Backend> T5Executor for T5Runner<B> {
    type Encoded = Tensor<B, 3>;

    fn config(&self) -> &T5Config {
        self.model.config()
    }

    fn tokenizer(&self) -> Option<&TextTokenizer> {
        self.tokenizer.as_ref()
    }

    fn encode(&self, inputs: &T5Inputs) -> Result<Tensor<B, 3>> {
        self.model.encode(inputs)
    }

    fn states(&self, encoded: &Tensor<B, 3>) -> Result<HostTensor> {
        float_to_host(encoded.clone())
    }

    fn logits(
        &self,
        encoded: &Tensor<B, 3>,
        inputs: &T5Inputs,
        ids: &[i64],
        len: usize,
    ) -> Result<HostTensor> {
        let hidden = self
            .model
            .decode(ids, len, encoded, &inputs.attention_mask, None)?;
        float_to_host(self.model.lm_logits(hidden))
    }

    fn generate_from(
        &self,
        encoded: &Tensor<B, 3>,
        inputs: &T5Inputs,
        config: &GenerationConfig,
        on_token: &mut dyn FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        config.validate()?;
        self.model.generate_from_encoder(
            encoded.clone(),
            &inputs.attention_mask,
            config,
            true,
            on_token,
        )
    }
}

impl<B: Backend> ModelRunner for T5Runner<B> {
    fn family(&self) -> &str {
        "t5"
    }

    fn backend(&self) -> BackendKind {
        self.kind
    }

    fn generate_ids(
        &self,
        inputs: &TensorMap,
        max_new_tokens: usize,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>> {
        generate_ids(self, inputs, max_new_tokens, on_token)
    }

    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        run_outputs(self, inputs)
    }
}

/// What a T5 executor (burn's modules, an engine of the specs) computes; [`run_outputs`],
/// [`generate_ids`] and [`T5Tasks`] are written once over it.
pub trait T5Executor {
    /// The encoder's output as the executor keeps it.
    type Encoded;
    /// The configuration.
    fn config(&self) -> &T5Config;
    /// The checkpoint's tokenizer, if it has one.
    fn tokenizer(&self) -> Option<&TextTokenizer>;
    /// Runs the encoder.
    fn encode(&self, inputs: &T5Inputs) -> Result<Self::Encoded>;
    /// The encoder's output `[batch, seq, d_model]` on the host.
    fn states(&self, encoded: &Self::Encoded) -> Result<HostTensor>;
    /// Logits `[batch, len, vocab]` of `ids` (row-major `[batch, len]`, uncached) over the
    /// encoder's output (`inputs`' padding masked).
    fn logits(
        &self,
        encoded: &Self::Encoded,
        inputs: &T5Inputs,
        ids: &[i64],
        len: usize,
    ) -> Result<HostTensor>;
    /// Generates from the decoder start token over the encoder's output through the shared loop;
    /// `on_token(row, token)` streams tokens.
    fn generate_from(
        &self,
        encoded: &Self::Encoded,
        inputs: &T5Inputs,
        config: &GenerationConfig,
        on_token: &mut dyn FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>>;
}

/// [`ModelRunner::generate_ids`] of any executor: exactly `max_new_tokens` greedy tokens of one
/// row (no stop token).
pub fn generate_ids<E: T5Executor + ?Sized>(
    executor: &E,
    inputs: &TensorMap,
    max_new_tokens: usize,
    on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
) -> Result<Vec<u32>> {
    let enc_inputs = T5Inputs::from_tensors(inputs)?;
    let config = GenerationConfig::exact_greedy(max_new_tokens);
    let encoded = executor.encode(&enc_inputs)?;
    let rows = executor.generate_from(&encoded, &enc_inputs, &config, &mut |_, t| on_token(t))?;
    ipfs_accelerate_nn::generate::single_row(rows)
}

/// [`ModelRunner::run`] of any executor. Inputs: `input_ids`, optional `attention_mask`, optional
/// `decoder_input_ids` (→ `logits`), optional `greedy_steps` (→ `greedy_tokens`: that many argmax
/// steps from the decoder start token, no EOS stop, through the KV-cached generation loop).
/// Always returns `encoder_last_hidden_state`.
pub fn run_outputs<E: T5Executor + ?Sized>(executor: &E, inputs: &TensorMap) -> Result<TensorMap> {
    let enc_inputs = T5Inputs::from_tensors(inputs)?;
    let encoded = executor.encode(&enc_inputs)?;
    let mut out = TensorMap::new();
    if let Some(dec) = inputs.get("decoder_input_ids") {
        let [batch, len] = matrix_dims("decoder_input_ids", dec.shape())?;
        if batch != enc_inputs.batch {
            return Err(Error::InvalidInput(format!(
                "decoder_input_ids has {batch} rows, input_ids {}",
                enc_inputs.batch
            )));
        }
        let logits = executor.logits(&encoded, &enc_inputs, &dec.to_i64_vec()?, len)?;
        out.insert("logits".into(), logits);
    }
    if let Some(steps) = ipfs_accelerate_nn::generate::greedy_steps(inputs)? {
        let config = GenerationConfig {
            max_new_tokens: steps,
            sampling: Sampling::Greedy,
            ..Default::default()
        };
        let tokens = executor.generate_from(&encoded, &enc_inputs, &config, &mut |_, _| {
            ControlFlow::Continue(())
        })?;
        let flat: Vec<i64> = tokens.iter().flatten().map(|&t| i64::from(t)).collect();
        out.insert(
            "greedy_tokens".into(),
            HostTensor::from_i64(vec![enc_inputs.batch, steps], &flat)?,
        );
    }
    out.insert(
        "encoder_last_hidden_state".into(),
        executor.states(&encoded)?,
    );
    Ok(out)
}

/// The object-safe task interface of a loaded T5, whatever backend it runs on.
pub trait T5Tasks: ModelRunner {
    /// The configuration.
    fn config(&self) -> &T5Config;
    /// Token-level generation (see [`T5::generate`]); `on_token(row, token)` streams tokens.
    fn generate(
        &self,
        input_ids: &[Vec<i64>],
        attention_mask: Option<&[Vec<i64>]>,
        config: &GenerationConfig,
        on_token: &mut dyn FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>>;
    /// Text-to-text: tokenises `texts` (the tokenizer appends `</s>`), generates, and decodes each
    /// row without special tokens. Needs a tokenizer.
    fn generate_text(&self, texts: &[&str], config: &GenerationConfig) -> Result<Vec<String>>;
}

impl<E: T5Executor + ModelRunner> T5Tasks for E {
    fn config(&self) -> &T5Config {
        T5Executor::config(self)
    }

    fn generate(
        &self,
        input_ids: &[Vec<i64>],
        attention_mask: Option<&[Vec<i64>]>,
        config: &GenerationConfig,
        on_token: &mut dyn FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        let pad = T5Executor::config(self)
            .pad_token_id
            .map(i64::from)
            .unwrap_or(0);
        let inputs = T5Inputs::from_rows(input_ids, attention_mask, pad)?;
        config.validate()?;
        let encoded = self.encode(&inputs)?;
        self.generate_from(&encoded, &inputs, config, on_token)
    }

    fn generate_text(&self, texts: &[&str], config: &GenerationConfig) -> Result<Vec<String>> {
        let tok = self.tokenizer().ok_or_else(|| {
            Error::InvalidInput(
                "this checkpoint has no tokenizer.json: text input is unavailable".into(),
            )
        })?;
        let enc = tok.encode_batch(texts)?;
        let inputs = T5Inputs {
            batch: enc.batch,
            seq: enc.seq,
            input_ids: enc.input_ids,
            attention_mask: enc.attention_mask,
        };
        config.validate()?;
        let encoded = self.encode(&inputs)?;
        let tokens = self.generate_from(&encoded, &inputs, config, &mut |_, _| {
            ControlFlow::Continue(())
        })?;
        tokens
            .iter()
            .map(|row| tok.decode(row).map_err(Error::from))
            .collect()
    }
}
