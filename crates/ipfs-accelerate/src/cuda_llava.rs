//! LLaVA / LLaVA-NeXT wholly on the cuBLAS engines: the CLIP tower read at its feature layer with
//! the projector as its head ([`ipfs_accelerate_llava::tower_spec`]) on the encoder engine, the
//! language model on the decoder engine ([`CudaDecoder`]) whose prefill takes the image features
//! at the image tokens in place of their token embeddings; then the decoding steps of any text
//! generation on it (device-resident KV cache, graph-replayed steps, picks on the device). The
//! host steps between the two (feature selection, LLaVA-NeXT's packing, the image slots) are the
//! llava crate's, as on every executor.

use std::ops::ControlFlow;
use std::path::Path;

use ipfs_accelerate_core::{BackendKind, Error, HostTensor, ModelRunner, Result, TensorMap};
use ipfs_accelerate_llava::{
    generate_ids_with, image_features_with, image_slots, run_llava, ImageFeatures, LlavaConfig,
    LlavaInputs, LlavaTasks, LlavaVariant, PromptTokens,
};
use ipfs_accelerate_nn::generate::{generate, GenerationConfig};

use crate::cuda_decoder::CudaDecoder;
use crate::cuda_tokens::Replacement;

/// A LLaVA checkpoint on the cuBLAS encoder and decoder engines.
pub(crate) struct CudaLlava {
    tower: Box<dyn ModelRunner>,
    text: CudaDecoder,
    config: LlavaConfig,
    newline: Option<Vec<f32>>,
    stop_tokens: Vec<u32>,
}

impl CudaLlava {
    /// Loads the checkpoint folder `dir` as `variant` on both engines in `options`' precision;
    /// why not, as a sentence, when either cannot take it (switched off, a missing library, no
    /// device, quantized weights asked for, several feature layers).
    pub(crate) fn load(
        dir: &Path,
        variant: LlavaVariant,
        options: &crate::LoadOptions,
    ) -> std::result::Result<Self, String> {
        crate::cuda_tokens::float_engine_allowed(options)?;
        let read = || -> Result<_> {
            let config = LlavaConfig::from_file_as(&dir.join("config.json"), variant)?;
            let weights = ipfs_accelerate_io::open_weights(dir)?;
            let tower = ipfs_accelerate_llava::tower_spec(&config, weights.clone())?;
            let text = ipfs_accelerate_llava::text_spec(&config, weights.clone())?;
            let newline = ipfs_accelerate_llava::image_newline(&config, weights)?;
            let stop_tokens = ipfs_accelerate_llava::stop_tokens(dir, &config)?;
            Ok((config, tower, text, newline, stop_tokens))
        };
        let (config, tower, text, newline, stop_tokens) = read().map_err(|e| e.to_string())?;
        let tower = crate::backends::cublas_encoder_for(BackendKind::Cuda, options, || Ok(tower))?;
        let text = CudaDecoder::load(&text, &config.text_config, None, options.precision)?;
        Ok(CudaLlava {
            tower,
            text,
            config,
            newline,
            stop_tokens,
        })
    }

    /// The images' features (see [`ipfs_accelerate_llava::image_features_with`]), the views
    /// through the encoder engine.
    fn features(&self, pixels: &HostTensor, sizes: Option<&HostTensor>) -> Result<ImageFeatures> {
        image_features_with(
            &self.config,
            self.newline.as_deref(),
            pixels,
            sizes,
            |views| {
                let mut inputs = TensorMap::new();
                inputs.insert("pixel_values".into(), views.clone());
                self.tower.run(&inputs)?.remove("logits").ok_or_else(|| {
                    Error::Compute("the encoder engine returned no projected features".into())
                })
            },
        )
    }

    /// The features in the columns of `ids` (row-major, padding where `mask` is 0) that hold
    /// image tokens; none without images.
    fn replacement(
        &self,
        features: Option<&ImageFeatures>,
        ids: &[i64],
        mask: Option<&[i64]>,
    ) -> Result<Option<Replacement>> {
        let rows = features.map_or(0, |f| f.counts.iter().sum());
        let columns = image_slots(&self.config, ids, mask, rows)?;
        Ok(features.filter(|_| rows > 0).map(|f| Replacement {
            columns,
            values: f.values.clone(),
        }))
    }

    /// Logits `[batch, seq, vocab]` of every position of `tokens` with the features spliced in
    /// (HF's forward: positions `0..seq` per row).
    fn logits(
        &self,
        tokens: PromptTokens<'_>,
        features: Option<&ImageFeatures>,
    ) -> Result<HostTensor> {
        let (batch, seq) = (tokens.batch, tokens.seq);
        let engine = self.text.engine();
        let session = engine.session(batch, seq)?;
        let replaced = self.replacement(features, tokens.ids, tokens.mask)?;
        let positions: Vec<i64> = (0..batch).flat_map(|_| 0..seq as i64).collect();
        crate::cuda_tokens::logits_of_every(
            session,
            (batch, seq, engine.vocab()),
            tokens.ids,
            (Some(&positions), tokens.mask),
            replaced.as_ref(),
        )
    }

    /// Rows generated after `prompts` (left-padded into one batch) whose image tokens, in row
    /// order, take `features` in order.
    fn generate_rows(
        &self,
        features: Option<&ImageFeatures>,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
        on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        let mut decoder =
            self.text
                .decoder_replacing(prompts, config.max_new_tokens, |ids, mask| {
                    self.replacement(features, ids, Some(mask))
                })?;
        generate(&mut decoder, prompts, config, on_token)
    }

    /// [`CudaLlava::generate_rows`] of the images in `pixels` (none: no image).
    fn generate_with(
        &self,
        pixels: Option<&HostTensor>,
        sizes: Option<&HostTensor>,
        prompts: &[Vec<u32>],
        config: &GenerationConfig,
        mut on_token: impl FnMut(usize, u32) -> ControlFlow<()>,
    ) -> Result<Vec<Vec<u32>>> {
        let start = std::time::Instant::now();
        let features = pixels.map(|p| self.features(p, sizes)).transpose()?;
        let features = features.as_ref();
        // With the engines' per-stage profile, the wall time of the host's part too.
        if !ipfs_accelerate_backend_cublas::profile_requested() {
            return self.generate_rows(features, prompts, config, on_token);
        }
        // The wall time of the image features and of the first token after them.
        let ready = start.elapsed();
        let mut first = None;
        let rows = self.generate_rows(features, prompts, config, |row, token| {
            first.get_or_insert_with(|| start.elapsed() - ready);
            on_token(row, token)
        })?;
        eprintln!(
            "cublas llava: image features {:.3} ms (tower and host steps), then the first token \
             {:.3} ms",
            ready.as_secs_f64() * 1e3,
            first.unwrap_or_default().as_secs_f64() * 1e3
        );
        Ok(rows)
    }
}

impl ModelRunner for CudaLlava {
    fn family(&self) -> &str {
        self.config.variant.name()
    }

    fn backend(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn engine(&self) -> Option<&str> {
        Some("cublas")
    }

    /// The peak of the device's memory pool (both engines allocate from it).
    fn device_memory_in_use(&self) -> Option<u64> {
        self.text.device_memory_in_use()
    }

    /// See [`run_llava`]; the greedy tokens decode with the KV cache (the same tokens as
    /// recomputing).
    fn run(&self, inputs: &TensorMap) -> Result<TensorMap> {
        run_llava(
            inputs,
            self.config.text_config.vocab_size,
            |pixels, sizes| {
                let features = self.features(pixels, sizes)?;
                let counts = features.counts.clone();
                Ok((Some(features), counts))
            },
            |tokens, features| self.logits(tokens, features.as_ref()),
            |prompts, config, features| {
                let features = features.as_ref();
                self.generate_rows(features, prompts, config, |_, _| ControlFlow::Continue(()))
            },
        )
    }

    /// Greedy tokens after the one row of `input_ids` and its images (no stop token): the
    /// benchmark's generation.
    fn generate_ids(
        &self,
        inputs: &TensorMap,
        max_new_tokens: usize,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>> {
        let vocab = self.config.text_config.vocab_size;
        generate_ids_with(
            inputs,
            vocab,
            max_new_tokens,
            |pixels, sizes, prompt, config| {
                self.generate_with(pixels, sizes, prompt, config, |_, t| on_token(t))
            },
        )
    }
}

impl LlavaTasks for CudaLlava {
    fn config(&self) -> &LlavaConfig {
        &self.config
    }

    fn default_generation_config(&self) -> GenerationConfig {
        GenerationConfig {
            stop_tokens: self.stop_tokens.clone(),
            ..GenerationConfig::default()
        }
    }

    fn generate(
        &self,
        inputs: &LlavaInputs,
        config: &GenerationConfig,
        on_token: &mut dyn FnMut(u32) -> ControlFlow<()>,
    ) -> Result<Vec<u32>> {
        let rows = self.generate_with(
            inputs.pixel_values.as_ref(),
            inputs.image_sizes.as_ref(),
            std::slice::from_ref(&inputs.input_ids),
            config,
            |_, t| on_token(t),
        )?;
        ipfs_accelerate_nn::generate::single_row(rows)
    }
}
