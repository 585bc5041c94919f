//! Object detection with DETR:
//! `cargo run --example detect -- --model facebook/detr-resnet-50 street.jpg`
mod common;

use ipfs_accelerate::vision::{load_images, ObjectDetector};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = common::args("detect --model M IMAGE... [--backend B]", None)?;
    let detr = ObjectDetector::load(&args.model, &args.options)?;
    let out = detr.detect(&load_images(&args.inputs)?, 0.9)?;
    for (file, found) in args.inputs.iter().zip(&out.value) {
        println!("{file}: {}", serde_json::to_string(found)?);
    }
    Ok(())
}
