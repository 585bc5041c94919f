//! LLaVA and LLaVA-NeXT behind the uniform [`ModelRunner`] interface, the two [`Family`] entries,
//! image-token expansion and the image-to-text generation task API.

use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use burn::tensor::{backend::Backend, Tensor};
use ipfs_accelerate_core::{
    BackendKind, Error, Family, HostTensor, ModelRunner, Result, TensorMap, TensorSource,
};
use ipfs_accelerate_llama::{
    check_vocab, greedy_steps, greedy_tokens, same_shape_ids, token_matrix, DecodeMode,
    LlamaDecoder,
};
use ipfs_accelerate_nn::{
    convert::float_to_host,
    generate::{generate, GenerationConfig},
};

use crate::config::{LlavaConfig, LlavaVariant};
use crate::model::{LlavaModel, PromptTokens};
use crate::processor::LlavaInputs;

/// The LLaVA-1.5 family (`LlavaForConditionalGeneration` checkpoints).
pub struct LlavaFamily;

/// The LLaVA-NeXT family (`LlavaNextForConditionalGeneration` checkpoints).
pub struct LlavaNextFamily;

/// Implements [`Family`] for a unit struct that loads a checkpoint folder as one variant.
macro_rules! variant_family {
    ($family:ty, $variant:expr) => {
        impl Family for $family {
            const NAME: &'static str = $variant.name();

            fn load<B: Backend>(
                dir: &Path,
                device: &B::Device,
                kind: BackendKind,
            ) -> Result<Box<dyn ModelRunner>> {
                let runner = LlavaRunner::<B>::load_dir(dir, $variant, device, kind)?;
                Ok(Box::new(runner))
            }
        }
    };
}

variant_family!(LlavaFamily, LlavaVariant::Llava);
variant_family!(LlavaNextFamily, LlavaVariant::LlavaNext);

/// Replaces the `i`-th occurrence of `image_token` in `prompt` by `counts[i]` copies of it (what
/// HF's LLaVA processors do to each `<image>` placeholder). The number of placeholders must equal
/// the number of images.
pub fn expand_image_tokens(prompt: &[u32], image_token: u32, counts: &[usize]) -> Result<Vec<u32>> {
    let placeholders = prompt.iter().filter(|&&t| t == image_token).count();
    if placeholders != counts.len() {
        return Err(Error::InvalidInput(format!(
            "the prompt holds {placeholders} image placeholders (token {image_token}) for {} \
             images",
            counts.len()
        )));
    }
    let mut out = Vec::with_capacity(prompt.len() + counts.iter().sum::<usize>());
    let mut next = counts.iter();
    for &t in prompt {
        match (t == image_token).then(|| next.next()).flatten() {
            Some(&n) => out.extend(std::iter::repeat_n(image_token, n)),
            None => out.push(t),
        }
    }
    Ok(out)
}

/// The tokens generation stops at: `eos_token_id` of `generation_config.json` in `dir` when
/// present, else the text model's.
pub fn stop_tokens(dir: &Path, config: &LlavaConfig) -> Result<Vec<u32>> {
    let path = dir.join("generation_config.json");
    if !path.is_file() {
        return Ok(config.text_config.eos_token_ids());
    }
    let text = std::fs::read_to_string(&path).map_err(|e| Error::io(&path, e))?;
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| Error::config(&path, e.to_string()))?;
    let ids: Vec<u64> = match value.get("eos_token_id") {
        Some(serde_json::Value::Number(n)) => n.as_u64().into_iter().collect(),
        Some(serde_json::Value::Array(list)) => list.iter().filter_map(|v| v.as_u64()).collect(),
        _ => return Ok(config.text_config.eos_token_ids()),
    };
    Ok(ids
        .into_iter()
        .filter_map(|i| u32::try_from(i).ok())
        .collect())
}

/// A loaded LLaVA / LLaVA-NeXT checkpoint on one backend.
pub struct LlavaRunner<B: Backend> {
    model: LlavaModel<B>,
    kind: BackendKind,
    stop_tokens: Vec<u32>,
}

impl<B: Backend> LlavaRunner<B> {
    /// Loads a checkpoint folder (`config.json`, safetensors, and `generation_config.json`'s EOS
    /// ids when present) as `variant`.
    pub fn load_dir(
        dir: &Path,
        variant: LlavaVariant,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Self> {
        let config = LlavaConfig::from_file_as(&dir.join("config.json"), variant)?;
        let weights = ipfs_accelerate_io::open_weights(dir)?;
        let mut runner = Self::load(weights, &config, device, kind)?;
        runner.stop_tokens = stop_tokens(dir, &config)?;
        Ok(runner)
    }

    /// Loads HF-named weights (either layout) from `source` onto `device`.
    pub fn load(
        source: Arc<dyn TensorSource>,
        config: &LlavaConfig,
        device: &B::Device,
        kind: BackendKind,
    ) -> Result<Self> {
        Ok(LlavaRunner {
            model: LlavaModel::load(source, config, device)?,
            kind,
            stop_tokens: config.text_config.eos_token_ids(),
        })
    }

    /// The model.
    pub fn model(&self) -> &LlavaModel<B> {
        &self.model
    }

    /// The configuration.
    pub fn config(&self) -> &LlavaConfig {
        self.model.config()
    }

    /// Image tokens one image of original `(height, width)` takes in the prompt (LLaVA-1.5:
    /// the same for every image; LLaVA-NeXT: depends on the size through the anyres grid).
    pub fn image_token_count(&self, image_size: (usize, usize)) -> Result<usize> {
        self.config().image_feature_count(image_size)
    }

    /// [`LlavaConfig::expand_image_tokens`].
    pub fn expand_image_tokens(
        &self,
        prompt: &[u32],
        image_sizes: &[(usize, usize)],
    ) -> Result<Vec<u32>> {
        self.config().expand_image_tokens(prompt, image_sizes)
    }

    /// Generation defaults of this checkpoint: greedy, stopping at its EOS token(s).
    pub fn default_generation_config(&self) -> GenerationConfig {
        GenerationConfig {
            stop_tokens: self.stop_tokens.clone(),
            ..GenerationConfig::default()
        }
    }

    /// Describes images: generates a continuation of `prompt` (already expanded, see
    /// [`expand_image_tokens`](Self::expand_image_tokens)) for `pixel_values` (and, for
    /// LLaVA-NeXT, `image_sizes`) with the KV cache; `on_token` sees every token as soon as it is
    /// chosen and may stop with `ControlFlow::Break`. Returns the new tokens.
    pub fn generate(
        &self,
        pixel_values: &HostTensor,
        image_sizes: Option<&HostTensor>,
        prompt: &[u32],
        config: &GenerationConfig,
        mut on_token: impl FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>> {
        let features = self.model.image_features(pixel_values, image_sizes)?;
        let mut out = self.generate_from_features(
            &features,
            &[prompt.to_vec()],
            config,
            DecodeMode::Cached,
            |_, t| on_token(t),
        )?;
        Ok(out.pop().unwrap_or_default())
    }

    /// Generates for a batch of prompts (left-padded) whose image tokens, in row order, take the
    /// images' features in order; `mode` picks KV-cache decoding or full recompute per step.
    pub fn generate_with(
        &self,
        pixel_values: Option<&HostTensor>,
        image_sizes: Option<&HostTensor>,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
        mode: DecodeMode,
        on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        let features = match pixel_values {
            Some(p) => self.model.image_features(p, image_sizes)?,
            None => Vec::new(),
        };
        self.generate_from_features(&features, prompts, config, mode, on_token)
    }

    fn generate_from_features(
        &self,
        features: &[Tensor<B, 2>],
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
        mode: DecodeMode,
        on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        let mut decoder = LlamaDecoder::new(self.model.text(), prompts, mode)?;
        let (ids, mask) = decoder.prompt_ids();
        let batch = prompts.len();
        let seq = ids.len() / batch.max(1);
        let tokens = PromptTokens {
            ids: &ids,
            batch,
            seq,
            mask: Some(&mask),
        };
        let embeds = self.model.embed(tokens, features)?;
        decoder.set_prompt_embeds(embeds)?;
        generate(&mut decoder, prompts, config, on_token)
    }
}

impl<B: Backend> ModelRunner for LlavaRunner<B> {
    fn family(&self) -> &str {
        self.config().variant.name()
    }

    fn backend(&self) -> BackendKind {
        self.kind
    }

    /// Greedy tokens after the one row of `input_ids` and its images (no stop token): the
    /// benchmark's generation.
    fn generate_ids(
        &self,
        inputs: &TensorMap,
        max_new_tokens: usize,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>> {
        let vocab = self.config().text_config.vocab_size;
        generate_ids_with(
            inputs,
            vocab,
            max_new_tokens,
            |pixels, sizes, prompt, config| {
                self.generate_with(pixels, sizes, prompt, config, DecodeMode::Cached, |_, t| {
                    on_token(t)
                })
            },
        )
    }

    /// See [`run_llava`].
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        run_llava(
            inputs,
            self.config().text_config.vocab_size,
            |pixels, sizes| {
                let features = self.model.image_features(pixels, sizes)?;
                let counts = features.iter().map(|f| f.dims()[0]).collect();
                Ok((features, counts))
            },
            |tokens, features| float_to_host(self.model.forward(tokens, features)?),
            |prompts, config, features| {
                self.generate_from_features(
                    features,
                    prompts,
                    config,
                    DecodeMode::Recompute,
                    |_, _| ControlFlow::Continue(()),
                )
            },
        )
    }
}

/// The `run` of every LLaVA executor (`ModelRunner::run`): `input_ids` `[batch, seq]` (+
/// `attention_mask`, `pixel_values`, and `image_sizes` for LLaVA-NeXT) → `logits` `[batch, seq,
/// vocab]` through `logits`, and with pixels `image_feature_count` `[images]` (`features` gives
/// the images' features and their row counts); with `greedy_steps` also `greedy_tokens`
/// `[batch, steps]` through `decode`, which runs the rows (left padding stripped by the mask)
/// under a greedy [`GenerationConfig`] of that many new tokens.
pub fn run_llava<F: Default>(
    inputs: &TensorMap,
    vocab: usize,
    features: impl FnOnce(&HostTensor, Option<&HostTensor>) -> Result<(F, Vec<usize>)>,
    logits: impl FnOnce(PromptTokens<'_>, &F) -> Result<HostTensor>,
    decode: impl FnOnce(&[Vec<u32>], &GenerationConfig, &F) -> Result<Vec<Vec<u32>>>,
) -> Result<TensorMap> {
    let (ids_t, [batch, seq], ids) = input_ids(inputs)?;
    check_vocab("input_ids", &ids, vocab)?;
    let mask = same_shape_ids(inputs, "attention_mask", ids_t)?;
    let tokens = PromptTokens {
        ids: &ids,
        batch,
        seq,
        mask: mask.as_deref(),
    };
    let (features, counts) = match inputs.get("pixel_values") {
        Some(p) => features(p, inputs.get("image_sizes"))?,
        None => (F::default(), Vec::new()),
    };
    let mut map = TensorMap::new();
    map.insert("logits".into(), logits(tokens, &features)?);
    if !counts.is_empty() {
        let counts: Vec<i64> = counts.iter().map(|&c| c as i64).collect();
        map.insert(
            "image_feature_count".into(),
            HostTensor::from_i64(vec![counts.len()], &counts)?,
        );
    }
    if inputs.contains_key("greedy_steps") {
        let steps = greedy_steps(inputs)?;
        let prompts = prompt_rows(tokens)?;
        let greedy = greedy_tokens(&prompts, steps, |prompts, config| {
            decode(prompts, config, &features)
        })?;
        map.insert("greedy_tokens".into(), greedy);
    }
    Ok(map)
}

/// `ModelRunner::generate_ids` of every LLaVA executor: `max_new_tokens` greedy tokens (no stop
/// token) after the one row of `input_ids` and its images, through `generate(pixel_values,
/// image_sizes, prompts, config)`.
pub fn generate_ids_with(
    inputs: &TensorMap,
    vocab: usize,
    max_new_tokens: usize,
    generate: impl FnOnce(
        Option<&HostTensor>,
        Option<&HostTensor>,
        &[Vec<u32>],
        &GenerationConfig,
    ) -> Result<Vec<Vec<u32>>>,
) -> Result<Vec<u32>> {
    let prompt = single_prompt(inputs, vocab)?;
    let rows = generate(
        inputs.get("pixel_values"),
        inputs.get("image_sizes"),
        &[prompt],
        &GenerationConfig::exact_greedy(max_new_tokens),
    )?;
    ipfs_accelerate_nn::generate::single_row(rows)
}

/// The prompt of a one-row `input_ids` whose tokens are in `0..vocab` (what `generate_ids`
/// generates after).
fn single_prompt(inputs: &TensorMap, vocab: usize) -> Result<Vec<u32>> {
    let (_, [rows, _], ids) = input_ids(inputs)?;
    if rows != 1 {
        return Err(Error::InvalidInput(format!(
            "generation takes one row of input_ids, got {rows}"
        )));
    }
    check_vocab("input_ids", &ids, vocab)?;
    Ok(ids.iter().map(|&t| t as u32).collect())
}

/// Each row of `tokens` without its left padding (zeros of the mask before the tokens; a zero
/// after a token is an error).
fn prompt_rows(tokens: PromptTokens<'_>) -> Result<Vec<Vec<u32>>> {
    let seq = tokens.seq;
    let mut prompts = Vec::with_capacity(tokens.batch);
    for (r, row) in tokens.ids.chunks(seq.max(1)).enumerate() {
        let start = match tokens.mask {
            None => 0,
            Some(m) => {
                let m = &m[r * seq..(r + 1) * seq];
                let first = m.iter().position(|&v| v != 0).unwrap_or(seq);
                if m[first..].contains(&0) {
                    return Err(Error::InvalidInput(
                        "generation takes left padding only (zeros before the tokens)".into(),
                    ));
                }
                first
            }
        };
        prompts.push(row[start..].iter().map(|&t| t as u32).collect());
    }
    Ok(prompts)
}

/// The input `input_ids` `[batch, seq]`: the tensor, its shape and its values.
fn input_ids(inputs: &TensorMap) -> Result<(&HostTensor, [usize; 2], Vec<i64>)> {
    let ids = inputs
        .get("input_ids")
        .ok_or_else(|| Error::InvalidInput("missing input `input_ids`".into()))?;
    let shape = token_matrix("input_ids", ids)?;
    Ok((ids, shape, ids.to_i64_vec()?))
}

/// The object-safe image-to-text interface of a loaded LLaVA / LLaVA-NeXT, whatever backend it
/// runs on (what a CLI or pipeline holds).
pub trait LlavaTasks: ModelRunner {
    /// The configuration.
    fn config(&self) -> &LlavaConfig;
    /// Greedy decoding stopping at the checkpoint's EOS token(s).
    fn default_generation_config(&self) -> GenerationConfig;
    /// Image tokens an image of original `(height, width)` takes in the prompt.
    fn image_token_count(&self, image_size: (usize, usize)) -> Result<usize> {
        self.config().image_feature_count(image_size)
    }
    /// Each image placeholder of `prompt` expanded for the image of that size (in order).
    fn expand_image_tokens(
        &self,
        prompt: &[u32],
        image_sizes: &[(usize, usize)],
    ) -> Result<Vec<u32>> {
        self.config().expand_image_tokens(prompt, image_sizes)
    }
    /// New tokens after `inputs` (KV cache), streamed through `on_token`.
    fn generate(
        &self,
        inputs: &LlavaInputs,
        config: &GenerationConfig,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>>;
}

impl<B: Backend> LlavaTasks for LlavaRunner<B> {
    fn config(&self) -> &LlavaConfig {
        self.model.config()
    }

    fn default_generation_config(&self) -> GenerationConfig {
        LlavaRunner::default_generation_config(self)
    }

    fn generate(
        &self,
        inputs: &LlavaInputs,
        config: &GenerationConfig,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>> {
        let mut out = self.generate_with(
            inputs.pixel_values.as_ref(),
            inputs.image_sizes.as_ref(),
            std::slice::from_ref(&inputs.input_ids),
            config,
            DecodeMode::Cached,
            |_, t| on_token(t),
        )?;
        Ok(out.pop().unwrap_or_default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_expand_in_order() {
        assert_eq!(
            expand_image_tokens(&[1, 9, 5, 9, 2], 9, &[2, 3]).unwrap(),
            vec![1, 9, 9, 5, 9, 9, 9, 2]
        );
        assert!(expand_image_tokens(&[1, 9, 5], 9, &[2, 3]).is_err());
        assert!(expand_image_tokens(&[1, 5], 9, &[2]).is_err());
        assert_eq!(expand_image_tokens(&[1, 5], 9, &[]).unwrap(), vec![1, 5]);
    }
}
