//! Sentence embeddings (BERT-like encoders; the built-in all-MiniLM-L6-v2 by default, offline):
//! `cargo run --example embed -- "first text" "second text" [--model DIR] [--backend cpu]`
mod common;

use ipfs_accelerate::{Pipeline, Task};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = common::args("embed TEXT... [--model M] [--backend B]", Some("embedded"))?;
    let mut builder = Pipeline::builder(&args.model).task(Task::Embed);
    if let Some(list) = args.options.backends {
        builder = builder.backends(list);
    }
    let pipe = builder.build()?;
    let out = pipe.embed(&common::refs(&args.inputs), true)?;
    for (text, v) in args.inputs.iter().zip(&out.value) {
        println!(
            "{text:?}: {} dims, starts {:?}",
            v.len(),
            &v[..4.min(v.len())]
        );
    }
    eprintln!(
        "{} on {} in {:?}",
        args.model, out.metrics.backend, out.metrics.total
    );
    Ok(())
}
