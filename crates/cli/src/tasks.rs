//! The image, speech and text-to-text sub-commands: each loads its task's model, runs it, prints
//! the result, and the metrics with `--metrics`.

use anyhow::Context;
use ipfs_accelerate::core::Selection;
use ipfs_accelerate::{LoadOptions, Metrics};

use crate::output::{emit, emit_output, Format, Native};
use crate::{backend_list, print_metrics, quantization, Cli, Command};

/// The load options of the global flags (backends, offline, quantization, precision).
pub(crate) fn options(cli: &Cli) -> anyhow::Result<LoadOptions> {
    Ok(LoadOptions {
        backends: backend_list(cli)?,
        offline: cli.offline,
        quantization: quantization(cli)?,
        share_weights: false,
        precision: cli.precision,
        ..Default::default()
    })
}

fn report_skipped(selection: &Selection) {
    for s in &selection.skipped {
        eprintln!("note: skipped backend {}: {}", s.kind, s.reason);
    }
}

/// Runs one of the task sub-commands.
pub(crate) fn run(cli: Cli) -> anyhow::Result<()> {
    if cli.model.is_empty() || cli.model == "embedded" {
        anyhow::bail!(
            "this command needs a model of its family: pass --model with a checkpoint folder or a hub id \
             (the embedded model is a sentence-embedding model)"
        );
    }
    let opts = options(&cli)?;
    let model = cli.model.clone();
    let loading = || format!("loading {model}");
    // The weight memory of the loaded model, for `--metrics` (every task type but speech).
    let mut weights = None;
    let metrics: Metrics = match cli.command {
        Command::Transcribe {
            file,
            language,
            max_new_tokens,
            json,
        } => {
            let mut asr =
                ipfs_accelerate::speech::Transcriber::load(&model, &opts).with_context(loading)?;
            report_skipped(asr.selection());
            asr.language = language;
            asr.max_new_tokens = max_new_tokens;
            let out = asr
                .transcribe_file(&file)
                .with_context(|| format!("transcribing {}", file.display()))?;
            if out.value.truncated {
                eprintln!("note: the audio is longer than the model's window and was cut");
            }
            let native = if json {
                Native::PrettyJson
            } else {
                Native::Lines(vec![out.value.text.clone()])
            };
            emit(cli.format, native, &model, &out.value, &out.metrics)?;
            out.metrics
        }
        Command::T2t {
            texts,
            file,
            max_new_tokens,
        } => {
            let texts = crate::input_lines(texts, file.as_deref())?;
            let t5 =
                ipfs_accelerate::text2text::Text2Text::load(&model, &opts).with_context(loading)?;
            report_skipped(t5.selection());
            weights = Some(t5.weights());
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let out = t5.generate(&refs, max_new_tokens)?;
            let lines = Native::Lines(out.value.clone());
            emit(cli.format, lines, &model, &out.value, &out.metrics)?;
            out.metrics
        }
        Command::ClassifyImage { files, top_k } => {
            let vit = ipfs_accelerate::vision::ImageClassifier::load(&model, &opts)
                .with_context(loading)?;
            report_skipped(vit.selection());
            weights = Some(vit.weights());
            let out = vit.classify_files(&files, top_k)?;
            emit_output(cli.format, Native::PrettyJson, &model, out)?
        }
        Command::ZeroShot {
            files,
            labels,
            template,
        } => {
            let clip = ipfs_accelerate::vision::ZeroShotClassifier::load(&model, &opts)
                .with_context(loading)?;
            report_skipped(clip.selection());
            weights = Some(clip.weights());
            let images = ipfs_accelerate::vision::load_images(&files)?;
            let refs: Vec<&str> = labels.iter().map(String::as_str).collect();
            let out = clip.classify(&images, &refs, &template)?;
            emit_output(cli.format, Native::PrettyJson, &model, out)?
        }
        Command::Detect {
            files,
            threshold,
            draw,
        } => {
            if draw.is_some() && files.len() != 1 {
                anyhow::bail!("--draw writes one image: pass exactly one file");
            }
            let detr = ipfs_accelerate::vision::ObjectDetector::load(&model, &opts)
                .with_context(loading)?;
            report_skipped(detr.selection());
            weights = Some(detr.weights());
            let images = ipfs_accelerate::vision::load_images(&files)?;
            let out = detr.detect(&images, threshold)?;
            emit(
                cli.format,
                Native::PrettyJson,
                &model,
                &out.value,
                &out.metrics,
            )?;
            if let Some(path) = draw {
                crate::draw::boxes(&images[0], &out.value[0], &path)?;
                eprintln!("wrote {}", path.display());
            }
            out.metrics
        }
        Command::DescribeImage {
            files,
            prompt,
            max_new_tokens,
        } => {
            use std::io::Write;
            let llava = ipfs_accelerate::multimodal::ImageDescriber::load(&model, &opts)
                .with_context(loading)?;
            report_skipped(llava.selection());
            weights = Some(llava.weights());
            let stdout = std::io::stdout();
            let stream = cli.format != Format::Json;
            let out = llava.describe_files(&files, &prompt, max_new_tokens, |piece| {
                if stream {
                    let mut lock = stdout.lock();
                    let _ = lock.write_all(piece.as_bytes());
                    let _ = lock.flush();
                }
            })?;
            if stream {
                println!();
            }
            emit_output(cli.format, Native::Printed, &model, out)?
        }
        Command::ClassifyVideo {
            frames,
            labels,
            template,
        } => {
            let xclip = ipfs_accelerate::multimodal::VideoClassifier::load(&model, &opts)
                .with_context(loading)?;
            report_skipped(xclip.selection());
            weights = Some(xclip.weights());
            let refs: Vec<&str> = labels.iter().map(String::as_str).collect();
            let out = xclip.classify_files(&frames, &refs, &template)?;
            emit_output(cli.format, Native::PrettyJson, &model, out)?
        }
        Command::ClassifyAudio {
            file,
            labels,
            template,
        } => {
            let clap = ipfs_accelerate::multimodal::AudioClassifier::load(&model, &opts)
                .with_context(loading)?;
            report_skipped(clap.selection());
            weights = Some(clap.weights());
            let refs: Vec<&str> = labels.iter().map(String::as_str).collect();
            let out = clap
                .classify_file(&file, &refs, &template)
                .with_context(|| format!("classifying {}", file.display()))?;
            emit_output(cli.format, Native::PrettyJson, &model, out)?
        }
        _ => unreachable!("dispatched to the task commands only"),
    };
    if cli.metrics {
        print_metrics(&metrics, &model);
        if let Some(w) = weights {
            crate::print_weights(&w);
        }
    }
    Ok(())
}
