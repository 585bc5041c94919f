//! The `ipfs-accelerate` command line.

use std::path::PathBuf;
use std::process::ExitCode;

mod draw;
mod output;
mod serve;
mod tasks;

use anyhow::Context;
use clap::{Parser, Subcommand};
use ipfs_accelerate::{Availability, BackendKind, Metrics, Pipeline, Task};
use output::Native;

// Tensor buffers are large and short-lived: mimalloc reuses their pages, where glibc's malloc
// returns them to the OS and page-faults fresh zeroed ones on every op (~16% of a BERT forward).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Run HuggingFace models on the best hardware this machine has.
#[derive(Parser)]
#[command(name = "ipfs-accelerate", version, about, long_about = None)]
struct Cli {
    /// Model: a local directory, a hub id (org/name or org/name@revision), a `.gguf` file
    /// (generate), or `embedded` (the built-in int8 all-MiniLM-L6-v2, no network needed: the
    /// default of embed, classify and qa). `serve` takes several (`--model a --model name=./dir`).
    #[arg(
        long = "model",
        global = true,
        help_heading = "Global options",
        env = "IPFS_ACCELERATE_MODEL"
    )]
    models: Vec<String>,
    /// The one model of the commands other than `serve`.
    #[arg(skip)]
    model: String,
    /// Backend preference list, first usable wins (e.g. `cuda,wgpu,cpu`).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_delimiter = ',',
        env = "IPFS_ACCELERATE_BACKENDS"
    )]
    backend: Vec<String>,
    /// Print the timing breakdown (init, preprocess, inference, postprocess, total) to stderr.
    #[arg(long, global = true, help_heading = "Global options")]
    metrics: bool,
    /// Never download; use local files and the HF cache only.
    #[arg(long, global = true, help_heading = "Global options")]
    offline: bool,
    /// Keep the linear weights quantized in memory: `int8` or `int4`, optionally with a block
    /// size (`int4:64`; default 32). Embeddings and norms stay float. `--metrics` reports the
    /// weight memory.
    #[arg(long, global = true, help_heading = "Global options")]
    quantize: Option<String>,
    /// Calibrate the int4 weights (GPTQ) on these texts: a file with one text per line, or
    /// `default` for the built-in English corpus. Needs `--quantize int4`; embed, classify and
    /// qa only. Loading takes longer (a float load, one pass over the texts, the solver).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_name = "FILE|default"
    )]
    calibrate: Option<String>,
    /// The float type to compute in on the native backends: `f32` (default), `f16` or `bf16`.
    /// A backend that does not compute in it is skipped with the reason (`generate` runs f32).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        default_value = "f32"
    )]
    precision: ipfs_accelerate::Precision,
    /// Kernel fusion on the CubeCL backends (cuda, wgpu): `on` (default) or `off`.
    #[arg(long, global = true,
        help_heading = "Global options", value_name = "on|off", env = "IPFS_ACCELERATE_FUSION", value_parser = ipfs_accelerate::parse_switch)]
    fusion: Option<bool>,
    /// Output: `auto` (the command's own form: JSON results, streamed text), `json` (one JSON
    /// document with the result and the metrics) or `text` (one line per item).
    #[arg(
        long,
        global = true,
        help_heading = "Global options",
        value_enum,
        default_value_t
    )]
    format: output::Format,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Sentence embeddings: prints one JSON array holding one vector per text.
    Embed {
        /// Texts to embed; `-` reads them from stdin, one per line.
        #[arg(required_unless_present = "file")]
        texts: Vec<String>,
        /// Also embed the lines of this file (one text per line).
        #[arg(long)]
        file: Option<PathBuf>,
        /// L2-normalise each vector.
        #[arg(long)]
        normalize: bool,
        /// Print the cosine-similarity matrix instead of the vectors.
        #[arg(long)]
        similarity: bool,
    },
    /// Sequence classification: labels with probabilities for each text (JSON).
    Classify {
        /// Texts to classify; `-` reads them from stdin, one per line.
        #[arg(required_unless_present = "file")]
        texts: Vec<String>,
        /// Also classify the lines of this file (one text per line).
        #[arg(long)]
        file: Option<PathBuf>,
        /// Labels to print per text.
        #[arg(long, default_value_t = 5)]
        top_k: usize,
        /// Label every token instead (token-classification checkpoints).
        #[arg(long)]
        tokens: bool,
    },
    /// Extractive question answering (JSON: answer text, offsets, score).
    Qa {
        /// The question.
        #[arg(long)]
        question: String,
        /// The passage holding the answer.
        #[arg(long)]
        context: String,
    },
    /// Text generation with a decoder LM (LLaMA / Qwen2): `--model` is a `.gguf` file, a checkpoint
    /// folder or a hub id. Streams exactly the generated text to stdout.
    Generate {
        /// The prompt; `-` reads it from stdin (all of it).
        prompt: String,
        /// Tokens to generate at most.
        #[arg(long, default_value_t = 64)]
        max_new_tokens: usize,
        /// Argmax decoding (the default when no sampling flag is given).
        #[arg(long, conflicts_with_all = ["temperature", "top_k", "top_p"])]
        greedy: bool,
        /// Sample with this softmax temperature.
        #[arg(long)]
        temperature: Option<f32>,
        /// Sample from the k most likely tokens.
        #[arg(long)]
        top_k: Option<usize>,
        /// Sample from the smallest set of tokens whose probability reaches p.
        #[arg(long)]
        top_p: Option<f32>,
        /// HF repetition penalty (1.0 = off).
        #[arg(long, default_value_t = 1.0)]
        repetition_penalty: f32,
        /// Seed of the sampler.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Wrap the prompt as a user message with the model's chat template.
        #[arg(long)]
        chat: bool,
        /// Keep generating past the end-of-sequence token.
        #[arg(long)]
        ignore_eos: bool,
    },
    /// Speech recognition of a WAV file with Whisper or Wav2Vec2 (by the checkpoint's model type);
    /// prints the text.
    Transcribe {
        /// The WAV file (any rate: resampled to the model's; channels are mixed down).
        file: PathBuf,
        /// Whisper's language code (`en`); detected when absent.
        #[arg(long)]
        language: Option<String>,
        /// Whisper: tokens to generate at most.
        #[arg(long)]
        max_new_tokens: Option<usize>,
        /// Print JSON (text, token ids, duration) instead of the text.
        #[arg(long)]
        json: bool,
    },
    /// Text-to-text generation with T5 / FLAN-T5: one output line per input text.
    T2t {
        /// Input texts (e.g. `translate English to German: Hello`); `-` reads them from stdin,
        /// one per line.
        #[arg(required_unless_present = "file")]
        texts: Vec<String>,
        /// Also take the lines of this file (one text per line).
        #[arg(long)]
        file: Option<PathBuf>,
        /// Tokens to generate at most per text.
        #[arg(long, default_value_t = 64)]
        max_new_tokens: usize,
    },
    /// Image classification (ViT): the top labels of each image (JSON).
    ClassifyImage {
        /// PNG / JPEG files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Labels to print per image.
        #[arg(long, default_value_t = 5)]
        top_k: usize,
    },
    /// Zero-shot image classification (CLIP): the probability of each label per image (JSON).
    ZeroShot {
        /// PNG / JPEG files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Candidate labels, comma-separated.
        #[arg(long, required = true, value_delimiter = ',')]
        labels: Vec<String>,
        /// Prompt each label is put into (`{}` is the label).
        #[arg(long, default_value = "a photo of a {}")]
        template: String,
    },
    /// Object detection (DETR): labels, scores and pixel boxes per image (JSON).
    Detect {
        /// PNG / JPEG files.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// Keep detections scoring at least this.
        #[arg(long, default_value_t = 0.9)]
        threshold: f64,
        /// Write the (single) image with the boxes drawn to this PNG.
        #[arg(long)]
        draw: Option<PathBuf>,
    },
    /// Answer a question about an image with LLaVA / LLaVA-NeXT; streams the answer to stdout.
    DescribeImage {
        /// PNG / JPEG file(s); each gets an `<image>` in the prompt.
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// The question.
        #[arg(long, default_value = "Describe this image.")]
        prompt: String,
        /// Tokens to generate at most.
        #[arg(long, default_value_t = 64)]
        max_new_tokens: usize,
    },
    /// Video classification with X-CLIP: the probability of each label (JSON). The model's frame
    /// count is sampled uniformly from the frames given.
    ClassifyVideo {
        /// Frame image files in order (PNG / JPEG).
        #[arg(required = true)]
        frames: Vec<PathBuf>,
        /// Candidate labels, comma-separated.
        #[arg(long, required = true, value_delimiter = ',')]
        labels: Vec<String>,
        /// Prompt each label is put into (`{}` is the label).
        #[arg(long, default_value = "{}")]
        template: String,
    },
    /// Zero-shot audio classification with CLAP: the probability of each label (JSON).
    ClassifyAudio {
        /// The WAV file.
        file: PathBuf,
        /// Candidate labels, comma-separated.
        #[arg(long, required = true, value_delimiter = ',')]
        labels: Vec<String>,
        /// Prompt each label is put into (`{}` is the label).
        #[arg(long, default_value = "This is a sound of {}.")]
        template: String,
    },
    /// Benchmark a family over batch sizes × sizes on the `--backend` list (default cpu) and add
    /// the results to a DuckDB file (`cargo xtask report` renders them).
    Bench(ipfs_accelerate_bench::cli::BenchArgs),
    /// Serve the `--model`s over HTTP: OpenAI-compatible `/v1/embeddings`, `/v1/completions`,
    /// `/v1/chat/completions` (streaming), `/v1/audio/transcriptions`; text-embeddings-inference's
    /// `/embed` and `/predict`; image tasks under `/v1/images/`; `/health` and `/metrics`.
    ///
    /// Example: `ipfs-accelerate serve --model embedded --model smol=./SmolLM2.Q4_1.gguf --port 8080`
    Serve(serve::ServeArgs),
    /// Probe every backend and print what this machine offers.
    Devices {
        /// Print JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

/// Restores the default action of SIGPIPE, which Rust's runtime ignores: with it ignored, a
/// closed stdout (`embed ... | head -c 100`) makes `println!` panic. Restored, the process ends
/// quietly with status 141, as `cat` or `grep` do. (Sockets are unaffected: the standard library
/// writes to them with `MSG_NOSIGNAL`.)
fn restore_sigpipe() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to SIG_DFL at start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    };
}

fn main() -> ExitCode {
    restore_sigpipe();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("IPFS_ACCELERATE_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        // Colour codes only on a terminal: logs of `serve` usually go to a file or a collector.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn backend_list(cli: &Cli) -> anyhow::Result<Option<Vec<BackendKind>>> {
    if cli.backend.is_empty() {
        return Ok(None);
    }
    Ok(Some(
        cli.backend
            .iter()
            .map(|b| b.parse::<BackendKind>())
            .collect::<Result<Vec<_>, _>>()?,
    ))
}

/// The `--quantize` setting (float when absent).
fn quantization(cli: &Cli) -> anyhow::Result<ipfs_accelerate::WeightQuantization> {
    Ok(match &cli.quantize {
        Some(q) => q.parse()?,
        None => ipfs_accelerate::WeightQuantization::None,
    })
}

/// Prints the weight memory line of `--metrics`.
fn print_weights(w: &ipfs_accelerate::weights::WeightStats) {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    let mut line = format!(
        "weights      {:.1} MiB in memory ({:.1} MiB as float); linear layers {:.1} MiB ({:.1} MiB as float)",
        mib(w.bytes),
        mib(w.f32_bytes()),
        mib(w.linear_bytes),
        mib(w.linear_f32_bytes)
    );
    if w.linear_quantized > 0 || w.linear_kept_float > 0 {
        line += &format!(", {} of {} quantized", w.linear_quantized, w.linear_layers);
    }
    eprintln!("{line}");
}

fn run(mut cli: Cli) -> anyhow::Result<()> {
    if let Command::Serve(args) = &cli.command {
        return serve::run(&cli, args);
    }
    if cli.models.len() > 1 {
        anyhow::bail!(
            "--model given {} times: only `serve` takes several models",
            cli.models.len()
        );
    }
    // The embedded model is the default of the sentence-embedding commands only.
    cli.model = cli.models.pop().unwrap_or_default();
    let text_pipeline = matches!(
        cli.command,
        Command::Embed { .. } | Command::Classify { .. } | Command::Qa { .. }
    );
    if cli.model.is_empty() && text_pipeline {
        cli.model = "embedded".into();
    }
    if let Some(on) = cli.fusion {
        ipfs_accelerate::set_kernel_fusion(on);
    }
    if let Command::Devices { json } = &cli.command {
        return devices(*json);
    }
    if let Command::Bench(args) = &cli.command {
        let command = std::env::args().collect::<Vec<_>>().join(" ");
        ipfs_accelerate_bench::cli::bench(args, &cli.backend, command)?;
        return Ok(());
    }
    if cli.calibrate.is_some() && !text_pipeline {
        anyhow::bail!("--calibrate applies to the embed, classify and qa commands");
    }
    if matches!(cli.command, Command::Generate { .. }) {
        return generate(cli);
    }
    if !text_pipeline {
        return tasks::run(cli);
    }
    let mut builder = Pipeline::builder(&cli.model)
        .offline(cli.offline)
        .precision(cli.precision)
        .quantize(quantization(&cli)?);
    match cli.calibrate.as_deref() {
        None => {}
        Some("default") => builder = builder.calibrate_default(),
        Some(file) => {
            let text = std::fs::read_to_string(file)
                .with_context(|| format!("reading the calibration texts {file}"))?;
            builder = builder.calibrate(ipfs_accelerate::calibration_lines(&text));
        }
    }
    if let Some(list) = backend_list(&cli)? {
        builder = builder.backends(list).env_override(false);
    }
    let task = match &cli.command {
        Command::Embed { .. } => Task::Embed,
        Command::Classify { tokens: true, .. } => Task::TokenClassify,
        Command::Classify { .. } => Task::Classify,
        Command::Qa { .. } => Task::QuestionAnswering,
        _ => unreachable!("handled above"),
    };
    let pipe = builder
        .task(task)
        .build()
        .with_context(|| format!("loading {}", cli.model))?;
    for s in pipe.skipped() {
        eprintln!("note: skipped backend {}: {}", s.kind, s.reason);
    }
    let metrics = match cli.command {
        Command::Embed {
            texts,
            file,
            normalize,
            similarity,
        } => {
            let texts = input_lines(texts, file.as_deref())?;
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let out = pipe.embed(&refs, normalize || similarity)?;
            if similarity {
                let m: Vec<Vec<f32>> = out
                    .value
                    .iter()
                    .map(|a| out.value.iter().map(|b| dot(a, b)).collect())
                    .collect();
                output::emit(cli.format, Native::Json, &cli.model, &m, &out.metrics)?;
            } else {
                output::emit(
                    cli.format,
                    Native::Json,
                    &cli.model,
                    &out.value,
                    &out.metrics,
                )?;
            }
            out.metrics
        }
        Command::Classify {
            texts,
            file,
            top_k,
            tokens,
        } => {
            let texts = input_lines(texts, file.as_deref())?;
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            if tokens {
                let out = pipe.classify_tokens(&refs)?;
                output::emit_output(cli.format, Native::PrettyJson, &cli.model, out)?
            } else {
                let mut out = pipe.classify(&refs)?;
                for labels in &mut out.value {
                    labels.truncate(top_k.max(1));
                }
                output::emit_output(cli.format, Native::PrettyJson, &cli.model, out)?
            }
        }
        Command::Qa { question, context } => {
            let out = pipe.answer(&question, &context)?;
            output::emit_output(cli.format, Native::PrettyJson, &cli.model, out)?
        }
        _ => unreachable!("handled above"),
    };
    if metrics.truncated > 0 {
        eprintln!(
            "note: {} input(s) were longer than {} tokens and were truncated",
            metrics.truncated,
            pipe.tokenizer().max_len()
        );
    }
    if cli.metrics {
        print_metrics(&metrics, pipe.model_name());
        print_weights(&pipe.weights());
        if let Some(c) = pipe.calibration() {
            eprintln!(
                "calibration  {} layers on {} texts in {:.2} s (GPTQ)",
                c.layers,
                c.texts,
                c.duration.as_secs_f64()
            );
        }
    }
    Ok(())
}

fn generate(cli: Cli) -> anyhow::Result<()> {
    use ipfs_accelerate::text::{GenerateOptions, Sampling, TextGenerator};
    use std::io::Write;
    let options = tasks::options(&cli)?;
    let Command::Generate {
        prompt,
        max_new_tokens,
        greedy,
        temperature,
        top_k,
        top_p,
        repetition_penalty,
        seed,
        chat,
        ignore_eos,
    } = cli.command
    else {
        unreachable!("called for generate only")
    };
    if cli.model.is_empty() || cli.model == "embedded" {
        anyhow::bail!(
            "generate needs a decoder LM: pass --model with a .gguf file, a checkpoint folder or a hub id"
        );
    }
    let prompt = if prompt == "-" {
        let mut text = String::new();
        std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
            .context("reading the prompt from stdin")?;
        text.trim_end_matches(['\n', '\r']).to_string()
    } else {
        prompt
    };
    let generator = TextGenerator::load(&cli.model, &options)
        .with_context(|| format!("loading {}", cli.model))?;
    // As kept (a GGUF's blocks on the CPU, or quantized as asked) and as f32.
    let weights = (generator.float_weight_bytes(), generator.weight_bytes());
    for s in &generator.selection().skipped {
        eprintln!("note: skipped backend {}: {}", s.kind, s.reason);
    }
    let sampling = if greedy || (temperature.is_none() && top_k.is_none() && top_p.is_none()) {
        Sampling::Greedy
    } else {
        Sampling::Sample {
            temperature: temperature.unwrap_or(1.0),
            top_k,
            top_p,
        }
    };
    let options = GenerateOptions {
        max_new_tokens,
        sampling,
        repetition_penalty,
        seed,
        chat,
        stop_at_eos: !ignore_eos,
    };
    let stdout = std::io::stdout();
    // JSON is one document at the end; text is streamed as it is generated.
    let stream = cli.format != output::Format::Json;
    let out = generator.generate(&prompt, &options, |piece| {
        if stream {
            let mut lock = stdout.lock();
            let _ = lock.write_all(piece.as_bytes());
            let _ = lock.flush();
        }
    })?;
    // stdout carries exactly the generated text; a terminal also gets a final newline.
    if stream && std::io::IsTerminal::is_terminal(&std::io::stdout()) {
        println!();
    }
    output::emit(
        cli.format,
        Native::Printed,
        &cli.model,
        &out.value,
        &out.metrics,
    )?;
    if cli.metrics {
        // Generation's own counts follow (its metrics count generated tokens, not padding).
        print_timings(&out.metrics, &cli.model);
        eprintln!(
            "generation   {} prompt tokens at {:.1} tokens/s, {} new tokens at {:.1} tokens/s",
            out.value.prompt_ids.len(),
            out.value.prefill_tokens_per_s,
            out.value.token_ids.len(),
            out.value.decode_tokens_per_s
        );
        let mib = |b: usize| b as f64 / (1u64 << 20) as f64;
        eprintln!(
            "weights      {:.1} MiB in memory ({:.1} MiB as float)",
            mib(weights.1),
            mib(weights.0)
        );
    }
    Ok(())
}

/// The texts of a command: each argument, where `-` stands for the lines of stdin, then the lines
/// of `file`. Blank lines are skipped; no text at all is an error.
pub(crate) fn input_lines(
    args: Vec<String>,
    file: Option<&std::path::Path>,
) -> anyhow::Result<Vec<String>> {
    let lines = |text: &str| -> Vec<String> {
        text.lines()
            .map(|l| l.trim_end_matches('\r'))
            .filter(|l| !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    };
    let mut out = Vec::new();
    let mut stdin_read = false;
    for arg in args {
        if arg == "-" {
            anyhow::ensure!(!stdin_read, "`-` given twice: stdin can be read once");
            stdin_read = true;
            let mut text = String::new();
            std::io::Read::read_to_string(&mut std::io::stdin(), &mut text)
                .context("reading the inputs from stdin (one per line, UTF-8)")?;
            out.extend(lines(&text));
        } else {
            out.push(arg);
        }
    }
    if let Some(path) = file {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!(
                "reading the inputs of {} (one per line, UTF-8)",
                path.display()
            )
        })?;
        out.extend(lines(&text));
    }
    anyhow::ensure!(
        !out.is_empty(),
        "no input: the texts, stdin or --file held no line"
    );
    Ok(out)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn print_metrics(m: &Metrics, model: &str) {
    print_timings(m, model);
    eprintln!(
        "items        {} ({} tokens incl. padding, {} truncated); {:.1} tokens/s",
        m.items,
        m.tokens,
        m.truncated,
        m.tokens_per_second()
    );
}

/// The model, backend and phase times of `--metrics`.
fn print_timings(m: &Metrics, model: &str) {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    eprintln!("model        {model}");
    eprintln!("backend      {}", m.backend);
    eprintln!("init         {:>9.2} ms", ms(m.init));
    eprintln!("preprocess   {:>9.2} ms", ms(m.preprocess));
    eprintln!("inference    {:>9.2} ms", ms(m.inference));
    eprintln!("postprocess  {:>9.2} ms", ms(m.postprocess));
    eprintln!("total        {:>9.2} ms", ms(m.total));
}

fn devices(json: bool) -> anyhow::Result<()> {
    let rows = ipfs_accelerate::devices();
    if json {
        let v: Vec<serde_json::Value> = rows
            .iter()
            .map(|(k, a)| serde_json::json!({ "backend": k.to_string(), "status": a }))
            .collect();
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    println!("{:<16} {:<12} details", "backend", "status");
    for (kind, availability) in rows {
        let (status, details) = match &availability {
            Availability::Available(info) => {
                let mut d = info.name.clone();
                if let Some(n) = info.compute_units {
                    d += &format!(", {n} threads");
                }
                if let Some(m) = info.memory_total {
                    d += &format!(", {:.1} GiB", m as f64 / (1u64 << 30) as f64);
                }
                if !info.capabilities.features.is_empty() {
                    d += &format!(", [{}]", info.capabilities.features.join(" "));
                }
                if let Some(driver) = &info.driver {
                    d += &format!(", {driver}");
                }
                ("available", d)
            }
            Availability::Unavailable(r) => ("unavailable", r.clone()),
            Availability::NotCompiled => (
                "absent",
                format!("not compiled in (enable feature `{}`)", kind.feature()),
            ),
        };
        println!("{:<16} {:<12} {}", kind.to_string(), status, details);
    }
    Ok(())
}
