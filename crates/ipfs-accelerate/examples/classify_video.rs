//! Zero-shot video classification with X-CLIP over frame images:
//! `cargo run --example classify_video -- --model microsoft/xclip-base-patch32 --labels "cooking,dancing" f*.png`
mod common;

use ipfs_accelerate::multimodal::VideoClassifier;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = common::args(
        "classify_video --model M --labels a,b FRAME... [--backend B]",
        None,
    )?;
    let xclip = VideoClassifier::load(&args.model, &args.options)?;
    let out = xclip.classify_files(&args.inputs, &common::refs(&args.labels), "{}")?;
    for label in &out.value {
        println!("{} {:.3}", label.label, label.score);
    }
    Ok(())
}
