//! Zero-shot image classification with CLIP:
//! `cargo run --example zero_shot -- --model openai/clip-vit-base-patch32 --labels cat,dog cat.jpg`
mod common;

use ipfs_accelerate::vision::{load_images, ZeroShotClassifier};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = common::args(
        "zero_shot --model M --labels a,b IMAGE... [--backend B]",
        None,
    )?;
    let clip = ZeroShotClassifier::load(&args.model, &args.options)?;
    let images = load_images(&args.inputs)?;
    let out = clip.classify(&images, &common::refs(&args.labels), "a photo of a {}")?;
    for (file, labels) in args.inputs.iter().zip(&out.value) {
        println!("{file}: {} ({:.3})", labels[0].label, labels[0].score);
    }
    Ok(())
}
