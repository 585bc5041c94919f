//! Embedding throughput of a whole application call: every line of a file embedded with
//! `Pipeline::embed` (length-sorted batches, pooling, normalisation), timed over rounds:
//! `cargo run --release --example embed_throughput -- --file sentences.txt [--model M]
//! [--backend cuda] [--precision f16] [--batch 32] [--rounds 10]`
//!
//! Prints the first call (on a GPU: kernel compilation included) and the median, min and max of
//! the warm rounds, as one JSON line on stdout.

use std::time::Instant;

use ipfs_accelerate::{BackendKind, LoadOptions, Pipeline, Precision, Task};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "embed_throughput --file FILE [--model M] [--backend B] [--precision P] \
                 [--batch N] [--rounds N]";
    let mut args = std::env::args().skip(1);
    let (mut file, mut model, mut rounds) = (None, "embedded".to_string(), 10usize);
    let mut options = LoadOptions::default();
    while let Some(arg) = args.next() {
        let mut value = || {
            args.next()
                .ok_or_else(|| format!("{arg} needs a value\n{usage}"))
        };
        match arg.as_str() {
            "--file" => file = Some(value()?),
            "--model" => model = value()?,
            "--backend" => options.backends = Some(BackendKind::parse_list(&value()?)?),
            "--precision" => options.precision = value()?.parse::<Precision>()?,
            "--batch" => options.batch_size = Some(value()?.parse()?),
            "--rounds" => rounds = value()?.parse::<usize>()?.max(1),
            "-h" | "--help" => {
                println!("usage: {usage}");
                return Ok(());
            }
            other => return Err(format!("unknown argument {other}\nusage: {usage}").into()),
        }
    }
    let file = file.ok_or_else(|| format!("--file is required\nusage: {usage}"))?;
    let lines: Vec<String> = std::fs::read_to_string(&file)?
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_string)
        .collect();
    let texts: Vec<&str> = lines.iter().map(String::as_str).collect();
    let clock = Instant::now();
    let pipe = Pipeline::load(&model, Task::Embed, &options)?;
    let load_ms = clock.elapsed().as_secs_f64() * 1e3;
    let clock = Instant::now();
    let first = pipe.embed(&texts, true)?;
    let first_ms = clock.elapsed().as_secs_f64() * 1e3;
    let mut last = first.metrics.clone();
    let mut times: Vec<f64> = (0..rounds)
        .map(|_| {
            let clock = Instant::now();
            pipe.embed(&texts, true).map(|out| {
                last = out.metrics;
                clock.elapsed().as_secs_f64() * 1e3
            })
        })
        .collect::<Result<_, _>>()?;
    times.sort_by(f64::total_cmp);
    let median = times[times.len() / 2];
    println!(
        "{}",
        serde_json::json!({
            "engine": "ipfs-accelerate",
            "backend": first.metrics.backend,
            "engine_detail": pipe.runner().engine(),
            "precision": options.precision.name(),
            "sentences": texts.len(),
            "load_ms": load_ms,
            "first_call_ms": first_ms,
            "median_ms": median,
            "min_ms": times[0],
            "max_ms": times[times.len() - 1],
            "sentences_per_s": texts.len() as f64 / median * 1e3,
            // The last round's phases: tokenizing, the model (batches of `--batch`), pooling.
            "last_preprocess_ms": last.preprocess.as_secs_f64() * 1e3,
            "last_inference_ms": last.inference.as_secs_f64() * 1e3,
            "last_postprocess_ms": last.postprocess.as_secs_f64() * 1e3,
        })
    );
    Ok(())
}
