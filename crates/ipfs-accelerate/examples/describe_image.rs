//! Ask LLaVA / LLaVA-NeXT about an image, streamed:
//! `cargo run --example describe_image -- --model llava-hf/llava-1.5-7b-hf cat.jpg`
mod common;

use std::io::Write;

use ipfs_accelerate::multimodal::ImageDescriber;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = common::args("describe_image --model M IMAGE [--backend B]", None)?;
    let llava = ImageDescriber::load(&args.model, &args.options)?;
    llava.describe_files(&args.inputs, "Describe this image.", 32, |piece| {
        print!("{piece}");
        let _ = std::io::stdout().flush();
    })?;
    println!();
    Ok(())
}
