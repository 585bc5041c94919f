//! Zero-shot audio classification with CLAP:
//! `cargo run --example classify_audio -- --model laion/clap-htsat-unfused --labels "dog barking,rain" dog.wav`
mod common;

use ipfs_accelerate::multimodal::AudioClassifier;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = common::args(
        "classify_audio --model M --labels a,b FILE.wav [--backend B]",
        None,
    )?;
    let clap = AudioClassifier::load(&args.model, &args.options)?;
    let labels = common::refs(&args.labels);
    for file in &args.inputs {
        let out = clap.classify_file(file, &labels, "This is a sound of {}.")?;
        println!("{file}: {} ({:.3})", out.value[0].label, out.value[0].score);
    }
    Ok(())
}
