//! Text classification with a sequence-classification checkpoint:
//! `cargo run --example classify -- --model ./sst2-bert "I loved it" [--backend cpu]`
mod common;

use ipfs_accelerate::{Pipeline, Task};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = common::args("classify --model M TEXT... [--backend B]", None)?;
    let mut builder = Pipeline::builder(&args.model).task(Task::Classify);
    if let Some(list) = args.options.backends {
        builder = builder.backends(list);
    }
    let out = builder.build()?.classify(&common::refs(&args.inputs))?;
    for (text, labels) in args.inputs.iter().zip(&out.value) {
        println!("{text:?}: {} ({:.3})", labels[0].label, labels[0].score);
    }
    Ok(())
}
