//! Image classification with ViT:
//! `cargo run --example classify_image -- --model google/vit-base-patch16-224 cat.jpg`
mod common;

use ipfs_accelerate::vision::ImageClassifier;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = common::args("classify_image --model M IMAGE... [--backend B]", None)?;
    let vit = ImageClassifier::load(&args.model, &args.options)?;
    let out = vit.classify_files(&args.inputs, 3)?;
    for (file, labels) in args.inputs.iter().zip(&out.value) {
        let top: Vec<String> = labels
            .iter()
            .map(|l| format!("{} {:.3}", l.label, l.score))
            .collect();
        println!("{file}: {}", top.join(", "));
    }
    Ok(())
}
