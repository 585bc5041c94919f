//! Text generation with the decoder LMs (LLaMA, Qwen2): from an HF checkpoint folder / hub id or a
//! llama.cpp `.gguf` file, on the first usable backend, with the tokenizer (tokenizer.json or the
//! GGUF's own vocabulary), the chat template, streaming and tokens/s metrics.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipfs_accelerate_core::{BackendKind, Metrics, Precision, Selection, Stopwatch};
use ipfs_accelerate_io::{gguf::GgufFile, ResolveOptions};
use ipfs_accelerate_llama::{Architecture, LlamaConfig, LlamaRunner};

pub use ipfs_accelerate_llama::TextGeneration;
pub use ipfs_accelerate_nn::generate::{GenerationConfig, RowRequest, Sampling};
pub use ipfs_accelerate_nn::WeightQuantization;

use crate::backends::{load_on_first_usable, resolve_preferences, WithBackend};
use crate::{Error, Output, Result};

/// Options of one [`TextGenerator::generate`] call.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateOptions {
    /// Tokens to generate at most.
    pub max_new_tokens: usize,
    /// Greedy (default) or sampling.
    pub sampling: Sampling,
    /// HF's repetition penalty (1.0 = off).
    pub repetition_penalty: f32,
    /// Sampling seed.
    pub seed: u64,
    /// Wrap the prompt as a user message with the checkpoint's chat template.
    pub chat: bool,
    /// Stop at the checkpoint's end-of-sequence token(s) (default on).
    pub stop_at_eos: bool,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 64,
            sampling: Sampling::Greedy,
            repetition_penalty: 1.0,
            seed: 0,
            chat: false,
            stop_at_eos: true,
        }
    }
}

/// One message of a chat ([`TextGenerator::apply_chat_messages`]).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant` (whatever the template knows).
    pub role: String,
    /// The message text.
    pub content: String,
}

/// The result of a generation.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Generated {
    /// The generated text (without the prompt).
    pub text: String,
    /// The prompt's token ids (after the chat template, with special tokens).
    pub prompt_ids: Vec<u32>,
    /// The generated token ids.
    pub token_ids: Vec<u32>,
    /// Prompt tokens per second (time to the first generated token).
    pub prefill_tokens_per_s: f64,
    /// Generated tokens per second after the first.
    pub decode_tokens_per_s: f64,
}

/// A loaded decoder LM with its tokenizer.
pub struct TextGenerator {
    model: Box<dyn TextGeneration>,
    tokenizer: tokenizers::Tokenizer,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    selection: Selection,
    init: Duration,
    name: String,
}

struct LoadLlama<'a> {
    source: &'a LoadSource,
    /// What the cuBLAS decoder is asked for (burn's path gets them from the load scope).
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    precision: Precision,
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    quantization: WeightQuantization,
}

enum LoadSource {
    Gguf(PathBuf),
    Dir {
        weights: std::sync::Arc<dyn ipfs_accelerate_core::TensorSource>,
        config: Box<LlamaConfig>,
    },
}

impl WithBackend for LoadLlama<'_> {
    type Output = Box<dyn TextGeneration>;

    fn run<H: ipfs_accelerate_core::Backend>(self, hal: &H) -> Result<Self::Output> {
        Ok(match self.source {
            LoadSource::Gguf(path) => Box::new(LlamaRunner::<H::Burn>::from_gguf(
                path,
                &hal.device(),
                hal.kind(),
            )?),
            LoadSource::Dir { weights, config } => Box::new(LlamaRunner::<H::Burn>::load(
                weights.clone(),
                config,
                &hal.device(),
                hal.kind(),
            )?),
        })
    }

    fn without_device(self, kind: BackendKind) -> std::result::Result<Result<Self::Output>, Self> {
        #[cfg(feature = "cuda")]
        if kind == BackendKind::Cuda {
            return match self.on_cuda_decoder() {
                Ok(model) => Ok(Ok(model)),
                Err(reason) if self.precision != Precision::F32 => {
                    Ok(Err(Error::Unsupported(format!(
                        "{} generation on cuda runs on the cuBLAS decoder, which cannot take \
                         this model: {reason}",
                        self.precision
                    ))))
                }
                Err(reason) => {
                    tracing::info!(
                        "the cuBLAS decoder does not run it ({reason}); burn's CubeCL kernels \
                         do (f32)"
                    );
                    Err(self)
                }
            };
        }
        let _ = kind;
        Err(self)
    }
}

impl LoadLlama<'_> {
    /// The model on the cuBLAS engine's decoder, or why not.
    #[cfg(feature = "cuda")]
    fn on_cuda_decoder(&self) -> std::result::Result<Box<dyn TextGeneration>, String> {
        // The decoder's int8 / int4 are ggml's Q8_0 / Q4_0 (blocks of 32 weights, an f16 scale
        // each), quantized here from the float weights; the GEMV dequantizes them in registers.
        let blocks = match self.quantization {
            WeightQuantization::None => None,
            WeightQuantization::Int8 { .. } => Some(ipfs_accelerate_nn::spec::BlockType::Q8_0),
            WeightQuantization::Int4 { .. } => Some(ipfs_accelerate_nn::spec::BlockType::Q4_0),
        };
        let (mut spec, config, template) = match self.source {
            LoadSource::Gguf(path) => {
                let file = std::sync::Arc::new(GgufFile::open(path).map_err(|e| e.to_string())?);
                let config = LlamaConfig::from_gguf(&file).map_err(|e| e.to_string())?;
                let weights = ipfs_accelerate_llama::GgufWeights::new(file.clone(), &config);
                let spec = ipfs_accelerate_llama::decoder_spec_keeping_blocks(
                    &config,
                    &weights,
                    &ipfs_accelerate_backend_cublas::DecoderEngine::reads_ggml_type,
                )
                .map_err(|e| e.to_string())?;
                (spec, config, file.chat_template().map(str::to_string))
            }
            LoadSource::Dir { weights, config } => {
                let spec = ipfs_accelerate_llama::decoder_spec_keeping_blocks(
                    config,
                    weights.as_ref(),
                    &ipfs_accelerate_backend_cublas::DecoderEngine::reads_ggml_type,
                )
                .map_err(|e| e.to_string())?;
                (spec, (**config).clone(), None)
            }
        };
        if let Some(ty) = blocks {
            tracing::info!(
                "{:?} on the cuBLAS decoder: ggml {} blocks of 32 weights",
                self.quantization,
                ty.name()
            );
            ipfs_accelerate_nn::spec::map_decoder_layers(&mut spec, |d| {
                ipfs_accelerate_nn::spec::quantize_dense(d, ty)
            })
            .map_err(|e| e.to_string())?;
        }
        let model =
            crate::cuda_decoder::CudaDecoder::load(&spec, &config, template, self.precision)?;
        Ok(Box::new(model))
    }
}

/// Loads a decoder LM at the token level, without its tokenizer (benchmarks and token-id
/// callers): `model` is a llama.cpp `.gguf` file or a local checkpoint folder (config.json with
/// safetensors, or with [`ipfs_accelerate_io::RANDOM_INIT_FILE`] for random weights of the
/// config), loaded on `backend` (f32 compute; GGUF blocks stay quantized; a
/// [`crate::weights::load_scope`] around the call applies `--quantize`).
///
/// ```no_run
/// use ipfs_accelerate::text::{load_decoder, GenerationConfig};
/// use ipfs_accelerate::{BackendKind, Precision};
///
/// # fn main() -> ipfs_accelerate::Result<()> {
/// let model = load_decoder("model.gguf".as_ref(), BackendKind::Cpu, Precision::F32)?;
/// let config = GenerationConfig {
///     max_new_tokens: 16,
///     ..model.default_generation_config()
/// };
/// let tokens = model.generate(&[1, 2, 3], &config, &mut |_| std::ops::ControlFlow::Continue(()))?;
/// println!("{tokens:?}");
/// # Ok(())
/// # }
/// ```
pub fn load_decoder(
    model: &Path,
    backend: BackendKind,
    precision: Precision,
) -> Result<Box<dyn TextGeneration>> {
    load_decoder_quantized(model, backend, precision, WeightQuantization::None)
}

/// [`load_decoder`] with the linear weights kept quantized on the cuBLAS decoder of `cuda`
/// (int8 / int4 as ggml's Q8_0 / Q4_0 blocks, dequantized in registers by its kernels). Other
/// backends quantize through [`crate::weights::load_scope`] or
/// [`TextGeneration::quantize`] after the load, as before; `quantization` is ignored there.
pub fn load_decoder_quantized(
    model: &Path,
    backend: BackendKind,
    precision: Precision,
    quantization: WeightQuantization,
) -> Result<Box<dyn TextGeneration>> {
    check_precision(precision, &[backend])?;
    let source = if model.is_file() {
        LoadSource::Gguf(model.to_path_buf())
    } else {
        let config = LlamaConfig::from_file(&model.join("config.json"), Architecture::Llama)?;
        LoadSource::Dir {
            weights: ipfs_accelerate_io::open_weights(model)?,
            config: Box::new(config),
        }
    };
    let preferences = resolve_preferences(Some(vec![backend]), false)?;
    let (model, _) = load_on_first_usable(&preferences, precision, || LoadLlama {
        source: &source,
        precision,
        quantization,
    })?;
    Ok(model)
}

/// Generation computes in f32, with bf16 linear weights on the CPU (`--precision bf16`: the
/// AVX-512 BF16 kernels; a GGUF's blocks stay as they are), or in f16 on the cuBLAS decoder of
/// `cuda`.
fn check_precision(precision: Precision, preferences: &[BackendKind]) -> Result<()> {
    let only = |kind: BackendKind| preferences.iter().all(|k| *k == kind);
    match precision {
        Precision::F32 => Ok(()),
        Precision::BF16 if only(BackendKind::Cpu) => Ok(()),
        Precision::F16 if cfg!(feature = "cuda") && only(BackendKind::Cuda) => Ok(()),
        other => Err(Error::Unsupported(format!(
            "generation computes in f32, bf16 on the cpu backend alone or f16 on cuda alone \
             (asked: {other} on {})",
            preferences
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(",")
        ))),
    }
}

fn tokenizer_err(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Core(ipfs_accelerate_core::Error::InvalidInput(format!(
        "{what}: {e}"
    )))
}

impl TextGenerator {
    /// Loads `model` — a `.gguf` file, a checkpoint folder or a hub id — with `options` as every
    /// task type takes them: the first usable of `options.backends` (`None`: the default
    /// preferences, `IPFS_ACCELERATE_BACKENDS` honoured), `offline`, and `quantization` applied
    /// while loading (each linear weight goes from the file to int8 / int4 blocks as it is read,
    /// never a whole f32 copy of the model). Generation computes in f32, or with bf16 linear
    /// weights on the cpu backend (`Precision::BF16` with `backends: [Cpu]`); another precision
    /// is an [`Error::Unsupported`].
    ///
    /// ```no_run
    /// use ipfs_accelerate::text::{GenerateOptions, TextGenerator};
    /// use ipfs_accelerate::LoadOptions;
    ///
    /// # fn main() -> ipfs_accelerate::Result<()> {
    /// let generator = TextGenerator::load("SmolLM2-135M-Instruct.Q4_1.gguf", &LoadOptions::default())?;
    /// let out = generator.generate("The capital of France is", &GenerateOptions::default(), |t| print!("{t}"))?;
    /// println!("\n{:.1} tokens/s", out.value.decode_tokens_per_s);
    /// # Ok(())
    /// # }
    /// ```
    pub fn load(model: &str, options: &crate::LoadOptions) -> Result<Self> {
        let (backends, offline) = (options.backends.clone(), options.offline);
        let mut clock = Stopwatch::start();
        let preferences = resolve_preferences(backends, true)?;
        check_precision(options.precision, &preferences)?;
        let path = Path::new(model);
        let (source, tokenizer, template, bos, eos) = if path.is_file()
            && path
                .extension()
                .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
        {
            let file = GgufFile::open(path)?;
            let tokenizer = file.tokenizer()?;
            let special = file.special_tokens();
            let name_of = |id: Option<u32>| id.and_then(|i| tokenizer.id_to_token(i));
            let (bos, eos) = (name_of(special.bos), name_of(special.eos));
            let template = file.chat_template().map(str::to_string);
            (
                LoadSource::Gguf(path.to_path_buf()),
                tokenizer,
                template,
                bos,
                eos,
            )
        } else {
            let files = ipfs_accelerate_io::resolve(
                &options.spec_with_revision(model),
                ResolveOptions {
                    offline,
                    ..Default::default()
                },
            )?;
            let config_path = files.get("config.json")?;
            let config = LlamaConfig::from_file(&config_path, Architecture::Llama)?;
            let tok_path = files.get("tokenizer.json")?;
            let tokenizer = tokenizers::Tokenizer::from_file(&tok_path)
                .map_err(|e| tokenizer_err(&tok_path.display().to_string(), e))?;
            let tok_config: Option<serde_json::Value> = files
                .get_optional("tokenizer_config.json")?
                .and_then(|p| std::fs::read_to_string(p).ok())
                .and_then(|t| serde_json::from_str(&t).ok());
            let field = |k: &str| {
                tok_config.as_ref().and_then(|c| {
                    c.get(k).and_then(|v| {
                        v.as_str().map(str::to_string).or_else(|| {
                            v.get("content")
                                .and_then(|c| c.as_str())
                                .map(str::to_string)
                        })
                    })
                })
            };
            let template = field("chat_template");
            let (bos, eos) = (field("bos_token"), field("eos_token"));
            let weights =
                ipfs_accelerate_io::WeightStore::open(&files.weight_files()?)?.into_source();
            (
                LoadSource::Dir {
                    weights,
                    config: Box::new(config),
                },
                tokenizer,
                template,
                bos,
                eos,
            )
        };
        // The load scope quantizes each linear weight as it is read (a GGUF's blocks through
        // f32 one tensor at a time).
        let ((model_box, _), selection) =
            load_on_first_usable(&preferences, options.precision, || crate::loaded::Scoped {
                work: LoadLlama {
                    source: &source,
                    precision: options.precision,
                    quantization: options.quantization,
                },
                quantization: options.quantization,
                share: options.share_weights,
            })?;
        Ok(TextGenerator {
            model: model_box,
            tokenizer,
            chat_template: template,
            bos_token: bos,
            eos_token: eos,
            selection,
            init: clock.lap(),
            name: model.to_string(),
        })
    }

    /// The backend it runs on and the preferences that were skipped.
    pub fn selection(&self) -> &Selection {
        &self.selection
    }

    /// The model's configuration.
    pub fn config(&self) -> &LlamaConfig {
        self.model.config()
    }

    /// Keeps the linear weights quantized in memory from now on (int8 / int4 blocks, re-quantized
    /// from a GGUF file's; embeddings and norms stay as loaded); returns the weight bytes before
    /// and after.
    pub fn quantize(
        &mut self,
        q: ipfs_accelerate_nn::WeightQuantization,
    ) -> Result<(usize, usize)> {
        let before = self.model.weight_bytes();
        self.model.quantize(q)?;
        Ok((before, self.model.weight_bytes()))
    }

    /// Bytes the model's weights take in memory (float, quantized or a GGUF file's blocks, as
    /// kept).
    pub fn weight_bytes(&self) -> usize {
        self.model.weight_bytes()
    }

    /// Bytes the model's weights take as f32 (the reference for [`weight_bytes`](Self::weight_bytes)).
    pub fn float_weight_bytes(&self) -> usize {
        self.model.float_weight_bytes()
    }

    /// The chat template, if the checkpoint has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// `prompt` as a single user message through the chat template (with the generation prompt).
    pub fn apply_chat_template(&self, prompt: &str) -> Result<String> {
        self.apply_chat_messages(&[ChatMessage {
            role: "user".into(),
            content: prompt.into(),
        }])
    }

    /// A conversation through the chat template, ending with the generation prompt (the
    /// assistant's turn), as HF's `apply_chat_template(messages, add_generation_prompt=True)`.
    pub fn apply_chat_messages(&self, messages: &[ChatMessage]) -> Result<String> {
        let template = self
            .chat_template
            .as_deref()
            .ok_or_else(|| Error::Unsupported(format!("{} has no chat template", self.name)))?;
        if messages.is_empty() {
            return Err(Error::Core(ipfs_accelerate_core::Error::InvalidInput(
                "a chat needs at least one message".into(),
            )));
        }
        let messages: Vec<minijinja::Value> = messages
            .iter()
            .map(|m| minijinja::context! { role => m.role, content => m.content })
            .collect();
        let ctx = minijinja::context! {
            messages => messages,
            add_generation_prompt => true,
            bos_token => self.bos_token.clone().unwrap_or_default(),
            eos_token => self.eos_token.clone().unwrap_or_default(),
        };
        ipfs_accelerate_preprocess::chat::render_chat_template(template, ctx)
            .map_err(|e| Error::Core(e.into()))
    }

    /// Token ids of `text` as the model sees them (with the tokenizer's special tokens).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        if text.is_empty() {
            return Err(Error::Core(ipfs_accelerate_core::Error::InvalidInput(
                "empty prompt".into(),
            )));
        }
        let enc = self
            .tokenizer
            .encode(text, true)
            .map_err(|e| tokenizer_err("tokenizing the prompt", e))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of token ids (special tokens dropped).
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.tokenizer
            .decode(ids, true)
            .map_err(|e| tokenizer_err("decoding tokens", e))
    }

    /// Generates a continuation of `prompt`; `on_text` receives the text as it grows (exactly the
    /// generated text, in pieces, ending on whole characters).
    pub fn generate(
        &self,
        prompt: &str,
        options: &GenerateOptions,
        mut on_text: impl FnMut(&str),
    ) -> Result<Output<Generated>> {
        self.generate_until(prompt, options, |piece| {
            on_text(piece);
            ControlFlow::Continue(())
        })
    }

    /// [`generate`](Self::generate) that `on_text` can stop: returning `ControlFlow::Break`
    /// ends the generation after the current token (a stop string seen, a client gone). The
    /// result holds what was generated up to there.
    pub fn generate_until(
        &self,
        prompt: &str,
        options: &GenerateOptions,
        mut on_text: impl FnMut(&str) -> ControlFlow<()>,
    ) -> Result<Output<Generated>> {
        let mut outputs = self.generate_many(&[(prompt, options)], |_, piece| on_text(piece))?;
        outputs
            .pop()
            .ok_or_else(|| Error::Core(ipfs_accelerate_core::Error::Compute("no output".into())))
    }

    /// Several requests decoded together as one batch (one forward per step for all of them, as
    /// a server batches concurrent requests), each with its own options: its prompt, limits and
    /// seeded sampler, so each gets the tokens it would get alone (up to the rounding of a
    /// batched product). `on_text(request, piece)` streams each request's text; its `Break`
    /// ends that request only. Outputs in request order; the first request that fails fails the
    /// call.
    pub fn generate_many(
        &self,
        requests: &[(&str, &GenerateOptions)],
        on_text: impl FnMut(usize, &str) -> ControlFlow<()>,
    ) -> Result<Vec<Output<Generated>>> {
        let mut outputs: Vec<Option<Result<Output<Generated>>>> =
            (0..requests.len()).map(|_| None).collect();
        let first = requests
            .iter()
            .map(|&(p, o)| (p.to_string(), o.clone()))
            .collect();
        self.generate_continuous(
            first,
            requests.len(),
            |_| Vec::new(),
            on_text,
            |i, out| outputs[i] = Some(out),
        )?;
        outputs
            .into_iter()
            .map(|o| {
                o.unwrap_or_else(|| {
                    Err(Error::Core(ipfs_accelerate_core::Error::Compute(
                        "a request ended without an output".into(),
                    )))
                })
            })
            .collect()
    }

    /// Whether requests can join a batch while it decodes (continuous batching on this
    /// executor; see [`generate_continuous`](Self::generate_continuous)).
    pub fn joins_running_batches(&self) -> bool {
        self.model.joins_running_batches()
    }

    /// The prompt's token ids and the sampler's configuration of one request, checked against
    /// the model's positions.
    fn prepare(
        &self,
        prompt: &str,
        options: &GenerateOptions,
    ) -> Result<(Vec<u32>, GenerationConfig)> {
        let max_positions = self.config().max_position_embeddings();
        let text = if options.chat {
            self.apply_chat_template(prompt)?
        } else {
            prompt.to_string()
        };
        let prompt_ids = self.encode(&text)?;
        if prompt_ids.len() + options.max_new_tokens > max_positions {
            return Err(Error::Core(ipfs_accelerate_core::Error::InvalidInput(
                format!(
                    "prompt of {} tokens + {} new tokens exceeds the model's {max_positions} \
                     positions",
                    prompt_ids.len(),
                    options.max_new_tokens
                ),
            )));
        }
        let mut config: GenerationConfig = self.model.default_generation_config();
        if !options.stop_at_eos {
            config.stop_tokens.clear();
        }
        config.max_new_tokens = options.max_new_tokens;
        config.sampling = options.sampling;
        config.repetition_penalty = options.repetition_penalty;
        config.seed = options.seed;
        Ok((prompt_ids, config))
    }

    /// Continuous batching: decodes `first` together and, between decoding steps, the requests
    /// `admit(free)` hands over (it should hand at most `free`; up to `max_rows` decode at
    /// once). A request joins the running batch as soon as it is admitted and leaves it when
    /// it ends, so a request that arrives mid-way does not wait for the batch to finish.
    /// Requests are numbered in arrival order (`first` are `0..first.len()`); `on_text(request,
    /// piece)` streams each one's text (its `Break` ends that request), and `on_done(request,
    /// output)` ends each — a request that fails (a prompt too long, bad options) fails alone.
    /// Each request gets the tokens it would get alone (up to the rounding of a batched
    /// product; on the cpu, bit for bit). On an executor that cannot change a running batch
    /// ([`joins_running_batches`](Self::joins_running_batches) false) `first` runs as one
    /// batch and `admit` is never called. `Err` is a failure of a whole
    /// decoding step: requests not yet ended get no `on_done`.
    ///
    /// ```no_run
    /// use std::ops::ControlFlow;
    /// use std::sync::mpsc;
    /// use ipfs_accelerate::text::{GenerateOptions, TextGenerator};
    /// use ipfs_accelerate::LoadOptions;
    ///
    /// # fn main() -> ipfs_accelerate::Result<()> {
    /// let generator = TextGenerator::load("SmolLM2-135M-Instruct.Q4_1.gguf", &LoadOptions::default())?;
    /// // Prompts that arrive while the first one decodes (another thread would send them).
    /// let (send, arrivals) = mpsc::channel::<String>();
    /// send.send("Water boils at".into()).unwrap();
    /// drop(send);
    /// let options = GenerateOptions { max_new_tokens: 24, ..Default::default() };
    /// generator.generate_continuous(
    ///     vec![("The capital of France is".into(), options.clone())],
    ///     8,
    ///     |free| arrivals.try_iter().take(free).map(|p| (p, options.clone())).collect(),
    ///     |request, piece| {
    ///         println!("request {request}: {piece:?}");
    ///         ControlFlow::Continue(())
    ///     },
    ///     |request, output| match output {
    ///         Ok(out) => println!("request {request} done: {}", out.value.text),
    ///         Err(e) => eprintln!("request {request} failed: {e}"),
    ///     },
    /// )?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn generate_continuous(
        &self,
        first: Vec<(String, GenerateOptions)>,
        max_rows: usize,
        mut admit: impl FnMut(usize) -> Vec<(String, GenerateOptions)>,
        on_text: impl FnMut(usize, &str) -> ControlFlow<()>,
        mut on_done: impl FnMut(usize, Result<Output<Generated>>),
    ) -> Result<()> {
        /// One request: its prompt and text so far.
        struct Stream {
            prompt_ids: Vec<u32>,
            generated: Vec<u32>,
            printed: usize,
            preprocess: Duration,
            admitted: std::time::Instant,
            first_token_at: Option<std::time::Instant>,
            last_token_at: Option<std::time::Instant>,
            stopped: bool,
            error: Option<String>,
        }
        let mut streams: Vec<Option<Stream>> = Vec::new();
        // The request number of each row request handed to the model, in order.
        let mut numbers: Vec<usize> = Vec::new();
        // Prepares `requests`, numbering them; those that fail end here.
        let take = |requests: Vec<(String, GenerateOptions)>,
                    streams: &mut Vec<Option<Stream>>,
                    numbers: &mut Vec<usize>,
                    on_done: &mut dyn FnMut(usize, Result<Output<Generated>>)|
         -> Vec<RowRequest> {
            let mut rows = Vec::with_capacity(requests.len());
            for (prompt, options) in requests {
                let id = streams.len();
                let clock = std::time::Instant::now();
                match self.prepare(&prompt, &options) {
                    Ok((prompt_ids, config)) => {
                        streams.push(Some(Stream {
                            prompt_ids: prompt_ids.clone(),
                            generated: Vec::new(),
                            printed: 0,
                            preprocess: clock.elapsed(),
                            admitted: std::time::Instant::now(),
                            first_token_at: None,
                            last_token_at: None,
                            stopped: false,
                            error: None,
                        }));
                        numbers.push(id);
                        rows.push(RowRequest {
                            prompt: prompt_ids,
                            config,
                        });
                    }
                    Err(e) => {
                        streams.push(None);
                        on_done(id, Err(e));
                    }
                }
            }
            rows
        };
        let first = take(first, &mut streams, &mut numbers, &mut on_done);
        let streams = std::cell::RefCell::new(streams);
        let numbers = std::cell::RefCell::new(numbers);
        let on_done = std::cell::RefCell::new(on_done);
        let on_text = std::cell::RefCell::new(on_text);
        let result = self.model.generate_continuous(
            first,
            max_rows.max(1),
            &mut |free| {
                let requests = admit(free);
                take(
                    requests,
                    &mut streams.borrow_mut(),
                    &mut numbers.borrow_mut(),
                    &mut *on_done.borrow_mut(),
                )
            },
            &mut |row, t| {
                let id = numbers.borrow()[row];
                let mut streams = streams.borrow_mut();
                let Some(st) = streams[id].as_mut() else {
                    return ControlFlow::Break(());
                };
                let now = std::time::Instant::now();
                st.last_token_at = Some(now);
                st.first_token_at.get_or_insert(now);
                st.generated.push(t);
                match self.tokenizer.decode(&st.generated, true) {
                    // Emit only complete characters: a byte-level token may end mid-character.
                    Ok(s) if !s.ends_with('\u{FFFD}') => {
                        if s.len() > st.printed && s.is_char_boundary(st.printed) {
                            let flow = (on_text.borrow_mut())(id, &s[st.printed..]);
                            st.printed = s.len();
                            if flow.is_break() {
                                st.stopped = true;
                                return ControlFlow::Break(());
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        st.error = Some(e.to_string());
                        st.stopped = true;
                        return ControlFlow::Break(());
                    }
                }
                ControlFlow::Continue(())
            },
            &mut |row, tokens| {
                let id = numbers.borrow()[row];
                let Some(st) = streams.borrow_mut()[id].take() else {
                    return;
                };
                let output = tokens.map_err(Error::from).and_then(|tokens| {
                    if let Some(e) = &st.error {
                        return Err(tokenizer_err("decoding tokens", e));
                    }
                    let text = self.decode(&tokens)?;
                    if !st.stopped && text.len() > st.printed && text.is_char_boundary(st.printed) {
                        let _ = (on_text.borrow_mut())(id, &text[st.printed..]);
                    }
                    let end = std::time::Instant::now();
                    let first = st.first_token_at.unwrap_or(end);
                    let to_first = first.duration_since(st.admitted);
                    let rest = tokens.len().saturating_sub(1);
                    let decode_tokens_per_s = match st.last_token_at {
                        Some(last) if rest > 0 => {
                            rest as f64 / last.duration_since(first).as_secs_f64().max(1e-9)
                        }
                        _ => 0.0,
                    };
                    let mut clock = Stopwatch::start();
                    let metrics = Metrics {
                        tokens: tokens.len(),
                        ..crate::loaded::call_metrics(
                            &self.selection,
                            self.init,
                            [st.preprocess, end.duration_since(st.admitted)],
                            &mut clock,
                            1,
                        )
                    };
                    Ok(Output {
                        value: Generated {
                            text,
                            prefill_tokens_per_s: st.prompt_ids.len() as f64
                                / to_first.as_secs_f64().max(1e-9),
                            prompt_ids: st.prompt_ids,
                            token_ids: tokens,
                            decode_tokens_per_s,
                        },
                        metrics,
                    })
                });
                (on_done.borrow_mut())(id, output);
            },
        );
        result.map_err(Error::from)
    }
}
