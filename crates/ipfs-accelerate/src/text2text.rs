//! Text-to-text generation with T5 / FLAN-T5 (translation, summarisation, instructions).
//!
//! ```no_run
//! use ipfs_accelerate::text2text::Text2Text;
//! use ipfs_accelerate::LoadOptions;
//!
//! # fn main() -> ipfs_accelerate::Result<()> {
//! let t5 = Text2Text::load("google/flan-t5-small", &LoadOptions::default())?;
//! let out = t5.generate(&["translate English to German: How old are you?"], 32)?;
//! println!("{}", out.value[0]);
//! # Ok(())
//! # }
//! ```

use ipfs_accelerate_nn::generate::{GenerationConfig, Sampling};
use ipfs_accelerate_t5::{T5Runner, T5Tasks};

use crate::loaded::{task_type, LoadOptions, Loaded};
use crate::{Error, Output, Result};

/// Loads a T5 checkpoint folder: on `cuda` both stacks on the cuBLAS decoder engine when it can
/// take the checkpoint (the reason is logged when not), else on burn.
pub(crate) struct LoadT5 {
    pub(crate) dir: std::path::PathBuf,
    pub(crate) options: LoadOptions,
}

impl crate::backends::WithBackend for LoadT5 {
    type Output = Box<dyn T5Tasks>;

    fn run<H: ipfs_accelerate_core::Backend>(self, hal: &H) -> Result<Self::Output> {
        Ok(Box::new(T5Runner::<H::Burn>::from_dir(
            &self.dir,
            &hal.device(),
            hal.kind(),
        )?))
    }

    fn without_device(
        self,
        kind: ipfs_accelerate_core::BackendKind,
    ) -> std::result::Result<Result<Self::Output>, Self> {
        #[cfg(feature = "cuda")]
        if let Some(model) =
            crate::backends::cublas_engines(kind, "t5", &self.dir, "using CubeCL", || {
                crate::cuda_t5::CudaT5::load(&self.dir, &self.options)
            })
        {
            return Ok(Ok(Box::new(model)));
        }
        // Without the cuda feature the options only matter to burn's loader.
        let _ = (kind, &self.options);
        Err(self)
    }
}

task_type!(
    /// A loaded T5 checkpoint with its tokenizer.
    Text2Text => T5Tasks {}
);

impl Text2Text {
    /// Loads `model` (it needs `tokenizer.json`) on the first usable backend.
    pub fn load(model: &str, options: &LoadOptions) -> Result<Self> {
        let inner = Loaded::load(model, options, &["tokenizer.json"], |dir| LoadT5 {
            dir,
            options: options.clone(),
        })?;
        if !inner.dir.join("tokenizer.json").is_file() {
            return Err(Error::Unsupported(format!(
                "{model} has no tokenizer.json: text-to-text needs one"
            )));
        }
        Ok(Text2Text { inner })
    }

    /// The generation settings [`generate`](Self::generate) uses: greedy, stopping at the
    /// checkpoint's end-of-sequence token.
    pub fn generation_config(&self, max_new_tokens: usize) -> GenerationConfig {
        GenerationConfig {
            max_new_tokens,
            sampling: Sampling::Greedy,
            stop_tokens: self.inner.model.config().eos_token_ids.clone(),
            ..Default::default()
        }
    }

    /// Greedy text-to-text generation of up to `max_new_tokens` tokens per input.
    pub fn generate(&self, texts: &[&str], max_new_tokens: usize) -> Result<Output<Vec<String>>> {
        self.generate_with(texts, &self.generation_config(max_new_tokens))
    }

    /// Generation with explicit settings (sampling, repetition penalty, stop tokens).
    pub fn generate_with(
        &self,
        texts: &[&str],
        config: &GenerationConfig,
    ) -> Result<Output<Vec<String>>> {
        self.inner.timed(
            texts.len(),
            || Ok(()),
            |m, ()| Ok(m.generate_text(texts, config)?),
            Ok,
        )
    }
}
