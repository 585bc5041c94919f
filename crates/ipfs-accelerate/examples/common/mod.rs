// Each example uses part of this module.
#![allow(dead_code)]

//! The examples' shared argument handling: `--model M`, `--backend a,b` (a preference list, first
//! usable wins), `--labels a,b`; every other argument is an input.

use ipfs_accelerate::{BackendKind, LoadOptions};

/// What an example was given.
pub struct Args {
    /// `--model` (each example says what it needs; `embedded` works offline where a BERT does).
    pub model: String,
    /// `--backend` as load options.
    pub options: LoadOptions,
    /// `--labels`, comma separated (zero-shot examples).
    pub labels: Vec<String>,
    /// The inputs: texts, or image / audio files.
    pub inputs: Vec<String>,
}

/// Parses the command line; `default_model` when there is no `--model`; at least one input.
/// A usage error prints the usage and exits with status 2.
pub fn args(usage: &str, default_model: Option<&str>) -> Result<Args, Box<dyn std::error::Error>> {
    let fail = |why: &str| -> ! {
        eprintln!("error: {why}\nusage: {usage}");
        std::process::exit(2)
    };
    let (mut model, mut backends, mut labels, mut inputs) = (None, None, Vec::new(), Vec::new());
    let mut precision = None;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = || {
            it.next()
                .unwrap_or_else(|| fail(&format!("{arg} needs a value")))
        };
        match arg.as_str() {
            "--model" => model = Some(value()),
            "--backend" => backends = Some(BackendKind::parse_list(&value())?),
            "--precision" => precision = Some(value().parse()?),
            "--labels" => labels = value().split(',').map(str::to_string).collect(),
            "-h" | "--help" => {
                println!("usage: {usage}");
                std::process::exit(0);
            }
            _ => inputs.push(arg),
        }
    }
    let model = model
        .or(default_model.map(str::to_string))
        .unwrap_or_else(|| fail("--model is required"));
    if inputs.is_empty() {
        fail("no input given");
    }
    Ok(Args {
        model,
        options: LoadOptions {
            backends,
            precision: precision.unwrap_or_default(),
            ..Default::default()
        },
        labels,
        inputs,
    })
}

/// The inputs as string slices.
pub fn refs(items: &[String]) -> Vec<&str> {
    items.iter().map(String::as_str).collect()
}
