//! Text-to-text generation with T5 / FLAN-T5:
//! `cargo run --example t2t -- --model google/flan-t5-small "translate English to German: Hello"`
mod common;

use ipfs_accelerate::text2text::Text2Text;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = common::args("t2t --model M TEXT... [--backend B]", None)?;
    let t5 = Text2Text::load(&args.model, &args.options)?;
    for line in t5.generate(&common::refs(&args.inputs), 32)?.value {
        println!("{line}");
    }
    Ok(())
}
