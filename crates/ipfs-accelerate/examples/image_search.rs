//! Image search with CLIP embeddings: ranks the images by cosine similarity to a query text:
//! `cargo run --example image_search -- --model openai/clip-vit-base-patch32 "a red car" a.jpg b.jpg`
mod common;

use ipfs_accelerate::vision::{load_images, ZeroShotClassifier};

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = common::args("image_search --model M QUERY IMAGE... [--backend B]", None)?;
    let (query, files) = args.inputs.split_first().ok_or("give a query and images")?;
    let clip = ZeroShotClassifier::load(&args.model, &args.options)?;
    let images = clip.embed_images(&load_images(files)?)?.value;
    let text = clip.embed_texts(&[query])?.value;
    let mut ranked: Vec<(f32, &String)> = images
        .iter()
        .map(|i| cosine(i, &text[0]))
        .zip(files)
        .collect();
    ranked.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (score, file) in ranked {
        println!("{score:.4} {file}");
    }
    Ok(())
}
